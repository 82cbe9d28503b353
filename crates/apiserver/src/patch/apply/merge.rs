//! Merging an applied configuration into the live object, list by list as the schema declares.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::fields::{ListKind, item_key, list_kind, metadata_schema, sub_schema};

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
pub(super) fn merge_root(target: &mut Value, applied: &Value, schema: Option<&Value>) {
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
