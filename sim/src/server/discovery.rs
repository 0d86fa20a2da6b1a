//! `/api`, `/version` and the OpenAPI documents kubectl insists on before `apply`.

use serde_json::{json, Value};

use crate::registry::Registry;

pub fn api_versions(address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    })
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-questdb-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Swagger 2.0 with the custom resources' schemas; built-in kinds have none (kubectl falls back
/// to the types compiled into it).
pub fn openapi_v2(registry: &Registry) -> Value {
    let mut definitions = serde_json::Map::new();
    for rt in registry.all() {
        if let Some(schema) = &rt.schema {
            let mut s = schema.raw().clone();
            s["x-kubernetes-group-version-kind"] =
                json!([{"group": rt.group, "version": rt.version, "kind": rt.kind}]);
            definitions.insert(definition_name(&rt.group, &rt.version, &rt.kind), s);
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes (questdb-sim)", "version": "v1.33.0"},
        "paths": {},
        "definitions": definitions,
    })
}

fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

pub fn openapi_v3_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.groups() {
        for v in versions {
            let p = group_version_path(&group, &v);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// One group-version's OpenAPI v3 document: the custom resources' schemas and, per resource,
/// the paths with the `fieldValidation` parameter so kubectl validates on the server side.
pub fn openapi_v3_group(registry: &Registry, rest: &[&str]) -> Option<Value> {
    let (group, version) = match rest {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let mut schemas = serde_json::Map::new();
    let mut paths = serde_json::Map::new();
    let gv = group_version_path(group, version);
    let types: Vec<_> = registry
        .all()
        .into_iter()
        .filter(|rt| rt.group == group && rt.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let field_validation =
        json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string"}});
    for rt in types {
        let gvk = json!([{"group": rt.group, "version": rt.version, "kind": rt.kind}]);
        let op = json!({
            "parameters": [field_validation],
            "x-kubernetes-group-version-kind": gvk[0],
            "responses": {"200": {"description": "OK"}},
        });
        let base = if rt.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}", rt.plural)
        } else {
            format!("/{gv}/{}", rt.plural)
        };
        paths.insert(base.clone(), json!({"post": op, "get": op}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"put": op, "patch": op, "get": op, "delete": op}),
        );
        if let Some(schema) = &rt.schema {
            let mut s = schema.raw().clone();
            s["x-kubernetes-group-version-kind"] = gvk;
            schemas.insert(definition_name(&rt.group, &rt.version, &rt.kind), s);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (questdb-sim)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
