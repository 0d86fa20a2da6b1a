//! The simulated control plane as the benches use it: the CRD installed, a namespace, and a
//! client whose own requests the simulator does not count.

use std::time::Duration;

use anyhow::{bail, Context as _};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use questdb_operator::api::QuestDB;
use questdb_sim::hooks::INTERNAL_HEADER;
use questdb_sim::Sim;
use tokio::time::Instant;

/// A client for the bench's own requests (creating QuestDBs, watching them). The simulator
/// neither counts nor faults requests carrying its internal header, so its request counters
/// hold the operator's requests alone.
pub fn uncounted_client(sim: &Sim) -> anyhow::Result<Client> {
    let mut config = sim.client_config();
    config.headers.push((
        http::HeaderName::from_static(INTERNAL_HEADER),
        http::HeaderValue::from_static("bench"),
    ));
    Client::try_from(config).context("building the bench's kube client")
}

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
