//! Starts a real control plane (questdb-testenv), installs the CRD, runs the manager under
//! `deploy/`'s RBAC, and waits on conditions.

pub(crate) mod cloud;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, Condition};
use kube::{Client, Resource};
use questdb_operator::api::QuestDB;
use questdb_operator::desired::testing;
use questdb_operator::manager::{self, ManagerHandle, ManagerOptions};
use questdb_testenv::{ControlPlane, ControlPlaneOptions};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Generous: a loaded 2-core CI machine runs two control planes at once.
pub const TIMEOUT: Duration = Duration::from_secs(90);

pub struct Env {
    pub cp: ControlPlane,
    pub client: Client,
    pub handle: ManagerHandle,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Three worker nodes in two zones.
pub fn cluster() -> ControlPlaneOptions {
    ControlPlaneOptions::sandbox()
}

/// A started control plane with the QuestDB CRD installed.
pub async fn control_plane() -> (ControlPlane, Client) {
    control_plane_with(cluster()).await
}

/// Runs a manager. One that ends before `token` told it to stop (its error, or a panic) is a
/// failed test at once: under nextest (one process per test) the process exits, instead of the
/// test waiting out every timeout for a manager that is gone.
pub fn spawn_manager(
    token: CancellationToken,
    run: impl Future<Output = anyhow::Result<()>> + Send + 'static,
) -> JoinHandle<anyhow::Result<()>> {
    use futures::FutureExt;
    // One task, so that aborting it (a crash, in `kill_and_restart_manager`) drops the manager.
    tokio::spawn(async move {
        let result = std::panic::AssertUnwindSafe(run)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the manager panicked")));
        if !token.is_cancelled() {
            eprintln!("the manager ended before the test told it to stop: {result:?}");
            if std::env::var_os("NEXTEST").is_some() {
                std::process::exit(101);
            }
        }
        result
    })
}

/// Waits for a manager told to stop; past the timeout, fails naming what had not stopped.
pub async fn stopped_in_time(
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    handle: &ManagerHandle,
) -> anyhow::Result<()> {
    match tokio::time::timeout(TIMEOUT, task).await {
        Ok(joined) => joined.expect("manager task does not panic"),
        Err(_) => panic!(
            "the manager did not stop within {TIMEOUT:?}; still running: {:?}",
            handle.stopping.running()
        ),
    }
}

/// [`control_plane`] with options of the test's choosing (real databases, say).
pub async fn control_plane_with(options: ControlPlaneOptions) -> (ControlPlane, Client) {
    init_tracing();
    let cp = ControlPlane::start(options)
        .await
        .expect("control plane starts");
    let client = cp.client().await;
    install_crd(&client).await;
    (cp, client)
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(ManagerOptions::default()).await
    }

    pub async fn start_with(opts: ManagerOptions) -> Env {
        Self::start_with_crd(opts, questdb_crd()).await
    }

    /// Like [`Env::start_with`], with a CRD of the test's choosing (e.g. a looser schema).
    pub async fn start_with_crd(opts: ManagerOptions, crd: CustomResourceDefinition) -> Env {
        Self::start_on(cluster(), opts, crd).await
    }

    /// Like [`Env::start_with_crd`], on a control plane of the test's choosing (e.g. the
    /// namespaced install's RBAC).
    pub async fn start_on(
        cluster: ControlPlaneOptions,
        opts: ManagerOptions,
        crd: CustomResourceDefinition,
    ) -> Env {
        let mut env = Self::without_manager(cluster, crd).await;
        env.start_synced_manager(opts).await;
        env
    }

    /// The control plane and the CRD, with no operator running yet (a test that installs the
    /// operator's RBAC itself starts it with [`Env::start_synced_manager`]).
    pub async fn without_manager(
        cluster: ControlPlaneOptions,
        crd: CustomResourceDefinition,
    ) -> Env {
        init_tracing();
        let cp = ControlPlane::start(cluster)
            .await
            .expect("control plane starts");
        let client = cp.client().await;
        install(&client, &crd).await;
        Env {
            cp,
            client,
            handle: ManagerHandle::default(),
            shutdown: CancellationToken::new(),
            task: None,
        }
    }

    /// Starts the operator and waits until its caches have synced.
    pub async fn start_synced_manager(&mut self, opts: ManagerOptions) {
        self.start_manager(opts).await;
        wait_until("manager caches synced", || {
            let r = self.handle.readiness.clone();
            async move { r.is_ready() }
        })
        .await;
    }

    async fn start_manager(&mut self, mut opts: ManagerOptions) {
        // The operator's own credentials: deploy/'s ClusterRole and Role, nothing more.
        let config = self.cp.operator_config().await;
        // The stand-in kubelets' serving certificates come from the test cluster's own CA.
        opts.kubelet_ca
            .get_or_insert_with(|| self.cp.kubelet_ca_pem());
        let token = self.shutdown.clone();
        let handle = self.handle.clone();
        self.task = Some(spawn_manager(
            token.clone(),
            manager::run_with(opts, config, token, handle),
        ));
    }

