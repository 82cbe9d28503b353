//! The agent's HTTPS API, mutual TLS only: the routes of the table in [`caretaker_agent_api`],
//! one refresh step at a time, and bounds on what connections may cost.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use caretaker_listener::{Bounds, Connection};
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use caretaker_agent_api::etcd::{
    HOOK_FAILED, InstallRequest, MAX_INSTALL_BYTES, NOT_HEALTHY, WRONG_MEMBER,
};
use caretaker_agent_api::inventory::Inventory;
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest, PlanStatus};
use caretaker_agent_api::upgrade::UpgradeRequest;
use caretaker_agent_api::{BUSY, ErrorBody, Health};

use crate::etcd::{EtcdInstaller, InstallError};
use crate::inventory;
use crate::refresh::{RefreshError, Refresher};
use crate::upgrade::{UpgradeError, Upgrader};

/// What the API serves.
#[derive(Debug, Clone)]
pub struct AgentService {
    refresher: Refresher,
    upgrader: Upgrader,
    /// The work on the node's certificate files running, if any. One at a time: a refresh's
    /// plans and applies and an etcd install touch the same files (kubeadm's etcd peer and
    /// serving pairs are both a refresh's slots and the installer's), and an install restarts
    /// the member.
    file_work: Arc<Mutex<Option<FileWork>>>,
    /// The etcd revision installer, when the agent has an etcd section.
    etcd: Option<EtcdInstaller>,
}

/// Work on the node's certificate files in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileWork {
    Planning,
    Applying { plan_id: String },
    InstallingEtcd,
}

/// The right to work on the files; dropping it (when the work ends, whoever waited for
/// it) lets the next one run.
struct FileTicket(Arc<Mutex<Option<FileWork>>>);

impl Drop for FileTicket {
    fn drop(&mut self) {
        *self.0.lock().expect("file work lock") = None;
    }
}

impl AgentService {
    pub fn new(refresher: Refresher, upgrader: Upgrader) -> Self {
        Self {
            refresher,
            upgrader,
            file_work: Arc::default(),
            etcd: None,
        }
    }

    /// Serves `GET /v1/etcd` and `POST /v1/etcd/revisions` for this node's etcd member.
    pub fn with_etcd(mut self, installer: Option<EtcdInstaller>) -> Self {
        self.etcd = installer;
        self
    }

    /// Claims the node for `work`, or answers busy: the caller should wait and ask again,
    /// never queue behind (an apply may run its restart hook for minutes).
    fn begin(&self, work: FileWork) -> Result<FileTicket, ApiError> {
        let mut running = self.file_work.lock().expect("file work lock");
        if let Some(current) = running.as_ref() {
            let what = match current {
                FileWork::Planning => "a refresh plan is being made".to_string(),
                FileWork::Applying { plan_id } => format!("plan {plan_id} is being applied"),
                FileWork::InstallingEtcd => "an etcd revision is being installed".to_string(),
            };
            return Err(ApiError(
                StatusCode::CONFLICT,
                BUSY,
                format!("{what}; ask again when it has finished"),
            ));
        }
        *running = Some(work);
        Ok(FileTicket(self.file_work.clone()))
    }

    fn is_applying(&self, plan_id: &str) -> bool {
        matches!(
            self.file_work.lock().expect("file work lock").as_ref(),
            Some(FileWork::Applying { plan_id: running }) if running == plan_id
        )
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/health", get(health))
            .route("/v1/certificates", get(certificates))
            .route("/v1/certificates/plan", post(plan))
            .route("/v1/certificates/apply", post(apply))
            .route("/v1/certificates/plans/{id}", get(plan_status))
            .route("/v1/upgrades", post(start_upgrade))
            .route("/v1/operations/{id}", get(operation))
            .route("/v1/operations/{id}/cancel", post(cancel))
            .route("/v1/etcd", get(etcd_installed))
            .route(
                "/v1/etcd/revisions",
                post(etcd_install).layer(DefaultBodyLimit::max(MAX_INSTALL_BYTES)),
            )
            .with_state(self)
    }
}

