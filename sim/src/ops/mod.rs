//! The write verbs with the apiserver's semantics: defaults stamped on create, optimistic
//! concurrency, status-subresource isolation, generation bumps, CRD schema admission and
//! server-side-apply conflicts. Deletion and garbage collection live in [`delete`].

use std::sync::Arc;

use axum::body::Bytes;
use rand::Rng;
use serde_json::{json, Value};

use crate::clock::Clock;
use crate::error::{ApiError, FieldCause};
use crate::fields::{self, Owners};
use crate::patch::{self, PatchKind};
use crate::registry::{Registry, ResourceType, StatusOnCreate, StorageKey};
use crate::schema::validate_name;
use crate::store::{ObjRef, StoreInner, Stored};

mod delete;

use delete::remove_and_collect;
pub use delete::{delete, delete_collection, DeleteOpts};

/// Everything a write needs, borrowed for the duration of one locked operation.
pub struct Ctx<'a> {
    pub store: &'a mut StoreInner,
    pub registry: &'a Registry,
    pub clock: &'a Clock,
}

#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    /// The request addressed the `/status` subresource.
    pub status_only: bool,
    pub field_manager: Option<String>,
    pub force: bool,
}

/// The JSON to answer with and whether the request created the object (201 vs 200).
pub struct Written {
    pub json: Bytes,
    pub created: bool,
}

impl Written {
    /// The stored object as the request's API version.
    fn stored(s: &Stored, rt: &ResourceType, created: bool) -> Self {
        Self {
            json: crate::server::render(s, rt),
            created,
        }
    }
    fn value(v: &Value, created: bool) -> Self {
        Self {
            json: Bytes::from(v.to_string()),
            created,
        }
    }
}

pub fn timestamp(clock: &Clock) -> String {
    let ts = k8s_openapi::jiff::Timestamp::try_from(clock.now())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::rng().random();
    let h = hex::encode(b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn random_suffix() -> String {
    // The apiserver's alphabet: no vowels (no accidental words) and no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn obj_ref(rt: &ResourceType, ns: &str, name: &str) -> ObjRef {
    ObjRef {
        key: rt.storage_key.clone(),
        namespace: if rt.namespaced {
            ns.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    }
}

fn namespace_key() -> StorageKey {
    StorageKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn crd_key() -> StorageKey {
    StorageKey {
        group: "apiextensions.k8s.io".into(),
        plural: "customresourcedefinitions".into(),
    }
}

fn is_crd(rt: &ResourceType) -> bool {
    rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions"
}

fn check_type_meta(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let api_version = rt.api_version();
    if let Some(v) = obj["apiVersion"].as_str() {
        if v != api_version {
            let (group, _) = crate::registry::split_api_version(v);
            // Another version of the same group is accepted and stored as the URL's version.
            if group != rt.group {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )));
            }
        }
    }
    if let Some(k) = obj["kind"].as_str() {
        if k != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )));
        }
    }
    obj["apiVersion"] = Value::String(api_version);
    obj["kind"] = Value::String(rt.kind.clone());
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    Ok(())
}

fn invalid(rt: &ResourceType, name: &str, causes: Vec<FieldCause>) -> ApiError {
    ApiError::invalid(&rt.kind, &rt.group, name, causes)
}

/// Schema admission for custom resources, and the CRD's own sanity check for CRDs.
fn admit(rt: &ResourceType, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(schema) = &rt.schema {
        let causes = schema.admit(obj, old);
        if !causes.is_empty() {
            return Err(invalid(rt, &name, causes));
        }
    }
    if is_crd(rt) {
        crate::registry::crd_resource_types(obj)
            .map_err(|e| invalid(rt, &name, vec![FieldCause::invalid("", e)]))?;
        let names = obj["spec"]["names"].clone();
        let stored: Vec<Value> = obj["spec"]["versions"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .filter(|v| v["storage"].as_bool() == Some(true))
                    .map(|v| v["name"].clone())
                    .collect()
            })
            .unwrap_or_default();
        let now = json!(obj["metadata"]["creationTimestamp"].clone());
        obj["status"] = json!({
            "acceptedNames": names,
            "storedVersions": stored,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        });
    }
    Ok(())
}

