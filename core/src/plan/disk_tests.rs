use super::*;

const MI: u64 = MIB;

fn grow_up_to(maximum: &str) -> AutoGrowSpec {
    AutoGrowSpec {
        threshold_percent: 80,
        step_percent: 50,
        maximum: maximum.into(),
    }
}

fn usage(capacity_mi: u64, percent_full: u64) -> VolumeUsage {
    let capacity = capacity_mi * MI;
    let used = capacity / 100 * percent_full;
    VolumeUsage {
        capacity,
        available: capacity - used,
        used,
    }
}

fn observed(u: VolumeUsage, requested_mi: u64, suspended: &[(&str, bool)]) -> Observed {
    Observed {
        usage: Some(Ok(u)),
        requested: Some(requested_mi * MI),
        claim_capacity: Some(requested_mi * MI),
        suspended: Some(
            suspended
                .iter()
                .map(|(n, tag)| SuspendedTable {
                    name: n.to_string(),
                    disk_full: *tag,
                })
                .collect(),
        ),
    }
}

fn recorded(tables: &[&str]) -> DiskStatus {
    DiskStatus {
        capacity: "320Mi".into(),
        used_percent: 95,
        suspended_when_full: tables.iter().map(|t| t.to_string()).collect(),
        growth: None,
    }
}

#[test]
fn a_volume_past_its_threshold_grows_by_a_step_before_it_fills() {
    let a = grow_up_to("1Gi");
    let plan = decide(Some(&a), &observed(usage(320, 85), 320, &[]), None);
    assert_eq!(plan.grow_to, Some(480 * MI));
    let v = plan.condition.unwrap();
    assert_eq!((v.status, v.reason), (true, DiskSpaceReason::Growing));
    assert!(
        v.message.contains("85% of 320Mi used") && v.message.contains("to 480Mi"),
        "{}",
        v.message
    );
    assert_eq!(plan.status.unwrap().used_percent, 85);
}

#[test]
fn a_volume_below_its_threshold_is_left_alone() {
    let a = grow_up_to("1Gi");
    let plan = decide(Some(&a), &observed(usage(320, 79), 320, &[]), None);
    assert_eq!(plan.grow_to, None);
    assert_eq!(plan.condition.unwrap().reason, DiskSpaceReason::Room);
}

#[test]
fn a_growth_under_way_is_not_stacked_with_another() {
    let a = grow_up_to("1Gi");
    let mut obs = observed(usage(320, 90), 480, &[]);
    obs.claim_capacity = Some(320 * MI);
    let plan = decide(Some(&a), &obs, None);
    assert_eq!(plan.grow_to, None);
    let v = plan.condition.unwrap();
    assert_eq!((v.status, v.reason), (true, DiskSpaceReason::Growing));
}

#[test]
fn growth_stops_at_the_maximum_and_says_so() {
    let a = grow_up_to("400Mi");
    let plan = decide(Some(&a), &observed(usage(320, 90), 320, &[]), None);
    assert_eq!(plan.grow_to, Some(400 * MI), "capped at the maximum");
    let plan = decide(Some(&a), &observed(usage(400, 90), 400, &[]), None);
    assert_eq!(plan.grow_to, None);
    let v = plan.condition.unwrap();
    assert_eq!((v.status, v.reason), (false, DiskSpaceReason::AtMaximum));
    assert!(v.message.contains("400Mi"), "{}", v.message);
}

#[test]
fn without_auto_grow_a_filling_volume_is_reported_and_never_grown() {
    let plan = decide(None, &observed(usage(320, 85), 320, &[]), None);
    assert_eq!(plan.grow_to, None);
    let v = plan.condition.unwrap();
    assert_eq!((v.status, v.reason), (false, DiskSpaceReason::Filling));
}

#[test]
fn tables_suspended_while_full_are_recorded_and_resumed_once_there_is_room() {
    let a = grow_up_to("400Mi");
    // Full at the maximum: the suspended table is recorded, nothing is resumed.
    let full = decide(
        Some(&a),
        &observed(usage(400, 96), 400, &[("trades", false)]),
        None,
    );
    assert!(full.resume.is_empty());
    let record = full.status.unwrap();
    assert_eq!(record.suspended_when_full, vec!["trades".to_string()]);
    // Room again (the maximum raised and the volume grown): resumed, and out of the record.
    let a = grow_up_to("1Gi");
    let room = decide(
        Some(&a),
        &observed(usage(600, 60), 600, &[("trades", false)]),
        Some(&record),
    );
    assert_eq!(room.resume, vec!["trades".to_string()]);
    assert!(room.status.unwrap().suspended_when_full.is_empty());
}

#[test]
fn a_table_suspended_with_room_to_spare_is_never_resumed_by_the_operator() {
    let plan = decide(
        Some(&grow_up_to("1Gi")),
        &observed(usage(320, 40), 320, &[("broken", false)]),
        None,
    );
    assert!(plan.resume.is_empty());
    assert!(plan.status.unwrap().suspended_when_full.is_empty());
}

