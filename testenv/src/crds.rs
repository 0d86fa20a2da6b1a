//! The operator's CRDs on a control plane of this environment, one helper for the tests, the
//! benches and the sandbox: each CRD as a cluster with these kubelets installs it (the floor on
//! `spec.failover.unhealthyAfterSeconds` is their Lease duration, as the operator's is), and a
//! wait until the apiserver serves the `QuestDB` resource (a real apiserver establishes a new
//! CRD a moment after accepting it).

use std::time::Duration;

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use questdb_core::api::QuestDB;

/// Every CRD of the operator, for this environment's kubelets.
pub fn all() -> Vec<CustomResourceDefinition> {
    questdb_core::crd::for_lease(crate::timings::node_lease_duration())
}

/// Installs every CRD of the operator and waits until `QuestDB` is served.
pub async fn install(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    install_these(client, &all(), timeout).await
}

/// Installs `crds` (a test may replace one with a variant of its own) and waits until `QuestDB`
/// is served.
pub async fn install_these(
    client: &Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        api.create(&PostParams::default(), crd)
            .await
            .with_context(|| {
                format!(
                    "installing the CRD {}",
                    crd.metadata.name.clone().unwrap_or_default()
                )
            })?;
    }
    let served: Api<QuestDB> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    while served.list(&Default::default()).await.is_err() {
        if tokio::time::Instant::now() > deadline {
            bail!("the QuestDB resource is not served {timeout:?} after installing its CRD");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Creates namespace `name`.
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}
