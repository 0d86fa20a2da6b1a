//! Wiring: client, caches, leader election, controllers, HTTP endpoints and shutdown.
//!
//! Caches run on every replica so a standby is warm; controllers run only on the leader. Losing
//! the Lease stops the controllers and ends `run` with an error: the process exits and restarts
//! as a standby rather than risk two writers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::events::Recorder;
use anyhow::Context as _;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Lookup, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{labels, QuestDB, QuestDBBackup, QuestDBBackupSchedule, MANAGER};
use crate::controllers::cached_pod::CachedPod;
use crate::controllers::cloud_runtime::CloudRuntime;
pub use crate::controllers::cloud_runtime::{Cloud, CloudSettings};
use crate::controllers::context::{Caches, Context, GuardedQuestDB, SecretIndex};
use crate::controllers::refusals;
use crate::controllers::{backup, node_health, questdb, retry_delay, schedule, sweep, Error, Next};
use crate::desired::diff::CachedMeta;
use crate::desired::OwnedChild;
use crate::http_server::{self, Readiness};
use crate::ilp_auth;
use crate::metrics::{ControllerMetrics, Metrics, ReconcileOutcome};
use crate::runtime::in_flight::InFlight;
use crate::runtime::stopping::{until_stopped, Parts};

/// Everything `run` needs besides the cluster connection.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// Watch one namespace; all when `None`.
    pub namespace: Option<String>,
    pub questdb_concurrency: u16,
    /// Concurrent reconciles of the node-health controller (never two of one Node).
    pub node_health_concurrency: u16,
    /// Concurrent reconciles of the backup controller (never two of one QuestDBBackup).
    pub backup_concurrency: u16,
    /// Concurrent reconciles of the backup-schedule controller.
    pub backup_schedule_concurrency: u16,
    pub backup_timeouts: crate::controllers::backup::plan::Timeouts,
    /// How often each Running database's `wal_tables()` is read for `WriteHealthy`.
    pub write_health_interval: Duration,
    pub leader_election: Option<LeaderElection>,
    pub metrics_addr: Option<SocketAddr>,
    pub health_addr: Option<SocketAddr>,
    /// Dedicated nodes and DNS; `None` runs without them (`spec.node` / `spec.dns` then
    /// report `NotConfigured`). Build the providers with `ManagerHandle::metrics`'s
    /// `aws_observer()` so every AWS call shows up in /metrics.
    pub cloud: Option<Cloud>,
    /// The allow-lists a tenant's QuestDB must meet beyond the schema.
    pub tenancy: crate::desired::TenancyPolicy,
    /// The operator's own Pod: what its preflight Events are about (`None`: outside a pod, the
    /// preflight logs and counts only).
    pub operator_pod: Option<k8s_openapi::api::core::v1::ObjectReference>,
    /// Recorded on every StatefulSet this operator writes: a pod template change made by a new
    /// version (not by the user) rolls at most `max_concurrent_operator_rollouts` databases at once.
    pub operator_version: String,
    pub max_concurrent_operator_rollouts: usize,
}

pub use crate::leadership::LeaderElection;

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            questdb_concurrency: 4,
            node_health_concurrency: 2,
            backup_concurrency: 2,
            backup_schedule_concurrency: 1,
            backup_timeouts: Default::default(),
            write_health_interval: Duration::from_secs(60),
            leader_election: None,
            metrics_addr: None,
            health_addr: None,
            cloud: None,
            tenancy: Default::default(),
            operator_pod: None,
            operator_version: env!("CARGO_PKG_VERSION").into(),
            max_concurrent_operator_rollouts: 1,
        }
    }
}

/// Handles a test or the sandbox can read while the manager runs.
#[derive(Clone)]
pub struct ManagerHandle {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub in_flight: Arc<InFlight>,
    /// The parts not stopped yet (a test that waited too long for a shutdown names them).
    pub stopping: Parts,
}

impl Default for ManagerHandle {
    fn default() -> Self {
        Self {
            metrics: Metrics::new(),
            readiness: Readiness::default(),
            in_flight: Arc::default(),
            stopping: Parts::default(),
        }
    }
}

/// Runs the manager until `shutdown` is cancelled (Ok) or leadership is lost (Err).
pub async fn run(
    opts: ManagerOptions,
    config: kube::Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with(opts, config, shutdown, ManagerHandle::default()).await
}

pub async fn run_with(
    opts: ManagerOptions,
    config: kube::Config,
    shutdown: CancellationToken,
    handle: ManagerHandle,
) -> anyhow::Result<()> {
    let ManagerHandle {
        metrics,
        readiness,
        in_flight,
        stopping,
    } = handle;
    let client = crate::metrics::instrumented_client(config, metrics.clone())
        .context("building the Kubernetes client")?;

    let mut servers = Vec::new();
    if let Some(addr) = opts.metrics_addr {
        let (m, s) = (metrics.clone(), shutdown.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = http_server::serve_metrics(addr, m, s).await {
                error!(error = format!("{e:#}"), %addr, "metrics server failed");
            }
        }));
    }
    if let Some(addr) = opts.health_addr {
        let (r, s) = (readiness.clone(), shutdown.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = http_server::serve_health(addr, r, s).await {
                error!(error = format!("{e:#}"), %addr, "health server failed");
            }
        }));
    }

    let caches_token = shutdown.child_token();
    let (caches, subs, cache_tasks) = start_caches(
        &client,
        opts.namespace.as_deref(),
        &opts.tenancy.secret_namespaces,
        watches_nodes(&opts),
        opts.cloud.is_some(),
        &caches_token,
    );
    let phases = caches.questdbs.clone();
    metrics.set_phase_source(move || {
        phases
            .state()
            .iter()
            .filter_map(|q| q.0.as_ref().ok())
            .map(|q| q.status.as_ref().and_then(|s| s.phase))
            .collect()
    });

    let result = async {
        // Subscriptions are drained while the caches fill so the reflectors never block.
        let (subs, ()) = subs.drain_while(wait_for_caches(&caches, &shutdown)).await;
        if shutdown.is_cancelled() {
            return Ok(());
        }
        readiness.set_ready();
        info!("caches synced");
        let shared = Shared {
            client: &client,
            opts: &opts,
            metrics: &metrics,
            in_flight: &in_flight,
            caches: &caches,
            stopping: &stopping,
        };
        match &opts.leader_election {
            None => {
                run_controllers(&shared, subs, shutdown.clone()).await;
                Ok(())
            }
            Some(le) => run_as_leader(le, &shared, subs, &shutdown).await,
        }
    }
    .await;

    caches_token.cancel();
    let rest = async {
        stopping
            .run("caches", async {
                for t in cache_tasks {
                    let _ = t.await;
                }
            })
            .await;
        shutdown.cancel();
        stopping
            .run("http servers", async {
                for s in servers {
                    let _ = s.await;
                }
            })
            .await;
    };
    tokio::select! {
        () = rest => {}
        () = stopping.report_while_stopping(&caches_token, STOPPING_REPORT_EVERY) => {}
    }
    result
}

