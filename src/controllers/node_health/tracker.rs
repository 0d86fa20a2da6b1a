//! Whether each dedicated node still answers, judged the way kube-controller-manager's
//! node-lifecycle controller does: by when **the operator** last saw the node's Lease
//! `renewTime` change, on its own monotonic clock, never by comparing `renewTime` with the
//! local clock (clock skew would fail over healthy nodes). `tryUpdateNodeHealth` in
//! pkg/controller/nodelifecycle keeps `probeTimestamp = nc.now()` for the same reason.
//!
//! Only Lease silence counts. A kubelet that renews its Lease while it reports NotReady
//! (a container runtime or CNI restart, PLEG) is alive and its containers may be writing:
//! fencing it would stop a database that is serving. Nothing here counts a node unhealthy
//! before its Lease has been silent for the kubelets' Lease duration (40 s on a real
//! kubelet, which renews every quarter of it): a shorter threshold trips on healthy nodes
//! between two renewals plus jitter and watch lag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use crate::desired::PIN_LABEL_KEY;
use crate::plan::failover::effective_threshold;

/// The silence a tracker that meets a node for the first time (a restarted operator, a new
/// leader) counts as already past: how old the Lease's `renewTime` looks on the operator's
/// wall clock, less one Lease duration. Without it, an operator restarted more often than a
/// database's threshold (a crash loop, an upgrade, leadership moving) counts every silence
/// from zero again and never fails over. The allowance keeps a kubelet whose clock runs up to
/// a Lease duration behind from looking silent; beyond that, its next renewal (a quarter of
/// the Lease duration later) resets the count, the live read before a fence sees it, and the
/// database's own word is asked before any fence.
pub(crate) fn seeded_silence(renew_age: Duration, lease_duration: Duration) -> Duration {
    renew_age.saturating_sub(lease_duration)
}

/// The namespace of the kubelets' Leases.
pub(crate) const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

pub(crate) use crate::crd::DEFAULT_NODE_LEASE_DURATION;

#[derive(Clone, Debug)]
struct Seen {
    renew: Option<String>,
    renewed_at: Instant,
    /// Times the node came back after having been silent past the Lease duration.
    flaps: u32,
    /// This silence was already reported as news (see [`NodeHealth::take_news`]).
    news_taken: bool,
    /// This silence already woke the node's database at its threshold (see
    /// [`NodeHealth::take_threshold`]).
    threshold_taken: bool,
}

#[derive(Clone, Debug, Default)]
struct NodeOf {
    node: Option<String>,
    since: Option<Instant>,
}

/// The tracker, shared by the health loop and the reconciles (one per leadership term).
#[derive(Debug)]
pub(crate) struct NodeHealth {
    seen: Mutex<HashMap<String, Seen>>,
    /// The Node of each database's instance as last seen, and since when it is missing (the
    /// operator's clock), by instance id.
    missing: Mutex<HashMap<String, NodeOf>>,
    breaker: Mutex<Breaker>,
    /// The last count of the fleet and when it was taken.
    fleet: Mutex<Option<(Instant, Arc<super::Fleet>)>>,
    lease_duration: Duration,
}

impl Default for NodeHealth {
    fn default() -> Self {
        Self::new(DEFAULT_NODE_LEASE_DURATION)
    }
}

impl NodeHealth {
    /// `lease_duration`: the kubelets' `nodeLeaseDurationSeconds`, the shortest silence that
    /// counts as unhealthy (`--node-lease-duration`).
    pub(crate) fn new(lease_duration: Duration) -> Self {
        Self {
            seen: Mutex::default(),
            missing: Mutex::default(),
            breaker: Mutex::default(),
            fleet: Mutex::default(),
            lease_duration,
        }
    }

    /// The shortest silence that makes a node unhealthy, whatever a QuestDB asks.
    pub(crate) fn min_unhealthy(&self) -> Duration {
        self.lease_duration
    }

