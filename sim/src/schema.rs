//! Custom-resource admission the way the apiserver does it for a structural schema: prune unknown
//! fields, apply defaults, check types/required/enum/bounds, then run `x-kubernetes-validations`
//! CEL rules (with `oldSelf` on updates) through `kube-cel`.

use serde_json::{Map, Value};

use crate::error::FieldCause;

pub struct CrdSchema {
    raw: Value,
    compiled: kube_cel::CompiledSchema,
}

impl std::fmt::Debug for CrdSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrdSchema").finish_non_exhaustive()
    }
}

impl CrdSchema {
    /// A CRD whose rules do not compile is rejected, as the apiserver does.
    pub fn compile(raw: Value) -> Result<Self, String> {
        if !raw.is_object() {
            return Err("Required value: schemas are required".into());
        }
        let compiled = kube_cel::compile_schema(&raw);
        let mut problems = vec![];
        collect_compile_errors(&compiled, &mut problems);
        if !problems.is_empty() {
            return Err(format!(
                "x-kubernetes-validations: compilation failed: {}",
                problems.join("; ")
            ));
        }
        Ok(Self { raw, compiled })
    }

    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// Prunes and defaults `obj` in place, then validates it. `old` is the stored object on
    /// updates, so transition rules (`oldSelf`) run.
    pub fn admit(&self, obj: &mut Value, old: Option<&Value>) -> Vec<FieldCause> {
        prune(&self.raw, obj, true);
        *obj = kube_cel::apply_defaults(&self.raw, obj);
        let mut causes = vec![];
        check(&self.raw, obj, "", true, &mut causes);
        if !causes.is_empty() {
            return causes;
        }
        if let Err(errors) = kube_cel::validate_compiled(&self.compiled, obj, old) {
            for e in errors {
                // The apiserver names the failing value's type: `Invalid value: "integer": ...`.
                let at = crate::table::json_path(obj, &format!(".{}", e.field_path));
                let value_kind = at.map(type_name).unwrap_or("object");
                causes.push(FieldCause {
                    reason: "FieldValueInvalid",
                    field: e.field_path.clone(),
                    message: format!("Invalid value: \"{value_kind}\": {}", e.message),
                });
            }
        }
        causes
    }
}

fn collect_compile_errors(s: &kube_cel::CompiledSchema, out: &mut Vec<String>) {
    for e in s.compilation_errors() {
        out.push(e.to_string());
    }
    for child in s.properties.values() {
        collect_compile_errors(child, out);
    }
    for child in s.items.iter().chain(s.additional_properties.iter()) {
        collect_compile_errors(child, out);
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

/// Drops fields the schema does not declare. At the root, `apiVersion`, `kind` and `metadata`
/// always survive (the apiserver owns them).
fn prune(schema: &Value, value: &mut Value, root: bool) {
    match value {
        Value::Object(map) => {
            let props = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve =
                preserves_unknown(schema) || schema["additionalProperties"] == Value::Bool(true);
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(child) = props.and_then(|p| p.get(&key)) {
                    if let Some(v) = map.get_mut(&key) {
                        prune(child, v, false);
                    }
                } else if let Some(child) = additional {
                    if let Some(v) = map.get_mut(&key) {
                        prune(child, v, false);
                    }
                } else if !preserve {
                    map.remove(&key);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    prune(item_schema, item, false);
                }
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) | Value::Array(_) => format!("\"{}\"", type_name(v)),
        other => other.to_string(),
    }
}

/// OpenAPI structural checks. Messages follow the apiserver's wording closely enough that a
/// human recognises them.
fn check(schema: &Value, value: &Value, path: &str, root: bool, causes: &mut Vec<FieldCause>) {
    if value.is_null() {
        if schema["nullable"].as_bool() == Some(true) || root {
            return;
        }
        // The apiserver drops nulls for non-nullable fields before validation in most cases;
        // a null here means "unset".
        return;
    }
    if schema["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            causes.push(FieldCause::invalid(
                path,
                format!(
                    "Invalid value: {}: {path} in body must be of type int-or-string",
                    short(value)
                ),
            ));
        }
        return;
    }
    if let Some(ty) = schema["type"].as_str() {
        let ok = match ty {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            _ => true,
        };
        if !ok {
            causes.push(FieldCause::invalid(
                path,
                format!(
                    "Invalid value: \"{}\": {path} in body must be of type {ty}: \"{}\"",
                    type_name(value),
                    type_name(value)
                ),
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            let list: Vec<String> = allowed.iter().map(short).collect();
            causes.push(FieldCause {
                reason: "FieldValueNotSupported",
                field: path.to_string(),
                message: format!(
                    "Unsupported value: {}: supported values: {}",
                    short(value),
                    list.join(", ")
                ),
            });
        }
    }
    check_bounds(schema, value, path, causes);
    match value {
        Value::Object(map) => check_object(schema, map, path, root, causes),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), false, causes);
                }
            }
        }
        _ => {}
    }
}

