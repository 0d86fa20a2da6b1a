//! Pure status computation: what the QuestDB's status must say, given what was observed.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::cached_pod::CachedPod;

use crate::api::{conditions, Phase, QuestDB, QuestDBStatus};
use crate::api::{
    CredentialsReason, IlpAuthReason, RestoreReason, VolumeSizeReason, WriteHealthReason,
};
use crate::api::{ReadyReason, SpecValidReason};
use crate::cache::compacted::CachedStatefulSet;
use crate::controllers::questdb::outcome::CloudOutcome;
use crate::desired;
use crate::plan::conditions::{merge, Verdict};
use crate::plan::node::node_is_ready;

use super::apply::Report;
use super::container_state;

/// What status is computed from ([`compute`]): what the reconcile saw in the caches and the
/// cloud, and what its applier did.
#[derive(Default)]
pub(crate) struct StatusInputs<'a> {
    pub statefulset: Option<&'a CachedStatefulSet>,
    pub pod: Option<&'a CachedPod>,
    /// No pod, and the StatefulSet controller was just refused its creation, with this message.
    pub pod_refused: Option<String>,
    /// The pod is not scheduled and its volume claim is unbound, with this message from the
    /// claim's events.
    pub volume_pending: Option<String>,
    pub node: Option<&'a Node>,
    /// Children applied, changed or blocked by this reconcile.
    pub children: Report,
    /// Spec problems found by validation; non-empty means nothing was built.
    pub invalid: Vec<String>,
    /// The ILP auth condition, decided by the auth module.
    pub ilp_auth: Option<Verdict<IlpAuthReason>>,
    /// `CredentialsReady`, decided by the credentials step.
    pub credentials: Option<Verdict<CredentialsReason>>,
    /// The Secret the credentials come from.
    pub credentials_secret: Option<String>,
    /// `VolumeSizeReady`, once the claim exists.
    pub volume_size: Option<Verdict<VolumeSizeReason>>,
    /// `VolumeRestored`, only with `spec.volume.restoreFrom`.
    pub restore: Option<Verdict<RestoreReason>>,
    /// `WriteHealthy`, from the newest poll of a Running database.
    pub write_health: Option<Verdict<WriteHealthReason>>,
    /// `BackupVerified`, from the database's backups.
    pub backup_verified: Option<Verdict<crate::api::BackupVerifiedReason>>,
    /// `CheckpointReleased`, from the same poll.
    pub checkpoint: Option<Verdict<crate::api::CheckpointReason>>,
    /// The dedicated node and DNS record, when the cloud part ran.
    pub cloud: Option<&'a CloudOutcome>,
    /// `status.config` as the reload step recorded it in this reconcile.
    pub config: Option<crate::api::ConfigStatus>,
    /// The `VersionUpgrade` condition, when a version change has something to say.
    pub version_upgrade: Option<Verdict<crate::api::VersionUpgradeReason>>,
    /// `DiskSpace` and `status.disk`, from the volume step's last look at the file system.
    pub disk_space: Option<Verdict<crate::api::DiskSpaceReason>>,
    pub disk: Option<crate::api::DiskStatus>,
}

pub(super) fn pod_ready(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The StatefulSet revision the pod was made from (its `controller-revision-hash` label).
pub(super) fn pod_revision(pod: &CachedPod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get("controller-revision-hash")
        .map(String::as_str)
}

fn node_internal_ip(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// Whether `pod` is Ready on the StatefulSet's current template (rolled out, the pod of the
/// update revision): what runs is the template's image.
pub(super) fn ready_on_template(sts: &CachedStatefulSet, pod: &CachedPod) -> bool {
    let update = sts
        .kept
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref());
    pod_ready(pod) && rolled_out(sts) && update.is_some_and(|u| pod_revision(pod) == Some(u))
}

/// Whether the pod's QuestDB container has started at least once (it may have touched the
/// data). The cache keeps a container's status only while it waits or failed: a pod with
/// none kept is taken to have run.
pub(super) fn database_ran(pod: &CachedPod) -> bool {
    let Some(c) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == desired::CONTAINER_NAME))
    else {
        return true;
    };
    let waiting_first = c.restart_count == 0
        && c.last_state.as_ref().is_none_or(|s| s.terminated.is_none())
        && c.state.as_ref().is_some_and(|s| s.waiting.is_some());
    !waiting_first
}