/// How often a manager that is slow to stop says what it still waits for.
const STOPPING_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Reconcile requests, forwarded from the reflector streams after each event reached its cache:
/// a QuestDB's own changes, and the changes and deletions of its children and key Secrets.
///
/// kube-runtime's shared-stream subscriptions are not used for triggers: they fan out only
/// applied objects (no deletions), and a subscription whose object vanished from the cache
/// before it was read returns `Pending` without a wake-up, which can stall that trigger stream.
pub struct Subscriptions {
    triggers: TriggerReceiver,
    /// For reconciles that ask for reconciles of other QuestDBs (node health, node moves).
    sender: TriggerSender,
    /// The node-health controller's requests: a dedicated Node or its kubelet Lease changed.
    node_triggers: futures::channel::mpsc::UnboundedReceiver<ObjectRef<Node>>,
}

type TriggerReceiver = futures::channel::mpsc::UnboundedReceiver<ObjectRef<GuardedQuestDB>>;
type TriggerSender = crate::controllers::context::Wake;

/// A watch event with its object in another form.
fn project<K, C>(event: watcher::Event<K>, f: impl Fn(K) -> C) -> watcher::Event<C> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Forwards an object's event to the QuestDB `map` says it belongs to. Unbounded, because a
/// dropped trigger would be a missed reconcile; a standby drains it continuously.
fn forward<K>(
    event: &Result<watcher::Event<K>, watcher::Error>,
    tx: &TriggerSender,
    deletions: bool,
    map: impl Fn(&K) -> Option<ObjectRef<GuardedQuestDB>>,
) {
    let obj = match event {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
        Ok(watcher::Event::Delete(o)) if deletions => o,
        _ => return,
    };
    if let Some(r) = map(obj) {
        let _ = tx.unbounded_send(r);
    }
}

/// The QuestDBs whose credentials a Secret holds: `<name>-credentials` (generated), and any
/// that names it in `spec.credentials.secretName`. Its change restarts their databases.
fn credentials_users(
    event: &Result<watcher::Event<PartialObjectMeta<Secret>>, watcher::Error>,
    questdbs: &kube::runtime::reflector::Store<GuardedQuestDB>,
) -> Vec<ObjectRef<GuardedQuestDB>> {
    // Not the initial list: every QuestDB is reconciled at start anyway.
    let s = match event {
        Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => o,
        _ => return vec![],
    };
    let (Some(name), Some(ns)) = (s.metadata.name.as_deref(), s.metadata.namespace.as_deref())
    else {
        return vec![];
    };
    questdbs
        .state()
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|q| q.metadata.namespace.as_deref() == Some(ns))
        .filter(|q| crate::desired::credentials::uses_secret(q, name))
        .filter_map(crate::controllers::context::questdb_ref)
        .collect()
}

/// The QuestDB a child belongs to, by the operator's instance label (pods are owned by the
/// StatefulSet and retained PVCs by nobody, but every child carries the label), whatever form
/// its cache holds.
fn questdb_of<C: CachedMeta + Lookup>(o: &C) -> Option<ObjectRef<GuardedQuestDB>> {
    let name = o.label(labels::INSTANCE)?;
    Some(ObjectRef::new(name).within(&Lookup::namespace(o)?))
}

/// What `reflect` does, for a cached form that is a [`Lookup`] but not a `Resource` (its
/// labels are not in an `ObjectMeta`): each event reaches the store before it goes on.
fn reflect_into<C>(
    mut writer: reflector::store::Writer<C>,
) -> impl FnMut(watcher::Event<C>) -> watcher::Event<C>
where
    C: Lookup<DynamicType = ()> + Clone + 'static,
{
    move |event| {
        writer.apply_watcher_event(&event);
        event
    }
}

/// The controller's key for a QuestDB found by name.
fn guarded(r: ObjectRef<QuestDB>) -> ObjectRef<GuardedQuestDB> {
    let key = ObjectRef::new(&r.name);
    match r.namespace.as_deref() {
        Some(ns) => key.within(ns),
        None => key,
    }
}

impl Subscriptions {
    /// Discards requests until `until` completes; the controllers reconcile everything when
    /// they start, so nothing drained is lost.
    async fn drain_while<T>(mut self, until: impl Future<Output = T>) -> (Self, T) {
        let mut until = std::pin::pin!(until);
        loop {
            tokio::select! {
                biased;
                out = &mut until => return (self, out),
                Some(_) = self.triggers.next() => {}
                Some(_) = self.node_triggers.next() => {}
            }
        }
    }
}

fn api_for<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn managed_selector() -> watcher::Config {
    watcher::Config::default()
        .labels(&format!(
            "{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE
        ))
        .page_size(LIST_PAGE_SIZE)
}

