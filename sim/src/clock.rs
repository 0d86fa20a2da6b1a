//! A scalable clock: the simulator's grace periods and heartbeats run `speed` times faster than
//! wall time so tests of minute-long behaviour finish in seconds.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    speed: f64,
    wall_start: SystemTime,
    mono_start: Instant,
}

impl Clock {
    /// `speed` > 1 makes simulated time pass faster than wall time.
    pub fn new(speed: f64) -> Self {
        assert!(speed > 0.0, "clock speed must be positive");
        Self {
            inner: Arc::new(Inner {
                speed,
                wall_start: SystemTime::now(),
                mono_start: Instant::now(),
            }),
        }
    }

    pub fn real_time() -> Self {
        Self::new(1.0)
    }

    pub fn speed(&self) -> f64 {
        self.inner.speed
    }

    /// Simulated "now": starts at the wall-clock time the clock was made.
    pub fn now(&self) -> SystemTime {
        let elapsed = self.inner.mono_start.elapsed().mul_f64(self.inner.speed);
        self.inner.wall_start + elapsed
    }

    /// Converts a simulated duration into the wall-clock duration to wait.
    pub fn to_real(&self, simulated: Duration) -> Duration {
        simulated.div_f64(self.inner.speed)
    }

    /// Sleeps for a simulated duration.
    pub async fn sleep(&self, simulated: Duration) {
        tokio::time::sleep(self.to_real(simulated)).await
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::real_time()
    }
}
