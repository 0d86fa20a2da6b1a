//! The caches: every reflector the manager starts (on every replica, so a standby is warm),
//! what each keeps of its objects (trimmed and compacted), and the reconcile requests they
//! forward once an event reached its cache.

pub(crate) mod compacted;
pub(crate) mod interned;
pub(crate) mod shared_text;
mod stores;

pub(crate) use stores::{
    Caches, CheckpointWatch, CredentialsCache, DiskObservation, DiskWatch, KeyCache, SecretIndex,
    WriteHealth,
};

use crate::api::{labels, QuestDB};
use crate::controllers::cached_pod::CachedPod;
use crate::controllers::keys::GuardedQuestDB;
use crate::controllers::node_health;
use crate::controllers::refusals;
use crate::ilp_auth;
use compacted::{CachedMeta, OwnedChild};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Lookup, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Reconcile requests, forwarded from the reflector streams after each event reached its cache:
/// a QuestDB's own changes, and the changes and deletions of its children and key Secrets.
///
/// kube-runtime's shared-stream subscriptions are not used for triggers: they fan out only
/// applied objects (no deletions), and a subscription whose object vanished from the cache
/// before it was read returns `Pending` without a wake-up, which can stall that trigger stream.
pub(crate) struct Subscriptions {
    pub(crate) triggers: TriggerReceiver,
    /// For reconciles that ask for reconciles of other QuestDBs (node health, node moves).
    pub(crate) sender: TriggerSender,
    /// The node-health controller's requests: a dedicated Node or its kubelet Lease changed.
    pub(crate) node_triggers: futures::channel::mpsc::UnboundedReceiver<ObjectRef<Node>>,
}

pub(crate) type TriggerReceiver =
    futures::channel::mpsc::UnboundedReceiver<ObjectRef<GuardedQuestDB>>;
pub(crate) type TriggerSender = crate::controllers::context::Wake;

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
    pub(crate) async fn drain_while<T>(mut self, until: impl Future<Output = T>) -> (Self, T) {
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

pub(crate) fn api_for<K>(client: &Client, ns: Option<&str>) -> Api<K>
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
pub(crate) fn start_caches(
    client: &Client,
    ns: Option<&str>,
    secret_namespaces: &[String],
    watch_nodes: bool,
    watch_leases: bool,
    token: &CancellationToken,
) -> (Caches, Subscriptions, Vec<tokio::task::JoinHandle<()>>) {
    let (tx, triggers) = futures::channel::mpsc::unbounded();
    let sender = tx.clone();
    let (node_tx, node_triggers) = futures::channel::mpsc::unbounded::<ObjectRef<Node>>();
    let start = Starter {
        client,
        ns,
        tx: tx.clone(),
        token,
        tasks: Default::default(),
    };

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
            start.spawn(stream, stringify!($k));
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
    let statefulsets = start.child(api_for::<StatefulSet>(client, ns), "StatefulSet");
    let configmaps = start.child(api_for::<ConfigMap>(client, ns), "ConfigMap");
    let services = start.child(api_for::<Service>(client, ns), "Service");
    let pvcs = cached!(
        PersistentVolumeClaim,
        api_for::<PersistentVolumeClaim>(client, ns),
        managed_selector(),
        true,
        questdb_of::<PersistentVolumeClaim>,
        trim_pvc
    );
    let pods = start.pods();

    let network_policies = start.child(api_for::<NetworkPolicy>(client, ns), "NetworkPolicy");

    let pdbs = start.child(
        api_for::<PodDisruptionBudget>(client, ns),
        "PodDisruptionBudget",
    );

    let refusals = refusal_caches(&start, &questdbs);

    let nodes = node_cache(&start, watch_nodes, &node_tx, &questdbs);

    let leases = lease_cache(&start, watch_leases, node_tx);

    let secrets = secret_caches(&start, ns, secret_namespaces, &questdbs);

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
        start.tasks.into_inner(),
    )
}

