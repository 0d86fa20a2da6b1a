//! What a platform team lets a tenant's QuestDB ask for beyond the restricted Pod Security
//! Standard the schema enforces: the image registries, the PriorityClasses and the taints a
//! database pod may use (the operator's `--allowed-image-registries`,
//! `--allowed-priority-classes` and `--allowed-toleration-keys`). A QuestDB outside them is
//! `SpecValid=False` naming the field and the flag, and nothing is built for it.

use std::fmt;

use super::image_ref::ImageRef;
use crate::api::QuestDB;

/// The registry a reference without one is pulled from (container runtimes' default).
const DEFAULT_REGISTRY: &str = "docker.io";

/// A field outside one of the allow-lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAllowed {
    pub field: String,
    pub value: String,
    pub flag: &'static str,
    pub allowed: String,
}

impl fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} is not allowed by the operator's {} ({}); ask the platform team or pick an allowed one",
            self.field, self.value, self.flag, self.allowed
        )
    }
}

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
    /// The shortest time between two runs of a backup schedule, and the most backups one
    /// keeps: each backup is a volume snapshot in the account's quota, shared by every tenant.
    pub backup_schedules: ScheduleLimits,
}

/// `--backup-schedule-min-interval`, `--backup-retention-max`; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleLimits {
    pub min_interval: Option<std::time::Duration>,
    pub max_retention: Option<i32>,
}

impl ScheduleLimits {
    /// Why a schedule that runs at most every `shortest_gap` and keeps `retention` backups is
    /// refused, if it is.
    pub fn refusal(
        &self,
        shortest_gap: Option<std::time::Duration>,
        retention: i32,
    ) -> Option<String> {
        if let (Some(min), Some(gap)) = (self.min_interval, shortest_gap) {
            if gap < min {
                return Some(format!(
                    "schedule runs {}s apart at its closest; at most one backup every {}s is allowed here (--backup-schedule-min-interval)",
                    gap.as_secs(),
                    min.as_secs()
                ));
            }
        }
        match self.max_retention {
            Some(max) if retention > max => Some(format!(
                "retention {retention} keeps more backups than the {max} allowed here (--backup-retention-max)"
            )),
            _ => None,
        }
    }
}

impl TenancyPolicy {
    /// Every field of `qdb` outside the allow-lists.
    pub fn problems(&self, qdb: &QuestDB) -> Vec<NotAllowed> {
        let mut out = Vec::new();
        let spec = &qdb.spec;
        let ns = qdb.metadata.namespace.clone().unwrap_or_default();
        if !self.secret_namespaces.is_empty() && !self.secret_namespaces.contains(&ns) {
            out.push(NotAllowed {
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
                    out.push(NotAllowed {
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
                out.push(NotAllowed {
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
                    out.push(NotAllowed {
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
            backup_schedules: ScheduleLimits::default(),
        }
    }

    fn fields(problems: &[NotAllowed]) -> Vec<String> {
        problems.iter().map(|p| p.field.clone()).collect()
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
    fn a_schedule_denser_or_longer_kept_than_the_platform_allows_is_refused() {
        let limits = ScheduleLimits {
            min_interval: Some(std::time::Duration::from_secs(600)),
            max_retention: Some(100),
        };
        let minutes = |m: u64| Some(std::time::Duration::from_secs(m * 60));
        assert_eq!(limits.refusal(minutes(10), 100), None);
        assert_eq!(limits.refusal(None, 1), None);
        let dense = limits.refusal(minutes(1), 7).unwrap();
        assert!(dense.contains("--backup-schedule-min-interval"), "{dense}");
        let hoarding = limits.refusal(minutes(60), 1000).unwrap();
        assert!(hoarding.contains("--backup-retention-max"), "{hoarding}");
        assert_eq!(ScheduleLimits::default().refusal(minutes(1), 1000), None);
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
