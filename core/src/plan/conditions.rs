//! `metav1.Condition` bookkeeping shared by every controller.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::ConditionReason;

/// A controller's verdict on one condition (status, reason, message), before the timestamps
/// of a Kubernetes `Condition` are attached. The condition's type is its reason's
/// ([`ConditionReason::CONDITION`]): a `Verdict<NodeReadyReason>` is a `NodeReady` condition
/// and can carry no other condition's reason:
///
/// ```compile_fail
/// use questdb_operator::api::DnsReason;
/// use questdb_operator::api::NodeReadyReason;
/// use questdb_operator::plan::conditions::Verdict;
///
/// let node_ready: Verdict<NodeReadyReason> = Verdict::new(false, DnsReason::Published, "");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict<R> {
    pub status: bool,
    pub reason: R,
    pub message: String,
}

impl<R: ConditionReason> Verdict<R> {
    pub fn new(status: bool, reason: R, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
        }
    }

    /// The same verdict among those of other condition types (what [`merge`] takes).
    pub fn desired(&self) -> Desired {
        Desired {
            type_: R::CONDITION,
            status: self.status,
            reason: self.reason.into(),
            message: self.message.clone(),
        }
    }
}

/// A verdict of any condition type, its reason as text: the list [`merge`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

fn status_str(status: bool) -> &'static str {
    if status {
        "True"
    } else {
        "False"
    }
}

/// Merges `desired` into `existing`. `lastTransitionTime` only moves when the status flips, so a
/// reconcile that changes nothing produces an identical list (and therefore no status write).
pub fn merge(
    existing: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = desired
        .iter()
        .map(|d| {
            let status = status_str(d.status).to_string();
            let previous = existing.iter().find(|c| c.type_ == d.type_);
            let last_transition_time = match previous {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => Time(now),
            };
            Condition {
                type_: d.type_.to_string(),
                status,
                reason: d.reason.to_string(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();
    // Conditions owned by other controllers (e.g. failover, upgrade) are kept untouched.
    for c in existing {
        if !desired.iter().any(|d| d.type_ == c.type_) {
            out.push(c.clone());
        }
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// Conditions whose status changed between two lists, as `(type, status, reason)`.
pub fn transitions<'a>(before: &[Condition], after: &'a [Condition]) -> Vec<&'a Condition> {
    after
        .iter()
        .filter(|a| {
            !before
                .iter()
                .any(|b| b.type_ == a.type_ && b.status == a.status && b.reason == a.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ReadyReason;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn unchanged_status_keeps_transition_time() {
        let first = merge(
            &[],
            &[Verdict::new(false, ReadyReason::Creating, "x").desired()],
            Some(1),
            t(100),
        );
        let second = merge(
            &first,
            &[Verdict::new(false, ReadyReason::Creating, "x").desired()],
            Some(1),
            t(200),
        );
        assert_eq!(first, second);
        assert_eq!(second[0].last_transition_time, Time(t(100)));
    }

    #[test]
    fn flipped_status_moves_transition_time() {
        let first = merge(
            &[],
            &[Verdict::new(false, ReadyReason::Creating, "x").desired()],
            Some(1),
            t(100),
        );
        let second = merge(
            &first,
            &[Verdict::new(true, ReadyReason::Running, "ok").desired()],
            Some(1),
            t(200),
        );
        assert_eq!(second[0].status, "True");
        assert_eq!(second[0].last_transition_time, Time(t(200)));
        assert_eq!(transitions(&first, &second).len(), 1);
    }

    #[test]
    fn reason_change_without_flip_keeps_time_but_counts_as_transition() {
        let first = merge(
            &[],
            &[Verdict::new(false, ReadyReason::Creating, "x").desired()],
            Some(1),
            t(100),
        );
        let second = merge(
            &first,
            &[Verdict::new(false, ReadyReason::PodNotReady, "y").desired()],
            Some(2),
            t(200),
        );
        assert_eq!(second[0].last_transition_time, Time(t(100)));
        assert_eq!(second[0].observed_generation, Some(2));
        assert_eq!(transitions(&first, &second).len(), 1);
    }

    #[test]
    fn foreign_conditions_are_kept_and_sorted() {
        let existing = merge(
            &[],
            &[Desired {
                type_: "Upgrading",
                status: true,
                reason: "Provisioning",
                message: String::new(),
            }],
            None,
            t(1),
        );
        let out = merge(
            &existing,
            &[Verdict::new(true, ReadyReason::Running, "").desired()],
            None,
            t(2),
        );
        let types: Vec<_> = out.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, vec!["Ready", "Upgrading"]);
    }
}
