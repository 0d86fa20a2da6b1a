//! `WriteHealthy`: the database's own view of its writes, from `wal_tables()` (a suspended
//! table takes no more writes until someone resumes it; a writer far behind its sequencer
//! serves stale reads). Polled at a modest interval, only for Running databases, over the same
//! authenticated HTTP channel as backups; the QuestDB reconcile only reads the last answer.
//! The same poll asks each database's checkpoint ([`checkpoint_watch`]), and each node's
//! kubelet for the volumes' usage ([`crate::kubelet_stats`]) of every database that should run,
//! Running or not: a volume too full for QuestDB to start is one to grow.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::api::{Phase, QuestDB, WriteHealthReason};
use crate::cache::DiskObservation;
use crate::controllers::checkpoint_watch;
use crate::controllers::context::{questdb_ref, Context};
use crate::desired;
use crate::plan::conditions::Verdict;
use crate::plan::disk::{SuspendedTable, VolumeUsage};
use crate::questdb_http::{Database, Login, Rows};

/// A writer this many transactions behind its sequencer is lagging.
pub(crate) const LAG_TXNS: i64 = 10_000;

/// Logins by credentials Secret, with the resourceVersion they were read at.
pub(crate) type Logins = HashMap<ObjectRef<Secret>, (String, Option<Login>)>;

/// The verdict `wal_tables()` (columns name, suspended, writerTxn, sequencerTxn) gives.
pub(crate) fn verdict(rows: &Rows) -> Verdict<WriteHealthReason> {
    let mut suspended = Vec::new();
    let mut lagging = Vec::new();
    for row in &rows.dataset {
        let name = row.first().and_then(|v| v.as_str()).unwrap_or("?");
        if row.get(1).and_then(|v| v.as_bool()) == Some(true) {
            suspended.push(name.to_string());
        }
        let writer = row.get(2).and_then(|v| v.as_i64()).unwrap_or(0);
        let sequencer = row.get(3).and_then(|v| v.as_i64()).unwrap_or(0);
        if sequencer - writer > LAG_TXNS {
            lagging.push(format!("{name} ({} behind)", sequencer - writer));
        }
    }
    let list = |v: &[String]| {
        let mut s = v.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
        if v.len() > 10 {
            s.push_str(&format!(" and {} more", v.len() - 10));
        }
        s
    };
    if !suspended.is_empty() {
        return Verdict::new(
            false,
            WriteHealthReason::TablesSuspended,
            format!(
                "WAL suspended (writes refused until `ALTER TABLE ... RESUME WAL`): {}",
                list(&suspended)
            ),
        );
    }
    if !lagging.is_empty() {
        return Verdict::new(
            false,
            WriteHealthReason::WalApplyLagging,
            format!(
                "WAL apply lags more than {LAG_TXNS} transactions: {}",
                list(&lagging)
            ),
        );
    }
    Verdict::new(
        true,
        WriteHealthReason::WalHealthy,
        format!("WAL applied and writable ({} tables)", rows.dataset.len()),
    )
}

