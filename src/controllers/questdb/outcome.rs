//! What the cloud part of a reconcile hands to the rest of it (and to status).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use crate::desired::DedicatedNode;
use crate::plan::conditions::Verdict;

/// What the rest of the reconcile needs from the cloud part.
#[derive(Default)]
pub struct CloudOutcome {
    /// Pin the pod to the dedicated node.
    pub dedicated: Option<DedicatedNode>,
    pub node_condition: Option<Verdict>,
    pub dns_condition: Option<Verdict>,
    /// Automatic failover: armed, under way, held back or stuck.
    pub failover_condition: Option<Verdict>,
    /// Node image / instance type moves.
    pub node_move_condition: Option<Verdict>,
    /// The dedicated Node, once registered.
    pub node: Option<Arc<Node>>,
    /// Nothing left in the cloud for this QuestDB (the finalizer may go).
    pub released: bool,
    pub requeue: Option<Duration>,
}

impl CloudOutcome {
    /// The node is not ready yet: the phase is Provisioning.
    pub fn provisioning(&self) -> bool {
        self.node_condition.as_ref().is_some_and(|c| !c.status)
    }

    pub(super) fn requeue_within(&mut self, d: Duration) {
        self.requeue = Some(self.requeue.map_or(d, |r| r.min(d)));
    }
}
