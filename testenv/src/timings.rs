//! Every timing shortened from Kubernetes' defaults, in one place. Anything not listed runs at
//! its real default. Each line says what it replaces.

use std::time::Duration;

/// kubelet: Lease `spec.leaseDurationSeconds` (real: 40 s).
pub const NODE_LEASE_DURATION: Duration = Duration::from_secs(10);
/// kubelet: Lease renew interval, 0.25 x the duration as the kubelet does (real: 10 s).
pub const NODE_LEASE_RENEW: Duration = Duration::from_millis(2500);
/// kubelet: NodeStatus post when nothing changed (real: 5 min).
pub const NODE_STATUS_REPORT: Duration = Duration::from_secs(60);
/// kube-controller-manager `--node-monitor-period` (real: 5 s).
pub const NODE_MONITOR_PERIOD: Duration = Duration::from_secs(1);
/// kube-controller-manager `--node-monitor-grace-period` (real: 50 s).
pub const NODE_MONITOR_GRACE: Duration = Duration::from_secs(12);
/// kube-apiserver `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds` (real: 300 s).
pub const DEFAULT_TOLERATION_SECONDS: u32 = 15;
/// A new Node's Ready condition stays False this long (network plugin, CSI registration).
pub const NODE_READY_DELAY: Duration = Duration::from_millis(1500);
/// Container start: from the pod's volumes being attached to Running + Ready.
pub const CONTAINER_START: Duration = Duration::from_millis(500);
/// Container stop after SIGTERM (QuestDB closes its tables), bounded by the grace period.
pub const CONTAINER_STOP: Duration = Duration::from_millis(500);
/// Fake EBS: attach and detach take this long (real EBS: seconds to tens of seconds).
pub const VOLUME_ATTACH: Duration = Duration::from_millis(500);
pub const VOLUME_DETACH: Duration = Duration::from_millis(500);

/// The kube-controller-manager flags derived from the above.
pub fn controller_manager_flags() -> Vec<String> {
    vec![
        format!(
            "--node-monitor-period={}ms",
            NODE_MONITOR_PERIOD.as_millis()
        ),
        format!(
            "--node-monitor-grace-period={}ms",
            NODE_MONITOR_GRACE.as_millis()
        ),
    ]
}

/// The kube-apiserver flags derived from the above.
pub fn apiserver_flags() -> Vec<String> {
    vec![
        format!("--default-not-ready-toleration-seconds={DEFAULT_TOLERATION_SECONDS}"),
        format!("--default-unreachable-toleration-seconds={DEFAULT_TOLERATION_SECONDS}"),
    ]
}
