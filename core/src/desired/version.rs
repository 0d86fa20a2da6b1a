//! QuestDB versions as an image tag (`9.2.0`, `9.2.0-rhel`) and `build()` (`9.2.0`) name them.
//!
//! QuestDB reads the data of its own and older versions and promises nothing the other way
//! (its upgrade notes: "downgrades are not supported"; a newer version may change table
//! metadata or the WAL format on first open). So a restore into an older version than the
//! backup's, or an image older than the one the data last ran with, is refused unless the
//! user acknowledges it (`spec.allowVersionDowngrade`).

use std::cmp::Ordering;

/// A release version: its numeric components, `9.2.0` -> `[9, 2, 0]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version(Vec<u64>);

impl Version {
    /// The leading `major.minor[.patch[.build]]` of a tag or version text, before any `-` or
    /// `+` suffix; `None` for a tag that names no version (`latest`, a digest, `nightly`).
    pub fn parse(text: &str) -> Option<Version> {
        let core = text.split(['-', '+']).next()?;
        let parts: Option<Vec<u64>> = core.split('.').map(|p| p.parse().ok()).collect();
        let parts = parts?;
        (2..=4).contains(&parts.len()).then_some(Version(parts))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    /// Missing components count as 0: `9.2` is `9.2.0`.
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.0.len().max(other.0.len());
        let at = |v: &Version, i: usize| v.0.get(i).copied().unwrap_or(0);
        (0..len)
            .map(|i| at(self, i).cmp(&at(other, i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

/// Whether `candidate` is a version older than `than`. A text that names no version is never
/// older: it cannot be compared, and refusing it would refuse every `latest` image.
pub fn older(candidate: &str, than: &str) -> bool {
    match (Version::parse(candidate), Version::parse(than)) {
        (Some(c), Some(t)) => c < t,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_build_versions_compare_by_their_numbers() {
        assert!(older("9.1.0", "9.2.0"));
        assert!(older("9.2.0", "9.10.0"), "numerically, not as text");
        assert!(older("8.3.3-rhel", "9.0.0"));
        assert!(!older("9.2.0", "9.2.0"));
        assert!(!older("9.2", "9.2.0"));
        assert!(!older("9.2.1", "9.2.0"));
        assert!(!older("10.0.0", "9.9.9"));
    }

    #[test]
    fn a_tag_that_names_no_version_is_never_called_older() {
        for tag in ["latest", "nightly", "sha256:abcdef", "", "9", "9.x.0"] {
            assert!(!older(tag, "9.2.0"), "{tag}");
            assert!(!older("9.2.0", tag), "{tag}");
        }
    }
}
