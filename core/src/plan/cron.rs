//! Five-field cron expressions (minute hour day-of-month month day-of-week), evaluated in UTC,
//! with the semantics of Kubernetes CronJobs (robfig/cron's standard parser): `*`, lists,
//! ranges, steps (`*/15`, `1-30/5`), month and weekday names, `7` for Sunday, the `@hourly`
//! family, and day-of-month OR day-of-week when both are restricted.

use k8s_openapi::jiff::civil::{Date, DateTime, Time};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, ToSpan};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Whether day-of-month / day-of-week were `*` (then only the other one restricts).
    any_day: bool,
    any_weekday: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl std::str::FromStr for Cron {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let expanded = match s {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(format!(
                "{s:?} is not a cron schedule: five fields (minute hour day-of-month month day-of-week) or @hourly/@daily/@weekly/@monthly/@yearly"
            ));
        };
        let weekdays = field(weekday, 0, 7, &WEEKDAYS, 0)?;
        // 7 is Sunday too.
        let weekdays = (weekdays | (weekdays >> 7)) & 0x7f;
        Ok(Cron {
            minutes: field(minute, 0, 59, &[], 0)?,
            hours: field(hour, 0, 23, &[], 0)? as u32,
            days: field(day, 1, 31, &[], 1)? as u32,
            months: field(month, 1, 12, &MONTHS, 1)? as u16,
            weekdays: weekdays as u8,
            any_day: day == "*" || day == "?",
            any_weekday: weekday == "*" || weekday == "?",
        })
    }
}

