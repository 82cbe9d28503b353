//! Starting and stopping the server: storage, HTTP(S) listener, controllers, kubeconfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::api::ApiState;
use crate::auth::tokens::TokenKey;
use crate::auth::{Access, Auth, AuthLayer, Authorization, PeerIdentity, UserInfo};
use crate::http::connections::{ConnectionLimits, track};
use crate::http::guard::RequestGuard;
use crate::http::handlers::{self, ServerState};
use crate::store::storage::{Store, StoreError};
use crate::tls::{TlsError, TlsMaterial};
use caretaker_listener::{Bounds, Connection};

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
    #[error(
        "RBAC authorization needs TLS: users are identified by their client certificates (use --tls)"
    )]
    RbacNeedsTls,
    #[error("the server address {0:?} is not a URL")]
    NotAUrl(String),
    #[error("the server issued no token: {0}")]
    TokenRequest(String),
    #[error("the ServiceAccount token key {path}: {source}")]
    TokenKey {
        path: PathBuf,
        source: std::io::Error,
    },
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
    authorization: Authorization,
    connection_limits: ConnectionLimits,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        ApiServerBuilder {
            data_dir: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            bookmark_interval: Duration::from_secs(10),
            history: crate::store::storage::DEFAULT_HISTORY,
            webhook_services: Default::default(),
            authorization: Authorization::AlwaysAllow,
            connection_limits: ConnectionLimits::default(),
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

    /// How requests are authorized. [`Authorization::Rbac`] needs [`Self::tls`]: users are
    /// the client certificates' subjects, and ServiceAccounts' bearer tokens. Default:
    /// everything is allowed.
    pub fn authorization(mut self, mode: Authorization) -> Self {
        self.authorization = mode;
        self
    }

    /// Bounds on what a connection may cost: TLS handshake, request head and idle timeouts,
    /// and how many may be open at once. Default: 10 s, 30 s, 90 s, 1,024.
    pub fn connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.connection_limits = limits;
        self
    }

    pub async fn start(self) -> Result<ApiServer, ServerError> {
        if self.authorization == Authorization::Rbac && !self.tls {
            return Err(ServerError::RbacNeedsTls);
        }
        crate::tls::install_crypto_provider();
        let store = match &self.data_dir {
            Some(dir) => {
                crate::store::private_files::create_dir(dir).map_err(|source| {
                    ServerError::DataDir {
                        path: dir.clone(),
                        source,
                    }
                })?;
                Store::open(Some(&dir.join(DATABASE_FILE)))?
            }
            None => Store::open(None)?,
        }
        .with_history(self.history);
        let tokens = token_key(self.data_dir.as_deref())?;
        let auth = Arc::new(Auth::new(self.authorization, tokens));
        let mut api = ApiState::new(store)?;
        api.admission = crate::admission::Admission::with_services(self.webhook_services.clone());
        if self.authorization == Authorization::Rbac {
            api.authorizer = Some(auth.clone());
        }
        let api = Arc::new(api);
        api.ensure_default_namespaces().await?;
        if self.authorization == Authorization::Rbac {
            crate::auth::bootstrap::ensure(&api).await?;
        }
        let tls = match (&self.data_dir, self.tls) {
            (_, false) => None,
            (Some(dir), true) => Some(TlsMaterial::load_or_generate(&dir.join("pki"))?),
            (None, true) => Some(TlsMaterial::generate()?),
        };
        let ca_pem = tls.as_ref().map(|t| t.ca_pem.clone()).unwrap_or_default();
        crate::controllers::fill_namespaces(&api, &ca_pem).await?;
        // The admin's own credentials: a client certificate in `system:masters`.
        let admin = match (&tls, self.authorization) {
            (Some(tls), Authorization::Rbac) => {
                let groups = [crate::auth::MASTERS.to_string()];
                Some(tls.client_certificate(ADMIN_USER, &groups)?)
            }
            _ => None,
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
            auth: auth.clone(),
            bookmark_interval: self.bookmark_interval,
        });
        let guard = Arc::new(RequestGuard::new(addr, tls.is_some()));
        let auth_layer = Arc::new(AuthLayer {
            auth: auth.clone(),
            api: api.clone(),
        });
        let router = Router::new()
            .fallback(handlers::dispatch)
            .layer(DefaultBodyLimit::max(handlers::MAX_REQUEST_BODY))
            .layer(axum::middleware::from_fn_with_state(
                auth_layer,
                crate::auth::middleware,
            ))
            .layer(axum::middleware::from_fn_with_state(
                guard,
                crate::http::guard::guard,
            ))
            .with_state(state);
        let acceptor = tls
            .as_ref()
            .map(|m| m.server_config())
            .transpose()?
            .map(tokio_rustls::TlsAcceptor::from);
        let serving = tokio::spawn(serve(listener, router, acceptor, self.connection_limits));
        let controllers = tokio::spawn(crate::controllers::run(api.clone(), ca_pem));
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
            auth,
            admin,
            tasks: vec![serving, controllers],
        })
    }
}

