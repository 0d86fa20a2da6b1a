//! The cloud part of a QuestDB reconcile: performs the steps `controllers::node` and
//! `controllers::dns` plan, persisting intent in status before each side effect.
//!
//! AWS cost: a converged QuestDB (its instance recorded, its Node registered, dedicated and
//! Ready, DNS recorded at the Node's address) costs no AWS call at all: the kubelet's Node is
//! the proof of life. Otherwise instance state comes from the shared [`InstanceCache`] (one
//! DescribeInstances per sync interval for the whole operator, at most one per
//! [`WAITING_SYNC`] while something is in transition).
//!
//! [`InstanceCache`]: crate::controllers::cloud_runtime::InstanceCache

use super::owner_uid;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, warn};

use super::node_marks::dedicate;
pub use super::outcome::CloudOutcome;
use super::record::{already_reported, persist};
use crate::api::Reason;
use crate::api::{conditions, QuestDB, QuestDBStatus, FINALIZER, MANAGER};
use crate::cloud::{
    desired_instance_tags, display_name, CloudError, DnsOwner, Instance, InstanceState,
    OWNED_ELSEWHERE,
};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::cloud_runtime::LaunchFailure;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::DedicatedNode;
use crate::plan::conditions::Verdict;
use crate::plan::dns::{self, DnsStep, DnsView};
use crate::plan::node::launch_request;
use crate::plan::node::{self, NodeStep, NodeView, PERMANENT_FAILURE_RETRY};

/// How fresh instance data must be while a node is launching or being released.
pub const WAITING_SYNC: Duration = Duration::from_secs(2);
/// Steps one reconcile may take before handing over to the next (each persisted).
const MAX_STEPS: usize = 8;

/// True when `qdb` needs the finalizer (it has, or may get, cloud resources).
pub fn wants_finalizer(qdb: &QuestDB) -> bool {
    qdb.spec.node.is_some() || qdb.spec.dns.is_some()
}

pub fn has_finalizer(qdb: &QuestDB) -> bool {
    qdb.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds or removes the finalizer; the resourceVersion makes it a no-op on a stale object.
pub async fn set_finalizer(qdb: &mut QuestDB, ctx: &Context, present: bool) -> Result<(), Error> {
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

fn not_configured(type_: &'static str) -> Verdict {
    Verdict::new(
        type_,
        false,
        Reason::NotConfigured,
        "the operator runs without a cloud provider (--cloud-provider)",
    )
}

/// Runs the node and DNS steps. `release` = paused or being deleted. `hold`: the node is no
/// longer wanted but the database pod still runs on it, so it is not released yet.
pub async fn reconcile(
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
            .map(|_| not_configured(conditions::NODE_READY));
        out.dns_condition = qdb
            .spec
            .dns
            .as_ref()
            .map(|_| not_configured(conditions::DNS_READY));
        let status = qdb.status.clone().unwrap_or_default();
        // Without a provider nothing can be cleaned up; say so rather than forget it.
        out.released = status.instance_id.is_none() && status.dns_name.is_none();
        return Ok(out);
    };
    // Before the steady-state shortcut: a node whose Lease stopped may still look Ready.
    out.failover_condition = super::failover::reconcile(qdb, ctx, cloud, &mut out).await?;
    out.node_move_condition = super::node_move::reconcile(qdb, ctx, cloud, &mut out).await?;
    let dedicated = DedicatedNode::for_questdb(qdb);

    if !release {
        if let Some(fast) = steady_state(qdb, ctx, &dedicated) {
            if let DnsDecision::Decided(done) =
                dns_step(qdb, ctx, cloud, &fast.ips, true, &mut out).await?
            {
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
            conditions::NODE_READY,
            false,
            Reason::MovingOff,
            format!(
                "spec.node was removed; instance {} is released once the database pod has left it",
                status.instance_id.as_deref().unwrap_or("-")
            ),
        ));
        out.requeue_within(WAITING_SYNC);
        None
    } else if involved {
        node_steps(qdb, ctx, cloud, &dedicated, release, &mut out).await?
    } else {
        out.released = true;
        None
    };
    let ips = current
        .map(|i| Ips {
            private: i.private_ip,
            public: i.public_ip,
        })
        .unwrap_or_default();
    report_untrusted_address(qdb, ctx, out.node.as_deref(), &ips).await;
    out.dns_condition = match dns_step(qdb, ctx, cloud, &ips, false, &mut out).await? {
        DnsDecision::Decided(c) => c,
        DnsDecision::Undecided => None,
    };
    let dns_left = qdb.status.as_ref().is_some_and(|s| s.dns_name.is_some());
    out.released = out.released && !dns_left;
    // Read again: the node steps may have recorded (or forgotten) the instance the pod pins.
    if qdb.spec.node.is_some() {
        out.dedicated = Some(DedicatedNode::for_questdb(qdb));
    }
    Ok(out)
}

#[derive(Default)]
struct Ips {
    private: Option<String>,
    public: Option<String>,
}

/// The dedicated node as the Node cache shows it.
struct SteadyNode {
    name: String,
    node: Arc<Node>,
    ips: Ips,
}

fn node_address(node: &Node, kind: &str) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == kind)
        .map(|a| a.address.clone())
}

