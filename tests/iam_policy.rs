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
        "REPLACE_ALLOWED_IMAGE_OWNER"
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
