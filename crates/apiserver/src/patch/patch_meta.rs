//! Patch metadata of the built-in kinds: for each list field, whether a patch replaces it,
//! merges it as a set of values, or merges its items by a key (a Pod's `containers` by `name`,
//! their `ports` by `containerPort`). Strategic merge patch reads it, and server-side apply
//! reads it as list types (`apply_schema`).
//!
//! kube-apiserver reads this from the `patchStrategy` and `patchMergeKey` tags of its Go types.
//! k8s-openapi, generated from the same API definitions, carries it only in code: the
//! `DeepMerge` of each type merges every list the way its field declares. So the strategy of a
//! list is learnt by asking that merge: two small objects that differ only in the list's items
//! are merged, and the number of items that come out tells the strategy; varying one item field
//! at a time finds the merge key. Each answer is computed once per kind and list, when a patch
//! first reaches that list.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value, json};

use crate::schema::builtin_schemas::{self, KindSchema};

/// How strategic merge patch treats one list field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch's list replaces the object's (lists without a patch strategy).
    Replace,
    /// Values are merged as a set (`finalizers`).
    MergeValues,
    /// Items are merged by the value of this field (`containers` by `name`).
    MergeByKey(String),
}

/// The list strategies of one kind, looked up by the list's field path from the object's root,
/// list items transparent: `spec.containers.env` is the `env` of a Pod's containers.
#[derive(Debug, Clone, Copy)]
pub struct PatchMeta {
    kind: Option<&'static KindSchema>,
}

impl PatchMeta {
    /// The metadata of a built-in kind; kinds without a k8s-openapi type replace every list.
    pub fn of(group: &str, version: &str, kind: &str) -> Self {
        PatchMeta {
            kind: builtin_schemas::of(group, version, kind),
        }
    }

    /// How strategic merge patch treats the list at `path`, learnt on first use.
    pub fn list(&self, path: &str) -> ListStrategy {
        let Some(kind) = self.kind else {
            return ListStrategy::Replace;
        };
        static LEARNT: OnceLock<Mutex<HashMap<(String, String), ListStrategy>>> = OnceLock::new();
        let learnt = LEARNT.get_or_init(Mutex::default);
        let key = (kind.name.clone(), path.to_string());
        if let Some(known) = learnt.lock().expect("not poisoned").get(&key) {
            return known.clone();
        }
        let strategy = learn(kind, path).unwrap_or(ListStrategy::Replace);
        learnt
            .lock()
            .expect("not poisoned")
            .insert(key, strategy.clone());
        strategy
    }

    /// The kind's fields as server-side apply reads them (`properties`, `items`,
    /// `additionalProperties`), each list marked with the `x-kubernetes-list-type` its merge
    /// declares: `map` by its merge key, `set`, or `atomic`. Built on first use, once per kind.
    /// `metadata` is left out: server-side apply has its own rules for it.
    pub fn apply_schema(&self) -> Option<&'static Value> {
        let kind = self.kind?;
        let root = kind.root()?;
        Some(kind.apply_schema.get_or_init(|| {
            let structure = Structure {
                meta: *self,
                schemas: Schemas(kind),
            };
            structure.of(root, "", &mut vec![kind.name.as_str()])
        }))
    }
}

/// Builds a kind's apply schema (see [`PatchMeta::apply_schema`]).
struct Structure<'a> {
    meta: PatchMeta,
    schemas: Schemas<'a>,
}