/// One field as a bit set (bit `v` for value `v`). `names[i]` stands for `i + name_base`.
fn field(text: &str, min: u32, max: u32, names: &[&str], name_base: u32) -> Result<u64, String> {
    let value = |v: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
            return Ok(i as u32 + name_base);
        }
        let n: u32 = v
            .parse()
            .map_err(|_| format!("{v:?} is not a number in {text:?}"))?;
        if n < min || n > max {
            return Err(format!("{n} is outside {min}-{max} in {text:?}"));
        }
        Ok(n)
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{s:?} is not a step in {text:?}"))?;
                (r, step)
            }
            None => (part, 1),
        };
        let (lo, hi) = match range {
            "*" | "?" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/15` means from 5 to the end, every 15.
                None if step > 1 => (value(r)?, max),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if lo > hi {
            return Err(format!("{range:?} runs backwards in {text:?}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl Cron {
    fn day_matches(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.any_day, self.any_weekday) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        }
    }

    /// The first scheduled minute strictly after `t`; `None` when none comes within five
    /// years (`0 0 30 2 *`).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let start = t.to_zoned(TimeZone::UTC).datetime();
        let mut date = start.date();
        for _ in 0..(366 * 5) {
            if self.day_matches(date) {
                for hour in 0..24u8 {
                    if self.hours & (1 << hour) == 0 {
                        continue;
                    }
                    for minute in 0..60u8 {
                        if self.minutes & (1 << minute) == 0 {
                            continue;
                        }
                        let at = DateTime::from_parts(
                            date,
                            Time::new(hour as i8, minute as i8, 0, 0).ok()?,
                        );
                        if at > start {
                            return at.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp());
                        }
                    }
                }
            }
            date = date.checked_add(1.day()).ok()?;
        }
        None
    }

    /// The shortest time between two runs over the year after `from` (at most 3,000 runs
    /// looked at: a schedule that dense has shown its shortest gap long before), `None` for a
    /// schedule that runs once or never in that year.
    pub fn shortest_gap(&self, from: Timestamp) -> Option<std::time::Duration> {
        let end = from
            .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(24 * 366))
            .ok()?;
        let mut shortest: Option<std::time::Duration> = None;
        let mut previous = self.next_after(from)?;
        for _ in 0..3_000 {
            let Some(next) = self.next_after(previous).filter(|n| *n <= end) else {
                break;
            };
            let gap = std::time::Duration::try_from(next.duration_since(previous)).ok()?;
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            previous = next;
        }
        shortest
    }

    /// The newest scheduled minute in `(after, now]`, if any.
    pub fn latest_between(&self, after: Timestamp, now: Timestamp) -> Option<Timestamp> {
        // Far behind (an old lastScheduleTime): a frequent schedule has its newest run in the
        // last day; only a sparser one (weekly, monthly) needs the whole stretch walked.
        let floor = now
            .checked_sub(24.hours())
            .ok()
            .filter(|f| *f > after)
            .unwrap_or(after);
        self.latest_in(floor, now).or_else(|| {
            (floor > after)
                .then(|| self.latest_in(after, floor))
                .flatten()
        })
    }

    fn latest_in(&self, after: Timestamp, until: Timestamp) -> Option<Timestamp> {
        let mut latest = None;
        let mut t = after;
        while let Some(next) = self.next_after(t) {
            if next > until {
                break;
            }
            latest = Some(next);
            t = next;
        }
        latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_shortest_gap_between_runs_is_found_wherever_it_falls() {
        let from = at("2026-11-24T08:07:30Z");
        let minutes = |m: u64| Some(std::time::Duration::from_secs(m * 60));
        assert_eq!(cron("* * * * *").shortest_gap(from), minutes(1));
        assert_eq!(cron("*/15 * * * *").shortest_gap(from), minutes(15));
        // Uneven minutes: the short gap is the one that counts.
        assert_eq!(cron("0,5 * * * *").shortest_gap(from), minutes(5));
        assert_eq!(cron("0 2 * * *").shortest_gap(from), minutes(24 * 60));
        // Only at the turn of a month: the 31st, then the 1st.
        assert_eq!(cron("0 0 1,31 * *").shortest_gap(from), minutes(24 * 60));
        assert_eq!(cron("0 0 30 2 *").shortest_gap(from), None);
    }

    fn cron(s: &str) -> Cron {
        s.parse().unwrap()
    }

    #[test]
    fn the_next_run_is_the_first_matching_minute_after_now_in_utc() {
        assert_eq!(
            cron("*/15 * * * *").next_after(at("2026-11-24T08:07:30Z")),
            Some(at("2026-11-24T08:15:00Z"))
        );
        assert_eq!(
            cron("0 2 * * *").next_after(at("2026-11-24T02:00:00Z")),
            Some(at("2026-11-25T02:00:00Z")),
            "strictly after"
        );
        assert_eq!(
            cron("@weekly").next_after(at("2026-11-24T08:00:00Z")),
            Some(at("2026-11-29T00:00:00Z")),
            "Sunday"
        );
        assert_eq!(
            cron("30 4 1 jan,jul *").next_after(at("2026-11-24T08:00:00Z")),
            Some(at("2027-01-01T04:30:00Z"))
        );
        assert_eq!(
            cron("0 0 30 2 *").next_after(at("2026-11-24T08:00:00Z")),
            None
        );
    }

    #[test]
    fn day_of_month_and_weekday_widen_each_other_as_in_a_cronjob() {
        // The 1st, or any Monday.
        let c = cron("0 0 1 * mon");
        assert_eq!(
            c.next_after(at("2026-11-24T08:00:00Z")),
            Some(at("2026-11-30T00:00:00Z"))
        );
        assert_eq!(cron("0 0 * * 7"), cron("0 0 * * 0"), "7 is Sunday");
    }

    #[test]
    fn mistakes_are_refused_with_a_message_that_says_what() {
        for bad in [
            "* * * *",
            "61 * * * *",
            "*/0 * * * *",
            "5-1 * * * *",
            "x * * * *",
        ] {
            let e = bad.parse::<Cron>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn the_newest_missed_run_is_found_however_long_ago_the_last_was() {
        let c = cron("* * * * *");
        assert_eq!(
            c.latest_between(at("2026-11-20T00:00:00Z"), at("2026-11-24T08:07:30Z")),
            Some(at("2026-11-24T08:07:00Z"))
        );
        assert_eq!(
            c.latest_between(at("2026-11-24T08:07:00Z"), at("2026-11-24T08:07:30Z")),
            None
        );
        let monthly = cron("@monthly");
        assert_eq!(
            monthly.latest_between(at("2026-09-15T00:00:00Z"), at("2026-11-24T08:00:00Z")),
            Some(at("2026-11-01T00:00:00Z"))
        );
    }
}
