//! Deletion: preconditions, finalizers, graceful pod termination, namespace termination and
//! ownerReference garbage collection (background, foreground, orphan).

use std::sync::Arc;

use serde_json::{json, Value};

use super::{crd_key, namespace_key, not_found, obj_ref, timestamp, Ctx, Written};
use crate::error::ApiError;
use crate::registry::{ResourceType, StorageKey};
use crate::store::{ObjRef, Propagation, Stored};

#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub dry_run: bool,
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub grace_period_seconds: Option<i64>,
}

pub fn delete(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
) -> Result<Written, ApiError> {
    let r = obj_ref(rt, ns, name);
    let current = cx.store.get_ref(&r).ok_or_else(|| not_found(rt, name))?;
    if let Some(uid) = &opts.precondition_uid {
        if *uid != current.uid {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.uid
                ),
            ));
        }
    }
    if let Some(rv) = &opts.precondition_rv {
        if *rv != current.rv.to_string() {
            return Err(ApiError::stale(&rt.group, &rt.plural, name));
        }
    }
    if opts.dry_run {
        return Ok(Written::stored(&current, rt, false));
    }
    if is_pod(rt) {
        if let Some(marked) =
            start_graceful_pod_deletion(cx, &r, &current, opts.grace_period_seconds)
        {
            return Ok(Written::stored(&marked, rt, false));
        }
    }
    let result = delete_object(cx, &r, opts.propagation);
    Ok(Written::stored(&result.unwrap_or(current), rt, false))
}

pub fn delete_collection(
    cx: &mut Ctx<'_>,
    rt: &ResourceType,
    targets: Vec<Arc<Stored>>,
    opts: &DeleteOpts,
) -> Vec<Arc<Stored>> {
    let mut out = vec![];
    for t in targets {
        if opts.dry_run {
            out.push(t);
            continue;
        }
        let r = obj_ref(rt, &t.namespace, &t.name);
        if let Some(s) = delete_object(cx, &r, opts.propagation) {
            out.push(s);
        }
    }
    out
}

fn is_pod(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "pods"
}

/// Like the apiserver's pod strategy: a pod bound to a node and still running gets a deletion
/// timestamp and a grace period; the kubelet removes it later with a zero-grace delete.
/// Returns `None` when the pod should be deleted right away.
fn start_graceful_pod_deletion(
    cx: &mut Ctx<'_>,
    r: &ObjRef,
    current: &Stored,
    requested: Option<i64>,
) -> Option<Arc<Stored>> {
    let v = current.value();
    let grace = requested
        .or_else(|| v["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0);
    let finished = matches!(current.phase.as_str(), "Succeeded" | "Failed");
    if grace == 0 || current.node_name.is_empty() || finished {
        return None;
    }
    let existing = v["metadata"]["deletionGracePeriodSeconds"].as_i64();
    if current.deleting && existing.is_some_and(|e| e <= grace) {
        return cx.store.get_ref(r);
    }
    let mut v = v;
    let deadline = cx.clock.now() + std::time::Duration::from_secs(grace as u64);
    let ts = k8s_openapi::jiff::Timestamp::try_from(deadline)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    v["metadata"]["deletionTimestamp"] =
        Value::String(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    v["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    Some(cx.store.put(&r.key, v, current.field_owners.clone()))
}

/// Deletes one object: marks it terminating while finalizers remain, else removes it and
/// collects its dependents. Returns the last version of the object.
pub fn delete_object(cx: &mut Ctx<'_>, r: &ObjRef, policy: Propagation) -> Option<Arc<Stored>> {
    let current = cx.store.get_ref(r)?;
    let is_ns = r.key == namespace_key();
    if current.has_finalizers || is_ns {
        let mut v = current.value();
        if current.deleting {
            // A zero-grace delete of a terminating object ends its grace period; what remains
            // is waiting for finalizers.
            if v["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                > 0
            {
                v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                return Some(cx.store.put(&r.key, v, current.field_owners.clone()));
            }
            return Some(current);
        }
        v["metadata"]["deletionTimestamp"] = Value::String(timestamp(cx.clock));
        v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if is_ns {
            v["status"]["phase"] = json!("Terminating");
        }
        let marked = cx.store.put(&r.key, v, current.field_owners.clone());
        if is_ns {
            for child in cx.store.objects_in_namespace(&r.name) {
                delete_object(cx, &child, Propagation::Background);
            }
            if cx.store.namespace_is_empty(&r.name) && !marked.has_finalizers {
                return remove_and_collect(cx, r, policy);
            }
        } else {
            cx.store
                .pending_propagation
                .insert(current.uid.clone(), policy);
        }
        return cx.store.get_ref(r).or(Some(marked));
    }
    if policy == Propagation::Foreground {
        for dep in cx.store.dependents_of(&current.uid) {
            delete_object(cx, &dep, Propagation::Foreground);
        }
    }
    remove_and_collect(cx, r, policy)
}

/// Removes the object and applies `policy` to its dependents, like the garbage collector.
pub(super) fn remove_and_collect(
    cx: &mut Ctx<'_>,
    r: &ObjRef,
    policy: Propagation,
) -> Option<Arc<Stored>> {
    let gone = cx.store.remove(r)?;
    if r.key == crd_key() {
        let v = gone.value();
        if let (Some(group), Some(plural)) = (
            v["spec"]["group"].as_str(),
            v["spec"]["names"]["plural"].as_str(),
        ) {
            cx.registry.uninstall_crd(&gone.name);
            cx.store.drop_resource(&StorageKey {
                group: group.into(),
                plural: plural.into(),
            });
        }
    }
    for dep in cx.store.dependents_of(&gone.uid) {
        let Some(d) = cx.store.get_ref(&dep) else {
            continue;
        };
        let orphaned = policy == Propagation::Orphan;
        let other_owner_alive = d
            .owner_uids
            .iter()
            .any(|u| u != &gone.uid && cx.store.uid_exists(u));
        if orphaned || other_owner_alive {
            let mut v = d.value();
            if let Some(refs) = v["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|o| o["uid"].as_str() != Some(gone.uid.as_str()));
                if refs.is_empty() {
                    if let Some(m) = v["metadata"].as_object_mut() {
                        m.remove("ownerReferences");
                    }
                }
            }
            cx.store.put(&dep.key, v, d.field_owners.clone());
        } else {
            delete_object(cx, &dep, Propagation::Background);
        }
    }
    if !gone.namespace.is_empty() && cx.store.namespace_is_empty(&gone.namespace) {
        if let Some(ns) = cx.store.get(&namespace_key(), "", &gone.namespace) {
            if ns.deleting && !ns.has_finalizers {
                let ns_ref = ObjRef {
                    key: namespace_key(),
                    namespace: String::new(),
                    name: gone.namespace.clone(),
                };
                remove_and_collect(cx, &ns_ref, Propagation::Background);
            }
        }
    }
    Some(gone)
}
