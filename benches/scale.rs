//! The operator under N QuestDBs (issues 7 and 29): the real operator binary, run as a child
//! process so its memory is its own, against the real control plane (questdb-testenv:
//! kube-apiserver, kube-controller-manager, kube-scheduler and etcd, fake kubelets and CSI).
//!
//! ```text
//! cargo bench --bench scale                                  # N=1000, concurrency 1,4,16
//! cargo bench --bench scale -- --quick                       # CI smoke run: N=50, concurrency 4
//! cargo bench --bench scale -- --questdbs 200 --concurrency 2,8
//! cargo bench --profile dev --bench scale -- --quick         # unoptimised, fast to build
//! ```
//! `QUESTDB_OPERATOR_BIN=<path>` runs another operator binary; `QDB_BENCH_OPERATOR_LOG=<filter>`
//! sets the operator's `RUST_LOG` (default `warn`) and keeps its logs.
//!
//! For every concurrency, on a fresh control plane and operator:
//! 1. provisioning: create N QuestDBs (32 creates in flight) and time until all are Ready;
//!    the operator's requests during it (counted by the proxy in front of the apiserver), per
//!    QuestDB, split by verb and resource; the CPU the operator, apiserver and etcd used;
//! 2. watch cut: every watch stream ends; the operator's watchers resume from their last
//!    resourceVersion, which must cost no write and no reconcile;
//! 3. full resync: the operator is restarted, lists everything and reconciles all N QuestDBs;
//!    with everything converged that must cost no write and no uncached read (GET).
//!
//! Then the baseline, on one more fresh control plane: a plain client (no operator) creates
//! what the operator created for each QuestDB, from the operator's own builders, writes the
//! status the operator wrote, and waits for the same pods to be Ready. The headline is the
//! operator's time to all Ready over the baseline's.
//!
//! Prints a table, then as its last line one JSON object for scripts.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use questdb_operator::api::{labels, QuestDB, QuestDBStatus};
use questdb_operator::desired::testing;
use questdb_testenv::{RequestCounts, Verb};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::time::Instant;

use support::control_plane::Cluster;
use support::operator::{self, Memory, Operator, RunArgs};
use support::prom::{self, quantile};
use support::{cluster, wait};

const NS: &str = "scale";

const CONTROLLER: &str = "questdb";
const DEFAULT_QUESTDBS: usize = 1000;
const DEFAULT_CONCURRENCY: &[u16] = &[1, 4, 16];
const QUICK_QUESTDBS: usize = 50;
const QUICK_CONCURRENCY: u16 = 4;
/// The operator's own default `--questdb-concurrency`: the headline figures come from it.
const OPERATOR_DEFAULT_CONCURRENCY: u16 = 4;
/// QuestDB creates in flight, as a provisioning service would send them.
const CREATES_IN_FLIGHT: usize = 32;

const PROVISION_TIMEOUT: Duration = Duration::from_secs(600);
const RESYNC_TIMEOUT: Duration = Duration::from_secs(600);
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// The operator counts as at rest when it has not started a reconcile for this long.
const QUIET_FOR: Duration = Duration::from_secs(2);
const QUIET_TIMEOUT: Duration = Duration::from_secs(120);

struct Settings {
    questdbs: usize,
    concurrency: Vec<u16>,
}

impl Settings {
    fn from_args() -> anyhow::Result<Settings> {
        let mut settings = Settings {
            questdbs: DEFAULT_QUESTDBS,
            concurrency: DEFAULT_CONCURRENCY.to_vec(),
        };
        for (flag, value) in support::args::flags(&["--questdbs", "--concurrency"])? {
            match flag.as_str() {
                "--quick" => {
                    settings.questdbs = QUICK_QUESTDBS;
                    settings.concurrency = vec![QUICK_CONCURRENCY];
                }
                "--questdbs" => {
                    let v = value.unwrap_or_default();
                    settings.questdbs = v
                        .parse()
                        .with_context(|| format!("--questdbs {v:?} is not a count"))?;
                }
                "--concurrency" => {
                    let v = value.unwrap_or_default();
                    settings.concurrency = v
                        .split(',')
                        .map(|c| c.trim().parse::<u16>())
                        .collect::<Result<_, _>>()
                        .with_context(|| {
                            format!("--concurrency {v:?} is not a list like 1,4,16")
                        })?;
                }
                other => bail!(
                    "unknown argument {other:?}; use --questdbs N, --concurrency 1,4,16 or --quick"
                ),
            }
        }
        if settings.questdbs == 0 || settings.concurrency.is_empty() {
            bail!("need at least one QuestDB and one concurrency");
        }
        if settings.concurrency.contains(&0) {
            bail!("a concurrency of 0 would never reconcile");
        }
        Ok(settings)
    }
}

