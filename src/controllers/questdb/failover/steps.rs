//! The steps of a failover under way: its record read with what EC2 and the caches say now,
//! `plan::failover` deciding the one next step, the step performed once (fence, wait for the
//! volume to let go, force-delete the pod, taint the node out-of-service, finish).

use super::*;

/// The failover under way, for one turn (see [`machine`](super::super::machine)).
pub(super) struct Failover<'a> {
    qdb: &'a mut QuestDB,
    ctx: &'a Context,
    cloud: &'a CloudRuntime,
    status: QuestDBStatus,
    record: FailoverStatus,
}

impl StateMachine for Failover<'_> {
    type Observed = Facts;
    type Step = Step;
    type Outcome = Turn<FailoverReason>;

    async fn observe(&mut self) -> Result<Facts, Error> {
        observe(self.qdb, self.ctx, self.cloud, &self.status, &self.record).await
    }

    fn decide(&self, facts: &Facts) -> Step {
        failover::next_step(&facts.view(&self.record, self.cloud.settings.escalation))
    }

    async fn perform(&mut self, step: Step, _: Facts) -> Result<Turn<FailoverReason>, Error> {
        perform(
            self.qdb,
            self.ctx,
            self.cloud,
            (&self.status, &self.record),
            step,
        )
        .await
    }
}

/// Takes the one step the record and the observed state call for: a transition recorded or
/// one action taken, never both of two steps.
pub(super) async fn steps(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
) -> Result<Turn<FailoverReason>, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let Some(record) = status.failover.clone() else {
        return Ok(Turn::settled(armed(qdb, cloud)));
    };
    turn(&mut Failover {
        qdb,
        ctx,
        cloud,
        status,
        record,
    })
    .await
}

pub(super) async fn perform(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    (status, f): (&QuestDBStatus, &FailoverStatus),
    step: Step,
) -> Result<Turn<FailoverReason>, Error> {
    match step {
        Step::RecordStop(mode) => record_stop(qdb, ctx, cloud, f, mode).await,
        Step::Fence(id, mode) => {
            match cloud.nodes.stop(&id, &owner_uid(qdb), mode).await {
                Ok(()) => {
                    info!(questdb = %qdb.name_any(), instance = %id, %mode, "fencing: stop requested")
                }
                Err(e) if super::super::not_owned(&e) => {
                    let refusal = refused(qdb, ctx, status, &e).await;
                    return Ok(Turn::again_within(refusal, Duration::from_secs(60)));
                }
                Err(CloudError::Throttled { .. } | CloudError::Transient { .. }) => {}
                Err(e) => return Err(Error::Cloud(e)),
            }
            Ok(Turn::again_within(in_progress(f), STEP_POLL))
        }
        Step::Advance(next) => {
            advance(qdb, ctx, f, next).await?;
            let entered = qdb.status.as_ref().and_then(|s| s.failover.clone());
            Ok(Turn::again_within(
                in_progress(entered.as_ref().unwrap_or(f)),
                STEP_POLL,
            ))
        }
        Step::TerminateFenced(old) => {
            match cloud.nodes.terminate(&old, &owner_uid(qdb)).await {
                Ok(()) => {}
                Err(e) if super::super::not_owned(&e) => {
                    let refusal = refused(qdb, ctx, status, &e).await;
                    return Ok(Turn::again_within(refusal, Duration::from_secs(60)));
                }
                Err(CloudError::Throttled { .. } | CloudError::Transient { .. }) => {}
                Err(e) => return Err(Error::Cloud(e)),
            }
            let note = format!(
                "the volume has not detached from fenced instance {old} after {}s: terminating it (EC2 detaches a terminated instance's volumes)",
                cloud.settings.escalation.detach.as_secs()
            );
            warn!(questdb = %qdb.name_any(), "{note}");
            ctx.event(
                qdb,
                EventType::Warning,
                EventReason::FailoverStuck,
                "Failover",
                note,
            )
            .await;
            Ok(Turn::again_within(in_progress(f), STEP_POLL))
        }
        Step::ForceDeletePod => {
            force_delete_pod_on(qdb, ctx, f.old_node.as_deref().unwrap_or_default()).await?;
            Ok(Turn::again_within(in_progress(f), STEP_POLL))
        }
        Step::TaintOutOfService(node) => {
            taint_out_of_service(ctx, &node).await?;
            info!(questdb = %qdb.name_any(), %node, "fenced node tainted out-of-service");
            Ok(Turn::again_within(in_progress(f), STEP_POLL))
        }
        Step::Wait(message) => {
            if f.message.as_deref() != Some(message.as_str()) {
                persist(qdb, ctx, |s| {
                    if let Some(f) = s.failover.as_mut() {
                        f.message = Some(message.clone());
                    }
                })
                .await?;
            }
            let in_step = since(f.phase_started_at.as_ref()).unwrap_or_default();
            let condition = match failover::stuck(f, in_step) {
                Some(c) => {
                    if !already_reported(status, &c) {
                        warn!(questdb = %qdb.name_any(), "{}", c.message);
                        ctx.event(
                            qdb,
                            EventType::Warning,
                            EventReason::FailoverStuck,
                            "Failover",
                            c.message.clone(),
                        )
                        .await;
                    }
                    c
                }
                None => in_progress(f),
            };
            Ok(Turn::again_within(condition, STEP_POLL))
        }
        // The planner's instance is the record's `oldInstanceID`, among those `fenced()` lists.
        Step::Finish(_) => finish(qdb, ctx, cloud, status, f).await,
    }
}

