//! Per-controller metrics: reconcile counts and times, workers, and the workqueue figures rebuilt
//! from triggers and reconciles (see the module docs of [`crate::metrics`] for how exact each is).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{Lookup, ObjectRef};
use kube::Resource;
use prometheus::{Gauge, Histogram, IntCounter, IntGauge};
use tokio::time::Instant;
use tracing::Instrument;

use super::families::Families;
use super::lock;

/// A pending trigger older than this is forgotten: kube-runtime drops triggers for objects that
/// left its cache without telling anyone, and they must not inflate `workqueue_depth` forever.
pub const STALE_PENDING_AFTER: Duration = Duration::from_secs(600);

/// Sweeping the pending maps is O(objects); doing it at most this often keeps triggers cheap.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Identifies one queued object: `namespace/name`, or `name` when cluster-scoped.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey(String);

impl QueueKey {
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        match namespace {
            Some(ns) if !ns.is_empty() => QueueKey(format!("{ns}/{name}")),
            _ => QueueKey(name.to_string()),
        }
    }

    /// The key of an object (the same key its `ObjectRef` maps to).
    pub fn of<K: Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        QueueKey::new(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<K: Lookup> From<&ObjectRef<K>> for QueueKey {
    fn from(object: &ObjectRef<K>) -> Self {
        QueueKey::new(object.namespace.as_deref(), &object.name)
    }
}

impl<K: Lookup> From<ObjectRef<K>> for QueueKey {
    fn from(object: ObjectRef<K>) -> Self {
        QueueKey::from(&object)
    }
}

/// Lets `stream.inspect(|r: &&ObjectRef<K>| metrics.observe_trigger(r))` work without a deref.
impl<K: Lookup> From<&&ObjectRef<K>> for QueueKey {
    fn from(object: &&ObjectRef<K>) -> Self {
        QueueKey::from(*object)
    }
}

impl From<&str> for QueueKey {
    fn from(key: &str) -> Self {
        QueueKey(key.to_string())
    }
}

impl From<String> for QueueKey {
    fn from(key: String) -> Self {
        QueueKey(key)
    }
}

impl From<&QueueKey> for QueueKey {
    fn from(key: &QueueKey) -> Self {
        key.clone()
    }
}

/// How a reconcile ended, in controller-runtime's terms (the `result` label).
///
/// The reconcilers say what they want next with `controllers::Next` (`AwaitChange` is `Success`,
/// `RequeueAfter(d)` is `RequeueAfter(d)`); `Err(_)` is `Error`. `Requeue` (an immediate,
/// rate-limited requeue) is controller-runtime's; nothing here asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileOutcome {
    Success,
    Requeue,
    RequeueAfter(Duration),
    Error,
}

impl ReconcileOutcome {
    pub fn as_label(self) -> &'static str {
        match self {
            ReconcileOutcome::Success => "success",
            ReconcileOutcome::Requeue => "requeue",
            ReconcileOutcome::RequeueAfter(_) => "requeue_after",
            ReconcileOutcome::Error => "error",
        }
    }
}

tokio::task_local! {
    /// The calls made by the reconcile running in this task (set by [`ReconcileGuard::scope`]).
    static CURRENT_RECONCILE: Arc<CallTally>;
}

#[derive(Debug, Default)]
struct CallTally {
    api: AtomicU64,
    aws: AtomicU64,
}

pub(super) fn count_api_call_in_current_reconcile() {
    // Outside a scoped reconcile (watches, leader election) there is nothing to attribute to.
    let _ = CURRENT_RECONCILE.try_with(|tally| tally.api.fetch_add(1, Ordering::Relaxed));
}

pub(super) fn count_aws_call_in_current_reconcile() {
    let _ = CURRENT_RECONCILE.try_with(|tally| tally.aws.fetch_add(1, Ordering::Relaxed));
}

struct ResultCounters {
    success: IntCounter,
    requeue: IntCounter,
    requeue_after: IntCounter,
    error: IntCounter,
}

impl ResultCounters {
    fn get(&self, outcome: ReconcileOutcome) -> &IntCounter {
        match outcome {
            ReconcileOutcome::Success => &self.success,
            ReconcileOutcome::Requeue => &self.requeue,
            ReconcileOutcome::RequeueAfter(_) => &self.requeue_after,
            ReconcileOutcome::Error => &self.error,
        }
    }
}

#[derive(Default)]
struct QueueState {
    /// Triggered, not yet started: first trigger time (client-go's `addTimes`).
    pending: HashMap<QueueKey, Instant>,
    /// Requeued with a delay: when the delay runs out.
    ready_at: HashMap<QueueKey, Instant>,
    /// Reconciles in flight: start time by guard id.
    in_flight: HashMap<u64, Instant>,
    next_id: u64,
    last_sweep: Option<Instant>,
}

