//! The IAM policy shipped in `deploy/aws/` against the AWS calls the code makes: a call added
//! without its permission fails here, not with AccessDenied in a customer's account; a
//! permission the code no longer needs is least privilege lost.

use std::collections::BTreeSet;
use std::path::Path;

/// `run_instances` → `RunInstances`.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Every SDK operation a client module calls (`.client\n .run_instances()`), as IAM actions.
fn operations_called(file: &str, service: &str) -> BTreeSet<String> {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let mut out = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find(".client") {
        rest = &rest[i + ".client".len()..];
        let call = rest.trim_start();
        if let Some(call) = call.strip_prefix('.') {
            let name: String = call
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if call[name.len()..].starts_with("()") {
                out.insert(format!("{service}:{}", pascal(&name)));
            }
        }
    }
    out
}

fn policy_actions() -> BTreeSet<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/iam-policy.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = BTreeSet::new();
    for st in doc["Statement"].as_array().unwrap() {
        assert_eq!(st["Effect"], "Allow");
        match &st["Action"] {
            serde_json::Value::String(a) => {
                out.insert(a.clone());
            }
            serde_json::Value::Array(a) => {
                out.extend(a.iter().map(|v| v.as_str().unwrap().to_string()));
            }
            other => panic!("Action {other}"),
        }
        let action = st["Action"].to_string();
        assert!(!action.contains('*'), "no wildcard actions: {action}");
    }
    out
}

#[test]
fn the_shipped_iam_policy_grants_exactly_the_calls_the_operator_makes() {
    let mut called = operations_called("src/cloud/aws/ec2.rs", "ec2");
    called.extend(operations_called("src/cloud/aws/route53.rs", "route53"));
    called.extend(operations_called("src/cloud/aws/eks.rs", "eks"));
    assert!(called.contains("eks:DescribeCluster"), "{called:?}");
    assert!(called.contains("ec2:RunInstances"), "{called:?}");
    // Implied by RunInstances' arguments: tags at launch, and the node's instance profile.
    called.insert("ec2:CreateTags".into());
    called.insert("iam:PassRole".into());
    assert_eq!(policy_actions(), called);
}

#[test]
fn stop_and_terminate_are_confined_to_this_clusters_database_instances() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/iam-policy.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let terminate = doc["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["Action"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "ec2:TerminateInstances"))
        })
        .unwrap();
    assert_eq!(
        terminate["Condition"]["StringEquals"]["aws:ResourceTag/questdb.io/cluster"],
        "REPLACE_CLUSTER_NAME"
    );
    // Only instances that carry a QuestDB's uid: the operator's own check then compares it
    // with the QuestDB whose record names the instance (IAM cannot).
    assert_eq!(
        terminate["Condition"]["Null"]["aws:ResourceTag/questdb.io/uid"],
        "false"
    );
    let actions = terminate["Action"].as_array().unwrap();
    assert!(
        actions.iter().any(|a| a == "ec2:StopInstances"),
        "{actions:?}"
    );
}

/// The allow-list is enforced twice: by the operator before every launch, and by IAM, so a
/// bug in the first (or a stolen operator token) still launches only allowed images and types.
#[test]
fn launches_are_confined_to_allowed_images_and_instance_types() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/iam-policy.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let statements = doc["Statement"].as_array().unwrap();
    let launching = |resource: &str| {
        statements
            .iter()
            .filter(|s| s["Action"] == "ec2:RunInstances")
            .find(|s| {
                let r = &s["Resource"];
                r.as_str().is_some_and(|r| r.contains(resource))
                    || r.as_array()
                        .is_some_and(|a| a.iter().any(|v| v.as_str().unwrap().contains(resource)))
            })
            .unwrap_or_else(|| panic!("a RunInstances statement for {resource}"))
            .clone()
    };
    let image = launching(":image/");
    assert_eq!(
        image["Condition"]["StringEquals"]["ec2:Owner"][0],
        "REPLACE_ALLOWED_IMAGE_OWNERS"
    );
    let instance = launching(":instance/");
    assert_eq!(
        instance["Condition"]["StringLike"]["ec2:InstanceType"][0],
        "REPLACE_ALLOWED_INSTANCE_TYPES"
    );
    assert_eq!(
        instance["Condition"]["StringEquals"]["aws:RequestTag/questdb.io/cluster"],
        "REPLACE_CLUSTER_NAME"
    );
    // No statement grants RunInstances on images or instances without those conditions.
    for s in statements
        .iter()
        .filter(|s| s["Action"] == "ec2:RunInstances")
    {
        let r = s["Resource"].to_string();
        if r.contains(":image/") {
            assert!(
                s["Condition"]["StringEquals"]["ec2:Owner"].is_array(),
                "{s}"
            );
        }
        if r.contains(":instance/") {
            assert!(
                s["Condition"]["StringLike"]["ec2:InstanceType"].is_array(),
                "{s}"
            );
        }
    }
}