    /// Stops the manager (graceful shutdown) and returns what `run` returned.
    pub async fn stop_manager(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(t) => stopped_in_time(t, &self.handle).await,
            None => Ok(()),
        }
    }

    /// Stops the manager and starts a fresh one (new caches, new metrics): a full resync as
    /// after an operator restart or a leader hand-over.
    pub async fn restart_manager(&mut self, opts: ManagerOptions) {
        self.stop_manager().await.expect("manager stopped cleanly");
        self.shutdown = CancellationToken::new();
        self.handle = ManagerHandle::default();
        self.start_manager(opts).await;
        let r = self.handle.readiness.clone();
        wait_until("restarted manager caches synced", || {
            let r = r.clone();
            async move { r.is_ready() }
        })
        .await;
    }

    /// A crash and a restart: the manager's future is dropped wherever it is (between a
    /// status write and its side effect included), then a fresh manager starts.
    pub async fn kill_and_restart_manager(&mut self, opts: ManagerOptions) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        // The caches' own tasks outlive an abort; stop them like a dead process would.
        self.shutdown.cancel();
        self.shutdown = CancellationToken::new();
        self.handle = ManagerHandle::default();
        self.start_manager(opts).await;
    }

    /// Stops the manager; a manager that fails to stop cleanly fails the test.
    pub async fn stop(mut self) {
        self.stop_manager()
            .await
            .expect("the manager stopped cleanly");
    }

    pub fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    pub async fn namespace(&self, name: &str) {
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
    }

    /// Creates a QuestDB from the standard fixture, adjusted by `edit`.
    pub async fn create_questdb(
        &self,
        ns: &str,
        name: &str,
        edit: impl FnOnce(&mut QuestDB),
    ) -> QuestDB {
        let mut q = testing::questdb(name, ns);
        q.metadata.uid = None;
        q.metadata.resource_version = None;
        q.metadata.generation = None;
        edit(&mut q);
        self.api::<QuestDB>(ns)
            .create(&PostParams::default(), &q)
            .await
            .expect("QuestDB created")
    }
}

pub async fn install_crd(client: &Client) {
    install(client, &questdb_crd()).await
}

/// The `QuestDB` CRD as a cluster with the test environment's kubelets installs it: its floor
/// on `spec.failover.unhealthyAfterSeconds` is their Lease duration, as the operator's is.
pub fn questdb_crd() -> CustomResourceDefinition {
    questdb_operator::crd::questdb(questdb_testenv::timings::node_lease_duration())
}

/// `crd` (the QuestDB CRD, or a test's variant of it) and the backup CRDs beside it.
async fn install(client: &Client, crd: &CustomResourceDefinition) {
    let mut crds = questdb_testenv::crds::all();
    crds[0] = crd.clone();
    questdb_testenv::crds::install_these(client, &crds, TIMEOUT)
        .await
        .expect("CRDs installed and served");
}

/// Waits (watch-based) until `cond` holds for the named object.
pub async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, cond: impl Condition<K>) -> K
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + Debug + Send + 'static,
{
    wait_for_within(api, name, what, TIMEOUT, cond).await
}

/// [`wait_for`] with a timeout of the test's choosing (a failover takes the cluster's own
/// timings: node grace, pod GC period, detach, attach).
pub async fn wait_for_within<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Condition<K>,
) -> K
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + Debug + Send + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => panic!("{what}: {name} was deleted"),
        Ok(Err(e)) => panic!("{what}: watch failed: {e}"),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            let ns = now
                .as_ref()
                .and_then(|o| o.meta().namespace.clone())
                .unwrap_or_default();
            let scene = match ns.as_str() {
                "" => String::new(),
                ns => scene(&api.clone().into_client(), ns).await,
            };
            let said = crate::log_capture::recent_about(&[name], 80).join("\n");
            // The stand-in kubelets and CSI driver name pods and volumes, not QuestDBs; other
            // tests' lines mix in.
            let agents = crate::log_capture::recent_about(&["questdb_testenv"], 40).join("\n");
            // Compact first: a CI log keeps the start and the end of a failure's output.
            let json = now
                .as_ref()
                .and_then(|o| serde_json::to_value(o).ok())
                .map(|mut v| {
                    if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                        m.remove("managedFields");
                    }
                    v.to_string()
                })
                .unwrap_or_default();
            panic!(
                "{what}: timed out after {timeout:?}; object is now {json}\n{scene}\n\
                 --- the newest lines naming {name} (namespace {ns}):\n{said}\n\
                 --- the agents' newest lines (every test's):\n{agents}"
            )
        }
    }
}

