//! Data safety counted in rows, on a real QuestDB: a client writes through the database's
//! address (`status.dnsIP`, the DNS target) with ILP over HTTP the whole time, counting the rows
//! QuestDB acknowledged (204), while the node loses power, is cut off, or the database moves to
//! a node of another image. Every acknowledged row must be there afterwards, and no two QuestDB
//! processes may ever hold the volume's directory at once. The gap the client saw is printed.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use questdb_operator::api::{CommitMode, QuestDB};
use questdb_operator::desired::credentials;

use super::{node_name_for, settings, CloudEnv, NS};
use crate::db_client::{count, ilp_http, wal_applied};
use crate::harness::{is_running, wait_for_within, wait_until};
use kube::runtime::wait::Condition;

const TIMEOUT: Duration = Duration::from_secs(300);
const TABLE: &str = "ticks";
const BATCH: i64 = 50;

/// The address the database's DNS record names now (as status reports it): where its
/// clients connect.
async fn record_ip(qdbs: &Api<QuestDB>) -> Option<String> {
    qdbs.get_opt("db1").await.ok().flatten()?.status?.dns_ip
}

async fn http_login(env: &CloudEnv) -> (String, String) {
    let s: Secret = Api::namespaced(env.client.clone(), NS)
        .get("db1-credentials")
        .await
        .expect("credentials Secret");
    let data = s.data.unwrap_or_default();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf-8");
    (
        text(credentials::HTTP_USER),
        text(credentials::HTTP_PASSWORD),
    )
}

