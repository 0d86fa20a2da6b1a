//! What a platform team lets a tenant's QuestDB ask for beyond the restricted Pod Security
//! Standard the schema enforces: the image registries, the PriorityClasses and the taints a
//! database pod may use (the operator's `--allowed-image-registries`,
//! `--allowed-priority-classes` and `--allowed-toleration-keys`). A QuestDB outside them is
//! `SpecValid=False` naming the field and the flag, and nothing is built for it.

use super::image_ref::ImageRef;
use super::validate::SpecProblem;
use crate::api::QuestDB;

/// The registry a reference without one is pulled from (container runtimes' default).
const DEFAULT_REGISTRY: &str = "docker.io";

/// The allow-lists; an empty list allows whatever the schema allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenancyPolicy {
    /// Registries or repository prefixes (`123456789012.dkr.ecr.us-east-1.amazonaws.com`,
    /// `docker.io/questdb`) `spec.image` must come from.
    pub allowed_image_registries: Vec<String>,
    /// PriorityClasses `spec.pod.priorityClassName` may name.
    pub allowed_priority_classes: Vec<String>,
    /// Taint keys `spec.pod.tolerations` may tolerate.
    pub allowed_toleration_keys: Vec<String>,
    /// The namespaces whose Secrets the operator may read (one watch each, no cluster-wide
    /// read): a QuestDB elsewhere could get neither credentials nor ILP keys.
    pub secret_namespaces: Vec<String>,
}

impl TenancyPolicy {
    /// Every field of `qdb` outside the allow-lists.
    pub fn problems(&self, qdb: &QuestDB) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        let spec = &qdb.spec;
        let ns = qdb.metadata.namespace.clone().unwrap_or_default();
        if !self.secret_namespaces.is_empty() && !self.secret_namespaces.contains(&ns) {
            out.push(SpecProblem::NotAllowed {
                field: "metadata.namespace".to_string(),
                value: ns,
                flag: "--secret-namespaces",
                allowed: self.secret_namespaces.join(", "),
            });
        }
        if !self.allowed_image_registries.is_empty() {
            // An unparsable image is validate's to report.
            if let Ok(image) = ImageRef::parse(&spec.image) {
                let name = format!(
                    "{}/{}",
                    image.registry.as_deref().unwrap_or(DEFAULT_REGISTRY),
                    image.repository
                );
                if !self
                    .allowed_image_registries
                    .iter()
                    .any(|allowed| under(&name, allowed))
                {
                    out.push(SpecProblem::NotAllowed {
                        field: "spec.image".to_string(),
                        value: spec.image.clone(),
                        flag: "--allowed-image-registries",
                        allowed: self.allowed_image_registries.join(", "),
                    });
                }
            }
        }
        if let Some(class) = &spec.pod.priority_class_name {
            if !self.allowed_priority_classes.is_empty()
                && !self.allowed_priority_classes.contains(class)
            {
                out.push(SpecProblem::NotAllowed {
                    field: "spec.pod.priorityClassName".to_string(),
                    value: class.clone(),
                    flag: "--allowed-priority-classes",
                    allowed: self.allowed_priority_classes.join(", "),
                });
            }
        }
        if !self.allowed_toleration_keys.is_empty() {
            for (i, t) in spec.pod.tolerations.iter().enumerate() {
                let key = t.key.clone().unwrap_or_default();
                if !self.allowed_toleration_keys.contains(&key) {
                    out.push(SpecProblem::NotAllowed {
                        field: format!("spec.pod.tolerations[{i}].key"),
                        value: key,
                        flag: "--allowed-toleration-keys",
                        allowed: self.allowed_toleration_keys.join(", "),
                    });
                }
            }
        }
        out
    }
}

/// Whether the image name `name` (`registry/repository`) is `prefix` or lies under it, by
/// whole path segments (`docker.io/questdb` does not allow `docker.io/questdb-fork/...`).
fn under(name: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    !prefix.is_empty()
        && (name == prefix
            || name
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::Toleration;

    fn policy() -> TenancyPolicy {
        TenancyPolicy {
            allowed_image_registries: vec![
                "docker.io/questdb".into(),
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/".into(),
            ],
            allowed_priority_classes: vec!["databases".into()],
            allowed_toleration_keys: vec!["spot".into()],
            secret_namespaces: vec![],
        }
    }

    fn fields(problems: &[SpecProblem]) -> Vec<String> {
        problems
            .iter()
            .map(|p| match p {
                SpecProblem::NotAllowed { field, .. } => field.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_image_from_a_registry_the_platform_did_not_allow_is_refused() {
        for (image, allowed) in [
            ("questdb/questdb:9.2.0", true),
            ("docker.io/questdb/questdb:9.2.0", true),
            (
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/questdb:9.2.0",
                true,
            ),
            // A lookalike repository is not under the allowed one.
            ("questdb-fork/questdb:9.2.0", false),
            ("attacker.example/questdb/questdb:9.2.0", false),
            ("busybox", false),
        ] {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec.image = image.into();
            let problems = policy().problems(&qdb);
            assert_eq!(problems.is_empty(), allowed, "{image}: {problems:?}");
            if !allowed {
                assert_eq!(fields(&problems), vec!["spec.image"]);
                let message = problems[0].to_string();
                assert!(
                    message.contains("--allowed-image-registries")
                        && message.contains(image)
                        && message.contains("docker.io/questdb"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn a_priority_class_or_toleration_outside_the_allow_lists_is_refused_naming_the_field() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.pod.priority_class_name = Some("databases".into());
        qdb.spec.pod.tolerations = vec![Toleration {
            key: Some("spot".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        assert_eq!(policy().problems(&qdb), vec![]);

        qdb.spec.pod.priority_class_name = Some("batch-high".into());
        qdb.spec.pod.tolerations.push(Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        });
        assert_eq!(
            fields(&policy().problems(&qdb)),
            vec!["spec.pod.priorityClassName", "spec.pod.tolerations[1].key"]
        );
        // Empty lists allow whatever the schema allows.
        assert_eq!(TenancyPolicy::default().problems(&qdb), vec![]);
    }

    #[test]
    fn a_database_in_a_namespace_whose_secrets_the_operator_may_not_read_is_refused() {
        let policy = TenancyPolicy {
            secret_namespaces: vec!["team-a".into(), "team-b".into()],
            ..Default::default()
        };
        assert_eq!(policy.problems(&questdb("db1", "team-b")), vec![]);
        let problems = policy.problems(&questdb("db1", "team-c"));
        assert_eq!(fields(&problems), vec!["metadata.namespace"]);
        let message = problems[0].to_string();
        assert!(
            message.contains("--secret-namespaces") && message.contains("team-a, team-b"),
            "{message}"
        );
    }
}
