//! Operator upgrades at a bounded rate. A new operator version that builds a different pod
//! template would otherwise restart every database at once, the moment it starts: the
//! StatefulSet controller rolls a pod as soon as its template changes. A change the new version
//! makes on its own (the user changed nothing) therefore waits for one of a few upgrade slots
//! (`--max-concurrent-operator-rollouts`) and for the database's maintenance window when it has
//! one. Pure.
//!
//! What is never held: a database that is not serving (a restart costs it nothing), a failover
//! or node move under way, and a change of the replica count (pause, resume): those are the
//! operator's and the user's own steps, and holding them could strand a database.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::plan::maintenance::WindowState;

/// What the gate looks at for one database.
#[derive(Clone, Debug)]
pub struct RollInputs<'a> {
    /// The StatefulSet's spec differs from what this operator builds (a restart when the pod
    /// template is what differs).
    pub differs: bool,
    /// The StatefulSet was last written by another operator version (or by one from before
    /// versions were recorded).
    pub other_version: bool,
    /// The database serves now: Ready, its pod at the StatefulSet's current revision.
    pub serving: bool,
    /// A failover or node move is under way, or the replica count changes.
    pub steering: bool,
    /// The other databases whose upgrade roll this operator began and has not seen finish.
    pub rolling: &'a [String],
    /// How many may roll at once.
    pub limit: usize,
    /// The database's maintenance window, if it has one (an unreadable one is `Err`).
    pub window: Option<Result<WindowState, String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollGate {
    /// Write the StatefulSet now (`begins`: an upgrade roll that takes a slot).
    Apply { begins: bool },
    /// Keep the StatefulSet as it is for now, saying why.
    Hold { message: String },
}

pub fn gate(i: &RollInputs) -> RollGate {
    if !(i.differs && i.other_version && i.serving && !i.steering) {
        return RollGate::Apply { begins: false };
    }
    match &i.window {
        Some(Ok(WindowState::OpensAt(at))) => {
            return RollGate::Hold {
                message: format!(
                    "this operator version builds a different pod template: the database restarts in its maintenance window, which opens at {at}"
                ),
            }
        }
        Some(Err(e)) => {
            return RollGate::Hold {
                message: format!(
                    "this operator version builds a different pod template, and the maintenance window cannot be read ({e}): the restart waits until it can"
                ),
            }
        }
        Some(Ok(WindowState::Open)) | None => {}
    }
    if i.rolling.len() >= i.limit.max(1) {
        return RollGate::Hold {
            message: format!(
                "this operator version builds a different pod template: the database restarts when one of {} upgrade slot(s) frees (restarting now: {})",
                i.limit.max(1),
                i.rolling.join(", ")
            ),
        };
    }
    RollGate::Apply { begins: true }
}

/// When a held database is looked at again at the latest (a finished roll wakes them sooner).
pub fn recheck(
    window: Option<&Result<WindowState, String>>,
    now: Timestamp,
) -> std::time::Duration {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(30);
    match window {
        Some(Ok(WindowState::OpensAt(at))) => at
            .duration_since(now)
            .try_into()
            .map_or(EVERY, |d: std::time::Duration| d.max(EVERY)),
        _ => EVERY,
    }
}

/// A roll not seen finishing within this long frees its slot anyway (a database that does not
/// come back must not stop every other upgrade; its own condition says why it is down).
pub const ROLL_PATIENCE: Duration = Duration::from_secs(600);

/// This operator's version, the upgrade-roll limit, and the rolls and holds of this process.
pub struct OperatorRollouts {
    pub version: String,
    pub limit: usize,
    /// QuestDB uid -> (namespace/name, when the roll began).
    pub begun: Mutex<HashMap<String, (String, String, Instant)>>,
    /// Databases held for a slot: woken when a roll finishes.
    pub held: Mutex<HashSet<(String, String)>>,
}

impl OperatorRollouts {
    pub fn new(version: impl Into<String>, limit: usize) -> Self {
        Self {
            version: version.into(),
            limit,
            begun: Mutex::default(),
            held: Mutex::default(),
        }
    }
}

impl Default for OperatorRollouts {
    fn default() -> Self {
        Self::new(env!("CARGO_PKG_VERSION"), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade<'a>(rolling: &'a [String]) -> RollInputs<'a> {
        RollInputs {
            differs: true,
            other_version: true,
            serving: true,
            steering: false,
            rolling,
            limit: 1,
            window: None,
        }
    }

    /// The harm: an operator upgrade that restarts every database at once. The first takes
    /// the slot; the next waits, naming the one restarting.
    #[test]
    fn an_upgrade_restarts_one_database_at_a_time() {
        assert_eq!(gate(&upgrade(&[])), RollGate::Apply { begins: true });
        let busy = ["orders/db1".to_string()];
        match gate(&upgrade(&busy)) {
            RollGate::Hold { message } => assert!(message.contains("orders/db1"), "{message}"),
            other => panic!("{other:?}"),
        }
        let two = RollInputs {
            limit: 2,
            ..upgrade(&busy)
        };
        assert_eq!(gate(&two), RollGate::Apply { begins: true });
    }

    /// Never held: the user's own change (same operator version), a database that does not
    /// serve, a failover, a move or a pause under way, and nothing to change.
    #[test]
    fn only_an_upgrades_own_change_to_a_serving_database_is_held() {
        let busy = ["orders/db1".to_string()];
        for (what, i) in [
            (
                "the user's change",
                RollInputs {
                    other_version: false,
                    ..upgrade(&busy)
                },
            ),
            (
                "not serving",
                RollInputs {
                    serving: false,
                    ..upgrade(&busy)
                },
            ),
            (
                "steering",
                RollInputs {
                    steering: true,
                    ..upgrade(&busy)
                },
            ),
            (
                "nothing differs",
                RollInputs {
                    differs: false,
                    ..upgrade(&busy)
                },
            ),
        ] {
            assert_eq!(gate(&i), RollGate::Apply { begins: false }, "{what}");
        }
    }

    /// A database with a maintenance window restarts in it, slot or not.
    #[test]
    fn a_database_with_a_maintenance_window_restarts_in_it() {
        let at: Timestamp = "2026-12-01T02:00:00Z".parse().unwrap();
        let closed = RollInputs {
            window: Some(Ok(WindowState::OpensAt(at))),
            ..upgrade(&[])
        };
        assert!(
            matches!(gate(&closed), RollGate::Hold { message } if message.contains("2026-12-01T02:00:00Z"))
        );
        let open = RollInputs {
            window: Some(Ok(WindowState::Open)),
            ..upgrade(&[])
        };
        assert_eq!(gate(&open), RollGate::Apply { begins: true });
        let now: Timestamp = "2026-12-01T01:00:00Z".parse().unwrap();
        assert_eq!(
            recheck(closed.window.as_ref(), now),
            std::time::Duration::from_secs(3600)
        );
    }
}