/// A client that writes a batch every ~100 ms to whatever address status names, and measures
/// the longest time between two acknowledged batches.
struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicI64>,
    sent: Arc<AtomicI64>,
    longest_gap: Arc<Mutex<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(qdbs: Api<QuestDB>, login: (String, String)) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicI64::new(0));
        let sent = Arc::new(AtomicI64::new(0));
        let longest_gap = Arc::new(Mutex::new(Duration::ZERO));
        let (s, a, n, g) = (
            stop.clone(),
            acked.clone(),
            sent.clone(),
            longest_gap.clone(),
        );
        let task = tokio::spawn(async move {
            let mut last_ack = Instant::now();
            let mut ip = None;
            while !s.load(Ordering::Relaxed) {
                if ip.is_none() {
                    ip = record_ip(&qdbs).await;
                }
                if let Some(addr) = ip.as_ref().map(|ip| format!("{ip}:9000")) {
                    let first = n.fetch_add(BATCH, Ordering::Relaxed);
                    let lines: String = (first..first + BATCH)
                        .map(|i| format!("{TABLE},src=w v={i}i\n"))
                        .collect();
                    let login = Some((login.0.as_str(), login.1.as_str()));
                    let answered = tokio::time::timeout(
                        Duration::from_secs(2),
                        ilp_http(&addr, &lines, login),
                    )
                    .await;
                    match answered {
                        Ok(Ok(204)) => {
                            a.fetch_add(BATCH, Ordering::Relaxed);
                            let gap = last_ack.elapsed();
                            let mut longest = g.lock().unwrap();
                            *longest = (*longest).max(gap);
                            last_ack = Instant::now();
                        }
                        // Refused or unanswered: look the address up again.
                        _ => ip = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Writer {
            stop,
            acked,
            sent,
            longest_gap,
            task,
        }
    }

    fn acked(&self) -> i64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops writing; (acknowledged rows, rows sent, the longest gap between acknowledgements).
    async fn finish(self) -> (i64, i64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let gap = *self.longest_gap.lock().unwrap();
        (
            self.acked.load(Ordering::Relaxed),
            self.sent.load(Ordering::Relaxed),
            gap,
        )
    }
}

/// `db1` with a 10 s failover threshold, Running on a real QuestDB, a writer going, and some
/// rows already acknowledged.
async fn writing(
    env: &CloudEnv,
    commit_mode: Option<CommitMode>,
) -> (Writer, String, (String, String)) {
    writing_with(env, move |q| q.spec.config.commit_mode = commit_mode).await
}

/// [`writing`] with `edit` applied to the QuestDB it creates.
async fn writing_with(
    env: &CloudEnv,
    edit: impl FnOnce(&mut QuestDB) + Send + 'static,
) -> (Writer, String, (String, String)) {
    env.create("db1", move |q| {
        crate::database::real(q);
        q.spec.failover.unhealthy_after_seconds = 10;
        edit(q);
    })
    .await;
    let q = wait_for_within(&env.qdbs(), "db1", "Running", TIMEOUT, is_running()).await;
    let instance = q
        .status
        .and_then(|s| s.instance_id)
        .expect("instance recorded");
    let login = http_login(env).await;
    let writer = Writer::start(env.qdbs(), login.clone());
    wait_until("the first rows acknowledged", || {
        let acked = writer.acked();
        async move { acked >= 5 * BATCH }
    })
    .await;
    (writer, instance, login)
}

/// After the event: writing resumes on the new node, then every acknowledged row is counted
/// there, and no two QuestDB processes ever held the volume.
async fn assert_no_acknowledged_row_lost(
    env: &CloudEnv,
    writer: Writer,
    login: &(String, String),
    what: &str,
) {
    let resumed_from = writer.acked();
    wait_until(&format!("{what}: writes acknowledged again"), || {
        let acked = writer.acked();
        async move { acked >= resumed_from + 5 * BATCH }
    })
    .await;
    let (acked, sent, gap) = writer.finish().await;
    let ip = record_ip(&env.qdbs()).await.expect("record address");
    let addr = format!("{ip}:9000");
    let l = Some((login.0.as_str(), login.1.as_str()));
    // Rows sent but unanswered may or may not be there; acknowledged ones must be.
    wait_until(&format!("{what}: WAL applied"), || {
        let addr = addr.clone();
        async move { wal_applied(&addr, TABLE, l).await }
    })
    .await;
    let rows = count(&addr, TABLE, l).await.expect("count");
    eprintln!(
        "data-safety figure ({what}): {acked} rows acknowledged, {sent} sent, {rows} counted; longest gap between acknowledged writes {:.1} s",
        gap.as_secs_f64()
    );
    assert!(
        rows >= acked,
        "{what}: {acked} acknowledged, {rows} counted"
    );
    assert!(rows <= sent, "{what}: more rows than were sent");
    let violations = env.cp.two_writer_violations();
    assert!(violations.is_empty(), "{what}: two writers: {violations:?}");
}

fn downtime(q: &QuestDB) -> Option<i64> {
    let s = q.status.as_ref()?;
    s.failover
        .as_ref()
        .and_then(|f| f.downtime_seconds)
        .or(s.node_move.as_ref().and_then(|u| u.downtime_seconds))
}

/// Waits until `db1`'s failover has ended on a healthy node; the QuestDB then.
async fn failover_done(env: &CloudEnv, what: &str) -> QuestDB {
    wait_for_within(&env.qdbs(), "db1", what, TIMEOUT, |q: Option<&QuestDB>| {
        q.and_then(|q| {
            q.status
                .as_ref()?
                .failover
                .as_ref()
                .map(|f| f.phase == "Healthy")
        })
        .unwrap_or(false)
    })
    .await
}

/// How the dedicated node fails.
enum NodeFailure {
    PowerLoss,
    Partition,
    /// `kubectl delete node` while the instance and its QuestDB run on.
    NodeDeleted,
    /// A partition that heals while the fence's normal stop is under way (a second event in
    /// the middle of the first).
    PartitionHealedMidFence,
}

/// The node of `db1` fails while a client writes; failover runs to the end; every acknowledged
/// row is there.
async fn failover_keeps_every_acknowledged_row(
    failure: NodeFailure,
    commit_mode: Option<CommitMode>,
    what: &str,
) {
    let env = match failure {
        // A deleted Node takes no out-of-service taint: its volume waits for the
        // attach-detach controller's force detach, shortened as upstream's own tests do.
        NodeFailure::NodeDeleted => {
            let mut cluster = crate::harness::cluster().with_real_databases();
            cluster.attach_detach_max_wait_for_unmount = Some(Duration::from_secs(30));
            let ec2 = questdb_operator::cloud::memory::MemoryEc2Options {
                private_ip_prefix: crate::harness::cloud::loopback_prefix(),
                ..Default::default()
            };
            CloudEnv::start_on(settings(), cluster, ec2).await
        }
        _ => CloudEnv::start_with_real_databases(settings()).await,
    };
    let (writer, old, login) = writing(&env, commit_mode).await;
    let kubelet = env.cp.node(&node_name_for(&old)).expect("kubelet");
    match failure {
        NodeFailure::NodeDeleted => {
            Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
                .delete(&node_name_for(&old), &Default::default())
                .await
                .expect("kubectl delete node");
        }
        // A hardware failure: the kubelet and QuestDB die at once while EC2 still reports the
        // instance `running` (failed status checks, not a stopped state), so the failover
        // stops it itself before the volume moves.
        NodeFailure::PowerLoss => kubelet.power_off(),
        NodeFailure::Partition => kubelet.partition(),
        NodeFailure::PartitionHealedMidFence => {
            kubelet.partition();
            wait_for_within(
                &env.qdbs(),
                "db1",
                "the fence's normal stop recorded",
                TIMEOUT,
                |q: Option<&QuestDB>| {
                    q.and_then(|q| q.status.as_ref()?.failover.as_ref()?.fence_stop.as_ref())
                        .is_some()
                },
            )
            .await;
            kubelet.heal();
        }
    }
    let q = failover_done(&env, "failover done").await;
    eprintln!(
        "data-safety figure ({what}): status downtimeSeconds {:?}",
        downtime(&q)
    );
    if matches!(
        failure,
        NodeFailure::Partition | NodeFailure::NodeDeleted | NodeFailure::PartitionHealedMidFence
    ) {
        // The node was alive: its fence was a normal stop, which ends QuestDB with SIGTERM.
        let killed: Vec<_> = env
            .cp
            .database_exits()
            .into_iter()
            .filter(|e| e.signal == Some(libc::SIGKILL))
            .collect();
        assert!(
            killed.is_empty(),
            "{what}: the fence killed QuestDB instead of stopping it: {killed:?}"
        );
    }
    assert_no_acknowledged_row_lost(&env, writer, &login, what).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_a_failover_after_power_loss() {
    // The default commit mode (sync): the volume layer loses what was not synced at the cut.
    failover_keeps_every_acknowledged_row(NodeFailure::PowerLoss, None, "power loss").await;
}

/// A Node deleted by hand while its instance runs: the instance is alive, so the fence's
/// normal stop lets QuestDB stop and the kernel write back, and even under `nosync` no
/// acknowledged row is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_the_failover_of_a_deleted_node_that_still_runs_under_nosync(
) {
    failover_keeps_every_acknowledged_row(
        NodeFailure::NodeDeleted,
        Some(CommitMode::Nosync),
        "deleted node, nosync",
    )
    .await;
}

/// The partition heals while the node is being stopped normally: the stop goes on (EC2 has it,
/// the OS is shutting down), the database moves, and under `nosync` no acknowledged row is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_heals_during_the_graceful_fence_loses_no_acknowledged_row_under_nosync() {
    failover_keeps_every_acknowledged_row(
        NodeFailure::PartitionHealedMidFence,
        Some(CommitMode::Nosync),
        "partition healed mid-fence, nosync",
    )
    .await;
}

/// The dangerous case: the old QuestDB keeps running and writing while its node is cut off.
/// Its volume must not reach the replacement while it can still write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_a_failover_of_a_partitioned_node_and_never_two_writers() {
    // Under `nosync`, which a power cut punishes (docs/user-guide/questdb-resource.md's durability table): the
    // fence's normal stop lets the partitioned node's OS stop QuestDB (SIGTERM) and write
    // back what its kernel held, so nothing acknowledged is lost.
    failover_keeps_every_acknowledged_row(
        NodeFailure::Partition,
        Some(CommitMode::Nosync),
        "partition, nosync",
    )
    .await;
}

/// A kubelet that loses the API server while its database serves (a certificate, an access
/// entry, a security group) is no reason to stop a database its clients still reach: past the
/// threshold, and long after, the database answers the operator, so nothing is fenced and the
/// client keeps writing. Then a second fault, the node's power: the database stops answering,
/// the failover runs, and every acknowledged row is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_still_answers_is_not_fenced_for_its_kubelets_silence_until_it_stops() {
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let (writer, old, login) = writing(&env, None).await;
    let kubelet = env.cp.node(&node_name_for(&old)).expect("kubelet");
    kubelet.cut_kubelet_off();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        "failover held back: the database answers",
        TIMEOUT,
        crate::harness::has_condition("Failover", "FailoverSuppressed"),
    )
    .await;
    let message = crate::harness::condition_message(&q, "Failover");
    assert!(message.starts_with("DatabaseAnswers"), "{message}");
    crate::harness::wait_for_event_in(
        &env.client,
        NS,
        "a FailoverSuppressed event naming the database's answer",
        |e| {
            e.reason.as_deref() == Some("FailoverSuppressed")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("DatabaseAnswers"))
        },
    )
    .await;
    // Well past the 10 s threshold: the client still writes, nothing was stopped.
    let acked = writer.acked();
    wait_until("writes acknowledged while the kubelet is cut off", || {
        let now = writer.acked();
        async move { now >= acked + 20 * BATCH }
    })
    .await;
    let q = env.qdbs().get("db1").await.expect("db1");
    let status = q.status.expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(old.as_str()));
    assert_eq!(status.failover, None, "no failover started");
    assert_eq!(env.cloud.ec2.call_count("StopInstances"), 0);

    // The second fault: the node loses power, the database stops answering.
    kubelet.power_off();
    failover_done(&env, "failover done after the power loss").await;
    assert_no_acknowledged_row_lost(&env, writer, &login, "kubelet cut off, then power loss").await;
    env.stop().await;
}

