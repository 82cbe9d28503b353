//! The registry of served resources: the built-in kinds plus one entry per served version of
//! every CustomResourceDefinition. Handlers resolve URL paths through it; discovery and OpenAPI
//! are generated from it.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::{Value, json};

use crate::store::events;

/// Which special behaviour a resource has beyond generic storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Generic,
    Namespace,
    Secret,
    /// core/v1 Event: the storage form of every Event.
    CoreEvent,
    /// events.k8s.io/v1 Event: converted to and from the core/v1 storage form.
    EventsV1Event,
    CustomResourceDefinition,
    CustomResource,
    /// A review (`authorization.k8s.io`'s, `authentication.k8s.io`'s SelfSubjectReview):
    /// created, answered, never stored.
    Review,
    /// core/v1 Service: a `clusterIP` is allocated, as kube-apiserver allocates one.
    Service,
    /// core/v1 Pod: the defaults clients notice (`restartPolicy`, `dnsPolicy`, …).
    Pod,
}

/// An `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub priority: i64,
    pub description: String,
}

/// One resource as served at one group/version.
#[derive(Debug, Clone)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub has_status: bool,
    /// Shared by every version of the resource: objects are stored once, whatever version wrote them.
    pub storage_key: String,
    pub flavor: Flavor,
    /// The version's openAPIV3Schema (custom resources only).
    pub schema: Option<Arc<Value>>,
    /// The version's `additionalPrinterColumns` (custom resources only: built-in kinds print
    /// as `schema/printers` says).
    pub printer_columns: Vec<PrinterColumn>,
    /// The scale subresource a CRD version declares (custom resources only).
    pub scale: Option<ScalePaths>,
    /// The fields a CRD version's `selectableFields` declare, as field selectors name them
    /// (`spec.color`; custom resources only: built-in kinds' are `schema/field_labels`').
    pub selectable_fields: Vec<String>,
}

/// `subresources.scale` of a CRD version: where a Scale's numbers are in the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Whether writes bump metadata.generation (kinds with a spec or CRs).
    pub fn tracks_generation(&self) -> bool {
        matches!(
            self.flavor,
            Flavor::CustomResource | Flavor::CustomResourceDefinition | Flavor::Namespace
        ) || matches!(
            self.plural.as_str(),
            "apiservices"
                | "deployments"
                | "replicasets"
                | "statefulsets"
                | "daemonsets"
                | "replicationcontrollers"
                | "jobs"
                | "cronjobs"
                | "poddisruptionbudgets"
                | "networkpolicies"
                | "ingresses"
        )
    }

    /// A stored object as served at this group/version (conversion `None`, Events converted).
    pub fn served(&self, stored: &Value) -> Value {
        self.as_served(stored).into_owned()
    }

    /// [`Self::served`], without a copy when `stored` is served as it is.
    pub fn as_served<'a>(&self, stored: &'a Value) -> Cow<'a, Value> {
        if self.flavor == Flavor::EventsV1Event {
            return Cow::Owned(events::core_to_v1(stored));
        }
        if self.serves_as_stored(stored) {
            return Cow::Borrowed(stored);
        }
        let mut o = stored.clone();
        if let Some(m) = o.as_object_mut() {
            m.insert("apiVersion".into(), json!(self.api_version()));
            m.insert("kind".into(), json!(self.kind));
        }
        Cow::Owned(o)
    }

    /// Whether `stored` is served at this group/version exactly as stored: it names this
    /// version's apiVersion and kind (as everything written through this version does), and
    /// the kind is not converted. Its stored JSON is then its served JSON too.
    pub fn serves_as_stored(&self, stored: &Value) -> bool {
        let text = |field| stored.get(field).and_then(Value::as_str);
        let this_version = |v: &str| match self.group.as_str() {
            "" => v == self.version,
            group => v.strip_prefix(group).and_then(|v| v.strip_prefix('/')) == Some(&self.version),
        };
        self.flavor != Flavor::EventsV1Event
            && text("kind") == Some(self.kind.as_str())
            && text("apiVersion").is_some_and(this_version)
    }
}

/// A built-in kind of `group`/`version`: namespaced (else cluster-scoped), without a status
/// subresource, stored under its own key, [`Flavor::Generic`]; the methods below say otherwise.
fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: vec![],
        categories: vec![],
        has_status: false,
        storage_key: format!("{group}/{plural}"),
        flavor: Flavor::Generic,
        schema: None,
        printer_columns: vec![],
        scale: None,
        selectable_fields: vec![],
    }
}

