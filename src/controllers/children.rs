//! Owned children: decide (pure) what a desired object needs against the cached one, then apply
//! that decision with at most one write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Lookup;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt::Debug;

use crate::api::{labels, ADOPT_ANNOTATION, MANAGER};
use crate::cache::compacted::CachedMeta;
use crate::cache::compacted::{needs_update, OwnedChild};

/// What to do with one child object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChildAction {
    /// Absent: create it.
    Create,
    /// Present without a controller, and provably ours (our labels for this QuestDB, or the
    /// user's adoption annotation): take it over (owner reference + desired fields).
    Adopt,
    /// Ours, but a field we set differs.
    Update,
    /// Ours and identical in every field we set: no write.
    InSync,
    /// Controlled by another object, or not provably ours: never touched, never mounted.
    /// Holds a human description of why.
    Blocked(String),
}

/// Who controls an object, of its owner references.
fn controller_of(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners.iter().find(|r| r.controller == Some(true))
}

/// Decides what `desired` needs given the cached `existing` object. Pure.
///
/// Only fields the operator sets are compared ([`needs_update`]), so values the apiserver
/// defaults (clusterIP, container defaults, volumeName, ...) never cause a write.
pub(crate) fn decide<K>(desired: &K, existing: Option<&K::Cached>, owner_uid: &str) -> ChildAction
where
    K: OwnedChild,
{
    let Some(existing) = existing else {
        return ChildAction::Create;
    };
    match controller_of(existing.owners()) {
        Some(c) if c.uid != owner_uid => {
            return ChildAction::Blocked(format!("{} {}", c.kind, c.name));
        }
        None if !provably_ours(desired, existing) => {
            return ChildAction::Blocked(format!(
                "nobody (it lacks this QuestDB's labels; annotate it {ADOPT_ANNOTATION}=true to hand it over)"
            ));
        }
        None if controller_of(desired.owner_references()).is_some() => return ChildAction::Adopt,
        _ => {}
    }
    if needs_update(desired, existing) {
        ChildAction::Update
    } else {
        ChildAction::InSync
    }
}

/// An object without a controller is ours only when it carries the operator's labels for the
/// same QuestDB (a retained PVC, a child whose owner reference was removed) or the user's
/// adoption annotation. Another application's PVC with a colliding name is neither.
fn provably_ours<K: Resource, E: CachedMeta>(desired: &K, existing: &E) -> bool {
    let ours = existing.label(labels::MANAGED_BY) == Some(labels::MANAGED_BY_VALUE)
        && existing.label(labels::NAME) == Some(labels::NAME_VALUE)
        && existing.label(labels::INSTANCE).is_some()
        && existing.label(labels::INSTANCE)
            == desired.labels().get(labels::INSTANCE).map(String::as_str);
    ours || existing.annotation(ADOPT_ANNOTATION) == Some("true")
}

/// Whether `obj`'s controller is the QuestDB with `uid`.
pub(crate) fn controlled_by<K: CachedMeta>(obj: &K, uid: &str) -> bool {
    controller_of(obj.owners()).is_some_and(|c| c.uid == uid)
}

/// Deletes a child the operator controls and no longer wants; the uid precondition makes sure
/// it is the object that was looked at, never a successor with the same name.
pub(crate) async fn delete_owned<K, O>(api: &Api<K>, obj: &O) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    O: Lookup,
{
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: obj.uid().map(Cow::into_owned),
            resource_version: None,
        }),
        ..Default::default()
    };
    let name = obj.name().unwrap_or_default();
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keeps the non-controller owner references an adopted object already had.
pub(crate) fn merge_owner_references<K: Resource, E: CachedMeta>(
    desired: &mut K,
    existing: Option<&E>,
) {
    let Some(existing) = existing else { return };
    let ours: Vec<OwnerReference> = desired.owner_references().to_vec();
    if ours.is_empty() && desired.meta().owner_references.is_some() {
        // An explicit empty list means "release": drop only our own references.
        let keep: Vec<OwnerReference> = existing
            .owners()
            .iter()
            .filter(|r| r.controller != Some(true))
            .cloned()
            .collect();
        desired.meta_mut().owner_references = Some(keep);
        return;
    }
    let mut merged = ours.clone();
    for r in existing.owners() {
        if r.controller != Some(true) && !ours.iter().any(|o| o.uid == r.uid) {
            merged.push(r.clone());
        }
    }
    desired.meta_mut().owner_references = Some(merged);
}

