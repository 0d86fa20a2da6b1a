//! A disk that grows before it fills (`spec.volume.autoGrow`), as a pure decision: from the
//! file system's usage (the kubelet's volume statistics), the claim's request and capacity,
//! the WAL tables QuestDB reports suspended and the last record, what to ask of the claim,
//! which tables to resume, what `status.disk` and the `DiskSpace` condition say.
//!
//! A full volume makes QuestDB suspend the WAL tables whose apply it broke (the message is
//! QuestDB's, often without the `DISK FULL` tag) and refuse writes. So a table is counted as
//! suspended by the disk when it is tagged so, or when it is seen suspended while the volume
//! is past its threshold; those are resumed once the volume is below it again, and only once:
//! a resumed table leaves the record, so one that is suspended again while there is room (for
//! another reason) is left to `WriteHealthy` and a person.

use crate::api::{AutoGrowSpec, DiskGrowth, DiskSpaceReason, DiskStatus};
use crate::desired::quantity::parse_quantity;
use crate::plan::conditions::Verdict;

/// A claim's file system, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeUsage {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
}

/// The threshold without `autoGrow`: past it `DiskSpace` is False `Filling`.
pub const DEFAULT_THRESHOLD_PERCENT: i32 = 80;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A WAL table QuestDB reports suspended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuspendedTable {
    pub name: String,
    /// `wal_tables().errorTag` is `DISK FULL`.
    pub disk_full: bool,
}

/// What the operator sees of one database's volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The file system's usage, or why it is unknown.
    pub usage: Option<Result<VolumeUsage, String>>,
    /// What the claim requests (bytes).
    pub requested: Option<u64>,
    /// What the claim's status says it has (bytes): below `requested` while it is expanded.
    pub claim_capacity: Option<u64>,
    /// QuestDB's suspended WAL tables, when it answered.
    pub suspended: Option<Vec<SuspendedTable>>,
}

/// What to do and to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// `status.disk` (unchanged when the usage is unknown).
    pub status: Option<DiskStatus>,
    pub condition: Option<Verdict<DiskSpaceReason>>,
    /// The size (bytes) to request of the claim.
    pub grow_to: Option<u64>,
    /// Tables to `RESUME WAL`.
    pub resume: Vec<String>,
}

/// The decision. `previous`: the last `status.disk`.
pub fn decide(
    auto_grow: Option<&AutoGrowSpec>,
    obs: &Observed,
    previous: Option<&DiskStatus>,
) -> Plan {
    let usage = match &obs.usage {
        None => {
            return Plan {
                status: previous.cloned(),
                condition: None,
                grow_to: None,
                resume: vec![],
            }
        }
        Some(Err(why)) => {
            return Plan {
                status: previous.cloned(),
                condition: Some(Verdict::new(
                    false,
                    DiskSpaceReason::UsageUnknown,
                    format!("the volume's usage cannot be read: {why}"),
                )),
                grow_to: None,
                resume: vec![],
            }
        }
        Some(Ok(u)) => *u,
    };
    let threshold = auto_grow.map_or(DEFAULT_THRESHOLD_PERCENT, |a| a.threshold_percent);
    let percent = used_percent(usage);
    let full = percent >= threshold;

    // Suspended by the disk: recorded before, seen suspended while full, or tagged so.
    let (suspended_when_full, resume) = match &obs.suspended {
        // QuestDB did not answer: the record stands, nothing is resumed blind.
        None => (
            previous
                .map(|p| p.suspended_when_full.clone())
                .unwrap_or_default(),
            vec![],
        ),
        Some(now) => {
            let recorded = previous
                .map(|p| p.suspended_when_full.as_slice())
                .unwrap_or(&[]);
            let mut tables: Vec<String> = now
                .iter()
                .filter(|t| full || t.disk_full || recorded.contains(&t.name))
                .map(|t| t.name.clone())
                .collect();
            tables.sort();
            tables.dedup();
            if full {
                (tables, vec![])
            } else {
                (vec![], tables)
            }
        }
    };
    // A growth asked before is under way until the file system is larger than it was then.
    let growing = previous
        .and_then(|p| p.growth.as_ref())
        .filter(|g| usage.capacity <= u64::try_from(g.from_capacity_bytes).unwrap_or(0));
    let mut status = DiskStatus {
        capacity: quantity(usage.capacity),
        used_percent: percent,
        suspended_when_full,
        growth: growing.cloned(),
    };
    let of = format!("{percent}% of {} used", quantity(usage.capacity));
    let (verdict, grow_to) = match auto_grow {
        _ if !full => (
            Verdict::new(
                true,
                DiskSpaceReason::Room,
                format!("{of} (threshold {threshold}%)"),
            ),
            None,
        ),
        None => (
            Verdict::new(
                false,
                DiskSpaceReason::Filling,
                format!(
                    "{of}, past {threshold}%: grow spec.volume.size, free space, or set spec.volume.autoGrow"
                ),
            ),
            None,
        ),
        Some(_) if growing.is_some() => (
            Verdict::new(
                true,
                DiskSpaceReason::Growing,
                format!(
                    "{of}; the volume is being expanded to {}",
                    growing.map(|g| g.to.as_str()).unwrap_or_default()
                ),
            ),
            None,
        ),
        Some(a) => grow(a, obs, &of),
    };
    if let Some(target) = grow_to {
        status.growth = Some(DiskGrowth {
            to: quantity(target),
            from_capacity_bytes: i64::try_from(usage.capacity).unwrap_or(i64::MAX),
        });
    }
    Plan {
        status: Some(status),
        condition: Some(verdict),
        grow_to,
        resume,
    }
}

