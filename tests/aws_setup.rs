//! The AWS set-up shipped in `deploy/aws/`: the CloudFormation template grants the operator
//! exactly the reviewed policy of `iam-policy.json` (a permission added to one and not the other
//! fails here, not with AccessDenied in a customer's account), AWS's own linter accepts it, and
//! the StorageClass puts volumes where dedicated nodes can attach them.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{json, Value};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn json_file(path: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
}

fn yaml_file<T: serde::de::DeserializeOwned>(path: &str) -> T {
    serde_yaml_ng::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
}

fn template() -> Value {
    json_file("deploy/aws/questdb-operator.cfn.json")
}

/// The template's value of the operator policy with its conditions decided by `condition`,
/// parameters as `iam-policy.json`'s placeholders and pseudo-parameters as the policy writes
/// them, so that the two documents compare equal when they grant the same.
fn resolve(v: &Value, condition: &dyn Fn(&str) -> bool) -> Option<Value> {
    let placeholders = [
        ("${AWS::Partition}", "REPLACE_PARTITION"),
        ("${AWS::URLSuffix}", "REPLACE_URL_SUFFIX"),
        ("${AWS::Region}", "REPLACE_REGION"),
        ("${AWS::AccountId}", "REPLACE_ACCOUNT_ID"),
        ("${ClusterName}", "REPLACE_CLUSTER_NAME"),
        ("${NodeRole}", "REPLACE_NODE_ROLE_NAME"),
        ("${HostedZoneId}", "REPLACE_HOSTED_ZONE_ID"),
        ("${RecordNames}", "REPLACE_RECORD_NAMES"),
    ];
    match v {
        Value::Object(m) if m.len() == 1 && m.contains_key("Fn::Sub") => {
            let mut s = m["Fn::Sub"]
                .as_str()
                .expect("Fn::Sub of a string")
                .to_string();
            for (var, to) in placeholders {
                s = s.replace(var, to);
            }
            assert!(
                !s.contains("${"),
                "a variable the policy has no placeholder for: {s}"
            );
            Some(Value::String(s))
        }
        Value::Object(m) if m.len() == 1 && m.contains_key("Ref") => {
            Some(match m["Ref"].as_str().unwrap() {
                "AWS::NoValue" => return None,
                "AllowedInstanceTypes" => json!(["REPLACE_ALLOWED_INSTANCE_TYPES"]),
                "AllowedImageOwners" => json!(["REPLACE_ALLOWED_IMAGE_OWNERS"]),
                "RootVolumeKmsKeyArn" => json!("REPLACE_KMS_KEY_ARN"),
                other => panic!("Ref {other} has no placeholder in iam-policy.json"),
            })
        }
        Value::Object(m) if m.len() == 1 && m.contains_key("Fn::If") => {
            let branches = m["Fn::If"].as_array().unwrap();
            let pick = if condition(branches[0].as_str().unwrap()) {
                &branches[1]
            } else {
                &branches[2]
            };
            resolve(pick, condition)
        }
        Value::Object(m) => Some(Value::Object(
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), resolve(v, condition)?)))
                .collect(),
        )),
        Value::Array(a) => {
            let items: Vec<Value> = a.iter().filter_map(|v| resolve(v, condition)).collect();
            Some(Value::Array(items))
        }
        other => Some(other.clone()),
    }
}

fn operator_policy(condition: &dyn Fn(&str) -> bool) -> Value {
    let t = template();
    resolve(
        &t["Resources"]["OperatorPolicy"]["Properties"]["PolicyDocument"],
        condition,
    )
    .unwrap()
}

#[test]
fn the_cloudformation_stack_grants_the_operator_exactly_the_reviewed_iam_policy() {
    let with_dns = operator_policy(&|c| c == "ManagesDns");
    assert_eq!(with_dns, json_file("deploy/aws/iam-policy.json"));
}

#[test]
fn without_a_hosted_zone_the_operator_gets_no_dns_permission() {
    let policy = operator_policy(&|_| false);
    let text = policy.to_string();
    assert!(!text.contains("route53"), "{text}");
    assert!(text.contains("ec2:RunInstances"), "{text}");
}

