//! Every child a QuestDB's database runs on, built in one call: what the reconcile applies, in
//! the order it applies them (the StatefulSet last, so it mounts files that already exist).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::QuestDB;

use super::{
    client_service, config_hash, config_map, headless_service, ilp_auth_config_map, network_policy,
    pod_disruption_budget, statefulset, DedicatedNode,
};

/// The desired children of one QuestDB (the PVC apart: it is applied first, before the node).
#[derive(Clone, Debug)]
pub struct Children {
    pub config: ConfigMap,
    /// `None`: ILP auth is off, and an auth file made earlier goes.
    pub ilp_auth: Option<ConfigMap>,
    /// `None`: switched off, and a policy made earlier goes.
    pub network_policy: Option<NetworkPolicy>,
    /// `None`: no dedicated node, and a budget made earlier goes.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    pub headless_service: Service,
    pub client_service: Service,
    /// Its pod template carries the hash of every mounted ConfigMap above, less the settings
    /// QuestDB reloads in place.
    pub statefulset: StatefulSet,
}

impl Children {
    /// The rendered `server.conf` (the config ConfigMap's), which the server.conf Secret also
    /// carries, followed by the pgwire users.
    pub fn server_conf(&self) -> &str {
        self.config
            .data
            .as_ref()
            .and_then(|d| d.get(super::SERVER_CONF_KEY))
            .map_or("", String::as_str)
    }
}

/// `ilp_auth_file`: the rendered auth file, when ILP auth is on and has keys.
/// `credentials`: the credentials Secret as last read, once it is.
/// `node`: the dedicated node the pod is pinned to, if any.
pub fn children(
    qdb: &QuestDB,
    ilp_auth_file: Option<&str>,
    credentials: Option<super::credentials::Seen>,
    node: Option<&DedicatedNode>,
) -> Children {
    let ilp_enabled = qdb.spec.ilp_auth.enabled;
    let config = config_map(qdb, ilp_enabled);
    let ilp_auth = ilp_auth_file.map(|txt| ilp_auth_config_map(qdb, txt));
    // The settings QuestDB reloads in place are not in the hash: changing only those reloads
    // the running database instead of restarting it (`super::reload`).
    let mut restart_config = config.clone();
    if let Some(text) = restart_config
        .data
        .as_mut()
        .and_then(|d| d.get_mut(super::SERVER_CONF_KEY))
    {
        *text = super::reload::restart_view(text, qdb);
    }
    let mounted: Vec<&ConfigMap> = std::iter::once(&restart_config)
        .chain(ilp_auth.as_ref())
        .collect();
    let hash = config_hash(&mounted);
    Children {
        statefulset: statefulset(qdb, &hash, credentials, ilp_enabled, node),
        network_policy: network_policy(qdb),
        pod_disruption_budget: pod_disruption_budget(qdb),
        headless_service: headless_service(qdb),
        client_service: client_service(qdb),
        config,
        ilp_auth,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{credentials, testing, CONFIG_HASH_ANNOTATION};

    fn template_hash(c: &Children) -> String {
        c.statefulset
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("the pod template carries the config hash")
    }

    #[test]
    fn a_reloadable_setting_leaves_the_pod_template_alone_and_any_other_setting_restarts() {
        let mut qdb = testing::questdb("db", "ns");
        qdb.spec
            .config
            .server
            .insert("pg.net.connection.limit".into(), "20".into());
        let one = children(&qdb, None, None, None);
        let mut reloadable = qdb.clone();
        reloadable
            .spec
            .config
            .server
            .insert("pg.net.connection.limit".into(), "30".into());
        let two = children(&reloadable, None, None, None);
        assert_ne!(one.config, two.config, "the mounted file changes");
        assert_eq!(
            one.statefulset.spec.as_ref().map(|s| &s.template),
            two.statefulset.spec.as_ref().map(|s| &s.template),
            "the pod is not restarted for it"
        );
        let mut other = qdb.clone();
        other
            .spec
            .config
            .server
            .insert("cairo.wal.enabled.default".into(), "false".into());
        assert_ne!(
            template_hash(&one),
            template_hash(&children(&other, None, None, None))
        );
    }

    #[test]
    fn a_changed_auth_file_restarts_the_pod_through_the_template_hash() {
        let mut qdb = testing::questdb("db", "ns");
        qdb.spec.ilp_auth.enabled = true;
        let one = children(&qdb, Some("a ec-p-256-sha256 x y\n"), None, None);
        let two = children(&qdb, Some("b ec-p-256-sha256 x y\n"), None, None);
        assert!(one.ilp_auth.is_some());
        assert_ne!(template_hash(&one), template_hash(&two));
        assert_eq!(
            template_hash(&one),
            template_hash(&children(&qdb, Some("a ec-p-256-sha256 x y\n"), None, None))
        );
    }

    #[test]
    fn a_changed_password_restarts_the_pod_and_an_unread_secret_does_not() {
        let qdb = testing::questdb("db", "ns");
        let digest = |c: &Children| {
            c.statefulset
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(credentials::CREDENTIALS_HASH_ANNOTATION).cloned())
        };
        let seen = |version, digest| {
            Some(credentials::Seen {
                version,
                digest,
                pg_digest: "pg",
            })
        };
        let one = children(&qdb, None, seen("1", "d1"), None);
        assert_eq!(digest(&one).as_deref(), Some("d1"));
        let two = children(&qdb, None, seen("2", "d2"), None);
        assert_eq!(digest(&two).as_deref(), Some("d2"));
        assert_eq!(digest(&children(&qdb, None, None, None)), None);
        assert_eq!(template_hash(&one), template_hash(&two));
        // A new resourceVersion with the same credentials (a label edit, an owner reference)
        // leaves the pod template alone: no restart.
        let relabelled = children(&qdb, None, seen("3", "d1"), None);
        assert_eq!(
            relabelled.statefulset.spec.as_ref().map(|s| &s.template),
            one.statefulset.spec.as_ref().map(|s| &s.template)
        );
        let annotations = relabelled
            .statefulset
            .metadata
            .annotations
            .unwrap_or_default();
        assert_eq!(
            annotations
                .get(credentials::CREDENTIALS_SEEN_ANNOTATION)
                .map(String::as_str),
            Some("3:d1:pg")
        );
    }

    #[test]
    fn no_auth_file_means_no_auth_config_map_to_keep() {
        let qdb = testing::questdb("db", "ns");
        let c = children(&qdb, None, None, None);
        assert!(c.ilp_auth.is_none());
        assert_eq!(c.statefulset.metadata.name.as_deref(), Some("db"));
    }
}
