//! Weekly maintenance windows (`spec.node.maintenanceWindow`, UTC): whether one is open now,
//! else when it next opens. Pure.

use std::time::Duration;

use k8s_openapi::jiff::civil::Weekday;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp, ToSpan};

use crate::api::MaintenanceWindow;
use crate::duration::parse_duration;

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowState {
    Open,
    OpensAt(Timestamp),
}

fn weekday(name: &str) -> Option<Weekday> {
    Some(match name {
        "Mon" => Weekday::Monday,
        "Tue" => Weekday::Tuesday,
        "Wed" => Weekday::Wednesday,
        "Thu" => Weekday::Thursday,
        "Fri" => Weekday::Friday,
        "Sat" => Weekday::Saturday,
        "Sun" => Weekday::Sunday,
        _ => return None,
    })
}

/// Whether `w` is open at `now`, else when it opens next. An unreadable window (the schema
/// refuses those; an object stored before the rule existed may still hold one) is an error
/// for a condition, never "always open".
pub fn state(w: &MaintenanceWindow, now: Timestamp) -> Result<WindowState, String> {
    let length = parse_duration(&w.duration)
        .map_err(|e| format!("maintenanceWindow.duration: {e}"))?
        .min(WEEK);
    let (h, m) = w
        .start
        .split_once(':')
        .and_then(|(h, m)| Some((h.parse::<i8>().ok()?, m.parse::<i8>().ok()?)))
        .filter(|(h, m)| (0..24).contains(h) && (0..60).contains(m))
        .ok_or_else(|| format!("maintenanceWindow.start `{}` is not HH:MM", w.start))?;
    let days: Vec<Weekday> = w
        .days
        .iter()
        .map(|d| weekday(d).ok_or_else(|| format!("maintenanceWindow.days: unknown day `{d}`")))
        .collect::<Result<_, _>>()?;
    let today = now.to_zoned(TimeZone::UTC).date();
    let length = SignedDuration::try_from(length).map_err(|e| e.to_string())?;
    let mut next: Option<Timestamp> = None;
    // A window that opened up to a week ago may still be open; one opens within eight days.
    for offset in -7i64..=8 {
        let Ok(day) = today.checked_add(offset.days()) else {
            continue;
        };
        if !days.is_empty() && !days.contains(&day.weekday()) {
            continue;
        }
        let Ok(opens) = day
            .at(h, m, 0, 0)
            .to_zoned(TimeZone::UTC)
            .map(|z| z.timestamp())
        else {
            continue;
        };
        let Ok(closes) = opens.checked_add(length) else {
            continue;
        };
        if opens <= now && now < closes {
            return Ok(WindowState::Open);
        }
        if opens > now && next.is_none_or(|n| opens < n) {
            next = Some(opens);
        }
    }
    next.map(WindowState::OpensAt)
        .ok_or_else(|| "maintenanceWindow never opens".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[&str], start: &str, duration: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            duration: duration.into(),
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    // 2026-11-21 is a Saturday.
    #[test]
    fn a_weekend_night_window_is_open_inside_and_names_its_next_opening_outside() {
        let w = window(&["Sat", "Sun"], "02:00", "4h");
        assert_eq!(state(&w, at("2026-11-21T03:00:00Z")), Ok(WindowState::Open));
        assert_eq!(state(&w, at("2026-11-22T05:59:59Z")), Ok(WindowState::Open));
        assert_eq!(
            state(&w, at("2026-11-22T06:00:00Z")),
            Ok(WindowState::OpensAt(at("2026-11-28T02:00:00Z")))
        );
        assert_eq!(
            state(&w, at("2026-11-23T12:00:00Z")),
            Ok(WindowState::OpensAt(at("2026-11-28T02:00:00Z")))
        );
        assert_eq!(
            state(&w, at("2026-11-21T01:59:00Z")),
            Ok(WindowState::OpensAt(at("2026-11-21T02:00:00Z")))
        );
    }

    #[test]
    fn a_window_that_spans_midnight_is_open_on_the_next_day() {
        let w = window(&["Fri"], "22:00", "6h");
        // Friday 2026-11-20 22:00 → Saturday 04:00.
        assert_eq!(state(&w, at("2026-11-21T03:59:00Z")), Ok(WindowState::Open));
        assert_eq!(
            state(&w, at("2026-11-21T04:00:00Z")),
            Ok(WindowState::OpensAt(at("2026-11-27T22:00:00Z")))
        );
    }

    #[test]
    fn without_days_the_window_opens_every_day() {
        let w = window(&[], "23:30", "1h");
        assert_eq!(state(&w, at("2026-11-24T00:15:00Z")), Ok(WindowState::Open));
        assert_eq!(
            state(&w, at("2026-11-24T12:00:00Z")),
            Ok(WindowState::OpensAt(at("2026-11-24T23:30:00Z")))
        );
    }

    #[test]
    fn an_unreadable_window_is_an_error_never_always_open() {
        let now = at("2026-11-24T00:15:00Z");
        assert!(state(&window(&[], "25:00", "1h"), now).is_err());
        assert!(state(&window(&["Someday"], "01:00", "1h"), now).is_err());
        assert!(state(&window(&[], "01:00", "soon"), now).is_err());
    }
}
