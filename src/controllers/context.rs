//! What every reconcile shares: the client, one event recorder, the caches, metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::WriteHealthReason;
use crate::runtime::events::Recorder;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, ObjectReference, PersistentVolumeClaim, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use tracing::warn;

use crate::api::{EventReason, QuestDB};

use crate::cache::compacted::OwnedChild;
use crate::controllers::cloud_runtime::CloudRuntime;
pub(crate) use crate::controllers::keys::{polled, questdb_ref, GuardedQuestDB};
use crate::ilp_auth::{KeyError, PublicKey};
use crate::metrics::Metrics;

/// A child as its cache holds it.
pub(crate) type Cached<K> = <K as OwnedChild>::Cached;

/// Reflector caches the reconcilers read instead of the apiserver.
#[derive(Clone)]
pub(crate) struct Caches {
    /// Guarded: one QuestDB that does not deserialize must not stop the watch of all others.
    pub questdbs: Store<GuardedQuestDB>,
    /// The operator's children, in the form [`OwnedChild::Cached`] says.
    pub statefulsets: Store<Cached<StatefulSet>>,
    pub configmaps: Store<Cached<ConfigMap>>,
    pub services: Store<Cached<Service>>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub pods: Store<crate::controllers::cached_pod::CachedPod>,
    pub network_policies: Store<Cached<NetworkPolicy>>,
    pub pdbs: Store<Cached<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
    pub nodes: Store<Node>,
    /// The kubelets' Leases in `kube-node-lease` (renewTime only), with a cloud provider.
    pub leases: Store<k8s_openapi::api::coordination::v1::Lease>,
    /// The refusal events that say why a database waits, one cache per reason watched.
    pub refusals: Vec<Store<crate::controllers::refusals::Refusal>>,
    /// Secrets, metadata only: Secret data of the whole cluster is never cached.
    pub secrets: SecretIndex,
    /// Dedicated instances by the QuestDB they serve, rebuilt when the QuestDB cache changes.
    pub owner_index: crate::controllers::node_health::owners::OwnerIndexCache,
}

/// The Secrets' metadata: one cache of every Secret the operator may list (the cluster's, or
/// the watched namespace's), or one per namespace of `--secret-namespaces`, so an install
/// grants Secret reads only in the namespaces its databases live in.
#[derive(Clone)]
pub(crate) struct SecretIndex {
    /// Each cache with the namespace it holds (`None`: every namespace it may list).
    stores: Vec<(Option<String>, Store<PartialObjectMeta<Secret>>)>,
}

impl SecretIndex {
    /// One cache of every Secret the operator lists.
    pub(crate) fn single(store: Store<PartialObjectMeta<Secret>>) -> Self {
        Self {
            stores: vec![(None, store)],
        }
    }

    /// One cache per namespace.
    pub(crate) fn per_namespace(stores: Vec<(String, Store<PartialObjectMeta<Secret>>)>) -> Self {
        Self {
            stores: stores.into_iter().map(|(ns, s)| (Some(ns), s)).collect(),
        }
    }

    fn store_of(&self, ns: &str) -> Option<&Store<PartialObjectMeta<Secret>>> {
        self.stores
            .iter()
            .find(|(held, _)| held.as_deref().is_none_or(|h| h == ns))
            .map(|(_, s)| s)
    }

    /// The Secret `r` names, when it is cached (never when its namespace is not read).
    pub(crate) fn get(
        &self,
        r: &ObjectRef<PartialObjectMeta<Secret>>,
    ) -> Option<Arc<PartialObjectMeta<Secret>>> {
        self.store_of(r.namespace.as_deref()?)?.get(r)
    }

    /// Every cached Secret of namespace `ns`.
    pub(crate) fn in_namespace(&self, ns: &str) -> Vec<Arc<PartialObjectMeta<Secret>>> {
        self.store_of(ns).map_or_else(Vec::new, |s| {
            s.state()
                .into_iter()
                .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
                .collect()
        })
    }

    /// Once every cache has listed its Secrets.
    pub(crate) async fn wait_until_ready(&self) {
        for (_, store) in &self.stores {
            let _ = store.wait_until_ready().await;
        }
    }
}

/// Parsed public keys by Secret and resourceVersion, so a resync reads no Secret again. Holds
/// only the public half (`kid`, `x`, `y`) or the problem found.
pub(crate) type KeyCache = Mutex<HashMap<ObjectRef<Secret>, (String, Result<PublicKey, KeyError>)>>;

/// What each credentials Secret's data said, by Secret and resourceVersion: the check and
/// digest only, never a value.
pub(crate) type CredentialsCache =
    Mutex<HashMap<ObjectRef<Secret>, (String, crate::desired::credentials::Check)>>;

