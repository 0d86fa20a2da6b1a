//! The writes a controller makes of its own resource, one shape for every kind (QuestDB,
//! QuestDBBackup, QuestDBBackupSchedule): its finalizer and its status. Each carries the
//! resourceVersion read, so a change made meanwhile (a user's edit, another leader's write) is
//! a conflict the reconcile decides again on, never overwritten; each names the operator as
//! its field manager.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::api::MANAGER;
use crate::controllers::Error;

/// What a controller may write of its own resource.
pub(crate) trait Own:
    Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug
{
}

impl<K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug> Own for K {}

pub(crate) fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds or removes `finalizer` with a merge patch that carries the resourceVersion read (a
/// list changed meanwhile is a conflict), and continues with the stored object. An object
/// gone while its finalizer was being removed leaves nothing to do.
pub(crate) async fn set_finalizer<K: Own>(
    api: &Api<K>,
    obj: &mut K,
    finalizer: &str,
    present: bool,
) -> Result<(), Error> {
    let mut finalizers: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if present {
        finalizers.push(finalizer.to_string());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match api.patch(&obj.name_any(), &pp, &Patch::Merge(&patch)).await {
        Ok(stored) => {
            *obj = stored;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        Err(e) => Err(Error::from_status_write(e)),
    }
}

/// Replaces the status of `obj` with the one it carries, through the status subresource, with
/// its resourceVersion; returns the stored object. The caller decides what a conflict means
/// (most: [`Error::from_status_write`]).
pub(crate) async fn replace_status<K: Own>(api: &Api<K>, obj: &K) -> kube::Result<K> {
    let mut body = obj.clone();
    // The server's bookkeeping of who set which field: never sent back.
    body.meta_mut().managed_fields = None;
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    api.replace_status(&obj.name_any(), &pp, &body).await
}
