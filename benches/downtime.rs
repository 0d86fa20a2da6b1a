//! What a change costs the database's clients (issue 50, item 4): client-observed
//! unavailability while the operator applies a reloadable setting, a pgwire password rotation,
//! a setting QuestDB cannot reload, a version upgrade, and an upgrade to a version that exits
//! at start, rolled back, each on a real QuestDB under the operator.
//!
//! ```text
//! cargo bench --profile dev --bench downtime                 # 3 runs of each change
//! cargo bench --profile dev --bench downtime -- --runs 1
//! cargo bench --profile dev --bench downtime -- --node-move-only   # or --no-node-move
//! ```
//!
//! The node move runs on the sandbox (`cargo build -p questdb-sandbox` first): a dedicated node
//! needs the in-memory EC2, which the sandbox wires; its client asks at `status.dnsIP`.
//!
//! A client asks `select 1` over HTTP every 100 ms (a 1 s answer limit), at the database pod's
//! address as the API reports it now (the test environment has no Service proxy, so a client
//! of the Service is stood in for by following the pod), with the database's HTTP login, which
//! none of the changes touches. A change begins when the bench writes it and ends when the
//! operator says it is applied (`status.config` for a reload; Ready on the new pod, or the new
//! version, for a restart), plus 3 s. Unavailability is the time from a failed question to the
//! next answered one, summed over the change; the longest such gap is printed too. A restart is
//! told by the pod's uid and its container's restart count.
//!
//! Prints a line per change, a table, then one JSON line.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use questdb_operator::api::{ConfigApplied, QuestDB};
use questdb_operator::questdb_http;
use questdb_testenv::{ControlPlane, ControlPlaneOptions, Databases, NodeRegistration};
use serde_json::json;

use support::operator::{self, Operator};
use support::{cluster, wait};

const NODE: &str = "worker-a1";
const TIMEOUT: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(100);
const ANSWER_LIMIT: Duration = Duration::from_secs(1);
const SETTLE: Duration = Duration::from_secs(3);
const OLD_VERSION: &str = "9.1.0";
const NEW_VERSION: &str = "9.2.0";
/// A version that exits at start on the failed upgrade's settings.
const FAILING_VERSION: &str = "9.3.2";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    ReloadableSetting,
    PgwireRotation,
    OtherSetting,
    VersionUpgrade,
    FailedUpgrade,
    /// Measured on the sandbox (its in-memory EC2 and a dedicated node), not with the others.
    NodeMove,
}

impl Change {
    const ALL: [Change; 5] = [
        Change::ReloadableSetting,
        Change::PgwireRotation,
        Change::OtherSetting,
        Change::VersionUpgrade,
        Change::FailedUpgrade,
    ];

    fn name(self) -> &'static str {
        match self {
            Change::ReloadableSetting => "reloadable setting (pg.net.connection.limit)",
            Change::PgwireRotation => "pgwire password rotation",
            Change::OtherSetting => "setting QuestDB cannot reload (cairo.max.uncommitted.rows)",
            Change::VersionUpgrade => "version upgrade (9.1.0 to 9.2.0)",
            Change::FailedUpgrade => {
                "failed upgrade rolled back (9.2.0 to 9.3.2, readyTimeout 30s)"
            }
            Change::NodeMove => "node move (a new node image, dedicated node)",
        }
    }
}

struct Measured {
    change: Change,
    unavailable: Duration,
    longest: Duration,
    restarted: bool,
    took: Duration,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut runs = 3;
    let mut node_moves = true;
    let mut node_move_only = false;
    for (flag, value) in support::args::flags(&["--runs"])? {
        match flag.as_str() {
            "--runs" => runs = value.context("--runs N")?.parse().context("--runs N")?,
            "--no-node-move" => node_moves = false,
            "--node-move-only" => node_move_only = true,
            other => bail!("unknown flag {other}"),
        }
    }
    let cp = ControlPlane::start(ControlPlaneOptions {
        nodes: vec![NodeRegistration::worker(NODE, "sim-zone-a")],
        databases: Databases::Real,
        ..ControlPlaneOptions::empty()
    })
    .await
    .context("starting the control plane")?;
    let client = cp.direct_client();
    cluster::install_crd(&client, TIMEOUT).await?;
    let mut op = operator::start_ready(
        &operator::binary()?,
        &cp.operator_kubeconfig_yaml(),
        TIMEOUT,
    )
    .await?;

