//! The cloud part of a QuestDB reconcile: one turn of each cloud machine in their order
//! (failover, node move, the dedicated node that `plan::node` plans), then the DNS step
//! (`dns.rs`), each persisting intent in status before its side effect.
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
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use super::dns::{dns_step, node_address, pod_address, report_untrusted_address, DnsDecision, Ips};
pub(crate) use super::outcome::CloudOutcome;
use super::placement;
use super::provision::{node_steps, ready_condition};
use crate::api::{ConditionReason, DnsReason, NodeReadyReason};
use crate::api::{QuestDB, QuestDBStatus, FINALIZER, MANAGER};
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::DedicatedNode;
use crate::plan::conditions::Verdict;
use crate::plan::node;

pub(crate) use super::provision::WAITING_SYNC;

/// True when `qdb` needs the finalizer (it has, or may get, cloud resources).
pub(crate) fn wants_finalizer(qdb: &QuestDB) -> bool {
    qdb.spec.node.is_some() || qdb.spec.dns.is_some()
}

pub(crate) fn has_finalizer(qdb: &QuestDB) -> bool {
    qdb.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds or removes the finalizer; the resourceVersion makes it a no-op on a stale object.
pub(crate) async fn set_finalizer(
    qdb: &mut QuestDB,
    ctx: &Context,
    present: bool,
) -> Result<(), Error> {
    let mut finalizers: Vec<String> = qdb
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": qdb.resource_version(),
    }});
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    *qdb = api
        .patch(&qdb.name_any(), &pp, &Patch::Merge(&patch))
        .await
        .map_err(Error::from_status_write)?;
    Ok(())
}

/// What the precedence between the cloud machines is decided on (`plan::cloud`).
pub(super) fn view<'a>(
    qdb: &QuestDB,
    status: &'a QuestDBStatus,
) -> crate::plan::cloud::CloudView<'a> {
    crate::plan::cloud::CloudView {
        dedicated: qdb.spec.node.is_some(),
        paused: qdb.spec.paused,
        deleting: qdb.metadata.deletion_timestamp.is_some(),
        status,
    }
}

fn not_configured<R: ConditionReason>(reason: R) -> Verdict<R> {
    Verdict::new(
        false,
        reason,
        "the operator runs without a cloud provider (--cloud-provider)",
    )
}

/// Runs the node and DNS steps. `release` = paused or being deleted. `hold`: the node is no
/// longer wanted but the database pod still runs on it, so it is not released yet.
pub(crate) async fn reconcile(
    qdb: &mut QuestDB,
    ctx: &Context,
    release: bool,
    hold: bool,
) -> Result<CloudOutcome, Error> {
    let mut out = CloudOutcome::default();
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
    let failover = super::failover::reconcile(qdb, ctx, cloud).await?;
    out.failover_condition = failover.map(|turn| out.absorb(turn));
    let node_move = super::node_move::reconcile(qdb, ctx, cloud).await?;
    out.node_move_condition = node_move.map(|turn| out.absorb(turn));
    let dedicated = placement::dedicated_node(qdb, ctx);

    if !release {
        if let Some(fast) = steady_state(qdb, ctx, &dedicated) {
            if let DnsDecision::Decided(done) = dns_step(qdb, ctx, cloud, &fast.ips, true).await? {
                out.node_condition = Some(ready_condition(&fast.name, true));
                out.node = Some(fast.node);
                out.dns_condition = done;
                out.dedicated = Some(dedicated);
                return Ok(out);
            }
        }
    }

    let status = qdb.status.clone().unwrap_or_default();
    let involved =
        qdb.spec.node.is_some() || status.node_generation.is_some() || status.instance_id.is_some();
    let current = if involved && hold {
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
    } else if involved {
        let turn = node_steps(qdb, ctx, cloud, &dedicated, release).await?;
        out.node_condition = turn.condition;
        out.node = turn.node;
        out.released = turn.released;
        out.requeue = super::outcome::sooner(out.requeue, turn.requeue);
        turn.instance
    } else {
        out.released = true;
        None
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
    out.dns_condition = match dns_step(qdb, ctx, cloud, &ips, false).await? {
        DnsDecision::Decided(c) => c,
        DnsDecision::Undecided => None,
    };
    let dns_left = qdb.status.as_ref().is_some_and(|s| s.dns_name.is_some());
    out.released = out.released && !dns_left;
    // Read again: the node steps may have recorded (or forgotten) the instance the pod pins.
    if qdb.spec.node.is_some() {
        out.dedicated = Some(placement::dedicated_node(qdb, ctx));
    }
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
