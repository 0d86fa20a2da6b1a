//! The node-health controller: reconciles each dedicated Node on its own and its kubelet
//! Lease's events, feeds the [`tracker`], recomputes the failover breaker and wakes the QuestDB
//! of a node past its threshold.

pub(crate) mod owners;
pub(crate) mod tracker;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::controllers::context::{Context, GuardedQuestDB};
use crate::controllers::{Error, Next};
use crate::plan::failover::{breaker_count, breaker_open, together};
use crate::plan::node::node_is_ready;
use owners::OwnerIndex;
pub(crate) use tracker::{pinned_instance, Breaker, NodeHealth, NODE_LEASE_NAMESPACE};

/// The well-known label of a Node's zone.
pub(crate) const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Name of the node-health controller in metrics and logs.
pub(crate) const CONTROLLER_NAME: &str = "node-health";

/// The shortest wait before a silent node is looked at again: no event arrives from a silent
/// kubelet, so the clock, not the watch, decides when it crosses each mark (news, the breaker's
/// half threshold, unhealthy, its threshold); it is looked at when the next one is due.
const MIN_LOOK: Duration = Duration::from_millis(100);

/// How long a node past every mark waits for an event before it is looked at again anyway.
const PAST_EVERY_MARK: Duration = Duration::from_secs(30);

/// How long one count of the fleet (the breaker's input) serves the reconciles that follow.
/// At 1,000 dedicated nodes the kubelets' renewals reconcile 100 Nodes a second; counting
/// every node for each made the controller's CPU grow with the square of the nodes. A quarter
/// second is nothing to a breaker that counts silences of 20 s and more.
pub(crate) const FLEET_COUNT_REUSE: Duration = Duration::from_millis(250);

/// The dedicated nodes and the databases on them, as the caches said at one walk of the Node
/// cache.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    unhealthy: usize,
    /// Per zone: the managed dedicated nodes, and the suspects as the breaker counts them
    /// (each namespace's capped, [`breaker_count`], among silences that began together).
    zones: std::collections::BTreeMap<String, (usize, usize)>,
    /// Every node with a Lease the operator has seen, dedicated or not, and how many of them
    /// are silent past half the Lease duration: an outage between the kubelets and the
    /// apiserver silences them all, which a lone dedicated node cannot tell from its own death.
    cluster: usize,
    cluster_silent: usize,
    /// The databases whose nodes are silent past their thresholds: woken when the breaker
    /// closes, since no event of theirs will come.
    past_threshold: Vec<ObjectRef<GuardedQuestDB>>,
}

/// Walks the Node cache once: the counts, and the tracker forgets nodes and instances no longer
/// there.
fn count_fleet(ctx: &Context, health: &NodeHealth, index: &OwnerIndex, now: Instant) -> Fleet {
    let nodes = ctx.caches.nodes.state();
    let mut out = Fleet::default();
    let mut present = std::collections::HashSet::new();
    // Per zone: managed dedicated nodes per namespace and the suspects' silences; and the
    // silences of the cluster's nodes: counted by when they began (`together`), not all at once.
    type Zone = (
        std::collections::HashMap<Option<String>, usize>,
        Vec<(Duration, Option<String>)>,
    );
    let mut zones: std::collections::BTreeMap<String, Zone> = Default::default();
    let mut cluster_silences: Vec<(Duration, ())> = Vec::new();
    for n in &nodes {
        let Some(name) = n.metadata.name.as_deref() else {
            continue;
        };
        present.insert(name);
        // A node fenced and tainted out-of-service is down on purpose: no sign of an outage.
        if out_of_service(n) {
            continue;
        }
        if health.has_renewed(name) {
            out.cluster += 1;
            if let Some(silent) = health.unhealthy_for(name, now) {
                cluster_silences.push((silent, ()));
            }
        }
        // A node no QuestDB runs on any more (fenced, being replaced, upgraded away) is not a
        // database at risk: it neither counts toward the breaker nor triggers.
        let Some(owner) = pinned_instance(n).and_then(|i| index.owners.get(i)) else {
            continue;
        };
        let threshold = &owner.threshold;
        // A zone's nodes go silent together when the zone's network does; the breaker of
        // one zone holds back only that zone's fences.
        let zone = n.labels().get(ZONE_LABEL).cloned().unwrap_or_default();
        let (managed, suspects) = zones.entry(zone).or_default();
        *managed.entry(owner.questdb.namespace.clone()).or_default() += 1;
        let Some(silent) = health.unhealthy_for(name, now) else {
            continue;
        };
        if silent >= health.min_unhealthy() {
            out.unhealthy += 1;
        }
        // For the breaker, a node counts from half its threshold on: nodes that die together
        // are all well past that when the first reaches its threshold, whatever the kubelets'
        // renewal phase (10 s apart at most on a real cluster).
        if silent >= *threshold / 2 {
            suspects.push((silent, owner.questdb.namespace.clone()));
        }
        if silent >= *threshold {
            out.past_threshold.push(owner.questdb.clone());
        }
    }
    // Nodes that die together stop renewing within a renewal interval and the watch's lag of
    // one another: a Lease duration covers both.
    let window = health.min_unhealthy();
    for (zone, (managed, suspects)) in zones {
        let counted = together(&suspects, window, |group| {
            breaker_count(
                group
                    .iter()
                    .map(|(ns, n)| (*n, managed.get(ns).copied().unwrap_or(*n))),
            )
        });
        out.zones.insert(zone, (managed.values().sum(), counted));
    }
    out.cluster_silent = together(&cluster_silences, window, |group| group.values().sum());
    health.retain(|n| present.contains(n));
    health.retain_instances(|i| index.owners.contains_key(i));
    out
}