/// Settings of a built-in kind, as [`builtins`] writes them.
impl ResourceDef {
    fn short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn with_status(mut self) -> Self {
        self.has_status = true;
        self
    }

    fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// A `scale` subresource over `.spec.replicas`, `.status.replicas` and `.spec.selector`,
    /// as kube-apiserver serves it for the workload kinds.
    fn scalable(mut self) -> Self {
        self.scale = Some(ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: Some(".spec.selector".into()),
        });
        self
    }

    fn api_extension(mut self) -> Self {
        self.categories = vec!["api-extensions".into()];
        self
    }
}

/// The built-in kinds served, one a line (the formatter would spread each over seven).
#[rustfmt::skip]
fn builtins() -> Vec<ResourceDef> {
    const NAMESPACED: bool = true;
    const CLUSTER: bool = false;
    let core_events = builtin("", "v1", "events", "Event", NAMESPACED)
        .short_names(&["ev"])
        .flavor(Flavor::CoreEvent);
    let mut v1_events = builtin("events.k8s.io", "v1", "events", "Event", NAMESPACED)
        .short_names(&["ev"])
        .flavor(Flavor::EventsV1Event);
    // One store for both Event APIs, as in Kubernetes.
    v1_events.storage_key = core_events.storage_key.clone();
    let webhooks = "admissionregistration.k8s.io";
    let rbac = "rbac.authorization.k8s.io";
    let reviews = "authorization.k8s.io";
    vec![
        builtin("", "v1", "namespaces", "Namespace", CLUSTER)
            .short_names(&["ns"]).with_status().flavor(Flavor::Namespace),
        // Stored only: no kubelet reports to it. Operators select Nodes by label (the etcd
        // members of an EtcdCertificates, say).
        builtin("", "v1", "nodes", "Node", CLUSTER).short_names(&["no"]).with_status(),
        builtin("", "v1", "configmaps", "ConfigMap", NAMESPACED).short_names(&["cm"]),
        builtin("", "v1", "secrets", "Secret", NAMESPACED).flavor(Flavor::Secret),
        core_events,
        v1_events,
        builtin("coordination.k8s.io", "v1", "leases", "Lease", NAMESPACED),
        // Stored only: nothing runs Pods for them. The operator's manifests (deploy/) hold them.
        builtin("", "v1", "serviceaccounts", "ServiceAccount", NAMESPACED).short_names(&["sa"]),
        builtin("", "v1", "services", "Service", NAMESPACED)
            .short_names(&["svc"]).with_status().flavor(Flavor::Service),
        builtin("apps", "v1", "deployments", "Deployment", NAMESPACED)
            .short_names(&["deploy"]).with_status().scalable(),
        // More workload and policy kinds clients' end-to-end suites create: stored with their
        // status (and scale) subresources; nothing runs them.
        builtin("", "v1", "pods", "Pod", NAMESPACED)
            .short_names(&["po"]).with_status().flavor(Flavor::Pod),
        builtin("", "v1", "replicationcontrollers", "ReplicationController", NAMESPACED)
            .short_names(&["rc"]).with_status().scalable(),
        builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", NAMESPACED)
            .short_names(&["pvc"]).with_status(),
        builtin("apps", "v1", "replicasets", "ReplicaSet", NAMESPACED)
            .short_names(&["rs"]).with_status().scalable(),
        builtin("apps", "v1", "statefulsets", "StatefulSet", NAMESPACED)
            .short_names(&["sts"]).with_status().scalable(),
        builtin("apps", "v1", "daemonsets", "DaemonSet", NAMESPACED)
            .short_names(&["ds"]).with_status(),
        builtin("batch", "v1", "jobs", "Job", NAMESPACED).with_status(),
        builtin("batch", "v1", "cronjobs", "CronJob", NAMESPACED)
            .short_names(&["cj"]).with_status(),
        builtin("networking.k8s.io", "v1", "ingresses", "Ingress", NAMESPACED)
            .short_names(&["ing"]).with_status(),
        builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", NAMESPACED)
            .short_names(&["netpol"]),
        builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", NAMESPACED)
            .short_names(&["pdb"]).with_status(),
        builtin("certificates.k8s.io", "v1beta1", "clustertrustbundles", "ClusterTrustBundle",
            CLUSTER),
        builtin(rbac, "v1", "clusterroles", "ClusterRole", CLUSTER),
        builtin(rbac, "v1", "clusterrolebindings", "ClusterRoleBinding", CLUSTER),
        builtin(rbac, "v1", "roles", "Role", NAMESPACED),
        builtin(rbac, "v1", "rolebindings", "RoleBinding", NAMESPACED),
        builtin(reviews, "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", CLUSTER)
            .flavor(Flavor::Review),
        builtin(reviews, "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", CLUSTER)
            .flavor(Flavor::Review),
        builtin("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview",
            CLUSTER).flavor(Flavor::Review),
        builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions",
            "CustomResourceDefinition", CLUSTER)
            .short_names(&["crd", "crds"]).with_status()
            .flavor(Flavor::CustomResourceDefinition).api_extension(),
        builtin("apiregistration.k8s.io", "v1", "apiservices", "APIService", CLUSTER)
            .with_status().api_extension(),
        builtin(webhooks, "v1", "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration", CLUSTER).api_extension(),
        builtin(webhooks, "v1", "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration", CLUSTER).api_extension(),
    ]
}