/// An error answer.
struct ApiError(StatusCode, &'static str, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            reason: self.1.to_string(),
            message: self.2,
        };
        (self.0, Json(body)).into_response()
    }
}

impl From<RefreshError> for ApiError {
    fn from(e: RefreshError) -> Self {
        let (status, reason) = match &e {
            RefreshError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            RefreshError::UnknownPlan(_) => (StatusCode::NOT_FOUND, "NotFound"),
            RefreshError::Rejected { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "Rejected"),
            RefreshError::Io { .. } | RefreshError::Node(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal")
            }
        };
        ApiError(status, reason, e.to_string())
    }
}

impl From<UpgradeError> for ApiError {
    fn from(e: UpgradeError) -> Self {
        let (status, reason) = match &e {
            UpgradeError::BadOption(_) | UpgradeError::BadRequestId(_) => {
                (StatusCode::BAD_REQUEST, "BadRequest")
            }
            UpgradeError::UnknownOperation(_) => (StatusCode::NOT_FOUND, "NotFound"),
            UpgradeError::Busy(_) => (StatusCode::CONFLICT, BUSY),
            UpgradeError::NotConfigured | UpgradeError::Spawn(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal")
            }
        };
        ApiError(status, reason, e.to_string())
    }
}

impl From<InstallError> for ApiError {
    fn from(e: InstallError) -> Self {
        let (status, reason) = match &e {
            InstallError::WrongMember { .. } => (StatusCode::FORBIDDEN, WRONG_MEMBER),
            InstallError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            InstallError::HookFailed { .. } => (StatusCode::INTERNAL_SERVER_ERROR, HOOK_FAILED),
            InstallError::NotHealthy { .. } => (StatusCode::GATEWAY_TIMEOUT, NOT_HEALTHY),
            InstallError::Io { .. } | InstallError::NotRegularFile { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "Internal")
            }
        };
        ApiError(status, reason, e.to_string())
    }
}

fn body<T>(json: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    json.map(|Json(t)| t)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, "BadRequest", e.body_text()))
}

async fn health(State(s): State<AgentService>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        release: s.upgrader.current_release(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn certificates(State(s): State<AgentService>) -> Json<Inventory> {
    let layout = s.refresher.layout().clone();
    let inventory = tokio::task::spawn_blocking(move || inventory::discover(&layout))
        .await
        .unwrap_or_default();
    Json(inventory)
}

async fn plan(
    State(s): State<AgentService>,
    json: Result<Json<PlanRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(json)?;
    let ticket = s.begin(FileWork::Planning)?;
    let refresher = s.refresher.clone();
    let plan = run_to_completion(ticket, move || refresher.plan(&request)).await??;
    Ok(Json(plan).into_response())
}

async fn apply(
    State(s): State<AgentService>,
    json: Result<Json<ApplyRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(json)?;
    let ticket = s.begin(FileWork::Applying {
        plan_id: request.plan_id.clone(),
    })?;
    let refresher = s.refresher.clone();
    let outcome = run_to_completion(ticket, move || refresher.apply(&request)).await??;
    Ok(Json(outcome).into_response())
}

/// Runs work on the files on a blocking thread that owns `ticket`: if the client goes away the
/// work still runs to its end (and records its outcome) and only then frees the node.
async fn run_to_completion<T: Send + 'static>(
    ticket: FileTicket,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || {
        let result = work();
        drop(ticket);
        result
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "Internal", e.to_string()))
}

async fn plan_status(
    State(s): State<AgentService>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if s.is_applying(&id) {
        return Ok(Json(PlanStatus::Applying).into_response());
    }
    let refresher = s.refresher.clone();
    let status = tokio::task::spawn_blocking(move || refresher.plan_status(&id))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "Internal", e.to_string()))??;
    Ok(Json(status).into_response())
}