/// Patches `spec.node` of `db1` and waits until the move's record says `phase` for a node as
/// `arrived` wants it, the database Running there; prints the downtime status records.
async fn move_node(
    env: &CloudEnv,
    node: serde_json::Value,
    phase: &'static str,
    arrived: impl Fn(&questdb_operator::api::QuestDBStatus) -> bool + Send + 'static,
    what: &str,
) {
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"node": node}})),
        )
        .await
        .expect("spec.node changed");
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        what,
        TIMEOUT,
        move |q: Option<&QuestDB>| {
            is_running().matches_object(q)
                && q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                    arrived(s) && s.node_move.as_ref().is_some_and(|u| u.phase == phase)
                })
        },
    )
    .await;
    eprintln!(
        "data-safety figure ({what}): status downtimeSeconds {:?}",
        downtime(&q)
    );
}

const NEW_AMI: &str = "ami-0fedcba9876543210";

/// Changes `db1`'s node image to [`NEW_AMI`], with no rollback window: a node move begins.
async fn move_to_new_image(env: &CloudEnv) {
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"node": {"image": NEW_AMI, "rollbackWindow": "0s"}}}),
            ),
        )
        .await
        .expect("spec.node changed");
}

/// A move to a node of a new image, then back (the image set back within the rollback window
/// returns to the retained node): every row acknowledged on either node is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_a_node_image_move_and_the_move_back() {
    let env = CloudEnv::start_with_real_databases(settings()).await;
    // nosync: only a stop that lets the old node write back keeps the rows.
    let (writer, old, login) = writing(&env, Some(CommitMode::Nosync)).await;
    let moved_from = old.clone();
    move_node(
        &env,
        serde_json::json!({"image": NEW_AMI}),
        "Retaining",
        move |s| {
            s.instance_id.as_deref() != Some(moved_from.as_str())
                && s.node_image.as_deref() == Some(NEW_AMI)
        },
        "node image move",
    )
    .await;
    let before = writer.acked();
    wait_until("writes acknowledged on the new node", || {
        let acked = writer.acked();
        async move { acked >= before + 3 * BATCH }
    })
    .await;
    move_node(
        &env,
        serde_json::json!({"image": super::AMI}),
        "Retaining",
        move |s| s.instance_id.as_deref() == Some(old.as_str()),
        "move back to the retained node",
    )
    .await;
    assert_no_acknowledged_row_lost(&env, writer, &login, "node image move and back").await;
    env.stop().await;
}

