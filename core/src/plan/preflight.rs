//! The preflight's findings (the operator's `controllers::preflight` asks): what each check's answer
//! means, and which finding holds launches back. Pure.

use std::sync::{Arc, Mutex};

use crate::cloud::CloudError;

/// What a preflight check looks at.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::Display,
    strum::IntoStaticStr,
    strum::EnumIter,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Check {
    /// `--aws-subnets`, `--aws-public-subnets` and `--aws-security-group-ids` against EC2.
    Network,
    /// Every exact type of `--allowed-node-instance-types` is known to EC2 and offered in a
    /// zone of `--aws-subnets` (a family pattern such as `m7i.*` is not checked).
    InstanceTypes,
    /// The hosted zone of `--route53-hosted-zone-id` can be read.
    HostedZone,
    /// The VolumeSnapshot API (the CSI snapshot CRDs) is served: backups need it.
    SnapshotApi,
    /// Every StorageClass a QuestDB names exists (a claim of a missing class stays Pending,
    /// and its database with it).
    StorageClass,
    /// EC2 would launch the nodes the QuestDBs ask for: a dry-run RunInstances of each image,
    /// instance type and zone in use (the operator's permissions, `iam:PassRole` of the
    /// instance profile, the profile itself).
    Launch,
}

/// One thing the preflight found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub check: Check,
    /// What is wrong, naming the resource.
    pub problem: String,
    /// What to do about it.
    pub fix: String,
    /// The answer is certain (EC2 said so), not a failure to ask: only a certain network
    /// mistake holds launches back.
    pub certain: bool,
}

impl Finding {
    /// The finding in one line: check, problem, fix.
    pub fn line(&self) -> String {
        format!("{}: {} (fix: {})", self.check, self.problem, self.fix)
    }
}

/// The newest findings, shared by the controllers.
#[derive(Default)]
pub struct PreflightState {
    findings: Mutex<Arc<[Finding]>>,
}

impl PreflightState {
    pub fn findings(&self) -> Arc<[Finding]> {
        self.findings.lock().expect("preflight lock").clone()
    }

    /// The finding that holds every launch back, if any (see [`blocks_launches`]).
    pub fn blocking_launch(&self) -> Option<Finding> {
        blocks_launches(&self.findings()).cloned()
    }

    /// Keeps `findings` as the newest; returns the ones they replace.
    pub fn replace(&self, findings: Vec<Finding>) -> Arc<[Finding]> {
        let new: Arc<[Finding]> = findings.into();
        std::mem::replace(&mut *self.findings.lock().expect("preflight lock"), new)
    }
}

/// The finding that stops a dedicated node from being launched: a certain network mistake
/// (EC2 would refuse the launch, or the node could not reach the cluster).
pub fn blocks_launches(findings: &[Finding]) -> Option<&Finding> {
    findings
        .iter()
        .find(|f| f.check == Check::Network && f.certain)
}

/// The findings of `check_network`'s answer.
pub fn network(answer: Result<(), CloudError>) -> Vec<Finding> {
    match answer {
        Ok(()) => vec![],
        Err(CloudError::Config(problem)) => vec![Finding {
            check: Check::Network,
            problem,
            fix: "correct the operator's AWS network settings (the chart's aws.subnets, aws.publicSubnets, aws.securityGroupIds) to subnets of one VPC, each in the zone it is mapped to, and security groups of that VPC".into(),
            certain: true,
        }],
        Err(e) => vec![unanswered(Check::Network, "DescribeSubnets/DescribeSecurityGroups", &e)],
    }
}

/// The findings for one exact instance type of the allow-list, from what EC2 says of it in
/// each configured zone (`None`: EC2 does not know the type).
pub fn instance_type(
    name: &str,
    zones: &[(
        String,
        Result<Option<crate::cloud::InstanceTypeFacts>, CloudError>,
    )],
) -> Vec<Finding> {
    if let Some((_, Err(e))) = zones.iter().find(|(_, a)| a.is_err()) {
        return vec![unanswered(Check::InstanceTypes, "DescribeInstanceTypes", e)];
    }
    let known: Vec<&crate::cloud::InstanceTypeFacts> = zones
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok().and_then(Option::as_ref))
        .collect();
    let zone_list = zones
        .iter()
        .map(|(z, _)| z.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if known.is_empty() {
        return vec![Finding {
            check: Check::InstanceTypes,
            problem: format!("the allowed instance type {name} is not an EC2 instance type"),
            fix: "correct --allowed-node-instance-types (the chart's aws.allowedInstanceTypes)"
                .into(),
            certain: true,
        }];
    }
    if !known.iter().any(|f| f.offered_in_zone) {
        return vec![Finding {
            check: Check::InstanceTypes,
            problem: format!(
                "the allowed instance type {name} is offered in none of the subnets' zones ({zone_list})"
            ),
            fix: "allow a type offered there, or add a subnet in a zone that offers it".into(),
            certain: true,
        }];
    }
    vec![]
}

