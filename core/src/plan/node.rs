//! Planning for a QuestDB's dedicated node: given what status, EC2 and the Node cache say, the
//! one next step. Pure, so every state of the machine is a unit test; the async shell in
//! `questdb::cloud` performs the step.
//!
//! Intent is persisted before each side effect: `status.nodeGeneration` is written before a
//! launch, and the instance (tags + ClientToken) is a function of uid + that generation, so
//! repeating any step after a crash finds the same instance instead of creating a second one.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::NodeReadyReason;
use crate::api::{NodeSpec, QuestDB, QuestDBStatus};
use crate::cloud::{
    parse_provider_id, Instance, InstanceState, LaunchRequest, Taint, TAG_NODE_GENERATION, TAG_UID,
};
use crate::desired::{
    DedicatedNode, DEDICATED_LABEL_KEY, DEDICATED_TAINT_EFFECT, DEDICATED_TAINT_KEY, PIN_LABEL_KEY,
};
use crate::plan::conditions::Verdict;

/// How long a permanent launch failure (unknown AMI, no capacity, ...) is shown before the
/// launch is tried again: slow on purpose, no retry storm against a request that cannot work.
pub const PERMANENT_FAILURE_RETRY: Duration = Duration::from_secs(600);

/// How soon a launch EC2 refused for want of capacity is tried again. A shortage is AWS's,
/// usually over in minutes, and a failover's database is down while it lasts: well under
/// [`PERMANENT_FAILURE_RETRY`], still far from a retry storm (one RunInstances per database
/// per this long, after every fallback type of the spec was tried).
pub const CAPACITY_RETRY: Duration = Duration::from_secs(90);

/// The launch errors that name a shortage of AWS's capacity rather than a mistake in the
/// request.
pub const CAPACITY_CODES: [&str; 4] = [
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
];

/// How long a permanent launch error (by EC2's code) is shown before the launch is tried again.
pub fn launch_retry(code: Option<&str>) -> Duration {
    if code.is_some_and(|c| CAPACITY_CODES.contains(&c)) {
        CAPACITY_RETRY
    } else {
        PERMANENT_FAILURE_RETRY
    }
}

/// What the planner looks at.
pub struct NodeView<'a> {
    pub uid: &'a str,
    pub spec: Option<&'a NodeSpec>,
    /// Paused or being deleted: the node must be released.
    pub release: bool,
    pub status: &'a QuestDBStatus,
    /// Every instance of this cluster (the shared cache); filtered by uid here.
    pub instances: &'a [Instance],
    pub nodes: &'a [std::sync::Arc<Node>],
    pub dedicated: &'a DedicatedNode,
    /// The last launch of this generation failed permanently less than
    /// [`PERMANENT_FAILURE_RETRY`] ago, with this message.
    pub recent_permanent_failure: Option<&'a str>,
    /// `--node-join-timeout`: a running instance whose Node has not registered after this
    /// long never joined.
    pub join_timeout: Duration,
    /// The wall clock, for the instances' launch times.
    pub now: std::time::SystemTime,
    /// `spec.failover.enabled`: failover fences and replaces an instance that never joined;
    /// without it the node's own steps terminate it and launch another.
    pub failover_replaces: bool,
    /// Other databases of this namespace holding a dedicated node, and how many one namespace
    /// may hold (`--max-dedicated-nodes-per-namespace`): a first launch waits at the cap, a
    /// replacement never does (the database already counts).
    pub namespace_nodes: usize,
    pub namespace_node_cap: Option<usize>,
}

/// What keeps a kubelet from registering, in the order an EKS user meets them.
pub const NEVER_JOINED_HINT: &str = "Check that the instance profile (--aws-instance-profile) has a role with an EC2_LINUX access entry in the cluster, that the user data joins this cluster (its console output shows nodeadm's error), and that the image is for this cluster's Kubernetes version";

