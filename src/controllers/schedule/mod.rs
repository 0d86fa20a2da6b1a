//! The backup-schedule controller: one reconcile per `QuestDBBackupSchedule`, woken by its own
//! changes, by its backups' (labelled with its name) and by its next scheduled minute. Its
//! backups are not owned by it: deleting a schedule keeps them (see the API's docs).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::{debug, info};

use crate::api::{
    labels, BackupStep, EventReason, QuestDBBackup, QuestDBBackupSchedule,
    QuestDBBackupScheduleStatus, QuestDBBackupSpec, ScheduledBackup, SCHEDULE_LABEL,
};
use crate::controllers::context::Context;
use crate::controllers::{Error, Next};

use crate::plan::cron;
use crate::plan::schedule as plan;
use plan::{Inputs, Owned};

pub(crate) const CONTROLLER_NAME: &str = "questdbbackupschedule";
/// How many of a schedule's newest backups its status lists.
const HISTORY: usize = 10;

pub(crate) struct ScheduleContext {
    pub ctx: Arc<Context>,
    /// The backup controller's cache of every QuestDBBackup.
    pub backups: Store<QuestDBBackup>,
}

pub(crate) async fn reconcile(
    schedule: Arc<QuestDBBackupSchedule>,
    sctx: Arc<ScheduleContext>,
) -> Result<Next, Error> {
    if schedule.metadata.deletion_timestamp.is_some() {
        // Its backups stay: none is owned by it (older ones are released below while it lives).
        return Ok(Next::AwaitChange);
    }
    let ctx = &sctx.ctx;
    let ns = schedule.namespace().ok_or(Error::MissingNamespace)?;
    let uid = schedule.uid().ok_or(Error::MissingUid)?;
    let name = schedule.name_any();
    let api: Api<QuestDBBackupSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    let backups: Api<QuestDBBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let status = schedule.status.clone().unwrap_or_default();

    let Some(cron) = valid_cron(&schedule, ctx, &api, &status).await? else {
        return Ok(Next::AwaitChange);
    };

    let mine: Vec<Arc<QuestDBBackup>> = sctx
        .backups
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
        .filter(|b| made_by(b, &schedule))
        .collect();
    // Backups made before schedules stopped owning them: the garbage collector would delete
    // them with the schedule. Released once each (their label keeps them the schedule's).
    for b in mine.iter().filter(|b| owned_by(b, &uid)) {
        release_ownership(&backups, b, &uid).await?;
    }
    let owned: Vec<Owned> = mine
        .iter()
        .map(|b| Owned {
            name: b.name_any(),
            created: b
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            step: b.status.as_ref().and_then(|s| s.step),
            verify: b.spec.verify,
        })
        .collect();
    let now = Timestamp::now();
    let created = schedule
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let last = status
        .last_schedule_time
        .as_deref()
        .and_then(|t| t.parse().ok())
        .unwrap_or(created);
    let p = plan::plan(&Inputs {
        schedule_name: &name,
        cron: &cron,
        suspend: schedule.spec.suspend,
        retention: schedule.spec.retention.max(1) as usize,
        max_age: schedule
            .spec
            .retention_days
            .map(|d| Duration::from_secs(d.max(1) as u64 * 86_400)),
        starting_deadline: schedule
            .spec
            .starting_deadline_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64)),
        last,
        now,
        owned: &owned,
        verify_every: schedule.spec.verify_every.map(|n| n.max(1) as usize),
    });
    debug!(schedule = %name, ?p, "backup schedule");

    let active = run_and_prune(&schedule, &sctx, &backups, &p).await?;

    let mut newest_first = owned.clone();
    newest_first.sort_by_key(|b| std::cmp::Reverse(b.created));
    let last_ok = newest_first
        .iter()
        .find(|b| b.step == Some(BackupStep::Succeeded));
    let mut s = QuestDBBackupScheduleStatus {
        last_schedule_time: p
            .record
            .map(|t| t.to_string())
            .or(status.last_schedule_time.clone()),
        next_schedule_time: p.next.map(|t| t.to_string()),
        active,
        last_successful_backup: last_ok.map(|b| b.name.clone()),
        last_successful_time: status.last_successful_time.clone(),
        message: p.message.clone(),
        history: newest_first
            .iter()
            .filter(|b| !p.delete.contains(&b.name))
            .take(HISTORY)
            .map(|b| ScheduledBackup {
                name: b.name.clone(),
                step: b.step.map(|s| s.as_str().to_string()),
            })
            .collect(),
    };
    if let Some(b) = last_ok {
        s.last_successful_time =
            successful_time(&sctx.backups, &ns, &b.name).or(s.last_successful_time);
    }
    if s != status {
        write_status(&api, &schedule, s).await?;
    }
    Ok(match p.next {
        // A second after the minute turns, so the run is due when the reconcile comes.
        Some(next) => {
            let wait = Duration::try_from(next.duration_since(now)).unwrap_or_default();
            Next::RequeueAfter((wait + Duration::from_secs(1)).min(Duration::from_secs(3600)))
        }
        None => Next::AwaitChange,
    })
}