impl QueueState {
    fn sweep_if_due(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|last| now.saturating_duration_since(last) < SWEEP_EVERY)
        {
            return;
        }
        self.last_sweep = Some(now);
        self.pending
            .retain(|_, added| now.saturating_duration_since(*added) < STALE_PENDING_AFTER);
        self.ready_at
            .retain(|_, ready| now.saturating_duration_since(*ready) < STALE_PENDING_AFTER);
    }
}

/// The state of one controller, shared by all its [`ControllerMetrics`] handles.
pub(crate) struct ControllerShared {
    name: String,
    results: ResultCounters,
    errors: IntCounter,
    reconcile_time: Histogram,
    active_workers: IntGauge,
    max_concurrent: IntGauge,
    depth: IntGauge,
    adds: IntCounter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: IntCounter,
    longest_running: Gauge,
    unfinished_work: Gauge,
    api_calls: Histogram,
    aws_calls: Histogram,
    queue: Mutex<QueueState>,
}

impl ControllerShared {
    /// Creates every labelled child up front, so all four results (and every workqueue series)
    /// are exposed at 0 before the first reconcile, as controller-runtime does.
    pub(super) fn new(name: &str, families: &Families) -> Self {
        let c = &[name];
        let q = &[name, name];
        let result = |r: &str| families.reconcile_total.with_label_values(&[name, r]);
        ControllerShared {
            name: name.to_string(),
            results: ResultCounters {
                success: result("success"),
                requeue: result("requeue"),
                requeue_after: result("requeue_after"),
                error: result("error"),
            },
            errors: families.reconcile_errors.with_label_values(c),
            reconcile_time: families.reconcile_time.with_label_values(c),
            active_workers: families.active_workers.with_label_values(c),
            max_concurrent: families.max_concurrent_reconciles.with_label_values(c),
            depth: families.workqueue_depth.with_label_values(q),
            adds: families.workqueue_adds.with_label_values(q),
            queue_duration: families.workqueue_queue_duration.with_label_values(q),
            work_duration: families.workqueue_work_duration.with_label_values(q),
            retries: families.workqueue_retries.with_label_values(q),
            longest_running: families.workqueue_longest_running.with_label_values(q),
            unfinished_work: families.workqueue_unfinished_work.with_label_values(q),
            api_calls: families.reconcile_api_calls.with_label_values(c),
            aws_calls: families.reconcile_aws_calls.with_label_values(c),
            queue: Mutex::new(QueueState::default()),
        }
    }

    pub(super) fn set_max_concurrency(&self, max: usize) {
        self.max_concurrent
            .set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    pub(super) fn refresh_in_flight_gauges(&self) {
        let now = Instant::now();
        let queue = lock(&self.queue);
        let running = queue
            .in_flight
            .values()
            .map(|started| now.saturating_duration_since(*started).as_secs_f64());
        let (longest, total) = running.fold((0.0_f64, 0.0_f64), |(longest, total), secs| {
            (longest.max(secs), total + secs)
        });
        self.longest_running.set(longest);
        self.unfinished_work.set(total);
    }
}

/// A controller's handle on its metrics; cheap to clone, one per controller.
#[derive(Clone)]
pub struct ControllerMetrics {
    shared: Arc<ControllerShared>,
}

impl fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerMetrics")
            .field("controller", &self.shared.name)
            .finish()
    }
}

impl ControllerMetrics {
    pub(super) fn new(shared: Arc<ControllerShared>) -> Self {
        ControllerMetrics { shared }
    }

    /// The controller's name (the `controller` label).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// A trigger for `key` reached the controller (what client-go's `Add` would be).
    pub fn observe_trigger(&self, key: impl Into<QueueKey>) {
        let key = key.into();
        let now = Instant::now();
        let mut queue = lock(&self.shared.queue);
        queue.sweep_if_due(now);
        if let std::collections::hash_map::Entry::Vacant(entry) = queue.pending.entry(key) {
            entry.insert(now);
            self.shared.adds.inc();
        }
        self.shared.depth.set(gauge_value(queue.pending.len()));
    }

    /// A watch event of the controller's own kind: triggers that object. Meant for
    /// `stream.inspect(|event| if let Ok(obj) = event { metrics.observe_object(obj) })`.
    pub fn observe_object<K: Resource>(&self, obj: &K) {
        self.observe_trigger(QueueKey::of(obj));
    }

    /// A watch event of an owned object: triggers each owner of kind `owner_kind`, like
    /// kube-runtime's `owns` does.
    pub fn observe_owners<K: Resource>(&self, child: &K, owner_kind: &str) {
        let meta = child.meta();
        for owner in meta.owner_references.iter().flatten() {
            if owner.kind == owner_kind {
                self.observe_trigger(QueueKey::new(meta.namespace.as_deref(), &owner.name));
            }
        }
    }

