//! Performs the node-image (and instance-type) move `plan::node_move` plans, in the cloud
//! part of a QuestDB's reconcile: never two reconciles of one object at once, every step
//! persisted in `status.nodeMove` before its side effect, a failover always first.

pub(super) mod steps;

use super::owner_uid;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;
use tokio::time::Instant;
use tracing::{info, warn};

use super::node_marks::dedicate;
use super::outcome::Turn;
use super::placement::{dns_follows, dns_ttl, volume_attached_to};
use super::record::{advance, persist};
use super::status::pod_ready;
use crate::api::{EventReason, NodeMoveReason};
use crate::api::{NodeMovePhase, NodeMoveStatus, QuestDB, QuestDBStatus};
use crate::cloud::Instance;
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::{names, DedicatedNode};
use crate::metrics::NodeMoveResult;
use crate::plan::cloud::NodeMoveTurn;
use crate::plan::conditions::Verdict;
use crate::plan::node::launch_request;
use crate::plan::node::{is_dedicated, node_for, node_is_ready};
use crate::plan::node_move::{self, Start, StartView, Step, StepView};
use crate::runtime::clock::{self, now, since};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const STEP_POLL: Duration = Duration::from_secs(2);

/// A terminate that failed: refused as not this QuestDB's instance (a forged record), the
/// move stops at this step with `NodeUpgrade` saying so; anything else is the reconcile's error.
async fn not_owned_or(
    qdb: &QuestDB,
    ctx: &Context,
    status: &QuestDBStatus,
    e: crate::cloud::CloudError,
) -> Result<Verdict<NodeMoveReason>, Error> {
    if !super::not_owned(&e) {
        return Err(Error::Cloud(e));
    }
    let c = condition(false, NodeMoveReason::InstanceNotOwned, e.to_string());
    Ok(super::report_not_owned(qdb, ctx, status, c, "NodeMove").await)
}

fn condition(status: bool, reason: NodeMoveReason, message: String) -> Verdict<NodeMoveReason> {
    Verdict::new(status, reason, message)
}

fn up_to_date() -> Verdict<NodeMoveReason> {
    condition(
        true,
        NodeMoveReason::UpToDate,
        "the node runs the image and instance type of the spec".into(),
    )
}

