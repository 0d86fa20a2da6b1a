//! The StatefulSet controller: ordered pod creation from the template, PVCs from
//! volumeClaimTemplates, scale down highest ordinal first, rolling updates one pod at a time
//! from the highest ordinal, and a truthful `status`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::runtime::{is_status, PassOutcome, Shared};
use super::wellknown::{REVISION_HASH_LABEL, STS_POD_INDEX_LABEL, STS_POD_NAME_LABEL};

/// The revision name of the current template, `<sts>-<hash>`, used for the pods'
/// `controller-revision-hash` label and `status.updateRevision`.
pub(crate) fn revision_name(sts: &StatefulSet) -> String {
    let template = sts.spec.as_ref().map(|s| &s.template);
    let bytes = serde_json::to_vec(&template).unwrap_or_default();
    let digest = hex::encode(Sha256::digest(&bytes));
    format!(
        "{}-{}",
        sts.metadata.name.as_deref().unwrap_or_default(),
        &digest[..10]
    )
}

pub(crate) fn pod_name(sts: &str, ordinal: i32) -> String {
    format!("{sts}-{ordinal}")
}

pub(crate) fn claim_name(template: &str, sts: &str, ordinal: i32) -> String {
    format!("{template}-{sts}-{ordinal}")
}

/// The ordinal of a pod named `<sts>-<n>`.
pub(crate) fn ordinal_of(sts: &str, pod: &str) -> Option<i32> {
    let rest = pod.strip_prefix(sts)?.strip_prefix('-')?;
    if rest.starts_with('+') || (rest.len() > 1 && rest.starts_with('0')) {
        return None;
    }
    rest.parse().ok().filter(|n: &i32| *n >= 0)
}

/// The facts about one existing pod the controller decides on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodView {
    pub ordinal: i32,
    pub revision: String,
    pub ready: bool,
    pub terminating: bool,
    pub failed: bool,
}

impl PodView {
    pub fn of(ordinal: i32, pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let ready_condition = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Self {
            ordinal,
            revision: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_HASH_LABEL).cloned())
                .unwrap_or_default(),
            ready: phase == Some("Running") && ready_condition,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            failed: phase == Some("Failed"),
        }
    }

    fn healthy(&self) -> bool {
        self.ready && !self.terminating
    }
}

/// The parts of a StatefulSet's spec that drive the plan.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape {
    pub replicas: i32,
    pub start: i32,
    pub parallel: bool,
    pub rolling: bool,
    pub partition: i32,
    pub update_revision: String,
}

impl Shape {
    pub fn of(sts: &StatefulSet) -> Self {
        let spec = sts.spec.clone().unwrap_or_default();
        let strategy = spec.update_strategy.unwrap_or_default();
        Self {
            replicas: spec.replicas.unwrap_or(1).max(0),
            start: spec.ordinals.and_then(|o| o.start).unwrap_or(0).max(0),
            parallel: spec.pod_management_policy.as_deref() == Some("Parallel"),
            rolling: strategy.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate",
            partition: strategy
                .rolling_update
                .and_then(|r| r.partition)
                .unwrap_or(0),
            update_revision: revision_name(sts),
        }
    }

