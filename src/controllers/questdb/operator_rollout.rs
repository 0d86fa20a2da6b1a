//! The shell of [`crate::plan::operator_rollout`]: which operator version wrote a StatefulSet,
//! the upgrade rolls this process began, and the databases held until a slot frees.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::api::QuestDB;
use crate::cache::compacted::OwnedChild;
use crate::cache::compacted::{CachedMeta, CachedStatefulSet};
use crate::controllers::context::Context;
use crate::plan::operator_rollout::{gate, recheck, RollGate, RollInputs, ROLL_PATIENCE};

/// The operator version that last wrote a StatefulSet (its metadata, not its pod template: a
/// version that builds the same template restarts nothing).
pub const OPERATOR_VERSION_ANNOTATION: &str = "crd.questdb.io/operator-version";

/// Records this operator's version on the StatefulSet it builds.
pub(crate) fn stamp_version(sts: &mut StatefulSet, version: &str) {
    sts.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(OPERATOR_VERSION_ANNOTATION.into(), version.into());
}

/// Whether the StatefulSet's database serves at its current revision, as the cache says.
fn serving(sts: &CachedStatefulSet) -> bool {
    let Some(s) = &sts.kept.status else {
        return false;
    };
    let replicas = sts.replicas();
    replicas > 0
        && s.ready_replicas.unwrap_or(0) >= replicas
        && s.current_revision.is_some()
        && s.current_revision == s.update_revision
        && s.observed_generation.unwrap_or(0) >= sts.generation().unwrap_or(0)
}

/// What the gate decides for `desired` (stamped with this operator's version): `None` to write
/// it, else when to look again (the database was told why it waits).
pub(crate) async fn hold(ctx: &Context, qdb: &QuestDB, desired: &StatefulSet) -> Option<Duration> {
    let rolls = &ctx.rolls;
    let uid = qdb.uid().unwrap_or_default();
    let ns = qdb.namespace().unwrap_or_default();
    let existing = ctx
        .caches
        .statefulsets
        .get(&ObjectRef::new(&desired.name_any()).within(&ns))?;
    let status = qdb.status.clone().unwrap_or_default();
    let steering = crate::plan::failover::in_progress(&status)
        || crate::plan::node_move::in_progress(&status)
        || crate::plan::version_upgrade::in_progress(status.version_upgrade.as_ref())
        || desired.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) != existing.replicas();
    // Also frees the slots of rolls that finished (this database's own among them).
    let rolling = rolling_besides(ctx, &uid);
    let other_version =
        existing.annotation(OPERATOR_VERSION_ANNOTATION) != Some(rolls.version.as_str());
    let window = qdb
        .spec
        .node
        .as_ref()
        .and_then(|n| n.maintenance_window.as_ref())
        .map(|w| crate::plan::maintenance::state(w, Timestamp::now()));
    let inputs = RollInputs {
        // Compared only after an upgrade: the applier compares the whole object anyway.
        differs: other_version && !StatefulSet::spec_matches(desired, &existing),
        other_version,
        serving: serving(&existing),
        steering,
        rolling: &rolling,
        limit: rolls.limit,
        window: window.clone(),
    };
    let key = (ns.clone(), qdb.name_any());
    match gate(&inputs) {
        RollGate::Apply { begins } => {
            rolls.held.lock().expect("held lock").remove(&key);
            if begins {
                rolls
                    .begun
                    .lock()
                    .expect("rolls lock")
                    .insert(uid, (ns, desired.name_any(), Instant::now()));
                tracing::info!(questdb = %qdb.name_any(), "upgrade roll begins");
            }
            None
        }
        RollGate::Hold { message } => {
            let first = rolls.held.lock().expect("held lock").insert(key);
            if first {
                tracing::info!(questdb = %qdb.name_any(), "{message}");
                ctx.event(
                    qdb,
                    kube::runtime::events::EventType::Normal,
                    crate::api::EventReason::OperatorRolloutHeld,
                    "OperatorRollout",
                    message,
                )
                .await;
            }
            Some(recheck(window.as_ref(), Timestamp::now()))
        }
    }
}

/// The databases other than `uid` whose upgrade roll this process began and has not seen
/// finish; a finished one frees its slot and wakes the held databases.
fn rolling_besides(ctx: &Context, uid: &str) -> Vec<String> {
    let rolls = &ctx.rolls;
    let mut freed = false;
    let mut begun = rolls.begun.lock().expect("rolls lock");
    begun.retain(|_, (ns, name, at)| {
        let finished = at.elapsed() > ROLL_PATIENCE
            || ctx
                .caches
                .statefulsets
                .get(&ObjectRef::new(name).within(ns))
                .is_none_or(|s| {
                    s.annotation(OPERATOR_VERSION_ANNOTATION) == Some(rolls.version.as_str())
                        && serving(&s)
                });
        freed |= finished;
        !finished
    });
    let rolling = begun
        .iter()
        .filter(|(u, _)| u.as_str() != uid)
        .map(|(_, (ns, name, _))| format!("{ns}/{name}"))
        .collect();
    drop(begun);
    if freed {
        if let Some(wake) = &ctx.wake {
            for (ns, name) in rolls.held.lock().expect("held lock").drain() {
                let _ = wake.unbounded_send(ObjectRef::new(&name).within(&ns));
            }
        }
    }
    rolling
}