impl<'a> Structure<'a> {
    /// The structure of `node`, found at `path`; `within` names the definitions on the way
    /// there, so that a recursive one (a CRD's JSONSchemaProps) ends instead of repeating.
    fn of(&self, node: &'a Value, path: &str, within: &mut Vec<&'a str>) -> Value {
        let definition = builtin_schemas::reference(node);
        if let Some(name) = definition {
            if within.contains(&name) && !path.is_empty() {
                return json!({});
            }
            within.push(name);
        }
        let resolved = self.schemas.resolve(node);
        let mut out = Map::new();
        if resolved.get("type").and_then(Value::as_str) == Some("array") {
            if let Some(items) = resolved.get("items") {
                out.insert("items".into(), self.of(items, path, within));
            }
            let (list_type, keys) = match self.meta.list(path) {
                ListStrategy::MergeByKey(key) => ("map", Some(key)),
                ListStrategy::MergeValues => ("set", None),
                ListStrategy::Replace => ("atomic", None),
            };
            out.insert("type".into(), json!("array"));
            out.insert("x-kubernetes-list-type".into(), json!(list_type));
            if let Some(key) = keys {
                out.insert("x-kubernetes-list-map-keys".into(), json!([key]));
            }
        }
        if let Some(Value::Object(properties)) = resolved.get("properties") {
            let fields: Map<String, Value> = properties
                .iter()
                .filter(|(name, _)| !(path.is_empty() && *name == "metadata"))
                .map(|(name, child)| (name.clone(), self.of(child, &join(path, name), within)))
                .collect();
            out.insert("properties".into(), Value::Object(fields));
        }
        if let Some(values) = resolved
            .get("additionalProperties")
            .filter(|v| v.is_object())
        {
            // Map values have no field name: `*` stands for any key (see `Schemas::field`).
            out.insert(
                "additionalProperties".into(),
                self.of(values, &join(path, "*"), within),
            );
        }
        if definition.is_some() {
            within.pop();
        }
        Value::Object(out)
    }
}

/// `field` below `path`, in the dotted form list strategies are looked up by.
pub fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// Asks the kind's merge how it treats the list at `path`; `None` when the path names no list
/// of the kind or the probes do not decode.
fn learn(kind: &KindSchema, path: &str) -> Option<ListStrategy> {
    let fields: Vec<&str> = path.split('.').collect();
    let schemas = Schemas(kind);
    let root = kind.root()?;
    let list = schemas.field(root, &fields)?;
    if schemas.resolve(list).get("type").and_then(Value::as_str) != Some("array") {
        return None;
    }
    let item = schemas.resolve(list.get("items")?);
    // How many items come out of merging a one-item list into another.
    let merged_len = |current: Value, new: Value| -> Option<usize> {
        let current = schemas.with_list(root, &fields, current);
        let new = schemas.with_list(root, &fields, new);
        let merged = (kind.merge)(current, new)?;
        list_at(&merged, &fields).map(Vec::len)
    };
    let scalar_fields: Vec<&String> = match item.get("properties") {
        Some(Value::Object(properties)) => properties
            .iter()
            .filter(|(_, schema)| schemas.is_scalar(schemas.resolve(schema)))
            .map(|(name, _)| name)
            .collect(),
        _ => {
            let distinct = merged_len(
                json!([schemas.sample(item, 0)]),
                json!([schemas.sample(item, 1)]),
            )?;
            return Some(if distinct == 2 {
                ListStrategy::MergeValues
            } else {
                ListStrategy::Replace
            });
        }
    };
    // An item with every scalar field set one way, and the same with one field set another.
    let base = schemas.item_sample(item, &scalar_fields, |_| false);
    let all_changed = schemas.item_sample(item, &scalar_fields, |_| true);
    if merged_len(json!([base]), json!([all_changed]))? == 1 {
        return Some(ListStrategy::Replace);
    }
    let mut keys = Vec::new();
    for field in &scalar_fields {
        let other = schemas.item_sample(item, &scalar_fields, |f| f == field.as_str());
        if merged_len(json!([base]), json!([other]))? == 2 {
            keys.push(field.to_string());
        }
    }
    // One key field is a patch merge key. Items told apart by several fields (list-map keys
    // without a patch strategy, or sets of objects) have no strategic merge: they are replaced.
    Some(match <[String; 1]>::try_from(keys) {
        Ok([key]) => ListStrategy::MergeByKey(key),
        Err(_) => ListStrategy::Replace,
    })
}

/// The list at `fields`, through the first item of the lists on the way.
fn list_at<'a>(doc: &'a Value, fields: &[&str]) -> Option<&'a Vec<Value>> {
    let mut at = doc;
    for (i, field) in fields.iter().enumerate() {
        at = at.get(field)?;
        if i + 1 < fields.len()
            && let Value::Array(items) = at
        {
            at = items.first()?;
        }
    }
    at.as_array()
}

