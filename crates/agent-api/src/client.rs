//! [`AgentClient`]: the operator's side of every call to an agent.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::etcd::{InstallOutcome, InstallRequest, Installed};
use crate::inventory::Inventory;
use crate::refresh::{ApplyOutcome, ApplyRequest, PlanRequest, PlanStatus, RefreshPlan};
use crate::tls::{ClientIdentity, NotTheNode, TlsError, not_the_node};
use crate::upgrade::{Operation, UpgradeRequest};
use crate::{BUSY, ErrorBody, Health};

/// Why a call to an agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid agent URL {0:?}: expected https://HOST:PORT")]
    BadUrl(String),
    #[error("cannot connect to the agent at {url}: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("TLS handshake with the agent at {url} failed: {source}")]
    Tls { url: String, source: std::io::Error },
    #[error("the agent at {url} is not this Machine's node's agent: {mismatch}")]
    NotTheNode { url: String, mismatch: NotTheNode },
    #[error("the agent at {url} sent a reply larger than {limit} bytes; it was not read")]
    ReplyTooLarge { url: String, limit: usize },
    #[error("the agent at {url} did not answer within {}s", timeout.as_secs())]
    Timeout { url: String, timeout: Duration },
    #[error("the agent at {url} answered {status} {reason}: {message}")]
    Status {
        url: String,
        status: u16,
        reason: String,
        message: String,
    },
    #[error("talking to the agent at {url}: {message}")]
    Protocol { url: String, message: String },
}

impl AgentError {
    /// Whether trying again later may help: the agent was unreachable, slow, or failed
    /// internally; not when it refused the request itself.
    pub fn is_transient(&self) -> bool {
        match self {
            AgentError::Connect { .. } | AgentError::Tls { .. } | AgentError::Timeout { .. } => {
                true
            }
            AgentError::Protocol { .. } => true,
            AgentError::Status { status, .. } => *status >= 500,
            // Another node's agent, or one that floods: asking again will not change that.
            AgentError::BadUrl(_)
            | AgentError::NotTheNode { .. }
            | AgentError::ReplyTooLarge { .. } => false,
        }
    }

    /// Whether the agent answered [`BUSY`]: the caller should wait, not count a failure.
    pub fn is_busy(&self) -> bool {
        matches!(self, AgentError::Status { status: 409, reason, .. } if reason == BUSY)
    }
}

/// A mutual-TLS client for the agents' API.
#[derive(Clone)]
pub struct AgentClient {
    connector: TlsConnector,
    timeout: Duration,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The most an agent's reply may hold. Real replies are a few KiB (an inventory, a plan of
/// CSRs, an output tail); a larger one is a broken or hostile agent, and is not read into memory.
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;

impl AgentClient {
    /// `tls` comes from [`crate::tls::client_config`]. Every call gives up after `timeout`.
    pub fn new(tls: rustls::ClientConfig, timeout: Duration) -> Self {
        Self {
            connector: TlsConnector::from(Arc::new(tls)),
            timeout,
        }
    }

    /// A client that talks only to an agent whose serving certificate names one of `names` (a
    /// node's name and addresses), wherever its URL points.
    pub fn for_node(
        identity: &ClientIdentity,
        names: &[String],
        timeout: Duration,
    ) -> Result<Self, TlsError> {
        Ok(Self::new(identity.config_for_node(names)?, timeout))
    }

    pub async fn health(&self, url: &str) -> Result<Health, AgentError> {
        self.call(url, Method::GET, "/v1/health", None::<&()>).await
    }

    pub async fn certificates(&self, url: &str) -> Result<Inventory, AgentError> {
        self.call(url, Method::GET, "/v1/certificates", None::<&()>)
            .await
    }

    pub async fn plan(&self, url: &str, request: &PlanRequest) -> Result<RefreshPlan, AgentError> {
        self.call(url, Method::POST, "/v1/certificates/plan", Some(request))
            .await
    }

    pub async fn apply(
        &self,
        url: &str,
        request: &ApplyRequest,
    ) -> Result<ApplyOutcome, AgentError> {
        self.call(url, Method::POST, "/v1/certificates/apply", Some(request))
            .await
    }