/// docs/operations/eks.md: a customer-managed key for the nodes' volumes needs these on that key, and nothing
/// else does; `kms:ReEncrypt*` is spelled out so that no action is a wildcard.
#[test]
fn a_customer_key_adds_exactly_the_kms_calls_ebs_makes_on_the_operators_behalf() {
    let policy = operator_policy(&|c| c == "EncryptsWithOwnKey");
    let kms: Vec<&Value> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.to_string().contains("kms:"))
        .collect();
    assert_eq!(kms.len(), 1, "{policy}");
    assert_eq!(
        kms[0]["Action"],
        json!([
            "kms:CreateGrant",
            "kms:Decrypt",
            "kms:DescribeKey",
            "kms:GenerateDataKeyWithoutPlaintext",
            "kms:ReEncryptFrom",
            "kms:ReEncryptTo"
        ])
    );
    assert_eq!(
        kms[0]["Condition"]["StringEquals"]["kms:ViaService"],
        "ec2.REPLACE_REGION.REPLACE_URL_SUFFIX",
        "only through EC2"
    );
}

/// The role is assumable by the operator's ServiceAccount alone: by EKS Pod Identity (which
/// needs `sts:TagSession`) or by IRSA for exactly `system:serviceaccount:<ns>:<sa>`, whose
/// defaults are the names `deploy/` and the chart install.
#[test]
fn only_the_operators_service_account_can_assume_its_role() {
    let t = template();
    let trust = &t["Resources"]["OperatorRole"]["Properties"]["AssumeRolePolicyDocument"]["Fn::If"];
    assert_eq!(trust[0], "UsesPodIdentity");
    // Partition-neutral: `amazonaws.com` is the commercial partition's suffix only.
    assert_eq!(
        trust[1]["Statement"][0]["Principal"]["Service"],
        json!({"Fn::Sub": "pods.eks.${AWS::URLSuffix}"})
    );
    let text = template().to_string();
    assert!(
        !text.contains("arn:aws:") && !text.contains("\"ec2.amazonaws.com\""),
        "a partition-specific name in the stack"
    );
    assert_eq!(
        trust[1]["Statement"][0]["Action"],
        json!(["sts:AssumeRole", "sts:TagSession"])
    );
    let irsa: Value = serde_json::from_str(trust[2]["Fn::Sub"].as_str().unwrap()).unwrap();
    let condition = &irsa["Statement"][0]["Condition"]["StringEquals"];
    assert_eq!(
        condition["${OidcIssuer}:sub"],
        "system:serviceaccount:${OperatorNamespace}:${OperatorServiceAccount}"
    );
    assert_eq!(condition["${OidcIssuer}:aud"], "sts.amazonaws.com");
    let params = &t["Parameters"];
    let sa: Value = yaml_file("deploy/operator/serviceaccount.yaml");
    assert_eq!(
        params["OperatorServiceAccount"]["Default"],
        sa["metadata"]["name"]
    );
    let ns: Value = yaml_file("deploy/operator/namespace.yaml");
    assert_eq!(
        params["OperatorNamespace"]["Default"],
        ns["metadata"]["name"]
    );
}

/// Without an access entry of type EC2_LINUX for the instance profile's role, an instance
/// boots, its kubelet is refused, and no node ever registers.
#[test]
fn the_node_role_can_join_the_cluster_and_pull_images() {
    let t = template();
    let r = &t["Resources"];
    assert_eq!(r["NodeAccessEntry"]["Properties"]["Type"], "EC2_LINUX");
    assert_eq!(
        r["NodeAccessEntry"]["Properties"]["PrincipalArn"],
        json!({"Fn::GetAtt": ["NodeRole", "Arn"]})
    );
    assert_eq!(
        r["NodeInstanceProfile"]["Properties"]["Roles"],
        json!([{"Ref": "NodeRole"}])
    );
    let managed = r["NodeRole"]["Properties"]["ManagedPolicyArns"].to_string();
    for policy in [
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryPullOnly",
        "AmazonEKS_CNI_Policy",
    ] {
        assert!(managed.contains(policy), "{policy} in {managed}");
    }
    // The policy's PassRole names this role, so the operator can hand it to nothing else.
    let policy = operator_policy(&|_| true);
    let pass = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["Action"] == "iam:PassRole")
        .unwrap();
    assert_eq!(
        pass["Resource"],
        "arn:REPLACE_PARTITION:iam::REPLACE_ACCOUNT_ID:role/REPLACE_NODE_ROLE_NAME"
    );
}

