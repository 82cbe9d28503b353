//! What the controllers need to know about a Cluster API Machine, read from the object as the
//! real CRD serves it (cluster.x-k8s.io/v1beta2; its kinds are `caretaker_api::cluster_api`).

pub mod cache;
pub mod context;
pub mod controller;
mod handle;
pub mod plan;
pub mod refresh;
pub mod signing;
pub mod upgrade;
mod work;

use std::collections::BTreeMap;
use std::net::IpAddr;

use kube::api::DynamicObject;
use serde_json::Value;

/// A Machine, reduced to what matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    pub name: String,
    pub namespace: String,
    pub cluster_name: String,
    pub node_name: Option<String>,
    pub addresses: Vec<String>,
    /// Whether it carries the `cluster.x-k8s.io/control-plane` label. Enough to group Machines
    /// for a rollout; never enough to sign control-plane certificates (see
    /// [`signing::verified_role`]).
    pub control_plane: bool,
    /// The owner reference with `controller: true`, if any.
    pub controller: Option<ObjectRef>,
    pub being_deleted: bool,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The version this view was read at, for writes that must not act on a stale view.
    pub resource_version: Option<String>,
    /// When the API server created it (Unix seconds): set by the server, not by its writers.
    pub created_at: Option<i64>,
}

impl MachineView {
    pub fn from_object(machine: &DynamicObject) -> Self {
        let data = &machine.data;
        let text = |v: &Value| v.as_str().map(str::to_string);
        let labels = machine.metadata.labels.clone().unwrap_or_default();
        Self {
            name: machine.metadata.name.clone().unwrap_or_default(),
            namespace: machine.metadata.namespace.clone().unwrap_or_default(),
            cluster_name: text(&data["spec"]["clusterName"]).unwrap_or_default(),
            node_name: text(&data["status"]["nodeRef"]["name"]).filter(|n| !n.is_empty()),
            addresses: data["status"]["addresses"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| text(&e["address"])).collect())
                .unwrap_or_default(),
            control_plane: labels.contains_key(caretaker_api::names::CONTROL_PLANE_LABEL),
            controller: machine
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| ObjectRef {
                    group: group_of(&o.api_version).to_string(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                }),
            being_deleted: machine.metadata.deletion_timestamp.is_some(),
            labels: labels.clone(),
            annotations: machine.metadata.annotations.clone().unwrap_or_default(),
            resource_version: machine.metadata.resource_version.clone(),
            created_at: machine
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
        }
    }

    /// Drops from a Machine what no view of it reads: its spec and status but for the cluster,
    /// node and addresses. The Machine cache keeps Machines so: Cluster API's status
    /// (conditions, node info, phases) is most of a Machine, and nothing else of a cached
    /// Machine is read (writes are patches of annotations, never the object written back).
    pub fn keep_what_views_read(machine: &mut DynamicObject) {
        let data = std::mem::take(&mut machine.data);
        let mut kept = serde_json::json!({ "spec": {}, "status": {} });
        for (section, field) in [
            ("spec", "clusterName"),
            ("status", "nodeRef"),
            ("status", "addresses"),
        ] {
            if let Some(value) = data.get(section).and_then(|s| s.get(field)) {
                kept[section][field] = value.clone();
            }
        }
        machine.data = kept;
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// The agent's URL: the `caretaker.dev/agent-endpoint` annotation, or the first address.
    pub fn agent_url(&self, agent_port: u16) -> Option<String> {
        if let Some(url) = self.annotation(caretaker_api::names::AGENT_ENDPOINT) {
            return Some(url.to_string());
        }
        let address = self.addresses.first()?;
        Some(match address.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:{agent_port}"),
            _ => format!("https://{address}:{agent_port}"),
        })
    }
}

/// A reference to an object by group, kind and name (a Cluster's `spec.controlPlaneRef`, a
/// Machine's controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

impl ObjectRef {
    /// A Cluster's `spec.controlPlaneRef`: `apiGroup` in v1beta2, `apiVersion` before it.
    pub fn control_plane_of(cluster: &DynamicObject) -> Option<Self> {
        let reference = &cluster.data["spec"]["controlPlaneRef"];
        let text = |key: &str| reference[key].as_str().filter(|s| !s.is_empty());
        let group = match text("apiGroup") {
            Some(group) => group,
            None => group_of(text("apiVersion")?),
        };
        Some(Self {
            group: group.to_string(),
            kind: text("kind")?.to_string(),
            name: text("name")?.to_string(),
        })
    }

    /// `kind/name (group)`, for messages.
    pub fn describe(&self) -> String {
        format!("{}/{} ({})", self.kind, self.name, self.group)
    }
}

