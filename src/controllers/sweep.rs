//! The orphan sweep: instances tagged for this cluster whose QuestDB no longer exists are
//! terminated after a grace period. Runs on the leader only, next to the controllers.
//!
//! An orphan appears when a QuestDB is deleted while its finalizer is removed by hand, or when
//! the operator crashed between a launch and recording it and the QuestDB was deleted before
//! it came back.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::Reason;
use crate::cloud::{Instance, TAG_NAME, TAG_NAMESPACE, TAG_UID};
use crate::controllers::context::Context;
use crate::controllers::node::node_for;

/// When each orphan was first seen; the grace period counts from there.
#[derive(Default)]
pub struct OrphanClock {
    first_seen: HashMap<String, Instant>,
}

impl OrphanClock {
    /// The live instances carrying a QuestDB uid that is not in `uids`, orphans
    /// for at least `grace`. Instances that stopped being orphans are forgotten.
    pub fn due<'a>(
        &mut self,
        instances: &'a [Instance],
        uids: &BTreeSet<String>,
        grace: Duration,
        now: Instant,
    ) -> Vec<&'a Instance> {
        let orphans: Vec<&Instance> = instances
            .iter()
            .filter(|i| !i.state.is_gone())
            // No uid tag: not launched by this operator (tagged by hand, or by another tool
            // that copies our cluster tag), so never ours to terminate.
            .filter(|i| i.tags.get(TAG_UID).is_some_and(|u| !uids.contains(u)))
            .collect();
        self.first_seen
            .retain(|id, _| orphans.iter().any(|i| &i.id == id));
        orphans
            .into_iter()
            .filter(|i| {
                let since = *self.first_seen.entry(i.id.clone()).or_insert(now);
                now.duration_since(since) >= grace
            })
            .collect()
    }
}

/// Sweeps every `interval` until `token` is cancelled. With `namespace` set (an operator that
/// watches one namespace) only instances of that namespace are considered: the QuestDBs of
/// other namespaces are not in the cache, and their instances are not ours to judge.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>, token: CancellationToken) {
    let Some(cloud) = ctx.cloud.clone() else {
        return;
    };
    let mut clock = OrphanClock::default();
    // The first sweep waits one interval: nothing could be due earlier anyway (the grace
    // period starts when an orphan is first seen), and a restart costs no extra AWS call.
    let period = cloud.settings.orphan_sweep_interval;
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A fresh answer: the sweep must not act on what a reconcile saw minutes ago.
        cloud.instances.invalidate();
        let instances = match cloud.instances.get(cloud.nodes.as_ref()).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "orphan sweep: cannot list instances");
                continue;
            }
        };
        let instances: Vec<Instance> = instances
            .iter()
            .filter(|i| {
                namespace
                    .as_deref()
                    .is_none_or(|ns| i.tags.get(TAG_NAMESPACE).map(String::as_str) == Some(ns))
            })
            .cloned()
            .collect();
        let uids: BTreeSet<String> = ctx
            .caches
            .questdbs
            .state()
            .iter()
            .filter_map(|q| q.uid())
            .collect();
        let due: Vec<Instance> = clock
            .due(
                &instances,
                &uids,
                cloud.settings.orphan_grace_period,
                Instant::now(),
            )
            .into_iter()
            .cloned()
            .collect();
        let managed = instances
            .iter()
            .filter(|i| !i.state.is_gone() && i.tags.contains_key(TAG_UID))
            .count();
        if !within_bound(due.len(), managed) {
            // Many at once is not a few deleted databases: a QuestDB cache that is empty or
            // partial (RBAC, a wrong namespace flag) would make every instance look orphaned.
            warn!(
                orphans = due.len(),
                managed,
                "orphan sweep: more instances look orphaned than one pass may terminate; terminating none"
            );
            for instance in &due {
                hold_back(&ctx, instance, due.len(), managed).await;
            }
            continue;
        }
        for instance in due {
            if token.is_cancelled() {
                return;
            }
            terminate_orphan(&ctx, &cloud.nodes, &instance).await;
        }
    }
}

/// One pass terminates at most max(1, 10%) of the managed instances; more is held back whole.
pub fn within_bound(orphans: usize, managed: usize) -> bool {
    orphans <= (managed / 10).max(1)
}

async fn hold_back(ctx: &Context, instance: &Instance, orphans: usize, managed: usize) {
    let nodes = ctx.caches.nodes.state();
    let Some(node) = node_for(&nodes, &instance.id) else {
        return;
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: Reason::OrphanSweepHeldBack.as_str().into(),
        note: Some(format!(
            "instance {} looks orphaned, but so do {orphans} of {managed} managed instances: more than one sweep may terminate, so none is; check the operator's QuestDB cache and --namespace",
            instance.id
        )),
        action: "TerminateOrphan".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &node.object_ref(&())).await {
        warn!(error = %e, "could not record event");
    }
}

