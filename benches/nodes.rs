//! The node-health controller and the failover breaker at 1,000 dedicated nodes (issue 29,
//! item 4), on the real control plane (questdb-testenv), with a real kubelet's node-health
//! timings (`QDB_TESTENV_TIMINGS=kubelet`, set by the bench itself: 40 s Lease renewed every
//! 10 s, NodeStatus every 5 min, kube-controller-manager's 5 s monitor period and 50 s grace).
//!
//! ```text
//! cargo bench --profile dev --bench nodes                  # 1,000 dedicated nodes
//! cargo bench --profile dev --bench nodes -- --quick       # 100 nodes, 20 s at rest
//! cargo bench --profile dev --bench nodes -- --nodes 300 --rest 30
//! ```
//!
//! **The operator** runs in a child process of its own (so its RSS and CPU are its own), with
//! the in-memory EC2 inside it, as the integration tests' failover tests and the sandbox wire
//! it: the fake EC2 replaces the AWS SDK client, so it has to live in the operator's process.
//! The child is this bench binary run again with `--operator-child`: the operator's
//! `manager::run_with`, the memory cloud, and a forwarder that writes every instance event
//! (running with its user data, stopped, terminated) to its stdout, where the bench joins the
//! instances as Nodes (`questdb_testenv::spawn_instance_join`, as the tests do in-process).
//! The child's RSS therefore includes the fake EC2's records (every instance with its
//! rendered user data, a few KiB each) and the bench binary's code instead of the operator
//! binary's; its CPU includes the fake EC2's bookkeeping.
//!
//! **The databases** are fake (`Databases::Fake`: the test kubelets report pods Running and
//! Ready, no QuestDB process) but everything else is real: each QuestDB has `spec.node`, the
//! operator launches its instance in the fake EC2, the instance joins from its rendered user
//! data (labels, taints, provider id), the fake EBS CSI provisions and attaches its volume, the
//! pod runs on its node, and every test kubelet renews its Lease every 10 s (one tokio task
//! per node: 100 renewals/s at 1,000 nodes, what 1,000 real kubelets send). The operator's
//! write-health poll is off (a day): the fake pods' addresses (127.255.x.y) answer nothing, and
//! a thousand refused connections a minute are not what this bench measures; instance
//! addresses are 127.231.x.y.
//!
//! Then:
//! 1. **at rest**: the operator's RSS and CPU over `--rest` seconds (60 s), node-health
//!    reconciles/s and their p50/p99 in that window (from `controller_runtime_reconcile_time_seconds`
//!    buckets, the window's difference);
//! 2. **one node silenced** (the test kubelet partitioned: no Lease renewal, the instance still
//!    runs): the time from its threshold being crossed (its last `renewTime` + the database's
//!    40 s threshold, on the wall clock) to the failover's start, as `status.failover.startedAt`
//!    (the operator records the Fencing step there before it calls StopInstances), as the
//!    bench's watch sees that record, and as the fake EC2 reports the instance stopped
//!    (StopInstances + the fake's 100 ms stop); goal ≤ 1 s after the threshold;
//! 3. **the breaker**: a quarter of the nodes silenced at once; no failover may start within
//!    their threshold + 20 s; prints the breaker's decision (the databases' `Failover`
//!    condition, `questdb_operator_failovers_suppressed_total`, the unhealthy-nodes gauge).
//!
//! Prints the figures, then as its last line one JSON object. Fails if no failover starts for
//! the lone silenced node, or if one starts while the breaker should hold them.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use questdb_operator::api::{NodeSpec, QuestDB};
use questdb_operator::cloud::memory::{InstanceEvent, MemoryCloud, MemoryEc2Options};
use questdb_operator::cloud::{CloudConfig, EksCluster, RateLimit};
use questdb_operator::desired::testing;
use questdb_operator::manager::{self, Cloud, CloudSettings, ManagerHandle, ManagerOptions};
use questdb_operator::plan::failover::effective_threshold;
use questdb_testenv::kubelet::Kubelets;
use questdb_testenv::{spawn_instance_join, InstanceChange};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use support::control_plane::Cluster;
use support::operator::{self, Memory, Operator};
use support::prom::{self, quantile};
use support::{cluster, wait};

const NS: &str = "nodes";
const AMI: &str = "ami-0123456789abcdef0";
const ZONES: [&str; 2] = ["sim-zone-a", "sim-zone-b"];
const CHILD_FLAG: &str = "--operator-child";
const NODE_HEALTH: &str = "node-health";
const QUESTDB: &str = "questdb";

