//! The metric families and their registration. Names, labels and buckets of the
//! controller-runtime families follow controller-runtime and client-go exactly. Only the
//! `workqueue_*` families the operator computes exactly are registered (see [`super`]).

use prometheus::{
    exponential_buckets, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets.
const RECONCILE_TIME_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// client-go's `rest_client_request_duration_seconds` buckets.
const REST_LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// Failover downtime spans node-failure detection, fencing and reattach: tens of seconds to
/// tens of minutes.
const FAILOVER_DOWNTIME_BUCKETS: &[f64] = &[
    5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0, 450.0, 600.0, 900.0,
    1200.0, 1800.0,
];

/// Node-move downtime is a planned detach/attach: seconds to a few minutes.
const UPGRADE_DOWNTIME_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
];

/// Calls per reconcile: a no-op reconcile should land in the `0` bucket.
const CALLS_PER_RECONCILE_BUCKETS: &[f64] =
    &[0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0];

pub(super) struct Families {
    pub runtime: RuntimeFamilies,
    pub reconciles: ReconcileFamilies,
    pub cloud: CloudFamilies,
    pub data: DataFamilies,
}

/// controller-runtime's and client-go's families, named and labelled as they name them, so
/// their dashboards work unchanged.
pub(super) struct RuntimeFamilies {
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_time: HistogramVec,
    pub active_workers: IntGaugeVec,
    pub max_concurrent_reconciles: IntGaugeVec,
    pub workqueue_work_duration: HistogramVec,
    pub workqueue_retries: IntCounterVec,
    pub workqueue_longest_running: GaugeVec,
    pub workqueue_unfinished_work: GaugeVec,
    pub rest_requests: IntCounterVec,
    pub rest_request_duration: HistogramVec,
    pub leader: IntGaugeVec,
}

impl RuntimeFamilies {
    fn register(r: &Registrar) -> Self {
        let controller = &["controller"];
        let queue = &["name", "controller"];
        let workqueue_buckets = exponential_buckets(10e-9, 10.0, 12).expect("valid buckets");
        Self {
        reconcile_total: r.counter_vec(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            &["controller", "result"],
        ),
        reconcile_errors: r.counter_vec(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            controller,
        ),
        reconcile_time: r.histogram_vec(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            controller,
            RECONCILE_TIME_BUCKETS.to_vec(),
        ),
        active_workers: r.gauge_vec(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            controller,
        ),
        max_concurrent_reconciles: r.gauge_vec(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller (0 = unbounded)",
            controller,
        ),
        workqueue_work_duration: r.histogram_vec(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            queue,
            workqueue_buckets,
        ),
        workqueue_retries: r.counter_vec(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            queue,
        ),
        workqueue_longest_running: r.float_gauge_vec(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            queue,
        ),
        workqueue_unfinished_work: r.float_gauge_vec(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress",
            queue,
        ),
        rest_requests: r.counter_vec(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host",
            &["code", "method", "host"],
        ),
        rest_request_duration: r.histogram_vec(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            &["verb", "host"],
            REST_LATENCY_BUCKETS.to_vec(),
        ),
        leader: r.gauge_vec(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master",
            &["name"],
        ),
        }
    }
}

/// The operator's own families about its reconciles: what they cost (API and AWS calls), what
/// woke them, why they failed, the databases by phase and their conditions' transitions.
pub(super) struct ReconcileFamilies {
    pub aws_requests: IntCounterVec,
    pub questdbs: IntGaugeVec,
    pub condition_transitions: IntCounterVec,
    pub triggers: IntCounterVec,
    pub reconcile_api_calls: HistogramVec,
    pub reconcile_aws_calls: HistogramVec,
    pub reconcile_errors_by_reason: IntCounterVec,
    pub preflight_failures: IntGaugeVec,
}