/// Polls every Running QuestDB each `interval` until `token` is cancelled: its WAL tables and
/// its checkpoint (the watchdog, with the backups' checkpoint limit from `timeouts`); a
/// changed verdict wakes that QuestDB's reconcile.
pub(crate) async fn run(
    ctx: Arc<Context>,
    interval: Duration,
    timeouts: crate::plan::backup::Timeouts,
    token: CancellationToken,
) {
    let mut logins = Logins::new();
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        // Every database that should run: a volume too full for QuestDB to start keeps it from
        // Running, and its usage is what gets it going again.
        let watched: Vec<QuestDB> = ctx
            .caches
            .questdbs
            .state()
            .iter()
            .filter_map(|g| g.0.as_ref().ok())
            .filter(|q| q.metadata.deletion_timestamp.is_none() && !q.spec.paused)
            .cloned()
            .collect();
        let mut seen = Vec::new();
        let mut polls = Vec::new();
        for qdb in watched
            .iter()
            .filter(|q| q.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running))
        {
            let Some(key) = questdb_ref(qdb) else {
                continue;
            };
            seen.push(key.clone());
            if let Some(db) = connect(&ctx, qdb, None, &mut logins).await {
                polls.push((key, qdb.clone(), db));
            }
        }
        // The kubelets' volume statistics: one Summary per node, whatever it runs.
        let mut usage = match &ctx.kubelets {
            Some(kubelets) => volume_usage(&ctx, kubelets, watched.iter()).await,
            None => HashMap::new(),
        };
        // A few databases at a time, each within its budget: one slow or hostile database
        // delays only its own verdicts, never the others' (their last verdict stands).
        let polled: Vec<_> = polls.iter().map(|(k, _, _)| k.clone()).collect();
        futures::stream::iter(polls)
            .for_each_concurrent(POLL_PARALLELISM, |(key, qdb, db)| {
                let ctx = ctx.clone();
                let usage = usage.get(&key).cloned();
                async move {
                    let poll = poll_one(&ctx, key, &qdb, &db, usage, timeouts);
                    if tokio::time::timeout(POLL_BUDGET, poll).await.is_err() {
                        debug!(questdb = %qdb.name_any(), "write health poll over its budget; the last verdict stands");
                    }
                }
            })
            .await;
        // The databases not asked (not Running, or no address): their volume alone.
        let mut disk_seen = polled;
        for qdb in &watched {
            let Some(key) = questdb_ref(qdb) else {
                continue;
            };
            if disk_seen.contains(&key) {
                continue;
            }
            if let Some(u) = usage.remove(&key) {
                if observe_disk(&ctx, &key, qdb, u, None) {
                    ctx.wake_questdb(key.clone());
                }
                disk_seen.push(key);
            }
        }
        ctx.write_health
            .lock()
            .expect("write health lock")
            .retain(|k, _| seen.contains(k));
        ctx.checkpoints
            .lock()
            .expect("checkpoint watch lock")
            .retain(|k, _| seen.contains(k));
        ctx.disk
            .lock()
            .expect("disk watch lock")
            .retain(|k, _| disk_seen.contains(k));
    }
}

/// Each database's volume usage from its node's kubelet (one Summary per node), or why it
/// could not be read.
async fn volume_usage<'a>(
    ctx: &Context,
    kubelets: &crate::kubelet_stats::Kubelets,
    databases: impl Iterator<Item = &'a QuestDB>,
) -> HashMap<ObjectRef<crate::controllers::context::GuardedQuestDB>, Result<VolumeUsage, String>> {
    let mut by_node: HashMap<String, Vec<(ObjectRef<_>, String, String)>> = HashMap::new();
    for qdb in databases {
        let (Some(key), Some(ns)) = (questdb_ref(qdb), qdb.namespace()) else {
            continue;
        };
        let node = ctx
            .caches
            .pods
            .get(&ObjectRef::new(&desired::names::pod(qdb)).within(&ns))
            .and_then(|p| p.node_name.clone());
        if let Some(node) = node {
            by_node
                .entry(node)
                .or_default()
                .push((key, ns, desired::names::pvc(qdb)));
        }
    }
    let summaries = futures::stream::iter(by_node)
        .map(|(node, claims)| async move {
            let summary = match ctx.caches.nodes.get(&ObjectRef::new(&node)) {
                Some(n) => kubelets.summary(&n).await,
                None => Err(format!("node {node} is not in the cache")),
            };
            (node, claims, summary)
        })
        .buffer_unordered(POLL_PARALLELISM)
        .collect::<Vec<_>>()
        .await;
    kubelets.keep_only(ctx.caches.nodes.state().iter().map(|n| n.as_ref()));
    let mut out = HashMap::new();
    for (node, claims, summary) in summaries {
        for (key, ns, claim) in claims {
            let usage = match &summary {
                // The kubelet measures a volume some time after it is mounted: until then
                // there is nothing to say.
                Ok(s) => match s.claim(&ns, &claim) {
                    Some(u) => Ok(u),
                    None => continue,
                },
                Err(why) => {
                    debug!(%node, error = %why, "kubelet volume statistics");
                    Err(why.clone())
                }
            };
            out.insert(key, usage);
        }
    }
    out
}

