//! Backups that restore, counted in rows: a real QuestDB checkpoint held while the real
//! snapshot-controller and the CSI stand-in take the volume's snapshot, then a new QuestDB
//! restored from it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::Condition;
use questdb_operator::api::{
    BackupDeletionPolicy, BackupReason, BackupStep, QuestDB, QuestDBBackup, QuestDBBackupSpec,
    RestoreSource, VerifyStep,
};
use questdb_operator::controllers::backup::{self, snapshot};
use questdb_operator::plan::backup as plan;

use crate::database::{env, lines, pod_ip, ready, real, rows_become, Credentials, NS};
use crate::db_client::{exec, ilp_http, Login};
use crate::harness::{
    condition_message, has_condition, wait_for, wait_for_within, wait_until, Env,
};
use questdb_testenv::{ControlPlaneOptions, Databases};

const BACKUP_TIMEOUT: Duration = Duration::from_secs(120);
/// A backup, then a restore of it: a second real QuestDB starting.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(240);

async fn create_backup(env: &Env, name: &str, questdb: &str) -> QuestDBBackup {
    create_backup_with(env, name, questdb, |_| {}).await
}

async fn create_backup_with(
    env: &Env,
    name: &str,
    questdb: &str,
    edit: impl FnOnce(&mut QuestDBBackupSpec),
) -> QuestDBBackup {
    let mut spec = backup_spec(questdb);
    edit(&mut spec);
    let b = QuestDBBackup::new(name, spec);
    env.api::<QuestDBBackup>(NS)
        .create(&PostParams::default(), &b)
        .await
        .expect("QuestDBBackup created")
}

/// A backup of `questdb` with every other field at its default.
pub(crate) fn backup_spec(questdb: &str) -> QuestDBBackupSpec {
    QuestDBBackupSpec {
        questdb_name: questdb.into(),
        volume_snapshot_class_name: None,
        deletion_policy: Default::default(),
        verify: false,
    }
}

fn step_is(step: BackupStep) -> impl Fn(Option<&QuestDBBackup>) -> bool {
    move |b| b.and_then(|b| b.status.as_ref()?.step) == Some(step)
}

async fn backup_reaches(env: &Env, name: &str, step: BackupStep) -> QuestDBBackup {
    wait_for_within(
        &env.api(NS),
        name,
        &format!("backup {name} {}", step.as_str()),
        BACKUP_TIMEOUT,
        step_is(step),
    )
    .await
}

async fn checkpoint_open(http: &str, login: Login<'_>) -> bool {
    let (code, body) = exec(http, "select in_progress from checkpoint_status()", login)
        .await
        .expect("checkpoint_status answers");
    assert_eq!(code, 200, "{body}");
    body.contains("[[true")
}

