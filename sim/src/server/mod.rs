//! HTTP front end: parses Kubernetes REST paths, applies test hooks, dispatches to the store.

mod discovery;
mod paging;
mod resource;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::clock::Clock;
use crate::error::ApiError;
use crate::hooks::{Hooks, Verb, INTERNAL_HEADER};
use crate::registry::{Registry, ResourceType};
use crate::store::Store;

/// Shared state of one simulated apiserver.
pub struct AppState {
    pub store: Store,
    pub registry: Registry,
    pub hooks: Hooks,
    pub clock: Clock,
    pub bookmark_interval: Duration,
    /// `host:port` the server listens on, for `/api`'s serverAddressByClientCIDRs.
    pub address: String,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// A parsed resource URL.
#[derive(Debug, Clone)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

enum Route {
    Json(serde_json::Value),
    Resource(ResourcePath),
    NotFound,
}

fn parse_resource(group: &str, version: &str, rest: &[&str]) -> Option<ResourcePath> {
    let owned = |s: &&str| s.to_string();
    let path = |namespace: Option<String>, rest: &[&str]| {
        (!rest.is_empty() && rest.len() <= 3).then(|| ResourcePath {
            group: group.into(),
            version: version.into(),
            plural: rest[0].into(),
            namespace,
            name: rest.get(1).map(owned),
            subresource: rest.get(2).map(owned),
        })
    };
    // `/namespaces/{ns}/{plural}...` vs the Namespace object itself (`/namespaces/{name}[/status]`).
    if rest.first() == Some(&"namespaces")
        && rest.len() >= 3
        && !matches!(rest[2], "status" | "finalize")
    {
        return path(Some(rest[1].to_string()), &rest[2..]);
    }
    path(None, rest)
}

fn route(app: &AppState, path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let json = |v: Option<serde_json::Value>| v.map(Route::Json).unwrap_or(Route::NotFound);
    match segs.as_slice() {
        ["api"] => Route::Json(discovery::api_versions(&app.address)),
        ["api", v] => json(app.registry.resource_list("", v)),
        ["api", v, rest @ ..] => parse_resource("", v, rest)
            .map(Route::Resource)
            .unwrap_or(Route::NotFound),
        ["apis"] => Route::Json(app.registry.api_group_list()),
        ["apis", g] => json(app.registry.api_group(g)),
        ["apis", g, v] => json(app.registry.resource_list(g, v)),
        ["apis", g, v, rest @ ..] => parse_resource(g, v, rest)
            .map(Route::Resource)
            .unwrap_or(Route::NotFound),
        ["version"] => Route::Json(discovery::version()),
        ["openapi", "v2"] => Route::Json(discovery::openapi_v2(&app.registry)),
        ["openapi", "v3"] => Route::Json(discovery::openapi_v3_root(&app.registry)),
        ["openapi", "v3", rest @ ..] => json(discovery::openapi_v3_group(&app.registry, rest)),
        ["healthz"] | ["readyz"] | ["livez"] => Route::Json(serde_json::Value::String("ok".into())),
        _ => Route::NotFound,
    }
}

pub fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
        .into_response()
}

fn not_found_route() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn verb_of(
    method: &Method,
    p: &ResourcePath,
    query: &HashMap<String, String>,
) -> Result<Verb, ApiError> {
    let has_name = p.name.is_some();
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    Ok(match (method.as_str(), has_name) {
        ("GET", true) => Verb::Get,
        ("GET", false) if watch => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        (m, _) => return Err(ApiError::method_not_allowed(m)),
    })
}

fn status_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let internal = parts.headers.contains_key(INTERNAL_HEADER);
    let path = match route(&app, parts.uri.path()) {
        Route::Json(v) => return json_response(StatusCode::OK, v.to_string()),
        Route::NotFound => return not_found_route().into_response(),
        Route::Resource(p) => p,
    };
    let query: HashMap<String, String> = axum::extract::Query::try_from_uri(&parts.uri)
        .map(|q: axum::extract::Query<HashMap<String, String>>| q.0)
        .unwrap_or_default();
    let verb = match verb_of(&parts.method, &path, &query) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let counted = match &path.subresource {
        Some(s) => format!("{}/{s}", path.plural),
        None => path.plural.clone(),
    };
    if !internal {
        app.hooks.count(verb, &counted);
        let fault = app.hooks.fault_for(verb, &counted, path.name.as_deref());
        if let Some(d) = fault.latency {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = fault.status {
            return ApiError::new(code, status_reason(code), format!("injected fault: {code}"))
                .into_response();
        }
    }
    let rt = match resolve(&app, &path) {
        Ok(rt) => rt,
        Err(e) => return e.into_response(),
    };
    let body = match axum::body::to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("reading request body: {e}")).into_response()
        }
    };
    let req = resource::Req {
        app: &app,
        rt: &rt,
        path: &path,
        query: &query,
        headers: &parts.headers,
        body,
    };
    let result = match verb {
        Verb::Watch => return watch::watch(&app, rt.clone(), &path, &query, &parts.headers),
        _ => resource::dispatch(verb, req),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The resource type of a path, with the apiserver's 404s for impossible combinations.
fn resolve(app: &AppState, p: &ResourcePath) -> Result<Arc<ResourceType>, ApiError> {
    let rt = app
        .registry
        .lookup(&p.group, &p.version, &p.plural)
        .ok_or_else(not_found_route)?;
    if (!rt.namespaced && p.namespace.is_some())
        || (rt.namespaced && p.namespace.is_none() && p.name.is_some())
    {
        return Err(not_found_route());
    }
    match p.subresource.as_deref() {
        None => {}
        Some("status") if rt.has_status => {}
        Some(_) => return Err(not_found_route()),
    }
    Ok(rt)
}

/// What representation the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    Full,
    Table,
    Metadata,
}

pub fn representation(headers: &HeaderMap) -> Representation {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The first acceptable alternative wins, as in the apiserver's negotiation.
    for alt in accept.split(',') {
        let alt = alt.trim();
        if alt.contains("as=Table") && alt.contains("v=v1") {
            return Representation::Table;
        }
        if alt.contains("as=PartialObjectMetadata") && alt.contains("v=v1") {
            return Representation::Metadata;
        }
        if alt.starts_with("application/json")
            || alt.starts_with("*/*")
            || alt.starts_with("application/yaml")
        {
            return Representation::Full;
        }
    }
    Representation::Full
}

/// The object as a JSON value of the requested version (see [`render`]).
pub fn value_as(obj: &crate::store::Stored, rt: &ResourceType) -> serde_json::Value {
    crate::events::to_version(obj.value(), &rt.api_version())
}

/// The object's JSON as the requested version: custom resources are stored once for all
/// served versions, so a read through another version only relabels `apiVersion`.
pub fn render(obj: &crate::store::Stored, rt: &ResourceType) -> Bytes {
    let want = rt.api_version();
    if obj.api_version == want {
        return obj.json.clone();
    }
    Bytes::from(crate::events::to_version(obj.value(), &want).to_string())
}
