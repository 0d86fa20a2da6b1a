//! A change of QuestDB version (`spec.image`) with a way back. Pure.
//!
//! QuestDB promises no downgrade once a newer version has run on the data, so the way back
//! is a copy of the data taken where no acknowledged row can be missing from it: after the old
//! version stopped (a clean stop writes everything back) and before the new one starts. The
//! steps, each recorded in `status.versionUpgrade` before its side effect:
//!
//! `Waiting` (a failover, node move or pause is under way; the old version runs) →
//! `Stopping` (the StatefulSet at zero replicas, old image) → `Snapshotting` (a VolumeSnapshot
//! of the claim, named in the record before it is asked for; the next step needs only its
//! cut, `status.creationTime`, not its upload) → `Starting` (the new image, `readyTimeout` to
//! become ready) → done: the record goes, the condition says `Upgraded`.
//!
//! A new version not ready in time, or an image set back while it starts, rolls back:
//! `StoppingNew` (zero replicas, old image) → `ReleasingVolume` (the PersistentVolume the new
//! version ran on is set to `Retain`, then its claim, named by uid, deleted: nothing that held
//! data is lost) → `Restoring` (the claim again, from the snapshot; the old version on it) →
//! `RolledBack` (the old version runs; `spec.image` still names the failed version until a
//! person changes it, or edits the spec to try it again). `Held`: the snapshot could not be taken; the old version runs again and
//! an edit of the spec tries once more. With `backup: Skip` there is no snapshot: the new
//! version starts at once, and one that is not ready is left for a person (setting the image
//! back runs the old version on the data as the new one left it).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    UpgradeBackup, VersionUpgradeReason, VersionUpgradeSpec, VersionUpgradeStatus,
    VersionUpgradeStep,
};
use crate::plan::conditions::Verdict;

/// How long a new version has to become ready by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How often a snapshot being cut is looked at (its status is not watched): the database is
/// down meanwhile, and a cut takes about a second (EBS answers CreateSnapshot with it).
pub const SNAPSHOT_POLL: Duration = Duration::from_millis(500);

/// What the database pod is, for the step that waits on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState<'a> {
    /// No pod: the StatefulSet at zero replicas has stopped it.
    Gone,
    /// A pod that is not ready on the StatefulSet's template; `ran`: its QuestDB container has
    /// started at least once (it may have touched the data).
    NotReady { ran: bool },
    /// Ready on the StatefulSet's current template, which runs `image`.
    Ready { image: &'a str },
}

/// The pre-upgrade VolumeSnapshot, looked at only while it is being cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotState {
    NotLooked,
    Absent,
    /// Asked for; `cut`: its point in time is fixed (`status.creationTime`).
    Pending {
        cut: bool,
    },
    Ready,
    /// The storage's error, or a VolumeSnapshot of that name that is not this database's.
    Failed(String),
    /// The VolumeSnapshot API is not served.
    ApiMissing,
}

/// The database's claim as the cache holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim<'a> {
    pub uid: &'a str,
    /// The PersistentVolume it is bound to.
    pub volume: Option<&'a str>,
}

#[derive(Clone, Debug)]
pub struct View<'a> {
    pub name: &'a str,
    pub spec_image: &'a str,
    pub generation: i64,
    pub record: Option<&'a VersionUpgradeStatus>,
    /// The database container's image in the StatefulSet (none before it exists).
    pub statefulset_image: Option<&'a str>,
    /// The database has run (`status.dataVersion`): a first image needs no way back.
    pub has_data: bool,
    pub policy: &'a VersionUpgradeSpec,
    /// Why the upgrade may not begin now: a pause, a failover or a node move under way.
    pub busy: Option<String>,
    pub pod: PodState<'a>,
    /// What the pod's containers report when it cannot run (the exit, the last log lines).
    pub trouble: Option<&'a str>,
    /// When the database pod was created: a new version's timeout counts from the later of
    /// its step and its pod, so a pod replaced meanwhile (a failover, a pause and unpause)
    /// gets its whole timeout.
    pub pod_created: Option<Timestamp>,
    pub snapshot: SnapshotState,
    /// Whether the VolumeSnapshot API is served (`None`: not asked).
    pub snapshot_api: Option<bool>,
    pub claim: Option<Claim<'a>>,
    pub now: Timestamp,
}

