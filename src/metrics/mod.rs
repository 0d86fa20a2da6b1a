//! One Prometheus registry for the whole operator.
//!
//! The controller-runtime families (`controller_runtime_*`, `workqueue_*`, `rest_client_*`,
//! `leader_election_master_status`, `process_*`) keep controller-runtime's exact names, labels
//! and buckets, so kubebuilder's Grafana dashboards work unchanged. Our own families are prefixed
//! `questdb_operator_`. No family has a label called `instance`: Prometheus attaches its own
//! `instance` target label and a clash would silently rename ours to `exported_instance`.
//!
//! Callers hold an `Arc<Metrics>`; each controller takes a [`ControllerMetrics`] from
//! [`Metrics::controller`] and wraps every reconcile in [`ControllerMetrics::start`] /
//! [`ReconcileGuard::finish`]. The kube client is built with [`instrumented_client`].
//!
//! # Which `workqueue_*` figures exist
//!
//! kube-runtime's `Controller` keeps its scheduler (its work queue) private, so the operator only
//! exports the workqueue families it can compute exactly from the reconciles it runs itself:
//!
//! - `workqueue_work_duration_seconds` is the reconcile's wall time.
//! - `workqueue_retries_total` counts reconciles that ended in an error or a plain requeue, the
//!   two cases controller-runtime hands to the rate-limited queue. It assumes the error policy
//!   requeues on error (every controller's does).
//! - `workqueue_longest_running_processor_seconds` and `workqueue_unfinished_work_seconds` are
//!   computed at scrape time from the reconciles in flight.
//!
//! client-go's depth, adds and queue-duration families are not exported: they describe the
//! private scheduler (pending triggers, their deduplication, delayed requeues), which the
//! operator could only approximate by re-creating its bookkeeping, and an approximate figure on a
//! dashboard is worse than none. A unit test keeps them from coming back.
//!
//! `controller_runtime_active_workers` counts reconciles in flight; `..._max_concurrent_reconciles`
//! is the concurrency given to the controller, 0 meaning unbounded (kube-runtime's meaning).

mod controller;
mod families;
mod rest_client;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{Encoder, Registry, TextEncoder};

use crate::api::Phase;
use crate::cloud::SharedObserver;

pub use controller::{ControllerMetrics, ErrorChain, QueueKey, ReconcileGuard, ReconcileOutcome};
pub use rest_client::{
    install_crypto_provider, instrumented_client, ApiCall, ApiCallSnapshot, RestMetricsLayer,
};

use families::Families;

/// Content type of the Prometheus text exposition format served on `/metrics`.
pub(crate) const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label value for QuestDBs that have no phase yet (status not written).
pub(crate) const PHASE_UNKNOWN: &str = "Unknown";

/// Every phase a QuestDB can report, so the phase gauge exposes zeros instead of gaps.
const ALL_PHASES: [Phase; 10] = [
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Unavailable,
    Phase::Failed,
    Phase::Paused,
    Phase::FailingOver,
    Phase::Upgrading,
    Phase::MovingNode,
    Phase::Terminating,
];

/// How a failover ended; the label of `questdb_operator_failovers_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailoverResult {
    /// The database runs again on a replacement node.
    Succeeded,
    /// The state machine gave up; a human has to look.
    Failed,
    /// The circuit breaker held it back (too many nodes unhealthy at once).
    Suppressed,
}

impl FailoverResult {
    const ALL: [FailoverResult; 3] = [Self::Succeeded, Self::Failed, Self::Suppressed];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Suppressed => "suppressed",
        }
    }
}

/// How a node move ended; the label of `questdb_operator_node_moves_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMoveResult {
    /// Running on the new node.
    Completed,
    /// Failed before the database stopped: no downtime.
    Aborted,
    /// Failed (or set back) after the database stopped: back on the old node.
    RolledBack,
}

impl NodeMoveResult {
    const ALL: [NodeMoveResult; 3] = [Self::Completed, Self::Aborted, Self::RolledBack];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::RolledBack => "rolled_back",
        }
    }
}

