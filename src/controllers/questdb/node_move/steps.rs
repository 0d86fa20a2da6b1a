//! The steps of a node move under way: what they are decided on (the record, EC2, the
//! caches), and each performed once per reconcile.

use super::*;
use crate::controllers::questdb::machine::{turn, StateMachine};

/// What a move step is decided on, beyond the record and the spec: what EC2 and the caches
/// say now.
struct Observed {
    validation: Option<Result<(), String>>,
    /// From the idempotent launch in `Provisioning`.
    new_instance: Option<Instance>,
    launch_error: Option<String>,
    /// The Node of the instance the database leaves.
    old_node: Option<String>,
    /// The new node's labels and pin.
    dedicated: DedicatedNode,
    /// `Retaining`: when the rollback window (and the DNS TTL) ends.
    retain_until: Option<Timestamp>,
    /// `Stopping`: the volume is still attached to the old node.
    volume_on_old_node: bool,
}

/// The move under way, for one turn (see [`machine`](crate::controllers::questdb::machine)).
struct NodeMove<'a> {
    qdb: &'a mut QuestDB,
    ctx: &'a Context,
    cloud: &'a CloudRuntime,
    status: QuestDBStatus,
    record: NodeMoveStatus,
    spec: crate::api::NodeSpec,
}

impl StateMachine for NodeMove<'_> {
    type Observed = Observed;
    type Step = Step;
    type Outcome = Turn<NodeMoveReason>;

    async fn observe(&mut self) -> Result<Observed, Error> {
        let (qdb, ctx, cloud) = (&*self.qdb, self.ctx, self.cloud);
        observe(qdb, ctx, cloud, &self.status, &self.record, &self.spec).await
    }

    fn decide(&self, seen: &Observed) -> Step {
        node_move::next_step(&step_view(self, seen))
    }

    async fn perform(&mut self, step: Step, seen: Observed) -> Result<Turn<NodeMoveReason>, Error> {
        let on = (&self.status, &self.record, &self.spec);
        act(self.qdb, self.ctx, self.cloud, step, on, seen).await
    }
}

/// Takes the one step the record and the observed state call for: a transition recorded, or
/// one action taken (and its outcome recorded).
pub(super) async fn steps(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
) -> Result<Turn<NodeMoveReason>, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let Some(u) = status.node_move.clone() else {
        return Ok(Turn::settled(up_to_date()));
    };
    if !node_move::active(&status) {
        return Ok(Turn::settled(up_to_date()));
    }
    let Some(spec) = qdb.spec.node.clone() else {
        return Ok(Turn::settled(up_to_date()));
    };
    turn(&mut NodeMove {
        qdb,
        ctx,
        cloud,
        status,
        record: u,
        spec,
    })
    .await
}

/// EC2's word on the target (`Validating`), the launch (`Provisioning`), and what the move's
/// steps need of the caches.
async fn observe(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    u: &NodeMoveStatus,
    spec: &crate::api::NodeSpec,
) -> Result<Observed, Error> {
    // What the move launches: its recorded target (a replacement's may be the node the
    // database runs on rather than the spec's).
    let target = node_move::target_spec(u, spec);
    let current = !node_move::superseded(u, spec);
    let validation = if u.phase == NodeMovePhase::Validating && current {
        let facts = cloud
            .nodes
            .node_facts(&target.image, &target.instance_type, &target.zone)
            .await
            .map_err(Error::Cloud)?;
        Some(node_move::check_node(&facts, &target))
    } else {
        None
    };
    let (new_instance, launch_error) = if u.phase == NodeMovePhase::Provisioning && current {
        launch(qdb, cloud, status, &target).await?
    } else {
        (None, None)
    };
    let nodes = ctx.caches.nodes.state();
    let old_node = u
        .old_instance_id
        .as_deref()
        .and_then(|id| node_for(&nodes, id))
        .and_then(|n| n.metadata.name.clone());
    let volume_on_old_node = match (u.phase, old_node.as_deref()) {
        (NodeMovePhase::Stopping, Some(node)) => volume_attached_to(qdb, ctx, node).await?,
        _ => false,
    };
    Ok(Observed {
        volume_on_old_node,
        validation,
        new_instance,
        launch_error,
        old_node,
        dedicated: DedicatedNode {
            instance: u.new_instance_id.clone(),
            ..DedicatedNode::for_questdb(qdb)
        },
        retain_until: (u.phase == NodeMovePhase::Retaining)
            .then(|| node_move::retention_end(u, spec, dns_ttl(qdb)))
            .flatten(),
    })
}

