//! Moving a database to a node built from a new image (or of a new instance type): when to
//! start, and the one next step. Pure; `questdb::node_move` performs the steps.
//!
//! The image and type are checked against EC2 first, then the new node is launched, joined,
//! dedicated and Ready **before** the database stops, so anything that goes wrong until then
//! (an unknown image, a node that never joins, the field set back) aborts with the database
//! never touched. Then the recorded instance switches to the new one: the StatefulSet's pin
//! changes, its controller stops the pod gracefully (QuestDB closes its tables within the
//! termination grace period, the kubelet unmounts, the volume detaches), and the pod starts
//! on the new node with the same volume. A failure after the stop (or the field set back then)
//! switches back to the old node, which is still there. After the move the old node is kept,
//! cordoned, for the rollback window: setting the field back within it moves the database back
//! without a launch. Each step is recorded in `status.nodeMove` before its side effect.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::maintenance::{self, WindowState};
use crate::api::{EventReason, NodeMoveReason};
use crate::api::{NodeMovePhase, NodeMoveStatus, NodeSpec, QuestDBStatus, ScheduledEventRecord};
use crate::cloud::{Instance, NodeFacts, ScheduledEvent};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The event reason of entering `phase`.
pub fn step_reason(phase: NodeMovePhase) -> EventReason {
    match phase {
        NodeMovePhase::Validating => EventReason::NodeMoveValidating,
        NodeMovePhase::Provisioning => EventReason::NodeMoveProvisioning,
        NodeMovePhase::NodeReady => EventReason::NodeMoveNodeReady,
        NodeMovePhase::Stopping => EventReason::NodeMoveStopping,
        NodeMovePhase::Moving => EventReason::NodeMoveMoving,
        NodeMovePhase::Verifying => EventReason::NodeMoveVerifying,
        NodeMovePhase::Retaining => EventReason::NodeMoveRetaining,
        NodeMovePhase::Completed => EventReason::NodeMoveCompleted,
        NodeMovePhase::Aborted => EventReason::NodeMoveAborted,
        NodeMovePhase::RolledBack => EventReason::NodeMoveRolledBack,
    }
}

/// The default `spec.node.rollbackWindow`.
/// The steps whose durations `questdb_operator_node_move_step_duration_seconds` records.
pub const STEPS: [NodeMovePhase; 7] = [
    NodeMovePhase::Validating,
    NodeMovePhase::Provisioning,
    NodeMovePhase::NodeReady,
    NodeMovePhase::Stopping,
    NodeMovePhase::Moving,
    NodeMovePhase::Verifying,
    NodeMovePhase::Retaining,
];

pub const DEFAULT_ROLLBACK_WINDOW: Duration = Duration::from_secs(30 * 60);

fn ended(phase: NodeMovePhase) -> bool {
    matches!(
        phase,
        NodeMovePhase::Completed | NodeMovePhase::Aborted | NodeMovePhase::RolledBack
    )
}

/// Whether a move is under way (the database is about to move, moving, or moving back). A
/// retained old node is not a move: the database runs where the spec asks.
pub fn in_progress(status: &QuestDBStatus) -> bool {
    status
        .node_move
        .as_ref()
        .is_some_and(|u| !ended(u.phase) && u.phase != NodeMovePhase::Retaining)
}

/// Whether the steps have work: a move, or a retained old node to release.
pub fn active(status: &QuestDBStatus) -> bool {
    status.node_move.as_ref().is_some_and(|u| !ended(u.phase))
}

/// Before this step the database runs untouched on the old node.
pub fn before_stopping(phase: NodeMovePhase) -> bool {
    matches!(
        phase,
        NodeMovePhase::Validating | NodeMovePhase::Provisioning | NodeMovePhase::NodeReady
    )
}

/// After the switch and until the database answers again, the move owns the database: it
/// fences and leaves a dead node itself (a failover started then would resume the move's
/// record with stale instance ids).
pub fn owns_the_database(status: &QuestDBStatus) -> bool {
    status.node_move.as_ref().is_some_and(|u| {
        matches!(
            u.phase,
            NodeMovePhase::Stopping | NodeMovePhase::Moving | NodeMovePhase::Verifying
        )
    })
}