/// Outcome of an apply, for events and requeue decisions.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    Created,
    Adopted,
    Updated,
    Unchanged,
    Blocked(String),
    /// The cache was behind the apiserver (create raced an existing object, or the object
    /// changed since the decision was made): retry soon.
    Stale,
}

pub(crate) use crate::cache::compacted::APPLIED_HASH_ANNOTATION;

/// Adds [`APPLIED_HASH_ANNOTATION`] to `desired`: a hash of everything else in it.
pub(crate) fn stamp_applied_hash<K: Resource + Serialize>(desired: &mut K) {
    desired.annotations_mut().remove(APPLIED_HASH_ANNOTATION);
    let bytes = serde_json::to_vec(desired).unwrap_or_default();
    let hash = hex::encode(&Sha256::digest(&bytes)[..8]);
    desired
        .annotations_mut()
        .insert(APPLIED_HASH_ANNOTATION.to_string(), hash);
}

fn api_error(code: u16) -> bool {
    // 404: deleted since; 409: changed since (resourceVersion precondition).
    matches!(code, 404 | 409)
}

/// Applies `action` with at most one write for the decision itself. `existing` is the object
/// the decision was made on (the cache's copy).
///
/// Creation is a plain create, which fails when any object of that name exists: server-side
/// apply would silently merge into an object the cache has not seen yet. Later writes of
/// [`OwnedChild::SERVER_SIDE_APPLY`] kinds are server-side applies under the field manager
/// `questdb-operator` (forced: the operator's fields are the operator's), with the cached
/// resourceVersion as precondition, so fields the operator no longer sets are removed by the
/// apiserver and fields others set (defaults, other controllers, a user's extra labels) stay.
/// The PVC is merge-patched with exactly its metadata and size.
pub(crate) async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    existing: Option<&K::Cached>,
    action: &ChildAction,
) -> kube::Result<Applied>
where
    K: OwnedChild + Serialize + DeserializeOwned + Clone + Debug,
{
    match action {
        ChildAction::InSync => Ok(Applied::Unchanged),
        ChildAction::Blocked(by) => Ok(Applied::Blocked(by.clone())),
        ChildAction::Create => {
            let pp = PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            // The create's fields belong to `(questdb-operator, Update)` until the first
            // server-side apply converts them: most children are never updated, so that
            // write is paid then, not at every creation.
            match api.create(&pp, desired).await {
                Ok(_) => Ok(Applied::Created),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Applied::Stale),
                Err(e) => Err(e),
            }
        }
        ChildAction::Adopt | ChildAction::Update => {
            let done = if *action == ChildAction::Adopt {
                Applied::Adopted
            } else {
                Applied::Updated
            };
            let result = if K::SERVER_SIDE_APPLY {
                server_side_apply(api, desired, existing).await
            } else {
                merge_patch(api, desired, existing).await
            };
            match result {
                Ok(true) => Ok(done),
                Ok(false) => Ok(Applied::Stale),
                Err(kube::Error::Api(s)) if api_error(s.code) => Ok(Applied::Stale),
                Err(e) => Err(e),
            }
        }
    }
}

/// The JSON merge patch of a PVC: metadata and (only ever upwards) the requested size.
async fn merge_patch<K>(
    api: &Api<K>,
    desired: &K,
    existing: Option<&K::Cached>,
) -> kube::Result<bool>
where
    K: OwnedChild + Serialize + DeserializeOwned + Clone + Debug,
{
    let mut body = desired.clone();
    merge_owner_references(&mut body, existing);
    body.meta_mut().resource_version = existing
        .and_then(|e| e.resource_version())
        .map(Cow::into_owned);
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    api.patch(&desired.name_any(), &pp, &Patch::Merge(&body))
        .await
        .map(|_| true)
}

