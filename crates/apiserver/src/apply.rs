//! Server-side apply and field ownership (`metadata.managedFields`).
//!
//! Field sets are sets of paths to leaves, in the `fieldsV1` vocabulary: `f:<field>` for map
//! fields, `k:{"<key>":<value>}` for items of lists the schema declares
//! `x-kubernetes-list-type: map`, `v:<value>` for items of `set` lists. Every other list is
//! atomic: one leaf, owned and replaced as a whole. Built-in kinds' list types come from their
//! patch metadata (`patch_meta::PatchMeta::apply_schema`); metadata has its own (`finalizers`
//! is a set, `ownerReferences` a map keyed by uid).
//!
//! Applying as manager M:
//! - a field M sets to a value that differs from the live one and that another manager owns is a
//!   conflict, unless `force` is given, which moves the ownership to M;
//! - fields M owned before and no longer sets are removed, unless another manager also owns them;
//! - M's field set becomes exactly the fields of its applied configuration.
//!
//! Non-apply writes (create, update, patch) never conflict: their manager takes ownership of the
//! fields it changed, and those fields leave every other manager's set.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// Path segments, each prefixed `f:`, `k:` or `v:` as in fieldsV1.
type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Metadata fields that belong to field management (the rest of metadata is server-owned).
const MANAGED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

fn metadata_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        json!({"properties": {
            "finalizers": {"type": "array", "x-kubernetes-list-type": "set"},
            "ownerReferences": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]},
        }})
    })
}

fn sub_schema<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties")
        .and_then(|p| p.get(field))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

fn list_kind(schema: Option<&Value>) -> ListKind {
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
fn item_key(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// A path naming a map-list item itself (its key fields are separate leaves).
fn is_item(path: &Path) -> bool {
    path.last().is_some_and(|s| s.starts_with("k:"))
}

/// Leaf paths of an object, ignoring type metadata and server-owned metadata.
fn leaves(obj: &Value, schema: Option<&Value>) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for field in MANAGED_METADATA {
                    if let Some(v) = v.get(*field) {
                        let path = vec!["f:metadata".to_string(), format!("f:{field}")];
                        collect(
                            v,
                            sub_schema(Some(metadata_schema()), field),
                            path,
                            &mut out,
                        );
                    }
                }
            }
            _ => collect(v, sub_schema(schema, k), vec![format!("f:{k}")], &mut out),
        }
    }
    out
}

fn child(path: &Path, segment: String) -> Path {
    let mut p = path.clone();
    p.push(segment);
    p
}

fn collect(v: &Value, schema: Option<&Value>, path: Path, out: &mut FieldSet) {
    match v {
        // An empty map owns nothing (as in kube's field sets, it does not claim the children).
        Value::Object(m) => {
            for (k, c) in m {
                collect(
                    c,
                    sub_schema(schema, k),
                    child(&path, format!("f:{k}")),
                    out,
                );
            }
        }
        Value::Array(items) => match list_kind(schema) {
            ListKind::Set => {
                for item in items {
                    out.insert(child(&path, format!("v:{item}")));
                }
            }
            ListKind::Map(keys) => {
                let item_schema = schema.and_then(|s| s.get("items"));
                for item in items {
                    match item_key(item, &keys) {
                        Some(key) => {
                            let p = child(&path, key);
                            out.insert(p.clone());
                            collect(item, item_schema, p, out);
                        }
                        // Not addressable by key: the list is owned as a whole.
                        None => {
                            out.insert(path.clone());
                        }
                    }
                }
            }
            ListKind::Atomic => {
                out.insert(path);
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

/// Every node of `obj` by its path, as [`leaves`] walks it (list items by their `k:`/`v:`
/// segment): what a path names in `obj` is one lookup, however long its lists.
fn nodes<'a>(obj: &'a Value, schema: Option<&Value>) -> HashMap<Path, &'a Value> {
    let mut out = HashMap::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        let path = vec![format!("f:{k}")];
        if k == "metadata" {
            out.insert(path.clone(), v);
            for field in MANAGED_METADATA {
                if let Some(v) = v.get(*field) {
                    let s = sub_schema(Some(metadata_schema()), field);
                    collect_nodes(v, s, child(&path, format!("f:{field}")), &mut out);
                }
            }
        } else {
            collect_nodes(v, sub_schema(schema, k), path, &mut out);
        }
    }
    out
}

fn collect_nodes<'a>(
    v: &'a Value,
    schema: Option<&Value>,
    path: Path,
    out: &mut HashMap<Path, &'a Value>,
) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                collect_nodes(
                    c,
                    sub_schema(schema, k),
                    child(&path, format!("f:{k}")),
                    out,
                );
            }
        }
        Value::Array(items) => match list_kind(schema) {
            ListKind::Set => {
                for item in items {
                    out.entry(child(&path, format!("v:{item}"))).or_insert(item);
                }
            }
            ListKind::Map(keys) => {
                let item_schema = schema.and_then(|s| s.get("items"));
                for item in items {
                    if let Some(key) = item_key(item, &keys) {
                        let item_path = child(&path, key);
                        if !out.contains_key(&item_path) {
                            collect_nodes(item, item_schema, item_path, out);
                        }
                    }
                }
            }
            ListKind::Atomic => {}
        },
        _ => {}
    }
    out.entry(path).or_insert(v);
}

