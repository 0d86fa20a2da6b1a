//! What a backup schedule does now: make the newest missed run (or skip it, saying why) and
//! apply retention. Pure, like a CronJob controller's `getMostRecentScheduleTime` plus its
//! history limits.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::cron::Cron;
use crate::api::BackupStep;

/// A backup the schedule made.
#[derive(Clone, Debug, PartialEq)]
pub struct Owned {
    pub name: String,
    pub created: Timestamp,
    pub step: Option<BackupStep>,
}

impl Owned {
    fn finished(&self) -> bool {
        self.step.is_some_and(BackupStep::is_final)
    }
}

pub struct Inputs<'a> {
    pub schedule_name: &'a str,
    pub cron: &'a Cron,
    pub suspend: bool,
    pub retention: usize,
    pub starting_deadline: Option<Duration>,
    /// The scheduled time of the newest run made, or the schedule's creation.
    pub last: Timestamp,
    pub now: Timestamp,
    pub owned: &'a [Owned],
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Make this backup (name, scheduled time).
    pub create: Option<(String, Timestamp)>,
    /// The scheduled time to record as the newest run handled (made or skipped for good).
    pub record: Option<Timestamp>,
    pub delete: Vec<String>,
    pub active: Option<String>,
    pub message: Option<String>,
    pub next: Option<Timestamp>,
}

pub fn plan(i: &Inputs) -> Plan {
    let mut newest_first: Vec<&Owned> = i.owned.iter().collect();
    newest_first.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(&a.name)));
    let active = newest_first
        .iter()
        .find(|b| !b.finished())
        .map(|b| b.name.clone());
    let mut p = Plan {
        active: active.clone(),
        delete: retention(&newest_first, i.retention),
        next: i.cron.next_after(i.now),
        ..Plan::default()
    };
    let Some(due) = i.cron.latest_between(i.last, i.now) else {
        return p;
    };
    let late = Duration::try_from(i.now.duration_since(due)).unwrap_or_default();
    if i.suspend {
        p.message = Some("suspended: no new backups".into());
    } else if i.starting_deadline.is_some_and(|d| late > d) {
        p.record = Some(due);
        p.message = Some(format!(
            "skipped the run of {due}: {}s late, past startingDeadlineSeconds",
            late.as_secs()
        ));
    } else if let Some(active) = active {
        p.message = Some(format!(
            "the run of {due} waits for backup {active} to finish"
        ));
    } else {
        p.create = Some((run_name(i.schedule_name, due), due));
        p.record = Some(due);
    }
    p
}

/// `<schedule>-<scheduled minute since the epoch>`, as a CronJob names its Jobs: the same run
/// always gets the same name, so a retried create cannot make two.
pub fn run_name(schedule: &str, due: Timestamp) -> String {
    format!("{schedule}-{}", due.as_second() / 60)
}

/// The finished backups to delete: everything older than the `keep`-th newest success, and
/// failures beyond the newest `keep`.
fn retention(newest_first: &[&Owned], keep: usize) -> Vec<String> {
    let mut delete = Vec::new();
    let (mut succeeded, mut failed) = (0, 0);
    for b in newest_first.iter().filter(|b| b.finished()) {
        let ok = b.step == Some(BackupStep::Succeeded);
        let beyond = succeeded >= keep || (!ok && failed >= keep);
        if ok {
            succeeded += 1;
        } else {
            failed += 1;
        }
        if beyond {
            delete.push(b.name.clone());
        }
    }
    delete
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn owned(name: &str, created: &str, step: Option<BackupStep>) -> Owned {
        Owned {
            name: name.into(),
            created: at(created),
            step,
        }
    }

    fn inputs<'a>(cron: &'a Cron, owned: &'a [Owned]) -> Inputs<'a> {
        Inputs {
            schedule_name: "nightly",
            cron,
            suspend: false,
            retention: 2,
            starting_deadline: None,
            last: at("2026-11-24T08:00:00Z"),
            now: at("2026-11-24T08:03:30Z"),
            owned,
        }
    }

    #[test]
    fn the_newest_missed_run_is_made_once_under_a_name_of_its_own() {
        let c: Cron = "* * * * *".parse().unwrap();
        let p = plan(&inputs(&c, &[]));
        let due = at("2026-11-24T08:03:00Z");
        assert_eq!(p.create, Some((run_name("nightly", due), due)));
        assert_eq!(p.record, Some(due));
        assert_eq!(p.next, Some(at("2026-11-24T08:04:00Z")));
        let mut again = inputs(&c, &[]);
        again.last = due;
        assert_eq!(
            plan(&again).create,
            None,
            "nothing new until the next minute"
        );
    }

    #[test]
    fn never_two_backups_of_one_schedule_at_once() {
        let c: Cron = "* * * * *".parse().unwrap();
        let running = [owned(
            "nightly-1",
            "2026-11-24T08:01:00Z",
            Some(BackupStep::Snapshotting),
        )];
        let p = plan(&inputs(&c, &running));
        assert_eq!(p.create, None);
        assert_eq!(p.record, None, "made late once the running one finishes");
        assert_eq!(p.active.as_deref(), Some("nightly-1"));
        assert!(p.message.unwrap().contains("nightly-1"));
    }

    #[test]
    fn a_run_missed_past_the_deadline_is_skipped_and_suspension_makes_none() {
        let c: Cron = "0 * * * *".parse().unwrap();
        let mut i = inputs(&c, &[]);
        i.last = at("2026-11-24T06:30:00Z");
        i.now = at("2026-11-24T08:20:00Z");
        i.starting_deadline = Some(Duration::from_secs(600));
        let p = plan(&i);
        assert_eq!(p.create, None);
        assert_eq!(p.record, Some(at("2026-11-24T08:00:00Z")));
        i.starting_deadline = None;
        i.suspend = true;
        let p = plan(&i);
        assert_eq!((p.create, p.record), (None, None));
    }

    #[test]
    fn retention_keeps_the_newest_successes_and_drops_older_failures() {
        let c: Cron = "0 0 1 1 *".parse().unwrap();
        let ok = Some(BackupStep::Succeeded);
        let bad = Some(BackupStep::Failed);
        let backups = [
            owned("b5", "2026-11-24T08:05:00Z", ok),
            owned("b4", "2026-11-24T08:04:00Z", bad),
            owned("b3", "2026-11-24T08:03:00Z", ok),
            owned("b2", "2026-11-24T08:02:00Z", bad),
            owned("b1", "2026-11-24T08:01:00Z", ok),
            owned("b6", "2026-11-24T08:06:00Z", Some(BackupStep::Uploading)),
        ];
        let p = plan(&inputs(&c, &backups));
        assert_eq!(p.delete, vec!["b2".to_string(), "b1".to_string()]);
        let failures: Vec<Owned> = (0..5)
            .map(|i| owned(&format!("f{i}"), &format!("2026-11-24T08:0{i}:00Z"), bad))
            .collect();
        let p = plan(&inputs(&c, &failures));
        assert_eq!(p.delete, vec!["f2", "f1", "f0"]);
    }
}
