//! Leader election: only the Lease holder reconciles, a standby takes over, and a leader that
//! loses its Lease stops.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use questdb_operator::api::QuestDB;
use questdb_operator::manager::{self, LeaderElection, ManagerHandle, ManagerOptions};
use questdb_testenv::ControlPlane;
use tokio_util::sync::CancellationToken;

use crate::harness::{control_plane, is_ready, wait_for, wait_until, TIMEOUT};

const LEASE: &str = "questdb-operator-leader";
const LEASE_NS: &str = "questdb-operator";

fn options(identity: &str) -> ManagerOptions {
    ManagerOptions {
        leader_election: Some(LeaderElection {
            lease_name: LEASE.into(),
            namespace: LEASE_NS.into(),
            identity: identity.into(),
            duration: Duration::from_secs(4),
            grace: Duration::from_secs(1),
        }),
        ..Default::default()
    }
}

struct Running {
    handle: ManagerHandle,
    token: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// A manager under the operator's own credentials (deploy/'s Role covers the Lease).
async fn spawn(cp: &ControlPlane, identity: &str) -> Running {
    let handle = ManagerHandle::default();
    let token = CancellationToken::new();
    let task = tokio::spawn(manager::run_with(
        options(identity),
        cp.operator_config().await,
        token.clone(),
        handle.clone(),
    ));
    Running {
        handle,
        token,
        task,
    }
}

fn is_leader(r: &Running) -> bool {
    r.handle.metrics.render().lines().any(|l| {
        l.starts_with("leader_election_master_status") && l.contains(LEASE) && l.ends_with(" 1")
    })
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_and_a_deposed_leader_stops() {
    questdb_operator::metrics::install_crypto_provider();
    // deploy/ (installed by the control plane) made the operator's namespace already.
    let (cp, client) = control_plane().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NS);
    let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), "default");

    let a = spawn(&cp, "manager-a").await;
    wait_until("manager-a leads", || {
        let leases = leases.clone();
        async move { holder(&leases).await.as_deref() == Some("manager-a") }
    })
    .await;
    let b = spawn(&cp, "manager-b").await;
    wait_until("both ready (caches synced on the standby too)", || {
        let ready = a.handle.readiness.is_ready() && b.handle.readiness.is_ready();
        async move { ready }
    })
    .await;
    wait_until("manager-a reports leadership", || {
        let l = is_leader(&a);
        async move { l }
    })
    .await;
    assert!(!is_leader(&b), "only one leader");

    let mut q = questdb_operator::desired::testing::questdb("db1", "default");
    q.metadata.uid = None;
    q.metadata.resource_version = None;
    qdbs.create(&PostParams::default(), &q).await.unwrap();
    wait_for(&qdbs, "db1", "reconciled by the leader", is_ready()).await;
    assert_eq!(
        b.handle.in_flight.max_total(),
        0,
        "the standby never reconciled"
    );

    // The leader stops: the standby takes over within the lease duration.
    a.token.cancel();
    tokio::time::timeout(TIMEOUT, a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    wait_until("manager-b leads", || {
        let leases = leases.clone();
        async move { holder(&leases).await.as_deref() == Some("manager-b") }
    })
    .await;
    let mut q2 = q.clone();
    q2.metadata.name = Some("db2".into());
    qdbs.create(&PostParams::default(), &q2).await.unwrap();
    wait_for(&qdbs, "db2", "reconciled by the new leader", is_ready()).await;

    // Someone else grabs the Lease: manager-b must stop reconciling and end with an error.
    let steal = serde_json::json!({"spec": {
        "holderIdentity": "intruder",
        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
        "leaseDurationSeconds": 3600,
    }});
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&steal))
        .await
        .unwrap();
    let Running {
        handle: b_handle,
        token: b_token,
        task: b_task,
    } = b;
    let ended = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("deposed leader stops")
        .unwrap();
    assert!(ended.is_err(), "a deposed leader reports the loss");
    assert!(!b_handle
        .metrics
        .render()
        .lines()
        .any(|l| l.starts_with("leader_election_master_status") && l.ends_with(" 1")));
    b_token.cancel();
    drop(cp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_apiserver_stops_before_its_lease_can_expire() {
    let (cp, client) = control_plane().await;
    let leases: Api<Lease> = Api::namespaced(cp.direct_client(), LEASE_NS);
    let a = spawn(&cp, "manager-a").await;
    wait_until("manager-a leads", || {
        let leases = leases.clone();
        async move { holder(&leases).await.as_deref() == Some("manager-a") }
    })
    .await;
    wait_until("manager-a reports leadership", || {
        let l = is_leader(&a);
        async move { l }
    })
    .await;
    drop(client);
    // Every request of the operator now dies on the wire: no renewal, no reads.
    cp.inject_fault(questdb_testenv::Fault::cut());
    let ended = tokio::time::timeout(TIMEOUT, a.task)
        .await
        .expect("a cut-off leader stops")
        .expect("manager task does not panic");
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    assert!(ended.is_err(), "a deposed leader reports the loss");
    assert!(
        !a.handle
            .metrics
            .render()
            .lines()
            .any(|l| l.starts_with("leader_election_master_status") && l.ends_with(" 1")),
        "it no longer reports leadership"
    );
    // Its last successful renewal, as the apiserver recorded it: the leader stopped before
    // that renewal's lease ran out, so no standby can have led at the same time.
    let lease = leases.get(LEASE).await.expect("lease");
    let spec = lease.spec.expect("spec");
    let renewed = spec.renew_time.expect("renewTime").0;
    let expires = renewed
        .checked_add(std::time::Duration::from_secs(
            spec.lease_duration_seconds.unwrap_or(0) as u64,
        ))
        .expect("time");
    assert!(
        stopped_at < expires,
        "stopped at {stopped_at}, after the lease (renewed {renewed}) expired at {expires}"
    );
    a.token.cancel();
}