const DEFAULT_NODES: usize = 1000;
const DEFAULT_REST: Duration = Duration::from_secs(60);
const QUICK_NODES: usize = 100;
const QUICK_REST: Duration = Duration::from_secs(20);
/// Each database's `spec.failover.unhealthyAfterSeconds`: the lowest the CRD allows with a
/// 40 s Lease (no threshold is shorter than the kubelets' Lease).
const UNHEALTHY_AFTER_SECONDS: i64 = 40;
/// QuestDB creates in flight, as a provisioning service would send them.
const CREATES_IN_FLIGHT: usize = 32;
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// The QuestDB controller counts as settled when it has started no reconcile for this long.
const QUIET_FOR: Duration = Duration::from_secs(3);
const QUIET_TIMEOUT: Duration = Duration::from_secs(180);
/// How long after the last silenced node's threshold the breaker phase still watches.
const BREAKER_MARGIN: Duration = Duration::from_secs(20);

struct Settings {
    nodes: usize,
    rest: Duration,
}

impl Settings {
    fn from_args() -> anyhow::Result<Settings> {
        let mut settings = Settings {
            nodes: DEFAULT_NODES,
            rest: DEFAULT_REST,
        };
        for (flag, value) in support::args::flags(&["--nodes", "--rest"])? {
            match flag.as_str() {
                "--quick" => {
                    settings.nodes = QUICK_NODES;
                    settings.rest = QUICK_REST;
                }
                "--nodes" => {
                    let v = value.unwrap_or_default();
                    settings.nodes = v
                        .parse()
                        .with_context(|| format!("--nodes {v:?} is not a count"))?;
                }
                "--rest" => {
                    let v = value.unwrap_or_default();
                    settings.rest = Duration::from_secs(
                        v.parse()
                            .with_context(|| format!("--rest {v:?} is not seconds"))?,
                    );
                }
                other => bail!("unknown argument {other:?}; use --nodes N, --rest SECS or --quick"),
            }
        }
        // Five silenced nodes at least, so a quarter is more than a fifth (the breaker's limit).
        if settings.nodes < 20 {
            bail!("need at least 20 nodes");
        }
        Ok(settings)
    }
}

fn unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn timestamp_secs(t: &k8s_openapi::jiff::Timestamp) -> f64 {
    t.as_microsecond() as f64 / 1e6
}

// ---------------------------------------------------------------------------------------------
// The child: the operator with the memory cloud inside it.

struct ChildArgs {
    kubeconfig: PathBuf,
    metrics: SocketAddr,
    health: SocketAddr,
}

impl ChildArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            CHILD_FLAG.into(),
            self.kubeconfig.display().to_string(),
            self.metrics.to_string(),
            self.health.to_string(),
        ]
    }

    fn parse(args: &[String]) -> anyhow::Result<ChildArgs> {
        let [kubeconfig, metrics, health] = args else {
            bail!("{CHILD_FLAG} KUBECONFIG METRICS_ADDR HEALTH_ADDR");
        };
        Ok(ChildArgs {
            kubeconfig: kubeconfig.into(),
            metrics: metrics.parse().context("metrics address")?,
            health: health.parse().context("health address")?,
        })
    }
}

/// What the integration tests give the memory cloud, with the shipped user-data template (the
/// test kubelets join from it as nodeadm would) and an EC2 budget of 100 calls/s so that
/// launching 1,000 instances is not the setup's bottleneck (the shipped default is 10/s; at rest
/// and for one failover the bucket is full either way).
fn cloud_config() -> CloudConfig {
    let mut config = CloudConfig::new("bench", "sim-region-1");
    for zone in ZONES {
        config
            .subnets_by_zone
            .insert(zone.into(), format!("subnet-{zone}"));
    }
    config.hosted_zone_id = Some("ZBENCH".into());
    config.user_data_template = questdb_operator::app::DEFAULT_USER_DATA_TEMPLATE.into();
    config.eks = EksCluster {
        api_endpoint: Some("https://bench.eks.invalid".into()),
        certificate_authority: Some("YmVuY2gtY2E=".into()),
        service_cidr: Some("10.100.0.0/16".into()),
    };
    config.rate_limit = RateLimit {
        per_second: 100.0,
        burst: 100,
    };
    config
}