/// The schedule's cron, when it parses and the tenancy rules allow its pace and retention;
/// otherwise `None`, said once in status and one Warning event.
async fn valid_cron(
    schedule: &QuestDBBackupSchedule,
    ctx: &Context,
    api: &Api<QuestDBBackupSchedule>,
    status: &QuestDBBackupScheduleStatus,
) -> Result<Option<cron::Cron>, Error> {
    let parsed = schedule
        .spec
        .schedule
        .parse::<cron::Cron>()
        .map_err(|e| format!("invalid schedule: {e}"))
        .and_then(|c| {
            let gap = c.shortest_gap(Timestamp::now());
            match ctx
                .tenancy
                .backup_schedules
                .refusal(gap, schedule.spec.retention)
            {
                Some(why) => Err(why),
                None => Ok(c),
            }
        });
    match parsed {
        Ok(c) => Ok(Some(c)),
        Err(message) => {
            if status.message.as_deref() != Some(message.as_str()) {
                event(
                    ctx,
                    schedule,
                    EventType::Warning,
                    EventReason::InvalidSpec,
                    message.clone(),
                )
                .await;
                let mut s = status.clone();
                s.message = Some(message);
                s.next_schedule_time = None;
                write_status(api, schedule, s).await?;
            }
            Ok(None)
        }
    }
}