/// A database with `rows` acknowledged rows in `trades`; its HTTP address and credentials.
async fn database_with_rows(env: &Env, name: &str, rows: usize) -> (String, Credentials) {
    env.create_questdb(NS, name, real).await;
    ready(env, name).await;
    let creds = Credentials::of(env, &format!("{name}-credentials")).await;
    let http = format!("{}:9000", pod_ip(env, name).await);
    assert_eq!(
        ilp_http(&http, &lines("trades", rows), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(env, &http, "trades", rows as i64, creds.http()).await;
    (http, creds)
}

/// A `CHECKPOINT CREATE` by hand (as a user preparing a manual copy might), then `more`
/// acknowledged rows, `total` in all.
async fn checkpoint_by_hand_then_rows(
    env: &Env,
    http: &str,
    creds: &Credentials,
    more: usize,
    total: i64,
) {
    let (code, body) = exec(http, "CHECKPOINT CREATE", creds.http()).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        ilp_http(http, &lines("trades", more), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(env, http, "trades", total, creds.http()).await;
}

/// A new QuestDB `name` restored from `backup`, Ready; its HTTP address and credentials.
async fn restored_from(env: &Env, backup: &str, name: &str) -> (QuestDB, String, Credentials) {
    env.create_questdb(NS, name, |q| {
        real(q);
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: Some(backup.into()),
            volume_snapshot: None,
        });
    })
    .await;
    let restored = ready(env, name).await;
    let creds = Credentials::of(env, &format!("{name}-credentials")).await;
    let http = format!("{}:9000", pod_ip(env, name).await);
    (restored, http, creds)
}

#[tokio::test]
async fn a_restored_backup_holds_exactly_the_rows_acknowledged_before_it_and_none_after() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 1000).await;

    create_backup(&env, "b1", "db1").await;
    let b = backup_reaches(&env, "b1", BackupStep::Succeeded).await;
    let status = b.status.clone().unwrap_or_default();
    let trades = status.tables.iter().find(|t| t.name == "trades");
    assert_eq!(trades.map(|t| t.rows), Some(1000), "{:?}", status.tables);
    assert_eq!(status.snapshot_name.as_deref(), Some("b1"));
    assert!(status.restore_size.is_some());
    assert_eq!(env.cp.ebs_snapshots().len(), 1, "one snapshot per backup");
    assert!(
        !checkpoint_open(&http, creds.http()).await,
        "the checkpoint is released once the backup is done"
    );

    // Written after the backup: not in it.
    assert_eq!(
        ilp_http(&http, &lines("trades", 500), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(&env, &http, "trades", 1500, creds.http()).await;

    let (restored, http2, creds2) = restored_from(&env, "b1", "db2").await;
    assert!(has_condition("VolumeRestored", "Restored").matches_object(Some(&restored)));
    wait_until("the restored database counts the backup's rows", || {
        let http2 = http2.clone();
        let login = creds2.http().map(|(u, p)| (u.to_string(), p.to_string()));
        async move {
            let login = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
            crate::db_client::count(&http2, "trades", login).await == Some(1000)
        }
    })
    .await;
    // Restored from the checkpoint (the state at CHECKPOINT CREATE), not from whatever the
    // volume held when it was copied.
    let recovery = env.cp.database_log_lines(NS, "db2-0", "checkpoint");
    assert!(
        recovery
            .iter()
            .any(|l| l.contains("starting checkpoint recovery")),
        "{recovery:?}"
    );
    // The source is untouched.
    rows_become(&env, &http, "trades", 1500, creds.http()).await;
}

#[tokio::test]
async fn a_backup_goes_on_after_a_manager_restart_and_deleting_it_takes_its_snapshot() {
    let mut env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 100).await;
    env.cp.csi.stall_snapshot.store(true, Ordering::SeqCst);

    create_backup_with(&env, "stuck", "db1", |s| {
        s.deletion_policy = BackupDeletionPolicy::Delete
    })
    .await;
    // The stalled snapshot is cut (EBS: pending, point in time fixed) but never ready.
    backup_reaches(&env, "stuck", BackupStep::Uploading).await;
    assert!(
        !checkpoint_open(&http, creds.http()).await,
        "released once cut"
    );

    env.cp.csi.stall_snapshot.store(false, Ordering::SeqCst);
    backup_reaches(&env, "stuck", BackupStep::Succeeded).await;

    // Restart in the middle of a backup: the new manager finds the step and goes on.
    env.cp.csi.stall_snapshot.store(true, Ordering::SeqCst);
    create_backup(&env, "second", "db1").await;
    backup_reaches(&env, "second", BackupStep::Uploading).await;
    env.restart_manager(Default::default()).await;
    env.cp.csi.stall_snapshot.store(false, Ordering::SeqCst);
    backup_reaches(&env, "second", BackupStep::Succeeded).await;
    assert_eq!(env.cp.ebs_snapshots().len(), 2, "one snapshot per backup");

    // Deleting a backup (Delete policy) takes its snapshot.
    env.api::<QuestDBBackup>(NS)
        .delete("stuck", &DeleteParams::default())
        .await
        .expect("deleted");
    wait_until("the deleted backup's snapshot is gone", || {
        let api = snapshot::api(&env.cp.direct_client(), NS);
        async move { api.get_opt("stuck").await.ok().flatten().is_none() }
    })
    .await;
    wait_until("its EBS snapshot is deleted", || {
        let n = env.cp.ebs_snapshots().len();
        async move { n == 1 }
    })
    .await;

    // A backup made by hand keeps its snapshot by default: deleting the object by mistake
    // loses no data, and the snapshot still restores (restoreFrom.volumeSnapshot).
    env.api::<QuestDBBackup>(NS)
        .delete("second", &DeleteParams::default())
        .await
        .expect("deleted");
    wait_until("the backup is gone", || {
        let api = env.api::<QuestDBBackup>(NS);
        async move { api.get_opt("second").await.ok().flatten().is_none() }
    })
    .await;
    let kept = snapshot::api(&env.cp.direct_client(), NS)
        .get_opt("second")
        .await
        .expect("read the snapshot");
    assert!(kept.is_some(), "a retained backup's snapshot outlives it");
    assert_eq!(env.cp.ebs_snapshots().len(), 1, "its EBS snapshot too");
}

#[tokio::test]
async fn a_failed_snapshot_fails_the_backup_releases_the_checkpoint_and_leaves_no_snapshot() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 10).await;
    env.cp.csi.fail_snapshot.store(true, Ordering::SeqCst);
    create_backup(&env, "bad", "db1").await;
    let b = backup_reaches(&env, "bad", BackupStep::Failed).await;
    let status = b.status.unwrap_or_default();
    assert_eq!(
        status.reason.as_deref(),
        Some(BackupReason::SnapshotFailed.as_str())
    );
    assert!(
        status.message.unwrap_or_default().contains("injected"),
        "the storage's own message is shown"
    );
    assert!(!checkpoint_open(&http, creds.http()).await);
    wait_until("the failed backup's snapshot is deleted", || {
        let api = snapshot::api(&env.cp.direct_client(), NS);
        async move { api.get_opt("bad").await.ok().flatten().is_none() }
    })
    .await;
}

