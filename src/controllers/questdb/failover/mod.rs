//! The failover machine, the executor of `plan::failover` (same name on both sides): this
//! module decides whether one starts (the node judged, the database asked, the symptom
//! confirmed by a live read) and starts it; `steps` performs the steps of the one under way;
//! `release` finishes its fence when the database is released meanwhile. It takes its turn
//! in the cloud stage (`plan::cloud` says when), so a failover is never two reconciles of one
//! object at once; every step is persisted in `status.failover` before its side effect.

mod release;
mod steps;

pub(crate) use release::{during_release, fence_dead_node, fence_for_release};
use steps::{in_progress, steps};

use super::owner_uid;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;
use tracing::{debug, info, warn};

use super::machine::{turn, StateMachine};
use super::node_marks::patch_node;
use super::outcome::Turn;
use super::placement::{dns_follows, dns_ttl, volume_attached_to};
use super::record::{advance, already_reported, persist};
use super::status::pod_ready;
use crate::api::{EventReason, FailoverReason};
use crate::api::{FailoverCause, FailoverPhase, FailoverStatus, QuestDB, QuestDBStatus};
use crate::cloud::{CloudError, InstanceState, StopMode};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::context::Context;
use crate::controllers::node_health::tracker::NODE_LEASE_NAMESPACE;
use crate::controllers::write_health::{self, Logins};
use crate::controllers::Error;
use crate::desired::names;
use crate::metrics::FailoverResult;
use crate::plan::cloud::FailoverTurn;
use crate::plan::conditions::Verdict;
use crate::plan::failover::{
    self, DatabaseWord, Escalation, ReleaseFence, ReleaseView, Start, StartView, Step, StepView,
    OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE, SKIP_ANNOTATION,
};
use crate::plan::node::node_for;
use crate::questdb_http::QueryError;
use crate::runtime::clock::{between, now, since};

/// Watch events drive most waits; this is how soon a wait on something unwatched (EC2, a
/// VolumeAttachment) looks again.
const STEP_POLL: Duration = Duration::from_secs(2);

fn condition(status: bool, reason: FailoverReason, message: String) -> Verdict<FailoverReason> {
    Verdict::new(status, reason, message)
}

/// The record names an instance that is not this QuestDB's (a forged status): the failover
/// stops at this step and touches nothing.
async fn refused(
    qdb: &QuestDB,
    ctx: &Context,
    status: &QuestDBStatus,
    e: &CloudError,
) -> Verdict<FailoverReason> {
    let c = condition(false, FailoverReason::InstanceNotOwned, e.to_string());
    super::report_not_owned(qdb, ctx, status, c, "Failover").await
}

