//! The four PATCH flavours. Strategic merge is approximated: lists with a known merge key
//! (containers by `name`, ports by `containerPort`/`port`, ...) merge element-wise, every other
//! list is replaced, and the `$patch`/`$setElementOrder`/`$deleteFromPrimitiveList` directives
//! kubectl sends are honoured or ignored as documented in the README.

use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Parses a request body that may be JSON or (for server-side apply and `application/yaml`)
/// YAML. Malformed input is a 400 like the apiserver's decoder errors.
pub fn parse_body(body: &[u8], yaml: bool) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(json_err) if yaml => serde_yaml_ng::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding YAML: {e} (as JSON: {json_err})"))
        }),
        Err(e) => Err(ApiError::bad_request(format!(
            "error decoding request body: invalid JSON: {e}"
        ))),
    }
}

/// Applies `patch` (already parsed) of kind `kind` to `current`.
pub fn apply_patch(
    kind: PatchKind,
    current: &Value,
    patch: &Value,
    strategic_allowed: bool,
) -> Result<Value, ApiError> {
    let mut target = current.clone();
    match kind {
        PatchKind::Merge => {
            require_object(patch)?;
            json_patch::merge(&mut target, patch);
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut target, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
        PatchKind::Strategic => {
            if !strategic_allowed {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json (not supported for custom resources)",
                ));
            }
            require_object(patch)?;
            strategic_merge(&mut target, patch);
        }
        PatchKind::Apply => {
            require_object(patch)?;
            if strategic_allowed {
                strategic_merge(&mut target, patch);
            } else {
                json_patch::merge(&mut target, patch);
            }
        }
    }
    Ok(target)
}

fn require_object(patch: &Value) -> Result<(), ApiError> {
    if patch.is_object() {
        Ok(())
    } else {
        Err(ApiError::bad_request("patch body must be a JSON object"))
    }
}

/// The merge key of a list field, from the Kubernetes types' `patchMergeKey` tags.
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "ports" => {
            if sample.is_some_and(|s| s.get("containerPort").is_some()) {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

/// Primitive lists that merge as sets (`patchStrategy: merge` without a key).
fn merges_as_set(field: &str) -> bool {
    field == "finalizers"
}

pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch_map.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(target_map) = target.as_object_mut() else {
        return;
    };
    for (key, value) in patch_map {
        if key == "$patch" || key.starts_with("$setElementOrder/") || key == "$retainKeys" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) =
                (target_map.get_mut(field), value.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        match value {
            Value::Null => {
                target_map.remove(key);
            }
            Value::Object(_) => {
                let child = target_map.entry(key.clone()).or_insert(Value::Null);
                strategic_merge(child, value);
            }
            Value::Array(items) => {
                let existing = target_map.get_mut(key).and_then(Value::as_array_mut);
                match (existing, merge_key(key, items.first())) {
                    (Some(list), Some(mk)) => merge_keyed_list(list, items, mk),
                    (Some(list), None) if merges_as_set(key) => {
                        for v in items {
                            if !list.contains(v) {
                                list.push(v.clone());
                            }
                        }
                    }
                    _ => {
                        let cleaned: Vec<Value> = items
                            .iter()
                            .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                            .cloned()
                            .collect();
                        target_map.insert(key.clone(), Value::Array(cleaned));
                    }
                }
            }
            other => {
                target_map.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_keyed_list(list: &mut Vec<Value>, items: &[Value], mk: &str) {
    for item in items {
        let Some(key_value) = item.get(mk) else {
            list.push(item.clone());
            continue;
        };
        let pos = list.iter().position(|e| e.get(mk) == Some(key_value));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut list[i], item),
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item);
                list.push(fresh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_containers_by_name_and_honours_directives() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ], "tolerations": [{"key": "k"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"}
            ],
            "tolerations": [{"key": "j"}]
        }});
        strategic_merge(&mut pod, &patch);
        assert_eq!(
            pod["spec"]["containers"],
            json!([
                {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
            ])
        );
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "j"}]));
    }

    #[test]
    fn null_deletes_and_finalizers_merge_as_a_set() {
        let mut obj = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}});
        strategic_merge(
            &mut obj,
            &json!({"metadata": {"finalizers": ["b", "a"], "labels": {"x": null}}}),
        );
        assert_eq!(obj["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(obj["metadata"]["labels"], json!({"y": "2"}));
    }

    #[test]
    fn json_patch_test_failure_is_rejected() {
        let cur = json!({"a": 1});
        let p = json!([{"op": "test", "path": "/a", "value": 2}]);
        assert_eq!(
            apply_patch(PatchKind::Json, &cur, &p, true)
                .unwrap_err()
                .code,
            422
        );
    }
}