/// The next step for the dedicated node.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeStep {
    /// No dedicated node wanted and none left over.
    Nothing,
    /// Write `status.nodeGeneration` (before launching that generation).
    PersistGeneration(i64),
    /// Launch (or find) the instance of this generation.
    Launch(i64),
    /// The instance of this generation exists but status does not name it yet (just launched,
    /// or found again after a crash): record it.
    RecordInstance(Box<Instance>),
    /// Status names an instance the cache does not hold: ask EC2 about that id directly.
    LookUp(String),
    /// The instance has run past `--node-join-timeout` without a Node, and failover is off:
    /// terminate it (nothing of the database can be on a node that never registered) and
    /// report why; its replacement follows as for any instance that went away, with the
    /// relaunch backoff and hourly cap.
    TerminateNeverJoined { instance: String, message: String },
    /// Status names an instance that no longer exists (terminated outside the operator, or
    /// ended before it ran): start a new generation; the volume keeps the data.
    Replace {
        next_generation: i64,
        /// The instance that went away, and EC2's reason.
        gone: String,
        reason: Option<String>,
    },
    /// The instance is on its way; look again soon.
    Wait(Verdict<NodeReadyReason>),
    /// The Node is there but lacks the dedicated label, the pin label and/or the taint.
    Dedicate { node: String, instance: String },
    /// Node up, labelled and tainted.
    Ready { node: String, ready: bool },
    /// Terminate these (live) instances of this QuestDB.
    Terminate(Vec<String>),
    /// Every instance of this QuestDB is gone: forget it (the next node is a new generation).
    Released { next_generation: Option<i64> },
    /// The last launch failed permanently; keep showing it until the retry time.
    Failed(Verdict<NodeReadyReason>),
}

fn gen_of(i: &Instance) -> Option<i64> {
    i.tags.get(TAG_NODE_GENERATION)?.parse().ok()
}

/// The instances of this QuestDB.
pub fn owned_by<'a>(instances: &'a [Instance], uid: &str) -> Vec<&'a Instance> {
    instances
        .iter()
        .filter(|i| i.tags.get(TAG_UID).is_some_and(|u| u == uid))
        .collect()
}

/// The Node that registered for `instance_id` (by `spec.providerID`).
pub fn node_for<'a>(nodes: &'a [std::sync::Arc<Node>], instance_id: &str) -> Option<&'a Node> {
    let claimants = claimants(nodes, instance_id);
    let pinned: Vec<&Node> = claimants
        .iter()
        .copied()
        .filter(|n| pin_of(n) == Some(instance_id))
        .collect();
    // The pin is set by the operator alone (NodeRestriction forbids a kubelet to set it), so
    // a pinned Node is the one the operator trusted; a second Node that registers with the
    // same providerID later is never mistaken for it. With no pin, one claimant or none.
    match (pinned.as_slice(), claimants.as_slice()) {
        ([node], _) => Some(node),
        ([], [node]) => Some(node),
        _ => None,
    }
}

/// Every Node whose providerID names `instance_id`: more than one means some Node lies
/// about its identity (a kubelet sets its own providerID).
pub fn claimants<'a>(nodes: &'a [std::sync::Arc<Node>], instance_id: &str) -> Vec<&'a Node> {
    nodes
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(parse_provider_id)
                .is_some_and(|p| p.instance_id == instance_id)
        })
        .collect()
}

fn pin_of(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(PIN_LABEL_KEY)
        .map(String::as_str)
}

/// Why a Node that claims `instance` is not trusted with a database, if it is not: another
/// Node claims the same instance, or its name is not the instance's private DNS name (the name
/// a kubelet on that instance registers under).
pub fn untrusted(claimants: &[&Node], node: &Node, instance: &Instance) -> Option<String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if claimants.len() > 1 {
        let names: Vec<String> = claimants
            .iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect();
        return Some(format!(
            "{} Nodes claim instance {} ({}): none is trusted with the database",
            claimants.len(),
            instance.id,
            names.join(", ")
        ));
    }
    match instance.private_dns_name.as_deref() {
        Some(dns) if dns != name => Some(format!(
            "Node {name} claims instance {} whose private DNS name is {dns}: not trusted with the database",
            instance.id
        )),
        _ => None,
    }
}