/// Whether `node` carries the out-of-service taint a fence puts on it.
fn out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key == crate::plan::failover::OUT_OF_SERVICE_TAINT)
        })
}

/// The database `node` serves, its threshold and the node readiness its status last recorded;
/// or the database whose node move holds it.
fn owner_of(
    node: &Node,
    index: &OwnerIndex,
) -> Option<(ObjectRef<GuardedQuestDB>, Duration, Option<bool>)> {
    let instance = pinned_instance(node)?;
    match index.owners.get(instance) {
        Some(o) => Some((o.questdb.clone(), o.threshold, o.recorded_ready)),
        None => index
            .movers
            .get(instance)
            .map(|m| (m.questdb.clone(), m.threshold, None)),
    }
}

/// One reconcile of the node-health controller for one Node: records when its Lease renewed
/// on the operator's clock (its Ready condition is not evidence: see [`tracker`]), recomputes the breaker over every dedicated node, and
/// asks for a reconcile of the node's QuestDB once it is unhealthy past that database's
/// threshold (the QuestDB reconcile confirms with live reads and decides). In memory only: no
/// API or AWS call, so a reconcile costs microseconds and never fails.
pub(crate) async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Next, Error> {
    let Some(cloud) = ctx.cloud.as_ref() else {
        return Ok(Next::AwaitChange);
    };
    let Some(name) = node.metadata.name.as_deref() else {
        return Ok(Next::AwaitChange);
    };
    let now = Instant::now();
    {
        let lease = ctx
            .caches
            .leases
            .get(&ObjectRef::<Lease>::new(name).within(NODE_LEASE_NAMESPACE));
        let renew_time = lease
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref());
        let renew = renew_time.map(|t| t.0.to_string());
        // Read by the tracker only the first time it meets the node (see `seeded_silence`).
        let renew_age = renew_time.and_then(|t| {
            let age = k8s_openapi::jiff::Timestamp::now().as_millisecond() - t.0.as_millisecond();
            u64::try_from(age).ok().map(Duration::from_millis)
        });
        cloud.health.observe(name, renew.as_deref(), renew_age, now);
    }
    let index = ctx
        .caches
        .owner_index
        .get(&ctx.caches.questdbs, |s| cloud.health.threshold(s));
    let fleet = cloud.health.fleet(FLEET_COUNT_REUSE, now, || {
        count_fleet(&ctx, &cloud.health, &index, now)
    });
    let closed = cloud.health.set_breaker(Breaker {
        cluster: breaker_open(fleet.cluster_silent, fleet.cluster),
        zones: fleet
            .zones
            .iter()
            .filter(|(_, (managed, suspects))| breaker_open(*suspects, *managed))
            .map(|(zone, _)| zone.clone())
            .collect(),
    });
    ctx.metrics.set_unhealthy_dedicated_nodes(fleet.unhealthy);
    if closed {
        // The failovers it held back may go now, at once rather than at their next look.
        for questdb in &fleet.past_threshold {
            ctx.wake_questdb(questdb.clone());
        }
    }
    let Some((questdb, threshold, recorded_ready)) = owner_of(&node, &index) else {
        return Ok(Next::AwaitChange);
    };
    // Not a reason to fail over, but what `kubectl get qdb` shows: a Ready transition of the
    // node reaches the database's status (one reconcile per transition).
    let ready_changed = recorded_ready.is_some_and(|r| r != node_is_ready(&node));
    // News of a silence wakes the database too: EC2 may already say the instance is gone.
    let news = cloud.health.take_news(name, now);
    // Once per silence: a database whose failover is held back looks again by itself, so
    // waking it every second as well would only crowd out the others.
    let due = cloud.health.take_threshold(name, threshold, now);
    // A cordon (a drain) asks for the node to be emptied: the database's move replaces it.
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let drain = cloud.cordon_news(name, cordoned);
    if due || ready_changed || news || drain {
        // After the breaker is set: the reconcile reads it.
        ctx.wake_questdb(questdb);
    }
    Ok(Next::RequeueAfter(next_look(
        &cloud.health,
        name,
        threshold,
        now,
    )))
}

