//! The reasons a QuestDB's conditions, its events, a backup's status and the failover metrics
//! carry: one enum per condition type, one for events, one for a backup's status and one for
//! why a due failover is held back. A reason the code acts on is a variant compared by the
//! compiler, never a string compared by hand, and a condition's type comes from its reason's
//! enum ([`ConditionReason::CONDITION`]), so a reason cannot be written under another
//! condition's type.
//!
//! A variant's name is the reason's text (`NodeReadyReason::LaunchFailed` is
//! `"LaunchFailed"`), which already satisfies the apiserver's pattern for `Condition.reason`;
//! the same word under two conditions (`WaitingForNode` under `NodeReady` and `DnsReady`) is
//! the same text, so what users, dashboards and alerts match on is unchanged.

mod condition;
mod event;

pub use condition::*;
pub use event::*;

/// A reason of one condition type: [`crate::plan::conditions::Verdict::new`] takes the type
/// from here.
pub trait ConditionReason: Copy + Into<&'static str> + std::fmt::Display {
    const CONDITION: &'static str;
}

/// What every reason enum offers beyond its derives: its text, every value, and comparison
/// with the text read back from a stored condition or event.
macro_rules! reason_text {
    ($($t:ty),* $(,)?) => {$(
        impl $t {
            pub fn as_str(self) -> &'static str {
                self.into()
            }

            /// The reason a condition, event or record spelt out earlier.
            pub fn parse(s: &str) -> Option<Self> {
                s.parse().ok()
            }

            pub fn all() -> impl Iterator<Item = Self> {
                <Self as strum::IntoEnumIterator>::iter()
            }
        }

        impl From<$t> for String {
            fn from(r: $t) -> String {
                r.as_str().to_string()
            }
        }

        impl PartialEq<$t> for str {
            fn eq(&self, other: &$t) -> bool {
                self == other.as_str()
            }
        }

        impl PartialEq<$t> for &str {
            fn eq(&self, other: &$t) -> bool {
                *self == other.as_str()
            }
        }

        impl PartialEq<$t> for String {
            fn eq(&self, other: &$t) -> bool {
                self == other.as_str()
            }
        }
    )*};
}
pub(crate) use reason_text;

#[cfg(test)]
mod tests;