/// The user of the admin kubeconfig when RBAC is on.
pub const ADMIN_USER: &str = "caretaker-admin";

/// The key of ServiceAccount tokens: `pki/serviceaccount.key` in the data directory, or a new
/// one in memory.
fn token_key(data_dir: Option<&Path>) -> Result<TokenKey, ServerError> {
    match data_dir {
        Some(dir) => {
            let pki = dir.join("pki");
            let path = pki.join("serviceaccount.key");
            crate::store::private_files::create_dir(&pki)
                .and_then(|()| TokenKey::load_or_generate(&path))
                .map_err(|source| ServerError::TokenKey { path, source })
        }
        None => TokenKey::generate().map_err(|source| ServerError::TokenKey {
            path: PathBuf::from("(memory)"),
            source,
        }),
    }
}

/// Who a kubeconfig is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A user, by client certificate: CN `name`, O `groups`.
    User { name: String, groups: Vec<String> },
    /// A ServiceAccount, by bearer token.
    ServiceAccount { namespace: String, name: String },
}

impl Subject {
    /// `system:serviceaccount:NAMESPACE:NAME` or a user name (with `groups`; a ServiceAccount
    /// has its own).
    pub fn parse(subject: &str, groups: &[String]) -> Result<Subject, String> {
        if let Some(rest) = subject.strip_prefix("system:serviceaccount:") {
            let (namespace, name) = rest
                .split_once(':')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
                .ok_or_else(|| {
                    format!("{subject:?} is not system:serviceaccount:NAMESPACE:NAME")
                })?;
            if !groups.is_empty() {
                return Err(format!(
                    "a ServiceAccount's groups are its own; {subject} cannot be given others"
                ));
            }
            return Ok(Subject::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        if subject.is_empty() {
            return Err("the user name is empty".into());
        }
        Ok(Subject::User {
            name: subject.into(),
            groups: groups.to_vec(),
        })
    }
}

/// How a kubeconfig's user proves who it is.
enum Credentials {
    Token(String),
    Certificate { cert_pem: String, key_pem: String },
}

fn render_kubeconfig(
    url: &str,
    ca_pem: Option<&str>,
    user: &str,
    credentials: &Credentials,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = ca_pem
        .map(|pem| {
            // The serving certificate names only loopback: a client of a non-loopback
            // listen address verifies it as `localhost`.
            format!(
                "    certificate-authority-data: {}\n    tls-server-name: localhost\n",
                b64(pem)
            )
        })
        .unwrap_or_default();
    let credentials = match credentials {
        Credentials::Token(token) => format!("    token: {token}\n"),
        Credentials::Certificate { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: caretaker\n  cluster:\n    server: {url}\n{ca}users:\n- name: {user:?}\n  user:\n{credentials}contexts:\n- name: caretaker\n  context:\n    cluster: caretaker\n    user: {user:?}\n    namespace: default\ncurrent-context: caretaker\n"
    )
}

/// How long the ServiceAccount tokens in the kubeconfigs the server writes
/// ([`ApiServer::kube_config_for`], [`ApiServer::kubeconfig_for`], [`kubeconfig_for`],
/// `caretaker apiserver --kubeconfig-for`) are valid: a day, longer than any test or demo
/// runs. `kubectl create token NAME --duration D` makes tokens of other lifetimes.
pub const KUBECONFIG_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// A kubeconfig for `subject` on the server at `url` whose data directory is `data_dir`
/// (`caretaker apiserver --kubeconfig-for`): a client certificate from its client CA (the
/// server need not be running), or a ServiceAccount token valid for
/// [`KUBECONFIG_TOKEN_LIFETIME`], which the running server issues (a TokenRequest, as the
/// admin): the token names the ServiceAccount's UID, so the ServiceAccount must exist.
pub async fn kubeconfig_for(
    data_dir: &Path,
    url: &str,
    subject: &Subject,
) -> Result<String, ServerError> {
    let tls = TlsMaterial::load_or_generate(&data_dir.join("pki"))?;
    let (user, credentials) = match subject {
        Subject::ServiceAccount { namespace, name } => (
            crate::auth::service_account_user(namespace, name),
            Credentials::Token(request_token(url, &tls, namespace, name).await?),
        ),
        Subject::User { .. } => user_credentials(Some(&tls), subject)?,
    };
    Ok(render_kubeconfig(
        url,
        Some(&tls.ca_pem),
        &user,
        &credentials,
    ))
}

/// A token for the ServiceAccount `namespace`/`name` from the server at `url` that `tls` is
/// the material of, asked for by its admin.
async fn request_token(
    url: &str,
    tls: &TlsMaterial,
    namespace: &str,
    name: &str,
) -> Result<String, ServerError> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let uri = url
        .parse()
        .map_err(|_| ServerError::NotAUrl(url.to_string()))?;
    let mut config = kube::Config::new(uri);
    config.root_cert = Some(vec![tls.ca_der()?]);
    // The serving certificate names only loopback (see `render_kubeconfig`).
    config.tls_server_name = Some("localhost".into());
    let (cert_pem, key_pem) =
        tls.client_certificate(ADMIN_USER, &[crate::auth::MASTERS.to_string()])?;
    ApiServer::with_certificate(&mut config, &cert_pem, &key_pem);
    let accounts =
        kube::Api::<ServiceAccount>::namespaced(kube::Client::try_from(config)?, namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(KUBECONFIG_TOKEN_LIFETIME.as_secs() as i64),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(name, &Default::default(), &request)
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) => ServerError::TokenRequest(status.message),
            other => ServerError::TokenRequest(other.to_string()),
        })?;
    answer
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ServerError::TokenRequest("the answer holds no token".into()))
}

