//! Bounded waiting on conditions that no single watch can express.

use std::future::Future;
use std::time::Duration;

use anyhow::bail;
use tokio::time::Instant;

use super::operator::Operator;

/// Polls `probe` until it is true, failing after `timeout` or as soon as the operator died (so
/// a crashed child is reported at once instead of as a timeout).
pub async fn until<F, Fut>(
    what: &str,
    timeout: Duration,
    operator: &mut Operator,
    mut probe: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(5);
    loop {
        if probe().await {
            return Ok(());
        }
        operator.ensure_running()?;
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}; operator log: {}",
                operator.log().display()
            );
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}
