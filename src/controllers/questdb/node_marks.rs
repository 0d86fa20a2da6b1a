//! The operator's marks on a dedicated Node: the dedicated label and taint, the pin label, and
//! the taints the failover and move steps add, always over the Node's live taint list.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use tracing::info;

use crate::api::MANAGER;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::{
    DedicatedNode, DEDICATED_LABEL_KEY, DEDICATED_TAINT_EFFECT, DEDICATED_TAINT_KEY, PIN_LABEL_KEY,
};

/// The CSI driver (`--csi-driver`) not yet registered on `node`, if any: its CSINode does not
/// list it. On EKS the EBS CSI node plugin registers after the Node is Ready; an attach before
/// that fails ("CSINode ... does not contain driver") and backs off for up to minutes, so a
/// node is dedicated (the database's pod can land there) only once the driver is there.
pub(crate) async fn csi_driver_missing(ctx: &Context, node: &str) -> Result<Option<String>, Error> {
    let Some(driver) = ctx
        .cloud
        .as_ref()
        .and_then(|c| c.settings.csi_driver.clone())
    else {
        return Ok(None);
    };
    let csinode = Api::<CSINode>::all(ctx.client.clone())
        .get_opt(node)
        .await
        .map_err(Error::Kube)?;
    let registered = csinode
        .and_then(|c| c.spec.drivers.into_iter().find(|d| d.name == driver))
        .is_some();
    Ok((!registered).then_some(driver))
}

/// What a node waits for while its CSI driver registers.
pub(crate) fn waiting_for_csi(node: &str, driver: &str) -> String {
    format!("node {node} waits for the CSI driver {driver} to register on it (its CSINode) before it takes the database")
}

/// Adds the dedicated label and taint to the Node, keeping its other taints.
pub(crate) async fn dedicate(
    ctx: &Context,
    name: &str,
    dedicated: &DedicatedNode,
    instance: &str,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let Some(live) = api.get_opt(name).await.map_err(Error::Kube)? else {
        return Ok(());
    };
    let taint = json!({
        "key": DEDICATED_TAINT_KEY,
        "value": dedicated.label_value,
        "effect": DEDICATED_TAINT_EFFECT,
    });
    let labels = json!({DEDICATED_LABEL_KEY: dedicated.label_value, PIN_LABEL_KEY: instance});
    patch_node(ctx, &live, taint, Some(labels)).await?;
    info!(node = %name, value = %dedicated.label_value, %instance, "dedicated node labelled, pinned and tainted");
    Ok(())
}

/// Adds `taint` to the live Node (replacing one with its key) and sets `labels`. The
/// resourceVersion guards the taint list: a merge patch replaces it whole.
pub(crate) async fn patch_node(
    ctx: &Context,
    live: &Node,
    taint: serde_json::Value,
    labels: Option<serde_json::Value>,
) -> Result<(), Error> {
    let key = taint["key"].as_str().unwrap_or_default().to_string();
    let mut taints: Vec<serde_json::Value> = live
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != key)
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    taints.push(taint);
    let mut metadata = json!({"resourceVersion": live.resource_version()});
    if let Some(labels) = labels {
        metadata["labels"] = labels;
    }
    let patch = json!({"metadata": metadata, "spec": {"taints": taints}});
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    Api::<Node>::all(ctx.client.clone())
        .patch(&live.name_any(), &pp, &Patch::Merge(&patch))
        .await
        .map_err(Error::from_status_write)?;
    Ok(())
}