/// The newest `WriteHealthy` verdict per QuestDB, written by the write-health poll and read
/// by the QuestDB's reconcile.
pub(crate) type WriteHealth =
    Mutex<HashMap<ObjectRef<GuardedQuestDB>, crate::plan::conditions::Verdict<WriteHealthReason>>>;

/// What the write-health poll last saw of each QuestDB's volume: the file system's usage from
/// its node's kubelet (or why it could not be read) and the WAL tables QuestDB reports
/// suspended (`None`: QuestDB did not answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DiskObservation {
    pub usage: Result<crate::plan::disk::VolumeUsage, String>,
    pub suspended: Option<Vec<crate::plan::disk::SuspendedTable>>,
}

pub(crate) type DiskWatch = Mutex<HashMap<ObjectRef<GuardedQuestDB>, DiskObservation>>;

/// The newest `CheckpointReleased` verdict per QuestDB, written by the same poll.
pub(crate) type CheckpointWatch = Mutex<
    HashMap<
        ObjectRef<GuardedQuestDB>,
        crate::plan::conditions::Verdict<crate::api::CheckpointReason>,
    >,
>;

pub(crate) struct Context {
    pub client: Client,
    /// One recorder for the whole manager so its event series cache is shared.
    pub recorder: Recorder,
    pub caches: Caches,
    pub metrics: Arc<Metrics>,
    pub keys: KeyCache,
    pub credentials: CredentialsCache,
    /// Consecutive failures per object, for backoff and the retries metric.
    pub failures: Mutex<HashMap<ObjectRef<GuardedQuestDB>, u32>>,
    /// Node and DNS providers; `None` runs without dedicated nodes.
    pub cloud: Option<Arc<CloudRuntime>>,
    /// Asks the controller to reconcile another QuestDB (a freed node-move slot wakes the
    /// moves queued behind it instead of leaving them to their next poll).
    pub wake: Option<Wake>,
    /// The operator's own namespace (`POD_NAMESPACE`): its pods are admitted to each
    /// database's HTTP port (backups). `None` outside a pod.
    pub operator_namespace: Option<String>,
    /// The newest `WriteHealthy` verdict per QuestDB (see `write_health`).
    pub write_health: WriteHealth,
    /// The newest `CheckpointReleased` verdict per QuestDB (see `checkpoint_watch`).
    pub checkpoints: CheckpointWatch,
    /// The volumes' usage and suspended tables, written by the same poll.
    pub disk: DiskWatch,
    /// Clients for the kubelets' Summary API (`None`: the nodes are not watched, as in a
    /// namespaced install, and no usage is read).
    pub kubelets: Option<Arc<crate::kubelet_stats::Kubelets>>,
    /// The backup controller's cache of QuestDBBackups, once it runs (the checkpoint watchdog
    /// reads which backup opened a checkpoint).
    pub backups: std::sync::OnceLock<Store<crate::api::QuestDBBackup>>,
    /// When each QuestDB's status was last written and since when progress waits, for those
    /// whose window or settle still runs ([`StatusWrite::live`]): progress within a phase
    /// waits out [`StatusWrite::wait`].
    pub status_writes: Mutex<HashMap<ObjectRef<GuardedQuestDB>, StatusWrite>>,
    /// The platform team's allow-lists for images, priority classes and tolerations.
    pub tenancy: crate::desired::TenancyPolicy,
    /// What the newest preflight found wrong (see [`crate::controllers::preflight`]).
    pub preflight: crate::plan::preflight::PreflightState,
    /// Operator upgrades at a bounded rate (see [`crate::plan::operator_rollout`]).
    pub rolls: crate::plan::operator_rollout::OperatorRollouts,
}

/// A database on its way (a pod created, then placed once the scheduler's retry finds its
/// claim bound, 1-2 s later) passes through states a person at a terminal cannot tell apart;
/// each write is one more for the apiserver and etcd, at a thousand databases thousands.
/// The first such progress waits this long after the last write: past the scheduler's first
/// retry (1-2 s), and as long as a database on an idle cluster takes to start, so most start
/// with one write of progress at most.
pub(crate) const STATUS_COALESCE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest progress waits: a database that stays on its way (a thousand created at once,
/// a volume slow to attach) still shows where it is twice a minute.
pub(crate) const STATUS_COALESCE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// How long progress is held back once seen, however long ago the last write was: the steps
/// of a database on its way come in bursts (placed on a node, then ready a second or two later:
/// half of them within 2 s at 200 databases created at once), and a burst is one write.
pub const STATUS_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// A QuestDB's last status write, how many progress-only writes came since the last write of
/// a change (a phase, a condition's status), and since when progress not yet written waits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StatusWrite {
    pub at: std::time::Instant,
    pub progress: u32,
    pub held: Option<std::time::Instant>,
}