    /// Whether a plan is still staged or was applied.
    pub async fn plan_status(&self, url: &str, plan_id: &str) -> Result<PlanStatus, AgentError> {
        let path = format!("/v1/certificates/plans/{}", encode_segment(plan_id));
        self.call(url, Method::GET, &path, None::<&()>).await
    }

    /// The etcd member this agent installs for, and the revision in place. A member name or
    /// revision out of shape (a name over [`MAX_MEMBER_NAME_BYTES`]) is refused: the answer
    /// goes into status and events.
    pub async fn etcd_installed(&self, url: &str) -> Result<Installed, AgentError> {
        let installed: Installed = self.call(url, Method::GET, "/v1/etcd", None::<&()>).await?;
        installed.check().map_err(|message| AgentError::Protocol {
            url: url.to_string(),
            message,
        })?;
        Ok(installed)
    }

    /// Installs one revision of a member's files; answers once the member is healthy with them
    /// (the client's timeout must allow for the agent's restart hook and health wait).
    pub async fn etcd_install(
        &self,
        url: &str,
        request: &InstallRequest,
    ) -> Result<InstallOutcome, AgentError> {
        let outcome: InstallOutcome =
            (self.call(url, Method::POST, "/v1/etcd/revisions", Some(request))).await?;
        outcome.check().map_err(|message| AgentError::Protocol {
            url: url.to_string(),
            message,
        })?;
        Ok(outcome)
    }

    pub async fn start_upgrade(
        &self,
        url: &str,
        request: &UpgradeRequest,
    ) -> Result<Operation, AgentError> {
        self.call(url, Method::POST, "/v1/upgrades", Some(request))
            .await
    }

    pub async fn operation(&self, url: &str, id: &str) -> Result<Operation, AgentError> {
        let path = format!("/v1/operations/{}", encode_segment(id));
        self.call(url, Method::GET, &path, None::<&()>).await
    }

    pub async fn cancel(&self, url: &str, id: &str) -> Result<Operation, AgentError> {
        let path = format!("/v1/operations/{}/cancel", encode_segment(id));
        self.call(url, Method::POST, &path, None::<&()>).await
    }

    /// Calls to the agent at `url` over one connection, opened at the first call: see
    /// [`AgentSession`].
    pub fn session(&self, url: &str) -> AgentSession<'_> {
        AgentSession {
            client: self,
            base: url.trim_end_matches('/').to_string(),
            connection: None,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        url: &str,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, AgentError> {
        self.session(url).call(method, path, body).await
    }

    /// A new mutual-TLS connection to the agent at `base`.
    async fn connect(&self, base: &str) -> Result<Connection, AgentError> {
        let uri: Uri = base.parse().map_err(|_| AgentError::BadUrl(base.into()))?;
        if uri.scheme_str() != Some("https") {
            return Err(AgentError::BadUrl(base.into()));
        }
        let host = uri.host().ok_or_else(|| AgentError::BadUrl(base.into()))?;
        let port = uri.port_u16().unwrap_or(443);
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let server_name =
            ServerName::try_from(bare_host.clone()).map_err(|_| AgentError::BadUrl(base.into()))?;

        let tcp = TcpStream::connect((bare_host.as_str(), port))
            .await
            .map_err(|source| AgentError::Connect {
                url: base.into(),
                source,
            })?;
        let tls = self
            .connector
            .connect(server_name, tcp)
            .await
            .map_err(|source| match not_the_node(&source) {
                Some(mismatch) => AgentError::NotTheNode {
                    url: base.into(),
                    mismatch: mismatch.clone(),
                },
                None => AgentError::Tls {
                    url: base.into(),
                    source,
                },
            })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| AgentError::Protocol {
                url: base.into(),
                message: e.to_string(),
            })?;
        tokio::spawn(connection);
        Ok(Connection {
            sender,
            host: host.to_string(),
        })
    }
}

/// One open connection to an agent.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// The `Host` header its requests carry.
    host: String,
}

/// Calls to one agent over one connection, opened at the first call and kept for the next
/// (a refresh's plan and apply, a few milliseconds apart): one TLS handshake where each call
/// made its own. The connection closes when the session is dropped, so it holds none of the
/// agent's connection slots while idle. A request goes on a new connection only when the old
/// one had closed before the request was sent (hyper hands such a request back), so no request
/// ever reaches the agent twice.
pub struct AgentSession<'a> {
    client: &'a AgentClient,
    base: String,
    connection: Option<Connection>,
}

