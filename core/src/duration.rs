//! Durations as the CRD and the flags write them (`90s`, `5m`, `1h`, `250ms`).

use std::time::Duration;

/// A whole number with a unit (`ms`, `s`, `m`, `h`); a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as 90s, 5m or 1h"))?;
    let seconds = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (ms, s, m, h)")),
    };
    Ok(Duration::from_secs(seconds))
}
