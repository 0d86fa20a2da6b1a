//! Names the operator stamps on cloud resources: tags, the idempotency token, the providerID.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

pub const TAG_CLUSTER: &str = "questdb.io/cluster";
pub const TAG_NAMESPACE: &str = "questdb.io/namespace";
pub const TAG_NAME: &str = "questdb.io/name";
pub const TAG_UID: &str = "questdb.io/uid";
/// The uid of the cluster's `kube-system` namespace: with [`TAG_CLUSTER`], what makes an
/// instance this cluster's for the orphan sweep (a cluster name can be reused, this uid not).
pub const TAG_CLUSTER_ID: &str = "questdb.io/cluster-id";
pub const TAG_NODE_GENERATION: &str = "questdb.io/node-generation";
pub const TAG_NAME_AWS: &str = "Name";

/// EC2 rejects tag values longer than this.
const MAX_TAG_VALUE: usize = 256;

/// Tags of the instance for generation `node_generation` of one QuestDB. The uid (not the
/// name) identifies the database: a QuestDB deleted and re-created under the same name must
/// never adopt the old one's instance.
pub fn desired_instance_tags(
    cluster: &str,
    qdb_namespace: &str,
    qdb_name: &str,
    uid: &str,
    node_generation: i64,
) -> BTreeMap<String, String> {
    let mut display = format!("questdb-{qdb_namespace}-{qdb_name}-g{node_generation}");
    truncate_ascii(&mut display, MAX_TAG_VALUE);
    BTreeMap::from([
        (TAG_CLUSTER.to_string(), cluster.to_string()),
        (TAG_NAMESPACE.to_string(), qdb_namespace.to_string()),
        (TAG_NAME.to_string(), qdb_name.to_string()),
        (TAG_UID.to_string(), uid.to_string()),
        (TAG_NODE_GENERATION.to_string(), node_generation.to_string()),
        (TAG_NAME_AWS.to_string(), display),
        // EKS: a self-managed node's instance carries its cluster's ownership tag (the cloud
        // provider and the load balancer controller find the cluster's nodes by it).
        (
            format!("kubernetes.io/cluster/{cluster}"),
            "owned".to_string(),
        ),
    ])
}

/// Why a key cannot be one of `--node-tags`: the operator's own keys (what identifies an
/// instance as a database's, and what IAM confines Stop/Terminate with), the cluster ownership
/// tag, `Name`, and AWS's reserved prefix.
pub fn reserved_tag_key(key: &str) -> Option<&'static str> {
    if key.starts_with("questdb.io/") {
        Some("questdb.io/ keys identify the operator's instances")
    } else if key.starts_with("kubernetes.io/cluster/") {
        Some("the cluster ownership tag is the operator's")
    } else if key == TAG_NAME_AWS {
        Some("Name is set by the operator")
    } else if key.to_ascii_lowercase().starts_with("aws:") {
        Some("aws: is reserved by AWS")
    } else {
        None
    }
}

/// `--node-tags` (`key=value,key=value`): checked at start-up, so a typo stops the operator
/// instead of every launch.
pub fn parse_node_tags(items: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("--node-tags: {item:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() || k.len() > 128 || v.len() > MAX_TAG_VALUE {
            return Err(format!(
                "--node-tags: {k:?}: EC2 tag keys are 1 to 128 characters, values at most {MAX_TAG_VALUE}"
            ));
        }
        if let Some(why) = reserved_tag_key(k) {
            return Err(format!("--node-tags: {k:?} cannot be set: {why}"));
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("--node-tags: {k:?} is given twice"));
        }
    }
    // EC2 allows 50 tags per resource; the operator's own take 8.
    if out.len() > 40 {
        return Err(format!("--node-tags: {} tags; at most 40 (EC2 allows 50 per resource, the operator sets up to 8)", out.len()));
    }
    Ok(out)
}

/// The tags that identify "the instance of this uid and generation" when looking it up.
pub fn identity_tags(cluster: &str, uid: &str, node_generation: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TAG_CLUSTER.to_string(), cluster.to_string()),
        (TAG_UID.to_string(), uid.to_string()),
        (TAG_NODE_GENERATION.to_string(), node_generation.to_string()),
    ])
}