    /// The threshold a database really gets: its own, but never under the Lease duration.
    pub(crate) fn threshold(&self, unhealthy_after_seconds: i64) -> Duration {
        effective_threshold(unhealthy_after_seconds, self.lease_duration)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what the caches say about `node`'s Lease at `now`. `renew_age` is how old its
    /// `renewTime` looks on the operator's wall clock: read only the first time the node is
    /// seen (see [`seeded_silence`]).
    pub(crate) fn observe(
        &self,
        node: &str,
        renew: Option<&str>,
        renew_age: Option<Duration>,
        now: Instant,
    ) {
        let min = self.lease_duration;
        let mut seen = self.lock();
        let entry = seen.entry(node.to_string()).or_insert_with(|| Seen {
            renew: renew.map(str::to_string),
            renewed_at: renew
                .and(renew_age)
                .and_then(|age| now.checked_sub(seeded_silence(age, min)))
                .unwrap_or(now),
            flaps: 0,
            news_taken: false,
            threshold_taken: false,
        });
        if entry.renew.as_deref() != renew {
            if now.saturating_duration_since(entry.renewed_at) >= min {
                entry.flaps += 1;
            }
            entry.renew = renew.map(str::to_string);
            entry.renewed_at = now;
            entry.news_taken = false;
            entry.threshold_taken = false;
        }
    }

    /// True once per silence of `node`, when it first becomes news: the moment to ask EC2
    /// whether the instance is gone (that proof needs no threshold).
    pub(crate) fn take_news(&self, node: &str, now: Instant) -> bool {
        self.take_once(node, self.lease_duration / 2, now, |s| &mut s.news_taken)
    }

    /// True once per silence of `node`, when it has lasted `threshold`: the moment to wake its
    /// database, which then looks again by itself while its failover is held back.
    pub(crate) fn take_threshold(&self, node: &str, threshold: Duration, now: Instant) -> bool {
        self.take_once(node, threshold, now, |s| &mut s.threshold_taken)
    }

    /// True the first time in this silence of `node` that it has lasted `after` (`taken` is
    /// the silence's flag for it).
    fn take_once(
        &self,
        node: &str,
        after: Duration,
        now: Instant,
        taken: impl Fn(&mut Seen) -> &mut bool,
    ) -> bool {
        let mut seen = self.lock();
        let Some(s) = seen.get_mut(node) else {
            return false;
        };
        let long_enough = now.saturating_duration_since(s.renewed_at) >= after;
        let flag = taken(s);
        let first = long_enough && !*flag;
        if first {
            *flag = true;
        }
        first
    }

    /// Whether the operator has seen `node`'s Lease renewed (without cloning the renewTime).
    pub(crate) fn has_renewed(&self, node: &str) -> bool {
        self.lock().get(node).is_some_and(|s| s.renew.is_some())
    }

    /// How long `node`'s Lease has been silent once that is news (half the Lease duration:
    /// twice the renew interval); `None` when it renews or is unknown.
    pub(crate) fn unhealthy_for(&self, node: &str, now: Instant) -> Option<Duration> {
        let half = self.lease_duration / 2;
        self.lock().get(node).and_then(|s| {
            let silent = now.saturating_duration_since(s.renewed_at);
            (silent >= half).then_some(silent)
        })
    }

    /// The renewTime last seen for `node` (a live read that disagrees means the watch lags).
    pub(crate) fn last_renew(&self, node: &str) -> Option<String> {
        self.lock().get(node).and_then(|s| s.renew.clone())
    }

    #[cfg(test)]
    pub(crate) fn flaps(&self, node: &str) -> u32 {
        self.lock().get(node).map_or(0, |s| s.flaps)
    }

    /// Time since the operator last saw `node`'s Lease renew (zero when unknown).
    pub(crate) fn silent_for(&self, node: &str, now: Instant) -> Duration {
        self.lock().get(node).map_or(Duration::ZERO, |s| {
            now.saturating_duration_since(s.renewed_at)
        })
    }

    /// Forgets nodes that are no longer dedicated (or gone).
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    /// Records that the Node of `instance` is `node`, there now.
    pub(crate) fn node_present(&self, instance: &str, node: &str) {
        let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
        let entry = missing.entry(instance.to_string()).or_default();
        entry.since = None;
        if entry.node.as_deref() != Some(node) {
            entry.node = Some(node.to_string());
        }
    }

    /// How long the Node of `instance` has been missing as of `now`, timed from the first call
    /// since it was last present, and its name when it was seen. `None` when the operator never
    /// saw that Node and `joined_long_ago` is false (a node still joining is not missing).
    pub(crate) fn node_missing(
        &self,
        instance: &str,
        joined_long_ago: bool,
        now: Instant,
    ) -> Option<(Option<String>, Duration)> {
        let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
        let entry = missing.entry(instance.to_string()).or_default();
        if entry.node.is_none() && !joined_long_ago {
            return None;
        }
        let since = *entry.since.get_or_insert(now);
        Some((entry.node.clone(), now.saturating_duration_since(since)))
    }

    /// Forgets the Nodes of instances no database runs on any more.
    pub(crate) fn retain_instances(&self, keep: impl Fn(&str) -> bool) {
        self.missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| keep(k));
    }

    /// Sets the breaker; true when this closes it anywhere (held-back failovers may go now).
    pub(crate) fn set_breaker(&self, open: Breaker) -> bool {
        let mut breaker = self.breaker.lock().unwrap_or_else(|p| p.into_inner());
        let closed = (breaker.cluster && !open.cluster)
            || breaker.zones.iter().any(|z| !open.zones.contains(z));
        *breaker = open;
        closed
    }