/// The planner's view: the pod, the two nodes and their health, DNS and the clock.
fn step_view<'a>(m: &'a NodeMove<'_>, seen: &'a Observed) -> StepView<'a> {
    let (qdb, ctx, cloud) = (&*m.qdb, m.ctx, m.cloud);
    let (status, u, spec) = (&m.status, &m.record, &m.spec);
    let nodes = ctx.caches.nodes.state();
    let new_id = u.new_instance_id.as_deref();
    let new_node = new_id.and_then(|id| node_for(&nodes, id));
    let old_node = seen.old_node.as_deref();
    let (pod, pod_node) = crate::controllers::questdb::placement::database_pod(qdb, ctx);
    let on_new = new_node.is_some_and(|n| n.metadata.name == pod_node && pod_node.is_some());
    let running = pod
        .as_ref()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .and_then(|p| p.status.as_ref()?.phase.clone())
        .is_some_and(|p| p == "Running");
    StepView {
        node_move: u,
        spec,
        validation: seen.validation.clone(),
        new_instance: seen.new_instance.as_ref(),
        launch_error: seen.launch_error.as_deref(),
        new_node: new_node.and_then(|n| n.metadata.name.clone()),
        new_node_dedicated: match (new_node, new_id) {
            (Some(n), Some(id)) => is_dedicated(n, &seen.dedicated, id),
            _ => false,
        },
        new_node_distrusted: match (new_id, seen.new_instance.as_ref()) {
            (Some(id), Some(instance)) => {
                let claimants = crate::plan::node::claimants(&nodes, id);
                claimants
                    .first()
                    .and_then(|n| crate::plan::node::untrusted(&claimants, n, instance))
            }
            _ => None,
        },
        new_node_ready: new_node.is_some_and(node_is_ready),
        new_node_cordoned: new_node.is_some_and(is_cordoned),
        in_phase_for: since(u.phase_started_at.as_ref()).unwrap_or_default(),
        node_timeout: cloud.settings.node_move_join_timeout,
        move_timeout: cloud.settings.node_move_step_timeout,
        stop_grace: Duration::from_secs(
            crate::desired::termination_grace_seconds(qdb).max(0) as u64
        ),
        pod_on_old_node: old_node.is_some() && pod_node.as_deref() == old_node,
        volume_on_old_node: seen.volume_on_old_node,
        pod_running_on_new_node: on_new && running,
        pod_ready: on_new && pod_ready_on(qdb, ctx, new_id),
        dns_follows: dns_follows(qdb, ctx, cloud, status, new_node),
        retention_over: seen.retain_until.is_none_or(|t| t <= Timestamp::now()),
        dns_ttl_over: since(u.phase_started_at.as_ref()).is_none_or(|d| d >= dns_ttl(qdb)),
        old_node_dead: node_dead(qdb, cloud, old_node),
        old_node_renews: old_node
            .is_some_and(|n| cloud.health.unhealthy_for(n, Instant::now()).is_none()),
        new_node_dead: node_dead(
            qdb,
            cloud,
            new_node.and_then(|n| n.metadata.name.as_deref()),
        ),
        backup_holding_checkpoint: backup_holding_checkpoint(qdb, ctx),
    }
}

