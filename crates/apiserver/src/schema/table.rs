//! Server-side printing: `meta.k8s.io/v1` Tables, which `kubectl get` asks for.

use serde_json::{Value, json};

use crate::meta;
use crate::schema::printers::{self, Printer};
use crate::store::registry::{Flavor, PrinterColumn, ResourceDef};

/// How much of each object rows carry (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

fn columns(def: &ResourceDef) -> Vec<PrinterColumn> {
    let name = PrinterColumn {
        name: "Name".into(),
        type_: "string".into(),
        json_path: ".metadata.name".into(),
        priority: 0,
        description: "Name must be unique within a namespace.".into(),
    };
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        json_path: ".metadata.creationTimestamp".into(),
        priority: 0,
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
    };
    let mut cols = vec![name];
    cols.extend(def.printer_columns.iter().cloned());
    // A CRD that declares columns chooses them all; otherwise an Age column ends the table.
    if def.printer_columns.is_empty() {
        cols.push(age);
    }
    cols
}

/// Evaluates the simple JSONPath subset printer columns use: `.a.b`, `.a[0]`, `.a[*].b`,
/// `.a[?(@.type=="Ready")].status`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut current = vec![obj];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            current = current.into_iter().filter_map(|v| v.get(field)).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return vec![];
            };
            let selector = &r[..end];
            rest = &r[end + 1..];
            let items = current.into_iter().filter_map(Value::as_array).flatten();
            current = if selector == "*" {
                items.collect()
            } else if let Ok(i) = selector.parse::<usize>() {
                items.skip(i).take(1).collect()
            } else if let Some(filter) = selector
                .strip_prefix("?(@.")
                .and_then(|f| f.strip_suffix(')'))
            {
                let Some((field, value)) = filter.split_once("==") else {
                    return vec![];
                };
                let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
                let field = field.trim();
                items
                    .filter(|item| {
                        json_path(item, &format!(".{field}"))
                            .first()
                            .is_some_and(|v| cell_text(v) == value)
                    })
                    .collect()
            } else {
                return vec![];
            };
        } else {
            return vec![];
        }
    }
    current
}

fn cell_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn cell(col: &PrinterColumn, obj: &Value, now: i64) -> Value {
    let found = json_path(obj, &col.json_path);
    match (col.type_.as_str(), found.as_slice()) {
        (_, []) => json!("<none>"),
        ("date", [Value::String(t), ..]) => match meta::parse_time(t) {
            Some(at) => json!(meta::human_duration(now - at)),
            None => json!("<invalid>"),
        },
        (_, [single]) => match single {
            Value::Number(_) | Value::Bool(_) => (*single).clone(),
            other => json!(cell_text(other)),
        },
        (_, many) => json!(
            many.iter()
                .map(|v| cell_text(v))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn row(cols: &[PrinterColumn], obj: &Value, include: IncludeObject, now: i64) -> Value {
    let cells: Vec<Value> = cols.iter().map(|c| cell(c, obj, now)).collect();
    json!({ "cells": cells, "object": row_object(obj, include) })
}

/// What a row carries of its object (`includeObject`).
fn row_object(obj: &Value, include: IncludeObject) -> Value {
    match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Object => obj.clone(),
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        }),
    }
}

/// kube-apiserver's columns for Events (pkg/printers/internalversion `printEvent`): no Name or
/// Age by default, but when last seen, and the object as `kind/name`; the rest for `-o wide`.
const EVENT_COLUMNS: [(&str, i64); 10] = [
    ("Last Seen", 0),
    ("Type", 0),
    ("Reason", 0),
    ("Object", 0),
    ("Subobject", 1),
    ("Source", 1),
    ("Message", 0),
    ("First Seen", 1),
    ("Count", 1),
    ("Name", 1),
];

