//! What the server fills in before an object is stored: kind-specific fields (before
//! mutating admission, so webhooks see them) and server-owned metadata (after it, so webhooks
//! cannot forge it).

use base64::Engine;
use serde_json::{Value, json};

use super::ApiState;
use super::defaults;
use crate::error::ApiError;
use crate::meta::{self, is_deleting, metadata_mut, name_of};
use crate::schema::crd;
use crate::store::registry::{Flavor, ResourceDef};

impl ApiState {
    /// Kind-specific defaults and conversions applied to every stored write.
    pub(super) fn prepare_kind(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        match def.flavor {
            Flavor::Secret => {
                if let Some(Value::Object(string_data)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    let data = obj
                        .as_object_mut()
                        .expect("checked in decode")
                        .entry("data")
                        .or_insert_with(|| json!({}));
                    if !data.is_object() {
                        *data = json!({});
                    }
                    for (k, v) in string_data {
                        let encoded = base64::engine::general_purpose::STANDARD
                            .encode(v.as_str().unwrap_or(""));
                        data[k] = json!(encoded);
                    }
                }
                if let Some(data) = obj.get("data").and_then(Value::as_object) {
                    for (k, v) in data {
                        if base64::engine::general_purpose::STANDARD
                            .decode(v.as_str().unwrap_or(""))
                            .is_err()
                        {
                            return Err(ApiError::bad_request(format!(
                                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{k}"
                            )));
                        }
                    }
                }
                if obj.get("type").is_none_or(|t| t.is_null() || t == "") {
                    obj["type"] = json!("Opaque");
                }
            }
            Flavor::Namespace => {
                if obj.pointer("/spec/finalizers").is_none() && old.is_none() {
                    obj["spec"] = json!({ "finalizers": ["kubernetes"] });
                }
                let phase = if is_deleting(obj) {
                    "Terminating"
                } else {
                    "Active"
                };
                if obj.get("status").is_none_or(|s| !s.is_object()) {
                    obj["status"] = json!({});
                }
                obj["status"]["phase"] = json!(phase);
                let name = name_of(obj).to_string();
                let labels = metadata_mut(obj)
                    .entry("labels")
                    .or_insert_with(|| json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
            }
            Flavor::Service => self.default_service(obj, old)?,
            Flavor::Pod => defaults::pod(obj),
            Flavor::Generic => defaults::workload(&def.group, &def.plural, obj),
            Flavor::CustomResourceDefinition => {
                let name = name_of(obj).to_string();
                let group = obj
                    .pointer("/spec/group")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let plural = obj
                    .pointer("/spec/names/plural")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let accepted = !self.registry.plural_taken(&name, &group, &plural);
                crd::set_status(obj, accepted, &meta::now());
            }
            _ => {}
        }
        Ok(())
    }

    /// A Service's defaults: `type: ClusterIP`, `sessionAffinity: None`, each port's `TCP`
    /// and `targetPort` (its `port`), and a `clusterIP`
    /// (with `clusterIPs`) from 10.96.0.0/12 unless it is headless (`None`) or an
    /// ExternalName. An update keeps the address, which is immutable.
    fn default_service(&self, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        // Go encodes a Service's status with its load balancer, empty or not.
        let status = obj.get("status").filter(|s| s.is_object()).cloned();
        let mut status = status.unwrap_or_else(|| json!({}));
        if status.get("loadBalancer").is_none_or(Value::is_null) {
            status["loadBalancer"] = json!({});
        }
        obj["status"] = status;
        let spec = &mut obj["spec"];
        defaults::service_spec(spec);
        if spec["type"] == "ExternalName" {
            return Ok(());
        }
        let given = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kept = old
            .and_then(|o| o.pointer("/spec/clusterIP"))
            .and_then(Value::as_str);
        let ip = match (given.as_str(), kept) {
            ("", Some(kept)) => kept.to_string(),
            (given, Some(kept)) if given != kept => {
                return Err(ApiError::invalid(
                    "",
                    "Service",
                    name_of(obj),
                    &[crate::error::FieldError::new(
                        "spec.clusterIP",
                        crate::error::FieldErrorKind::Invalid,
                        format!("Invalid value: {given:?}: field is immutable"),
                    )],
                ));
            }
            ("", None) => self.free_cluster_ip(obj)?,
            (given, _) => given.to_string(),
        };
        obj["spec"]["clusterIP"] = json!(ip);
        obj["spec"]["clusterIPs"] = json!([ip]);
        defaults::service_ip_families(&mut obj["spec"]);
        Ok(())
    }

    /// An address of 10.96.0.0/12 no Service has: the first free one from a hash of the
    /// Service's namespace and name (10.96.0.1 is the `kubernetes` Service's in a cluster).
    fn free_cluster_ip(&self, obj: &Value) -> Result<String, ApiError> {
        let (services, _) = self.store.list("/services", None, None)?;
        let taken: std::collections::HashSet<&str> = services
            .iter()
            .filter_map(|s| s.pointer("/spec/clusterIP").and_then(Value::as_str))
            .collect();
        let seed = format!("{}/{}", meta::namespace_of(obj), name_of(obj))
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        const HOSTS: u32 = 1 << 20;
        let base = u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0));
        for step in 0..HOSTS {
            let host = (seed.wrapping_add(step) % (HOSTS - 2)) + 2;
            let ip = std::net::Ipv4Addr::from(base + host).to_string();
            if !taken.contains(ip.as_str()) {
                return Ok(ip);
            }
        }
        Err(ApiError::internal("no free cluster IP in 10.96.0.0/12"))
    }

    /// Sets server-owned metadata: on create from scratch, on update carried over from `old`.
    pub(super) fn stamp_metadata(def: &ResourceDef, obj: &mut Value, old: Option<&Value>) {
        let spec_changed = old.is_some_and(|o| spec_like(o) != spec_like(obj));
        let m = metadata_mut(obj);
        m.remove("selfLink");
        match old
            .and_then(|o| o.get("metadata"))
            .and_then(Value::as_object)
        {
            None => {
                m.insert("uid".into(), json!(meta::new_uid()));
                m.insert("creationTimestamp".into(), json!(meta::now()));
                m.remove("deletionTimestamp");
                m.remove("deletionGracePeriodSeconds");
                m.remove("resourceVersion");
                if def.tracks_generation() {
                    m.insert("generation".into(), json!(1));
                } else {
                    m.remove("generation");
                }
            }
            Some(old_meta) => {
                for k in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "generateName",
                ] {
                    match old_meta.get(k) {
                        Some(v) => m.insert(k.into(), v.clone()),
                        None => m.remove(k),
                    };
                }
                if def.tracks_generation() && spec_changed {
                    let g = old_meta
                        .get("generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    m.insert("generation".into(), json!(g + 1));
                }
            }
        }
    }
}

/// What a change of bumps `metadata.generation`: everything but metadata and status.
fn spec_like(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}