/// Every object `api` lists, or none if the list fails (a diagnostic never fails the test
/// twice).
async fn listed<K>(api: Api<K>) -> Vec<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// What a timed-out wait saw around its object, compactly (a CI log keeps only so much): the
/// namespace's pods, StatefulSets and newest events.
async fn scene(client: &Client, ns: &str) -> String {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Event, Pod};
    use std::fmt::Write;
    let mut out = format!(
        "--- namespace {ns} at {}\n",
        k8s_openapi::jiff::Timestamp::now()
    );
    let mut nodes = std::collections::BTreeSet::new();
    for p in listed(Api::<Pod>::namespaced(client.clone(), ns)).await {
        nodes.extend(p.spec.as_ref().and_then(|s| s.node_name.clone()));
        let status = p.status.unwrap_or_default();
        let conditions: Vec<String> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .map(|c| format!("{}={}", c.type_, c.status))
            .collect();
        let _ = writeln!(
            out,
            "pod {} uid={} node={:?} phase={:?} {:?} revision={:?} deleting={:?}",
            p.metadata.name.unwrap_or_default(),
            p.metadata.uid.unwrap_or_default(),
            p.spec.and_then(|s| s.node_name),
            status.phase,
            conditions,
            p.metadata
                .labels
                .unwrap_or_default()
                .get("controller-revision-hash"),
            p.metadata.deletion_timestamp.map(|t| t.0.to_string()),
        );
    }
    for s in listed(Api::<StatefulSet>::namespaced(client.clone(), ns)).await {
        let _ = writeln!(
            out,
            "statefulset {} generation={:?} status={}",
            s.metadata.name.unwrap_or_default(),
            s.metadata.generation,
            serde_json::to_string(&s.status).unwrap_or_default()
        );
    }
    for n in nodes {
        if let Ok(Some(node)) = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .get_opt(&n)
            .await
        {
            let status = node.status.unwrap_or_default();
            let _ = writeln!(
                out,
                "node {n} inUse={:?} attached={:?}",
                status.volumes_in_use.unwrap_or_default(),
                status
                    .volumes_attached
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v.name)
                    .collect::<Vec<_>>()
            );
        }
    }
    for va in listed(Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(
        client.clone(),
    ))
    .await
    {
        let _ = writeln!(
            out,
            "volumeattachment {} node={} pv={:?} attached={:?} deleting={}",
            va.metadata.name.unwrap_or_default(),
            va.spec.node_name,
            va.spec.source.persistent_volume_name,
            va.status.map(|s| s.attached),
            va.metadata.deletion_timestamp.is_some()
        );
    }
    let mut events = listed(Api::<Event>::namespaced(client.clone(), ns)).await;
    let at = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
    };
    events.sort_by_key(at);
    for e in events.iter().rev().take(20).rev() {
        let _ = writeln!(
            out,
            "event {} {}/{} {:?} x{:?}: {}",
            at(e).map(|t| t.to_string()).unwrap_or_default(),
            e.involved_object.kind.as_deref().unwrap_or(""),
            e.involved_object.name.as_deref().unwrap_or(""),
            e.reason,
            e.count,
            e.message.as_deref().unwrap_or("")
        );
    }
    out
}

/// Polls `probe` until it returns true (for facts no single watch can express).
pub async fn wait_until<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut delay = Duration::from_millis(10);
    loop {
        if probe().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

/// Waits until no write has gone through the proxy for longer than the operator holds back a
/// status write ([`STATUS_SETTLE`](questdb_operator::controllers::questdb::status_write::STATUS_SETTLE)):
/// in-flight reconciles have finished and no held progress is still to come.
pub async fn writes_settle(cp: &ControlPlane) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let quiet = questdb_operator::controllers::questdb::status_write::STATUS_SETTLE
        + Duration::from_secs(1);
    let last = std::sync::Arc::new(AtomicU64::new(cp.request_counts().writes()));
    wait_until("writes settle", || {
        let last = last.clone();
        async move {
            tokio::time::sleep(quiet).await;
            let now = cp.request_counts().writes();
            last.swap(now, Ordering::SeqCst) == now
        }
    })
    .await;
}

/// Waits until an Event in `ns` satisfies `matches` (events.k8s.io/v1, as the recorder writes).
pub async fn wait_for_event(
    env: &Env,
    ns: &str,
    what: &str,
    matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) {
    wait_for_event_in(&env.client, ns, what, matches).await
}

/// [`wait_for_event`] through any client (a cloud test's environment is not an [`Env`]).
pub async fn wait_for_event_in(
    client: &Client,
    ns: &str,
    what: &str,
    matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let matches = &matches;
    wait_until(what, || {
        let events = events.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .map(|l| l.items.iter().any(matches))
                .unwrap_or(false)
        }
    })
    .await;
}

/// The QuestDB's Ready condition is True.
pub fn is_ready() -> impl Condition<QuestDB> {
    |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    }
}

/// Ready, and the phase says Running (a step record is written before the status that follows
/// from it, so the two can briefly disagree).
pub fn is_running() -> impl Condition<QuestDB> {
    |q: Option<&QuestDB>| {
        is_ready().matches_object(q)
            && q.and_then(|q| q.status.as_ref()?.phase)
                .is_some_and(|p| p.as_str() == "Running")
    }
}

/// The message of the QuestDB's condition `type_` (empty without it).
pub fn condition_message(q: &QuestDB, type_: &str) -> String {
    q.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The QuestDB's condition `type_` has `reason`.
pub fn has_condition(type_: &'static str, reason: &'static str) -> impl Condition<QuestDB> {
    move |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.reason == reason)
        })
    }
}

fn init_tracing() {
    crate::log_capture::init();
}