/// Starts a failover when the node of the recorded instance is unhealthy past the threshold
/// (and nothing holds it back), or advances the one under way. Returns the turn with the
/// `Failover` condition; `None` for a QuestDB without a dedicated node.
pub(crate) async fn reconcile(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    turn: FailoverTurn,
) -> Result<Option<Turn<FailoverReason>>, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    match turn {
        FailoverTurn::Nothing => return Ok(None),
        // A failover under way is finished or ended by `during_release`; this shows where.
        FailoverTurn::ShowProgress => {
            return Ok(status
                .failover
                .as_ref()
                .map(|f| Turn::again_within(in_progress(f), STEP_POLL)))
        }
        FailoverTurn::Steps => {
            if let Some(turn) = replace_failed_replacement(qdb, ctx, cloud, &status).await? {
                return Ok(Some(turn));
            }
            return steps(qdb, ctx, cloud).await.map(Some);
        }
        FailoverTurn::Armed => return Ok(Some(Turn::settled(armed(qdb, cloud)))),
        FailoverTurn::HeldByMove => {
            return Ok(Some(Turn::settled(condition(
                true,
                FailoverReason::Armed,
                "a node move is switching nodes: it fences a node that dies and returns the database to the live one itself".into(),
            ))))
        }
        FailoverTurn::Judge => {}
    }
    let Some(id) = status.instance_id.clone() else {
        return Ok(Some(Turn::settled(armed(qdb, cloud))));
    };
    let Some(Judged {
        symptom,
        unhealthy_for,
        look_again,
    }) = judge(qdb, ctx, cloud, &id).await?
    else {
        return Ok(Some(Turn::settled(armed(qdb, cloud))));
    };
    let (node, unhealthy_for) = (symptom.node.clone(), Some(unhealthy_for));
    let since_last_start = status
        .failover
        .as_ref()
        .and_then(|f| since(f.started_at.as_ref()));
    let decision = failover::should_start(&start_view(
        qdb,
        cloud,
        &status,
        unhealthy_for,
        since_last_start,
    ));
    match decision {
        Start::No => Ok(Some(Turn::settled(armed(qdb, cloud)).sooner(look_again))),
        Start::Suppressed { reason, message } => {
            let c = suppressed(qdb, ctx, &status, reason, message, &node).await;
            Ok(Some(
                Turn::again_within(c, Duration::from_secs(5)).sooner(look_again),
            ))
        }
        Start::Go => {
            if let Some(held) = database_answers(qdb, ctx, &status, &symptom).await {
                return Ok(Some(
                    Turn::again_within(held, DATABASE_ASKED_AGAIN).sooner(look_again),
                ));
            }
            let Some(reason) = confirm(ctx, cloud, &symptom, &id).await? else {
                // The live read saw the node after all. Node health wakes a database once
                // per silence, so a node that falls silent again before its renewal reaches
                // the cache is looked at again here.
                return Ok(Some(
                    Turn::settled(armed(qdb, cloud)).sooner(Some(GONE_POLL)),
                ));
            };
            let next_generation = status.node_generation.unwrap_or(1) + 1;
            let record = FailoverStatus {
                phase: FailoverPhase::Fencing,
                reason: Some(reason),
                started_at: Some(now()),
                phase_started_at: Some(now()),
                old_node: Some(node.clone()).filter(|n| !n.is_empty()),
                old_instance_id: Some(id.clone()),
                message: Some(format!("fencing instance {id}")),
                ..Default::default()
            };
            // Intent first: the replacement's generation and the old instance, before the stop.
            persist(qdb, ctx, |s| {
                s.failover = Some(record.clone());
                s.instance_id = None;
                s.node_generation = Some(next_generation);
            })
            .await?;
            if let Some(u) = unhealthy_for {
                let threshold = cloud
                    .health
                    .threshold(qdb.spec.failover.unhealthy_after_seconds);
                ctx.metrics.failover_detected(u.saturating_sub(threshold));
            }
            let note = start_note(reason, &id, &node, &symptom, cloud);
            warn!(questdb = %qdb.name_any(), "{note}");
            ctx.event(
                qdb,
                EventType::Warning,
                EventReason::FailoverStarted,
                "Failover",
                note,
            )
            .await;
            // The record is this reconcile's step: its watch event brings the fence.
            Ok(Some(Turn::again_within(in_progress(&record), STEP_POLL)))
        }
    }
}

/// What the `FailoverStarted` event and log line say: the symptom and what happens next.
fn start_note(
    reason: FailoverCause,
    id: &str,
    node: &str,
    symptom: &Symptom,
    cloud: &CloudRuntime,
) -> String {
    if reason == FailoverCause::InstanceTerminated {
        format!(
            "EC2 reports instance {id} ({node}) terminated, {}s into its silence: releasing its volume, launching a replacement",
            symptom.for_.as_secs()
        )
    } else if reason == FailoverCause::NodeNeverJoined {
        format!(
            "instance {id} has run past --node-join-timeout ({}s) without a Node registering for it: fencing instance {id}, launching a replacement. {}",
            cloud.settings.node_join_timeout.as_secs(),
            crate::plan::node::NEVER_JOINED_HINT
        )
    } else if symptom.missing {
        format!(
            "the Node object of instance {id} ({node}) has been gone for {}s while the instance runs ({reason}): fencing instance {id}, launching a replacement",
            symptom.for_.as_secs()
        )
    } else {
        format!(
            "node {node} has not renewed its Lease for {}s ({reason}): fencing instance {id}, launching a replacement",
            symptom.for_.as_secs()
        )
    }
}