/// A backup of `qdb` whose step may hold the database's checkpoint now, from the backup
/// controller's cache (none before that controller runs).
pub(in crate::controllers::questdb) fn backup_holding_checkpoint(
    qdb: &QuestDB,
    ctx: &Context,
) -> Option<String> {
    let ns = qdb.namespace();
    let name = qdb.name_any();
    ctx.backups.get()?.state().iter().find_map(|b| {
        let holds = b.namespace() == ns
            && b.spec.questdb_name == name
            && b.status
                .as_ref()
                .and_then(|s| s.step)
                .is_some_and(|step| step.holds_checkpoint());
        holds.then(|| b.name_any())
    })
}

/// Performs `step`. A step that only records a transition returns through the end, looked
/// at again when its write comes back as a watch event.
async fn act(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    step: Step,
    (status, u, spec): (&QuestDBStatus, &NodeMoveStatus, &crate::api::NodeSpec),
    seen: Observed,
) -> Result<Turn<NodeMoveReason>, Error> {
    match step {
        Step::Launch => {
            let Some(i) = seen.new_instance else {
                return Ok(Turn::again_within(moving(u), STEP_POLL));
            };
            persist(qdb, ctx, |s| {
                if let Some(u) = s.node_move.as_mut() {
                    u.new_instance_id = Some(i.id.clone());
                }
            })
            .await?;
        }
        Step::Dedicate { node, instance } => {
            if let Some(driver) =
                crate::controllers::questdb::node_marks::csi_driver_missing(ctx, &node).await?
            {
                let message =
                    crate::controllers::questdb::node_marks::waiting_for_csi(&node, &driver);
                return waiting_with(qdb, ctx, u, message).await;
            }
            dedicate(ctx, &node, &seen.dedicated, &instance).await?;
            return Ok(Turn::again_within(moving(u), STEP_POLL));
        }
        Step::Uncordon { node } => {
            let target = u.new_instance_id.as_deref().unwrap_or_default();
            if !ec2_says_ours(qdb, cloud, target).await? {
                return waiting_with(
                    qdb,
                    ctx,
                    u,
                    format!("instance {target} is not this QuestDB's in EC2's view: node {node} is not uncordoned"),
                )
                .await;
            }
            set_unschedulable(ctx, &node, false).await?;
            return Ok(Turn::again_within(moving(u), STEP_POLL));
        }
        Step::Advance(next) => advance(qdb, ctx, u, next).await?,
        Step::Switch => switch(qdb, ctx, cloud, u).await?,
        Step::Wait(message) => {
            return wait(qdb, ctx, cloud, u, message, &seen).await;
        }
        Step::Abort { reason, message } => {
            // The database was never stopped: the new instance goes.
            let new = u.new_instance_id.clone();
            return abort(qdb, ctx, cloud, status, new.as_deref(), reason, message)
                .await
                .map(Turn::settled);
        }
        Step::FenceOld => {
            let old = u.old_instance_id.clone().unwrap_or_default();
            let message = crate::controllers::questdb::failover::fence_dead_node(
                qdb,
                ctx,
                &old,
                true,
                "moving to another node",
                false,
            )
            .await?
            .unwrap_or_else(|| format!("waiting for the dead node of instance {old} to be fenced"));
            return waiting_with(qdb, ctx, u, message).await;
        }
        Step::FenceStuck { message } => {
            return fence_stuck(qdb, ctx, u, message).await;
        }
        Step::HandOver { message } => {
            // Nothing of the database is left on the old node (the step says so): its
            // instance goes, and the record ends so a failover starts from a clean one.
            let old = u.old_instance_id.clone();
            return abort(
                qdb,
                ctx,
                cloud,
                status,
                old.as_deref(),
                NodeMoveReason::NodesFailed,
                message,
            )
            .await
            .map(Turn::settled);
        }
        Step::RollBack { reason, message } => roll_back(qdb, ctx, u, reason, message).await?,
        Step::Retain => retain(qdb, ctx, cloud, u, spec, seen.old_node.as_deref()).await?,
        Step::FinishRollback => {
            return finish_rollback(qdb, ctx, cloud, status, u)
                .await
                .map(Turn::settled)
        }
        Step::Release => return release(qdb, ctx, cloud, status, u).await.map(Turn::settled),
        Step::Revert => {
            let record = node_move::revert_record(u, status, &now());
            let note = format!(
                "spec.node set back to {} ({}) within the rollback window: moving back to retained instance {}",
                spec.image,
                spec.instance_type,
                u.old_instance_id.clone().unwrap_or_default()
            );
            persist(qdb, ctx, |s| s.node_move = Some(record.clone())).await?;
            started(qdb, ctx, note).await;
        }
    }
    // A transition was recorded: the next reconcile, woken by its watch event, takes the next
    // step.
    let entered = qdb.status.as_ref().and_then(|s| s.node_move.clone());
    Ok(Turn::again_within(
        moving(entered.as_ref().unwrap_or(u)),
        STEP_POLL,
    ))
}

