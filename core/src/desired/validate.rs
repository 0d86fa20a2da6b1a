//! Checks of a QuestDB spec that the schema cannot express, or that the operator repeats as
//! defence in depth (a CRD installed by hand may lack the CEL rules). A spec that fails them
//! gets `Ready=False, reason=InvalidSpec` and no children at all.

use std::fmt;

use kube::ResourceExt;

use super::image_ref::{ImageRef, ImageRefError};
use super::quantity::parse_quantity;
use super::tenancy::{NotAllowed, TenancyPolicy};
use crate::api::{reserved_env_vars, QuestDB, RESERVED_SERVER_KEYS};

/// The longest QuestDB name: the StatefulSet controller labels each pod revision
/// `<name>-<10-character hash>`, and a label value holds at most 63 characters.
pub const NAME_MAX: usize = 52;
/// The shortest failover delay: below it a routine kubelet hiccup would fence a healthy node.
pub const MIN_UNHEALTHY_AFTER_SECONDS: i64 = 10;

/// One thing wrong with a spec, phrased for a human reading a condition message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecProblem {
    /// The name cannot be used for the Services and StatefulSet the operator derives from it.
    InvalidName { name: String, reason: &'static str },
    /// `spec.image` is not an image reference.
    InvalidImage {
        image: String,
        reason: ImageRefError,
    },
    /// `spec.imagePullPolicy` is not one Kubernetes knows.
    InvalidImagePullPolicy(String),
    /// `spec.volume.size` is not a positive quantity.
    InvalidVolumeSize(String),
    /// A `spec.config.server` key the operator sets itself.
    ReservedServerKey(String),
    /// An empty `spec.config.server` key.
    EmptyServerKey,
    /// A `spec.env` variable that would override a reserved server.conf key.
    ReservedEnvVar(String),
    /// A `spec.env` name Kubernetes would reject.
    InvalidEnvName(String),
    /// `spec.failover.unhealthyAfterSeconds` below [`MIN_UNHEALTHY_AFTER_SECONDS`].
    UnhealthyAfterTooShort(i64),
    /// A `spec.pod.extraVolumeMounts` path over the database's root, tables or checkpoint.
    ReservedMountPath(String),
    /// A `spec.pod` field the restricted Pod Security Standard refuses (the message names it).
    NotRestricted(String),
    /// `spec.image` is an older QuestDB version than the one the data last ran with.
    VersionDowngrade { image: String, data_version: String },
    /// A field outside one of the platform team's allow-lists (`TenancyPolicy`).
    NotAllowed(NotAllowed),
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName { name, reason } => write!(f, "name {name:?} cannot be used: {reason}"),
            Self::InvalidImage { image, reason } => {
                write!(f, "spec.image {image:?} is not a valid image reference: {reason}")
            }
            Self::InvalidImagePullPolicy(p) => write!(
                f,
                "spec.imagePullPolicy {p:?} must be one of Always, IfNotPresent, Never"
            ),
            Self::InvalidVolumeSize(s) => write!(
                f,
                "spec.volume.size {s:?} is not a positive quantity such as 50Gi"
            ),
            Self::ReservedServerKey(k) => write!(
                f,
                "server.conf key {k} is managed by the operator; remove it from spec.config.server"
            ),
            Self::EmptyServerKey => write!(f, "spec.config.server has an empty key"),
            Self::ReservedEnvVar(v) => write!(
                f,
                "env var {v} is managed by the operator; remove it from spec.env"
            ),
            Self::InvalidEnvName(v) => write!(
                f,
                "env var name {v:?} is invalid: use letters, digits, '_', '-' and '.', not starting with a digit"
            ),
            Self::UnhealthyAfterTooShort(s) => write!(
                f,
                "spec.failover.unhealthyAfterSeconds is {s}; it must be at least {MIN_UNHEALTHY_AFTER_SECONDS}"
            ),
            Self::ReservedMountPath(p) => write!(
                f,
                "mount path {p:?}: {}",
                crate::api::reserved_mount_message()
            ),
            Self::NotRestricted(problem) => {
                write!(f, "{problem} (restricted Pod Security, enforced by the operator)")
            }
            Self::VersionDowngrade { image, data_version } => write!(
                f,
                "spec.image {image:?} is older than QuestDB {data_version}, the version this database's data last ran with (status.dataVersion): QuestDB does not support downgrades, an older version may not read what a newer one wrote; the database keeps running as it was. Set spec.allowVersionDowngrade: true to run it anyway, or restore a backup taken on that version into a new QuestDB"
            ),
            Self::NotAllowed(n) => write!(f, "{n}"),
        }
    }
}

impl std::error::Error for SpecProblem {}