impl StatusWrite {
    /// How long progress waits after this write: doubling with each progress-only write
    /// since the last change, from [`STATUS_COALESCE`] up to [`STATUS_COALESCE_MAX`]. A
    /// database that takes a minute to start costs four progress writes, not twelve.
    pub(crate) fn window(&self) -> std::time::Duration {
        crate::controllers::keys::doubling(STATUS_COALESCE, self.progress, STATUS_COALESCE_MAX)
    }

    /// How much longer progress seen `now` waits: until the window after the last write has
    /// passed and the progress has settled for [`STATUS_SETTLE`]. `None`: write it now.
    pub(crate) fn wait(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        let window = self
            .window()
            .checked_sub(now.saturating_duration_since(self.at));
        let held = self.held.unwrap_or(now);
        let settle = STATUS_SETTLE.checked_sub(now.saturating_duration_since(held));
        window.max(settle).filter(|w| !w.is_zero())
    }

    /// Whether this entry still decides anything: a window or a settle not yet over.
    pub(crate) fn live(&self, now: std::time::Instant) -> bool {
        now.saturating_duration_since(self.at) < STATUS_COALESCE_MAX
            || self
                .held
                .is_some_and(|h| now.saturating_duration_since(h) < STATUS_SETTLE)
    }
}

pub(crate) type Wake = futures::channel::mpsc::UnboundedSender<ObjectRef<GuardedQuestDB>>;

impl Context {
    /// Publishes an event about `qdb`. Failing to record an event must never fail a reconcile.
    pub(crate) async fn event(
        &self,
        qdb: &QuestDB,
        type_: EventType,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        self.event_for(&qdb.object_ref(&()), type_, reason, action, note)
            .await
    }

    /// Publishes an event about any object. Failing to record an event must never fail a
    /// reconcile.
    pub(crate) async fn event_for(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.as_str().into(),
            note: Some(truncate(note, 1024)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            warn!(error = %e, %reason, "could not record event");
        }
    }

    /// Asks for a reconcile of the QuestDB `key` now (a background look saw something that
    /// changes its decision). Nothing when the controller is not running.
    pub(crate) fn wake_questdb(&self, key: ObjectRef<GuardedQuestDB>) {
        if let Some(wake) = &self.wake {
            let _ = wake.unbounded_send(key);
        }
    }

    pub(crate) fn metrics_conditions(&self, before: &[Condition], after: &[Condition]) {
        for c in crate::plan::conditions::transitions(before, after) {
            self.metrics
                .condition_transition(&c.type_, &c.status, &c.reason);
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_of_a_database_slow_to_start_is_written_ever_less_often_but_at_least_twice_a_minute()
    {
        let at = std::time::Instant::now();
        let windows: Vec<u64> = (0..8)
            .map(|progress| {
                StatusWrite {
                    at,
                    progress,
                    held: None,
                }
                .window()
                .as_secs()
            })
            .collect();
        assert_eq!(windows, [5, 10, 20, 30, 30, 30, 30, 30]);
        assert_eq!(
            StatusWrite {
                at,
                progress: u32::MAX,
                held: None,
            }
            .window(),
            STATUS_COALESCE_MAX
        );
    }

    /// A database placed on its node and ready a second later is one write, not two: progress
    /// waits [`STATUS_SETTLE`] after it is first seen, even long after the last write.
    #[test]
    fn progress_waits_to_settle_even_long_after_the_last_write() {
        let start = std::time::Instant::now();
        let secs = std::time::Duration::from_secs;
        let long_ago = StatusWrite {
            at: start,
            progress: 0,
            held: None,
        };
        let later = start + secs(120);
        assert_eq!(long_ago.wait(later), Some(STATUS_SETTLE));
        let held = StatusWrite {
            held: Some(later),
            ..long_ago
        };
        assert_eq!(held.wait(later + secs(2)), Some(secs(3)));
        assert_eq!(held.wait(later + STATUS_SETTLE), None);
        assert!(held.live(later + secs(4)));
        assert!(!held.live(later + STATUS_SETTLE));

        // Soon after a write, the window decides.
        let just_written = StatusWrite {
            at: later,
            progress: 2,
            held: Some(later + secs(1)),
        };
        assert_eq!(just_written.wait(later + secs(6)), Some(secs(14)));
    }
}
