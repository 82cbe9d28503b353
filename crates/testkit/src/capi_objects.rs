//! Cluster API objects written the way Cluster API and the CK8s providers would write them, for
//! places that run caretaker without those controllers: `caretaker demo`, the integration tests
//! and the benchmarks. The objects follow the real CRDs (cluster.x-k8s.io/v1beta2 and
//! controlplane.cluster.x-k8s.io/v1beta2), so the API server validates them as it would in a
//! management cluster.

use std::collections::BTreeMap;

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names::{
    self, CLUSTER_NAME_LABEL, CONTROL_PLANE_NAME_LABEL, DEPLOYMENT_NAME_LABEL,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::provision::ClusterCas;

macro_rules! upstream_crd {
    ($file:literal) => {
        (
            $file,
            include_str!(concat!("../../../deploy/upstream-crds/", $file)),
        )
    };
}

/// The CRDs of the Cluster API kinds caretaker reads, as upstream publishes them (copies in
/// deploy/upstream-crds, where a test checks them).
pub const UPSTREAM_CRDS: [(&str, &str); 5] = [
    upstream_crd!("cluster.x-k8s.io_clusters.yaml"),
    upstream_crd!("cluster.x-k8s.io_machines.yaml"),
    upstream_crd!("cluster.x-k8s.io_machinedeployments.yaml"),
    upstream_crd!("cluster.x-k8s.io_machinesets.yaml"),
    upstream_crd!("controlplane.cluster.x-k8s.io_ck8scontrolplanes.yaml"),
];

/// trust-manager's CRDs, as upstream publishes them: Bundle, and ClusterBundle.
pub const TRUST_MANAGER_CRDS: [(&str, &str); 2] = [
    upstream_crd!("trust.cert-manager.io_bundles.yaml"),
    upstream_crd!("trust-manager.io_clusterbundles.yaml"),
];

/// Installs [`UPSTREAM_CRDS`].
pub async fn install_upstream_crds(client: &kube::Client) -> Result<(), kube::Error> {
    install(client, &UPSTREAM_CRDS).await
}

/// Installs [`TRUST_MANAGER_CRDS`].
pub async fn install_trust_manager_crds(client: &kube::Client) -> Result<(), kube::Error> {
    install(client, &TRUST_MANAGER_CRDS).await
}

async fn install(client: &kube::Client, files: &[(&str, &str)]) -> Result<(), kube::Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, text) in files {
        let value: Value = serde_saphyr::from_str(text)
            .unwrap_or_else(|e| panic!("the embedded {file} is not YAML: {e}"));
        let crd: CustomResourceDefinition = serde_json::from_value(value)
            .unwrap_or_else(|e| panic!("the embedded {file} is not a CRD: {e}"));
        crds.create(&PostParams::default(), &crd).await?;
    }
    Ok(())
}

/// Writes one workload cluster's objects: its Cluster, CA Secrets, CK8sControlPlane,
/// MachineDeployments and Machines, all in one namespace.
#[derive(Clone)]
pub struct ClusterObjects {
    pub client: kube::Client,
    pub namespace: String,
    pub name: String,
    /// The control-plane endpoint host (`spec.controlPlaneEndpoint.host`), which the
    /// apiserver certificates name.
    pub endpoint_host: String,
}

/// Where a Machine belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineRole<'a> {
    ControlPlane,
    Worker { deployment: &'a str },
}

impl<'a> MachineRole<'a> {
    /// The role of a node provisioned as `role`; a worker joins `deployment`.
    pub fn of(role: NodeRole, deployment: &'a str) -> Self {
        match role {
            NodeRole::ControlPlane => MachineRole::ControlPlane,
            NodeRole::Worker => MachineRole::Worker { deployment },
        }
    }
}

/// A Machine whose node has joined: its agent's URL and the node's name and address.
#[derive(Debug, Clone, Copy)]
pub struct MachineObject<'a> {
    pub name: &'a str,
    pub role: MachineRole<'a>,
    pub node_name: &'a str,
    pub address: &'a str,
    pub agent_url: &'a str,
}

impl ClusterObjects {
    pub fn new(client: &kube::Client, namespace: &str, name: &str, endpoint_host: &str) -> Self {
        Self {
            client: client.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            endpoint_host: endpoint_host.to_string(),
        }
    }

    /// The name of the Cluster's CK8sControlPlane.
    pub fn control_plane_name(&self) -> String {
        format!("{}-control-plane", self.name)
    }

