//! Starting and stopping the server: storage, HTTP(S) listener, controllers, kubeconfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::api::ApiState;
use crate::guard::RequestGuard;
use crate::handlers::{self, ServerState};
use crate::storage::{Store, StoreError};
use crate::tls::{TlsError, TlsMaterial};

/// File name of the SQLite database inside a data directory.
pub const DATABASE_FILE: &str = "state.sqlite";

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the API: {0}")]
    Api(#[from] crate::error::ApiError),
    #[error("building a client: {0}")]
    Client(#[from] kube::Error),
}

/// Configures and starts an [`ApiServer`].
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    data_dir: Option<PathBuf>,
    listen: SocketAddr,
    tls: bool,
    bookmark_interval: Duration,
    history: u64,
    webhook_services: std::collections::HashMap<String, SocketAddr>,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        ApiServerBuilder {
            data_dir: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            bookmark_interval: Duration::from_secs(10),
            history: crate::storage::DEFAULT_HISTORY,
            webhook_services: Default::default(),
        }
    }
}

impl ApiServerBuilder {
    /// Keep state in `dir` (`state.sqlite`, and `pki/` with `tls`). Without it, state is in memory.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Address to listen on; port 0 picks a free port. Default 127.0.0.1:0.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serve HTTPS with a self-signed CA (kept in the data directory when there is one).
    pub fn tls(mut self, enabled: bool) -> Self {
        self.tls = enabled;
        self
    }

    /// How often watches with allowWatchBookmarks get a BOOKMARK. Default 10 s.
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// How many changes are kept for watches resuming from an older resourceVersion; older ones
    /// get 410 Expired. Default 10,000. Compaction runs every 1,000 writes.
    pub fn watch_history(mut self, changes: u64) -> Self {
        self.history = changes;
        self
    }

    /// Where admission webhooks given as `clientConfig.service` {namespace, name} are reached
    /// (there is no cluster network). Their certificates must be valid for `<name>.<namespace>.svc`.
    pub fn webhook_service(mut self, namespace: &str, name: &str, addr: SocketAddr) -> Self {
        self.webhook_services
            .insert(format!("{name}.{namespace}.svc"), addr);
        self
    }

    pub async fn start(self) -> Result<ApiServer, ServerError> {
        crate::tls::install_crypto_provider();
        let store = match &self.data_dir {
            Some(dir) => {
                crate::private_files::create_dir(dir).map_err(|source| ServerError::DataDir {
                    path: dir.clone(),
                    source,
                })?;
                Store::open(Some(&dir.join(DATABASE_FILE)))?
            }
            None => Store::open(None)?,
        }
        .with_history(self.history);
        let mut api = ApiState::new(store)?;
        api.admission = crate::admission::Admission::with_services(self.webhook_services.clone());
        let api = Arc::new(api);
        api.ensure_default_namespaces().await?;
        let tls = match (&self.data_dir, self.tls) {
            (_, false) => None,
            (Some(dir), true) => Some(TlsMaterial::load_or_generate(&dir.join("pki"))?),
            (None, true) => Some(TlsMaterial::generate()?),
        };
        let listener =
            TcpListener::bind(self.listen)
                .await
                .map_err(|source| ServerError::Listen {
                    addr: self.listen,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServerError::Listen {
                addr: self.listen,
                source,
            })?;
        let state = Arc::new(ServerState {
            api: api.clone(),
            bookmark_interval: self.bookmark_interval,
        });
        let guard = Arc::new(RequestGuard::new(addr, tls.is_some()));
        let router = Router::new()
            .fallback(handlers::dispatch)
            .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
            .layer(axum::middleware::from_fn_with_state(
                guard,
                crate::guard::guard,
            ))
            .with_state(state);
        let acceptor = tls
            .as_ref()
            .map(|m| m.server_config())
            .transpose()?
            .map(tokio_rustls::TlsAcceptor::from);
        let serving = tokio::spawn(serve(listener, router, acceptor));
        let controllers = tokio::spawn(crate::controllers::run(api.clone()));
        let scheme = if tls.is_some() { "https" } else { "http" };
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(ApiServer {
            url: format!("{scheme}://{host}:{}", addr.port()),
            addr,
            tls,
            api,
            tasks: vec![serving, controllers],
        })
    }
}

/// Accepts connections until aborted; aborting drops the JoinSet, which ends every connection.
async fn serve(listener: TcpListener, router: Router, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Usually running out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        while connections.try_join_next().is_some() {}
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        connections.spawn(async move {
            let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let result = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(s) => {
                        http.serve_connection_with_upgrades(TokioIo::new(s), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    http.serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

/// A running server. Dropping it stops it.
pub struct ApiServer {
    url: String,
    addr: SocketAddr,
    tls: Option<TlsMaterial>,
    api: Arc<ApiState>,
    tasks: Vec<JoinHandle<()>>,
}

impl ApiServer {
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// `http://127.0.0.1:PORT` (or https).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed the serving certificate, when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.api.store.current_rv().unwrap_or(0)
    }

    /// Client configuration for this server (trusting its CA when serving HTTPS).
    pub fn kube_config(&self) -> kube::Config {
        let uri = self.url.parse().expect("the server URL is a valid URI");
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        if let Some(der) = self.tls.as_ref().and_then(|t| t.ca_der().ok()) {
            config.root_cert = Some(vec![der]);
        }
        config
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config())
            .expect("a client for a loopback URL can always be built")
    }

    /// A kubeconfig (YAML) for this server, with the CA inline when serving HTTPS.
    pub fn kubeconfig(&self) -> String {
        use base64::Engine;
        let ca = self
            .ca_pem()
            .map(|pem| {
                // The serving certificate names only loopback: a client of a non-loopback
                // listen address verifies it as `localhost`.
                format!(
                    "    certificate-authority-data: {}\n    tls-server-name: localhost\n",
                    base64::engine::general_purpose::STANDARD.encode(pem)
                )
            })
            .unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: caretaker\n  cluster:\n    server: {}\n{ca}users:\n- name: caretaker\n  user:\n    # The server does not authenticate; a token keeps kubectl from prompting for a password.\n    token: caretaker-no-auth\ncontexts:\n- name: caretaker\n  context:\n    cluster: caretaker\n    user: caretaker\n    namespace: default\ncurrent-context: caretaker\n",
            self.url
        )
    }

    /// Writes [`Self::kubeconfig`] to `path` (mode 0600).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        crate::private_files::write(path.as_ref(), &self.kubeconfig())
    }

    /// Stops serving: closes the listener and every connection (watches end) and stops the controllers.
    pub async fn shutdown(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The in-process server tests use: in-memory SQLite, an ephemeral loopback port, plain HTTP.
pub struct TestServer;

impl TestServer {
    /// Starts a fresh server. Panics if it cannot (tests want a loud failure).
    #[allow(clippy::new_ret_no_self)]
    pub async fn start() -> ApiServer {
        ApiServer::builder()
            .bookmark_interval(Duration::from_secs(1))
            .start()
            .await
            .expect("start the test API server")
    }
}