/// A dedicated security group opens the database ports to the clients' addresses only, not
/// to every node that carries the cluster security group.
#[test]
fn the_database_security_group_opens_only_the_database_ports() {
    let t = template();
    let ingress = t["Resources"]["DatabaseSecurityGroup"]["Properties"]["SecurityGroupIngress"]
        .as_array()
        .unwrap()
        .clone();
    let ports: Vec<(i64, i64)> = ingress
        .iter()
        .map(|r| {
            (
                r["FromPort"].as_i64().unwrap(),
                r["ToPort"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, vec![(9000, 9000), (8812, 8812), (9009, 9009)]);
    for rule in &ingress {
        assert_eq!(rule["IpProtocol"], "tcp");
        assert_eq!(rule["CidrIp"], json!({"Ref": "ClientCidr"}));
    }
}

fn cfn_lint() -> PathBuf {
    if let Ok(bin) = std::env::var("QDB_CFN_LINT") {
        return PathBuf::from(bin);
    }
    let out = Command::new("bash")
        .arg(repo(".ci/cfn-lint.sh"))
        .output()
        .expect("bash .ci/cfn-lint.sh");
    assert!(
        out.status.success(),
        "installing cfn-lint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// AWS's linter checks every resource type, property, intrinsic function and `Fn::Sub`
/// variable against CloudFormation's published specifications: a template it refuses would
/// fail `aws cloudformation deploy` in the customer's account.
#[test]
fn cloudformation_lint_accepts_the_template() {
    let lint = cfn_lint();
    let run = |path: &Path| {
        Command::new(&lint)
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", lint.display()))
    };
    let out = run(&repo("deploy/aws/questdb-operator.cfn.json"));
    assert!(
        out.status.success(),
        "cfn-lint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And it refuses what CloudFormation would: a template missing a required property.
    let mut broken = template();
    broken["Resources"]["DatabaseSecurityGroup"]["Properties"]
        .as_object_mut()
        .unwrap()
        .remove("GroupDescription");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, broken.to_string()).unwrap();
    let out = run(&path);
    assert!(!out.status.success(), "cfn-lint accepted a broken template");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("GroupDescription"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// No StorageClass is the default on a new EKS cluster, and an Immediate one can put the
/// volume in another zone than the dedicated node that must attach it.
#[test]
fn the_storage_class_makes_encrypted_volumes_in_the_zone_the_pod_lands_in() {
    let class: StorageClass = yaml_file("deploy/aws/storageclass.yaml");
    assert_eq!(class.provisioner, "ebs.csi.aws.com");
    assert_eq!(
        class.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    assert_eq!(class.allow_volume_expansion, Some(true));
    let params = class.parameters.unwrap_or_default();
    assert_eq!(params.get("type").map(String::as_str), Some("gp3"));
    assert_eq!(params.get("encrypted").map(String::as_str), Some("true"));
    let annotations = class.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key("storageclass.kubernetes.io/is-default-class"),
        "the class does not make itself every workload's default"
    );
}

/// Backups need a VolumeSnapshotClass of the EBS driver; the one shipped is that driver's
/// default, so a QuestDBBackup names none.
#[test]
fn the_snapshot_class_takes_ebs_snapshots_by_default() {
    let class: Value = yaml_file("deploy/aws/volumesnapshotclass.yaml");
    assert_eq!(class["apiVersion"], "snapshot.storage.k8s.io/v1");
    assert_eq!(class["driver"], "ebs.csi.aws.com");
    assert_eq!(
        class["metadata"]["annotations"]["snapshot.storage.kubernetes.io/is-default-class"],
        "true"
    );
}

/// The image ships what was reviewed: every base image of the Dockerfile is pinned by digest,
/// so a rebuild cannot pull other bytes under the same tag.
#[test]
fn every_base_image_of_the_container_build_is_pinned_by_digest() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).expect("Dockerfile");
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "{froms:?}");
    for from in froms {
        let image = from.split_whitespace().nth(1).unwrap_or_default();
        let digest = image
            .split_once("@sha256:")
            .map(|(_, d)| d)
            .unwrap_or_default();
        assert!(
            digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
            "not pinned by digest: {from}"
        );
    }
}

/// The fenced block of the documentation page `page` that starts with `first_line`.
fn doc_block(page: &str, first_line: &str) -> String {
    let readme = std::fs::read_to_string(repo(page)).expect(page);
    let start = readme
        .find(first_line)
        .unwrap_or_else(|| panic!("no block in {page} starting {first_line:?}"));
    let body = &readme[start..];
    body[..body.find("```").expect("the block ends")].to_string()
}

/// A `Key='a,b'` parameter override of the documented stack command, as a list.
fn stack_override(command: &str, key: &str) -> Vec<String> {
    let start = command
        .find(&format!("{key}='"))
        .unwrap_or_else(|| panic!("the stack command sets no {key}"));
    let value = &command[start + key.len() + 2..];
    value[..value.find('\'').expect("quoted")]
        .split(',')
        .map(str::to_string)
        .collect()
}

fn as_strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// One instance-type list and one image-owner rule on the EKS path: the stack's defaults, the
/// documented stack command (the IAM policy) and Helm values (the operator's allow-list) agree,
/// and the EKS example asks for a type they allow. Three lists that disagreed made the
/// operator refuse the example's type, or IAM refuse what the operator allowed.
#[test]
fn the_eks_path_names_one_instance_type_list_and_one_image_owner_rule() {
    let command = doc_block(
        "docs/operations/eks.md",
        "aws cloudformation deploy --stack-name questdb-operator",
    );
    let values: Value = serde_yaml_ng::from_str(&doc_block(
        "docs/operations/install.md",
        "# eks-values.yaml",
    ))
    .unwrap();
    let params = &template()["Parameters"];
    let default = |key: &str| -> Vec<String> {
        params[key]["Default"]
            .as_str()
            .expect("a default")
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let types = stack_override(&command, "AllowedInstanceTypes");
    assert_eq!(types, default("AllowedInstanceTypes"));
    assert_eq!(types, as_strings(&values["nodes"]["allowedInstanceTypes"]));
    let owners = stack_override(&command, "AllowedImageOwners");
    assert_eq!(owners, default("AllowedImageOwners"));
    assert_eq!(owners, as_strings(&values["nodes"]["allowedImageOwners"]));
    assert!(
        owners.iter().any(|o| o == "amazon"),
        "IAM's ec2:Owner names Amazon's own images by the alias: {owners:?}"
    );
    let example: Value = yaml_file("examples/eks-questdb.yaml");
    let asked = example["spec"]["node"]["instanceType"].as_str().unwrap();
    let allow = questdb_operator::cloud::LaunchAllowList {
        instance_types: types.clone(),
        ..Default::default()
    };
    assert_eq!(
        allow.refuse_instance_type(asked),
        None,
        "{asked} in {types:?}"
    );
    // One identity story: the stack's default is Pod Identity, so the values set no IRSA role.
    assert_eq!(params["Identity"]["Default"], "PodIdentity");
    assert!(
        values["serviceAccount"]["annotations"]["eks.amazonaws.com/role-arn"].is_null(),
        "an IRSA annotation beside a Pod Identity association"
    );
}

#[test]
fn the_operator_finds_the_stacks_instance_profile_and_database_group_without_values() {
    let t = template();
    let profile = t["Resources"]["NodeInstanceProfile"]["Properties"]["InstanceProfileName"]
        ["Fn::Sub"]
        .as_str()
        .expect("the stack names the instance profile");
    assert_eq!(
        profile.replace("${ClusterName}", "prod-eu"),
        questdb_operator::cloud::discovery::default_instance_profile("prod-eu"),
        "the operator's default --aws-instance-profile is the stack's profile"
    );
    let tags = t["Resources"]["DatabaseSecurityGroup"]["Properties"]["Tags"]
        .as_array()
        .expect("tags");
    assert!(
        tags.iter()
            .any(|tag| tag["Key"] == questdb_operator::cloud::TAG_CLUSTER
                && tag["Value"]["Ref"] == "ClusterName"),
        "the database group carries the tag the operator's discovery looks for: {tags:?}"
    );
}

/// These machines run no container builder, so the image is checked as far as it can be
/// without one. The harm each check prevents: an image that builds another binary or crate
/// than the one tested (or one without the AWS provider, which the sandbox builds without),
/// copies a path the build never wrote, starts something else than `questdb-operator run`, or
/// links a library its distroless base does not have (it would die at exec on the cluster).
#[test]
fn the_image_ships_the_tested_operator_binary_with_its_aws_provider_on_a_base_that_can_run_it() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).expect("Dockerfile");
    // Continuation lines joined: one instruction per line.
    let instructions: Vec<String> = dockerfile
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let build = instructions
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("the builder stage runs cargo build");
    for flag in [
        "--release",
        "--locked",
        "-p questdb-operator",
        "--bin questdb-operator",
    ] {
        assert!(
            build.contains(flag),
            "the image's build lacks {flag}: {build}"
        );
    }
    assert!(
        !build.contains("--no-default-features") && !build.contains("--features"),
        "the image builds the default features, which are the shipped ones: {build}"
    );
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(repo("Cargo.toml")).unwrap()).expect("Cargo.toml");
    let default: Vec<&str> = manifest["features"]["default"]
        .as_array()
        .expect("default features")
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert_eq!(
        default,
        ["aws"],
        "the shipped binary has the AWS provider and neither the memory cloud nor the test fixtures"
    );
    let bins: Vec<&str> = manifest["bin"]
        .as_array()
        .expect("[[bin]]")
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert!(bins.contains(&"questdb-operator"), "{bins:?}");
    // The binary the build writes is the one copied out, into the final stage, and started.
    let out = build
        .split("install ")
        .nth(1)
        .expect("the build copies the binary out of the cache mount");
    let parts: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        parts[parts.len() - 2],
        "target/release/questdb-operator",
        "{build}"
    );
    let written = parts[parts.len() - 1];
    let copy = instructions
        .iter()
        .find(|l| l.starts_with("COPY --from=builder"))
        .expect("the final stage copies from the builder");
    let copy: Vec<&str> = copy.split_whitespace().collect();
    assert_eq!(
        copy[2], written,
        "the final stage copies what the build wrote"
    );
    let entrypoint = instructions
        .iter()
        .find(|l| l.starts_with("ENTRYPOINT"))
        .expect("ENTRYPOINT");
    assert_eq!(
        entrypoint,
        &format!("ENTRYPOINT [\"{}\"]", copy[3]),
        "exec form, the copied binary: no shell in distroless"
    );
    assert!(instructions.iter().any(|l| l == "CMD [\"run\"]"));
    let user = instructions
        .iter()
        .find(|l| l.starts_with("USER"))
        .expect("USER");
    assert_eq!(user, "USER 65532:65532", "numeric, for runAsNonRoot");
    // Builder and base from one Debian release: the binary's glibc symbols are the base's.
    let froms: Vec<&String> = instructions
        .iter()
        .filter(|l| l.starts_with("FROM"))
        .collect();
    assert!(froms[0].contains("-bookworm@"), "{}", froms[0]);
    assert!(froms[1].contains("distroless/cc-debian12"), "{}", froms[1]);
    // The binary links only what distroless/cc has (glibc, libgcc_s): OpenSSL or another
    // library would be missing at exec. Read from the same crate's binary the tests run.
    let elf = std::process::Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_questdb-operator")])
        .output()
        .expect("readelf (binutils) reads the binary's dynamic section");
    let needed: Vec<String> = String::from_utf8_lossy(&elf.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect();
    assert!(!needed.is_empty(), "a dynamically linked binary");
    for lib in &needed {
        assert!(
            [
                "libc.so.6",
                "libm.so.6",
                "libgcc_s.so.1",
                "libpthread.so.0",
                "libdl.so.2",
                "librt.so.1"
            ]
            .contains(&lib.as_str())
                || lib.starts_with("ld-linux"),
            "{lib} is not in distroless/cc: {needed:?}"
        );
    }
    // And it starts: the image's `run`, and the helm test's `preflight`.
    for sub in ["run", "preflight"] {
        let help = std::process::Command::new(env!("CARGO_BIN_EXE_questdb-operator"))
            .args([sub, "--help"])
            .output()
            .expect("the binary runs");
        assert!(help.status.success(), "{sub} --help: {help:?}");
    }
    let ignore = std::fs::read_to_string(repo(".dockerignore")).expect(".dockerignore");
    for kept_out in ["target/", ".venv/", ".git/"] {
        assert!(
            ignore.lines().any(|l| l.trim() == kept_out),
            "{kept_out} stays out of the build context"
        );
    }
}