    /// The CA Secrets `<cluster>-ca`, `-etcd` and `-proxy` (as Cluster API names them), the
    /// Cluster and its CK8sControlPlane.
    pub async fn create(&self, cas: &ClusterCas) -> Result<(), kube::Error> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        for (suffix, ca) in [
            ("ca", &cas.cluster),
            ("etcd", &cas.etcd),
            ("proxy", &cas.front_proxy),
        ] {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{suffix}", self.name)),
                    labels: Some(BTreeMap::from([(
                        CLUSTER_NAME_LABEL.to_string(),
                        self.name.to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(ca.certificate_pem().into_bytes()),
                    ),
                    (
                        "tls.key".to_string(),
                        ByteString(ca.private_key_pem().into_bytes()),
                    ),
                ])),
                type_: Some("cluster.x-k8s.io/secret".into()),
                ..Default::default()
            };
            secrets.create(&PostParams::default(), &secret).await?;
        }
        self.create_object(&caretaker_api::cluster_api::cluster_api_resource(), json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": { "name": &self.name },
            "spec": {
                "controlPlaneEndpoint": { "host": self.endpoint_host, "port": 6443 },
                "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "CK8sControlPlane", "name": self.control_plane_name() },
                "infrastructureRef": infrastructure_ref("DockerCluster", &self.name)
            }
        }))
        .await?;
        self.create_object(&caretaker_api::cluster_api::control_plane_api_resource(), json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "CK8sControlPlane",
            "metadata": { "name": self.control_plane_name(), "labels": { CLUSTER_NAME_LABEL: self.name } },
            "spec": {
                "version": "v1.33.0",
                "machineTemplate": { "infrastructureTemplate": { "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": self.control_plane_name() } }
            }
        }))
        .await
    }

    /// A MachineDeployment of the Cluster, selecting its Machines by
    /// `cluster.x-k8s.io/deployment-name`.
    pub async fn create_machine_deployment(&self, name: &str) -> Result<(), kube::Error> {
        self.create_object(
            &caretaker_api::cluster_api::machine_deployment_api_resource(),
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": { "name": name },
                "spec": {
                    "clusterName": self.name,
                    "selector": { "matchLabels": { DEPLOYMENT_NAME_LABEL: name } },
                    "template": self.machine_template(name)
                }
            }),
        )
        .await
    }

    /// The Machine template of a MachineDeployment (or MachineSet) named `deployment`.
    pub fn machine_template(&self, deployment: &str) -> Value {
        json!({
            "metadata": { "labels": { DEPLOYMENT_NAME_LABEL: deployment } },
            "spec": {
                "clusterName": self.name,
                "bootstrap": { "dataSecretName": format!("{deployment}-bootstrap") },
                "infrastructureRef": infrastructure_ref("DockerMachine", deployment)
            }
        })
    }

    /// A Machine of the Cluster, with its node assigned in its status.
    pub async fn create_machine(&self, m: &MachineObject<'_>) -> Result<(), kube::Error> {
        let mut labels = json!({ CLUSTER_NAME_LABEL: self.name });
        let mut owners = json!([]);
        match m.role {
            MachineRole::ControlPlane => {
                labels[names::CONTROL_PLANE_LABEL] = json!("");
                labels[CONTROL_PLANE_NAME_LABEL] = json!(self.control_plane_name());
                // As the control-plane provider creates them: controlled by the control plane.
                let plane = self
                    .api(&caretaker_api::cluster_api::control_plane_api_resource())
                    .get(&self.control_plane_name())
                    .await?;
                owners = json!([{
                    "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "CK8sControlPlane",
                    "name": self.control_plane_name(), "uid": plane.metadata.uid,
                    "controller": true, "blockOwnerDeletion": true
                }]);
            }
            MachineRole::Worker { deployment } => labels[DEPLOYMENT_NAME_LABEL] = json!(deployment),
        }
        let machines = caretaker_api::cluster_api::machine_api_resource();
        self.create_object(
            &machines,
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {
                    "name": m.name, "labels": labels, "ownerReferences": owners,
                    "annotations": { names::AGENT_ENDPOINT: m.agent_url }
                },
                "spec": {
                    "clusterName": self.name,
                    "bootstrap": { "dataSecretName": format!("{}-bootstrap", m.name) },
                    "infrastructureRef": infrastructure_ref("DockerMachine", m.name)
                }
            }),
        )
        .await?;
        let status = json!({ "status": {
            "nodeRef": { "name": m.node_name },
            "addresses": [
                { "type": "InternalIP", "address": m.address },
                { "type": "Hostname", "address": m.node_name }
            ]
        }});
        self.api(&machines)
            .patch_status(m.name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// An API for `resource` in the Cluster's namespace.
    pub fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, resource)
    }

    async fn create_object(
        &self,
        resource: &ApiResource,
        object: Value,
    ) -> Result<(), kube::Error> {
        let object: DynamicObject =
            serde_json::from_value(object).expect("objects written here deserialize");
        self.api(resource)
            .create(&PostParams::default(), &object)
            .await?;
        Ok(())
    }
}

