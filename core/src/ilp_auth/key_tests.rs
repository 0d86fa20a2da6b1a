use std::collections::BTreeMap;

use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::*;
use crate::ilp_auth::testing::{public_coordinates, secret, TestKey};

const KID: &str = "client-7f3a";

fn alice() -> TestKey {
    TestKey::rfc7515_a3(KID)
}

/// An `auth.json` Secret holding `key`'s full JWK after `edit` has changed its members.
fn json_secret_with(key: &TestKey, edit: impl FnOnce(&mut Map<String, Value>)) -> Secret {
    let mut jwk: Map<String, Value> = serde_json::from_str(&key.jwk_json()).expect("fixture");
    edit(&mut jwk);
    secret(
        "alice",
        &[("auth.json", Value::Object(jwk).to_string().as_bytes())],
    )
}

/// A separate-keys Secret holding `d` plus the given entries.
fn separate_secret_with(key: &TestKey, entries: &[(&str, &str)]) -> Secret {
    let mut data: Vec<(&str, &[u8])> = vec![("d", key.d.as_bytes())];
    data.extend(entries.iter().map(|(k, v)| (*k, v.as_bytes())));
    secret("alice", &data)
}

/// The JWK as JSON with a fixed member order, so syntax-error positions are stable.
fn literal_jwk(key: &TestKey) -> String {
    format!(
        r#"{{"kty":"EC","crv":"P-256","kid":"{}","x":"{}","y":"{}","d":"{}"}}"#,
        key.kid, key.x, key.y, key.d
    )
}

fn encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn decode(text: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(text).expect("fixture is base64url")
}

#[test]
fn rfc7515_fixture_is_a_real_key_pair() {
    // Guards every test below: the embedded x/y really are the public point of the embedded d.
    let key = alice();
    let (x, y) = public_coordinates(&decode(&key.d));
    assert_eq!((x.as_str(), y.as_str()), (key.x.as_str(), key.y.as_str()));
}

#[test]
fn json_jwk_yields_its_public_half() {
    let key = alice();
    let parsed = parse_secret(&key.json_secret("alice")).expect("valid JWK");
    assert_eq!(parsed.kid(), KID);
    assert_eq!(parsed.x(), key.x);
    assert_eq!(parsed.y(), key.y);
}

#[test]
fn separate_keys_yield_the_same_public_half() {
    for seed in [1u8, 2, 0x42, 0xfe] {
        let key = TestKey::derived(&format!("client-{seed}"), seed);
        let from_json = parse_secret(&key.json_secret("s")).expect("valid JWK JSON");
        let separate = parse_secret(&key.separate_secret("s")).expect("valid separate keys");
        assert_eq!(from_json, separate);
        assert_eq!(separate, PublicKey::new(&key.kid, &key.x, &key.y).unwrap());
    }
}

#[test]
fn separate_keys_need_no_kty_or_crv_and_lose_trailing_line_breaks() {
    let key = alice();
    let secret = separate_secret_with(
        &key,
        &[
            ("kid", &format!("{KID}\n")),
            ("x", &format!("{}\r\n", key.x)),
            ("y", &key.y),
        ],
    );
    let parsed = parse_secret(&secret).expect("valid");
    assert_eq!(
        (parsed.kid(), parsed.x(), parsed.y()),
        (KID, &*key.x, &*key.y)
    );
}

#[test]
fn string_data_is_read_like_the_apiserver_would_merge_it() {
    let key = alice();
    let mut secret = separate_secret_with(&key, &[("kid", "stale"), ("x", "stale")]);
    secret.string_data = Some(BTreeMap::from([
        ("kid".to_string(), KID.to_string()),
        ("x".to_string(), key.x.clone()),
        ("y".to_string(), key.y.clone()),
    ]));
    assert_eq!(parse_secret(&secret).expect("valid").kid(), KID);
}

#[test]
fn auth_json_wins_over_separate_keys() {
    let key = alice();
    let mut secret = key.json_secret("alice");
    let data = secret.data.as_mut().unwrap();
    data.insert("kid".into(), k8s_openapi::ByteString(b"other kid".to_vec()));
    assert_eq!(
        parse_secret(&secret).expect("auth.json is valid").kid(),
        KID
    );
}

#[test]
fn padded_coordinates_are_accepted_and_written_unpadded() {
    let key = alice();
    let padded_x = URL_SAFE.encode(decode(&key.x));
    assert!(padded_x.ends_with('='), "fixture must exercise padding");
    let secret = json_secret_with(&key, |jwk| {
        jwk.insert("x".into(), json!(padded_x));
    });
    assert_eq!(parse_secret(&secret).expect("valid").x(), key.x);
}

#[test]
fn other_jwk_members_are_allowed() {
    let key = alice();
    let secret = json_secret_with(&key, |jwk| {
        jwk.insert("use".into(), json!("sig"));
        jwk.insert("alg".into(), json!("ES256"));
        jwk.insert("key_ops".into(), json!(["sign"]));
    });
    assert_eq!(parse_secret(&secret).expect("valid").kid(), KID);
}

