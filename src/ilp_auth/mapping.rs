//! Which QuestDB a key Secret belongs to.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;

use crate::api::{QuestDB, SECRET_QUESTDB_ANNOTATION};

/// Maps a Secret's metadata to the QuestDB named by its `crd.questdb.io/name` annotation, in the
/// Secret's own namespace.
///
/// Takes only metadata so it works on `PartialObjectMeta<Secret>` from a metadata-only watch:
/// `watches_stream(secret_meta_stream, |s| questdb_for_secret(&s.metadata))`.
///
/// `None` for a Secret without the annotation, without a namespace, or whose annotation is not a
/// possible QuestDB name (blank, surrounding spaces, upper case, ...): such a Secret can belong
/// to no QuestDB, and guessing (e.g. trimming) would make two spellings name the same database.
pub(crate) fn questdb_for_secret(secret_meta: &ObjectMeta) -> Option<ObjectRef<QuestDB>> {
    let name = secret_meta
        .annotations
        .as_ref()?
        .get(SECRET_QUESTDB_ANNOTATION)?;
    // The Secret's namespace is the only namespace it may speak for: anyone who can create a
    // Secret in namespace A must not be able to add a key to a QuestDB in namespace B.
    let namespace = secret_meta.namespace.as_deref()?;
    if !is_valid_questdb_name(name) || namespace.is_empty() {
        return None;
    }
    Some(ObjectRef::new(name).within(namespace))
}

/// Whether `name` can be the name of a QuestDB object: a Kubernetes DNS-1123 subdomain (lower
/// case alphanumerics, `-` and `.`, alphanumeric at both ends of every label, at most 253
/// characters), which is what the apiserver enforces for custom resource names.
pub(crate) fn is_valid_questdb_name(name: &str) -> bool {
    const MAX_LEN: usize = 253;
    const MAX_LABEL_LEN: usize = 63;
    if name.is_empty() || name.len() > MAX_LEN {
        return false;
    }
    name.split('.').all(|label| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                label.len() <= MAX_LABEL_LEN
                    && alnum(first)
                    && alnum(last)
                    && bytes.iter().all(|b| alnum(b) || *b == b'-')
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use kube::core::PartialObjectMeta;
    use std::collections::BTreeMap;

    fn meta(namespace: Option<&str>, annotation: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("client-key".into()),
            namespace: namespace.map(Into::into),
            annotations: annotation.map(|value| {
                BTreeMap::from([(SECRET_QUESTDB_ANNOTATION.to_string(), value.to_string())])
            }),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn annotated_secret_maps_to_questdb_in_its_own_namespace() {
        let target = questdb_for_secret(&meta(Some("team-a"), Some("db1"))).expect("mapped");
        assert_eq!(target.name, "db1");
        assert_eq!(target.namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn works_on_metadata_only_objects() {
        let partial: PartialObjectMeta<Secret> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "client-key",
                "namespace": "team-a",
                "annotations": {"crd.questdb.io/name": "db1"}
            }
        }))
        .expect("valid PartialObjectMeta");
        let target = questdb_for_secret(&partial.metadata).expect("mapped");
        assert_eq!(target, ObjectRef::<QuestDB>::new("db1").within("team-a"));
    }

    #[test]
    fn annotation_with_namespace_like_value_stays_in_the_secrets_namespace() {
        // "team-b/db1" is not a name; it must not be read as a pointer into team-b.
        assert_eq!(
            questdb_for_secret(&meta(Some("team-a"), Some("team-b/db1"))),
            None
        );
        let dotted = questdb_for_secret(&meta(Some("team-a"), Some("db1.team-b"))).expect("name");
        assert_eq!(dotted.namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn unannotated_or_namespaceless_secret_maps_to_nothing() {
        assert_eq!(questdb_for_secret(&meta(Some("team-a"), None)), None);
        assert_eq!(questdb_for_secret(&meta(None, Some("db1"))), None);
        assert_eq!(questdb_for_secret(&meta(Some(""), Some("db1"))), None);
        let other_annotation = ObjectMeta {
            annotations: Some(BTreeMap::from([(
                "example.com/name".to_string(),
                "db1".to_string(),
            )])),
            namespace: Some("team-a".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(questdb_for_secret(&other_annotation), None);
    }

    #[test]
    fn blank_or_invalid_annotation_maps_to_nothing() {
        for bad in [
            "", " ", " db1", "db1 ", "DB1", "db_1", "-db1", "db1-", "db..1", ".db1", "db1.",
        ] {
            assert_eq!(
                questdb_for_secret(&meta(Some("team-a"), Some(bad))),
                None,
                "annotation {bad:?} must not map"
            );
        }
        let too_long = "a".repeat(254);
        assert_eq!(
            questdb_for_secret(&meta(Some("team-a"), Some(&too_long))),
            None
        );
        let long_label = "a".repeat(64);
        assert!(!is_valid_questdb_name(&long_label));
        assert!(is_valid_questdb_name(&"a".repeat(63)));
        assert!(is_valid_questdb_name("db-1.prod"));
    }
}
