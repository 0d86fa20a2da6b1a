//! One place that makes every cloud API call: rate limit, attempt, observe, classify, back off.

use std::future::Future;
use std::sync::Arc;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::time::{Duration, Instant};

use super::rate_limit::TokenBucket;
use super::{classify, ApiError, ErrorClass, RetryPolicy, SharedObserver};

/// Shared by all calls of one provider (the rate limit is per provider, not per call).
#[derive(Clone)]
pub(crate) struct CallRunner {
    service: &'static str,
    observer: SharedObserver,
    limiter: Arc<TokenBucket>,
    policy: RetryPolicy,
}

/// Whether `InvalidInstanceID.NotFound` may be retried for this call (only where the id came
/// from our own recent launch, i.e. describing ids; a terminate treats it as "already gone").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotFound {
    Retry,
    Return,
}

impl CallRunner {
    pub(crate) fn new(
        service: &'static str,
        observer: SharedObserver,
        limiter: Arc<TokenBucket>,
        policy: RetryPolicy,
    ) -> Self {
        Self {
            service,
            observer,
            limiter,
            policy,
        }
    }

    /// Run `attempt` until it succeeds, fails permanently, or its class's retry budget is
    /// spent; the last error is returned as the API reported it.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        operation: &'static str,
        not_found: NotFound,
        mut attempt: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let started = Instant::now();
        let mut delays = ExponentialBuilder::new()
            .with_jitter()
            .with_min_delay(self.policy.min_delay)
            .with_max_delay(self.policy.max_delay)
            .without_max_times()
            .build();
        let mut retries = 0usize;
        loop {
            self.limiter.acquire().await;
            let answer = tokio::time::timeout(self.policy.attempt_timeout, attempt()).await;
            let error = match answer {
                Ok(Ok(value)) => {
                    self.observer.observe(self.service, operation, "ok");
                    return Ok(value);
                }
                Ok(Err(error)) => error,
                Err(_) => ApiError::new(
                    "Timeout",
                    format!("no answer within {:?}", self.policy.attempt_timeout),
                ),
            };
            let class = classify(&error);
            let outcome = match class {
                ErrorClass::Throttled => "throttled".to_string(),
                _ => format!("error:{}", error.code),
            };
            self.observer.observe(self.service, operation, &outcome);

            let mut delay = delays.next().unwrap_or(self.policy.max_delay);
            let retry = match class {
                ErrorClass::Throttled | ErrorClass::Transient => retries < self.policy.max_retries,
                ErrorClass::NotFoundEventuallyConsistent => {
                    let left = self
                        .policy
                        .eventual_consistency_window
                        .saturating_sub(started.elapsed());
                    delay = delay.min(left);
                    not_found == NotFound::Retry && !left.is_zero()
                }
                ErrorClass::Permanent(_) => false,
            };
            let in_time = started.elapsed() + delay < self.policy.call_deadline;
            if !retry || !in_time {
                return Err(error);
            }
            retries += 1;
            tracing::debug!(
                service = self.service,
                operation,
                code = %error.code,
                delay_ms = delay.as_millis() as u64,
                "retrying cloud call"
            );
            tokio::time::sleep(delay.max(Duration::from_millis(1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::{CallCounter, RateLimit};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runner(counter: &CallCounter) -> CallRunner {
        CallRunner::new(
            "ec2",
            Arc::new(counter.clone()),
            Arc::new(TokenBucket::new(&RateLimit {
                per_second: 0.0,
                burst: 1,
            })),
            RetryPolicy {
                min_delay: Duration::from_millis(100),
                max_delay: Duration::from_secs(2),
                max_retries: 3,
                eventual_consistency_window: Duration::from_secs(10),
                attempt_timeout: Duration::from_secs(5),
                call_deadline: Duration::from_secs(30),
            },
        )
    }

    /// An API that fails with `code` for the first `failures` attempts.
    async fn flaky(n: &AtomicUsize, failures: usize, code: &str) -> Result<u32, ApiError> {
        if n.fetch_add(1, Ordering::SeqCst) < failures {
            Err(ApiError::new(code, "nope"))
        } else {
            Ok(7)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_is_retried_with_growing_delays_and_counted() {
        let counter = CallCounter::new();
        let n = AtomicUsize::new(0);
        let start = Instant::now();
        let got = runner(&counter)
            .call("DescribeInstances", NotFound::Return, || {
                flaky(&n, 3, "RequestLimitExceeded")
            })
            .await;
        assert_eq!(got, Ok(7));
        assert_eq!(counter.count("DescribeInstances", "throttled"), 3);
        assert_eq!(counter.count("DescribeInstances", "ok"), 1);
        // 100 + 200 + 400 ms of backoff at least (jitter only adds).
        assert!(
            start.elapsed() >= Duration::from_millis(700),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_gives_up_after_the_budget() {
        let counter = CallCounter::new();
        let n = AtomicUsize::new(0);
        let got = runner(&counter)
            .call("RunInstances", NotFound::Return, || {
                flaky(&n, 100, "Throttling")
            })
            .await;
        assert_eq!(got.unwrap_err().code, "Throttling");
        assert_eq!(counter.attempts("RunInstances"), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_returned_after_one_attempt() {
        let counter = CallCounter::new();
        let n = AtomicUsize::new(0);
        let got = runner(&counter)
            .call("RunInstances", NotFound::Return, || {
                flaky(&n, 100, "InsufficientInstanceCapacity")
            })
            .await;
        assert_eq!(got.unwrap_err().code, "InsufficientInstanceCapacity");
        assert_eq!(counter.attempts("RunInstances"), 1);
        assert_eq!(
            counter.count("RunInstances", "error:InsufficientInstanceCapacity"),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_is_retried_only_where_allowed_and_only_within_the_window() {
        let counter = CallCounter::new();
        let n = AtomicUsize::new(0);
        let got = runner(&counter)
            .call("DescribeInstances", NotFound::Retry, || {
                flaky(&n, 2, "InvalidInstanceID.NotFound")
            })
            .await;
        assert_eq!(got, Ok(7));

        let n = AtomicUsize::new(0);
        let got = runner(&counter)
            .call("TerminateInstances", NotFound::Return, || {
                flaky(&n, 2, "InvalidInstanceID.NotFound")
            })
            .await;
        assert!(got.is_err());
        assert_eq!(counter.attempts("TerminateInstances"), 1);

        let n = AtomicUsize::new(0);
        let start = Instant::now();
        let got = runner(&counter)
            .call("DescribeInstances", NotFound::Retry, || {
                flaky(&n, usize::MAX, "InvalidInstanceID.NotFound")
            })
            .await;
        assert!(got.is_err());
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
            "{waited:?}"
        );
    }

    /// A hung endpoint must not hold a reconcile (and a deposed leader's call) for ever.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_ends_within_the_deadline() {
        let counter = CallCounter::default();
        let mut r = runner(&counter);
        r.policy.attempt_timeout = Duration::from_secs(2);
        r.policy.call_deadline = Duration::from_secs(5);
        r.policy.max_retries = 100;
        let start = Instant::now();
        let got: Result<u32, ApiError> = r
            .call("RunInstances", NotFound::Return, std::future::pending)
            .await;
        assert_eq!(got.map_err(|e| e.code), Err("Timeout".to_string()));
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
        assert!(
            counter.attempts("RunInstances") >= 2,
            "timeouts are retried"
        );
    }
}
