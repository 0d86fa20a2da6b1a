//! `spec.volume.restoreFrom`: the volume is created from a backup's VolumeSnapshot, once, and
//! never from anything else. An existing volume in the way is never overwritten: the database
//! does not start until a person decides (condition `VolumeRestored=False, RestoreRefused`).

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::api::{BackupStep, QuestDB, QuestDBBackup, RestoreReason, RestoreSource};
use crate::controllers::backup::snapshot;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired;
use crate::plan::conditions::Verdict;

/// Whether the rest of the reconcile may go on.
#[derive(Debug, PartialEq)]
pub(crate) enum Gate {
    /// Nothing to restore, or the volume was restored.
    Open(Option<Verdict<RestoreReason>>),
    /// Create the volume from this VolumeSnapshot.
    Create {
        snapshot: String,
        condition: Verdict<RestoreReason>,
    },
    /// Build nothing yet; look again after this long (`None`: on the next change).
    Blocked(Verdict<RestoreReason>, Option<Duration>),
}

pub(crate) async fn gate(qdb: &QuestDB, ctx: &Context) -> Result<Gate, Error> {
    let Some(source) = &qdb.spec.volume.restore_from else {
        return Ok(Gate::Open(None));
    };
    let ns = qdb.namespace().ok_or(Error::MissingNamespace)?;
    let pvc_name = desired::names::pvc(qdb);
    let pvc = ctx.caches.pvcs.get(&ObjectRef::new(&pvc_name).within(&ns));
    if let Some(pvc) = pvc {
        return Ok(existing(&pvc, &pvc_name, source));
    }
    // The cache holds only the operator's claims: someone else's of that name is read live,
    // and only until the restored claim exists.
    let live: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(pvc) = live.get_opt(&pvc_name).await.map_err(Error::Kube)? {
        return Ok(existing(&pvc, &pvc_name, source));
    }
    let (snapshot, what) = match source {
        RestoreSource {
            backup: Some(name), ..
        } => {
            let api: Api<QuestDBBackup> = Api::namespaced(ctx.client.clone(), &ns);
            let Some(backup) = api.get_opt(name).await.map_err(Error::Kube)? else {
                return Ok(blocked(
                    RestoreReason::RestoreSourceNotFound,
                    format!("QuestDBBackup {name} does not exist"),
                    30,
                ));
            };
            let status = backup.status.unwrap_or_default();
            if let Some(refused) = newer_backup(qdb, name, status.questdb_version.as_deref()) {
                return Ok(Gate::Blocked(refused, None));
            }
            match (status.step, status.snapshot_name) {
                (Some(BackupStep::Succeeded), Some(snap)) => (snap, format!("backup {name}")),
                (step, _) => {
                    let step = step.map_or("new", |s| s.as_str());
                    return Ok(blocked(
                        RestoreReason::RestoreSourceNotReady,
                        format!(
                            "QuestDBBackup {name} is {step}; only a Succeeded backup is restored"
                        ),
                        10,
                    ));
                }
            }
        }
        RestoreSource {
            volume_snapshot: Some(name),
            ..
        } => (name.clone(), format!("VolumeSnapshot {name}")),
        // The schema requires one of the two.
        _ => return Ok(Gate::Open(None)),
    };
    let api = snapshot::api(&ctx.client, &ns);
    match api.get_opt(&snapshot).await {
        Ok(Some(obj)) => {
            let ready = obj
                .data
                .get("status")
                .and_then(|s| s.get("readyToUse"))
                .and_then(|v| v.as_bool())
                == Some(true);
            if !ready {
                return Ok(blocked(
                    RestoreReason::RestoreSourceNotReady,
                    format!("VolumeSnapshot {snapshot} is not ready to use"),
                    10,
                ));
            }
        }
        Ok(None) => {
            return Ok(blocked(
                RestoreReason::RestoreSourceNotFound,
                format!("VolumeSnapshot {snapshot} ({what}) does not exist"),
                30,
            ))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Ok(blocked(
                RestoreReason::RestoreSourceNotFound,
                crate::plan::backup::SNAPSHOT_API_MISSING.to_string(),
                60,
            ))
        }
        Err(e) => return Err(Error::Kube(e)),
    }
    let verdict = Verdict::new(
        true,
        RestoreReason::Restored,
        format!("volume {pvc_name} created from {what} (VolumeSnapshot {snapshot})"),
    );
    Ok(Gate::Create {
        snapshot,
        condition: verdict,
    })
}

/// The VolumeSnapshot `source` names: a backup's snapshot carries the backup's name (the
/// backup controller creates it so).
fn source_snapshot(source: &RestoreSource) -> Option<&str> {
    source
        .backup
        .as_deref()
        .or(source.volume_snapshot.as_deref())
}

