//! Plumbing shared by the simulated controllers: the watch caches, the wake-up signal, the
//! level-triggered control loop, and helpers for time and API errors.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::config::ClusterConfig;
use super::wellknown::NODE_LEASE_NAMESPACE;
use crate::clock::Clock;

/// Watch caches of everything the simulated controllers read. Writes go to the apiserver and
/// come back through these, exactly like informers in kube-controller-manager.
#[derive(Clone)]
pub(crate) struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub pvs: Store<PersistentVolume>,
    pub attachments: Store<VolumeAttachment>,
    pub statefulsets: Store<StatefulSet>,
    pub leases: Store<Lease>,
    pub storage_classes: Store<StorageClass>,
}

/// The kinds the caches hold; a control loop wakes only for the kinds it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Node,
    Pod,
    Claim,
    Volume,
    Attachment,
    StatefulSet,
    Lease,
    StorageClass,
}

const KINDS: usize = 8;

/// Per-kind event counters, bumped by the reflectors.
pub(crate) type Changes = watch::Sender<[u64; KINDS]>;

pub(crate) fn changes_channel() -> Changes {
    watch::channel([0; KINDS]).0
}

impl Stores {
    /// Starts one reflector per kind; each event bumps its kind's counter in `changes`.
    pub fn start(
        client: &Client,
        tasks: &mut JoinSet<()>,
        cancel: &CancellationToken,
        changes: &Changes,
    ) -> Self {
        let mut spawn = Spawner {
            tasks,
            cancel,
            changes,
        };
        Self {
            nodes: spawn.reflect(Kind::Node, Api::all(client.clone())),
            pods: spawn.reflect(Kind::Pod, Api::all(client.clone())),
            pvcs: spawn.reflect(Kind::Claim, Api::all(client.clone())),
            pvs: spawn.reflect(Kind::Volume, Api::all(client.clone())),
            attachments: spawn.reflect(Kind::Attachment, Api::all(client.clone())),
            statefulsets: spawn.reflect(Kind::StatefulSet, Api::all(client.clone())),
            leases: spawn.reflect(
                Kind::Lease,
                Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            ),
            storage_classes: spawn.reflect(Kind::StorageClass, Api::all(client.clone())),
        }
    }

    pub async fn wait_until_ready(&self) -> anyhow::Result<()> {
        self.nodes.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        self.pvcs.wait_until_ready().await?;
        self.pvs.wait_until_ready().await?;
        self.attachments.wait_until_ready().await?;
        self.statefulsets.wait_until_ready().await?;
        self.leases.wait_until_ready().await?;
        self.storage_classes.wait_until_ready().await?;
        Ok(())
    }

    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    pub fn pvc(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get(&ObjectRef::new(name))
    }

    pub fn lease(&self, node: &str) -> Option<Arc<Lease>> {
        self.leases
            .get(&ObjectRef::new(node).within(NODE_LEASE_NAMESPACE))
    }

    pub fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.storage_classes.get(&ObjectRef::new(name))
    }
}

struct Spawner<'a> {
    tasks: &'a mut JoinSet<()>,
    cancel: &'a CancellationToken,
    changes: &'a Changes,
}

impl Spawner<'_> {
    fn reflect<K>(&mut self, kind: Kind, api: Api<K>) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        let (reader, writer) = reflector::store();
        let changes = self.changes.clone();
        let cancel = self.cancel.clone();
        // The default backoff keeps a failing watch (apiserver down, 410 storms) from spinning.
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        self.tasks.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    event = stream.next() => match event {
                        Some(Ok(_)) => { changes.send_modify(|n| n[kind as usize] = n[kind as usize].wrapping_add(1)); }
                        Some(Err(err)) => tracing::debug!(%err, kind = %K::kind(&Default::default()), "sim watch error"),
                        None => break,
                    }
                }
            }
        });
        reader
    }
}

/// What one pass of a control loop asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct PassOutcome {
    /// Wake again after this much simulated time even if nothing changes.
    pub requeue_after: Option<Duration>,
    /// A write failed (conflict, injected error…); retry with backoff.
    pub failed: bool,
}

impl PassOutcome {
    pub fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(match self.requeue_after {
            Some(current) => current.min(after),
            None => after,
        });
    }

    pub fn record<T>(&mut self, what: &str, result: Result<T, kube::Error>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                // Conflicts and not-founds are normal races with other writers; the next pass
                // re-reads the cache and decides again.
                tracing::debug!(%err, what, "sim write failed; will retry");
                self.failed = true;
                None
            }
        }
    }
}

