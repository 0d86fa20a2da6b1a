use super::*;
use crate::ilp_auth::testing::{secret, TestKey};

fn key(kid: &str, seed: u8) -> TestKey {
    TestKey::derived(kid, seed)
}

fn public(key: &TestKey) -> PublicKey {
    PublicKey::new(&key.kid, &key.x, &key.y).expect("valid test key")
}

/// A Secret whose `x` is not base64url; it still carries the key's `d`.
fn broken_secret(name: &str, key: &TestKey) -> Secret {
    secret(
        name,
        &[
            ("kid", key.kid.as_bytes()),
            ("x", b"+not/base64url"),
            ("y", key.y.as_bytes()),
            ("d", key.d.as_bytes()),
        ],
    )
}

/// Asserts that no private scalar, and no coordinate of a rejected Secret, shows up in anything
/// the operator would write or log for this decision.
fn assert_no_leak(outcome: &AuthOutcome, decision: &AuthDecision, keys: &[&TestKey]) {
    let texts = [
        decision.auth_file.clone(),
        decision.message.clone(),
        format!("{decision:?}"),
        format!("{outcome:?}"),
    ];
    for text in &texts {
        for key in keys {
            assert!(!text.contains(&key.d), "private key leaked into {text:?}");
        }
    }
}

#[test]
fn collect_keeps_every_valid_key_sorted_by_kid() {
    let (carol, alice, bob) = (key("carol", 3), key("alice", 1), key("bob", 2));
    let outcome = collect(&[
        carol.json_secret("s-carol"),
        alice.separate_secret("s-alice"),
        bob.json_secret("s-bob"),
    ]);
    assert!(outcome.is_complete());
    assert_eq!(outcome.keys, [public(&alice), public(&bob), public(&carol)]);
}

#[test]
fn duplicate_kid_rejects_every_secret_that_uses_it() {
    let first = key("shared", 1);
    let second = key("shared", 2);
    let other = key("other", 3);
    let outcome = collect(&[
        second.json_secret("b-second"),
        other.json_secret("c-other"),
        first.separate_secret("a-first"),
    ]);
    assert!(!outcome.is_complete());
    assert_eq!(outcome.keys, [public(&other)]);
    assert_eq!(
        outcome.problems,
        [
            SecretProblem {
                secret: "a-first".into(),
                error: KeyError::DuplicateKid {
                    other_secrets: vec!["b-second".into()]
                },
            },
            SecretProblem {
                secret: "b-second".into(),
                error: KeyError::DuplicateKid {
                    other_secrets: vec!["a-first".into()]
                },
            },
        ]
    );
}

#[test]
fn cached_parse_results_give_the_same_outcome_in_any_order() {
    let (first, second, other) = (key("shared", 1), key("shared", 2), key("other", 3));
    let secrets = [
        first.json_secret("a-first"),
        second.separate_secret("b-second"),
        other.json_secret("c-other"),
    ];
    let mut parsed: Vec<(String, Result<PublicKey, KeyError>)> = secrets
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), parse_secret(s)))
        .collect();
    parsed.reverse();
    assert_eq!(collect_parsed(parsed), collect(&secrets));
}

#[test]
fn invalid_secret_is_reported_by_name_and_does_not_stop_the_others() {
    let (alice, bob) = (key("alice", 1), key("bob", 2));
    let outcome = collect(&[broken_secret("s-bob", &bob), alice.json_secret("s-alice")]);
    assert_eq!(outcome.keys, [public(&alice)]);
    assert_eq!(
        outcome.problems,
        [SecretProblem {
            secret: "s-bob".into(),
            error: KeyError::NotBase64Url {
                coordinate: crate::ilp_auth::Coordinate::X
            },
        }]
    );
}

