//! Controllers hosted by the manager, and the state they share. Each reads like a pipeline:
//! observe -> decide (the pure planners of `crate::plan` and builders of `crate::desired`) ->
//! apply -> update status.

pub mod backup;
pub(crate) mod cached_pod;
pub(crate) mod checkpoint_watch;
pub(crate) mod children;
pub(crate) mod cloud_runtime;
pub mod context;
pub(crate) mod keys;
pub(crate) mod node_health;
pub(crate) mod own_writes;
pub(crate) mod preflight;
pub mod questdb;
pub(crate) mod refusals;
pub(crate) mod schedule;
pub(crate) mod scheduled_events;
pub(crate) mod sweep;
pub(crate) mod write_health;

use std::time::Duration;

use crate::api::EventReason;

use kube::runtime::controller::Action;

use crate::metrics::ReconcileOutcome;

/// What a reconcile asks for next. It becomes kube-runtime's `Action` at the controller boundary
/// and the `result` of `controller_runtime_reconcile_total`, with its delay, without looking
/// inside `Action` (which keeps the delay private).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing to do until something changes.
    AwaitChange,
    /// Look again after this long even without a change.
    RequeueAfter(Duration),
}

impl Next {
    pub(crate) fn action(self) -> Action {
        match self {
            Next::AwaitChange => Action::await_change(),
            Next::RequeueAfter(d) => Action::requeue(d),
        }
    }

    pub(crate) fn outcome(self) -> ReconcileOutcome {
        match self {
            Next::AwaitChange => ReconcileOutcome::Success,
            Next::RequeueAfter(d) => ReconcileOutcome::RequeueAfter(d),
        }
    }
}

/// Reconcile failures. [`Error::reason`] is the label of `questdb_operator_reconcile_errors_total`
/// and the reason of the Warning event a failing streak starts with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("object has no namespace")]
    MissingNamespace,
    #[error("object has no uid")]
    MissingUid,
    #[error("the cache is behind the apiserver for {0}")]
    StaleCache(String),
    #[error("optimistic-concurrency conflict")]
    Conflict,
    #[error("Kubernetes API call failed")]
    Kube(#[source] kube::Error),
    /// Throttled or transient after the provider's own retries; the reconcile backs off.
    #[error("cloud API call failed")]
    Cloud(#[source] crate::cloud::CloudError),
    /// A write to one object failed: which, for the event and the log line.
    #[error("{verb} {what}")]
    Write {
        verb: &'static str,
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A stage of a reconcile failed with `source`: which stage, for the event and the log
    /// line (whose span names the object).
    #[error("{stage} step")]
    During {
        stage: Stage,
        #[source]
        source: Box<Error>,
    },
}

/// The stages of a QuestDB reconcile, as a failure names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "lowercase")]
pub(crate) enum Stage {
    Finalizer,
    Restore,
    #[strum(serialize = "version upgrade")]
    VersionUpgrade,
    Volume,
    #[strum(serialize = "cloud (node, DNS, failover, node move)")]
    Cloud,
    Children,
    #[strum(serialize = "config reload")]
    ConfigReload,
    Disk,
    Status,
    #[strum(serialize = "deletion cleanup")]
    Deletion,
}

/// Names the stage a failure happened in.
pub(crate) trait During<T> {
    fn during(self, stage: Stage) -> Result<T, Error>;
}

impl<T> During<T> for Result<T, Error> {
    fn during(self, stage: Stage) -> Result<T, Error> {
        self.map_err(|source| match source {
            // The first stage named is the one that failed.
            e @ Error::During { .. } => e,
            e => Error::During {
                stage,
                source: Box::new(e),
            },
        })
    }
}

impl Error {
    /// Conflicts and stale caches are normal in a controller: retried quickly, never logged as
    /// errors.
    pub(crate) fn is_transient_conflict(&self) -> bool {
        match self {
            Error::During { source, .. } => source.is_transient_conflict(),
            e => matches!(e, Error::StaleCache(_) | Error::Conflict),
        }
    }

    /// Every value [`Error::reason`] can take.
    pub(crate) const REASONS: [EventReason; 7] = [
        EventReason::MissingNamespace,
        EventReason::MissingUid,
        EventReason::StaleCache,
        EventReason::Conflict,
        EventReason::KubernetesApiError,
        EventReason::CloudApiError,
        EventReason::InstanceNotOwned,
    ];

    pub(crate) fn reason(&self) -> EventReason {
        match self {
            Error::MissingNamespace => EventReason::MissingNamespace,
            Error::MissingUid => EventReason::MissingUid,
            Error::StaleCache(_) => EventReason::StaleCache,
            Error::Conflict => EventReason::Conflict,
            Error::Kube(_) | Error::Write { .. } => EventReason::KubernetesApiError,
            Error::During { source, .. } => source.reason(),
            Error::Cloud(crate::cloud::CloudError::Permanent { code, .. })
                if code == crate::cloud::INSTANCE_NOT_OWNED =>
            {
                EventReason::InstanceNotOwned
            }
            Error::Cloud(_) => EventReason::CloudApiError,
        }
    }

    pub(crate) fn from_status_write(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 409 => Error::Conflict,
            e => Error::Kube(e),
        }
    }
}

/// A one-line description of a kube error for events and conditions (no object bodies).
pub(crate) fn short_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
        other => other.to_string(),
    }
}

