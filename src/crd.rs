//! The CRD as YAML: what `questdb-operator crd` prints and `crds/questdb.yaml` holds.

use kube::CustomResourceExt;

use crate::api::QuestDB;

pub fn yaml() -> anyhow::Result<String> {
    Ok(serde_yaml_ng::to_string(&QuestDB::crd())?)
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