#[test]
fn complete_outcome_loads_the_new_file() {
    let (alice, bob) = (key("alice", 1), key("bob", 2));
    let outcome = collect(&[bob.json_secret("s-bob"), alice.json_secret("s-alice")]);
    let decision = decide(&outcome);
    assert_eq!(decision.file_choice, FileChoice::Complete);
    assert_eq!(
        decision.auth_file,
        render_auth_file(&[public(&alice), public(&bob)])
    );
    assert!(decision.ready);
    assert_eq!(decision.condition_status(), "True");
    assert_eq!(decision.reason, IlpAuthReason::KeysLoaded);
    assert_eq!(decision.message, "2 ILP keys loaded: alice, bob");
    assert_no_leak(&outcome, &decision, &[&alice, &bob]);
}

#[test]
fn rotating_a_key_changes_the_file() {
    let before = key("alice", 1);
    let after = key("alice", 9);
    let old = decide(&collect(&[before.json_secret("s-alice")]));
    let new = decide(&collect(&[after.json_secret("s-alice")]));
    assert_eq!(new.file_choice, FileChoice::Complete);
    assert_ne!(new.auth_file, old.auth_file);
    assert!(new.auth_file.contains(&after.x));
    assert!(!new.auth_file.contains(&before.x));
}

#[test]
fn removing_a_secret_removes_its_key() {
    let (alice, bob) = (key("alice", 1), key("bob", 2));
    let both = decide(&collect(&[
        alice.json_secret("s-alice"),
        bob.json_secret("s-bob"),
    ]));
    assert!(both.auth_file.contains("bob "));
    let only_alice = decide(&collect(&[alice.json_secret("s-alice")]));
    assert_eq!(only_alice.auth_file, render_auth_file(&[public(&alice)]));
    assert!(!only_alice.auth_file.contains("bob"));
}

#[test]
fn no_keys_fails_closed_with_an_alertable_condition() {
    let outcome = collect(&[]);
    assert!(outcome.is_complete());
    // Removing the last key revokes it: the file is empty, auth stays on.
    let decision = decide(&outcome);
    assert_eq!(decision.auth_file, "");
    assert_eq!(decision.file_choice, FileChoice::Complete);
    assert!(!decision.ready);
    assert_eq!(decision.condition_status(), "False");
    assert_eq!(decision.reason, IlpAuthReason::NoKeys);
    assert!(decision.message.contains("every ILP client is refused"));
    assert!(decision.message.contains("spec.ilpAuth.enabled"));
}

#[test]
fn an_invalid_secret_withholds_only_its_own_key() {
    let (alice, bob) = (key("alice", 1), key("bob", 2));
    let outcome = collect(&[alice.json_secret("s-alice"), broken_secret("s-bob", &bob)]);
    let decision = decide(&outcome);
    assert_eq!(decision.auth_file, render_auth_file(&[public(&alice)]));
    assert_eq!(decision.file_choice, FileChoice::ValidKeysOnly);
    assert!(!decision.ready);
    assert_eq!(decision.reason, IlpAuthReason::InvalidSecret);
    assert!(
        decision.message.starts_with(
            "1 key Secret rejected: Secret s-bob: `x` is not base64url (alphabet A-Z a-z 0-9 - _). \
             Their keys are withheld until fixed; the 1 other valid key is deployed"
        ),
        "{}",
        decision.message
    );
    assert!(!decision.message.contains("+not/base64url"));
    assert_no_leak(&outcome, &decision, &[&alice, &bob]);
}

#[test]
fn deleting_a_leaked_keys_secret_revokes_it_while_another_is_broken() {
    let (alice, bob, carol) = (key("alice", 1), key("bob", 2), key("carol", 3));
    let before = decide(&collect(&[
        alice.json_secret("s-alice"),
        bob.json_secret("s-bob"),
        carol.json_secret("s-carol"),
    ]));
    assert!(before.auth_file.contains("bob "));
    // bob's key leaked: its Secret is deleted while carol's is mid-edit and broken.
    let after = decide(&collect(&[
        alice.json_secret("s-alice"),
        broken_secret("s-carol", &carol),
    ]));
    assert!(!after.auth_file.contains("bob "), "{}", after.auth_file);
    assert_eq!(after.auth_file, render_auth_file(&[public(&alice)]));
}