/// True once the StatefulSet controller has rolled the current template out (whether or not
/// the pod is Ready: a pod on a dead node is not a rollout).
fn rolled_out(sts: &CachedStatefulSet) -> bool {
    let generation = sts.generation();
    let Some(st) = sts.kept.status.as_ref() else {
        return false;
    };
    let want = sts.replicas();
    st.observed_generation >= generation
        && st.updated_replicas.unwrap_or(0) >= want
        && (st.update_revision.is_none() || st.current_revision == st.update_revision)
}

/// Whether the database is between two revisions: this reconcile changed a child that already
/// existed, or the StatefulSet has not rolled its template out over a pod that exists. A
/// database being created (children only created, no pod or the first one on its way) is not:
/// it waits for its pod, and saying so in the same words from its first status on spares a
/// write per database (at a thousand created at once, a thousand writes).
fn rolls_out(sts: &CachedStatefulSet, obs: &StatusInputs) -> bool {
    let pod_ready = obs.pod.is_some_and(pod_ready);
    let updated = obs
        .children
        .changed
        .iter()
        .any(|c| !obs.children.created(c));
    let first = !pod_ready && !updated;
    let waits_for_first_pod = first && first_revision(sts, obs.pod);
    (!obs.children.changed.is_empty() && !first) || !(rolled_out(sts) || waits_for_first_pod)
}

/// Whether the StatefulSet has only ever had one revision, and the pod (if any) is of it.
fn first_revision(sts: &CachedStatefulSet, pod: Option<&CachedPod>) -> bool {
    let status = sts.kept.status.as_ref();
    let current = status.and_then(|s| s.current_revision.as_deref());
    let update = status.and_then(|s| s.update_revision.as_deref());
    let of_pod = pod.and_then(pod_revision);
    current == update && of_pod.is_none_or(|r| Some(r) == update || update.is_none())
}

/// Computes the full status. Conditions keep their `lastTransitionTime` unless they flip, so the
/// result equals the existing status when nothing changed — the caller then skips the write.
pub(crate) fn compute(qdb: &QuestDB, obs: &StatusInputs, now: Timestamp) -> QuestDBStatus {
    let existing = qdb.status.clone().unwrap_or_default();
    let generation = qdb.metadata.generation;
    if !obs.invalid.is_empty() && built_before(&existing) {
        return on_last_good_spec(existing, obs, generation, now);
    }
    let spec = &qdb.spec;

    let (phase, ready) = readiness(&existing, spec, obs, now);

    let mut desired = vec![ready.desired(), spec_valid(obs).desired()];
    desired.extend(obs.ilp_auth.as_ref().map(Verdict::desired));
    desired.extend(obs.credentials.as_ref().map(Verdict::desired));
    desired.extend(obs.volume_size.as_ref().map(Verdict::desired));
    desired.extend(obs.restore.as_ref().map(Verdict::desired));
    desired.extend(obs.write_health.as_ref().map(Verdict::desired));
    desired.extend(obs.checkpoint.as_ref().map(Verdict::desired));
    desired.extend(obs.backup_verified.as_ref().map(Verdict::desired));
    desired.extend(obs.version_upgrade.as_ref().map(Verdict::desired));
    desired.extend(obs.disk_space.as_ref().map(Verdict::desired));
    let cloud = obs.cloud.filter(|_| obs.invalid.is_empty());
    if let Some(c) = cloud {
        desired.extend(c.node_condition.as_ref().map(Verdict::desired));
        desired.extend(c.dns_condition.as_ref().map(Verdict::desired));
        desired.extend(c.failover_condition.as_ref().map(Verdict::desired));
        desired.extend(c.node_move_condition.as_ref().map(Verdict::desired));
    }
    let phase = shown_phase(phase, &existing, spec, cloud);

    // With a dedicated node, the node fields describe it (even before the pod is scheduled).
    let dedicated = cloud.and_then(|c| c.node.as_deref());
    let node = if spec.paused {
        None
    } else {
        dedicated.or(obs.node)
    };
    let pod_node = if spec.paused {
        None
    } else {
        dedicated
            .and_then(|n| n.metadata.name.clone())
            .or_else(|| obs.pod.and_then(|p| p.node_name.clone()))
    };

    let running_image =
        crate::plan::version_upgrade::template(existing.version_upgrade.as_ref(), &spec.image)
            .image;
    QuestDBStatus {
        phase: Some(phase),
        observed_generation: generation,
        version: desired::version_of(running_image),
        // Running means the pod of the image that runs (the spec's, or the version a rollback
        // went back to) is ready on the data.
        data_version: if phase == Phase::Running {
            desired::version_of(running_image).or(existing.data_version.clone())
        } else {
            existing.data_version.clone()
        },
        node_name: pod_node,
        node_ready: node.map(node_is_ready),
        node_ip: match node {
            Some(n) => node_internal_ip(n),
            // No Node read (a namespaced install): the kubelet's address as the pod reports it.
            None if !spec.paused => obs
                .pod
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.host_ip.clone()),
            None => None,
        },
        instance_id: existing.instance_id.clone(),
        fence_stop: existing.fence_stop.clone(),
        node_image: existing.node_image.clone(),
        node_instance_type: existing.node_instance_type.clone(),
        previous_node_image: existing.previous_node_image.clone(),
        node_generation: existing.node_generation,
        dns_name: existing.dns_name.clone(),
        dns_ip: existing.dns_ip.clone(),
        endpoints: Some(desired::endpoints(qdb)),
        credentials_secret: obs
            .credentials_secret
            .clone()
            .or(existing.credentials_secret.clone()),
        conditions: without_stale_cloud_conditions(
            merge(&existing.conditions, &desired, generation, now),
            qdb,
            cloud,
        ),
        failover: existing.failover.clone(),
        node_move: existing.node_move.clone(),
        config: obs.config.clone().or(existing.config.clone()),
        version_upgrade: existing.version_upgrade.clone(),
        disk: obs.disk.clone().or(existing.disk.clone()),
    }
}

