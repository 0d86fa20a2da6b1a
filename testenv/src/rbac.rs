//! The operator runs in tests under a token bound to `deploy/`'s ClusterRole and Role, so a
//! verb the manifests do not grant fails a test as it would fail in a cluster; the
//! cluster-wide install's admission policy (`deploy/admission/`) confines its writes too.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
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

/// Which of `deploy/`'s installs the operator's token is bound by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Install {
    /// `deploy/`: the ClusterRole, every namespace.
    #[default]
    ClusterWide,
    /// `deploy/namespaced/`: a Role in the operator's namespace, nothing cluster-wide.
    Namespaced,
    /// Nothing: the test installs the operator's namespace and RBAC itself (the Helm chart).
    Nothing,
}

/// Installs the operator's namespace, its leader-election Role and the data-plane RBAC of
/// `install`, from `deploy/`'s files, with an admin client.
pub async fn install(admin: &Client, install: Install) -> anyhow::Result<()> {
    if install == Install::Nothing {
        return Ok(());
    }
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let pp = PostParams::default();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": OPERATOR_NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&pp, &ns)
        .await?;
    let roles = Api::<Role>::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    roles
        .create(&pp, &load(&deploy, "operator/role.yaml")?)
        .await?;
    bindings
        .create(&pp, &load(&deploy, "operator/rolebinding.yaml")?)
        .await?;
    match install {
        Install::ClusterWide => {
            let cr: ClusterRole = load(&deploy, "clusterrole.yaml")?;
            Api::<ClusterRole>::all(admin.clone())
                .create(&pp, &cr)
                .await?;
            let crb: ClusterRoleBinding = load(&deploy, "clusterrolebinding.yaml")?;
            Api::<ClusterRoleBinding>::all(admin.clone())
                .create(&pp, &crb)
                .await?;
            let policy: ValidatingAdmissionPolicy = load(&deploy, "admission/policy.yaml")?;
            Api::<ValidatingAdmissionPolicy>::all(admin.clone())
                .create(&pp, &policy)
                .await?;
            let binding: ValidatingAdmissionPolicyBinding =
                load(&deploy, "admission/binding.yaml")?;
            Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
                .create(&pp, &binding)
                .await?;
        }
        Install::Namespaced => {
            roles
                .create(&pp, &load(&deploy, "namespaced/role.yaml")?)
                .await?;
            bindings
                .create(&pp, &load(&deploy, "namespaced/rolebinding.yaml")?)
                .await?;
        }
        Install::Nothing => unreachable!("returned above"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::PolicyRule;

    fn grants(rules: &[PolicyRule]) -> std::collections::BTreeSet<(String, String, String)> {
        let mut out = std::collections::BTreeSet::new();
        for r in rules {
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    for v in &r.verbs {
                        out.insert((g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
        out
    }

    /// A verb added to the cluster-wide install and forgotten in the namespaced one would fail
    /// only there, in production.
    #[test]
    fn the_namespaced_role_grants_every_namespaced_verb_of_the_cluster_role() {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let cluster: ClusterRole = load(&deploy, "clusterrole.yaml").unwrap();
        let role: Role = load(&deploy, "namespaced/role.yaml").unwrap();
        // Cluster-scoped, or used only with a cloud provider (node health), which a
        // namespaced install does not run.
        let cluster_scoped = [
            "nodes",
            "storageclasses",
            "csinodes",
            "volumeattachments",
            "leases",
            "namespaces",
            "persistentvolumes",
        ];
        // Used only together with a cluster-scoped grant: a version rollback deletes its claim
        // only after setting its PersistentVolume to Retain, which a namespaced install may not.
        let with_cluster_grant = [("", "persistentvolumeclaims", "delete")];
        let want: std::collections::BTreeSet<_> = grants(&cluster.rules.unwrap_or_default())
            .into_iter()
            // A subresource (`nodes/stats`) is scoped as its resource.
            .filter(|(_, r, _)| !cluster_scoped.contains(&r.split('/').next().unwrap_or(r)))
            .filter(|(g, r, v)| !with_cluster_grant.contains(&(g.as_str(), r.as_str(), v.as_str())))
            .collect();
        let have = grants(&role.rules.unwrap_or_default());
        assert_eq!(have, want);
    }
}