/// Whether `u` moves to what `spec` asks for.
pub fn targets(u: &NodeMoveStatus, spec: &NodeSpec) -> bool {
    u.to_image.as_deref() == Some(spec.image.as_str())
        && u.to_instance_type.as_deref() == Some(spec.instance_type.as_str())
}

/// The spec moved on from the move's target before the database stopped: the move ends
/// (`Superseded`). Not a replacement, which goes on whatever the spec asks meanwhile: AWS
/// takes the old node anyway, and a new target is a move of its own afterwards.
pub fn superseded(u: &NodeMoveStatus, spec: &NodeSpec) -> bool {
    !targets(u, spec) && !replaces_node(u)
}

/// Whether `spec` asks for the node `u` moves away from. Never for a replacement: its old
/// node is the image and type it moves to, and the one AWS is about to take away.
pub fn reverts(u: &NodeMoveStatus, spec: &NodeSpec) -> bool {
    !replaces_node(u)
        && u.from_image.as_deref() == Some(spec.image.as_str())
        && u.from_instance_type.as_deref() == Some(spec.instance_type.as_str())
}

/// A move for an EC2 scheduled event or a drain to a node of the image and type the database
/// runs on: a new instance of the same node, off the hardware AWS is about to stop or reboot,
/// or off the node someone wants emptied.
pub fn replaces_node(u: &NodeMoveStatus) -> bool {
    (u.scheduled_event.is_some() || u.drained_node.is_some())
        && u.to_image == u.from_image
        && (u.to_instance_type == u.from_instance_type || u.from_instance_type.is_none())
}

/// The node spec the move's steps check and launch: `spec` with the move's recorded image and
/// type (a replacement's may be the node the database runs on, not a target of the spec that
/// failed before).
pub fn target_spec(u: &NodeMoveStatus, spec: &NodeSpec) -> NodeSpec {
    let mut target = spec.clone();
    if let Some(image) = &u.to_image {
        target.image = image.clone();
    }
    if let Some(kind) = &u.to_instance_type {
        target.instance_type = kind.clone();
    }
    target
}

/// How long before an event's start a planned move must have begun: a node's launch and join
/// (up to `--node-move-join-timeout`), the switch, and one failed attempt tried again.
pub const SCHEDULED_EVENT_LEAD: Duration = Duration::from_secs(3600);

/// How long after a replacement for a scheduled event failed it is tried again while the
/// event stands (a capacity shortage passes; a failover at AWS's time is worse than a retry).
pub const SCHEDULED_EVENT_RETRY: Duration = Duration::from_secs(600);

/// `spec.node.rollbackWindow`, or the default (the schema only admits readable values).
pub fn rollback_window(spec: &NodeSpec) -> Duration {
    spec.rollback_window
        .as_deref()
        .and_then(|w| crate::duration::parse_duration(w).ok())
        .unwrap_or(DEFAULT_ROLLBACK_WINDOW)
}

/// When a retained old node goes: the window of the spec as it is now (a user may shorten it
/// to release the node early) from the start of `Retaining`, but never before the DNS record's
/// TTL has passed (resolvers may still send clients to the old address, and a terminated
/// instance's address can go to another instance at once). A replacement's old node is kept
/// for the TTL alone: there is no rolling back to the node AWS or a drain takes.
pub fn retention_end(u: &NodeMoveStatus, spec: &NodeSpec, dns_ttl: Duration) -> Option<Timestamp> {
    let since = u.phase_started_at.as_ref()?.0;
    let kept = if replaces_node(u) {
        dns_ttl
    } else {
        rollback_window(spec).max(dns_ttl)
    };
    let window = k8s_openapi::jiff::SignedDuration::try_from(kept).ok()?;
    since.checked_add(window).ok()
}