/// Every way a Secret can be wrong, with the error it must produce.
fn invalid_cases() -> Vec<(&'static str, Secret, KeyError)> {
    let key = alice();
    let x = decode(&key.x);
    let y = decode(&key.y);
    let mut y_plus_one = y.clone();
    y_plus_one[31] = y_plus_one[31].wrapping_add(1);
    let with = |edit: &dyn Fn(&mut Map<String, Value>)| json_secret_with(&key, edit);
    let without = |field: &'static str| json_secret_with(&key, |jwk| drop(jwk.remove(field)));
    let separate = |entries: &[(&str, &str)]| separate_secret_with(&key, entries);
    let all_separate = |kid: &str, x: &str, y: &str| separate(&[("kid", kid), ("x", x), ("y", y)]);
    vec![
        (
            "wrong kty",
            with(&|jwk| drop(jwk.insert("kty".into(), json!("RSA")))),
            KeyError::UnsupportedKeyType,
        ),
        (
            "wrong crv",
            with(&|jwk| drop(jwk.insert("crv".into(), json!("P-384")))),
            KeyError::UnsupportedCurve,
        ),
        (
            "secp256k1 curve",
            with(&|jwk| drop(jwk.insert("crv".into(), json!("secp256k1")))),
            KeyError::UnsupportedCurve,
        ),
        (
            "wrong kty in separate keys",
            separate(&[("kty", "OKP"), ("kid", KID), ("x", &key.x), ("y", &key.y)]),
            KeyError::UnsupportedKeyType,
        ),
        (
            "wrong crv in separate keys",
            separate(&[("crv", "P-521"), ("kid", KID), ("x", &key.x), ("y", &key.y)]),
            KeyError::UnsupportedCurve,
        ),
        (
            "x of 31 bytes",
            with(&|jwk| drop(jwk.insert("x".into(), json!(encode(&x[1..]))))),
            KeyError::WrongCoordinateLength {
                coordinate: Coordinate::X,
                actual: 31,
            },
        ),
        (
            "x of 33 bytes",
            with(&|jwk| drop(jwk.insert("x".into(), json!(encode(&[&[0u8][..], &x].concat()))))),
            KeyError::WrongCoordinateLength {
                coordinate: Coordinate::X,
                actual: 33,
            },
        ),
        (
            "y of 31 bytes",
            with(&|jwk| drop(jwk.insert("y".into(), json!(encode(&y[..31]))))),
            KeyError::WrongCoordinateLength {
                coordinate: Coordinate::Y,
                actual: 31,
            },
        ),
        (
            "x in the standard base64 alphabet",
            with(&|jwk| drop(jwk.insert("x".into(), json!(STANDARD.encode([0xfb; 32]))))),
            KeyError::NotBase64Url {
                coordinate: Coordinate::X,
            },
        ),
        (
            "y not base64 at all",
            with(&|jwk| drop(jwk.insert("y".into(), json!("not base64!")))),
            KeyError::NotBase64Url {
                coordinate: Coordinate::Y,
            },
        ),
        (
            "x with wrong padding",
            with(&|jwk| drop(jwk.insert("x".into(), json!(format!("{}==", key.x))))),
            KeyError::NotBase64Url {
                coordinate: Coordinate::X,
            },
        ),
        (
            "point not on the curve",
            with(&|jwk| drop(jwk.insert("y".into(), json!(encode(&y_plus_one))))),
            KeyError::NotOnCurve,
        ),
        (
            "coordinate not below the field prime",
            with(&|jwk| drop(jwk.insert("x".into(), json!(encode(&[0xff; 32]))))),
            KeyError::NotOnCurve,
        ),
        (
            "empty kid",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("")))),
            KeyError::EmptyKid,
        ),
        (
            "kid with a space",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("client 7f3a")))),
            KeyError::KidContainsWhitespace,
        ),
        (
            "kid with a tab",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("client\t7f3a")))),
            KeyError::KidContainsWhitespace,
        ),
        (
            "kid with a line break inside separate keys",
            all_separate("client\n7f3a", &key.x, &key.y),
            KeyError::KidContainsWhitespace,
        ),
        (
            "kid with leading space in separate keys",
            all_separate(" client-7f3a", &key.x, &key.y),
            KeyError::KidContainsWhitespace,
        ),
        (
            "kid with a non-ASCII character",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("clïent")))),
            KeyError::KidNotPrintableAscii,
        ),
        (
            "kid with a control character",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("client\u{0}")))),
            KeyError::KidNotPrintableAscii,
        ),
        (
            "kid starting with #",
            with(&|jwk| drop(jwk.insert("kid".into(), json!("#client")))),
            KeyError::KidStartsWithHash,
        ),
        (
            "JSON without kty",
            without("kty"),
            KeyError::MissingField { field: "kty" },
        ),
        (
            "JSON without crv",
            without("crv"),
            KeyError::MissingField { field: "crv" },
        ),
        (
            "JSON without kid",
            without("kid"),
            KeyError::MissingField { field: "kid" },
        ),
        (
            "JSON without x",
            without("x"),
            KeyError::MissingField { field: "x" },
        ),
        (
            "JSON without y",
            without("y"),
            KeyError::MissingField { field: "y" },
        ),
        (
            "JSON kid null",
            with(&|jwk| drop(jwk.insert("kid".into(), Value::Null))),
            KeyError::MissingField { field: "kid" },
        ),
        (
            "JSON kid a number",
            with(&|jwk| drop(jwk.insert("kid".into(), json!(7)))),
            KeyError::FieldNotString { field: "kid" },
        ),
        (
            "separate keys without y",
            separate(&[("kid", KID), ("x", &key.x)]),
            KeyError::MissingField { field: "y" },
        ),
        (
            "separate keys without kid",
            separate(&[("x", &key.x), ("y", &key.y)]),
            KeyError::MissingField { field: "kid" },
        ),
        ("only a private key", separate(&[]), KeyError::NoKeyMaterial),
        (
            "no data at all",
            Secret {
                data: None,
                ..secret("alice", &[])
            },
            KeyError::NoData,
        ),
        ("empty data", secret("alice", &[]), KeyError::NoData),
        (
            "truncated JSON",
            secret(
                "alice",
                &[("auth.json", &literal_jwk(&key).as_bytes()[..40])],
            ),
            KeyError::MalformedJson {
                line: 1,
                column: 40,
            },
        ),
        (
            "JSON with a syntax error",
            secret(
                "alice",
                &[(
                    "auth.json",
                    literal_jwk(&key).replacen(',', ";", 1).as_bytes(),
                )],
            ),
            KeyError::MalformedJson {
                line: 1,
                column: 12,
            },
        ),
        (
            "JSON array",
            secret(
                "alice",
                &[("auth.json", format!("[{}]", key.jwk_json()).as_bytes())],
            ),
            KeyError::JsonNotObject,
        ),
        (
            "JSON string holding the private key",
            secret(
                "alice",
                &[("auth.json", json!(key.d).to_string().as_bytes())],
            ),
            KeyError::JsonNotObject,
        ),
        (
            "JSON with a repeated member",
            secret(
                "alice",
                &[(
                    "auth.json",
                    key.jwk_json()
                        .replacen('{', &format!("{{\"kid\":\"{KID}\","), 1)
                        .as_bytes(),
                )],
            ),
            KeyError::DuplicateMember,
        ),
        (
            "auth.json not UTF-8",
            secret(
                "alice",
                &[("auth.json", &[key.jwk_json().as_bytes(), &[0xff]].concat())],
            ),
            KeyError::NotUtf8 { key: "auth.json" },
        ),
        (
            "separate x not UTF-8",
            secret(
                "alice",
                &[
                    ("d", key.d.as_bytes()),
                    ("kid", KID.as_bytes()),
                    ("x", &[0xc3, 0x28]),
                    ("y", key.y.as_bytes()),
                ],
            ),
            KeyError::NotUtf8 { key: "x" },
        ),
    ]
}