/// An event to publish with a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Say {
    pub reason: crate::api::EventReason,
    pub message: String,
    pub warning: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// No version change concerns this database.
    None,
    /// Write this record, then go on with the template it names.
    Record(VersionUpgradeStatus, Option<Say>),
    /// The new version ran ready: the record goes.
    Finish(Say),
    /// The image is back to the running version before the new one ran: the record goes.
    Clear(Option<Say>),
    /// Ask for the snapshot the record names.
    CreateSnapshot { name: String },
    /// Keep the PersistentVolume (`Retain`), then delete the claim of this uid.
    ReleaseVolume {
        volume: Option<String>,
        claim_uid: String,
    },
    /// Nothing to do now; look again after this long (`None`: on the next change).
    Wait(Option<Duration>),
}

/// What the StatefulSet runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template<'a> {
    pub image: &'a str,
    /// Zero replicas.
    pub stopped: bool,
}

/// The image and replica count the StatefulSet carries for `record`.
pub fn template<'a>(record: Option<&'a VersionUpgradeStatus>, spec_image: &'a str) -> Template<'a> {
    use VersionUpgradeStep::*;
    let Some(r) = record else {
        return Template {
            image: spec_image,
            stopped: false,
        };
    };
    let (image, stopped) = match r.step {
        Waiting | Held | Restoring | RolledBack => (r.from_image.as_str(), false),
        Stopping | Snapshotting | StoppingNew | ReleasingVolume => (r.from_image.as_str(), true),
        Starting => (r.to_image.as_str(), false),
    };
    Template { image, stopped }
}

/// The snapshot a claim created now must come from (a rollback's claim, never an empty one).
pub fn restore_snapshot(record: Option<&VersionUpgradeStatus>) -> Option<&str> {
    record
        .filter(|r| {
            matches!(
                r.step,
                VersionUpgradeStep::ReleasingVolume | VersionUpgradeStep::Restoring
            )
        })
        .and_then(|r| r.snapshot.as_deref())
}

/// Whether the steps have the database stopped or on its way between versions (the phase says
/// `Upgrading`, nothing else moves it meanwhile).
pub fn in_progress(record: Option<&VersionUpgradeStatus>) -> bool {
    use VersionUpgradeStep::*;
    record.is_some_and(|r| {
        matches!(
            r.step,
            Stopping | Snapshotting | Starting | StoppingNew | ReleasingVolume | Restoring
        )
    })
}

/// `spec.versionUpgrade.readyTimeout`, or the default (the schema admits only readable values).
pub fn ready_timeout(policy: &VersionUpgradeSpec) -> Duration {
    policy
        .ready_timeout
        .as_deref()
        .and_then(|t| crate::duration::parse_duration(t).ok())
        .unwrap_or(DEFAULT_READY_TIMEOUT)
}

/// The pre-upgrade snapshot's name: the database, the version it goes to and the spec
/// generation that asked (a second try of the same version gets its own).
pub fn snapshot_name(db: &str, to_image: &str, generation: i64) -> String {
    let version = crate::desired::version_of(to_image).unwrap_or_else(|| "image".into());
    let version: String = version
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let suffix = format!("-before-{}-{generation}", version.trim_matches(['-', '.']));
    let keep = 253usize.saturating_sub(suffix.len());
    format!("{}{suffix}", &db[..db.len().min(keep)])
}

/// `90s`, `10m`, `2h`: as the spec spells durations.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn at(now: Timestamp) -> Option<Time> {
    Some(Time(now))
}

fn entered(
    r: &VersionUpgradeStatus,
    step: VersionUpgradeStep,
    now: Timestamp,
) -> VersionUpgradeStatus {
    VersionUpgradeStatus {
        step,
        since: at(now),
        ..r.clone()
    }
}