    fn in_range(&self, ordinal: i32) -> bool {
        ordinal >= self.start && ordinal < self.start + self.replicas
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    Create(i32),
    Delete(i32),
}

/// What to do next, as the real controller would: with OrderedReady (the default) one step at a
/// time and only while every lower ordinal is Running and Ready.
pub(crate) fn plan(shape: &Shape, pods: &[PodView]) -> Vec<Step> {
    let mut steps = Vec::new();
    let find = |o: i32| pods.iter().find(|p| p.ordinal == o);
    for pod in pods.iter().filter(|p| p.failed && !p.terminating) {
        steps.push(Step::Delete(pod.ordinal));
    }
    if !steps.is_empty() && !shape.parallel {
        return steps;
    }
    for ordinal in shape.start..shape.start + shape.replicas {
        match find(ordinal) {
            None => {
                steps.push(Step::Create(ordinal));
                if !shape.parallel {
                    return steps;
                }
            }
            Some(pod) if !shape.parallel && !pod.healthy() => return steps,
            Some(_) => {}
        }
    }
    let mut condemned: Vec<&PodView> = pods.iter().filter(|p| !shape.in_range(p.ordinal)).collect();
    condemned.sort_by_key(|p| std::cmp::Reverse(p.ordinal));
    let all_in_range_healthy = pods
        .iter()
        .filter(|p| shape.in_range(p.ordinal))
        .all(PodView::healthy);
    for pod in condemned {
        if pod.terminating {
            if !shape.parallel {
                return steps;
            }
            continue;
        }
        if !shape.parallel && !all_in_range_healthy {
            return steps;
        }
        steps.push(Step::Delete(pod.ordinal));
        if !shape.parallel {
            return steps;
        }
    }
    if !steps.is_empty() || !shape.rolling {
        return steps;
    }
    let current: Vec<&PodView> = pods.iter().filter(|p| shape.in_range(p.ordinal)).collect();
    if current.len() as i32 != shape.replicas || !current.iter().all(|p| p.healthy()) {
        return steps;
    }
    let first_updated = shape.partition.max(shape.start);
    for ordinal in (first_updated..shape.start + shape.replicas).rev() {
        if find(ordinal).is_some_and(|p| p.revision != shape.update_revision) {
            steps.push(Step::Delete(ordinal));
            break;
        }
    }
    steps
}

/// The status the pods justify. `previous_current` is the old `status.currentRevision`.
pub(crate) fn compute_status(
    shape: &Shape,
    generation: Option<i64>,
    previous_current: Option<&str>,
    pods: &[PodView],
) -> StatefulSetStatus {
    let replicas = pods.len() as i32;
    let ready = pods.iter().filter(|p| p.ready).count() as i32;
    let mut current_revision = previous_current
        .filter(|r| !r.is_empty())
        .unwrap_or(&shape.update_revision)
        .to_string();
    let count_at = |rev: &str| {
        pods.iter()
            .filter(|p| !p.terminating && p.revision == rev)
            .count() as i32
    };
    let updated = count_at(&shape.update_revision);
    let mut current = count_at(&current_revision);
    if shape.rolling && updated == replicas && ready == replicas && replicas == shape.replicas {
        current_revision = shape.update_revision.clone();
        current = updated;
    }
    StatefulSetStatus {
        replicas,
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        current_replicas: Some(current),
        updated_replicas: Some(updated),
        current_revision: Some(current_revision),
        update_revision: Some(shape.update_revision.clone()),
        observed_generation: generation,
        collision_count: Some(0),
        conditions: None,
    }
}

fn owner_reference(sts: &StatefulSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".to_string(),
        kind: "StatefulSet".to_string(),
        name: sts.metadata.name.clone().unwrap_or_default(),
        uid: sts.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub(crate) fn new_pod(sts: &StatefulSet, ordinal: i32, revision: &str) -> Pod {
    let set_name = sts.metadata.name.clone().unwrap_or_default();
    let spec = sts.spec.clone().unwrap_or_default();
    let name = pod_name(&set_name, ordinal);
    let template_meta = spec.template.metadata.unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.to_string(), revision.to_string());
    labels.insert(STS_POD_NAME_LABEL.to_string(), name.clone());
    labels.insert(STS_POD_INDEX_LABEL.to_string(), ordinal.to_string());
    let mut pod_spec = spec.template.spec.unwrap_or_default();
    pod_spec.hostname = Some(name.clone());
    if !spec.service_name.as_deref().unwrap_or_default().is_empty() {
        pod_spec.subdomain = spec.service_name.clone();
    }
    let volumes = pod_spec.volumes.get_or_insert_with(Vec::new);
    for template in spec.volume_claim_templates.iter().flatten() {
        let vct = template.metadata.name.clone().unwrap_or_default();
        let volume = Volume {
            name: vct.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&vct, &set_name, ordinal),
                read_only: None,
            }),
            ..Volume::default()
        };
        match volumes.iter_mut().find(|v| v.name == vct) {
            Some(existing) => *existing = volume,
            None => volumes.push(volume),
        }
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: sts.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![owner_reference(sts)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// PVCs for one ordinal; no ownerReference, as with the default Retain retention policy.
pub(crate) fn new_claims(sts: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let set_name = sts.metadata.name.clone().unwrap_or_default();
    let spec = sts.spec.clone().unwrap_or_default();
    let selector_labels = spec.selector.match_labels.unwrap_or_default();
    spec.volume_claim_templates
        .into_iter()
        .flatten()
        .map(|template| {
            let vct = template.metadata.name.clone().unwrap_or_default();
            let mut labels = template.metadata.labels.clone().unwrap_or_default();
            labels.extend(selector_labels.clone());
            PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name(&vct, &set_name, ordinal)),
                    namespace: sts.metadata.namespace.clone(),
                    labels: Some(labels),
                    annotations: template.metadata.annotations.clone(),
                    ..ObjectMeta::default()
                },
                spec: template.spec.clone(),
                status: None,
            }
        })
        .collect()
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

