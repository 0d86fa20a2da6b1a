//! The operator runs in tests under a token bound to `deploy/`'s ClusterRole and Role, so a
//! verb the manifests do not grant fails a test as it would fail in a cluster.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::Client;
use serde::de::DeserializeOwned;

/// The namespace and ServiceAccount `deploy/` installs the operator as.
pub const OPERATOR_NAMESPACE: &str = "questdb-operator";
pub const OPERATOR_SERVICE_ACCOUNT: &str = "questdb-operator";

/// The user name and groups the apiserver gives the operator's token (those of its
/// ServiceAccount, so `deploy/`'s bindings apply unchanged).
pub fn operator_user() -> (String, Vec<String>) {
    (
        format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{OPERATOR_NAMESPACE}"),
            "system:authenticated".into(),
        ],
    )
}

fn load<K: DeserializeOwned>(deploy: &Path, file: &str) -> anyhow::Result<K> {
    let path = deploy.join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Installs `deploy/`'s namespace, ClusterRole, Role and their bindings with an admin client.
pub async fn install(admin: &Client) -> anyhow::Result<()> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let pp = PostParams::default();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": OPERATOR_NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&pp, &ns)
        .await?;
    let cr: ClusterRole = load(&deploy, "clusterrole.yaml")?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &cr)
        .await?;
    let crb: ClusterRoleBinding = load(&deploy, "clusterrolebinding.yaml")?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &crb)
        .await?;
    let role: Role = load(&deploy, "role.yaml")?;
    Api::<Role>::namespaced(admin.clone(), OPERATOR_NAMESPACE)
        .create(&pp, &role)
        .await?;
    let rb: RoleBinding = load(&deploy, "rolebinding.yaml")?;
    Api::<RoleBinding>::namespaced(admin.clone(), OPERATOR_NAMESPACE)
        .create(&pp, &rb)
        .await?;
    Ok(())
}
