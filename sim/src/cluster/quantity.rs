//! Parsing of Kubernetes resource quantities ("500m", "16Gi", "1e3") into plain numbers, enough
//! for the scheduler's resource-fit arithmetic.

/// The quantity in base units (cores, bytes, count), or `None` when it is not a quantity.
pub(crate) fn parse(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let value: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(value * multiplier)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_cpu_memory_and_exponent_forms() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("16Gi"), Some(16.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse("1G"), Some(1e9));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse("1.5Ki"), Some(1536.0));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse("lots"), None);
        assert_eq!(parse("5Xi"), None);
        assert_eq!(parse(""), None);
    }
}
