//! The control plane as the benches use it: the CRD installed and a namespace.

use std::time::Duration;

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use questdb_operator::api::QuestDB;
use tokio::time::Instant;

/// Installs the QuestDB CRD and waits until the resource is served.
pub async fn install_crd(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &questdb_operator::crd::questdb(questdb_testenv::timings::node_lease_duration()),
    )
    .await
    .context("installing the CRD")?;
    let api: Api<QuestDB> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    while api.list(&Default::default()).await.is_err() {
        if Instant::now() > deadline {
            bail!("the QuestDB resource is not served after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

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
