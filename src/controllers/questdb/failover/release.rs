//! A failover meeting a release (pause, deletion, `spec.node` removed): its fence and the old
//! node's release finish first; and a release's own fence of a dead node that holds the pod.

use super::steps::{has_out_of_service, taint_out_of_service};
use super::*;

/// A pause, deletion or removal of `spec.node` during a failover. The fence and the release
/// of the old node finish first, whatever the spec says now: a partitioned old instance that
/// nothing stops keeps serving, and its pod, on a kubelet that no longer answers, never lets
/// the release go on. Once the volume has left the old node the failover ends here: every
/// instance it fenced is terminated and the record says why; the release then lets the
/// replacement go as it would any node, and nothing resumes later with the ids of terminated
/// instances. `Some(what it waits for)` while the fence or the old node's release is under way.
pub(crate) async fn during_release(
    qdb: &mut QuestDB,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let Some(cloud) = ctx.cloud.as_deref() else {
        return Ok(None);
    };
    let status = qdb.status.clone().unwrap_or_default();
    let Some(record) = status
        .failover
        .clone()
        .filter(|_| failover::in_progress(&status))
    else {
        return Ok(None);
    };
    if matches!(
        record.phase,
        FailoverPhase::Fencing | FailoverPhase::Releasing
    ) {
        let turn = steps(qdb, ctx, cloud).await?;
        return Ok(Some(turn.condition.map(|c| c.message).unwrap_or_default()));
    }
    if let Some(refusal) = terminate_fenced(qdb, ctx, cloud, &status, &record).await? {
        return Ok(Some(refusal.message));
    }
    let why = if qdb.metadata.deletion_timestamp.is_some() {
        "the database is being deleted"
    } else if qdb.spec.paused {
        "the database was paused"
    } else {
        "spec.node was removed"
    };
    let terminated = record.fenced().collect::<Vec<_>>().join(", ");
    let note = format!(
        "failover ended in step {}: {why} once the old node had let the volume go; fenced instance {terminated} terminated",
        record.phase
    );
    persist(qdb, ctx, |s| {
        if let Some(f) = s.failover.as_mut() {
            f.phase = FailoverPhase::Healthy;
            f.phase_started_at = Some(now());
            f.finished_at = Some(now());
            f.message = Some(note.clone());
        }
    })
    .await?;
    info!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::FailoverEnded,
        "Failover",
        note,
    )
    .await;
    Ok(None)
}

/// A release (pause, deletion, `spec.node` removed) whose database pod sits on a node that
/// stopped renewing its Lease past the failover threshold: the pod would never go, so the node
/// is fenced and tainted out-of-service as a failover does (see
/// [`failover::release_fence`]). `Some(what it waits for)` while that is under way.
pub(crate) async fn fence_for_release(
    qdb: &mut QuestDB,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let Some(id) = qdb.status.as_ref().and_then(|s| s.instance_id.clone()) else {
        return Ok(None);
    };
    let pod_on_node = super::super::stop_first::pod_on_recorded_node(qdb, &ctx.caches);
    fence_dead_node(qdb, ctx, &id, pod_on_node, "being released", false).await
}

/// The fence of a release, for any instance of the database whose node holds its pod (or
/// volume, `holds`) and has been silent past the failover threshold: stop, then taint
/// out-of-service. `Some(what it waits for)` while that is under way; `None` when nothing
/// needs fencing. `during` says what the database is doing, for the event. `stuck`: the node
/// answers but will not let the pod or volume go; it is fenced as a dead one is, whatever
/// its Lease and the breaker say (a node that answers is no sign of an outage).
pub(crate) async fn fence_dead_node(
    qdb: &mut QuestDB,
    ctx: &Context,
    id: &str,
    holds: bool,
    during: &str,
    stuck: bool,
) -> Result<Option<String>, Error> {
    let Some(cloud) = ctx.cloud.as_ref() else {
        return Ok(None);
    };
    let id = id.to_string();
    let pod_on_node = holds;
    let nodes = ctx.caches.nodes.state();
    let Some(node) = node_for(&nodes, &id) else {
        return Ok(None);
    };
    let name = node.metadata.name.clone().unwrap_or_default();
    let silent_for = cloud
        .health
        .unhealthy_for(&name, tokio::time::Instant::now());
    let threshold = cloud
        .health
        .threshold(qdb.spec.failover.unhealthy_after_seconds);
    let mut view = ReleaseView {
        node: &name,
        instance: &id,
        pod_on_node,
        silent_for: if stuck { Some(threshold) } else { silent_for },
        threshold,
        breaker_open: !stuck && cloud.health.breaker_for(zone_of(qdb)).is_some(),
        instance_state: Some(InstanceState::Running),
        node_tainted: has_out_of_service(node),
        stop: qdb
            .status
            .as_ref()
            .and_then(|s| s.fence_stop.as_ref())
            .filter(|s| s.instance == id)
            .map(|s| (s.mode, since(Some(&s.requested_at)).unwrap_or_default())),
        escalation: cloud.settings.escalation,
    };
    // EC2 is asked only once the caches say the release is stuck on a dead node.
    if failover::release_fence(&view) == ReleaseFence::None {
        return Ok(None);
    }
    view.instance_state = cloud
        .nodes
        .look_up(&id)
        .await
        .map_err(Error::Cloud)?
        .map(|i| i.state);
    let owner = owner_uid(qdb);
    let stop = |instance: String, mode: StopMode| {
        let owner = owner.clone();
        async move {
            match cloud.nodes.stop(&instance, &owner, mode).await {
                Ok(()) | Err(CloudError::Throttled { .. } | CloudError::Transient { .. }) => Ok(()),
                Err(e) => Err(Error::Cloud(e)),
            }
        }
    };
    match failover::release_fence(&view) {
        ReleaseFence::None => Ok(None),
        ReleaseFence::RecordStop(mode) => {
            let requested_at = crate::runtime::clock::now();
            persist(qdb, ctx, |s| {
                s.fence_stop = Some(crate::api::FenceStop {
                    instance: id.clone(),
                    mode,
                    requested_at: requested_at.clone(),
                })
            })
            .await?;
            let why = if stuck {
                format!(
                    "node {name} holds the database's pod or volume while the database is {during}"
                )
            } else {
                format!(
                    "node {name} has not renewed its Lease for {}s while the database is {during}",
                    silent_for.unwrap_or_default().as_secs()
                )
            };
            let (reason, note) = match mode {
                StopMode::Graceful => (
                    EventReason::ReleaseFenced,
                    format!("{why}: stopping instance {id} (normally, so the database flushes what it wrote) so its pod and volume can go"),
                ),
                StopMode::Forced => (
                    EventReason::FenceForced,
                    format!(
                        "{why}: {}",
                        failover::forced_stop_note(&id, cloud.settings.escalation.graceful_stop)
                    ),
                ),
            };
            warn!(questdb = %qdb.name_any(), "{note}");
            ctx.event(qdb, EventType::Warning, reason, "Release", note.clone())
                .await;
            stop(id.clone(), mode).await?;
            Ok(Some(note))
        }
        ReleaseFence::Stop(instance, mode) => {
            stop(instance.clone(), mode).await?;
            Ok(Some(format!("stopping instance {instance} ({mode})")))
        }
        ReleaseFence::Taint(node) => {
            taint_out_of_service(ctx, &node).await?;
            info!(questdb = %qdb.name_any(), %node, "fenced node tainted out-of-service: the database is {during}");
            Ok(Some(format!(
                "node {node} fenced and tainted out-of-service"
            )))
        }
        ReleaseFence::Wait(message) => Ok(Some(message)),
    }
}