/// Kubernetes version ordering: GA > beta > alpha, then by major, then by minor; others last, alphabetically.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u32, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let major: u32 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((3, major, 0));
        }
        for (prefix, rank) in [("beta", 2), ("alpha", 1)] {
            if let Some(n) = tail.strip_prefix(prefix) {
                return Some((rank, major, n.parse().ok()?));
            }
        }
        None
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[derive(Default)]
struct Snapshot {
    /// (group, version, plural) → definition.
    resources: BTreeMap<(String, String, String), Arc<ResourceDef>>,
    /// CRD name → the (group, version, plural) keys it serves.
    crd_served: BTreeMap<String, Vec<(String, String, String)>>,
}

/// Thread-safe registry; CRD writes replace their entries atomically.
pub struct Registry {
    inner: RwLock<Snapshot>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        let mut snap = Snapshot::default();
        for def in builtins() {
            snap.resources.insert(
                (def.group.clone(), def.version.clone(), def.plural.clone()),
                Arc::new(def),
            );
        }
        Registry {
            inner: RwLock::new(snap),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Snapshot> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.read()
            .resources
            .get(&(group.into(), version.into(), plural.into()))
            .cloned()
    }

    /// Some served version of a storage key (used to reach objects found by key, e.g. in GC).
    pub fn by_storage_key(&self, storage_key: &str) -> Option<Arc<ResourceDef>> {
        let snap = self.read();
        let mut defs: Vec<_> = snap
            .resources
            .values()
            .filter(|d| d.storage_key == storage_key)
            .cloned()
            .collect();
        // Prefer the core form of Events and the preferred version of CRs.
        defs.sort_by(|a, b| {
            a.group
                .cmp(&b.group)
                .then(compare_versions(&a.version, &b.version))
        });
        defs.into_iter().next()
    }

    /// Groups with their served versions, preferred version first. The core group is "".
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (g, v, _) in self.read().resources.keys() {
            let vs = groups.entry(g.clone()).or_default();
            if !vs.contains(v) {
                vs.push(v.clone());
            }
        }
        let mut out: Vec<_> = groups
            .into_iter()
            .map(|(g, mut vs)| {
                vs.sort_by(|a, b| compare_versions(a, b));
                (g, vs)
            })
            .collect();
        // Built-in groups first (as kube-apiserver orders them), then custom groups by name.
        out.sort_by_key(|(g, _)| (!is_builtin_group(g), g.clone()));
        out
    }

    pub fn resources_in(&self, group: &str, version: &str) -> Vec<Arc<ResourceDef>> {
        self.read()
            .resources
            .values()
            .filter(|d| d.group == group && d.version == version)
            .cloned()
            .collect()
    }

    /// Serves (or re-serves) the resources the CRD `name` defines (`crd::served_resources`).
    pub fn apply_crd(&self, name: &str, defs: Vec<ResourceDef>) {
        let mut snap = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = snap.crd_served.remove(name) {
            for k in old {
                snap.resources.remove(&k);
            }
        }
        let mut keys = Vec::new();
        for def in defs {
            let k = (def.group.clone(), def.version.clone(), def.plural.clone());
            // Never let a CRD shadow a built-in kind.
            if snap
                .resources
                .get(&k)
                .is_some_and(|d| d.flavor != Flavor::CustomResource)
            {
                continue;
            }
            snap.resources.insert(k.clone(), Arc::new(def));
            keys.push(k);
        }
        snap.crd_served.insert(name.to_string(), keys);
    }

    pub fn remove_crd(&self, name: &str) {
        let mut snap = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = snap.crd_served.remove(name) {
            for k in old {
                snap.resources.remove(&k);
            }
        }
    }

    /// Whether another CRD than `crd_name` already serves `group`/`plural`.
    pub fn plural_taken(&self, crd_name: &str, group: &str, plural: &str) -> bool {
        let snap = self.read();
        snap.resources
            .values()
            .any(|d| d.group == group && d.plural == plural)
            && !snap
                .crd_served
                .get(crd_name)
                .is_some_and(|ks| ks.iter().any(|(g, _, p)| g == group && p == plural))
    }
}