pub fn decide(v: &View) -> Decision {
    use VersionUpgradeStep::*;
    let Some(r) = v.record else {
        return begin(v);
    };
    let set_back = v.spec_image == r.from_image;
    match r.step {
        // Nothing has run on the data yet: the image set back ends it.
        Waiting | Held | Stopping | Snapshotting if set_back => Decision::Clear(None),
        Waiting => match &v.busy {
            Some(why) if r.message.as_deref() != Some(why.as_str()) => Decision::Record(
                VersionUpgradeStatus {
                    message: Some(why.clone()),
                    to_image: v.spec_image.to_string(),
                    ..r.clone()
                },
                None,
            ),
            Some(_) => Decision::Wait(None),
            None => go(v, &r.from_image),
        },
        Held if v.generation > r.generation.unwrap_or(i64::MAX) => go(v, &r.from_image),
        Held => Decision::Wait(None),
        Stopping => match v.pod {
            PodState::Gone => Decision::Record(
                VersionUpgradeStatus {
                    to_image: v.spec_image.to_string(),
                    snapshot: Some(snapshot_name(v.name, v.spec_image, v.generation)),
                    ..entered(r, Snapshotting, v.now)
                },
                None,
            ),
            _ => Decision::Wait(None),
        },
        Snapshotting => snapshotting(v, r),
        Starting => starting(v, r),
        StoppingNew => match (v.pod, v.claim) {
            (PodState::Gone, Some(c)) => Decision::Record(
                VersionUpgradeStatus {
                    claim_uid: Some(c.uid.to_string()),
                    retained_volume: c.volume.map(str::to_string),
                    ..entered(r, ReleasingVolume, v.now)
                },
                None,
            ),
            (PodState::Gone, None) => Decision::Record(entered(r, Restoring, v.now), None),
            _ => Decision::Wait(None),
        },
        ReleasingVolume => match v.claim {
            Some(c) if Some(c.uid) == r.claim_uid.as_deref() => Decision::ReleaseVolume {
                volume: r.retained_volume.clone(),
                claim_uid: c.uid.to_string(),
            },
            // Gone, or already the claim from the snapshot (only that one is created now).
            _ => Decision::Record(entered(r, Restoring, v.now), None),
        },
        Restoring => match (v.pod, v.claim) {
            (PodState::Ready { image }, Some(c))
                if image == r.from_image && Some(c.uid) != r.claim_uid.as_deref() =>
            {
                let message = rolled_back_message(r);
                Decision::Record(
                    VersionUpgradeStatus {
                        generation: Some(v.generation),
                        ..entered(r, RolledBack, v.now)
                    },
                    Some(Say {
                        reason: crate::api::EventReason::VersionRolledBack,
                        message,
                        warning: true,
                    }),
                )
            }
            _ => Decision::Wait(None),
        },
        // The same version after an edit of the spec (the setting that stopped it fixed): one
        // more try, from the version that runs.
        RolledBack
            if v.spec_image == r.to_image && v.generation > r.generation.unwrap_or(i64::MAX) =>
        {
            go(
                &View {
                    record: None,
                    ..v.clone()
                },
                &r.from_image,
            )
        }
        RolledBack if v.spec_image == r.to_image => Decision::Wait(None),
        RolledBack if set_back => Decision::Clear(None),
        // Another version: an upgrade from the version that runs, on the data it runs on.
        RolledBack => go(
            &View {
                record: None,
                ..v.clone()
            },
            &r.from_image,
        ),
    }
}

/// `Snapshotting`: the volume's snapshot is named, cut and waited for; a failed snapshot or a
/// missing API holds the upgrade (the old version runs again).
fn snapshotting(v: &View, r: &VersionUpgradeStatus) -> Decision {
    use VersionUpgradeStep::*;
    let Some(name) = r.snapshot.clone() else {
        // A record without its snapshot's name cannot be cut: name it first.
        return Decision::Record(
            VersionUpgradeStatus {
                snapshot: Some(snapshot_name(v.name, &r.to_image, v.generation)),
                ..r.clone()
            },
            None,
        );
    };
    match &v.snapshot {
        SnapshotState::Absent => Decision::CreateSnapshot { name },
        SnapshotState::NotLooked | SnapshotState::Pending { cut: false } => {
            Decision::Wait(Some(SNAPSHOT_POLL))
        }
        SnapshotState::Pending { cut: true } | SnapshotState::Ready => Decision::Record(
            VersionUpgradeStatus {
                to_image: v.spec_image.to_string(),
                ..entered(r, Starting, v.now)
            },
            None,
        ),
        SnapshotState::Failed(why) => held(v, r, format!("the snapshot {name} failed: {why}")),
        SnapshotState::ApiMissing => held(v, r, API_MISSING.to_string()),
    }
}

const API_MISSING: &str = "the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not served, so no snapshot can be taken before the new version runs; install the CSI snapshot CRDs and controller, or set spec.versionUpgrade.backup: Skip to upgrade without a way back";

fn held(v: &View, r: &VersionUpgradeStatus, why: String) -> Decision {
    let message = format!(
        "{why}; the database runs {} again. Edit the spec to try again",
        r.from_image
    );
    Decision::Record(
        VersionUpgradeStatus {
            message: Some(message.clone()),
            generation: Some(v.generation),
            snapshot: None,
            ..entered(r, VersionUpgradeStep::Held, v.now)
        },
        Some(Say {
            reason: crate::api::EventReason::VersionUpgradeHeld,
            message: format!("upgrade to {} held: {message}", r.to_image),
            warning: true,
        }),
    )
}

