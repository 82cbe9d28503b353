//! Field sets: the leaf paths of an object in the `fieldsV1` vocabulary, as its schema's list
//! types name them, and what a path names in an object.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

/// Path segments, each prefixed `f:`, `k:` or `v:` as in fieldsV1.
pub(super) type Path = Vec<String>;
pub(super) type FieldSet = BTreeSet<Path>;

/// Metadata fields that belong to field management (the rest of metadata is server-owned).
pub(super) const MANAGED_METADATA: &[&str] =
    &["labels", "annotations", "finalizers", "ownerReferences"];

pub(super) fn metadata_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({"properties": {
            "finalizers": {"type": "array", "x-kubernetes-list-type": "set"},
            "ownerReferences": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]},
        }})
    })
}

pub(super) fn sub_schema<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties")
        .and_then(|p| p.get(field))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

pub(super) enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

pub(super) fn list_kind(schema: Option<&Value>) -> ListKind {
    let Some(s) = schema else {
        return ListKind::Atomic;
    };
    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListKind::Set,
        Some("map") => {
            let mut keys: Vec<String> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| {
                    k.iter()
                        .filter_map(|k| k.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            keys.sort();
            if keys.is_empty() {
                ListKind::Atomic
            } else {
                ListKind::Map(keys)
            }
        }
        _ => ListKind::Atomic,
    }
}

/// The `k:` segment of a map-list item, or None if it lacks a key field.
pub(super) fn item_key(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// A path naming a map-list item itself (its key fields are separate leaves).
pub(super) fn is_item(path: &Path) -> bool {
    path.last().is_some_and(|s| s.starts_with("k:"))
}

/// What a walk of an object's fields ([`walk`]) tells: a field set collects the leaves, a map
/// of nodes every node with its value. One walk serves both, so that the paths they name are
/// always the same.
pub(super) trait FieldSink<'a> {
    /// A field its writer owns whole, with no fields of its own below it: a scalar, an atomic
    /// list, a set's value.
    fn leaf(&mut self, path: Path, value: &'a Value);
    /// A field its writer owns whose fields are walked too (a map-list item), or a map list
    /// owned as a whole because an item has no key.
    fn owned(&mut self, path: &Path);
    /// A map or list, after the fields below it.
    fn node(&mut self, path: Path, value: &'a Value);
    /// Whether the map-list item at `path` is walked: a sink that keeps the first of two items
    /// with one key skips the second.
    fn walks_item(&self, path: &Path) -> bool;
}

impl FieldSink<'_> for FieldSet {
    fn leaf(&mut self, path: Path, _: &Value) {
        self.insert(path);
    }
    fn owned(&mut self, path: &Path) {
        self.insert(path.clone());
    }
    fn node(&mut self, _: Path, _: &Value) {}
    fn walks_item(&self, _: &Path) -> bool {
        true
    }
}

impl<'a> FieldSink<'a> for HashMap<Path, &'a Value> {
    fn leaf(&mut self, path: Path, value: &'a Value) {
        self.entry(path).or_insert(value);
    }
    fn owned(&mut self, _: &Path) {}
    fn node(&mut self, path: Path, value: &'a Value) {
        self.entry(path).or_insert(value);
    }
    fn walks_item(&self, path: &Path) -> bool {
        !self.contains_key(path)
    }
}

/// Leaf paths of an object, ignoring type metadata and server-owned metadata.
pub(super) fn leaves(obj: &Value, schema: Option<&Value>) -> FieldSet {
    let mut out = FieldSet::new();
    walk_object(obj, schema, &mut out);
    out
}

/// Every node of `obj` by its path, as [`leaves`] walks it (list items by their `k:`/`v:`
/// segment): what a path names in `obj` is one lookup, however long its lists.
pub(super) fn nodes<'a>(obj: &'a Value, schema: Option<&Value>) -> HashMap<Path, &'a Value> {
    let mut out = HashMap::new();
    walk_object(obj, schema, &mut out);
    out
}

/// A whole object: of its metadata only what field management covers; its type fields are
/// nodes, never leaves.
fn walk_object<'a>(obj: &'a Value, schema: Option<&Value>, sink: &mut impl FieldSink<'a>) {
    let Some(map) = obj.as_object() else {
        return;
    };
    for (k, v) in map {
        let path = vec![format!("f:{k}")];
        match k.as_str() {
            "apiVersion" | "kind" => sink.node(path, v),
            "metadata" => {
                for field in MANAGED_METADATA {
                    if let Some(v) = v.get(*field) {
                        let s = sub_schema(Some(metadata_schema()), field);
                        walk(v, s, child(&path, format!("f:{field}")), sink);
                    }
                }
                sink.node(path, v);
            }
            _ => walk(v, sub_schema(schema, k), path, sink),
        }
    }
}

pub(super) fn child(path: &Path, segment: String) -> Path {
    let mut p = path.clone();
    p.push(segment);
    p
}