/// A user's client certificate.
fn user_credentials(
    tls: Option<&TlsMaterial>,
    subject: &Subject,
) -> Result<(String, Credentials), ServerError> {
    let Subject::User { name, groups } = subject else {
        unreachable!("only users have client certificates");
    };
    let tls = tls.ok_or(ServerError::RbacNeedsTls)?;
    let (cert_pem, key_pem) = tls.client_certificate(name, groups)?;
    Ok((name.clone(), Credentials::Certificate { cert_pem, key_pem }))
}

/// Accepts connections until aborted; aborting ends every connection.
async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: ConnectionLimits,
) {
    let bounds = Bounds {
        max_connections: limits.max_connections,
        // No limit per peer: the server's clients are on this machine.
        max_connections_per_peer: limits.max_connections,
        // Usually out of file descriptors: back off instead of spinning.
        accept_retry: Duration::from_millis(50),
    };
    caretaker_listener::serve(listener, "apiserver", bounds, |stream, _, slot| {
        let _ = stream.set_nodelay(true);
        connection(stream, slot, router.clone(), tls.clone(), limits)
    })
    .await
}

/// Serves one connection: its TLS handshake (within the handshake timeout), then its
/// requests, until it closes or stays idle too long.
async fn connection(
    stream: tokio::net::TcpStream,
    slot: Connection,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: ConnectionLimits,
) {
    let Some(acceptor) = tls else {
        slot.established();
        return http(stream, &slot, router, &limits).await;
    };
    let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
        Err(_) => return tracing::debug!("TLS handshake timed out"),
    };
    slot.established();
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| UserInfo::from_certificate(leaf))
        .map(Arc::new);
    let router = router.layer(axum::Extension(PeerIdentity(peer)));
    http(stream, &slot, router, &limits).await
}