fn infrastructure_ref(kind: &str, name: &str) -> Value {
    json!({ "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": kind, "name": name })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use kube::core::GroupVersionKind;

    use super::*;

    fn upstream_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/upstream-crds")
    }

    /// Every file in deploy/upstream-crds and the kind (at the version caretaker uses) it must
    /// define: the Cluster API kinds the operator reads, and trust-manager's for the trust work.
    fn expected() -> Vec<(&'static str, ApiResource)> {
        let kind = |group: &str, version: &str, kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
        };
        vec![
            (
                "cluster.x-k8s.io_clusters.yaml",
                caretaker_api::cluster_api::cluster_api_resource(),
            ),
            (
                "cluster.x-k8s.io_machines.yaml",
                caretaker_api::cluster_api::machine_api_resource(),
            ),
            (
                "cluster.x-k8s.io_machinedeployments.yaml",
                caretaker_api::cluster_api::machine_deployment_api_resource(),
            ),
            (
                "cluster.x-k8s.io_machinesets.yaml",
                kind("cluster.x-k8s.io", "v1beta2", "MachineSet", "machinesets"),
            ),
            (
                "controlplane.cluster.x-k8s.io_ck8scontrolplanes.yaml",
                caretaker_api::cluster_api::control_plane_api_resource(),
            ),
            (
                "trust.cert-manager.io_bundles.yaml",
                kind("trust.cert-manager.io", "v1alpha1", "Bundle", "bundles"),
            ),
            (
                "trust-manager.io_clusterbundles.yaml",
                kind(
                    "trust-manager.io",
                    "v1alpha2",
                    "ClusterBundle",
                    "clusterbundles",
                ),
            ),
        ]
    }

    #[test]
    fn deploy_upstream_crds_holds_the_crds_of_the_kinds_caretaker_uses() {
        let dir = upstream_dir();
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".yaml"))
            .collect();
        let expected = expected();
        let listed: BTreeSet<String> = expected.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(on_disk, listed, "the YAML files in {}", dir.display());

        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for (file, resource) in &expected {
            assert!(readme.contains(file), "README.md does not name {file}");
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let value: Value =
                serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file} is not YAML: {e}"));
            let crd: CustomResourceDefinition = serde_json::from_value(value)
                .unwrap_or_else(|e| panic!("{file} is not a CRD: {e}"));
            let names = &crd.spec.names;
            assert_eq!(
                (
                    crd.spec.group.as_str(),
                    names.kind.as_str(),
                    names.plural.as_str()
                ),
                (
                    resource.group.as_str(),
                    resource.kind.as_str(),
                    resource.plural.as_str()
                ),
                "{file}"
            );
            assert_eq!(
                crd.metadata.name.as_deref(),
                Some(format!("{}.{}", resource.plural, resource.group).as_str()),
                "{file}"
            );
            assert!(
                crd.spec
                    .versions
                    .iter()
                    .any(|v| v.name == resource.version && v.served),
                "{file} does not serve {}",
                resource.api_version
            );
        }
    }

    /// The texts are those files by construction (`include_str!`); what can go wrong is the
    /// list: a Cluster API CRD the demo and tests would not install, or one too many.
    #[test]
    fn the_embedded_crds_are_the_cluster_api_files_in_deploy_upstream_crds() {
        let embedded: Vec<&str> = UPSTREAM_CRDS.iter().map(|(file, _)| *file).collect();
        let cluster_api: Vec<&str> = expected()
            .into_iter()
            .map(|(file, _)| file)
            .filter(|file| file.contains("cluster.x-k8s.io_"))
            .collect();
        assert_eq!(embedded, cluster_api);
    }
}
