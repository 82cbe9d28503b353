//! Strategic merge patch, as kube-apiserver applies it (apimachinery's `strategicpatch`, with
//! the options the server uses: parallel deletion lists merged, unmatched nulls ignored).
//!
//! It is a JSON merge patch in which lists follow their field's strategy (`patch_meta`):
//! replaced, merged as a set of values, or merged item by item on a key. Directives in the patch
//! refine it: `$patch: replace | delete` on a map or a list item, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`, which kubectl sends.
//! Merged lists keep kube-apiserver's order: the patch's items in the patch's (or
//! `$setElementOrder`'s) order, interleaved with the items only the server had, in theirs.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::patch::patch_meta::{ListStrategy, PatchMeta, join};
use crate::work::Deadline;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies the strategic merge patch `patch` to `target`, an object of the kind `meta`
/// describes; 504 once `deadline` passes.
pub fn apply(
    target: &Value,
    patch: &Map<String, Value>,
    meta: PatchMeta,
    deadline: Deadline,
) -> Result<Value, ApiError> {
    apply_with(target, patch, &|path| meta.list(path), deadline)
}

/// [`apply`] with the list strategies given by `lists`, for a field path from the root.
fn apply_with(
    target: &Value,
    patch: &Map<String, Value>,
    lists: &dyn Fn(&str) -> ListStrategy,
    deadline: Deadline,
) -> Result<Value, ApiError> {
    let original = match target {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    StrategicMerge { lists, deadline }
        .merge_map(original, patch.clone(), "")
        .map(Value::Object)
}

/// kube-apiserver's answers to a patch it cannot apply: the format errors are 400, lists of
/// lists 422, and the rest (a missing merge key, say) come out of apimachinery unclassified,
/// as 500.
fn bad_format(what: &str) -> ApiError {
    ApiError::bad_request(format!("invalid patch format of {what}"))
}

fn unclassified(message: String) -> ApiError {
    ApiError::internal(format!("Internal error occurred: {message}"))
}

fn no_merge_key(item: &Value, key: &str) -> ApiError {
    unclassified(format!(
        "map: {} does not contain declared merge key: {key}",
        brief(item)
    ))
}

struct StrategicMerge<'a> {
    lists: &'a dyn Fn(&str) -> ListStrategy,
    /// Checked at every map: the work between two maps is linear in what they hold.
    deadline: Deadline,
}

