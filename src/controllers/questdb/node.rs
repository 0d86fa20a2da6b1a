//! The dedicated node's machine, the first of the cloud state machines (the executor of
//! `plan::node`, same name on both sides): launches the dedicated instance, records it,
//! dedicates its Node, replaces it when it goes, and releases it. One step per reconcile (see
//! [`machine`](super::machine)).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use tracing::{info, warn};

use super::machine::{turn, StateMachine};
use super::node_marks::dedicate;
use super::outcome::Turn;
use super::owner_uid;
use super::record::{already_reported, persist};
use crate::api::{conditions, QuestDB, QuestDBStatus};
use crate::api::{EventReason, NodeReadyReason};
use crate::cloud::CloudError;
use crate::cloud::{desired_instance_tags, Instance, InstanceState};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::cloud_runtime::LaunchFailure;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::DedicatedNode;
use crate::plan::conditions::Verdict;
use crate::plan::node::launch_request;
use crate::plan::node::{self, NodeStep, NodeView, PERMANENT_FAILURE_RETRY};

/// How fresh instance data must be while a node is launching or being released.
pub(crate) const WAITING_SYNC: Duration = Duration::from_secs(2);
/// How soon a reconcile that took a node step looks again if no watch event of its own write
/// wakes it first (a launch or a terminate writes nothing the watch sees).
const AFTER_A_STEP: Duration = Duration::from_secs(1);

/// What the dedicated node's turn saw beyond its condition, which the DNS step and the status
/// read.
#[derive(Default, Debug)]
pub(super) struct NodeFacts {
    /// The dedicated Node, once registered.
    pub node: Option<Arc<Node>>,
    /// No instance is left for this QuestDB.
    pub released: bool,
    /// The instance DNS may name.
    pub instance: Option<Instance>,
}

/// The dedicated node's turn.
pub(super) type NodeOutcome = Turn<NodeReadyReason, NodeFacts>;

/// Takes the one node step the plan calls for and returns; the next reconcile (woken by the
/// watch event of this one's write, or by its requeue) takes the next.
pub(super) async fn node_steps(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    dedicated: &DedicatedNode,
    release: bool,
) -> Result<NodeOutcome, Error> {
    let uid = qdb.uid().ok_or(Error::MissingUid)?;
    turn(&mut NodeMachine {
        qdb,
        ctx,
        cloud,
        dedicated,
        uid,
        release,
        turn: NodeOutcome::default(),
        learnt: Vec::new(),
    })
    .await
}

/// What a node step is decided on.
struct Observed {
    status: QuestDBStatus,
    /// EC2's snapshot, with what this turn learnt beyond it (a look-up by id).
    instances: Vec<Instance>,
    failure: Option<LaunchFailure>,
    nodes: Vec<Arc<Node>>,
}

