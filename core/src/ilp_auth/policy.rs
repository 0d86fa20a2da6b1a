//! From the key Secrets of one QuestDB to the auth file to deploy and the `IlpAuthReady`
//! condition to report.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use crate::api::IlpAuthReason;

use super::{parse_secret, render_auth_file, KeyError, PublicKey};

/// Keys one QuestDB's auth file holds at most: with kids of at most
/// [`super::MAX_KID_LEN`] bytes a line is under 400 bytes, so the file stays far below the 1 MiB
/// a ConfigMap may hold. Secrets past the cap (in name order) are reported, not deployed.
pub const MAX_KEYS: usize = 1000;

/// How many Secrets or kids a condition message lists before summarising the rest: a
/// condition message is capped (32 KiB) and must stay readable in `kubectl describe`.
const MAX_LISTED: usize = 10;

/// A Secret that contributes no key, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretProblem {
    /// Name of the Secret (same namespace as the QuestDB).
    pub secret: String,
    pub error: KeyError,
}

/// What the key Secrets of one QuestDB amount to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthOutcome {
    /// Valid keys with unique kids, sorted by kid.
    pub keys: Vec<PublicKey>,
    /// Secrets that contribute no key, sorted by Secret name.
    pub problems: Vec<SecretProblem>,
}

impl AuthOutcome {
    /// Whether every Secret contributed its key.
    pub fn is_complete(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Parses the key Secrets of ONE QuestDB: the caller passes exactly the Secrets that
/// the operator's `ilp_auth::questdb_for_secret` maps to it (all from its namespace).
///
/// A kid used by more than one Secret is a problem for each of them and none of their keys is
/// kept: which one the user meant cannot be known, and QuestDB refuses to start on a duplicate.
pub fn collect(secrets: &[Secret]) -> AuthOutcome {
    collect_parsed(
        secrets
            .iter()
            .map(|secret| (secret_name(secret), parse_secret(secret))),
    )
}

/// [`collect`] for Secrets already run through [`parse_secret`], as `(Secret name, result)`:
/// lets the controller cache parse results by resourceVersion instead of keeping Secrets.
pub fn collect_parsed(
    parsed: impl IntoIterator<Item = (String, Result<PublicKey, KeyError>)>,
) -> AuthOutcome {
    let mut parsed: Vec<(String, Result<PublicKey, KeyError>)> = parsed.into_iter().collect();
    parsed.sort_by(|a, b| a.0.cmp(&b.0));

    let mut secrets_by_kid: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, key) in &parsed {
        if let Ok(key) = key {
            secrets_by_kid
                .entry(key.kid().to_owned())
                .or_default()
                .push(name.clone());
        }
    }

    let mut outcome = AuthOutcome::default();
    for (name, key) in parsed {
        match key {
            Ok(key) => {
                let owners = &secrets_by_kid[key.kid()];
                if owners.len() == 1 && outcome.keys.len() >= MAX_KEYS {
                    outcome.problems.push(SecretProblem {
                        secret: name,
                        error: KeyError::TooManyKeys,
                    });
                } else if owners.len() == 1 {
                    outcome.keys.push(key);
                } else {
                    let other_secrets = owners.iter().filter(|o| **o != name).cloned().collect();
                    outcome.problems.push(SecretProblem {
                        secret: name,
                        error: KeyError::DuplicateKid { other_secrets },
                    });
                }
            }
            Err(error) => outcome.problems.push(SecretProblem {
                secret: name,
                error,
            }),
        }
    }
    outcome.keys.sort();
    outcome
}

fn secret_name(secret: &Secret) -> String {
    secret
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "(unnamed)".to_owned())
}

/// Which auth file a decision deploys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileChoice {
    /// Rendered from a complete outcome.
    Complete,
    /// Some Secret is broken: the keys that validated are used, a broken Secret withholds only
    /// its own key, and a removed Secret's key is gone (revocation beats any earlier file).
    ValidKeysOnly,
}

