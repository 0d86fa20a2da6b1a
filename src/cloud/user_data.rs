//! The node bootstrap script (EC2 user data).
//!
//! The template comes from the operator's configuration; it must pass `{{node_labels}}` and
//! `{{node_taints}}` to the kubelet (`--node-labels`, `--register-with-taints`) so the Node is
//! born dedicated and tainted: nothing else can be scheduled there in the window before the
//! operator first sees it. [`check_template`] refuses, at start-up, a template that does not,
//! or that uses a placeholder nothing fills.

use std::collections::BTreeMap;

use super::{CloudConfig, CloudError, LaunchRequest, Taint};

/// The default bootstrap: Amazon Linux 2023 EKS AMIs join through `nodeadm`, which reads a
/// `NodeConfig` from a MIME multi-part user data part of type `application/node.eks.aws`.
/// Cluster name, API endpoint, CA bundle and service CIDR are its required fields
/// (awslabs.github.io/amazon-eks-ami/nodeadm: "the minimum required parameters"); AL2's
/// `/etc/eks/bootstrap.sh` does not exist on AL2023, and AL2 has no AMIs for Kubernetes 1.33+.
/// The kubelet flags are quoted: a taint's `key=value:Effect` must stay one YAML string.
///
/// It also sets the kernel limits QuestDB's docs ask for ([`KERNEL_LIMIT`], capacity
/// planning, "OS configuration"): the open-file limit of every container through containerd's
/// base OCI runtime spec (`spec.containerd.baseRuntimeSpec`, merged by nodeadm into the
/// default spec, whose own limit is containerd's 1,024), and `vm.max_map_count` (the kernel's
/// default is 65,530; nodeadm has no sysctl field) by a shell-script part, which cloud-init
/// runs at first boot. A dedicated node runs nothing else, so node-wide limits are the
/// database's.
pub const AL2023_NODECONFIG_TEMPLATE: &str = r#"MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: "{{cluster_name}}"
    apiServerEndpoint: "{{api_endpoint}}"
    certificateAuthority: "{{certificate_authority}}"
    cidr: "{{service_cidr}}"
  kubelet:
    flags:
      - "--node-labels={{node_labels}}"
      - "--register-with-taints={{node_taints}}"
  containerd:
    baseRuntimeSpec:
      process:
        rlimits:
          - type: RLIMIT_NOFILE
            soft: 1048576
            hard: 1048576

--//
Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash
# QuestDB maps many files: its docs ask for vm.max_map_count=1048576.
echo "vm.max_map_count = 1048576" > /etc/sysctl.d/90-questdb.conf
sysctl --load /etc/sysctl.d/90-questdb.conf

--//--
"#;

/// The open-file limit and `vm.max_map_count` QuestDB's documentation asks for (capacity
/// planning, "OS configuration": 1,048,576 for both), which the default template and the
/// Bottlerocket example set on every dedicated node.
pub(crate) const KERNEL_LIMIT: u64 = 1_048_576;

/// Whether `template` sets the kernel limits QuestDB needs ([`KERNEL_LIMIT`]), in any of the
/// bootstrap formats the operator ships: a custom template that does not is allowed (the image
/// may set them), and the operator warns at start-up.
pub(crate) fn sets_kernel_limits(template: &str) -> bool {
    let value = KERNEL_LIMIT.to_string();
    let map_count = template
        .lines()
        .any(|l| l.contains("vm.max_map_count") && l.contains(&value));
    let open_files = template.contains("RLIMIT_NOFILE") || template.contains("max-open-files");
    map_count && open_files
}

/// What a template must hand to the kubelet; without either, the Node is born undedicated or
/// untainted.
pub(crate) const REQUIRED_PLACEHOLDERS: [&str; 2] = ["node_labels", "node_taints"];

/// The same for formats that take labels and taints as TOML tables (Bottlerocket's
/// `settings.kubernetes.node-labels` and `node-taints`).
pub(crate) const REQUIRED_TOML_PLACEHOLDERS: [&str; 2] = ["node_labels_toml", "node_taints_toml"];

/// The placeholders of `template`, in order (`{{ x }}` and `{{x}}` alike).
pub(crate) fn placeholders(template: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        out.push(after[..end].trim().to_string());
        rest = &after[end + 2..];
    }
    out
}