/// Starts a move when the recorded node differs from `spec.node`, or advances the one under
/// way (or releases a retained old node). Returns the turn with the `NodeMove` condition;
/// `None` without a dedicated node.
pub(crate) async fn reconcile(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    turn: NodeMoveTurn,
) -> Result<Option<Turn<NodeMoveReason>>, Error> {
    let Some(spec) = qdb.spec.node.clone() else {
        return Ok(None);
    };
    let status = qdb.status.clone().unwrap_or_default();
    match turn {
        NodeMoveTurn::Nothing | NodeMoveTurn::HeldByVersionUpgrade => return Ok(None),
        // A failover pre-empts a move that has not stopped the database yet.
        NodeMoveTurn::PreemptedByFailover => {
            let new = status
                .node_move
                .as_ref()
                .and_then(|u| u.new_instance_id.clone());
            let verdict = abort(
                qdb,
                ctx,
                cloud,
                &status,
                new.as_deref(),
                NodeMoveReason::Preempted,
                "a failover of the database started; the move starts again after it".into(),
            )
            .await?;
            // Still active: the terminate was refused, and the condition says why.
            if node_move::active(qdb.status.as_ref().unwrap_or(&status)) {
                return Ok(Some(Turn::settled(verdict)));
            }
            return Ok(None);
        }
        // Even the step that ends the move is this reconcile's one step: a move queued behind
        // it starts on the next.
        NodeMoveTurn::Steps => return steps::steps(qdb, ctx, cloud).await.map(Some),
        NodeMoveTurn::MayStart => {}
    }
    // A converged QuestDB (node as the spec asks) never waits for a slot: no lock, no scan of
    // the other QuestDBs, no pod lookup on its reconcile.
    let event = status
        .instance_id
        .as_deref()
        .and_then(|id| cloud.scheduled_event(id));
    let cordoned = cordoned_node(ctx, &status);
    let decision = if node_move::differs(&spec, &status) || event.is_some() || cordoned.is_some() {
        decide(
            qdb,
            ctx,
            cloud,
            &spec,
            &status,
            event.as_ref(),
            cordoned.as_deref(),
        )
    } else {
        Start::No
    };
    match decision {
        Start::No => Ok(Some(Turn::settled(match status.node_move.as_ref() {
            Some(u)
                if (u.phase == NodeMovePhase::Aborted || u.phase == NodeMovePhase::RolledBack)
                    && node_move::targets(u, &spec) =>
            {
                condition(
                    false,
                    u.reason.unwrap_or(NodeMoveReason::Aborted),
                    u.message.clone().unwrap_or_default(),
                )
            }
            _ => up_to_date(),
        }))),
        Start::Waiting { why, retry } => Ok(Some(Turn::again_within(
            condition(false, NodeMoveReason::Waiting, why),
            retry,
        ))),
        Start::Go(record) => {
            let record = *record;
            let next_generation = status.node_generation.unwrap_or(1) + 1;
            // The new node's generation is recorded before it is launched.
            persist(qdb, ctx, |s| {
                s.node_move = Some(record.clone());
                s.node_generation = Some(next_generation);
            })
            .await?;
            let image = record.to_image.clone().unwrap_or_default();
            let kind = record.to_instance_type.clone().unwrap_or_default();
            let note = match (&record.scheduled_event, event.as_ref(), &record.drained_node) {
                (Some(_), Some(e), _) => format!(
                    "{}: replacing the node with a new one of {image} ({kind}); the database keeps running until the new node is Ready",
                    node_move::describe_event(e)
                ),
                (_, _, Some(node)) => format!(
                    "node {node} was cordoned (a drain): replacing it with a new one of {image} ({kind}); the database keeps running until the new node is Ready, then the drain can finish"
                ),
                _ => format!(
                    "moving to a node of {image} ({kind}); the database keeps running until the new node is Ready"
                ),
            };
            started(qdb, ctx, note).await;
            // The record is this reconcile's step: its watch event brings the validation.
            Ok(Some(Turn::again_within(moving(&record), STEP_POLL)))
        }
    }
}

/// Whether a move starts now, claiming a slot of `--node-move-concurrency` when it does (under
/// the claims lock, so two reconciles cannot both take the last slot).
fn decide(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    spec: &crate::api::NodeSpec,
    status: &QuestDBStatus,
    event: Option<&crate::cloud::ScheduledEvent>,
    cordoned: Option<&str>,
) -> Start {
    let uid = qdb.uid().unwrap_or_default();
    let mut claims = cloud
        .move_claims
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    claims.retain(|_, at| at.elapsed() < CLAIM_TTL);
    let ended: HashSet<String> = cloud
        .move_ends
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .filter(|(_, at)| at.elapsed() < CLAIM_TTL)
        .map(|(uid, _)| uid.clone())
        .collect();
    let others = moves_elsewhere(ctx, &claims, &ended, &uid);
    let namespace = qdb.namespace();
    let decision = node_move::should_start(&StartView {
        spec,
        status,
        database_ready: pod_ready_on(qdb, ctx, status.instance_id.as_deref()),
        failover_in_progress: false,
        now: Timestamp::now(),
        moves_elsewhere: others.len(),
        concurrency: cloud.settings.node_move_concurrency,
        moves_in_namespace: others.iter().filter(|(_, ns)| *ns == namespace).count(),
        namespace_concurrency: cloud.settings.node_move_concurrency_per_namespace,
        scheduled_event: event,
        cordoned_node: cordoned,
    });
    if matches!(decision, Start::Go(_)) {
        claims.insert(uid.clone(), Instant::now());
        cloud
            .move_ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&uid);
    }
    decision
}

/// The database's node, when it is cordoned (`kubectl drain`, `kubectl cordon`, the Node
/// Termination Handler). The operator cordons only a move's retained old node, never the one
/// the database runs on.
fn cordoned_node(ctx: &Context, status: &QuestDBStatus) -> Option<String> {
    let instance = status.instance_id.as_deref()?;
    let nodes = ctx.caches.nodes.state();
    let node = node_for(&nodes, instance)?;
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        .then(|| node.metadata.name.clone())
        .flatten()
}