/// Makes the run the plan says is due (a name made twice is refused by the apiserver, so a
/// crash between making and recording makes nothing twice), tells a skipped run, and deletes
/// the backups beyond retention. Returns the active run.
async fn run_and_prune(
    schedule: &QuestDBBackupSchedule,
    sctx: &ScheduleContext,
    backups: &Api<QuestDBBackup>,
    p: &plan::Plan,
) -> Result<Option<String>, Error> {
    let ctx = &sctx.ctx;
    let ns = schedule.namespace().unwrap_or_default();
    let name = schedule.name_any();
    let mut active = p.active.clone();
    if let Some((run, due)) = &p.create {
        // Made first, recorded after: a crash in between makes the same name again, which
        // the apiserver refuses.
        match backups
            .create(&PostParams::default(), &backup_for(schedule, run, p.verify))
            .await
        {
            Ok(_) => {
                info!(schedule = %name, backup = %run, scheduled = %due, "scheduled backup made");
                event(
                    ctx,
                    schedule,
                    EventType::Normal,
                    EventReason::BackupScheduled,
                    format!("made backup {run} for the run of {due}"),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
        active = Some(run.clone());
    }
    if p.record.is_some() && p.create.is_none() {
        if let Some(message) = &p.message {
            event(
                ctx,
                schedule,
                EventType::Warning,
                EventReason::BackupSkipped,
                message.clone(),
            )
            .await;
        }
    }
    for old in &p.delete {
        let uid = owned_uid(&sctx.backups, &ns, old);
        let dp = DeleteParams {
            preconditions: uid.map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match backups.delete(old, &dp).await {
            Ok(_) => info!(schedule = %name, backup = %old, "deleted a backup beyond retention"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(active)
}

fn owned_uid(store: &Store<QuestDBBackup>, ns: &str, name: &str) -> Option<String> {
    store
        .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
        .and_then(|b| b.uid())
}

fn successful_time(store: &Store<QuestDBBackup>, ns: &str, name: &str) -> Option<String> {
    store
        .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
        .and_then(|b| Some(b.status.as_ref()?.finished_at.as_ref()?.0.to_string()))
}

/// Whether `backup` is one of `schedule`'s: its label names the schedule and it backs up the
/// schedule's database (a label alone, copied onto a hand-made backup of another database,
/// does not put that backup under this schedule's retention).
fn made_by(backup: &QuestDBBackup, schedule: &QuestDBBackupSchedule) -> bool {
    backup.labels().get(SCHEDULE_LABEL) == Some(&schedule.name_any())
        && backup.spec.questdb_name == schedule.spec.questdb_name
}

fn owned_by(backup: &QuestDBBackup, schedule_uid: &str) -> bool {
    backup
        .owner_references()
        .iter()
        .any(|o| o.uid == schedule_uid)
}

/// Drops the schedule's owner reference from `backup` (a merge patch carrying the
/// resourceVersion read, so a list changed meanwhile is a conflict, never overwritten).
async fn release_ownership(
    api: &Api<QuestDBBackup>,
    backup: &QuestDBBackup,
    schedule_uid: &str,
) -> Result<(), Error> {
    let kept: Vec<_> = backup
        .owner_references()
        .iter()
        .filter(|o| o.uid != schedule_uid)
        .cloned()
        .collect();
    let patch = serde_json::json!({"metadata": {
        "ownerReferences": kept,
        "resourceVersion": backup.resource_version(),
    }});
    match api
        .patch(
            &backup.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            info!(backup = %backup.name_any(), "released a scheduled backup from its schedule's ownership: deleting the schedule keeps it");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::from_status_write(e)),
    }
}

/// A backup of the schedule's database, labelled with the schedule's name and not owned by
/// it: deleting the schedule keeps every backup it made.
fn backup_for(schedule: &QuestDBBackupSchedule, name: &str, verify: bool) -> QuestDBBackup {
    let mut b = QuestDBBackup::new(
        name,
        QuestDBBackupSpec {
            questdb_name: schedule.spec.questdb_name.clone(),
            volume_snapshot_class_name: schedule.spec.volume_snapshot_class_name.clone(),
            deletion_policy: schedule.spec.deletion_policy,
            verify,
        },
    );
    b.metadata.namespace = schedule.namespace();
    b.metadata.labels = Some(
        [
            (SCHEDULE_LABEL, schedule.name_any()),
            (labels::INSTANCE, schedule.spec.questdb_name.clone()),
            (labels::MANAGED_BY, labels::MANAGED_BY_VALUE.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    );
    b
}

async fn write_status(
    api: &Api<QuestDBBackupSchedule>,
    schedule: &QuestDBBackupSchedule,
    status: QuestDBBackupScheduleStatus,
) -> Result<(), Error> {
    let mut obj = schedule.clone();
    obj.status = Some(status);
    crate::controllers::own_writes::replace_status(api, &obj)
        .await
        .map_err(Error::from_status_write)?;
    Ok(())
}

async fn event(
    ctx: &Context,
    schedule: &QuestDBBackupSchedule,
    type_: EventType,
    reason: EventReason,
    note: String,
) {
    ctx.event_for(&schedule.object_ref(&()), type_, reason, "Schedule", note)
        .await
}
