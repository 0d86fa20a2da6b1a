//! What the cloud part of a reconcile hands to the rest of it (and to status).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use crate::api::{DnsReason, FailoverReason, NodeMoveReason, NodeReadyReason};
use crate::desired::DedicatedNode;
use crate::plan::conditions::Verdict;

/// What the rest of the reconcile needs from the cloud part.
#[derive(Default)]
pub(crate) struct CloudOutcome {
    /// Pin the pod to the dedicated node.
    pub dedicated: Option<DedicatedNode>,
    pub node_condition: Option<Verdict<NodeReadyReason>>,
    pub dns_condition: Option<Verdict<DnsReason>>,
    /// Automatic failover: armed, under way, held back or stuck.
    pub failover_condition: Option<Verdict<FailoverReason>>,
    /// Node image / instance type moves.
    pub node_move_condition: Option<Verdict<NodeMoveReason>>,
    /// The dedicated Node, once registered.
    pub node: Option<Arc<Node>>,
    /// Nothing left in the cloud for this QuestDB (the finalizer may go).
    pub released: bool,
    pub requeue: Option<Duration>,
    /// A turn recorded a step (a status write): the reconcile ends here, and the watch event
    /// of that write starts the next, which decides on the record read back.
    pub recorded: bool,
}

impl CloudOutcome {
    /// The node is not ready yet: the phase is Provisioning.
    pub(crate) fn provisioning(&self) -> bool {
        self.node_condition.as_ref().is_some_and(|c| !c.status)
    }

    /// A turn recorded a step: nothing is released yet (the next reconcile says), and what
    /// the turns so far reported is kept only for their requeue.
    pub(super) fn ended(mut self) -> Self {
        self.recorded = true;
        self.released = false;
        self
    }

    pub(super) fn requeue_within(&mut self, d: Duration) {
        self.requeue = sooner(self.requeue, Some(d));
    }
}

/// The sooner of two requeues, either of which may be absent.
pub(crate) fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One reconcile's turn of a cloud machine (the dedicated node, failover, node move, DNS), the
/// one shape every machine's turn returns: the condition it reports, how soon it wants to be
/// looked at again, and what else it saw that the rest of the stage reads (`also`: the
/// dedicated node's Node, instance and release; nothing for the others). A requeue of `None`
/// waits for a watch event: the one its own status write causes, or a change of what it waits
/// on.
#[derive(Debug)]
pub(crate) struct Turn<R, Also = ()> {
    /// `None`: the machine has no condition to report (no `spec.dns`, say).
    pub condition: Option<Verdict<R>>,
    pub requeue: Option<Duration>,
    pub also: Also,
}

impl<R, Also: Default> Default for Turn<R, Also> {
    fn default() -> Self {
        Self {
            condition: None,
            requeue: None,
            also: Also::default(),
        }
    }
}

impl<R: crate::api::ConditionReason, Also: Default> Turn<R, Also> {
    /// Reports `condition` (or none); nothing to look at again unless a watch event says so.
    pub(crate) fn decided(condition: Option<Verdict<R>>) -> Self {
        Self {
            condition,
            ..Self::default()
        }
    }

    /// Nothing to look at again unless a watch event says so.
    pub(crate) fn settled(condition: Verdict<R>) -> Self {
        Self::decided(Some(condition))
    }

    /// Waits on something no watch reports (EC2, a clock): looked at again within `d`.
    pub(crate) fn again_within(condition: Verdict<R>, d: Duration) -> Self {
        Self {
            condition: Some(condition),
            requeue: Some(d),
            ..Self::default()
        }
    }

    /// The sooner of this turn's requeue and `d`, if any.
    pub(crate) fn sooner(mut self, d: Option<Duration>) -> Self {
        self.requeue = sooner(self.requeue, d);
        self
    }

    /// Looked at again within `d` at the latest.
    pub(crate) fn requeue_within(&mut self, d: Duration) {
        self.requeue = sooner(self.requeue, Some(d));
    }
}

impl CloudOutcome {
    /// Keeps `turn`'s requeue; returns its condition.
    pub(crate) fn absorb<R, Also>(&mut self, turn: Turn<R, Also>) -> Option<Verdict<R>> {
        self.requeue = sooner(self.requeue, turn.requeue);
        turn.condition
    }
}