/// Objects per page of a cache's initial list. Each page is deserialized whole before the
/// cache compacts its objects, so the page bounds the transient heap of a (re)start; at 1,000
/// QuestDBs kube's default of 500 left the heap fragmented about 20 MiB above its live size.
const LIST_PAGE_SIZE: u32 = 100;

/// Starts every reflector. Children are watched by the operator's managed-by label so the
/// caches hold only what the operator manages; Secrets are watched metadata-only so no Secret
/// data of the cluster is ever cached.
/// Nodes are cluster-scoped: a namespaced install without a cloud provider (Role-only RBAC)
/// never reads them; its NodeIP column comes from the pod's hostIP and NodeReady stays empty.
/// Dedicated nodes need them (labels, taints, the pin), whatever the namespace.
pub fn watches_nodes(opts: &ManagerOptions) -> bool {
    opts.cloud.is_some() || opts.namespace.is_none()
}

fn start_caches(
    client: &Client,
    ns: Option<&str>,
    secret_namespaces: &[String],
    watch_nodes: bool,
    watch_leases: bool,
    token: &CancellationToken,
) -> (Caches, Subscriptions, Vec<tokio::task::JoinHandle<()>>) {
    let mut tasks = Vec::new();
    let (tx, triggers) = futures::channel::mpsc::unbounded();
    let sender = tx.clone();
    let (node_tx, node_triggers) = futures::channel::mpsc::unbounded::<ObjectRef<Node>>();

    // `inspect` runs after `reflect`: a request is only sent once its event is in the cache.
    macro_rules! cached {
        ($k:ty, $api:expr, $cfg:expr, $deletions:expr, $map:expr) => {
            cached!($k, $api, $cfg, $deletions, $map, |_: &mut $k| {})
        };
        ($k:ty, $api:expr, $cfg:expr, $deletions:expr, $map:expr, $trim:expr) => {
            cached!($k, $api, $cfg, $deletions, $map, $trim, None)
        };
        ($k:ty, $api:expr, $cfg:expr, $deletions:expr, $map:expr, $trim:expr, $changes:expr) => {{
            let (reader, writer) = reflector::store::<$k>();
            let tx = tx.clone();
            let trim = $trim;
            let changes: Option<Arc<std::sync::atomic::AtomicU64>> = $changes;
            let stream = watcher($api, $cfg)
                .default_backoff()
                .modify(move |o: &mut $k| {
                    o.meta_mut().managed_fields = None;
                    trim(o);
                })
                .reflect(writer)
                .inspect(move |ev| {
                    if let Some(c) = &changes {
                        c.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    forward(ev, &tx, $deletions, $map)
                });
            tasks.push(spawn_drain(stream, token.clone(), stringify!($k)));
            reader
        }};
    }

    // A child kind, held in the form `OwnedChild::Cached` says: projected before the store.
    macro_rules! child {
        ($k:ty, $api:expr) => {{
            type C = <$k as OwnedChild>::Cached;
            let (reader, writer) = reflector::store::<C>();
            let tx = tx.clone();
            let stream = watcher($api, managed_selector())
                .default_backoff()
                .map_ok(|ev| {
                    project(ev, |mut o: $k| {
                        o.meta_mut().managed_fields = None;
                        <$k as OwnedChild>::to_cached(o)
                    })
                })
                .map_ok(reflect_into(writer))
                .inspect(move |ev| forward(ev, &tx, true, questdb_of::<C>));
            tasks.push(spawn_drain(stream, token.clone(), stringify!($k)));
            reader
        }};
    }

    let owner_index = crate::controllers::node_health::owners::OwnerIndexCache::default();
    let questdbs = cached!(
        GuardedQuestDB,
        api_for::<GuardedQuestDB>(client, ns),
        watcher::Config::default(),
        false,
        |q: &GuardedQuestDB| Some(ObjectRef::from_obj(q)),
        // kubectl's copy of the whole object, a few KiB each, is never read (children drop it
        // too), and the status is written with a PUT to /status, which ignores metadata.
        |q: &mut GuardedQuestDB| {
            if let Some(a) = q.meta_mut().annotations.as_mut() {
                a.remove(crate::desired::labels::LAST_APPLIED);
            }
        },
        Some(owner_index.changes())
    );
    let statefulsets = child!(StatefulSet, api_for::<StatefulSet>(client, ns));
    let configmaps = child!(ConfigMap, api_for::<ConfigMap>(client, ns));
    let services = child!(Service, api_for::<Service>(client, ns));
    let pvcs = cached!(
        PersistentVolumeClaim,
        api_for::<PersistentVolumeClaim>(client, ns),
        managed_selector(),
        true,
        questdb_of::<PersistentVolumeClaim>,
        trim_pvc
    );
    // Held as `CachedPod`: the pod spec never reaches the cache.
    let pods = {
        let (reader, writer) = reflector::store::<CachedPod>();
        let tx = tx.clone();
        let stream = watcher(api_for::<Pod>(client, ns), managed_selector())
            .default_backoff()
            .map_ok(|ev| project(ev, CachedPod::from))
            .reflect(writer)
            .inspect(move |ev| forward(ev, &tx, true, questdb_of::<CachedPod>));
        tasks.push(spawn_drain(stream, token.clone(), "Pod"));
        reader
    };

    let network_policies = child!(NetworkPolicy, api_for::<NetworkPolicy>(client, ns));

    let pdbs = child!(
        PodDisruptionBudget,
        api_for::<PodDisruptionBudget>(client, ns)
    );

    // One watch per refusal reason: the field selector keeps every other event (probes,
    // back-offs, other applications' warnings) out of the operator's memory.
    let refusals: Vec<_> = refusals::REASONS
        .iter()
        .map(|reason| {
            let (reader, writer) = reflector::store::<refusals::Refusal>();
            let config = watcher::Config::default()
                .fields(&format!("reason={reason}"))
                .page_size(LIST_PAGE_SIZE);
            let stream = watcher(
                api_for::<k8s_openapi::api::core::v1::Event>(client, ns),
                config,
            )
            .default_backoff()
            .map_ok(|ev| project(ev, refusals::Refusal::from_event))
            .reflect(writer)
            .inspect({
                // A refusal wakes its database, which would otherwise poll for it; events
                // about another application's objects wake nothing.
                let (tx, questdbs) = (tx.clone(), questdbs.clone());
                move |ev| {
                    forward(ev, &tx, false, |r: &refusals::Refusal| {
                        let key = ObjectRef::new(r.questdb_name()?)
                            .within(r.metadata.namespace.as_deref()?);
                        questdbs.get(&key).map(|_| key)
                    })
                }
            });
            tasks.push(spawn_drain(stream, token.clone(), "Event"));
            reader
        })
        .collect();

    let (nodes, mut node_writer) = reflector::store::<Node>();
    if watch_nodes {
        let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(trim_node)
            .reflect(node_writer)
            .inspect({
                let node_tx = node_tx.clone();
                let questdbs = questdbs.clone();
                let tx = tx.clone();
                move |ev| match ev {
                    // Only dedicated nodes have a health to judge; every node's Lease counts
                    // for the breaker, and its events reach the controller anyway.
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))
                        if node_health::pinned_instance(n).is_some() =>
                    {
                        let _ = node_tx.unbounded_send(ObjectRef::from_obj(n));
                    }
                    // A deleted dedicated Node is forgotten by the next survey, but its
                    // database must hear of it: its instance may still run (failover).
                    Ok(watcher::Event::Delete(n)) => {
                        if let Some(instance) = node_health::pinned_instance(n) {
                            for q in questdbs.state() {
                                let runs_there = q.0.as_ref().ok().is_some_and(|q| {
                                    q.status.as_ref().and_then(|s| s.instance_id.as_deref())
                                        == Some(instance)
                                });
                                if runs_there {
                                    let _ = tx.unbounded_send(ObjectRef::from_obj(q.as_ref()));
                                }
                            }
                        }
                    }
                    _ => {}
                }
            });
        tasks.push(spawn_drain(node_stream, token.clone(), "Node"));
    } else {
        // An empty, ready store: nothing waits on a watch the RBAC would refuse.
        node_writer.apply_watcher_event(&watcher::Event::Init);
        node_writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    // Dedicated nodes' health: the kubelets' Leases, trimmed to their renewTime.
    let (leases, mut lease_writer) = reflector::store::<Lease>();
    if watch_leases {
        let api: Api<Lease> = Api::namespaced(
            client.clone(),
            crate::controllers::node_health::NODE_LEASE_NAMESPACE,
        );
        let lease_stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|l: &mut Lease| {
                l.metadata.managed_fields = None;
                l.metadata.owner_references = None;
                l.metadata.labels = None;
                if let Some(spec) = l.spec.as_mut() {
                    *spec = k8s_openapi::api::coordination::v1::LeaseSpec {
                        renew_time: spec.renew_time.take(),
                        ..Default::default()
                    };
                }
            })
            .reflect(lease_writer)
            .inspect(move |ev| {
                if let Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) = ev {
                    if let Some(node) = node_health::node_of_lease(l) {
                        let _ = node_tx.unbounded_send(node);
                    }
                }
            });
        tasks.push(spawn_drain(lease_stream, token.clone(), "Lease"));
    } else {
        lease_writer.apply_watcher_event(&watcher::Event::Init);
        lease_writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    // One watch of every Secret it may list, or one per namespace of --secret-namespaces (an
    // install that grants Secret reads only there).
    let secret_namespaces: Vec<Option<&str>> = if secret_namespaces.is_empty() {
        vec![ns]
    } else {
        secret_namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let mut secret_stores = Vec::new();
    for secret_ns in secret_namespaces {
        let (store, secret_writer) = reflector::store::<PartialObjectMeta<Secret>>();
        let secret_stream = watcher(
            api_for::<PartialObjectMeta<Secret>>(client, secret_ns),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|s: &mut PartialObjectMeta<Secret>| {
            // Only the mapping annotation matters; drop the rest to keep the cache small when
            // the cluster holds thousands of unrelated Secrets.
            s.metadata.managed_fields = None;
            s.metadata.labels = None;
            s.types = None;
            if let Some(a) = s.metadata.annotations.as_mut() {
                a.retain(|k, v| kept_secret_annotation(k, v));
            }
        })
        .reflect(secret_writer)
        .inspect({
            let questdbs = questdbs.clone();
            let tx = tx.clone();
            move |ev| {
                forward(ev, &tx, true, |s: &PartialObjectMeta<Secret>| {
                    ilp_auth::questdb_for_secret(&s.metadata).map(guarded)
                });
                for r in credentials_users(ev, &questdbs) {
                    let _ = tx.unbounded_send(r);
                }
            }
        });
        tasks.push(spawn_drain(secret_stream, token.clone(), "Secret"));
        secret_stores.push((secret_ns.map(str::to_string), store));
    }
    let secrets = match secret_stores.as_slice() {
        [(None, store)] => SecretIndex::single(store.clone()),
        _ => SecretIndex::per_namespace(
            secret_stores
                .into_iter()
                .map(|(ns, store)| (ns.unwrap_or_default(), store))
                .collect(),
        ),
    };

    let caches = Caches {
        questdbs,
        statefulsets,
        configmaps,
        services,
        pvcs,
        pods,
        network_policies,
        pdbs,
        nodes,
        leases,
        refusals,
        secrets,
        owner_index,
    };
    (
        caches,
        Subscriptions {
            triggers,
            sender,
            node_triggers,
        },
        tasks,
    )
}

/// The volume machinery's annotations on a claim (binding, provisioner, selected node) are
/// most of a bound claim's metadata; the operator never reads them and never sets them
/// (`labels::child_annotations` leaves them out), so dropping them cannot make a claim look
/// different from the one desired.
fn trim_pvc(pvc: &mut PersistentVolumeClaim) {
    if let Some(a) = pvc.metadata.annotations.as_mut() {
        a.retain(|k, _| !crate::desired::labels::set_by_volume_machinery(k));
        if a.is_empty() {
            pvc.metadata.annotations = None;
        }
    }
}

/// Keeps what the operator reads of a Node: its metadata and spec (the pin, providerID,
/// taints), its conditions and addresses. A real kubelet's status also lists every image on the
/// node, tens of KiB on a busy one, which a cache of 1,000 nodes would hold for nothing.
fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        *status = k8s_openapi::api::core::v1::NodeStatus {
            conditions: status.conditions.take(),
            addresses: status.addresses.take(),
            ..Default::default()
        };
    }
}

