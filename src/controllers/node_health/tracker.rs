//! Whether each dedicated node still answers, judged the way kube-controller-manager's
//! node-lifecycle controller does: by when **the operator** last saw the node's Lease
//! `renewTime` change (or its Ready condition go bad), on its own monotonic clock, never by
//! comparing `renewTime` with the local clock (clock skew would fail over healthy nodes).
//! `tryUpdateNodeHealth` in pkg/controller/nodelifecycle keeps `probeTimestamp = nc.now()` for
//! the same reason.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use crate::desired::PIN_LABEL_KEY;

/// The namespace of the kubelets' Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// No database asks for less (the CRD's minimum of `failover.unhealthyAfterSeconds`); nodes
/// silent for shorter are not counted as unhealthy anywhere.
pub const MIN_UNHEALTHY: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
struct Seen {
    renew: Option<String>,
    renewed_at: Instant,
    /// Ready was True at least once since the operator started watching: a node that is still
    /// joining is not a dead one.
    was_ready: bool,
    not_ready_since: Option<Instant>,
    /// Times the node came back after having been unhealthy past [`MIN_UNHEALTHY`].
    flaps: u32,
}

/// The tracker, shared by the health loop and the reconciles (one per leadership term).
#[derive(Debug, Default)]
pub struct NodeHealth {
    seen: Mutex<HashMap<String, Seen>>,
    breaker: Mutex<bool>,
}

impl NodeHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what the caches say about `node` at `now`.
    pub fn observe(&self, node: &str, renew: Option<&str>, ready: bool, now: Instant) {
        let mut seen = self.lock();
        let entry = seen.entry(node.to_string()).or_insert_with(|| Seen {
            renew: renew.map(str::to_string),
            renewed_at: now,
            was_ready: ready,
            not_ready_since: None,
            flaps: 0,
        });
        let was_unhealthy = unhealthy(entry, now).is_some_and(|d| d >= MIN_UNHEALTHY);
        if entry.renew.as_deref() != renew {
            entry.renew = renew.map(str::to_string);
            entry.renewed_at = now;
        }
        if ready {
            entry.was_ready = true;
            entry.not_ready_since = None;
        } else if entry.was_ready {
            entry.not_ready_since.get_or_insert(now);
        }
        if was_unhealthy && unhealthy(entry, now).is_none_or(|d| d < MIN_UNHEALTHY) {
            entry.flaps += 1;
        }
    }

    /// How long `node` has been silent or not Ready; `None` when it is fine or unknown.
    pub fn unhealthy_for(&self, node: &str, now: Instant) -> Option<Duration> {
        self.lock().get(node).and_then(|s| unhealthy(s, now))
    }

    /// The renewTime last seen for `node` (a live read that disagrees means the watch lags).
    pub fn last_renew(&self, node: &str) -> Option<String> {
        self.lock().get(node).and_then(|s| s.renew.clone())
    }

    pub fn flaps(&self, node: &str) -> u32 {
        self.lock().get(node).map_or(0, |s| s.flaps)
    }

    /// Time since the operator last saw `node`'s Lease renew (zero when unknown).
    pub fn silent_for(&self, node: &str, now: Instant) -> Duration {
        self.lock().get(node).map_or(Duration::ZERO, |s| {
            now.saturating_duration_since(s.renewed_at)
        })
    }

    /// Forgets nodes that are no longer dedicated (or gone).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    pub fn set_breaker(&self, open: bool) {
        *self.breaker.lock().unwrap_or_else(|p| p.into_inner()) = open;
    }

    pub fn breaker_open(&self) -> bool {
        *self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn unhealthy(s: &Seen, now: Instant) -> Option<Duration> {
    let silent = now.saturating_duration_since(s.renewed_at);
    let not_ready = s
        .not_ready_since
        .map(|t| now.saturating_duration_since(t))
        .unwrap_or_default();
    let worst = silent.max(not_ready);
    // Under half the smallest threshold is a kubelet between two renewals, not news.
    (worst >= MIN_UNHEALTHY / 2 || s.not_ready_since.is_some()).then_some(worst)
}

/// The instance a dedicated node is pinned to (the operator's pin label), if it is one.
pub fn pinned_instance(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(PIN_LABEL_KEY)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_measured_from_when_the_operator_saw_the_last_renewal() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("n", Some("10:00:00"), true, t0);
        assert_eq!(h.unhealthy_for("n", t0 + Duration::from_secs(4)), None);
        // A renewTime far in the past (a skewed node clock) changes nothing: only change counts.
        h.observe("n", Some("09:00:00"), true, t0 + Duration::from_secs(5));
        assert_eq!(h.unhealthy_for("n", t0 + Duration::from_secs(9)), None);
        let later = t0 + Duration::from_secs(5 + 30);
        assert_eq!(h.unhealthy_for("n", later), Some(Duration::from_secs(30)));
    }

    #[test]
    fn a_heartbeat_that_returns_resets_the_clock_and_counts_a_flap() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("n", Some("a"), true, t0);
        h.observe("n", Some("a"), true, t0 + Duration::from_secs(12));
        assert!(h
            .unhealthy_for("n", t0 + Duration::from_secs(12))
            .is_some_and(|d| d >= MIN_UNHEALTHY));
        h.observe("n", Some("b"), true, t0 + Duration::from_secs(13));
        assert_eq!(h.unhealthy_for("n", t0 + Duration::from_secs(14)), None);
        assert_eq!(h.flaps("n"), 1);
    }

    #[test]
    fn a_node_still_joining_is_not_unhealthy_but_one_that_was_ready_is() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("new", Some("a"), false, t0);
        h.observe("new", Some("b"), false, t0 + Duration::from_secs(30));
        assert_eq!(h.unhealthy_for("new", t0 + Duration::from_secs(30)), None);

        h.observe("old", Some("a"), true, t0);
        h.observe("old", Some("b"), false, t0 + Duration::from_secs(1));
        h.observe("old", Some("c"), false, t0 + Duration::from_secs(20));
        assert_eq!(
            h.unhealthy_for("old", t0 + Duration::from_secs(21)),
            Some(Duration::from_secs(20))
        );
    }
}