/// A `k:`/`v:` segment in the form [`collect`] writes it (managedFields written by clients
/// may space or order theirs otherwise).
fn normalized(segment: &str) -> String {
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
fn remove_all(obj: &mut Value, schema: Option<&Value>, paths: &HashSet<Path>) {
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
fn overlapping<'s>(fields: &'s FieldSet, path: &Path) -> impl Iterator<Item = &'s Path> {
    let ancestors = (1..path.len()).filter_map(move |n| fields.get(&path[..n].to_vec()));
    let below = fields
        .range(path.clone()..)
        .take_while(move |p| p.starts_with(path));
    ancestors.chain(below)
}

/// Whether changing a path of `changed` takes `owned` away from its owner: it does for the
/// field itself, its children and its atomic parents, not for the map-list item that contains
/// it.
fn taken_over(changed: &FieldSet, owned: &Path) -> bool {
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
fn display(path: &Path) -> String {
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
fn encode(set: &FieldSet) -> Value {
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

fn decode(v: &Value) -> FieldSet {
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

/// One `managedFields` entry, decoded.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: FieldSet,
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or("").into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or("").into(),
                    time: e["time"].as_str().unwrap_or("").into(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .map(String::from),
                    fields: e.get("fieldsV1").map(decode).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": encode(&e.fields),
            });
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    let meta = crate::meta::metadata_mut(obj);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn deep_merge(target: &mut Value, applied: &Value, schema: Option<&Value>) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                let s = sub_schema(schema, k);
                match t.get_mut(k) {
                    Some(existing) => deep_merge(existing, v, s),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(a)) => match list_kind(schema) {
            ListKind::Set => {
                let mut present: HashSet<String> = t.iter().map(Value::to_string).collect();
                for item in a {
                    if present.insert(item.to_string()) {
                        t.push(item.clone());
                    }
                }
            }
            ListKind::Map(keys) => {
                let item_schema = schema.and_then(|s| s.get("items"));
                let mut at: HashMap<String, usize> = HashMap::new();
                for (i, x) in t.iter().enumerate() {
                    if let Some(key) = item_key(x, &keys) {
                        at.entry(key).or_insert(i);
                    }
                }
                for item in a {
                    match item_key(item, &keys).map(|k| (at.get(&k).copied(), k)) {
                        Some((Some(i), _)) => deep_merge(&mut t[i], item, item_schema),
                        Some((None, key)) => {
                            at.insert(key, t.len());
                            t.push(item.clone());
                        }
                        None => t.push(item.clone()),
                    }
                }
            }
            ListKind::Atomic => *t = a.clone(),
        },
        (t, a) => *t = a.clone(),
    }
}

/// Merges an applied configuration into the live object: metadata with its built-in list
/// types, everything else with the kind's schema.
fn merge_root(target: &mut Value, applied: &Value, schema: Option<&Value>) {
    let (Value::Object(t), Value::Object(a)) = (&mut *target, applied) else {
        *target = applied.clone();
        return;
    };
    for (k, v) in a {
        let s = if k == "metadata" {
            Some(metadata_schema())
        } else {
            sub_schema(schema, k)
        };
        match t.get_mut(k) {
            Some(existing) => deep_merge(existing, v, s),
            None => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Who writes, for field management.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: String,
    pub subresource: Option<&'a str>,
    pub now: String,
    /// The kind's schema, for list types (None: every list is atomic).
    pub schema: Option<&'a Value>,
}

/// Server-side apply of `applied` onto `live` (None: the object does not exist yet).
/// Returns the new object with updated managedFields.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    writer: &Writer,
    force: bool,
    group: &str,
    plural: &str,
) -> Result<Value, ApiError> {
    let new_fields = leaves(applied, writer.schema);
    let Some(live) = live else {
        let mut obj = applied.clone();
        write_entries(&mut obj, &[entry(writer, "Apply", new_fields)]);
        return Ok(obj);
    };
    let mut entries = read_entries(live);
    let is_mine = |e: &Entry| {
        e.manager == writer.manager
            && e.operation == "Apply"
            && e.subresource.as_deref() == writer.subresource
    };
    let previously_owned = entries
        .iter()
        .find(|e| is_mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();

    let (live_nodes, applied_nodes) = (nodes(live, writer.schema), nodes(applied, writer.schema));
    let mut conflicts = Vec::new();
    for path in &new_fields {
        // Naming a map-list item is no conflict; its fields are checked one by one.
        if is_item(path) || live_nodes.get(path) == applied_nodes.get(path) {
            continue;
        }
        for e in entries.iter().filter(|e| !is_mine(e)) {
            if let Some(owned) = overlapping(&e.fields, path).find(|p| !is_item(p)) {
                conflicts.push((e.manager.clone(), e.api_version.clone(), owned.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(
            group,
            plural,
            crate::meta::name_of(live),
            &conflicts,
        ));
    }
    if force {
        let taken: HashSet<&Path> = conflicts.iter().map(|(_, _, c)| c).collect();
        for e in entries
            .iter_mut()
            .filter(|e| !(e.manager == writer.manager && e.operation == "Apply"))
        {
            e.fields.retain(|p| !taken.contains(p));
        }
    }

    let mut obj = live.clone();
    merge_root(&mut obj, applied, writer.schema);
    let dropped: HashSet<Path> = previously_owned
        .difference(&new_fields)
        .filter(|path| {
            let shared = entries
                .iter()
                .any(|e| !is_mine(e) && overlapping(&e.fields, path).next().is_some());
            let still_applied = new_fields
                .range((*path).clone()..)
                .next()
                .is_some_and(|p| p.starts_with(path));
            !shared && !still_applied
        })
        .map(|path| path.iter().map(|segment| normalized(segment)).collect())
        .collect();
    remove_all(&mut obj, writer.schema, &dropped);
    entries.retain(|e| !is_mine(e));
    entries.push(entry(writer, "Apply", new_fields));
    write_entries(&mut obj, &entries);
    Ok(obj)
}

fn entry(writer: &Writer, operation: &str, fields: FieldSet) -> Entry {
    Entry {
        manager: writer.manager.into(),
        operation: operation.into(),
        api_version: writer.api_version.clone(),
        time: writer.now.clone(),
        subresource: writer.subresource.map(String::from),
        fields,
    }
}

fn conflict_error(
    group: &str,
    plural: &str,
    name: &str,
    conflicts: &[(String, String, Path)],
) -> ApiError {
    let describe = |(m, v, p): &(String, String, Path)| {
        (format!("conflict with \"{m}\" using {v}"), display(p))
    };
    let lines: Vec<String> = conflicts
        .iter()
        .map(describe)
        .map(|(m, f)| format!("{m}: {f}"))
        .collect();
    let n = conflicts.len();
    let summary = if n == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(describe)
        .map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": m, "field": f}))
        .collect();
    let mut details = json!({"name": name, "kind": plural, "causes": causes});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError {
        details: Some(details),
        ..ApiError::new(409, "Conflict", summary)
    }
}

/// Checks that `managedFields` decodes into Go's `[]ManagedFieldsEntry`, which kube-apiserver
/// answers with 400 when it does not; the error is in Go's words. Keys entries do not have
/// are removed and reported in `unknown`.
pub fn check_managed_fields(list: &mut Value, unknown: &mut Vec<String>) -> Result<(), String> {
    let mismatch = |v: &Value, field: &str, go_type: &str| {
        let json_type = match v {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        format!("json: cannot unmarshal {json_type} into Go struct field {field} of type {go_type}")
    };
    let entries = match list {
        Value::Null => return Ok(()),
        Value::Array(entries) => entries,
        other => {
            return Err(mismatch(
                other,
                "ObjectMeta.metadata.managedFields",
                "[]v1.ManagedFieldsEntry",
            ));
        }
    };
    for (i, entry) in entries.iter_mut().enumerate() {
        let fields = match entry {
            Value::Null => continue,
            Value::Object(fields) => fields,
            other => {
                return Err(mismatch(
                    other,
                    "ObjectMeta.metadata.managedFields",
                    "v1.ManagedFieldsEntry",
                ));
            }
        };
        fields.retain(|key, _| {
            let known = matches!(
                key.as_str(),
                "manager"
                    | "operation"
                    | "apiVersion"
                    | "time"
                    | "fieldsType"
                    | "fieldsV1"
                    | "subresource"
            );
            if !known {
                unknown.push(format!("metadata.managedFields[{i}].{key}"));
            }
            known
        });
        for (key, value) in fields.iter() {
            let go_type = match key.as_str() {
                // Raw JSON in Go: anything decodes.
                "fieldsV1" => continue,
                "operation" => "v1.ManagedFieldsOperationType",
                "time" => "v1.Time",
                _ => "string",
            };
            if !value.is_string() && !value.is_null() {
                return Err(mismatch(
                    value,
                    &format!("ManagedFieldsEntry.metadata.managedFields.{key}"),
                    go_type,
                ));
            }
        }
        if let Some(time) = fields.get("time").and_then(Value::as_str)
            && crate::meta::parse_time(time).is_none()
        {
            return Err(format!(
                "metadata.managedFields[{i}].time: {time:?} is not an RFC 3339 time"
            ));
        }
    }
    Ok(())
}

/// Whether kube-apiserver's field manager accepts `list` as the object's new managedFields:
/// well-typed entries it cannot use are ignored in favour of the live object's.
fn usable(list: &Value) -> bool {
    list.as_array().is_some_and(|entries| {
        entries.iter().all(|e| {
            matches!(e["operation"].as_str(), Some("Apply" | "Update"))
                && e["apiVersion"].as_str().is_some_and(|v| !v.is_empty())
                && e["fieldsType"] == "FieldsV1"
                && e.get("fieldsV1")
                    .is_none_or(|f| f.is_object() || f.is_null())
        })
    })
}

/// `[]` or `[{}]`: an explicit request to drop all managedFields (e.g. kubectl's client-side
/// to server-side apply migration).
fn is_reset(list: &Value) -> bool {
    match list.as_array().map(Vec::as_slice) {
        Some([]) => true,
        Some([only]) => only.as_object().is_some_and(|m| m.is_empty()),
        _ => false,
    }
}

/// What a write from one version of an object to the next changed: the leaf paths of either
/// whose value differs (a map-list item: that appears or disappears), and those of them that
/// are leaves of the new version (what the writer owns now).
#[derive(Debug, Default, PartialEq, Eq)]
struct Changes {
    changed: FieldSet,
    owned_now: FieldSet,
}

/// The [`Changes`] from `old` to `new`. Walks both together and skips what is equal: a write
/// usually changes a few fields of an object, and listing every leaf of both versions cost a
/// sixth of a patch. Below a map field that differs, down to anything that is not a map
/// (lists above all, whose items' paths need their whole list), both sides are listed and
/// compared as [`leaves`] and [`nodes`] list them; every path under a map field comes only
/// from that field's values, so the answer is the same as comparing the whole objects.
fn changes(old: &Value, new: &Value, schema: Option<&Value>) -> Changes {
    let mut out = Changes::default();
    let (Some(old_map), Some(new_map)) = (old.as_object(), new.as_object()) else {
        changes_below(Some(old), Some(new), schema, Vec::new(), &mut out);
        return out;
    };
    for k in keys_of_either(old_map, new_map) {
        let (before, after) = (old_map.get(k), new_map.get(k));
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for field in MANAGED_METADATA {
                    let path = vec!["f:metadata".to_string(), format!("f:{field}")];
                    let schema = sub_schema(Some(metadata_schema()), field);
                    let (before, after) = (
                        before.and_then(|m| m.get(*field)),
                        after.and_then(|m| m.get(*field)),
                    );
                    changes_in(before, after, schema, path, &mut out);
                }
            }
            _ => changes_in(
                before,
                after,
                sub_schema(schema, k),
                vec![format!("f:{k}")],
                &mut out,
            ),
        }
    }
    out
}

/// The changes under `path`, a map field's: none when equal; field by field when both are maps.
fn changes_in(
    old: Option<&Value>,
    new: Option<&Value>,
    schema: Option<&Value>,
    path: Path,
    out: &mut Changes,
) {
    if old == new {
        return;
    }
    match (old, new) {
        (Some(Value::Object(old)), Some(Value::Object(new))) => {
            for k in keys_of_either(old, new) {
                let path = child(&path, format!("f:{k}"));
                changes_in(old.get(k), new.get(k), sub_schema(schema, k), path, out);
            }
        }
        _ => changes_below(old, new, schema, path, out),
    }
}

/// The keys of `a`, then those of `b` that `a` lacks.
fn keys_of_either<'a>(
    a: &'a Map<String, Value>,
    b: &'a Map<String, Value>,
) -> impl Iterator<Item = &'a String> {
    a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)))
}

