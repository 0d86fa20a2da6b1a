//! Reloadable settings: when the operator asks the database, reloads it, records what it
//! reports, or gives up on the reload and restarts it (see `desired::reload`).
//!
//! Each reconcile of a database whose recorded digest is not the spec's: nothing while its pod
//! is not Ready on the current template (a restart reads the file anyway); else ask
//! `SHOW PARAMETERS`, and decide from the answer. Every step's record goes before its side
//! effect: `reloadingSince` before the first `reload_config()`, `restartedFor` before the
//! template changes.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::{ConfigApplied, ConfigStatus};
use crate::desired::reload::Settle;

/// How long a reload may wait for the mounted file before the database is restarted instead.
/// The kubelet refreshes a ConfigMap volume at its periodic pod sync (`syncFrequency`, 1 minute
/// by default) plus its cache's delay (the Kubernetes documentation, "Mounted ConfigMaps are
/// updated automatically"): three minutes is past both on a healthy node.
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(180);

/// How often a pending reload is tried again while the file is not there yet.
pub const RELOAD_RETRY: Duration = Duration::from_secs(5);

/// What the reconcile sees.
#[derive(Clone, Debug)]
pub struct ConfigView<'a> {
    /// The digest of the reloadable settings the spec asks for.
    pub wanted: &'a str,
    pub status: Option<&'a ConfigStatus>,
    /// The database pod is Ready.
    pub pod_ready: bool,
    /// The pod carries the pod template's config hash and restart mark: no restart is on its
    /// way for this spec.
    pub pod_current: bool,
    /// The restart mark the pod runs with (`restartedFor` when it was made).
    pub pod_restarted_for: Option<&'a str>,
    pub now: Timestamp,
}

/// The next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigStep {
    /// Nothing to do, or nothing to do until the pod is Ready on the current template.
    Idle,
    /// Ask the database for its parameters, then decide again with the answer.
    Ask,
    /// Record the spec's digest as applied this way.
    Record(ConfigApplied),
    /// Record the reload (`first`: its start) and call `reload_config()`.
    Reload { first: bool },
    /// Record `restartedFor`: the pod template changes, and the database restarts for these keys.
    Restart { keys: Vec<String>, timed_out: bool },
}

/// `settle`: the database's answer, once asked.
pub fn decide(view: &ConfigView, settle: Option<&Settle>) -> ConfigStep {
    let status = view.status.cloned().unwrap_or_default();
    let wanted = Some(view.wanted);
    if status.applied_digest.as_deref() == wanted || !view.pod_ready {
        return ConfigStep::Idle;
    }
    if status.restarted_for.as_deref() == wanted {
        // The file is read at start: the pod made with this mark has it.
        return if view.pod_restarted_for == wanted && view.pod_current {
            ConfigStep::Record(ConfigApplied::Restart)
        } else {
            ConfigStep::Idle
        };
    }
    if !view.pod_current {
        return ConfigStep::Idle;
    }
    let reloading = status.reloading_digest.as_deref() == wanted;
    match settle {
        None => ConfigStep::Ask,
        Some(Settle::Settled) if reloading => ConfigStep::Record(ConfigApplied::Reload),
        Some(Settle::Settled) => ConfigStep::Record(ConfigApplied::Restart),
        Some(Settle::NeedsRestart(keys)) => ConfigStep::Restart {
            keys: keys.clone(),
            timed_out: false,
        },
        Some(Settle::Pending(keys)) => {
            let waited = status
                .reloading_since
                .filter(|_| reloading)
                .map(|since| view.now.duration_since(since.0).as_secs())
                .unwrap_or(0);
            if waited >= RELOAD_TIMEOUT.as_secs() as i64 {
                ConfigStep::Restart {
                    keys: keys.clone(),
                    timed_out: true,
                }
            } else {
                ConfigStep::Reload { first: !reloading }
            }
        }
    }
}

