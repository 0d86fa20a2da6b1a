//! The leader's own check that it still leads: a live read of its Lease must keep showing it as
//! the holder with a renewTime that moves, judged on this process's clock from when a change was
//! last seen (never by comparing renewTime with the local clock). A leader cut off from the
//! apiserver, or whose renewals fail, steps down before its Lease can expire and a standby take
//! over: the deadline is the lease duration minus half the renew grace, looked at every tenth
//! of the grace, so a renewal is seen well before it and the leader has stopped well before
//! the Lease runs out.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::Client;
use tokio::time::Instant;
use tracing::warn;

/// Leader election on a Lease (`ManagerOptions::leader_election`).
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
    pub grace: Duration,
}

/// How long renewals may go unseen before the leader stops, and how often it looks.
pub(crate) fn deadline_and_period(le: &LeaderElection) -> (Duration, Duration) {
    let deadline = le.duration.saturating_sub(le.grace / 2);
    let period = (le.grace / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    (deadline, period)
}

/// What one look at the Lease showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// We hold it; its renewTime as the apiserver has it.
    Held(Option<String>),
    /// Someone else holds it.
    Other,
    /// No answer (cut off, timeout, error).
    Unknown,
}

/// Pure: the instant renewals were last seen to progress, after one more look.
pub(crate) fn confirm(
    last_change: Instant,
    last_renew: &mut Option<String>,
    seen: &Seen,
    now: Instant,
) -> Instant {
    match seen {
        Seen::Held(renew) if renew != last_renew => {
            *last_renew = renew.clone();
            now
        }
        _ => last_change,
    }
}

async fn look(leases: &Api<Lease>, name: &str, identity: &str, timeout: Duration) -> Seen {
    match tokio::time::timeout(timeout, leases.get_opt(name)).await {
        Ok(Ok(Some(lease))) => {
            let spec = lease.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() == Some(identity) {
                Seen::Held(spec.renew_time.map(|t| format!("{:?}", t.0)))
            } else {
                Seen::Other
            }
        }
        Ok(Ok(None)) => Seen::Other,
        _ => Seen::Unknown,
    }
}

/// Returns when leadership can no longer be trusted (renewals unseen past the deadline, or
/// another holder). Call it once leadership was won.
pub(crate) async fn watch_renewals(client: Client, le: &LeaderElection) {
    let (deadline, period) = deadline_and_period(le);
    let leases: Api<Lease> = Api::namespaced(client, &le.namespace);
    let mut last_change = Instant::now();
    let mut last_renew = None;
    loop {
        tokio::time::sleep(period).await;
        let seen = look(&leases, &le.lease_name, &le.identity, period).await;
        if seen == Seen::Other {
            warn!(lease = %le.lease_name, "the Lease names another holder");
            return;
        }
        last_change = confirm(last_change, &mut last_renew, &seen, Instant::now());
        if last_change.elapsed() > deadline {
            warn!(lease = %le.lease_name, ?deadline, "no Lease renewal seen within the renew deadline");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(duration: u64, grace: u64) -> LeaderElection {
        LeaderElection {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            duration: Duration::from_secs(duration),
            grace: Duration::from_secs(grace),
        }
    }

    #[test]
    fn the_deadline_ends_before_the_lease_can_expire() {
        for (duration, grace) in [(15, 5), (4, 1)] {
            let (deadline, period) = deadline_and_period(&le(duration, grace));
            // Seen late by a period, checked every period, stopped within a period.
            assert!(deadline + 3 * period < Duration::from_secs(duration));
            // Renewals come every duration - grace and are seen within a period.
            assert!(deadline > Duration::from_secs(duration - grace) + period);
        }
    }

    #[test]
    fn only_a_moving_renew_time_of_ours_counts() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut last = None;
        let held = |s: &str| Seen::Held(Some(s.into()));
        assert_eq!(confirm(t0, &mut last, &held("a"), t1), t1);
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(
            confirm(t1, &mut last, &held("a"), t2),
            t1,
            "unchanged renewTime"
        );
        assert_eq!(confirm(t1, &mut last, &Seen::Unknown, t2), t1, "no answer");
        assert_eq!(confirm(t1, &mut last, &held("b"), t2), t2);
    }
}