/// Backoff for failed reconciles of one object: exponential with jitter, capped.
pub(crate) fn retry_delay(attempt: u32, conflict: bool) -> Duration {
    use backon::BackoffBuilder;
    let (min, max) = if conflict {
        (Duration::from_millis(200), Duration::from_secs(5))
    } else {
        (Duration::from_secs(1), Duration::from_secs(300))
    };
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(attempt as usize)
        .unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_reconcile_asks_for_is_the_action_and_the_metric_result() {
        assert_eq!(Next::AwaitChange.action(), Action::await_change());
        assert_eq!(Next::AwaitChange.outcome(), ReconcileOutcome::Success);
        let d = Duration::from_millis(1500);
        assert_eq!(Next::RequeueAfter(d).action(), Action::requeue(d));
        assert_eq!(
            Next::RequeueAfter(d).outcome(),
            ReconcileOutcome::RequeueAfter(d)
        );
    }

    #[test]
    fn retry_delay_grows_and_is_capped() {
        assert!(retry_delay(0, false) < Duration::from_secs(3));
        assert!(retry_delay(20, false) <= Duration::from_secs(600));
        assert!(retry_delay(20, false) >= Duration::from_secs(300));
        assert!(retry_delay(30, true) <= Duration::from_secs(10));
    }

    /// On-call reads which stage of which object failed in the event and the log line, and
    /// the metric's reason and the retry pace stay those of the cause.
    #[test]
    fn a_failure_names_its_stage_and_object_and_keeps_its_causes_reason() {
        let refused = kube::Error::Api(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": "admission webhook denied the request",
                "reason": "Forbidden", "code": 403,
            }))
            .unwrap(),
        );
        let failed: Result<(), Error> = Err(Error::Write {
            verb: "writing",
            what: "StatefulSet db1".into(),
            source: refused,
        });
        let e = failed.during(Stage::Children).unwrap_err();
        let chain = crate::metrics::ErrorChain(&e).to_string();
        assert!(
            chain.starts_with("children step: writing StatefulSet db1: ")
                && chain.contains("admission webhook denied the request"),
            "{chain}"
        );
        assert_eq!(e.reason(), EventReason::KubernetesApiError);
        // The stage a failure is first named in is the one that failed.
        let e = Err::<(), _>(e).during(Stage::Status).unwrap_err();
        assert!(crate::metrics::ErrorChain(&e)
            .to_string()
            .starts_with("children step"));
        // A conflict is still a conflict: retried quickly, not logged as an error.
        let conflict = Err::<(), _>(Error::Conflict)
            .during(Stage::Cloud)
            .unwrap_err();
        assert!(conflict.is_transient_conflict());
        assert_eq!(conflict.reason(), EventReason::Conflict);
    }
}