impl AgentSession<'_> {
    /// Opens the session's connection now (TCP and the TLS handshake; no request), so that a
    /// caller can overlap it with its own work before the first call.
    pub async fn open(&mut self) -> Result<(), AgentError> {
        if self.is_open() {
            return Ok(());
        }
        let timeout = self.client.timeout;
        let connection = tokio::time::timeout(timeout, self.client.connect(&self.base))
            .await
            .map_err(|_| self.timed_out())??;
        self.connection = Some(connection);
        Ok(())
    }

    /// Whether the session holds a connection the agent has not closed.
    fn is_open(&self) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|c| !c.sender.is_closed())
    }

    fn timed_out(&self) -> AgentError {
        AgentError::Timeout {
            url: self.base.clone(),
            timeout: self.client.timeout,
        }
    }

    pub async fn plan(&mut self, request: &PlanRequest) -> Result<RefreshPlan, AgentError> {
        self.call(Method::POST, "/v1/certificates/plan", Some(request))
            .await
    }

    pub async fn apply(&mut self, request: &ApplyRequest) -> Result<ApplyOutcome, AgentError> {
        self.call(Method::POST, "/v1/certificates/apply", Some(request))
            .await
    }

    /// Whether a plan is still staged or was applied.
    pub async fn plan_status(&mut self, plan_id: &str) -> Result<PlanStatus, AgentError> {
        let path = format!("/v1/certificates/plans/{}", encode_segment(plan_id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, AgentError> {
        let timeout = self.client.timeout;
        match tokio::time::timeout(timeout, self.exchange(method, path, body)).await {
            Ok(result) => result,
            Err(_) => {
                // The request may be half sent: the connection is not used again.
                self.connection = None;
                Err(self.timed_out())
            }
        }
    }

    async fn exchange<B: Serialize, T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, AgentError> {
        let base = self.base.clone();
        let protocol = |message: String| AgentError::Protocol {
            url: base.clone(),
            message,
        };
        let payload = match body {
            Some(body) => {
                Bytes::from(serde_json::to_vec(body).map_err(|e| protocol(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let mut reused = self.is_open();
        let mut connection = match self.connection.take() {
            Some(open) if reused => open,
            _ => self.client.connect(&base).await?,
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", connection.host.as_str())
            .header("content-type", "application/json")
            .body(Full::new(payload))
            .map_err(|e| protocol(e.to_string()))?;
        let response = loop {
            match connection.sender.try_send_request(request).await {
                Ok(response) => break response,
                // Closed before the request went out: the request comes back unsent, and goes
                // once on a new connection.
                Err(mut e) if reused && e.message().is_some() => {
                    request = e.take_message().expect("checked above");
                    reused = false;
                    connection = self.client.connect(&base).await?;
                }
                Err(e) => return Err(protocol(e.into_error().to_string())),
            }
        };
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    AgentError::ReplyTooLarge {
                        url: base.clone(),
                        limit: MAX_REPLY_BYTES,
                    }
                } else {
                    protocol(e.to_string())
                }
            })?
            .to_bytes();
        // Read whole: the connection can carry the next call.
        self.connection = Some(connection);
        if !status.is_success() {
            let (reason, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => (e.reason, e.message),
                Err(_) => (String::new(), String::from_utf8_lossy(&bytes).into_owned()),
            };
            return Err(AgentError::Status {
                url: base,
                status: status.as_u16(),
                reason: bounded(reason, MAX_REASON_BYTES),
                message: bounded(message, MAX_MESSAGE_BYTES),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| protocol(format!("unexpected answer: {e}")))
    }
}

/// The most of an agent's error message kept (it goes into events, conditions and logs); the
/// rest is cut, saying how much.
pub const MAX_MESSAGE_BYTES: usize = 2048;
/// The most of an agent's error reason kept (a reason is one word).
pub const MAX_REASON_BYTES: usize = 64;

/// `text` cut to at most `limit` bytes (on a character boundary), saying how many were cut.
pub fn bounded(text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes cut)", &text[..end], text.len() - end)
}

/// Operation ids are hex; anything else is percent-encoded so it stays one path segment.
fn encode_segment(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