/// A dedicated Node that reports a private address EC2 does not give its instance: DNS keeps
/// EC2's, and on-call hears of it (a misconfigured or compromised node).
async fn report_untrusted_address(qdb: &QuestDB, ctx: &Context, node: Option<&Node>, ips: &Ips) {
    let (Some(node), Some(ec2)) = (node, ips.private.as_deref()) else {
        return;
    };
    let Some(reported) = node_address(node, "InternalIP").filter(|r| r != ec2) else {
        return;
    };
    let note = format!(
        "node {} reports address {reported}, but EC2 gives its instance {ec2}: DNS follows EC2, never the node's report",
        node.name_any()
    );
    warn!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Warning,
        Reason::NodeAddressUntrusted,
        "DnsRecord",
        note,
    )
    .await;
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
        ips: Ips {
            private: node_address(node, "InternalIP"),
            public: node_address(node, "ExternalIP"),
        },
        node: found,
    })
}

fn ready_condition(node: &str, ready: bool) -> Verdict {
    if ready {
        Verdict::new(
            conditions::NODE_READY,
            true,
            Reason::Ready,
            format!("dedicated node {node} is ready"),
        )
    } else {
        Verdict::new(
            conditions::NODE_READY,
            false,
            Reason::NodeNotReady,
            format!("dedicated node {node} is not ready"),
        )
    }
}

fn cloud_error(e: CloudError) -> Error {
    Error::Cloud(e)
}