fn spawn_drain<S, T>(
    stream: S,
    token: CancellationToken,
    what: &'static str,
) -> tokio::task::JoinHandle<()>
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                item = stream.next() => match item {
                    Some(Ok(_)) => {}
                    // The watcher retries with backoff by itself; a malformed object is skipped.
                    Some(Err(e)) => warn!(cache = what, error = %e, "watch error"),
                    None => break,
                }
            }
        }
    })
}

async fn wait_for_caches(c: &Caches, shutdown: &CancellationToken) {
    let all = async {
        let _ = c.questdbs.wait_until_ready().await;
        let _ = c.statefulsets.wait_until_ready().await;
        let _ = c.configmaps.wait_until_ready().await;
        let _ = c.services.wait_until_ready().await;
        let _ = c.pvcs.wait_until_ready().await;
        let _ = c.pods.wait_until_ready().await;
        let _ = c.network_policies.wait_until_ready().await;
        let _ = c.pdbs.wait_until_ready().await;
        let _ = c.nodes.wait_until_ready().await;
        let _ = c.leases.wait_until_ready().await;
        let _ = c.secrets.wait_until_ready().await;
    };
    tokio::select! {
        _ = all => {}
        _ = shutdown.cancelled() => {}
    }
}

/// What every controller of this manager shares.
struct Shared<'a> {
    client: &'a Client,
    opts: &'a ManagerOptions,
    metrics: &'a Arc<Metrics>,
    in_flight: &'a Arc<InFlight>,
    caches: &'a Caches,
    stopping: &'a Parts,
}