/// The new node is Ready: the recorded instance becomes the new one, so the pod's pin moves
/// and the StatefulSet controller stops the database gracefully. Downtime starts here.
async fn switch(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    u: &NodeMoveStatus,
) -> Result<(), Error> {
    let (id, image, kind) = (
        u.new_instance_id.clone().unwrap_or_default(),
        u.to_image.clone(),
        u.to_instance_type.clone(),
    );
    // The type the instance has: a launch may have fallen back to one of
    // spec.node.fallbackInstanceTypes. One DescribeInstances per move.
    let launched = cloud
        .nodes
        .describe(std::slice::from_ref(&id))
        .await
        .map_err(Error::Cloud)?;
    let kind = launched
        .iter()
        .find(|i| i.id == id)
        .map(|i| i.instance_type.clone())
        .or(kind);
    step_done(qdb, ctx, u);
    persist(qdb, ctx, |s| {
        s.instance_id = Some(id.clone());
        s.node_image = image.clone();
        s.node_instance_type = kind.clone();
        if let Some(u) = s.node_move.as_mut() {
            u.phase = NodeMovePhase::Stopping;
            u.phase_started_at = Some(now());
            u.stopped_at = Some(now());
            u.message = None;
        }
    })
    .await?;
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::NodeMoveStopping,
        "NodeMove",
        format!("the new node is Ready; stopping the database to move it to instance {id}"),
    )
    .await;
    Ok(())
}

/// A step that waits: its message (and, retaining, the end of the window) recorded once,
/// looked at again when the wait can end.
async fn wait(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    u: &NodeMoveStatus,
    message: String,
    seen: &Observed,
) -> Result<Turn<NodeMoveReason>, Error> {
    let until = seen.retain_until.map(|t| Time(clock::seconds(t)));
    if u.message.as_deref() != Some(message.as_str())
        || (until.is_some() && u.retain_until != until)
    {
        persist(qdb, ctx, |s| {
            if let Some(u) = s.node_move.as_mut() {
                u.message = Some(message.clone());
                if until.is_some() {
                    u.retain_until = until.clone();
                }
            }
        })
        .await?;
    }
    // A retained node that went silent is released once dead, not at the end of its window;
    // nothing else wakes this database for a node it no longer runs on.
    let retained_silent = seen
        .old_node
        .as_deref()
        .is_some_and(|n| cloud.health.unhealthy_for(n, Instant::now()).is_some());
    let poll = match seen.retain_until {
        Some(_) if retained_silent => STEP_POLL,
        Some(t) => Duration::try_from(t.duration_since(Timestamp::now()))
            .unwrap_or_default()
            .clamp(STEP_POLL, Duration::from_secs(300)),
        None => STEP_POLL,
    };
    let condition = if u.phase == NodeMovePhase::Retaining {
        retaining(u)
    } else {
        moving(u)
    };
    Ok(Turn::again_within(condition, poll))
}