/// Runs node steps until one has to wait; returns the instance status names, if any.
async fn node_steps(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    dedicated: &DedicatedNode,
    release: bool,
    out: &mut CloudOutcome,
) -> Result<Option<Instance>, Error> {
    let uid = qdb.uid().ok_or(Error::MissingUid)?;
    let settled = qdb.status.as_ref().is_some_and(|s| {
        s.instance_id.is_some()
            && s.conditions
                .iter()
                .any(|c| c.type_ == conditions::NODE_READY && c.status == "True")
    });
    let max_age = if settled && !release {
        cloud.settings.instance_sync_interval
    } else {
        WAITING_SYNC
    };
    let cached = cloud
        .instances
        .get_within(cloud.nodes.as_ref(), max_age)
        .await
        .map_err(cloud_error)?;
    let mut run = NodeRun {
        qdb,
        ctx,
        cloud,
        dedicated,
        uid,
        out,
        learnt: Vec::new(),
    };
    for _ in 0..MAX_STEPS {
        let instances = run.instances(&cached);
        let status = run.qdb.status.clone().unwrap_or_default();
        let failure = recent_failure(
            cloud,
            &run.uid,
            run.qdb.metadata.generation,
            status.node_generation,
        );
        let nodes = ctx.caches.nodes.state();
        let step = node::plan(&NodeView {
            uid: &run.uid,
            spec: run.qdb.spec.node.as_ref(),
            release,
            status: &status,
            instances: &instances,
            nodes: &nodes,
            dedicated,
            recent_permanent_failure: failure.as_ref().map(|f| f.message.as_str()),
            join_timeout: cloud.settings.node_join_timeout,
            now: std::time::SystemTime::now(),
            failover_replaces: run.qdb.spec.failover.enabled,
        });
        let current = status
            .instance_id
            .as_ref()
            .and_then(|id| instances.iter().find(|i| &i.id == id))
            .cloned();
        let flow = match step {
            NodeStep::Nothing => {
                run.out.released = true;
                Flow::Stop
            }
            NodeStep::PersistGeneration(g) => {
                persist(run.qdb, ctx, |s| s.node_generation = Some(g)).await?;
                Flow::Next
            }
            NodeStep::Launch(g) => run.launch(g).await?,
            NodeStep::RecordInstance(instance) => run.record_instance(instance).await?,
            NodeStep::LookUp(id) => run.look_up(id, status.node_generation).await?,
            NodeStep::Replace {
                next_generation,
                gone,
                reason,
            } => {
                run.replace(&status, next_generation, &gone, reason.as_deref())
                    .await?
            }
            NodeStep::Wait(condition) => {
                if matches!(
                    condition.reason,
                    Reason::NodeIdentityConflict | Reason::NodeNeverJoined
                ) && !already_reported(&run.qdb.status.clone().unwrap_or_default(), &condition)
                {
                    warn!(questdb = %run.qdb.name_any(), "{}", condition.message);
                    ctx.event(
                        run.qdb,
                        EventType::Warning,
                        condition.reason,
                        "DedicateNode",
                        condition.message.clone(),
                    )
                    .await;
                }
                run.out.node_condition = Some(condition);
                run.out.requeue_within(WAITING_SYNC);
                Flow::StopAt
            }
            NodeStep::Dedicate { node, instance } => {
                if let Some(driver) = super::node_marks::csi_driver_missing(ctx, &node).await? {
                    run.out.node_condition = Some(Verdict::new(
                        conditions::NODE_READY,
                        false,
                        Reason::WaitingForCsiDriver,
                        super::node_marks::waiting_for_csi(&node, &driver),
                    ));
                    run.out.requeue_within(Duration::from_secs(2));
                } else {
                    dedicate(ctx, &node, dedicated, &instance).await?;
                    run.out.node_condition = Some(Verdict::new(
                        conditions::NODE_READY,
                        false,
                        Reason::WaitingForNode,
                        format!("labelled and tainted node {node} for this database"),
                    ));
                    run.out.requeue_within(Duration::from_secs(1));
                }
                Flow::StopAt
            }
            NodeStep::Ready { node, ready } => {
                run.out.node_condition = Some(ready_condition(&node, ready));
                run.out.node = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                    .cloned();
                if !ready {
                    run.out.requeue_within(WAITING_SYNC);
                }
                Flow::StopAt
            }
            NodeStep::Terminate(ids) => run.terminate(&ids).await?,
            NodeStep::TerminateNeverJoined { instance, message } => {
                run.terminate_never_joined(&instance, message).await?
            }
            NodeStep::Released { next_generation } => run.released(next_generation).await?,
            NodeStep::Failed(condition) => {
                run.out.node_condition = Some(condition);
                let left = failure.map_or(PERMANENT_FAILURE_RETRY, |f| {
                    PERMANENT_FAILURE_RETRY.saturating_sub(f.at.elapsed())
                });
                run.out.requeue_within(left.max(Duration::from_secs(1)));
                Flow::Stop
            }
        };
        match flow {
            Flow::Next => {}
            Flow::Stop => return Ok(None),
            Flow::StopAt => return Ok(current),
        }
    }
    run.out.requeue_within(Duration::from_secs(1));
    Ok(None)
}

/// What a node step leaves the loop to do.
enum Flow {
    /// Plan again: the step changed something the planner reads.
    Next,
    /// Wait; no instance to publish in DNS.
    Stop,
    /// Wait; DNS may name the recorded instance.
    StopAt,
}