fn selector_matches(sts: &StatefulSet, pod: &Pod) -> bool {
    let Some(spec) = sts.spec.as_ref() else {
        return false;
    };
    // Only matchLabels selectors adopt orphans; matchExpressions are not evaluated here.
    if spec
        .selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return false;
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    spec.selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

pub(crate) struct StatefulSetController {
    shared: Arc<Shared>,
}

impl StatefulSetController {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    async fn pass_once(&mut self) -> PassOutcome {
        let mut out = PassOutcome::default();
        let shared = self.shared.clone();
        // Index once per pass so each set only looks at its own pods (and the orphans of its
        // namespace it might adopt), not at every pod of the cluster.
        let mut by_owner: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        let mut orphans_by_ns: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in shared.stores.pods.state() {
            match controller_uid(&pod) {
                Some(uid) => by_owner.entry(uid.to_string()).or_default().push(pod),
                None => {
                    let ns = pod.metadata.namespace.clone().unwrap_or_default();
                    orphans_by_ns.entry(ns).or_default().push(pod);
                }
            }
        }
        for sts in shared.stores.statefulsets.state() {
            if sts.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ns = sts.metadata.namespace.clone().unwrap_or_default();
            let uid = sts.metadata.uid.clone().unwrap_or_default();
            let mut pods = by_owner.get(&uid).cloned().unwrap_or_default();
            pods.extend(orphans_by_ns.get(&ns).cloned().unwrap_or_default());
            self.sync(&sts, &pods, &mut out).await;
        }
        out
    }

    async fn sync(&self, sts: &StatefulSet, pods: &[Arc<Pod>], out: &mut PassOutcome) {
        let client = &self.shared.client;
        let namespace = sts.metadata.namespace.as_deref().unwrap_or("default");
        let set_name = sts.metadata.name.as_deref().unwrap_or_default();
        let uid = sts.metadata.uid.as_deref().unwrap_or_default();
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let shape = Shape::of(sts);

        let mut owned: BTreeMap<i32, &Pod> = BTreeMap::new();
        for pod in pods {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let Some(ordinal) = ordinal_of(set_name, name) else {
                continue;
            };
            match controller_uid(pod) {
                Some(owner) if owner == uid => {
                    owned.insert(ordinal, pod);
                }
                None if selector_matches(sts, pod) && pod.metadata.deletion_timestamp.is_none() => {
                    // An orphan left by `delete --cascade=orphan`: adopt it, as the real one does.
                    let patch = json!({"metadata": {
                        "resourceVersion": pod.metadata.resource_version,
                        "ownerReferences": [owner_reference(sts)],
                    }});
                    out.record(
                        "adopt orphan pod",
                        pod_api
                            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await,
                    );
                }
                _ => {}
            }
        }
        let views: Vec<PodView> = owned.iter().map(|(o, p)| PodView::of(*o, p)).collect();

        for step in plan(&shape, &views) {
            match step {
                Step::Create(ordinal) => {
                    if !self.ensure_claims(sts, ordinal, out).await {
                        continue;
                    }
                    let pod = new_pod(sts, ordinal, &shape.update_revision);
                    match pod_api.create(&PostParams::default(), &pod).await {
                        Err(err) if is_status(&err, 409) => {}
                        other => {
                            out.record("create StatefulSet pod", other);
                        }
                    }
                }
                Step::Delete(ordinal) => {
                    let Some(pod) = owned.get(&ordinal) else {
                        continue;
                    };
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: pod.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    match pod_api.delete(&pod_name(set_name, ordinal), &dp).await {
                        Err(err) if is_status(&err, 404) => {}
                        other => {
                            out.record("delete StatefulSet pod", other);
                        }
                    }
                }
            }
        }
        // Existing pods whose claims went missing get them back (the real controller does too).
        for (ordinal, pod) in &owned {
            if pod.metadata.deletion_timestamp.is_none() {
                self.ensure_claims(sts, *ordinal, out).await;
            }
        }

        let previous = sts.status.clone().unwrap_or_default();
        let status = compute_status(
            &shape,
            sts.metadata.generation,
            previous.current_revision.as_deref(),
            &views,
        );
        let unchanged = StatefulSetStatus {
            conditions: previous.conditions.clone(),
            ..status.clone()
        } == previous;
        if !unchanged {
            let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
            let patch = json!({"status": status});
            out.record(
                "update StatefulSet status",
                sts_api
                    .patch_status(set_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            );
        }
    }

    /// Creates the ordinal's missing PVCs; false when one could not be created.
    async fn ensure_claims(&self, sts: &StatefulSet, ordinal: i32, out: &mut PassOutcome) -> bool {
        let namespace = sts.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.shared.client.clone(), namespace);
        let mut ok = true;
        for claim in new_claims(sts, ordinal) {
            let name = claim.metadata.name.clone().unwrap_or_default();
            if self.shared.stores.pvc(namespace, &name).is_some() {
                continue;
            }
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => {}
                Err(err) if is_status(&err, 409) => {}
                Err(err) => {
                    out.record::<()>("create StatefulSet PVC", Err(err));
                    ok = false;
                }
            }
        }
        ok
    }
}