async fn terminate_orphan(
    ctx: &Context,
    nodes: &Arc<dyn crate::cloud::NodeProvider>,
    instance: &Instance,
) {
    let tag = |k: &str| instance.tags.get(k).map(String::as_str).unwrap_or("-");
    let (ns, name) = (tag(TAG_NAMESPACE), tag(TAG_NAME));
    if let Err(e) = nodes.terminate(&instance.id).await {
        warn!(instance = %instance.id, error = %e, "orphan sweep: terminate failed");
        return;
    }
    ctx.metrics.orphaned_instance_terminated();
    if let Some(c) = ctx.cloud.as_ref() {
        c.instances.invalidate();
    }
    let note = format!(
        "terminated instance {} of QuestDB {ns}/{name}, which no longer exists",
        instance.id
    );
    info!(instance = %instance.id, questdb_namespace = ns, questdb = name, "orphan sweep: {note}");
    let node: Option<Arc<Node>> = {
        let all = ctx.caches.nodes.state();
        node_for(&all, &instance.id).and_then(|n| {
            all.iter()
                .find(|m| m.metadata.name == n.metadata.name)
                .cloned()
        })
    };
    if let Some(node) = node {
        let ev = Event {
            type_: EventType::Warning,
            reason: Reason::OrphanTerminated.as_str().into(),
            note: Some(note),
            action: "TerminateOrphan".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &node.object_ref(&())).await {
            warn!(error = %e, node = %node.name_any(), "could not record event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::{desired_instance_tags, InstanceState};

    fn instance(id: &str, uid: &str, state: InstanceState) -> Instance {
        Instance {
            id: id.into(),
            state,
            zone: "z".into(),
            image: "ami-1".into(),
            instance_type: "t3.micro".into(),
            private_ip: None,
            public_ip: None,
            tags: desired_instance_tags("c", "ns", "db", uid, 1),
            launched_at: None,
            state_reason: None,
        }
    }

    #[test]
    fn a_sweep_that_would_terminate_many_instances_terminates_none() {
        assert!(within_bound(1, 1));
        assert!(within_bound(1, 5));
        assert!(!within_bound(2, 5));
        assert!(within_bound(3, 30));
        assert!(!within_bound(4, 30));
        assert!(within_bound(0, 0));
    }

    #[test]
    fn an_instance_without_a_uid_tag_is_never_swept() {
        let mut clock = OrphanClock::default();
        let mut stranger = instance("i-stranger", "x", InstanceState::Running);
        stranger.tags.remove(TAG_UID);
        let instances = vec![stranger];
        let (t0, grace) = (Instant::now(), Duration::from_secs(60));
        assert!(clock
            .due(&instances, &BTreeSet::new(), grace, t0)
            .is_empty());
        assert!(clock
            .due(&instances, &BTreeSet::new(), grace, t0 + grace * 10)
            .is_empty());
    }

    #[test]
    fn orphans_are_due_only_after_the_grace_period() {
        let grace = Duration::from_secs(60);
        let instances = vec![
            instance("i-1", "alive", InstanceState::Running),
            instance("i-2", "deleted", InstanceState::Running),
            instance("i-3", "deleted", InstanceState::Terminated),
        ];
        let uids: BTreeSet<String> = ["alive".to_string()].into();
        let mut clock = OrphanClock::default();
        let t0 = Instant::now();
        assert!(clock.due(&instances, &uids, grace, t0).is_empty());
        let later = clock.due(&instances, &uids, grace, t0 + grace);
        assert_eq!(
            later.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
            ["i-2"]
        );
    }

    #[test]
    fn an_instance_whose_questdb_reappears_starts_its_grace_over() {
        let grace = Duration::from_secs(60);
        let instances = vec![instance("i-2", "late", InstanceState::Pending)];
        let mut clock = OrphanClock::default();
        let t0 = Instant::now();
        let none = BTreeSet::new();
        assert!(clock.due(&instances, &none, grace, t0).is_empty());
        let with_qdb: BTreeSet<String> = ["late".to_string()].into();
        assert!(clock
            .due(&instances, &with_qdb, grace, t0 + grace)
            .is_empty());
        assert!(clock
            .due(
                &instances,
                &none,
                grace,
                t0 + grace + Duration::from_secs(1)
            )
            .is_empty());
    }
}
