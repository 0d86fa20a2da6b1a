//! Labels, annotations and owner references every child carries.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::api::{labels, QuestDB};

/// kubectl's copy of the whole applied object: copying it onto children would be wrong (it
/// describes the QuestDB) and large.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The operator's own labels, the only ones in selectors. Selectors are immutable, so they must
/// never include anything a user can edit.
pub fn selector_labels(qdb: &QuestDB) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::NAME.to_string(), labels::NAME_VALUE.to_string()),
        (labels::INSTANCE.to_string(), qdb.name_any()),
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
    ])
}

/// Prefix of the operator's own keys. On a QuestDB they speak to the operator
/// (`crd.questdb.io/skip-failover`); on a child they are the operator's bookkeeping (hashes,
/// the cached form): copied from the QuestDB they would overwrite it, or fight it for ever.
const OPERATOR_PREFIX: &str = "crd.questdb.io/";

fn users(key: &str) -> bool {
    !key.starts_with(OPERATOR_PREFIX)
}

/// The user's labels plus the selector labels; the selector labels win so a user label can never
/// take a child out of its own selector.
pub fn child_labels(qdb: &QuestDB) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = qdb
        .labels()
        .iter()
        .filter(|(k, _)| users(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.extend(selector_labels(qdb));
    out
}

/// Prefixes of the annotations Kubernetes' volume machinery writes on a claim (binding,
/// provisioner, the node a volume waits for). They are its own: one copied from a QuestDB onto
/// the claim could pin the volume to a node, and the PVC cache drops them (a few hundred bytes
/// a claim, never read).
const VOLUME_MACHINERY: [&str; 3] = [
    "pv.kubernetes.io/",
    "volume.kubernetes.io/",
    "volume.beta.kubernetes.io/",
];

/// Whether `key` is an annotation Kubernetes' volume machinery owns.
pub fn set_by_volume_machinery(key: &str) -> bool {
    VOLUME_MACHINERY.iter().any(|p| key.starts_with(p))
}

/// The user's annotations, minus kubectl's last-applied copy of the QuestDB, the operator's
/// own keys and the volume machinery's.
pub fn child_annotations(qdb: &QuestDB) -> BTreeMap<String, String> {
    qdb.annotations()
        .iter()
        .filter(|(k, _)| k.as_str() != LAST_APPLIED && users(k) && !set_by_volume_machinery(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Annotation prefixes a QuestDB's annotations reach its Services under: monitoring's
/// discovery only. Controllers act on a Service's other annotations (external-dns publishes a
/// `hostname` outside the operator's namespaced DNS rule, cloud load-balancer controllers open
/// ports), so a tenant's QuestDB must not steer them.
pub const SERVICE_ANNOTATION_PREFIXES: &[&str] = &["prometheus.io/", "ad.datadoghq.com/"];

/// The user's annotations a Service carries: [`child_annotations`] under
/// [`SERVICE_ANNOTATION_PREFIXES`].
pub fn service_annotations(qdb: &QuestDB) -> BTreeMap<String, String> {
    child_annotations(qdb)
        .into_iter()
        .filter(|(k, _)| SERVICE_ANNOTATION_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect()
}

/// The controller reference to the QuestDB (`controller` and `blockOwnerDeletion` set, so
/// foreground deletion waits for children). Empty only for a QuestDB that never came from the
/// API server (no uid), which the controller never sees.
pub fn owner_references(qdb: &QuestDB) -> Vec<OwnerReference> {
    qdb.controller_owner_ref(&())
        .map(|r| OwnerReference {
            block_owner_deletion: Some(true),
            ..r
        })
        .into_iter()
        .collect()
}

/// Metadata of a child named `name`: namespace, child labels and annotations, owner reference.
pub fn child_meta(qdb: &QuestDB, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: qdb.namespace(),
        labels: Some(child_labels(qdb)),
        annotations: non_empty(child_annotations(qdb)),
        owner_references: non_empty_vec(owner_references(qdb)),
        ..ObjectMeta::default()
    }
}

/// `None` for an empty map: the API server drops empty maps, and an absent field can never make
/// a desired object differ from the stored one.
pub(crate) fn non_empty(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

pub(crate) fn non_empty_vec<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;

    fn labelled() -> QuestDB {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.metadata.labels = Some(BTreeMap::from([
            ("team".to_string(), "payments".to_string()),
            // A user trying to hijack a selector label must not win.
            (labels::INSTANCE.to_string(), "other".to_string()),
        ]));
        qdb.metadata.annotations = Some(BTreeMap::from([
            ("owner".to_string(), "alice@example.com".to_string()),
            (LAST_APPLIED.to_string(), "{\"huge\":true}".to_string()),
        ]));
        qdb
    }

    #[test]
    fn a_volume_annotation_on_a_questdb_never_reaches_its_children() {
        let mut qdb = labelled();
        qdb.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend([
                (
                    "volume.kubernetes.io/selected-node".to_string(),
                    "node-a".to_string(),
                ),
                (
                    "pv.kubernetes.io/bind-completed".to_string(),
                    "yes".to_string(),
                ),
            ]);
        assert_eq!(
            child_annotations(&qdb).into_keys().collect::<Vec<_>>(),
            vec!["owner".to_string()]
        );
    }

    #[test]
    fn the_operators_own_keys_on_a_questdb_never_reach_its_children() {
        let mut qdb = labelled();
        qdb.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend([
                (
                    "crd.questdb.io/skip-failover".to_string(),
                    "true".to_string(),
                ),
                (
                    "crd.questdb.io/applied-hash".to_string(),
                    "forged".to_string(),
                ),
            ]);
        qdb.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(
                "crd.questdb.io/dedicated".to_string(),
                "other.db".to_string(),
            );
        let annotations = child_annotations(&qdb);
        assert!(
            annotations
                .keys()
                .all(|k| !k.starts_with("crd.questdb.io/")),
            "{annotations:?}"
        );
        assert_eq!(annotations["owner"], "alice@example.com");
        let labels = child_labels(&qdb);
        assert!(
            !labels.contains_key("crd.questdb.io/dedicated"),
            "{labels:?}"
        );
        assert_eq!(labels["team"], "payments");
    }

    #[test]
    fn selector_labels_are_exactly_the_operators_three() {
        let qdb = labelled();
        let sel = selector_labels(&qdb);
        assert_eq!(
            sel,
            BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "questdb".to_string()),
                ("app.kubernetes.io/instance".to_string(), "db1".to_string()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "questdb-operator".to_string()
                ),
            ])
        );
    }

    #[test]
    fn child_labels_keep_user_labels_and_selector_labels_win() {
        let labels = child_labels(&labelled());
        assert_eq!(labels.get("team").map(String::as_str), Some("payments"));
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some("db1")
        );
        assert_eq!(labels.len(), 4);
    }

    #[test]
    fn child_annotations_drop_last_applied_configuration() {
        let ann = child_annotations(&labelled());
        assert_eq!(
            ann,
            BTreeMap::from([("owner".to_string(), "alice@example.com".to_string())])
        );
    }

    #[test]
    fn owner_reference_is_a_blocking_controller_reference() {
        let qdb = questdb("db1", "tenant-a");
        let refs = owner_references(&qdb);
        assert_eq!(refs.len(), 1);
        let r = &refs[0];
        assert_eq!(r.api_version, "crd.questdb.io/v1beta1");
        assert_eq!(r.kind, "QuestDB");
        assert_eq!(r.name, "db1");
        assert_eq!(Some(&r.uid), qdb.metadata.uid.as_ref());
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));
    }

    #[test]
    fn child_meta_is_namespaced_labelled_and_owned() {
        let qdb = labelled();
        let meta = child_meta(&qdb, "db1-config".to_string());
        assert_eq!(meta.name.as_deref(), Some("db1-config"));
        assert_eq!(meta.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(meta.labels, Some(child_labels(&qdb)));
        assert_eq!(meta.annotations, Some(child_annotations(&qdb)));
        assert_eq!(meta.owner_references, Some(owner_references(&qdb)));
    }

    #[test]
    fn child_meta_omits_empty_annotations() {
        let meta = child_meta(&questdb("db1", "tenant-a"), "x".to_string());
        assert_eq!(meta.annotations, None);
    }
}