fn child_main(args: &[String]) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = ChildArgs::parse(args).and_then(|args| {
        // The operator binary's runtime: tokio's defaults (a worker per core).
        tokio::runtime::Runtime::new()
            .context("starting tokio")?
            .block_on(run_child(args))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("operator child: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_child(args: ChildArgs) -> anyhow::Result<()> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let handle = ManagerHandle::default();
    let ec2 = MemoryEc2Options {
        // Loopback, though nothing connects to an instance's address here.
        private_ip_prefix: "127.231".into(),
        ..MemoryEc2Options::default()
    };
    let cloud = MemoryCloud::new(cloud_config(), ec2, handle.metrics.aws_observer())?;
    forward_instance_events(&cloud);
    let opts = ManagerOptions {
        metrics_addr: Some(args.metrics),
        health_addr: Some(args.health),
        // Off: fake pods answer nothing; their refusals are not what this bench measures.
        write_health_interval: Duration::from_secs(86_400),
        cloud: Some(Cloud {
            nodes: cloud.nodes.clone(),
            dns: Some(cloud.dns.clone()),
            settings: CloudSettings {
                node_lease_duration: questdb_testenv::timings::node_lease_duration(),
                csi_driver: Some(questdb_testenv::csi::DRIVER.into()),
                ..CloudSettings::default()
            },
        }),
        ..ManagerOptions::default()
    };
    // Killed by the bench (or with it): never shut down in an orderly way.
    manager::run_with(opts, config, CancellationToken::new(), handle).await
}

/// Every instance event as one JSON line on stdout, written by a thread of its own so a slow
/// reader never makes the broadcast channel drop events.
fn forward_instance_events(cloud: &MemoryCloud) {
    let mut events = cloud.ec2.subscribe();
    let ec2 = cloud.ec2.clone();
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        for line in lines {
            if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let line = match events.recv().await {
                Ok(InstanceEvent::Running(i)) => json!({
                    "kind": "running",
                    "user_data": ec2.user_data(&i.id).unwrap_or_default(),
                    "id": i.id,
                    "zone": i.zone,
                    "private_ip": i.private_ip,
                    "at": unix_secs(),
                }),
                Ok(InstanceEvent::Stopping { id, graceful }) => {
                    json!({"kind": "stopping", "id": id, "graceful": graceful, "at": unix_secs()})
                }
                Ok(InstanceEvent::Stopped(id)) => {
                    json!({"kind": "stopped", "id": id, "at": unix_secs()})
                }
                Ok(InstanceEvent::Terminated(id)) => {
                    json!({"kind": "terminated", "id": id, "at": unix_secs()})
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::error!("the instance event forwarder lost {n} events");
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(line.to_string()).is_err() {
                return;
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The bench side.

/// What the bench learns from the operator child's EC2.
#[derive(Clone, Default)]
struct Ec2Seen {
    running: Arc<Mutex<usize>>,
    /// Instance id → when the fake EC2 reported it stopped (unix seconds).
    stopped: Arc<Mutex<HashMap<String, f64>>>,
}

/// Reads the child's instance events and joins, stops and removes the test kubelets as EC2
/// says, as `spawn_instance_join` does for the in-process tests.
fn join_instances(
    stdout: std::process::ChildStdout,
    kubelets: Kubelets,
    stop: CancellationToken,
) -> Ec2Seen {
    let seen = Ec2Seen::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<InstanceChange>();
    let s = seen.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                eprintln!("nodes bench: unreadable instance event {line:?}");
                continue;
            };
            let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            let change = match v["kind"].as_str() {
                Some("running") => {
                    *s.running.lock().unwrap() += 1;
                    InstanceChange::Running {
                        id: text("id"),
                        zone: text("zone"),
                        private_ip: v["private_ip"].as_str().map(str::to_string),
                        user_data: text("user_data"),
                    }
                }
                Some("stopped") => {
                    let at = v["at"].as_f64().unwrap_or_default();
                    s.stopped.lock().unwrap().insert(text("id"), at);
                    InstanceChange::Stopped { id: text("id") }
                }
                Some("terminated") => InstanceChange::Terminated { id: text("id") },
                Some("stopping") => InstanceChange::Stopping {
                    id: text("id"),
                    graceful: v["graceful"].as_bool().unwrap_or_default(),
                },
                _ => continue,
            };
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    let changes =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    spawn_instance_join(kubelets, changes, stop);
    seen
}

fn db_name(i: usize) -> String {
    format!("db-{i:05}")
}

async fn create_questdbs(client: &Client, n: usize) -> anyhow::Result<()> {
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = db_name(i);
                let mut q = testing::questdb(&name, NS);
                q.metadata = ObjectMeta {
                    name: Some(name),
                    namespace: Some(NS.into()),
                    ..ObjectMeta::default()
                };
                q.spec.node = Some(NodeSpec {
                    image: AMI.into(),
                    instance_type: "m6i.large".into(),
                    zone: ZONES[i % ZONES.len()].into(),
                    ..Default::default()
                });
                q.spec.failover.unhealthy_after_seconds = UNHEALTHY_AFTER_SECONDS;
                api.create(&PostParams::default(), &q).await
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("creating QuestDBs")
}

fn is_ready(q: &QuestDB) -> bool {
    q.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Watches the namespace's QuestDBs until `n` are Ready at once, saying how far it got every
/// 30 s and checking the operator every second.
async fn all_ready(
    client: &Client,
    operator: &mut Operator,
    kubelets: &Kubelets,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut ready: BTreeSet<String> = BTreeSet::new();
    let mut relisting: BTreeSet<String> = BTreeSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let started = Instant::now();
    let mut said = Instant::now();
    while ready.len() < n {
        tokio::select! {
            ev = events.next() => {
                match ev.context("the QuestDB watch ended")?.context("watching QuestDBs")? {
                    watcher::Event::Init => relisting.clear(),
                    watcher::Event::InitApply(q) => {
                        if is_ready(&q) {
                            relisting.insert(q.name_any());
                        }
                    }
                    watcher::Event::InitDone => ready = std::mem::take(&mut relisting),
                    watcher::Event::Apply(q) if is_ready(&q) => {
                        ready.insert(q.name_any());
                    }
                    watcher::Event::Apply(q) | watcher::Event::Delete(q) => {
                        ready.remove(&q.name_any());
                    }
                }
            }
            _ = tick.tick() => {
                operator.ensure_running()?;
                if started.elapsed() > timeout {
                    bail!("only {} of {n} QuestDBs Ready after {timeout:?}; operator log: {}", ready.len(), operator.log().display());
                }
                if said.elapsed() >= Duration::from_secs(30) {
                    said = Instant::now();
                    eprintln!(
                        "  {:>5.0} s: {} of {n} QuestDBs Ready, {} nodes joined",
                        started.elapsed().as_secs_f64(),
                        ready.len(),
                        kubelets.names().len()
                    );
                }
            }
        }
    }
    Ok(())
}

/// Waits until the QuestDB controller has started no reconcile for [`QUIET_FOR`] and runs
/// none. False when it never settles within [`QUIET_TIMEOUT`] (figures are taken anyway).
async fn questdbs_settle(operator: &mut Operator, metrics: SocketAddr) -> anyhow::Result<bool> {
    let deadline = Instant::now() + QUIET_TIMEOUT;
    let mut last = (f64::NAN, Instant::now());
    loop {
        operator.ensure_running()?;
        let m = prom::scrape(metrics).await?;
        let total = m.sum("controller_runtime_reconcile_total", "controller", QUESTDB);
        let busy = m.sum("controller_runtime_active_workers", "controller", QUESTDB) > 0.0;
        if total != last.0 || busy {
            last = (total, Instant::now());
        } else if last.1.elapsed() >= QUIET_FOR {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The QuestDBs by name: the node and instance each runs on.
async fn placements(client: &Client) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    let list = api
        .list(&ListParams::default())
        .await
        .context("listing QuestDBs")?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|q| {
            let s = q.status.as_ref()?;
            Some((q.name_any(), (s.node_name.clone()?, s.instance_id.clone()?)))
        })
        .collect())
}

/// The operator's requests that are not reads of its caches' kind, as `verb resource n`:
/// writes (events included) and uncached GETs, counted by the proxy in front of the apiserver.
fn requests(counts: &questdb_testenv::RequestCounts) -> Vec<String> {
    counts
        .0
        .iter()
        .filter(|((v, _), n)| **n > 0 && (v.is_write() || *v == questdb_testenv::Verb::Get))
        .map(|((v, r), n)| format!("{} {r} {n}", v.as_str()))
        .collect()
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2} ms"))
}

#[derive(Default)]
struct Rest {
    secs: f64,
    operator_cpu_secs: f64,
    memory: Option<Memory>,
    apiserver_cpu_secs: f64,
    etcd_cpu_secs: f64,
    bench_cpu_secs: f64,
    node_health_per_sec: f64,
    node_health_p50_ms: Option<f64>,
    node_health_p99_ms: Option<f64>,
    node_health_mean_ms: Option<f64>,
    /// The share of the window's node-health reconciles in the histogram's first bucket
    /// (≤ 5 ms, controller-runtime's buckets): quantiles inside it are interpolations.
    node_health_first_bucket: Option<f64>,
    questdb_per_sec: f64,
    questdbs_settled: bool,
    /// The operator's writes and uncached reads in the window.
    requests: Vec<String>,
}

async fn at_rest(
    sim: &Cluster,
    operator: &mut Operator,
    metrics: SocketAddr,
    window: Duration,
) -> anyhow::Result<Rest> {
    let questdbs_settled = questdbs_settle(operator, metrics).await?;
    let pid_of = |name: &str| {
        sim.pids()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p)
    };
    let cpu = |pid: Option<u32>| pid.map_or(Ok(0.0), operator::cpu_secs);
    let (apiserver, etcd) = (pid_of("kube-apiserver"), pid_of("etcd"));
    let bench = std::process::id();
    let before = prom::scrape(metrics).await?;
    let cpu0 = (
        operator::cpu_secs(operator.pid())?,
        cpu(apiserver)?,
        cpu(etcd)?,
        operator::cpu_secs(bench)?,
    );
    sim.reset_request_counts();
    let started = Instant::now();
    // A measurement window, not a wait for something: the figures are rates over it.
    tokio::time::sleep(window).await;
    operator.ensure_running()?;
    let after = prom::scrape(metrics).await?;
    let counted = sim.request_counts();
    let secs = started.elapsed().as_secs_f64();
    let memory = operator.memory()?;
    let count =
        |m: &prom::Metrics, c: &str| m.sum("controller_runtime_reconcile_total", "controller", c);
    let time = |m: &prom::Metrics| {
        m.sum(
            "controller_runtime_reconcile_time_seconds_sum",
            "controller",
            NODE_HEALTH,
        )
    };
    let buckets = |m: &prom::Metrics| {
        m.histogram(
            "controller_runtime_reconcile_time_seconds",
            "controller",
            NODE_HEALTH,
        )
    };
    let window_buckets = prom::since(&buckets(&after), &buckets(&before));
    let reconciles = count(&after, NODE_HEALTH) - count(&before, NODE_HEALTH);
    Ok(Rest {
        secs,
        operator_cpu_secs: operator::cpu_secs(operator.pid())? - cpu0.0,
        memory: Some(memory),
        apiserver_cpu_secs: cpu(apiserver)? - cpu0.1,
        etcd_cpu_secs: cpu(etcd)? - cpu0.2,
        bench_cpu_secs: operator::cpu_secs(bench)? - cpu0.3,
        node_health_per_sec: reconciles / secs,
        node_health_p50_ms: quantile(&window_buckets, 0.50).map(|s| s * 1000.0),
        node_health_p99_ms: quantile(&window_buckets, 0.99).map(|s| s * 1000.0),
        node_health_first_bucket: window_buckets
            .first()
            .zip(window_buckets.last())
            .filter(|(_, all)| all.count > 0.0)
            .map(|(first, all)| first.count / all.count),
        node_health_mean_ms: (reconciles > 0.0)
            .then(|| (time(&after) - time(&before)) / reconciles * 1000.0),
        questdb_per_sec: (count(&after, QUESTDB) - count(&before, QUESTDB)) / secs,
        questdbs_settled,
        requests: requests(&counted),
    })
}

/// The lone silenced node's failover, timed from its threshold.
struct Failover {
    node: String,
    reason: String,
    /// `status.failover.startedAt` − the threshold (the operator's clock, written with the
    /// Fencing record before StopInstances; a metav1.Time, to the second, truncated).
    started_after: f64,
    /// When the bench's watch saw that record − the threshold: an upper bound of the start,
    /// to the millisecond, so the goal is judged on it.
    seen_after: f64,
    /// When the fake EC2 reported the instance stopped − the threshold.
    stopped_after: Option<f64>,
    /// The operator's own `questdb_operator_failover_detection_latency_seconds` (its silence
    /// past the threshold when it decided, on its monotonic clock).
    detection_secs: f64,
}

fn failover_started(q: &QuestDB) -> Option<&questdb_operator::api::FailoverStatus> {
    q.status.as_ref()?.failover.as_ref()
}

async fn last_renew(client: &Client, node: &str) -> anyhow::Result<f64> {
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get(node)
        .await
        .with_context(|| format!("reading the Lease of {node}"))?;
    lease
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| timestamp_secs(&t.0))
        .with_context(|| format!("the Lease of {node} has no renewTime"))
}

async fn one_failover(
    client: &Client,
    sim: &Cluster,
    operator: &mut Operator,
    metrics: SocketAddr,
    ec2: &Ec2Seen,
    threshold: Duration,
) -> anyhow::Result<Failover> {
    let name = db_name(0);
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    let q = api.get(&name).await?;
    let status = q.status.clone().unwrap_or_default();
    let (node, instance) = status
        .node_name
        .zip(status.instance_id)
        .with_context(|| format!("{name} has no node"))?;
    sim.kubelets()
        .get(&node)
        .with_context(|| format!("no kubelet for {node}"))?
        .partition();
    eprintln!("failover: {node} ({name}) partitioned: its Lease is no longer renewed");
    let wait = kube::runtime::wait::await_condition(api.clone(), &name, |q: Option<&QuestDB>| {
        q.and_then(failover_started).is_some()
    });
    let q = tokio::time::timeout(threshold + Duration::from_secs(60), wait)
        .await
        .with_context(|| {
            format!(
                "no failover of {name} within its threshold + 60 s; operator log: {}",
                operator.log().display()
            )
        })??
        .context("the QuestDB is gone")?;
    let seen = unix_secs();
    operator.ensure_running()?;
    let record = failover_started(&q).cloned().unwrap_or_default();
    // A metav1.Time, to the second (truncated): the bench's own watch is the finer figure.
    let started: k8s_openapi::jiff::Timestamp =
        record.started_at.as_ref().context("no startedAt")?.0;
    let threshold_at = last_renew(client, &node).await? + threshold.as_secs_f64();
    let stopped = ec2.stopped.clone();
    let id = instance.clone();
    // The fence follows the record at once; an absent stop is reported, not waited for long.
    let _ = wait::until(
        "the fence's StopInstances",
        Duration::from_secs(30),
        operator,
        || {
            let s = stopped.lock().unwrap().contains_key(&id);
            async move { s }
        },
    )
    .await;
    let stopped_at = ec2.stopped.lock().unwrap().get(&instance).copied();
    let m = prom::scrape(metrics).await?;
    Ok(Failover {
        node,
        reason: record.reason.map(|r| r.to_string()).unwrap_or_default(),
        started_after: timestamp_secs(&started) - threshold_at,
        seen_after: seen - threshold_at,
        stopped_after: stopped_at.map(|t| t - threshold_at),
        detection_secs: m.total("questdb_operator_failover_detection_latency_seconds_sum"),
    })
}

struct Breaker {
    silenced: usize,
    managed: usize,
    watched_secs: f64,
    /// Databases whose failover started while the breaker should have held them.
    started: Vec<String>,
    /// Stops the fake EC2 reported in the window (the first failover's replacement aside).
    stops: usize,
    /// Silenced databases whose `Failover` condition says the breaker held them back.
    suppressed: usize,
    suppressed_total: f64,
    unhealthy_gauge: f64,
    example: String,
    /// Reconciles per second in the window, by controller.
    questdb_per_sec: f64,
    node_health_per_sec: f64,
    /// The operator's writes and uncached reads in the window.
    requests: Vec<String>,
}

async fn breaker(
    client: &Client,
    sim: &Cluster,
    operator: &mut Operator,
    metrics: SocketAddr,
    ec2: &Ec2Seen,
    threshold: Duration,
) -> anyhow::Result<Breaker> {
    let placed = placements(client).await?;
    let managed = placed.len();
    // A quarter of the dedicated nodes: more than the fifth the breaker allows.
    let silenced: Vec<(String, String)> = placed
        .iter()
        .filter(|(name, _)| **name != db_name(0))
        .take(managed / 4)
        .map(|(name, (node, _))| (name.clone(), node.clone()))
        .collect();
    let stops_before = ec2.stopped.lock().unwrap().len();
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    // Watching from before the first silence: any failover start in the window is seen.
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut started: BTreeSet<String> = BTreeSet::new();
    let victims: BTreeSet<String> = silenced.iter().map(|(n, _)| n.clone()).collect();
    let note = |q: &QuestDB, started: &mut BTreeSet<String>| {
        if victims.contains(&q.name_any()) && failover_started(q).is_some() {
            started.insert(q.name_any());
        }
    };
    loop {
        match events.next().await.context("the QuestDB watch ended")?? {
            watcher::Event::InitDone => break,
            watcher::Event::InitApply(q) => note(&q, &mut started),
            _ => {}
        }
    }
    if !started.is_empty() {
        bail!("failovers under way before the breaker phase: {started:?}");
    }
    for (_, node) in &silenced {
        sim.kubelets()
            .get(node)
            .with_context(|| format!("no kubelet for {node}"))?
            .partition();
    }
    let from = Instant::now();
    sim.reset_request_counts();
    let before = prom::scrape(metrics).await?;
    eprintln!(
        "breaker: {} of {managed} dedicated nodes partitioned at once",
        silenced.len()
    );
    // Every silenced node's last renewal was before `from`: all are past the threshold by
    // `from + threshold`.
    let until = from + threshold + BREAKER_MARGIN;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            ev = events.next() => {
                match ev.context("the QuestDB watch ended")?.context("watching QuestDBs")? {
                    watcher::Event::Apply(q) | watcher::Event::InitApply(q) => note(&q, &mut started),
                    _ => {}
                }
            }
            _ = tick.tick() => {
                operator.ensure_running()?;
                if Instant::now() >= until {
                    break;
                }
            }
        }
    }
    let watched_secs = from.elapsed().as_secs_f64();
    let counted = sim.request_counts();
    let after = prom::scrape(metrics).await?;
    let rate = |c: &str| {
        let count =
            |m: &prom::Metrics| m.sum("controller_runtime_reconcile_total", "controller", c);
        (count(&after) - count(&before)) / watched_secs
    };
    let stops = ec2.stopped.lock().unwrap().len() - stops_before;
    let list = api.list(&ListParams::default()).await?;
    let mut suppressed = 0;
    let mut example = String::new();
    for q in list
        .items
        .iter()
        .filter(|q| victims.contains(&q.name_any()))
    {
        let condition = q
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failover"));
        if let Some(c) = condition.filter(|c| {
            c.reason == "FailoverSuppressed" && c.message.contains("TooManyUnhealthyNodes")
        }) {
            suppressed += 1;
            if example.is_empty() {
                example = format!("{}: {}", q.name_any(), c.message);
            }
        }
    }
    let m = prom::scrape(metrics).await?;
    Ok(Breaker {
        silenced: silenced.len(),
        managed,
        watched_secs,
        started: started.into_iter().collect(),
        stops,
        suppressed,
        suppressed_total: m.sum(
            "questdb_operator_failovers_suppressed_total",
            "reason",
            "TooManyUnhealthyNodes",
        ),
        unhealthy_gauge: m.total("questdb_operator_unhealthy_dedicated_nodes"),
        example,
        questdb_per_sec: rate(QUESTDB),
        node_health_per_sec: rate(NODE_HEALTH),
        requests: requests(&counted),
    })
}

struct Figures {
    nodes: usize,
    setup_secs: f64,
    rest: Rest,
    failover: Failover,
    breaker: Breaker,
    total_secs: f64,
}

async fn run(settings: &Settings) -> anyhow::Result<Figures> {
    let begun = Instant::now();
    let n = settings.nodes;
    let threshold = effective_threshold(
        UNHEALTHY_AFTER_SECONDS,
        questdb_testenv::timings::node_lease_duration(),
    );
    // No shared workers: every pod has a dedicated node.
    let sim = Cluster::start(&[]).await?;
    let client = sim.bench_client();
    cluster::install_crd(&client, STEP_TIMEOUT).await?;
    cluster::create_namespace(&client, NS).await?;
    // Kept after a failed run so the operator's log can be read.
    let dir = tempfile::tempdir()
        .context("creating a temporary directory")?
        .keep();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, sim.operator_kubeconfig()).context("writing the kubeconfig")?;
    let args = ChildArgs {
        kubeconfig,
        metrics: operator::free_addr()?,
        health: operator::free_addr()?,
    };
    let mut command = Command::new(std::env::current_exe().context("this bench's binary")?);
    command.args(args.to_args());
    let mut op = Operator::spawn(command, dir.join("operator.log"), true)?;
    let stop = CancellationToken::new();
    let _stop_joins = stop.clone().drop_guard();
    let ec2 = join_instances(
        op.take_stdout().context("the child's stdout")?,
        sim.kubelets().clone(),
        stop,
    );
    let health = args.health;
    wait::until(
        "the operator's /readyz",
        STEP_TIMEOUT,
        &mut op,
        || async move { operator::http_get(health, "/readyz").await.is_some() },
    )
    .await?;
    eprintln!(
        "{n} dedicated nodes: operator pid {}, log {}",
        op.pid(),
        op.log().display()
    );

    let setup = Instant::now();
    create_questdbs(&client, n).await?;
    let timeout = Duration::from_secs(300) + Duration::from_millis(1500) * n as u32;
    all_ready(&client, &mut op, sim.kubelets(), n, timeout).await?;
    let setup_secs = setup.elapsed().as_secs_f64();
    eprintln!(
        "{n} QuestDBs Ready on {} dedicated nodes ({} instances running) after {setup_secs:.1} s",
        sim.kubelets().names().len(),
        *ec2.running.lock().unwrap()
    );

    let rest = at_rest(&sim, &mut op, args.metrics, settings.rest).await?;
    eprintln!(
        "at rest: {:.1} node-health reconciles/s over {:.0} s",
        rest.node_health_per_sec, rest.secs
    );
    let failover = one_failover(&client, &sim, &mut op, args.metrics, &ec2, threshold).await?;
    eprintln!(
        "failover: started {:+.3} s after the threshold",
        failover.started_after
    );
    let breaker = breaker(&client, &sim, &mut op, args.metrics, &ec2, threshold).await?;
    Ok(Figures {
        nodes: n,
        setup_secs,
        rest,
        failover,
        breaker,
        total_secs: begun.elapsed().as_secs_f64(),
    })
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn print_figures(f: &Figures) {
    let r = &f.rest;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!(
        "node health at {} dedicated nodes ({} build)",
        f.nodes,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "  setup: {} QuestDBs Ready on their own nodes in {:.1} s",
        f.nodes, f.setup_secs
    );
    if let Some(m) = r.memory {
        println!(
            "  operator at rest: RSS {:.1} MiB (peak {:.1} MiB), CPU {:.2} s over {:.0} s ({:.1} % of a core)",
            mib(m.rss_kib),
            mib(m.hwm_kib),
            r.operator_cpu_secs,
            r.secs,
            r.operator_cpu_secs / r.secs * 100.0
        );
    }
    println!(
        "  node-health: {:.1} reconciles/s, p50 {} p99 {} (mean {}; {} of them <= 5 ms, the first bucket: \
         a quantile inside it is an interpolation); questdb {:.2} reconciles/s{}",
        r.node_health_per_sec,
        ms(r.node_health_p50_ms),
        ms(r.node_health_p99_ms),
        ms(r.node_health_mean_ms),
        r.node_health_first_bucket
            .map_or("-".into(), |f| format!("{:.1} %", f * 100.0)),
        r.questdb_per_sec,
        if r.questdbs_settled {
            ""
        } else {
            " (the QuestDB controller had not settled)"
        }
    );
    println!(
        "  meanwhile: kube-apiserver {:.1} s, etcd {:.1} s, bench (kubelets, CSI, proxy) {:.1} s of CPU; operator writes and GETs: {}",
        r.apiserver_cpu_secs,
        r.etcd_cpu_secs,
        r.bench_cpu_secs,
        if r.requests.is_empty() {
            "none".to_string()
        } else {
            r.requests.join(", ")
        }
    );
    let fo = &f.failover;
    println!(
        "  one node silenced ({}): failover ({}) started {:+.3} s after its threshold (status.failover.startedAt, to the second), \
         seen by the bench {:+.3} s, instance stopped {}; operator's detection latency {:.3} s; goal <= 1 s: {}",
        fo.node,
        fo.reason,
        fo.started_after,
        fo.seen_after,
        fo.stopped_after
            .map_or("never reported".into(), |s| format!("{s:+.3} s")),
        fo.detection_secs,
        if fo.seen_after <= 1.0 { "met" } else { "MISSED" }
    );
    let b = &f.breaker;
    println!(
        "  breaker: {} of {} dedicated nodes silenced at once; over {:.0} s, {} failovers started, {} instances stopped; \
         {} of {} databases report FailoverSuppressed (TooManyUnhealthyNodes), failovers_suppressed_total {}, unhealthy nodes gauge {}: {}",
        b.silenced,
        b.managed,
        b.watched_secs,
        b.started.len(),
        b.stops,
        b.suppressed,
        b.silenced,
        b.suppressed_total,
        b.unhealthy_gauge,
        if b.started.is_empty() && b.stops == 0 {
            "held (correct)"
        } else {
            "LET FAILOVERS THROUGH"
        }
    );
    if !b.example.is_empty() {
        println!("    e.g. {}", b.example);
    }
    println!(
        "    meanwhile: questdb {:.1} reconciles/s, node-health {:.1} reconciles/s; operator writes and GETs: {}",
        b.questdb_per_sec,
        b.node_health_per_sec,
        b.requests.join(", ")
    );
    println!("  whole run: {:.0} s", f.total_secs);
}

fn final_json(f: &Figures) -> serde_json::Value {
    let r = &f.rest;
    let b = &f.breaker;
    json!({
        "bench": "nodes",
        "nodes": f.nodes,
        "setup_secs": round(f.setup_secs, 1),
        "rest_secs": round(r.secs, 1),
        "operator_rss_mib": r.memory.map(|m| round(m.rss_kib as f64 / 1024.0, 1)),
        "operator_hwm_mib": r.memory.map(|m| round(m.hwm_kib as f64 / 1024.0, 1)),
        "operator_cpu_secs": round(r.operator_cpu_secs, 2),
        "apiserver_cpu_secs": round(r.apiserver_cpu_secs, 2),
        "etcd_cpu_secs": round(r.etcd_cpu_secs, 2),
        "node_health_reconciles_per_sec": round(r.node_health_per_sec, 2),
        "node_health_p50_ms": r.node_health_p50_ms.map(|v| round(v, 3)),
        "node_health_p99_ms": r.node_health_p99_ms.map(|v| round(v, 3)),
        "node_health_mean_ms": r.node_health_mean_ms.map(|v| round(v, 3)),
        "node_health_first_bucket_share": r.node_health_first_bucket.map(|v| round(v, 4)),
        "questdb_reconciles_per_sec": round(r.questdb_per_sec, 2),
        "failover_started_after_threshold_secs": round(f.failover.started_after, 3),
        "failover_seen_after_threshold_secs": round(f.failover.seen_after, 3),
        "failover_stopped_after_threshold_secs": f.failover.stopped_after.map(|v| round(v, 3)),
        "failover_detection_latency_secs": round(f.failover.detection_secs, 3),
        "breaker_silenced": b.silenced,
        "breaker_managed": b.managed,
        "breaker_failovers_started": b.started.len(),
        "breaker_instances_stopped": b.stops,
        "breaker_suppressed": b.suppressed,
        "breaker_questdb_reconciles_per_sec": round(b.questdb_per_sec, 2),
        "breaker_requests": b.requests,
        "rest_requests": r.requests,
        "total_secs": round(f.total_secs, 0),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // A real kubelet's node-health timings, on both sides, before anything reads them.
    std::env::set_var("QDB_TESTENV_TIMINGS", "kubelet");
    questdb_operator::metrics::install_crypto_provider();
    if args.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        return child_main(&args[2..]);
    }
    let settings = match Settings::from_args() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nodes bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodes bench: starting tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&settings)) {
        Ok(figures) => {
            print_figures(&figures);
            println!("{}", final_json(&figures));
            let _ = std::io::stdout().flush();
            let b = &figures.breaker;
            if b.started.is_empty() && b.stops == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "nodes bench: the breaker let failovers through: {:?}",
                    b.started
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("nodes bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
