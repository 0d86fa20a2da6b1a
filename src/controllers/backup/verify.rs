//! A backup proven by restoring it (`spec.verify`): after the backup succeeds, its snapshot is
//! restored into a throwaway QuestDB the backup owns, QuestDB opens it (the checkpoint
//! recovery a real restore runs), every table recorded at the checkpoint is counted again, the
//! result goes to condition `Verified`, and the throwaway database and its volume are deleted.
//!
//! Steps are recorded before their side effects (`status.verification.step`): `Restoring`
//! (create the database, or find it; wait until it runs), `CleaningUp` (the result is recorded
//! first; delete the database), `Done`. A manager killed anywhere finds the database by its
//! name and the backup's owner reference, and the result already recorded.
//!
//! The comparison: the backup's tables were counted just before `CHECKPOINT CREATE`, while
//! writes went on, so the restore holds *at least* those rows and that newest timestamp; fewer,
//! an older newest timestamp, a table missing or one that cannot be read is a difference.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::api::{
    EventReason, Phase, QuestDB, QuestDBBackup, QuestDBSpec, RestoreSource, TableFacts,
    Verification, VerifyStep, VolumeSpec, VERIFIES_LABEL,
};
use crate::controllers::{Error, Next};
use crate::desired;
use crate::questdb_http::Database as Db;
use crate::runtime::clock;

use super::BackupContext;

pub(crate) const VERIFIED: &str = "Verified";

/// How long the throwaway database may take to restore, start and answer.
pub(crate) const VERIFY_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Why a verification ended as it did (`Verified`'s reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VerifyReason {
    Verifying,
    Verified,
    /// A table recorded at the checkpoint is missing, unreadable, or holds less.
    TablesDiffer,
    /// The throwaway database could not be made, or did not run within [`VERIFY_TIMEOUT`].
    VerifyFailed,
}

impl VerifyReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Verifying => "Verifying",
            Self::Verified => "Verified",
            Self::TablesDiffer => "TablesDiffer",
            Self::VerifyFailed => "VerifyFailed",
        }
    }
}

/// The throwaway database's name: `verify-<backup>` (a QuestDB name: lower-case letters,
/// digits and '-', at most 52 characters), shortened with a hash of the backup's name.
pub(crate) fn database_name(backup: &str) -> String {
    let clean: String = backup
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let full = format!("verify-{clean}");
    if full.len() <= 52 {
        return full.trim_end_matches('-').to_string();
    }
    let hash = hex::encode(Sha256::digest(backup.as_bytes()));
    format!(
        "verify-{}-{}",
        clean[..38].trim_end_matches('-'),
        &hash[..6]
    )
}

/// What differs between the tables recorded at the checkpoint and the restore's (`Err` per
/// table: it could not be read). Empty: every recorded table holds at least what was recorded.
pub(crate) fn differences(
    recorded: &[TableFacts],
    restored: &[(String, Result<TableFacts, String>)],
) -> Vec<String> {
    let mut out = Vec::new();
    for want in recorded {
        match restored.iter().find(|(name, _)| *name == want.name) {
            None => out.push(format!("{}: missing", want.name)),
            Some((_, Err(e))) => out.push(format!("{}: unreadable ({e})", want.name)),
            Some((_, Ok(got))) => {
                if got.rows < want.rows {
                    out.push(format!(
                        "{}: {} rows, {} recorded at the checkpoint",
                        want.name, got.rows, want.rows
                    ));
                } else if older(got.max_timestamp.as_deref(), want.max_timestamp.as_deref()) {
                    out.push(format!(
                        "{}: newest timestamp {}, {} recorded at the checkpoint",
                        want.name,
                        got.max_timestamp.as_deref().unwrap_or("none"),
                        want.max_timestamp.as_deref().unwrap_or("none")
                    ));
                }
            }
        }
    }
    out
}

