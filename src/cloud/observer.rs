//! A seam for counting cloud API calls (by service, operation and outcome) without this module
//! knowing about the metrics registry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Told about every API attempt, retries included, so `/metrics` shows what AWS really saw.
///
/// `outcome` is `ok`, `throttled` or `error:<code>`; codes are a bounded set, so the label
/// cardinality stays small.
pub trait AwsCallObserver: Send + Sync {
    fn observe(&self, service: &str, operation: &str, outcome: &str);
}

/// Closures are observers, so `src/metrics.rs` can hand in `Arc::new(|s, o, r| ...)`.
impl<F> AwsCallObserver for F
where
    F: Fn(&str, &str, &str) + Send + Sync,
{
    fn observe(&self, service: &str, operation: &str, outcome: &str) {
        self(service, operation, outcome)
    }
}

/// The default: nobody is counting.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl AwsCallObserver for NoopObserver {
    fn observe(&self, _: &str, _: &str, _: &str) {}
}

/// Shared, cheaply clonable observer handle.
pub type SharedObserver = Arc<dyn AwsCallObserver>;

/// The default observer.
pub fn noop_observer() -> SharedObserver {
    Arc::new(NoopObserver)
}

/// `(service, operation, outcome)`.
pub type CallKey = (String, String, String);

/// Keeps counts in memory; for tests and for reporting calls per provisioned QuestDB.
#[derive(Clone, Debug, Default)]
pub struct CallCounter {
    counts: Arc<Mutex<BTreeMap<CallKey, u64>>>,
}

impl CallCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of calls of `operation` with `outcome` (any service).
    pub fn count(&self, operation: &str, outcome: &str) -> u64 {
        self.snapshot()
            .iter()
            .filter(|((_, op, out), _)| op == operation && out == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    /// Number of calls of `operation`, whatever the outcome.
    pub fn attempts(&self, operation: &str) -> u64 {
        self.snapshot()
            .iter()
            .filter(|((_, op, _), _)| op == operation)
            .map(|(_, n)| n)
            .sum()
    }

    /// All calls so far.
    #[cfg(test)]
    pub(crate) fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// `(service, operation, outcome) -> count`.
    pub(crate) fn snapshot(&self) -> BTreeMap<CallKey, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl AwsCallObserver for CallCounter {
    fn observe(&self, service: &str, operation: &str, outcome: &str) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *counts
            .entry((service.into(), operation.into(), outcome.into()))
            .or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_are_observers() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let observer: SharedObserver = Arc::new(move |s: &str, o: &str, r: &str| {
            sink.lock().unwrap().push(format!("{s}/{o}/{r}"));
        });
        observer.observe("ec2", "RunInstances", "ok");
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["ec2/RunInstances/ok".to_string()]
        );
    }

    #[test]
    fn counter_counts_by_operation_and_outcome() {
        let c = CallCounter::new();
        c.observe("ec2", "RunInstances", "throttled");
        c.observe("ec2", "RunInstances", "ok");
        c.observe("ec2", "DescribeInstances", "ok");
        assert_eq!(c.count("RunInstances", "ok"), 1);
        assert_eq!(c.attempts("RunInstances"), 2);
        assert_eq!(c.total(), 3);
    }
}