fn after_write(cx: &mut Ctx<'_>, rt: &ResourceType, stored: &Stored) {
    if is_crd(rt) {
        // admit() already proved the CRD is servable.
        if let Err(e) = cx.registry.install_crd(&stored.value()) {
            tracing::warn!(crd = %stored.name, error = %e, "stored CRD could not be served");
        }
    }
    // The garbage collector also collects a dependent written *after* all of its owners were
    // gone (a controller acting on a stale cache does that): the write succeeds, the object is
    // collected right after, as the real GC does once it has checked the owners are absent.
    if !stored.owner_uids.is_empty() && stored.owner_uids.iter().all(|u| !cx.store.uid_exists(u)) {
        let r = ObjRef {
            key: rt.storage_key.clone(),
            namespace: stored.namespace.clone(),
            name: stored.name.clone(),
        };
        delete::delete_object(cx, &r, crate::store::Propagation::Background);
    }
}

fn check_labels(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    for field in ["labels", "annotations"] {
        if let Some(map) = obj["metadata"][field].as_object() {
            if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                return Err(invalid(
                    rt,
                    name,
                    vec![FieldCause::invalid(
                        format!("metadata.{field}"),
                        format!("Invalid value: {k:?}: {field} values must be strings"),
                    )],
                ));
            }
        }
    }
    Ok(())
}

pub fn create(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    ns: &str,
    mut obj: Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    check_type_meta(rt, &mut obj)?;
    let meta = &mut obj["metadata"];
    if rt.namespaced {
        match meta["namespace"].as_str() {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => meta["namespace"] = Value::String(ns.to_string()),
        }
    } else if let Some(m) = meta.as_object_mut() {
        m.remove("namespace");
    }
    let name = match (meta["name"].as_str(), meta["generateName"].as_str()) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", random_suffix()),
        _ => {
            return Err(invalid(
                rt,
                "",
                vec![FieldCause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ))
        }
    };
    if let Some(cause) = validate_name(&rt.plural, &name) {
        return Err(invalid(rt, &name, vec![cause]));
    }
    check_labels(rt, &obj)?;
    if rt.namespaced {
        match cx.store.get(&namespace_key(), "", ns) {
            None => return Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if n.deleting => {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!("{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated", rt.plural),
                ))
            }
            _ => {}
        }
    }
    let r = obj_ref(rt, ns, &name);
    if cx.store.get_ref(&r).is_some() {
        return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
    }
    let now = timestamp(cx.clock);
    let meta = &mut obj["metadata"];
    meta["name"] = Value::String(name.clone());
    meta["uid"] = Value::String(new_uid());
    meta["creationTimestamp"] = Value::String(now);
    meta["generation"] = json!(1);
    if let Some(m) = meta.as_object_mut() {
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "managedFields",
            "selfLink",
        ] {
            m.remove(k);
        }
    }
    match &rt.status_on_create {
        StatusOnCreate::Keep => {}
        StatusOnCreate::Clear => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        StatusOnCreate::Set(v) => obj["status"] = v.clone(),
    }
    admit(rt, &mut obj, None)?;
    if opts.dry_run {
        return Ok(Written::value(&obj, true));
    }
    let owners = opts.field_manager.as_ref().map(|m| {
        let mut o = Owners::new();
        fields::record(&mut o, &json!({}), &obj, m, Some(&obj));
        Arc::new(o)
    });
    let stored = cx.store.put(&rt.storage_key, obj, owners);
    after_write(cx, rt, &stored);
    Ok(Written::stored(&stored, rt, true))
}

fn strip_for_generation(v: &Value, has_status: bool) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if has_status {
            m.remove("status");
        }
    }
    v
}