#[test]
fn duplicate_kids_withhold_both_keys_with_their_own_reason() {
    let (first, second, other) = (key("shared", 1), key("shared", 2), key("other", 3));
    let outcome = collect(&[
        first.json_secret("a-first"),
        second.json_secret("b-second"),
        other.json_secret("c-other"),
    ]);
    let decision = decide(&outcome);
    assert_eq!(decision.auth_file, render_auth_file(&[public(&other)]));
    assert_eq!(decision.reason, IlpAuthReason::DuplicateKid);
    assert!(decision.message.contains(
        "Secret a-first: its `kid` is also used by Secret b-second; \
         QuestDB refuses duplicate key ids"
    ));
    assert!(decision
        .message
        .contains("Secret b-second: its `kid` is also used by Secret a-first"));
    assert_no_leak(&outcome, &decision, &[&first, &second, &other]);
}

#[test]
fn invalid_and_duplicate_together_report_invalid_secret() {
    let (first, second, third) = (key("shared", 1), key("shared", 2), key("third", 3));
    let outcome = collect(&[
        first.json_secret("a"),
        second.json_secret("b"),
        broken_secret("c", &third),
    ]);
    let decision = decide(&outcome);
    assert_eq!(decision.reason, IlpAuthReason::InvalidSecret);
    assert!(decision
        .message
        .starts_with("3 key Secrets rejected: Secret a: "));
}

#[test]
fn nothing_valid_refuses_every_client() {
    let bob = key("bob", 2);
    let nothing_valid = decide(&collect(&[broken_secret("s-bob", &bob)]));
    assert_eq!(nothing_valid.auth_file, "");
    assert!(nothing_valid
        .message
        .contains("every ILP client is refused"));
}

#[test]
fn long_problem_lists_are_summarised() {
    let keys: Vec<TestKey> = (1..=15).map(|i| key(&format!("k{i:02}"), i)).collect();
    let secrets: Vec<Secret> = keys
        .iter()
        .map(|k| broken_secret(&format!("s{}", k.kid), k))
        .collect();
    let outcome = collect(&secrets);
    let decision = decide(&outcome);
    assert!(decision
        .message
        .starts_with("15 key Secrets rejected: Secret sk01: "));
    assert!(decision.message.contains("Secret sk10: "));
    assert!(!decision.message.contains("Secret sk11: "));
    assert!(decision.message.contains("; and 5 more. "));
    let refs: Vec<&TestKey> = keys.iter().collect();
    assert_no_leak(&outcome, &decision, &refs);

    let many_valid: Vec<Secret> = keys.iter().map(|k| k.json_secret(&k.kid)).collect();
    let loaded = decide(&collect(&many_valid));
    assert_eq!(
        loaded.message,
        "15 ILP keys loaded: k01, k02, k03, k04, k05, k06, k07, k08, k09, k10, and 5 more"
    );
    assert_eq!(loaded.auth_file.lines().count(), 15);
}

#[test]
fn keys_past_the_cap_are_reported_not_deployed() {
    let secrets: Vec<_> = (0..=MAX_KEYS)
        .map(|i| key(&format!("k{i:05}"), (i % 200 + 1) as u8).json_secret(&format!("s{i:05}")))
        .collect();
    let outcome = collect(&secrets);
    assert_eq!(outcome.keys.len(), MAX_KEYS);
    assert_eq!(outcome.problems.len(), 1);
    assert_eq!(outcome.problems[0].secret, format!("s{MAX_KEYS:05}"));
    assert_eq!(outcome.problems[0].error, KeyError::TooManyKeys);
    let decision = decide(&outcome);
    assert!(decision.auth_file.len() < 1024 * 1024);
    assert!(decision.message.contains(&format!("Secret s{MAX_KEYS:05}")));
}