impl StrategicMerge<'_> {
    /// Merges `patch` into the map `original`, found at `path` (field names from the root).
    fn merge_map(
        &self,
        mut original: Map<String, Value>,
        mut patch: Map<String, Value>,
        path: &str,
    ) -> Result<Map<String, Value>, ApiError> {
        self.deadline.check()?;
        if let Some(directive) = patch.remove(DIRECTIVE) {
            return match directive.as_str() {
                Some("replace") => Ok(without_directives_map(patch)),
                Some("delete") => Ok(Map::new()),
                _ => Err(unclassified(format!(
                    "unknown patch type: {} in map: {}",
                    brief(&directive),
                    brief(&Value::Object(patch))
                ))),
            };
        }
        retain_keys(&mut original, &mut patch)?;
        self.set_element_orders(&mut original, &mut patch, path)?;
        for (key, value) in patch {
            let (key, deletion_list) = match key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
                Some(field) => (field.to_string(), true),
                None => (key, false),
            };
            if value.is_null() {
                original.remove(&key);
                continue;
            }
            let field_path = join(path, &key);
            let merged = match (original.remove(&key), value) {
                (None, _) if deletion_list => continue,
                (None, value) => without_directives(value),
                (Some(Value::Object(old)), Value::Object(new)) => {
                    Some(Value::Object(self.merge_map(old, new, &field_path)?))
                }
                (Some(Value::Array(old)), Value::Array(new)) => Some(Value::Array(
                    self.merge_list_field(old, new, &field_path, deletion_list)?,
                )),
                (Some(old), _) if deletion_list => Some(old),
                (Some(_), value) => without_directives(value),
            };
            if let Some(merged) = merged {
                original.insert(key, merged);
            }
        }
        Ok(original)
    }

    fn merge_key(&self, path: &str) -> (ListStrategy, Option<String>) {
        let strategy = (self.lists)(path);
        let key = match &strategy {
            ListStrategy::MergeByKey(key) => Some(key.clone()),
            _ => None,
        };
        (strategy, key)
    }

    /// A list field present in both: replaced, or merged when its strategy says so. A
    /// `$deleteFromPrimitiveList` list removes its values whatever the strategy.
    fn merge_list_field(
        &self,
        original: Vec<Value>,
        patch: Vec<Value>,
        path: &str,
        deletion_list: bool,
    ) -> Result<Vec<Value>, ApiError> {
        let (strategy, key) = self.merge_key(path);
        if deletion_list {
            let deleted = Positions::of(&patch, None);
            return Ok(original
                .into_iter()
                .filter(|v| deleted.get(v, None).is_none())
                .collect());
        }
        match strategy {
            ListStrategy::Replace => Ok(patch.into_iter().filter_map(without_directives).collect()),
            ListStrategy::MergeValues | ListStrategy::MergeByKey(_) => {
                self.merge_list(original, patch, key.as_deref(), path)
            }
        }
    }

    fn merge_list(
        &self,
        original: Vec<Value>,
        patch: Vec<Value>,
        key: Option<&str>,
        path: &str,
    ) -> Result<Vec<Value>, ApiError> {
        if original.is_empty() && patch.is_empty() {
            return Ok(original);
        }
        let (original, patch, merged) = if items_are_maps(&original, &patch)? {
            let Some(key) = key else {
                return Err(unclassified(format!(
                    "cannot merge lists without merge key for {path}"
                )));
            };
            let (original, patch) = apply_list_directives(original, patch, key)?;
            let mut merged = original.clone();
            let mut positions = Positions::of(&merged, Some(key));
            for item in &patch {
                if item.get(key).is_none() {
                    return Err(no_merge_key(item, key));
                }
                match (positions.get(item, Some(key)), item) {
                    (Some(i), Value::Object(new)) => {
                        let Value::Object(old) = std::mem::take(&mut merged[i]) else {
                            unreachable!("items are maps")
                        };
                        merged[i] = Value::Object(self.merge_map(old, new.clone(), path)?);
                    }
                    _ => {
                        if let Some(item) = without_directives(item.clone()) {
                            positions.add(&item, Some(key), merged.len());
                            merged.push(item);
                        }
                    }
                }
            }
            (original, patch, merged)
        } else {
            let mut seen = Positions::default();
            let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
            for value in original.iter().chain(&patch) {
                if seen.get(value, None).is_none() {
                    seen.add(value, None, merged.len());
                    merged.push(value.clone());
                }
            }
            (original, patch, merged)
        };
        let (in_patch, server_only) = partition(merged, &patch, key);
        Ok(normalize_order(
            in_patch,
            server_only,
            &patch,
            &original,
            key,
        ))
    }

    /// Each `$setElementOrder/<field>`: merges `<field>` now and orders it as the directive
    /// lists, the server's other items kept in between as they were.
    fn set_element_orders(
        &self,
        original: &mut Map<String, Value>,
        patch: &mut Map<String, Value>,
        path: &str,
    ) -> Result<(), ApiError> {
        let directives: Vec<String> = patch
            .keys()
            .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
            .cloned()
            .collect();
        for directive in directives {
            let order = patch.remove(&directive).expect("listed above");
            let field = &directive[SET_ELEMENT_ORDER.len()..];
            let Value::Array(order) = order else {
                return Err(bad_format("setElementOrder list"));
            };
            let old = match original.get(field) {
                Some(Value::Array(old)) => Some(old.clone()),
                Some(_) => return Err(bad_format("setElementOrder list")),
                None => None,
            };
            let new = match patch.remove(field) {
                Some(Value::Array(new)) => Some(new),
                Some(_) => return Err(bad_format("setElementOrder list")),
                None => None,
            };
            let field_path = join(path, field);
            let (_, key) = self.merge_key(&field_path);
            check_order(new.as_deref().unwrap_or_default(), &order, key.as_deref())?;
            let merged = match (old.clone(), new) {
                (Some(old), None) => old,
                (None, Some(new)) => new.into_iter().filter_map(without_directives).collect(),
                (Some(old), Some(new)) => self.merge_list_field(old, new, &field_path, false)?,
                (None, None) => continue,
            };
            let (in_order, server_only) = partition(merged, &order, key.as_deref());
            let old = old.unwrap_or_default();
            let ordered = normalize_order(in_order, server_only, &order, &old, key.as_deref());
            original.insert(field.to_string(), Value::Array(ordered));
        }
        Ok(())
    }
}

