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
use crate::api::{conditions, QuestDB, QuestDBStatus, FINALIZER, MANAGER};
use crate::cloud::{
    desired_instance_tags, display_name, CloudError, DnsOwner, Instance, InstanceState,
    OWNED_ELSEWHERE,
};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::cloud_runtime::LaunchFailure;
use crate::controllers::conditions::reasons;
use crate::controllers::conditions::Verdict;
use crate::controllers::context::Context;
use crate::controllers::dns::{self, DnsStep, DnsView};
use crate::controllers::node::launch_request;
use crate::controllers::node::{self, NodeStep, NodeView, PERMANENT_FAILURE_RETRY};
use crate::controllers::Error;
use crate::desired::DedicatedNode;

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
        "NotConfigured",
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
    out.upgrade_condition = super::upgrade::reconcile(qdb, ctx, cloud, &mut out).await?;
    let dedicated = DedicatedNode::for_questdb(qdb);

    if !release {
        if let Some(fast) = steady_state(qdb, ctx, &dedicated) {
            if let Some(done) = dns_step(qdb, ctx, cloud, &fast.ips, true, &mut out).await? {
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
            "MovingOff",
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
    out.dns_condition = dns_step(qdb, ctx, cloud, &ips, false, &mut out)
        .await?
        .flatten();
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
            "Ready",
            format!("dedicated node {node} is ready"),
        )
    } else {
        Verdict::new(
            conditions::NODE_READY,
            false,
            "NodeNotReady",
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
    // What this reconcile learnt beyond the shared snapshot (its own launch, a lookup).
    let mut learnt: Vec<Instance> = Vec::new();

    for _ in 0..MAX_STEPS {
        let mut instances: Vec<Instance> = cached
            .iter()
            .filter(|i| !learnt.iter().any(|l| l.id == i.id))
            .cloned()
            .collect();
        instances.extend(learnt.iter().cloned());
        let status = qdb.status.clone().unwrap_or_default();
        let failure = recent_failure(cloud, &uid, qdb.metadata.generation, status.node_generation);
        let nodes = ctx.caches.nodes.state();
        let step = node::plan(&NodeView {
            uid: &uid,
            spec: qdb.spec.node.as_ref(),
            release,
            status: &status,
            instances: &instances,
            nodes: &nodes,
            dedicated,
            recent_permanent_failure: failure.as_ref().map(|f| f.message.as_str()),
        });
        let current = status
            .instance_id
            .as_ref()
            .and_then(|id| instances.iter().find(|i| &i.id == id))
            .cloned();
        match step {
            NodeStep::Nothing => {
                out.released = true;
                return Ok(None);
            }
            NodeStep::PersistGeneration(g) => {
                persist(qdb, ctx, |s| s.node_generation = Some(g)).await?;
            }
            NodeStep::Launch(g) => {
                let Some(req) = launch_request(qdb, &uid, g, dedicated) else {
                    return Ok(None);
                };
                match cloud.nodes.launch(&req).await {
                    Ok(instance) => {
                        cloud.instances.invalidate();
                        forget_failure(cloud, &uid);
                        learnt.push(instance);
                    }
                    Err(e) if e.is_permanent() => {
                        let message = e.to_string();
                        warn!(questdb = %qdb.name_any(), error = %message, "launch failed permanently");
                        ctx.event(
                            qdb,
                            EventType::Warning,
                            "LaunchFailed",
                            "LaunchNode",
                            message.clone(),
                        )
                        .await;
                        remember_failure(cloud, &uid, qdb.metadata.generation, g, message.clone());
                        out.node_condition = Some(Verdict::new(
                            conditions::NODE_READY,
                            false,
                            "LaunchFailed",
                            message,
                        ));
                        out.requeue_within(PERMANENT_FAILURE_RETRY);
                        return Ok(None);
                    }
                    Err(e) => return Err(cloud_error(e)),
                }
            }
            NodeStep::RecordInstance(instance) => {
                info!(questdb = %qdb.name_any(), instance = %instance.id, "recording dedicated instance");
                let (id, image, kind) = (
                    instance.id.clone(),
                    instance.image.clone(),
                    instance.instance_type.clone(),
                );
                persist(qdb, ctx, |s| {
                    s.instance_id = Some(id.clone());
                    s.node_image = Some(image.clone());
                    s.node_instance_type = Some(kind.clone());
                })
                .await?;
                if !learnt.iter().any(|l| l.id == instance.id) {
                    learnt.push(instance);
                }
            }
            NodeStep::LookUp(id) => {
                let found = cloud
                    .nodes
                    .describe(std::slice::from_ref(&id))
                    .await
                    .map_err(cloud_error)?;
                match found.into_iter().find(|i| i.id == id) {
                    Some(i) => learnt.push(i),
                    // EC2 forgets terminated instances after a while: gone for good.
                    None => learnt.push(forgotten(qdb, &uid, &id, status.node_generation)),
                }
            }
            NodeStep::Replace {
                next_generation,
                gone,
                reason,
            } => {
                let why = reason.as_deref().unwrap_or("no reason given by EC2");
                let uid = qdb.uid().unwrap_or_default();
                let now = tokio::time::Instant::now();
                let hold = {
                    let mut all = cloud.relaunches.lock().unwrap_or_else(|p| p.into_inner());
                    let history = all.entry(uid).or_default();
                    let verdict = node::relaunch(history, now);
                    if verdict == node::Relaunch::Now {
                        history.push(now);
                    }
                    verdict
                };
                let wait = match hold {
                    node::Relaunch::Now => None,
                    node::Relaunch::Backoff(d) => Some(("RelaunchBackoff", d)),
                    node::Relaunch::Capped(d) => Some(("RelaunchCapped", d)),
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
                    if !already_reported(&status, &c) {
                        ctx.event(
                            qdb,
                            EventType::Warning,
                            reason,
                            "ReplaceNode",
                            c.message.clone(),
                        )
                        .await;
                    }
                    out.node_condition = Some(c);
                    out.requeue_within(d.max(Duration::from_secs(1)));
                    return Ok(None);
                }
                let note = format!(
                    "instance {gone} is gone ({why}); launching node generation {next_generation}"
                );
                ctx.event(qdb, EventType::Warning, "NodeGone", "ReplaceNode", note)
                    .await;
                persist(qdb, ctx, |s| {
                    s.node_generation = Some(next_generation);
                    s.instance_id = None;
                    s.node_image = None;
                    s.node_instance_type = None;
                })
                .await?;
            }
            NodeStep::Wait(condition) => {
                out.node_condition = Some(condition);
                out.requeue_within(WAITING_SYNC);
                return Ok(current);
            }
            NodeStep::Dedicate { node, instance } => {
                dedicate(ctx, &node, dedicated, &instance).await?;
                out.node_condition = Some(Verdict::new(
                    conditions::NODE_READY,
                    false,
                    reasons::WAITING_FOR_NODE,
                    format!("labelled and tainted node {node} for this database"),
                ));
                out.requeue_within(Duration::from_secs(1));
                return Ok(current);
            }
            NodeStep::Ready { node, ready } => {
                out.node_condition = Some(ready_condition(&node, ready));
                out.node = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                    .cloned();
                if !ready {
                    out.requeue_within(WAITING_SYNC);
                }
                return Ok(current);
            }
            NodeStep::Terminate(ids) => {
                for id in &ids {
                    info!(questdb = %qdb.name_any(), instance = %id, "terminating dedicated instance");
                    cloud.nodes.terminate(id).await.map_err(cloud_error)?;
                }
                cloud.instances.invalidate();
                ctx.event(
                    qdb,
                    EventType::Normal,
                    "ReleasingNode",
                    "TerminateNode",
                    format!("terminating instance(s) {}", ids.join(", ")),
                )
                .await;
                out.node_condition = Some(Verdict::new(
                    conditions::NODE_READY,
                    false,
                    "Releasing",
                    format!("terminating instance(s) {}", ids.join(", ")),
                ));
                out.requeue_within(WAITING_SYNC);
                return Ok(None);
            }
            NodeStep::Released { next_generation } => {
                persist(qdb, ctx, |s| {
                    s.instance_id = None;
                    s.node_image = None;
                    s.node_instance_type = None;
                    s.node_generation = next_generation;
                })
                .await?;
                out.node_condition = qdb.spec.node.as_ref().map(|_| {
                    Verdict::new(
                        conditions::NODE_READY,
                        false,
                        "Released",
                        "the dedicated node was released; the volume is kept",
                    )
                });
                out.released = true;
                return Ok(None);
            }
            NodeStep::Failed(condition) => {
                out.node_condition = Some(condition);
                let left = failure.map_or(PERMANENT_FAILURE_RETRY, |f| {
                    PERMANENT_FAILURE_RETRY.saturating_sub(f.at.elapsed())
                });
                out.requeue_within(left.max(Duration::from_secs(1)));
                return Ok(None);
            }
        }
    }
    out.requeue_within(Duration::from_secs(1));
    Ok(None)
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
fn dns_refusal(e: &CloudError) -> Option<&'static str> {
    match e {
        CloudError::Permanent { code, .. } if code == OWNED_ELSEWHERE => {
            Some("RecordOwnedElsewhere")
        }
        CloudError::Permanent { .. } | CloudError::Config(_) => Some("DnsRejected"),
        _ => None,
    }
}

/// Performs the DNS step. Returns `Ok(None)` when the fast path (`from_node`: addresses read
/// from the Node only) cannot decide, `Ok(Some(condition))` otherwise.
async fn dns_step(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    ips: &Ips,
    from_node: bool,
    out: &mut CloudOutcome,
) -> Result<Option<Option<Verdict>>, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let release = qdb.spec.paused || qdb.metadata.deletion_timestamp.is_some();
    let step = dns::plan(&DnsView {
        spec: qdb.spec.dns.as_ref(),
        release,
        status: &status,
        private_ip: ips.private.as_deref(),
        public_ip: ips.public.as_deref(),
        provider_configured: cloud.dns.is_some(),
    });
    let Some(provider) = cloud.dns.as_ref() else {
        return Ok(Some(match step {
            DnsStep::Blocked(c) => Some(c),
            _ => None,
        }));
    };
    match step {
        DnsStep::Nothing => Ok(Some(None)),
        DnsStep::InSync(c) => Ok(Some(Some(c))),
        DnsStep::Blocked(c) if c.reason == reasons::WAITING_FOR_NODE && from_node => {
            // The fast path read the Node only; let the instance data decide.
            Ok(None)
        }
        DnsStep::Blocked(c) => Ok(Some(Some(c))),
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
                        Ok(Some(Some(c)))
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
                "DnsPublished",
                "UpsertRecord",
                format!("{name} -> {ip}"),
            )
            .await;
            Ok(Some(Some(dns::published(&name, &ip))))
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
            Ok(Some(qdb.spec.dns.as_ref().filter(|_| release).map(|_| {
                Verdict::new(
                    conditions::DNS_READY,
                    false,
                    "Removed",
                    format!("record {name} removed while compute is released"),
                )
            })))
        }
    }
}
