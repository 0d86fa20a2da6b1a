//! The CRDs as YAML: what `questdb-operator crd` prints and `crds/questdb.yaml` holds.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{QuestDB, QuestDBBackup, QuestDBBackupSchedule};

/// Every CRD the operator serves, `QuestDB` first.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        QuestDB::crd(),
        QuestDBBackup::crd(),
        QuestDBBackupSchedule::crd(),
    ]
}

/// [`all`] as one multi-document YAML stream.
pub fn yaml() -> anyhow::Result<String> {
    let docs = all()
        .iter()
        .map(serde_yaml_ng::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

#[cfg(test)]
mod tests {
    /// The checked-in CRD must be exactly what the code generates; regenerate it with
    /// `cargo run -- crd > crds/questdb.yaml`.
    #[test]
    fn checked_in_crd_matches_generated() {
        let generated = super::yaml().unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/questdb.yaml");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "crds/questdb.yaml is out of date: run `cargo run -- crd > crds/questdb.yaml`"
        );
    }
}