/// The phase the database's own objects show and the `Ready` verdict: an invalid spec, a
/// blocking object, a pause, or what the StatefulSet and its pod say.
fn readiness(
    existing: &QuestDBStatus,
    spec: &crate::api::QuestDBSpec,
    obs: &StatusInputs,
    now: Timestamp,
) -> (Phase, Verdict<ReadyReason>) {
    if !obs.invalid.is_empty() {
        (
            Phase::Failed,
            Verdict::new(false, ReadyReason::InvalidSpec, obs.invalid.join("; ")),
        )
    } else if !obs.children.blocked.is_empty() {
        (
            Phase::Failed,
            Verdict::new(
                false,
                ReadyReason::ChildConflict,
                format!(
                    "objects that are not this QuestDB's block it (never adopted, never mounted): {}",
                    obs.children.blocked.join(", ")
                ),
            ),
        )
    } else if spec.paused {
        (
            Phase::Paused,
            Verdict::new(false, ReadyReason::Paused, "compute released, data kept"),
        )
    } else {
        from_objects(existing, spec, obs, now)
    }
}

/// `readiness` of a valid, unpaused database with nothing in its way: what its StatefulSet,
/// pod and node say (a pod in trouble, a restore waited for, a rollout, a node not ready).
fn from_objects(
    existing: &QuestDBStatus,
    spec: &crate::api::QuestDBSpec,
    obs: &StatusInputs,
    now: Timestamp,
) -> (Phase, Verdict<ReadyReason>) {
    // A dedicated database's pod waits for its node to join, which the node condition
    // tells; elsewhere a pod the scheduler cannot place is the user's placement to fix.
    let trouble = obs
        .pod
        .and_then(container_state::trouble)
        .map(|t| container_state::with_memory_split(t, spec))
        // Before the scheduler's word: its "unbound PersistentVolumeClaims" does not say why.
        .or_else(|| {
            obs.volume_pending
                .as_deref()
                .filter(|_| obs.pod.is_some_and(|p| !is_scheduled(p)))
                .map(container_state::volume_pending)
        })
        .or_else(|| {
            obs.pod
                .filter(|_| spec.node.is_none())
                .and_then(|p| container_state::unschedulable(p, now))
        })
        .or_else(|| {
            obs.pod_refused
                .as_deref()
                .filter(|_| obs.pod.is_none())
                .map(container_state::refused)
        });
    match obs.statefulset {
        // Before the rollout check: a pod that never becomes ready never completes one.
        Some(_) if trouble.is_some() => {
            let t = trouble.expect("checked by the guard");
            (
                if matches!(
                    t.reason,
                    ReadyReason::Unschedulable | ReadyReason::VolumePending
                ) {
                    Phase::Pending
                } else {
                    Phase::Failed
                },
                Verdict::new(false, t.reason, t.message),
            )
        }
        // Nothing is built while the volume's restore source is missing or in the way.
        None if obs.restore.as_ref().is_some_and(|r| !r.status) => {
            let r = obs.restore.as_ref().expect("checked by the guard");
            (
                Phase::Pending,
                Verdict::new(
                    false,
                    restore_blocks(r.reason),
                    format!("waiting for the volume's restore: {}", r.message),
                ),
            )
        }
        None => (
            Phase::Pending,
            Verdict::new(false, ReadyReason::Creating, "creating the StatefulSet"),
        ),
        Some(sts) if rolls_out(sts, obs) => {
            let what = if obs.children.changed.is_empty() {
                "waiting for the database pod to become ready".to_string()
            } else {
                format!("applied {}", obs.children.changed.join(", "))
            };
            (
                not_answering(existing, obs.pod),
                Verdict::new(false, ReadyReason::RollingOut, what),
            )
        }
        Some(_) if obs.pod.is_some_and(pod_ready) => (
            Phase::Running,
            Verdict::new(true, ReadyReason::Running, "the database pod is ready"),
        ),
        Some(_) => {
            let phase = not_answering(existing, obs.pod);
            let dead_node = obs.node.filter(|n| !node_is_ready(n));
            let ready = match dead_node {
                Some(n) => Verdict::new(
                    false,
                    ReadyReason::NodeNotReady,
                    format!(
                        "the database pod's node {} is not ready: the database does not answer",
                        n.metadata.name.clone().unwrap_or_default()
                    ),
                ),
                None => Verdict::new(
                    false,
                    ReadyReason::PodNotReady,
                    "waiting for the database pod to become ready",
                ),
            };
            (phase, ready)
        }
    }
}