async fn run_as_leader(
    le: &LeaderElection,
    shared: &Shared<'_>,
    subs: Subscriptions,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let (client, metrics) = (shared.client, shared.metrics);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &le.lease_name)
        .with_namespace(&le.namespace)
        .with_identity(&le.identity)
        .with_duration(le.duration.as_secs())
        .with_grace(le.grace.as_secs())
        .with_field_manager(format!("{MANAGER}-{}", le.identity))
        .build()
        .await
        .context("starting leader election")?;
    let (mut leader, lease_task) = manager.watch().await;
    metrics.set_leader(&le.lease_name, false);
    info!(lease = %le.lease_name, identity = %le.identity, "waiting for leadership");

    let became_leader = async {
        loop {
            if *leader.borrow_and_update() {
                return true;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                changed = leader.changed() => if changed.is_err() { return false },
            }
        }
    };
    let (subs, is_leader) = subs.drain_while(became_leader).await;
    if !is_leader {
        drop(leader);
        let _ = lease_task.await;
        return Ok(());
    }

    info!(lease = %le.lease_name, identity = %le.identity, "became leader");
    metrics.set_leader(&le.lease_name, true);
    let controllers_token = shutdown.child_token();
    let controllers = run_controllers(shared, subs, controllers_token.clone());
    let mut controllers = std::pin::pin!(controllers);
    let renewals = crate::leadership::watch_renewals(client.clone(), le);
    let mut renewals = std::pin::pin!(renewals);
    let lost = loop {
        tokio::select! {
            _ = &mut controllers => break false,
            _ = &mut renewals => break true,
            changed = leader.changed() => {
                if changed.is_err() || !*leader.borrow_and_update() {
                    break true;
                }
            }
        }
    };
    controllers_token.cancel();
    if lost {
        // Stop every reconcile (and the AWS calls inside them) before reporting, so nothing
        // writes after the Lease may have gone: a short grace, then they are dropped.
        let (_, period) = crate::leadership::deadline_and_period(le);
        let _ = tokio::time::timeout(period, &mut controllers).await;
    }
    metrics.set_leader(&le.lease_name, false);
    // Dropping the receiver makes the lease task release the Lease for a fast hand-over; cut
    // off from the apiserver, that release cannot be waited for.
    drop(leader);
    if lost {
        // Cut off or replaced: there is nothing to release, and no time to wait for it.
        lease_task.abort();
    } else {
        let _ = tokio::time::timeout(le.grace, lease_task).await;
    }
    if lost {
        error!(lease = %le.lease_name, "lost leadership; stopping");
        anyhow::bail!("lost the leader-election Lease {}", le.lease_name);
    }
    Ok(())
}

fn zero_known_labels(metrics: &crate::metrics::Metrics) {
    let suppression = crate::plan::failover::SUPPRESSION_REASONS.map(<&str>::from);
    let errors = crate::controllers::Error::REASONS.map(<&str>::from);
    let failover_steps = crate::plan::failover::STEPS.map(<&str>::from);
    let move_steps = crate::plan::node_move::STEPS.map(<&str>::from);
    metrics.zero_known_labels(&crate::metrics::KnownLabels {
        suppression_reasons: &suppression,
        failover_steps: &failover_steps,
        node_move_steps: &move_steps,
        controllers: &[
            questdb::CONTROLLER_NAME,
            node_health::CONTROLLER_NAME,
            backup::CONTROLLER_NAME,
            schedule::CONTROLLER_NAME,
        ],
        error_reasons: &errors,
    });
}