#[tokio::test]
async fn restoring_over_an_existing_volume_is_refused_and_the_database_never_starts() {
    let env = env().await;
    // A claim of the name the restored database would use, made by someone else.
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db3-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    env.api::<PersistentVolumeClaim>(NS)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    env.create_questdb(NS, "db3", |q| {
        real(q);
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: None,
            volume_snapshot: Some("nightly".into()),
        });
    })
    .await;
    wait_for(
        &env.api::<QuestDB>(NS),
        "db3",
        "VolumeRestored=False RestoreRefused",
        has_condition("VolumeRestored", "RestoreRefused"),
    )
    .await;
    let q: QuestDB = env.api(NS).get("db3").await.unwrap();
    assert!(
        has_condition("Ready", "RestoreRefused").matches_object(Some(&q)),
        "Ready says why nothing runs: {:?}",
        q.status.map(|s| s.conditions)
    );
    let sts: Option<StatefulSet> = env.api(NS).get_opt("db3").await.unwrap();
    assert!(
        sts.is_none(),
        "no database runs on a volume it was not restored into"
    );

    // And a restore whose backup does not exist says so.
    env.create_questdb(NS, "db4", |q| {
        real(q);
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: Some("never-made".into()),
            volume_snapshot: None,
        });
    })
    .await;
    wait_for(
        &env.api::<QuestDB>(NS),
        "db4",
        "VolumeRestored=False RestoreSourceNotFound",
        has_condition("VolumeRestored", "RestoreSourceNotFound"),
    )
    .await;
    let claim: Option<PersistentVolumeClaim> = env.api(NS).get_opt("db4-data").await.unwrap();
    assert!(claim.is_none(), "no empty volume is made in its place");

    // A name reused for a second restore drill: the first drill's retained claim was made from
    // Monday's snapshot, and this restore asks for Friday's. Serving Monday's data as Friday's
    // restore is refused, naming both.
    let monday: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db5-data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "monday"},
        },
    }))
    .unwrap();
    env.api::<PersistentVolumeClaim>(NS)
        .create(&PostParams::default(), &monday)
        .await
        .unwrap();
    env.create_questdb(NS, "db5", |q| {
        real(q);
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: None,
            volume_snapshot: Some("friday".into()),
        });
    })
    .await;
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db5",
        "VolumeRestored=False RestoreRefused for another snapshot's volume",
        has_condition("VolumeRestored", "RestoreRefused"),
    )
    .await;
    let message = crate::harness::condition_message(&q, "VolumeRestored");
    assert!(
        message.contains("monday") && message.contains("friday"),
        "{message}"
    );
    let sts: Option<StatefulSet> = env.api(NS).get_opt("db5").await.unwrap();
    assert!(sts.is_none(), "no database runs on another backup's data");
}