    /// The fleet as counted at most `reuse` before `now`, or as `count` says now. Counted
    /// under the lock: reconciles that come together share one count.
    pub(super) fn fleet(
        &self,
        reuse: Duration,
        now: Instant,
        count: impl FnOnce() -> super::Fleet,
    ) -> Arc<super::Fleet> {
        let mut last = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some((at, fleet)) if now.saturating_duration_since(*at) < reuse => fleet.clone(),
            _ => {
                let fleet = Arc::new(count());
                *last = Some((now, fleet.clone()));
                fleet
            }
        }
    }

    /// Where the breaker holds back the fence of a node in `zone`: the cluster (most of its
    /// kubelets silent at once: the operator's own partition), or that zone. `None`: closed.
    pub(crate) fn breaker_for(&self, zone: Option<&str>) -> Option<String> {
        let breaker = self.breaker.lock().unwrap_or_else(|p| p.into_inner());
        if breaker.cluster {
            return Some("the cluster".into());
        }
        let zone = zone?;
        breaker.zones.contains(zone).then(|| format!("zone {zone}"))
    }
}

/// Where the breaker is open: silences that began together in too many of a zone's dedicated
/// nodes hold back that zone's fences; in too many of all the cluster's nodes, every fence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Breaker {
    pub cluster: bool,
    pub zones: std::collections::BTreeSet<String>,
}

