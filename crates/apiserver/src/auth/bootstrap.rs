//! The ClusterRoles and ClusterRoleBindings kube-apiserver creates at start
//! (plugin/pkg/auth/authorizer/rbac/bootstrappolicy), those a client relies on without being
//! granted anything: discovery, `kubectl auth can-i`, the public health and version endpoints,
//! and `cluster-admin` for `system:masters`. Made when absent, never overwritten.

use serde_json::{Value, json};

use crate::api::{ApiState, WriteOptions};
use crate::error::ApiError;

const GROUP: &str = "rbac.authorization.k8s.io";

fn metadata(name: &str) -> Value {
    json!({
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    })
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"metadata": metadata(name), "rules": rules})
}

fn binding(name: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"kind": "Group", "apiGroup": GROUP, "name": g}))
        .collect();
    json!({
        "metadata": metadata(name),
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
        "subjects": subjects,
    })
}

/// (ClusterRoles, ClusterRoleBindings).
pub fn policy() -> (Vec<Value>, Vec<Value>) {
    let roles = vec![
        cluster_role(
            "cluster-admin",
            json!([
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ]),
        ),
        cluster_role(
            "system:discovery",
            json!([{"nonResourceURLs": [
                "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                "/openapi/*", "/readyz", "/version", "/version/"
            ], "verbs": ["get"]}]),
        ),
        cluster_role(
            "system:basic-user",
            json!([
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
            ]),
        ),
        cluster_role(
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
    ];
    let bindings = vec![
        binding("cluster-admin", &["system:masters"]),
        binding("system:discovery", &["system:authenticated"]),
        binding("system:basic-user", &["system:authenticated"]),
        binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ];
    (roles, bindings)
}

/// Creates each object of [`policy`] that does not exist.
pub async fn ensure(api: &ApiState) -> Result<(), ApiError> {
    let (roles, bindings) = policy();
    let opts = WriteOptions {
        field_manager: "caretaker-apiserver".into(),
        ..Default::default()
    };
    for (plural, objects) in [("clusterroles", roles), ("clusterrolebindings", bindings)] {
        let def = api
            .registry
            .lookup(GROUP, "v1", plural)
            .expect("RBAC kinds are built in");
        for object in objects {
            match api.create(&def, "", object, &opts).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