/// The fields of `v` at `path`, as its schema's list types name them.
pub(super) fn walk<'a>(
    v: &'a Value,
    schema: Option<&Value>,
    path: Path,
    sink: &mut impl FieldSink<'a>,
) {
    match v {
        // An empty map owns nothing (as in kube's field sets, it does not claim the children).
        Value::Object(m) => {
            for (k, c) in m {
                walk(
                    c,
                    sub_schema(schema, k),
                    child(&path, format!("f:{k}")),
                    sink,
                );
            }
        }
        Value::Array(items) => match list_kind(schema) {
            ListKind::Set => {
                for item in items {
                    sink.leaf(child(&path, format!("v:{item}")), item);
                }
            }
            ListKind::Map(keys) => {
                let item_schema = schema.and_then(|s| s.get("items"));
                for item in items {
                    match item_key(item, &keys) {
                        Some(key) => {
                            let item_path = child(&path, key);
                            if sink.walks_item(&item_path) {
                                sink.owned(&item_path);
                                walk(item, item_schema, item_path, sink);
                            }
                        }
                        // Not addressable by key: the list is owned as a whole.
                        None => sink.owned(&path),
                    }
                }
            }
            ListKind::Atomic => return sink.leaf(path, v),
        },
        _ => return sink.leaf(path, v),
    }
    sink.node(path, v);
}

/// A `k:`/`v:` segment in the form [`walk`] writes it (managedFields written by clients
/// may space or order theirs otherwise).
pub(super) fn normalized(segment: &str) -> String {
    let reparsed = |prefix: &str, text: &str| {
        serde_json::from_str::<Value>(text)
            .map(|v| format!("{prefix}{v}"))
            .unwrap_or_else(|_| segment.to_string())
    };
    if let Some(k) = segment.strip_prefix("k:") {
        reparsed("k:", k)
    } else if let Some(v) = segment.strip_prefix("v:") {
        reparsed("v:", v)
    } else {
        segment.to_string()
    }
}

/// Removes from `obj` every node whose path is in `paths`, in one walk.
pub(super) fn remove_all(obj: &mut Value, schema: Option<&Value>, paths: &HashSet<Path>) {
    fn walk(v: &mut Value, schema: Option<&Value>, path: &Path, paths: &HashSet<Path>) {
        match v {
            Value::Object(m) => {
                m.retain(|k, _| !paths.contains(&child(path, format!("f:{k}"))));
                for (k, c) in m.iter_mut() {
                    let s = if path.is_empty() && k == "metadata" {
                        Some(metadata_schema())
                    } else {
                        sub_schema(schema, k)
                    };
                    walk(c, s, &child(path, format!("f:{k}")), paths);
                }
            }
            Value::Array(items) => match list_kind(schema) {
                ListKind::Set => {
                    items.retain(|i| !paths.contains(&child(path, format!("v:{i}"))));
                }
                ListKind::Map(keys) => {
                    items.retain(|i| {
                        item_key(i, &keys).is_none_or(|k| !paths.contains(&child(path, k)))
                    });
                    let item_schema = schema.and_then(|s| s.get("items"));
                    for item in items.iter_mut() {
                        if let Some(key) = item_key(item, &keys) {
                            walk(item, item_schema, &child(path, key), paths);
                        }
                    }
                }
                ListKind::Atomic => {}
            },
            _ => {}
        }
    }
    if !paths.is_empty() {
        walk(obj, schema, &Vec::new(), paths);
    }
}

/// The paths of `fields` that overlap `path` (its ancestors, itself, its descendants), in
/// `fields`' order, found by lookups rather than a scan.
pub(super) fn overlapping<'s>(fields: &'s FieldSet, path: &Path) -> impl Iterator<Item = &'s Path> {
    let ancestors = (1..path.len()).filter_map(move |n| fields.get(&path[..n].to_vec()));
    let below = fields
        .range(path.clone()..)
        .take_while(move |p| p.starts_with(path));
    ancestors.chain(below)
}

/// Whether changing a path of `changed` takes `owned` away from its owner: it does for the
/// field itself, its children and its atomic parents, not for the map-list item that contains
/// it.
pub(super) fn taken_over(changed: &FieldSet, owned: &Path) -> bool {
    let at_or_above = (1..=owned.len()).any(|n| changed.contains(&owned[..n].to_vec()));
    let below = || {
        changed
            .range(owned.clone()..)
            .take_while(|p| p.starts_with(owned))
            .next()
            .is_some()
    };
    at_or_above || (!is_item(owned) && below())
}

/// A path as kubectl users read it: `.status.conditions[type="Ready"].status`.
pub(super) fn display(path: &Path) -> String {
    let mut out = String::new();
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = seg.strip_prefix("v:") {
            out.push_str(&format!("[{v}]"));
        }
    }
    out
}

/// `fieldsV1` encoding: `{"f:data": {"f:key": {}}}`.
pub(super) fn encode(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let entry = cur
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            cur = entry.as_object_mut().expect("fieldsV1 nodes are objects");
        }
    }
    Value::Object(root)
}

pub(super) fn decode(v: &Value) -> FieldSet {
    fn walk(v: &Value, path: Path, out: &mut FieldSet) {
        let children: Vec<_> = v
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| {
                        k.starts_with("f:") || k.starts_with("k:") || k.starts_with("v:")
                    })
                    .collect()
            })
            .unwrap_or_default();
        if (children.is_empty() || is_item(&path)) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, c) in children {
            walk(c, child(&path, k.clone()), out);
        }
    }
    let mut out = FieldSet::new();
    walk(v, vec![], &mut out);
    out
}