impl StateMachine for NodeMachine<'_> {
    type Observed = Observed;
    type Step = NodeStep;
    type Outcome = NodeOutcome;

    async fn observe(&mut self) -> Result<Observed, Error> {
        let status = self.qdb.status.clone().unwrap_or_default();
        let settled = status.instance_id.is_some()
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == conditions::NODE_READY && c.status == "True");
        let max_age = if settled && !self.release {
            self.cloud.settings.instance_sync_interval
        } else {
            WAITING_SYNC
        };
        let cached = self
            .cloud
            .instances
            .get_within(self.cloud.nodes.as_ref(), max_age)
            .await
            .map_err(cloud_error)?;
        // The snapshot lacks the recorded instance: EC2 is asked by id before anything is
        // decided about it (a filtered answer may leave out a running instance, and taking it
        // for gone would launch a second one beside it).
        if let Some(id) = &status.instance_id {
            if !node::owned_by(&cached, &self.uid)
                .iter()
                .any(|i| &i.id == id)
            {
                self.look_up(id.clone(), status.node_generation).await?;
            }
        }
        Ok(Observed {
            failure: recent_failure(
                self.cloud,
                &self.uid,
                self.qdb.metadata.generation,
                status.node_generation,
            ),
            instances: self.instances(&cached),
            nodes: self.ctx.caches.nodes.state(),
            status,
        })
    }

    fn decide(&self, o: &Observed) -> NodeStep {
        node::plan(&NodeView {
            uid: &self.uid,
            spec: self.qdb.spec.node.as_ref(),
            release: self.release,
            status: &o.status,
            instances: &o.instances,
            nodes: &o.nodes,
            dedicated: self.dedicated,
            recent_permanent_failure: o.failure.as_ref().map(|f| f.message.as_str()),
            join_timeout: self.cloud.settings.node_join_timeout,
            now: std::time::SystemTime::now(),
            failover_replaces: self.qdb.spec.failover.enabled,
            // Only a first launch is capped: no scan of every QuestDB on other reconciles.
            namespace_nodes: if o.status.instance_id.is_none()
                && o.status.node_generation == Some(1)
            {
                self.namespace_nodes()
            } else {
                0
            },
            namespace_node_cap: self.cloud.settings.max_dedicated_nodes_per_namespace,
        })
    }

    async fn perform(&mut self, step: NodeStep, o: Observed) -> Result<NodeOutcome, Error> {
        let nodes = &o.nodes;
        let current = o
            .status
            .instance_id
            .as_ref()
            .and_then(|id| o.instances.iter().find(|i| &i.id == id))
            .cloned();
        let flow = match step {
            NodeStep::Nothing => {
                self.turn.also.released = true;
                Flow::Stop
            }
            NodeStep::PersistGeneration(g) => {
                persist(self.qdb, self.ctx, |s| s.node_generation = Some(g)).await?;
                Flow::Stepped(launching("launching a dedicated node".into()))
            }
            NodeStep::Launch(g) => self.launch(g).await?,
            NodeStep::RecordInstance(instance) => self.record_instance(*instance).await?,
            NodeStep::LookUp(id) => {
                // Cannot follow a look-up of the same id: it is learnt, or forgotten as terminated.
                warn!(questdb = %self.qdb.name_any(), instance = %id, "instance still unknown after a look-up by id");
                self.turn.requeue_within(WAITING_SYNC);
                Flow::Stop
            }
            NodeStep::Replace {
                next_generation,
                gone,
                reason,
            } => {
                self.replace(&o.status, next_generation, &gone, reason.as_deref())
                    .await?
            }
            NodeStep::Wait(condition) => {
                let warning = match condition.reason {
                    NodeReadyReason::NodeIdentityConflict => {
                        Some(EventReason::NodeIdentityConflict)
                    }
                    NodeReadyReason::NodeNeverJoined => Some(EventReason::NodeNeverJoined),
                    _ => None,
                };
                if let Some(reason) = warning.filter(|_| !already_reported(&o.status, &condition)) {
                    warn!(questdb = %self.qdb.name_any(), "{}", condition.message);
                    self.ctx
                        .event(
                            self.qdb,
                            EventType::Warning,
                            reason,
                            "DedicateNode",
                            condition.message.clone(),
                        )
                        .await;
                }
                self.turn.condition = Some(condition);
                self.turn.requeue_within(WAITING_SYNC);
                Flow::StopAt
            }
            NodeStep::Dedicate { node, instance } => {
                if let Some(driver) = super::node_marks::csi_driver_missing(self.ctx, &node).await?
                {
                    self.turn.condition = Some(Verdict::new(
                        false,
                        NodeReadyReason::WaitingForCsiDriver,
                        super::node_marks::waiting_for_csi(&node, &driver),
                    ));
                    self.turn.requeue_within(Duration::from_secs(2));
                } else {
                    dedicate(self.ctx, &node, self.dedicated, &instance).await?;
                    self.turn.condition = Some(Verdict::new(
                        false,
                        NodeReadyReason::WaitingForNode,
                        format!("labelled and tainted node {node} for this database"),
                    ));
                    self.turn.requeue_within(Duration::from_secs(1));
                }
                Flow::StopAt
            }
            NodeStep::Ready { node, ready } => {
                self.turn.condition = Some(ready_condition(&node, ready));
                self.turn.also.node = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                    .cloned();
                if !ready {
                    self.turn.requeue_within(WAITING_SYNC);
                }
                Flow::StopAt
            }
            NodeStep::Terminate(ids) => self.terminate(&ids).await?,
            NodeStep::TerminateNeverJoined { instance, message } => {
                self.terminate_never_joined(&instance, message).await?
            }
            NodeStep::Released { next_generation } => self.released(next_generation).await?,
            NodeStep::Failed(condition) => {
                self.turn.condition = Some(condition);
                let left = o.failure.as_ref().map_or(PERMANENT_FAILURE_RETRY, |f| {
                    f.retry_after.saturating_sub(f.at.elapsed())
                });
                self.turn.requeue_within(left.max(Duration::from_secs(1)));
                Flow::Stop
            }
        };
        let mut turn = std::mem::take(&mut self.turn);
        match flow {
            Flow::Stepped(condition) => {
                turn.condition = Some(condition);
                turn.requeue_within(AFTER_A_STEP);
                // The instance this step recorded, if any: DNS may name it at once.
                let recorded = self.qdb.status.as_ref().and_then(|s| s.instance_id.clone());
                turn.also.instance = recorded.and_then(|id| {
                    self.instances(&o.instances)
                        .into_iter()
                        .find(|i| i.id == id)
                });
            }
            Flow::Stop => {}
            Flow::StopAt => turn.also.instance = current,
        }
        Ok(turn)
    }
}

