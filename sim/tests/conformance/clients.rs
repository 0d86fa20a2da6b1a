//! What kube-runtime's event Recorder and lease-based leader election need.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn the_event_recorder_creates_and_then_patches_a_series() {
    let sim = sim().await;
    let client = sim.client().await;
    let cm = configmaps(&client)
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("conformance"));
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: cm.metadata.name.clone(),
        namespace: Some("default".into()),
        uid: cm.metadata.uid.clone(),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("twice".into()),
        action: "Test".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &reference)
        .await
        .expect("first publish creates");
    recorder
        .publish(&event, &reference)
        .await
        .expect("second publish patches");
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let series = list.items[0]
        .series
        .as_ref()
        .expect("a series after the repeat");
    assert_eq!(series.count, 2);

    // The same Event through core/v1, selected the way `kubectl describe` does.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let selected = core
        .list(
            &kube::api::ListParams::default()
                .fields("involvedObject.kind=ConfigMap,involvedObject.name=a"),
        )
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    assert_eq!(selected.items[0].message.as_deref(), Some("twice"));
    assert_eq!(selected.items[0].involved_object.name.as_deref(), Some("a"));
    sim.shutdown().await;
}

fn lease_spec(holder: Option<&str>) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
    })
}

/// The sequence kube-lease-manager uses: apply to take an orphaned lease, strategic patches to
/// renew and release. A second candidate's apply conflicts while the lease is held.
#[tokio::test]
async fn lease_takeover_conflicts_until_the_holder_releases() {
    let sim = sim().await;
    let leases: Api<Lease> = Api::namespaced(sim.client().await, "default");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {}})).unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();

    let a = PatchParams::apply("candidate-a");
    let b = PatchParams::apply("candidate-b");
    leases
        .patch("leader", &a, &Patch::Apply(lease_spec(Some("a"))))
        .await
        .expect("a takes the lease");
    let err = leases
        .patch("leader", &b, &Patch::Apply(lease_spec(Some("b"))))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);

    let renew = json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}});
    leases
        .patch(
            "leader",
            &PatchParams {
                field_manager: Some("candidate-a".into()),
                ..Default::default()
            },
            &Patch::Strategic(&renew),
        )
        .await
        .expect("the holder renews");
    let release =
        json!({"spec": {"holderIdentity": null, "renewTime": null, "leaseDurationSeconds": null}});
    leases
        .patch(
            "leader",
            &PatchParams {
                field_manager: Some("candidate-a".into()),
                ..Default::default()
            },
            &Patch::Strategic(&release),
        )
        .await
        .expect("the holder releases");
    let taken = leases
        .patch("leader", &b, &Patch::Apply(lease_spec(Some("b"))))
        .await
        .expect("b takes over");
    assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
    sim.shutdown().await;
}

/// The real kube-lease-manager (what the operator's manager uses): one candidate leads; when it
/// steps down the other takes over.
#[tokio::test]
async fn kube_lease_manager_elects_one_leader_and_hands_over() {
    use kube_lease_manager::LeaseManagerBuilder;

    let sim = sim().await;
    let client = sim.client().await;
    let build = |identity: &str| {
        LeaseManagerBuilder::new(client.clone(), "operator-leader")
            .with_identity(identity)
            .with_duration(5)
            .with_grace(1)
            .build()
    };
    let a = build("a").await.expect("manager a");
    let b = build("b").await.expect("manager b");
    let (mut a_leads, a_task) = a.watch().await;
    within("a to lead", a_leads.wait_for(|l| *l)).await.unwrap();
    let (mut b_leads, b_task) = b.watch().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = leases
        .get("operator-leader")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("a"));
    assert!(
        !*b_leads.borrow(),
        "b must not lead while a holds the lease"
    );

    // Dropping the receiver makes a release the lease and end its task.
    drop(a_leads);
    within("a to release", a_task)
        .await
        .unwrap()
        .expect("a released cleanly");
    within("b to take over", b_leads.wait_for(|l| *l))
        .await
        .unwrap();
    drop(b_leads);
    within("b to release", b_task)
        .await
        .unwrap()
        .expect("b released cleanly");
    sim.shutdown().await;
}