/// Waits until `db1` runs on a new instance of the same image after a move off `old` (done, its
/// old node retained or released), with no failover and nothing fenced: what a replacement for
/// a scheduled event or a drain ends in.
async fn replaced(env: &CloudEnv, old: &str, what: &str) -> QuestDB {
    let moved_from = old.to_string();
    let q = wait_for_within(
        &env.qdbs(),
        "db1",
        &format!("{what}, the database Running on the new node"),
        TIMEOUT,
        move |q: Option<&QuestDB>| {
            is_running().matches_object(q)
                && q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                    s.instance_id.as_deref() != Some(moved_from.as_str())
                        && s.node_move
                            .as_ref()
                            .is_some_and(|u| u.phase == "Retaining" || u.phase == "Completed")
                })
        },
    )
    .await;
    let status = q.status.as_ref().expect("status");
    assert_eq!(status.node_image.as_deref(), Some(super::AMI), "same image");
    assert!(
        status.failover.is_none(),
        "{what}: a failover started: {:?}",
        status.failover
    );
    assert_eq!(
        env.cloud.ec2.call_count("StopInstances"),
        0,
        "{what}: the operator fenced a node"
    );
    q
}

/// The harm: AWS retires the instance at its own time, an unplanned power cut for a database
/// on `nosync` (what the kernel had not written back is lost) and a failover after the
/// threshold. EC2's scheduled retirement is read, and a planned move to a new node of the same
/// image and type goes first: the old node is left cleanly, every acknowledged row is kept,
/// the operator fences nothing and no failover starts, and the retirement then finds the old
/// instance retained or gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_retirement_moves_the_database_to_a_new_node_before_aws_stops_the_old_one() {
    let env = CloudEnv::start_with_real_databases(questdb_operator::manager::CloudSettings {
        // Seen within a second of being scheduled.
        scheduled_event_interval: Duration::from_secs(1),
        ..settings()
    })
    .await;
    let (writer, old, login) = writing(&env, Some(CommitMode::Nosync)).await;
    // Well within the move's reach on this machine, and far inside the hour a planned move
    // keeps ahead of an event: the move starts at once. The memory EC2 stops the instance at
    // this time if it still runs, as AWS would.
    let not_before = std::time::SystemTime::now() + Duration::from_secs(150);
    let event_id = env
        .cloud
        .ec2
        .schedule_event(&old, "instance-retirement", not_before);
    let q = replaced(&env, &old, "a planned move off the retiring instance").await;
    assert!(
        std::time::SystemTime::now() < not_before,
        "the move ended before AWS's time"
    );
    let status = q.status.clone().expect("status");
    let record = status.node_move.clone().expect("move record");
    let answered = record
        .scheduled_event
        .clone()
        .expect("the move names the event");
    assert_eq!(answered.code, "instance-retirement");
    assert_eq!(answered.event_id.as_deref(), Some(event_id.as_str()));
    assert_eq!(answered.instance_id, old);
    assert_eq!(record.old_instance_id.as_deref(), Some(old.as_str()));
    let new = status.instance_id.clone().expect("new instance");
    assert!(
        env.cloud
            .ec2
            .instances()
            .iter()
            .any(|i| i.id == new && i.image == super::AMI),
        "the new instance runs the same image"
    );
    assert_no_acknowledged_row_lost(&env, writer, &login, "a scheduled retirement").await;
    let after = env.qdbs().get("db1").await.expect("db1");
    assert!(
        after.status.as_ref().is_some_and(|s| s.failover.is_none()),
        "still no failover"
    );
    env.stop().await;
}