/// A move ended and freed its slot (its claim goes at once): the QuestDBs whose node differs
/// from their spec (the ones that may be queued) are reconciled now rather than at their next
/// poll.
fn wake_queued(qdb: &QuestDB, ctx: &Context) {
    if let (Some(cloud), Some(uid)) = (ctx.cloud.as_ref(), qdb.metadata.uid.as_deref()) {
        let mut claims = cloud
            .move_claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        claims.remove(uid);
        let mut ends = cloud
            .move_ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ends.retain(|_, at| at.elapsed() < CLAIM_TTL);
        ends.insert(uid.to_string(), Instant::now());
    }
    let Some(wake) = ctx.wake.as_ref() else {
        return;
    };
    let me = qdb.metadata.uid.as_deref();
    for q in ctx.caches.questdbs.state() {
        let Ok(q) = q.0.as_ref() else { continue };
        let queued = q.metadata.uid.as_deref() != me
            && q.spec
                .node
                .as_ref()
                .zip(q.status.as_ref())
                .is_some_and(|(spec, status)| {
                    node_move::differs(spec, status) && !node_move::active(status)
                });
        if let Some(r) = queued
            .then(|| crate::controllers::context::questdb_ref(q))
            .flatten()
        {
            let _ = wake.unbounded_send(r);
        }
    }
}

/// How long a started move counts through its claim (then through its persisted record,
/// which the QuestDB cache holds by then).
const CLAIM_TTL: Duration = Duration::from_secs(30);

/// Moves of other QuestDBs under way: persisted ones (the cache) and ones this process
/// started moments ago (the claims).
/// The other QuestDBs whose moves are under way (recorded in status, or claimed by a
/// reconcile whose record is not in the cache yet), each with its namespace.
fn moves_elsewhere(
    ctx: &Context,
    claims: &HashMap<String, Instant>,
    ended: &HashSet<String>,
    uid: &str,
) -> Vec<(String, Option<String>)> {
    let questdbs = ctx.caches.questdbs.state();
    let namespace_of: HashMap<&str, Option<String>> = questdbs
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter_map(|q| Some((q.metadata.uid.as_deref()?, q.namespace())))
        .collect();
    let mut uids: HashSet<String> = questdbs
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|q| q.status.as_ref().is_some_and(node_move::in_progress))
        .filter_map(|q| q.metadata.uid.clone())
        .filter(|u| !ended.contains(u))
        .collect();
    uids.extend(claims.keys().cloned());
    uids.remove(uid);
    uids.into_iter()
        .map(|u| {
            let ns = namespace_of.get(u.as_str()).cloned().flatten();
            (u, ns)
        })
        .collect()
}

fn pod_ready_on(qdb: &QuestDB, ctx: &Context, instance: Option<&str>) -> bool {
    let Some(instance) = instance else {
        return false;
    };
    let nodes = ctx.caches.nodes.state();
    let node = node_for(&nodes, instance).and_then(|n| n.metadata.name.clone());
    let ns = qdb.namespace().unwrap_or_default();
    ctx.caches
        .pods
        .get(&ObjectRef::new(&names::pod(qdb)).within(&ns))
        .is_some_and(|p| {
            // A pod on its way out answers for seconds more; it is not the database's home.
            p.metadata.deletion_timestamp.is_none() && p.node_name == node && pod_ready(&p)
        })
}

/// A move step that waits: its message recorded (once), looked at again soon.
async fn waiting_with(
    qdb: &mut QuestDB,
    ctx: &Context,
    u: &NodeMoveStatus,
    message: String,
) -> Result<Turn<NodeMoveReason>, Error> {
    if u.message.as_deref() != Some(message.as_str()) {
        persist(qdb, ctx, |s| {
            if let Some(u) = s.node_move.as_mut() {
                u.message = Some(message.clone());
            }
        })
        .await?;
    }
    Ok(Turn::again_within(moving(u), STEP_POLL))
}

