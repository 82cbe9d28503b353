//! What a non-apply write changed, found by walking both versions together.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::fields::{
    FieldSet, MANAGED_METADATA, Path, child, is_item, leaves, metadata_schema, nodes, sub_schema,
    walk,
};

/// What a write from one version of an object to the next changed: the leaf paths of either
/// whose value differs (a map-list item: that appears or disappears), and those of them that
/// are leaves of the new version (what the writer owns now).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    pub changed: FieldSet,
    pub owned_now: FieldSet,
}

/// The [`Changes`] from `old` to `new`. Walks both together and skips what is equal: a write
/// usually changes a few fields of an object, and listing every leaf of both versions cost a
/// sixth of a patch. Below a map field that differs, down to anything that is not a map
/// (lists above all, whose items' paths need their whole list), both sides are listed and
/// compared as [`leaves`] and [`nodes`] list them; every path under a map field comes only
/// from that field's values, so the answer is the same as comparing the whole objects.
pub(super) fn changes(old: &Value, new: &Value, schema: Option<&Value>) -> Changes {
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
                walk(v, schema, path.clone(), &mut leaves);
                walk(v, schema, path.clone(), &mut nodes);
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

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

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
}