/// Reads the live object (the cache strips managedFields), refuses to act when it is not the
/// object the decision was made on, converts ownership recorded by earlier plain writes, then
/// applies.
async fn server_side_apply<K>(
    api: &Api<K>,
    desired: &K,
    existing: Option<&K::Cached>,
) -> kube::Result<bool>
where
    K: OwnedChild + Serialize + DeserializeOwned + Clone + Debug,
{
    let Some(live) = api.get_opt(&desired.name_any()).await? else {
        return Ok(false);
    };
    let decided_on = existing.and_then(|e| e.resource_version());
    if decided_on.is_some() && live.meta().resource_version.as_deref() != decided_on.as_deref() {
        return Ok(false);
    }
    let live = match upgrade_managed_fields(api, &live).await? {
        Some(upgraded) => upgraded,
        None => live,
    };
    let mut body = desired.clone();
    body.meta_mut().resource_version = live.meta().resource_version.clone();
    let pp = PatchParams::apply(MANAGER).force();
    api.patch(&desired.name_any(), &pp, &Patch::Apply(&body))
        .await
        .map(|_| true)
}

/// Fields written by a create or merge patch belong to `(questdb-operator, Update)`, and a
/// server-side apply never removes a field another entry still owns. This moves them to the
/// operator's `Apply` entry (as `kubectl` does when it upgrades client-side to server-side
/// apply), in one patch guarded by the resourceVersion. `Ok(None)`: nothing to convert.
async fn upgrade_managed_fields<K>(api: &Api<K>, live: &K) -> kube::Result<Option<K>>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let Some(patch) = managed_fields_upgrade(live.meta()) else {
        return Ok(None);
    };
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    api.patch(&live.name_any(), &pp, &Patch::Merge(&patch))
        .await
        .map(Some)
}

fn is_legacy_entry(m: &ManagedFieldsEntry) -> bool {
    m.manager.as_deref() == Some(MANAGER)
        && m.operation.as_deref() == Some("Update")
        && m.subresource.as_deref().unwrap_or_default().is_empty()
}