/// A level-triggered controller: each pass compares the whole cached state with what it wants.
pub(crate) trait Reconciler: Send + 'static {
    fn pass(&mut self) -> impl Future<Output = PassOutcome> + Send;
}

/// Shortest real pause between passes: events arriving in a burst coalesce into one pass.
const MIN_PASS_SPACING: Duration = Duration::from_millis(10);
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(2);

/// Runs `pass` whenever a watched object changes, when the pass asked to be requeued, and every
/// `resync` as a safety net, until `cancel` fires. Failed passes back off exponentially (in real
/// time, so a broken apiserver is not hammered however fast the clock runs).
pub(crate) struct LoopSpec {
    pub name: &'static str,
    pub interests: &'static [Kind],
    pub clock: Clock,
    pub resync: Duration,
    pub cancel: CancellationToken,
}

pub(crate) async fn control_loop<R: Reconciler>(
    spec: LoopSpec,
    mut changes: watch::Receiver<[u64; KINDS]>,
    mut reconciler: R,
) {
    let LoopSpec {
        name,
        interests,
        clock,
        resync,
        cancel,
    } = spec;
    let relevant = |counters: &[u64; KINDS]| {
        interests
            .iter()
            .map(|k| counters[*k as usize])
            .collect::<Vec<_>>()
    };
    let mut error_backoff = Duration::from_millis(20);
    loop {
        let mut seen = relevant(&changes.borrow_and_update());
        let outcome = reconciler.pass().await;
        let mut wait = clock.to_real(outcome.requeue_after.unwrap_or(resync).min(resync));
        if outcome.failed {
            tracing::trace!(name, ?error_backoff, "sim pass failed");
            wait = wait.min(error_backoff);
            error_backoff = (error_backoff * 2).min(MAX_ERROR_BACKOFF);
        } else {
            error_backoff = Duration::from_millis(20);
        }
        let wait = wait.max(MIN_PASS_SPACING);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(MIN_PASS_SPACING) => {}
        }
        let deadline = tokio::time::Instant::now() + wait.saturating_sub(MIN_PASS_SPACING);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = changes.changed(), if !outcome.failed => {
                    if changed.is_err() { return; }
                    // Events of kinds this loop does not read (e.g. Lease renewals for the
                    // scheduler) do not cost it a pass.
                    let now = relevant(&changes.borrow_and_update());
                    if now != seen {
                        break;
                    }
                    seen = now;
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
}

/// Remembers since when (simulated time) a condition has held, e.g. "volume no longer needed".
#[derive(Debug)]
pub(crate) struct Since<K> {
    first_seen: HashMap<K, SystemTime>,
}

impl<K: Eq + Hash + Clone> Since<K> {
    pub fn new() -> Self {
        Self {
            first_seen: HashMap::new(),
        }
    }

    /// Returns how long `key` has been observed, starting the count now if it is new.
    pub fn observe(&mut self, key: &K, now: SystemTime) -> Duration {
        let start = *self.first_seen.entry(key.clone()).or_insert(now);
        now.duration_since(start).unwrap_or_default()
    }

    pub fn forget(&mut self, key: &K) {
        self.first_seen.remove(key);
    }

    /// Drops every key not in `live`, so the map cannot grow without bound.
    pub fn retain(&mut self, mut live: impl FnMut(&K) -> bool) {
        self.first_seen.retain(|k, _| live(k));
    }
}

/// Time left until `elapsed` reaches `needed` (zero when it has).
pub(crate) fn remaining(needed: Duration, elapsed: Duration) -> Duration {
    needed.saturating_sub(elapsed)
}

pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub(crate) fn time(t: SystemTime) -> Time {
    Time(timestamp(t))
}

pub(crate) fn micro_time(t: SystemTime) -> MicroTime {
    MicroTime(timestamp(t))
}

pub(crate) fn system_time(t: &Timestamp) -> SystemTime {
    SystemTime::from(*t)
}

pub(crate) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

/// Everything the simulated controllers share.
pub(crate) struct Shared {
    pub client: Client,
    pub config: ClusterConfig,
    pub clock: Clock,
    pub stores: Stores,
}

impl Shared {
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_counts_from_first_observation_and_resets_on_forget() {
        let mut since = Since::new();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(since.observe(&"va", t0), Duration::ZERO);
        assert_eq!(
            since.observe(&"va", t0 + Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        since.forget(&"va");
        assert_eq!(
            since.observe(&"va", t0 + Duration::from_secs(9)),
            Duration::ZERO
        );
    }

    #[test]
    fn time_round_trips_through_kubernetes_timestamps() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(system_time(&time(t).0), t);
    }
}
