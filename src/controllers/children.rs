//! Owned children: decide (pure) what a desired object needs against the cached one, then apply
//! that decision with at most one write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

use crate::api::{labels, ADOPT_ANNOTATION, MANAGER};
use crate::build::{needs_update, OwnedChild};

/// What to do with one child object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildAction {
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

/// Who controls an existing object, relative to `owner_uid`.
fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// Decides what `desired` needs given the cached `existing` object. Pure.
///
/// Only fields the operator sets are compared ([`needs_update`]), so values the apiserver
/// defaults (clusterIP, container defaults, volumeName, ...) never cause a write.
pub fn decide<K>(desired: &K, existing: Option<&K>, owner_uid: &str) -> ChildAction
where
    K: OwnedChild,
{
    let Some(existing) = existing else {
        return ChildAction::Create;
    };
    match controller_of(existing.meta()) {
        Some(c) if c.uid != owner_uid => {
            return ChildAction::Blocked(format!("{} {}", c.kind, c.name));
        }
        None if !provably_ours(desired, existing) => {
            return ChildAction::Blocked(format!(
                "nobody (it lacks this QuestDB's labels; annotate it {ADOPT_ANNOTATION}=true to hand it over)"
            ));
        }
        None if controller_of(desired.meta()).is_some() => return ChildAction::Adopt,
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
fn provably_ours<K: Resource>(desired: &K, existing: &K) -> bool {
    let l = existing.labels();
    let ours = l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
        && l.get(labels::NAME).map(String::as_str) == Some(labels::NAME_VALUE)
        && l.get(labels::INSTANCE).is_some()
        && l.get(labels::INSTANCE) == desired.labels().get(labels::INSTANCE);
    ours || existing
        .annotations()
        .get(ADOPT_ANNOTATION)
        .map(String::as_str)
        == Some("true")
}

/// Whether `obj`'s controller is the QuestDB with `uid`.
pub fn controlled_by<K: Resource>(obj: &K, uid: &str) -> bool {
    controller_of(obj.meta()).is_some_and(|c| c.uid == uid)
}

/// Deletes a child the operator controls and no longer wants; the uid precondition makes sure
/// it is the object that was looked at, never a successor with the same name.
pub async fn delete_owned<K>(api: &Api<K>, obj: &K) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&obj.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keeps the non-controller owner references an adopted object already had.
pub fn merge_owner_references<K: Resource>(desired: &mut K, existing: Option<&K>) {
    let Some(existing) = existing else { return };
    let ours: Vec<OwnerReference> = desired.owner_references().to_vec();
    if ours.is_empty() && desired.meta().owner_references.is_some() {
        // An explicit empty list means "release": drop only our own references.
        let keep: Vec<OwnerReference> = existing
            .owner_references()
            .iter()
            .filter(|r| r.controller != Some(true))
            .cloned()
            .collect();
        desired.meta_mut().owner_references = Some(keep);
        return;
    }
    let mut merged = ours.clone();
    for r in existing.owner_references() {
        if r.controller != Some(true) && !ours.iter().any(|o| o.uid == r.uid) {
            merged.push(r.clone());
        }
    }
    desired.meta_mut().owner_references = Some(merged);
}

/// Outcome of an apply, for events and requeue decisions.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Adopted,
    Updated,
    Unchanged,
    Blocked(String),
    /// The cache was behind the apiserver (create raced an existing object): retry soon.
    Stale,
}

/// Applies `action` with at most one write. Uses a JSON merge patch for updates so fields the
/// operator does not set (status, defaults, bound volume names) are left alone.
pub async fn apply<K>(api: &Api<K>, desired: &K, action: &ChildAction) -> kube::Result<Applied>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    match action {
        ChildAction::InSync => Ok(Applied::Unchanged),
        ChildAction::Blocked(by) => Ok(Applied::Blocked(by.clone())),
        ChildAction::Create => {
            let pp = PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            match api.create(&pp, desired).await {
                Ok(_) => Ok(Applied::Created),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Applied::Stale),
                Err(e) => Err(e),
            }
        }
        ChildAction::Adopt | ChildAction::Update => {
            let pp = PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            let name = desired.name_any();
            match api.patch(&name, &pp, &Patch::Merge(desired)).await {
                Ok(_) if *action == ChildAction::Adopt => Ok(Applied::Adopted),
                Ok(_) => Ok(Applied::Updated),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Applied::Stale),
                Err(e) => Err(e),
            }
        }
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
        assert_eq!(decide(&d, Some(&e), "u1"), ChildAction::InSync);
    }

    #[test]
    fn changed_data_is_updated() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "2")]);
        let e = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        assert_eq!(decide(&d, Some(&e), "u1"), ChildAction::Update);
    }

    #[test]
    fn unowned_with_our_labels_is_adopted() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let e = cm(None, &[("a", "1")]);
        assert_eq!(decide(&d, Some(&e), "u1"), ChildAction::Adopt);
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
            decide(&d, Some(&e), "u1"),
            ChildAction::Blocked(_)
        ));
        // Retained children (no owner reference wanted) are not used either.
        let mut retained = d.clone();
        retained.metadata.owner_references = None;
        assert!(matches!(
            decide(&retained, Some(&e), "u1"),
            ChildAction::Blocked(_)
        ));
        // Our labels for another QuestDB are not ours either.
        e.metadata.labels = Some(our_labels("other"));
        assert!(matches!(
            decide(&d, Some(&e), "u1"),
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
        assert_eq!(decide(&d, Some(&e), "u1"), ChildAction::Adopt);
    }

    #[test]
    fn foreign_controller_blocks() {
        let d = cm(Some(vec![owner("u1", true)]), &[("a", "1")]);
        let e = cm(Some(vec![owner("other", true)]), &[("a", "1")]);
        assert!(matches!(
            decide(&d, Some(&e), "u1"),
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
            decide(&d, Some(&e), "new"),
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
        assert_eq!(decide(&d, Some(&e), "u1"), ChildAction::Update);
    }
}
