//! ILP (InfluxDB Line Protocol over TCP) authentication keys, taken from annotated JWK Secrets.
//!
//! Pure code: no client, no async. The controller lists the Secrets, calls into this module and
//! writes what it returns.
//!
//! # Where keys come from
//! A Secret annotated `crd.questdb.io/name: <questdb name>` belongs to the QuestDB of that name in
//! the Secret's own namespace (the operator's `ilp_auth::questdb_for_secret`); an annotation never reaches across
//! namespaces. The Secret holds a client's P-256 JSON Web Key, either as JSON in the data key
//! `auth.json` or as separate data keys `kid`, `x`, `y` (optional `kty`, `crv`, `d`), see
//! [`parse_secret`]. Only `kid`, `x` and `y` are ever read into a [`PublicKey`]; the private `d`
//! is never copied, logged or quoted, and no error message quotes any value of a Secret.
//!
//! # What QuestDB reads
//! `line.tcp.auth.db.path` ([`AUTH_DB_PATH_KEY`]) in `server.conf` points at a text file
//! ([`AUTH_DB_PATH`], relative to the QuestDB root). Each line is
//! `<kid> ec-p-256-sha256 <x> <y>`, with `x`/`y` the base64url JWK coordinates; QuestDB splits
//! the line on whitespace, treats a token starting with `#` as the start of a comment and refuses
//! to start on a duplicate kid. [`render_auth_file`] writes that file; validation makes sure none
//! of those traps can be reached from a Secret. QuestDB reads the file only at start, so a new
//! file needs a pod restart (the controller's job).
//!
//! # Policy ([`decide`])
//! - Every annotated Secret valid, at least one key: the new file is used,
//!   `IlpAuthReady=True`/`KeysLoaded`.
//! - No key Secret at all: an empty file — ILP auth stays ON and refuses every client (fail
//!   closed) — with `IlpAuthReady=False`/`NoKeys`, so that on-call can alert on it. Only
//!   `spec.ilpAuth.enabled: false` turns authentication off; losing the last key never does.
//! - Any invalid Secret or duplicate kid: the keys that validated are deployed and the broken
//!   Secrets withhold their own keys (a typo locks out that one client, never every client, and
//!   never opens the database), with `IlpAuthReady=False`/`InvalidSecret` or `DuplicateKid`
//!   naming the Secrets and the problems. Revocation beats any earlier file: deleting a key
//!   Secret (or its annotation) removes its key at once, however many other Secrets are broken.

mod auth_file;
mod key;
mod policy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use auth_file::{render_auth_file, AUTH_DB_PATH, AUTH_DB_PATH_KEY, KEY_TYPE};
pub use key::{parse_secret, Coordinate, KeyError, PublicKey, MAX_KID_LEN};
pub use policy::{
    collect, collect_parsed, decide, AuthDecision, AuthOutcome, FileChoice, SecretProblem, MAX_KEYS,
};
