//! Discovery documents: /version, /api, /apis, /apis/{group}, and the resource lists.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::store::registry::{Registry, discovery_entries};

/// The Kubernetes version this server reports (the API level it imitates).
pub const KUBERNETES_VERSION: (&str, &str) = ("1", "33");

pub fn version() -> Value {
    json!({
        "major": KUBERNETES_VERSION.0,
        "minor": KUBERNETES_VERSION.1,
        "gitVersion": format!("v{}.{}.0+caretaker-{}", KUBERNETES_VERSION.0, KUBERNETES_VERSION.1, env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "n/a (Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

pub fn api_versions(host: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": host }],
    })
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v }))
        .collect();
    json!({ "name": name, "versions": vs, "preferredVersion": vs[0] })
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(&g, &vs))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn group(registry: &Registry, name: &str) -> Result<Value, ApiError> {
    let (g, vs) = registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())
        .ok_or_else(ApiError::unknown_resource)?;
    let mut entry = group_entry(&g, &vs);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Ok(entry)
}

pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Result<Value, ApiError> {
    let defs = registry.resources_in(group, version);
    if defs.is_empty() {
        return Err(ApiError::unknown_resource());
    }
    let resources: Vec<Value> = defs.iter().flat_map(|d| discovery_entries(d)).collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources }),
    )
}
