//! Kubernetes resource quantities (`50Gi`, `500m`, `1e3`) as numbers.
//!
//! k8s-openapi keeps a `Quantity` as its string; the operator needs the value to validate a
//! volume size, to grow a PVC but never shrink it, and to treat `1000m` and `1` (which the API
//! server canonicalises into each other) as the same request.

/// The value of a quantity in base units (bytes, cores), or `None` when `s` is not a quantity
/// in Kubernetes' grammar. `f64` is exact for every power-of-two size up to exabytes and for
/// any integer below 2^53, far beyond what a volume or a pod request needs.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let (number, suffix) = split_number(s)?;
    let value: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp if exp.starts_with(['e', 'E']) => {
            let exponent = &exp[1..];
            if !is_signed_integer(exponent) {
                return None;
            }
            10f64.powi(exponent.parse().ok()?)
        }
        _ => return None,
    };
    let v = value * multiplier;
    v.is_finite().then_some(v)
}

/// Splits `[+-]digits[.digits]` from the suffix; at least one digit is required.
fn split_number(s: &str) -> Option<(&str, &str)> {
    let body_start = usize::from(s.starts_with(['+', '-']));
    let mut digits = 0;
    let mut dots = 0;
    let mut end = body_start;
    for (i, c) in s[body_start..].char_indices() {
        match c {
            '0'..='9' => digits += 1,
            '.' if dots == 0 => dots += 1,
            _ => break,
        }
        end = body_start + i + c.len_utf8();
    }
    (digits > 0).then(|| (&s[..end], &s[end..]))
}

fn is_signed_integer(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(
            parse_quantity("50Gi"),
            Some(50.0 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(parse_quantity("1Ki"), Some(1024.0));
        assert_eq!(parse_quantity("2Ei"), Some(2.0 * 1024f64.powi(6)));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("1E"), Some(1e18));
        assert_eq!(parse_quantity("128974848"), Some(128_974_848.0));
    }

    #[test]
    fn exponents_signs_and_fractions() {
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("1E+3"), Some(1000.0));
        assert_eq!(parse_quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(parse_quantity(".5"), Some(0.5));
        assert_eq!(parse_quantity("-1"), Some(-1.0));
        assert_eq!(parse_quantity("+2k"), Some(2000.0));
    }

    #[test]
    fn equal_amounts_in_different_spellings_compare_equal() {
        assert_eq!(parse_quantity("1000m"), parse_quantity("1"));
        assert_eq!(parse_quantity("1024Mi"), parse_quantity("1Gi"));
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in [
            "", "Gi", "50GB", "50 Gi", "fifty", "1..5", "1.2.3", "1e", "1e+", "1Gi ", "-",
        ] {
            assert_eq!(parse_quantity(bad), None, "{bad:?} should not parse");
        }
    }
}