/// The findings of a read of the hosted zone.
pub fn hosted_zone(zone_id: &str, answer: Result<(), CloudError>) -> Vec<Finding> {
    match answer {
        Ok(()) => vec![],
        Err(e) => vec![Finding {
            check: Check::HostedZone,
            problem: format!("the hosted zone {zone_id} cannot be read: {e}"),
            fix: "name an existing hosted zone (the chart's aws.hostedZoneId) and allow route53:ListResourceRecordSets on it".into(),
            certain: matches!(e, CloudError::Permanent { .. } | CloudError::Config(_)),
        }],
    }
}

/// The findings of asking whether the VolumeSnapshot API is served.
pub fn snapshot_api(answer: Result<bool, impl std::fmt::Display>) -> Vec<Finding> {
    match answer {
        Ok(true) => vec![],
        Ok(false) => vec![Finding {
            check: Check::SnapshotApi,
            problem: "the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not served: backups wait with SnapshotApiMissing".into(),
            fix: "install the CSI snapshot CRDs and snapshot-controller (kubernetes-csi/external-snapshotter), or the EKS snapshot-controller add-on".into(),
            certain: true,
        }],
        Err(e) => vec![Finding {
            check: Check::SnapshotApi,
            problem: format!("could not ask whether the VolumeSnapshot API is served: {e}"),
            fix: "allow the operator to list volumesnapshots".into(),
            certain: false,
        }],
    }
}

/// The findings of reading StorageClass `name`, which `asked_by` (a QuestDB, in words) names.
pub fn storage_class(
    name: &str,
    asked_by: &str,
    answer: Result<bool, impl std::fmt::Display>,
) -> Vec<Finding> {
    match answer {
        Ok(true) => vec![],
        Ok(false) => vec![Finding {
            check: Check::StorageClass,
            problem: format!(
                "the StorageClass {name} ({asked_by} names it) does not exist: its volume claim stays Pending and the database never starts"
            ),
            fix: format!(
                "create {name} (on EKS: kubectl apply -f deploy/aws/storageclass.yaml makes questdb-gp3), or name an existing class in spec.volume.storageClassName"
            ),
            certain: true,
        }],
        Err(e) => vec![Finding {
            check: Check::StorageClass,
            problem: format!("could not read the StorageClass {name} ({asked_by} names it): {e}"),
            fix: "allow the operator to get storageclasses (a namespaced install has no such right: the check is then only reported)".into(),
            certain: false,
        }],
    }
}

/// What one dry-run launch of `what` (image, type and zone, in words) means.
pub fn launch(what: &str, answer: Result<(), CloudError>) -> Vec<Finding> {
    let Err(e) = answer else {
        return vec![];
    };
    let text = e.to_string();
    // Named by its message whatever the code's class: EC2 says InvalidParameterValue, an
    // emulator IAM's NoSuchEntity.
    let profile = text.to_ascii_lowercase().contains("instance profile")
        || text.contains("iamInstanceProfile");
    let fix = if profile {
        "the instance profile the message names does not exist or cannot be used: create it (the stack's NodeInstanceProfile, `<cluster>-questdb-node`) or name an existing one (--aws-instance-profile, the chart's aws.instanceProfile)".to_string()
    } else if matches!(
        e,
        CloudError::Throttled { .. } | CloudError::Transient { .. }
    ) {
        return vec![unanswered(Check::Launch, "RunInstances with DryRun", &e)];
    } else if e.code() == Some("UnauthorizedOperation") {
        "the operator's role may not make this launch: its policy is deploy/aws/iam-policy.json (the stack's AllowedInstanceTypes and AllowedImageOwners must allow the type and the image's owner, and iam:PassRole the instance profile's role); `aws sts decode-authorization-message --encoded-message <message>` names the denied action and condition".to_string()
    } else {
        "EC2 refuses this launch as configured: correct what the message names (the operator's AWS settings, or the QuestDB's spec.node)".to_string()
    };
    vec![Finding {
        check: Check::Launch,
        problem: format!("EC2 would refuse to launch {what}: {text}"),
        fix,
        certain: true,
    }]
}