/// An image older than the version the data last ran with, unless acknowledged.
fn downgrade(qdb: &QuestDB) -> Option<SpecProblem> {
    if qdb.spec.allow_version_downgrade {
        return None;
    }
    let data_version = qdb.status.as_ref()?.data_version.clone()?;
    let image_version = crate::desired::version_of(&qdb.spec.image)?;
    crate::desired::version::older(&image_version, &data_version).then(|| {
        SpecProblem::VersionDowngrade {
            image: qdb.spec.image.clone(),
            data_version,
        }
    })
}

/// Every problem in `qdb`'s spec (and name), or `Ok` when the builders can act on it.
pub fn validate(qdb: &QuestDB) -> Result<(), Vec<SpecProblem>> {
    validate_with(qdb, &TenancyPolicy::default())
}

/// [`validate`], and the platform team's allow-lists.
pub fn validate_with(qdb: &QuestDB, tenancy: &TenancyPolicy) -> Result<(), Vec<SpecProblem>> {
    let spec = &qdb.spec;
    let mut problems = Vec::new();

    let name = qdb.name_any();
    if let Some(reason) = name_problem(&name) {
        problems.push(SpecProblem::InvalidName { name, reason });
    }
    if let Err(reason) = ImageRef::parse(&spec.image) {
        problems.push(SpecProblem::InvalidImage {
            image: spec.image.clone(),
            reason,
        });
    }
    if let Some(policy) = &spec.image_pull_policy {
        if !matches!(policy.as_str(), "Always" | "IfNotPresent" | "Never") {
            problems.push(SpecProblem::InvalidImagePullPolicy(policy.clone()));
        }
    }
    if !parse_quantity(&spec.volume.size).is_some_and(|bytes| bytes > 0.0) {
        problems.push(SpecProblem::InvalidVolumeSize(spec.volume.size.clone()));
    }
    for key in spec.config.server.keys() {
        if key.is_empty() {
            problems.push(SpecProblem::EmptyServerKey);
        } else if RESERVED_SERVER_KEYS.contains(&key.as_str()) {
            problems.push(SpecProblem::ReservedServerKey(key.clone()));
        }
    }
    let reserved_env = reserved_env_vars();
    for var in &spec.env {
        if reserved_env.contains(&var.name) {
            problems.push(SpecProblem::ReservedEnvVar(var.name.clone()));
        } else if !is_env_name(&var.name) {
            problems.push(SpecProblem::InvalidEnvName(var.name.clone()));
        }
    }
    for m in &spec.pod.extra_volume_mounts {
        if crate::api::reserved_mount_path(&m.mount_path) {
            problems.push(SpecProblem::ReservedMountPath(m.mount_path.clone()));
        }
    }
    problems.extend(
        crate::api::restricted_problems(&spec.pod)
            .into_iter()
            .map(SpecProblem::NotRestricted),
    );
    problems.extend(
        tenancy
            .problems(qdb)
            .into_iter()
            .map(SpecProblem::NotAllowed),
    );
    if let Some(problem) = downgrade(qdb) {
        problems.push(problem);
    }
    if spec.failover.unhealthy_after_seconds < MIN_UNHEALTHY_AFTER_SECONDS {
        problems.push(SpecProblem::UnhealthyAfterTooShort(
            spec.failover.unhealthy_after_seconds,
        ));
    }

    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The name becomes Service names, which must be DNS-1035 labels (a letter first), and a
/// StatefulSet name, which must leave room for the revision hash.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.len() > NAME_MAX {
        return Some("it must be at most 52 characters long");
    }
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (!valid).then_some(
        "it must start with a lower-case letter and contain only lower-case letters, digits and '-'",
    )
}