/// Runs every controller until `token` is cancelled; returns once all of them stopped.
async fn run_controllers(shared: &Shared<'_>, subs: Subscriptions, token: CancellationToken) {
    let Shared {
        client,
        opts,
        metrics,
        in_flight,
        caches,
        stopping,
    } = *shared;
    let recorder = Recorder::new(client.clone(), MANAGER, std::env::var("POD_NAME").ok());
    let ctrl_metrics =
        metrics.controller(questdb::CONTROLLER_NAME, opts.questdb_concurrency as usize);
    zero_known_labels(metrics);
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder,
        caches: caches.clone(),
        metrics: metrics.clone(),
        keys: Default::default(),
        credentials: Default::default(),
        failures: Default::default(),
        // Built per leadership term: a new leader starts from a fresh view of EC2.
        cloud: match opts.cloud.clone() {
            Some(c) => Some(Arc::new(CloudRuntime::new(
                c,
                crate::controllers::cloud_runtime::cluster_id(client).await,
            ))),
            None => None,
        },
        wake: Some(subs.sender.clone()),
        operator_namespace: std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty()),
        write_health: Default::default(),
        checkpoints: Default::default(),
        backups: Default::default(),
        status_writes: Default::default(),
        tenancy: opts.tenancy.clone(),
        preflight: Default::default(),
        rolls: crate::plan::operator_rollout::OperatorRollouts::new(
            opts.operator_version.clone(),
            opts.max_concurrent_operator_rollouts,
        ),
    });
    let sweeper = sweep::run(ctx.clone(), opts.namespace.clone(), token.clone());
    let Subscriptions {
        triggers,
        sender: _,
        node_triggers,
    } = subs;
    let health = run_node_health(
        node_triggers,
        caches,
        opts.node_health_concurrency,
        metrics,
        ctx.clone(),
        token.clone(),
    );
    // Every QuestDB trigger is also offered to the backup controller: a change of a database
    // wakes the backups waiting for it (they are not polled).
    let (questdb_changes, questdb_changed) =
        futures::channel::mpsc::unbounded::<ObjectRef<GuardedQuestDB>>();
    let backups = run_backups(opts, metrics, ctx.clone(), questdb_changed, token.clone());
    let write_health = crate::controllers::write_health::run(
        ctx.clone(),
        opts.write_health_interval,
        opts.backup_timeouts,
        token.clone(),
    );
    // Where the snapshot API is asked for: the operator's own namespace, else the one it
    // watches (a namespaced install may list nothing elsewhere).
    let snapshot_namespace = ctx
        .operator_namespace
        .clone()
        .or_else(|| opts.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let preflight = crate::controllers::preflight::run(
        ctx.clone(),
        opts.operator_pod.clone(),
        snapshot_namespace,
        token.clone(),
    );
    let counted = ctrl_metrics.clone();
    let triggers = triggers.inspect(move |r| {
        counted.observe_trigger();
        // Dropped (an error) once the backup controller is off: nothing queues up.
        let _ = questdb_changes.unbounded_send(r.clone());
    });
    let controller = questdb_controller(triggers, caches, opts.questdb_concurrency)
        .graceful_shutdown_on(token.clone().cancelled_owned());
    let all = async {
        tokio::join!(
            stopping.run(
                "questdb controller",
                run_questdb_controller(controller, ctx, ctrl_metrics, in_flight.clone())
            ),
            stopping.run("orphan sweep", sweeper),
            stopping.run("node-health controller", health),
            stopping.run("backup controllers", backups),
            stopping.run("write-health poll", write_health),
            stopping.run("preflight", preflight)
        )
    };
    tokio::select! {
        _ = all => {}
        () = stopping.report_while_stopping(&token, STOPPING_REPORT_EVERY) => {}
    }
}

/// The backup controller: one reconcile per QuestDBBackup, on its own watch. Off (one error
/// line, no retry storm) when the QuestDBBackup CRD is not installed.
async fn run_backups(
    opts: &ManagerOptions,
    metrics: &Arc<Metrics>,
    ctx: Arc<Context>,
    questdb_changed: futures::channel::mpsc::UnboundedReceiver<ObjectRef<GuardedQuestDB>>,
    token: CancellationToken,
) {
    let api: Api<QuestDBBackup> = api_for(&ctx.client, opts.namespace.as_deref());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            error!("the QuestDBBackup CRD is not installed: backups are off until it is (apply crds/) and the operator restarts");
            return;
        }
        // Anything else (a blip): the controller's own watch retries with backoff.
        Err(e) => {
            warn!(error = %e, "listing QuestDBBackups failed; the backup controller starts anyway")
        }
    }
    let concurrency = opts.backup_concurrency;
    let m = metrics.controller(backup::CONTROLLER_NAME, concurrency as usize);
    let controller = Controller::new(api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(concurrency));
    let store = controller.store();
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let by_questdb = {
        let store = store.clone();
        questdb_changed
            .flat_map(move |q| futures::stream::iter(backup::woken_by_questdb(&store, &q)))
    };
    let controller = controller.reconcile_on(futures::stream::select(by_questdb, woken));
    let _ = ctx.backups.set(store.clone());
    let schedules = run_schedules(opts, metrics, ctx.clone(), store.clone(), token.clone());
    let bctx = Arc::new(backup::BackupContext::new(
        ctx,
        store,
        opts.backup_timeouts,
        wake,
    ));
    let backups = drive(
        controller,
        &token,
        m,
        backup::CONTROLLER_NAME,
        metrics.clone(),
        bctx,
        backup::reconcile,
    );
    tokio::join!(backups, schedules);
}

