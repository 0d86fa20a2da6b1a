//! `Accept: application/json;as=Table;g=meta.k8s.io;v=v1` answers: kubectl's `get` output with a
//! CRD's `additionalPrinterColumns`, or Name/Age for built-in kinds.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::registry::{PrinterColumn, ResourceType};

/// Evaluates the simple JSONPath subset printer columns use: `.a.b`, `.a[0].b`,
/// `.a[?(@.type=="Ready")].status`.
pub fn json_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut cur = v;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if !key.is_empty() {
                cur = cur.get(key)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            cur = if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let (field, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur.as_array()?
                    .iter()
                    .find(|e| e.get(field.trim()).and_then(Value::as_str) == Some(want))?
            } else {
                cur.get(inner.trim().parse::<usize>().ok()?)?
            };
            rest = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(cur)
}

/// kubectl's short age format: 45s, 12m, 5h, 3d.
pub fn human_age(since: Duration) -> String {
    let s = since.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn age_of(ts: &str, now: SystemTime) -> Option<String> {
    let t: k8s_openapi::jiff::Timestamp = ts.parse().ok()?;
    let then = SystemTime::from(t);
    Some(human_age(now.duration_since(then).unwrap_or_default()))
}

fn columns(rt: &ResourceType) -> Vec<PrinterColumn> {
    let age = PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        json_path: ".metadata.creationTimestamp".into(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
        priority: 0,
    };
    if rt.printer_columns.is_empty() {
        vec![age]
    } else {
        rt.printer_columns.clone()
    }
}

fn cell(col: &PrinterColumn, obj: &Value, now: SystemTime) -> Value {
    let Some(v) = json_path(obj, &col.json_path) else {
        return Value::Null;
    };
    match (col.type_.as_str(), v) {
        ("date", Value::String(s)) => age_of(s, now).map(Value::String).unwrap_or(Value::Null),
        (_, Value::Object(_) | Value::Array(_)) => Value::String(v.to_string()),
        _ => v.clone(),
    }
}

pub fn table(
    rt: &ResourceType,
    objects: &[Value],
    resource_version: u64,
    include_object: &str,
    now: SystemTime,
) -> Value {
    let cols = columns(rt);
    let mut defs = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    defs.extend(cols.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": "", "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            cells.extend(cols.iter().map(|c| cell(c, o, now)));
            let object = match include_object {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                }),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_handles_fields_indexes_and_filters() {
        let v = json!({"status": {"conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(
            json_path(&v, ".status.conditions[1].type"),
            Some(&json!("Ready"))
        );
        assert_eq!(
            json_path(&v, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("True"))
        );
        assert_eq!(json_path(&v, ".status.missing"), None);
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(Duration::from_secs(30)), "30s");
        assert_eq!(human_age(Duration::from_secs(600)), "10m");
        assert_eq!(human_age(Duration::from_secs(3 * 86400)), "3d");
    }
}