fn truncate_ascii(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// EC2 `ClientToken` for the launch of generation `node_generation` of the QuestDB `uid`.
///
/// Deterministic so that a launch retried after a crash (before `status.instanceID` was
/// written) gets the already-launched instance back instead of a second one. Hashed because
/// EC2 allows at most 64 ASCII characters and the uid is user-visible input of any length.
pub fn client_token(uid: &str, node_generation: i64) -> String {
    token_of(&format!("{uid}/{node_generation}"))
}

/// The ClientToken of a launch with a fallback instance type: EC2 refuses a token reused with
/// other parameters (`IdempotentParameterMismatch`), so each type has its own.
pub fn fallback_client_token(uid: &str, node_generation: i64, instance_type: &str) -> String {
    token_of(&format!("{uid}/{node_generation}/{instance_type}"))
}

fn token_of(seed: &str) -> String {
    let digest = Sha256::digest(seed.as_bytes());
    let hex = hex::encode(digest);
    format!("qdb-{}", &hex[..56])
}

/// `providerID` the kubelet / cloud controller puts on the Node of an EC2 instance.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// A parsed `aws:///<zone>/<instance-id>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderId {
    pub zone: String,
    pub instance_id: String,
}

/// Parse a Node's `spec.providerID`; `None` for anything that is not an EC2 instance.
pub fn parse_provider_id(provider_id: &str) -> Option<ProviderId> {
    let rest = provider_id.strip_prefix("aws:///")?;
    let (zone, instance_id) = rest.split_once('/')?;
    let valid_id = instance_id
        .strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()));
    if zone.is_empty() || !valid_id {
        return None;
    }
    Some(ProviderId {
        zone: zone.to_string(),
        instance_id: instance_id.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_tags_never_replace_the_operators_own() {
        let ok =
            parse_node_tags(&["team=data".into(), " cost-center = 42 ".into(), "".into()]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok["cost-center"], "42");
        for bad in [
            "questdb.io/uid=x",
            "kubernetes.io/cluster/other=owned",
            "Name=mine",
            "AWS:foo=1",
            "novalue",
            "=v",
        ] {
            assert!(parse_node_tags(&[bad.into()]).is_err(), "{bad} accepted");
        }
        assert!(parse_node_tags(&["a=1".into(), "a=2".into()]).is_err());
        let many: Vec<String> = (0..41).map(|i| format!("k{i}=v")).collect();
        assert!(parse_node_tags(&many).is_err());
    }

    #[test]
    fn instance_tags_name_cluster_database_uid_and_generation() {
        let tags = desired_instance_tags("prod", "team-a", "db1", "uid-1", 3);
        assert_eq!(tags[TAG_CLUSTER], "prod");
        assert_eq!(tags[TAG_NAMESPACE], "team-a");
        assert_eq!(tags[TAG_NAME], "db1");
        assert_eq!(tags[TAG_UID], "uid-1");
        assert_eq!(tags[TAG_NODE_GENERATION], "3");
        assert_eq!(tags[TAG_NAME_AWS], "questdb-team-a-db1-g3");
        let identity = identity_tags("prod", "uid-1", 3);
        assert!(identity.iter().all(|(k, v)| tags.get(k) == Some(v)));
    }

    #[test]
    fn name_tag_fits_ec2_limit_for_long_names() {
        let long = "x".repeat(253);
        let tags = desired_instance_tags("c", &"n".repeat(63), &long, "u", 1);
        assert!(tags[TAG_NAME_AWS].len() <= MAX_TAG_VALUE);
    }

    #[test]
    fn client_token_is_deterministic_short_ascii_and_per_generation() {
        let uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
        let t = client_token(uid, 1);
        assert_eq!(t, client_token(uid, 1));
        assert!(t.len() <= 64 && t.is_ascii(), "{t}");
        assert_ne!(t, client_token(uid, 2));
        assert_ne!(t, client_token("another-uid", 1));
        let huge = "u".repeat(10_000);
        assert!(client_token(&huge, i64::MAX).len() <= 64);
        let fallback = fallback_client_token(uid, 1, "m6a.large");
        assert_ne!(fallback, t);
        assert_ne!(fallback, fallback_client_token(uid, 1, "m5.large"));
        assert!(fallback_client_token(&huge, 1, &huge).len() <= 64);
    }

    #[test]
    fn provider_id_round_trips() {
        let p = provider_id("us-east-1a", "i-0123456789abcdef0");
        assert_eq!(p, "aws:///us-east-1a/i-0123456789abcdef0");
        assert_eq!(
            parse_provider_id(&p),
            Some(ProviderId {
                zone: "us-east-1a".into(),
                instance_id: "i-0123456789abcdef0".into()
            })
        );
    }

    #[test]
    fn foreign_or_malformed_provider_ids_are_rejected() {
        for bad in [
            "",
            "gce://project/zone/name",
            "aws:///us-east-1a/",
            "aws:////i-0123",
            "aws:///us-east-1a/vol-0123",
            "aws:///us-east-1a/i-xyz",
            "kind://docker/kind/kind-worker",
        ] {
            assert_eq!(parse_provider_id(bad), None, "{bad}");
        }
    }
}