/// `$retainKeys`: the patch may only set the keys it lists, and the original loses the others.
fn retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(retained) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(listed) = retained else {
        return Err(bad_format("retainKeys"));
    };
    // Looked up, not scanned: tens of thousands of keys against as many must stay linear.
    let retained: HashSet<&str> = listed.iter().filter_map(Value::as_str).collect();
    let kept = |key: &str| retained.contains(key);
    let unlisted = patch.iter().any(|(k, v)| {
        !v.is_null()
            && !k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            && !k.starts_with(SET_ELEMENT_ORDER)
            && !kept(k)
    });
    if unlisted {
        return Err(bad_format("retainKeys"));
    }
    original.retain(|k, _| kept(k));
    Ok(())
}

/// Whether the items of both lists are maps; lists of lists and mixed lists are refused.
fn items_are_maps(original: &[Value], patch: &[Value]) -> Result<bool, ApiError> {
    let mut items = original.iter().chain(patch);
    let Some(first) = items.next() else {
        return Ok(false);
    };
    let kind = |v: &Value| std::mem::discriminant(v);
    if first.is_array() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "lists of lists are not supported",
        ));
    }
    if items.any(|v| kind(v) != kind(first)) {
        return Err(unclassified(
            "the items of a list must all be of one type".into(),
        ));
    }
    Ok(first.is_object())
}

/// Applies the `$patch` items of a merged list: `delete` removes the original items with that
/// key, `replace` makes the patch's other items the whole list. Returns the original and the
/// patch's remaining items.
fn apply_list_directives(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), ApiError> {
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    let mut deleted = Positions::default();
    for item in patch {
        match item.get(DIRECTIVE) {
            None => plain.push(item),
            Some(directive) => match directive.as_str() {
                Some("delete") => {
                    if item.get(key).is_none() {
                        return Err(no_merge_key(&item, key));
                    }
                    deleted.add(&item, Some(key), 0);
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(unclassified(
                        "merging lists cannot yet be specified in the patch".into(),
                    ));
                }
                _ => {
                    return Err(unclassified(format!(
                        "unknown patch type: {} in map: {}",
                        brief(directive),
                        brief(&item)
                    )));
                }
            },
        }
    }
    original.retain(|o| deleted.get(o, Some(key)).is_none());
    Ok(if replace {
        (plain, Vec::new())
    } else {
        (original, plain)
    })
}

/// The identity of a list item: its merge key's value, or the item itself.
fn identity<'a>(item: &'a Value, key: Option<&str>) -> Option<&'a Value> {
    match key {
        Some(key) => item.get(key),
        None => Some(item),
    }
}

/// Where each identity first stands in a list, so that merging lists of any length stays
/// linear (a patch with a hundred thousand items must not hold a worker for minutes).
#[derive(Default)]
struct Positions(HashMap<String, usize>);

impl Positions {
    fn of(list: &[Value], key: Option<&str>) -> Self {
        let mut positions = Positions::default();
        for (i, item) in list.iter().enumerate() {
            positions.add(item, key, i);
        }
        positions
    }

    fn add(&mut self, item: &Value, key: Option<&str>, at: usize) {
        if let Some(id) = identity(item, key) {
            self.0.entry(id.to_string()).or_insert(at);
        }
    }

    fn get(&self, item: &Value, key: Option<&str>) -> Option<usize> {
        self.0.get(&identity(item, key)?.to_string()).copied()
    }
}

/// Splits `merged` into the items `by` names and the others, each in `merged`'s order.
fn partition(merged: Vec<Value>, by: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    let by = Positions::of(by, key);
    merged
        .into_iter()
        .partition(|item| by.get(item, key).is_some())
}