/// What decides whether to start: status alone (a converged QuestDB costs no AWS call).
pub struct StartView<'a> {
    pub spec: &'a NodeSpec,
    pub status: &'a QuestDBStatus,
    /// The database is Ready (an upgrade never starts from a broken state).
    pub database_ready: bool,
    pub failover_in_progress: bool,
    pub now: Timestamp,
    /// Moves of other QuestDBs under way, and how many may run at once.
    pub moves_elsewhere: usize,
    pub concurrency: usize,
    /// Of those, the ones in this QuestDB's namespace, and how many may run at once there.
    pub moves_in_namespace: usize,
    pub namespace_concurrency: usize,
    /// EC2's pending scheduled event of the database's instance, if any.
    pub scheduled_event: Option<&'a ScheduledEvent>,
    /// The database's node, when someone cordoned it (a drain): it is to be emptied now.
    pub cordoned_node: Option<&'a str>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Start {
    No,
    /// The node differs from the spec, but the move waits (the reason is for a condition) and
    /// is looked at again within `retry`.
    Waiting {
        why: String,
        retry: Duration,
    },
    /// Start with this record.
    Go(Box<NodeMoveStatus>),
}

/// Whether the recorded instance differs from what the spec asks for (an instance type not
/// recorded, by an earlier operator version, is not a difference; nor is a fallback type the
/// spec allows, or the database would be moved off it at once).
pub fn differs(spec: &NodeSpec, status: &QuestDBStatus) -> bool {
    let image = status
        .node_image
        .as_deref()
        .is_some_and(|i| i != spec.image);
    let kind = status.node_instance_type.as_deref().is_some_and(|t| {
        t != spec.instance_type && !spec.fallback_instance_types.iter().any(|f| f == t)
    });
    image || kind
}

/// The event of `v`'s instance (an event of another instance, one the database left, is not
/// this node's).
fn event_of<'a>(v: &StartView<'a>) -> Option<&'a ScheduledEvent> {
    v.scheduled_event
        .filter(|e| v.status.instance_id.as_deref() == Some(e.instance_id.as_str()))
}

/// The spec's target failed before: not retried in a loop; a new edit (another target) is. A
/// move a failover pre-empted is not a failure of the target: it starts again.
fn failed_same(v: &StartView) -> bool {
    v.status.node_move.as_ref().is_some_and(|u| {
        matches!(u.phase, NodeMovePhase::Aborted | NodeMovePhase::RolledBack)
            && targets(u, v.spec)
            && u.reason != Some(NodeMoveReason::Preempted)
    })
}

/// How long from `now` to `at`, looked at again at least every second and at most every `max`.
fn until(at: Timestamp, now: Timestamp, max: Duration) -> Duration {
    Duration::try_from(at.duration_since(now))
        .unwrap_or_default()
        .clamp(Duration::from_secs(1), max)
}

/// When the event may start, as a timestamp.
fn event_start(e: &ScheduledEvent) -> Option<Timestamp> {
    e.not_before.and_then(|t| Timestamp::try_from(t).ok())
}