fn check_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    root: bool,
    causes: &mut Vec<FieldCause>,
) {
    if let Some(required) = schema["required"].as_array() {
        for r in required.iter().filter_map(Value::as_str) {
            if map.get(r).is_none_or(Value::is_null) {
                causes.push(FieldCause::required(join(path, r)));
            }
        }
    }
    let props = schema["properties"].as_object();
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in map {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(child) = props.and_then(|p| p.get(k)) {
            check(child, v, &join(path, k), false, causes);
        } else if let Some(child) = additional {
            check(child, v, &format!("{path}[{k}]"), false, causes);
        }
    }
}

fn check_bounds(schema: &Value, value: &Value, path: &str, causes: &mut Vec<FieldCause>) {
    let mut fail = |msg: String| causes.push(FieldCause::invalid(path, msg));
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64() {
            if n < min {
                fail(format!(
                    "Invalid value: {n}: {path} in body should be greater than or equal to {min}"
                ));
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            if n > max {
                fail(format!(
                    "Invalid value: {n}: {path} in body should be less than or equal to {max}"
                ));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema["minLength"].as_u64() {
            if len < min {
                fail(format!(
                    "Invalid value: {s:?}: {path} in body should be at least {min} chars long"
                ));
            }
        }
        if let Some(max) = schema["maxLength"].as_u64() {
            if len > max {
                fail(format!("Too long: may not be more than {max} bytes"));
            }
        }
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if let Some(min) = schema["minItems"].as_u64() {
            if len < min {
                fail(format!(
                    "Invalid value: {len}: {path} in body should have at least {min} items"
                ));
            }
        }
        if let Some(max) = schema["maxItems"].as_u64() {
            if len > max {
                fail(format!("Too many: {len}: must have at most {max} items"));
            }
        }
    }
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// One dot-separated part of a DNS-1123 name. Only labels proper (`max_len` 63) are length
/// limited; the parts of a subdomain are not (the 253 limit applies to the whole name).
fn is_label_part(s: &str, max_len: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max_len
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Object-name rules: namespaces and services are DNS-1123 labels, everything else a subdomain.
pub fn validate_name(plural: &str, name: &str) -> Option<FieldCause> {
    let label_only = matches!(plural, "namespaces" | "services");
    let ok = if label_only {
        is_label_part(name, 63)
    } else {
        name.len() <= 253 && name.split('.').all(|p| is_label_part(p, 253))
    };
    if ok {
        return None;
    }
    let msg = if label_only {
        DNS1123_LABEL_MSG
    } else {
        DNS1123_SUBDOMAIN_MSG
    };
    Some(FieldCause::invalid(
        "metadata.name",
        format!("Invalid value: {name:?}: {msg}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> CrdSchema {
        CrdSchema::compile(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "x-kubernetes-validations": [
                            {"rule": "self >= oldSelf", "message": "size may not shrink"}]},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }
            }
        }))
        .expect("schema compiles")
    }

    #[test]
    fn prunes_unknown_fields_and_applies_defaults() {
        let s = schema();
        let mut obj =
            json!({"metadata": {"name": "x"}, "spec": {"size": 1, "junk": 1, "free": {"k": 1}}});
        assert!(s.admit(&mut obj, None).is_empty());
        assert_eq!(
            obj["spec"],
            json!({"size": 1, "mode": "a", "free": {"k": 1}})
        );
    }

    #[test]
    fn rejects_wrong_types_missing_fields_and_enum_values() {
        let s = schema();
        let mut obj = json!({"spec": {"mode": "c"}});
        let causes = s.admit(&mut obj, None);
        assert!(causes
            .iter()
            .any(|c| c.field == "spec.size" && c.reason == "FieldValueRequired"));
        assert!(causes.iter().any(|c| c.reason == "FieldValueNotSupported"));
        let mut obj = json!({"spec": {"size": "big"}});
        assert!(!s.admit(&mut obj, None).is_empty());
    }

    #[test]
    fn transition_rules_see_the_old_object() {
        let s = schema();
        let old = json!({"spec": {"size": 5, "mode": "a"}});
        let mut shrink = json!({"spec": {"size": 4}});
        let causes = s.admit(&mut shrink, Some(&old));
        assert!(
            causes
                .iter()
                .any(|c| c.message.contains("size may not shrink")),
            "{causes:?}"
        );
        let mut grow = json!({"spec": {"size": 6}});
        assert!(s.admit(&mut grow, Some(&old)).is_empty());
    }

    #[test]
    fn names_must_be_dns1123() {
        assert!(validate_name("pods", "web-0.x").is_none());
        assert!(validate_name("pods", "Web").is_some());
        assert!(validate_name("services", "a.b").is_some());
        assert!(validate_name("pods", "-a").is_some());
        // VolumeAttachment names are "csi-" + 64 hex characters: longer than a label.
        let va = format!("csi-{}", "a".repeat(64));
        assert!(validate_name("volumeattachments", &va).is_none());
        assert!(validate_name("services", &va).is_some());
    }
}
