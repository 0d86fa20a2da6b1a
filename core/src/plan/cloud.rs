//! Which cloud machine acts in a reconcile, and in what role: the precedence between the
//! release fences, a failover, a node move, a version upgrade, the dedicated node's own steps
//! and DNS, in one place. [`turns`] decides every machine's turn from one view; the executor
//! gives the turns in the order of [`CloudTurns`] and ends the reconcile after the first one
//! that records a step (its status write), so one machine acts per reconcile and the next turn
//! is decided on the record read back from the apiserver (the watch event of that write starts
//! the next reconcile).
//!
//! The order, from the table tests below:
//! - a release (pause, deletion, `spec.node` removed) first finishes a failover's fence, and
//!   fences a dead node that holds the database pod (a pod on a dead kubelet never goes);
//! - a released database (paused, being deleted, or without `spec.node`) moves nothing: a
//!   failover under way only shows its progress (its fence is finished by the release);
//! - a failover under way goes on, and pre-empts a move that has not stopped the database
//!   (one that has is the move's to finish or roll back: it owns the database);
//! - a move that owns the database (it stopped it and has not seen it answer again) holds back
//!   any new failover: it fences a node that dies itself;
//! - a version upgrade under way holds back a new move (one already active goes on);
//! - otherwise each machine decides for itself whether it starts;
//! - the dedicated node's steps come last: a node no longer wanted waits while the database
//!   pod still runs on it, and is released only once the database has stopped; DNS follows
//!   the node.

use crate::api::QuestDBStatus;
use crate::plan::{failover, node_move, version_upgrade};

/// What the turns are decided on.
#[derive(Clone, Copy, Debug)]
pub struct CloudView<'a> {
    /// `spec.node` is set (a dedicated node is wanted).
    pub dedicated: bool,
    pub paused: bool,
    pub deleting: bool,
    /// The database has stopped: its StatefulSet is at zero and its pod gone.
    pub stopped: bool,
    /// The database pod still runs on the node of the recorded instance.
    pub pod_on_recorded_node: bool,
    pub status: &'a QuestDBStatus,
}

impl CloudView<'_> {
    fn released(&self) -> bool {
        !self.dedicated || self.paused || self.deleting
    }

    /// `spec.node` was removed and the unpinned pod has not left the node yet: the node stays.
    fn node_holds_the_pod(&self) -> bool {
        !self.dedicated && !self.paused && !self.deleting && self.pod_on_recorded_node
    }
}

/// What a release does before anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReleaseFence {
    /// A failover under way finishes its fence and the old node's release first (or ends,
    /// once the old node let the volume go), whatever the spec says now.
    pub finish_failover: bool,
    /// The database pod still runs on a node that is being released: if that node is dead,
    /// it is fenced (its pod would never go). Given only when no failover's fence is waited on.
    pub fence_dead_node: bool,
}

pub fn release_fence(v: &CloudView) -> ReleaseFence {
    let releasing = v.paused || v.deleting || !v.dedicated;
    ReleaseFence {
        finish_failover: releasing && failover::in_progress(v.status),
        fence_dead_node: ((v.paused || v.deleting) && !v.stopped) || v.node_holds_the_pod(),
    }
}

/// The failover's turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailoverTurn {
    /// Nothing to do or show.
    Nothing,
    /// Released with a failover under way: its progress is shown, the release finishes it.
    ShowProgress,
    /// A failover under way takes its next step.
    Steps,
    /// No instance recorded yet: armed, nothing to judge.
    Armed,
    /// A node move owns the database: armed, and the move fences a node that dies.
    HeldByMove,
    /// The node is judged, and a failover may start.
    Judge,
}

pub fn failover_turn(v: &CloudView) -> FailoverTurn {
    let underway = failover::in_progress(v.status);
    if v.released() {
        return if underway {
            FailoverTurn::ShowProgress
        } else {
            FailoverTurn::Nothing
        };
    }
    if underway {
        FailoverTurn::Steps
    } else if v.status.instance_id.is_none() {
        FailoverTurn::Armed
    } else if node_move::owns_the_database(v.status) {
        FailoverTurn::HeldByMove
    } else {
        FailoverTurn::Judge
    }
}

/// The node move's turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMoveTurn {
    /// Nothing to do or show (released, or a failover has the database).
    Nothing,
    /// A failover started before the move stopped the database: the move is aborted.
    PreemptedByFailover,
    /// A version upgrade has the database stopped or starting: a move begins after it.
    HeldByVersionUpgrade,
    /// A move (or a retained old node to release) takes its next step.
    Steps,
    /// No move under way: one may start.
    MayStart,
}

pub fn node_move_turn(v: &CloudView) -> NodeMoveTurn {
    if v.released() {
        return NodeMoveTurn::Nothing;
    }
    if failover::in_progress(v.status) {
        let unstopped = v
            .status
            .node_move
            .as_ref()
            .is_some_and(|m| node_move::before_stopping(m.phase));
        return if unstopped {
            NodeMoveTurn::PreemptedByFailover
        } else {
            NodeMoveTurn::Nothing
        };
    }
    let active = node_move::active(v.status);
    if version_upgrade::in_progress(v.status.version_upgrade.as_ref()) && !active {
        NodeMoveTurn::HeldByVersionUpgrade
    } else if active {
        NodeMoveTurn::Steps
    } else {
        NodeMoveTurn::MayStart
    }
}

