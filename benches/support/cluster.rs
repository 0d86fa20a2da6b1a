//! The control plane as the benches use it: the CRDs installed and a namespace (the helpers the
//! tests and the sandbox use too).

use std::time::Duration;

use kube::Client;

/// Installs the operator's CRDs and waits until the `QuestDB` resource is served.
pub async fn install_crd(client: &Client, timeout: Duration) -> anyhow::Result<()> {
    questdb_testenv::crds::install(client, timeout).await
}

pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    questdb_testenv::crds::create_namespace(client, name).await
}