/// What the operator asked the apiserver in one phase.
struct Requests(RequestCounts);

impl Requests {
    fn is_event(resource: &str) -> bool {
        resource == "events"
    }

    fn sum(&self, keep: impl Fn(Verb, &str) -> bool) -> u64 {
        self.0
             .0
            .iter()
            .filter(|((v, r), _)| keep(*v, r))
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes other than events: what the minimum is about.
    fn writes(&self) -> u64 {
        self.sum(|v, r| v.is_write() && !Self::is_event(r))
    }

    fn events(&self) -> u64 {
        self.sum(|_, r| Self::is_event(r))
    }

    /// Reads the caches did not answer.
    fn gets(&self) -> u64 {
        self.sum(|v, r| v == Verb::Get && !Self::is_event(r))
    }

    /// Informer traffic: initial lists and (re-)watches.
    fn lists(&self) -> u64 {
        self.sum(|v, _| v == Verb::List)
    }

    fn watches(&self) -> u64 {
        self.sum(|v, _| v == Verb::Watch)
    }

    fn reads(&self) -> u64 {
        self.sum(|v, r| !v.is_write() && !Self::is_event(r))
    }

    fn watched_resources(&self) -> BTreeSet<String> {
        self.0
             .0
            .iter()
            .filter(|((v, _), n)| *v == Verb::Watch && **n > 0)
            .map(|((_, r), _)| r.clone())
            .collect()
    }

    /// `resource: verb n, verb n` lines; per QuestDB when `per` is set, totals otherwise.
    fn breakdown(&self, per: Option<usize>) -> Vec<String> {
        let mut by_resource: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for ((verb, resource), n) in &self.0 .0 {
            let n = match per {
                Some(per) => format!("{:.2}", *n as f64 / per as f64),
                None => n.to_string(),
            };
            by_resource
                .entry(resource)
                .or_default()
                .push(format!("{} {n}", verb_name(*verb)));
        }
        by_resource
            .into_iter()
            .map(|(r, verbs)| format!("{r:<28} {}", verbs.join(", ")))
            .collect()
    }
}

fn verb_name(v: Verb) -> &'static str {
    v.as_str()
}

/// Reconcile latency from the operator's `controller_runtime_reconcile_time_seconds`.
#[derive(Clone, Copy, Default)]
struct Latency {
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
}

struct Figures {
    concurrency: u16,
    questdbs: usize,
    nodes: usize,
    provision_secs: f64,
    create_secs: f64,
    children: usize,
    provisioning: Requests,
    provisioning_latency: Latency,
    /// Reconciles and the seconds spent in them until all were Ready.
    provision_reconciles: f64,
    provision_busy_secs: f64,
    /// Requests the apiserver answered 409 Conflict (stale cache or resourceVersion).
    provision_conflicts: f64,
    /// Started, caches synced, no QuestDB yet.
    empty: Memory,
    at_rest: Memory,
    rest_was_quiet: bool,
    cut: Requests,
    cut_reconciles: f64,
    /// Requests the watches handed the controller during the cut (the rest of
    /// `cut_reconciles` is the periodic resync of converged QuestDBs).
    cut_triggers: f64,
    resync: Requests,
    resync_secs: f64,
    resync_reconciles: f64,
    resync_latency: Latency,
    after_resync: Memory,
    /// CPU while provisioning and RSS at rest: the operator, the control plane's processes and
    /// the bench itself (which runs the fake kubelets, CSI and the counting proxy).
    usage: Vec<Usage>,
}

/// One process's share of a phase.
struct Usage {
    name: String,
    cpu_secs: f64,
    rss_kib: u64,
}

/// CPU counters of the processes [`Usage`] reports, taken at the start of a phase.
struct CpuMark(Vec<(String, u32, f64)>);

impl CpuMark {
    fn take(operator: u32, cluster: &Cluster) -> anyhow::Result<CpuMark> {
        let mut pids = vec![("operator".to_string(), operator)];
        pids.extend(
            cluster
                .pids()
                .into_iter()
                .filter(|(name, _)| matches!(*name, "kube-apiserver" | "etcd"))
                .map(|(n, p)| (n.to_string(), p)),
        );
        pids.push((
            "bench (kubelets, CSI, proxy)".to_string(),
            std::process::id(),
        ));
        pids.into_iter()
            .map(|(name, pid)| Ok((name, pid, operator::cpu_secs(pid)?)))
            .collect::<anyhow::Result<_>>()
            .map(CpuMark)
    }