/// What every reflector is started with: the client, the namespace watched (every one when
/// `None`), the reconcile requests' sender, the shutdown token, and the drain tasks so far.
struct Starter<'a> {
    client: &'a Client,
    ns: Option<&'a str>,
    tx: TriggerSender,
    token: &'a CancellationToken,
    tasks: std::cell::RefCell<Vec<tokio::task::JoinHandle<()>>>,
}

impl Starter<'_> {
    /// Drains `stream` (which feeds a cache) until shutdown.
    fn spawn<S, T>(&self, stream: S, what: &'static str)
    where
        S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let task = spawn_drain(stream, self.token.clone(), what);
        self.tasks.borrow_mut().push(task);
    }
    /// A child kind, held in the form `OwnedChild::Cached` says (projected before the store);
    /// its changes and deletions wake the QuestDB whose instance label it carries.
    fn child<K>(&self, api: Api<K>, what: &'static str) -> reflector::Store<K::Cached>
    where
        K: OwnedChild + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let (reader, writer) = reflector::store::<K::Cached>();
        let tx = self.tx.clone();
        let stream = watcher(api, managed_selector())
            .default_backoff()
            .map_ok(|ev| {
                project(ev, |mut o: K| {
                    o.meta_mut().managed_fields = None;
                    K::to_cached(o)
                })
            })
            .map_ok(reflect_into(writer))
            .inspect(move |ev| forward(ev, &tx, true, questdb_of::<K::Cached>));
        self.spawn(stream, what);
        reader
    }

    /// The database pods, held as `CachedPod`: the pod spec never reaches the cache.
    fn pods(&self) -> reflector::Store<CachedPod> {
        let (reader, writer) = reflector::store::<CachedPod>();
        let tx = self.tx.clone();
        let stream = watcher(api_for::<Pod>(self.client, self.ns), managed_selector())
            .default_backoff()
            .map_ok(|ev| project(ev, CachedPod::from))
            .reflect(writer)
            .inspect(move |ev| forward(ev, &tx, true, questdb_of::<CachedPod>));
        self.spawn(stream, "Pod");
        reader
    }
}

/// The controllers' refusal events (a pod or a claim the cluster refused), one watch per
/// reason.
fn refusal_caches(
    start: &Starter,
    questdbs: &reflector::Store<GuardedQuestDB>,
) -> Vec<reflector::Store<refusals::Refusal>> {
    // One watch per refusal reason: the field selector keeps every other event (probes,
    // back-offs, other applications' warnings) out of the operator's memory.
    refusals::REASONS
        .iter()
        .map(|reason| {
            let (reader, writer) = reflector::store::<refusals::Refusal>();
            let config = watcher::Config::default()
                .fields(&format!("reason={reason}"))
                .page_size(LIST_PAGE_SIZE);
            let stream = watcher(
                api_for::<k8s_openapi::api::core::v1::Event>(start.client, start.ns),
                config,
            )
            .default_backoff()
            .map_ok(|ev| project(ev, refusals::Refusal::from_event))
            .reflect(writer)
            .inspect({
                // A refusal wakes its database, which would otherwise poll for it; events
                // about another application's objects wake nothing.
                let (tx, questdbs) = (start.tx.clone(), questdbs.clone());
                move |ev| {
                    forward(ev, &tx, false, |r: &refusals::Refusal| {
                        let key = ObjectRef::new(r.questdb_name()?)
                            .within(r.metadata.namespace.as_deref()?);
                        questdbs.get(&key).map(|_| key)
                    })
                }
            });
            start.spawn(stream, "Event");
            reader
        })
        .collect()
}

