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

/// One reconcile, as named stages: validate (the cron and the tenancy's rules), observe (the
/// schedule's backups, released from an older operator's ownership), plan (pure: what is due,
/// what retention drops), apply (create and delete backups), status (written only when it
/// differs), next look (a second after the next run is due).
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
    let api: Api<QuestDBBackupSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    let backups: Api<QuestDBBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let status = schedule.status.clone().unwrap_or_default();
    let Some(cron) = valid_cron(&schedule, ctx, &api, &status).await? else {
        return Ok(Next::AwaitChange);
    };
    let owned = observe(&schedule, &sctx, &backups, &ns).await?;
    let now = Timestamp::now();
    let p = plan::plan(&inputs(&schedule, &status, &cron, &owned, now));
    debug!(schedule = %schedule.name_any(), ?p, "backup schedule");
    let active = run_and_prune(&schedule, &sctx, &backups, &p).await?;
    let mut s = status_of(&owned, &p, active, &status);
    if let Some(b) = &s.last_successful_backup {
        s.last_successful_time = successful_time(&sctx.backups, &ns, b).or(s.last_successful_time);
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

/// The schedule's backups as the planner reads them. Backups made before schedules stopped
/// owning them would be deleted with the schedule by the garbage collector: each is released
/// once here (its label keeps it the schedule's).
async fn observe(
    schedule: &QuestDBBackupSchedule,
    sctx: &ScheduleContext,
    backups: &Api<QuestDBBackup>,
    ns: &str,
) -> Result<Vec<Owned>, Error> {
    let uid = schedule.uid().ok_or(Error::MissingUid)?;
    let mine: Vec<Arc<QuestDBBackup>> = sctx
        .backups
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == Some(ns))
        .filter(|b| made_by(b, schedule))
        .collect();
    for b in mine.iter().filter(|b| owned_by(b, &uid)) {
        release_ownership(backups, b, &uid).await?;
    }
    Ok(mine
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
        .collect())
}

/// What the planner decides on: the spec, when the schedule last ran (its creation before
/// that), the backups it made, now.
fn inputs<'a>(
    schedule: &'a QuestDBBackupSchedule,
    status: &QuestDBBackupScheduleStatus,
    cron: &'a cron::Cron,
    owned: &'a [Owned],
    now: Timestamp,
) -> Inputs<'a> {
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
    let spec = &schedule.spec;
    Inputs {
        schedule_name: schedule.metadata.name.as_deref().unwrap_or_default(),
        cron,
        suspend: spec.suspend,
        retention: spec.retention.max(1) as usize,
        max_age: spec
            .retention_days
            .map(|d| Duration::from_secs(d.max(1) as u64 * 86_400)),
        starting_deadline: spec
            .starting_deadline_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64)),
        last,
        now,
        owned,
        verify_every: spec.verify_every.map(|n| n.max(1) as usize),
    }
}

/// The status after this reconcile's runs and deletions (pure; the last success's time is
/// read from its backup by the caller).
fn status_of(
    owned: &[Owned],
    p: &plan::Plan,
    active: Option<String>,
    status: &QuestDBBackupScheduleStatus,
) -> QuestDBBackupScheduleStatus {
    let mut newest_first = owned.to_vec();
    newest_first.sort_by_key(|b| std::cmp::Reverse(b.created));
    let last_ok = newest_first
        .iter()
        .find(|b| b.step == Some(BackupStep::Succeeded));
    QuestDBBackupScheduleStatus {
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
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(name: &str, minute: i64, step: Option<BackupStep>) -> Owned {
        Owned {
            name: name.into(),
            created: Timestamp::from_second(1_800_000_000 + minute * 60).unwrap(),
            step,
            verify: false,
        }
    }

    /// The status lists the newest backups first without the ones this reconcile deletes,
    /// names the newest that succeeded (not a newer failed or running one) and keeps the last
    /// run recorded when this reconcile ran none.
    #[test]
    fn the_status_names_the_newest_success_and_never_a_backup_being_deleted() {
        let backups = [
            owned("b-1", 1, Some(BackupStep::Succeeded)),
            owned("b-2", 2, Some(BackupStep::Succeeded)),
            owned("b-3", 3, Some(BackupStep::Failed)),
            owned("b-4", 4, None),
        ];
        let p = plan::Plan {
            delete: vec!["b-1".into()],
            active: Some("b-4".into()),
            ..plan::Plan::default()
        };
        let before = QuestDBBackupScheduleStatus {
            last_schedule_time: Some("2027-01-15T08:00:00Z".into()),
            last_successful_time: Some("2027-01-15T08:00:30Z".into()),
            ..Default::default()
        };
        let s = status_of(&backups, &p, p.active.clone(), &before);
        let listed: Vec<&str> = s.history.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(listed, ["b-4", "b-3", "b-2"]);
        assert_eq!(s.last_successful_backup.as_deref(), Some("b-2"));
        assert_eq!(s.active.as_deref(), Some("b-4"));
        assert_eq!(s.last_schedule_time, before.last_schedule_time);
        assert_eq!(s.last_successful_time, before.last_successful_time);
        assert_eq!(s.next_schedule_time, None);
    }
}
