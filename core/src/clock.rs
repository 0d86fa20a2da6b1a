//! Timestamps the failover and move records keep in status: `metav1.Time` from the wall
//! clock, so they survive a restart (durations within one process use the monotonic clock
//! instead). The apiserver stores them to the second, as every `metav1.Time`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, TimestampRound, Unit};

/// Now, to the second: what a written record reads back as, so a value computed here compares
/// equal to the one stored.
pub fn now() -> Time {
    Time(seconds(Timestamp::now()))
}

/// `t` to the second (down), as the apiserver stores a `metav1.Time`.
pub fn seconds(t: Timestamp) -> Timestamp {
    t.round(
        TimestampRound::new()
            .smallest(Unit::Second)
            .mode(k8s_openapi::jiff::RoundMode::Trunc),
    )
    .unwrap_or(t)
}

pub fn since(ts: Option<&Time>) -> Option<Duration> {
    let d = Timestamp::now().duration_since(ts?.0);
    Duration::try_from(d).ok()
}

/// From `from` to `to`, both timestamps of a record; `None` when either is missing or `to` is
/// earlier.
pub fn between(from: Option<&Time>, to: Option<&Time>) -> Option<Duration> {
    Duration::try_from(to?.0.duration_since(from?.0)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_survives_the_apiservers_round_trip_unchanged() {
        let t = now();
        let stored: Time = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(stored, t);
    }

    #[test]
    fn a_record_written_with_fractional_seconds_still_reads() {
        let t: Time =
            serde_json::from_value(serde_json::json!("2026-11-25T11:10:23.123456789Z")).unwrap();
        let later = Time(seconds(t.0) + Duration::from_secs(3));
        assert_eq!(
            between(Some(&t), Some(&later)).map(|d| d.as_secs()),
            Some(2)
        );
        assert_eq!(between(Some(&later), Some(&t)), None);
    }
}