/// Start-up check of the configured template: it must pass the dedicated labels and taints,
/// and every placeholder it uses must have a value (for the EKS cluster's endpoint, CA and
/// service CIDR: the flag that gives it is named).
pub fn check_template(config: &CloudConfig) -> Result<(), CloudError> {
    let used = placeholders(&config.user_data_template);
    let lacking_of = |required: [&'static str; 2]| -> Vec<&'static str> {
        required
            .into_iter()
            .filter(|p| !used.iter().any(|u| u == p))
            .collect()
    };
    let lacking = lacking_of(REQUIRED_PLACEHOLDERS);
    let toml_complete = lacking_of(REQUIRED_TOML_PLACEHOLDERS).is_empty();
    // Formats that take keys and values apart (Bottlerocket) write the dedicated key
    // themselves and use the bare value twice: once for the label, once for the taint.
    let bare_value_uses = used.iter().filter(|u| *u == "dedicated_value").count();
    let keyed = bare_value_uses >= 2
        && config
            .user_data_template
            .matches(crate::desired::DEDICATED_LABEL_KEY)
            .count()
            >= 2;
    if !lacking.is_empty() && !keyed && !toml_complete {
        return Err(CloudError::Config(format!(
            "the user-data template never uses {} (nor {{{{dedicated_value}}}} for both the {} label and taint): the node would join without its dedicated label or taint",
            lacking
                .iter()
                .map(|p| format!("{{{{{p}}}}}"))
                .collect::<Vec<_>>()
                .join(" and "),
            crate::desired::DEDICATED_LABEL_KEY
        )));
    }
    let sample = LaunchRequest {
        namespace: "ns".into(),
        name: "db".into(),
        uid: "uid".into(),
        node_generation: 1,
        image: "ami-0".into(),
        instance_type: "m7i.large".into(),
        zone: "zone-a".into(),
        labels: BTreeMap::from([("dedicated".to_string(), "ns.db".to_string())]),
        taints: vec![Taint::new("dedicated", Some("ns.db"), "NoSchedule")],
        public_ip: false,
        fallback_instance_types: Vec::new(),
        cluster_id: None,
    };
    let vars = bootstrap_vars(&sample, config);
    let missing: Vec<String> = used
        .iter()
        .filter(|u| !vars.contains_key(u.as_str()))
        .map(|u| match flag_for(u) {
            Some(flag) => format!("{{{{{u}}}}} (set {flag})"),
            None => format!("{{{{{u}}}}} (not a template variable)"),
        })
        .collect();
    if !missing.is_empty() {
        return Err(CloudError::Config(format!(
            "the user-data template uses placeholders without a value: {}",
            missing.join(", ")
        )));
    }
    render_user_data(&config.user_data_template, &vars).map(|_| ())
}

/// The flag that fills an optional placeholder.
fn flag_for(placeholder: &str) -> Option<&'static str> {
    match placeholder {
        "api_endpoint" => Some("--eks-api-endpoint"),
        "certificate_authority" => Some("--eks-certificate-authority"),
        "service_cidr" | "cluster_dns_ip" => Some("--eks-service-cidr"),
        _ => None,
    }
}

/// Substitute `{{var}}` (whitespace inside the braces allowed) with `vars[var]`.
///
/// A placeholder without a value is an error, not an empty string: a bootstrap script with a
/// silently blank `--register-with-taints` would create an untainted node.
pub(crate) fn render_user_data(
    template: &str,
    vars: &BTreeMap<String, String>,
) -> Result<String, CloudError> {
    let mut out = String::with_capacity(template.len());
    let mut missing = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(CloudError::Config(
                "user-data template has an unterminated `{{`".to_string(),
            ));
        };
        let key = after[..end].trim();
        match vars.get(key) {
            Some(value) => out.push_str(value),
            None => missing.push(key.to_string()),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(CloudError::Config(format!(
            "user-data template uses unknown placeholders: {}",
            missing.join(", ")
        )))
    }
}

