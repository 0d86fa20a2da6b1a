//! Moving a database to a node built from a new image (or of a new instance type): when to
//! start, and the one next step. Pure; `questdb::upgrade` performs the steps.
//!
//! The new node is launched, joined, dedicated and Ready **before** the database stops, so
//! anything that goes wrong until then (an unknown image, a node that never joins, the field
//! set back) aborts with the database never touched. Then the recorded instance switches to the
//! new one: the StatefulSet's pin changes, its controller stops the pod gracefully (QuestDB
//! closes its tables within the termination grace period, the kubelet unmounts, the volume
//! detaches), and the pod starts on the new node with the same volume. Each step is recorded in
//! `status.upgrade` before its side effect.

use std::time::Duration;

use crate::api::{NodeSpec, QuestDBStatus, UpgradeStatus};
use crate::cloud::Instance;

pub mod phase {
    pub const PROVISIONING: &str = "Provisioning";
    pub const NODE_READY: &str = "NodeReady";
    /// Downtime starts: the database stops on the old node.
    pub const STOPPING: &str = "Stopping";
    pub const MOVING: &str = "Moving";
    /// Downtime ends when the pod is Ready and DNS names the new node.
    pub const VERIFYING: &str = "Verifying";
    pub const COMPLETED: &str = "Completed";
    pub const ABORTED: &str = "Aborted";
}

/// Whether an upgrade is under way.
pub fn in_progress(status: &QuestDBStatus) -> bool {
    status
        .upgrade
        .as_ref()
        .is_some_and(|u| u.phase != phase::COMPLETED && u.phase != phase::ABORTED)
}

/// Before this step the database runs untouched on the old node.
pub fn before_stopping(phase: &str) -> bool {
    matches!(phase, phase::PROVISIONING | phase::NODE_READY)
}

/// Whether `u` moves to what `spec` asks for.
pub fn targets(u: &UpgradeStatus, spec: &NodeSpec) -> bool {
    u.to_image.as_deref() == Some(spec.image.as_str())
        && u.to_instance_type.as_deref() == Some(spec.instance_type.as_str())
}

/// What decides whether to start: status alone (a converged QuestDB costs no AWS call).
pub struct StartView<'a> {
    pub spec: &'a NodeSpec,
    pub status: &'a QuestDBStatus,
    /// The database is Ready (an upgrade never starts from a broken state).
    pub database_ready: bool,
    pub failover_in_progress: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Start {
    No,
    /// The node differs from the spec, but the move waits (the reason is for a condition).
    Waiting(String),
    Go,
}

/// Whether the recorded instance differs from what the spec asks for (an instance type not
/// recorded, by an earlier operator version, is not a difference).
pub fn differs(spec: &NodeSpec, status: &QuestDBStatus) -> bool {
    let image = status
        .node_image
        .as_deref()
        .is_some_and(|i| i != spec.image);
    let kind = status
        .node_instance_type
        .as_deref()
        .is_some_and(|t| t != spec.instance_type);
    image || kind
}

pub fn should_start(v: &StartView) -> Start {
    if v.status.instance_id.is_none() || in_progress(v.status) || !differs(v.spec, v.status) {
        return Start::No;
    }
    // The same target failed before: not retried in a loop; a new edit (another target) is.
    let aborted_same = v
        .status
        .upgrade
        .as_ref()
        .is_some_and(|u| u.phase == phase::ABORTED && targets(u, v.spec));
    if aborted_same {
        return Start::No;
    }
    if v.failover_in_progress {
        return Start::Waiting("a failover is under way".into());
    }
    if !v.database_ready {
        return Start::Waiting(
            "the database is not Ready; a move starts from a healthy database only".into(),
        );
    }
    Start::Go
}