/// Every Node (trimmed to its conditions and addresses) when the nodes are watched; an empty,
/// ready store otherwise. A dedicated Node's change is a node-health request; a deleted one
/// wakes the databases that ran on it.
fn node_cache(
    start: &Starter,
    watch_nodes: bool,
    node_tx: &futures::channel::mpsc::UnboundedSender<ObjectRef<Node>>,
    questdbs: &reflector::Store<GuardedQuestDB>,
) -> reflector::Store<Node> {
    let (nodes, mut node_writer) = reflector::store::<Node>();
    if watch_nodes {
        let node_stream = watcher(
            Api::<Node>::all(start.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(trim_node)
        .reflect(node_writer)
        .inspect({
            let node_tx = node_tx.clone();
            let questdbs = questdbs.clone();
            let tx = start.tx.clone();
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
        start.spawn(node_stream, "Node");
    } else {
        // An empty, ready store: nothing waits on a watch the RBAC would refuse.
        node_writer.apply_watcher_event(&watcher::Event::Init);
        node_writer.apply_watcher_event(&watcher::Event::InitDone);
    }
    nodes
}

/// The kubelets' Leases (the dedicated nodes' health), trimmed to their renewTime, when they
/// are watched; an empty, ready store otherwise.
fn lease_cache(
    start: &Starter,
    watch_leases: bool,
    node_tx: futures::channel::mpsc::UnboundedSender<ObjectRef<Node>>,
) -> reflector::Store<Lease> {
    // Dedicated nodes' health: the kubelets' Leases, trimmed to their renewTime.
    let (leases, mut lease_writer) = reflector::store::<Lease>();
    if watch_leases {
        let api: Api<Lease> = Api::namespaced(
            start.client.clone(),
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
        start.spawn(lease_stream, "Lease");
    } else {
        lease_writer.apply_watcher_event(&watcher::Event::Init);
        lease_writer.apply_watcher_event(&watcher::Event::InitDone);
    }
    leases
}

/// The Secrets' metadata (only the mapping annotation kept), in the watched namespace or in
/// each of `--secret-namespaces`.
fn secret_caches(
    start: &Starter,
    ns: Option<&str>,
    secret_namespaces: &[String],
    questdbs: &reflector::Store<GuardedQuestDB>,
) -> SecretIndex {
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
            api_for::<PartialObjectMeta<Secret>>(start.client, secret_ns),
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
            let tx = start.tx.clone();
            move |ev| {
                forward(ev, &tx, true, |s: &PartialObjectMeta<Secret>| {
                    ilp_auth::questdb_for_secret(&s.metadata).map(guarded)
                });
                // The server.conf Secret, edited or deleted by hand: written back.
                forward(ev, &tx, true, |s: &PartialObjectMeta<Secret>| {
                    questdb_of(s).filter(|q| {
                        s.metadata.name.as_deref()
                            == Some(format!("{}-server-conf", q.name).as_str())
                    })
                });
                for r in credentials_users(ev, &questdbs) {
                    let _ = tx.unbounded_send(r);
                }
            }
        });
        start.spawn(secret_stream, "Secret");
        secret_stores.push((secret_ns.map(str::to_string), store));
    }
    match secret_stores.as_slice() {
        [(None, store)] => SecretIndex::single(store.clone()),
        _ => SecretIndex::per_namespace(
            secret_stores
                .into_iter()
                .map(|(ns, store)| (ns.unwrap_or_default(), store))
                .collect(),
        ),
    }
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

pub(crate) fn spawn_drain<S, T>(
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

pub(crate) async fn wait_for_caches(c: &Caches, shutdown: &CancellationToken) {
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

/// Which annotations of a Secret the cluster-wide metadata cache keeps: only the operator's
/// three, and only with a value they can hold (a QuestDB name, a uid). Any namespace's user can
/// annotate a Secret, and a megabyte of annotation value kept for each of thousands of Secrets
/// would be the operator's memory, not theirs.
pub(crate) fn kept_secret_annotation(key: &str, value: &str) -> bool {
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
        // `<16 hex>:<16 hex>` (`credentials::server_conf_source`).
        crate::desired::credentials::SERVER_CONF_SOURCE_ANNOTATION => {
            value.len() <= 33 && value.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
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
        assert!(kept(
            "crd.questdb.io/server-conf-source",
            "0123456789abcdef:fedcba9876543210"
        ));
        assert!(!kept("crd.questdb.io/server-conf-source", &"a".repeat(34)));
        assert!(!kept(
            "kubectl.kubernetes.io/last-applied-configuration",
            "{}"
        ));
    }
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bound_claim_in_the_cache_still_matches_the_claim_desired() {
        use crate::cache::compacted::needs_update;
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