/// The harm: `kubectl drain` (or the Node Termination Handler) of a dedicated node waits for
/// ever on the database's disruption budget, or, allowed to evict, strands the pod Pending on
/// the cordoned node: a database still starting becomes an outage. A database that is not
/// Ready is never evicted; the cordon is answered by a move to a new node (the eviction refused
/// meanwhile), after which the drained node holds no pod of the database, every acknowledged
/// row kept, nothing fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_dedicated_node_is_emptied_by_a_move_and_a_database_not_ready_is_never_evicted() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let (writer, old, login) = writing(&env, Some(CommitMode::Nosync)).await;
    let old_node = node_name_for(&old);
    // As kubectl drain asks: once per try, reading the 429 (a retrying client would wait).
    let mut config = env.cp.client_config().await;
    config.default_retry = false;
    let once = kube::Client::try_from(config).expect("client");
    let pods: Api<Pod> = Api::namespaced(once, NS);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), NS);
    let budget_counts = |healthy: i32| {
        let pdbs = pdbs.clone();
        async move {
            pdbs.get_opt("db1")
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .is_some_and(|s| s.current_healthy == healthy)
        }
    };

    // Not Ready: the process stopped, its readiness probe failing.
    let pids = questdb_pids(&env);
    assert_eq!(pids.len(), 1, "{pids:?}");
    // SAFETY: kill(2) with a pid of a QuestDB this test environment started.
    unsafe { libc::kill(pids[0] as i32, libc::SIGSTOP) };
    wait_until("the budget counts the database not Ready", || {
        budget_counts(0)
    })
    .await;
    match pods.evict("db1-0", &Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("a database that is not Ready was evicted: {other:?}"),
    }
    // SAFETY: as above.
    unsafe { libc::kill(pids[0] as i32, libc::SIGCONT) };
    wait_until("the budget counts the database Ready again", || {
        budget_counts(1)
    })
    .await;
    let resumed = writer.acked();
    wait_until("writes acknowledged again", || {
        let acked = writer.acked();
        async move { acked >= resumed + 3 * BATCH }
    })
    .await;

    // The drain: the node cordoned first, as kubectl drain does, then evictions tried.
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            &old_node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("node cordoned");
    match pods.evict("db1-0", &Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("the database was evicted off its node: {other:?}"),
    }
    let q = replaced(&env, &old, "the database moved off the drained node").await;
    let status = q.status.clone().expect("status");
    let record = status.node_move.clone().expect("move record");
    assert_eq!(record.drained_node.as_deref(), Some(old_node.as_str()));
    // What the drain lists next: no pod of the database on the drained node.
    let pod = pods.get("db1-0").await.expect("pod");
    let on = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
    assert_ne!(on, old_node, "the drained node still holds the database");
    assert_no_acknowledged_row_lost(&env, writer, &login, "a drain").await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_an_instance_type_move() {
    let env = CloudEnv::start_with_real_databases(settings()).await;
    // nosync, and the old node terminated at once (no rollback window): the volume leaves it
    // only after a clean unmount, or the rows not yet written back would be lost with it.
    let (writer, old, login) = writing(&env, Some(CommitMode::Nosync)).await;
    move_node(
        &env,
        serde_json::json!({"instanceType": "m6i.xlarge", "rollbackWindow": "0s"}),
        "Completed",
        move |s| {
            s.instance_id.as_deref() != Some(old.as_str())
                && s.node_instance_type.as_deref() == Some("m6i.xlarge")
        },
        "instance type move",
    )
    .await;
    assert_no_acknowledged_row_lost(&env, writer, &login, "instance type move").await;
    env.stop().await;
}