    fn since(&self) -> anyhow::Result<Vec<Usage>> {
        self.0
            .iter()
            .map(|(name, pid, before)| {
                Ok(Usage {
                    name: name.clone(),
                    cpu_secs: operator::cpu_secs(*pid)? - before,
                    rss_kib: Memory::of(*pid)?.rss_kib,
                })
            })
            .collect()
    }
}

impl Figures {
    fn per(&self, n: u64) -> f64 {
        self.per_f(n as f64)
    }

    fn per_f(&self, n: f64) -> f64 {
        n / self.questdbs as f64
    }

    fn children_per_questdb(&self) -> f64 {
        self.children as f64 / self.questdbs as f64
    }

    /// Every child created once and one status write (Ready) per QuestDB: nothing less can
    /// provision it. (The operator also reports `Provisioning` first, a deliberate extra write
    /// that makes progress visible.)
    fn min_writes_per_questdb(&self) -> f64 {
        self.children_per_questdb() + 1.0
    }

    /// The share of the wall time the reconcile workers were busy while provisioning: low means
    /// the operator waited (on the cluster, on its queue), not that it was short of workers.
    fn worker_utilisation(&self) -> f64 {
        self.provision_busy_secs / (self.provision_secs * f64::from(self.concurrency))
    }

    fn json(&self) -> serde_json::Value {
        let mib = |kib: u64| round(kib as f64 / 1024.0, 1);
        json!({
            "concurrency": self.concurrency,
            "questdbs": self.questdbs,
            "provision_seconds": round(self.provision_secs, 2),
            "writes_per_questdb": round(self.per(self.provisioning.writes()), 2),
            "min_writes_per_questdb": round(self.min_writes_per_questdb(), 2),
            "status_writes_per_questdb": round(self.per(self.provisioning.sum(|v, r| v.is_write() && r == "questdbs/status")), 2),
            "reconciles_per_questdb": round(self.per_f(self.provision_reconciles), 2),
            "conflicts_per_questdb": round(self.per_f(self.provision_conflicts), 2),
            "worker_utilisation": round(self.worker_utilisation(), 3),
            "reads_per_questdb": round(self.per(self.provisioning.reads()), 2),
            "gets_per_questdb": round(self.per(self.provisioning.gets()), 2),
            "events_per_questdb": round(self.per(self.provisioning.events()), 2),
            "noop_writes": self.resync.writes(),
            "noop_reads": self.resync.gets(),
            "noop_lists": self.resync.lists(),
            "noop_watches": self.resync.watches(),
            "noop_events": self.resync.events(),
            "noop_reconciles": self.resync_reconciles,
            "resync_seconds": round(self.resync_secs, 2),
            "watch_cut_writes": self.cut.writes(),
            "watch_cut_reads": self.cut.gets(),
            "watch_cut_lists": self.cut.lists(),
            "watch_cut_reconciles": self.cut_reconciles,
            "watch_cut_triggers": self.cut_triggers,
            "rss_mib_peak": mib(self.at_rest.hwm_kib),
            "rss_mib_rest": mib(self.at_rest.rss_kib),
            "rss_mib_after_restart": mib(self.after_resync.rss_kib),
            "rss_mib_empty": mib(self.empty.rss_kib),
            "rss_mib_rest_anon": mib(self.at_rest.anon_kib),
            "rss_mib_rest_file": mib(self.at_rest.file_kib),
            "rss_mib_empty_anon": mib(self.empty.anon_kib),
            "reconcile_p50_ms": self.provisioning_latency.p50_ms.map(|v| round(v, 1)),
            "reconcile_p99_ms": self.provisioning_latency.p99_ms.map(|v| round(v, 1)),
            "resync_reconcile_p99_ms": self.resync_latency.p99_ms.map(|v| round(v, 1)),
            "provisioning_cpu_seconds": self.usage.iter().map(|u| (u.name.clone(), json!(round(u.cpu_secs, 1)))).collect::<serde_json::Map<_, _>>(),
            "rss_mib_at_rest": self.usage.iter().map(|u| (u.name.clone(), json!(mib(u.rss_kib)))).collect::<serde_json::Map<_, _>>(),
        })
    }