/// `k=v,k2=v2`, the kubelet's `--node-labels` syntax.
pub(crate) fn kubelet_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `k=v:Effect,k2:Effect`, the kubelet's `--register-with-taints` syntax.
pub(crate) fn kubelet_taints(req: &LaunchRequest) -> String {
    req.taints
        .iter()
        .map(|t| match &t.value {
            Some(v) => format!("{}={}:{}", t.key, v, t.effect),
            None => format!("{}:{}", t.key, t.effect),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Labels as the lines of a TOML table (`"k" = "v"`), Bottlerocket's
/// `[settings.kubernetes.node-labels]`.
pub(crate) fn toml_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Taints as the lines of a TOML table (`"k" = ["v:Effect"]`), Bottlerocket's
/// `[settings.kubernetes.node-taints]`.
pub(crate) fn toml_taints(req: &LaunchRequest) -> String {
    req.taints
        .iter()
        .map(|t| {
            let value = format!("{}:{}", t.value.as_deref().unwrap_or_default(), t.effect);
            format!("{} = [{}]", toml_string(&t.key), toml_string(&value))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A TOML basic string. Label keys, values and taint effects are restricted to
/// `[A-Za-z0-9._/-]` by the apiserver, so escaping `"` and `\` is all that can be needed.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The cluster DNS Service's address: the tenth of the service CIDR, where EKS puts kube-dns
/// (`10.100.0.10`, `172.20.0.10`). Bottlerocket would otherwise ask EKS's DescribeCluster
/// for it, which the node role is not granted.
pub(crate) fn cluster_dns_ip(service_cidr: &str) -> Option<String> {
    let (ip, bits) = service_cidr.trim().split_once('/')?;
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    let bits: u32 = bits.parse().ok().filter(|b| *b <= 28)?;
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    Some(std::net::Ipv4Addr::from((u32::from(ip) & mask) + 10).to_string())
}

/// Everything a template may refer to. The EKS cluster's endpoint, CA and service CIDR are
/// present only when configured, so a template that needs them fails [`check_template`].
pub(crate) fn bootstrap_vars(
    req: &LaunchRequest,
    config: &CloudConfig,
) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::from([
        ("cluster_name".to_string(), config.cluster_name.clone()),
        ("region".to_string(), config.region.clone()),
        ("zone".to_string(), req.zone.clone()),
        ("namespace".to_string(), req.namespace.clone()),
        ("name".to_string(), req.name.clone()),
        ("uid".to_string(), req.uid.clone()),
        (
            "node_generation".to_string(),
            req.node_generation.to_string(),
        ),
        ("image".to_string(), req.image.clone()),
        ("instance_type".to_string(), req.instance_type.clone()),
        ("node_labels".to_string(), kubelet_labels(&req.labels)),
        ("node_taints".to_string(), kubelet_taints(req)),
        ("node_labels_toml".to_string(), toml_labels(&req.labels)),
        ("node_taints_toml".to_string(), toml_taints(req)),
        // The bare value of the dedicated label and taint, for formats that take keys and
        // values apart (Bottlerocket's TOML settings).
        (
            "dedicated_value".to_string(),
            req.labels.values().next().cloned().unwrap_or_default(),
        ),
    ]);
    let eks = &config.eks;
    for (key, value) in [
        ("api_endpoint", &eks.api_endpoint),
        ("certificate_authority", &eks.certificate_authority),
        ("service_cidr", &eks.service_cidr),
    ] {
        if let Some(v) = value {
            vars.insert(key.to_string(), v.clone());
        }
    }
    if let Some(ip) = eks.service_cidr.as_deref().and_then(cluster_dns_ip) {
        vars.insert("cluster_dns_ip".to_string(), ip);
    }
    vars
}

/// The user data for `req`: the configured template rendered with [`bootstrap_vars`].
pub(crate) fn user_data_for(
    req: &LaunchRequest,
    config: &CloudConfig,
) -> Result<String, CloudError> {
    render_user_data(&config.user_data_template, &bootstrap_vars(req, config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::Taint;

    fn request() -> LaunchRequest {
        LaunchRequest {
            namespace: "team-a".into(),
            name: "db1".into(),
            uid: "uid-1".into(),
            node_generation: 2,
            image: "ami-0123".into(),
            instance_type: "m6i.large".into(),
            zone: "us-east-1a".into(),
            labels: BTreeMap::from([
                ("questdb.io/dedicated".to_string(), "team-a.db1".to_string()),
                ("questdb.io/node".to_string(), "true".to_string()),
            ]),
            taints: vec![
                Taint::new("questdb.io/dedicated", Some("team-a.db1"), "NoSchedule"),
                Taint::new("questdb.io/bootstrapping", None, "NoExecute"),
            ],
            public_ip: false,
            fallback_instance_types: Vec::new(),
            cluster_id: None,
        }
    }

    #[test]
    fn template_carries_kubelet_labels_and_taints() {
        let mut config = CloudConfig::new("prod", "us-east-1");
        config.user_data_template = "#!/bin/bash\n/etc/eks/bootstrap.sh {{ cluster_name }} \
            --kubelet-extra-args '--node-labels={{node_labels}} --register-with-taints={{node_taints}}'\n"
            .into();
        let rendered = user_data_for(&request(), &config).unwrap();
        assert_eq!(
            rendered,
            "#!/bin/bash\n/etc/eks/bootstrap.sh prod --kubelet-extra-args \
             '--node-labels=questdb.io/dedicated=team-a.db1,questdb.io/node=true \
             --register-with-taints=questdb.io/dedicated=team-a.db1:NoSchedule,questdb.io/bootstrapping:NoExecute'\n"
        );
    }

    fn eks_config() -> CloudConfig {
        let mut config = CloudConfig::new("prod-eu", "eu-west-1");
        config.user_data_template = AL2023_NODECONFIG_TEMPLATE.into();
        config.eks = crate::cloud::EksCluster {
            api_endpoint: Some("https://ABC.gr7.eu-west-1.eks.amazonaws.com".into()),
            certificate_authority: Some("LS0tLS1CRUdJTg==".into()),
            service_cidr: Some("172.20.0.0/16".into()),
        };
        config
    }

    /// The default joins an AL2023 node: a nodeadm NodeConfig with the cluster's endpoint, CA
    /// and service CIDR, and the kubelet flags that make the node dedicated from birth.
    #[test]
    fn the_default_template_is_a_nodeadm_node_config_with_dedicated_kubelet_flags() {
        let config = eks_config();
        check_template(&config).unwrap();
        let rendered = user_data_for(&request(), &config).unwrap();
        assert!(rendered.contains("Content-Type: application/node.eks.aws"));
        let yaml = rendered
            .split("---\n")
            .nth(1)
            .and_then(|rest| rest.split("\n--//").next())
            .unwrap();
        let doc: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(doc["apiVersion"], "node.eks.aws/v1alpha1");
        assert_eq!(doc["kind"], "NodeConfig");
        let cluster = &doc["spec"]["cluster"];
        assert_eq!(cluster["name"], "prod-eu");
        assert_eq!(
            cluster["apiServerEndpoint"],
            "https://ABC.gr7.eu-west-1.eks.amazonaws.com"
        );
        assert_eq!(cluster["certificateAuthority"], "LS0tLS1CRUdJTg==");
        assert_eq!(cluster["cidr"], "172.20.0.0/16");
        let flags = doc["spec"]["kubelet"]["flags"].as_array().unwrap();
        assert_eq!(
            flags[0],
            "--node-labels=questdb.io/dedicated=team-a.db1,questdb.io/node=true"
        );
        assert_eq!(
            flags[1],
            "--register-with-taints=questdb.io/dedicated=team-a.db1:NoSchedule,questdb.io/bootstrapping:NoExecute"
        );
    }

    #[test]
    fn the_default_template_without_the_cluster_endpoint_is_refused_naming_the_flags() {
        let mut config = eks_config();
        config.eks = Default::default();
        let err = check_template(&config).unwrap_err().to_string();
        for flag in [
            "--eks-api-endpoint",
            "--eks-certificate-authority",
            "--eks-service-cidr",
        ] {
            assert!(err.contains(flag), "{err}");
        }
    }

    #[test]
    fn a_template_that_drops_the_taint_is_refused_at_start_up() {
        let mut config = eks_config();
        config.user_data_template = "#!/bin/bash\nkubelet --node-labels={{node_labels}}\n".into();
        let err = check_template(&config).unwrap_err().to_string();
        assert!(err.contains("{{node_taints}}"), "{err}");
        assert!(!err.contains("{{node_labels}}"), "{err}");
    }

    #[test]
    fn a_template_with_an_unknown_placeholder_is_refused_at_start_up() {
        let mut config = eks_config();
        config.user_data_template =
            "--node-labels={{node_labels}} --register-with-taints={{node_taints}} {{clustr}}"
                .into();
        let err = check_template(&config).unwrap_err().to_string();
        assert!(
            err.contains("{{clustr}} (not a template variable)"),
            "{err}"
        );
    }

    /// Bottlerocket reads TOML: the rendered example must parse, carry every label and taint
    /// of the request (not only the dedicated one), and name the cluster's DNS address.
    #[test]
    fn the_bottlerocket_example_renders_to_settings_bottlerocket_can_read() {
        let mut config = eks_config();
        config.user_data_template =
            include_str!("../../examples/bottlerocket-user-data.toml").into();
        check_template(&config).unwrap();
        let rendered = user_data_for(&request(), &config).unwrap();
        let doc: toml::Table = rendered
            .parse()
            .unwrap_or_else(|e| panic!("{e}\n{rendered}"));
        let k8s = &doc["settings"]["kubernetes"];
        assert_eq!(k8s["cluster-name"].as_str(), Some("prod-eu"));
        assert_eq!(k8s["cluster-dns-ip"].as_str(), Some("172.20.0.10"));
        let labels = k8s["node-labels"].as_table().unwrap();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert_eq!(labels["questdb.io/dedicated"].as_str(), Some("team-a.db1"));
        let taints = k8s["node-taints"].as_table().unwrap();
        assert_eq!(
            taints["questdb.io/dedicated"].as_array().unwrap()[0].as_str(),
            Some("team-a.db1:NoSchedule")
        );
        assert_eq!(
            taints["questdb.io/bootstrapping"].as_array().unwrap()[0].as_str(),
            Some(":NoExecute")
        );
    }

    /// Read back as a node would (the test environment's nodeadm and Bottlerocket parsers):
    /// both shipped bootstraps give the database the open files and memory maps QuestDB's
    /// docs ask for, and a template that sets neither leaves the defaults a real node has.
    #[test]
    fn both_shipped_bootstraps_give_the_database_the_kernel_limits_questdb_asks_for() {
        let mut config = eks_config();
        let expected = questdb_testenv::kubelet::KernelLimits {
            max_map_count: KERNEL_LIMIT,
            open_files: KERNEL_LIMIT,
        };
        for template in [
            AL2023_NODECONFIG_TEMPLATE,
            include_str!("../../examples/bottlerocket-user-data.toml"),
        ] {
            config.user_data_template = template.into();
            check_template(&config).unwrap();
            assert!(sets_kernel_limits(template));
            let rendered = user_data_for(&request(), &config).unwrap();
            let node =
                questdb_testenv::NodeRegistration::from_user_data("n", "z", "i-1", None, &rendered)
                    .unwrap_or_else(|e| panic!("{e:#}\n{rendered}"));
            assert_eq!(node.kernel, expected, "{rendered}");
        }
        let bare = "#!/bin/bash\nkubelet --node-labels={{node_labels}} \
                    --register-with-taints={{node_taints}}\n";
        assert!(!sets_kernel_limits(bare));
        config.user_data_template = bare.into();
        let rendered = user_data_for(&request(), &config).unwrap();
        let node =
            questdb_testenv::NodeRegistration::from_user_data("n", "z", "i-1", None, &rendered)
                .unwrap();
        assert_eq!(
            node.kernel,
            questdb_testenv::kubelet::KernelLimits::UNCONFIGURED
        );
    }

    /// A template that sets only the dedicated key by hand still passes (older Bottlerocket
    /// templates of ours did).
    #[test]
    fn a_keyed_bottlerocket_template_with_the_bare_value_still_passes() {
        let mut config = eks_config();
        config.user_data_template = format!(
            "[settings.kubernetes.node-labels]\n\"{k}\" = \"{{{{dedicated_value}}}}\"\n\
             [settings.kubernetes.node-taints]\n\"{k}\" = [\"{{{{dedicated_value}}}}:NoSchedule\"]\n",
            k = crate::desired::DEDICATED_LABEL_KEY
        );
        check_template(&config).unwrap();
    }

    #[test]
    fn the_cluster_dns_address_is_the_tenth_of_the_service_range() {
        assert_eq!(
            cluster_dns_ip("10.100.0.0/16").as_deref(),
            Some("10.100.0.10")
        );
        assert_eq!(
            cluster_dns_ip("172.20.5.0/24").as_deref(),
            Some("172.20.5.10")
        );
        assert_eq!(
            cluster_dns_ip("172.20.0.7/16").as_deref(),
            Some("172.20.0.10")
        );
        assert_eq!(cluster_dns_ip("fd00::/108"), None, "IPv6 is not supported");
        assert_eq!(
            cluster_dns_ip("10.0.0.0/30"),
            None,
            "too small for a tenth address"
        );
        assert_eq!(cluster_dns_ip("nonsense"), None);
    }

    #[test]
    fn a_template_asking_for_the_dns_address_without_a_service_range_names_the_flag() {
        let mut config = eks_config();
        config.eks.service_cidr = None;
        config.user_data_template =
            include_str!("../../examples/bottlerocket-user-data.toml").into();
        let err = check_template(&config).unwrap_err().to_string();
        assert!(
            err.contains("{{cluster_dns_ip}} (set --eks-service-cidr)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_placeholder_is_an_error_not_a_blank() {
        let err = render_user_data("x {{nope}} {{ zone }}", &BTreeMap::new()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nope") && text.contains("zone"), "{text}");
    }

    #[test]
    fn unterminated_placeholder_is_an_error() {
        assert!(render_user_data("x {{zone", &BTreeMap::new()).is_err());
    }

    #[test]
    fn text_without_placeholders_is_unchanged() {
        let t = "#!/bin/sh\necho '{ json }'\n";
        assert_eq!(render_user_data(t, &BTreeMap::new()).unwrap(), t);
    }
}