/// The label values [`Metrics::zero_known_labels`] sets to zero: the controllers' own lists,
/// so a new step or reason is initialised the day it is added.
pub(crate) struct KnownLabels<'a> {
    pub suppression_reasons: &'a [&'a str],
    pub failover_steps: &'a [&'a str],
    pub node_move_steps: &'a [&'a str],
    pub controllers: &'a [&'a str],
    pub error_reasons: &'a [&'a str],
}

type PhaseSource = Box<dyn Fn() -> Vec<Option<Phase>> + Send + Sync>;

/// The operator's metrics: one registry and every family in it.
pub struct Metrics {
    /// The registry `/metrics` renders; exposed so callers can register extra collectors.
    pub registry: Registry,
    families: Families,
    controllers: Mutex<HashMap<String, Arc<controller::ControllerShared>>>,
    api_calls: rest_client::ApiCallCounter,
    phase_source: Mutex<Option<PhaseSource>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry with every family registered (including `process_*`).
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let families = Families::register(&registry);
        for phase in ALL_PHASES {
            families
                .reconciles
                .questdbs
                .with_label_values(&[phase.as_str()])
                .set(0);
        }
        families
            .reconciles
            .questdbs
            .with_label_values(&[PHASE_UNKNOWN])
            .set(0);
        for result in FailoverResult::ALL {
            families
                .cloud
                .failovers
                .with_label_values(&[result.as_str()]);
        }
        for result in NodeMoveResult::ALL {
            families
                .cloud
                .node_moves
                .with_label_values(&[result.as_str()]);
        }
        Arc::new(Metrics {
            registry,
            families,
            controllers: Mutex::new(HashMap::new()),
            api_calls: rest_client::ApiCallCounter::default(),
            phase_source: Mutex::new(None),
        })
    }

    /// The metrics of controller `name` (the `controller` and workqueue `name` label).
    ///
    /// `max_concurrency` is what the controller was configured with (0 = unbounded). Asking twice
    /// for the same name returns handles onto the same state.
    pub fn controller(&self, name: &str, max_concurrency: usize) -> ControllerMetrics {
        let mut controllers = lock(&self.controllers);
        let shared = controllers
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(controller::ControllerShared::new(name, &self.families)))
            .clone();
        shared.set_max_concurrency(max_concurrency);
        ControllerMetrics::new(shared)
    }

    /// The text exposition (format 0.0.4) of every family.
    pub fn render(&self) -> String {
        self.refresh_scrape_time_gauges();
        let mut buffer = Vec::new();
        // Encoding into a Vec only fails on metric families that break the format's rules,
        // which this module never builds; an empty scrape is the visible symptom if it did.
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::error!(error = %err, "encoding metrics failed");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }

    /// `leader_election_master_status{name}`: 1 while this process holds the lease.
    pub fn set_leader(&self, lease_name: &str, leader: bool) {
        self.families
            .runtime
            .leader
            .with_label_values(&[lease_name])
            .set(i64::from(leader));
    }

    /// One AWS API attempt. `outcome` is `ok`, `throttled` or `error:<code>` (see
    /// [`crate::cloud::AwsCallObserver`]). Also counted in the current reconcile's
    /// `questdb_operator_reconcile_aws_calls`.
    pub fn aws_call(&self, service: &str, operation: &str, outcome: &str) {
        self.families
            .reconciles
            .aws_requests
            .with_label_values(&[service, operation, outcome])
            .inc();
        controller::count_aws_call_in_current_reconcile();
    }

    /// An observer for the cloud providers that feeds [`Metrics::aws_call`].
    pub fn aws_observer(self: &Arc<Self>) -> SharedObserver {
        let metrics = Arc::clone(self);
        Arc::new(move |service: &str, operation: &str, outcome: &str| {
            metrics.aws_call(service, operation, outcome)
        })
    }

    /// A condition of a QuestDB changed status (or reason).
    pub fn condition_transition(&self, type_: &str, status: &str, reason: &str) {
        self.families
            .reconciles
            .condition_transitions
            .with_label_values(&[type_, status, reason])
            .inc();
    }

    /// A failover ended; `downtime` is from the database becoming unreachable to serving again.
    pub fn failover_finished(&self, result: FailoverResult, downtime: Option<Duration>) {
        self.families
            .cloud
            .failovers
            .with_label_values(&[result.as_str()])
            .inc();
        if let Some(downtime) = downtime {
            self.families
                .cloud
                .failover_downtime
                .observe(downtime.as_secs_f64());
        }
    }

    /// A node move ended; `downtime` is from stopping the database to verifying it.
    pub fn node_move_finished(&self, result: NodeMoveResult, downtime: Option<Duration>) {
        self.families
            .cloud
            .node_moves
            .with_label_values(&[result.as_str()])
            .inc();
        if let Some(downtime) = downtime {
            self.families
                .cloud
                .node_move_downtime
                .observe(downtime.as_secs_f64());
        }
    }

    /// A backup reached a final step; `took` from its start to the end.
    pub fn backup_finished(&self, succeeded: bool, took: Option<Duration>) {
        let result = if succeeded { "Succeeded" } else { "Failed" };
        self.families
            .data
            .backups
            .with_label_values(&[result])
            .inc();
        if let (true, Some(took)) = (succeeded, took) {
            self.families
                .data
                .backup_duration
                .observe(took.as_secs_f64());
        }
    }

    /// The newest successful backup of a QuestDB finished at `unix_seconds` (never moves back).
    pub fn last_successful_backup(&self, namespace: &str, questdb: &str, unix_seconds: i64) {
        let g = self
            .families
            .data
            .last_successful_backup
            .with_label_values(&[namespace, questdb]);
        if unix_seconds > g.get() {
            g.set(unix_seconds);
        }
    }

    /// The newest backup of a QuestDB proven by restoring it was taken at `unix_seconds`
    /// (never moves back).
    pub fn last_verified_backup(&self, namespace: &str, questdb: &str, unix_seconds: i64) {
        let g = self
            .families
            .data
            .last_verified_backup
            .with_label_values(&[namespace, questdb]);
        if unix_seconds > g.get() {
            g.set(unix_seconds);
        }
    }

    /// How long a QuestDB's checkpoint has been open (0: none).
    pub fn set_checkpoint_open_seconds(&self, namespace: &str, questdb: &str, seconds: i64) {
        self.families
            .data
            .checkpoint_open
            .with_label_values(&[namespace, questdb])
            .set(seconds);
    }

    /// How many findings the newest preflight has for `check` (0: it passes).
    pub(crate) fn set_preflight_failures(&self, check: &str, findings: i64) {
        self.families
            .reconciles
            .preflight_failures
            .with_label_values(&[check])
            .set(findings);
    }

    /// Whether a QuestDB reports a suspended WAL table.
    pub(crate) fn set_suspended_wal_tables(&self, namespace: &str, questdb: &str, suspended: i64) {
        self.families
            .data
            .suspended_wal_tables
            .with_label_values(&[namespace, questdb])
            .set(suspended);
    }

    /// A QuestDB volume's file system size and use, in bytes.
    pub(crate) fn set_volume_usage(
        &self,
        namespace: &str,
        questdb: &str,
        capacity: u64,
        used: u64,
    ) {
        let f = &self.families;
        f.data
            .volume_capacity
            .with_label_values(&[namespace, questdb])
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        f.data
            .volume_used
            .with_label_values(&[namespace, questdb])
            .set(i64::try_from(used).unwrap_or(i64::MAX));
    }

    /// A reconcile failed with an error of kind `reason` (conflicts are retried, not counted).
    pub fn reconcile_error(&self, controller: &str, reason: &str) {
        self.families
            .reconciles
            .reconcile_errors_by_reason
            .with_label_values(&[controller, reason])
            .inc();
    }

    /// Label values known in advance, set to zero at start (as controller-runtime does for its
    /// reconcile results): `rate()` and alert rules see the series before the first event
    /// instead of nothing at all.
    pub(crate) fn zero_known_labels(&self, known: &KnownLabels) {
        for reason in known.suppression_reasons {
            self.families
                .cloud
                .failovers_suppressed
                .with_label_values(&[reason]);
        }
        for step in known.failover_steps {
            self.families
                .cloud
                .failover_steps
                .with_label_values(&[step]);
        }
        for result in ["Succeeded", "Failed"] {
            self.families.data.backups.with_label_values(&[result]);
        }
        for step in known.node_move_steps {
            self.families
                .cloud
                .node_move_steps
                .with_label_values(&[step]);
        }
        for controller in known.controllers {
            for reason in known.error_reasons {
                self.families
                    .reconciles
                    .reconcile_errors_by_reason
                    .with_label_values(&[controller, reason]);
            }
        }
    }

    /// A failover was due but held back (`reason` as in the `Failover` condition).
    pub fn failover_suppressed(&self, reason: &str) {
        self.families
            .cloud
            .failovers_suppressed
            .with_label_values(&[reason])
            .inc();
    }

    pub fn set_unhealthy_dedicated_nodes(&self, n: usize) {
        self.families.cloud.unhealthy_dedicated_nodes.set(n as i64);
    }

    /// A failover step ended after `took`.
    pub fn failover_step(&self, step: &str, took: Duration) {
        self.families
            .cloud
            .failover_steps
            .with_label_values(&[step])
            .observe(took.as_secs_f64());
    }

    /// A node-move step ended after `took`.
    pub fn node_move_step(&self, step: &str, took: Duration) {
        self.families
            .cloud
            .node_move_steps
            .with_label_values(&[step])
            .observe(took.as_secs_f64());
    }

    /// From the threshold crossing to the fencing call.
    pub fn failover_detected(&self, latency: Duration) {
        self.families
            .cloud
            .failover_detection
            .observe(latency.as_secs_f64());
    }

    /// The orphan sweep terminated an instance that no QuestDB claims.
    pub fn orphaned_instance_terminated(&self) {
        self.families.cloud.orphaned_instances_terminated.inc();
    }

    /// The sweep terminated an instance its live QuestDB no longer names (leaked).
    pub(crate) fn leaked_instance_terminated(&self) {
        self.families.cloud.leaked_instances_terminated.inc();
    }

    /// Sets `questdb_operator_questdbs{phase}` from one entry per QuestDB (`None` = no phase yet).
    pub fn set_questdb_phases(&self, phases: impl IntoIterator<Item = Option<Phase>>) {
        let mut counts: BTreeMap<&'static str, i64> = ALL_PHASES
            .iter()
            .map(|phase| (phase.as_str(), 0))
            .chain([(PHASE_UNKNOWN, 0)])
            .collect();
        for phase in phases {
            *counts
                .entry(phase.map_or(PHASE_UNKNOWN, |p| p.as_str()))
                .or_default() += 1;
        }
        for (phase, count) in counts {
            self.families
                .reconciles
                .questdbs
                .with_label_values(&[phase])
                .set(count);
        }
    }

    /// Lets every scrape count phases afresh (e.g. from the controller's reflector store), so the
    /// gauge never lags behind deletions the reconciler does not see.
    pub(crate) fn set_phase_source(
        &self,
        source: impl Fn() -> Vec<Option<Phase>> + Send + Sync + 'static,
    ) {
        *lock(&self.phase_source) = Some(Box::new(source));
    }

    /// Kubernetes API calls made through [`instrumented_client`] so far, by verb and resource.
    #[cfg(test)]
    pub(crate) fn api_calls(&self) -> ApiCallSnapshot {
        self.api_calls.snapshot()
    }

    /// Records one request to the API server (what the client layer calls per response).
    /// `code` is the HTTP status, or `None` when no response arrived (client-go's `<error>`).
    pub fn record_rest_request(
        &self,
        call: &ApiCall,
        method: &str,
        host: &str,
        code: Option<u16>,
        latency: Duration,
    ) {
        let code = code.map_or_else(|| "<error>".to_string(), |c| c.to_string());
        self.families
            .runtime
            .rest_requests
            .with_label_values(&[code.as_str(), method, host])
            .inc();
        self.families
            .runtime
            .rest_request_duration
            .with_label_values(&[method, host])
            .observe(latency.as_secs_f64());
        self.api_calls.record(call);
        controller::count_api_call_in_current_reconcile();
    }

    fn refresh_scrape_time_gauges(&self) {
        if let Some(source) = lock(&self.phase_source).as_ref() {
            self.set_questdb_phases(source());
        }
        for shared in lock(&self.controllers).values() {
            shared.refresh_in_flight_gauges();
        }
    }
}

/// Locks a mutex, recovering from poisoning: metrics bookkeeping must not take the process down.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