pub fn should_start(v: &StartView) -> Start {
    let event = event_of(v);
    if v.status.instance_id.is_none()
        || active(v.status)
        || (!differs(v.spec, v.status) && event.is_none() && v.cordoned_node.is_none())
    {
        return Start::No;
    }
    let waiting = |why: String, retry| Start::Waiting { why, retry };
    if failed_same(v) {
        if event.is_none() && v.cordoned_node.is_none() {
            return Start::No;
        }
        // A replacement for this very event (or drain) that failed is tried again after a
        // while: AWS acts whatever happens, and an unplanned failover then is the worse
        // outcome; a drain waits until the node is empty.
        let last = v.status.node_move.as_ref();
        let same_cause = last.is_some_and(|u| {
            let same_event = match (&u.scheduled_event, event) {
                (Some(r), Some(e)) => r.event_id == e.id && r.instance_id == e.instance_id,
                _ => false,
            };
            let same_drain =
                u.drained_node.is_some() && u.drained_node.as_deref() == v.cordoned_node;
            same_event || same_drain
        });
        if same_cause {
            let ended = last
                .and_then(|u| u.finished_at.as_ref())
                .map(|t| t.0)
                .unwrap_or(v.now);
            let again = ended
                .checked_add(SignedDuration::try_from(SCHEDULED_EVENT_RETRY).unwrap_or_default())
                .unwrap_or(ended);
            if again > v.now {
                let cause = match (event, v.cordoned_node) {
                    (Some(e), _) => format!("EC2's {}", e.code),
                    (None, Some(node)) => format!("the drain of node {node}"),
                    (None, None) => String::new(),
                };
                return waiting(
                    format!(
                        "the replacement of the node for {cause} failed ({}); tried again at {again}",
                        last.and_then(|u| u.message.clone()).unwrap_or_default()
                    ),
                    until(again, v.now, SCHEDULED_EVENT_RETRY),
                );
            }
        }
    }
    if v.failover_in_progress {
        return waiting("a failover is under way".into(), Duration::from_secs(10));
    }
    if !v.database_ready {
        return waiting(
            "the database is not Ready; a move starts from a healthy database only".into(),
            Duration::from_secs(10),
        );
    }
    // The latest a move may start before the event: AWS's time is not negotiable, the window
    // is. Without a start time the event is taken as due now.
    let latest = event.map(|e| {
        event_start(e)
            .unwrap_or(v.now)
            .checked_sub(SignedDuration::try_from(SCHEDULED_EVENT_LEAD).unwrap_or_default())
            .unwrap_or(v.now)
    });
    // A drain asks for the node now: whoever drains (a human, the Node Termination Handler)
    // waits for it, and the maintenance window is not theirs.
    let window = v
        .spec
        .maintenance_window
        .as_ref()
        .filter(|_| v.cordoned_node.is_none());
    if let Some(w) = window {
        match (maintenance::state(w, v.now), latest, event) {
            (Ok(WindowState::Open), _, _) => {}
            (Ok(WindowState::OpensAt(at)), Some(latest), Some(e)) if at <= latest => {
                return waiting(
                    format!(
                        "{}: the node is replaced in the maintenance window opening at {at}",
                        describe_event(e)
                    ),
                    until(at, v.now, Duration::from_secs(3600)),
                );
            }
            // The window opens too late for the event (or cannot be read): the move starts
            // now, before AWS acts.
            (_, Some(_), Some(_)) => {}
            (Ok(WindowState::OpensAt(at)), _, _) => {
                return waiting(
                    format!("outside the maintenance window; the move starts at {at}"),
                    until(at, v.now, Duration::from_secs(3600)),
                );
            }
            (Err(e), _, _) => return waiting(e, Duration::from_secs(3600)),
        }
    }
    if v.moves_in_namespace >= v.namespace_concurrency {
        return waiting(
            format!(
                "{} other node move(s) of this namespace under way; at most {} at once per namespace (--node-move-concurrency-per-namespace)",
                v.moves_in_namespace, v.namespace_concurrency
            ),
            Duration::from_secs(10),
        );
    }
    if v.moves_elsewhere >= v.concurrency {
        return waiting(
            format!(
                "{} other node move(s) under way; at most {} at once (--node-move-concurrency)",
                v.moves_elsewhere, v.concurrency
            ),
            Duration::from_secs(10),
        );
    }
    Start::Go(Box::new(start_record(v, &Time(v.now))))
}

/// A line naming an event for the condition and the move's record.
pub fn describe_event(e: &ScheduledEvent) -> String {
    let when = event_start(e)
        .map(|t| format!(" not before {t}"))
        .unwrap_or_default();
    format!(
        "EC2 scheduled {} of instance {}{when}",
        e.code, e.instance_id
    )
}

/// The record a move starts with: to the spec's node, or, for a scheduled event or a drain
/// when the spec asks for nothing new or its target failed before, a new instance of the node
/// the database runs on (the last one that worked).
pub fn start_record(v: &StartView, now: &Time) -> NodeMoveStatus {
    let event = event_of(v);
    let to_spec = differs(v.spec, v.status) && !failed_same(v);
    let (to_image, to_instance_type) = if to_spec {
        (
            Some(v.spec.image.clone()),
            Some(v.spec.instance_type.clone()),
        )
    } else {
        (
            v.status
                .node_image
                .clone()
                .or_else(|| Some(v.spec.image.clone())),
            v.status
                .node_instance_type
                .clone()
                .or_else(|| Some(v.spec.instance_type.clone())),
        )
    };
    NodeMoveStatus {
        phase: NodeMovePhase::Validating,
        from_image: v.status.node_image.clone(),
        to_image,
        from_instance_type: v.status.node_instance_type.clone(),
        to_instance_type,
        old_instance_id: v.status.instance_id.clone(),
        started_at: Some(now.clone()),
        phase_started_at: Some(now.clone()),
        scheduled_event: event.map(|e| ScheduledEventRecord {
            code: e.code.clone(),
            event_id: e.id.clone(),
            instance_id: e.instance_id.clone(),
            not_before: event_start(e).map(Time),
        }),
        drained_node: v.cordoned_node.map(str::to_string),
        ..Default::default()
    }
}