    let mut measured = Vec::new();
    for run in 0..runs {
        let ns = format!("downtime-{run}");
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        for change in Change::ALL.into_iter().filter(|_| !node_move_only) {
            let m = one_change(&client, &mut op, &ns, change).await?;
            println!(
                "run {run}: {:<60} unavailable {:>6.1} s (longest gap {:.1} s), restarted: {}, applied in {:.1} s",
                change.name(),
                m.unavailable.as_secs_f64(),
                m.longest.as_secs_f64(),
                if m.restarted { "yes" } else { "no" },
                m.took.as_secs_f64()
            );
            measured.push(m);
        }
    }

    if node_moves {
        drop(op);
        drop(cp);
        for run in 0..runs {
            let m = node_move(run).await?;
            println!(
                "run {run}: {:<60} unavailable {:>6.1} s (longest gap {:.1} s), restarted: {}, applied in {:.1} s",
                Change::NodeMove.name(),
                m.unavailable.as_secs_f64(),
                m.longest.as_secs_f64(),
                if m.restarted { "yes" } else { "no" },
                m.took.as_secs_f64()
            );
            measured.push(m);
        }
    }

    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    println!();
    println!(
        "| change | runs | unavailable, s (median / max) | restarted | applied in, s (median) |"
    );
    println!("|---|---|---|---|---|");
    let mut summary = Vec::new();
    for change in Change::ALL.into_iter().chain([Change::NodeMove]) {
        let of: Vec<&Measured> = measured.iter().filter(|m| m.change == change).collect();
        if of.is_empty() {
            continue;
        }
        let down: Vec<f64> = of.iter().map(|m| m.unavailable.as_secs_f64()).collect();
        let max = down.iter().copied().fold(0.0, f64::max);
        let took = median(of.iter().map(|m| m.took.as_secs_f64()).collect());
        let restarted = of.iter().filter(|m| m.restarted).count();
        println!(
            "| {} | {} | {:.1} / {:.1} | {restarted} of {} | {took:.1} |",
            change.name(),
            of.len(),
            median(down.clone()),
            max,
            of.len()
        );
        summary.push(json!({"change": change.name(), "runs": of.len(),
            "unavailable_s_median": median(down), "unavailable_s_max": max,
            "restarted": restarted, "applied_s_median": took}));
    }
    println!("{}", json!({"downtime": summary}));
    Ok(())
}