/// A claim that exists: restored from the snapshot `source` names, or in the way (made from
/// nothing, or from another snapshot: a name reused for a second restore drill keeps the first
/// drill's retained volume, which would serve the other backup's data).
fn existing(pvc: &PersistentVolumeClaim, name: &str, source: &RestoreSource) -> Gate {
    let spec = pvc.spec.as_ref();
    let made_from = spec
        .and_then(|s| s.data_source.as_ref())
        .filter(|d| d.kind == "VolumeSnapshot")
        .map(|d| d.name.clone());
    let wanted = source_snapshot(source);
    let what = match (&source.backup, &source.volume_snapshot) {
        (Some(b), _) => format!("backup {b}"),
        (None, Some(v)) => format!("VolumeSnapshot {v}"),
        (None, None) => "nothing".into(),
    };
    match made_from {
        Some(snapshot) if wanted.is_none_or(|w| w == snapshot) => Gate::Open(Some(Verdict::new(
            true,
            RestoreReason::Restored,
            format!("volume {name} was created from VolumeSnapshot {snapshot}"),
        ))),
        Some(snapshot) => Gate::Blocked(
            Verdict::new(
                false,
                RestoreReason::RestoreRefused,
                format!("volume {name} already exists and was restored from VolumeSnapshot {snapshot}, not from {what} (VolumeSnapshot {}): it is never overwritten; delete it (its data goes with it) to restore {what}", wanted.unwrap_or_default()),
            ),
            None,
        ),
        None => Gate::Blocked(
            Verdict::new(
                false,
                RestoreReason::RestoreRefused,
                format!("volume {name} already exists and was not restored from a snapshot: it is never overwritten; delete it (its data goes with it) or remove volume.restoreFrom by recreating the QuestDB without it"),
            ),
            None,
        ),
    }
}

/// A backup taken on a newer QuestDB than the image restores into: refused (QuestDB supports
/// no downgrade), unless the spec acknowledges it.
fn newer_backup(
    qdb: &QuestDB,
    backup: &str,
    backup_version: Option<&str>,
) -> Option<Verdict<RestoreReason>> {
    let backup_version = backup_version?;
    let image_version = desired::version_of(&qdb.spec.image)?;
    if qdb.spec.allow_version_downgrade || !desired::version::older(&image_version, backup_version)
    {
        return None;
    }
    Some(Verdict::new(
        false,
        RestoreReason::RestoreRefused,
        format!(
            "backup {backup} was taken from QuestDB {backup_version}, newer than the image {} ({image_version}): QuestDB does not support downgrades, an older version may not read its data; restore into an image of {backup_version} or later, or set spec.allowVersionDowngrade: true",
            qdb.spec.image
        ),
    ))
}

fn blocked(reason: RestoreReason, message: String, retry_seconds: u64) -> Gate {
    Gate::Blocked(
        Verdict::new(false, reason, message),
        Some(Duration::from_secs(retry_seconds)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, TypedLocalObjectReference};

    fn claim(source: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                data_source: source.map(|s| TypedLocalObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: s.into(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn from_backup(name: &str) -> RestoreSource {
        RestoreSource {
            backup: Some(name.into()),
            volume_snapshot: None,
        }
    }

    #[test]
    fn an_existing_volume_not_made_from_a_snapshot_is_never_restored_over() {
        match existing(&claim(None), "prod-data", &from_backup("nightly")) {
            Gate::Blocked(v, None) => {
                assert_eq!(v.reason, RestoreReason::RestoreRefused);
                assert!(!v.status);
            }
            other => panic!("{other:?}"),
        }
        match existing(
            &claim(Some("nightly")),
            "prod-data",
            &from_backup("nightly"),
        ) {
            Gate::Open(Some(v)) => assert!(v.status && v.message.contains("nightly")),
            other => panic!("{other:?}"),
        }
    }

    /// The harm: QuestDB 9.1 opening a backup 9.2 wrote.
    #[test]
    fn a_backup_of_a_newer_version_is_refused_naming_both_versions() {
        let mut qdb = crate::desired::testing::questdb("r", "ns");
        qdb.spec.image = "questdb/questdb:9.1.0".into();
        let refused = newer_backup(&qdb, "friday", Some("9.2.0")).expect("refused");
        assert_eq!(refused.reason, RestoreReason::RestoreRefused);
        assert!(
            refused.message.contains("9.1.0") && refused.message.contains("9.2.0"),
            "{}",
            refused.message
        );
        assert_eq!(newer_backup(&qdb, "friday", Some("9.1.0")), None);
        assert_eq!(newer_backup(&qdb, "friday", Some("9.0.2")), None);
        assert_eq!(newer_backup(&qdb, "friday", None), None);
        qdb.spec.allow_version_downgrade = true;
        assert_eq!(newer_backup(&qdb, "friday", Some("9.2.0")), None);
    }

    /// The harm: restoring `r` from Friday's backup after an earlier drill of `r` from Monday's
    /// (whose claim was retained) would serve Monday's data, Ready and `VolumeRestored=True`.
    #[test]
    fn a_volume_restored_from_another_snapshot_is_refused_naming_both() {
        match existing(&claim(Some("monday")), "r-data", &from_backup("friday")) {
            Gate::Blocked(v, None) => {
                assert_eq!(v.reason, RestoreReason::RestoreRefused);
                assert!(
                    v.message.contains("monday") && v.message.contains("friday"),
                    "{}",
                    v.message
                );
            }
            other => panic!("{other:?}"),
        }
        let snapshot = RestoreSource {
            backup: None,
            volume_snapshot: Some("friday".into()),
        };
        assert!(matches!(
            existing(&claim(Some("friday")), "r-data", &snapshot),
            Gate::Open(Some(_))
        ));
        assert!(matches!(
            existing(&claim(Some("monday")), "r-data", &snapshot),
            Gate::Blocked(_, None)
        ));
    }
}