fn statements() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/iam-policy.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["Statement"].as_array().unwrap().clone()
}

/// A leaked operator credential launches, stops or describes nothing outside the cluster's
/// own region and account.
#[test]
fn every_ec2_permission_is_confined_to_the_clusters_region_and_account() {
    for s in statements() {
        let resources: Vec<String> = match &s["Resource"] {
            serde_json::Value::String(r) => vec![r.clone()],
            serde_json::Value::Array(a) => a.iter().map(|v| v.as_str().unwrap().into()).collect(),
            other => panic!("Resource {other}"),
        };
        let ec2 = s["Action"].to_string().contains("ec2:");
        for r in resources.iter().filter(|_| ec2) {
            if r == "*" {
                assert_eq!(
                    s["Condition"]["StringEquals"]["aws:RequestedRegion"], "REPLACE_REGION",
                    "{s}"
                );
                continue;
            }
            let parts: Vec<&str> = r.split(':').collect();
            assert_eq!(parts[3], "REPLACE_REGION", "{r}");
            // Public images belong to their owner's account; the owner condition confines them.
            if !r.contains(":image/") {
                assert_eq!(parts[4], "REPLACE_ACCOUNT_ID", "{r}");
            }
        }
    }
}

/// The operator launches with IMDSv2 only and one hop, so the database pod cannot read the
/// node role's credentials; IAM refuses a launch that would not (a bug, or a stolen token).
#[test]
fn launches_without_imdsv2_and_one_hop_are_refused() {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cloud/aws/ec2.rs"))
            .unwrap();
    assert!(src.contains(".http_tokens(HttpTokensState::Required)"));
    assert!(src.contains(".http_put_response_hop_limit(1)"));
    let instance = statements()
        .into_iter()
        .find(|s| {
            s["Action"] == "ec2:RunInstances" && s["Resource"].to_string().contains(":instance/")
        })
        .unwrap();
    let c = &instance["Condition"];
    assert_eq!(c["StringEquals"]["ec2:MetadataHttpTokens"], "required");
    assert_eq!(
        c["NumericLessThanEquals"]["ec2:MetadataHttpPutResponseHopLimit"],
        "1"
    );
    // Every instance launched carries the QuestDB uid that Stop/Terminate later require.
    assert_eq!(c["Null"]["aws:RequestTag/questdb.io/uid"], "false");
}

/// The operator writes an A record and its TXT ownership marker; IAM lets it change nothing
/// else in the zone (MX, NS, a record of another application).
#[test]
fn dns_changes_are_confined_to_a_and_txt_records_of_the_database_names() {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cloud/dns.rs"))
            .unwrap();
    let kinds: Vec<&str> = src
        .match_indices("kind: \"")
        .map(|(i, m)| {
            let rest = &src[i + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(kinds, ["A", "TXT"], "record types the code writes");
    let change = statements()
        .into_iter()
        .find(|s| s["Action"] == "route53:ChangeResourceRecordSets")
        .expect("ChangeResourceRecordSets in a statement of its own");
    let c = &change["Condition"];
    assert_eq!(
        c["ForAllValues:StringEquals"]["route53:ChangeResourceRecordSetsRecordTypes"],
        serde_json::json!(kinds)
    );
    assert_eq!(
        c["ForAllValues:StringLike"]["route53:ChangeResourceRecordSetsNormalizedRecordNames"],
        serde_json::json!(["REPLACE_RECORD_NAMES"])
    );
}
