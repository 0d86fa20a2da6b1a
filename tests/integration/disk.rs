//! A disk that grows before it fills (`spec.volume.autoGrow`), on a real QuestDB whose volume
//! is a real file system of the claim's size (XFS on a loop device, grown online as the EBS
//! CSI driver's NodeExpandVolume does), its usage read from the stand-in kubelet's Summary API
//! as from a real one.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::Condition as _;
use questdb_operator::api::{AutoGrowSpec, QuestDB};

use crate::database::{env_polled_every_second, pod_ip, ready, real, Credentials, NS};
use crate::db_client::{count, exec};
use crate::harness::{has_condition, wait_for, wait_for_event, wait_until};

/// The stand-in CSI driver's class of real, sized XFS volumes.
const SIZED_CLASS: &str = "gp3-xfs";

/// Whether `table` is suspended, as QuestDB reports it.
async fn suspended(http: &str, table: &str, creds: &Credentials) -> bool {
    let sql = format!("select suspended from wal_tables() where name = '{table}'");
    let Ok((200, body)) = exec(http, &sql, creds.http()).await else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["dataset"][0][0].as_bool() == Some(true)
}

/// Whether `table`'s writer caught up with its sequencer, or the table is suspended.
async fn applied_or_suspended(http: &str, table: &str, creds: &Credentials) -> bool {
    let sql = format!(
        "select suspended, writerTxn, sequencerTxn from wal_tables() where name = '{table}'"
    );
    let Ok((200, body)) = exec(http, &sql, creds.http()).await else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let row = &v["dataset"][0];
    row[0].as_bool() == Some(true) || (row[1].as_i64().is_some() && row[1] == row[2])
}