/// What to deploy and what to report for one QuestDB's ILP auth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthDecision {
    /// Content of the auth file to deploy.
    pub auth_file: String,
    pub file_choice: FileChoice,
    /// Status of the `IlpAuthReady` condition.
    pub ready: bool,
    /// Reason of the `IlpAuthReady` condition.
    pub reason: IlpAuthReason,
    /// Message of the condition (also fit for a Warning event when not ready). Names Secrets,
    /// kids and problems, never a key value.
    pub message: String,
}

impl AuthDecision {
    /// The condition status string (`"True"` / `"False"`).
    pub fn condition_status(&self) -> &'static str {
        if self.ready {
            "True"
        } else {
            "False"
        }
    }
}

/// Applies the ILP auth policy (see the module docs) to an outcome.
///
/// Zero keys is reported as `IlpAuthReady=False`/`NoKeys` rather than `True`: the database is
/// then closed to every ILP client, which is almost never what anyone wants for long, and a
/// False condition is something on-call can alert on.
pub fn decide(outcome: &AuthOutcome) -> AuthDecision {
    if !outcome.is_complete() {
        return decide_with_problems(outcome);
    }
    let auth_file = render_auth_file(&outcome.keys);
    if outcome.keys.is_empty() {
        return AuthDecision {
            auth_file,
            file_choice: FileChoice::Complete,
            ready: false,
            reason: IlpAuthReason::NoKeys,
            message: "No Secret annotated crd.questdb.io/name holds an ILP key for this QuestDB: \
                      ILP authentication stays on and every ILP client is refused until a key \
                      Secret is annotated or spec.ilpAuth.enabled is set to false"
                .to_owned(),
        };
    }
    let kids: Vec<&str> = outcome.keys.iter().map(PublicKey::kid).collect();
    AuthDecision {
        auth_file,
        file_choice: FileChoice::Complete,
        ready: true,
        reason: IlpAuthReason::KeysLoaded,
        message: format!(
            "{} loaded: {}",
            plural(kids.len(), "ILP key", "ILP keys"),
            listed(&kids)
        ),
    }
}

fn decide_with_problems(outcome: &AuthOutcome) -> AuthDecision {
    let only_duplicates = outcome
        .problems
        .iter()
        .all(|p| matches!(p.error, KeyError::DuplicateKid { .. }));
    let reason = if only_duplicates {
        IlpAuthReason::DuplicateKid
    } else {
        IlpAuthReason::InvalidSecret
    };
    let problems: Vec<String> = outcome
        .problems
        .iter()
        .map(|p| format!("Secret {}: {}", p.secret, p.error))
        .collect();
    let problems: Vec<&str> = problems.iter().map(String::as_str).collect();
    // A broken Secret withholds only its own key: keeping an earlier file instead would keep
    // a leaked key whose Secret was just deleted for as long as any other Secret is broken.
    let auth_file = render_auth_file(&outcome.keys);
    let file_choice = FileChoice::ValidKeysOnly;
    let consequence = match outcome.keys.len() {
        0 => "No valid key remains, so every ILP client is refused until this is fixed".to_owned(),
        n => format!(
            "Their keys are withheld until fixed; the {} deployed",
            plural(n, "other valid key is", "other valid keys are")
        ),
    };
    AuthDecision {
        auth_file,
        file_choice,
        ready: false,
        reason,
        message: format!(
            "{} rejected: {}. {consequence}",
            plural(problems.len(), "key Secret", "key Secrets"),
            listed_with(&problems, "; ")
        ),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn listed(items: &[&str]) -> String {
    listed_with(items, ", ")
}

fn listed_with(items: &[&str], separator: &str) -> String {
    let shown = items[..items.len().min(MAX_LISTED)].join(separator);
    match items.len().saturating_sub(MAX_LISTED) {
        0 => shown,
        rest => format!("{shown}{separator}and {rest} more"),
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