/// The pids of the QuestDB processes that run now.
fn questdb_pids(env: &CloudEnv) -> Vec<u32> {
    env.cp.database_processes().iter().map(|p| p.pid).collect()
}

/// Patches `db1`'s spec with `patch` and waits until a new QuestDB process (not one of those
/// running before) serves it, the database is Running with `arrived` true of its status, and
/// new writes are acknowledged.
async fn change_under_load(
    env: &CloudEnv,
    writer: &Writer,
    patch: serde_json::Value,
    arrived: impl Fn(&questdb_operator::api::QuestDBStatus) -> bool + Send + 'static,
    what: &str,
) {
    let before = questdb_pids(env);
    env.qdbs()
        .patch("db1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("spec changed");
    wait_until(&format!("{what}: QuestDB restarted"), || {
        let now = questdb_pids(env);
        let before = &before;
        async move { now.len() == 1 && !before.contains(&now[0]) }
    })
    .await;
    wait_for_within(
        &env.qdbs(),
        "db1",
        what,
        TIMEOUT,
        move |q: Option<&QuestDB>| {
            is_running().matches_object(q)
                && q.and_then(|q| q.status.as_ref()).is_some_and(&arrived)
        },
    )
    .await;
    let acked = writer.acked();
    wait_until(&format!("{what}: writes acknowledged again"), || {
        let now = writer.acked();
        async move { now >= acked + 3 * BATCH }
    })
    .await;
}

/// The changes that stop QuestDB on purpose, one after another while a client writes under
/// `nosync` on a dedicated node: a config roll, a version upgrade, and a pause and unpause.
/// Each stops QuestDB with SIGTERM and unmounts the volume cleanly before anything else
/// happens to its node; a stop that cut the volume instead would lose the rows the kernel had
/// not written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_row_survives_a_config_roll_an_upgrade_and_a_pause_under_nosync() {
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let (writer, _old, login) = writing_with(&env, |q| {
        q.spec.image = "questdb/questdb:9.1.0".into();
        q.spec.config.commit_mode = Some(CommitMode::Nosync);
    })
    .await;
    change_under_load(
        &env,
        &writer,
        serde_json::json!({"spec": {"config": {"server": {"cairo.max.uncommitted.rows": "100000"}}}}),
        |_| true,
        "config roll",
    )
    .await;
    change_under_load(
        &env,
        &writer,
        serde_json::json!({"spec": {"image": format!("questdb/questdb:{}", crate::database::VERSION)}}),
        |s| s.version.as_deref() == Some(crate::database::VERSION),
        "version upgrade",
    )
    .await;
    env.qdbs()
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("paused");
    wait_for_within(
        &env.qdbs(),
        "db1",
        "paused",
        TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.phase.is_some_and(|p| p.as_str() == "Paused"))
        },
    )
    .await;
    wait_until("paused: no QuestDB runs", || {
        let none = questdb_pids(&env).is_empty();
        async move { none }
    })
    .await;
    change_under_load(
        &env,
        &writer,
        serde_json::json!({"spec": {"paused": false}}),
        |s| s.instance_id.is_some(),
        "unpause",
    )
    .await;
    assert_no_acknowledged_row_lost(&env, writer, &login, "config roll, upgrade, pause").await;
    env.stop().await;
}