/// The phase a machine under way shows over the one the objects show: a failover, a node
/// move, a version upgrade; a database waiting for its dedicated node is Provisioning.
fn shown_phase(
    phase: Phase,
    existing: &QuestDBStatus,
    spec: &crate::api::QuestDBSpec,
    cloud: Option<&CloudOutcome>,
) -> Phase {
    // A failover under way says so, whatever the pod looks like meanwhile (until the database
    // answers again: draining the old address is no outage).
    let failing_over = crate::plan::failover::database_down(existing) && !spec.paused;
    // A version upgrade waits for a node move (and a move for nothing a version step holds).
    let moving_node = crate::plan::node_move::in_progress(existing) && !spec.paused;
    let upgrading = crate::plan::version_upgrade::in_progress(existing.version_upgrade.as_ref())
        && !spec.paused;
    let phase = if failing_over {
        Phase::FailingOver
    } else if moving_node {
        Phase::MovingNode
    } else if upgrading {
        Phase::Upgrading
    } else {
        phase
    };
    // A database waiting for its dedicated node is Provisioning, not merely Pending.
    match cloud {
        Some(c) if c.provisioning() && !spec.paused && phase == Phase::Pending => {
            Phase::Provisioning
        }
        _ => phase,
    }
}

/// `Ready`'s reason while the volume's restore holds everything back.
fn restore_blocks(reason: RestoreReason) -> ReadyReason {
    match reason {
        RestoreReason::RestoreSourceNotFound => ReadyReason::RestoreSourceNotFound,
        RestoreReason::RestoreSourceNotReady => ReadyReason::RestoreSourceNotReady,
        RestoreReason::RestoreRefused => ReadyReason::RestoreRefused,
        // Restored holds nothing back: the StatefulSet is being created.
        RestoreReason::Restored => ReadyReason::Creating,
    }
}

