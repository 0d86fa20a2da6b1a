//! Shutdown: which parts of the manager have not stopped yet (logged while it stops, so a pod
//! stuck in Terminating says what it waits for), and controllers told to stop before their
//! own cache ever filled.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kube::runtime::reflector::Store;
use kube::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The parts of a manager still running, by name.
#[derive(Clone, Debug, Default)]
pub struct Parts(Arc<Mutex<BTreeMap<&'static str, usize>>>);

impl Parts {
    /// Runs `work` under `name`: [`Parts::running`] lists it until it ends (or is dropped).
    pub(crate) async fn run<F: Future>(&self, name: &'static str, work: F) -> F::Output {
        let _entered = Entered::new(self, name);
        work.await
    }

    /// The names of the parts still running, sorted.
    pub fn running(&self) -> Vec<&'static str> {
        self.0.lock().expect("parts lock").keys().copied().collect()
    }

    /// Once `token` is cancelled, logs every `every` what has not stopped yet. Never ends:
    /// run it beside the work it watches.
    pub(crate) async fn report_while_stopping(&self, token: &CancellationToken, every: Duration) {
        token.cancelled().await;
        let mut waited = Duration::ZERO;
        loop {
            tokio::time::sleep(every).await;
            waited += every;
            let running = self.running();
            if !running.is_empty() {
                warn!(
                    waited_s = waited.as_secs(),
                    still_running = running.join(", "),
                    "still stopping"
                );
            }
        }
    }
}

struct Entered {
    parts: Parts,
    name: &'static str,
}

impl Entered {
    fn new(parts: &Parts, name: &'static str) -> Self {
        *parts.0.lock().expect("parts lock").entry(name).or_default() += 1;
        Self {
            parts: parts.clone(),
            name,
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut map = self.parts.0.lock().expect("parts lock");
        if let Some(n) = map.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                map.remove(self.name);
            }
        }
    }
}

/// Runs a controller that fills its own cache (`store`) until it ends. Told to stop before
/// that cache's first list answered, it ends at once: kube-runtime's runner starts no
/// reconcile before the first list, and after a graceful shutdown drops the watch that would
/// bring it, the runner waits for it forever (found when a backup list failed at shutdown).
pub(crate) async fn until_stopped<K>(
    name: &'static str,
    run: impl Future<Output = ()>,
    store: &Store<K>,
    token: &CancellationToken,
) where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let never_filled = async {
        token.cancelled().await;
        // Filled (or its writer gone, which ends the runner by itself): the graceful drain
        // finishes what is in flight.
        if store.wait_until_ready().now_or_never().is_some() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = run => {}
        _ = never_filled => {
            info!(controller = name, "stopped before its cache's first list: nothing was in flight");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher;

    #[tokio::test]
    async fn a_part_is_listed_while_it_runs_and_not_after() {
        let parts = Parts::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn({
            let parts = parts.clone();
            async move { parts.run("caches", rx).await }
        });
        tokio::task::yield_now().await;
        while parts.running().is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(parts.running(), ["caches"]);
        tx.send(()).unwrap();
        running.await.unwrap().unwrap();
        assert!(parts.running().is_empty());
    }

    #[tokio::test]
    async fn a_controller_stopped_before_its_first_list_ends_at_once() {
        let (reader, _writer) = store::<ConfigMap>();
        let token = CancellationToken::new();
        token.cancel();
        // A controller that would never end by itself.
        let stuck = std::future::pending::<()>();
        tokio::time::timeout(
            Duration::from_secs(5),
            until_stopped("test", stuck, &reader, &token),
        )
        .await
        .expect("ends without waiting for the controller");
    }

    #[tokio::test]
    async fn a_controller_whose_cache_filled_is_left_to_finish_what_is_in_flight() {
        let (reader, mut writer) = store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let token = CancellationToken::new();
        token.cancel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let draining = async move {
            let _ = done_rx.await;
        };
        let run = until_stopped("test", draining, &reader, &token);
        let mut run = std::pin::pin!(run);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut run)
                .await
                .is_err(),
            "waits for the in-flight work"
        );
        done_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("ends when the work ends");
    }
}
