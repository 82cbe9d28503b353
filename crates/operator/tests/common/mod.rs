//! A test world: the embedded API server with the real Cluster API CRDs and a Cluster with its
//! CA Secrets, real agents on loopback with kubeadm-layout nodes in temp directories, and the
//! Machine controller.
#![allow(dead_code)]

pub mod authorities;
// The etcd harness lives in the testkit, where `caretaker demo --etcd` uses it too. Most
// test crates that include this module use neither (as with dead code, above).
#[allow(unused_imports)]
pub use caretaker_testkit::{etcd, etcd_agents};
pub mod hooks;
pub mod logs;
pub mod openmetrics;
pub mod outage;
pub mod trust;
pub mod unanswering;

use std::collections::BTreeMap;
use std::time::Duration;

use caretaker_agent::NodeLayout;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_apiserver::TestServer;
use caretaker_operator::controllers;
use caretaker_operator::{Context, Settings};
use caretaker_testkit::capi_objects::{self, ClusterObjects, MachineObject, MachineRole};
use caretaker_testkit::local::LocalAgent;
use caretaker_testkit::provision::{ClusterCas, NodeSpec, agent_serving_leaf, provision_node};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

pub const NS: &str = "default";

pub struct World {
    pub server: caretaker_apiserver::ApiServer,
    pub client: kube::Client,
    /// Writes the Cluster API objects of Cluster `c1`.
    pub cluster: ClusterObjects,
    pub cas: ClusterCas,
    pub dir: tempfile::TempDir,
    pub agents: Vec<LocalAgent>,
    /// The running controllers' context.
    pub ctx: std::sync::Arc<Context>,
    pub controller: tokio::task::JoinHandle<()>,
    /// The MachineDeployment new workers join.
    pub deployment: String,
}