/// One database, made for the change (the upgrade's at the old version), then the change,
/// measured; the database goes afterwards so that two JVMs never share the machine long.
async fn one_change(
    client: &Client,
    op: &mut Operator,
    ns: &str,
    change: Change,
) -> anyhow::Result<Measured> {
    let name = match change {
        Change::ReloadableSetting => "reload",
        Change::PgwireRotation => "rotate",
        Change::OtherSetting => "restart",
        Change::VersionUpgrade => "upgrade",
        Change::FailedUpgrade => "failed-upgrade",
        Change::NodeMove => bail!("a node move is measured on the sandbox"),
    };
    let version = if change == Change::VersionUpgrade {
        OLD_VERSION
    } else {
        NEW_VERSION
    };
    let mut server = json!({"pg.net.connection.limit": "20", "cairo.max.uncommitted.rows": "1000"});
    if change == Change::FailedUpgrade {
        // A key 9.3.2 no longer knows: under strict validation it exits (55) at start.
        server["config.validation.strict"] = json!("true");
        server["cairo.sql.backup.root"] = json!("/var/lib/questdb/backup");
    }
    let qdb: QuestDB = serde_json::from_value(json!({
        "apiVersion": "crd.questdb.io/v1beta1",
        "kind": "QuestDB",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "image": format!("questdb/questdb:{version}"),
            "volume": {"size": "10Gi"},
            "config": {"server": server},
            "versionUpgrade": {"readyTimeout": "30s"},
        },
    }))?;
    let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), ns);
    qdbs.create(&PostParams::default(), &qdb).await?;
    wait::until(
        "the QuestDB Running with its settings recorded",
        TIMEOUT,
        op,
        || async {
            qdbs.get_opt(name).await.ok().flatten().is_some_and(|q| {
                running(&q)
                    && (matches!(change, Change::VersionUpgrade | Change::FailedUpgrade)
                        || applied(&q).is_some())
            })
        },
    )
    .await?;
    let before_config = qdbs.get(name).await?.status.and_then(|s| s.config);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod_name = format!("{name}-0");
    let before_pod = identity(&pods.get(&pod_name).await?);
    let login = http_login(client, ns, name).await?;

    let answers = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new()));
    let target = Target::Pod(pods.clone(), pod_name.clone());
    let client_task = tokio::spawn(ask_forever(target, login, answers.clone()));
    // The client answered before the change: it measures the change, not its own start.
    wait::until("the client's first answer", TIMEOUT, op, || async {
        answers.lock().expect("answers").iter().any(|(_, ok)| *ok)
    })
    .await?;

    let began = Instant::now();
    let pp = PatchParams::default();
    match change {
        Change::ReloadableSetting => {
            let p = json!({"spec": {"config": {"server": {"pg.net.connection.limit": "30"}}}});
            qdbs.patch(name, &pp, &Patch::Merge(&p)).await?;
        }
        Change::PgwireRotation => {
            let p = json!({"stringData": {"QDB_PG_PASSWORD": format!("rotated-{}", began.elapsed().as_nanos())}});
            Api::<Secret>::namespaced(client.clone(), ns)
                .patch(&format!("{name}-credentials"), &pp, &Patch::Merge(&p))
                .await?;
        }
        Change::OtherSetting => {
            let p = json!({"spec": {"config": {"server": {"cairo.max.uncommitted.rows": "2000"}}}});
            qdbs.patch(name, &pp, &Patch::Merge(&p)).await?;
        }
        Change::VersionUpgrade => {
            let p = json!({"spec": {"image": format!("questdb/questdb:{NEW_VERSION}")}});
            qdbs.patch(name, &pp, &Patch::Merge(&p)).await?;
        }
        Change::FailedUpgrade => {
            let p = json!({"spec": {"image": format!("questdb/questdb:{FAILING_VERSION}")}});
            qdbs.patch(name, &pp, &Patch::Merge(&p)).await?;
        }
        Change::NodeMove => unreachable!("refused above"),
    }
    let before_pod_ref = &before_pod;
    let before_config_ref = &before_config;
    let pods_ref = &pods;
    let pod_name_ref = &pod_name;
    let qdbs_ref = &qdbs;
    wait::until(
        "the operator saying the change is applied",
        TIMEOUT,
        op,
        || async move {
            let Some(q) = qdbs_ref.get_opt(name).await.ok().flatten() else {
                return false;
            };
            let Some(pod) = pods_ref.get_opt(pod_name_ref).await.ok().flatten() else {
                return false;
            };
            let generation_seen =
                q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation;
            match change {
                Change::ReloadableSetting | Change::PgwireRotation => {
                    let now = q.status.as_ref().and_then(|s| s.config.clone());
                    applied(&q) == Some(ConfigApplied::Reload)
                        && now.map(|c| c.applied_digest)
                            != before_config_ref.clone().map(|c| c.applied_digest)
                }
                Change::OtherSetting => {
                    generation_seen && running(&q) && identity(&pod) != *before_pod_ref
                }
                Change::VersionUpgrade => {
                    generation_seen
                        && running(&q)
                        && q.status.as_ref().and_then(|s| s.version.as_deref()) == Some(NEW_VERSION)
                }
                Change::NodeMove => false,
                Change::FailedUpgrade => {
                    running(&q)
                        && q.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .any(|c| c.type_ == "VersionUpgrade" && c.reason == "RolledBack")
                        })
                }
            }
        },
    )
    .await?;
    let took = began.elapsed();
    tokio::time::sleep(SETTLE).await;
    client_task.abort();
    let after_pod = identity(&pods.get(&pod_name).await?);
    let answers: Vec<(Instant, bool)> = answers
        .lock()
        .expect("answers")
        .iter()
        .copied()
        .filter(|(at, _)| *at >= began)
        .collect();
    let (unavailable, longest) = gaps(&answers);
    qdbs.delete(name, &Default::default()).await?;
    wait::until("the database pod gone", TIMEOUT, op, || async {
        pods.get_opt(&pod_name).await.ok().flatten().is_none()
    })
    .await?;
    Ok(Measured {
        change,
        unavailable,
        longest,
        restarted: after_pod != before_pod,
        took,
    })
}

