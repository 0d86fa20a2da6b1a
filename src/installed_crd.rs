//! The installed `QuestDB` CRD against this operator's: an operator upgraded before its CRD
//! would write fields the old schema does not name, and the apiserver drops them from every
//! write (a node move's record, mid-move). The schema is read from the apiserver's OpenAPI v3
//! document of the group, which every authenticated client may read (the `system:discovery`
//! role): no right beyond what the operator has.

use kube::{Client, Resource};
use serde_json::Value;
use tracing::{info, warn};

use crate::api::QuestDB;

/// Refuses to start when the installed CRD lacks fields this operator writes; starts (with a
/// warning) when the served schema cannot be read, as it is no reason to keep databases
/// without their operator.
pub(crate) async fn refuse_an_older_crd(client: &Client) -> anyhow::Result<()> {
    let path = format!(
        "/openapi/v3/apis/{}/{}",
        QuestDB::group(&()),
        QuestDB::version(&())
    );
    let request = http::Request::get(&path).body(Vec::new())?;
    let document: Value = match client.request(request).await {
        Ok(document) => document,
        Err(e) => {
            warn!(error = %e, %path, "the installed QuestDB CRD could not be read from the apiserver's OpenAPI document; it is not checked against this operator's");
            return Ok(());
        }
    };
    let Some(served) = questdb_schema(&document) else {
        warn!(%path, "the apiserver's OpenAPI document has no QuestDB schema; the installed CRD is not checked against this operator's");
        return Ok(());
    };
    let missing = crate::crd::missing_fields(served);
    if missing.is_empty() {
        info!("the installed QuestDB CRD has every field this operator writes");
        return Ok(());
    }
    anyhow::bail!(
        "the installed QuestDB CRD is older than this operator: it lacks {}, which the apiserver would drop from what the operator writes (a node move's record among them). Apply this version's CRDs before its operator: kubectl apply --server-side --force-conflicts -f charts/questdb-operator/crds/questdb.yaml (docs/operations/install.md, Upgrades)",
        missing.join(", ")
    )
}

/// The `QuestDB` kind's schema among the document's components.
fn questdb_schema(document: &Value) -> Option<&Value> {
    document["components"]["schemas"]
        .as_object()?
        .values()
        .find(|schema| {
            schema["x-kubernetes-group-version-kind"]
                .as_array()
                .is_some_and(|gvks| {
                    gvks.iter().any(|gvk| {
                        gvk["kind"] == "QuestDB" && gvk["group"] == QuestDB::group(&()).as_ref()
                    })
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_questdb_schema_is_found_by_its_kind_among_the_groups_schemas() {
        let document = serde_json::json!({"components": {"schemas": {
            "io.questdb.crd.v1beta1.QuestDBBackup": {"x-kubernetes-group-version-kind": [
                {"group": "crd.questdb.io", "kind": "QuestDBBackup", "version": "v1beta1"}]},
            "io.questdb.crd.v1beta1.QuestDB": {"type": "object", "x-kubernetes-group-version-kind": [
                {"group": "crd.questdb.io", "kind": "QuestDB", "version": "v1beta1"}]},
        }}});
        assert_eq!(questdb_schema(&document).unwrap()["type"], "object");
        assert!(questdb_schema(&serde_json::json!({})).is_none());
    }
}
