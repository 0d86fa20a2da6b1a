//! Graceful shutdown: told to stop, the operator stops within its grace however far it got,
//! so a rollout or a leader hand-over never waits for the kubelet's SIGKILL.

use questdb_operator::manager::ManagerOptions;
use questdb_testenv::{Fault, Verb};

use crate::harness::{cluster, questdb_crd, wait_until, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_whose_backup_watches_never_listed_still_stops_when_told() {
    let mut env = Env::without_manager(cluster(), questdb_crd()).await;
    // The backup and schedule controllers fill their own caches: while neither list has
    // answered, they hold every reconcile back (and kube-runtime's runner then also waits
    // forever for a readiness that can no longer come once the shutdown drops the watch).
    env.cp
        .inject_fault(Fault::status(500).on(Verb::List, "questdbbackups"));
    env.cp
        .inject_fault(Fault::status(500).on(Verb::List, "questdbbackupschedules"));
    env.start_synced_manager(ManagerOptions::default()).await;
    let cp = &env.cp;
    wait_until("both backup watches tried to list", || async move {
        let counts = cp.request_counts();
        counts.get(Verb::List, "questdbbackups") >= 2
            && counts.get(Verb::List, "questdbbackupschedules") >= 1
    })
    .await;
    env.stop_manager()
        .await
        .expect("the manager stopped cleanly");
    env.stop().await;
}
