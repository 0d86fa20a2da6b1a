//! The cloud part of a QuestDB reconcile: the turns `plan::cloud` decides (the release fences,
//! failover, node move, the dedicated node that `plan::node` plans, then the DNS step in
//! `dns.rs`), given in that order until one records a step, which ends the reconcile.
//!
//! AWS cost: a converged QuestDB (its instance recorded, its Node registered, dedicated and
//! Ready, DNS recorded at the Node's address) costs no AWS call at all: the kubelet's Node is
//! the proof of life. Otherwise instance state comes from the shared [`InstanceCache`] (one
//! DescribeInstances per sync interval for the whole operator, at most one per
//! [`WAITING_SYNC`] while something is in transition).
//!
//! [`InstanceCache`]: crate::controllers::cloud_runtime::InstanceCache

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::ResourceExt;

use super::dns::{dns_step, node_address, pod_address, report_untrusted_address, Ips};
use super::node::{node_steps, ready_condition};
pub(crate) use super::outcome::CloudOutcome;
use super::placement;
use super::stop_first;
use crate::api::{ConditionReason, DnsReason, NodeReadyReason};
use crate::api::{QuestDB, FINALIZER};
use crate::controllers::context::Context;
use crate::controllers::own_writes;
use crate::controllers::Error;
use crate::desired::DedicatedNode;
use crate::plan::cloud::{CloudTurns, CloudView, NodeTurn};
use crate::plan::conditions::Verdict;
use crate::plan::{self, node};

pub(crate) use super::node::WAITING_SYNC;

/// True when `qdb` needs the finalizer (it has, or may get, cloud resources).
pub(crate) fn wants_finalizer(qdb: &QuestDB) -> bool {
    qdb.spec.node.is_some() || qdb.spec.dns.is_some()
}

pub(crate) fn has_finalizer(qdb: &QuestDB) -> bool {
    own_writes::has_finalizer(qdb, FINALIZER)
}

/// Adds or removes the finalizer; the resourceVersion makes it a no-op on a stale object.
pub(crate) async fn set_finalizer(
    qdb: &mut QuestDB,
    ctx: &Context,
    present: bool,
) -> Result<(), Error> {
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    own_writes::set_finalizer(&api, qdb, FINALIZER, present).await
}

/// Every cloud machine's turn for `qdb` as it is now (`plan::cloud`), decided on the spec, the
/// status, whether the database has stopped (`stopped`, read by the caller, which acts on the
/// same reading) and whether its pod still sits on the recorded node.
pub(super) fn turns_for(qdb: &QuestDB, ctx: &Context, stopped: bool) -> CloudTurns {
    let status = qdb.status.clone().unwrap_or_default();
    plan::cloud::turns(&CloudView {
        dedicated: qdb.spec.node.is_some(),
        paused: qdb.spec.paused,
        deleting: qdb.metadata.deletion_timestamp.is_some(),
        stopped,
        pod_on_recorded_node: stop_first::pod_on_recorded_node(qdb, &ctx.caches),
        status: &status,
    })
}

/// Whether a turn wrote the QuestDB (a step's status record): the resourceVersion moved.
/// Kubernetes does not bump it for an update that changes nothing.
pub(super) struct Since(Option<String>);

impl Since {
    pub(super) fn of(qdb: &QuestDB) -> Self {
        Self(qdb.resource_version())
    }

    pub(super) fn recorded(&self, qdb: &QuestDB) -> bool {
        qdb.resource_version() != self.0
    }
}

fn not_configured<R: ConditionReason>(reason: R) -> Verdict<R> {
    Verdict::new(
        false,
        reason,
        "the operator runs without a cloud provider (--cloud-provider)",
    )
}

/// How long a release waits before looking at a fence again (a stop is no watch event).
const FENCE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// The cloud stage of a reconcile: the release fences, then each machine's turn in the order
/// `plan::cloud` gives, each persisting intent in status before its side effect. It works on
/// its own copy of the QuestDB: the first turn that records a step ends the stage with
/// [`CloudOutcome::recorded`], and the reconcile with it, so nothing after is decided or built
/// on a status this pass wrote (the watch event of the write starts the next reconcile).
pub(crate) async fn stage(qdb: &QuestDB, ctx: &Context) -> Result<CloudOutcome, Error> {
    let mut qdb = qdb.clone();
    let turns = turns_for(&qdb, ctx, stop_first::database_stopped(&qdb, &ctx.caches));
    let since = Since::of(&qdb);
    let mut waits_on_a_fence = None;
    if turns.release_fence.finish_failover {
        waits_on_a_fence = super::failover::during_release(&mut qdb, ctx).await?;
    }
    // Either fence waits for the pod to leave the node: a dead node never lets it.
    if waits_on_a_fence.is_none() && turns.release_fence.fence_dead_node {
        waits_on_a_fence = super::failover::fence_for_release(&mut qdb, ctx).await?;
    }
    let mut out = machines(&mut qdb, ctx, turns, &since).await?;
    if waits_on_a_fence.is_some() {
        out.requeue_within(FENCE_POLL);
    }
    Ok(out)
}