/// Records the stop a fence asks EC2 for before asking (a forced one is a Warning event: what
/// the database did not sync is lost).
pub(super) async fn record_stop(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    f: &FailoverStatus,
    mode: StopMode,
) -> Result<Turn<FailoverReason>, Error> {
    let requested_at = crate::runtime::clock::now();
    super::super::record::persist(qdb, ctx, |s| {
        if let Some(r) = s.failover.as_mut() {
            r.fence_stop = Some(crate::api::FenceStop {
                instance: r.old_instance_id.clone().unwrap_or_default(),
                mode,
                requested_at: requested_at.clone(),
            });
        }
    })
    .await?;
    if mode == StopMode::Forced {
        let note = failover::forced_stop_note(
            f.old_instance_id.as_deref().unwrap_or_default(),
            cloud.settings.escalation.graceful_stop,
        );
        warn!(questdb = %qdb.name_any(), "{note}");
        ctx.event(
            qdb,
            EventType::Warning,
            EventReason::FenceForced,
            "Failover",
            note,
        )
        .await;
    }
    let recorded = qdb.status.as_ref().and_then(|s| s.failover.clone());
    Ok(Turn::again_within(
        in_progress(recorded.as_ref().unwrap_or(f)),
        Duration::ZERO,
    ))
}

/// Ends a failover whose database answers again: the fenced instances terminated, the record
/// `Healthy` with its downtime, the result counted and told.
pub(super) async fn finish(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    f: &FailoverStatus,
) -> Result<Turn<FailoverReason>, Error> {
    if let Some(refusal) = terminate_fenced(qdb, ctx, cloud, status, f).await? {
        return Ok(Turn::again_within(refusal, Duration::from_secs(60)));
    }
    // Downtime ends when the database answered again (Draining began), not when
    // the fenced instance is let go.
    let downtime = between(f.started_at.as_ref(), f.phase_started_at.as_ref());
    if let Some(took) = since(f.phase_started_at.as_ref()) {
        ctx.metrics.failover_step(f.phase.into(), took);
    }
    persist(qdb, ctx, |s| {
        if let Some(f) = s.failover.as_mut() {
            f.phase = FailoverPhase::Healthy;
            f.phase_started_at = Some(now());
            f.finished_at = Some(now());
            f.downtime_seconds = downtime.map(|d| d.as_secs() as i64);
            f.new_instance_id = s.instance_id.clone();
            f.message = Some(format!(
                "fenced instance {} terminated",
                f.fenced().collect::<Vec<_>>().join(", ")
            ));
        }
    })
    .await?;
    ctx.metrics
        .failover_finished(FailoverResult::Succeeded, downtime);
    let note = format!(
        "the database answers again on instance {} after {}s; instance {} terminated",
        qdb.status
            .as_ref()
            .and_then(|s| s.instance_id.clone())
            .unwrap_or_default(),
        downtime.unwrap_or_default().as_secs(),
        f.fenced().collect::<Vec<_>>().join(", ")
    );
    info!(questdb = %qdb.name_any(), "failover done: {note}");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::FailoverSucceeded,
        "Failover",
        note,
    )
    .await;
    Ok(Turn::settled(condition(
        true,
        FailoverReason::Recovered,
        "the last failover succeeded".into(),
    )))
}

pub(super) fn in_progress(f: &FailoverStatus) -> Verdict<FailoverReason> {
    condition(
        true,
        FailoverReason::InProgress,
        format!("{}: {}", f.phase, f.message.clone().unwrap_or_default()),
    )
}

