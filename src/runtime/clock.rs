//! Timestamps the failover and move records keep in status: RFC 3339 from the wall clock, so
//! they survive a restart (durations within one process use the monotonic clock instead).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

pub fn now() -> String {
    Timestamp::now().to_string()
}

pub fn since(ts: Option<&str>) -> Option<Duration> {
    let t: Timestamp = ts?.parse().ok()?;
    let d = Timestamp::now().duration_since(t);
    Duration::try_from(d).ok()
}

/// From `from` to `to`, both timestamps of a record; `None` when either is missing or unparsable.
pub fn between(from: Option<&str>, to: Option<&str>) -> Option<Duration> {
    let from: Timestamp = from?.parse().ok()?;
    let to: Timestamp = to?.parse().ok()?;
    Duration::try_from(to.duration_since(from)).ok()
}