fn unanswered(check: Check, operation: &str, e: &CloudError) -> Finding {
    Finding {
        check,
        problem: format!("could not check ({operation}): {e}"),
        fix: "allow the operator's role this call, or wait for AWS to answer".into(),
        certain: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::InstanceTypeFacts;

    fn facts(offered: bool) -> Option<InstanceTypeFacts> {
        Some(InstanceTypeFacts {
            name: "m7i.xlarge".into(),
            architectures: vec!["x86_64".into()],
            offered_in_zone: offered,
        })
    }

    /// Only a certain network mistake holds launches back: a check EC2 did not answer
    /// (throttled, denied) must never stop a failover's replacement from launching.
    #[test]
    fn only_a_certain_network_mistake_holds_launches_back() {
        let wrong = network(Err(CloudError::Config(
            "--aws-subnets: subnet-dead does not exist".into(),
        )));
        assert!(blocks_launches(&wrong).is_some());
        assert!(
            wrong[0].line().contains("subnet-dead"),
            "{}",
            wrong[0].line()
        );
        let unanswered = network(Err(CloudError::Transient {
            operation: "DescribeSubnets".into(),
            code: "RequestLimitExceeded".into(),
            message: "slow down".into(),
        }));
        assert_eq!(unanswered.len(), 1);
        assert!(blocks_launches(&unanswered).is_none());
        assert!(network(Ok(())).is_empty());
        let type_unknown = instance_type("m9z.huge", &[("us-east-1a".into(), Ok(None))]);
        assert!(blocks_launches(&type_unknown).is_none());
    }

    /// An allowed type EC2 does not know, or offers in none of the subnets' zones, is named;
    /// one offered in any of them passes.
    #[test]
    fn an_allowed_instance_type_must_exist_and_be_offered_in_a_configured_zone() {
        let zones = |a: Option<InstanceTypeFacts>, b: Option<InstanceTypeFacts>| {
            vec![
                ("us-east-1a".to_string(), Ok(a)),
                ("us-east-1b".to_string(), Ok(b)),
            ]
        };
        assert!(instance_type("m7i.xlarge", &zones(facts(false), facts(true))).is_empty());
        let nowhere = instance_type("m7i.xlarge", &zones(facts(false), facts(false)));
        assert!(
            nowhere[0].problem.contains("us-east-1a, us-east-1b"),
            "{}",
            nowhere[0].problem
        );
        let unknown = instance_type("m9z.huge", &zones(None, None));
        assert!(unknown[0].problem.contains("m9z.huge") && unknown[0].certain);
    }

    /// A launch IAM would deny, or naming an instance profile that does not exist, is named
    /// with the policy or the profile to fix, before a database waits on a refused launch; an
    /// unanswered dry run is not a certain finding.
    #[test]
    fn a_launch_ec2_would_refuse_names_the_permission_or_the_profile() {
        let what = "m7i.xlarge from ami-1 in us-east-1a";
        assert!(launch(what, Ok(())).is_empty());
        let denied = launch(
            what,
            Err(CloudError::Permanent {
                operation: "RunInstances".into(),
                code: "UnauthorizedOperation".into(),
                message: "You are not authorized to perform this operation. Encoded authorization failure message: abc".into(),
            }),
        );
        assert!(denied[0].certain && denied[0].fix.contains("iam-policy.json"));
        assert!(denied[0].problem.contains(what), "{}", denied[0].problem);
        let no_profile = launch(
            what,
            Err(CloudError::Permanent {
                operation: "RunInstances".into(),
                code: "InvalidParameterValue".into(),
                message: "Value (prod-eu-questdb-node) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name".into(),
            }),
        );
        let unknown_class = launch(
            what,
            Err(CloudError::Transient {
                operation: "RunInstances".into(),
                code: "NoSuchEntity".into(),
                message: "Instance profile prod-eu-questdb-node not found".into(),
            }),
        );
        assert!(unknown_class[0].certain, "{:?}", unknown_class[0]);
        assert!(
            no_profile[0].problem.contains("prod-eu-questdb-node")
                && no_profile[0].fix.contains("aws.instanceProfile"),
            "{}",
            no_profile[0].fix
        );
        let slow = launch(
            what,
            Err(CloudError::Throttled {
                operation: "RunInstances".into(),
                message: "slow down".into(),
            }),
        );
        assert!(!slow[0].certain);
    }

    #[test]
    fn a_storage_class_no_one_made_is_named_with_the_class_the_stack_ships() {
        assert!(storage_class("questdb-gp3", "team-a/orders", Ok::<_, String>(true)).is_empty());
        let missing = storage_class("questdb-gp3", "team-a/orders", Ok::<_, String>(false));
        assert!(missing[0].certain);
        assert!(missing[0].problem.contains("team-a/orders"));
        assert!(missing[0].fix.contains("deploy/aws/storageclass.yaml"));
    }

    #[test]
    fn a_missing_snapshot_api_is_named_with_its_fix() {
        let missing = snapshot_api(Ok::<_, String>(false));
        assert_eq!(missing[0].check, Check::SnapshotApi);
        assert!(missing[0].fix.contains("snapshot-controller"));
        assert!(snapshot_api(Ok::<_, String>(true)).is_empty());
    }
}
