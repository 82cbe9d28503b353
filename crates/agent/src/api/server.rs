use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{ErrorBody, Health};
use crate::inventory;
use crate::refresh::{ApplyRequest, PlanRequest, RefreshError, Refresher};
use crate::upgrade::{UpgradeError, UpgradeRequest, Upgrader};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API serves.
#[derive(Debug, Clone)]
pub struct AgentService {
    refresher: Refresher,
    upgrader: Upgrader,
    /// One refresh step at a time: plans and applies touch the same files.
    refresh_lock: Arc<tokio::sync::Mutex<()>>,
}

impl AgentService {
    pub fn new(refresher: Refresher, upgrader: Upgrader) -> Self {
        Self {
            refresher,
            upgrader,
            refresh_lock: Arc::default(),
        }
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
            UpgradeError::Busy(_) => (StatusCode::CONFLICT, "Conflict"),
            UpgradeError::NotConfigured | UpgradeError::Spawn(_) => {
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

async fn certificates(State(s): State<AgentService>) -> Json<inventory::Inventory> {
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
    let _guard = s.refresh_lock.lock().await;
    let refresher = s.refresher.clone();
    let plan = tokio::task::spawn_blocking(move || refresher.plan(&request))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "Internal", e.to_string()))??;
    Ok(Json(plan).into_response())
}

async fn apply(
    State(s): State<AgentService>,
    json: Result<Json<ApplyRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let request = body(json)?;
    let _guard = s.refresh_lock.lock().await;
    let refresher = s.refresher.clone();
    let outcome = tokio::task::spawn_blocking(move || refresher.apply(&request))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, "Internal", e.to_string()))??;
    Ok(Json(outcome).into_response())
}

async fn plan_status(
    State(s): State<AgentService>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
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

/// Serves `router` over mutual TLS on `listener` until the task is dropped. Connections whose
/// handshake fails (no client certificate, a wrong one, or plain HTTP) are closed without any
/// HTTP answer.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    loop {
        let (stream, peer) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let router = router.clone();
        tokio::spawn(async move { serve_connection(acceptor, stream, peer, router).await });
    }
}

async fn serve_connection(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
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
    let service = TowerToHyperService::new(router);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