/// A failover whose replacement died, stopped or never joined would wait for it for ever
/// (and hold back backups, moves and later failovers with it): past the same threshold as
/// any dedicated node, the replacement is fenced and replaced in turn, the failover going
/// back to `Fencing` with the instances fenced so far kept to be terminated at its end.
/// `None`: the replacement is fine (or not judged yet), and the failover's steps go on.
async fn replace_failed_replacement(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
) -> Result<Option<Turn<FailoverReason>>, Error> {
    let (Some(id), Some(record)) = (
        failover::replacement_judged(status).map(str::to_string),
        status.failover.clone(),
    ) else {
        return Ok(None);
    };
    let Some(Judged {
        symptom,
        unhealthy_for,
        ..
    }) = judge(qdb, ctx, cloud, &id).await?
    else {
        return Ok(None);
    };
    let decision =
        failover::replace_again(&start_view(qdb, cloud, status, Some(unhealthy_for), None));
    match decision {
        Start::No => Ok(None),
        Start::Suppressed { reason, message } => {
            let c = suppressed(qdb, ctx, status, reason, message, &id).await;
            Ok(Some(Turn::again_within(c, Duration::from_secs(5))))
        }
        Start::Go => {
            if let Some(held) = database_answers(qdb, ctx, status, &symptom).await {
                return Ok(Some(Turn::again_within(held, DATABASE_ASKED_AGAIN)));
            }
            let Some(cause) = confirm(ctx, cloud, &symptom, &id).await? else {
                return Ok(None);
            };
            let next = failover::next_attempt(&record, cause, &id, &symptom.node, now());
            let next_generation = status.node_generation.unwrap_or(1) + 1;
            // Intent first, as at the start: the next generation and the instance to fence.
            persist(qdb, ctx, |s| {
                s.failover = Some(next.clone());
                s.instance_id = None;
                s.node_generation = Some(next_generation);
            })
            .await?;
            let note = format!(
                "the replacement instance {id} ({}) failed before the failover ended ({cause}, {}s): fencing it and launching another (attempt {} of {})",
                if symptom.node.is_empty() { "no Node" } else { symptom.node.as_str() },
                symptom.for_.as_secs(),
                next.attempt(),
                failover::MAX_ATTEMPTS
            );
            warn!(questdb = %qdb.name_any(), "{note}");
            ctx.event(
                qdb,
                EventType::Warning,
                EventReason::ReplacementFailed,
                "Failover",
                note,
            )
            .await;
            Ok(Some(Turn::again_within(in_progress(&next), STEP_POLL)))
        }
    }
}

/// How long the database has to answer before a fence: QuestDB answers `select 1` in
/// milliseconds; a database that cannot within this is not serving its clients either.
const DATABASE_ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// How soon a database that answered is asked again while its node stays silent.
const DATABASE_ASKED_AGAIN: Duration = Duration::from_secs(5);

/// The database's own word before a due fence ([`failover::heed_the_database`]): the held
/// condition (reported once per change) when it answers on the silent node. Asked only of a
/// silent Lease, the one symptom a kubelet cut off from the API server shows. Not when EC2
/// says the instance is terminated (nothing runs there), nor when the Node object is gone
/// while its instance runs: pod garbage collection force-deletes a missing Node's pods, so
/// Kubernetes itself is about to stop that database at once, and the fence's normal stop is
/// the gentler end (seen: held back because it answered, the database was then killed by its
/// pod's forced deletion).
async fn database_answers(
    qdb: &QuestDB,
    ctx: &Context,
    status: &QuestDBStatus,
    symptom: &Symptom,
) -> Option<Verdict<FailoverReason>> {
    if symptom.terminated || symptom.missing || symptom.node.is_empty() {
        return None;
    }
    let word = ask_the_database(ctx, qdb, &symptom.node).await;
    match failover::heed_the_database(&word, &symptom.node) {
        Start::Suppressed { reason, message } => {
            Some(suppressed(qdb, ctx, status, reason, message, &symptom.node).await)
        }
        Start::No | Start::Go => None,
    }
}

/// Asks the database whose pod runs on `node` one query over its HTTP channel, with its
/// credentials. An answer behind its login (rows, or a refused query) is this database alive;
/// a refused login is not proof that it is this database.
async fn ask_the_database(ctx: &Context, qdb: &QuestDB, node: &str) -> DatabaseWord {
    let mut logins = Logins::new();
    let Some(db) = write_health::connect(ctx, qdb, Some(node), &mut logins).await else {
        return DatabaseWord::Silent;
    };
    match db.exec_within("select 1", DATABASE_ASK_TIMEOUT).await {
        Ok(_) | Err(QueryError::Refused { .. }) => DatabaseWord::Answered {
            at: db.addr().to_string(),
        },
        Err(e) => {
            debug!(questdb = %qdb.name_any(), %node, "the database did not answer before the fence: {e}");
            DatabaseWord::Silent
        }
    }
}

/// A node's symptom as a failover judges it.
struct Judged {
    symptom: Symptom,
    /// How long it counts as unhealthy: EC2's word that the instance is gone counts as the
    /// whole threshold.
    unhealthy_for: Duration,
    /// How soon to ask EC2 again while the silence is under the threshold.
    look_again: Option<Duration>,
}