/// Whether `got` is older than `want` (a recorded timestamp missing from the restore is).
fn older(got: Option<&str>, want: Option<&str>) -> bool {
    let parse = |t: &str| t.parse::<Timestamp>().ok();
    match (got, want) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(g), Some(w)) => match (parse(g), parse(w)) {
            (Some(g), Some(w)) => g < w,
            _ => g < w,
        },
    }
}

/// The throwaway database: the source's image, configuration and resources, a volume
/// restored from the backup and deleted with it, no dedicated node, no DNS, its own generated
/// credentials, only the operator admitted; owned by the backup.
pub(crate) fn throwaway(
    backup: &QuestDBBackup,
    source: Option<&QuestDB>,
) -> Result<QuestDB, String> {
    let status = backup.status.clone().unwrap_or_default();
    let image = match (source, &status.questdb_version) {
        (Some(q), _) => q.spec.image.clone(),
        (None, Some(v)) => format!("questdb/questdb:{v}"),
        (None, None) => {
            return Err(format!(
                "QuestDB {} is gone and the backup recorded no version: no image to restore into",
                backup.spec.questdb_name
            ))
        }
    };
    let size = status
        .restore_size
        .clone()
        .or_else(|| source.map(|q| q.spec.volume.size.clone()))
        .ok_or("the backup's snapshot has no restore size and the QuestDB is gone")?;
    let name = database_name(&backup.name_any());
    let mut spec = QuestDBSpec {
        image,
        image_pull_policy: source.and_then(|q| q.spec.image_pull_policy.clone()),
        volume: VolumeSpec {
            size,
            storage_class_name: source.and_then(|q| q.spec.volume.storage_class_name.clone()),
            retain_on_delete: false,
            // A verification's copy lives minutes and is deleted: nothing to grow.
            auto_grow: None,
            restore_from: Some(RestoreSource {
                backup: Some(backup.name_any()),
                volume_snapshot: None,
            }),
        },
        resources: source.and_then(|q| q.spec.resources.clone()),
        config: source.map(|q| q.spec.config.clone()).unwrap_or_default(),
        env: source.map(|q| q.spec.env.clone()).unwrap_or_default(),
        node: None,
        failover: Default::default(),
        dns: None,
        ilp_auth: Default::default(),
        paused: false,
        allow_version_downgrade: false,
        version_upgrade: Default::default(),
        network_policy: Default::default(),
        credentials: Default::default(),
        pod: Default::default(),
    };
    // Pulls from the source's private registry, nothing else of its placement.
    if let Some(q) = source {
        spec.pod.image_pull_secrets = q.spec.pod.image_pull_secrets.clone();
    }
    let mut qdb = QuestDB::new(&name, spec);
    qdb.metadata.namespace = backup.namespace();
    // The operator's label: its admission policy lets it create and delete only these.
    qdb.metadata.labels = Some(
        [
            (VERIFIES_LABEL.to_string(), backup.name_any()),
            (
                crate::api::labels::MANAGED_BY.to_string(),
                crate::api::labels::MANAGED_BY_VALUE.to_string(),
            ),
        ]
        .into_iter()
        .collect(),
    );
    qdb.metadata.owner_references = backup.controller_owner_ref(&()).map(|o| vec![o]);
    Ok(qdb)
}

fn condition(status: bool, reason: VerifyReason, message: String, now: Timestamp) -> Condition {
    Condition {
        type_: VERIFIED.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.as_str().into(),
        message,
        last_transition_time: Time(now),
        observed_generation: None,
    }
}

/// Whether `qdb` is this backup's throwaway database.
fn ours(qdb: &QuestDB, backup: &QuestDBBackup) -> bool {
    let uid = backup.uid();
    qdb.owner_references()
        .iter()
        .any(|o| Some(&o.uid) == uid.as_ref())
}

