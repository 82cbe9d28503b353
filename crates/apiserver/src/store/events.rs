//! Events are stored once, in core/v1 form, and served through both core/v1 and
//! events.k8s.io/v1, as kube-apiserver does. These functions convert between the two forms
//! (k8s.io/kubernetes/pkg/apis/events/v1/conversion.go).

use serde_json::{Map, Value};

/// (core/v1 field, events.k8s.io/v1 field) pairs that only change name.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("source", "deprecatedSource"),
];

/// Fields both forms share unchanged.
const SHARED: &[&str] = &[
    "metadata",
    "reason",
    "type",
    "action",
    "related",
    "eventTime",
    "series",
    "reportingInstance",
];

/// Whether `name` is a top-level field of a core/v1 Event.
pub fn is_core_field(name: &str) -> bool {
    SHARED.contains(&name) || RENAMED.iter().any(|(core, _)| *core == name)
}

/// Whether `name` is a top-level field of an events.k8s.io/v1 Event.
pub fn is_v1_field(name: &str) -> bool {
    SHARED.contains(&name) || RENAMED.iter().any(|(_, v1)| *v1 == name)
}

fn convert(obj: &Value, from_core: bool, api_version: &str) -> Value {
    let Some(src) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    out.insert("kind".into(), Value::String("Event".into()));
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    for key in SHARED {
        if let Some(v) = src.get(*key) {
            out.insert((*key).into(), v.clone());
        }
    }
    for (core, v1) in RENAMED {
        let (from, to) = if from_core { (core, v1) } else { (v1, core) };
        if let Some(v) = src.get(*from) {
            out.insert((*to).into(), v.clone());
        }
    }
    Value::Object(out)
}

pub fn core_to_v1(obj: &Value) -> Value {
    convert(obj, true, "events.k8s.io/v1")
}

pub fn v1_to_core(obj: &Value) -> Value {
    convert(obj, false, "v1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hello", "reason": "Started",
            "reportingController": "c", "reportingInstance": "i", "eventTime": "2024-01-01T00:00:00.000000Z"});
        let core = v1_to_core(&v1);
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hello");
        assert_eq!(core_to_v1(&core), v1);
    }

    #[test]
    fn each_form_knows_its_own_field_names() {
        for (core, v1) in [("message", "note"), ("involvedObject", "regarding")] {
            assert!(is_core_field(core) && !is_core_field(v1));
            assert!(is_v1_field(v1) && !is_v1_field(core));
        }
        assert!(is_core_field("reason") && is_v1_field("reason"));
        assert!(!is_core_field("spec") && !is_v1_field("spec"));
    }
}