/// How many databases are polled at once.
const POLL_PARALLELISM: usize = 8;
/// How long one database's poll may take in all (its WAL tables and its checkpoint).
const POLL_BUDGET: Duration = Duration::from_secs(15);

/// One database's verdicts; a changed one wakes its reconcile.
async fn poll_one(
    ctx: &Context,
    key: ObjectRef<crate::controllers::context::GuardedQuestDB>,
    qdb: &QuestDB,
    db: &Database,
    usage: Option<Result<VolumeUsage, String>>,
    timeouts: crate::plan::backup::Timeouts,
) {
    let mut changed = false;
    let wal = wal_verdict(qdb, db).await;
    if let Some(usage) = usage {
        let suspended = wal.as_ref().map(|(_, s)| s.clone());
        changed |= observe_disk(ctx, &key, qdb, usage, suspended);
    }
    if let Some((verdict, _)) = wal {
        let suspended = if verdict.reason == WriteHealthReason::TablesSuspended {
            1
        } else {
            0
        };
        ctx.metrics.set_suspended_wal_tables(
            &qdb.namespace().unwrap_or_default(),
            &qdb.name_any(),
            suspended,
        );
        let mut map = ctx.write_health.lock().expect("write health lock");
        changed |= map.insert(key.clone(), verdict.clone()) != Some(verdict);
    }
    if let Some(verdict) = checkpoint_watch::check(ctx, qdb, db, timeouts).await {
        let mut map = ctx.checkpoints.lock().expect("checkpoint watch lock");
        changed |= map.insert(key.clone(), verdict.clone()) != Some(verdict);
    }
    if changed {
        ctx.wake_questdb(key);
    }
}

/// Records what was seen of the volume (`suspended`: `None` when QuestDB was not asked or did
/// not answer); whether the disk decision may change.
fn observe_disk(
    ctx: &Context,
    key: &ObjectRef<crate::controllers::context::GuardedQuestDB>,
    qdb: &QuestDB,
    usage: Result<VolumeUsage, String>,
    suspended: Option<Vec<SuspendedTable>>,
) -> bool {
    if let Ok(u) = &usage {
        ctx.metrics.set_volume_usage(
            &qdb.namespace().unwrap_or_default(),
            &qdb.name_any(),
            u.capacity,
            u.used,
        );
    }
    let seen = DiskObservation { usage, suspended };
    let mut map = ctx.disk.lock().expect("disk watch lock");
    // The bytes change with every write: only what the decision reads wakes it.
    let changed = !map.get(key).is_some_and(|old| decides_alike(old, &seen));
    map.insert(key.clone(), seen);
    changed
}