/// One pass of the verification of a `Succeeded` backup with `spec.verify`.
pub(crate) async fn step(backup: &mut QuestDBBackup, bctx: &BackupContext) -> Result<Next, Error> {
    let ctx = &bctx.ctx;
    let ns = backup.namespace().ok_or(Error::MissingNamespace)?;
    let api: Api<QuestDBBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let qdbs: Api<QuestDB> = Api::namespaced(ctx.client.clone(), &ns);
    let status = backup.status.clone().unwrap_or_default();
    let name = database_name(&backup.name_any());
    let now = Timestamp::now();
    let Some(v) = status.verification.clone() else {
        // Recorded before the database is made: a crash after finds it by name.
        let mut s = status.clone();
        s.verification = Some(Verification {
            step: Some(VerifyStep::Restoring),
            database: name.clone(),
            started_at: Some(clock::now()),
            ..Default::default()
        });
        s.conditions = vec![condition(
            false,
            VerifyReason::Verifying,
            format!("restoring the backup into QuestDB {name}"),
            now,
        )];
        s.conditions[0].status = "Unknown".into();
        super::write_status(&api, backup, s).await?;
        return Ok(Next::RequeueAfter(Duration::from_secs(1)));
    };
    match v.step {
        Some(VerifyStep::Done) | None => Ok(Next::AwaitChange),
        Some(VerifyStep::Restoring) => {
            let result = restored_verdict(backup, bctx, &qdbs, &v).await?;
            let Some((ok, reason, message)) = result else {
                return Ok(Next::RequeueAfter(Duration::from_secs(5)));
            };
            // The result first, then the cleanup: a crash in between still reports it.
            let mut s = status.clone();
            let mut v = v.clone();
            v.step = Some(VerifyStep::CleaningUp);
            v.finished_at = Some(clock::now());
            if ok {
                v.tables_checked = Some(status.tables.len() as i32);
            }
            s.verification = Some(v);
            s.conditions = vec![condition(ok, reason, message.clone(), now)];
            super::write_status(&api, backup, s).await?;
            let source = backup.spec.questdb_name.clone();
            if ok {
                if let Some(at) = status.checkpoint_at.as_ref() {
                    ctx.metrics
                        .last_verified_backup(&ns, &source, at.0.as_second());
                }
                info!(backup = %backup.name_any(), questdb = %source, "backup verified by restoring it");
                super::event(
                    ctx,
                    backup,
                    EventType::Normal,
                    EventReason::BackupVerified,
                    message,
                )
                .await;
            } else {
                warn!(backup = %backup.name_any(), questdb = %source, %message, "backup verification failed");
                super::event(
                    ctx,
                    backup,
                    EventType::Warning,
                    EventReason::BackupVerificationFailed,
                    message,
                )
                .await;
            }
            wake_source(backup, bctx);
            Ok(Next::RequeueAfter(Duration::from_secs(1)))
        }
        Some(VerifyStep::CleaningUp) => clean_up(backup, &api, &qdbs, &status, &v).await,
    }
}