/// Whether the new node fits: the image exists, is available, boots from EBS and is built for
/// an architecture of the type; the type exists and is offered in the volume's zone.
pub fn check_node(facts: &NodeFacts, spec: &NodeSpec) -> Result<(), String> {
    let Some(image) = &facts.image else {
        return Err(format!(
            "image {} does not exist (DescribeImages)",
            spec.image
        ));
    };
    if image.state != "available" {
        return Err(format!(
            "image {} is {}, not available",
            image.id, image.state
        ));
    }
    if image.root_device_type != "ebs" {
        return Err(format!(
            "image {} boots from {}; a dedicated node needs an EBS-backed image",
            image.id, image.root_device_type
        ));
    }
    let Some(kind) = &facts.instance_type else {
        return Err(format!(
            "instance type {} does not exist (DescribeInstanceTypes)",
            spec.instance_type
        ));
    };
    if !kind.offered_in_zone {
        return Err(format!(
            "instance type {} is not offered in {}",
            kind.name, spec.zone
        ));
    }
    if !kind.architectures.contains(&image.architecture) {
        return Err(format!(
            "image {} is built for {}, instance type {} runs {}",
            image.id,
            image.architecture,
            kind.name,
            kind.architectures.join("/")
        ));
    }
    Ok(())
}

/// What the steps look at.
pub struct StepView<'a> {
    pub node_move: &'a NodeMoveStatus,
    pub spec: &'a NodeSpec,
    /// EC2's verdict on the target image and type (`Validating` only).
    pub validation: Option<Result<(), String>>,
    /// The new instance (from an idempotent launch in `Provisioning`, else EC2's cache).
    pub new_instance: Option<&'a Instance>,
    /// A permanent launch error (unknown image, unsupported type, no capacity).
    pub launch_error: Option<&'a str>,
    /// The new instance's Node: registered, dedicated (labels, taint, pin), Ready.
    pub new_node: Option<String>,
    pub new_node_dedicated: bool,
    /// Why the Nodes that claim the new instance are not trusted with the database (two claim
    /// it, or its name is not the instance's private DNS name), as at first provisioning: a
    /// kubelet sets its own providerID, so a compromised node could claim the move's target.
    pub new_node_distrusted: Option<String>,
    pub new_node_ready: bool,
    /// Cordoned (a retained node the database moves back to).
    pub new_node_cordoned: bool,
    /// How long the current phase has run.
    pub in_phase_for: Duration,
    /// How long the new node may take to join and become Ready.
    pub node_timeout: Duration,
    /// How long each step after the stop may take before the database goes back.
    pub move_timeout: Duration,
    /// The pod's termination grace period: the stop may take all of it (a large flush, or a
    /// process that ignores SIGTERM until the kubelet kills it).
    pub stop_grace: Duration,
    pub pod_on_old_node: bool,
    pub volume_on_old_node: bool,
    pub pod_running_on_new_node: bool,
    pub pod_ready: bool,
    pub dns_follows: bool,
    /// `Retaining`: the rollback window (and the DNS TTL) has passed.
    pub retention_over: bool,
    /// `Retaining`: the DNS record's TTL has passed since the switch.
    pub dns_ttl_over: bool,
    /// The node the database leaves (`old_instance_id`'s) has been silent past the failover
    /// threshold, with failover enabled and the breaker closed: it is fenced, never returned to.
    pub old_node_dead: bool,
    /// Likewise for the node the database moves to (`new_instance_id`'s).
    pub new_node_dead: bool,
    /// The node the database leaves renews its Lease: it answers. Only such a node is fenced
    /// for a stop that does not end; a silent one is the dead-node rule's, breaker included.
    pub old_node_renews: bool,
    /// A backup of this database that holds its checkpoint now (`Checkpointing`,
    /// `Snapshotting`, `Releasing`): the switch stops the database, which would lose the
    /// checkpoint and fail the backup, so the switch waits for it. A backup `Uploading` no
    /// longer needs the database (its snapshot is cut): it holds nothing back.
    pub backup_holding_checkpoint: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Launch (or find) the new instance and record its id.
    Launch,
    Dedicate {
        node: String,
        instance: String,
    },
    /// A retained node the database moves back to takes pods again.
    Uncordon {
        node: String,
    },
    Advance(NodeMovePhase),
    /// Record the new instance as the database's: downtime starts.
    Switch,
    Wait(String),
    /// Terminate the new instance (if any); the database stays where it is.
    Abort {
        reason: NodeMoveReason,
        message: String,
    },
    /// The database stopped but does not answer on the new node (or the field was set
    /// back): record the old instance as the database's again.
    RollBack {
        reason: NodeMoveReason,
        message: String,
    },
    /// The database answers on the new node: cordon the old one and keep it.
    Retain,
    /// The database answers on the old node again: terminate the new one.
    FinishRollback,
    /// The rollback window is over (or the spec moved on): terminate the old node.
    Release,
    /// The spec asks for the retained node again: move back without a launch.
    Revert,
    /// The node the database leaves is dead while the pod or volume is still there: stop its
    /// instance and taint it out-of-service, as a failover fences (a silent kubelet never
    /// confirms the pod's end).
    FenceOld,
    /// The node the database leaves still answers but has held its pod or volume past the
    /// grace period and the step timeout (an unmount that fails, a process that will not
    /// die): going back is no way out (the pod cannot leave for either node), so its instance
    /// is stopped and tainted as a dead node's is, and the move goes on.
    FenceStuck {
        message: String,
    },
    /// Both nodes are dead and nothing of the database is left on the old one: terminate the
    /// old instance, end the move, and let a failover replace the new one.
    HandOver {
        message: String,
    },
}

