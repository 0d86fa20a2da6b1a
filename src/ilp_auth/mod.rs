//! ILP auth: the pure parts (key parsing, the auth file, the policy) are `questdb_core::ilp_auth`;
//! here is what ties a key Secret to its QuestDB in the caches.

mod mapping;

pub(crate) use mapping::questdb_for_secret;
pub use questdb_core::ilp_auth::*;