/// The instance a dedicated node is pinned to (the operator's pin label), if it is one.
pub(crate) fn pinned_instance(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(PIN_LABEL_KEY)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn silence_is_measured_from_when_the_operator_saw_the_last_renewal() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("n", Some("10:00:00"), None, t0);
        assert_eq!(h.unhealthy_for("n", t0 + secs(4)), None);
        // A renewTime far in the past (a skewed node clock) changes nothing: only change counts.
        h.observe("n", Some("09:00:00"), None, t0 + secs(5));
        assert_eq!(h.unhealthy_for("n", t0 + secs(9)), None);
        let later = t0 + secs(5 + 30);
        assert_eq!(h.unhealthy_for("n", later), Some(secs(30)));
    }

    /// News wakes the database once per silence (to ask EC2 whether the instance is gone),
    /// not at every look, and again after the node renewed and fell silent once more.
    #[test]
    fn a_silence_is_news_once_until_the_node_renews() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("n", Some("a"), None, t0);
        assert!(!h.take_news("n", t0 + secs(19)));
        assert!(h.take_news("n", t0 + secs(20)));
        assert!(!h.take_news("n", t0 + secs(21)));
        h.observe("n", Some("b"), None, t0 + secs(30));
        assert!(!h.take_news("n", t0 + secs(31)));
        assert!(h.take_news("n", t0 + secs(50)));
        assert!(!h.take_news("unknown", t0 + secs(50)));
    }

    #[test]
    fn a_silence_wakes_the_database_once_at_its_threshold_until_the_node_renews() {
        let h = NodeHealth::new(secs(40));
        let t0 = Instant::now();
        h.observe("n", Some("r1"), None, t0);
        assert!(!h.take_threshold("n", secs(60), t0 + secs(59)));
        assert!(h.take_threshold("n", secs(60), t0 + secs(60)));
        assert!(!h.take_threshold("n", secs(60), t0 + secs(61)));
        h.observe("n", Some("r2"), None, t0 + secs(70));
        assert!(!h.take_threshold("n", secs(60), t0 + secs(71)));
        assert!(h.take_threshold("n", secs(60), t0 + secs(130)));
        assert!(!h.take_threshold("unknown", secs(60), t0 + secs(130)));
    }

    #[test]
    fn closing_the_breaker_is_said_once() {
        let h = NodeHealth::new(secs(40));
        let closed = Breaker::default();
        let cluster = Breaker {
            cluster: true,
            ..Default::default()
        };
        let zone = |z: &str| Breaker {
            zones: [z.to_string()].into(),
            ..Default::default()
        };
        assert!(!h.set_breaker(closed.clone()));
        assert!(!h.set_breaker(cluster.clone()));
        assert!(!h.set_breaker(cluster.clone()));
        assert_eq!(h.breaker_for(Some("z-a")).as_deref(), Some("the cluster"));
        assert_eq!(h.breaker_for(None).as_deref(), Some("the cluster"));
        assert!(h.set_breaker(closed.clone()));
        assert!(!h.set_breaker(closed.clone()));
        // A zone's breaker holds back that zone only.
        assert!(!h.set_breaker(zone("z-a")));
        assert_eq!(h.breaker_for(Some("z-a")).as_deref(), Some("zone z-a"));
        assert_eq!(h.breaker_for(Some("z-b")), None);
        assert_eq!(h.breaker_for(None), None);
        // Another zone opening while the first closes: the first's held-back failovers go.
        assert!(h.set_breaker(zone("z-b")));
    }

    #[test]
    fn a_real_kubelet_renewing_every_10s_with_jitter_and_lag_is_never_unhealthy() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        // 10 s renewals, each up to 4 s late (jitter plus a lagging watch).
        let mut t = t0;
        for i in 0..30u64 {
            h.observe("n", Some(&i.to_string()), None, t);
            let next = t + secs(10 + i % 5);
            for probe in [t + secs(1), next - secs(1)] {
                assert_eq!(h.unhealthy_for("n", probe), None, "renewal {i}");
            }
            t = next;
        }
        assert_eq!(h.flaps("n"), 0);
    }

    #[test]
    fn a_heartbeat_that_returns_after_the_lease_expired_resets_the_clock_and_counts_a_flap() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        h.observe("n", Some("a"), None, t0);
        h.observe("n", Some("a"), None, t0 + secs(45));
        assert!(h
            .unhealthy_for("n", t0 + secs(45))
            .is_some_and(|d| d >= h.min_unhealthy()));
        h.observe("n", Some("b"), None, t0 + secs(46));
        assert_eq!(h.unhealthy_for("n", t0 + secs(47)), None);
        assert_eq!(h.flaps("n"), 1);
    }

    #[test]
    fn no_threshold_is_shorter_than_the_kubelets_lease() {
        let h = NodeHealth::default();
        assert_eq!(h.threshold(10), secs(40));
        assert_eq!(h.threshold(90), secs(90));
        assert_eq!(h.threshold(-5), secs(40));
        // A cluster whose kubelets hold shorter Leases, configured so, gets shorter minimums.
        assert_eq!(NodeHealth::new(secs(10)).threshold(10), secs(10));
    }

    #[test]
    fn a_node_that_went_missing_is_timed_from_when_it_was_first_seen_missing() {
        let h = NodeHealth::default();
        let t0 = Instant::now();
        let n = || Some("n1".to_string());
        // Never seen, instance young: still joining.
        assert_eq!(h.node_missing("i-1", false, t0), None);
        h.node_present("i-1", "n1");
        assert_eq!(
            h.node_missing("i-1", false, t0),
            Some((n(), Duration::ZERO))
        );
        assert_eq!(
            h.node_missing("i-1", false, t0 + secs(30)),
            Some((n(), secs(30)))
        );
        h.node_present("i-1", "n1");
        assert_eq!(
            h.node_missing("i-1", false, t0 + secs(40)),
            Some((n(), Duration::ZERO))
        );
        // A restarted operator that never saw the Node: only an instance past its join time.
        assert_eq!(
            h.node_missing("i-2", true, t0),
            Some((None, Duration::ZERO))
        );
        h.retain_instances(|i| i != "i-1");
        assert_eq!(h.node_missing("i-1", false, t0), None);
    }

    /// A restarted operator (or a new leader) meets every node for the first time: a Lease
    /// already silent for minutes counts as silent that long, less one Lease duration for the
    /// kubelet's clock, so restarts faster than the threshold no longer defer a failover for
    /// good; a fresh renewal counts nothing, and the next renewal resets a seeded silence.
    #[test]
    fn a_restarted_operator_counts_a_silence_that_began_before_it_less_a_lease_duration() {
        let lease = secs(40);
        let t0 = Instant::now() + secs(3600);
        let h = NodeHealth::new(lease);
        h.observe("dead", Some("r-old"), Some(secs(300)), t0);
        assert_eq!(h.unhealthy_for("dead", t0), Some(secs(260)));
        // Read only the first time: a later look at the same renewTime changes nothing.
        h.observe("dead", Some("r-old"), Some(secs(900)), t0 + secs(5));
        assert_eq!(h.unhealthy_for("dead", t0 + secs(5)), Some(secs(265)));
        // A kubelet whose clock is behind by less than a Lease duration looks renewing.
        h.observe("skewed", Some("r"), Some(secs(35)), t0);
        assert_eq!(h.unhealthy_for("skewed", t0), None);
        // One behind by more is taken for silent, until its next renewal.
        h.observe("far", Some("r1"), Some(secs(120)), t0);
        assert_eq!(h.unhealthy_for("far", t0), Some(secs(80)));
        h.observe("far", Some("r2"), Some(secs(120)), t0 + secs(10));
        assert_eq!(h.unhealthy_for("far", t0 + secs(10)), None);
        // A Lease without a renewTime seeds nothing.
        h.observe("blank", None, Some(secs(300)), t0);
        assert_eq!(h.unhealthy_for("blank", t0), None);
        assert_eq!(seeded_silence(secs(10), lease), Duration::ZERO);
    }
}