    fn print_details(&self) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!();
        println!(
            "concurrency {}: {} QuestDBs on {} worker nodes",
            self.concurrency, self.questdbs, self.nodes
        );
        println!(
            "  creates sent in {:.2} s; all Ready after {:.2} s; {} children ({:.2} per QuestDB){}",
            self.create_secs,
            self.provision_secs,
            self.children,
            self.children_per_questdb(),
            if self.rest_was_quiet {
                ""
            } else {
                "; the operator never went quiet, rest figures taken anyway"
            }
        );
        println!(
            "  operator RSS (MiB): empty {:.1} (heap {:.1}, mapped files {:.1}); at rest with {} \
             QuestDBs {:.1} (heap {:.1}, mapped files {:.1}), {:.1} KiB of heap per QuestDB; \
             after a restart's resync {:.1}",
            mib(self.empty.rss_kib),
            mib(self.empty.anon_kib),
            mib(self.empty.file_kib),
            self.questdbs,
            mib(self.at_rest.rss_kib),
            mib(self.at_rest.anon_kib),
            mib(self.at_rest.file_kib),
            self.at_rest.anon_kib.saturating_sub(self.empty.anon_kib) as f64 / self.questdbs as f64,
            mib(self.after_resync.rss_kib),
        );
        println!(
            "  until Ready: {:.2} reconciles and {:.2} 409 answers per QuestDB, {:.1} s inside \
             reconciles, workers busy {:.0}% of the time",
            self.per_f(self.provision_reconciles),
            self.per_f(self.provision_conflicts),
            self.provision_busy_secs,
            self.worker_utilisation() * 100.0
        );
        println!("  CPU while provisioning, RSS at rest:");
        for u in &self.usage {
            println!(
                "    {:<30} {:>7.1} s {:>8.1} MiB",
                u.name,
                u.cpu_secs,
                u.rss_kib as f64 / 1024.0
            );
        }
        println!("  provisioning requests per QuestDB:");
        for line in self.provisioning.breakdown(Some(self.questdbs)) {
            println!("    {line}");
        }
        println!(
            "  watch cut: {} reconciles ({} from watch events, the rest periodic resyncs), {} writes, {} GETs, {} lists, {} watches",
            self.cut_reconciles,
            self.cut_triggers,
            self.cut.writes(),
            self.cut.gets(),
            self.cut.lists(),
            self.cut.watches()
        );
        println!(
            "  restart resync: {} reconciles in {:.2} s; requests (totals):",
            self.resync_reconciles, self.resync_secs
        );
        for line in self.resync.breakdown(None) {
            println!("    {line}");
        }
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

fn print_table(runs: &[Figures], baseline: &Baseline) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!(
        "baseline (no operator, a plain client): {} QuestDBs' children and status written in \
         {:.2} s, all pods Ready after {:.2} s; {:.2} writes per QuestDB",
        baseline.questdbs,
        baseline.writes_secs,
        baseline.ready_secs,
        baseline.requests.writes() as f64 / baseline.questdbs as f64
    );
    for line in baseline.requests.breakdown(Some(baseline.questdbs)) {
        println!("    {line}");
    }
    println!();
    println!(
        "{:>4} {:>6} {:>9} {:>8} {:>12} {:>9} {:>8} {:>14} {:>9} {:>9} {:>8} {:>8}",
        "conc",
        "N",
        "ready s",
        "/base",
        "writes/qdb",
        "GETs/qdb",
        "ev/qdb",
        "resync w/GET",
        "RSS peak",
        "RSS rest",
        "p50 ms",
        "p99 ms"
    );
    for f in runs {
        println!(
            "{:>4} {:>6} {:>9.2} {:>8.2} {:>12} {:>9.2} {:>8.2} {:>14} {:>9.1} {:>9.1} {:>8} {:>8}",
            f.concurrency,
            f.questdbs,
            f.provision_secs,
            f.provision_secs / baseline.ready_secs,
            format!(
                "{:.2} ({:.0})",
                f.per(f.provisioning.writes()),
                f.min_writes_per_questdb()
            ),
            f.per(f.provisioning.gets()),
            f.per(f.provisioning.events()),
            format!("{}/{}", f.resync.writes(), f.resync.gets()),
            mib(f.at_rest.hwm_kib),
            mib(f.at_rest.rss_kib),
            ms(f.provisioning_latency.p50_ms),
            ms(f.provisioning_latency.p99_ms),
        );
    }
    println!(
        "/base: time to all Ready over the baseline's (target <= 1.2); writes/qdb: provisioning \
         writes per QuestDB without events (minimum in brackets: children + 1 status write); resync: writes/GETs when a restarted operator reconciles \
         all N (target 0/0); RSS in MiB (target <= 48); latency from the operator's histogram"
    );
}

fn final_json(runs: &[Figures], baseline: &Baseline) -> serde_json::Value {
    let headline = runs
        .iter()
        .find(|f| f.concurrency == OPERATOR_DEFAULT_CONCURRENCY)
        .or_else(|| runs.iter().max_by_key(|f| f.concurrency));
    let mut out = headline.map(Figures::json).unwrap_or_else(|| json!({}));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    out["bench"] = json!("scale");
    out["profile"] = json!(profile);
    out["control_plane"] = json!("real");
    out["baseline_ready_seconds"] = json!(round(baseline.ready_secs, 2));
    out["baseline_writes_seconds"] = json!(round(baseline.writes_secs, 2));
    out["baseline_writes_per_questdb"] = json!(round(
        baseline.requests.writes() as f64 / baseline.questdbs as f64,
        2
    ));
    if let Some(h) = headline {
        out["ready_over_baseline"] = json!(round(h.provision_secs / baseline.ready_secs, 2));
    }
    for f in runs {
        out[format!("ready_over_baseline_c{}", f.concurrency)] =
            json!(round(f.provision_secs / baseline.ready_secs, 2));
    }
    out["by_concurrency"] = runs.iter().map(Figures::json).collect();
    out
}