    /// A reconcile of `key` starts. Finish the guard with its outcome; a guard dropped without
    /// [`ReconcileGuard::finish`] (panic, cancelled future) counts as an error.
    pub fn start(&self, key: impl Into<QueueKey>) -> ReconcileGuard {
        let key = key.into();
        let now = Instant::now();
        let shared = &self.shared;
        let id = {
            let mut queue = lock(&shared.queue);
            queue.sweep_if_due(now);
            let ready_at = queue.ready_at.remove(&key);
            let waited = match queue.pending.remove(&key) {
                Some(added) => Some(now.saturating_duration_since(added)),
                None => {
                    // No trigger seen: kube-runtime's own requeue (or retry) fired. client-go
                    // counts that as an add when its delay runs out.
                    shared.adds.inc();
                    ready_at.map(|ready| now.saturating_duration_since(ready))
                }
            };
            if let Some(waited) = waited {
                shared.queue_duration.observe(waited.as_secs_f64());
            }
            shared.depth.set(gauge_value(queue.pending.len()));
            let id = queue.next_id;
            queue.next_id += 1;
            queue.in_flight.insert(id, now);
            id
        };
        shared.active_workers.inc();
        let span = tracing::info_span!(
            "reconcile",
            controller = %shared.name,
            object = %key,
        );
        ReconcileGuard {
            shared: Arc::clone(shared),
            key,
            id,
            started: now,
            tally: Arc::new(CallTally::default()),
            span,
            finished: false,
        }
    }

    /// Runs one reconcile under a guard: `start`, [`ReconcileGuard::scope`], then `finish` with
    /// the outcome `classify` gives the result.
    pub async fn instrument<F, T>(
        &self,
        key: impl Into<QueueKey>,
        reconcile: F,
        classify: impl FnOnce(&T) -> ReconcileOutcome,
    ) -> T
    where
        F: Future<Output = T>,
    {
        let guard = self.start(key);
        let output = guard.scope(reconcile).await;
        guard.finish(classify(&output));
        output
    }
}

/// One reconcile in flight. Records work duration, reconcile time and the call counts on finish.
#[must_use = "finish the guard with the reconcile's outcome; dropping it counts as an error"]
pub struct ReconcileGuard {
    shared: Arc<ControllerShared>,
    key: QueueKey,
    id: u64,
    started: Instant,
    tally: Arc<CallTally>,
    span: tracing::Span,
    finished: bool,
}

impl fmt::Debug for ReconcileGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileGuard")
            .field("controller", &self.shared.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReconcileGuard {
    /// The `reconcile` span (fields `controller`, `object`).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Runs the reconcile's future inside the `reconcile` span and attributes the Kubernetes and
    /// AWS calls it makes to this reconcile. Calls made by tasks it spawns are not attributed.
    pub fn scope<F: Future>(&self, reconcile: F) -> impl Future<Output = F::Output> {
        CURRENT_RECONCILE
            .scope(Arc::clone(&self.tally), reconcile)
            .instrument(self.span.clone())
    }

    /// Records the reconcile's outcome.
    pub fn finish(mut self, outcome: ReconcileOutcome) {
        self.record(outcome);
    }

    /// Records an error and logs it once, with its whole cause chain, in the reconcile's span.
    pub fn finish_with_error(self, error: &(dyn std::error::Error + 'static)) {
        self.span.in_scope(|| {
            tracing::warn!(error = %ErrorChain(error), "reconcile failed");
        });
        self.finish(ReconcileOutcome::Error);
    }

    fn record(&mut self, outcome: ReconcileOutcome) {
        if self.finished {
            return;
        }
        self.finished = true;
        let now = Instant::now();
        let shared = &self.shared;
        let elapsed = now.saturating_duration_since(self.started).as_secs_f64();
        {
            let mut queue = lock(&shared.queue);
            queue.in_flight.remove(&self.id);
            match outcome {
                ReconcileOutcome::RequeueAfter(delay) => {
                    // A delay too long to represent never fires: nothing to wait for.
                    if let Some(ready) = now.checked_add(delay) {
                        queue.ready_at.insert(self.key.clone(), ready);
                    }
                }
                ReconcileOutcome::Requeue => {
                    queue.ready_at.insert(self.key.clone(), now);
                }
                ReconcileOutcome::Success | ReconcileOutcome::Error => {}
            }
        }
        shared.active_workers.dec();
        shared.results.get(outcome).inc();
        shared.reconcile_time.observe(elapsed);
        shared.work_duration.observe(elapsed);
        if matches!(outcome, ReconcileOutcome::Error) {
            shared.errors.inc();
        }
        if matches!(outcome, ReconcileOutcome::Error | ReconcileOutcome::Requeue) {
            shared.retries.inc();
        }
        shared
            .api_calls
            .observe(self.tally.api.load(Ordering::Relaxed) as f64);
        shared
            .aws_calls
            .observe(self.tally.aws.load(Ordering::Relaxed) as f64);
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        self.record(ReconcileOutcome::Error);
    }
}

/// Formats an error and its sources as `outer: cause: root cause`.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

fn gauge_value(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}
