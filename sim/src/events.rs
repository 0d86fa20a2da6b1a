//! core/v1 and events.k8s.io/v1 Events are one resource in two shapes, as in the apiserver: the
//! operator records through events.k8s.io (kube-runtime's Recorder) while `kubectl describe`
//! and `kubectl get events` read core/v1. Objects are stored as written and converted on read.

use serde_json::{Map, Value};

const CORE: &str = "v1";
const EVENTS: &str = "events.k8s.io/v1";

/// (events.k8s.io/v1 field, core/v1 field) pairs that only differ in name.
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(map: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = map.remove(from) {
        map.insert(to.to_string(), v);
    }
}

/// Converts an Event between the two API versions; other kinds only get `apiVersion` rewritten.
pub fn to_version(mut v: Value, api_version: &str) -> Value {
    let from = v["apiVersion"].as_str().unwrap_or_default().to_string();
    if from == api_version {
        return v;
    }
    if v["kind"] == "Event" {
        if let Some(map) = v.as_object_mut() {
            for (events_name, core_name) in RENAMED {
                match (from.as_str(), api_version) {
                    (EVENTS, CORE) => rename(map, events_name, core_name),
                    (CORE, EVENTS) => rename(map, core_name, events_name),
                    _ => {}
                }
            }
        }
    }
    v["apiVersion"] = Value::String(api_version.to_string());
    v
}

/// Field-selector values of an Event, named as core/v1 names them (kubectl's selectors).
pub fn selectable_fields(v: &Value) -> Vec<(String, String)> {
    if v["kind"] != "Event" {
        return vec![];
    }
    let object = if v["apiVersion"] == EVENTS {
        &v["regarding"]
    } else {
        &v["involvedObject"]
    };
    let mut out = vec![];
    if let Some(map) = object.as_object() {
        for (k, val) in map {
            if let Some(s) = val.as_str() {
                out.push((format!("involvedObject.{k}"), s.to_string()));
            }
        }
    }
    for k in ["reason", "type"] {
        if let Some(s) = v[k].as_str() {
            out.push((k.to_string(), s.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_versions() {
        let e = json!({"apiVersion": EVENTS, "kind": "Event", "note": "hi", "reason": "R",
                       "regarding": {"kind": "QuestDB", "name": "db1"}});
        let core = to_version(e.clone(), CORE);
        assert_eq!(core["message"], "hi");
        assert_eq!(core["involvedObject"]["name"], "db1");
        assert!(core.get("note").is_none());
        assert_eq!(to_version(core, EVENTS), e);
    }

    #[test]
    fn selectable_fields_use_core_names() {
        let e = json!({"apiVersion": EVENTS, "kind": "Event", "type": "Normal",
                       "regarding": {"kind": "QuestDB", "name": "db1"}});
        let f = selectable_fields(&e);
        assert!(f.contains(&("involvedObject.name".into(), "db1".into())));
        assert!(f.contains(&("type".into(), "Normal".into())));
    }
}