/// The backup-schedule controller, reading backups from the backup controller's cache.
async fn run_schedules(
    opts: &ManagerOptions,
    metrics: &Arc<Metrics>,
    ctx: Arc<Context>,
    backups: reflector::Store<QuestDBBackup>,
    token: CancellationToken,
) {
    let api: Api<QuestDBBackupSchedule> = api_for(&ctx.client, opts.namespace.as_deref());
    if let Err(kube::Error::Api(s)) = api.list_metadata(&ListParams::default().limit(1)).await {
        if s.code == 404 {
            error!("the QuestDBBackupSchedule CRD is not installed: backup schedules are off until it is (apply crds/) and the operator restarts");
            return;
        }
    }
    let concurrency = opts.backup_schedule_concurrency;
    let m = metrics.controller(schedule::CONTROLLER_NAME, concurrency as usize);
    let owned: Api<QuestDBBackup> = api_for(&ctx.client, opts.namespace.as_deref());
    // Its backups carry its name in a label (they are not owned: deleting a schedule keeps
    // them).
    let controller = Controller::new(api, watcher::Config::default())
        .watches(
            owned,
            watcher::Config::default().labels(crate::api::SCHEDULE_LABEL),
            |b: QuestDBBackup| {
                let schedule = kube::ResourceExt::labels(&b)
                    .get(crate::api::SCHEDULE_LABEL)?
                    .clone();
                Some(
                    reflector::ObjectRef::new(&schedule).within(&kube::ResourceExt::namespace(&b)?),
                )
            },
        )
        .with_config(ControllerConfig::default().concurrency(concurrency));
    let sctx = Arc::new(schedule::ScheduleContext { ctx, backups });
    drive(
        controller,
        &token,
        m,
        schedule::CONTROLLER_NAME,
        metrics.clone(),
        sctx,
        schedule::reconcile,
    )
    .await;
}

/// Runs `controller` with a span and metrics around every reconcile; a failed one is
/// counted by reason and retried with backoff (conflicts sooner). Stops when `token` is
/// cancelled: gracefully, or at once while its own cache never listed ([`until_stopped`]).
async fn drive<K, C, Fut>(
    controller: Controller<K>,
    token: &CancellationToken,
    m: ControllerMetrics,
    name: &'static str,
    metrics: Arc<Metrics>,
    ctx: Arc<C>,
    reconcile: fn(Arc<K>, Arc<C>) -> Fut,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    C: Send + Sync + 'static,
    Fut: Future<Output = Result<Next, Error>> + Send + 'static,
{
    let run_one = move |obj: Arc<K>, ctx: Arc<C>| {
        let (m, metrics) = (m.clone(), metrics.clone());
        async move {
            let guard = m.start(ObjectRef::from_obj(&*obj));
            let result = guard.scope(reconcile(obj, ctx)).await;
            match &result {
                Ok(next) => guard.finish(next.outcome()),
                Err(e) if e.is_transient_conflict() => guard.finish(ReconcileOutcome::Error),
                Err(e) => {
                    metrics.reconcile_error(name, e.reason().as_str());
                    guard.finish_with_error(e)
                }
            }
            result.map(Next::action)
        }
    };
    let store = controller.store();
    let running = controller
        .graceful_shutdown_on(token.clone().cancelled_owned())
        .run(
            run_one,
            |_, e: &Error, _| Action::requeue(retry_delay(2, e.is_transient_conflict())),
            ctx,
        )
        .for_each(|_| async {});
    until_stopped(name, running, &store, token).await;
}

/// The node-health controller: one reconcile per dedicated Node when it or its kubelet's
/// Lease changes, and on its own requeue while it looks unhealthy (a silent kubelet sends
/// nothing). Runs only with a cloud provider (dedicated nodes).
async fn run_node_health(
    node_triggers: futures::channel::mpsc::UnboundedReceiver<ObjectRef<Node>>,
    caches: &Caches,
    concurrency: u16,
    metrics: &Arc<Metrics>,
    ctx: Arc<Context>,
    token: CancellationToken,
) {
    if ctx.cloud.is_none() {
        // Nothing to judge; the channel is drained so the watch streams never back up.
        let mut node_triggers = node_triggers;
        tokio::select! {
            _ = token.cancelled() => {}
            _ = async { while node_triggers.next().await.is_some() {} } => {}
        }
        return;
    }
    let m = metrics.controller(node_health::CONTROLLER_NAME, concurrency as usize);
    let counted = m.clone();
    let none = futures::stream::pending::<Result<Node, watcher::Error>>();
    let controller = Controller::for_stream(none, caches.nodes.clone())
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .reconcile_on(node_triggers.inspect(move |_| counted.observe_trigger()))
        .reconcile_all_on(futures::stream::once(async {}))
        .graceful_shutdown_on(token.cancelled_owned());
    let reconcile = move |node: Arc<Node>, ctx: Arc<Context>| {
        let m = m.clone();
        async move {
            let guard = m.start(ObjectRef::from_obj(&*node));
            let result = guard.scope(node_health::reconcile(node, ctx)).await;
            match &result {
                Ok(next) => guard.finish(next.outcome()),
                Err(e) => guard.finish_with_error(e),
            }
            result.map(Next::action)
        }
    };
    controller
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

/// Builds the QuestDB controller and its triggers.
fn questdb_controller(
    triggers: impl Stream<Item = ObjectRef<GuardedQuestDB>> + Send + 'static,
    caches: &Caches,
    concurrency: u16,
) -> Controller<GuardedQuestDB> {
    // A short debounce folds the burst of events that follows a reconcile's own writes (six
    // children appearing, then the StatefulSet's status steps) into one reconcile that sees them
    // all, instead of several that act on a cache not yet caught up.
    let config = ControllerConfig::default()
        .concurrency(concurrency)
        .debounce(Duration::from_millis(100));
    // Every request comes through `subs.triggers`; the main stream only lends its cache.
    let none = futures::stream::pending::<Result<GuardedQuestDB, watcher::Error>>();
    let c = Controller::for_stream(none, caches.questdbs.clone())
        .with_config(config)
        .reconcile_on(triggers);
    // The controller only sees events after it starts: reconcile everything once at start.
    c.reconcile_all_on(futures::stream::once(async {}))
}

/// Drives the QuestDB controller: a span and metrics around every reconcile, and an error
/// policy with per-object exponential backoff.
async fn run_questdb_controller(
    controller: Controller<GuardedQuestDB>,
    ctx: Arc<Context>,
    m: ControllerMetrics,
    in_flight: Arc<InFlight>,
) {
    let reconcile = move |obj: Arc<GuardedQuestDB>, ctx: Arc<Context>| {
        let m = m.clone();
        let in_flight = in_flight.clone();
        async move {
            let key = ObjectRef::from_obj(&*obj);
            let _in_flight = in_flight.enter(key.to_string());
            let guard = m.start(&key);
            let result = match &obj.0 {
                Ok(qdb) => {
                    guard
                        .scope(questdb::reconcile(Arc::new(qdb.clone()), ctx.clone()))
                        .await
                }
                Err(invalid) => {
                    guard
                        .scope(questdb::report_unreadable(&obj, invalid, &ctx))
                        .await
                }
            };
            match &result {
                Ok(next) => {
                    ctx.failures.lock().expect("failures lock").remove(&key);
                    guard.finish(next.outcome());
                }
                // Conflicts are routine for a controller: retried, not reported as errors.
                Err(e) if e.is_transient_conflict() => {
                    guard
                        .span()
                        .in_scope(|| tracing::debug!(error = %e, "retrying after a conflict"));
                    guard.finish(ReconcileOutcome::Error);
                }
                Err(e) => {
                    ctx.metrics
                        .reconcile_error(questdb::CONTROLLER_NAME, e.reason().as_str());
                    // One Warning event per failing streak (the backoff retries are counted,
                    // not announced); the cause chain carries no Secret data.
                    let first = !ctx
                        .failures
                        .lock()
                        .expect("failures lock")
                        .contains_key(&key);
                    if let (true, Ok(qdb)) = (first, &obj.0) {
                        let note = crate::metrics::ErrorChain(e).to_string();
                        ctx.event(qdb, EventType::Warning, e.reason(), "Reconcile", note)
                            .await;
                    }
                    guard.finish_with_error(e)
                }
            }
            result.map(Next::action)
        }
    };
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                // Reconciler errors were already logged with their cause chain.
                if !matches!(e, kube::runtime::controller::Error::ReconcilerFailed(..)) {
                    warn!(error = %e, "controller event");
                }
            }
        })
        .await;
}