/// The patch that `upgrade_managed_fields` sends, if one is needed. Pure.
pub(crate) fn managed_fields_upgrade(meta: &ObjectMeta) -> Option<serde_json::Value> {
    let entries = meta.managed_fields.as_deref().unwrap_or_default();
    let legacy = entries.iter().position(is_legacy_entry)?;
    let rv = meta.resource_version.clone().unwrap_or_default();
    let mut upgraded: Vec<ManagedFieldsEntry> = entries.to_vec();
    let from = upgraded.remove(legacy);
    let applied = upgraded.iter_mut().find(|m| {
        m.manager.as_deref() == Some(MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref().unwrap_or_default().is_empty()
    });
    match applied {
        Some(a) => {
            let mut fields = a.fields_v1.take().map(|f| f.0).unwrap_or(json!({}));
            if let Some(f) = from.fields_v1 {
                union(&mut fields, f.0);
            }
            a.fields_v1 = Some(FieldsV1(fields));
        }
        None => {
            let mut entry = from;
            entry.operation = Some("Apply".to_string());
            upgraded.insert(legacy, entry);
        }
    }
    // A merge patch replaces the list whole; the resourceVersion makes it conditional.
    Some(json!({"metadata": {"resourceVersion": rv, "managedFields": upgraded}}))
}

/// Union of two managed-field sets (`fieldsV1` trees: nested objects whose leaves are `{}`).
fn union(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(existing) => union(existing, v),
                    None => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (into, from) => *into = from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    fn owner(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "crd.questdb.io/v1beta1".into(),
            kind: "QuestDB".into(),
            name: "db".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    fn our_labels(instance: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NAME.to_string(), labels::NAME_VALUE.to_string()),
            (labels::INSTANCE.to_string(), instance.to_string()),
            (
                labels::MANAGED_BY.to_string(),
                labels::MANAGED_BY_VALUE.to_string(),
            ),
        ])
    }

    fn cached<K: OwnedChild + Clone>(existing: &K) -> K::Cached {
        K::to_cached(existing.clone())
    }

    fn cm(owners: Option<Vec<OwnerReference>>, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("db-config".into()),
                namespace: Some("ns".into()),
                owner_references: owners,
                labels: Some(our_labels("db")),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn absent_is_created() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        assert_eq!(decide(&d, None, "u1"), ChildAction::Create);
    }

    #[test]
    fn identical_is_in_sync_even_with_server_fields() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let mut e = d.clone();
        e.metadata.resource_version = Some("42".into());
        e.metadata.uid = Some("child-uid".into());
        assert_eq!(decide(&d, Some(&cached(&e)), "u1"), ChildAction::InSync);
    }

    #[test]
    fn changed_data_is_updated() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "2")]);
        let e = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        assert_eq!(decide(&d, Some(&cached(&e)), "u1"), ChildAction::Update);
    }

    #[test]
    fn unowned_with_our_labels_is_adopted() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let e = cm(None, &[("a", "1")]);
        assert_eq!(decide(&d, Some(&cached(&e)), "u1"), ChildAction::Adopt);
    }

    #[test]
    fn another_applications_object_is_never_adopted_or_used() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let mut e = cm(None, &[("a", "1")]);
        e.metadata.labels = Some(BTreeMap::from([(
            labels::NAME.to_string(),
            "prometheus".to_string(),
        )]));
        assert!(matches!(
            decide(&d, Some(&cached(&e)), "u1"),
            ChildAction::Blocked(_)
        ));
        // Retained children (no owner reference wanted) are not used either.
        let mut retained = d.clone();
        retained.metadata.owner_references = None;
        assert!(matches!(
            decide(&retained, Some(&cached(&e)), "u1"),
            ChildAction::Blocked(_)
        ));
        // Our labels for another QuestDB are not ours either.
        e.metadata.labels = Some(our_labels("other"));
        assert!(matches!(
            decide(&d, Some(&cached(&e)), "u1"),
            ChildAction::Blocked(_)
        ));
    }

    #[test]
    fn the_adoption_annotation_hands_an_object_over() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let mut e = cm(None, &[("a", "1")]);
        e.metadata.labels = None;
        e.metadata.annotations = Some(BTreeMap::from([(
            ADOPT_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        assert_eq!(decide(&d, Some(&cached(&e)), "u1"), ChildAction::Adopt);
    }

    #[test]
    fn foreign_controller_blocks() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let e = cm(Some(vec![owner("other", true)]), &[("a", "1")]);
        assert!(matches!(
            decide(&d, Some(&cached(&e)), "u1"),
            ChildAction::Blocked(_)
        ));
    }

    #[test]
    fn previous_owner_with_same_name_blocks() {
        // A QuestDB recreated with the same name has a new uid: children still controlled by the
        // old (deleted, GC pending) object must not be grabbed.
        let d = cm(Some(vec![owner("new", true)]), &[("a", "1")]);
        let e = cm(Some(vec![owner("old", true)]), &[("a", "1")]);
        assert!(matches!(
            decide(&d, Some(&cached(&e)), "new"),
            ChildAction::Blocked(_)
        ));
    }

    #[test]
    fn adoption_keeps_foreign_non_controller_refs() {
        let mut d = cm(Some(vec![owner("u1", true)]), &[]);
        let e = cm(Some(vec![owner("x", false)]), &[]);
        merge_owner_references(&mut d, Some(&e));
        let uids: Vec<_> = d
            .owner_references()
            .iter()
            .map(|r| r.uid.as_str())
            .collect();
        assert_eq!(uids, vec!["u1", "x"]);
    }

    #[test]
    fn release_drops_only_our_controller_ref() {
        let mut d = cm(Some(vec![]), &[]);
        let e = cm(Some(vec![owner("u1", true), owner("x", false)]), &[]);
        merge_owner_references(&mut d, Some(&e));
        let uids: Vec<_> = d
            .owner_references()
            .iter()
            .map(|r| r.uid.as_str())
            .collect();
        assert_eq!(uids, vec!["x"]);
        assert_eq!(decide(&d, Some(&cached(&e)), "u1"), ChildAction::Update);
    }

    fn entry(manager: &str, operation: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn meta_with(entries: Vec<ManagedFieldsEntry>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some("7".into()),
            managed_fields: Some(entries),
            ..Default::default()
        }
    }

    fn upgraded(meta: &ObjectMeta) -> Vec<ManagedFieldsEntry> {
        let patch = managed_fields_upgrade(meta).expect("an upgrade");
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "guarded");
        serde_json::from_value(patch["metadata"]["managedFields"].clone()).expect("entries")
    }

    /// Fields the operator wrote with a create stay owned by an Update entry, which a server-side
    /// apply never clears: without the upgrade, a removed field would stay in the child for good.
    #[test]
    fn fields_from_a_create_become_the_operators_applied_fields() {
        let kcm = entry("kube-controller-manager", "Update", json!({"f:status": {}}));
        let meta = meta_with(vec![
            entry(MANAGER, "Update", json!({"f:spec": {"f:a": {}}})),
            kcm.clone(),
        ]);
        let after = upgraded(&meta);
        assert_eq!(after.len(), 2);
        assert_eq!(after[0].operation.as_deref(), Some("Apply"));
        assert_eq!(after[0].manager.as_deref(), Some(MANAGER));
        assert_eq!(after[1], kcm, "other managers are untouched");
    }

    #[test]
    fn an_existing_applied_entry_absorbs_the_old_fields() {
        let meta = meta_with(vec![
            entry(MANAGER, "Apply", json!({"f:spec": {"f:a": {}}})),
            entry(
                MANAGER,
                "Update",
                json!({"f:spec": {"f:b": {}}, "f:data": {}}),
            ),
        ]);
        let after = upgraded(&meta);
        assert_eq!(after.len(), 1);
        assert_eq!(
            after[0].fields_v1.as_ref().map(|f| f.0.clone()),
            Some(json!({"f:spec": {"f:a": {}, "f:b": {}}, "f:data": {}}))
        );
    }

    #[test]
    fn nothing_to_upgrade_means_no_write() {
        let meta = meta_with(vec![
            entry(MANAGER, "Apply", json!({"f:spec": {}})),
            entry("kubectl-edit", "Update", json!({"f:spec": {}})),
        ]);
        assert_eq!(managed_fields_upgrade(&meta), None);
        let mut status_only = entry(MANAGER, "Update", json!({"f:status": {}}));
        status_only.subresource = Some("status".into());
        assert_eq!(managed_fields_upgrade(&meta_with(vec![status_only])), None);
    }

    /// A removal (a field no longer built) must change what the converged check compares.
    #[test]
    fn the_applied_hash_changes_when_a_field_is_removed() {
        // Labels compare as a subset, so without the hash a dropped label looks converged.
        let mut with = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        with.labels_mut().insert("team".into(), "x".into());
        let mut without = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let unstamped = without.clone();
        assert_eq!(
            decide(&unstamped, Some(&cached(&with)), "u1"),
            ChildAction::InSync
        );
        stamp_applied_hash(&mut with);
        stamp_applied_hash(&mut without);
        let hash = |c: &ConfigMap| c.annotations().get(APPLIED_HASH_ANNOTATION).cloned();
        assert!(hash(&with).is_some());
        assert_ne!(hash(&with), hash(&without));
        let again = {
            let mut c = with.clone();
            stamp_applied_hash(&mut c);
            c
        };
        assert_eq!(hash(&again), hash(&with), "stable");
        // The stored object carries the old hash: the decision is an update.
        assert_eq!(
            decide(&without, Some(&cached(&with)), "u1"),
            ChildAction::Update
        );
    }
}