/// What a node step leaves the reconcile to do.
enum Flow {
    /// A step was taken (recorded, or acted on and its outcome recorded), and the condition
    /// says which: the next reconcile plans again on what it changed.
    Stepped(Verdict<NodeReadyReason>),
    /// Wait; no instance to publish in DNS.
    Stop,
    /// Wait; DNS may name the recorded instance.
    StopAt,
}

/// One run of node steps for one QuestDB.
struct NodeMachine<'a> {
    qdb: &'a mut QuestDB,
    ctx: &'a Context,
    cloud: &'a CloudRuntime,
    dedicated: &'a DedicatedNode,
    uid: String,
    /// Paused or being deleted: the node goes.
    release: bool,
    turn: NodeOutcome,
    /// What this run learnt beyond the shared snapshot (its own launch, a lookup).
    learnt: Vec<Instance>,
}

impl NodeMachine<'_> {
    /// The other databases of this QuestDB's namespace that hold a dedicated node.
    fn namespace_nodes(&self) -> usize {
        let ns = self.qdb.metadata.namespace.as_deref();
        self.ctx
            .caches
            .questdbs
            .state()
            .iter()
            .filter_map(|g| g.0.as_ref().ok())
            .filter(|q| q.metadata.namespace.as_deref() == ns)
            .filter(|q| q.metadata.uid.as_deref() != Some(self.uid.as_str()))
            .filter(|q| {
                q.spec.node.is_some() && q.status.as_ref().is_some_and(|s| s.instance_id.is_some())
            })
            .count()
    }

    fn instances(&self, cached: &[Instance]) -> Vec<Instance> {
        cached
            .iter()
            .filter(|i| !self.learnt.iter().any(|l| l.id == i.id))
            .chain(self.learnt.iter())
            .cloned()
            .collect()
    }

    async fn launch(&mut self, generation: i64) -> Result<Flow, Error> {
        let Some(req) = launch_request(self.qdb, &self.uid, generation, self.dedicated) else {
            return Ok(Flow::Stop);
        };
        let status = self.qdb.status.clone().unwrap_or_default();
        let mut req = crate::plan::node::for_failover(req, &status);
        // EC2 would refuse the launch (or the node could not reach the cluster): said in the
        // database's condition, with the fix, until the preflight sees it fixed (which wakes it).
        if let Some(finding) = self.ctx.preflight.blocking_launch() {
            self.turn.condition = Some(Verdict::new(
                false,
                NodeReadyReason::PreflightFailed,
                format!("no node is launched: {}", finding.line()),
            ));
            self.turn
                .requeue_within(crate::controllers::preflight::AGAIN_WHILE_FAILING);
            return Ok(Flow::Stop);
        }
        req.cluster_id = self.cloud.cluster_id.clone();
        match self.cloud.nodes.launch(&req).await {
            Ok(instance) => {
                self.cloud.instances.invalidate();
                forget_failure(self.cloud, &self.uid);
                if instance.state.is_gone() {
                    // The next plan, on a fresh snapshot, replaces it.
                    let note = format!("instance {} went away at launch", instance.id);
                    self.learnt.push(instance);
                    return Ok(Flow::Stepped(launching(note)));
                }
                // The launch's outcome is part of its step: recorded at once, so a snapshot
                // that lags EC2 cannot hide it from the next reconcile.
                self.record_instance(instance).await
            }
            Err(e) if e.is_permanent() => {
                let message = match e.code() {
                    Some("InsufficientFreeAddressesInSubnet") => format!(
                        "{e} (the subnet of zone {} has no free address: free some, or map the zone to another subnet in --aws-subnets; the launch is tried again every {} minutes and at once on an edit of the QuestDB)",
                        req.zone,
                        PERMANENT_FAILURE_RETRY.as_secs() / 60
                    ),
                    _ => e.to_string(),
                };
                warn!(questdb = %self.qdb.name_any(), error = %message, "launch failed permanently");
                self.ctx
                    .event(
                        self.qdb,
                        EventType::Warning,
                        EventReason::LaunchFailed,
                        "LaunchNode",
                        message.clone(),
                    )
                    .await;
                let retry_after = node::launch_retry(e.code());
                remember_failure(
                    self.cloud,
                    &self.uid,
                    (self.qdb.metadata.generation, generation),
                    message.clone(),
                    retry_after,
                );
                self.turn.condition =
                    Some(Verdict::new(false, NodeReadyReason::LaunchFailed, message));
                self.turn.requeue_within(retry_after);
                Ok(Flow::Stop)
            }
            Err(e) => Err(cloud_error(e)),
        }
    }

    async fn record_instance(&mut self, instance: Instance) -> Result<Flow, Error> {
        info!(questdb = %self.qdb.name_any(), instance = %instance.id, "recording dedicated instance");
        let (id, image, kind) = (
            instance.id.clone(),
            instance.image.clone(),
            instance.instance_type.clone(),
        );
        persist(self.qdb, self.ctx, |s| {
            s.instance_id = Some(id.clone());
            s.node_image = Some(image.clone());
            s.node_instance_type = Some(kind.clone());
        })
        .await?;
        let note = format!("instance {} is starting", instance.id);
        if !self.learnt.iter().any(|l| l.id == instance.id) {
            self.learnt.push(instance);
        }
        Ok(Flow::Stepped(launching(note)))
    }

    async fn look_up(&mut self, id: String, generation: Option<i64>) -> Result<(), Error> {
        // By id: a filtered answer may leave out a running instance, and taking it for gone
        // would launch a second one beside it.
        let found = self.cloud.nodes.look_up(&id).await.map_err(cloud_error)?;
        let instance = match found {
            Some(i) => i,
            // EC2 forgets terminated instances after a while: gone for good.
            None => forgotten(self.qdb, &self.uid, &id, generation),
        };
        self.learnt.push(instance);
        Ok(())
    }

    async fn replace(
        &mut self,
        status: &QuestDBStatus,
        next_generation: i64,
        gone: &str,
        reason: Option<&str>,
    ) -> Result<Flow, Error> {
        let why = reason.unwrap_or("no reason given by EC2");
        let now = tokio::time::Instant::now();
        let hold = {
            let mut all = self
                .cloud
                .relaunches
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let history = all.entry(self.uid.clone()).or_default();
            // tokio's instants (a paused test clock moves them) as the planner's std ones.
            let earlier: Vec<_> = history.iter().map(|t| t.into_std()).collect();
            let verdict = node::relaunch(&earlier, now.into_std());
            if verdict == node::Relaunch::Now {
                history.push(now);
            }
            verdict
        };
        let wait = match hold {
            node::Relaunch::Now => None,
            node::Relaunch::Backoff(d) => Some((
                NodeReadyReason::RelaunchBackoff,
                EventReason::RelaunchBackoff,
                d,
            )),
            node::Relaunch::Capped(d) => Some((
                NodeReadyReason::RelaunchCapped,
                EventReason::RelaunchCapped,
                d,
            )),
        };
        if let Some((reason, event_reason, d)) = wait {
            let c = Verdict::new(
                false,
                reason,
                format!(
                    "instance {gone} went away ({why}); the next launch waits (at most {} per hour)",
                    node::MAX_RELAUNCHES_PER_HOUR
                ),
            );
            if !already_reported(status, &c) {
                self.ctx
                    .event(
                        self.qdb,
                        EventType::Warning,
                        event_reason,
                        "ReplaceNode",
                        c.message.clone(),
                    )
                    .await;
            }
            self.turn.condition = Some(c);
            self.turn.requeue_within(d.max(Duration::from_secs(1)));
            return Ok(Flow::Stop);
        }
        let note =
            format!("instance {gone} is gone ({why}); launching node generation {next_generation}");
        self.ctx
            .event(
                self.qdb,
                EventType::Warning,
                EventReason::NodeGone,
                "ReplaceNode",
                note.clone(),
            )
            .await;
        persist(self.qdb, self.ctx, |s| {
            s.node_generation = Some(next_generation);
            s.instance_id = None;
            s.node_image = None;
            s.node_instance_type = None;
        })
        .await?;
        Ok(Flow::Stepped(launching(note)))
    }

    async fn terminate(&mut self, ids: &[String]) -> Result<Flow, Error> {
        let note = format!("terminating instance(s) {}", ids.join(", "));
        self.terminate_and_report(
            ids,
            EventType::Normal,
            EventReason::Releasing,
            NodeReadyReason::Releasing,
            note,
        )
        .await
    }

    async fn terminate_never_joined(&mut self, id: &str, message: String) -> Result<Flow, Error> {
        warn!(questdb = %self.qdb.name_any(), instance = %id, "{message}");
        let ids = [id.to_string()];
        self.terminate_and_report(
            &ids,
            EventType::Warning,
            EventReason::NodeNeverJoined,
            NodeReadyReason::NodeNeverJoined,
            message,
        )
        .await
    }

    /// Terminates `ids` (each checked to be this QuestDB's), then one event and the
    /// `NodeReady=False` condition, both saying `note`.
    async fn terminate_and_report(
        &mut self,
        ids: &[String],
        event: EventType,
        event_reason: EventReason,
        condition_reason: NodeReadyReason,
        note: String,
    ) -> Result<Flow, Error> {
        for id in ids {
            info!(questdb = %self.qdb.name_any(), instance = %id, "terminating dedicated instance");
            self.cloud
                .nodes
                .terminate(id, &owner_uid(self.qdb))
                .await
                .map_err(cloud_error)?;
        }
        self.cloud.instances.invalidate();
        self.ctx
            .event(self.qdb, event, event_reason, "TerminateNode", note.clone())
            .await;
        self.turn.condition = Some(Verdict::new(false, condition_reason, note));
        self.turn.requeue_within(WAITING_SYNC);
        Ok(Flow::Stop)
    }

    async fn released(&mut self, next_generation: Option<i64>) -> Result<Flow, Error> {
        persist(self.qdb, self.ctx, |s| {
            s.instance_id = None;
            s.node_image = None;
            s.node_instance_type = None;
            s.node_generation = next_generation;
        })
        .await?;
        self.turn.condition = self.qdb.spec.node.as_ref().map(|_| {
            Verdict::new(
                false,
                NodeReadyReason::Released,
                "the dedicated node was released; the volume is kept",
            )
        });
        self.turn.also.released = true;
        Ok(Flow::Stop)
    }
}