impl ReconcileFamilies {
    fn register(r: &Registrar) -> Self {
        let controller = &["controller"];
        Self {
        aws_requests: r.counter_vec(
            "questdb_operator_aws_requests_total",
            "AWS API attempts (retries included) by service, operation and outcome",
            &["service", "operation", "outcome"],
        ),
        questdbs: r.gauge_vec(
            "questdb_operator_questdbs",
            "Number of QuestDB resources by phase",
            &["phase"],
        ),
        condition_transitions: r.counter_vec(
            "questdb_operator_condition_transitions_total",
            "Changes of QuestDB status conditions, by condition type, new status and reason",
            &["type", "status", "reason"],
        ),
        triggers: r.counter_vec(
            "questdb_operator_triggers_total",
            "Requests the watches handed to the controller, before the controller merges \
             those of an object already queued",
            controller,
        ),
        reconcile_api_calls: r.histogram_vec(
            "questdb_operator_reconcile_api_calls",
            "Kubernetes API requests made by one reconcile",
            controller,
            CALLS_PER_RECONCILE_BUCKETS.to_vec(),
        ),
        reconcile_aws_calls: r.histogram_vec(
            "questdb_operator_reconcile_aws_calls",
            "AWS API attempts made by one reconcile",
            controller,
            CALLS_PER_RECONCILE_BUCKETS.to_vec(),
        ),
        reconcile_errors_by_reason: r.counter_vec(
            "questdb_operator_reconcile_errors_total",
            "Reconciles that failed, by controller and reason (the error kind, also the Warning event's reason)",
            &["controller", "reason"],
        ),
        preflight_failures: r.gauge_vec(
            "questdb_operator_preflight_failures",
            "What the newest preflight found wrong, per check (network, instance-types, hosted-zone, snapshot-api): 0 when it passes",
            &["check"],
        ),
        }
    }
}

/// Dedicated nodes: failovers and node moves (counts, steps, downtime), instances the sweep
/// terminated, nodes judged unhealthy.
pub(super) struct CloudFamilies {
    pub failovers: IntCounterVec,
    pub node_moves: IntCounterVec,
    pub failover_downtime: Histogram,
    pub node_move_downtime: Histogram,
    pub orphaned_instances_terminated: IntCounter,
    pub leaked_instances_terminated: IntCounter,
    pub failovers_suppressed: IntCounterVec,
    pub unhealthy_dedicated_nodes: IntGauge,
    pub failover_steps: HistogramVec,
    pub failover_detection: Histogram,
    pub node_move_steps: HistogramVec,
}

impl CloudFamilies {
    fn register(r: &Registrar) -> Self {
        Self {
        failovers: r.counter_vec(
            "questdb_operator_failovers_total",
            "Failovers of QuestDB nodes, by result",
            &["result"],
        ),
        node_moves: r.counter_vec(
            "questdb_operator_node_moves_total",
            "Node moves (image or instance type) of QuestDBs, by result",
            &["result"],
        ),
        failover_downtime: r.histogram(
            "questdb_operator_failover_downtime_seconds",
            "Seconds a QuestDB was unavailable during a failover",
            FAILOVER_DOWNTIME_BUCKETS.to_vec(),
        ),
        node_move_downtime: r.histogram(
            "questdb_operator_node_move_downtime_seconds",
            "Seconds a QuestDB was stopped during a node move",
            UPGRADE_DOWNTIME_BUCKETS.to_vec(),
        ),
        orphaned_instances_terminated: r.counter(
            "questdb_operator_orphaned_instances_terminated_total",
            "Cloud instances terminated because no QuestDB claims them",
        ),
        leaked_instances_terminated: r.counter(
            "questdb_operator_leaked_instances_terminated_total",
            "Cloud instances of an older node generation of a live QuestDB, named by none of its records, terminated",
        ),
        failovers_suppressed: r.counter_vec(
            "questdb_operator_failovers_suppressed_total",
            "Failovers held back although the node was unhealthy past its threshold, by reason",
            &["reason"],
        ),
        unhealthy_dedicated_nodes: r.gauge(
            "questdb_operator_unhealthy_dedicated_nodes",
            "Dedicated nodes whose kubelet Lease has been silent for at least its duration (--node-lease-duration)",
        ),
        failover_steps: r.histogram_vec(
            "questdb_operator_failover_step_duration_seconds",
            "Seconds each failover step took, by step",
            &["step"],
            FAILOVER_DOWNTIME_BUCKETS.to_vec(),
        ),
        failover_detection: r.histogram(
            "questdb_operator_failover_detection_latency_seconds",
            "Seconds from a node crossing its unhealthy threshold to the fencing call",
            vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0],
        ),
        node_move_steps: r.histogram_vec(
            "questdb_operator_node_move_step_duration_seconds",
            "Seconds each node-move step took, by step",
            &["step"],
            FAILOVER_DOWNTIME_BUCKETS.to_vec(),
        ),
        }
    }
}

