//! An agent serving one node directory on loopback inside this process, with a serving
//! certificate from the cluster CA. For tests and tools that need a real agent without a
//! separate process.

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::refresh::Refresher;
use caretaker_agent::server::{AgentService, serve};
use caretaker_agent::upgrade::Upgrader;
use caretaker_agent::{NodeLayout, tls};
use caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT;
use caretaker_pki::{CertificateAuthority, LeafSpec};

/// A running in-process agent; it stops when dropped.
pub struct LocalAgent {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl LocalAgent {
    /// Starts serving `layout` on 127.0.0.1 with an ephemeral port, presenting a certificate
    /// for `serving` (see [`crate::provision::agent_serving_leaf`]) signed by `cluster_ca`.
    pub async fn start(
        serving: &LeafSpec,
        layout: NodeLayout,
        state_dir: &std::path::Path,
        cluster_ca: &CertificateAuthority,
        restart: Option<CommandTemplate>,
        upgrade: Option<CommandTemplate>,
    ) -> std::io::Result<Self> {
        let serving = cluster_ca.issue(serving).map_err(std::io::Error::other)?;
        let key = serving
            .key
            .as_ref()
            .expect("issue() returns a key")
            .to_pem();
        let config = tls::server_config(
            &serving.certificate_pem,
            &key,
            &cluster_ca.certificate_pem(),
            DEFAULT_ALLOWED_CLIENT,
        )
        .map_err(std::io::Error::other)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
        let router = AgentService::new(
            Refresher::new(layout, state_dir).with_restart_command(restart),
            Upgrader::new(state_dir, upgrade),
        )
        .router();
        let task = tokio::spawn(async move {
            let _ = serve(listener, config, router).await;
        });
        Ok(Self { url, task })
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}