/// What is wrong with the node of `id`, if anything. Before the threshold, only EC2's word
/// that the instance is gone starts a failover: then the Node still exists to take the
/// out-of-service taint (the cloud controller deletes it once NotReady), so the volume need
/// not wait for the 6-minute force detach.
async fn judge(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    id: &str,
) -> Result<Option<Judged>, Error> {
    let Some(mut symptom) = symptom(qdb, ctx, cloud, id, tokio::time::Instant::now()).await? else {
        return Ok(None);
    };
    let threshold = cloud
        .health
        .threshold(qdb.spec.failover.unhealthy_after_seconds);
    let mut look_again = None;
    if symptom.for_ < threshold {
        symptom.terminated = instance_gone(cloud, id).await;
        if !symptom.terminated {
            look_again = Some(threshold.saturating_sub(symptom.for_).min(GONE_POLL));
        }
    }
    let unhealthy_for = if symptom.terminated {
        symptom.for_.max(threshold)
    } else {
        symptom.for_
    };
    Ok(Some(Judged {
        symptom,
        unhealthy_for,
        look_again,
    }))
}

/// A due fence held back (of `what`: a node, or a replacement instance): the condition, and
/// once per change of it a log line, an event and the suppression counted.
async fn suppressed(
    qdb: &QuestDB,
    ctx: &Context,
    status: &QuestDBStatus,
    reason: crate::api::SuppressionReason,
    message: String,
    what: &str,
) -> Verdict<FailoverReason> {
    let c = condition(
        false,
        FailoverReason::FailoverSuppressed,
        format!("{reason}: {message}"),
    );
    if !already_reported(status, &c) {
        warn!(questdb = %qdb.name_any(), node = %what, %reason, "failover suppressed: {message}");
        ctx.metrics.failover_suppressed(reason.as_str());
        ctx.event(
            qdb,
            EventType::Warning,
            EventReason::FailoverSuppressed,
            "Failover",
            c.message.clone(),
        )
        .await;
    }
    c
}

/// What a fence is decided on, for the node of `status.instanceId` silent `unhealthy_for`:
/// the spec, the skip annotation, the breaker of the database's zone.
fn start_view<'a>(
    qdb: &'a QuestDB,
    cloud: &CloudRuntime,
    status: &'a QuestDBStatus,
    unhealthy_for: Option<Duration>,
    since_last_start: Option<Duration>,
) -> StartView<'a> {
    StartView {
        spec: &qdb.spec.failover,
        skip_annotation: skip_requested(qdb),
        status,
        unhealthy_for,
        lease_duration: cloud.health.min_unhealthy(),
        breaker: cloud.health.breaker_for(zone_of(qdb)),
        since_last_start,
    }
}