#[tokio::test]
async fn a_schedule_every_minute_keeps_exactly_its_two_newest_successful_backups() {
    use questdb_operator::api::{QuestDBBackupSchedule, QuestDBBackupScheduleSpec, SCHEDULE_LABEL};
    let env = env().await;
    database_with_rows(&env, "db1", 10).await;
    let schedule = QuestDBBackupSchedule::new(
        "every-minute",
        QuestDBBackupScheduleSpec {
            questdb_name: "db1".into(),
            schedule: "* * * * *".into(),
            retention: 2,
            retention_days: None,
            suspend: false,
            starting_deadline_seconds: None,
            volume_snapshot_class_name: None,
            deletion_policy: BackupDeletionPolicy::Delete,
            verify_every: None,
        },
    );
    env.api::<QuestDBBackupSchedule>(NS)
        .create(&PostParams::default(), &schedule)
        .await
        .expect("schedule created");

    // Three runs at least (one a minute), then exactly the newest two, both Succeeded.
    let api = env.api::<QuestDBBackup>(NS);
    let lp = kube::api::ListParams::default().labels(&format!("{SCHEDULE_LABEL}=every-minute"));
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(330);
    let kept = loop {
        let list = api.list(&lp).await.expect("list backups").items;
        seen.extend(list.iter().map(kube::ResourceExt::name_any));
        let all_ok = list.iter().all(|b| step_is(BackupStep::Succeeded)(Some(b)));
        if seen.len() >= 3 && list.len() == 2 && all_ok {
            break list;
        }
        assert!(
            list.len() <= 3,
            "retention lets at most one more than 2 exist (the run being made): {:?}",
            list.iter()
                .map(kube::ResourceExt::name_any)
                .collect::<Vec<_>>()
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 330 s: seen {seen:?}, now {:?}",
            list.iter()
                .map(|b| (
                    kube::ResourceExt::name_any(b),
                    b.status.as_ref().and_then(|s| s.step)
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut names: Vec<String> = kept.iter().map(kube::ResourceExt::name_any).collect();
    names.sort();
    let mut newest: Vec<String> = seen.iter().cloned().collect();
    newest.sort();
    assert_eq!(names, newest[newest.len() - 2..], "the newest two are kept");
    wait_until("the deleted backups' snapshots are gone", || {
        let n = env.cp.ebs_snapshots().len();
        async move { n == 2 }
    })
    .await;

    // Deleting the schedule (by mistake, or a GitOps prune) keeps the backups it made.
    env.api::<QuestDBBackupSchedule>(NS)
        .delete("every-minute", &DeleteParams::default())
        .await
        .expect("schedule deleted");
    wait_until("the schedule is gone", || {
        let api = env.api::<QuestDBBackupSchedule>(NS);
        async move { api.get_opt("every-minute").await.ok().flatten().is_none() }
    })
    .await;
    // The garbage collector deletes only what names the schedule as its owner: no backup
    // does (the check that fails on the old code), so none goes, now or later.
    let after = api.list(&lp).await.expect("list backups").items;
    assert_eq!(after.len(), 2, "the schedule's backups outlive it");
    assert!(
        after
            .iter()
            .all(|b| kube::ResourceExt::owner_references(b).is_empty()),
        "no backup is owned by the schedule"
    );
    assert_eq!(env.cp.ebs_snapshots().len(), 2);
}

#[tokio::test]
async fn killing_the_manager_at_every_backup_step_still_releases_the_checkpoint_once_with_one_snapshot(
) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let mut env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 200).await;
    // Slow enough for the watch to see each step before the next.
    env.cp.csi.stall_snapshot.store(true, Ordering::SeqCst);
    create_backup(&env, "b1", "db1").await;

    let cfg = watcher::Config::default().fields("metadata.name=b1");
    let mut events = std::pin::pin!(watcher(env.api::<QuestDBBackup>(NS), cfg).applied_objects());
    let mut killed = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + BACKUP_TIMEOUT;
    loop {
        let b = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("Succeeded in time; killed in {killed:?}"))
            .expect("watch open")
            .expect("watch event");
        let Some(step) = b.status.as_ref().and_then(|s| s.step) else {
            continue;
        };
        match step {
            BackupStep::Succeeded => break,
            BackupStep::Failed => panic!("{:?}", b.status),
            // The snapshot is cut: interrupted once more, then let it finish (nothing is
            // written while it uploads, so no later event would come).
            BackupStep::Uploading => {
                if killed.insert(step.as_str().to_string()) {
                    env.kill_and_restart_manager(Default::default()).await;
                }
                env.cp.csi.stall_snapshot.store(false, Ordering::SeqCst);
            }
            _ if killed.insert(step.as_str().to_string()) => {
                env.kill_and_restart_manager(Default::default()).await;
            }
            _ => {}
        }
    }
    assert!(
        ["Checkpointing", "Snapshotting", "Uploading"]
            .iter()
            .all(|s| killed.contains(*s)),
        "killed in {killed:?}"
    );
    assert!(!checkpoint_open(&http, creds.http()).await, "released");
    assert_eq!(
        env.cp.ebs_snapshots().len(),
        1,
        "one snapshot for one backup"
    );
    let b: QuestDBBackup = env.api(NS).get("b1").await.unwrap();
    let trades = b.status.unwrap_or_default().tables;
    assert_eq!(
        trades.iter().find(|t| t.name == "trades").map(|t| t.rows),
        Some(200)
    );
}

#[tokio::test]
async fn a_backup_taken_under_write_load_restores_whole_batches_and_writable_tables() {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;
    const BATCH: usize = 200;
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", BATCH).await;
    let login = creds.http().map(|(u, p)| (u.to_string(), p.to_string()));

    // One writer, batch after batch (each ILP/HTTP request is one transaction), until told.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(BATCH));
    let writer = {
        let (stop, acked, http, login) = (stop.clone(), acked.clone(), http.clone(), login.clone());
        tokio::spawn(async move {
            let login = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
            while !stop.load(Ordering::SeqCst) {
                if ilp_http(&http, &lines("trades", BATCH), login).await.ok() == Some(204) {
                    acked.fetch_add(BATCH, Ordering::SeqCst);
                }
            }
        })
    };
    wait_until("the writer is under way", || {
        let n = acked.load(Ordering::SeqCst);
        async move { n >= 5 * BATCH }
    })
    .await;
    create_backup(&env, "hot", "db1").await;
    let b = backup_reaches(&env, "hot", BackupStep::Succeeded).await;
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let total = acked.load(Ordering::SeqCst) as i64;
    rows_become(&env, &http, "trades", total, creds.http()).await;
    let before = b
        .status
        .unwrap_or_default()
        .tables
        .into_iter()
        .find(|t| t.name == "trades")
        .map(|t| t.rows)
        .expect("trades counted at checkpoint time");

    env.create_questdb(NS, "db2", |q| {
        real(q);
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: Some("hot".into()),
            volume_snapshot: None,
        });
    })
    .await;
    ready(&env, "db2").await;
    let creds2 = Credentials::of(&env, "db2-credentials").await;
    let http2 = format!("{}:9000", pod_ip(&env, "db2").await);
    // WAL applied and nothing suspended before counting.
    wait_until(
        "the restored database's WAL is applied and writable",
        || {
            let (http2, login) = (
                http2.clone(),
                creds2.http().map(|(u, p)| (u.to_string(), p.to_string())),
            );
            async move {
                let login = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
                let Ok((200, body)) = exec(
                    &http2,
                    "select count() from wal_tables() where suspended or writerTxn != sequencerTxn",
                    login,
                )
                .await
                else {
                    return false;
                };
                body.contains("[[0]]")
            }
        },
    )
    .await;
    let restored = crate::db_client::count(&http2, "trades", creds2.http())
        .await
        .expect("the restored table is readable");
    eprintln!("under load: {before} rows counted before the checkpoint, {restored} restored, {total} acknowledged");
    assert!(
        before <= restored && restored <= total,
        "restored {restored} rows: at least the {before} counted before the checkpoint, at most the {total} acknowledged"
    );
    assert_eq!(
        restored % BATCH as i64,
        0,
        "{restored} rows: a batch is restored whole or not at all"
    );
    // And it takes writes.
    assert_eq!(
        ilp_http(&http2, &lines("trades", 1), creds2.http())
            .await
            .unwrap(),
        204
    );
    rows_become(&env, &http2, "trades", restored + 1, creds2.http()).await;
}

/// A checkpoint left open on a volume (its database deleted mid-backup) must never roll a
/// later database on that same volume back to it: a QuestDB recreated under the same name
/// adopts the retained claim and counts every row acknowledged before the deletion.
#[tokio::test]
async fn a_recreated_database_on_a_retained_volume_never_rolls_back_to_a_checkpoint_left_open() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 300).await;
    checkpoint_by_hand_then_rows(&env, &http, &creds, 200, 500).await;

    let qdbs = env.api::<QuestDB>(NS);
    qdbs.delete("db1", &DeleteParams::default()).await.unwrap();
    wait_until("db1 and its pod are gone", || {
        let (qdbs, pods) = (qdbs.clone(), env.api::<k8s_openapi::api::core::v1::Pod>(NS));
        async move {
            qdbs.get_opt("db1").await.ok().flatten().is_none()
                && pods.get_opt("db1-0").await.ok().flatten().is_none()
        }
    })
    .await;
    env.create_questdb(NS, "db1", real).await;
    ready(&env, "db1").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    let creds = Credentials::of(&env, "db1-credentials").await;
    rows_become(&env, &http, "trades", 500, creds.http()).await;
    let recovered = env
        .cp
        .database_log_lines(NS, "db1-0", "checkpoint recovery");
    assert!(recovered.is_empty(), "{recovered:?}");
}