/// A backup asked for while the database moves to a new node waits (`DatabaseBusy`) instead
/// of checkpointing a process about to stop, then succeeds on the new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_asked_for_during_a_node_move_waits_for_it_and_then_succeeds() {
    use questdb_operator::api::{BackupStep, QuestDBBackup};
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let (writer, old, _login) = writing(&env, None).await;
    move_to_new_image(&env).await;
    wait_for_within(
        &env.qdbs(),
        "db1",
        "a node move under way",
        TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(questdb_operator::plan::node_move::in_progress)
        },
    )
    .await;
    let backups: Api<QuestDBBackup> = Api::namespaced(env.client.clone(), NS);
    let b = QuestDBBackup::new("during-move", crate::backup::backup_spec("db1"));
    backups
        .create(&Default::default(), &b)
        .await
        .expect("backup created");
    wait_for_within(
        &backups,
        "during-move",
        "Pending while the database moves",
        TIMEOUT,
        |b: Option<&QuestDBBackup>| {
            b.and_then(|b| b.status.as_ref())
                .and_then(|s| s.reason.as_deref())
                == Some("DatabaseBusy")
        },
    )
    .await;
    let b = wait_for_within(
        &backups,
        "during-move",
        "Succeeded after the move",
        TIMEOUT,
        |b: Option<&QuestDBBackup>| {
            b.and_then(|b| b.status.as_ref()?.step) == Some(BackupStep::Succeeded)
        },
    )
    .await;
    let q: QuestDB = env.qdbs().get("db1").await.unwrap();
    let status = q.status.unwrap_or_default();
    assert_ne!(status.instance_id.as_deref(), Some(old.as_str()), "moved");
    assert!(
        b.status
            .unwrap_or_default()
            .tables
            .iter()
            .any(|t| t.name == TABLE),
        "the checkpoint was taken on the moved database"
    );
    writer.finish().await;
    env.stop().await;
}

