//! The `scale` subresource of custom resources whose CRD declares one
//! (`subresources.scale`): an `autoscaling/v1` Scale read from, and written to, the paths the
//! CRD names, as `kubectl scale` and autoscalers use it.

use serde_json::{Value, json};

use super::ApiState;
use super::options::{Part, WriteOptions};
use crate::error::{ApiError, FieldError, FieldErrorKind};
use crate::meta::resource_version_of;
use crate::patch::bodies::{self, PatchType};
use crate::patch::patch_meta::PatchMeta;
use crate::schema::table::json_path;
use crate::store::registry::{ResourceDef, ScalePaths};
use crate::work::{self, Deadline};

/// What a write to `…/scale` carries.
pub enum ScaleChange {
    /// PUT: a whole Scale.
    Replace(Value),
    /// PATCH: a patch of the Scale.
    Patch(PatchType, Value),
}

/// `.spec.replicas` → `/spec/replicas`.
fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut p, field| {
            p.push('/');
            p.push_str(field);
            p
        })
}

/// The Scale of `object` (served form) under `paths`.
fn scale_of(paths: &ScalePaths, object: &Value) -> Value {
    let replicas = |path: &str| {
        json_path(object, path)
            .first()
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    };
    let mut status = json!({ "replicas": replicas(&paths.status_replicas) });
    if let Some(selector) = paths
        .label_selector
        .as_deref()
        .and_then(|p| json_path(object, p).first().and_then(|v| selector_text(v)))
    {
        status["selector"] = json!(selector);
    }
    let meta = |key: &str| object.pointer(&format!("/metadata/{key}")).cloned();
    let mut metadata = json!({});
    for key in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta(key) {
            metadata[key] = v;
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": { "replicas": replicas(&paths.spec_replicas) },
        "status": status,
    })
}

/// A selector as a Scale's `status.selector` writes it: a custom resource's string as it is;
/// a workload's `LabelSelector` (or a ReplicationController's map) in label-selector syntax.
fn selector_text(selector: &Value) -> Option<String> {
    if let Some(text) = selector.as_str() {
        return Some(text.to_string());
    }
    let object = selector.as_object()?;
    if object.contains_key("matchLabels") || object.contains_key("matchExpressions") {
        return Some(crate::selectors::label_selector_text(selector));
    }
    // A ReplicationController's selector: a plain map of labels.
    let labels: Vec<String> = object
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    Some(labels.join(","))
}

fn paths_of(def: &ResourceDef) -> Result<&ScalePaths, ApiError> {
    def.scale.as_ref().ok_or_else(ApiError::unknown_resource)
}

impl ApiState {
    pub fn get_scale(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let paths = paths_of(def)?;
        Ok(scale_of(paths, &self.get(def, namespace, name)?))
    }

    /// Writes the replicas of a new Scale to the object's `specReplicasPath`; the answer is
    /// the Scale after the write. A `resourceVersion` in the Scale is a precondition on the
    /// object, as in kube-apiserver.
    pub async fn update_scale(
        &self,
        def: &ResourceDef,
        namespace: &str,
        name: &str,
        change: ScaleChange,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let paths = paths_of(def)?;
        for _ in 0..10 {
            let old = self.get(def, namespace, name)?;
            let current = scale_of(paths, &old);
            let wanted = match &change {
                ScaleChange::Replace(body) => body.clone(),
                ScaleChange::Patch(patch_type, body) => {
                    let (patch_type, body) = (*patch_type, body.clone());
                    work::run(Deadline::from_now(), move |deadline| {
                        let scale = PatchMeta::of("autoscaling", "v1", "Scale");
                        bodies::apply_patch(patch_type, &current, &body, scale, deadline)
                    })
                    .await?
                }
            };
            let invalid = |message: &str, value: &Value| {
                ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    &[FieldError::new(
                        "spec.replicas",
                        FieldErrorKind::Invalid,
                        format!("Invalid value: {value}: {message}"),
                    )],
                )
            };
            let replicas = &wanted["spec"]["replicas"];
            let count = match replicas {
                Value::Null => 0,
                v => v.as_i64().ok_or_else(|| invalid("must be an integer", v))?,
            };
            if count < 0 {
                return Err(invalid("must be greater than or equal to 0", replicas));
            }
            if let Some(expected) = resource_version_of(&wanted)
                && Some(expected) != resource_version_of(&old)
            {
                return Err(ApiError::conflict(&def.group, &def.plural, name));
            }
            let mut object = old;
            set_at(&mut object, &pointer(&paths.spec_replicas), json!(count));
            match self
                .update(def, namespace, name, object, Part::Main, opts)
                .await
            {
                // Someone wrote the object between the read and the write: read again.
                Err(e) if e.code == 409 && resource_version_of(&wanted).is_none() => continue,
                Err(e) => return Err(e),
                Ok(written) => return Ok(scale_of(paths, &written.object)),
            }
        }
        Err(ApiError::conflict(&def.group, &def.plural, name))
    }
}

/// Sets `value` at JSON `pointer` in `object`, making the objects on the way.
fn set_at(object: &mut Value, pointer: &str, value: Value) {
    let mut at = object;
    let fields: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, field) in fields.iter().enumerate() {
        if !at.is_object() {
            *at = json!({});
        }
        let map = at.as_object_mut().expect("made an object above");
        if i + 1 == fields.len() {
            map.insert((*field).to_string(), value);
            return;
        }
        at = map.entry((*field).to_string()).or_insert_with(|| json!({}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_written_as_label_selectors() {
        assert_eq!(selector_text(&json!("app=x")).unwrap(), "app=x");
        assert_eq!(
            selector_text(&json!({"matchLabels": {"app": "web", "tier": "a"},
                "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "qa"]},
                                     {"key": "canary", "operator": "DoesNotExist"}]}))
            .unwrap(),
            "app=web,tier=a,env in (prod,qa),!canary"
        );
        assert_eq!(selector_text(&json!({"app": "rc"})).unwrap(), "app=rc");
    }

    #[test]
    fn replicas_are_set_where_the_crd_says_making_the_way() {
        let mut object = json!({"spec": {"template": {}}});
        set_at(&mut object, &pointer(".spec.replicas"), json!(3));
        set_at(&mut object, &pointer(".spec.scaling.count"), json!(2));
        assert_eq!(
            object,
            json!({"spec": {"template": {}, "replicas": 3, "scaling": {"count": 2}}})
        );
    }
}
