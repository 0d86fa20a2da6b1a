//! How `spec.pod` reaches the database pod: the builders in [`mod@super::statefulset`] take each
//! field from it; what is here is the merge of the user's security contexts over the
//! operator's restricted defaults, and the tests of the whole path.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// `default` with every field `user` sets taken from `user`: the user's security context
/// changes what it names and keeps the operator's restricted defaults for the rest.
pub fn overlay<T: Serialize + DeserializeOwned>(default: T, user: Option<&T>) -> T {
    let Some(user) = user else {
        return default;
    };
    let (Ok(Value::Object(mut base)), Ok(Value::Object(over))) =
        (serde_json::to_value(&default), serde_json::to_value(user))
    else {
        return default;
    };
    base.extend(over);
    serde_json::from_value(Value::Object(base)).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{
        Affinity, Capabilities, EmptyDirVolumeSource, LocalObjectReference, PodAntiAffinity,
        PodSecurityContext, PodSpec, SecurityContext, Toleration, TopologySpreadConstraint, Volume,
        VolumeMount,
    };

    use crate::api::{PodOptions, QuestDB};
    use crate::desired::statefulset::{statefulset, DedicatedNode, PIN_LABEL_KEY};
    use crate::desired::testing::questdb;

    fn build(qdb: &QuestDB, dedicated: Option<&DedicatedNode>) -> StatefulSet {
        statefulset(qdb, "hash", None, true, dedicated)
    }

    fn pod(sts: &StatefulSet) -> PodSpec {
        sts.spec.clone().unwrap().template.spec.unwrap()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn everything() -> PodOptions {
        PodOptions {
            labels: map(&[("team", "payments")]),
            annotations: map(&[("sidecar.istio.io/inject", "false")]),
            stateful_set_annotations: map(&[("backup.velero.io/backup-volumes", "data")]),
            affinity: Some(Box::new(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity::default()),
                ..Default::default()
            })),
            tolerations: vec![Toleration {
                key: Some("spot".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            node_selector: map(&[("disk", "nvme")]),
            topology_spread_constraints: vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: "topology.kubernetes.io/zone".into(),
                when_unsatisfiable: "ScheduleAnyway".into(),
                ..Default::default()
            }],
            security_context: Some(Box::new(PodSecurityContext {
                supplemental_groups: Some(vec![2000]),
                ..Default::default()
            })),
            container_security_context: Some(Box::new(SecurityContext {
                read_only_root_filesystem: Some(true),
                ..Default::default()
            })),
            image_pull_secrets: vec![LocalObjectReference {
                name: "registry".into(),
            }],
            priority_class_name: Some("databases".into()),
            termination_grace_period_seconds: Some(300),
            extra_volumes: vec![Volume {
                name: "import".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }],
            extra_volume_mounts: vec![VolumeMount {
                name: "import".into(),
                mount_path: "/var/lib/questdb/import".into(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn every_pod_field_reaches_the_pod_and_removing_it_removes_it() {
        let mut qdb = questdb("db1", "ns");
        let plain = build(&qdb, None);
        qdb.spec.pod = everything();
        let sts = build(&qdb, None);
        let p = pod(&sts);
        let template = sts.spec.clone().unwrap().template.metadata.unwrap();
        assert_eq!(template.labels.unwrap()["team"], "payments");
        assert_eq!(
            template.annotations.unwrap()["sidecar.istio.io/inject"],
            "false"
        );
        assert_eq!(
            sts.metadata.annotations.clone().unwrap()["backup.velero.io/backup-volumes"],
            "data"
        );
        assert!(p.affinity.unwrap().pod_anti_affinity.is_some());
        assert_eq!(p.tolerations.unwrap()[0].key.as_deref(), Some("spot"));
        assert_eq!(p.node_selector.unwrap()["disk"], "nvme");
        assert_eq!(p.topology_spread_constraints.unwrap().len(), 1);
        assert_eq!(
            p.security_context.unwrap().supplemental_groups,
            Some(vec![2000])
        );
        assert_eq!(p.image_pull_secrets.unwrap()[0].name, "registry");
        assert_eq!(p.priority_class_name.as_deref(), Some("databases"));
        assert_eq!(p.termination_grace_period_seconds, Some(300));
        assert!(p.volumes.unwrap().iter().any(|v| v.name == "import"));
        for c in p.init_containers.unwrap().iter().chain(p.containers.iter()) {
            assert_eq!(
                c.security_context
                    .as_ref()
                    .unwrap()
                    .read_only_root_filesystem,
                Some(true),
                "{}",
                c.name
            );
        }
        assert!(p.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == "/var/lib/questdb/import"));

        // Every field taken out again: the StatefulSet the operator applies is the plain one,
        // and server-side apply removes what the operator no longer sets.
        qdb.spec.pod = PodOptions::default();
        assert_eq!(build(&qdb, None), plain);
    }

    #[test]
    fn a_users_security_context_keeps_the_restricted_defaults_it_does_not_name() {
        let mut qdb = questdb("db1", "ns");
        qdb.spec.pod.security_context = Some(Box::new(PodSecurityContext {
            run_as_user: Some(4242),
            ..Default::default()
        }));
        qdb.spec.pod.container_security_context = Some(Box::new(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_BIND_SERVICE".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        }));
        let p = pod(&build(&qdb, None));
        let s = p.security_context.unwrap();
        assert_eq!(s.run_as_user, Some(4242));
        assert_eq!(s.run_as_non_root, Some(true));
        assert_eq!(s.fs_group, Some(10001));
        assert_eq!(s.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = p.containers[0].security_context.clone().unwrap();
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(
            c.capabilities.unwrap().add,
            Some(vec!["NET_BIND_SERVICE".to_string()])
        );
    }

    #[test]
    fn on_a_dedicated_node_the_pin_and_its_toleration_always_win() {
        // What an older schema may have let in: the builder still keeps the pod on its instance.
        let mut qdb = questdb("db1", "ns");
        qdb.spec.pod = everything();
        let node = DedicatedNode {
            label_value: "ns.db1".into(),
            instance: Some("i-0abc".into()),
            host_ports: true,
        };
        let p = pod(&build(&qdb, Some(&node)));
        let selector = p.node_selector.unwrap();
        assert_eq!(
            selector.get(PIN_LABEL_KEY).map(String::as_str),
            Some("i-0abc")
        );
        assert!(!selector.contains_key("disk"), "{selector:?}");
        let tolerations = p.tolerations.unwrap();
        assert!(
            tolerations.iter().all(|t| t.key.as_deref() != Some("spot")),
            "{tolerations:?}"
        );
    }

    #[test]
    fn the_operators_labels_win_over_the_users_pod_labels() {
        let mut qdb = questdb("db1", "ns");
        qdb.spec.pod.labels = map(&[("app.kubernetes.io/instance", "someone-else")]);
        let sts = build(&qdb, None);
        let labels = sts.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/instance"], "db1");
    }
}