/// The status once `step` is recorded (`None`: the step records nothing).
pub fn record(view: &ConfigView, step: &ConfigStep) -> Option<ConfigStatus> {
    let mut status = view.status.cloned().unwrap_or_default();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(view.now);
    match step {
        ConfigStep::Idle | ConfigStep::Ask | ConfigStep::Reload { first: false } => return None,
        ConfigStep::Record(by) => {
            status.applied_digest = Some(view.wanted.to_string());
            status.applied_by = Some(*by);
            status.applied_at = Some(now);
            status.reloading_digest = None;
            status.reloading_since = None;
        }
        ConfigStep::Reload { first: true } => {
            status.reloading_digest = Some(view.wanted.to_string());
            status.reloading_since = Some(now);
        }
        ConfigStep::Restart { .. } => {
            status.restarted_for = Some(view.wanted.to_string());
            status.reloading_digest = None;
            status.reloading_since = None;
        }
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn view<'a>(status: Option<&'a ConfigStatus>) -> ConfigView<'a> {
        ConfigView {
            wanted: "new",
            status,
            pod_ready: true,
            pod_current: true,
            pod_restarted_for: None,
            now: at(0),
        }
    }

    fn applied(digest: &str) -> ConfigStatus {
        ConfigStatus {
            applied_digest: Some(digest.into()),
            applied_by: Some(ConfigApplied::Reload),
            ..Default::default()
        }
    }

    fn pending() -> Settle {
        Settle::Pending(vec!["pg.net.connection.limit".into()])
    }

    #[test]
    fn a_converged_database_is_not_asked_anything() {
        let done = applied("new");
        assert_eq!(decide(&view(Some(&done)), None), ConfigStep::Idle);
    }

    #[test]
    fn a_database_not_ready_or_about_to_restart_is_not_reloaded() {
        let old = applied("old");
        let mut v = view(Some(&old));
        v.pod_ready = false;
        assert_eq!(decide(&v, None), ConfigStep::Idle);
        let mut v = view(Some(&old));
        v.pod_current = false;
        assert_eq!(decide(&v, None), ConfigStep::Idle);
    }

    #[test]
    fn a_change_is_asked_about_then_reloaded_then_recorded_as_a_reload() {
        let old = applied("old");
        let v = view(Some(&old));
        assert_eq!(decide(&v, None), ConfigStep::Ask);
        let step = decide(&v, Some(&pending()));
        assert_eq!(step, ConfigStep::Reload { first: true });
        let reloading = record(&v, &step).expect("the reload's start is recorded first");
        assert_eq!(reloading.reloading_digest.as_deref(), Some("new"));
        assert_eq!(reloading.applied_digest.as_deref(), Some("old"));

        let v = view(Some(&reloading));
        assert_eq!(
            decide(&v, Some(&pending())),
            ConfigStep::Reload { first: false }
        );
        assert_eq!(record(&v, &ConfigStep::Reload { first: false }), None);
        let step = decide(&v, Some(&Settle::Settled));
        assert_eq!(step, ConfigStep::Record(ConfigApplied::Reload));
        let done = record(&v, &step).unwrap();
        assert_eq!(done.applied_digest.as_deref(), Some("new"));
        assert_eq!(done.applied_by, Some(ConfigApplied::Reload));
        assert_eq!(done.reloading_digest, None);
        assert_eq!(decide(&view(Some(&done)), None), ConfigStep::Idle);
    }

    #[test]
    fn a_database_that_already_runs_the_settings_is_recorded_as_started_with_them() {
        // A first look (no status yet), or a restart for another change that read the file.
        assert_eq!(
            decide(&view(None), Some(&Settle::Settled)),
            ConfigStep::Record(ConfigApplied::Restart)
        );
    }

    #[test]
    fn a_reload_the_file_never_brings_restarts_after_the_timeout_and_not_before() {
        let reloading = ConfigStatus {
            reloading_digest: Some("new".into()),
            reloading_since: Some(Time(at(0))),
            ..applied("old")
        };
        let mut v = view(Some(&reloading));
        v.now = at(RELOAD_TIMEOUT.as_secs() as i64 - 1);
        assert_eq!(
            decide(&v, Some(&pending())),
            ConfigStep::Reload { first: false }
        );
        v.now = at(RELOAD_TIMEOUT.as_secs() as i64);
        let step = decide(&v, Some(&pending()));
        assert_eq!(
            step,
            ConfigStep::Restart {
                keys: vec!["pg.net.connection.limit".into()],
                timed_out: true
            }
        );
        let marked = record(&v, &step).unwrap();
        assert_eq!(marked.restarted_for.as_deref(), Some("new"));
        assert_eq!(marked.reloading_digest, None);
    }

    #[test]
    fn an_earlier_reloads_clock_does_not_count_for_a_new_change() {
        let other = ConfigStatus {
            reloading_digest: Some("older".into()),
            reloading_since: Some(Time(at(-1000))),
            ..applied("old")
        };
        assert_eq!(
            decide(&view(Some(&other)), Some(&pending())),
            ConfigStep::Reload { first: true }
        );
    }

    #[test]
    fn a_version_that_cannot_reload_restarts_at_once_and_the_restart_is_recorded_once_it_ran() {
        let old = applied("old");
        let v = view(Some(&old));
        let keys = vec!["pg.net.connection.limit".to_string()];
        let step = decide(&v, Some(&Settle::NeedsRestart(keys.clone())));
        assert_eq!(
            step,
            ConfigStep::Restart {
                keys,
                timed_out: false
            }
        );
        let marked = record(&v, &step).unwrap();
        // The old pod (no mark yet) is not the restart.
        let v = view(Some(&marked));
        assert_eq!(decide(&v, None), ConfigStep::Idle);
        let mut restarted = view(Some(&marked));
        restarted.pod_restarted_for = Some("new");
        assert_eq!(
            decide(&restarted, None),
            ConfigStep::Record(ConfigApplied::Restart)
        );
        restarted.pod_ready = false;
        assert_eq!(decide(&restarted, None), ConfigStep::Idle);
    }
}