/// A full volume at its maximum suspends the table it filled; raising the maximum grows the
/// volume online (the same QuestDB process throughout) and the operator resumes the table,
/// which then holds every row QuestDB acknowledged, and takes more.
#[tokio::test]
async fn a_full_volume_is_grown_and_its_suspended_table_resumed_with_every_acknowledged_row() {
    let env = env_polled_every_second().await;
    env.create_questdb(NS, "db1", |q| {
        real(q);
        q.spec.volume.size = "480Mi".into();
        q.spec.volume.storage_class_name = Some(SIZED_CLASS.into());
        q.spec.volume.auto_grow = Some(AutoGrowSpec {
            threshold_percent: 80,
            step_percent: 100,
            // At its maximum from the start: the volume fills.
            maximum: "480Mi".into(),
        });
    })
    .await;
    ready(&env, "db1").await;
    let qdbs: Api<QuestDB> = env.api(NS);
    let q = wait_for(
        &qdbs,
        "db1",
        "the volume's usage in status",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.disk.is_some())
        },
    )
    .await;
    let disk = q.status.unwrap_or_default().disk.unwrap_or_default();
    assert!(
        (380..=480).contains(&disk_mib(&disk.capacity)),
        "the file system of a 480Mi claim: {disk:?}"
    );
    let pid = env.cp.database_processes()[0].pid;

    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    let (code, body) = exec(
        &http,
        "create table t (x long, s varchar, ts timestamp) timestamp(ts) partition by day wal",
        creds.http(),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    // Rows until QuestDB cannot apply them: the rows of every insert it answered OK are in its
    // WAL (acknowledged); the apply that fails suspends the table. Each batch of rows is
    // followed by a few late rows that belong before all others, as a late-arriving feed
    // sends: applying those rewrites the day's partition, which needs the partition's size
    // free, while their WAL needs almost nothing, so the apply runs out of space first.
    const BATCH: i64 = 20_000;
    const LATE: i64 = 10;
    let mut acknowledged = 0;
    let mut insert = async |sql: String, rows: i64| -> bool {
        let (code, body) = exec(&http, &sql, creds.http()).await.unwrap();
        // A closed connection with no answer: QuestDB 9.2.0 died (it was seen to crash with
        // SIGSEGV in its WAL writer when written to again after an ENOSPC).
        assert_ne!(code, 0, "QuestDB died on the full volume");
        if code == 200 && !body.contains("\"error\"") {
            acknowledged += rows;
            true
        } else {
            assert!(
                body.contains("No space left"),
                "only a full disk refuses: {code} {body}"
            );
            false
        }
    };
    for batch in 0..100i64 {
        let start = 1_000_000 + batch * BATCH;
        let late = batch * LATE;
        // Refused (the WAL itself found no room): nothing more is written to a full volume.
        let taken = insert(
            format!("insert into t select x, rnd_varchar(100,200,0), timestamp_sequence({start}, 1) from long_sequence({BATCH})"),
            BATCH,
        )
        .await
            && insert(
                format!("insert into t select x, 'late', timestamp_sequence({late}, 1) from long_sequence({LATE})"),
                LATE,
            )
            .await;
        // Nothing more is written before QuestDB applied these or gave up: a writer that runs
        // ahead of a slow apply fills the volume with WAL first (and, written to on a full
        // volume, 9.2.0 may crash), which is not what this test is about.
        wait_until("the rows applied or the table suspended", || {
            let (http, creds) = (&http, &creds);
            async move { applied_or_suspended(http, "t", creds).await }
        })
        .await;
        if !taken || suspended(&http, "t", &creds).await {
            break;
        }
    }
    assert!(acknowledged > 0);
    wait_until("QuestDB suspends the table it could not apply", || {
        let (http, creds) = (&http, &creds);
        async move { suspended(http, "t", creds).await }
    })
    .await;
    let q = wait_for(
        &qdbs,
        "db1",
        "DiskSpace=False AtMaximum, the suspended table recorded",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "DiskSpace" && c.reason == "AtMaximum")
                    && s.disk
                        .as_ref()
                        .is_some_and(|d| d.suspended_when_full == vec!["t".to_string()])
            })
        },
    )
    .await;
    let full = q.status.unwrap().disk.unwrap();
    assert!(full.used_percent >= 80, "{full:?}");
    let applied = count(&http, "t", creds.http()).await.unwrap_or_default();
    assert!(
        applied < acknowledged,
        "the suspended table holds back acknowledged rows: {applied} of {acknowledged}"
    );
    eprintln!(
        "full at {}% of {}: {applied} of {acknowledged} acknowledged rows applied, table suspended",
        full.used_percent, full.capacity
    );
    wait_for_event(&env, NS, "a VolumeAtMaximum event", |e| {
        e.reason.as_deref() == Some("VolumeAtMaximum")
    })
    .await;

    // Room: the maximum raised, the claim grows by its step and the table is resumed.
    qdbs.patch(
        "db1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"volume": {"autoGrow": {"maximum": "1Gi"}}}})),
    )
    .await
    .unwrap();
    wait_for_event(&env, NS, "a VolumeGrowing event", |e| {
        e.reason.as_deref() == Some("VolumeGrowing")
            && e.note.as_deref().is_some_and(|n| n.contains("to 960Mi"))
    })
    .await;
    wait_for_event(&env, NS, "a TablesResumed event naming t", |e| {
        e.reason.as_deref() == Some("TablesResumed")
            && e.note.as_deref().is_some_and(|n| n.ends_with(": t"))
    })
    .await;
    wait_until("every acknowledged row applied", || {
        let (http, creds) = (&http, &creds);
        async move { count(http, "t", creds.http()).await == Some(acknowledged) }
    })
    .await;
    assert!(!suspended(&http, "t", &creds).await);
    let claim: PersistentVolumeClaim = env.api(NS).get("db1-data").await.unwrap();
    let requested = claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
        .0
        .clone();
    assert_eq!(requested, "960Mi");
    let q = wait_for(
        &qdbs,
        "db1",
        "DiskSpace=True Room and WriteHealthy=True",
        |q: Option<&QuestDB>| {
            has_condition("DiskSpace", "Room").matches_object(q)
                && has_condition("WriteHealthy", "WalHealthy").matches_object(q)
        },
    )
    .await;
    let disk = q.status.unwrap().disk.unwrap();
    assert!(disk.suspended_when_full.is_empty(), "{disk:?}");
    assert!(
        disk_mib(&disk.capacity) > 800,
        "the grown file system: {disk:?}"
    );

    // The table takes writes again, on the same process: the volume grew under it.
    let (code, body) = exec(
        &http,
        "insert into t select x, 'after', timestamp_sequence(0, 1) from long_sequence(1000)",
        creds.http(),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    wait_until("the new rows applied", || {
        let (http, creds) = (&http, &creds);
        async move { count(http, "t", creds.http()).await == Some(acknowledged + 1000) }
    })
    .await;
    let processes = env.cp.database_processes();
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0].pid, pid, "never restarted");
    env.stop().await;
}

/// `480Mi` → 480 (whole MiB of a status capacity).
fn disk_mib(q: &str) -> u64 {
    if let Some(g) = q.strip_suffix("Gi") {
        g.parse::<u64>().unwrap() * 1024
    } else {
        q.strip_suffix("Mi").unwrap().parse().unwrap()
    }
}