/// Kubernetes' rule for env var names (`[-._a-zA-Z][-._a-zA-Z0-9]*`).
fn is_env_name(name: &str) -> bool {
    let first_ok = |c: char| c.is_ascii_alphabetic() || "-._".contains(c);
    name.starts_with(first_ok) && name.chars().all(|c| first_ok(c) || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::EnvVar;

    fn env(name: &str) -> EnvVar {
        EnvVar {
            name: name.to_string(),
            value: Some("x".to_string()),
            ..EnvVar::default()
        }
    }

    fn problems(qdb: &QuestDB) -> Vec<SpecProblem> {
        validate(qdb).err().unwrap_or_default()
    }

    #[test]
    fn a_realistic_spec_is_valid() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec
            .config
            .server
            .insert("cairo.commit.lag".into(), "1000".into());
        qdb.spec.env = vec![env("QDB_SHARED_WORKER_COUNT"), env("JAVA_OPTS")];
        qdb.spec.image_pull_policy = Some("IfNotPresent".into());
        assert_eq!(validate(&qdb), Ok(()));
    }

    #[test]
    fn unparsable_image_is_reported_with_the_reason() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.image = "questdb/QuestDB:9.0.0".into();
        let found = problems(&qdb);
        assert!(
            matches!(found.as_slice(), [SpecProblem::InvalidImage { .. }]),
            "{found:?}"
        );
        let message = found[0].to_string();
        assert!(message.contains("questdb/QuestDB:9.0.0"), "{message}");
        assert!(message.contains("not a valid repository"), "{message}");
    }

    /// The harm: QuestDB 9.1 opening tables 9.2 wrote (no downgrade is supported).
    #[test]
    fn an_image_older_than_the_data_is_refused_unless_acknowledged() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.status = Some(crate::api::QuestDBStatus {
            data_version: Some("9.2.0".into()),
            ..Default::default()
        });
        qdb.spec.image = "questdb/questdb:9.1.0".into();
        let found = problems(&qdb);
        assert!(
            matches!(found.as_slice(), [SpecProblem::VersionDowngrade { .. }]),
            "{found:?}"
        );
        let message = found[0].to_string();
        assert!(
            message.contains("9.1.0")
                && message.contains("9.2.0")
                && message.contains("allowVersionDowngrade"),
            "{message}"
        );
        qdb.spec.allow_version_downgrade = true;
        assert_eq!(validate(&qdb), Ok(()));
        qdb.spec.allow_version_downgrade = false;
        for fine in [
            "questdb/questdb:9.2.0",
            "questdb/questdb:9.3.1",
            "questdb/questdb:latest",
        ] {
            qdb.spec.image = fine.into();
            assert_eq!(validate(&qdb), Ok(()), "{fine}");
        }
    }

    /// A QuestDB stored before the schema refused it (or past a webhook-less apiserver) is
    /// never built with a privileged pod: the operator's own check refuses it.
    #[test]
    fn a_pod_restricted_pod_security_refuses_is_an_invalid_spec() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.pod.container_security_context =
            Some(Box::new(k8s_openapi::api::core::v1::SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }));
        let found = problems(&qdb);
        assert!(
            matches!(found.as_slice(), [SpecProblem::NotRestricted(m)] if m.contains("privileged")),
            "{found:?}"
        );
        assert!(found[0].to_string().contains("restricted Pod Security"));
    }

    #[test]
    fn volume_size_must_be_a_positive_quantity() {
        for bad in ["50GB", "", "0", "-5Gi"] {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec.volume.size = bad.into();
            assert_eq!(
                problems(&qdb),
                vec![SpecProblem::InvalidVolumeSize(bad.into())],
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_reserved_server_key_is_rejected_by_name() {
        for key in RESERVED_SERVER_KEYS {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec.config.server.insert(key.to_string(), "x".into());
            let found = problems(&qdb);
            assert_eq!(found, vec![SpecProblem::ReservedServerKey(key.to_string())]);
            assert!(found[0].to_string().contains(key), "{}", found[0]);
        }
    }

    #[test]
    fn every_reserved_env_var_is_rejected_by_name() {
        for name in reserved_env_vars() {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec.env = vec![env(&name)];
            let found = problems(&qdb);
            assert_eq!(found, vec![SpecProblem::ReservedEnvVar(name.clone())]);
            assert!(found[0].to_string().contains(&name), "{}", found[0]);
        }
    }

    #[test]
    fn invalid_env_names_are_rejected() {
        for bad in ["1ABC", "A B", "A=B", ""] {
            let mut qdb = questdb("db1", "tenant-a");
            qdb.spec.env = vec![env(bad)];
            assert_eq!(
                problems(&qdb),
                vec![SpecProblem::InvalidEnvName(bad.into())]
            );
        }
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.env = vec![env("my.var-1"), env("_X")];
        assert_eq!(validate(&qdb), Ok(()));
    }

    #[test]
    fn failover_delay_must_be_at_least_ten_seconds() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.failover.unhealthy_after_seconds = 9;
        assert_eq!(problems(&qdb), vec![SpecProblem::UnhealthyAfterTooShort(9)]);
        qdb.spec.failover.unhealthy_after_seconds = 10;
        assert_eq!(validate(&qdb), Ok(()));
    }

    #[test]
    fn names_that_cannot_name_services_are_rejected() {
        for bad in ["1db", "db.one", &"d".repeat(53)] {
            let found = problems(&questdb(bad, "tenant-a"));
            assert!(
                matches!(found.as_slice(), [SpecProblem::InvalidName { .. }]),
                "{bad:?}: {found:?}"
            );
        }
        assert_eq!(validate(&questdb(&"d".repeat(52), "tenant-a")), Ok(()));
    }

    #[test]
    fn unknown_pull_policy_and_empty_key_are_rejected() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.image_pull_policy = Some("Sometimes".into());
        qdb.spec.config.server.insert(String::new(), "x".into());
        assert_eq!(
            problems(&qdb),
            vec![
                SpecProblem::InvalidImagePullPolicy("Sometimes".into()),
                SpecProblem::EmptyServerKey
            ]
        );
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.image = String::new();
        qdb.spec.volume.size = "lots".into();
        qdb.spec.failover.unhealthy_after_seconds = 1;
        assert_eq!(problems(&qdb).len(), 3);
    }
}