/// Whether `node` is dead as a failover judges it: silent past the database's threshold,
/// failover on for it, and the breaker closed (a partition is not a dead node).
fn node_dead(qdb: &QuestDB, cloud: &CloudRuntime, node: Option<&str>) -> bool {
    let Some(node) = node else {
        return false;
    };
    let skip = super::failover::skip_requested(qdb);
    let breaker = cloud.health.breaker_for(super::failover::zone_of(qdb));
    if !qdb.spec.failover.enabled || skip || breaker.is_some() {
        return false;
    }
    let threshold = cloud
        .health
        .threshold(qdb.spec.failover.unhealthy_after_seconds);
    cloud
        .health
        .unhealthy_for(node, Instant::now())
        .is_some_and(|silent| silent >= threshold)
}

fn step_done(qdb: &QuestDB, ctx: &Context, u: &NodeMoveStatus) {
    if let Some(took) = since(u.phase_started_at.as_ref()) {
        info!(questdb = %qdb.name_any(), step = %u.phase, seconds = took.as_secs_f64(), "node move step done");
        ctx.metrics.node_move_step(u.phase.into(), took);
    }
}

/// A move (or a move back without a launch) has begun.
async fn started(qdb: &QuestDB, ctx: &Context, note: String) {
    info!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::NodeMoveStarted,
        "NodeMove",
        note,
    )
    .await;
}

/// The database stopped but does not answer on the new node (or the spec was set back): the
/// old instance, still there and dedicated, becomes the database's again. The record swaps the
/// two ids, so the same steps move the database back.
async fn roll_back(
    qdb: &mut QuestDB,
    ctx: &Context,
    u: &NodeMoveStatus,
    reason: NodeMoveReason,
    message: String,
) -> Result<(), Error> {
    let old = u.old_instance_id.clone();
    let (image, kind) = (u.from_image.clone(), u.from_instance_type.clone());
    step_done(qdb, ctx, u);
    persist(qdb, ctx, |s| {
        s.instance_id = old.clone();
        s.node_image = image.clone();
        s.node_instance_type = kind.clone();
        if let Some(u) = s.node_move.as_mut() {
            std::mem::swap(&mut u.old_instance_id, &mut u.new_instance_id);
            u.rolling_back = true;
            u.reason = Some(reason);
            u.message = Some(message.clone());
            u.phase = NodeMovePhase::Stopping;
            u.phase_started_at = Some(now());
        }
    })
    .await?;
    warn!(questdb = %qdb.name_any(), %reason, "node move rolling back: {message}");
    ctx.event(
        qdb,
        EventType::Warning,
        EventReason::NodeMoveRollingBack,
        "NodeMove",
        format!("{reason}: {message}"),
    )
    .await;
    Ok(())
}

/// The database answers on the new node: the old one is cordoned (nothing else lands on it)
/// and kept for the rollback window.
async fn retain(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    u: &NodeMoveStatus,
    spec: &crate::api::NodeSpec,
    old_node: Option<&str>,
) -> Result<(), Error> {
    let window = node_move::rollback_window(spec);
    if let (Some(node), Some(instance)) = (old_node, u.old_instance_id.as_deref()) {
        if !window.is_zero() && ec2_says_ours(qdb, cloud, instance).await? {
            set_unschedulable(ctx, node, true).await?;
        }
    }
    let window = window.max(dns_ttl(qdb));
    step_done(qdb, ctx, u);
    let downtime = since(u.stopped_at.as_ref());
    let started = now();
    let retain_until = Time(
        started
            .0
            .checked_add(SignedDuration::try_from(window).unwrap_or_default())
            .unwrap_or(started.0),
    );
    let previous = u.from_image.clone();
    persist(qdb, ctx, |s| {
        s.previous_node_image = previous.clone();
        if let Some(u) = s.node_move.as_mut() {
            u.phase = NodeMovePhase::Retaining;
            u.phase_started_at = Some(started.clone());
            u.finished_at = Some(started.clone());
            u.downtime_seconds = downtime.map(|d| d.as_secs() as i64);
            u.retain_until = Some(retain_until.clone());
            u.message = None;
        }
    })
    .await?;
    ctx.metrics
        .node_move_finished(NodeMoveResult::Completed, downtime);
    wake_queued(qdb, ctx);
    let note = format!(
        "the database answers on the new node after {}s of downtime; old instance {} kept, cordoned, until {} for a rollback",
        downtime.unwrap_or_default().as_secs(),
        u.old_instance_id.clone().unwrap_or_default(),
        retain_until.0
    );
    info!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::NodeMoveRetaining,
        "NodeMove",
        note,
    )
    .await;
    Ok(())
}