/// The machines' turns after the release fences: failover, node move, the dedicated node
/// (`plan::node`), DNS; the first that records a step ends them (none is given when a release
/// fence recorded one since `since`).
pub(super) async fn machines(
    qdb: &mut QuestDB,
    ctx: &Context,
    turns: CloudTurns,
    since: &Since,
) -> Result<CloudOutcome, Error> {
    let mut out = CloudOutcome::default();
    if since.recorded(qdb) {
        return Ok(out.ended());
    }
    let Some(cloud) = ctx.cloud.as_deref() else {
        out.node_condition = qdb
            .spec
            .node
            .as_ref()
            .map(|_| not_configured(NodeReadyReason::NotConfigured));
        out.dns_condition = qdb
            .spec
            .dns
            .as_ref()
            .map(|_| not_configured(DnsReason::NotConfigured));
        let status = qdb.status.clone().unwrap_or_default();
        // Without a provider nothing can be cleaned up; say so rather than forget it.
        out.released = status.instance_id.is_none() && status.dns_name.is_none();
        return Ok(out);
    };
    // Before the steady-state shortcut: a node whose Lease stopped may still look Ready.
    let failover = super::failover::reconcile(qdb, ctx, cloud, turns.failover).await?;
    out.failover_condition = failover.and_then(|turn| out.absorb(turn));
    if since.recorded(qdb) {
        return Ok(out.ended());
    }
    let node_move = super::node_move::reconcile(qdb, ctx, cloud, turns.node_move).await?;
    out.node_move_condition = node_move.and_then(|turn| out.absorb(turn));
    if since.recorded(qdb) {
        return Ok(out.ended());
    }
    // Nothing recorded so far: the status the pod's pinning is read from is the one observed.
    let dedicated = placement::dedicated_node(qdb, ctx);
    if qdb.spec.node.is_some() {
        out.dedicated = Some(dedicated.clone());
    }

    if turns.node == (NodeTurn::Steps { release: false }) {
        if let Some(fast) = steady_state(qdb, ctx, &dedicated) {
            if let Some(done) = dns_step(qdb, ctx, cloud, &fast.ips, true).await? {
                out.node_condition = Some(ready_condition(&fast.name, true));
                out.node = Some(fast.node);
                out.dns_condition = done.condition;
                return Ok(if since.recorded(qdb) {
                    out.ended()
                } else {
                    out
                });
            }
        }
    }

    let current = match turns.node {
        NodeTurn::HeldForThePod => {
            let status = qdb.status.clone().unwrap_or_default();
            out.node_condition = Some(Verdict::new(
                false,
                NodeReadyReason::MovingOff,
                format!(
                    "spec.node was removed; instance {} is released once the database pod has left it",
                    status.instance_id.as_deref().unwrap_or("-")
                ),
            ));
            out.requeue_within(WAITING_SYNC);
            None
        }
        NodeTurn::Steps { release } => {
            let turn = node_steps(qdb, ctx, cloud, &dedicated, release).await?;
            out.node_condition = turn.condition;
            out.node = turn.also.node;
            out.released = turn.also.released;
            out.requeue = super::outcome::sooner(out.requeue, turn.requeue);
            if since.recorded(qdb) {
                return Ok(out.ended());
            }
            turn.also.instance
        }
        NodeTurn::Uninvolved => {
            out.released = true;
            None
        }
    };
    let node_ip = current.as_ref().and_then(|i| i.private_ip.clone());
    report_untrusted_address(qdb, ctx, out.node.as_deref(), node_ip.as_deref()).await;
    let ips = match current {
        Some(i) if !dedicated.host_ports => Ips {
            private: pod_address(qdb, ctx, cloud, out.node.as_deref(), &i).await?,
            public: i.public_ip,
            pod_addressed: true,
        },
        Some(i) => Ips {
            private: i.private_ip,
            public: i.public_ip,
            pod_addressed: false,
        },
        None => Ips {
            pod_addressed: !dedicated.host_ports,
            ..Ips::default()
        },
    };
    out.dns_condition = dns_step(qdb, ctx, cloud, &ips, false)
        .await?
        .and_then(|turn| turn.condition);
    if since.recorded(qdb) {
        return Ok(out.ended());
    }
    let dns_left = qdb.status.as_ref().is_some_and(|s| s.dns_name.is_some());
    out.released = out.released && !dns_left;
    Ok(out)
}

/// The dedicated node as the Node cache shows it.
struct SteadyNode {
    name: String,
    node: Arc<Node>,
    ips: Ips,
}

/// A converged QuestDB: instance recorded, its Node registered, dedicated and Ready.
fn steady_state(qdb: &QuestDB, ctx: &Context, dedicated: &DedicatedNode) -> Option<SteadyNode> {
    qdb.spec.node.as_ref()?;
    let id = qdb.status.as_ref()?.instance_id.as_deref()?;
    let nodes = ctx.caches.nodes.state();
    let node = node::node_for(&nodes, id)?;
    if !node::is_dedicated(node, dedicated, id) || !node::node_is_ready(node) {
        return None;
    }
    let found = nodes
        .iter()
        .find(|n| n.metadata.name == node.metadata.name)?
        .clone();
    Some(SteadyNode {
        name: node.metadata.name.clone().unwrap_or_default(),
        // What the kubelet reports: enough to confirm the record, never to move it.
        ips: Ips {
            private: if dedicated.host_ports {
                node_address(node, "InternalIP")
            } else {
                placement::pod_ip_on(qdb, ctx, &node.name_any())
            },
            public: node_address(node, "ExternalIP"),
            pod_addressed: !dedicated.host_ports,
        },
        node: found,
    })
}
