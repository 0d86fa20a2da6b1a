//! The node bootstrap script (EC2 user data).
//!
//! The template comes from the operator's configuration; it must pass `{{node_labels}}` and
//! `{{node_taints}}` to the kubelet (`--node-labels`, `--register-with-taints`) so the Node is
//! born dedicated and tainted: nothing else can be scheduled there in the window before the
//! operator first sees it.

use std::collections::BTreeMap;

use super::{CloudConfig, CloudError, LaunchRequest};

/// Substitute `{{var}}` (whitespace inside the braces allowed) with `vars[var]`.
///
/// A placeholder without a value is an error, not an empty string: a bootstrap script with a
/// silently blank `--register-with-taints` would create an untainted node.
pub fn render_user_data(
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
pub fn kubelet_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `k=v:Effect,k2:Effect`, the kubelet's `--register-with-taints` syntax.
pub fn kubelet_taints(req: &LaunchRequest) -> String {
    req.taints
        .iter()
        .map(|t| match &t.value {
            Some(v) => format!("{}={}:{}", t.key, v, t.effect),
            None => format!("{}:{}", t.key, t.effect),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Everything a template may refer to.
pub fn bootstrap_vars(req: &LaunchRequest, config: &CloudConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
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
    ])
}

/// The user data for `req`: the configured template rendered with [`bootstrap_vars`].
pub fn user_data_for(req: &LaunchRequest, config: &CloudConfig) -> Result<String, CloudError> {
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
