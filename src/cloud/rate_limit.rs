//! A token bucket shared by every call of one provider.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

use super::RateLimit;

/// Callers reserve a token up front (the balance may go negative) and sleep until it would
/// have refilled: waiters are served in arrival order and nobody spins.
///
/// tokio's clock (not `std`'s) so tests with a paused clock are exact and instant.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    per_second: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    refilled_at: Instant,
}

impl TokenBucket {
    pub(crate) fn new(limit: &RateLimit) -> Self {
        let burst = f64::from(limit.burst.max(1));
        Self {
            per_second: limit.per_second,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                refilled_at: Instant::now(),
            }),
        }
    }

    /// Wait for the right to make one call. A non-positive rate means "no limit".
    pub(crate) async fn acquire(&self) {
        if self.per_second <= 0.0 || !self.per_second.is_finite() {
            return;
        }
        let wait = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            let elapsed = now.duration_since(state.refilled_at).as_secs_f64();
            state.tokens = (state.tokens + elapsed * self.per_second).min(self.burst);
            state.refilled_at = now;
            state.tokens -= 1.0;
            if state.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-state.tokens / self.per_second)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn burst_is_free_then_calls_are_spaced_by_the_rate() {
        let bucket = TokenBucket::new(&RateLimit {
            per_second: 10.0,
            burst: 5,
        });
        let start = Instant::now();
        for _ in 0..5 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..10 {
            bucket.acquire().await;
        }
        // 10 calls past the burst at 10/s: one second, give or take float rounding.
        let elapsed = start.elapsed().as_secs_f64();
        assert!((0.99..1.01).contains(&elapsed), "{elapsed}");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_budget() {
        let bucket = Arc::new(TokenBucket::new(&RateLimit {
            per_second: 4.0,
            burst: 1,
        }));
        let start = Instant::now();
        let tasks: Vec<_> = (0..9)
            .map(|_| {
                let b = bucket.clone();
                tokio::spawn(async move {
                    b.acquire().await;
                    Instant::now()
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap().duration_since(start).as_secs_f64());
        }
        done.sort_by(f64::total_cmp);
        // 1 immediate + 8 more at 4/s = 2 s for the last; never more than rate allows.
        let last = done[done.len() - 1];
        assert!((1.99..2.01).contains(&last), "{done:?}");
        for (i, t) in done.iter().enumerate() {
            assert!(*t + 1e-6 >= i.saturating_sub(1) as f64 * 0.25, "{done:?}");
        }
    }
}
