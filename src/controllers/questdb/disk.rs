//! The disk step: acts on [`crate::plan::disk`]'s decision from what the write-health poll
//! last saw of the volume. It grows the claim (the storage expands it online; the volume step
//! then keeps the larger size, since volumes never shrink) and resumes the WAL tables a full
//! volume suspended once there is room, with an event for each. Idempotent: the next size
//! derives from the claim's request and the storage's progress, and a table is resumed only
//! while the record (`status.disk.suspendedWhenFull`) holds it.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, warn};

use crate::api::{DiskSpaceReason, DiskStatus, EventReason, QuestDB};
use crate::controllers::context::{polled, Context};
use crate::controllers::Error;
use crate::desired;
use crate::plan::conditions::Verdict;
use crate::plan::disk::{self, Observed};

/// `DiskSpace` and `status.disk` for the status write.
#[derive(Default)]
pub(super) struct DiskOut {
    pub condition: Option<Verdict<DiskSpaceReason>>,
    pub status: Option<DiskStatus>,
}

pub(super) async fn step(qdb: &mut QuestDB, ctx: &Context) -> Result<DiskOut, Error> {
    let Some(seen) = polled(qdb, &ctx.disk) else {
        return Ok(DiskOut::default());
    };
    let ns = qdb.namespace().unwrap_or_default();
    let claim_name = desired::names::pvc(qdb);
    let claim = ctx
        .caches
        .pvcs
        .get(&kube::runtime::reflector::ObjectRef::new(&claim_name).within(&ns));
    let bytes = |q: Option<String>| {
        q.and_then(|q| desired::quantity::parse_quantity(&q))
            .map(|b| b as u64)
    };
    let observed = Observed {
        usage: Some(seen.usage.clone()),
        requested: bytes(claim.as_deref().and_then(desired::requested_size)),
        claim_capacity: bytes(claim.as_deref().and_then(|c| {
            c.status
                .as_ref()?
                .capacity
                .as_ref()?
                .get("storage")
                .map(|q| q.0.clone())
        })),
        suspended: seen.suspended.clone(),
    };
    let previous = qdb.status.as_ref().and_then(|s| s.disk.clone());
    let auto_grow = qdb.spec.volume.auto_grow.clone();
    let mut plan = disk::decide(auto_grow.as_ref(), &observed, previous.as_ref());
    let class = claim
        .as_deref()
        .and_then(|c| c.spec.as_ref()?.storage_class_name.clone())
        .unwrap_or_default();

    if let Some(target) = plan.grow_to {
        let expandable = if class.is_empty() {
            None
        } else {
            super::volume::storage_class_expands(ctx, &class).await
        };
        if expandable == Some(false) {
            plan = disk::not_expandable(plan, &class);
        } else {
            // Recorded first: after a crash here, a look at the file system from before the
            // growth does not ask for another.
            let record = plan.status.clone();
            super::record::persist(qdb, ctx, |s| s.disk = record.clone()).await?;
            if !grow(qdb, ctx, &claim_name, target, &plan).await? {
                plan = disk::not_expandable(plan, &class);
            }
        }
    }

    let was_at_maximum = qdb
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == crate::api::conditions::DISK_SPACE)
        })
        .is_some_and(|c| c.reason == DiskSpaceReason::AtMaximum.as_str());
    if let Some(v) = plan.condition.as_ref() {
        if v.reason == DiskSpaceReason::AtMaximum && !was_at_maximum {
            warn!(questdb = %qdb.name_any(), "{}", v.message);
            ctx.event(
                qdb,
                EventType::Warning,
                EventReason::VolumeAtMaximum,
                "GrowVolume",
                v.message.clone(),
            )
            .await;
        }
    }

    if !plan.resume.is_empty() {
        let not_resumed = resume(qdb, ctx, &plan.resume).await;
        if let Some(status) = plan.status.as_mut() {
            // Not resumed (QuestDB did not answer): kept, to try again.
            status.suspended_when_full.extend(not_resumed);
        }
    }
    Ok(DiskOut {
        condition: plan.condition,
        status: plan.status,
    })
}

/// Asks for the claim to grow to `target` bytes; `false` when the apiserver refuses the
/// resize (the class cannot expand).
async fn grow(
    qdb: &QuestDB,
    ctx: &Context,
    claim_name: &str,
    target: u64,
    plan: &disk::Plan,
) -> Result<bool, Error> {
    let ns = qdb.namespace().unwrap_or_default();
    let size = disk::quantity(target);
    let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch(
            claim_name,
            &PatchParams {
                field_manager: Some(crate::api::MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            let note = plan
                .condition
                .as_ref()
                .map(|v| v.message.clone())
                .unwrap_or_default();
            info!(questdb = %qdb.name_any(), claim = %claim_name, %size, "growing the volume");
            ctx.event(
                qdb,
                EventType::Normal,
                EventReason::VolumeGrowing,
                "GrowVolume",
                note,
            )
            .await;
            Ok(true)
        }
        Err(kube::Error::Api(e)) if super::volume::refused_resize(&e) => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Resumes `tables`; returns the ones that could not be.
async fn resume(qdb: &QuestDB, ctx: &Context, tables: &[String]) -> Vec<String> {
    let mut logins = crate::controllers::write_health::Logins::new();
    let Some(db) = crate::controllers::write_health::connect(ctx, qdb, None, &mut logins).await
    else {
        return tables.to_vec();
    };
    let mut resumed = Vec::new();
    let mut failed = Vec::new();
    for table in tables {
        match db.resume_wal(table).await {
            Ok(()) => resumed.push(table.clone()),
            Err(e) => {
                warn!(questdb = %qdb.name_any(), %table, error = %e, "resuming a WAL table");
                failed.push(table.clone());
            }
        }
    }
    if !resumed.is_empty() {
        let note = format!(
            "resumed the WAL tables a full volume suspended, now that there is room: {}",
            resumed.join(", ")
        );
        info!(questdb = %qdb.name_any(), tables = %resumed.join(","), "resumed WAL tables");
        ctx.event(
            qdb,
            EventType::Normal,
            EventReason::TablesResumed,
            "ResumeWal",
            note,
        )
        .await;
    }
    failed
}