/// Answers a connection's requests (HTTP/1.1 or HTTP/2) until it closes or has been idle
/// for its limit; an idle HTTP/2 connection gets a GOAWAY first.
async fn http<I>(io: I, slot: &Connection, router: Router, limits: &ConnectionLimits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let service = track(slot, TowerToHyperService::new(router));
    let served = http.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(served);
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = limits.idle_expired(slot) => {
            served.as_mut().graceful_shutdown();
            // A client that does not let it close is cut off.
            match tokio::time::timeout(limits.header_read_timeout, served).await {
                Ok(result) => result,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// A running server. Dropping it stops it.
pub struct ApiServer {
    url: String,
    addr: SocketAddr,
    tls: Option<TlsMaterial>,
    api: Arc<ApiState>,
    auth: Arc<Auth>,
    /// The admin's client certificate and key, with RBAC on.
    admin: Option<(String, String)>,
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

    /// Client configuration for this server (trusting its CA when serving HTTPS), as the
    /// admin: with RBAC on, a client certificate in `system:masters`.
    pub fn kube_config(&self) -> kube::Config {
        let mut config = self.bare_config();
        if let Some((cert_pem, key_pem)) = &self.admin {
            Self::with_certificate(&mut config, cert_pem, key_pem);
        }
        config
    }

    fn bare_config(&self) -> kube::Config {
        let uri = self.url.parse().expect("the server URL is a valid URI");
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        if let Some(der) = self.tls.as_ref().and_then(|t| t.ca_der().ok()) {
            config.root_cert = Some(vec![der]);
        }
        config
    }

    fn with_certificate(config: &mut kube::Config, cert_pem: &str, key_pem: &str) {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        config.auth_info.client_certificate_data = Some(b64(cert_pem));
        config.auth_info.client_key_data = Some(b64(key_pem).into());
    }

    /// Client configuration acting as `subject`: a client certificate for a user (TLS only),
    /// a bearer token valid for [`KUBECONFIG_TOKEN_LIFETIME`] for a ServiceAccount (which must
    /// exist: the token names its UID).
    pub fn kube_config_for(&self, subject: &Subject) -> Result<kube::Config, ServerError> {
        let mut config = self.bare_config();
        match self.credentials(subject)?.1 {
            Credentials::Token(token) => config.auth_info.token = Some(token.into()),
            Credentials::Certificate { cert_pem, key_pem } => {
                Self::with_certificate(&mut config, &cert_pem, &key_pem)
            }
        }
        Ok(config)
    }

    /// A kubeconfig (YAML) acting as `subject`, as [`Self::kube_config_for`].
    pub fn kubeconfig_for(&self, subject: &Subject) -> Result<String, ServerError> {
        let (user, credentials) = self.credentials(subject)?;
        Ok(render_kubeconfig(
            &self.url,
            self.ca_pem(),
            &user,
            &credentials,
        ))
    }

    /// A bearer token for the ServiceAccount `namespace`/`name`, valid for `lifetime` (any,
    /// unlike a TokenRequest's ten minutes at the least): tests use it for tokens that expire
    /// while they watch.
    pub fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        lifetime: Duration,
    ) -> Result<String, ServerError> {
        let lifetime = i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX);
        Ok(crate::auth::token_request::issue(
            &self.api,
            self.auth.tokens(),
            namespace,
            name,
            crate::auth::unix_now(),
            lifetime,
        )?)
    }

    fn credentials(&self, subject: &Subject) -> Result<(String, Credentials), ServerError> {
        match subject {
            Subject::ServiceAccount { namespace, name } => Ok((
                crate::auth::service_account_user(namespace, name),
                Credentials::Token(self.service_account_token(
                    namespace,
                    name,
                    KUBECONFIG_TOKEN_LIFETIME,
                )?),
            )),
            Subject::User { .. } => user_credentials(self.tls.as_ref(), subject),
        }
    }

    /// Every kind of resource request each user made (with RBAC on): verb, group, resource,
    /// subresource, namespace, and whether it was allowed.
    pub fn access_log(&self) -> Vec<Access> {
        self.auth.access_log()
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config())
            .expect("a client for a loopback URL can always be built")
    }

    /// A kubeconfig (YAML) for this server, with the CA inline when serving HTTPS. With RBAC
    /// on, its user is the admin (`system:masters`, by client certificate).
    pub fn kubeconfig(&self) -> String {
        let (user, credentials) = match &self.admin {
            Some((cert_pem, key_pem)) => (
                ADMIN_USER,
                Credentials::Certificate {
                    cert_pem: cert_pem.clone(),
                    key_pem: key_pem.clone(),
                },
            ),
            // The server does not authenticate; a token keeps kubectl from prompting for a
            // password.
            None => ("caretaker", Credentials::Token("caretaker-no-auth".into())),
        };
        render_kubeconfig(&self.url, self.ca_pem(), user, &credentials)
    }

    /// Writes [`Self::kubeconfig`] to `path` (mode 0600).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        crate::store::private_files::write(path.as_ref(), &self.kubeconfig())
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