fn spec_valid(obs: &StatusInputs) -> Verdict<SpecValidReason> {
    if obs.invalid.is_empty() {
        Verdict::new(true, SpecValidReason::Valid, "the spec is valid")
    } else {
        Verdict::new(false, SpecValidReason::InvalidSpec, obs.invalid.join("; "))
    }
}

/// Whether children were ever built from a valid spec (a database may be running on it).
fn built_before(existing: &QuestDBStatus) -> bool {
    existing.phase.is_some()
        && !existing
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.reason == ReadyReason::InvalidSpec)
}

/// An invalid edit of a database built before: it keeps running on its last good spec, so
/// phase, version, node columns, `Ready` and every other condition stay as they are; only
/// `SpecValid=False` says what is wrong. `Failed` would tell on-call of an outage that is not
/// there.
fn on_last_good_spec(
    existing: QuestDBStatus,
    obs: &StatusInputs,
    generation: Option<i64>,
    now: Timestamp,
) -> QuestDBStatus {
    let conditions = merge(
        &existing.conditions,
        &[spec_valid(obs).desired()],
        generation,
        now,
    );
    QuestDBStatus {
        observed_generation: generation,
        conditions,
        ..existing
    }
}

/// Drops `NodeReady` / `DnsReady` once their field is gone from the spec and the cloud part
/// has nothing more to say about it (the node or record is released): a removed feature must
/// not keep reporting its last state.
fn without_stale_cloud_conditions(
    mut list: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    qdb: &QuestDB,
    cloud: Option<&CloudOutcome>,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    list.retain(|k| k.type_ != conditions::LEGACY_NODE_UPGRADE);
    let Some(c) = cloud else { return list };
    let drop_node = qdb.spec.node.is_none() && c.node_condition.is_none();
    let drop_failover = c.failover_condition.is_none();
    let drop_node_move = c.node_move_condition.is_none();
    let drop_dns = qdb.spec.dns.is_none() && c.dns_condition.is_none();
    list.retain(|k| {
        !(drop_node && k.type_ == conditions::NODE_READY
            || drop_dns && k.type_ == conditions::DNS_READY
            || drop_failover && k.type_ == conditions::FAILOVER
            || drop_node_move && k.type_ == conditions::NODE_MOVE)
    });
    list
}

/// Whether the scheduler has placed the pod.
fn is_scheduled(pod: &CachedPod) -> bool {
    pod.node_name.as_deref().is_some_and(|n| !n.is_empty())
}

/// The phase while the StatefulSet is not done: `Running` as long as the pod still answers
/// (a change rolling out), `Unavailable` once a database that ran does not (a not-ready node,
/// a restart), `Pending` for one that never ran. The phase column must not say `Running` for a
/// database that does not answer.
fn not_answering(existing: &QuestDBStatus, pod: Option<&CachedPod>) -> Phase {
    let ran = matches!(existing.phase, Some(Phase::Running | Phase::Unavailable));
    match (pod.is_some_and(pod_ready), ran) {
        (true, true) => Phase::Running,
        (false, true) => Phase::Unavailable,
        (_, false) => Phase::Pending,
    }
}

/// Whether `new` only adds progress to `old` while the database is on its way (`Pending`
/// both): no condition of `old` changes its status, and nothing beyond the conditions' words
/// and the node's fields differs (no step of a failover or node move, no instance). Such a
/// write may wait a moment for the next piece of progress; any other change, and any news
/// of a database that ran (its node going NotReady), is written at once.
pub(crate) fn progress_only(old: &QuestDBStatus, new: &QuestDBStatus) -> bool {
    if old.phase != Some(Phase::Pending) || new.phase != Some(Phase::Pending) {
        return false;
    }
    let flips = old.conditions.iter().any(|o| {
        new.conditions
            .iter()
            .find(|n| n.type_ == o.type_)
            .is_none_or(|n| n.status != o.status)
    });
    let rest = |s: &QuestDBStatus| QuestDBStatus {
        conditions: Vec::new(),
        node_name: None,
        node_ready: None,
        node_ip: None,
        ..s.clone()
    };
    !flips && rest(old) == rest(new)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