/// An instance EC2 no longer knows, as a terminated record the planner understands.
fn forgotten(qdb: &QuestDB, uid: &str, id: &str, generation: Option<i64>) -> Instance {
    Instance {
        id: id.to_string(),
        state: InstanceState::Terminated,
        zone: String::new(),
        image: String::new(),
        instance_type: String::new(),
        private_ip: None,
        public_ip: None,
        tags: desired_instance_tags(
            "",
            &qdb.namespace().unwrap_or_default(),
            &qdb.name_any(),
            uid,
            generation.unwrap_or_default(),
        ),
        launched_at: None,
        state_reason: None,
        private_dns_name: None,
        pod_addresses: Default::default(),
    }
}

fn recent_failure(
    cloud: &CloudRuntime,
    uid: &str,
    spec_generation: Option<i64>,
    node_generation: Option<i64>,
) -> Option<LaunchFailure> {
    let failures = cloud
        .launch_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    failures.get(uid).cloned().filter(|f| {
        f.spec_generation == spec_generation
            && Some(f.node_generation) == node_generation
            && f.at.elapsed() < f.retry_after
    })
}

fn remember_failure(
    cloud: &CloudRuntime,
    uid: &str,
    (spec_generation, node_generation): (Option<i64>, i64),
    message: String,
    retry_after: Duration,
) {
    cloud
        .launch_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            uid.to_string(),
            LaunchFailure {
                spec_generation,
                node_generation,
                at: tokio::time::Instant::now(),
                message,
                retry_after,
            },
        );
}

fn forget_failure(cloud: &CloudRuntime, uid: &str) {
    cloud
        .launch_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(uid);
}

/// `NodeReady=False` while a dedicated node is on its way.
fn launching(message: String) -> Verdict<NodeReadyReason> {
    Verdict::new(false, NodeReadyReason::Launching, message)
}

pub(super) fn ready_condition(node: &str, ready: bool) -> Verdict<NodeReadyReason> {
    if ready {
        Verdict::new(
            true,
            NodeReadyReason::Ready,
            format!("dedicated node {node} is ready"),
        )
    } else {
        Verdict::new(
            false,
            NodeReadyReason::NodeNotReady,
            format!("dedicated node {node} is not ready"),
        )
    }
}

pub(super) fn cloud_error(e: CloudError) -> Error {
    Error::Cloud(e)
}
