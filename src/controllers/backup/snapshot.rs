//! A backup's VolumeSnapshot (`snapshot.storage.k8s.io/v1`, served by the CSI snapshot CRDs),
//! read and written as dynamic objects: the API is optional in a cluster, so nothing here is
//! compiled against its types.
//!
//! Fields read (external-snapshotter `client/apis/volumesnapshot/v1/types.go`):
//! `status.creationTime` (the snapshot is cut: its point in time is fixed), `status.readyToUse`,
//! `status.restoreSize`, `status.error.message`.

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::core::ObjectMeta;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::api::{labels, BackupDeletionPolicy, QuestDBBackup, BACKUP_LABEL};
use crate::plan::backup::Snapshot;

/// Annotation with the uid of the backup a VolumeSnapshot belongs to (a `Retain` snapshot
/// carries no owner reference).
pub(crate) const BACKUP_UID_ANNOTATION: &str = "crd.questdb.io/backup-uid";

pub(crate) fn resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshot",
    ))
}

pub fn api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource())
}

/// Whether the VolumeSnapshot API is served: a list of at most one object answers 404 when
/// the CRDs are not installed.
pub(crate) async fn api_served(client: &Client, ns: &str) -> kube::Result<bool> {
    match api(client, ns)
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The backup's snapshot as the plan sees it.
pub(crate) async fn observe(client: &Client, backup: &QuestDBBackup) -> kube::Result<Snapshot> {
    let ns = backup.namespace().unwrap_or_default();
    observe_named(client, &ns, &backup.name_any(), |obj| is_ours(obj, backup)).await
}

/// The VolumeSnapshot `name` as a plan sees it, `ours` telling whether it is the caller's (a
/// backup's by uid annotation, a version upgrade's by owner).
pub(crate) async fn observe_named(
    client: &Client,
    ns: &str,
    name: &str,
    ours: impl Fn(&DynamicObject) -> bool,
) -> kube::Result<Snapshot> {
    match api(client, ns).get_opt(name).await {
        Ok(Some(obj)) if !ours(&obj) => Ok(Snapshot::NotOurs),
        Ok(Some(obj)) => Ok(progress(&obj)),
        Ok(None) => Ok(Snapshot::Absent),
        // The resource itself is not served.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Snapshot::ApiMissing),
        Err(e) => Err(e),
    }
}

/// The backup's snapshot as `observe` judges it.
#[cfg(test)]
fn view(obj: &DynamicObject, backup: &QuestDBBackup) -> Snapshot {
    if !is_ours(obj, backup) {
        return Snapshot::NotOurs;
    }
    progress(obj)
}

/// How far a VolumeSnapshot got: its error, ready to use, or asked for (cut or not).
fn progress(obj: &DynamicObject) -> Snapshot {
    let status = obj.data.get("status");
    let field = |name: &str| status.and_then(|s| s.get(name));
    if let Some(message) = field("error").and_then(|e| e.get("message")?.as_str()) {
        return Snapshot::Error(format!("the VolumeSnapshot reports: {message}"));
    }
    if field("readyToUse").and_then(|v| v.as_bool()) == Some(true) {
        return Snapshot::Ready {
            restore_size: field("restoreSize")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        };
    }
    Snapshot::Pending {
        cut: field("creationTime").is_some_and(|v| !v.is_null()),
    }
}

fn is_ours(obj: &DynamicObject, backup: &QuestDBBackup) -> bool {
    obj.annotations().get(BACKUP_UID_ANNOTATION) == backup.meta().uid.as_ref()
}

/// The VolumeSnapshot of `pvc` for `backup`, named like the backup. With `deletionPolicy:
/// Delete` it is owned by the backup, so it goes when the backup goes, whoever deletes it.
pub(crate) fn desired(backup: &QuestDBBackup, pvc: &str) -> DynamicObject {
    let ns = backup.namespace().unwrap_or_default();
    let mut metadata = ObjectMeta {
        name: Some(backup.name_any()),
        namespace: Some(ns),
        labels: Some(
            [
                (labels::NAME, labels::NAME_VALUE),
                (labels::INSTANCE, backup.spec.questdb_name.as_str()),
                (labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
                (BACKUP_LABEL, backup.name_any().as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ),
        annotations: Some(
            [(
                BACKUP_UID_ANNOTATION.to_string(),
                backup.meta().uid.clone().unwrap_or_default(),
            )]
            .into(),
        ),
        ..ObjectMeta::default()
    };
    if backup.spec.deletion_policy == BackupDeletionPolicy::Delete {
        metadata.owner_references = backup.controller_owner_ref(&()).map(|o| vec![o]);
    }
    let spec = spec_of(pvc, backup.spec.volume_snapshot_class_name.as_deref());
    let mut obj = DynamicObject::new(&backup.name_any(), &resource()).data(json!({"spec": spec}));
    obj.metadata = metadata;
    obj
}

/// The spec of a VolumeSnapshot of `pvc` (`class` unset: the cluster's default class).
pub(crate) fn spec_of(pvc: &str, class: Option<&str>) -> serde_json::Value {
    let mut spec = json!({"source": {"persistentVolumeClaimName": pvc}});
    if let Some(class) = class {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    spec
}

/// Creates the snapshot; one that already exists (a retried step) is left as it is.
pub(crate) async fn create(client: &Client, backup: &QuestDBBackup, pvc: &str) -> kube::Result<()> {
    let ns = backup.namespace().unwrap_or_default();
    create_once(client, &ns, &desired(backup, pvc)).await
}

/// Creates `obj`; one of its name that already exists (asked before a crash) is left as it
/// is, for the caller's next look to judge.
pub(crate) async fn create_once(
    client: &Client,
    ns: &str,
    obj: &DynamicObject,
) -> kube::Result<()> {
    let pp = PostParams {
        field_manager: Some(crate::api::MANAGER.into()),
        ..PostParams::default()
    };
    match api(client, ns).create(&pp, obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the backup's own snapshot (checked by uid annotation; the delete is preconditioned
/// on the uid read, so never a successor of the same name).
pub(crate) async fn delete(client: &Client, backup: &QuestDBBackup) -> kube::Result<()> {
    let ns = backup.namespace().unwrap_or_default();
    let api = api(client, &ns);
    let Some(obj) = api.get_opt(&backup.name_any()).await? else {
        return Ok(());
    };
    if !is_ours(&obj, backup) {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: obj.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&backup.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::QuestDBBackupSpec;

    fn backup(policy: BackupDeletionPolicy) -> QuestDBBackup {
        let mut b = QuestDBBackup::new(
            "nightly",
            QuestDBBackupSpec {
                questdb_name: "prod".into(),
                volume_snapshot_class_name: Some("ebs".into()),
                deletion_policy: policy,
                verify: false,
            },
        );
        b.metadata.namespace = Some("team-a".into());
        b.metadata.uid = Some("uid-1".into());
        b
    }

    fn with_status(b: &QuestDBBackup, status: serde_json::Value) -> DynamicObject {
        let mut obj = desired(b, "prod-data");
        obj.data["status"] = status;
        obj
    }

    #[test]
    fn a_retained_snapshot_outlives_its_backup_and_a_deleted_one_goes_with_it() {
        let keep = desired(&backup(BackupDeletionPolicy::Retain), "prod-data");
        assert!(keep.metadata.owner_references.is_none());
        let go = desired(&backup(BackupDeletionPolicy::Delete), "prod-data");
        let owners = go.metadata.owner_references.unwrap();
        assert_eq!(owners[0].uid, "uid-1");
        assert_eq!(
            go.data["spec"]["source"]["persistentVolumeClaimName"],
            "prod-data"
        );
        assert_eq!(go.data["spec"]["volumeSnapshotClassName"], "ebs");
    }

    #[test]
    fn the_snapshot_is_cut_before_it_is_ready_and_errors_win() {
        let b = backup(BackupDeletionPolicy::Delete);
        let s = |st| view(&with_status(&b, st), &b);
        assert_eq!(s(json!({})), Snapshot::Pending { cut: false });
        assert_eq!(
            s(json!({"creationTime": "2026-11-24T08:00:00Z", "readyToUse": false})),
            Snapshot::Pending { cut: true }
        );
        assert_eq!(
            s(
                json!({"creationTime": "2026-11-24T08:00:00Z", "readyToUse": true, "restoreSize": "1Gi"})
            ),
            Snapshot::Ready {
                restore_size: Some("1Gi".into())
            }
        );
        assert!(matches!(
            s(json!({"readyToUse": false, "error": {"message": "quota exceeded"}})),
            Snapshot::Error(m) if m.contains("quota exceeded")
        ));
    }

    #[test]
    fn a_snapshot_of_the_same_name_made_by_someone_else_is_never_taken_for_ours() {
        let b = backup(BackupDeletionPolicy::Delete);
        let mut other = with_status(&b, json!({"readyToUse": true}));
        other.metadata.annotations = None;
        assert_eq!(view(&other, &b), Snapshot::NotOurs);
    }
}
