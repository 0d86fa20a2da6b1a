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
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{QuestDBBackup, QuestDBBackupSchedule, MANAGER};
use crate::cache::Caches;
use crate::controllers::cloud_runtime::CloudRuntime;
pub use crate::controllers::cloud_runtime::{Cloud, CloudSettings};
use crate::controllers::context::{Context, GuardedQuestDB};
use crate::controllers::{backup, node_health, questdb, retry_delay, schedule, sweep, Error, Next};
use crate::http_server::{self, Readiness};
use crate::metrics::{ControllerMetrics, Metrics, ReconcileOutcome};
use crate::runtime::in_flight::InFlight;
use crate::runtime::stopping::{until_stopped, Parts};

use crate::cache::{api_for, start_caches, wait_for_caches, Subscriptions};

/// Nodes are cluster-scoped: a namespaced install without a cloud provider (Role-only RBAC)
/// never reads them; its NodeIP column comes from the pod's hostIP and NodeReady stays empty.
/// Dedicated nodes need them (labels, taints, the pin), whatever the namespace.
pub(crate) fn watches_nodes(opts: &ManagerOptions) -> bool {
    opts.cloud.is_some() || opts.namespace.is_none()
}

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
    pub backup_timeouts: crate::plan::backup::Timeouts,
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
    /// The CA (PEM) that signs the kubelets' serving certificates, read for the volumes'
    /// usage; the cluster's CA when `None` (`--kubelet-ca-file`).
    pub kubelet_ca: Option<String>,
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
            kubelet_ca: None,
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
    // The volumes' usage comes from the kubelets, with the operator's own credentials; only
    // where the nodes are watched (their addresses come from the Node cache).
    let kubelets = if watches_nodes(&opts) {
        Some(Arc::new(
            crate::kubelet_stats::Kubelets::new(&config, opts.kubelet_ca.as_deref())
                .context("reading the kubelet CA")?,
        ))
    } else {
        None
    };
    let client = crate::metrics::instrumented_client(config, metrics.clone())
        .context("building the Kubernetes client")?;

    // Before anything is served or cached: an operator newer than its CRD would have the
    // apiserver drop what it writes; its predecessor keeps running meanwhile.
    crate::installed_crd::refuse_an_older_crd(&client).await?;

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
            kubelets: &kubelets,
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

/// What every controller of this manager shares.
struct Shared<'a> {
    kubelets: &'a Option<Arc<crate::kubelet_stats::Kubelets>>,
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
    let suppression: Vec<&str> = crate::api::SuppressionReason::all()
        .map(<&str>::from)
        .collect();
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
        kubelets,
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
        disk: Default::default(),
        kubelets: kubelets.clone(),
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
    let scheduled_events = crate::controllers::scheduled_events::run(ctx.clone(), token.clone());
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
            stopping.run("scheduled-event look", scheduled_events),
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