/// When to look at `name` again without an event: at the next mark its silence crosses if no
/// renewal arrives first: news and unhealthy at half and all of the Lease duration, the
/// breaker's count at half the database's threshold, and the threshold.
fn next_look(health: &NodeHealth, name: &str, threshold: Duration, now: Instant) -> Duration {
    let lease = health.min_unhealthy();
    let silent = health.silent_for(name, now);
    [lease / 2, lease, threshold / 2, threshold]
        .into_iter()
        .filter(|m| *m > silent)
        .map(|m| m - silent)
        .min()
        .unwrap_or(PAST_EVERY_MARK)
        .max(MIN_LOOK)
}

/// The Node a kubelet Lease belongs to (same name, in `kube-node-lease`).
pub(crate) fn node_of_lease(lease: &Lease) -> Option<ObjectRef<Node>> {
    if lease.metadata.namespace.as_deref() != Some(NODE_LEASE_NAMESPACE) {
        return None;
    }
    lease.metadata.name.as_deref().map(ObjectRef::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// One walk of the Node cache serves the renewals of a quarter second: at 1,000 nodes
    /// that is 25 reconciles per walk instead of one.
    #[test]
    fn the_fleet_is_counted_once_per_quarter_second_not_once_per_renewal() {
        let h = NodeHealth::new(secs(40));
        let t0 = Instant::now();
        let counts = std::cell::Cell::new(0);
        let count = |at: Instant| {
            h.fleet(FLEET_COUNT_REUSE, at, || {
                counts.set(counts.get() + 1);
                Fleet {
                    cluster: counts.get(),
                    ..Fleet::default()
                }
            })
            .cluster
        };
        assert_eq!(count(t0), 1);
        assert_eq!(count(t0 + FLEET_COUNT_REUSE / 2), 1, "reused");
        assert_eq!(count(t0 + FLEET_COUNT_REUSE), 2, "counted again");
        assert_eq!(counts.get(), 2);
    }

    /// A silent kubelet sends no event: the node is looked at when each mark comes (news at
    /// 20 s, the breaker's count at 30 s, unhealthy at 40 s, the threshold at 60 s), not every
    /// second, and rarely once past them all.
    #[test]
    fn a_silent_node_is_looked_at_when_its_next_mark_comes_not_every_second() {
        let h = NodeHealth::new(secs(40));
        let t0 = Instant::now();
        h.observe("n", Some("r1"), None, t0);
        let look = |at: u64| next_look(&h, "n", secs(60), t0 + secs(at));
        assert_eq!(look(0), secs(20));
        assert_eq!(look(19), secs(1));
        assert_eq!(look(20), secs(10));
        assert_eq!(look(31), secs(9));
        assert_eq!(look(45), secs(15));
        assert_eq!(look(60), PAST_EVERY_MARK);
        assert_eq!(look(600), PAST_EVERY_MARK);
        // A mark a few milliseconds away is not a busy loop.
        assert_eq!(
            next_look(&h, "n", secs(60), t0 + secs(60) - Duration::from_millis(1)),
            MIN_LOOK
        );
    }
}