/// What the steps look at.
pub struct StepView<'a> {
    pub upgrade: &'a UpgradeStatus,
    pub spec: &'a NodeSpec,
    /// The new instance (from an idempotent launch in `Provisioning`, else EC2's cache).
    pub new_instance: Option<&'a Instance>,
    /// A permanent launch error (unknown image, unsupported type, no capacity).
    pub launch_error: Option<&'a str>,
    /// The new instance's Node: registered, dedicated (labels, taint, pin), Ready.
    pub new_node: Option<String>,
    pub new_node_dedicated: bool,
    pub new_node_ready: bool,
    /// How long the current phase has run.
    pub in_phase_for: Duration,
    /// How long the new node may take to join and become Ready.
    pub node_timeout: Duration,
    pub pod_on_old_node: bool,
    pub volume_on_old_node: bool,
    pub pod_running_on_new_node: bool,
    pub pod_ready: bool,
    pub dns_follows: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Launch (or find) the new instance and record its id.
    Launch,
    Dedicate {
        node: String,
        instance: String,
    },
    Advance(&'static str),
    /// Record the new instance as the database's: downtime starts.
    Switch,
    Wait(String),
    /// Terminate the new instance (if any); the database stays where it is.
    Abort {
        reason: &'static str,
        message: String,
    },
    /// The database answers on the new node: terminate the old instance.
    Finish,
}

pub fn next_step(v: &StepView) -> Step {
    let u = v.upgrade;
    if before_stopping(&u.phase) && !targets(u, v.spec) {
        return Step::Abort {
            reason: "Superseded",
            message: format!(
                "spec.node changed to {} ({}) while moving to {} ({}); the database stays on its node",
                v.spec.image,
                v.spec.instance_type,
                u.to_image.clone().unwrap_or_default(),
                u.to_instance_type.clone().unwrap_or_default()
            ),
        };
    }
    let abort = |reason, message: String| Step::Abort { reason, message };
    match u.phase.as_str() {
        phase::PROVISIONING => {
            if let Some(e) = v.launch_error {
                return abort("LaunchFailed", e.to_string());
            }
            let Some(i) = v.new_instance else {
                return Step::Launch;
            };
            if u.new_instance_id.as_deref() != Some(i.id.as_str()) {
                return Step::Launch;
            }
            if i.state.is_gone() {
                return abort(
                    "InstanceGone",
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
                (Some(node), false) => Step::Dedicate {
                    node: node.clone(),
                    instance: i.id.clone(),
                },
                (Some(_), true) => Step::Advance(phase::NODE_READY),
                (None, _) if v.in_phase_for > v.node_timeout => abort(
                    "NodeNeverJoined",
                    format!(
                        "instance {} did not join the cluster within {}s",
                        i.id,
                        v.node_timeout.as_secs()
                    ),
                ),
                (None, _) => Step::Wait(format!("waiting for instance {} to join", i.id)),
            }
        }
        phase::NODE_READY => {
            if v.new_node_ready {
                Step::Switch
            } else if v.in_phase_for > v.node_timeout {
                abort(
                    "NodeNeverReady",
                    format!(
                        "node {} did not become Ready within {}s",
                        v.new_node.clone().unwrap_or_default(),
                        v.node_timeout.as_secs()
                    ),
                )
            } else {
                Step::Wait("waiting for the new node to become Ready".into())
            }
        }
        phase::STOPPING => {
            if v.pod_on_old_node || v.volume_on_old_node {
                Step::Wait("the database stops on the old node and its volume detaches".into())
            } else {
                Step::Advance(phase::MOVING)
            }
        }
        phase::MOVING => {
            if v.pod_running_on_new_node {
                Step::Advance(phase::VERIFYING)
            } else {
                Step::Wait("the database starts on the new node".into())
            }
        }
        phase::VERIFYING => {
            if v.pod_ready && v.dns_follows {
                Step::Finish
            } else {
                Step::Wait("waiting for the database to answer on the new node".into())
            }
        }
        _ => Step::Wait(String::new()),
    }
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;