/// A backup that holds the database's checkpoint when a node move reaches its switch (here:
/// its snapshot not cut yet) would fail if the move stopped the database: the move waits at
/// `NodeReady` and says why, the backup succeeds, then the move switches, and every
/// acknowledged row is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_reaching_its_switch_waits_for_a_backup_that_holds_the_checkpoint() {
    use questdb_operator::api::{BackupStep, QuestDBBackup};
    use std::sync::atomic::Ordering;
    let env = CloudEnv::start_with_real_databases(settings()).await;
    let (writer, old, login) = writing(&env, None).await;
    env.cp.csi.hold_cut.store(true, Ordering::SeqCst);
    let backups: Api<QuestDBBackup> = Api::namespaced(env.client.clone(), NS);
    let b = QuestDBBackup::new("before-move", crate::backup::backup_spec("db1"));
    backups
        .create(&Default::default(), &b)
        .await
        .expect("backup created");
    let step_is = |step: BackupStep| {
        move |b: Option<&QuestDBBackup>| b.and_then(|b| b.status.as_ref()?.step) == Some(step)
    };
    wait_for_within(
        &backups,
        "before-move",
        "the backup holding the checkpoint, its snapshot not cut",
        TIMEOUT,
        step_is(BackupStep::Snapshotting),
    )
    .await;
    move_to_new_image(&env).await;
    let held = wait_for_within(
        &env.qdbs(),
        "db1",
        "the switch held for the backup",
        TIMEOUT,
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()?.node_move.as_ref()?.message.clone())
                .is_some_and(|m| m.contains("waits for backup before-move"))
        },
    )
    .await;
    let status = held.status.expect("status");
    assert!(
        status
            .node_move
            .as_ref()
            .is_some_and(|u| u.phase == "NodeReady"),
        "held before the stop: {:?}",
        status.node_move
    );
    assert_eq!(status.instance_id.as_deref(), Some(old.as_str()));
    let b = backups.get("before-move").await.expect("backup");
    assert_eq!(
        b.status.and_then(|s| s.step),
        Some(BackupStep::Snapshotting)
    );

    // The snapshot is cut: the backup releases the checkpoint and succeeds, then the move
    // switches.
    env.cp.csi.hold_cut.store(false, Ordering::SeqCst);
    wait_for_within(
        &backups,
        "before-move",
        "the backup Succeeded",
        TIMEOUT,
        step_is(BackupStep::Succeeded),
    )
    .await;
    wait_for_within(
        &env.qdbs(),
        "db1",
        "moved to the new node, Running",
        TIMEOUT,
        |q: Option<&QuestDB>| {
            is_running().matches_object(q)
                && q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                    s.instance_id.as_deref() != Some(old.as_str())
                        && !questdb_operator::plan::node_move::in_progress(s)
                })
        },
    )
    .await;
    assert_no_acknowledged_row_lost(&env, writer, &login, "a move held for a backup").await;
    env.stop().await;
}