/// Whether EC2 (the cluster's instance snapshot, refreshed within the sync interval) shows
/// `instance` tagged as this QuestDB's. A Node is cordoned or uncordoned for a database only
/// then: a record forged through the status subresource never reaches another database's node.
async fn ec2_says_ours(qdb: &QuestDB, cloud: &CloudRuntime, instance: &str) -> Result<bool, Error> {
    let instances = cloud
        .instances
        .get_within(cloud.nodes.as_ref(), cloud.settings.instance_sync_interval)
        .await
        .map_err(Error::Cloud)?;
    let ours = crate::plan::node::owned_by(&instances, &owner_uid(qdb))
        .iter()
        .any(|i| i.id == instance);
    if !ours {
        warn!(questdb = %qdb.name_any(), %instance, "instance is not this QuestDB's in EC2's view: its Node is not written");
    }
    Ok(ours)
}

/// Cordons (or uncordons) a Node: `spec.unschedulable`, as `kubectl cordon` sets it.
async fn set_unschedulable(ctx: &Context, name: &str, cordon: bool) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({"spec": {"unschedulable": cordon}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // The Node went away with its instance: nothing to cordon.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn retaining(u: &NodeMoveStatus) -> Verdict<NodeMoveReason> {
    condition(
        true,
        NodeMoveReason::Retaining,
        u.message.clone().unwrap_or_default(),
    )
}

fn moving(u: &NodeMoveStatus) -> Verdict<NodeMoveReason> {
    condition(
        true,
        NodeMoveReason::Moving,
        format!("{}: {}", u.phase, u.message.clone().unwrap_or_default()),
    )
}

/// The idempotent launch of the new node (found by its tags if it exists). A permanent error
/// (unknown image, unsupported type, no capacity) is returned as a message: it aborts.
async fn launch(
    qdb: &QuestDB,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    target: &crate::api::NodeSpec,
) -> Result<(Option<Instance>, Option<String>), Error> {
    let uid = qdb.uid().unwrap_or_default();
    let generation = status.node_generation.unwrap_or(1);
    let dedicated = DedicatedNode::for_questdb(qdb);
    let Some(mut req) = launch_request(qdb, &uid, generation, &dedicated) else {
        return Ok((None, None));
    };
    req.image = target.image.clone();
    req.instance_type = target.instance_type.clone();
    req.cluster_id = cloud.cluster_id.clone();
    match cloud.nodes.launch(&req).await {
        Ok(i) => Ok((Some(i), None)),
        Err(e) if e.is_permanent() => Ok((None, Some(e.to_string()))),
        Err(e) => Err(Error::Cloud(e)),
    }
}

/// The move ends as `Aborted`, once: `terminate` (the instance nothing of the database is on)
/// goes first, then the record says why. A terminate refused as not this QuestDB's (a forged
/// record) stops the move at this step instead.
async fn abort(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    terminate: Option<&str>,
    reason: NodeMoveReason,
    message: String,
) -> Result<Verdict<NodeMoveReason>, Error> {
    if let Some(id) = terminate {
        if let Err(e) = cloud.nodes.terminate(id, &owner_uid(qdb)).await {
            return not_owned_or(qdb, ctx, status, e).await;
        }
        cloud.instances.invalidate();
    }
    persist(qdb, ctx, |s| {
        if let Some(u) = s.node_move.as_mut() {
            u.phase = NodeMovePhase::Aborted;
            u.reason = Some(reason);
            u.message = Some(message.clone());
            u.phase_started_at = Some(now());
            u.finished_at = Some(now());
        }
    })
    .await?;
    warn!(questdb = %qdb.name_any(), %reason, "node move aborted: {message}");
    ctx.metrics
        .node_move_finished(NodeMoveResult::Aborted, None);
    wake_queued(qdb, ctx);
    ctx.event(
        qdb,
        EventType::Warning,
        EventReason::NodeMoveAborted,
        "NodeMove",
        format!("{reason}: {message}"),
    )
    .await;
    Ok(condition(false, reason, message))
}
