//! The orphan sweep: instances tagged for this cluster whose QuestDB no longer exists, and
//! leaked instances of a live QuestDB, are terminated after a grace period. Runs on the
//! leader only, next to the controllers.
//!
//! An orphan appears when a QuestDB is deleted while its finalizer is removed by hand, or when
//! the operator crashed between a launch and recording it and the QuestDB was deleted before
//! it came back. A leak is an instance of an older node generation than the QuestDB's current
//! one that none of its records names (the instance, a failover's old and new, a node move's
//! old, new or retained): a step that lost track of it, a crash between two records. An
//! instance of the current generation that no record names yet is left alone: a launch whose
//! record is still to come is adopted by its tags.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::EventReason;
use crate::api::{QuestDB, QuestDBStatus};
use crate::cloud::{
    Instance, TAG_CLUSTER_ID, TAG_NAME, TAG_NAMESPACE, TAG_NODE_GENERATION, TAG_UID,
};
use crate::controllers::context::Context;
use crate::plan::node::node_for;

/// What a live QuestDB claims: its node generation and the instances its records name.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Claim {
    pub generation: Option<i64>,
    pub named: BTreeSet<String>,
}

impl Claim {
    pub(crate) fn of(status: Option<&QuestDBStatus>) -> Self {
        let Some(s) = status else {
            return Self::default();
        };
        let f = s.failover.as_ref();
        let u = s.node_move.as_ref();
        let named = [
            s.instance_id.as_ref(),
            f.and_then(|f| f.old_instance_id.as_ref()),
            f.and_then(|f| f.new_instance_id.as_ref()),
            u.and_then(|u| u.old_instance_id.as_ref()),
            u.and_then(|u| u.new_instance_id.as_ref()),
        ]
        .into_iter()
        .flatten()
        // The instances earlier attempts of a failover fenced: kept stopped, holding their
        // addresses, until the failover terminates them itself.
        .chain(f.into_iter().flat_map(|f| f.fenced_instance_ids.iter()))
        .cloned()
        .collect();
        Self {
            // A status without a generation is on its first (generation 1), as the steps
            // that launch the next one read it.
            generation: s.node_generation.or(s.instance_id.as_ref().map(|_| 1)),
            named,
        }
    }

    /// An instance of an older generation that no record names.
    fn leaked(&self, instance: &Instance) -> bool {
        let generation = instance
            .tags
            .get(TAG_NODE_GENERATION)
            .and_then(|g| g.parse::<i64>().ok());
        !self.named.contains(&instance.id)
            && matches!((generation, self.generation), (Some(g), Some(current)) if g < current)
    }
}

/// The claims of every QuestDB in the cache, by uid.
pub(crate) fn claims<'a>(
    questdbs: impl IntoIterator<Item = &'a QuestDB>,
) -> HashMap<String, Claim> {
    questdbs
        .into_iter()
        .filter_map(|q| Some((q.uid()?, Claim::of(q.status.as_ref()))))
        .collect()
}

/// When each orphan or leak was first seen; the grace period counts from there.
#[derive(Default)]
pub(crate) struct OrphanClock {
    first_seen: HashMap<String, Instant>,
}

impl OrphanClock {
    /// The live instances carrying a QuestDB uid that no live QuestDB has (orphans), or whose
    /// QuestDB's records no longer name them (leaks), for at least `grace`. Instances that
    /// stopped being either are forgotten.
    pub(crate) fn due<'a>(
        &mut self,
        instances: &'a [Instance],
        claims: &HashMap<String, Claim>,
        grace: Duration,
        now: Instant,
    ) -> Vec<&'a Instance> {
        let orphans: Vec<&Instance> = instances
            .iter()
            .filter(|i| !i.state.is_gone())
            // No uid tag: not launched by this operator (tagged by hand, or by another tool
            // that copies our cluster tag), so never ours to terminate.
            .filter(|i| {
                i.tags
                    .get(TAG_UID)
                    .is_some_and(|u| claims.get(u).is_none_or(|c| c.leaked(i)))
            })
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
pub(crate) async fn run(ctx: Arc<Context>, namespace: Option<String>, token: CancellationToken) {
    let Some(cloud) = ctx.cloud.clone() else {
        return;
    };
    // The cluster name alone is not proof: a small cluster reusing a big one's name would see
    // every instance of the big one as an orphan. Without the cluster's own uid, no sweep.
    let Some(cluster_id) = cloud.cluster_id.clone() else {
        info!("orphan sweep off: the cluster id (the kube-system namespace's uid) is unknown");
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
            .filter(|i| i.tags.get(TAG_CLUSTER_ID) == Some(&cluster_id))
            .filter(|i| {
                namespace
                    .as_deref()
                    .is_none_or(|ns| i.tags.get(TAG_NAMESPACE).map(String::as_str) == Some(ns))
            })
            .cloned()
            .collect();
        let questdbs = ctx.caches.questdbs.state();
        let claims = claims(questdbs.iter().filter_map(|q| q.0.as_ref().ok()));
        let due: Vec<Instance> = clock
            .due(
                &instances,
                &claims,
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
            let leaked = instance
                .tags
                .get(TAG_UID)
                .is_some_and(|u| claims.contains_key(u));
            terminate_orphan(&ctx, &cloud.nodes, &instance, leaked).await;
        }
    }
}

