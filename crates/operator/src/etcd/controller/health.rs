//! Asks an etcd member for its health over mutual TLS: `GET /health` on its client URL, with
//! the client certificate the spec names, verifying the member against `etcd-ca-bundle`. The
//! same handshake tells which serving certificate the member presents (what revision it runs),
//! and, during a rotation, a second handshake with a short-lived client certificate from the
//! next signer tells whether the member already trusts it. That certificate lives only in
//! memory, for one pass.

use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::tls::ClientIdentity;
use caretaker_pki::{KeyAlgorithm, LeafSpec, Usage};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::authority::bundle::Bundle;
use crate::authority::{CaKeyPair, Certificate, Mint, PkiMint};
use crate::etcd::{EndpointHealth, MemberAnswer};

/// How long one member may take to answer.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The most of a `/health` reply that is read; etcd's is a few dozen bytes.
const MAX_REPLY: usize = 16 * 1024;

/// Who asks: the trust members are verified with, the client pair to present, and the next
/// signer to probe with (during a rotation).
pub(crate) struct Asker {
    client: Option<Arc<rustls::ClientConfig>>,
    probe: Option<Arc<rustls::ClientConfig>>,
    problem: Option<String>,
}

impl Asker {
    /// `client`: the PEM certificate and key of the client Secret (`None`: not there yet).
    pub(crate) fn new(
        trust: Option<&Bundle>,
        client: Option<(&str, &str)>,
        next: Option<&CaKeyPair>,
    ) -> Self {
        let Some(trust) = trust else {
            return Self::unable("no etcd-signer or etcd-ca-bundle to verify members with");
        };
        let Some((crt, key)) = client else {
            return Self::unable("the client certificate Secret has no tls.crt and tls.key yet");
        };
        let roots = trust.text();
        let config = |crt: &str, key: &str| {
            ClientIdentity::from_pem(&roots, crt, key)
                .and_then(|identity| identity.config())
                .map(Arc::new)
        };
        let client = match config(crt, key) {
            Ok(config) => config,
            Err(e) => return Self::unable(&format!("the client certificate: {e}")),
        };
        let probe = next.and_then(|next| {
            let spec = LeafSpec {
                validity: "10m".parse().expect("a TTL"),
                algorithm: KeyAlgorithm::EcdsaP256,
                ..LeafSpec::new("caretaker-trust-probe", Usage::Client)
            };
            let issued = PkiMint.issue(next, &spec).ok()?;
            config(issued.certificate.pem(), issued.key.expose()).ok()
        });
        Self {
            client: Some(client),
            probe,
            problem: None,
        }
    }

    fn unable(problem: &str) -> Self {
        Self {
            client: None,
            probe: None,
            problem: Some(problem.to_string()),
        }
    }

    /// Every endpoint's answer, asked at once.
    pub(crate) async fn ask_all(&self, endpoints: &[String]) -> Vec<EndpointHealth> {
        futures::future::join_all(endpoints.iter().map(|e| self.ask(e))).await
    }

    async fn ask(&self, endpoint: &str) -> EndpointHealth {
        let answer = match &self.client {
            None => Err(self.problem.clone().unwrap_or_default()),
            Some(client) => match get_health(client, endpoint).await {
                Err(e) => Err(e),
                Ok((healthy, serving)) => {
                    let accepts_next = match &self.probe {
                        None => None,
                        Some(probe) => Some(get_health(probe, endpoint).await.is_ok()),
                    };
                    Ok(MemberAnswer {
                        healthy,
                        serving,
                        accepts_next,
                    })
                }
            },
        };
        EndpointHealth {
            endpoint: endpoint.to_string(),
            answer,
        }
    }
}

/// `GET /health` at `endpoint`: whether etcd says healthy, and the serving certificate it
/// presented. An error says why there was no answer.
async fn get_health(
    config: &Arc<rustls::ClientConfig>,
    endpoint: &str,
) -> Result<(bool, Option<Certificate>), String> {
    match tokio::time::timeout(TIMEOUT, exchange(config, endpoint)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {}s", TIMEOUT.as_secs())),
    }
}

async fn exchange(
    config: &Arc<rustls::ClientConfig>,
    endpoint: &str,
) -> Result<(bool, Option<Certificate>), String> {
    let uri: hyper::Uri = endpoint
        .parse()
        .map_err(|_| format!("{endpoint:?} is not a URL"))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("{endpoint:?} has no host"))?
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(2379);
    let name = ServerName::try_from(host.clone()).map_err(|e| format!("{host:?}: {e}"))?;
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut tls = TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let serving = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|der| Certificate::from_der(der.to_vec()).ok());
    let request = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // A member that refuses the client certificate says so here, after the handshake.
        let n = tls.read(&mut buf).await.map_err(|e| format!("TLS: {e}"))?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply.len() > MAX_REPLY {
            return Err(format!("a reply over {MAX_REPLY} bytes"));
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    // etcd's /health: `{"health":"true"}` (and a reason when false), 503 when unhealthy.
    let healthy = status == "200"
        && serde_json::from_str::<serde_json::Value>(body.trim())
            .ok()
            .or_else(|| dechunk(body))
            .is_some_and(|v| v["health"] == "true");
    if !healthy && status.is_empty() {
        return Err("not an HTTP reply".into());
    }
    Ok((healthy, serving))
}

/// A chunked body's JSON, for servers that chunk even a short reply.
fn dechunk(body: &str) -> Option<serde_json::Value> {
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    serde_json::from_str(&body[start..=end]).ok()
}