/// True when the Node carries the dedicated label and taint of this QuestDB, and the pin label
/// naming `instance_id` (which only the operator sets).
pub fn is_dedicated(node: &Node, dedicated: &DedicatedNode, instance_id: &str) -> bool {
    let label = |key: &str| node.metadata.labels.as_ref().and_then(|l| l.get(key));
    let labelled = label(DEDICATED_LABEL_KEY).is_some_and(|v| *v == dedicated.label_value)
        && label(PIN_LABEL_KEY).is_some_and(|v| v == instance_id);
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == DEDICATED_TAINT_KEY
                    && t.effect == DEDICATED_TAINT_EFFECT
                    && t.value.as_deref() == Some(dedicated.label_value.as_str())
            })
        });
    labelled && tainted
}

pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn waiting(reason: NodeReadyReason, message: impl Into<String>) -> NodeStep {
    NodeStep::Wait(Verdict::new(false, reason, message))
}

pub fn plan(v: &NodeView) -> NodeStep {
    let mine = owned_by(v.instances, v.uid);
    let wanted = v.spec.filter(|_| !v.release);
    if wanted.is_none() {
        return released(v, &mine);
    }

    let Some(generation) = v.status.node_generation else {
        return NodeStep::PersistGeneration(1);
    };
    let instance = match &v.status.instance_id {
        Some(id) => match mine.iter().find(|i| &i.id == id) {
            Some(i) => *i,
            None => return NodeStep::LookUp(id.clone()),
        },
        None => return unrecorded(v, &mine, generation),
    };

    match instance.state {
        InstanceState::ShuttingDown | InstanceState::Terminated => NodeStep::Replace {
            next_generation: generation + 1,
            gone: instance.id.clone(),
            reason: instance.state_reason.clone(),
        },
        InstanceState::Pending => waiting(
            NodeReadyReason::Launching,
            format!("instance {} is starting", instance.id),
        ),
        InstanceState::Stopping | InstanceState::Stopped => waiting(
            NodeReadyReason::InstanceStopped,
            format!(
                "instance {} is {}; start it again or delete it to get a new node",
                instance.id,
                instance.state.as_str()
            ),
        ),
        InstanceState::Running => match node_for(v.nodes, &instance.id) {
            None => without_node(v, instance),
            Some(node) if !is_dedicated(node, v.dedicated, &instance.id) => {
                match untrusted(&claimants(v.nodes, &instance.id), node, instance) {
                    Some(why) => waiting(NodeReadyReason::NodeIdentityConflict, why),
                    None => NodeStep::Dedicate {
                        node: node.metadata.name.clone().unwrap_or_default(),
                        instance: instance.id.clone(),
                    },
                }
            }
            Some(node) => NodeStep::Ready {
                node: node.metadata.name.clone().unwrap_or_default(),
                ready: node_is_ready(node),
            },
        },
    }
}

/// The node is not wanted (no `spec.node`, paused, being deleted): every live instance of the
/// database terminated, then the record forgotten once EC2 shows them gone.
fn released(v: &NodeView, mine: &[&Instance]) -> NodeStep {
    let live: Vec<String> = mine
        .iter()
        .filter(|i| !i.state.is_gone())
        .map(|i| i.id.clone())
        .collect();
    if !live.is_empty() {
        return NodeStep::Terminate(live);
    }
    // Only "terminated" is final: a shutting-down instance may still hold the volume.
    if let Some(i) = mine.iter().find(|i| i.state == InstanceState::ShuttingDown) {
        return waiting(
            NodeReadyReason::Releasing,
            format!("waiting for instance {} to terminate", i.id),
        );
    }
    if let Some(id) = &v.status.instance_id {
        // The cache has never seen it (or lost it): make sure before forgetting it.
        if !mine.iter().any(|i| &i.id == id) {
            return NodeStep::LookUp(id.clone());
        }
    }
    match (&v.status.instance_id, v.status.node_generation) {
        (Some(_), generation) => NodeStep::Released {
            next_generation: generation.map(|g| g + 1),
        },
        (None, _) => NodeStep::Nothing,
    }
}