/// [`StepView`] without the failover record.
pub(super) struct Facts {
    old_instance: Option<InstanceState>,
    old_node_exists: bool,
    old_node_tainted: bool,
    old_node_holds_pod: bool,
    old_node_holds_volume: bool,
    pod_running_on_new_node: bool,
    pod_ready: bool,
    dns_follows: bool,
    dns_ttl: Duration,
}

impl Facts {
    fn view<'a>(&self, failover: &'a FailoverStatus, escalation: Escalation) -> StepView<'a> {
        StepView {
            failover,
            old_instance: self.old_instance,
            old_node_exists: self.old_node_exists,
            old_node_tainted: self.old_node_tainted,
            old_node_holds_pod: self.old_node_holds_pod,
            old_node_holds_volume: self.old_node_holds_volume,
            pod_running_on_new_node: self.pod_running_on_new_node,
            pod_ready: self.pod_ready,
            dns_follows: self.dns_follows,
            dns_ttl: self.dns_ttl,
            in_step_for: since(failover.phase_started_at.as_ref()).unwrap_or_default(),
            fence_stop_for: since(failover.fence_stop.as_ref().map(|s| &s.requested_at))
                .unwrap_or_default(),
            escalation,
        }
    }
}

/// What the steps need to know, from the caches, EC2 (fencing only) and the
/// VolumeAttachments (releasing only).
pub(super) async fn observe(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
    f: &FailoverStatus,
) -> Result<Facts, Error> {
    let old_id = f.old_instance_id.clone().unwrap_or_default();
    let old_node = f.old_node.clone().unwrap_or_default();
    let nodes = ctx.caches.nodes.state();
    let old = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(old_node.as_str()));
    let (pod, pod_node) = super::super::placement::database_pod(qdb, ctx);
    let old_instance = if matches!(f.phase, FailoverPhase::Fencing | FailoverPhase::Recovering) {
        // By id: only NotFound proves it gone; a filter that leaves it out would skip the fence.
        cloud
            .nodes
            .look_up(&old_id)
            .await
            .map_err(Error::Cloud)?
            .map(|i| i.state)
    } else {
        None
    };
    let old_node_holds_volume = if f.phase == FailoverPhase::Releasing {
        volume_attached_to(qdb, ctx, &old_node).await?
    } else {
        false
    };
    let new_node = status
        .instance_id
        .as_deref()
        .and_then(|id| node_for(&nodes, id));
    let on_new = new_node.is_some_and(|n| n.metadata.name == pod_node);
    let running = pod
        .as_ref()
        .and_then(|p| p.status.as_ref()?.phase.clone())
        .is_some_and(|p| p == "Running");
    let ready = pod.as_deref().is_some_and(pod_ready);
    let dns_follows = dns_follows(qdb, ctx, cloud, status, new_node);
    Ok(Facts {
        old_instance,
        old_node_exists: old.is_some(),
        old_node_tainted: old.is_some_and(|n| has_out_of_service(n)),
        old_node_holds_pod: pod_node.as_deref() == Some(old_node.as_str()),
        old_node_holds_volume,
        pod_running_on_new_node: on_new && running,
        pod_ready: on_new && ready,
        dns_follows,
        dns_ttl: dns_ttl(qdb),
    })
}

/// Deletes the database pod bound to `node` with no grace period, exactly that pod (uid
/// precondition): only after EC2 reported the node's instance stopped or terminated.
pub(super) async fn force_delete_pod_on(
    qdb: &QuestDB,
    ctx: &Context,
    node: &str,
) -> Result<(), Error> {
    let ns = qdb.namespace().unwrap_or_default();
    let name = names::pod(qdb);
    let Some(pod) = ctx.caches.pods.get(&ObjectRef::new(&name).within(&ns)) else {
        return Ok(());
    };
    if pod.node_name.as_deref() != Some(node) {
        return Ok(());
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .delete(&name, &params)
        .await
    {
        Ok(_) => {
            info!(questdb = %qdb.name_any(), %node, pod = %name, "pod of the fenced node deleted without grace");
            Ok(())
        }
        // Gone already, or replaced by a newer pod (another uid): nothing of the fenced node.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

pub(super) fn has_out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, keeping the node's other taints.
pub(super) async fn taint_out_of_service(ctx: &Context, name: &str) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let Some(live) = api.get_opt(name).await.map_err(Error::Kube)? else {
        return Ok(());
    };
    if has_out_of_service(&live) {
        return Ok(());
    }
    let taint = json!({
        "key": OUT_OF_SERVICE_TAINT,
        "value": OUT_OF_SERVICE_VALUE,
        "effect": OUT_OF_SERVICE_EFFECT,
    });
    patch_node(ctx, &live, taint, None).await?;
    Ok(())
}