/// Scrapes the operator's reconcile counter for the QuestDB controller.
async fn reconciles(addr: SocketAddr) -> anyhow::Result<f64> {
    Ok(prom::scrape(addr).await?.sum(
        "controller_runtime_reconcile_total",
        "controller",
        CONTROLLER,
    ))
}

/// Reconciles so far and the seconds spent in them.
async fn reconcile_work(addr: SocketAddr) -> anyhow::Result<(f64, f64)> {
    let m = prom::scrape(addr).await?;
    Ok((
        m.sum(
            "controller_runtime_reconcile_total",
            "controller",
            CONTROLLER,
        ),
        m.sum(
            "controller_runtime_reconcile_time_seconds_sum",
            "controller",
            CONTROLLER,
        ),
    ))
}

async fn latency(addr: SocketAddr) -> anyhow::Result<Latency> {
    let metrics = prom::scrape(addr).await?;
    let buckets = metrics.histogram(
        "controller_runtime_reconcile_time_seconds",
        "controller",
        CONTROLLER,
    );
    Ok(Latency {
        p50_ms: quantile(&buckets, 0.50).map(|s| s * 1000.0),
        p99_ms: quantile(&buckets, 0.99).map(|s| s * 1000.0),
    })
}

/// Waits until, for [`QUIET_FOR`], the watches handed the controller nothing and the operator
/// wrote nothing. The periodic resync of converged QuestDBs (one each per 5 minutes, 3 a second
/// at 1,000) goes on meanwhile: it reconciles without writing, so it is not counted as work.
/// Returns false when it never settles within [`QUIET_TIMEOUT`] (figures are taken anyway).
async fn wait_quiet(operator: &mut Operator, metrics: SocketAddr) -> anyhow::Result<bool> {
    let deadline = Instant::now() + QUIET_TIMEOUT;
    let mut last = ((f64::NAN, f64::NAN), Instant::now());
    loop {
        operator.ensure_running()?;
        let m = prom::scrape(metrics).await?;
        let now = (
            m.sum("questdb_operator_triggers_total", "controller", CONTROLLER),
            operator_writes(&m),
        );
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= QUIET_FOR {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator's writes so far, by its own client's count (every verb that changes state).
fn operator_writes(m: &prom::Metrics) -> f64 {
    ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|verb| m.sum("rest_client_requests_total", "method", verb))
        .sum()
}

/// Requests the watches handed the QuestDB controller so far.
async fn triggers(addr: SocketAddr) -> anyhow::Result<f64> {
    Ok(prom::scrape(addr)
        .await?
        .sum("questdb_operator_triggers_total", "controller", CONTROLLER))
}

fn is_ready(q: &QuestDB) -> bool {
    q.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Watches the namespace's QuestDBs until `n` are Ready at once.
async fn all_ready(client: &Client, operator: &mut Operator, n: usize) -> anyhow::Result<()> {
    let log = operator.log().display().to_string();
    // The operator is checked between events so a crash is reported at once, not as a timeout.
    until_ready::<QuestDB>(client.clone(), n, is_ready, || operator.ensure_running())
        .await
        .with_context(|| format!("operator log: {log}"))
}

/// Watches the namespace's `K`s until `n` are `ready` at once, calling `alive` every second.
async fn until_ready<K>(
    client: Client,
    n: usize,
    ready_now: impl Fn(&K) -> bool,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(client, NS);
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut ready: HashSet<String> = HashSet::new();
    let mut relisting: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = tokio::time::sleep(PROVISION_TIMEOUT);
    tokio::pin!(deadline);
    let kind = K::plural(&());
    while ready.len() < n {
        tokio::select! {
            ev = events.next() => {
                match ev.with_context(|| format!("the {kind} watch ended"))?.with_context(|| format!("watching {kind}"))? {
                    watcher::Event::Init => relisting.clear(),
                    watcher::Event::InitApply(o) => {
                        if ready_now(&o) {
                            relisting.insert(o.name_any());
                        }
                    }
                    watcher::Event::InitDone => ready = std::mem::take(&mut relisting),
                    watcher::Event::Apply(o) if ready_now(&o) => {
                        ready.insert(o.name_any());
                    }
                    watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                        ready.remove(&o.name_any());
                    }
                }
            }
            _ = tick.tick() => alive()?,
            _ = &mut deadline => bail!("only {} of {n} {kind} Ready after {PROVISION_TIMEOUT:?}", ready.len()),
        }
    }
    Ok(())
}

async fn create_questdbs(client: &Client, n: usize) -> anyhow::Result<()> {
    let api: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("db-{i:05}");
                let mut q = testing::questdb(&name, NS);
                q.metadata = ObjectMeta {
                    name: Some(name),
                    namespace: Some(NS.into()),
                    ..ObjectMeta::default()
                };
                api.create(&PostParams::default(), &q).await
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("creating QuestDBs")
}

async fn count_managed<K>(client: &Client) -> anyhow::Result<usize>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), NS);
    let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .with_context(|| format!("listing {}", K::plural(&())))?;
    Ok(list.items.len())
}

