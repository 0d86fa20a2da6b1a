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
    /// Made with `spec.verify`.
    pub verify: bool,
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
    /// Finished backups older than this go too (but the newest success).
    pub max_age: Option<Duration>,
    pub starting_deadline: Option<Duration>,
    /// The scheduled time of the newest run made, or the schedule's creation.
    pub last: Timestamp,
    pub now: Timestamp,
    pub owned: &'a [Owned],
    /// Verify every Nth backup made.
    pub verify_every: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Make this backup (name, scheduled time).
    pub create: Option<(String, Timestamp)>,
    /// Make it with `spec.verify`: none of the newest `verifyEvery - 1` backups was.
    pub verify: bool,
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
        delete: retention(&newest_first, i.retention, i.max_age, i.now),
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
        p.verify = i.verify_every.is_some_and(|n| {
            newest_first
                .iter()
                .take(n.saturating_sub(1))
                .all(|b| !b.verify)
        });
        p.record = Some(due);
    }
    p
}

/// `<schedule>-<scheduled minute since the epoch>`, as a CronJob names its Jobs: the same run
/// always gets the same name, so a retried create cannot make two.
pub fn run_name(schedule: &str, due: Timestamp) -> String {
    format!("{schedule}-{}", due.as_second() / 60)
}

/// The finished backups to delete: everything older than the `keep`-th newest success,
/// failures beyond the newest `keep`, and anything created more than `max_age` before `now`
/// except the newest success (a schedule whose runs fail keeps its last good backup).
fn retention(
    newest_first: &[&Owned],
    keep: usize,
    max_age: Option<Duration>,
    now: Timestamp,
) -> Vec<String> {
    let mut delete = Vec::new();
    let (mut succeeded, mut failed) = (0, 0);
    for b in newest_first.iter().filter(|b| b.finished()) {
        let ok = b.step == Some(BackupStep::Succeeded);
        let age = Duration::try_from(now.duration_since(b.created)).unwrap_or_default();
        let newest_success = ok && succeeded == 0;
        let too_old = max_age.is_some_and(|m| age > m) && !newest_success;
        let beyond = succeeded >= keep || (!ok && failed >= keep) || too_old;
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
            verify: false,
        }
    }

    fn inputs<'a>(cron: &'a Cron, owned: &'a [Owned]) -> Inputs<'a> {
        Inputs {
            schedule_name: "nightly",
            cron,
            suspend: false,
            retention: 2,
            max_age: None,
            starting_deadline: None,
            last: at("2026-11-24T08:00:00Z"),
            now: at("2026-11-24T08:03:30Z"),
            owned,
            verify_every: None,
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

    /// The harm: a schedule asked to prove its backups proving none, or paying for a restore
    /// of every one when asked for one in N.
    #[test]
    fn every_nth_backup_made_is_verified() {
        let c: Cron = "* * * * *".parse().unwrap();
        let ok = Some(BackupStep::Succeeded);
        let mut made: Vec<Owned> = Vec::new();
        let mut verified = Vec::new();
        for minute in 0..9 {
            let mut i = inputs(&c, &made);
            i.verify_every = Some(3);
            let p = plan(&i);
            let (name, _) = p.create.clone().expect("a run is due");
            verified.push(p.verify);
            let mut b = owned(&name, &format!("2026-11-24T08:0{minute}:00Z"), ok);
            b.verify = p.verify;
            made.push(b);
        }
        assert_eq!(
            verified,
            [true, false, false, true, false, false, true, false, false]
        );
        let mut every = inputs(&c, &made);
        every.verify_every = Some(1);
        assert!(plan(&every).verify);
        assert!(!plan(&inputs(&c, &made)).verify, "unset: none");
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

    /// The harm: a schedule whose runs have failed for longer than its age limit deleting its
    /// last good backup, leaving none.
    #[test]
    fn retention_by_age_drops_old_backups_but_never_the_newest_success() {
        let c: Cron = "0 0 1 1 *".parse().unwrap();
        let ok = Some(BackupStep::Succeeded);
        let bad = Some(BackupStep::Failed);
        let backups = [
            owned("fail-new", "2026-11-24T07:00:00Z", bad),
            owned("ok-old", "2026-11-10T00:00:00Z", ok),
            owned("fail-old", "2026-11-09T00:00:00Z", bad),
        ];
        let mut i = inputs(&c, &backups);
        i.retention = 10;
        i.max_age = Some(Duration::from_secs(7 * 86_400));
        assert_eq!(plan(&i).delete, vec!["fail-old"]);
        let more = [
            owned("ok-new", "2026-11-24T07:00:00Z", ok),
            owned("ok-old", "2026-11-10T00:00:00Z", ok),
        ];
        let mut i = inputs(&c, &more);
        i.retention = 10;
        i.max_age = Some(Duration::from_secs(7 * 86_400));
        assert_eq!(plan(&i).delete, vec!["ok-old"]);
    }
}