/// kube-apiserver's order of a merged list: the patch's items sorted by `patch_order`, the
/// server-only items by `server_order`, then interleaved: a server item goes first only while
/// it stood before the next patch item on the server; new items come as soon as they are next.
fn normalize_order(
    mut in_patch: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let patch_order = Positions::of(patch_order, key);
    let server_order = Positions::of(server_order, key);
    in_patch.sort_by_cached_key(|item| patch_order.get(item, key).unwrap_or(usize::MAX));
    server_only.sort_by_cached_key(|item| server_order.get(item, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(in_patch.len() + server_only.len());
    let mut server = server_only.into_iter().peekable();
    for item in in_patch {
        let at = server_order.get(&item, key);
        while let Some(next) = server.peek() {
            match (server_order.get(next, key), at) {
                (Some(s), Some(p)) if s < p => out.extend(server.next()),
                _ => break,
            }
        }
        out.push(item);
    }
    out.extend(server);
    out
}

/// A patch list and its `$setElementOrder` must agree: the patch's items (deletions aside)
/// appear in the order list, in the same relative order.
fn check_order(patch: &[Value], order: &[Value], key: Option<&str>) -> Result<(), ApiError> {
    let mut remaining = order.iter();
    for item in patch.iter().filter(|i| i.get(DIRECTIVE).is_none()) {
        if let Some(key) = key
            && item.get(key).is_none()
        {
            return Err(no_merge_key(item, key));
        }
        let id = identity(item, key);
        if !remaining.any(|o| identity(o, key) == id) {
            return Err(unclassified(format!(
                "The order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER} list:\n{}\n",
                abridged(patch),
                abridged(order)
            )));
        }
    }
    Ok(())
}

/// A value for an error message, cut short so that a huge patch is not echoed back.
fn brief(value: &Value) -> String {
    const SHOWN: usize = 200;
    let text = value.to_string();
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// A list for an error message: its first items only, so that a huge patch is not echoed back.
fn abridged(list: &[Value]) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<String> = list.iter().take(SHOWN).map(Value::to_string).collect();
    let more = list.len().saturating_sub(SHOWN);
    if more == 0 {
        format!("[{}]", shown.join(","))
    } else {
        format!("[{},… {more} more]", shown.join(","))
    }
}

/// A patch value as it enters the object: maps with a `$patch` directive dropped, other
/// directives and nulls removed. `None` when the value itself is a directive.
fn without_directives(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) if map.contains_key(DIRECTIVE) => None,
        Value::Object(map) => Some(Value::Object(without_directives_map(map))),
        Value::Array(items) => Some(Value::Array(
            items.into_iter().filter_map(without_directives).collect(),
        )),
        other => Some(other),
    }
}