/// The objects the operator created for the QuestDBs (the pods are the StatefulSets' doing).
async fn count_children(client: &Client) -> anyhow::Result<usize> {
    Ok(count_managed::<ConfigMap>(client).await?
        + count_managed::<Service>(client).await?
        + count_managed::<PersistentVolumeClaim>(client).await?
        + count_managed::<StatefulSet>(client).await?
        + count_managed::<Secret>(client).await?
        + count_managed::<NetworkPolicy>(client).await?
        + count_managed::<PodDisruptionBudget>(client).await?)
}

async fn start_operator(
    binary: &Path,
    kubeconfig: &Path,
    concurrency: u16,
    log: PathBuf,
) -> anyhow::Result<(Operator, RunArgs)> {
    let mut args = RunArgs::on_free_ports(kubeconfig.to_path_buf())?;
    args.concurrency = Some(concurrency);
    let mut op = Operator::start(binary, &args, log)?;
    let health = args.health;
    wait::until(
        "the operator's /readyz",
        STEP_TIMEOUT,
        &mut op,
        || async move { operator::http_get(health, "/readyz").await.is_some() },
    )
    .await?;
    Ok((op, args))
}

/// Worker nodes for N QuestDBs of one volume each: a node attaches at most
/// [`questdb_testenv::kubelet::ATTACHABLE_VOLUMES`] volumes (fewer than the 110 pods it
/// takes), so the volumes decide; a tenth more leaves the scheduler a choice.
fn worker_nodes(questdbs: usize) -> Vec<(String, String)> {
    let per_node = questdb_testenv::kubelet::ATTACHABLE_VOLUMES;
    (0..(questdbs + questdbs / 10).div_ceil(per_node).max(3))
        .map(|i| {
            let zone = if i % 2 == 0 { "a" } else { "b" };
            (format!("sim-node-{i:03}"), format!("sim-zone-{zone}"))
        })
        .collect()
}