/// One run of node steps for one QuestDB.
struct NodeRun<'a> {
    qdb: &'a mut QuestDB,
    ctx: &'a Context,
    cloud: &'a CloudRuntime,
    dedicated: &'a DedicatedNode,
    uid: String,
    out: &'a mut CloudOutcome,
    /// What this run learnt beyond the shared snapshot (its own launch, a lookup).
    learnt: Vec<Instance>,
}

impl NodeRun<'_> {
    fn instances(&self, cached: &[Instance]) -> Vec<Instance> {
        cached
            .iter()
            .filter(|i| !self.learnt.iter().any(|l| l.id == i.id))
            .chain(self.learnt.iter())
            .cloned()
            .collect()
    }

    async fn launch(&mut self, generation: i64) -> Result<Flow, Error> {
        let Some(mut req) = launch_request(self.qdb, &self.uid, generation, self.dedicated) else {
            return Ok(Flow::Stop);
        };
        req.cluster_id = self.cloud.cluster_id.clone();
        match self.cloud.nodes.launch(&req).await {
            Ok(instance) => {
                self.cloud.instances.invalidate();
                forget_failure(self.cloud, &self.uid);
                self.learnt.push(instance);
                Ok(Flow::Next)
            }
            Err(e) if e.is_permanent() => {
                let message = e.to_string();
                warn!(questdb = %self.qdb.name_any(), error = %message, "launch failed permanently");
                self.ctx
                    .event(
                        self.qdb,
                        EventType::Warning,
                        Reason::LaunchFailed,
                        "LaunchNode",
                        message.clone(),
                    )
                    .await;
                remember_failure(
                    self.cloud,
                    &self.uid,
                    self.qdb.metadata.generation,
                    generation,
                    message.clone(),
                );
                self.out.node_condition = Some(Verdict::new(
                    conditions::NODE_READY,
                    false,
                    Reason::LaunchFailed,
                    message,
                ));
                self.out.requeue_within(PERMANENT_FAILURE_RETRY);
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
        if !self.learnt.iter().any(|l| l.id == instance.id) {
            self.learnt.push(instance);
        }
        Ok(Flow::Next)
    }

    async fn look_up(&mut self, id: String, generation: Option<i64>) -> Result<Flow, Error> {
        // By id: a filtered answer may leave out a running instance, and taking it for gone
        // would launch a second one beside it.
        let found = self.cloud.nodes.look_up(&id).await.map_err(cloud_error)?;
        let instance = match found {
            Some(i) => i,
            // EC2 forgets terminated instances after a while: gone for good.
            None => forgotten(self.qdb, &self.uid, &id, generation),
        };
        self.learnt.push(instance);
        Ok(Flow::Next)
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
            let verdict = node::relaunch(history, now);
            if verdict == node::Relaunch::Now {
                history.push(now);
            }
            verdict
        };
        let wait = match hold {
            node::Relaunch::Now => None,
            node::Relaunch::Backoff(d) => Some((Reason::RelaunchBackoff, d)),
            node::Relaunch::Capped(d) => Some((Reason::RelaunchCapped, d)),
        };
        if let Some((reason, d)) = wait {
            let c = Verdict::new(
                conditions::NODE_READY,
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
                        reason,
                        "ReplaceNode",
                        c.message.clone(),
                    )
                    .await;
            }
            self.out.node_condition = Some(c);
            self.out.requeue_within(d.max(Duration::from_secs(1)));
            return Ok(Flow::Stop);
        }
        let note =
            format!("instance {gone} is gone ({why}); launching node generation {next_generation}");
        self.ctx
            .event(
                self.qdb,
                EventType::Warning,
                Reason::NodeGone,
                "ReplaceNode",
                note,
            )
            .await;
        persist(self.qdb, self.ctx, |s| {
            s.node_generation = Some(next_generation);
            s.instance_id = None;
            s.node_image = None;
            s.node_instance_type = None;
        })
        .await?;
        Ok(Flow::Next)
    }

    async fn terminate(&mut self, ids: &[String]) -> Result<Flow, Error> {
        let note = format!("terminating instance(s) {}", ids.join(", "));
        self.terminate_and_report(
            ids,
            EventType::Normal,
            Reason::ReleasingNode,
            Reason::Releasing,
            note,
        )
        .await
    }

    async fn terminate_never_joined(&mut self, id: &str, message: String) -> Result<Flow, Error> {
        warn!(questdb = %self.qdb.name_any(), instance = %id, "{message}");
        let ids = [id.to_string()];
        let never = Reason::NodeNeverJoined;
        self.terminate_and_report(&ids, EventType::Warning, never, never, message)
            .await
    }

    /// Terminates `ids` (each checked to be this QuestDB's), then one event and the
    /// `NodeReady=False` condition, both saying `note`.
    async fn terminate_and_report(
        &mut self,
        ids: &[String],
        event: EventType,
        event_reason: Reason,
        condition_reason: Reason,
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
        self.out.node_condition = Some(Verdict::new(
            conditions::NODE_READY,
            false,
            condition_reason,
            note,
        ));
        self.out.requeue_within(WAITING_SYNC);
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
        self.out.node_condition = self.qdb.spec.node.as_ref().map(|_| {
            Verdict::new(
                conditions::NODE_READY,
                false,
                Reason::Released,
                "the dedicated node was released; the volume is kept",
            )
        });
        self.out.released = true;
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
            && f.at.elapsed() < PERMANENT_FAILURE_RETRY
    })
}