/// The harm (tried by hand): a backup said Succeeded and restored 5,000 of 8,000 acknowledged
/// rows, because it took a checkpoint a user had opened by hand before the last 3,000 as its
/// own. A backup never takes over a checkpoint it did not open: it waits, saying whose it is
/// not and since when, and once the user releases it the backup opens its own and its restore
/// counts every row acknowledged before it.
#[tokio::test]
async fn a_checkpoint_opened_by_hand_is_never_taken_over_and_the_backup_holds_every_row() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 5000).await;
    checkpoint_by_hand_then_rows(&env, &http, &creds, 3000, 8000).await;

    create_backup(&env, "b1", "db1").await;
    let waiting = wait_for_within(
        &env.api::<QuestDBBackup>(NS),
        "b1",
        "backup b1 waits on the checkpoint it did not open",
        BACKUP_TIMEOUT,
        |b: Option<&QuestDBBackup>| {
            b.and_then(|b| b.status.as_ref()?.reason.clone()).as_deref()
                == Some("ForeignCheckpoint")
        },
    )
    .await;
    let status = waiting.status.unwrap_or_default();
    assert_eq!(status.step, Some(BackupStep::Pending), "{status:?}");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("did not open")),
        "{status:?}"
    );
    assert!(env.cp.ebs_snapshots().is_empty(), "nothing was cut");
    assert!(
        checkpoint_open(&http, creds.http()).await,
        "the user's checkpoint is theirs: the backup left it open"
    );

    let (code, body) = exec(&http, "CHECKPOINT RELEASE", creds.http())
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let b = backup_reaches(&env, "b1", BackupStep::Succeeded).await;
    let status = b.status.unwrap_or_default();
    let trades = status.tables.iter().find(|t| t.name == "trades");
    assert_eq!(trades.map(|t| t.rows), Some(8000), "{:?}", status.tables);
    assert!(status.checkpoint_started_at.is_some(), "{status:?}");
    assert!(!checkpoint_open(&http, creds.http()).await);

    let (_, http2, creds2) = restored_from(&env, "b1", "db2").await;
    rows_become(&env, &http2, "trades", 8000, creds2.http()).await;
}

fn verified(b: Option<&QuestDBBackup>) -> Option<(String, String)> {
    let s = b?.status.as_ref()?;
    let done = s.verification.as_ref()?.step == Some(VerifyStep::Done);
    let c = s.conditions.iter().find(|c| c.type_ == "Verified")?;
    done.then(|| (c.status.clone(), c.message.clone()))
}

/// The harm: a backup that says Succeeded but does not restore (its snapshot damaged in
/// storage, a table left out) is found at the disaster, not before. A verified backup is
/// restored into a throwaway database, its tables counted against what was recorded at the
/// checkpoint, and the throwaway removed; a snapshot with one table's files truncated is
/// `Verified=False` naming that table, and the database's `BackupVerified` says so.
#[tokio::test]
async fn a_verified_backup_is_proven_by_restoring_it_and_a_damaged_one_names_its_table() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 300).await;
    assert_eq!(
        ilp_http(&http, &lines("quotes", 40), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(&env, &http, "quotes", 40, creds.http()).await;
    let backups = env.api::<QuestDBBackup>(NS);

    create_backup_with(&env, "good", "db1", |s| s.verify = true).await;
    let good = wait_for_within(
        &backups,
        "good",
        "good verified",
        VERIFY_TIMEOUT,
        |b: Option<&QuestDBBackup>| verified(b).is_some(),
    )
    .await;
    let (status, message) = verified(Some(&good)).unwrap();
    assert_eq!(status, "True", "{message}");
    let checked = good.status.as_ref().and_then(|s| s.verification.clone());
    assert_eq!(checked.and_then(|v| v.tables_checked), Some(2));
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "BackupVerified=True",
        has_condition("BackupVerified", "BackupVerified"),
    )
    .await;
    assert!(condition_message(&q, "BackupVerified").contains("good"));
    wait_until("the throwaway database and its volume are gone", || {
        let (qdbs, pvcs) = (env.api::<QuestDB>(NS), env.api::<PersistentVolumeClaim>(NS));
        async move {
            qdbs.get_opt("verify-good").await.ok().flatten().is_none()
                && pvcs
                    .get_opt("verify-good-data")
                    .await
                    .ok()
                    .flatten()
                    .is_none()
        }
    })
    .await;

    *env.cp.csi.corrupt_table_in_snapshots.lock().unwrap() = Some("quotes".into());
    create_backup_with(&env, "damaged", "db1", |s| s.verify = true).await;
    let damaged = wait_for_within(
        &backups,
        "damaged",
        "damaged verified",
        VERIFY_TIMEOUT,
        |b: Option<&QuestDBBackup>| verified(b).is_some(),
    )
    .await;
    let (status, message) = verified(Some(&damaged)).unwrap();
    assert_eq!(status, "False", "{message}");
    assert!(message.contains("quotes"), "{message}");
    assert!(
        !message.contains("trades:"),
        "the whole table is fine: {message}"
    );
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "BackupVerified=False",
        has_condition("BackupVerified", "VerificationFailed"),
    )
    .await;
    let message = condition_message(&q, "BackupVerified");
    assert!(
        message.contains("damaged") && message.contains("good"),
        "names the failed one and the newest proven: {message}"
    );

    // A colliding name: a user's own QuestDB already called `verify-<backup>` is never taken
    // over nor deleted; the verification fails saying so.
    *env.cp.csi.corrupt_table_in_snapshots.lock().unwrap() = None;
    env.create_questdb(NS, "verify-clash", |q| {
        real(q);
        q.spec.paused = true;
    })
    .await;
    let users = env.api::<QuestDB>(NS).get("verify-clash").await.unwrap();
    create_backup_with(&env, "clash", "db1", |s| s.verify = true).await;
    let clash = wait_for_within(
        &backups,
        "clash",
        "clash verified",
        VERIFY_TIMEOUT,
        |b: Option<&QuestDBBackup>| verified(b).is_some(),
    )
    .await;
    let (status, message) = verified(Some(&clash)).unwrap();
    assert_eq!(status, "False", "{message}");
    assert!(message.contains("not this backup's"), "{message}");
    let still = env.api::<QuestDB>(NS).get("verify-clash").await.unwrap();
    assert_eq!(
        still.metadata.uid, users.metadata.uid,
        "the user's QuestDB is left alone"
    );
    assert!(still.metadata.deletion_timestamp.is_none());
}

