//! Names of a QuestDB's children, derived from the QuestDB's name alone.
//!
//! Deterministic names are what make adoption possible: a new `QuestDB` with an old name finds
//! the retained PVC (and any hand-made child) exactly where the builders expect it.

use kube::ResourceExt;

use crate::api::QuestDB;

/// `<name>`: the NetworkPolicy guarding the database ports.
pub fn network_policy(qdb: &QuestDB) -> String {
    qdb.name_any()
}

/// `<name>`: the PodDisruptionBudget of a dedicated database.
pub fn pod_disruption_budget(qdb: &QuestDB) -> String {
    qdb.name_any()
}

/// The StatefulSet runs the database pod.
pub fn statefulset(qdb: &QuestDB) -> String {
    qdb.name_any()
}

/// The ClusterIP Service clients connect to.
pub fn client_service(qdb: &QuestDB) -> String {
    qdb.name_any()
}

/// The headless Service that gives the pod its stable DNS name (the StatefulSet's `serviceName`).
pub fn headless_service(qdb: &QuestDB) -> String {
    format!("{}-headless", qdb.name_any())
}

/// The ConfigMap holding `server.conf` and `log.conf`.
pub fn config_map(qdb: &QuestDB) -> String {
    format!("{}-config", qdb.name_any())
}

/// The ConfigMap holding the ILP `auth.txt` (public keys only).
pub fn ilp_auth_config_map(qdb: &QuestDB) -> String {
    format!("{}-ilp-auth", qdb.name_any())
}

/// The Secret with the database's generated credentials (pgwire and HTTP users).
pub fn credentials_secret(qdb: &QuestDB) -> String {
    format!("{}-credentials", qdb.name_any())
}

/// The Secret with the `server.conf` the database reads: the rendered settings and the pgwire
/// users (`desired::credentials::server_conf_secret`).
pub fn server_conf_secret(qdb: &QuestDB) -> String {
    format!("{}-server-conf", qdb.name_any())
}

/// The PVC with the whole QuestDB root directory. The operator creates it itself (no
/// volumeClaimTemplate) so it alone decides whether the data outlives the QuestDB.
pub fn pvc(qdb: &QuestDB) -> String {
    format!("{}-data", qdb.name_any())
}

/// The QuestDB a claim named by [`pvc`] belongs to.
pub fn questdb_of_pvc(claim: &str) -> Option<&str> {
    claim.strip_suffix("-data").filter(|n| !n.is_empty())
}

/// The database pod: the StatefulSet's only ordinal.
pub fn pod(qdb: &QuestDB) -> String {
    format!("{}-0", statefulset(qdb))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;

    #[test]
    fn children_are_named_after_the_questdb() {
        let qdb = questdb("db1", "tenant-a");
        assert_eq!(statefulset(&qdb), "db1");
        assert_eq!(client_service(&qdb), "db1");
        assert_eq!(headless_service(&qdb), "db1-headless");
        assert_eq!(config_map(&qdb), "db1-config");
        assert_eq!(ilp_auth_config_map(&qdb), "db1-ilp-auth");
        assert_eq!(pvc(&qdb), "db1-data");
        assert_eq!(credentials_secret(&qdb), "db1-credentials");
        assert_eq!(pod(&qdb), "db1-0");
    }

    #[test]
    fn names_do_not_depend_on_the_namespace() {
        let a = questdb("db1", "tenant-a");
        let b = questdb("db1", "tenant-b");
        assert_eq!(pvc(&a), pvc(&b));
        assert_ne!(pvc(&a), pvc(&questdb("db2", "tenant-a")));
    }
}