#[test]
fn a_table_resumed_once_and_suspended_again_with_room_is_not_resumed_again() {
    // The last round resumed it (the record no longer holds it); it is suspended again.
    let after_resume = DiskStatus {
        suspended_when_full: vec![],
        ..recorded(&[])
    };
    let plan = decide(
        Some(&grow_up_to("1Gi")),
        &observed(usage(600, 60), 600, &[("trades", false)]),
        Some(&after_resume),
    );
    assert!(plan.resume.is_empty());
}

#[test]
fn a_table_tagged_disk_full_is_resumed_even_if_the_operator_never_saw_the_volume_full() {
    let plan = decide(
        Some(&grow_up_to("1Gi")),
        &observed(usage(600, 50), 600, &[("trades", true), ("other", false)]),
        None,
    );
    assert_eq!(plan.resume, vec!["trades".to_string()]);
}

#[test]
fn when_questdb_does_not_answer_the_record_stands_and_nothing_is_resumed() {
    let mut obs = observed(usage(600, 50), 600, &[]);
    obs.suspended = None;
    let plan = decide(Some(&grow_up_to("1Gi")), &obs, Some(&recorded(&["trades"])));
    assert!(plan.resume.is_empty());
    assert_eq!(
        plan.status.unwrap().suspended_when_full,
        vec!["trades".to_string()]
    );
}

#[test]
fn unreadable_usage_keeps_the_record_and_says_why() {
    let obs = Observed {
        usage: Some(Err("the kubelet refused the operator (403)".into())),
        ..Observed::default()
    };
    let plan = decide(Some(&grow_up_to("1Gi")), &obs, Some(&recorded(&["t"])));
    assert_eq!(plan.status, Some(recorded(&["t"])));
    assert_eq!(plan.grow_to, None);
    let v = plan.condition.unwrap();
    assert_eq!((v.status, v.reason), (false, DiskSpaceReason::UsageUnknown));
    assert!(v.message.contains("403"));
    let none = decide(None, &Observed::default(), None);
    assert_eq!(
        (none.condition, none.status),
        (None, None),
        "not polled yet: nothing said"
    );
}

#[test]
fn a_class_that_cannot_expand_turns_the_growth_into_a_warning() {
    let plan = decide(
        Some(&grow_up_to("1Gi")),
        &observed(usage(320, 90), 320, &[]),
        None,
    );
    let plan = not_expandable(plan, "gp3-fixed");
    assert_eq!(plan.grow_to, None);
    assert_eq!(
        plan.status.as_ref().unwrap().growth,
        None,
        "nothing to wait for"
    );
    let v = plan.condition.unwrap();
    assert_eq!(
        (v.status, v.reason),
        (false, DiskSpaceReason::NotExpandable)
    );
    assert!(
        v.message.contains("gp3-fixed") && v.message.contains("90%"),
        "{}",
        v.message
    );
}

#[test]
fn steps_round_up_to_whole_units_and_always_grow() {
    assert_eq!(next_size(320 * MI, 50, u64::MAX), 480 * MI);
    assert_eq!(next_size(100 * GIB, 50, u64::MAX), 150 * GIB);
    assert_eq!(
        next_size(800 * MI, 50, u64::MAX),
        2 * GIB,
        "past 1 GiB: whole GiB"
    );
    assert_eq!(next_size(10 * MI, 10, u64::MAX), 11 * MI);
    assert_eq!(
        next_size(50 * MI, 1, u64::MAX),
        51 * MI,
        "at least one unit"
    );
}

#[test]
fn usage_counts_what_a_writer_can_no_longer_get_rounded_up() {
    // 5% reserved from ordinary users: used 75%, but only 20% is still available.
    let u = VolumeUsage {
        capacity: 100 * MI,
        available: 20 * MI,
        used: 75 * MI,
    };
    assert_eq!(used_percent(u), 80);
    let u = VolumeUsage {
        capacity: 1000,
        available: 209,
        used: 791,
    };
    assert_eq!(used_percent(u), 80, "79.1% is past an 80% threshold");
    assert_eq!(quantity(320 * MI), "320Mi");
    assert_eq!(quantity(2 * GIB), "2Gi");
}

#[test]
fn a_look_at_the_file_system_from_before_a_growth_never_asks_for_another() {
    let a = grow_up_to("2Gi");
    let first = decide(Some(&a), &observed(usage(320, 96), 320, &[]), None);
    assert_eq!(first.grow_to, Some(480 * MI));
    let record = first.status.unwrap();
    let growth = record.growth.clone().expect("recorded before it is asked");
    assert_eq!(growth.to, "480Mi");
    // The claim's capacity already says 480Mi, but the file system seen is the old one.
    let stale = decide(Some(&a), &observed(usage(320, 96), 480, &[]), Some(&record));
    assert_eq!(stale.grow_to, None);
    assert_eq!(stale.condition.unwrap().reason, DiskSpaceReason::Growing);
    assert_eq!(stale.status.unwrap().growth, Some(growth));
    // The file system grew: the record goes, and a volume still past its threshold grows on.
    let grown = decide(Some(&a), &observed(usage(480, 90), 480, &[]), Some(&record));
    assert_eq!(grown.grow_to, Some(720 * MI));
    let grown = decide(Some(&a), &observed(usage(480, 50), 480, &[]), Some(&record));
    assert_eq!(grown.status.unwrap().growth, None);
}
