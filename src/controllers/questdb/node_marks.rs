//! The operator's marks on a dedicated Node: the dedicated label and taint, the pin label, and
//! the taints the failover and move steps add, always over the Node's live taint list.

use k8s_openapi::api::core::v1::Node;
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

/// Adds the dedicated label and taint to the Node, keeping its other taints.
pub async fn dedicate(
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
pub async fn patch_node(
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