/// The verification's answer once it has one: the throwaway QuestDB made (`None` meanwhile), a
/// name that is not the backup's, QuestDB's refusal to start on the data, a timeout, or the
/// restored tables compared with the backup's.
async fn restored_verdict(
    backup: &QuestDBBackup,
    bctx: &BackupContext,
    qdbs: &Api<QuestDB>,
    v: &Verification,
) -> Result<Option<(bool, VerifyReason, String)>, Error> {
    let ctx = &bctx.ctx;
    let ns = backup.namespace().unwrap_or_default();
    let existing = qdbs.get_opt(&v.database).await.map_err(Error::Kube)?;
    let elapsed = clock::since(v.started_at.as_ref()).unwrap_or_default();
    Ok(match existing {
        Some(q) if !ours(&q, backup) => Some((
            false,
            VerifyReason::VerifyFailed,
            format!(
                "a QuestDB named {} exists and is not this backup's: it is left alone",
                v.database
            ),
        )),
        None => {
            let source = ctx
                .caches
                .questdbs
                .get(
                    &kube::runtime::reflector::ObjectRef::new(&backup.spec.questdb_name)
                        .within(&ns),
                )
                .and_then(|g| g.0.as_ref().ok().cloned());
            match throwaway(backup, source.as_ref()) {
                Ok(q) => match qdbs.create(&PostParams::default(), &q).await {
                    Ok(_) => {
                        info!(backup = %backup.name_any(), questdb = %v.database, "restoring the backup into a throwaway QuestDB to verify it");
                        None
                    }
                    // Made by an earlier pass: found by name on the next.
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Some((
                        false,
                        VerifyReason::VerifyFailed,
                        format!("the throwaway QuestDB was refused: {}", s.message),
                    )),
                    Err(e) => return Err(Error::Kube(e)),
                },
                Err(message) => Some((false, VerifyReason::VerifyFailed, message)),
            }
        }
        // QuestDB refuses to start on data it cannot open (it exits; the pod crash-loops):
        // the verification's answer, with QuestDB's own last words.
        Some(q) if q.status.as_ref().and_then(|s| s.phase) == Some(Phase::Failed) => {
            let ready = q
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            Some((
                false,
                VerifyReason::VerifyFailed,
                format!(
                    "the restored QuestDB {} does not start on the backup's data: {}",
                    v.database,
                    ready.chars().take(1500).collect::<String>()
                ),
            ))
        }
        Some(_) if elapsed > VERIFY_TIMEOUT => Some((
            false,
            VerifyReason::VerifyFailed,
            format!(
                "the throwaway QuestDB {} did not run within {}s",
                v.database,
                VERIFY_TIMEOUT.as_secs()
            ),
        )),
        Some(q) if q.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running) => {
            let compared =
                tokio::time::timeout(super::TABLE_FACTS_BUDGET, compare(&q, backup, bctx))
                    .await
                    .unwrap_or_else(|_| Err("counting the tables took too long".into()));
            match compared {
                Ok(found) => Some(found),
                // Running but not answering yet (its pod just became Ready): ask again.
                Err(e) => {
                    info!(backup = %backup.name_any(), error = %e, "the throwaway QuestDB does not answer yet");
                    None
                }
            }
        }
        Some(_) => None,
    })
}

/// Deletes the throwaway QuestDB (only one that is the backup's) and, once it is gone with its
/// volume, records the verification done.
async fn clean_up(
    backup: &mut QuestDBBackup,
    api: &Api<QuestDBBackup>,
    qdbs: &Api<QuestDB>,
    status: &crate::api::QuestDBBackupStatus,
    v: &Verification,
) -> Result<Next, Error> {
    // A QuestDB of that name that is not the backup's is never ours to delete.
    let throwaway = qdbs
        .get_opt(&v.database)
        .await
        .map_err(Error::Kube)?
        .filter(|q| ours(q, backup));
    if let Some(q) = throwaway {
        if q.metadata.deletion_timestamp.is_none() {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: q.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match qdbs.delete(&v.database, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Error::Kube(e)),
            }
            return Ok(Next::RequeueAfter(Duration::from_secs(2)));
        } else {
            // Its finalizer deletes the volume; done once it is gone.
            return Ok(Next::RequeueAfter(Duration::from_secs(2)));
        }
    }
    let mut s = status.clone();
    let mut v = v.clone();
    v.step = Some(VerifyStep::Done);
    s.verification = Some(v);
    super::write_status(api, backup, s).await?;
    Ok(Next::AwaitChange)
}