impl Drop for World {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

pub async fn world(settings: Settings) -> World {
    let server = TestServer::start().await;
    let client = server.client();
    world_on(server, client, settings).await
}

/// A world on `server`, whose controllers act through `operator` (the test itself acts as
/// the server's admin).
pub async fn world_on(
    server: caretaker_apiserver::ApiServer,
    operator: kube::Client,
    settings: Settings,
) -> World {
    let client = server.client();
    // The fixtures' CRDs, embedded (a unit test checks they are the same files).
    capi_objects::install_upstream_crds(&client).await.unwrap();
    let cas = ClusterCas::create().unwrap();
    let cluster = ClusterObjects::new(&client, NS, "c1", "cp.example");
    cluster.create(&cas).await.unwrap();
    cluster.create_machine_deployment("c1-md-0").await.unwrap();

    let ctx = Context::new(operator, settings);
    let controller = tokio::spawn(run_controllers(ctx.clone()));
    World {
        server,
        client,
        cluster,
        cas,
        dir: tempfile::tempdir().unwrap(),
        agents: Vec::new(),
        ctx,
        controller,
        deployment: "c1-md-0".into(),
    }
}

impl World {
    pub fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            NS,
            &caretaker_api::cluster_api::machine_api_resource(),
        )
    }

    /// Provisions a node (its apiserver certificate naming `endpoint_host`), starts its agent
    /// and creates its Machine. `agent_url` overrides the agent's URL (to point at nothing).
    pub async fn add_machine(
        &mut self,
        name: &str,
        role: NodeRole,
        endpoint_host: &str,
        agent_url: Option<&str>,
    ) -> NodeLayout {
        self.add_machine_with(name, role, endpoint_host, agent_url, None, None)
            .await
    }

    /// Like [`Self::add_machine`] (endpoint `cp.example`), with an upgrade command for the agent.
    pub async fn add_upgradable(
        &mut self,
        name: &str,
        role: NodeRole,
        upgrade: caretaker_agent::command::CommandTemplate,
    ) -> NodeLayout {
        self.add_machine_with(name, role, "cp.example", None, None, Some(upgrade))
            .await
    }

    /// Like [`Self::add_machine`] (endpoint `cp.example`), with a restart command for the agent.
    pub async fn add_restartable(
        &mut self,
        name: &str,
        role: NodeRole,
        restart: caretaker_agent::command::CommandTemplate,
    ) -> NodeLayout {
        self.add_machine_with(name, role, "cp.example", None, Some(restart), None)
            .await
    }

    /// Like [`Self::add_machine`], with restart and upgrade commands for the agent.
    pub async fn add_machine_with(
        &mut self,
        name: &str,
        role: NodeRole,
        endpoint_host: &str,
        agent_url: Option<&str>,
        restart: Option<caretaker_agent::command::CommandTemplate>,
        upgrade: Option<caretaker_agent::command::CommandTemplate>,
    ) -> NodeLayout {
        let node_dir = self.dir.path().join(name);
        let layout = NodeLayout::new(node_dir.join("pki"), node_dir.join("kubeconfigs"));
        let node_name = format!("node-{name}");
        // Each node has its own loopback address, so that its agent's serving certificate
        // names it and no other node.
        let address = format!("127.0.0.{}", 10 + self.agents.len());
        let ip = address.parse().unwrap();
        provision_node(
            &layout,
            &self.cas,
            &NodeSpec {
                node_name: node_name.clone(),
                addresses: vec![ip],
                role,
                control_plane_host: endpoint_host.into(),
                server_url: format!("https://{endpoint_host}:6443"),
                validity: "30d".parse().unwrap(),
            },
        )
        .unwrap();
        let agent = LocalAgent::start(
            &agent_serving_leaf(&node_name, &[ip]),
            layout.clone(),
            &node_dir.join("state"),
            &self.cas.cluster,
            restart,
            upgrade,
        )
        .await
        .unwrap();
        let url = agent_url.map_or(agent.url.clone(), str::to_string);
        self.agents.push(agent);

        let role = MachineRole::of(role, &self.deployment);
        self.cluster
            .create_machine(&MachineObject {
                name,
                role,
                node_name: &node_name,
                address: &address,
                agent_url: &url,
            })
            .await
            .unwrap();
        layout
    }

    /// A client as the operator has it for the agent of node `node_name`, to act behind the
    /// operator's back (as an operator that died right afterwards would have).
    pub fn operator_client(&self, node_name: &str) -> caretaker_agent_api::client::AgentClient {
        let pair = self
            .cas
            .cluster
            .issue(&caretaker_pki::LeafSpec::new(
                caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT,
                caretaker_pki::Usage::Client,
            ))
            .unwrap();
        let identity = caretaker_agent_api::tls::ClientIdentity::from_pem(
            &self.cas.cluster.certificate_pem(),
            &pair.certificate_pem,
            &pair.key.unwrap().to_pem(),
        )
        .unwrap();
        caretaker_agent_api::client::AgentClient::for_node(
            &identity,
            &[node_name.to_string()],
            Duration::from_secs(10),
        )
        .unwrap()
    }

    /// How many refresh plans the agent of Machine `name` has staged (keys made, not applied).
    pub fn staged_plans(&self, name: &str) -> usize {
        let staged = self.dir.path().join(name).join("state/staged");
        std::fs::read_dir(staged).map_or(0, |d| d.count())
    }

    pub async fn annotate(&self, name: &str, key: &str, value: &str) {
        let body = json!({ "metadata": { "annotations": { key: value } } });
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
    }

    pub async fn remove_annotation(&self, name: &str, key: &str) {
        let body = json!({ "metadata": { "annotations": { key: null } } });
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
    }

    /// Waits until the Machine has no annotation `key`.
    pub async fn wait_gone(&self, name: &str, key: &str) -> BTreeMap<String, String> {
        for _ in 0..400 {
            let annotations = self.annotations(name).await;
            if !annotations.contains_key(key) {
                return annotations;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{name} kept {key}: {:?}", self.annotations(name).await);
    }

    pub async fn annotations(&self, name: &str) -> BTreeMap<String, String> {
        self.machines()
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
    }

    /// Waits until the Machine's refresh status is `status`.
    pub async fn wait_status(&self, name: &str, status: &str) -> BTreeMap<String, String> {
        self.wait_for(name, names::REFRESH_CERTIFICATES_STATUS, status)
            .await
    }

    /// Waits until annotation `key` of the Machine is `status`.
    pub async fn wait_for(&self, name: &str, key: &str, status: &str) -> BTreeMap<String, String> {
        for _ in 0..400 {
            let annotations = self.annotations(name).await;
            if annotations.get(key).map(String::as_str) == Some(status) {
                return annotations;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{name} never reached {status}: {:?}",
            self.annotations(name).await
        );
    }

    pub async fn events(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    pub async fn event_with(&self, name: &str, reason: &str) -> Event {
        for _ in 0..100 {
            if let Some(e) = self
                .events(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
            {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no {reason} event for {name}: {:?}",
            self.events(name).await
        );
    }
}

/// The Machine controller and the rollout controllers, as `caretaker operator` runs them.
pub async fn run_controllers(ctx: std::sync::Arc<Context>) {
    controllers::run(ctx, None).await;
}

/// An agent URL nothing listens on.
pub fn unreachable_agent_url() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("https://127.0.0.1:{closed}")
}

pub fn fast() -> Settings {
    Settings {
        max_attempts: 2,
        retry_base: Duration::from_millis(200),
        agent_timeout: Duration::from_secs(10),
        upgrade_poll: Duration::from_millis(100),
        ..Settings::default()
    }
}