async fn start_upgrade(
    State(s): State<AgentService>,
    json: Result<Json<UpgradeRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let operation = s.upgrader.start(&body(json)?)?;
    Ok((StatusCode::ACCEPTED, Json(operation)).into_response())
}

async fn operation(
    State(s): State<AgentService>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(s.upgrader.get(&id)?).into_response())
}

async fn cancel(
    State(s): State<AgentService>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(s.upgrader.cancel(&id)?).into_response())
}

fn etcd_of(s: &AgentService) -> Result<EtcdInstaller, ApiError> {
    s.etcd.clone().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "NotFound",
            "this agent has no etcd section (--etcd-member)".into(),
        )
    })
}

async fn etcd_installed(State(s): State<AgentService>) -> Result<Response, ApiError> {
    let installer = etcd_of(&s)?;
    Ok(Json(installer.installed()).into_response())
}

/// Clears the install flag when the install's work ends, whoever waited for it.
async fn etcd_install(
    State(s): State<AgentService>,
    json: Result<Json<InstallRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let installer = etcd_of(&s)?;
    if let Err(e) = &json
        && e.status() == StatusCode::PAYLOAD_TOO_LARGE
    {
        let message = format!("an install body holds at most {MAX_INSTALL_BYTES} bytes");
        return Err(ApiError(StatusCode::PAYLOAD_TOO_LARGE, "TooLarge", message));
    }
    let request = body(json)?;
    let ticket = s.begin(FileWork::InstallingEtcd)?;
    // Runs to its end even if the client goes away: the member is restarted at most once.
    let outcome = run_to_completion(ticket, move || installer.install(&request)).await??;
    Ok(Json(outcome).into_response())
}

/// Bounds on what connections may cost the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// How long a client may take to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Connections open at once. A new one over the limit closes the oldest one still in its
    /// handshake, or else the oldest between requests; only when every connection is answering
    /// a request is it refused. Silent connections cannot keep the operator out.
    pub max_connections: usize,
    /// Connections one peer address may hold at once, with the same rule among its own: one
    /// hostile host holding idle connections cannot take every slot.
    pub max_connections_per_peer: usize,
    /// How long to pause after a failed accept (out of file descriptors, say) before the next.
    pub accept_retry: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_connections_per_peer: 8,
            accept_retry: Duration::from_millis(200),
        }
    }
}

/// Serves `router` over mutual TLS on `listener` until the task is dropped. Connections whose
/// handshake fails (no client certificate, a wrong one, or plain HTTP) are closed without any
/// HTTP answer.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
) -> std::io::Result<()> {
    serve_with(listener, tls, router, ServeLimits::default()).await
}

/// [`serve`] within `limits`. A failed accept never ends serving: it is logged and tried again
/// after a pause, since it is usually temporary (no file descriptor free) and an agent that
/// exits cannot be reached to refresh anything.
pub async fn serve_with(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
    limits: ServeLimits,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let bounds = Bounds {
        max_connections: limits.max_connections,
        max_connections_per_peer: limits.max_connections_per_peer,
        accept_retry: limits.accept_retry,
    };
    caretaker_listener::serve(listener, "agent", bounds, |stream, peer, slot| {
        serve_connection(
            acceptor.clone(),
            stream,
            peer,
            slot,
            router.clone(),
            limits.handshake_timeout,
        )
    })
    .await;
    Ok(())
}

async fn serve_connection(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Connection,
    router: Router,
    handshake_timeout: Duration,
) {
    let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "refused a TLS connection");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake timed out");
            return;
        }
    };
    slot.established();
    let router = TowerToHyperService::new(router);
    // A request in progress (an apply may run its restart hook for minutes) keeps its
    // connection from being closed to make room.
    let service = hyper::service::service_fn(move |request| slot.busy_during(router.call(request)));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