/// No instance recorded for this generation: the one launched for it is recorded (or replaced
/// when gone), or one is launched, unless a permanent failure or the namespace's cap says no.
fn unrecorded(v: &NodeView, mine: &[&Instance], generation: i64) -> NodeStep {
    let of_generation: Vec<&Instance> = mine
        .iter()
        .copied()
        .filter(|i| gen_of(i) == Some(generation))
        .collect();
    // The same rule as the provider's launch: a live one wins; a gone one means this
    // generation is spent.
    let pick = of_generation
        .iter()
        .find(|i| !i.state.is_gone())
        .or_else(|| of_generation.first());
    match pick {
        Some(i) if i.state.is_gone() => NodeStep::Replace {
            next_generation: generation + 1,
            gone: i.id.clone(),
            reason: i.state_reason.clone(),
        },
        Some(i) => NodeStep::RecordInstance(Box::new((*i).clone())),
        None => match v.recent_permanent_failure {
            Some(message) => NodeStep::Failed(Verdict::new(
                false,
                NodeReadyReason::LaunchFailed,
                message,
            )),
            None => match v.namespace_node_cap {
                Some(cap) if generation == 1 && v.namespace_nodes >= cap => waiting(
                    NodeReadyReason::NamespaceQuota,
                    format!(
                        "this namespace already has {} databases on dedicated nodes, the most one namespace may have (--max-dedicated-nodes-per-namespace {cap}); the node is launched once one goes",
                        v.namespace_nodes
                    ),
                ),
                _ => NodeStep::Launch(generation),
            },
        },
    }
}

/// A running instance whose Node has not registered: waiting for it, a Node that claims it
/// without proof, or one that never joins (terminated, or left to failover).
fn without_node(v: &NodeView, instance: &Instance) -> NodeStep {
    let claimants = claimants(v.nodes, &instance.id);
    match claimants
        .first()
        .and_then(|n| untrusted(&claimants, n, instance))
    {
        Some(why) => waiting(NodeReadyReason::NodeIdentityConflict, why),
        None => match instance
            .launched_at
            .and_then(|t| v.now.duration_since(t).ok())
            .filter(|ran| *ran >= v.join_timeout)
        {
            Some(_) if !v.failover_replaces => NodeStep::TerminateNeverJoined {
                instance: instance.id.clone(),
                message: format!(
                    "instance {} ran longer than --node-join-timeout ({}s) and no Node registered for it: terminated, another is launched. {NEVER_JOINED_HINT}",
                    instance.id,
                    v.join_timeout.as_secs()
                ),
            },
            // The message stays the same while it lasts: one event, not one a minute.
            Some(_) => waiting(
                NodeReadyReason::NodeNeverJoined,
                format!(
                    "instance {} has run longer than --node-join-timeout ({}s) and no Node has registered for it; failover replaces it. {NEVER_JOINED_HINT}",
                    instance.id,
                    v.join_timeout.as_secs()
                ),
            ),
            None => waiting(
                NodeReadyReason::WaitingForNode,
                format!(
                    "instance {} is running; waiting for its Node to register",
                    instance.id
                ),
            ),
        },
    }
}

/// Replacements of instances that went away by themselves, per QuestDB and hour: more is a
/// pattern (a KMS key policy, a volume limit, a bad AMI) for a person, not a loop.
pub const MAX_RELAUNCHES_PER_HOUR: usize = 5;
const RELAUNCH_BASE: Duration = Duration::from_secs(30);
const RELAUNCH_MAX: Duration = Duration::from_secs(900);
const HOUR: Duration = Duration::from_secs(3600);