/// The changes under `path` from the leaves and nodes of both sides, as [`leaves`] and
/// [`nodes`] name them.
fn changes_below(
    old: Option<&Value>,
    new: Option<&Value>,
    schema: Option<&Value>,
    path: Path,
    out: &mut Changes,
) {
    let scalar = |v: Option<&Value>| !matches!(v, Some(Value::Object(_) | Value::Array(_)));
    if !path.is_empty() && scalar(old) && scalar(new) {
        // A value set, changed or removed (they differ): the field itself is the one leaf.
        if new.is_some() {
            out.owned_now.insert(path.clone());
        }
        out.changed.insert(path);
        return;
    }
    fn listed<'a>(
        side: Option<&'a Value>,
        schema: Option<&Value>,
        path: &Path,
    ) -> (FieldSet, HashMap<Path, &'a Value>) {
        match side {
            None => Default::default(),
            Some(v) if path.is_empty() => (leaves(v, schema), nodes(v, schema)),
            Some(v) => {
                let (mut leaves, mut nodes) = (FieldSet::new(), HashMap::new());
                collect(v, schema, path.clone(), &mut leaves);
                collect_nodes(v, schema, path.clone(), &mut nodes);
                (leaves, nodes)
            }
        }
    }
    let (old_leaves, old_nodes) = listed(old, schema, &path);
    let (new_leaves, new_nodes) = listed(new, schema, &path);
    for p in old_leaves.union(&new_leaves) {
        let (before, after) = (old_nodes.get(p), new_nodes.get(p));
        let changed = if is_item(p) {
            // An item is changed only by appearing or disappearing.
            before.is_none() != after.is_none()
        } else {
            before != after
        };
        if changed {
            out.changed.insert(p.clone());
            if new_leaves.contains(p) {
                out.owned_now.insert(p.clone());
            }
        }
    }
}