/// The harm: a checkpoint left open keeps every WAL segment and old partition until the disk
/// fills. One a person opened is reported and never released by the operator; one the
/// operator's own backup left (its status names its `started_at`) is released.
#[tokio::test]
async fn a_checkpoint_left_open_is_reported_and_released_only_when_the_operators() {
    use questdb_operator::manager::ManagerOptions;
    use questdb_operator::plan::backup::Timeouts;
    let options = ControlPlaneOptions {
        databases: Databases::Real,
        ..crate::harness::cluster()
    };
    let metrics_addr = crate::metrics::free_port();
    let opts = ManagerOptions {
        metrics_addr: Some(metrics_addr),
        write_health_interval: Duration::from_secs(1),
        backup_timeouts: Timeouts {
            cut: Duration::from_secs(3),
            ..Default::default()
        },
        ..Default::default()
    };
    let env = Env::start_on(options, opts, crate::harness::questdb_crd()).await;
    env.namespace(NS).await;
    let (http, creds) = database_with_rows(&env, "db1", 10).await;

    let (code, body) = exec(&http, "CHECKPOINT CREATE", creds.http())
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "CheckpointReleased=False",
        has_condition("CheckpointReleased", "CheckpointLeftOpen"),
    )
    .await;
    assert!(
        condition_message(&q, "CheckpointReleased").contains("CHECKPOINT RELEASE"),
        "{}",
        condition_message(&q, "CheckpointReleased")
    );
    let (_, scrape) = crate::metrics::get(metrics_addr, "/metrics").await;
    let open_seconds = scrape
        .lines()
        .find(|l| {
            l.starts_with("questdb_operator_checkpoint_open_seconds{")
                && l.contains("questdb=\"db1\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(open_seconds.is_some_and(|s| s >= 3.0), "{open_seconds:?}");
    assert!(
        checkpoint_open(&http, creds.http()).await,
        "a person's checkpoint is never released by the operator"
    );

    // The operator's own: a backup that failed with its checkpoint recorded as open.
    let (_, body) = exec(
        &http,
        "select started_at from checkpoint_status()",
        creds.http(),
    )
    .await
    .unwrap();
    let started_at: serde_json::Value = serde_json::from_str(&body).unwrap();
    let started_at = started_at["dataset"][0][0].as_str().unwrap().to_string();
    create_backup(&env, "lost", "db1").await;
    wait_for_within(
        &env.api::<QuestDBBackup>(NS),
        "lost",
        "lost waits",
        BACKUP_TIMEOUT,
        |b: Option<&QuestDBBackup>| {
            b.and_then(|b| b.status.as_ref()?.reason.clone()).as_deref()
                == Some("ForeignCheckpoint")
        },
    )
    .await;
    let patch = serde_json::json!({"status": {
        "step": "Failed",
        "reason": "CheckpointLost",
        "checkpointStartedAt": started_at,
    }});
    env.api::<QuestDBBackup>(NS)
        .patch_status(
            "lost",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("status patched");
    wait_until("the operator releases its own checkpoint", || {
        let (http, creds) = (http.clone(), creds.http());
        async move { !checkpoint_open(&http, creds).await }
    })
    .await;
    wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "CheckpointReleased=True",
        has_condition("CheckpointReleased", "NoCheckpointOpen"),
    )
    .await;
}

/// The harm: QuestDB 9.1 opening data 9.2 wrote (QuestDB supports no downgrade). An image
/// older than the data's version is refused and the database keeps running as it was; a
/// restore of a 9.2 backup into 9.1 is refused naming both versions.
#[tokio::test]
async fn an_image_downgrade_and_a_restore_into_an_older_version_are_refused() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 20).await;
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "dataVersion",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.data_version.clone())
                .is_some()
        },
    )
    .await;
    let version = q.status.unwrap().data_version.unwrap();
    assert_eq!(version, crate::database::VERSION);

    env.api::<QuestDB>(NS)
        .patch(
            "db1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"image": "questdb/questdb:9.1.0"}}),
            ),
        )
        .await
        .expect("patched");
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "SpecValid=False",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "SpecValid" && c.status == "False")
            })
        },
    )
    .await;
    let message = condition_message(&q, "SpecValid");
    assert!(
        message.contains("9.1.0") && message.contains(&version),
        "{message}"
    );
    let sts: StatefulSet = env.api(NS).get("db1").await.unwrap();
    let image = sts.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(
        image.as_deref(),
        Some(format!("questdb/questdb:{version}").as_str())
    );
    rows_become(&env, &http, "trades", 20, creds.http()).await;

    create_backup(&env, "b1", "db1").await;
    let b = backup_reaches(&env, "b1", BackupStep::Succeeded).await;
    assert_eq!(
        b.status.unwrap().questdb_version.as_deref(),
        Some(version.as_str())
    );
    env.create_questdb(NS, "older", |q| {
        q.spec.image = "questdb/questdb:9.1.0".into();
        q.spec.volume.restore_from = Some(RestoreSource {
            backup: Some("b1".into()),
            volume_snapshot: None,
        });
    })
    .await;
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "older",
        "RestoreRefused",
        has_condition("VolumeRestored", "RestoreRefused"),
    )
    .await;
    let message = condition_message(&q, "VolumeRestored");
    assert!(
        message.contains("9.1.0") && message.contains(&version),
        "{message}"
    );
    let pvc: Option<PersistentVolumeClaim> = env.api(NS).get_opt("older-data").await.unwrap();
    assert!(pvc.is_none(), "no volume is made for a refused restore");
}