pub fn next_step(v: &StepView) -> Step {
    let u = v.node_move;
    if let Some(step) = interrupted(v) {
        return step;
    }
    let abort = |reason, message: String| Step::Abort { reason, message };
    let leaves_old = v.pod_on_old_node || v.volume_on_old_node;
    match u.phase {
        NodeMovePhase::Validating => match &v.validation {
            Some(Ok(())) => Step::Advance(NodeMovePhase::Provisioning),
            Some(Err(e)) => abort(NodeMoveReason::InvalidNode, e.clone()),
            None => Step::Wait("checking the image and instance type".into()),
        },
        NodeMovePhase::Provisioning => provisioning(v),
        NodeMovePhase::NodeReady => match &v.new_node {
            Some(node) if v.new_node_cordoned => Step::Uncordon { node: node.clone() },
            Some(_) if v.new_node_ready => match &v.backup_holding_checkpoint {
                // No timeout of its own: the backup's steps have theirs, and the database
                // runs on where it is meanwhile.
                Some(backup) => Step::Wait(format!(
                    "the switch waits for backup {backup}, which holds the database's checkpoint: stopping the database now would fail it"
                )),
                None => Step::Switch,
            },
            _ if v.in_phase_for > v.node_timeout => abort(
                NodeMoveReason::NodeNeverReady,
                format!(
                    "node {} did not become Ready within {}s",
                    v.new_node.clone().unwrap_or_default(),
                    v.node_timeout.as_secs()
                ),
            ),
            _ => Step::Wait("waiting for the new node to become Ready".into()),
        },
        NodeMovePhase::Stopping => stopping(v, leaves_old),
        NodeMovePhase::Moving => {
            if v.pod_running_on_new_node {
                Step::Advance(NodeMovePhase::Verifying)
            } else {
                timed_out(v, "the database did not start on the new node", v.move_timeout)
                    .unwrap_or_else(|| Step::Wait("the database starts on the new node".into()))
            }
        }
        NodeMovePhase::Verifying => {
            if v.pod_ready && v.dns_follows {
                if u.rolling_back {
                    Step::FinishRollback
                } else {
                    Step::Retain
                }
            } else {
                timed_out(
                    v,
                    "the database did not become Ready on the new node",
                    v.move_timeout,
                )
                .unwrap_or_else(|| {
                    Step::Wait("waiting for the database to answer on the new node".into())
                })
            }
        }
        NodeMovePhase::Retaining => {
            if reverts(u, v.spec) && !v.old_node_dead {
                Step::Revert
            } else if v.retention_over
                || ((!targets(u, v.spec) || v.old_node_dead || replaces_node(u)) && v.dns_ttl_over)
            {
                Step::Release
            } else if v.old_node_dead {
                Step::Wait(format!(
                    "old instance {} stopped answering: no rollback to it; released once resolvers dropped its address (DNS TTL)",
                    u.old_instance_id.clone().unwrap_or_default()
                ))
            } else if replaces_node(u) {
                Step::Wait(format!(
                    "old instance {} kept, cordoned, until resolvers dropped its address (DNS TTL, until retainUntil); no rollback to a replaced node",
                    u.old_instance_id.clone().unwrap_or_default()
                ))
            } else {
                Step::Wait(format!(
                    "old instance {} kept, cordoned, for a rollback (until retainUntil)",
                    u.old_instance_id.clone().unwrap_or_default()
                ))
            }
        }
        NodeMovePhase::Completed | NodeMovePhase::Aborted | NodeMovePhase::RolledBack => {
            Step::Wait(String::new())
        }
    }
}