pub fn is_builtin_group(group: &str) -> bool {
    group.is_empty() || group.ends_with(".k8s.io") && !group.contains(".x-k8s.io")
}

/// The discovery entry (APIResource) for a definition, plus its subresources.
pub fn discovery_entries(def: &ResourceDef) -> Vec<Value> {
    let verbs = if def.flavor == Flavor::Review {
        json!(["create"])
    } else {
        json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ])
    };
    let mut main = json!({
        "name": def.plural,
        "singularName": def.singular,
        "namespaced": def.namespaced,
        "kind": def.kind,
        "verbs": verbs,
    });
    if !def.short_names.is_empty() {
        main["shortNames"] = json!(def.short_names);
    }
    if !def.categories.is_empty() {
        main["categories"] = json!(def.categories);
    }
    let mut out = vec![main];
    if def.scale.is_some() {
        out.push(json!({
            "name": format!("{}/scale", def.plural),
            "singularName": "",
            "namespaced": def.namespaced,
            "group": "autoscaling",
            "version": "v1",
            "kind": "Scale",
            "verbs": ["get", "patch", "update"],
        }));
    }
    if def.group.is_empty() && def.plural == "serviceaccounts" {
        // TokenRequest (`kubectl create token`), served by `handlers`.
        out.push(json!({
            "name": "serviceaccounts/token",
            "singularName": "",
            "namespaced": true,
            "group": "authentication.k8s.io",
            "version": "v1",
            "kind": "TokenRequest",
            "verbs": ["create"],
        }));
    }
    if def.has_status {
        out.push(json!({
            "name": format!("{}/status", def.plural),
            "singularName": "",
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object written through the version it is read through is served as stored, with no
    /// copy (and its stored JSON is its served JSON); one written through another version, or
    /// of a converted kind, is served as that version says.
    #[test]
    fn served_as_stored_only_when_version_and_kind_are_the_served_ones() {
        let registry = Registry::new();
        let def = |group, version, plural| registry.lookup(group, version, plural).unwrap();
        let config_map =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let config_maps = def("", "v1", "configmaps");
        assert!(matches!(
            config_maps.as_served(&config_map),
            Cow::Borrowed(_)
        ));
        assert_eq!(config_maps.served(&config_map), config_map);

        let deployments = def("apps", "v1", "deployments");
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}});
        assert!(deployments.serves_as_stored(&deployment));
        // A group that merely starts the same, a version that merely ends the same.
        for other in ["apps.example.com/v1", "apps/v1beta1", "apps/xv1", "v1"] {
            let stored = json!({"apiVersion": other, "kind": "Deployment", "metadata": {}});
            assert!(!deployments.serves_as_stored(&stored), "{other}");
            let served = deployments.as_served(&stored);
            assert!(matches!(served, Cow::Owned(_)), "{other}");
            assert_eq!(served["apiVersion"], "apps/v1");
        }
        let wrong_kind = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
        assert!(!config_maps.serves_as_stored(&wrong_kind));
        assert_eq!(config_maps.served(&wrong_kind)["kind"], "ConfigMap");

        // Stored as core/v1 Events, served converted at events.k8s.io/v1.
        let events = def("events.k8s.io", "v1", "events");
        let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {}});
        assert!(!events.serves_as_stored(&event));
        assert!(matches!(events.as_served(&event), Cow::Owned(_)));
    }

    #[test]
    fn version_priority_matches_kubernetes() {
        let mut vs = vec![
            "v1alpha1",
            "v1beta1",
            "foo",
            "v2",
            "v1",
            "v1beta2",
            "v10alpha3",
        ];
        vs.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(
            vs,
            vec![
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v10alpha3",
                "v1alpha1",
                "foo"
            ]
        );
    }
}