/// Shared tail of PUT and PATCH: `candidate` is the full desired object.
fn update_existing(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    current: &Arc<Stored>,
    mut candidate: Value,
    opts: &WriteOpts,
    applied: Option<&Value>,
) -> Result<Written, ApiError> {
    let status_only = opts.status_only;
    check_type_meta(rt, &mut candidate)?;
    let old = crate::events::to_version(current.value(), &rt.api_version());
    let name = current.name.clone();
    if let Some(n) = candidate["metadata"]["name"].as_str() {
        if n != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    match candidate["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() && rv != current.rv.to_string() => {
            return Err(ApiError::stale(&rt.group, &rt.plural, &name));
        }
        _ => {}
    }
    if let Some(uid) = candidate["metadata"]["uid"].as_str() {
        if !uid.is_empty() && uid != current.uid {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.uid
                ),
            ));
        }
    }
    let mut new = if status_only {
        let mut n = old.clone();
        n["status"] = candidate.get("status").cloned().unwrap_or(Value::Null);
        if n["status"].is_null() {
            if let Some(m) = n.as_object_mut() {
                m.remove("status");
            }
        }
        n
    } else {
        if rt.has_status {
            match old.get("status") {
                Some(s) => candidate["status"] = s.clone(),
                None => {
                    if let Some(m) = candidate.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        candidate
    };
    // Fields only the server sets.
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "generation",
    ] {
        match old["metadata"].get(k) {
            Some(v) => new["metadata"][k] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(k);
                }
            }
        }
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("selfLink");
    }
    check_labels(rt, &new)?;
    if current.deleting {
        let old_f = old["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let new_f = new["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if new_f.iter().any(|f| !old_f.contains(f)) {
            return Err(invalid(
                rt,
                &name,
                vec![FieldCause::forbidden(
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                )],
            ));
        }
    }
    if strip_for_generation(&new, rt.has_status) != strip_for_generation(&old, rt.has_status) {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    admit(rt, &mut new, Some(&old))?;
    new["metadata"]["resourceVersion"] = Value::String(current.rv.to_string());
    let owners = track_owners(current, &old, &new, opts, applied)?;
    // A pod in its termination grace period stays until the kubelet deletes it with grace 0.
    let finalized = current.deleting
        && new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty())
        && new["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            == 0;
    if new == old && owners == current.field_owners {
        // The apiserver does not write (nor bump resourceVersion) for a no-op update.
        return Ok(Written::stored(current, rt, false));
    }
    if opts.dry_run {
        return Ok(Written::value(&new, false));
    }
    let stored = cx.store.put(&rt.storage_key, new, owners);
    after_write(cx, rt, &stored);
    if finalized {
        let r = obj_ref(rt, &stored.namespace, &stored.name);
        let policy = cx
            .store
            .pending_propagation
            .remove(&stored.uid)
            .unwrap_or_default();
        remove_and_collect(cx, &r, policy);
    }
    Ok(Written::stored(&stored, rt, false))
}

fn track_owners(
    current: &Stored,
    old: &Value,
    new: &Value,
    opts: &WriteOpts,
    applied: Option<&Value>,
) -> Result<Option<Arc<Owners>>, ApiError> {
    let manager = opts
        .field_manager
        .clone()
        .unwrap_or_else(|| "unknown".into());
    if applied.is_none() && current.field_owners.is_none() {
        return Ok(None);
    }
    let mut owners = current.field_owners.as_deref().cloned().unwrap_or_default();
    if let Some(applied) = applied {
        if !opts.force {
            let conflicts = fields::apply_conflicts(&owners, old, applied, &manager);
            if !conflicts.is_empty() {
                let list: Vec<String> = conflicts
                    .iter()
                    .map(|(path, owner)| format!("conflict with {owner:?}: {path}"))
                    .collect();
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Apply failed with {} conflict(s): {}",
                        list.len(),
                        list.join(", ")
                    ),
                ));
            }
        }
    }
    fields::record(&mut owners, old, new, &manager, applied);
    Ok(Some(Arc::new(owners)))
}

fn not_found(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::not_found(&rt.group, &rt.plural, name)
}

pub fn update(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    obj: Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let current = cx
        .store
        .get_ref(&obj_ref(rt, ns, name))
        .ok_or_else(|| not_found(rt, name))?;
    update_existing(cx, rt, &current, obj, opts, None)
}

pub fn patch(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    kind: PatchKind,
    body: Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let status_only = opts.status_only;
    let current = cx.store.get_ref(&obj_ref(rt, ns, name));
    let Some(current) = current else {
        if kind == PatchKind::Apply && !status_only {
            let mut obj = body;
            if obj.is_object() {
                obj["metadata"]["name"] = Value::String(name.to_string());
            }
            return create(cx, rt, ns, obj, opts);
        }
        return Err(not_found(rt, name));
    };
    let old = crate::events::to_version(current.value(), &rt.api_version());
    let mut patched = patch::apply_patch(kind, &old, &body, rt.strategic_merge)?;
    if kind == PatchKind::Apply {
        if opts.field_manager.is_none() {
            return Err(invalid(
                rt,
                name,
                vec![FieldCause::required("fieldManager")],
            ));
        }
        // An applied configuration never carries a precondition.
        if body["metadata"]["resourceVersion"].is_null() {
            patched["metadata"]["resourceVersion"] = Value::String(current.rv.to_string());
        }
    }
    let applied = (kind == PatchKind::Apply).then_some(&body);
    update_existing(cx, rt, &current, patched, opts, applied)
}