/// A kind's schema, to walk it and build objects that decode as the kind.
struct Schemas<'a>(&'a KindSchema);

impl<'a> Schemas<'a> {
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        self.0.resolve(schema)
    }

    fn field(&self, schema: &'a Value, fields: &[&str]) -> Option<&'a Value> {
        self.0.field(schema, fields)
    }

    fn is_scalar(&self, schema: &Value) -> bool {
        schema.get("x-kubernetes-int-or-string").is_some()
            || matches!(
                schema.get("type").and_then(Value::as_str),
                Some("string" | "integer" | "number" | "boolean")
            )
    }

    /// The smallest value that decodes as `schema`: required fields only, each its sample 0.
    /// Scalars have two samples (0 and 1) that differ.
    fn sample(&self, schema: &Value, which: u8) -> Value {
        let schema = self.resolve(schema);
        if schema.get("x-kubernetes-int-or-string").is_some() {
            return json!(["a", "b"][usize::from(which)]);
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => match schema.get("format").and_then(Value::as_str) {
                Some("date-time") => json!(format!("2000-01-0{}T00:00:00Z", which + 1)),
                Some("byte") => json!(["YQ==", "Yg=="][usize::from(which)]),
                _ => json!(["a", "b"][usize::from(which)]),
            },
            Some("integer" | "number") => json!(which + 1),
            Some("boolean") => json!(which == 1),
            Some("array") => json!([]),
            _ => {
                let mut object = Map::new();
                let required = schema.get("required").and_then(Value::as_array);
                for name in required.into_iter().flatten().filter_map(Value::as_str) {
                    if let Some(field) = schema.get("properties").and_then(|p| p.get(name)) {
                        object.insert(name.into(), self.sample(field, 0));
                    }
                }
                Value::Object(object)
            }
        }
    }

    /// A list item with its scalar fields at sample 0, or 1 for those `changed` picks.
    fn item_sample(
        &self,
        item: &Value,
        scalars: &[&String],
        changed: impl Fn(&str) -> bool,
    ) -> Value {
        let mut sample = self.sample(item, 0);
        if let Value::Object(object) = &mut sample {
            for field in scalars {
                let which = u8::from(changed(field));
                object.insert(
                    field.to_string(),
                    self.sample(&item["properties"][field], which),
                );
            }
        }
        sample
    }

    /// The smallest object of `schema` that holds `list` at `fields`, with one smallest item
    /// in each list on the way.
    fn with_list(&self, schema: &Value, fields: &[&str], list: Value) -> Value {
        let Some((first, rest)) = fields.split_first() else {
            return list;
        };
        let node = self.resolve(schema);
        let mut object = self.sample(node, 0);
        let child = node
            .get("properties")
            .and_then(|p| p.get(*first))
            .or_else(|| node.get("additionalProperties"));
        let value = match child.map(|c| self.resolve(c)) {
            _ if rest.is_empty() => list,
            Some(child) if child.get("type").and_then(Value::as_str) == Some("array") => {
                json!([self.with_list(&child["items"], rest, list)])
            }
            Some(child) => self.with_list(child, rest, list),
            None => list,
        };
        if let Value::Object(o) = &mut object {
            o.insert(first.to_string(), value);
        }
        object
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(group: &str, kind: &str, path: &str) -> ListStrategy {
        PatchMeta::of(group, "v1", kind).list(path)
    }

    fn by(key: &str) -> ListStrategy {
        ListStrategy::MergeByKey(key.into())
    }

    #[test]
    fn list_strategies_come_from_k8s_openapi() {
        use ListStrategy::*;
        // Kubernetes' patchMergeKey tags, as kube-apiserver applies them.
        for (group, kind, path, expected) in [
            ("", "Pod", "spec.containers", by("name")),
            ("", "Pod", "spec.containers.env", by("name")),
            ("", "Pod", "spec.containers.ports", by("containerPort")),
            ("", "Pod", "spec.containers.volumeMounts", by("mountPath")),
            ("", "Pod", "spec.initContainers", by("name")),
            ("", "Pod", "spec.volumes", by("name")),
            ("", "Pod", "spec.imagePullSecrets", by("name")),
            ("", "Pod", "status.conditions", by("type")),
            ("", "Pod", "metadata.finalizers", MergeValues),
            ("", "Pod", "metadata.ownerReferences", by("uid")),
            ("", "Pod", "spec.containers.args", Replace),
            ("", "Pod", "spec.tolerations", Replace),
            ("", "Service", "spec.ports", by("port")),
            (
                "apps",
                "Deployment",
                "spec.template.spec.containers",
                by("name"),
            ),
            (
                "apps",
                "Deployment",
                "spec.template.spec.containers.env",
                by("name"),
            ),
            ("apps", "Deployment", "status.conditions", by("type")),
            (
                "batch",
                "CronJob",
                "spec.jobTemplate.spec.template.spec.volumes",
                by("name"),
            ),
            (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration",
                "webhooks",
                by("name"),
            ),
            ("rbac.authorization.k8s.io", "Role", "rules", Replace),
            ("", "ConfigMap", "metadata.finalizers", MergeValues),
            // Not lists, or no such field: nothing to merge.
            ("", "Pod", "spec.nodeName", Replace),
            ("", "Pod", "spec.noSuchField", Replace),
        ] {
            assert_eq!(strategy(group, kind, path), expected, "{kind} {path}");
        }
    }

    #[test]
    fn every_list_of_the_workload_kinds_can_be_learnt() {
        // Probes that do not decode would quietly make every list replace; walk each list of
        // a few deep kinds and check that the merge answered.
        for (group, kind) in [("", "Pod"), ("apps", "Deployment"), ("", "Service")] {
            let schema = builtin_schemas::of(group, "v1", kind).unwrap();
            let schemas = Schemas(schema);
            let mut lists = Vec::new();
            let root = &schema.definitions[&schema.name];
            collect_lists(&schemas, root, String::new(), &mut lists, 0);
            assert!(lists.len() >= 10, "{kind}: {lists:?}");
            for path in lists {
                assert!(
                    learn(schema, &path).is_some(),
                    "{kind} {path} was not learnt"
                );
            }
        }
    }

    fn collect_lists(
        schemas: &Schemas,
        schema: &Value,
        path: String,
        out: &mut Vec<String>,
        depth: usize,
    ) {
        let node = schemas.0.element(schemas.resolve(schema));
        let Some(Value::Object(properties)) = node.get("properties") else {
            return;
        };
        if depth > 12 {
            return;
        }
        for (name, child) in properties {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            let resolved = schemas.resolve(child);
            if resolved.get("type").and_then(Value::as_str) == Some("array") {
                out.push(child_path.clone());
            }
            collect_lists(schemas, child, child_path, out, depth + 1);
        }
    }

    #[test]
    fn apply_schemas_mark_each_list_as_its_merge_treats_it() {
        let schema = PatchMeta::of("apps", "v1", "Deployment")
            .apply_schema()
            .unwrap();
        let pod = &schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"];
        let containers = &pod["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-list-type"], "map");
        assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
        let env = &containers["items"]["properties"]["env"];
        assert_eq!(env["x-kubernetes-list-map-keys"], json!(["name"]));
        assert_eq!(
            pod["properties"]["tolerations"]["x-kubernetes-list-type"],
            "atomic"
        );
        assert!(
            schema["properties"].get("metadata").is_none(),
            "apply has its own rules"
        );
        // A recursive kind ends instead of repeating.
        let crd = PatchMeta::of("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
        assert!(crd.apply_schema().is_some());
        assert!(
            PatchMeta::of("example.com", "v1", "Widget")
                .apply_schema()
                .is_none()
        );
    }

    #[test]
    fn kinds_without_a_type_replace_their_lists() {
        let meta = PatchMeta::of("example.com", "v1", "Widget");
        assert_eq!(meta.list("spec.items"), ListStrategy::Replace);
    }
}