/// `ReleasingVolume` refused to keep the volume (`refusal`: a namespaced install may not patch
/// PersistentVolumes): the claim is not replaced, the old version runs on the data as the new
/// one left it, and the snapshot stays for a restore into a new QuestDB.
pub fn volume_not_kept(r: &VersionUpgradeStatus, refusal: &str) -> (VersionUpgradeStatus, Say) {
    let why = format!(
        "the operator may not keep the volume the new version ran on ({refusal}), so its claim is not replaced: {} runs on the data as the new version left it; if it cannot read it, restore the snapshot {} into a new QuestDB (spec.volume.restoreFrom.volumeSnapshot)",
        r.from_image,
        r.snapshot.as_deref().unwrap_or_default()
    );
    let next = VersionUpgradeStatus {
        step: VersionUpgradeStep::Restoring,
        claim_uid: None,
        retained_volume: None,
        message: Some(format!(
            "{}; {why}",
            r.message.as_deref().unwrap_or_default()
        )),
        ..r.clone()
    };
    let say = Say {
        reason: crate::api::EventReason::VersionRollingBack,
        message: why,
        warning: true,
    };
    (next, say)
}

/// A record for a change of image, if the database has run on another one.
fn begin(v: &View) -> Decision {
    match v.statefulset_image {
        Some(running) if running != v.spec_image && v.has_data => go(v, running),
        _ => Decision::None,
    }
}

/// The first step of an upgrade from `from` to the spec's image.
fn go(v: &View, from: &str) -> Decision {
    let fresh = VersionUpgradeStatus {
        from_image: from.to_string(),
        to_image: v.spec_image.to_string(),
        ..VersionUpgradeStatus::default()
    };
    use VersionUpgradeStep::*;
    if let Some(why) = &v.busy {
        return Decision::Record(
            VersionUpgradeStatus {
                message: Some(why.clone()),
                ..entered(&fresh, Waiting, v.now)
            },
            None,
        );
    }
    if v.policy.backup == UpgradeBackup::Skip {
        return Decision::Record(entered(&fresh, Starting, v.now), None);
    }
    if v.snapshot_api == Some(false) {
        return held(v, &fresh, API_MISSING.to_string());
    }
    Decision::Record(entered(&fresh, Stopping, v.now), None)
}

fn starting(v: &View, r: &VersionUpgradeStatus) -> Decision {
    use VersionUpgradeStep::*;
    let since = starting_since(r, v.pod_created, v.now);
    let timeout = ready_timeout(v.policy);
    let overdue = v.now.duration_since(since).unsigned_abs() >= timeout;
    let why = if v.spec_image != r.to_image {
        format!(
            "spec.image changed to {} while {} started",
            v.spec_image, r.to_image
        )
    } else {
        match v.pod {
            PodState::Ready { image } if image == r.to_image => {
                return Decision::Finish(Say {
                    reason: crate::api::EventReason::VersionUpgraded,
                    message: format!(
                        "{} runs ready (was {}){}",
                        r.to_image,
                        r.from_image,
                        r.snapshot
                            .as_deref()
                            .map(|s| format!("; the snapshot {s} of the data before it is kept"))
                            .unwrap_or_default()
                    ),
                    warning: false,
                })
            }
            _ if !overdue => {
                let left = timeout.saturating_sub(v.now.duration_since(since).unsigned_abs());
                return Decision::Wait(Some(left.max(Duration::from_secs(1))));
            }
            _ => format!(
                "{} was not ready within {}{}",
                r.to_image,
                human(timeout),
                v.trouble.map(|t| format!(" ({t})")).unwrap_or_default()
            ),
        }
    };
    let ran = !matches!(v.pod, PodState::NotReady { ran: false });
    match &r.snapshot {
        // The new version never started (its image was never pulled): nothing touched the
        // data, the old version goes back on it as it is.
        Some(_) | None if !ran && v.pod != PodState::Gone => Decision::Record(
            VersionUpgradeStatus {
                message: Some(format!("{why}; it never started, so the data is as it was")),
                generation: Some(v.generation),
                ..entered(r, RolledBack, v.now)
            },
            Some(Say {
                reason: crate::api::EventReason::VersionRolledBack,
                message: format!(
                    "{why}; it never started: {} runs again on the data as it was",
                    r.from_image
                ),
                warning: true,
            }),
        ),
        Some(_) => Decision::Record(
            VersionUpgradeStatus {
                message: Some(why.clone()),
                ..entered(r, StoppingNew, v.now)
            },
            Some(Say {
                reason: crate::api::EventReason::VersionRollingBack,
                message: format!(
                    "{why}: rolling back to {} and the data as it was when it stopped",
                    r.from_image
                ),
                warning: true,
            }),
        ),
        // No snapshot: the image set back runs the old version on the data as it is, which
        // the user chose with `backup: Skip`.
        None if v.spec_image == r.from_image => Decision::Clear(Some(Say {
            reason: crate::api::EventReason::VersionRolledBack,
            message: format!(
                "{why}: {} runs again on the data as {} left it (no snapshot: backup Skip)",
                r.from_image, r.to_image
            ),
            warning: true,
        })),
        // Another version instead, without a snapshot: it starts now.
        None if v.spec_image != r.to_image => Decision::Record(
            VersionUpgradeStatus {
                to_image: v.spec_image.to_string(),
                ..entered(r, Starting, v.now)
            },
            None,
        ),
        // Overdue without a snapshot: a person decides (the condition says so).
        None => Decision::Wait(None),
    }
}