fn error_policy(obj: Arc<GuardedQuestDB>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(&*obj);
    let attempt = {
        let mut failures = ctx.failures.lock().expect("failures lock");
        let n = failures.entry(key).or_default();
        *n += 1;
        *n
    };
    Action::requeue(retry_delay(attempt - 1, err.is_transient_conflict()))
}

/// Which annotations of a Secret the cluster-wide metadata cache keeps: only the operator's
/// two, and only with a value they can hold (a QuestDB name, a uid). Any namespace's user can
/// annotate a Secret, and a megabyte of annotation value kept for each of thousands of Secrets
/// would be the operator's memory, not theirs.
pub fn kept_secret_annotation(key: &str, value: &str) -> bool {
    let label = |v: &str| {
        !v.is_empty()
            && v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    match key {
        crate::api::SECRET_QUESTDB_ANNOTATION => label(value),
        crate::desired::credentials::GENERATED_FOR_ANNOTATION => {
            value.len() <= 36 && value.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {

    /// The harm: any user who may annotate a Secret growing the operator's memory.
    #[test]
    fn only_the_operators_secret_annotations_with_plausible_values_are_cached() {
        use super::kept_secret_annotation as kept;
        assert!(kept("crd.questdb.io/name", "prod-db"));
        assert!(!kept("crd.questdb.io/name", &"a".repeat(64)));
        assert!(!kept("crd.questdb.io/name", &"x".repeat(1 << 20)));
        assert!(!kept("crd.questdb.io/name", "Prod"));
        assert!(kept(
            "crd.questdb.io/generated-for",
            "2f0c3a4e-1b2c-4d5e-8f90-123456789abc"
        ));
        assert!(!kept("crd.questdb.io/generated-for", &"0".repeat(37)));
        assert!(!kept(
            "kubectl.kubernetes.io/last-applied-configuration",
            "{}"
        ));
    }
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bound_claim_in_the_cache_still_matches_the_claim_desired() {
        use crate::desired::diff::needs_update;
        use crate::desired::{pvc_with_ownership, testing::questdb, PvcOwnership};
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.annotations = Some(std::collections::BTreeMap::from([(
            "owner".to_string(),
            "alice".to_string(),
        )]));
        let desired = pvc_with_ownership(&qdb, PvcOwnership::Owned);
        let mut stored = desired.clone();
        stored.metadata.annotations.get_or_insert_default().extend([
            ("pv.kubernetes.io/bind-completed".into(), "yes".into()),
            ("volume.kubernetes.io/selected-node".into(), "node-a".into()),
            (
                "volume.beta.kubernetes.io/storage-provisioner".into(),
                "ebs.csi.aws.com".into(),
            ),
        ]);
        trim_pvc(&mut stored);
        assert_eq!(
            stored.metadata.annotations, desired.metadata.annotations,
            "the user's annotation kept, the volume machinery's dropped"
        );
        assert!(!needs_update(&desired, &stored));
    }

    #[test]
    fn a_nodes_image_list_never_reaches_the_cache_but_what_failover_reads_does() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"crd.questdb.io/instance-id": "i-1"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"providerID": "aws:///sim-zone-a/i-1",
                     "taints": [{"key": "crd.questdb.io/dedicated", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "images": [{"names": ["registry/questdb:9.0"], "sizeBytes": 1}],
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                             "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c",
                             "kubeletVersion": "v", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"}
            }
        }))
        .unwrap();
        let before = node.clone();
        trim_node(&mut node);
        let status = node.status.as_ref().unwrap();
        assert!(status.images.is_none() && status.node_info.is_none());
        assert!(node.metadata.managed_fields.is_none());
        assert_eq!(
            status.conditions,
            before.status.as_ref().unwrap().conditions
        );
        assert_eq!(status.addresses, before.status.as_ref().unwrap().addresses);
        assert_eq!(
            (node.spec, node.metadata.labels),
            (before.spec, before.metadata.labels)
        );
    }
}