/// Whether the QuestDB carries the annotation that turns its failover off.
pub(crate) fn skip_requested(qdb: &QuestDB) -> bool {
    qdb.annotations()
        .get(SKIP_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// Terminates every instance the failover `record` fenced (the earlier attempts' too).
/// `Some(refusal)`: one of them is not this QuestDB's (a forged record), and nothing more is
/// terminated.
async fn terminate_fenced(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    record: &FailoverStatus,
) -> Result<Option<Verdict<FailoverReason>>, Error> {
    let owner = owner_uid(qdb);
    for fenced in record.fenced() {
        match cloud.nodes.terminate(fenced, &owner).await {
            Ok(()) => {}
            Err(e) if super::not_owned(&e) => {
                return Ok(Some(refused(qdb, ctx, status, &e).await));
            }
            Err(e) => return Err(Error::Cloud(e)),
        }
    }
    Ok(None)
}

/// The zone of the database's dedicated node (its volume's): whose breaker holds its fence.
pub(crate) fn zone_of(qdb: &QuestDB) -> Option<&str> {
    qdb.spec.node.as_ref().map(|n| n.zone.as_str())
}

fn armed(qdb: &QuestDB, cloud: &CloudRuntime) -> Verdict<FailoverReason> {
    let (status, reason, message) =
        failover::idle_condition(&qdb.spec.failover, cloud.health.min_unhealthy());
    condition(status, reason, message)
}

/// What looks wrong with the node of a database's instance.
struct Symptom {
    /// The Node's name (empty when a restarted operator never saw the Node of an instance
    /// whose pod is gone too).
    node: String,
    /// How long, on the operator's clock.
    for_: Duration,
    /// The Node object is gone while the instance is there; otherwise its Lease is silent.
    missing: bool,
    /// The shared EC2 snapshot says the instance is terminated or terminating.
    terminated: bool,
}

/// How often a silent node's instance is looked up in the shared EC2 snapshot before the
/// threshold (at most one DescribeInstances per this long, however many databases ask).
const GONE_POLL: Duration = Duration::from_secs(5);

/// Whether the shared EC2 snapshot (at most [`GONE_POLL`] old) says `instance` is gone. An
/// AWS error answers no: the threshold still decides, and a failed reconcile's back-off must
/// not delay a failover that the Lease alone will start.
async fn instance_gone(cloud: &CloudRuntime, instance: &str) -> bool {
    match cloud
        .instances
        .get_within(cloud.nodes.as_ref(), GONE_POLL)
        .await
    {
        Ok(all) => all.iter().any(|i| i.id == instance && i.state.is_gone()),
        Err(e) => {
            debug!(%instance, error = %e, "EC2 snapshot unavailable; the threshold decides");
            false
        }
    }
}

/// The node of `instance` as the caches and the tracker see it: `None` while it renews its
/// Lease. A Node object that disappeared counts from when the operator first missed it, if
/// the operator saw it before or the instance was launched longer ago than a node takes to
/// join (`--node-join-timeout`): a node still joining is not a missing one.
async fn symptom(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    instance: &str,
    now: tokio::time::Instant,
) -> Result<Option<Symptom>, Error> {
    let nodes = ctx.caches.nodes.state();
    if let Some(node) = node_for(&nodes, instance).and_then(|n| n.metadata.name.clone()) {
        cloud.health.node_present(instance, &node);
        return Ok(cloud.health.unhealthy_for(&node, now).map(|for_| Symptom {
            node,
            for_,
            missing: false,
            terminated: false,
        }));
    }
    let launched_long_ago = cloud
        .instances
        .get(cloud.nodes.as_ref())
        .await
        .map_err(Error::Cloud)?
        .iter()
        // A pending instance is still booting (EC2 can take minutes): not one that never
        // joined, whatever its launch time says.
        .find(|i| i.id == instance && i.state == InstanceState::Running)
        .and_then(|i| i.launched_at)
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > cloud.settings.node_join_timeout);
    let Some((known, for_)) = cloud.health.node_missing(instance, launched_long_ago, now) else {
        return Ok(None);
    };
    // The pod may still be bound to the deleted Node (pod GC takes 40 s): its name then.
    let node = known.or_else(|| {
        let ns = qdb.namespace()?;
        let pod = ctx
            .caches
            .pods
            .get(&ObjectRef::new(&names::pod(qdb)).within(&ns))?;
        let bound = pod.node_name.clone()?;
        let gone = !nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(bound.as_str()));
        gone.then_some(bound)
    });
    Ok(Some(Symptom {
        node: node.unwrap_or_default(),
        for_,
        missing: true,
        terminated: false,
    }))
}

/// Live reads before acting: the cache may lag. The Lease must still carry the renewTime the
/// tracker saw (a newer one means the node is alive and the watch is behind); a missing Node
/// must be missing for the apiserver too; EC2's view of the instance names the reason.
/// `None`: not confirmed, do nothing.
async fn confirm(
    ctx: &Context,
    cloud: &CloudRuntime,
    symptom: &Symptom,
    instance: &str,
) -> Result<Option<FailoverCause>, Error> {
    let node = symptom.node.as_str();
    if symptom.missing {
        if !node.is_empty()
            && Api::<Node>::all(ctx.client.clone())
                .get_opt(node)
                .await
                .map_err(Error::Kube)?
                .is_some()
        {
            info!(%node, "the Node is back after all; no failover");
            return Ok(None);
        }
    } else {
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), NODE_LEASE_NAMESPACE);
        let live_renew = leases
            .get_opt(node)
            .await
            .map_err(Error::Kube)?
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0.to_string());
        let seen = cloud.health.last_renew(node);
        if live_renew.is_some() && live_renew != seen {
            info!(%node, "node Lease renewed after all; no failover");
            return Ok(None);
        }
    }
    let state = cloud
        .nodes
        .look_up(instance)
        .await
        .map_err(Error::Cloud)?
        .map(|i| i.state);
    Ok(match state {
        Some(InstanceState::Terminated | InstanceState::ShuttingDown) | None
            if symptom.terminated =>
        {
            Some(FailoverCause::InstanceTerminated)
        }
        // The snapshot was wrong after all (by id, EC2 has it alive): the threshold decides.
        _ if symptom.terminated => None,
        Some(InstanceState::Stopped | InstanceState::Terminated | InstanceState::ShuttingDown)
        | None => Some(FailoverCause::InstanceDown),
        // No Node was ever seen for it, and no pod was bound to one: it never joined (or its
        // Node went before this operator started; either way no kubelet serves it).
        _ if symptom.missing && node.is_empty() => Some(FailoverCause::NodeNeverJoined),
        _ if symptom.missing => Some(FailoverCause::NodeDeleted),
        _ => Some(FailoverCause::NodeLeaseExpired),
    })
}