#[test]
fn every_invalid_secret_gets_its_own_error() {
    for (case, secret, expected) in invalid_cases() {
        assert_eq!(parse_secret(&secret), Err(expected), "case: {case}");
    }
}

#[test]
fn errors_never_quote_a_value_of_the_secret() {
    let key = alice();
    let values = [key.d.as_str(), key.x.as_str(), key.y.as_str(), KID];
    for (case, secret, _) in invalid_cases() {
        let err = parse_secret(&secret).expect_err(case);
        for text in [format!("{err}"), format!("{err:?}")] {
            for value in values {
                assert!(
                    !text.contains(value),
                    "case {case}: {text:?} quotes a value"
                );
            }
        }
    }
}

#[test]
fn the_private_scalar_never_reaches_the_public_key() {
    let key = alice();
    for secret in [key.json_secret("a"), key.separate_secret("a")] {
        let parsed = parse_secret(&secret).expect("valid");
        let shown = format!("{parsed:?} {} {} {}", parsed.kid(), parsed.x(), parsed.y());
        assert!(!shown.contains(&key.d));
    }
}

#[test]
fn an_overlong_kid_is_refused_with_its_length() {
    let long = "k".repeat(MAX_KID_LEN + 1);
    let key = TestKey::derived("x", 1);
    let (x, y) = public_coordinates(&decode(&key.d));
    let err = PublicKey::new(&long, &x, &y).unwrap_err();
    assert!(matches!(err, KeyError::KidTooLong { len } if len == MAX_KID_LEN + 1));
    assert!(PublicKey::new(&"k".repeat(MAX_KID_LEN), &x, &y).is_ok());
}