/// The databases' data: backups (counts, duration, the newest taken and the newest proven),
/// volumes, suspended WAL tables, open checkpoints.
pub(super) struct DataFamilies {
    pub backups: IntCounterVec,
    pub backup_duration: Histogram,
    pub suspended_wal_tables: IntGaugeVec,
    pub volume_capacity: IntGaugeVec,
    pub volume_used: IntGaugeVec,
    pub checkpoint_open: IntGaugeVec,
    pub last_verified_backup: IntGaugeVec,
    pub last_successful_backup: IntGaugeVec,
}

impl DataFamilies {
    fn register(r: &Registrar) -> Self {
        Self {
        backups: r.counter_vec(
            "questdb_operator_backups_total",
            "QuestDBBackups finished, by result (Succeeded, Failed)",
            &["result"],
        ),
        backup_duration: r.histogram(
            "questdb_operator_backup_duration_seconds",
            "Seconds from a backup's start to its snapshot being ready to use",
            BACKUP_DURATION_BUCKETS.to_vec(),
        ),
        suspended_wal_tables: r.gauge_vec(
            "questdb_operator_wal_suspended",
            "1 while a QuestDB reports a suspended WAL table (WriteHealthy=False), else 0",
            &["namespace", "questdb"],
        ),
        volume_capacity: r.gauge_vec(
            "questdb_operator_volume_capacity_bytes",
            "Size of each QuestDB volume's file system, from its kubelet's volume statistics",
            &["namespace", "questdb"],
        ),
        volume_used: r.gauge_vec(
            "questdb_operator_volume_used_bytes",
            "Bytes used on each QuestDB volume's file system, from its kubelet's volume statistics",
            &["namespace", "questdb"],
        ),
        checkpoint_open: r.gauge_vec(
            "questdb_operator_checkpoint_open_seconds",
            "Seconds the QuestDB's checkpoint has been open (0: none), from checkpoint_status() on the write-health poll",
            &["namespace", "questdb"],
        ),
        last_verified_backup: r.gauge_vec(
            "questdb_operator_last_verified_backup_timestamp_seconds",
            "Unix time the newest backup of each QuestDB proven by restoring it was taken (its checkpoint); the QuestDB's creation until one is",
            &["namespace", "questdb"],
        ),
        last_successful_backup: r.gauge_vec(
            "questdb_operator_last_successful_backup_timestamp_seconds",
            "Unix time the newest successful backup of each QuestDB finished; the QuestDB's creation until one does",
            &["namespace", "questdb"],
        ),
        }
    }
}

/// A backup takes seconds (a small volume) to hours (an EBS snapshot's first upload).
const BACKUP_DURATION_BUCKETS: [f64; 10] = [
    5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 10800.0, 21600.0,
];

impl Families {
    /// Builds and registers every family. Names and help texts are constants, so a failure here
    /// is a programming error caught by the first test that creates a `Metrics`.
    pub(crate) fn register(registry: &Registry) -> Families {
        let r = Registrar(registry);
        let families = Families {
            runtime: RuntimeFamilies::register(&r),
            reconciles: ReconcileFamilies::register(&r),
            cloud: CloudFamilies::register(&r),
            data: DataFamilies::register(&r),
        };
        r.process_collector();
        families
    }
}

struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<C: prometheus::core::Collector + Clone + 'static>(&self, collector: C) -> C {
        self.0
            .register(Box::new(collector.clone()))
            .expect("metric names are unique constants");
        collector
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::with_opts(Opts::new(name, help)).expect("valid counter"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::with_opts(Opts::new(name, help)).expect("valid gauge"))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge"))
    }

    fn float_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.register(GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge"))
    }

    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        self.register(
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("valid histogram"),
        )
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        self.register(
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
                .expect("valid histogram"),
        )
    }

    /// `process_*` (CPU, RSS, fds, start time); a no-op collector off Linux.
    fn process_collector(&self) {
        self.0
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process collector registers once per registry");
    }
}