/// `Provisioning`: the new node is launched and joins, dedicated to the database, or the move
/// is aborted (a launch refused, a node that never joins).
fn provisioning(v: &StepView) -> Step {
    let u = v.node_move;
    let abort = |reason, message: String| Step::Abort { reason, message };
    if let Some(e) = v.launch_error {
        return abort(NodeMoveReason::LaunchFailed, e.to_string());
    }
    let Some(i) = v.new_instance else {
        return Step::Launch;
    };
    if u.new_instance_id.as_deref() != Some(i.id.as_str()) {
        return Step::Launch;
    }
    if i.state.is_gone() {
        return abort(
            NodeMoveReason::InstanceGone,
            format!(
                "new instance {} ended before it joined ({})",
                i.id,
                i.state_reason
                    .clone()
                    .unwrap_or_else(|| i.state.as_str().into())
            ),
        );
    }
    match (&v.new_node, v.new_node_dedicated) {
        (_, false) if v.new_node_distrusted.is_some() => {
            let why = v.new_node_distrusted.clone().unwrap_or_default();
            if v.in_phase_for > v.node_timeout {
                abort(NodeMoveReason::NodeNeverJoined, why)
            } else {
                Step::Wait(why)
            }
        }
        (Some(node), false) => Step::Dedicate {
            node: node.clone(),
            instance: i.id.clone(),
        },
        (Some(_), true) => Step::Advance(NodeMovePhase::NodeReady),
        (None, _) if v.in_phase_for > v.node_timeout => abort(
            NodeMoveReason::NodeNeverJoined,
            format!(
                "instance {} did not join the cluster within {}s",
                i.id,
                v.node_timeout.as_secs()
            ),
        ),
        (None, _) => Step::Wait(format!("waiting for instance {} to join", i.id)),
    }
}

/// What ends or turns a move whatever its phase: a spec edit that supersedes a move that has
/// not stopped the database, one that sets the node back after the stop, a new node that dies
/// after the switch.
fn interrupted(v: &StepView) -> Option<Step> {
    let u = v.node_move;
    if before_stopping(u.phase) && superseded(u, v.spec) {
        return Some(Step::Abort {
            reason: NodeMoveReason::Superseded,
            message: format!(
                "spec.node changed to {} ({}) while moving to {} ({}); the database stays on its node",
                v.spec.image,
                v.spec.instance_type,
                u.to_image.clone().unwrap_or_default(),
                u.to_instance_type.clone().unwrap_or_default()
            ),
        });
    }
    let after_stop = matches!(
        u.phase,
        NodeMovePhase::Stopping | NodeMovePhase::Moving | NodeMovePhase::Verifying
    );
    if after_stop && !u.rolling_back && reverts(u, v.spec) {
        return Some(Step::RollBack {
            reason: NodeMoveReason::Reverted,
            message: format!(
                "spec.node set back to {} ({}); the database returns to instance {}",
                v.spec.image,
                v.spec.instance_type,
                u.old_instance_id.clone().unwrap_or_default()
            ),
        });
    }
    let leaves_old = v.pod_on_old_node || v.volume_on_old_node;
    if after_stop && v.new_node_dead {
        let target = u.new_instance_id.clone().unwrap_or_default();
        if !u.rolling_back && !v.old_node_dead {
            return Some(Step::RollBack {
                reason: NodeMoveReason::TargetNodeFailed,
                message: format!(
                    "the node of instance {target} stopped renewing its Lease after the switch; the database returns to instance {}",
                    u.old_instance_id.clone().unwrap_or_default()
                ),
            });
        }
        if !leaves_old {
            return Some(Step::HandOver {
                message: format!(
                    "the nodes of instances {target} and {} both stopped answering after the switch; a failover replaces the node of instance {target}",
                    u.old_instance_id.clone().unwrap_or_default()
                ),
            });
        }
    }
    None
}