/// A client for the database's HTTP port with its credentials, while its pod has an address
/// (and runs on `on_node`, when given).
pub(crate) async fn connect(
    ctx: &Context,
    qdb: &QuestDB,
    on_node: Option<&str>,
    logins: &mut Logins,
) -> Option<Database> {
    let ns = qdb.namespace()?;
    let pod = ctx
        .caches
        .pods
        .get(&ObjectRef::new(&desired::names::pod(qdb)).within(&ns))?;
    if on_node.is_some_and(|n| pod.node_name.as_deref() != Some(n)) {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    let secret_name = desired::credentials::secret_name(qdb);
    let secret_ref = ObjectRef::<Secret>::new(&secret_name).within(&ns);
    // The Secret's data is read again only when its resourceVersion (from the metadata
    // cache) changed.
    let version = ctx
        .caches
        .secrets
        .get(&ObjectRef::new(&secret_name).within(&ns))
        .and_then(|m| m.resource_version())
        .unwrap_or_default();
    if logins.get(&secret_ref).map(|(v, _)| v) != Some(&version) {
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        let secret = api.get_opt(&secret_name).await.ok().flatten();
        let login = secret.as_ref().and_then(Login::from_secret);
        logins.insert(secret_ref.clone(), (version, login));
    }
    let login = logins.get(&secret_ref).and_then(|(_, l)| l.clone());
    Some(Database::at(
        SocketAddr::new(ip, desired::HTTP_PORT as u16),
        login.as_ref(),
    ))
}

/// Whether two observations make the same disk decision: the whole percentage, the
/// capacity, the suspended tables, the error (the bytes change with every write).
fn decides_alike(a: &DiskObservation, b: &DiskObservation) -> bool {
    let coarse = |o: &DiskObservation| {
        o.usage
            .as_ref()
            .map(|u| (crate::plan::disk::used_percent(*u), u.capacity))
            .map_err(Clone::clone)
    };
    coarse(a) == coarse(b) && a.suspended == b.suspended
}

/// The suspended tables of `wal_tables()` (columns name, suspended, ..., errorTag).
pub(crate) fn suspended_tables(rows: &Rows) -> Vec<SuspendedTable> {
    rows.dataset
        .iter()
        .filter(|row| row.get(1).and_then(|v| v.as_bool()) == Some(true))
        .map(|row| SuspendedTable {
            name: row
                .first()
                .and_then(|v| v.as_str())
                .unwrap_or("?")
                .to_string(),
            disk_full: row.get(4).and_then(|v| v.as_str()) == Some("DISK FULL"),
        })
        .collect()
}

async fn wal_verdict(
    qdb: &QuestDB,
    db: &Database,
) -> Option<(Verdict<WriteHealthReason>, Vec<SuspendedTable>)> {
    match db
        .exec("select name, suspended, writerTxn, sequencerTxn, errorTag from wal_tables()")
        .await
    {
        Ok(rows) => Some((verdict(&rows), suspended_tables(&rows))),
        Err(e) => {
            // Unreachable or refusing: Ready already says so; the last verdict stands.
            debug!(questdb = %qdb.name_any(), error = %e, "write health poll failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(data: serde_json::Value) -> Rows {
        serde_json::from_value(json!({ "columns": [], "dataset": data })).unwrap()
    }

    #[test]
    fn a_suspended_table_is_named_and_makes_writes_unhealthy() {
        let v = verdict(&rows(json!([
            ["trades", true, 5, 9],
            ["quotes", false, 3, 3]
        ])));
        assert!(!v.status);
        assert_eq!(v.reason, WriteHealthReason::TablesSuspended);
        assert!(v.message.contains("trades") && !v.message.contains("quotes"));
    }

    #[test]
    fn suspended_tables_are_named_with_their_disk_full_tag() {
        let t = suspended_tables(&rows(json!([
            ["trades", true, 5, 9, ""],
            ["quotes", true, 3, 4, "DISK FULL"],
            ["ok", false, 3, 3, ""]
        ])));
        assert_eq!(
            t,
            vec![
                SuspendedTable {
                    name: "trades".into(),
                    disk_full: false
                },
                SuspendedTable {
                    name: "quotes".into(),
                    disk_full: true
                }
            ]
        );
    }

    #[test]
    fn a_writer_far_behind_its_sequencer_is_lagging_and_a_caught_up_one_is_healthy() {
        let v = verdict(&rows(json!([["trades", false, 1, 1 + LAG_TXNS + 1]])));
        assert_eq!(
            (v.status, v.reason),
            (false, WriteHealthReason::WalApplyLagging)
        );
        let v = verdict(&rows(json!([["trades", false, 100, 120]])));
        assert_eq!((v.status, v.reason), (true, WriteHealthReason::WalHealthy));
        let v = verdict(&rows(json!([])));
        assert!(v.status, "no WAL table, nothing unhealthy");
    }
}
