//! Every timing shortened from Kubernetes' defaults, in one place. Anything not listed runs at
//! its real default. Each line says what it replaces.

use std::time::Duration;

/// Whether this process runs node health at a real kubelet's timings; chosen once per process.
static REAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// `QDB_TESTENV_TIMINGS=kubelet` (or [`choose_real_node_timings`]) runs node health at a real
/// kubelet's and kube-controller-manager's defaults (40 s Lease renewed every 10 s, 5 s monitor
/// period, 50 s grace, 300 s tolerations): for the tests and benchmarks that must show what a
/// real cluster's failover takes. Anything else: the shortened timings below.
pub fn real_node_timings() -> bool {
    *REAL.get_or_init(|| std::env::var("QDB_TESTENV_TIMINGS").is_ok_and(|v| v == "kubelet"))
}

/// Chooses a real kubelet's timings for this process, before anything has read them: what a
/// test that needs them calls first. Every control plane and CRD of the process then uses them,
/// so the test must have the process to itself, as nextest gives every test (`.ci/test`).
/// Panics when the process already runs on the shortened timings.
pub fn choose_real_node_timings() {
    assert!(
        *REAL.get_or_init(|| true),
        "this process already runs on the shortened node timings: run the test in a process of \
         its own (cargo nextest run), or with QDB_TESTENV_TIMINGS=kubelet"
    );
}

/// kubelet: Lease `spec.leaseDurationSeconds` (real: 40 s). The operator is told the same
/// (`--node-lease-duration`), as an admin of a cluster with such kubelets would: both sides
/// run on one set of timings, and no failover threshold is shorter than this.
pub fn node_lease_duration() -> Duration {
    if real_node_timings() {
        Duration::from_secs(40)
    } else {
        Duration::from_secs(10)
    }
}
/// kubelet: Lease renew interval, 0.25 x the duration as the kubelet does (real: 10 s).
pub fn node_lease_renew() -> Duration {
    node_lease_duration() / 4
}
/// kubelet: NodeStatus post when nothing changed (`nodeStatusReportFrequency`, real: 5 min;
/// the Lease is the heartbeat).
pub fn node_status_report() -> Duration {
    if real_node_timings() {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(60)
    }
}
/// kube-controller-manager `--node-monitor-period` (real: 5 s).
pub fn node_monitor_period() -> Duration {
    if real_node_timings() {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(1)
    }
}
/// kube-controller-manager `--node-monitor-grace-period` (real: 50 s).
pub fn node_monitor_grace() -> Duration {
    if real_node_timings() {
        Duration::from_secs(50)
    } else {
        Duration::from_secs(12)
    }
}
/// kube-apiserver `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds` (real: 300 s).
pub fn default_toleration_seconds() -> u32 {
    if real_node_timings() {
        300
    } else {
        15
    }
}
/// A new Node's Ready condition stays False this long (network plugin, CSI registration).
pub const NODE_READY_DELAY: Duration = Duration::from_millis(1500);
/// A restarted kubelet reports NotReady until its first PLEG relist ("PLEG is not healthy:
/// pleg has yet to be successful"; the relist runs every second) and runtime status check.
pub const KUBELET_START: Duration = Duration::from_secs(2);
/// Container start: from the pod's volumes being attached to Running + Ready.
pub const CONTAINER_START: Duration = Duration::from_millis(500);
/// Container stop after SIGTERM (QuestDB closes its tables), bounded by the grace period.
pub const CONTAINER_STOP: Duration = Duration::from_millis(500);
/// Fake EBS: attach and detach take this long (real EBS: seconds to tens of seconds).
pub const VOLUME_ATTACH: Duration = Duration::from_millis(500);
pub const VOLUME_DETACH: Duration = Duration::from_millis(500);
/// Fake EBS: a snapshot is `pending` (VolumeSnapshotContent `readyToUse: false`) this long
/// after CreateSnapshot before it is `completed` (real EBS: minutes, longer for a first full
/// snapshot of a volume).
pub const SNAPSHOT_COMPLETE: Duration = Duration::from_millis(1500);

/// Real databases (`Databases::Real`): the first wait before restarting a container that
/// exited, doubled after each further exit (kubelet: 10 s, pkg/kubelet/kubelet.go
/// `backOffPeriod`).
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The longest restart back-off (kubelet: 300 s, `MaxContainerBackOff`).
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A container that ran this long without exiting restarts its back-off from the start
/// (kubelet: 2 x the maximum, i.e. 10 min; client-go flowcontrol `Backoff`).
pub const RESTART_BACKOFF_RESET: Duration = Duration::from_secs(20);
/// Real databases: SIGTERM, then SIGKILL after the pod's grace period but at most this long
/// (real: the grace period alone, 60 s for the operator's pods). QuestDB closes its tables
/// in about 1.5 s.
pub const DATABASE_STOP_MAX: Duration = Duration::from_secs(10);
/// Real databases: probes run at the pod's `periodSeconds` but at least this often
/// (the operator's readiness probe: every 5 s).
pub const PROBE_PERIOD_MAX: Duration = Duration::from_secs(1);

/// How often the stand-in's OOM killer compares a database's resident memory with its
/// container's limit (a real kernel acts at the allocation that crosses it).
pub const MEMORY_CHECK_PERIOD: Duration = Duration::from_millis(250);
/// How often a running container's ConfigMap and Secret volumes (mounted as directories, not
/// subPath) are refreshed from the API. Replaces the kubelet's periodic pod sync
/// (`syncFrequency`, 1 minute) plus its object cache's delay: the Kubernetes documentation's
/// "Mounted ConfigMaps are updated automatically" says the total can be as long as both. Still
/// longer than the operator's first look after a change, so a reload that comes before the
/// file is exercised.
pub const VOLUME_REFRESH: Duration = Duration::from_secs(5);
/// Real databases: an unpullable image shows `ErrImagePull` this long before
/// `ImagePullBackOff` (kubelet: the image back-off, 10 s at first).
pub const IMAGE_PULL_BACKOFF: Duration = Duration::from_secs(1);
/// Real databases: a container whose configuration cannot be resolved (a missing Secret or
/// ConfigMap) is tried again after this long (kubelet: the pod worker's resync, 10 s + jitter).
pub const CONTAINER_CONFIG_RETRY: Duration = Duration::from_secs(1);

/// The kube-controller-manager flags derived from the above.
pub fn controller_manager_flags() -> Vec<String> {
    vec![
        format!(
            "--node-monitor-period={}ms",
            node_monitor_period().as_millis()
        ),
        format!(
            "--node-monitor-grace-period={}ms",
            node_monitor_grace().as_millis()
        ),
    ]
}

/// The kube-apiserver flags derived from the above.
pub fn apiserver_flags() -> Vec<String> {
    vec![
        format!(
            "--default-not-ready-toleration-seconds={}",
            default_toleration_seconds()
        ),
        format!(
            "--default-unreachable-toleration-seconds={}",
            default_toleration_seconds()
        ),
    ]
}

/// After a Node is Ready, how long until the EBS CSI node plugin has registered its driver
/// (the DaemonSet pod starts once the node is Ready: image pull, then node-driver-registrar
/// registers it and the kubelet writes it into the CSINode; on a fresh EKS node that is
/// typically 10-30 s). Longer than a database takes to stop and its volume to detach here, as
/// on EKS.
pub const CSI_DRIVER_REGISTRATION: Duration = Duration::from_secs(5);