/// A node move on the sandbox (`questdb-sandbox`, built beside the operator binary, or
/// `QUESTDB_SANDBOX_BIN`): its example database is a real QuestDB on a dedicated node of the
/// in-memory EC2, which launches the new node. The client asks at `status.dnsIP`, the address
/// the database's DNS record names (what its clients resolve). Each run is a sandbox of its
/// own, so each move launches a node (a move back within the rollback window would not).
async fn node_move(run: usize) -> anyhow::Result<Measured> {
    const NEW_AMI: &str = "ami-0fedcba9876543210";
    let sandbox = match std::env::var_os("QUESTDB_SANDBOX_BIN") {
        Some(p) => std::path::PathBuf::from(p),
        None => operator::binary()?.with_file_name("questdb-sandbox"),
    };
    if !sandbox.is_file() {
        bail!(
            "{} not found: build it with `cargo build -p questdb-sandbox` or set QUESTDB_SANDBOX_BIN",
            sandbox.display()
        );
    }
    let dir =
        std::env::temp_dir().join(format!("qdb-downtime-sandbox-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("sandbox.kubeconfig");
    let log = std::fs::File::create(dir.join("sandbox.log"))?;
    let mut child = std::process::Command::new(&sandbox)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", sandbox.display()))?;
    let result = node_move_on(&kubeconfig, NEW_AMI, &dir).await;
    // SIGINT: the sandbox stops its databases, kubelets and control plane itself.
    let _ = std::process::Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    result
}

async fn node_move_on(
    kubeconfig: &std::path::Path,
    new_ami: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    while !kubeconfig.is_file() {
        if started.elapsed() > TIMEOUT * 2 {
            bail!("the sandbox wrote no kubeconfig (log in {})", dir.display());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &Default::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), "default");
    let ready_with_address =
        |q: &QuestDB| running(q) && q.status.as_ref().and_then(|s| s.dns_ip.as_ref()).is_some();
    let deadline = Instant::now() + TIMEOUT * 2;
    loop {
        if let Some(q) = qdbs.get_opt("example").await.ok().flatten() {
            if ready_with_address(&q) {
                break;
            }
        }
        if Instant::now() > deadline {
            bail!("the sandbox's example never ran (log in {})", dir.display());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let login = http_login(&client, "default", "example").await?;
    let answers = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new()));
    let target = Target::DnsAddress(qdbs.clone(), "example".into());
    let client_task = tokio::spawn(ask_forever(target, login, answers.clone()));
    let first_answer = Instant::now();
    while !answers.lock().expect("answers").iter().any(|(_, ok)| *ok) {
        if first_answer.elapsed() > TIMEOUT {
            bail!("the client never got an answer at status.dnsIP");
        }
        tokio::time::sleep(POLL).await;
    }
    let before_node = qdbs.get("example").await?.status.and_then(|s| s.node_name);
    let began = Instant::now();
    let p = json!({"spec": {"node": {"image": new_ami}}});
    qdbs.patch("example", &PatchParams::default(), &Patch::Merge(&p))
        .await?;
    loop {
        let q = qdbs.get("example").await?;
        let moved = q
            .status
            .as_ref()
            .and_then(|s| s.node_move.as_ref())
            .is_some_and(|m| {
                m.to_image.as_deref() == Some(new_ami)
                    && matches!(m.phase.as_str(), "Retaining" | "Completed")
            });
        if moved && ready_with_address(&q) {
            break;
        }
        if began.elapsed() > TIMEOUT {
            bail!(
                "the move did not end within {TIMEOUT:?}: {:?}",
                q.status.and_then(|s| s.node_move)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = began.elapsed();
    tokio::time::sleep(SETTLE).await;
    client_task.abort();
    let after_node = qdbs.get("example").await?.status.and_then(|s| s.node_name);
    let answers: Vec<(Instant, bool)> = answers
        .lock()
        .expect("answers")
        .iter()
        .copied()
        .filter(|(at, _)| *at >= began)
        .collect();
    let (unavailable, longest) = gaps(&answers);
    Ok(Measured {
        change: Change::NodeMove,
        unavailable,
        longest,
        restarted: after_node != before_node,
        took,
    })
}

/// The database's HTTP user and password, from its credentials Secret (no change touches them).
async fn http_login(client: &Client, ns: &str, db: &str) -> anyhow::Result<(String, String)> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{db}-credentials"))
        .await?;
    let data = secret.data.unwrap_or_default();
    let text = |k: &str| -> anyhow::Result<String> {
        let v = data.get(k).with_context(|| format!("{k} missing"))?;
        Ok(String::from_utf8(v.0.clone())?)
    };
    Ok((text("QDB_HTTP_USER")?, text("QDB_HTTP_PASSWORD")?))
}

/// Where the client finds the database: the pod's own address (no Service proxy in the test
/// environment), or the address the QuestDB's DNS record names (`status.dnsIP`).
#[derive(Clone)]
enum Target {
    Pod(Api<Pod>, String),
    DnsAddress(Api<QuestDB>, String),
}

impl Target {
    async fn ip(&self) -> Option<String> {
        match self {
            Target::Pod(pods, name) => pods.get_opt(name).await.ok()??.status?.pod_ip,
            Target::DnsAddress(qdbs, name) => qdbs.get_opt(name).await.ok()??.status?.dns_ip,
        }
    }
}

/// Asks `select 1` every [`POLL`] at the target's current address, recording each answer.
async fn ask_forever(
    target: Target,
    login: (String, String),
    answers: Arc<Mutex<Vec<(Instant, bool)>>>,
) {
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let addr = target
            .ip()
            .await
            .and_then(|ip| format!("{ip}:9000").parse::<SocketAddr>().ok());
        let ok = match addr {
            Some(addr) => questdb_http::Database::new(addr, Some((&login.0, &login.1)))
                .exec_within("select 1", ANSWER_LIMIT)
                .await
                .is_ok(),
            None => false,
        };
        answers.lock().expect("answers").push((Instant::now(), ok));
    }
}

/// The summed and the longest time from a failed answer to the next good one.
fn gaps(answers: &[(Instant, bool)]) -> (Duration, Duration) {
    let mut total = Duration::ZERO;
    let mut longest = Duration::ZERO;
    let mut down_since: Option<Instant> = None;
    for (at, ok) in answers {
        match (ok, down_since) {
            (false, None) => down_since = Some(*at),
            (true, Some(since)) => {
                let gap = at.duration_since(since);
                total += gap;
                longest = longest.max(gap);
                down_since = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some((last, _))) = (down_since, answers.last()) {
        let gap = last.duration_since(since);
        total += gap;
        longest = longest.max(gap);
    }
    (total, longest)
}

fn running(q: &QuestDB) -> bool {
    q.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

fn applied(q: &QuestDB) -> Option<ConfigApplied> {
    let config = q.status.as_ref()?.config.as_ref()?;
    config
        .reloading_digest
        .is_none()
        .then_some(config.applied_by)
        .flatten()
}

/// The pod's uid and its database container's restart count.
fn identity(pod: &Pod) -> (Option<String>, i32) {
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "questdb"))
        .map_or(-1, |c| c.restart_count);
    (pod.uid(), restarts)
}