/// The group of an `apiVersion` (`""` for the core group's `v1`).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// A worker Machine `m` of Cluster `c1` with a node and these annotations, for the decision
/// tests.
#[cfg(test)]
pub(crate) fn test_machine(annotations: &[(&str, &str)]) -> MachineView {
    MachineView {
        name: "m".into(),
        namespace: "default".into(),
        cluster_name: "c1".into(),
        node_name: Some("node-m".into()),
        addresses: vec!["10.0.0.1".into()],
        control_plane: false,
        controller: None,
        being_deleted: false,
        labels: Default::default(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        resource_version: None,
        created_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control-plane Machine as Cluster API serves it, status and all.
    fn served_machine() -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": "c1-cp-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-11-01T00:00:00Z",
                "labels": { "cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/control-plane": "" },
                "annotations": { "caretaker.dev/agent-endpoint": "https://10.0.0.7:9443" },
                "ownerReferences": [{ "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                    "kind": "CK8sControlPlane", "name": "c1-cp", "uid": "u-2", "controller": true }],
                "finalizers": ["machine.cluster.x-k8s.io"]
            },
            "spec": {
                "clusterName": "c1", "version": "v1.32.0", "providerID": "aws:///i-1",
                "bootstrap": { "configRef": { "kind": "CK8sConfig", "name": "c1-cp-0" } },
                "infrastructureRef": { "kind": "AWSMachine", "name": "c1-cp-0" }
            },
            "status": {
                "phase": "Running",
                "nodeRef": { "name": "node-0" },
                "addresses": [{ "type": "InternalIP", "address": "10.0.0.7" }, { "type": "Hostname", "address": "node-0" }],
                "nodeInfo": { "kubeletVersion": "v1.32.0", "osImage": "Ubuntu 24.04" },
                "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2026-11-01T00:00:00Z" }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_machine_kept_as_views_read_it_has_the_same_view() {
        let served = served_machine();
        let mut kept = served.clone();
        MachineView::keep_what_views_read(&mut kept);
        assert_eq!(
            MachineView::from_object(&kept),
            MachineView::from_object(&served)
        );
        let view = MachineView::from_object(&kept);
        assert_eq!(
            (
                view.cluster_name.as_str(),
                view.node_name.as_deref(),
                view.addresses.len()
            ),
            ("c1", Some("node-0"), 2),
            "the kept fields are the real ones, not all empty"
        );
        assert!(kept.data["status"].get("conditions").is_none());
        assert!(kept.data["spec"].get("bootstrap").is_none());
        assert_eq!(
            kept.metadata, served.metadata,
            "events and writes need the metadata"
        );

        let mut bare: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": "new", "namespace": "ns" }
        }))
        .unwrap();
        let before = MachineView::from_object(&bare);
        MachineView::keep_what_views_read(&mut bare);
        assert_eq!(
            MachineView::from_object(&bare),
            before,
            "a Machine without spec or status"
        );
    }

    #[test]
    fn the_agent_url_is_the_annotation_or_the_first_address_on_the_agent_port() {
        let mut m = test_machine(&[]);
        m.addresses = vec!["10.0.0.7".into(), "node-m".into()];
        assert_eq!(m.agent_url(9443).as_deref(), Some("https://10.0.0.7:9443"));
        m.addresses = vec!["fd00::7".into()];
        assert_eq!(m.agent_url(7000).as_deref(), Some("https://[fd00::7]:7000"));
        m.addresses = vec!["node-m.internal".into()];
        assert_eq!(
            m.agent_url(9443).as_deref(),
            Some("https://node-m.internal:9443")
        );
        m.addresses.clear();
        assert_eq!(m.agent_url(9443), None);
        let annotated = test_machine(&[(
            caretaker_api::names::AGENT_ENDPOINT,
            "https://agent.example:1",
        )]);
        assert_eq!(
            annotated.agent_url(9443).as_deref(),
            Some("https://agent.example:1")
        );
    }

    #[test]
    fn the_controller_owner_and_the_control_plane_reference_are_read_as_served() {
        let machine: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": "cp-0", "ownerReferences": [
                { "apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1" },
                { "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "CK8sControlPlane",
                  "name": "c1-control-plane", "uid": "2", "controller": true }
            ]},
            "spec": { "clusterName": "c1" }
        }))
        .unwrap();
        let expected = ObjectRef {
            group: "controlplane.cluster.x-k8s.io".into(),
            kind: "CK8sControlPlane".into(),
            name: "c1-control-plane".into(),
        };
        assert_eq!(
            MachineView::from_object(&machine).controller,
            Some(expected.clone())
        );
        for reference in [
            serde_json::json!({ "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "CK8sControlPlane", "name": "c1-control-plane" }),
            serde_json::json!({ "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CK8sControlPlane", "name": "c1-control-plane" }),
        ] {
            let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": { "name": "c1" }, "spec": { "controlPlaneRef": reference }
            }))
            .unwrap();
            assert_eq!(
                ObjectRef::control_plane_of(&cluster),
                Some(expected.clone())
            );
        }
    }
}
