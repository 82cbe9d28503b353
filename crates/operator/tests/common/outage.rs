//! An agent that goes down and comes back at the same address: a TCP forwarder on a fixed
//! loopback port in front of a real agent. While down, its port refuses connections and the
//! connections it had are cut, as when the agent's process stops; brought back, it listens on
//! the same port again, so the Machine's agent URL is unchanged and nothing about the Machine
//! changes in the API server.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

pub struct Outage {
    address: SocketAddr,
    agent: SocketAddr,
    forwarding: Option<JoinHandle<()>>,
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Outage {
    /// Forwards a new loopback port to the agent at `agent_url` (`https://127.0.0.1:PORT`).
    pub async fn start(agent_url: &str) -> Self {
        let agent = agent_url
            .trim_start_matches("https://")
            .parse()
            .expect("an agent URL of the form https://IP:PORT");
        let listener = TcpListener::bind((
            "127.0.0.1",
            caretaker_testkit::ports::reusable_port().unwrap(),
        ))
        .await
        .unwrap();
        let address = listener.local_addr().unwrap();
        let mut outage = Self {
            address,
            agent,
            forwarding: None,
        };
        outage.forward(listener);
        outage
    }

    /// The URL to give the Machine as its agent's.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The agent goes down: the port refuses connections, open ones are cut.
    pub fn stop(&mut self) {
        if let Some(task) = self.forwarding.take() {
            // Aborting drops the listener and the JoinSet of connections, which aborts them.
            task.abort();
        }
    }

    /// The agent comes back on the same port.
    pub async fn resume(&mut self) {
        assert!(self.forwarding.is_none(), "the agent is not down");
        // The aborted task releases the port when it is dropped, which may be a moment later.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.address).await {
                Ok(listener) => break listener,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.address),
            }
        };
        self.forward(listener);
    }

    fn forward(&mut self, listener: TcpListener) {
        let agent = self.agent;
        self.forwarding = Some(tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut agent) = TcpStream::connect(agent).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut agent).await;
                    }
                });
                // Forget the connections that have ended.
                while connections.try_join_next().is_some() {}
            }
        }));
    }
}