/// Counts the restored tables and compares them with the recorded ones.
async fn compare(
    restored: &QuestDB,
    backup: &QuestDBBackup,
    bctx: &BackupContext,
) -> Result<(bool, VerifyReason, String), String> {
    let ctx = &bctx.ctx;
    let ns = backup.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = pods
        .get_opt(&desired::names::pod(restored))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no pod yet")?;
    let ip: std::net::IpAddr = pod
        .status
        .and_then(|s| s.pod_ip)
        .and_then(|ip| ip.parse().ok())
        .ok_or("no pod address yet")?;
    let login = super::http_login(restored, ctx).await?;
    let db = Db::at(SocketAddr::new(ip, desired::HTTP_PORT as u16), Some(&login));
    let tables = db.tables().await.map_err(|e| e.to_string())?;
    let status = backup.status.clone().unwrap_or_default();
    let mut found = Vec::new();
    for want in &status.tables {
        let Some((name, ts)) = tables.iter().find(|(n, _)| *n == want.name) else {
            continue;
        };
        let fact = db
            .table_fact(name, ts.as_deref())
            .await
            .map_err(|e| e.to_string().chars().take(200).collect::<String>());
        found.push((name.clone(), fact));
    }
    let differ = differences(&status.tables, &found);
    Ok(if differ.is_empty() {
        (
            true,
            VerifyReason::Verified,
            format!(
                "restored into QuestDB {}: all {} tables recorded at the checkpoint hold at least their rows and newest timestamp",
                restored.name_any(),
                status.tables.len()
            ),
        )
    } else {
        (
            false,
            VerifyReason::TablesDiffer,
            format!(
                "restored into QuestDB {}, {} of {} tables differ: {}",
                restored.name_any(),
                differ.len(),
                status.tables.len(),
                differ.join("; ")
            ),
        )
    })
}

/// The source database's `BackupVerified` condition reads the backups: wake its reconcile.
fn wake_source(backup: &QuestDBBackup, bctx: &BackupContext) {
    let Some(ns) = backup.namespace() else { return };
    if let Some(wake) = &bctx.ctx.wake {
        let _ = wake.unbounded_send(
            kube::runtime::reflector::ObjectRef::new(&backup.spec.questdb_name).within(&ns),
        );
    }
}

/// The source database's `BackupVerified`, from its backups' finished verifications: the
/// newest by checkpoint decides; `None` when none of its backups was verified.
pub(crate) fn database_verdict(
    backups: &[&QuestDBBackup],
) -> Option<crate::plan::conditions::Verdict<crate::api::BackupVerifiedReason>> {
    use crate::api::BackupVerifiedReason as R;
    use crate::plan::conditions::Verdict;
    let finished = |b: &&&QuestDBBackup| {
        let s = b.status.as_ref()?;
        let v = s.verification.as_ref()?;
        matches!(v.step, Some(VerifyStep::CleaningUp | VerifyStep::Done)).then_some(())?;
        let c = s.conditions.iter().find(|c| c.type_ == VERIFIED)?;
        Some((
            s.checkpoint_at.as_ref()?.0,
            c.status == "True",
            c.message.clone(),
        ))
    };
    let mut done: Vec<(Timestamp, bool, String, String)> = backups
        .iter()
        .filter_map(|b| finished(&b).map(|(at, ok, m)| (at, ok, m, b.name_any())))
        .collect();
    done.sort_by_key(|d| std::cmp::Reverse(d.0));
    let newest = done.first()?;
    let proven = done.iter().find(|d| d.1);
    let proven_text = proven.map_or("no backup of it has been proven yet".to_string(), |p| {
        format!("the newest proven is {} (taken {})", p.3, p.0)
    });
    Some(if newest.1 {
        Verdict::new(
            true,
            R::BackupVerified,
            format!(
                "backup {} (taken {}) was proven by restoring it",
                newest.3, newest.0
            ),
        )
    } else {
        Verdict::new(
            false,
            R::VerificationFailed,
            format!(
                "backup {} (taken {}) failed its verification: {}; {proven_text}",
                newest.3, newest.0, newest.2
            ),
        )
    })
}

