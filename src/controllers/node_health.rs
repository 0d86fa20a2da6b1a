//! Whether each dedicated node still answers, judged the way kube-controller-manager's
//! node-lifecycle controller does: by when **the operator** last saw the node's Lease
//! `renewTime` change (or its Ready condition go bad), on its own monotonic clock, never by
//! comparing `renewTime` with the local clock (clock skew would fail over healthy nodes).
//! `tryUpdateNodeHealth` in pkg/controller/nodelifecycle keeps `probeTimestamp = nc.now()` for
//! the same reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::controllers::Next;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::controllers::context::{Context, GuardedQuestDB};
use crate::desired::PIN_LABEL_KEY;

use crate::controllers::failover::breaker_open;
use crate::controllers::node::node_is_ready;
use crate::controllers::Error;

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

/// Name of the node-health controller in metrics and logs.
pub const CONTROLLER_NAME: &str = "node-health";

/// How often a node that looks unhealthy is looked at again: no event arrives from a silent
/// kubelet, so the clock, not the watch, decides when its threshold is crossed.
const SUSPECT_POLL: Duration = Duration::from_secs(1);

/// The dedicated nodes and the databases on them, as the caches say now.
struct Survey {
    managed: usize,
    unhealthy: usize,
    suspects: usize,
    /// For the reconciled node: its QuestDB and threshold, if a database runs on it.
    owner: Option<(ObjectRef<GuardedQuestDB>, Duration)>,
}

fn survey(ctx: &Context, health: &NodeHealth, node: &str, now: Instant) -> Survey {
    let questdbs = ctx.caches.questdbs.state();
    let owners: HashMap<&str, (&crate::api::QuestDB, Duration)> = questdbs
        .iter()
        .filter_map(|q| q.0.as_ref().ok())
        .filter_map(|q| {
            let id = q.status.as_ref()?.instance_id.as_deref()?;
            let t = Duration::from_secs(q.spec.failover.unhealthy_after_seconds.max(0) as u64);
            Some((id, (q, t.max(MIN_UNHEALTHY))))
        })
        .collect();
    let nodes = ctx.caches.nodes.state();
    let mut out = Survey {
        managed: 0,
        unhealthy: 0,
        suspects: 0,
        owner: None,
    };
    let mut dedicated = std::collections::HashSet::new();
    for n in &nodes {
        let (Some(name), Some(instance)) = (n.metadata.name.as_deref(), pinned_instance(n)) else {
            continue;
        };
        dedicated.insert(name);
        // A node no QuestDB runs on any more (fenced, being replaced, upgraded away) is not a
        // database at risk: it neither counts toward the breaker nor triggers.
        let Some((qdb, threshold)) = owners.get(instance) else {
            continue;
        };
        out.managed += 1;
        if name == node {
            out.owner = crate::manager::questdb_ref(qdb).map(|r| (r, *threshold));
        }
        let Some(silent) = health.unhealthy_for(name, now) else {
            continue;
        };
        if silent >= MIN_UNHEALTHY {
            out.unhealthy += 1;
        }
        // For the breaker, a node counts from half its threshold on: nodes that die together
        // are all well past that when the first reaches its threshold, whatever the kubelets'
        // renewal phase (10 s apart at most on a real cluster).
        if silent >= *threshold / 2 {
            out.suspects += 1;
        }
    }
    health.retain(|n| dedicated.contains(n));
    out
}

/// One reconcile of the node-health controller for one Node: records what its Lease and Ready
/// condition say on the operator's clock, recomputes the breaker over every dedicated node, and
/// asks for a reconcile of the node's QuestDB once it is unhealthy past that database's
/// threshold (the QuestDB reconcile confirms with live reads and decides). In memory only: no
/// API or AWS call, so a reconcile costs microseconds and never fails.
pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Next, Error> {
    let Some(cloud) = ctx.cloud.as_ref() else {
        return Ok(Next::AwaitChange);
    };
    let Some(name) = node.metadata.name.as_deref() else {
        return Ok(Next::AwaitChange);
    };
    let now = Instant::now();
    if pinned_instance(&node).is_some() {
        let lease = ctx
            .caches
            .leases
            .get(&ObjectRef::<Lease>::new(name).within(NODE_LEASE_NAMESPACE));
        let renew = lease
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
            .map(|t| t.0.to_string());
        cloud
            .health
            .observe(name, renew.as_deref(), node_is_ready(&node), now);
    }
    let survey = survey(&ctx, &cloud.health, name, now);
    cloud
        .health
        .set_breaker(breaker_open(survey.suspects, survey.managed));
    ctx.metrics.set_unhealthy_dedicated_nodes(survey.unhealthy);
    let Some((questdb, threshold)) = survey.owner else {
        return Ok(Next::AwaitChange);
    };
    let silent = cloud.health.unhealthy_for(name, now);
    if silent.is_some_and(|s| s >= threshold) {
        // After the breaker is set: the reconcile reads it.
        if let Some(wake) = ctx.wake.as_ref() {
            let _ = wake.unbounded_send(questdb);
        }
    }
    // The next look without an event: soon while the node looks unhealthy, else when it could
    // first count for the breaker if no renewal arrives before.
    let next = match silent {
        Some(_) => SUSPECT_POLL,
        None => (threshold / 2).saturating_sub(cloud.health.silent_for(name, now)),
    };
    Ok(Next::RequeueAfter(next.max(SUSPECT_POLL)))
}

/// The Node a kubelet Lease belongs to (same name, in `kube-node-lease`).
pub fn node_of_lease(lease: &Lease) -> Option<ObjectRef<Node>> {
    if lease.metadata.namespace.as_deref() != Some(NODE_LEASE_NAMESPACE) {
        return None;
    }
    lease.metadata.name.as_deref().map(ObjectRef::new)
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