impl super::runtime::Reconciler for StatefulSetController {
    fn pass(&mut self) -> impl std::future::Future<Output = PassOutcome> + Send {
        self.pass_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn shape(replicas: i32) -> Shape {
        Shape {
            replicas,
            start: 0,
            parallel: false,
            rolling: true,
            partition: 0,
            update_revision: "db-new".into(),
        }
    }

    fn view(ordinal: i32, revision: &str, ready: bool) -> PodView {
        PodView {
            ordinal,
            revision: revision.into(),
            ready,
            terminating: false,
            failed: false,
        }
    }

    fn sts(image: &str) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("db".into()),
                namespace: Some("prod".into()),
                uid: Some("sts-uid".into()),
                generation: Some(3),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                service_name: Some("db-headless".into()),
                selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".into(), "db".into())])),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([("app".into(), "db".into())])),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "questdb".into(),
                            image: Some(image.into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
                volume_claim_templates: Some(vec![PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some("data".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn ordered_ready_creates_one_pod_at_a_time() {
        assert_eq!(plan(&shape(3), &[]), vec![Step::Create(0)]);
        assert_eq!(plan(&shape(3), &[view(0, "db-new", false)]), vec![]);
        assert_eq!(
            plan(&shape(3), &[view(0, "db-new", true)]),
            vec![Step::Create(1)]
        );
        let parallel = Shape {
            parallel: true,
            ..shape(3)
        };
        assert_eq!(
            plan(&parallel, &[]),
            vec![Step::Create(0), Step::Create(1), Step::Create(2)]
        );
    }

    #[test]
    fn deleted_pod_is_recreated_only_after_it_is_gone() {
        let mut terminating = view(0, "db-new", true);
        terminating.terminating = true;
        assert_eq!(plan(&shape(1), &[terminating]), vec![]);
        assert_eq!(plan(&shape(1), &[]), vec![Step::Create(0)]);
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first() {
        let pods = [
            view(0, "db-new", true),
            view(1, "db-new", true),
            view(2, "db-new", true),
        ];
        assert_eq!(plan(&shape(1), &pods), vec![Step::Delete(2)]);
    }

    #[test]
    fn rolling_update_replaces_highest_outdated_pod_when_all_are_ready() {
        let pods = [view(0, "db-old", true), view(1, "db-old", true)];
        assert_eq!(plan(&shape(2), &pods), vec![Step::Delete(1)]);
        let waiting = [view(0, "db-old", true), view(1, "db-new", false)];
        assert_eq!(plan(&shape(2), &waiting), vec![]);
        let next = [view(0, "db-old", true), view(1, "db-new", true)];
        assert_eq!(plan(&shape(2), &next), vec![Step::Delete(0)]);
        let on_delete = Shape {
            rolling: false,
            ..shape(2)
        };
        assert_eq!(plan(&on_delete, &pods), vec![]);
        let partitioned = Shape {
            partition: 1,
            ..shape(2)
        };
        assert_eq!(plan(&partitioned, &next), vec![]);
    }

    #[test]
    fn failed_pods_are_deleted_to_be_recreated() {
        let mut failed = view(0, "db-new", false);
        failed.failed = true;
        assert_eq!(plan(&shape(1), &[failed]), vec![Step::Delete(0)]);
    }

    #[test]
    fn status_reports_revisions_and_completes_rollouts() {
        let s = shape(2);
        let mid = compute_status(
            &s,
            Some(4),
            Some("db-old"),
            &[view(0, "db-old", true), view(1, "db-new", true)],
        );
        assert_eq!(mid.replicas, 2);
        assert_eq!(mid.ready_replicas, Some(2));
        assert_eq!(mid.current_replicas, Some(1));
        assert_eq!(mid.updated_replicas, Some(1));
        assert_eq!(mid.current_revision.as_deref(), Some("db-old"));
        assert_eq!(mid.update_revision.as_deref(), Some("db-new"));
        assert_eq!(mid.observed_generation, Some(4));
        let done = compute_status(
            &s,
            Some(4),
            Some("db-old"),
            &[view(0, "db-new", true), view(1, "db-new", true)],
        );
        assert_eq!(done.current_revision.as_deref(), Some("db-new"));
        assert_eq!(done.current_replicas, Some(2));
        let fresh = compute_status(&s, Some(1), None, &[]);
        assert_eq!(fresh.current_revision.as_deref(), Some("db-new"));
        assert_eq!(fresh.ready_replicas, Some(0));
    }

    #[test]
    fn pod_from_template_is_owned_labelled_and_mounts_its_claim() {
        let set = sts("questdb/questdb:9.0.0");
        let rev = revision_name(&set);
        let pod = new_pod(&set, 0, &rev);
        assert_eq!(pod.metadata.name.as_deref(), Some("db-0"));
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[REVISION_HASH_LABEL], rev);
        assert_eq!(labels[STS_POD_NAME_LABEL], "db-0");
        assert_eq!(labels["app"], "db");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("StatefulSet", "sts-uid", Some(true))
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("db-0"));
        assert_eq!(spec.subdomain.as_deref(), Some("db-headless"));
        let claim = spec.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .as_ref()
            .unwrap();
        assert_eq!(claim.claim_name, "data-db-0");
        let claims = new_claims(&set, 0);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("data-db-0"));
        assert!(claims[0].metadata.owner_references.is_none());
    }

    #[test]
    fn template_change_changes_revision() {
        let a = revision_name(&sts("questdb/questdb:9.0.0"));
        assert_eq!(a, revision_name(&sts("questdb/questdb:9.0.0")));
        assert_ne!(a, revision_name(&sts("questdb/questdb:9.0.1")));
        assert!(a.starts_with("db-"));
    }

    #[test]
    fn ordinals_parse_only_from_exact_names() {
        assert_eq!(ordinal_of("db", "db-0"), Some(0));
        assert_eq!(ordinal_of("db", "db-12"), Some(12));
        assert_eq!(ordinal_of("db", "db-x"), None);
        assert_eq!(ordinal_of("db", "dbx-1"), None);
        assert_eq!(ordinal_of("db", "db-01"), None);
        assert_eq!(ordinal_of("db", "db-other-1"), None);
    }
}
