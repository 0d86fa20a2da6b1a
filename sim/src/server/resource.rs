//! Handlers of the non-watch verbs.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::{
    json_response, render, representation, value_as, AppState, Representation, ResourcePath,
};
use crate::error::ApiError;
use crate::hooks::Verb;
use crate::ops::{self, Ctx, DeleteOpts, WriteOpts, Written};
use crate::patch::{parse_body, PatchKind};
use crate::registry::ResourceType;
use crate::selector::{FieldSelector, FieldValues, LabelSelector};
use crate::store::{Propagation, Stored};

pub struct Req<'a> {
    pub app: &'a AppState,
    pub rt: &'a Arc<ResourceType>,
    pub path: &'a ResourcePath,
    pub query: &'a HashMap<String, String>,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

impl Req<'_> {
    fn ns(&self) -> &str {
        self.path.namespace.as_deref().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.path.name.as_deref().unwrap_or("")
    }
    fn status_only(&self) -> bool {
        self.path.subresource.as_deref() == Some("status")
    }
    fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|d| d == "All")
    }
    fn write_opts(&self) -> WriteOpts {
        WriteOpts {
            dry_run: self.dry_run(),
            status_only: self.status_only(),
            field_manager: self.query.get("fieldManager").cloned(),
            force: self.query.get("force").is_some_and(|f| f == "true"),
        }
    }
    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    fn ctx<'s>(&'s self, store: &'s mut crate::store::StoreInner) -> Ctx<'s> {
        Ctx {
            store,
            registry: &self.app.registry,
            clock: &self.app.clock,
        }
    }
}

pub fn dispatch(verb: Verb, req: Req<'_>) -> Result<Response, ApiError> {
    match verb {
        Verb::Get => get(req),
        Verb::List => list(req),
        Verb::Create => create(req),
        Verb::Update => update(req),
        Verb::Patch => patch(req),
        Verb::Delete => delete(req),
        Verb::DeleteCollection => delete_collection(req),
        Verb::Watch => Err(ApiError::internal("watch is served elsewhere")),
    }
}

/// Request bodies of create/update: JSON or YAML, nothing else (415).
fn object_body(req: &Req<'_>) -> Result<Value, ApiError> {
    let ct = req.content_type();
    let base = ct.split(';').next().unwrap_or("").trim();
    let yaml = match base {
        "application/json" | "" => false,
        "application/yaml" => true,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    parse_body(&req.body, yaml)
}

fn written(w: Written) -> Response {
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(code, w.json)
}

fn one_object(req: &Req<'_>, obj: &Stored) -> Response {
    match representation(req.headers) {
        Representation::Full => json_response(StatusCode::OK, render(obj, req.rt)),
        Representation::Metadata => {
            json_response(StatusCode::OK, metadata_only(&obj.value()).to_string())
        }
        Representation::Table => {
            let include = req
                .query
                .get("includeObject")
                .map(String::as_str)
                .unwrap_or("Metadata");
            let t = crate::table::table(
                req.rt,
                &[value_as(obj, req.rt)],
                obj.rv,
                include,
                req.app.clock.now(),
            );
            json_response(StatusCode::OK, t.to_string())
        }
    }
}

pub fn metadata_only(v: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": v["metadata"],
    })
}

fn get(req: Req<'_>) -> Result<Response, ApiError> {
    let obj = {
        let store = req.app.store.read();
        store.get(&req.rt.storage_key, req.ns(), req.name())
    };
    let obj = obj.ok_or_else(|| ApiError::not_found(&req.rt.group, &req.rt.plural, req.name()))?;
    Ok(one_object(&req, &obj))
}

/// Selectors of a list or watch request.
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn from_query(
        rt: &ResourceType,
        path: &ResourcePath,
        query: &HashMap<String, String>,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            namespace: path.namespace.clone(),
            labels: LabelSelector::parse(
                query.get("labelSelector").map(String::as_str).unwrap_or(""),
            )?,
            fields: FieldSelector::parse(
                query.get("fieldSelector").map(String::as_str).unwrap_or(""),
                &rt.plural,
            )?,
        })
    }

    pub fn matches(&self, o: &Stored) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == o.namespace)
            && self.labels.matches(&o.labels)
            && self.fields.matches(&FieldValues {
                name: &o.name,
                namespace: &o.namespace,
                node_name: &o.node_name,
                phase: &o.phase,
                extra: &o.fields,
            })
    }
}

fn list(req: Req<'_>) -> Result<Response, ApiError> {
    let filter = Filter::from_query(req.rt, req.path, req.query)?;
    let (rv, items) = {
        let store = req.app.store.read();
        let items: Vec<Arc<Stored>> = store
            .list(&req.rt.storage_key, filter.namespace.as_deref())
            .into_iter()
            .filter(|o| filter.matches(o))
            .collect();
        (store.current_rv(), items)
    };
    let page = super::paging::paginate(
        items,
        rv,
        req.query.get("limit").map(String::as_str),
        req.query.get("continue").map(String::as_str),
    )?;
    Ok(list_response(&req, page.meta, &page.items))
}