/// Past the threshold with `autoGrow`: the next size, or why there is none.
fn grow(a: &AutoGrowSpec, obs: &Observed, of: &str) -> (Verdict<DiskSpaceReason>, Option<u64>) {
    let Some(requested) = obs.requested else {
        return (
            Verdict::new(
                false,
                DiskSpaceReason::Filling,
                format!("{of}; the claim's size is not known yet"),
            ),
            None,
        );
    };
    if obs.claim_capacity.is_some_and(|c| c < requested) {
        // The storage is still expanding the last step: one at a time.
        return (
            Verdict::new(
                true,
                DiskSpaceReason::Growing,
                format!(
                    "{of}; the volume is being expanded to {}",
                    quantity(requested)
                ),
            ),
            None,
        );
    }
    let maximum = parse_quantity(&a.maximum).map(|m| m as u64).unwrap_or(0);
    if requested >= maximum {
        return (
            Verdict::new(
                false,
                DiskSpaceReason::AtMaximum,
                format!(
                    "{of}; the volume requests {}, autoGrow.maximum is {}",
                    quantity(requested),
                    a.maximum
                ),
            ),
            None,
        );
    }
    let target = next_size(requested, a.step_percent, maximum);
    (
        Verdict::new(
            true,
            DiskSpaceReason::Growing,
            format!(
                "{of}; the claim grows from {} to {}",
                quantity(requested),
                quantity(target)
            ),
        ),
        Some(target),
    )
}

/// `requested` grown by `step_percent`, in whole MiB (whole GiB from 1 GiB up, as EBS sizes
/// volumes), never more than `maximum` nor less than one unit more.
pub fn next_size(requested: u64, step_percent: i32, maximum: u64) -> u64 {
    let grown = requested.saturating_add(requested / 100 * step_percent.max(1) as u64);
    let unit = if grown >= GIB { GIB } else { MIB };
    let rounded = grown.div_ceil(unit) * unit;
    rounded.max(requested + unit).min(maximum)
}

/// The StorageClass cannot expand the volume: what is said instead of growing.
pub fn not_expandable(plan: Plan, class: &str) -> Plan {
    let message = plan
        .condition
        .as_ref()
        .map(|v| v.message.split(';').next().unwrap_or_default().to_string())
        .unwrap_or_default();
    Plan {
        condition: Some(Verdict::new(
            false,
            DiskSpaceReason::NotExpandable,
            format!("{message}; StorageClass {class} does not allow volume expansion"),
        )),
        grow_to: None,
        // Nothing was grown: no growth to wait for.
        status: plan.status.map(|s| DiskStatus { growth: None, ..s }),
        ..plan
    }
}

/// How full, in whole percent, rounded up: 79.1% is 80%, past an 80% threshold.
pub fn used_percent(u: VolumeUsage) -> i32 {
    if u.capacity == 0 {
        return 0;
    }
    // The file system's own "used" (blocks - free) may count blocks reserved from ordinary
    // users; what a writer can still get is `available`.
    let taken = u.capacity.saturating_sub(u.available).max(u.used);
    ((taken as u128 * 100).div_ceil(u.capacity as u128)).min(100) as i32
}

/// A size as a quantity: whole GiB when it is one, else MiB (rounded down).
pub fn quantity(bytes: u64) -> String {
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{}Gi", bytes / GIB)
    } else {
        format!("{}Mi", bytes / MIB)
    }
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
