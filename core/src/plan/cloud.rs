//! Which cloud machine acts in a reconcile, and in what role: the precedence between a
//! failover, a node move and a version upgrade, in one place. Each machine asks for its turn
//! with the status as it is when its turn comes (a failover started earlier in the same
//! reconcile pre-empts the move that asks after it), and performs only what its turn allows.
//!
//! The order, from the table test below:
//! - a released database (paused, being deleted, or without `spec.node`) moves nothing: a
//!   failover under way only shows its progress (its fence is finished by the release);
//! - a failover under way goes on, and pre-empts a move that has not stopped the database
//!   (one that has is the move's to finish or roll back: it owns the database);
//! - a move that owns the database (it stopped it and has not seen it answer again) holds back
//!   any new failover: it fences a node that dies itself;
//! - a version upgrade under way holds back a new move (one already active goes on);
//! - otherwise each machine decides for itself whether it starts.

use crate::api::QuestDBStatus;
use crate::plan::{failover, node_move, version_upgrade};

/// What the turns are decided on.
#[derive(Clone, Copy, Debug)]
pub struct CloudView<'a> {
    /// `spec.node` is set (a dedicated node is wanted).
    pub dedicated: bool,
    pub paused: bool,
    pub deleting: bool,
    pub status: &'a QuestDBStatus,
}

impl CloudView<'_> {
    fn released(&self) -> bool {
        !self.dedicated || self.paused || self.deleting
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

    fn turns(released: Released, s: &QuestDBStatus) -> (FailoverTurn, NodeMoveTurn) {
        let v = CloudView {
            dedicated: !matches!(released, Released::NoNode),
            paused: matches!(released, Released::Paused),
            deleting: matches!(released, Released::Deleting),
            status: s,
        };
        (failover_turn(&v), node_move_turn(&v))
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
                turns(released, &s),
                (want_f, want_m),
                "{released:?}, instance {instance}, failover {failover:?}, move {moving:?}, upgrading {upgrading}"
            );
        }
    }
}