fn remember_failure(
    cloud: &CloudRuntime,
    uid: &str,
    spec_generation: Option<i64>,
    g: i64,
    message: String,
) {
    cloud
        .launch_failures
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            uid.to_string(),
            LaunchFailure {
                spec_generation,
                node_generation: g,
                at: tokio::time::Instant::now(),
                message,
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

/// This QuestDB as the owner of `name`: its uid, and the IP status says it published there.
fn dns_owner(qdb: &QuestDB, status: &QuestDBStatus, name: &str) -> DnsOwner {
    let published = status
        .dns_name
        .as_deref()
        .is_some_and(|n| display_name(n) == display_name(name));
    DnsOwner {
        uid: qdb.uid().unwrap_or_default(),
        published_ip: status.dns_ip.clone().filter(|_| published),
    }
}

/// A DNS error that needs a person (a name owned by someone else, a record Route53 refuses, no
/// hosted zone): a condition and one event, not a failed reconcile retried forever.
fn dns_refusal(e: &CloudError) -> Option<Reason> {
    match e {
        CloudError::Permanent { code, .. } if code == OWNED_ELSEWHERE => {
            Some(Reason::RecordOwnedElsewhere)
        }
        CloudError::Permanent { .. } | CloudError::Config(_) => Some(Reason::DnsRejected),
        _ => None,
    }
}

/// What the DNS step concluded.
enum DnsDecision {
    /// The fast path (`from_node`: addresses read from the Node only) cannot decide.
    Undecided,
    /// `DnsReady`, if `spec.dns` asks for a record.
    Decided(Option<Verdict>),
}

/// Performs the DNS step.
async fn dns_step(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    ips: &Ips,
    from_node: bool,
    out: &mut CloudOutcome,
) -> Result<DnsDecision, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let deleting = qdb.metadata.deletion_timestamp.is_some();
    let release = qdb.spec.paused || deleting;
    // A name outside this namespace's zone is not wanted: never written (and a recorded one
    // of an earlier spec is deleted as for any rename).
    let refusal = qdb.spec.dns.as_ref().and_then(|d| {
        dns::outside_namespace(
            &d.name,
            &qdb.namespace().unwrap_or_default(),
            cloud.settings.dns_namespace_suffix.as_deref(),
        )
    });
    if let Some(c) = &refusal {
        if !already_reported(&status, c) {
            warn!(questdb = %qdb.name_any(), "{}", c.message);
            ctx.event(
                qdb,
                EventType::Warning,
                Reason::DnsRejected,
                "UpsertRecord",
                c.message.clone(),
            )
            .await;
        }
    }
    let step = dns::plan(&DnsView {
        spec: qdb.spec.dns.as_ref().filter(|_| refusal.is_none()),
        release,
        deleting,
        status: &status,
        private_ip: ips.private.as_deref(),
        public_ip: ips.public.as_deref(),
        provider_configured: cloud.dns.is_some(),
    });
    let Some(provider) = cloud.dns.as_ref() else {
        return Ok(DnsDecision::Decided(match step {
            DnsStep::Blocked(c) => Some(c),
            _ => None,
        }));
    };
    match step {
        DnsStep::Nothing => Ok(DnsDecision::Decided(refusal)),
        DnsStep::InSync(c) => Ok(DnsDecision::Decided(Some(c))),
        DnsStep::Blocked(c) if c.reason == Reason::WaitingForNode && from_node => {
            // The fast path read the Node only; let the instance data decide.
            Ok(DnsDecision::Undecided)
        }
        // A Node's addresses are what its kubelet reports, and a compromised node can report
        // any: they may confirm the record, never move it. EC2's word decides a write.
        DnsStep::Upsert { .. } if from_node => Ok(DnsDecision::Undecided),
        DnsStep::Blocked(c) => Ok(DnsDecision::Decided(Some(c))),
        DnsStep::Upsert { name, ip, ttl } => {
            let owner = dns_owner(qdb, &status, &name);
            if let Err(e) = provider.upsert_a(&name, &ip, ttl, &owner).await {
                return match dns_refusal(&e) {
                    Some(reason) => {
                        let c = Verdict::new(conditions::DNS_READY, false, reason, e.to_string());
                        if !already_reported(&status, &c) {
                            warn!(questdb = %qdb.name_any(), record = %name, error = %e, "DNS record not written");
                            ctx.event(
                                qdb,
                                EventType::Warning,
                                reason,
                                "UpsertRecord",
                                e.to_string(),
                            )
                            .await;
                        }
                        Ok(DnsDecision::Decided(Some(c)))
                    }
                    None => Err(cloud_error(e)),
                };
            }
            info!(questdb = %qdb.name_any(), record = %name, %ip, "DNS record published");
            let (n, a) = (name.clone(), ip.clone());
            persist(qdb, ctx, |s| {
                s.dns_name = Some(n.clone());
                s.dns_ip = Some(a.clone());
            })
            .await?;
            ctx.event(
                qdb,
                EventType::Normal,
                Reason::DnsPublished,
                "UpsertRecord",
                format!("{name} -> {ip}"),
            )
            .await;
            Ok(DnsDecision::Decided(Some(dns::published(&name, &ip))))
        }
        DnsStep::Withdraw { name } => {
            let owner = dns_owner(qdb, &status, &name);
            provider
                .withdraw_a(&name, &owner)
                .await
                .map_err(cloud_error)?;
            info!(questdb = %qdb.name_any(), record = %name, "DNS record withdrawn; the name stays reserved");
            persist(qdb, ctx, |s| s.dns_ip = None).await?;
            Ok(DnsDecision::Decided(Some(dns::reserved_while_paused(
                &name,
            ))))
        }
        DnsStep::Delete { name } => {
            let owner = dns_owner(qdb, &status, &name);
            provider
                .delete_a(&name, &owner)
                .await
                .map_err(cloud_error)?;
            info!(questdb = %qdb.name_any(), record = %name, "DNS record deleted");
            persist(qdb, ctx, |s| {
                s.dns_name = None;
                s.dns_ip = None;
            })
            .await?;
            // The new record (if any) is written by the next pass.
            out.requeue_within(Duration::from_secs(1));
            Ok(DnsDecision::Decided(
                qdb.spec.dns.as_ref().filter(|_| release).map(|_| {
                    Verdict::new(
                        conditions::DNS_READY,
                        false,
                        Reason::Removed,
                        format!("record {name} removed while compute is released"),
                    )
                }),
            ))
        }
    }
}