/// Whether a replacement may launch now, given the earlier ones (`history`, any order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relaunch {
    Now,
    /// Exponential backoff since the last replacement: 30 s, 1, 2, 4 min ... capped at 15.
    Backoff(Duration),
    /// The hourly cap is reached; the oldest replacement ages out after this long.
    Capped(Duration),
}

pub fn relaunch(history: &[Instant], now: Instant) -> Relaunch {
    let recent: Vec<_> = history
        .iter()
        .filter(|t| now.saturating_duration_since(**t) < HOUR)
        .copied()
        .collect();
    if recent.len() >= MAX_RELAUNCHES_PER_HOUR {
        let oldest = recent.iter().min().copied().unwrap_or(now);
        return Relaunch::Capped(HOUR.saturating_sub(now.saturating_duration_since(oldest)));
    }
    let Some(last) = recent.iter().max().copied() else {
        return Relaunch::Now;
    };
    let exp = u32::try_from(recent.len() - 1).unwrap_or(u32::MAX).min(10);
    let backoff = RELAUNCH_BASE
        .saturating_mul(2u32.saturating_pow(exp))
        .min(RELAUNCH_MAX);
    let since = now.saturating_duration_since(last);
    if since >= backoff {
        Relaunch::Now
    } else {
        Relaunch::Backoff(backoff - since)
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;

/// The well-known label the service controllers (AWS load balancer controller, cloud
/// provider) read to leave a node out of load balancer targets.
pub const EXCLUDE_FROM_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// A failover's replacement is launched with the image and instance type of the node the
/// database last ran on (`status.nodeImage`, `status.nodeInstanceType`, kept through the
/// failover), not with `spec.node` as it stands: a spec that names an untried target (a move
/// still waiting for its window) or a refused one (a move that aborted on an unknown image or
/// type) would leave the database with no node at all when its only good one died. The move
/// to the spec's target is still the node move's to make, from a running database.
pub fn for_failover(mut req: LaunchRequest, status: &QuestDBStatus) -> LaunchRequest {
    if !crate::plan::failover::in_progress(status) {
        return req;
    }
    if let Some(image) = status.node_image.as_deref().filter(|i| !i.is_empty()) {
        req.image = image.to_string();
    }
    if let Some(kind) = status
        .node_instance_type
        .as_deref()
        .filter(|t| !t.is_empty())
    {
        req.instance_type = kind.to_string();
    }
    req
}

pub fn launch_request(
    qdb: &QuestDB,
    uid: &str,
    generation: i64,
    dedicated: &DedicatedNode,
) -> Option<LaunchRequest> {
    let spec = qdb.spec.node.as_ref()?;
    Some(LaunchRequest {
        namespace: qdb.namespace().unwrap_or_default(),
        name: qdb.name_any(),
        uid: uid.to_string(),
        node_generation: generation,
        image: spec.image.clone(),
        instance_type: spec.instance_type.clone(),
        zone: spec.zone.clone(),
        labels: [
            (
                DEDICATED_LABEL_KEY.to_string(),
                dedicated.label_value.clone(),
            ),
            // A LoadBalancer Service of another application must not send its traffic through
            // a database's node (instance-mode targets are every node without this label).
            (EXCLUDE_FROM_LOAD_BALANCERS.to_string(), "true".to_string()),
        ]
        .into(),
        taints: vec![Taint::new(
            DEDICATED_TAINT_KEY,
            Some(&dedicated.label_value),
            DEDICATED_TAINT_EFFECT,
        )],
        public_ip: qdb.spec.dns.as_ref().is_some_and(|d| d.public),
        fallback_instance_types: spec.fallback_instance_types.clone(),
        cluster_id: None,
    })
}
