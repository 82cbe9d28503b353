//! An agent that dies on every request: it completes mutual TLS with a serving certificate
//! from the cluster CA naming the node, reads the request head, notes it, and closes the
//! connection without answering. The operator sees a transient error each time, as from an
//! agent that crashes, so it retries; what it asked and when is recorded to count its attempts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_agent::tls;
use caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT;
use caretaker_testkit::provision::{ClusterCas, agent_serving_leaf};
use tokio::io::AsyncReadExt;

pub struct Unanswering {
    pub url: String,
    /// The request line (`POST /v1/...`) of each request, when its head was read.
    requests: Arc<Mutex<Vec<(String, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Unanswering {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Unanswering {
    /// Serves as the agent of node `node_name` on 127.0.0.1.
    pub async fn start(cas: &ClusterCas, node_name: &str) -> Self {
        let serving = cas
            .cluster
            .issue(&agent_serving_leaf(node_name, &[]))
            .unwrap();
        let config = tls::server_config(
            &serving.certificate_pem,
            &serving.key.unwrap().to_pem(),
            &cas.cluster.certificate_pem(),
            DEFAULT_ALLOWED_CLIENT,
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let noted = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, noted) = (acceptor.clone(), noted.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if let Some(line) = request_line(&mut tls).await {
                        noted.lock().unwrap().push((line, Instant::now()));
                    }
                    // Dropped here: the connection closes with no answer.
                });
            }
        });
        Self {
            url,
            requests,
            task,
        }
    }

    /// When each request whose request line starts with `prefix` (`POST /v1/upgrades`) came.
    pub fn requests(&self, prefix: &str) -> Vec<Instant> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(line, _)| line.starts_with(prefix))
            .map(|(_, at)| *at)
            .collect()
    }
}

/// The first line of a request, once its whole head has arrived.
async fn request_line(stream: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await.ok()?;
        if read == 0 {
            return None;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let head = String::from_utf8_lossy(&head);
    head.lines().next().map(str::to_string)
}

/// Settings for counting retries: three attempts, the backoff starting at 1 s.
pub fn three_attempts() -> caretaker_operator::Settings {
    caretaker_operator::Settings {
        max_attempts: 3,
        retry_base: Duration::from_secs(1),
        ..super::fast()
    }
}

/// Checks that `requests` (from [`Unanswering::requests`]) are one per attempt of
/// [`three_attempts`], and that the last retry waited out its backoff.
pub fn assert_three_backed_off_attempts(requests: &[Instant]) {
    assert_eq!(requests.len(), 3, "one request per attempt: {requests:?}");
    // The backoff after the second failure is 2 s; the Machine records the retry time to the
    // second, which may take up to 1 s off. The first backoff (1 s) may so shrink to nothing.
    let second_wait = requests[2] - requests[1];
    assert!(
        second_wait >= Duration::from_secs(1),
        "the third attempt waited only {second_wait:?}"
    );
}