/// A step after the stop that takes too long sends the database back (once: a move back
/// that also stalls waits, with the reason in the record, for a human), never to a dead node.
fn timed_out(v: &StepView, what: &str, limit: Duration) -> Option<Step> {
    let u = v.node_move;
    if v.in_phase_for <= limit {
        return None;
    }
    if !u.rolling_back && v.old_node_dead {
        return Some(Step::Wait(format!(
                "{what} for {}s, and the node of instance {} is dead, so there is nothing to go back to; needs attention",
                v.in_phase_for.as_secs(),
                u.old_instance_id.clone().unwrap_or_default()
            )));
    }
    if u.rolling_back {
        return Some(Step::Wait(format!(
            "moving back: {what} for {}s; needs attention",
            v.in_phase_for.as_secs()
        )));
    }
    Some(Step::RollBack {
        reason: NodeMoveReason::MoveFailed,
        message: format!(
            "{what} within {}s; the database returns to instance {}",
            limit.as_secs(),
            u.old_instance_id.clone().unwrap_or_default()
        ),
    })
}

/// `Stopping`: the database stops on the old node and its volume detaches; a node that dies
/// or will not let go is fenced.
fn stopping(v: &StepView, leaves_old: bool) -> Step {
    let u = v.node_move;
    if leaves_old && v.old_node_dead {
        Step::FenceOld
    } else if leaves_old {
        // The database is never cut off in the middle of the stop it was granted: the
        // step's time starts after the grace period.
        let limit = v.stop_grace + v.move_timeout;
        // Once begun, the fence goes on: the stopped node falls silent.
        let fencing = u.reason == Some(NodeMoveReason::NodeMoveStuck);
        if fencing || (v.in_phase_for > limit && v.old_node_renews) {
            Step::FenceStuck {
                message: format!(
                    "the database did not stop and release its volume on instance {} within {}s (its {}s grace period and the {}s step timeout)",
                    u.old_instance_id.clone().unwrap_or_default(),
                    limit.as_secs(),
                    v.stop_grace.as_secs(),
                    v.move_timeout.as_secs()
                ),
            }
        } else if v.in_phase_for > limit {
            // Silent but not judged dead (the breaker holds, or failover is off): the
            // database may still run there, so nothing is fenced.
            timed_out(v, "the database did not stop and release its volume", limit)
                .unwrap_or_else(|| Step::Wait("the old node is silent".into()))
        } else {
            Step::Wait(format!(
                "the database stops on the old node (within its {}s grace period) and its volume detaches",
                v.stop_grace.as_secs()
            ))
        }
    } else {
        Step::Advance(NodeMovePhase::Moving)
    }
}

/// The record of a move back to the retained node of `u` (no launch, no validation: the node
/// ran the database minutes ago). `current` is the node the database leaves.
pub fn revert_record(u: &NodeMoveStatus, status: &QuestDBStatus, now: &Time) -> NodeMoveStatus {
    NodeMoveStatus {
        phase: NodeMovePhase::NodeReady,
        from_image: status.node_image.clone(),
        to_image: u.from_image.clone(),
        from_instance_type: status.node_instance_type.clone(),
        to_instance_type: u.from_instance_type.clone(),
        old_instance_id: status.instance_id.clone(),
        new_instance_id: u.old_instance_id.clone(),
        started_at: Some(now.clone()),
        phase_started_at: Some(now.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "node_move_tests.rs"]
mod tests;