/// The harm: a snapshot cut after the database restarted holds a `.checkpoint` no process
/// holds any more, which a restore would silently roll back to. A restart between `CHECKPOINT
/// CREATE` and the cut fails the backup (`CheckpointLost`), leaves no checkpoint open in the
/// new process and no snapshot behind.
#[tokio::test]
async fn a_restart_between_the_checkpoint_and_the_cut_fails_the_backup_and_leaves_nothing() {
    let env = env().await;
    database_with_rows(&env, "db1", 50).await;
    env.cp.csi.hold_cut.store(true, Ordering::SeqCst);
    create_backup_with(&env, "b1", "db1", |s| {
        s.deletion_policy = BackupDeletionPolicy::Retain
    })
    .await;
    backup_reaches(&env, "b1", BackupStep::Snapshotting).await;

    let pods = env.api::<k8s_openapi::api::core::v1::Pod>(NS);
    let old = pods.get("db1-0").await.unwrap();
    pods.delete("db1-0", &DeleteParams::default())
        .await
        .expect("pod deleted");
    wait_until("a new database process", || {
        let pods = pods.clone();
        let old_uid = old.metadata.uid.clone();
        async move {
            pods.get_opt("db1-0")
                .await
                .ok()
                .flatten()
                .is_some_and(|p| p.metadata.uid != old_uid)
        }
    })
    .await;
    ready(&env, "db1").await;
    env.cp.csi.hold_cut.store(false, Ordering::SeqCst);

    let b = backup_reaches(&env, "b1", BackupStep::Failed).await;
    let status = b.status.unwrap_or_default();
    assert_eq!(
        status.reason.as_deref(),
        Some("CheckpointLost"),
        "{status:?}"
    );
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert!(!checkpoint_open(&http, creds.http()).await);
    wait_until("no snapshot is left, even with Retain", || {
        let api = snapshot::api(&env.cp.direct_client(), NS);
        async move { api.get_opt("b1").await.ok().flatten().is_none() }
    })
    .await;
    assert!(env.cp.ebs_snapshots().is_empty(), "nothing was cut");
}

/// The harm: a checkpoint left open because the database only looked unavailable (its pod
/// not Ready while its node reports NotReady, the process still running): QuestDB then purges
/// nothing until the disk fills. The release asks the process, not the pod's readiness, so a
/// minute after the fault heals no checkpoint is open.
#[tokio::test]
async fn a_database_not_ready_at_the_cut_still_has_its_checkpoint_released() {
    let env = env().await;
    let (http, creds) = database_with_rows(&env, "db1", 50).await;
    env.cp.csi.hold_cut.store(true, Ordering::SeqCst);
    create_backup(&env, "b1", "db1").await;
    backup_reaches(&env, "b1", BackupStep::Snapshotting).await;
    assert!(checkpoint_open(&http, creds.http()).await);

    let pods = env.api::<k8s_openapi::api::core::v1::Pod>(NS);
    let node = pods
        .get("db1-0")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("scheduled");
    let kubelet = env.cp.node(&node).expect("kubelet");
    kubelet.set_fault(questdb_testenv::NodeFault::NotReady);
    // A NotReady node's pods are evicted by its NoExecute taint (15 s here); its kubelet skips
    // pod syncs, so the process runs on in a pod that looks gone.
    wait_for(
        &pods,
        "db1-0",
        "the database pod not Ready or being evicted",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| {
                p.metadata.deletion_timestamp.is_some()
                    || p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "False")
                        })
            })
        },
    )
    .await;
    env.cp.csi.hold_cut.store(false, Ordering::SeqCst);
    wait_until("the backup is past its checkpoint", || {
        let api = env.api::<QuestDBBackup>(NS);
        async move {
            api.get_opt("b1")
                .await
                .ok()
                .flatten()
                .and_then(|b| b.status?.step)
                .is_some_and(|s| !s.holds_checkpoint() && s != BackupStep::Pending)
        }
    })
    .await;
    // Released while the pod is still not Ready: the backup asked the process itself.
    assert!(
        !checkpoint_open(&http, creds.http()).await,
        "the checkpoint was released while the pod was not Ready"
    );
    kubelet.set_fault(questdb_testenv::NodeFault::None);
    let b = wait_for_within(
        &env.api::<QuestDBBackup>(NS),
        "b1",
        "b1 final",
        BACKUP_TIMEOUT,
        |b: Option<&QuestDBBackup>| {
            b.and_then(|b| b.status.as_ref()?.step)
                .is_some_and(BackupStep::is_final)
        },
    )
    .await;
    assert_eq!(
        b.status.and_then(|s| s.step),
        Some(BackupStep::Succeeded),
        "the same process held its checkpoint through the cut"
    );
    // (Once the fault heals the kubelet carries out the taint's eviction: the process that
    // held the checkpoint ends, so there is nothing left to ask.)
}

