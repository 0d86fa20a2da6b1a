//! Per-controller metrics: reconcile counts and times, workers, and the workqueue figures the
//! operator can compute exactly from the reconciles it runs (see the module docs of
//! [`crate::metrics`]).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{Lookup, ObjectRef};
use prometheus::{Gauge, Histogram, IntCounter, IntGauge};
use tokio::time::Instant;
use tracing::Instrument;

use super::families::Families;
use super::lock;

/// Identifies one reconciled object: `namespace/name`, or `name` when cluster-scoped.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey(String);

impl QueueKey {
    pub(crate) fn new(namespace: Option<&str>, name: &str) -> Self {
        match namespace {
            Some(ns) if !ns.is_empty() => QueueKey(format!("{ns}/{name}")),
            _ => QueueKey(name.to_string()),
        }
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

impl From<&str> for QueueKey {
    fn from(key: &str) -> Self {
        QueueKey(key.to_string())
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

/// The reconciles in flight, for the scrape-time workqueue gauges.
#[derive(Default)]
struct QueueState {
    /// Reconciles in flight: start time by guard id.
    in_flight: HashMap<u64, Instant>,
    next_id: u64,
}

/// The state of one controller, shared by all its [`ControllerMetrics`] handles.
pub(crate) struct ControllerShared {
    name: String,
    results: ResultCounters,
    errors: IntCounter,
    reconcile_time: Histogram,
    active_workers: IntGauge,
    max_concurrent: IntGauge,
    work_duration: Histogram,
    retries: IntCounter,
    longest_running: Gauge,
    unfinished_work: Gauge,
    api_calls: Histogram,
    triggers: IntCounter,
    aws_calls: Histogram,
    queue: Mutex<QueueState>,
}

impl ControllerShared {
    /// Creates every labelled child up front, so all four results (and every workqueue series)
    /// are exposed at 0 before the first reconcile, as controller-runtime does.
    pub(super) fn new(name: &str, families: &Families) -> Self {
        let c = &[name];
        let q = &[name, name];
        let result = |r: &str| {
            families
                .runtime
                .reconcile_total
                .with_label_values(&[name, r])
        };
        ControllerShared {
            name: name.to_string(),
            results: ResultCounters {
                success: result("success"),
                requeue: result("requeue"),
                requeue_after: result("requeue_after"),
                error: result("error"),
            },
            errors: families.runtime.reconcile_errors.with_label_values(c),
            reconcile_time: families.runtime.reconcile_time.with_label_values(c),
            active_workers: families.runtime.active_workers.with_label_values(c),
            max_concurrent: families
                .runtime
                .max_concurrent_reconciles
                .with_label_values(c),
            work_duration: families
                .runtime
                .workqueue_work_duration
                .with_label_values(q),
            retries: families.runtime.workqueue_retries.with_label_values(q),
            longest_running: families
                .runtime
                .workqueue_longest_running
                .with_label_values(q),
            unfinished_work: families
                .runtime
                .workqueue_unfinished_work
                .with_label_values(q),
            api_calls: families.reconciles.reconcile_api_calls.with_label_values(c),
            triggers: families.reconciles.triggers.with_label_values(c),
            aws_calls: families.reconciles.reconcile_aws_calls.with_label_values(c),
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

    /// A watch handed the controller a request (exact: counted as it is sent; how many the
    /// controller merged is its own, private, business).
    pub(crate) fn observe_trigger(&self) {
        self.shared.triggers.inc();
    }

    /// A reconcile of `key` starts. Finish the guard with its outcome; a guard dropped without
    /// [`ReconcileGuard::finish`] (panic, cancelled future) counts as an error.
    pub(crate) fn start(&self, key: impl Into<QueueKey>) -> ReconcileGuard {
        let key = key.into();
        let now = Instant::now();
        let shared = &self.shared;
        let id = {
            let mut queue = lock(&shared.queue);
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
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Runs the reconcile's future inside the `reconcile` span and attributes the Kubernetes and
    /// AWS calls it makes to this reconcile. Calls made by tasks it spawns are not attributed.
    pub(crate) fn scope<F: Future>(&self, reconcile: F) -> impl Future<Output = F::Output> {
        CURRENT_RECONCILE
            .scope(Arc::clone(&self.tally), reconcile)
            .instrument(self.span.clone())
    }

    /// Records the reconcile's outcome.
    pub(crate) fn finish(mut self, outcome: ReconcileOutcome) {
        self.record(outcome);
    }

    /// Records an error and logs it once, with its whole cause chain, in the reconcile's span.
    pub(crate) fn finish_with_error(self, error: &(dyn std::error::Error + 'static)) {
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
        let shared = &self.shared;
        let elapsed = Instant::now()
            .saturating_duration_since(self.started)
            .as_secs_f64();
        lock(&shared.queue).in_flight.remove(&self.id);
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