/// The dedicated node's own turn (`plan::node` decides its step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeTurn {
    /// No node is wanted, recorded or being launched: nothing in the cloud to keep or release.
    Uninvolved,
    /// `spec.node` was removed while the database pod still runs on the node: it waits.
    HeldForThePod,
    /// The node's next step; `release`: paused or being deleted with the database stopped, so
    /// the node goes (a converged node may take the steady-state shortcut only when not).
    Steps { release: bool },
}

pub fn node_turn(v: &CloudView) -> NodeTurn {
    let involved =
        v.dedicated || v.status.node_generation.is_some() || v.status.instance_id.is_some();
    if !involved {
        NodeTurn::Uninvolved
    } else if v.node_holds_the_pod() {
        NodeTurn::HeldForThePod
    } else {
        NodeTurn::Steps {
            release: (v.paused || v.deleting) && v.stopped,
        }
    }
}

/// Every machine's turn, in the order they are given (DNS, last, follows the node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloudTurns {
    pub release_fence: ReleaseFence,
    pub failover: FailoverTurn,
    pub node_move: NodeMoveTurn,
    pub node: NodeTurn,
}

pub fn turns(v: &CloudView) -> CloudTurns {
    CloudTurns {
        release_fence: release_fence(v),
        failover: failover_turn(v),
        node_move: node_move_turn(v),
        node: node_turn(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        FailoverPhase, FailoverStatus, NodeMovePhase, NodeMoveStatus, VersionUpgradeStatus,
        VersionUpgradeStep,
    };

    #[derive(Clone, Copy, Debug)]
    enum Released {
        No,
        Paused,
        Deleting,
        NoNode,
    }

    fn status(
        instance: bool,
        failover: Option<FailoverPhase>,
        moving: Option<NodeMovePhase>,
        upgrading: bool,
    ) -> QuestDBStatus {
        QuestDBStatus {
            instance_id: instance.then(|| "i-1".to_string()),
            failover: failover.map(|phase| FailoverStatus {
                phase,
                ..Default::default()
            }),
            node_move: moving.map(|phase| NodeMoveStatus {
                phase,
                ..Default::default()
            }),
            version_upgrade: upgrading.then(|| VersionUpgradeStatus {
                step: VersionUpgradeStep::Starting,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn failover_and_move(released: Released, s: &QuestDBStatus) -> (FailoverTurn, NodeMoveTurn) {
        let v = CloudView {
            dedicated: !matches!(released, Released::NoNode),
            paused: matches!(released, Released::Paused),
            deleting: matches!(released, Released::Deleting),
            stopped: false,
            pod_on_recorded_node: false,
            status: s,
        };
        let all = turns(&v);
        (all.failover, all.node_move)
    }

    /// The precedence, row by row: (released, instance recorded, failover phase, move phase,
    /// version upgrade under way) -> (failover's turn, move's turn).
    #[test]
    fn one_table_says_which_machine_acts_and_which_waits() {
        use FailoverPhase as F;
        use FailoverTurn as FT;
        use NodeMovePhase as M;
        use NodeMoveTurn as MT;
        type Row = (Released, bool, Option<F>, Option<M>, bool, FT, MT);
        let rows: &[Row] = &[
            // A converged database: each machine decides whether it starts.
            (
                Released::No,
                true,
                None,
                None,
                false,
                FT::Judge,
                MT::MayStart,
            ),
            // A node not launched yet: nothing to judge.
            (
                Released::No,
                false,
                None,
                None,
                false,
                FT::Armed,
                MT::MayStart,
            ),
            // A healthy record of an ended failover is no failover.
            (
                Released::No,
                true,
                Some(F::Healthy),
                None,
                false,
                FT::Judge,
                MT::MayStart,
            ),
            // A failover under way goes on and pre-empts a move that has not stopped the database.
            (
                Released::No,
                false,
                Some(F::Fencing),
                None,
                false,
                FT::Steps,
                MT::Nothing,
            ),
            (
                Released::No,
                false,
                Some(F::Fencing),
                Some(M::Provisioning),
                false,
                FT::Steps,
                MT::PreemptedByFailover,
            ),
            (
                Released::No,
                false,
                Some(F::Fencing),
                Some(M::NodeReady),
                false,
                FT::Steps,
                MT::PreemptedByFailover,
            ),
            (
                Released::No,
                false,
                Some(F::Fencing),
                Some(M::Moving),
                false,
                FT::Steps,
                MT::Nothing,
            ),
            // A move that stopped the database owns it: no new failover.
            (
                Released::No,
                true,
                None,
                Some(M::Stopping),
                false,
                FT::HeldByMove,
                MT::Steps,
            ),
            (
                Released::No,
                true,
                None,
                Some(M::Verifying),
                false,
                FT::HeldByMove,
                MT::Steps,
            ),
            // Before it stops the database, a dying node is the failover's.
            (
                Released::No,
                true,
                None,
                Some(M::Provisioning),
                false,
                FT::Judge,
                MT::Steps,
            ),
            // A retained old node is released by the move's steps; a failover may start.
            (
                Released::No,
                true,
                None,
                Some(M::Retaining),
                false,
                FT::Judge,
                MT::Steps,
            ),
            // An ended move starts nothing by itself.
            (
                Released::No,
                true,
                None,
                Some(M::Completed),
                false,
                FT::Judge,
                MT::MayStart,
            ),
            // A version upgrade holds back a new move, not one already active.
            (
                Released::No,
                true,
                None,
                None,
                true,
                FT::Judge,
                MT::HeldByVersionUpgrade,
            ),
            (
                Released::No,
                true,
                None,
                Some(M::Moving),
                true,
                FT::HeldByMove,
                MT::Steps,
            ),
            // Released: nothing moves; a failover under way shows where it is.
            (
                Released::Paused,
                true,
                None,
                Some(M::Provisioning),
                false,
                FT::Nothing,
                MT::Nothing,
            ),
            (
                Released::Deleting,
                false,
                Some(F::Fencing),
                None,
                false,
                FT::ShowProgress,
                MT::Nothing,
            ),
            (
                Released::NoNode,
                false,
                Some(F::Releasing),
                None,
                false,
                FT::ShowProgress,
                MT::Nothing,
            ),
            (
                Released::NoNode,
                true,
                None,
                None,
                false,
                FT::Nothing,
                MT::Nothing,
            ),
        ];
        for &(released, instance, failover, moving, upgrading, want_f, want_m) in rows {
            let s = status(instance, failover, moving, upgrading);
            assert_eq!(
                failover_and_move(released, &s),
                (want_f, want_m),
                "{released:?}, instance {instance}, failover {failover:?}, move {moving:?}, upgrading {upgrading}"
            );
        }
    }

    /// The release fences and the node's own turn, row by row: (released, database stopped,
    /// pod on the recorded node, failover under way, instance or generation recorded) ->
    /// (finish the failover's fence, fence a dead node, the node's turn).
    #[test]
    fn a_release_fences_first_and_the_node_goes_only_once_the_database_stopped() {
        use NodeTurn as N;
        type Row = (Released, bool, bool, bool, bool, bool, bool, N);
        let steps = N::Steps { release: false };
        let release = N::Steps { release: true };
        let rows: &[Row] = &[
            // A running dedicated database: no fence, the node's next step.
            (Released::No, false, true, false, true, false, false, steps),
            // A failover under way is its own turn's, not a release's.
            (Released::No, false, true, true, true, false, false, steps),
            // A database never given a node: nothing in the cloud.
            (
                Released::NoNode,
                false,
                false,
                false,
                false,
                false,
                false,
                N::Uninvolved,
            ),
            // Paused, still running: a dead node holding the pod is fenced; the node stays.
            (
                Released::Paused,
                false,
                true,
                false,
                true,
                false,
                true,
                steps,
            ),
            // Paused and stopped: the node goes.
            (
                Released::Paused,
                true,
                false,
                false,
                true,
                false,
                false,
                release,
            ),
            // Paused during a failover: its fence finishes first.
            (Released::Paused, false, true, true, true, true, true, steps),
            (
                Released::Paused,
                true,
                false,
                true,
                true,
                true,
                false,
                release,
            ),
            // Deleted: the same, as the finalizer runs it.
            (
                Released::Deleting,
                false,
                true,
                false,
                true,
                false,
                true,
                steps,
            ),
            (
                Released::Deleting,
                true,
                false,
                true,
                true,
                true,
                false,
                release,
            ),
            // spec.node removed, the pod still on the node: fenced if dead, the node waits.
            (
                Released::NoNode,
                false,
                true,
                false,
                true,
                false,
                true,
                N::HeldForThePod,
            ),
            // ...and once the pod has left it, the node goes through its steps (it is no
            // longer wanted, so they release it).
            (
                Released::NoNode,
                false,
                false,
                false,
                true,
                false,
                false,
                steps,
            ),
            (
                Released::NoNode,
                false,
                false,
                true,
                true,
                true,
                false,
                steps,
            ),
        ];
        for &(released, stopped, on_node, underway, recorded, finish, fence, node) in rows {
            let s = QuestDBStatus {
                instance_id: recorded.then(|| "i-1".to_string()),
                failover: underway.then(|| FailoverStatus {
                    phase: FailoverPhase::Fencing,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let v = CloudView {
                dedicated: !matches!(released, Released::NoNode),
                paused: matches!(released, Released::Paused),
                deleting: matches!(released, Released::Deleting),
                stopped,
                pod_on_recorded_node: on_node,
                status: &s,
            };
            let all = turns(&v);
            assert_eq!(
                (all.release_fence, all.node),
                (
                    ReleaseFence {
                        finish_failover: finish,
                        fence_dead_node: fence
                    },
                    node
                ),
                "{released:?}, stopped {stopped}, pod on node {on_node}, failover {underway}, recorded {recorded}"
            );
        }
    }
}