/// One pass terminates at most max(1, 10%) of the managed instances; more is held back whole.
pub(crate) fn within_bound(orphans: usize, managed: usize) -> bool {
    orphans <= (managed / 10).max(1)
}

async fn hold_back(ctx: &Context, instance: &Instance, orphans: usize, managed: usize) {
    let nodes = ctx.caches.nodes.state();
    let Some(node) = node_for(&nodes, &instance.id) else {
        return;
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: EventReason::OrphanSweepHeldBack.as_str().into(),
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
    leaked: bool,
) {
    let tag = |k: &str| instance.tags.get(k).map(String::as_str).unwrap_or("-");
    let (ns, name) = (tag(TAG_NAMESPACE), tag(TAG_NAME));
    if let Err(e) = nodes.terminate(&instance.id, tag(TAG_UID)).await {
        warn!(instance = %instance.id, error = %e, "orphan sweep: terminate failed");
        return;
    }
    if leaked {
        ctx.metrics.leaked_instance_terminated();
    } else {
        ctx.metrics.orphaned_instance_terminated();
    }
    if let Some(c) = ctx.cloud.as_ref() {
        c.instances.invalidate();
    }
    let note = if leaked {
        format!(
            "terminated instance {} of QuestDB {ns}/{name}: an older node generation ({}) that none of its records names any more (leaked)",
            instance.id,
            tag(TAG_NODE_GENERATION)
        )
    } else {
        format!(
            "terminated instance {} of QuestDB {ns}/{name}, which no longer exists",
            instance.id
        )
    };
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
            reason: EventReason::OrphanTerminated.as_str().into(),
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
            private_dns_name: None,
            pod_addresses: Default::default(),
        }
    }

    /// Live QuestDBs that name no instance and have no generation yet.
    fn live(uids: &[&str]) -> HashMap<String, Claim> {
        uids.iter()
            .map(|u| (u.to_string(), Claim::default()))
            .collect()
    }

    fn generation(mut i: Instance, g: i64) -> Instance {
        i.tags.insert(TAG_NODE_GENERATION.into(), g.to_string());
        i
    }

    #[test]
    fn an_older_generation_no_record_names_is_a_leak_but_a_newer_unnamed_one_is_a_launch() {
        let grace = Duration::from_secs(60);
        let status = QuestDBStatus {
            instance_id: Some("i-current".into()),
            node_generation: Some(3),
            failover: Some(crate::api::FailoverStatus {
                old_instance_id: Some("i-fenced".into()),
                fenced_instance_ids: vec!["i-fenced-first".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let claims = HashMap::from([("db".to_string(), Claim::of(Some(&status)))]);
        let instances = vec![
            generation(instance("i-current", "db", InstanceState::Running), 3),
            generation(instance("i-fenced", "db", InstanceState::Stopped), 2),
            // An earlier attempt's fenced instance, kept until the failover ends.
            generation(instance("i-fenced-first", "db", InstanceState::Stopped), 1),
            generation(instance("i-leaked", "db", InstanceState::Running), 2),
            generation(instance("i-launching", "db", InstanceState::Pending), 4),
            {
                let mut i = instance("i-untagged-generation", "db", InstanceState::Running);
                i.tags.remove(TAG_NODE_GENERATION);
                i
            },
        ];
        let mut clock = OrphanClock::default();
        let t0 = Instant::now();
        assert!(clock.due(&instances, &claims, grace, t0).is_empty());
        let due = clock.due(&instances, &claims, grace, t0 + grace);
        assert_eq!(
            due.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
            ["i-leaked"]
        );
        // A first generation reads as 1 without a recorded generation.
        let first = QuestDBStatus {
            instance_id: Some("i-current".into()),
            ..Default::default()
        };
        let claims = HashMap::from([("db".to_string(), Claim::of(Some(&first)))]);
        let zero = vec![generation(
            instance("i-zero", "db", InstanceState::Running),
            0,
        )];
        let mut clock = OrphanClock::default();
        assert!(clock.due(&zero, &claims, grace, t0).is_empty());
        assert_eq!(clock.due(&zero, &claims, grace, t0 + grace).len(), 1);
        // A QuestDB whose status names nothing (lost, or not written yet) leaks nothing.
        let blank = HashMap::from([("db".to_string(), Claim::of(None))]);
        assert!(clock
            .due(&instances, &blank, grace, t0 + grace * 3)
            .is_empty());
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
        assert!(clock.due(&instances, &HashMap::new(), grace, t0).is_empty());
        assert!(clock
            .due(&instances, &HashMap::new(), grace, t0 + grace * 10)
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
        let uids = live(&["alive"]);
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
        let none = HashMap::new();
        assert!(clock.due(&instances, &none, grace, t0).is_empty());
        let with_qdb = live(&["late"]);
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