/// The old node answers but the database does not stop on it: recorded first (the stopped
/// node falls silent, and the record, not the node, says the fence goes on), then fenced.
async fn fence_stuck(
    qdb: &mut QuestDB,
    ctx: &Context,
    u: &NodeMoveStatus,
    why: String,
) -> Result<Turn<NodeMoveReason>, Error> {
    let old = u.old_instance_id.clone().unwrap_or_default();
    if u.reason != Some(NodeMoveReason::NodeMoveStuck) {
        persist(qdb, ctx, |s| {
            if let Some(u) = s.node_move.as_mut() {
                u.reason = Some(NodeMoveReason::NodeMoveStuck);
                u.message = Some(why.clone());
            }
        })
        .await?;
        warn!(questdb = %qdb.name_any(), "{why}: fencing that node");
        ctx.event(
            qdb,
            EventType::Warning,
            EventReason::NodeMoveStuck,
            "NodeMove",
            format!("{why}: its instance is stopped so the move can go on"),
        )
        .await;
    }
    let doing = crate::controllers::questdb::failover::fence_dead_node(
        qdb,
        ctx,
        &old,
        true,
        "moving to another node",
        true,
    )
    .await?
    .unwrap_or_else(|| format!("waiting for instance {old} to be fenced"));
    let u = qdb
        .status
        .as_ref()
        .and_then(|s| s.node_move.clone())
        .unwrap_or_else(|| u.clone());
    waiting_with(qdb, ctx, &u, format!("{why}: {doing}")).await
}

/// The database answers on its old node again: the failed new instance goes, and the move
/// ends rolled back.
async fn finish_rollback(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    u: &NodeMoveStatus,
) -> Result<Verdict<NodeMoveReason>, Error> {
    if let Some(refusal) = terminate_old(qdb, ctx, cloud, status, u).await? {
        return Ok(refusal);
    }
    step_done(qdb, ctx, u);
    let downtime = since(u.stopped_at.as_ref());
    persist(qdb, ctx, |s| {
        if let Some(u) = s.node_move.as_mut() {
            u.phase = NodeMovePhase::RolledBack;
            u.phase_started_at = Some(now());
            u.finished_at = Some(now());
            u.downtime_seconds = downtime.map(|d| d.as_secs() as i64);
        }
    })
    .await?;
    ctx.metrics
        .node_move_finished(NodeMoveResult::RolledBack, downtime);
    wake_queued(qdb, ctx);
    let note = format!(
        "the database answers on its old node again after {}s of downtime; instance {} terminated ({})",
        downtime.unwrap_or_default().as_secs(),
        u.old_instance_id.clone().unwrap_or_default(),
        u.message.clone().unwrap_or_default()
    );
    warn!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Warning,
        EventReason::NodeMoveRolledBack,
        "NodeMove",
        note,
    )
    .await;
    Ok(condition(
        false,
        u.reason.unwrap_or(NodeMoveReason::RolledBack),
        u.message.clone().unwrap_or_default(),
    ))
}

/// The rollback window is over: the retained old instance goes and the move completes.
async fn release(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    u: &NodeMoveStatus,
) -> Result<Verdict<NodeMoveReason>, Error> {
    if let Some(refusal) = terminate_old(qdb, ctx, cloud, status, u).await? {
        return Ok(refusal);
    }
    cloud.instances.invalidate();
    persist(qdb, ctx, |s| {
        if let Some(u) = s.node_move.as_mut() {
            u.phase = NodeMovePhase::Completed;
            u.phase_started_at = Some(now());
            u.message = None;
        }
    })
    .await?;
    let note = format!(
        "old instance {} terminated (rollback window over)",
        u.old_instance_id.clone().unwrap_or_default()
    );
    info!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::NodeMoveCompleted,
        "NodeMove",
        note,
    )
    .await;
    Ok(up_to_date())
}

/// Terminates the record's old instance (the failed one after a rollback, the retained one
/// after a move); `Some` refusal when it is not this QuestDB's.
async fn terminate_old(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    u: &NodeMoveStatus,
) -> Result<Option<Verdict<NodeMoveReason>>, Error> {
    let Some(old) = u.old_instance_id.as_deref() else {
        return Ok(None);
    };
    match cloud.nodes.terminate(old, &owner_uid(qdb)).await {
        Ok(()) => Ok(None),
        Err(e) => not_owned_or(qdb, ctx, status, e).await.map(Some),
    }
}