/// One Event's cells, from its core/v1 form or its events.k8s.io/v1 form.
fn event_cells(event: &Value, now: i64) -> Vec<Value> {
    let text = |path: &str| {
        event
            .pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let first_of = |paths: &[&str]| {
        paths
            .iter()
            .map(|p| text(p))
            .find(|t| !t.is_empty())
            .unwrap_or_default()
    };
    let since = |at: &str| match meta::parse_time(at) {
        Some(at) => meta::human_duration(now - at),
        None => "<unknown>".to_string(),
    };
    let first = first_of(&["/firstTimestamp", "/deprecatedFirstTimestamp", "/eventTime"]);
    let series_last = text("/series/lastObservedTime");
    let last = if series_last.is_empty() {
        first_of(&["/lastTimestamp", "/deprecatedLastTimestamp"])
    } else {
        series_last
    };
    let last = if last.is_empty() { first.clone() } else { last };
    let count = event
        .pointer("/series/count")
        .or_else(|| event.get("count"))
        .or_else(|| event.get("deprecatedCount"))
        .and_then(Value::as_i64)
        .filter(|c| *c > 0)
        .unwrap_or(1);
    let (kind, name) = if event.get("involvedObject").is_some() {
        (text("/involvedObject/kind"), text("/involvedObject/name"))
    } else {
        (text("/regarding/kind"), text("/regarding/name"))
    };
    let object = if name.is_empty() {
        kind.to_lowercase()
    } else {
        format!("{}/{name}", kind.to_lowercase())
    };
    let source = {
        let component = first_of(&[
            "/source/component",
            "/reportingController",
            "/reportingComponent",
        ]);
        let host = first_of(&["/source/host", "/reportingInstance"]);
        match (component.is_empty(), host.is_empty()) {
            (true, _) => String::new(),
            (false, true) => component,
            (false, false) => format!("{component}, {host}"),
        }
    };
    vec![
        json!(since(&last)),
        json!(text("/type")),
        json!(text("/reason")),
        json!(object),
        json!(first_of(&[
            "/involvedObject/fieldPath",
            "/regarding/fieldPath"
        ])),
        json!(source),
        json!(first_of(&["/message", "/note"]).trim()),
        json!(since(&first)),
        json!(count),
        json!(text("/metadata/name")),
    ]
}

fn event_table(objects: &[Value], list_meta: Value, include: IncludeObject, now: i64) -> Value {
    let defs: Vec<Value> = EVENT_COLUMNS
        .iter()
        .map(|(name, priority)| {
            let (type_, format) = match *name {
                "Count" => ("integer", ""),
                "Name" => ("string", "name"),
                _ => ("string", ""),
            };
            json!({ "name": name, "type": type_, "format": format, "description": "", "priority": priority })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| json!({ "cells": event_cells(o, now), "object": row_object(o, include) }))
        .collect();
    envelope(list_meta, defs, rows)
}

/// A built-in kind's Table, as its kube-apiserver printer makes it.
fn printed_table(
    printer: &Printer,
    objects: &[Value],
    list_meta: Value,
    include: IncludeObject,
    now: i64,
) -> Value {
    let defs = printer
        .columns
        .iter()
        .map(|c| {
            json!({ "name": c.name, "type": c.type_, "format": c.format,
                "description": c.description, "priority": c.priority })
        })
        .collect();
    let rows = objects
        .iter()
        .map(|o| {
            let mut row =
                json!({ "cells": (printer.cells)(o, now), "object": row_object(o, include) });
            if let Some(conditions) = (printer.conditions)(o) {
                row["conditions"] = conditions;
            }
            row
        })
        .collect();
    envelope(list_meta, defs, rows)
}

fn envelope(list_meta: Value, column_definitions: Vec<Value>, rows: Vec<Value>) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": column_definitions,
        "rows": rows,
    })
}

/// A Table of `objects` with the list metadata `list_meta`.
pub fn table(
    def: &ResourceDef,
    objects: &[Value],
    list_meta: Value,
    include: IncludeObject,
) -> Value {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if matches!(def.flavor, Flavor::CoreEvent | Flavor::EventsV1Event) {
        return event_table(objects, list_meta, include, now);
    }
    if def.flavor != Flavor::CustomResource
        && let Some(printer) = printers::of(&def.group, &def.kind)
    {
        return printed_table(&printer, objects, list_meta, include, now);
    }
    let cols = columns(def);
    let defs: Vec<Value> = cols
        .iter()
        .map(|c| {
            let format = if c.json_path == ".metadata.name" { "name" } else { "" };
            let type_ = if c.type_ == "date" { "string" } else { c.type_.as_str() };
            json!({ "name": c.name, "type": type_, "format": format, "description": c.description, "priority": c.priority })
        })
        .collect();
    let rows = objects
        .iter()
        .map(|o| row(&cols, o, include, now))
        .collect();
    envelope(list_meta, defs, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_print_as_kube_apiserver_prints_them() {
        let now = meta::parse_time("2026-11-26T10:00:00Z").unwrap();
        let core = json!({
            "metadata": {"name": "m1.17a"},
            "involvedObject": {"kind": "Machine", "name": "m1", "fieldPath": ""},
            "reason": "RefreshCertsDone", "type": "Normal", "message": " refreshed \n",
            "firstTimestamp": "2026-11-26T09:00:00Z", "lastTimestamp": "2026-11-26T09:58:00Z",
            "count": 3, "source": {"component": "caretaker"},
        });
        assert_eq!(
            event_cells(&core, now),
            [
                json!("2m"),
                json!("Normal"),
                json!("RefreshCertsDone"),
                json!("machine/m1"),
                json!(""),
                json!("caretaker"),
                json!("refreshed"),
                json!("60m"),
                json!(3),
                json!("m1.17a")
            ]
        );
        // events.k8s.io/v1: regarding, note, a series, the reporting controller and instance.
        let v1 = json!({
            "metadata": {"name": "e"},
            "regarding": {"kind": "Cluster", "name": "c1"},
            "reason": "R", "type": "Warning", "note": "n",
            "eventTime": "2026-11-26T09:59:00.000000Z",
            "series": {"count": 7, "lastObservedTime": "2026-11-26T09:59:50.000000Z"},
            "reportingController": "caretaker", "reportingInstance": "op-1",
        });
        let cells = event_cells(&v1, now);
        assert_eq!(cells[0], json!("10s"));
        assert_eq!(cells[3], json!("cluster/c1"));
        assert_eq!(cells[5], json!("caretaker, op-1"));
        assert_eq!(cells[7], json!("60s"));
        assert_eq!(cells[8], json!(7));
        let table = event_table(&[core], json!({}), IncludeObject::None, now);
        let shown: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["priority"] == 0)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(shown, ["Last Seen", "Type", "Reason", "Object", "Message"]);
    }

    #[test]
    fn json_path_filters() {
        let obj = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"n": 3}});
        assert_eq!(
            json_path(&obj, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![&json!("True")]
        );
        assert_eq!(json_path(&obj, ".spec.n"), vec![&json!(3)]);
        assert_eq!(
            json_path(&obj, ".status.conditions[0].type"),
            vec![&json!("A")]
        );
        assert!(json_path(&obj, ".missing.x").is_empty());
    }
}
