//! A test world: the embedded API server with the real Cluster API CRDs and a Cluster with its
//! CA Secrets, real agents on loopback with kubeadm-layout nodes in temp directories, and the
//! Machine controller.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use caretaker_agent::NodeLayout;
use caretaker_agent::local::LocalAgent;
use caretaker_agent::provision::{ClusterCas, NodeRole, NodeSpec, provision_node};
use caretaker_apiserver::TestServer;
use caretaker_operator::controllers::machines;
use caretaker_operator::{Context, Settings, machine, names};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

pub const NS: &str = "default";

fn fixture(name: &str) -> CustomResourceDefinition {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/crds")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    serde_json::from_value(value).unwrap()
}

pub struct World {
    pub server: caretaker_apiserver::ApiServer,
    pub client: kube::Client,
    pub cas: ClusterCas,
    pub dir: tempfile::TempDir,
    pub agents: Vec<LocalAgent>,
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
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in [
        "cluster.x-k8s.io_clusters.yaml",
        "cluster.x-k8s.io_machines.yaml",
        "cluster.x-k8s.io_machinedeployments.yaml",
        "controlplane.cluster.x-k8s.io_ck8scontrolplanes.yaml",
    ] {
        crds.create(&PostParams::default(), &fixture(file))
            .await
            .unwrap();
    }
    let cas = ClusterCas::create().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for (suffix, ca) in [
        ("ca", &cas.cluster),
        ("etcd", &cas.etcd),
        ("proxy", &cas.front_proxy),
    ] {
        let mut data = BTreeMap::new();
        data.insert(
            "tls.crt".to_string(),
            ByteString(ca.certificate_pem().into_bytes()),
        );
        data.insert(
            "tls.key".to_string(),
            ByteString(ca.private_key_pem().into_bytes()),
        );
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("c1-{suffix}")),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &machine::cluster_api_resource());
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "c1" },
        "spec": { "controlPlaneEndpoint": { "host": "cp.example", "port": 6443 } }
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();

    let ctx = Context::new(client.clone(), settings);
    let controller = tokio::spawn(run_controllers(ctx));
    World {
        server,
        client,
        cas,
        dir: tempfile::tempdir().unwrap(),
        agents: Vec::new(),
        controller,
        deployment: "c1-md-0".into(),
    }
}

impl World {
    pub fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &machine::api_resource())
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
        self.add_machine_with(name, role, endpoint_host, agent_url, None)
            .await
    }

    /// Like [`Self::add_machine`], with an upgrade command for the agent.
    pub async fn add_machine_with(
        &mut self,
        name: &str,
        role: NodeRole,
        endpoint_host: &str,
        agent_url: Option<&str>,
        upgrade: Option<caretaker_agent::command::CommandTemplate>,
    ) -> NodeLayout {
        let node_dir = self.dir.path().join(name);
        let layout = NodeLayout::new(node_dir.join("pki"), node_dir.join("kubeconfigs"));
        provision_node(
            &layout,
            &self.cas,
            &NodeSpec {
                node_name: format!("node-{name}"),
                addresses: vec!["127.0.0.1".parse().unwrap()],
                role,
                control_plane_host: endpoint_host.into(),
                server_url: format!("https://{endpoint_host}:6443"),
                validity: "30d".parse().unwrap(),
            },
        )
        .unwrap();
        let agent = LocalAgent::start(
            layout.clone(),
            &node_dir.join("state"),
            &self.cas.cluster,
            None,
            upgrade,
        )
        .await
        .unwrap();
        let url = agent_url.map_or(agent.url.clone(), str::to_string);
        self.agents.push(agent);

        let mut labels = json!({ "cluster.x-k8s.io/cluster-name": "c1" });
        if role == NodeRole::ControlPlane {
            labels[names::CONTROL_PLANE_LABEL] = json!("");
            labels["cluster.x-k8s.io/control-plane-name"] = json!("c1-control-plane");
        } else {
            labels["cluster.x-k8s.io/deployment-name"] = json!(self.deployment.clone());
        }
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": { "name": name, "labels": labels, "annotations": { names::AGENT_ENDPOINT: url } },
            "spec": {
                "clusterName": "c1",
                "bootstrap": { "dataSecretName": format!("{name}-bootstrap") },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name }
            }
        }))
        .unwrap();
        self.machines()
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let status = json!({ "status": {
            "nodeRef": { "name": format!("node-{name}") },
            "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }]
        }});
        self.machines()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        layout
    }

    pub async fn annotate(&self, name: &str, key: &str, value: &str) {
        let body = json!({ "metadata": { "annotations": { key: value } } });
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
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
    futures::join!(
        machines::run(ctx.clone(), None),
        caretaker_operator::controllers::rollout::run(ctx, None)
    );
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