fn list_response(req: &Req<'_>, meta: Value, items: &[Arc<Stored>]) -> Response {
    match representation(req.headers) {
        Representation::Table => {
            let values: Vec<Value> = items.iter().map(|o| value_as(o, req.rt)).collect();
            let include = req
                .query
                .get("includeObject")
                .map(String::as_str)
                .unwrap_or("Metadata");
            let mut t = crate::table::table(req.rt, &values, 0, include, req.app.clock.now());
            t["metadata"] = meta;
            json_response(StatusCode::OK, t.to_string())
        }
        Representation::Metadata => {
            let values: Vec<Value> = items.iter().map(|o| metadata_only(&o.value())).collect();
            let body = json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
                "items": values,
            });
            json_response(StatusCode::OK, body.to_string())
        }
        Representation::Full => {
            // Concatenate the stored bytes: no per-item re-serialisation on the hot path.
            let mut out =
                Vec::with_capacity(128 + items.iter().map(|o| o.json.len() + 1).sum::<usize>());
            out.extend_from_slice(
                format!(
                    "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{meta},\"items\":[",
                    req.rt.kind,
                    req.rt.api_version()
                )
                .as_bytes(),
            );
            for (i, o) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&render(o, req.rt));
            }
            out.extend_from_slice(b"]}");
            json_response(StatusCode::OK, out)
        }
    }
}

fn create(req: Req<'_>) -> Result<Response, ApiError> {
    if req.path.name.is_some() {
        return Err(ApiError::method_not_allowed("POST"));
    }
    let body = object_body(&req)?;
    let opts = req.write_opts();
    let mut store = req.app.store.write();
    let mut cx = req.ctx(&mut store);
    ops::create(&mut cx, req.rt, req.ns(), body, &opts).map(written)
}

fn update(req: Req<'_>) -> Result<Response, ApiError> {
    let body = object_body(&req)?;
    let opts = req.write_opts();
    let mut store = req.app.store.write();
    let mut cx = req.ctx(&mut store);
    ops::update(&mut cx, req.rt, req.ns(), req.name(), body, &opts).map(written)
}

fn patch(req: Req<'_>) -> Result<Response, ApiError> {
    let ct = req.content_type().to_string();
    let kind =
        PatchKind::from_content_type(&ct).ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
    let body = parse_body(&req.body, kind == PatchKind::Apply)?;
    let opts = req.write_opts();
    let mut store = req.app.store.write();
    let mut cx = req.ctx(&mut store);
    ops::patch(&mut cx, req.rt, req.ns(), req.name(), kind, body, &opts).map(written)
}

/// DeleteOptions arrive as a JSON body (kube-rs) and/or query parameters (kubectl).
fn delete_opts(req: &Req<'_>) -> Result<DeleteOpts, ApiError> {
    let body = if req.body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_body(&req.body, false)?
    };
    let policy = body["propagationPolicy"]
        .as_str()
        .or(req.query.get("propagationPolicy").map(String::as_str));
    let propagation = match policy {
        None | Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {other:?}"
            )))
        }
    };
    let orphan_legacy = body["orphanDependents"].as_bool() == Some(true);
    let dry_run = req.dry_run()
        || body["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    Ok(DeleteOpts {
        dry_run,
        propagation: if orphan_legacy {
            Propagation::Orphan
        } else {
            propagation
        },
        precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_string),
        precondition_rv: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_string),
        grace_period_seconds: body["gracePeriodSeconds"].as_i64().or_else(|| {
            req.query
                .get("gracePeriodSeconds")
                .and_then(|g| g.parse().ok())
        }),
    })
}

fn delete(req: Req<'_>) -> Result<Response, ApiError> {
    let opts = delete_opts(&req)?;
    let mut store = req.app.store.write();
    let mut cx = req.ctx(&mut store);
    ops::delete(&mut cx, req.rt, req.ns(), req.name(), &opts).map(written)
}

fn delete_collection(req: Req<'_>) -> Result<Response, ApiError> {
    let opts = delete_opts(&req)?;
    let filter = Filter::from_query(req.rt, req.path, req.query)?;
    let mut store = req.app.store.write();
    let targets: Vec<Arc<Stored>> = store
        .list(&req.rt.storage_key, filter.namespace.as_deref())
        .into_iter()
        .filter(|o| filter.matches(o))
        .collect();
    let mut cx = req.ctx(&mut store);
    let deleted = ops::delete_collection(&mut cx, req.rt, targets, &opts);
    let rv = cx.store.current_rv();
    drop(store);
    Ok(list_response(
        &req,
        json!({"resourceVersion": rv.to_string()}),
        &deleted,
    ))
}