/// Records a non-apply write (create/update/patch) from `old` to `new` by `writer`.
/// If the request set usable managedFields itself, those are kept as given.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer) {
    let requested = new.pointer("/metadata/managedFields").cloned();
    let previous = old.and_then(|o| o.pointer("/metadata/managedFields").cloned());
    if let Some(requested) = requested.filter(|r| Some(r) != previous.as_ref()) {
        if is_reset(&requested) {
            crate::meta::metadata_mut(new).remove("managedFields");
            return;
        }
        if usable(&requested) {
            return;
        }
        crate::meta::metadata_mut(new).remove("managedFields");
    }
    let mut entries = old.map(read_entries).unwrap_or_default();
    let Changes { changed, owned_now } = match old {
        None => {
            let leaves = leaves(new, writer.schema);
            Changes {
                changed: leaves.clone(),
                owned_now: leaves,
            }
        }
        Some(old) => changes(old, new, writer.schema),
    };
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in entries.iter_mut() {
        e.fields.retain(|p| !taken_over(&changed, p));
    }
    let is_mine = |e: &Entry| {
        e.manager == writer.manager
            && e.operation == "Update"
            && e.subresource.as_deref() == writer.subresource
    };
    match entries.iter_mut().find(|e| is_mine(e)) {
        Some(e) => {
            e.fields.extend(owned_now);
            e.time = writer.now.clone();
            e.api_version = writer.api_version.clone();
        }
        None => entries.push(entry(writer, "Update", owned_now)),
    }
    write_entries(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The changes from listing every leaf and node of both whole objects (`changes_below`
    /// at the root, as record_update computed them before): what [`changes`] must find by its
    /// walk that skips what is equal.
    fn changes_of_whole_objects(old: &Value, new: &Value, schema: Option<&Value>) -> Changes {
        let mut out = Changes::default();
        changes_below(Some(old), Some(new), schema, Vec::new(), &mut out);
        out
    }

    /// A schema with every kind of list, at the top and nested.
    fn lists_schema() -> Value {
        let lists = json!({
            "set": {"type": "array", "x-kubernetes-list-type": "set"},
            "map": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"properties": {"tags": {"type": "array", "x-kubernetes-list-type": "set"}}}},
            "atomic": {"type": "array"},
        });
        let mut properties = lists.as_object().unwrap().clone();
        properties.insert("spec".into(), json!({"properties": lists}));
        json!({"properties": properties})
    }

    /// JSON built from a few names and values, so that two of them share much and differ
    /// somewhere: maps, lists of each kind (items with and without their key, duplicates),
    /// scalars, and metadata with its managed fields.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0..3i64).prop_map(Value::from),
            prop::sample::select(vec!["x", "y", ""]).prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            let names = prop::sample::select(vec![
                "a", "b", "set", "map", "atomic", "spec", "name", "tags",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(names.prop_map(String::from), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn object() -> impl Strategy<Value = Value> {
        let names = prop::sample::select(vec!["a", "b", "set", "map", "atomic", "spec"]);
        let fields = prop::collection::btree_map(names.prop_map(String::from), value(), 0..5);
        let metadata = prop::collection::btree_map(
            prop::sample::select(vec![
                "labels",
                "annotations",
                "finalizers",
                "ownerReferences",
                "name",
            ])
            .prop_map(String::from),
            value(),
            0..3,
        );
        (fields, metadata).prop_map(|(fields, metadata)| {
            let mut object: Map<String, Value> = fields.into_iter().collect();
            object.insert("kind".into(), json!("Widget"));
            object.insert(
                "metadata".into(),
                Value::Object(metadata.into_iter().collect()),
            );
            Value::Object(object)
        })
    }

    /// `old` and a version of it with one field of its own replaced, removed or added.
    fn object_and_change() -> impl Strategy<Value = (Value, Value)> {
        (
            object(),
            value(),
            any::<prop::sample::Index>(),
            any::<bool>(),
        )
            .prop_map(|(old, replacement, at, nested)| {
                let mut new = old.clone();
                let map = new.as_object_mut().unwrap();
                let keys: Vec<String> = map.keys().cloned().collect();
                let key = keys[at.index(keys.len())].clone();
                match (nested, map.get_mut(&key)) {
                    (true, Some(Value::Object(inner))) if !inner.is_empty() => {
                        let inner_keys: Vec<String> = inner.keys().cloned().collect();
                        inner.insert(inner_keys[at.index(inner_keys.len())].clone(), replacement);
                    }
                    (_, Some(v)) if replacement.is_null() => *v = Value::Null,
                    _ => {
                        map.insert(key, replacement);
                    }
                }
                (old, new)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn changes_are_those_of_the_whole_objects((old, new) in object_and_change(), other in object()) {
            let schema = lists_schema();
            for schema in [None, Some(&schema)] {
                prop_assert_eq!(changes(&old, &new, schema), changes_of_whole_objects(&old, &new, schema));
                prop_assert_eq!(changes(&old, &other, schema), changes_of_whole_objects(&old, &other, schema));
                prop_assert_eq!(changes(&old, &old, schema), changes_of_whole_objects(&old, &old, schema));
            }
        }
    }

    fn w(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "v1".into(),
            subresource: None,
            now: "2024-01-01T00:00:00Z".into(),
            schema: None,
        }
    }

    #[test]
    fn apply_conflicts_force_and_removal() {
        let a1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"x": "1", "y": "2"}});
        let live = apply(None, &a1, &w("alice"), false, "", "configmaps").unwrap();
        assert_eq!(
            live["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:data": {"f:x": {}, "f:y": {}}})
        );

        // bob sets x to another value: conflict naming alice and the field.
        let b = json!({"metadata": {"name": "c"}, "data": {"x": "9"}});
        let err = apply(Some(&live), &b, &w("bob"), false, "", "configmaps").unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.x"
        );
        // Same value: shared ownership, no conflict.
        let same = json!({"metadata": {"name": "c"}, "data": {"x": "1"}});
        let shared = apply(Some(&live), &same, &w("bob"), false, "", "configmaps").unwrap();
        // alice stops applying x: bob still owns it, so it stays.
        let a2 = json!({"metadata": {"name": "c"}, "data": {"y": "2"}});
        let after = apply(Some(&shared), &a2, &w("alice"), false, "", "configmaps").unwrap();
        assert_eq!(after["data"], json!({"x": "1", "y": "2"}));
        // Force moves ownership of x to bob; alice dropping y removes it.
        let forced = apply(Some(&live), &b, &w("bob"), true, "", "configmaps").unwrap();
        assert_eq!(forced["data"]["x"], "9");
        let a3 = json!({"metadata": {"name": "c"}, "data": {}});
        let after = apply(Some(&forced), &a3, &w("alice"), false, "", "configmaps").unwrap();
        assert_eq!(after["data"], json!({"x": "9"}));
    }

    #[test]
    fn updates_take_ownership_without_conflict() {
        let a = json!({"metadata": {"name": "c"}, "data": {"x": "1"}});
        let live = apply(None, &a, &w("alice"), false, "", "configmaps").unwrap();
        let mut updated = live.clone();
        updated["data"]["x"] = json!("2");
        record_update(Some(&live), &mut updated, &w("kubectl-edit"));
        let entries = read_entries(&updated);
        assert_eq!(entries.len(), 1, "{updated}");
        assert_eq!(entries[0].manager, "kubectl-edit");
        // alice re-applying x=1 now conflicts with the updater.
        assert!(apply(Some(&updated), &a, &w("alice"), false, "", "configmaps").is_err());
    }

    #[test]
    fn huge_lists_apply_in_linear_time() {
        // Two managers applying long lists, another updating one item, then one manager
        // leaving. Each list is walked a few times, never once per item: the quadratic walk
        // this replaced took minutes here (5.6 s at a fifth of the size).
        const N: usize = 10_000;
        let schema = json!({"properties": {"spec": {"properties": {
            "items": {"type": "array", "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set"}}}}});
        let writer = |manager| Writer {
            schema: Some(&schema),
            ..w(manager)
        };
        let spec = |from: usize| {
            let items: Vec<Value> = (from..from + N)
                .map(|i| json!({"name": format!("c{i}"), "v": 1}))
                .collect();
            let tags: Vec<Value> = (from..from + N).map(|i| json!(i)).collect();
            json!({"spec": {"items": items, "tags": tags}})
        };
        let live = apply(None, &spec(0), &writer("alice"), false, "g", "things").unwrap();
        let both = apply(Some(&live), &spec(N), &writer("bob"), false, "g", "things").unwrap();
        assert_eq!(both["spec"]["items"].as_array().unwrap().len(), 2 * N);
        let mut updated = both.clone();
        updated["spec"]["items"][0]["v"] = json!(2);
        record_update(Some(&both), &mut updated, &writer("carol"));
        let empty = json!({"spec": {"items": [], "tags": []}});
        let left = apply(
            Some(&updated),
            &empty,
            &writer("alice"),
            false,
            "g",
            "things",
        )
        .unwrap();
        // Alice's items go but the one carol changed, which carol now shares.
        assert_eq!(left["spec"]["items"].as_array().unwrap().len(), N + 1);
        assert_eq!(left["spec"]["tags"].as_array().unwrap().len(), N);
    }

    #[test]
    fn map_lists_merge_by_key_and_sets_by_value() {
        let schema = json!({"properties": {"status": {"properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}}});
        let writer = |manager| Writer {
            schema: Some(&schema),
            ..w(manager)
        };
        let cond = |t: &str, st: &str| json!({"type": t, "status": st});
        let a = json!({"status": {"conditions": [cond("A", "True")], "tags": ["x"]}});
        let live = apply(None, &a, &writer("alice"), false, "g", "things").unwrap();
        let fields = &live["metadata"]["managedFields"][0]["fieldsV1"];
        assert_eq!(fields["f:status"]["f:tags"], json!({"v:\"x\"": {}}));
        assert!(
            fields["f:status"]["f:conditions"]
                .get("k:{\"type\":\"A\"}")
                .is_some(),
            "{fields}"
        );

        // bob adds his own condition and tag: both managers' items coexist.
        let b = json!({"status": {"conditions": [cond("B", "False")], "tags": ["y"]}});
        let both = apply(Some(&live), &b, &writer("bob"), false, "g", "things").unwrap();
        assert_eq!(
            both["status"]["conditions"],
            json!([cond("A", "True"), cond("B", "False")])
        );
        assert_eq!(both["status"]["tags"], json!(["x", "y"]));

        // bob changing alice's condition conflicts, naming the item by its key.
        let steal = json!({"status": {"conditions": [cond("A", "False")]}});
        let err = apply(Some(&both), &steal, &writer("bob"), false, "g", "things").unwrap_err();
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"alice\" using v1: .status.conditions[type=\"A\"].status"
        );

        // alice stops applying her condition: it goes, bob's stays.
        let gone = apply(
            Some(&both),
            &json!({"status": {"tags": ["x"]}}),
            &writer("alice"),
            false,
            "g",
            "things",
        )
        .unwrap();
        assert_eq!(gone["status"]["conditions"], json!([cond("B", "False")]));

        // An update that changes bob's condition takes only that field, not alice's item.
        let mut updated = both.clone();
        updated["status"]["conditions"][1]["status"] = json!("True");
        record_update(Some(&both), &mut updated, &writer("controller"));
        let entries = read_entries(&updated);
        let alice = entries.iter().find(|e| e.manager == "alice").unwrap();
        assert!(
            alice
                .fields
                .iter()
                .any(|p| display(p) == ".status.conditions[type=\"A\"].status")
        );
        let bob = entries.iter().find(|e| e.manager == "bob").unwrap();
        assert!(
            !bob.fields
                .iter()
                .any(|p| display(p) == ".status.conditions[type=\"B\"].status")
        );
        assert!(
            bob.fields
                .iter()
                .any(|p| display(p) == ".status.conditions[type=\"B\"]")
        );
    }
}
