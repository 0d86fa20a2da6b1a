//! The PodDisruptionBudget of a database with a dedicated node: the answer to `kubectl drain`
//! (and to the AWS Node Termination Handler, which drains). An evicted database pod would come
//! back pinned to the same cordoned node and stay Pending for good, so the eviction is refused
//! instead: the drain waits and says why, while the operator answers the cordon with a move to
//! a new node (`plan::node_move`), after which the old node holds nothing and the drain ends.
//! A database that is not Ready is not evicted either (`unhealthyPodEvictionPolicy:
//! IfHealthyBudget`, the budget never healthy with its one pod down): evicted, its pod would
//! come back Pending on the cordoned node, a database starting (replaying its WAL) turned into
//! an outage until someone uncordons.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{child_meta, selector_labels};
use super::names;
use crate::api::QuestDB;

/// `Some` for a database with a dedicated node (`spec.node`); `None` otherwise, and a budget
/// made earlier goes.
pub fn pod_disruption_budget(qdb: &QuestDB) -> Option<PodDisruptionBudget> {
    qdb.spec.node.as_ref()?;
    Some(PodDisruptionBudget {
        metadata: child_meta(qdb, names::pod_disruption_budget(qdb)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(0)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(qdb)),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("IfHealthyBudget".to_string()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;

    #[test]
    fn a_dedicated_database_refuses_voluntary_eviction_of_its_pod_ready_or_not() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.node = None;
        assert!(
            pod_disruption_budget(&qdb).is_none(),
            "shared nodes drain freely"
        );
        qdb.spec.node = Some(Default::default());
        let pdb = pod_disruption_budget(&qdb).expect("dedicated");
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(0)));
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("IfHealthyBudget")
        );
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(selector_labels(&qdb))
        );
    }
}