/// When the new version's timeout began: its step, or its pod if that came later.
fn starting_since(
    r: &VersionUpgradeStatus,
    pod_created: Option<Timestamp>,
    now: Timestamp,
) -> Timestamp {
    let step = r.since.as_ref().map(|t| t.0).unwrap_or(now);
    pod_created.map_or(step, |p| p.max(step))
}

fn rolled_back_message(r: &VersionUpgradeStatus) -> String {
    let mut m = format!(
        "{}; {} runs again on the data from the snapshot {} taken when it stopped",
        r.message.as_deref().unwrap_or("rolled back"),
        r.from_image,
        r.snapshot.as_deref().unwrap_or("?")
    );
    if let Some(pv) = &r.retained_volume {
        m.push_str(&format!(
            "; the volume {} ran on is kept as PersistentVolume {pv} (reclaim policy Retain): delete it once it is not needed",
            r.to_image
        ));
    }
    m.push_str(&format!(
        ". spec.image still names {}: set it to {} or to another version, or fix what stopped it and edit the spec to try again",
        r.to_image, r.from_image
    ));
    m
}

/// The `VersionUpgrade` condition while a record exists (`overdue`: the new version is past
/// its timeout with no snapshot to go back to).
pub fn verdict(
    r: &VersionUpgradeStatus,
    policy: &VersionUpgradeSpec,
    pod_created: Option<Timestamp>,
    now: Timestamp,
) -> Verdict<VersionUpgradeReason> {
    use VersionUpgradeReason as R;
    use VersionUpgradeStep::*;
    let (from, to) = (&r.from_image, &r.to_image);
    let message = r.message.clone().unwrap_or_default();
    match r.step {
        Waiting => Verdict::new(
            false,
            R::Waiting,
            format!("the upgrade from {from} to {to} waits: {message}"),
        ),
        Stopping => Verdict::new(
            false,
            R::BackingUp,
            format!("stopping {from} to snapshot its volume before {to} runs"),
        ),
        Snapshotting => Verdict::new(
            false,
            R::BackingUp,
            format!(
                "cutting the snapshot {} of the volume {from} left",
                r.snapshot.as_deref().unwrap_or_default()
            ),
        ),
        Starting => {
            let since = starting_since(r, pod_created, now);
            let timeout = ready_timeout(policy);
            if r.snapshot.is_none() && now.duration_since(since).unsigned_abs() >= timeout {
                Verdict::new(
                    false,
                    R::NotReadyNoSnapshot,
                    format!(
                        "{to} was not ready within {} and there is no snapshot to go back to (backup: Skip): fix what stops it, or set spec.image back to {from} to run it on the data as {to} left it",
                        human(timeout)
                    ),
                )
            } else {
                Verdict::new(
                    false,
                    R::StartingNewVersion,
                    format!(
                        "{to} is starting; {} if it is not ready within {}",
                        if r.snapshot.is_some() {
                            format!("the database goes back to {from} and its data")
                        } else {
                            "nothing goes back (backup: Skip)".to_string()
                        },
                        human(timeout)
                    ),
                )
            }
        }
        StoppingNew | ReleasingVolume | Restoring => Verdict::new(
            false,
            R::RollingBack,
            format!("{message}: rolling back to {from} ({})", r.step),
        ),
        RolledBack => Verdict::new(
            false,
            R::RolledBack,
            // Restored (a claim released): the snapshot and the kept volume are named.
            if r.claim_uid.is_some() {
                rolled_back_message(r)
            } else {
                format!(
                    "{message}{}. spec.image still names {to}: set it to {from} or to another version, or fix what stopped it and edit the spec to try again",
                    r.snapshot
                        .as_deref()
                        .map(|s| format!("; the snapshot {s} of the data before it is kept"))
                        .unwrap_or_default()
                )
            },
        ),
        Held => Verdict::new(false, R::SnapshotFailed, message),
    }
}

#[cfg(test)]
#[path = "version_upgrade_tests.rs"]
mod tests;