fn without_directives_map(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
        .filter_map(|(k, v)| without_directives(v).map(|v| (k, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The lists of apimachinery's own strategic merge patch tests.
    fn lists(path: &str) -> ListStrategy {
        match path.rsplit('.').next().unwrap_or(path) {
            "mergingList" => ListStrategy::MergeByKey("name".into()),
            "mergingIntList" | "nestedList" => ListStrategy::MergeValues,
            _ => ListStrategy::Replace,
        }
    }

    fn patched(current: Value, patch: Value) -> Result<Value, ApiError> {
        apply_with(
            &current,
            patch.as_object().unwrap(),
            &lists,
            Deadline::from_now(),
        )
    }

    #[test]
    fn merged_lists_take_kube_apiservers_order() {
        // Cases from apimachinery's strategicpatch tests: the current object, the patch
        // kubectl sends, and kube-apiserver's result.
        for (current, patch, result) in [
            (
                json!({"mergingIntList": [1, 2, 4]}),
                json!({"$setElementOrder/mergingIntList": [1, 2, 3], "mergingIntList": [3]}),
                json!({"mergingIntList": [1, 2, 3, 4]}),
            ),
            (
                json!({"mergingIntList": [1, 4, 2]}),
                json!({"$setElementOrder/mergingIntList": [3, 1, 2], "mergingIntList": [3]}),
                json!({"mergingIntList": [3, 1, 4, 2]}),
            ),
            (
                json!({"mergingList": [{"name": 1, "other": "a"}, {"name": 3}]}),
                json!({"$setElementOrder/mergingList": [{"name": 1}, {"name": 2}],
                       "mergingList": [{"name": 2}]}),
                json!({"mergingList": [{"name": 1, "other": "a"}, {"name": 2}, {"name": 3}]}),
            ),
            (
                json!({"mergingList": [{"name": 1, "other": "a"}, {"name": 2, "value": 2},
                    {"name": 7}, {"name": 9}, {"name": 8}, {"name": 3, "value": 3},
                    {"name": 4, "value": 4}]}),
                json!({"$setElementOrder/mergingList":
                    [{"name": 2}, {"name": 1}, {"name": 4}, {"name": 3}]}),
                json!({"mergingList": [{"name": 2, "value": 2}, {"name": 1, "other": "a"},
                    {"name": 7}, {"name": 9}, {"name": 8}, {"name": 4, "value": 4},
                    {"name": 3, "value": 3}]}),
            ),
            // Without an order directive the patch's new items come first.
            (
                json!({"mergingIntList": [1, 2]}),
                json!({"mergingIntList": [3, 2]}),
                json!({"mergingIntList": [3, 1, 2]}),
            ),
        ] {
            assert_eq!(
                patched(current.clone(), patch.clone()).unwrap(),
                result,
                "{patch}"
            );
        }
    }

    #[test]
    fn items_merge_by_key_and_other_lists_are_replaced() {
        let current = json!({"mergingList": [{"name": "a", "value": 1, "keep": true}, {"name": "b"}],
            "otherList": [1, 2]});
        let out = patched(
            current,
            json!({"mergingList": [{"name": "a", "value": 2, "keep": null}, {"name": "c", "drop": null}],
                   "otherList": [3]}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"mergingList": [{"name": "a", "value": 2}, {"name": "c"}, {"name": "b"}],
                   "otherList": [3]})
        );
    }

    #[test]
    fn directives() {
        let current = json!({
            "mergingList": [{"name": "a"}, {"name": "b"}],
            "mergingIntList": [1, 2, 3],
            "map": {"x": 1, "y": 2},
            "gone": {"x": 1},
            "union": {"emptyDir": {}, "size": 1},
        });
        let out = patched(
            current.clone(),
            json!({
                "mergingList": [{"name": "a", "$patch": "delete"}],
                "$deleteFromPrimitiveList/mergingIntList": [2],
                "map": {"$patch": "replace", "z": 3},
                "gone": {"$patch": "delete"},
                "union": {"$retainKeys": ["hostPath", "size"], "hostPath": {"path": "/x"}},
                "$deleteFromPrimitiveList/absent": [1],
            }),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({
                "mergingList": [{"name": "b"}],
                "mergingIntList": [1, 3],
                "map": {"z": 3},
                "gone": {},
                "union": {"hostPath": {"path": "/x"}, "size": 1},
            })
        );
        // `$patch: replace` as a list item makes the patch's items the whole list.
        let out = patched(
            current,
            json!({"mergingList": [{"name": "z"}, {"$patch": "replace"}]}),
        )
        .unwrap();
        assert_eq!(out["mergingList"], json!([{"name": "z"}]));
    }

    #[test]
    fn new_values_enter_without_directives_or_nulls() {
        let out = patched(
            json!({}),
            json!({"map": {"a": null, "b": 1, "$setElementOrder/l": [], "m": {"$patch": "delete"}},
                   "mergingList": [{"name": "x", "$patch": "delete"}, {"name": "y"}]}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"map": {"b": 1}, "mergingList": [{"name": "y"}]})
        );
    }

    #[test]
    fn huge_lists_merge_in_linear_time() {
        // A hostile patch (a body near the size limit holds this many items) against an object
        // as large: a quadratic merge would take minutes; this takes milliseconds.
        const N: usize = 100_000;
        let items = |from: usize| -> Vec<Value> {
            (from..from + N)
                .map(|i| json!({"name": i.to_string()}))
                .collect()
        };
        let values = |from: usize| -> Vec<Value> { (from..from + N).map(|i| json!(i)).collect() };
        let current = json!({"mergingList": items(0), "mergingIntList": values(0)});
        let mut reversed = items(N / 2);
        reversed.reverse();
        let patch = json!({
            "mergingList": reversed.clone(),
            "$setElementOrder/mergingList": reversed,
            "mergingIntList": values(N / 2),
        });
        let out = patched(current.clone(), patch)
            .map_err(|e| e.message.chars().take(300).collect::<String>())
            .unwrap();
        assert_eq!(out["mergingList"].as_array().unwrap().len(), N + N / 2);
        assert_eq!(out["mergingIntList"].as_array().unwrap().len(), N + N / 2);
        // A refused one does not echo the whole patch back.
        let refused = patched(
            current,
            json!({"mergingList": items(0), "$setElementOrder/mergingList": items(1)}),
        )
        .unwrap_err();
        assert!(
            refused.message.len() < 1_000,
            "{}",
            &refused.message[..1_000]
        );
        assert!(refused.message.contains("more]"), "{}", refused.message);
    }

    #[test]
    fn deletion_lists_and_retained_keys_keep_their_meaning() {
        let current = json!({
            "mergingIntList": [1, 2, 2, 3, "2"],
            "otherList": ["a", "b", {"c": 1}],
            "map": {"x": 1, "y": 2, "z": 3},
        });
        let out = patched(
            current,
            json!({
                // Every occurrence goes; values of another type (the string "2") stay; values
                // the list does not hold change nothing.
                "$deleteFromPrimitiveList/mergingIntList": [2, 9],
                // Whatever the list's strategy.
                "$deleteFromPrimitiveList/otherList": ["b", {"c": 1}],
                // Listed keys stay whether or not the patch sets them; entries that are not
                // strings retain nothing.
                "map": {"$retainKeys": ["x", "z", 3, "w"], "z": 4},
            }),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({
                "mergingIntList": [1, 3, "2"],
                "otherList": ["a"],
                "map": {"x": 1, "z": 4},
            })
        );
    }

    #[test]
    fn huge_directives_apply_in_linear_time() {
        // The reported attack's shape: tens of thousands of `$retainKeys` and
        // `$deleteFromPrimitiveList` entries against as many keys and values (80,000 against
        // 80,000 took 16 s when each was looked for in a scan of the other).
        const N: usize = 80_000;
        let names = |from: usize| (from..from + N).map(|i| format!("k{i}"));
        let current = json!({
            "map": names(0).map(|k| (k, json!(1))).collect::<Map<String, Value>>(),
            "mergingIntList": names(0).collect::<Vec<_>>(),
        });
        let out = patched(
            current,
            json!({
                "map": {"$retainKeys": names(N / 2).collect::<Vec<_>>()},
                "$deleteFromPrimitiveList/mergingIntList": names(N / 2).collect::<Vec<_>>(),
            }),
        )
        .unwrap();
        assert_eq!(out["map"].as_object().unwrap().len(), N / 2);
        assert!(out["map"].get(format!("k{}", N / 2)).is_some());
        assert_eq!(out["mergingIntList"].as_array().unwrap().len(), N / 2);
        assert_eq!(out["mergingIntList"][0], "k0");
    }

    #[test]
    fn a_merge_past_its_deadline_stops_with_504() {
        let error = apply_with(
            &json!({"map": {"x": 1}}),
            json!({"map": {"y": 2}}).as_object().unwrap(),
            &lists,
            Deadline::after(std::time::Duration::ZERO),
        )
        .unwrap_err();
        assert_eq!((error.code, error.reason), (504, "Timeout"));
    }

    #[test]
    fn bad_patches_are_refused_as_kube_apiserver_refuses_them() {
        let current = json!({"mergingList": [{"name": "a"}], "map": {"x": 1}, "nestedList": [[0]]});
        for (patch, code, words) in [
            (
                json!({"mergingList": [{"value": 1}]}),
                500,
                "does not contain declared merge key: name",
            ),
            (
                json!({"map": {"$retainKeys": ["x"], "y": 2}}),
                400,
                "invalid patch format of retainKeys",
            ),
            (json!({"map": {"$retainKeys": "x"}}), 400, "retainKeys"),
            (
                json!({"$setElementOrder/mergingList": [{"name": "b"}],
                       "mergingList": [{"name": "a"}]}),
                500,
                "doesn't match",
            ),
            (
                json!({"$setElementOrder/mergingList": {"name": "a"}}),
                400,
                "setElementOrder",
            ),
            (
                json!({"map": {"$patch": "bogus"}}),
                500,
                "unknown patch type",
            ),
            (
                json!({"mergingList": [{"name": "a", "$patch": "merge"}]}),
                500,
                "cannot yet be specified",
            ),
            (json!({"nestedList": [[1]]}), 422, "lists of lists"),
        ] {
            let error = patched(current.clone(), patch.clone()).unwrap_err();
            assert!(
                error.message.len() < 1_000,
                "a short message, not the patch"
            );
            assert_eq!(error.code, code, "{patch}: {}", error.message);
            assert!(error.message.contains(words), "{patch}: {}", error.message);
        }
    }
}
