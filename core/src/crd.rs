//! The CRDs as YAML: what `questdb-operator crd` prints and `crds/questdb.yaml` holds.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{QuestDB, QuestDBBackup, QuestDBBackupSchedule};

/// The kubelet's default `nodeLeaseDurationSeconds`; it renews every quarter of it (10 s).
pub const DEFAULT_NODE_LEASE_DURATION: Duration = Duration::from_secs(40);

/// Every CRD the operator serves, `QuestDB` first, for kubelets with the default Lease.
pub fn all() -> Vec<CustomResourceDefinition> {
    for_lease(DEFAULT_NODE_LEASE_DURATION)
}

/// Every CRD, `QuestDB` first, for kubelets whose Lease lasts `lease_duration`.
pub fn for_lease(lease_duration: Duration) -> Vec<CustomResourceDefinition> {
    vec![
        questdb(lease_duration),
        QuestDBBackup::crd(),
        QuestDBBackupSchedule::crd(),
    ]
}

/// The `QuestDB` CRD whose floor on `spec.failover.unhealthyAfterSeconds` is `lease_duration`:
/// a live kubelet leaves its Lease unrenewed for up to that long, so a shorter threshold would
/// fence healthy nodes. The operator's `--node-lease-duration` sets the same floor in code.
pub fn questdb(lease_duration: Duration) -> CustomResourceDefinition {
    let mut crd = QuestDB::crd();
    let floor = lease_duration.as_secs().max(1);
    for version in &mut crd.spec.versions {
        let field = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut()?.get_mut("spec"))
            .and_then(|s| s.properties.as_mut()?.get_mut("failover"))
            .and_then(|s| s.properties.as_mut()?.get_mut("unhealthyAfterSeconds"));
        let Some(field) = field else { continue };
        for rule in field.x_kubernetes_validations.iter_mut().flatten() {
            rule.rule = format!("self >= {floor}");
            rule.message = Some(format!(
                "failover.unhealthyAfterSeconds must be at least {floor}, the kubelets' Lease duration"
            ));
        }
    }
    crd
}

/// The fields this operator's `QuestDB` schema has under `spec` and `status` that `served` (the
/// schema the apiserver serves for the installed CRD, as its OpenAPI v3 document gives it)
/// lacks, as dotted paths. Non-empty: the installed CRD is older than the operator, and the
/// apiserver would drop those fields from every write (a node move's record under
/// `status.nodeMove`, say, mid-move). A subtree the served schema keeps whole
/// (`x-kubernetes-preserve-unknown-fields`) lacks nothing.
pub fn missing_fields(served: &serde_json::Value) -> Vec<String> {
    let ours = serde_json::to_value(QuestDB::crd()).unwrap_or_default();
    let ours = &ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut missing = Vec::new();
    for top in ["spec", "status"] {
        match served["properties"].get(top) {
            Some(theirs) => missing_below(&ours[top], theirs, top, &mut missing),
            None => missing.push(top.to_string()),
        }
    }
    missing
}

fn missing_below(
    ours: &serde_json::Value,
    theirs: &serde_json::Value,
    path: &str,
    missing: &mut Vec<String>,
) {
    if theirs["x-kubernetes-preserve-unknown-fields"] == serde_json::Value::Bool(true) {
        return;
    }
    if let Some(properties) = ours["properties"].as_object() {
        for (name, schema) in properties {
            let here = format!("{path}.{name}");
            match theirs["properties"].get(name) {
                Some(served) => missing_below(schema, served, &here, missing),
                None => missing.push(here),
            }
        }
    }
    if ours.get("items").is_some() && theirs.get("items").is_some() {
        missing_below(
            &ours["items"],
            &theirs["items"],
            &format!("{path}[]"),
            missing,
        );
    }
}

/// [`all`] as one multi-document YAML stream.
pub fn yaml() -> anyhow::Result<String> {
    yaml_for_lease(DEFAULT_NODE_LEASE_DURATION)
}

/// [`for_lease`] as one multi-document YAML stream.
pub fn yaml_for_lease(lease_duration: Duration) -> anyhow::Result<String> {
    let docs = for_lease(lease_duration)
        .iter()
        .map(serde_yaml_ng::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    fn floor_rule(crd: &super::CustomResourceDefinition) -> String {
        let json = serde_json::to_value(crd).unwrap();
        json.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/failover/properties/unhealthyAfterSeconds/x-kubernetes-validations/0/rule")
            .and_then(|r| r.as_str())
            .expect("the floor rule is where the renderer looks")
            .to_string()
    }

    #[test]
    fn the_default_crd_floors_the_failover_threshold_at_the_kubelets_default_lease() {
        assert_eq!(floor_rule(&super::all()[0]), "self >= 40");
        assert_eq!(
            super::questdb(super::DEFAULT_NODE_LEASE_DURATION),
            <crate::api::QuestDB as kube::CustomResourceExt>::crd()
        );
    }

    #[test]
    fn a_cluster_with_shorter_kubelet_leases_gets_a_lower_floor() {
        assert_eq!(
            floor_rule(&super::questdb(Duration::from_secs(12))),
            "self >= 12"
        );
    }

    fn served_schema() -> serde_json::Value {
        let crd =
            serde_json::to_value(<crate::api::QuestDB as kube::CustomResourceExt>::crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn the_installed_crd_of_this_version_lacks_nothing() {
        assert_eq!(
            super::missing_fields(&served_schema()),
            Vec::<String>::new()
        );
    }

    /// The harm: an operator upgraded before its CRD writes a node move's record the old
    /// schema does not name, and the apiserver drops it, mid-move.
    #[test]
    fn an_older_crd_is_named_by_the_fields_it_would_drop() {
        let mut older = served_schema();
        let status = older["properties"]["status"]["properties"]
            .as_object_mut()
            .unwrap();
        status.remove("nodeMove");
        let node_move = status["upgrade"]["properties"].as_object_mut().unwrap();
        node_move.remove("drainedNode");
        older["properties"]["spec"]["properties"]["env"]["items"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("valueFrom");
        assert_eq!(
            super::missing_fields(&older),
            vec![
                "spec.env[].valueFrom".to_string(),
                "status.nodeMove".to_string(),
                "status.upgrade.drainedNode".to_string(),
            ]
        );
        // A subtree kept whole lacks nothing.
        older["properties"]["status"] =
            serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        older["properties"]["spec"] = older["properties"]["status"].clone();
        assert!(super::missing_fields(&older).is_empty());
    }

    /// The checked-in CRD must be exactly what the code generates; regenerate it with
    /// `cargo run -- crd > crds/questdb.yaml`.
    #[test]
    fn checked_in_crd_matches_generated() {
        let generated = super::yaml().unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/questdb.yaml");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "crds/questdb.yaml is out of date: run `cargo run -- crd > crds/questdb.yaml`"
        );
    }
}
