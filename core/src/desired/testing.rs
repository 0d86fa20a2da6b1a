//! Realistic fixtures for tests in this crate and in `tests/` (hence not `#[cfg(test)]`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::api::{
    ConfigSpec, FailoverSpec, IlpAuthSpec, NetworkPolicySpec, QuestDB, QuestDBSpec, VolumeSpec,
};

/// The image the fixtures run; a real, pinned QuestDB release.
pub const IMAGE: &str = "questdb/questdb:9.0.0";

/// A `QuestDB` as the API server would hand it to the controller: named, namespaced, with a uid
/// (so owner references can be built) and generation 1, a 50Gi `gp3` volume, no user config.
pub fn questdb(name: &str, namespace: &str) -> QuestDB {
    QuestDB {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            uid: Some(uid_for(name, namespace)),
            generation: Some(1),
            resource_version: Some("1".to_string()),
            ..ObjectMeta::default()
        },
        spec: spec(),
        status: None,
    }
}

/// The spec of [`questdb`]: what a provisioner writes for a small database.
pub fn spec() -> QuestDBSpec {
    QuestDBSpec {
        image: IMAGE.to_string(),
        image_pull_policy: None,
        volume: VolumeSpec {
            size: "50Gi".to_string(),
            storage_class_name: Some("gp3".to_string()),
            retain_on_delete: true,
            restore_from: None,
            auto_grow: None,
        },
        resources: None,
        config: ConfigSpec::default(),
        env: Vec::new(),
        node: None,
        failover: FailoverSpec::default(),
        dns: None,
        ilp_auth: IlpAuthSpec::default(),
        paused: false,
        allow_version_downgrade: false,
        version_upgrade: Default::default(),
        network_policy: NetworkPolicySpec::default(),
        credentials: Default::default(),
        pod: Default::default(),
    }
}

/// A stable, UUID-shaped uid so two fixtures for the same object compare equal.
fn uid_for(name: &str, namespace: &str) -> String {
    let digest = hex::encode(Sha256::digest(format!("{namespace}/{name}")));
    format!(
        "{}-{}-{}-{}-{}",
        &digest[0..8],
        &digest[8..12],
        &digest[12..16],
        &digest[16..20],
        &digest[20..32]
    )
}
