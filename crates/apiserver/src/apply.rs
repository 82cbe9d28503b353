//! Server-side apply and field ownership (`metadata.managedFields`).
//!
//! Field sets are sets of paths to leaves. Maps are recursed into; lists and scalars are leaves
//! (every list is atomic here, see the README). Applying as manager M:
//! - a field M sets to a value that differs from the live one and that another manager owns is a
//!   conflict, unless `force` is given, which moves the ownership to M;
//! - fields M owned before and no longer sets are removed, unless another manager also owns them;
//! - M's field set becomes exactly the fields of its applied configuration.
//!
//! Non-apply writes (create, update, patch) never conflict: their manager takes ownership of the
//! fields it changed, and those fields leave every other manager's set.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::error::ApiError;

type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Metadata fields that belong to field management (the rest of metadata is server-owned).
const MANAGED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// Leaf paths of an object, ignoring type metadata and server-owned metadata.
fn leaves(obj: &Value) -> FieldSet {
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
                        collect(v, vec!["metadata".into(), (*field).into()], &mut out);
                    }
                }
            }
            _ => collect(v, vec![k.clone()], &mut out),
        }
    }
    out
}

fn collect(v: &Value, path: Path, out: &mut FieldSet) {
    match v {
        // An empty map owns nothing (as in kube's field sets, it does not claim the children).
        Value::Object(m) => {
            for (k, child) in m {
                let mut p = path.clone();
                p.push(k.clone());
                collect(child, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

fn value_at<'a>(obj: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter().try_fold(obj, |cur, seg| cur.get(seg))
}

fn remove_at(obj: &mut Value, path: &Path) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parents {
        match cur.get_mut(seg) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `fieldsV1` encoding: `{"f:data": {"f:key": {}}}`.
fn encode(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let entry = cur
                .entry(format!("f:{seg}"))
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
                    .filter_map(|(k, c)| k.strip_prefix("f:").map(|k| (k.to_string(), c)))
                    .collect()
            })
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path);
            }
            return;
        }
        for (k, c) in children {
            let mut p = path.clone();
            p.push(k);
            walk(c, p, out);
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

fn deep_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        deep_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, a) => *t = a.clone(),
    }
}

/// Who writes, for field management.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: Option<&'a str>,
    pub now: &'a str,
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
    let new_fields = leaves(applied);
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

    let mut conflicts = Vec::new();
    for path in &new_fields {
        if value_at(live, path) == value_at(applied, path) {
            continue;
        }
        for e in entries.iter().filter(|e| !is_mine(e)) {
            if let Some(owned) = e.fields.iter().find(|p| overlaps(p, path)) {
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
        for e in entries
            .iter_mut()
            .filter(|e| !(e.manager == writer.manager && e.operation == "Apply"))
        {
            e.fields
                .retain(|p| !conflicts.iter().any(|(_, _, c)| c == p));
        }
    }

    let mut obj = live.clone();
    deep_merge(&mut obj, applied);
    for path in previously_owned.difference(&new_fields) {
        let shared = entries
            .iter()
            .any(|e| !is_mine(e) && e.fields.iter().any(|p| overlaps(p, path)));
        if !shared && !new_fields.iter().any(|p| p.starts_with(path)) {
            remove_at(&mut obj, path);
        }
    }
    entries.retain(|e| !is_mine(e));
    entries.push(entry(writer, "Apply", new_fields));
    write_entries(&mut obj, &entries);
    Ok(obj)
}

fn entry(writer: &Writer, operation: &str, fields: FieldSet) -> Entry {
    Entry {
        manager: writer.manager.into(),
        operation: operation.into(),
        api_version: writer.api_version.into(),
        time: writer.now.into(),
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
        (
            format!("conflict with \"{m}\" using {v}"),
            format!(".{}", p.join(".")),
        )
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

/// Records a non-apply write (create/update/patch) from `old` to `new` by `writer`.
/// If the request set managedFields itself, those are kept as given.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer) {
    let requested = new.pointer("/metadata/managedFields").cloned();
    let previous = old.and_then(|o| o.pointer("/metadata/managedFields").cloned());
    if requested.is_some() && requested != previous {
        // An explicit reset (e.g. kubectl's client-side to server-side apply migration).
        if requested
            .as_ref()
            .is_some_and(|r| r.as_array().is_some_and(Vec::is_empty))
        {
            crate::meta::metadata_mut(new).remove("managedFields");
        }
        return;
    }
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_leaves = leaves(new);
    let changed: FieldSet = match old {
        None => new_leaves.clone(),
        Some(old) => {
            let old_leaves = leaves(old);
            old_leaves
                .union(&new_leaves)
                .filter(|p| value_at(old, p) != value_at(new, p))
                .cloned()
                .collect()
        }
    };
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in entries.iter_mut() {
        e.fields.retain(|p| !changed.iter().any(|c| overlaps(c, p)));
    }
    let owned_now: FieldSet = changed
        .into_iter()
        .filter(|p| new_leaves.contains(p))
        .collect();
    let is_mine = |e: &Entry| {
        e.manager == writer.manager
            && e.operation == "Update"
            && e.subresource.as_deref() == writer.subresource
    };
    match entries.iter_mut().find(|e| is_mine(e)) {
        Some(e) => {
            e.fields.extend(owned_now);
            e.time = writer.now.into();
            e.api_version = writer.api_version.into();
        }
        None => entries.push(entry(writer, "Update", owned_now)),
    }
    write_entries(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "v1",
            subresource: None,
            now: "2024-01-01T00:00:00Z",
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
}