/// A backup of `questdb` in [`NS`], from its creation to `Succeeded`: how long it took.
async fn timed_backup(env: &Env, name: &str, questdb: &str) -> Duration {
    let started = std::time::Instant::now();
    create_backup(env, name, questdb).await;
    backup_reaches(env, name, BackupStep::Succeeded).await;
    started.elapsed()
}

/// The backup workers are shared by every tenant: one tenant's 500 backups that cannot run
/// (its database is paused, so each waits and is looked at again every poll) must not hold
/// back another tenant's backup beyond twice its normal time.
#[tokio::test]
async fn five_hundred_waiting_backups_of_one_tenant_do_not_hold_back_another_tenants_backup() {
    use futures::StreamExt;
    const NOISY: &str = "tenant-noisy";
    const WAITING: usize = 500;
    let env = env().await;
    database_with_rows(&env, "db1", 10).await;
    // Normal: the faster of two (the first pays for warming the caches and the snapshot class).
    let normal = timed_backup(&env, "normal-1", "db1")
        .await
        .min(timed_backup(&env, "normal-2", "db1").await);

    env.namespace(NOISY).await;
    env.create_questdb(NOISY, "hog", |q| {
        real(q);
        q.spec.paused = true;
    })
    .await;
    let api = env.api::<QuestDBBackup>(NOISY);
    let created = futures::stream::iter(0..WAITING)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &QuestDBBackup::new(&format!("hog-{i:03}"), backup_spec("hog")),
                )
                .await
                .is_ok()
            }
        })
        .buffer_unordered(16)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    assert_eq!(created, WAITING);
    // While the operator takes the 500 in (a status write each): printed, not asserted (on two
    // loaded cores it reached 2.2x; see the issue note).
    let during_intake = timed_backup(&env, "during-intake", "db1").await;
    let pending = |list: &kube::core::ObjectList<QuestDBBackup>| {
        list.items
            .iter()
            .filter(|b| b.status.as_ref().and_then(|s| s.step) == Some(BackupStep::Pending))
            .count()
    };
    wait_until("the noisy tenant's 500 backups are all waiting", || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .is_ok_and(|l| pending(&l) == WAITING)
        }
    })
    .await;
    // The tenant holding its 500 waiting backups. What they cost the shared workers meanwhile
    // is counted in reconciles (a 10 s poll of each cost about 50 a second: about 150 in a
    // 3 s backup); the time it takes is printed (on two loaded cores it varies with whatever
    // else runs, so it is a figure, not the assertion).
    let reconciles_before = backup_reconciles(&env);
    let held = timed_backup(&env, "loaded", "db1").await;
    let reconciles_during = backup_reconciles(&env) - reconciles_before;
    let still = pending(&api.list(&Default::default()).await.expect("noisy backups"));
    eprintln!(
        "another tenant's backup: normal {:.1}s, during the intake of {WAITING} backups {:.1}s, beside {WAITING} waiting {:.1}s ({reconciles_during} backup reconciles meanwhile, its own included)",
        normal.as_secs_f64(),
        during_intake.as_secs_f64(),
        held.as_secs_f64()
    );
    assert_eq!(
        still, WAITING,
        "the noisy tenant's backups waited meanwhile"
    );
    // The other tenant's backup takes about five of its own (one per step and snapshot poll).
    assert!(
        reconciles_during < 40,
        "{reconciles_during} backup reconciles while another tenant's backup ran beside {WAITING} waiting ones: the waiting ones are being polled"
    );
}

/// How many reconciles the backup controller has run.
fn backup_reconciles(env: &Env) -> u64 {
    env.handle
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{"))
        .filter(|l| l.contains(&format!("controller=\"{}\"", backup::CONTROLLER_NAME)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The harm: a backup asked for while its database was paused, or queued behind another
/// backup of it, sits until a poll minutes away. Waiting backups are not polled (a tenant's
/// hundreds would keep the shared workers busy): the database's return wakes those waiting for
/// it, and the end of each backup wakes the next one queued.
#[tokio::test]
async fn backups_waiting_for_a_paused_database_run_one_after_another_once_it_returns() {
    let env = env().await;
    database_with_rows(&env, "db1", 10).await;
    let qdbs = env.api::<QuestDB>(NS);
    let pause = |paused: bool| crate::database::set_paused(&env, "db1", paused);
    pause(true).await;
    wait_for(&qdbs, "db1", "paused", |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()?.phase) == Some(questdb_operator::api::Phase::Paused)
    })
    .await;
    const NAMES: [&str; 3] = ["first", "second", "third"];
    for name in NAMES {
        create_backup(&env, name, "db1").await;
    }
    let backups = env.api::<QuestDBBackup>(NS);
    for name in NAMES {
        wait_for(
            &backups,
            name,
            "waiting for the paused database",
            |b: Option<&QuestDBBackup>| {
                b.and_then(|b| b.status.as_ref()?.reason.clone()).as_deref()
                    == Some("DatabaseNotRunning")
            },
        )
        .await;
    }
    pause(false).await;
    // Well inside the fallback poll: only the wake-ups can get all three done in time.
    let within = plan::WOKEN_WAIT_FALLBACK / 2;
    let mut held = Vec::new();
    for name in NAMES {
        let b = wait_for_within(
            &backups,
            name,
            &format!("backup {name} Succeeded"),
            within,
            step_is(BackupStep::Succeeded),
        )
        .await;
        let s = b.status.expect("status");
        held.push((s.checkpoint_at, s.released_at, name));
    }
    // One after another: no two held the database's checkpoint at once.
    held.sort();
    for pair in held.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "{} checkpointed before {} released its checkpoint",
            pair[1].2,
            pair[0].2
        );
    }
}