/// When the backup was taken, if a restore proved it (for the verified-backup gauge).
pub(crate) fn verified_at(backup: &QuestDBBackup) -> Option<i64> {
    let s = backup.status.as_ref()?;
    s.conditions
        .iter()
        .any(|c| c.type_ == VERIFIED && c.status == "True")
        .then_some(())?;
    Some(s.checkpoint_at.as_ref()?.0.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(name: &str, rows: i64, ts: Option<&str>) -> TableFacts {
        TableFacts {
            name: name.into(),
            rows,
            max_timestamp: ts.map(str::to_string),
        }
    }

    #[test]
    fn throwaway_names_are_questdb_names_of_at_most_52_characters() {
        assert_eq!(database_name("nightly-1"), "verify-nightly-1");
        assert_eq!(database_name("a.b"), "verify-a-b");
        let long = "x".repeat(200);
        let n = database_name(&long);
        assert!(n.len() <= 52, "{n}");
        assert_ne!(n, database_name(&"x".repeat(199)), "long names stay apart");
        let mut q = crate::desired::testing::questdb(&n, "ns");
        q.metadata.name = Some(n.clone());
        assert_eq!(crate::desired::validate(&q), Ok(()));
    }

    /// The harm: a backup that restores fewer rows than it recorded reported as proven.
    #[test]
    fn fewer_rows_an_older_newest_row_a_missing_or_unreadable_table_each_differ() {
        let t1 = "2026-11-28T10:00:00.000000Z";
        let t0 = "2026-11-28T09:00:00.000000Z";
        let recorded = vec![
            fact("trades", 100, Some(t1)),
            fact("quotes", 10, Some(t1)),
            fact("gone", 1, None),
            fact("broken", 5, None),
            fact("more", 5, Some(t0)),
        ];
        let restored = vec![
            ("trades".to_string(), Ok(fact("trades", 99, Some(t1)))),
            ("quotes".to_string(), Ok(fact("quotes", 10, Some(t0)))),
            ("broken".to_string(), Err("could not open".to_string())),
            ("more".to_string(), Ok(fact("more", 7, Some(t1)))),
        ];
        let d = differences(&recorded, &restored);
        assert_eq!(d.len(), 4, "{d:?}");
        assert!(d[0].starts_with("trades: 99 rows, 100"), "{d:?}");
        assert!(d[1].starts_with("quotes: newest timestamp"), "{d:?}");
        assert_eq!(d[2], "gone: missing");
        assert!(d[3].starts_with("broken: unreadable"), "{d:?}");
        let same = vec![("trades".to_string(), Ok(fact("trades", 100, Some(t1))))];
        assert!(differences(&recorded[..1], &same).is_empty());
    }

    #[test]
    fn the_throwaway_database_is_the_backups_with_no_node_no_dns_and_a_volume_that_goes_with_it() {
        let mut source = crate::desired::testing::questdb("prod", "ns");
        source.spec.volume.retain_on_delete = true;
        let mut b = QuestDBBackup::new(
            "nightly",
            crate::api::QuestDBBackupSpec {
                questdb_name: "prod".into(),
                volume_snapshot_class_name: None,
                deletion_policy: Default::default(),
                verify: true,
            },
        );
        b.metadata.namespace = Some("ns".into());
        b.metadata.uid = Some("uid-b".into());
        b.status = Some(crate::api::QuestDBBackupStatus {
            restore_size: Some("10Gi".into()),
            ..Default::default()
        });
        let q = throwaway(&b, Some(&source)).unwrap();
        assert_eq!(q.spec.image, source.spec.image);
        assert!(q.spec.node.is_none() && q.spec.dns.is_none());
        assert!(!q.spec.volume.retain_on_delete);
        assert_eq!(q.spec.volume.size, "10Gi");
        assert_eq!(
            q.spec
                .volume
                .restore_from
                .as_ref()
                .and_then(|r| r.backup.as_deref()),
            Some("nightly")
        );
        assert_eq!(q.owner_references()[0].uid, "uid-b");
        assert!(
            throwaway(&b, None).is_err(),
            "no source and no version: no image"
        );
    }
}