/// One concurrency's phases; with the status one Ready QuestDB ended with, for the baseline.
async fn run_one(
    binary: &Path,
    questdbs: usize,
    concurrency: u16,
) -> anyhow::Result<(Figures, QuestDBStatus)> {
    let workers = worker_nodes(questdbs);
    let nodes = workers.len();
    let sim = Cluster::start(&workers).await?;
    let client = sim.bench_client();
    cluster::install_crd(&client, STEP_TIMEOUT).await?;
    cluster::create_namespace(&client, NS).await?;

    // Kept after a failed run so its operator logs can be read.
    let dir = tempfile::tempdir()
        .context("creating a temporary directory")?
        .keep();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, sim.operator_kubeconfig()).context("writing the kubeconfig")?;

    // 1. Provisioning.
    let (mut op, args) =
        start_operator(binary, &kubeconfig, concurrency, dir.join("operator.log")).await?;
    eprintln!(
        "concurrency {concurrency}: operator pid {}, log {}",
        op.pid(),
        op.log().display()
    );
    // What the operator costs before any QuestDB: its code, its runtime, empty caches.
    let empty = op.memory_at_rest().await?;
    let startup = Requests(sim.request_counts());
    sim.reset_request_counts();
    let cpu = CpuMark::take(op.pid(), &sim)?;
    let started = Instant::now();
    create_questdbs(&client, questdbs).await?;
    let create_secs = started.elapsed().as_secs_f64();
    all_ready(&client, &mut op, questdbs).await?;
    let provision_secs = started.elapsed().as_secs_f64();
    let provisioning_latency = latency(args.metrics).await?;
    let (provision_reconciles, provision_busy_secs) = reconcile_work(args.metrics).await?;
    let provision_conflicts =
        prom::scrape(args.metrics)
            .await?
            .sum("rest_client_requests_total", "code", "409");
    let rest_was_quiet = wait_quiet(&mut op, args.metrics).await?;
    let provisioning = Requests(sim.request_counts());
    let at_rest = op.memory_at_rest().await?;
    // Until at rest: the quiet wait and the heap's trim period add a dozen idle seconds.
    let usage = cpu.since()?;
    let children = count_children(&client).await?;
    let final_status = Api::<QuestDB>::namespaced(client.clone(), NS)
        .get("db-00000")
        .await
        .context("reading a Ready QuestDB")?
        .status
        .unwrap_or_default();
    eprintln!("concurrency {concurrency}: {questdbs} Ready after {provision_secs:.2} s");

    // 2. Watch cut: the watchers resume where they were, so nothing is re-listed or reconciled.
    let mut watched = startup.watched_resources();
    watched.extend(provisioning.watched_resources());
    let before_cut = reconciles(args.metrics).await?;
    let triggers_before_cut = triggers(args.metrics).await?;
    sim.reset_request_counts();
    sim.cut_watches();
    wait::until("every watch resumed", STEP_TIMEOUT, &mut op, || {
        let resumed = Requests(sim.request_counts()).watched_resources();
        let all = watched.is_subset(&resumed);
        async move { all }
    })
    .await?;
    wait_quiet(&mut op, args.metrics).await?;
    let cut = Requests(sim.request_counts());
    let cut_reconciles = reconciles(args.metrics).await? - before_cut;
    let cut_triggers = triggers(args.metrics).await? - triggers_before_cut;

    // 3. Full resync: a restarted operator lists everything and reconciles every QuestDB.
    drop(op);
    sim.reset_request_counts();
    let restarted = Instant::now();
    let (mut op, args) = start_operator(
        binary,
        &kubeconfig,
        concurrency,
        dir.join("operator-restarted.log"),
    )
    .await?;
    let target = questdbs as f64;
    let metrics = args.metrics;
    wait::until(
        "the restarted operator reconciled every QuestDB",
        RESYNC_TIMEOUT,
        &mut op,
        || async move { reconciles(metrics).await.is_ok_and(|n| n >= target) },
    )
    .await?;
    let resync_secs = restarted.elapsed().as_secs_f64();
    wait_quiet(&mut op, args.metrics).await?;
    let resync = Requests(sim.request_counts());
    let resync_reconciles = reconciles(args.metrics).await?;
    let resync_latency = latency(args.metrics).await?;
    let after_resync = op.memory_at_rest().await?;

    drop(op);
    sim.shutdown().await;
    if std::env::var_os("QDB_BENCH_OPERATOR_LOG").is_some() {
        eprintln!(
            "concurrency {concurrency}: operator logs kept in {}",
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok((
        Figures {
            concurrency,
            questdbs,
            nodes,
            provision_secs,
            create_secs,
            children,
            provisioning,
            provisioning_latency,
            provision_reconciles,
            provision_busy_secs,
            provision_conflicts,
            empty,
            at_rest,
            rest_was_quiet,
            cut,
            cut_reconciles,
            cut_triggers,
            resync,
            resync_secs,
            resync_reconciles,
            resync_latency,
            after_resync,
            usage,
        },
        final_status,
    ))
}

/// What the cluster itself takes to run N databases: the plain-client baseline.
struct Baseline {
    questdbs: usize,
    /// Until every write below was answered.
    writes_secs: f64,
    /// Until every database pod was Ready.
    ready_secs: f64,
    requests: Requests,
}

/// The cluster's own pace for what the operator does, with no operator: on a fresh control
/// plane with the same workers, a plain client creates each QuestDB, then what the operator
/// created for it (the credentials Secret, the PVC, then every child from the operator's own
/// builder), writes the status the operator wrote, 32 QuestDBs in flight, and waits until
/// every pod is Ready. Its requests go through the counting proxy, as the operator's do.
async fn plain_client_baseline(
    questdbs: usize,
    status: &QuestDBStatus,
) -> anyhow::Result<Baseline> {
    use questdb_operator::desired;
    let cluster = Cluster::start(&worker_nodes(questdbs)).await?;
    let watch_client = cluster.bench_client();
    cluster::install_crd(&watch_client, STEP_TIMEOUT).await?;
    cluster::create_namespace(&watch_client, NS).await?;
    let client = cluster.counted_client().await;
    let ready = until_ready::<Pod>(watch_client.clone(), questdbs, pod_ready, || Ok(()));
    tokio::pin!(ready);
    cluster.reset_request_counts();
    let pp = PostParams::default();
    let started = Instant::now();
    let writes = futures::stream::iter(0..questdbs)
        .map(|i| {
            let client = client.clone();
            let pp = pp.clone();
            async move {
                let name = format!("db-{i:05}");
                let mut q = testing::questdb(&name, NS);
                q.metadata = ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(NS.into()),
                    ..ObjectMeta::default()
                };
                let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), NS);
                let mut created = qdbs.create(&pp, &q).await?;
                let secret = Api::<Secret>::namespaced(client.clone(), NS)
                    .create(
                        &pp,
                        &desired::credentials::generated_secret(&created, &mut rand::rng()),
                    )
                    .await?;
                let data = secret.data.clone().unwrap_or_default();
                let (digest, pg_digest) = match desired::credentials::check(&data) {
                    desired::credentials::Check::Usable { digest, pg_digest } => {
                        (digest, pg_digest)
                    }
                    other => anyhow::bail!("the generated credentials are unusable: {other:?}"),
                };
                let version = secret.metadata.resource_version.clone().unwrap_or_default();
                let seen = desired::credentials::Seen {
                    version: &version,
                    digest: &digest,
                    pg_digest: &pg_digest,
                };
                Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
                    .create(&pp, &desired::pvc(&created))
                    .await?;
                // ILP auth is on by default: with no key Secret yet the operator mounts an
                // empty auth file, which refuses every client.
                let auth_file = created
                    .spec
                    .ilp_auth
                    .enabled
                    .then(|| questdb_operator::ilp_auth::render_auth_file(&[]));
                let children = desired::children(&created, auth_file.as_deref(), Some(seen), None);
                let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
                cms.create(&pp, &children.config).await?;
                // The server.conf the pod reads, as the operator renders it.
                let server_conf = children.server_conf();
                let pg =
                    desired::credentials::PgCredentials::from_data(&data).ok_or_else(|| {
                        anyhow::anyhow!("the generated credentials lack a pgwire key")
                    })?;
                Api::<Secret>::namespaced(client.clone(), NS)
                    .create(
                        &pp,
                        &desired::credentials::server_conf_secret(
                            &created,
                            server_conf,
                            &pg,
                            &desired::credentials::server_conf_source(server_conf, &pg_digest),
                        ),
                    )
                    .await?;
                if let Some(cm) = &children.ilp_auth {
                    cms.create(&pp, cm).await?;
                }
                if let Some(np) = &children.network_policy {
                    Api::namespaced(client.clone(), NS).create(&pp, np).await?;
                }
                if let Some(pdb) = &children.pod_disruption_budget {
                    Api::namespaced(client.clone(), NS).create(&pp, pdb).await?;
                }
                let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
                svcs.create(&pp, &children.headless_service).await?;
                svcs.create(&pp, &children.client_service).await?;
                Api::<StatefulSet>::namespaced(client.clone(), NS)
                    .create(&pp, &children.statefulset)
                    .await?;
                created.status = Some(status.clone());
                qdbs.replace_status(&name, &pp, &created).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_for_each(|_| async { Ok(()) });
    let writes_secs = tokio::select! {
        done = writes => {
            done.context("baseline creates")?;
            started.elapsed().as_secs_f64()
        }
        // Pods cannot be Ready before their StatefulSets exist: this ends only on an error.
        r = &mut ready => { r?; bail!("pods Ready before the baseline's writes ended") }
    };
    ready.await?;
    let ready_secs = started.elapsed().as_secs_f64();
    let requests = Requests(cluster.request_counts());
    cluster.shutdown().await;
    Ok(Baseline {
        questdbs,
        writes_secs,
        ready_secs,
        requests,
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn run(settings: &Settings) -> anyhow::Result<(Vec<Figures>, Baseline)> {
    let binary = operator::binary()?;
    eprintln!("operator binary {}", binary.display());
    let mut runs = Vec::new();
    let mut status = None;
    for &c in &settings.concurrency {
        let (figures, final_status) = run_one(&binary, settings.questdbs, c)
            .await
            .with_context(|| format!("concurrency {c}"))?;
        figures.print_details();
        runs.push(figures);
        status.get_or_insert(final_status);
    }
    let baseline = plain_client_baseline(settings.questdbs, &status.unwrap_or_default())
        .await
        .context("the baseline")?;
    eprintln!(
        "baseline: a plain client wrote {} QuestDBs' children and status in {:.2} s; all pods Ready after {:.2} s (no operator)",
        settings.questdbs, baseline.writes_secs, baseline.ready_secs
    );
    Ok((runs, baseline))
}

fn main() -> std::process::ExitCode {
    questdb_operator::metrics::install_crypto_provider();
    let settings = match Settings::from_args() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("scale bench: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scale bench: starting tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&settings)) {
        Ok((runs, baseline)) => {
            print_table(&runs, &baseline);
            println!("{}", final_json(&runs, &baseline));
            let _ = std::io::stdout().flush();
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scale bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
