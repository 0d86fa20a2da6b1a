//! Reading and validating the public half of a client's P-256 JWK from a Secret.
//!
//! Decisions a JWK consumer has to make, and the ones taken here:
//! - `x`/`y` are base64url (RFC 7515 §2: URL-safe alphabet, no padding). Padding is tolerated
//!   when it is the canonical amount, because common encoders add it and QuestDB's own decoder
//!   (Java's URL decoder) accepts it; the output is always re-encoded without padding. The
//!   standard alphabet's `+` and `/` are rejected: QuestDB's decoder would reject them too.
//! - Each coordinate must decode to exactly 32 bytes (RFC 7518 §6.2.1.2: the full coordinate
//!   size, leading zeros kept), and `(x, y)` must be a point on P-256.
//! - `kid` must be printable ASCII without spaces and must not start with `#`: QuestDB splits
//!   auth-file lines on whitespace and reads a `#` token as the start of a comment, so such a
//!   kid would silently lose its key or break the file.
//! - In `auth.json` `kty` and `crv` are required (RFC 7517 §4.1, RFC 7518 §6.2.1.1). With
//!   separate data keys they are optional and checked when present, because a Secret made with
//!   `kubectl create secret generic --from-literal=kid=... --from-literal=x=...` has no reason
//!   to carry them. Separate values lose trailing line breaks (files written with `echo` or an
//!   editor end in one); any other whitespace is an error.
//! - `auth.json` wins when both forms are present; the other data keys are then ignored.
//! - `stringData` is read before `data`, as the apiserver merges it, so a Secret built in memory
//!   (tests, a simulated apiserver) behaves like one read back from a real cluster.

use std::fmt;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

/// Data key holding the whole JWK as JSON.
pub const JSON_DATA_KEY: &str = "auth.json";

const EC_KEY_TYPE: &str = "EC";
const P256_CURVE: &str = "P-256";
/// Bytes in a P-256 field element, hence in each affine coordinate.
const COORDINATE_LEN: usize = 32;
/// SEC1 tag of an uncompressed point (`0x04 || x || y`).
const SEC1_UNCOMPRESSED: u8 = 0x04;

const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The public half of a client's ILP key: exactly what QuestDB's auth file needs.
///
/// Only obtainable through validation ([`parse_secret`] or [`PublicKey::new`]), so holding one
/// means the kid is safe for the auth file and `(x, y)` is a point on P-256. Carries no private
/// data, which is why it may be logged and compared freely.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey {
    // Field order matters: the derived `Ord` sorts by kid first.
    kid: String,
    x: String,
    y: String,
}

impl PublicKey {
    /// Validates a key id and base64url coordinates; `x`/`y` are stored without padding.
    pub fn new(kid: &str, x: &str, y: &str) -> Result<Self, KeyError> {
        validate_kid(kid)?;
        let x_bytes = decode_coordinate(Coordinate::X, x)?;
        let y_bytes = decode_coordinate(Coordinate::Y, y)?;
        check_on_curve(&x_bytes, &y_bytes)?;
        Ok(Self {
            kid: kid.to_owned(),
            x: BASE64URL.encode(x_bytes),
            y: BASE64URL.encode(y_bytes),
        })
    }

    /// The JWK `kid`: the name the client authenticates with.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Base64url (unpadded) x coordinate.
    pub fn x(&self) -> &str {
        &self.x
    }

    /// Base64url (unpadded) y coordinate.
    pub fn y(&self) -> &str {
        &self.y
    }
}

/// An affine coordinate of the public point, named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coordinate {
    X,
    Y,
}

impl fmt::Display for Coordinate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Coordinate::X => "x",
            Coordinate::Y => "y",
        })
    }
}

/// Why a Secret yields no usable key.
///
/// Messages name the field and the rule, never a value taken from the Secret (the Secret's own
/// name is added by the caller), so they are safe for conditions, events and logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Secret has no data")]
    NoData,
    #[error("the Secret has neither data key `auth.json` (a JWK) nor data keys `kid`, `x`, `y`")]
    NoKeyMaterial,
    #[error("the JWK has no `{field}`")]
    MissingField { field: &'static str },
    #[error("data key `{key}` is not UTF-8 text")]
    NotUtf8 { key: &'static str },
    #[error("`auth.json` is not valid JSON (line {line}, column {column})")]
    MalformedJson { line: usize, column: usize },
    #[error("`auth.json` is not a JSON object")]
    JsonNotObject,
    #[error("`auth.json` has a member more than once")]
    DuplicateMember,
    #[error("JWK member `{field}` is not a string")]
    FieldNotString { field: &'static str },
    #[error("`kty` is not \"EC\": QuestDB accepts only EC P-256 keys")]
    UnsupportedKeyType,
    #[error("`crv` is not \"P-256\": QuestDB accepts only EC P-256 keys")]
    UnsupportedCurve,
    #[error("`{coordinate}` is not base64url (alphabet A-Z a-z 0-9 - _)")]
    NotBase64Url { coordinate: Coordinate },
    #[error("`{coordinate}` decodes to {actual} bytes; a P-256 coordinate has exactly 32")]
    WrongCoordinateLength {
        coordinate: Coordinate,
        actual: usize,
    },
    #[error("(`x`, `y`) is not a point on the P-256 curve")]
    NotOnCurve,
    #[error("`kid` is empty")]
    EmptyKid,
    #[error("`kid` is {len} bytes long; at most {MAX_KID_LEN} are accepted")]
    KidTooLong { len: usize },
    #[error("`kid` contains whitespace; QuestDB separates the fields of its auth file with it")]
    KidContainsWhitespace,
    #[error("`kid` contains a character outside printable ASCII")]
    KidNotPrintableAscii,
    #[error("`kid` starts with `#`, which QuestDB reads as the start of a comment")]
    KidStartsWithHash,
    #[error("its `kid` is also used by Secret {}; QuestDB refuses duplicate key ids", .other_secrets.join(", "))]
    DuplicateKid { other_secrets: Vec<String> },
    #[error("this QuestDB already has {max} keys, the most one auth file holds; this Secret's key is not deployed", max = crate::ilp_auth::MAX_KEYS)]
    TooManyKeys,
}

/// Reads the public half of the JWK in `secret` and validates it (see the module docs for the
/// accepted forms). The private `d` is never read.
pub fn parse_secret(secret: &Secret) -> Result<PublicKey, KeyError> {
    let data = SecretData(secret);
    if data.is_empty() {
        return Err(KeyError::NoData);
    }
    if let Some(json) = data.get(JSON_DATA_KEY) {
        return parse_json_jwk(utf8(JSON_DATA_KEY, json)?);
    }
    parse_separate_keys(&data)
}

/// The members of a JWK this module reads. Everything else (notably `d`) is skipped by serde
/// without being copied out of the input.
#[derive(Deserialize)]
struct JwkMembers {
    kty: Option<serde_json::Value>,
    crv: Option<serde_json::Value>,
    kid: Option<serde_json::Value>,
    x: Option<serde_json::Value>,
    y: Option<serde_json::Value>,
}

fn parse_json_jwk(json: &str) -> Result<PublicKey, KeyError> {
    // serde_json's own messages can quote the input, so only its position and category are used.
    let members: JwkMembers = serde_json::from_str(json).map_err(|err| {
        if err.is_syntax() || err.is_eof() {
            KeyError::MalformedJson {
                line: err.line(),
                column: err.column(),
            }
        } else if json.trim_start().starts_with('{') {
            // With every member typed as an optional `Value`, an object can only fail by
            // repeating a member.
            KeyError::DuplicateMember
        } else {
            KeyError::JsonNotObject
        }
    })?;
    let kty = json_string("kty", members.kty)?;
    let crv = json_string("crv", members.crv)?;
    let kid = json_string("kid", members.kid)?;
    let x = json_string("x", members.x)?;
    let y = json_string("y", members.y)?;
    check_key_type(&kty)?;
    check_curve(&crv)?;
    PublicKey::new(&kid, &x, &y)
}

fn json_string(field: &'static str, member: Option<serde_json::Value>) -> Result<String, KeyError> {
    match member {
        None | Some(serde_json::Value::Null) => Err(KeyError::MissingField { field }),
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(_) => Err(KeyError::FieldNotString { field }),
    }
}

fn parse_separate_keys(data: &SecretData<'_>) -> Result<PublicKey, KeyError> {
    const KID: &str = "kid";
    const X: &str = "x";
    const Y: &str = "y";
    if [KID, X, Y].iter().all(|key| data.get(key).is_none()) {
        return Err(KeyError::NoKeyMaterial);
    }
    let text = |key: &'static str| -> Result<Option<&str>, KeyError> {
        data.get(key)
            .map(|bytes| utf8(key, bytes).map(without_trailing_line_breaks))
            .transpose()
    };
    let required = |key: &'static str| text(key)?.ok_or(KeyError::MissingField { field: key });
    if let Some(kty) = text("kty")? {
        check_key_type(kty)?;
    }
    if let Some(crv) = text("crv")? {
        check_curve(crv)?;
    }
    PublicKey::new(required(KID)?, required(X)?, required(Y)?)
}

/// A Secret's payload as the apiserver would return it: `stringData` entries override `data`.
struct SecretData<'a>(&'a Secret);

impl<'a> SecretData<'a> {
    fn get(&self, key: &str) -> Option<&'a [u8]> {
        let from_string_data = self
            .0
            .string_data
            .as_ref()
            .and_then(|m| m.get(key))
            .map(|s| s.as_bytes());
        from_string_data.or_else(|| {
            self.0
                .data
                .as_ref()
                .and_then(|m| m.get(key))
                .map(|b| b.0.as_slice())
        })
    }

    fn is_empty(&self) -> bool {
        self.0.data.as_ref().is_none_or(|m| m.is_empty())
            && self.0.string_data.as_ref().is_none_or(|m| m.is_empty())
    }
}

fn utf8<'a>(key: &'static str, bytes: &'a [u8]) -> Result<&'a str, KeyError> {
    std::str::from_utf8(bytes).map_err(|_| KeyError::NotUtf8 { key })
}

fn without_trailing_line_breaks(value: &str) -> &str {
    value.trim_end_matches(['\n', '\r'])
}

fn check_key_type(kty: &str) -> Result<(), KeyError> {
    if kty == EC_KEY_TYPE {
        Ok(())
    } else {
        Err(KeyError::UnsupportedKeyType)
    }
}

fn check_curve(crv: &str) -> Result<(), KeyError> {
    if crv == P256_CURVE {
        Ok(())
    } else {
        Err(KeyError::UnsupportedCurve)
    }
}

/// Longest accepted `kid`: with the per-QuestDB key cap, the auth file stays far below the
/// 1 MiB a ConfigMap may hold (a line is kid + 2 x 43 base64url characters + 17).
pub const MAX_KID_LEN: usize = 256;

fn validate_kid(kid: &str) -> Result<(), KeyError> {
    if kid.is_empty() {
        return Err(KeyError::EmptyKid);
    }
    if kid.len() > MAX_KID_LEN {
        return Err(KeyError::KidTooLong { len: kid.len() });
    }
    if kid.chars().any(char::is_whitespace) {
        return Err(KeyError::KidContainsWhitespace);
    }
    if !kid.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::KidNotPrintableAscii);
    }
    if kid.starts_with('#') {
        return Err(KeyError::KidStartsWithHash);
    }
    Ok(())
}

fn decode_coordinate(coordinate: Coordinate, text: &str) -> Result<[u8; COORDINATE_LEN], KeyError> {
    let bytes = BASE64URL
        .decode(text)
        .map_err(|_| KeyError::NotBase64Url { coordinate })?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::WrongCoordinateLength {
            coordinate,
            actual: bytes.len(),
        })
}

fn check_on_curve(x: &[u8; COORDINATE_LEN], y: &[u8; COORDINATE_LEN]) -> Result<(), KeyError> {
    let mut sec1 = [0u8; 1 + 2 * COORDINATE_LEN];
    sec1[0] = SEC1_UNCOMPRESSED;
    sec1[1..=COORDINATE_LEN].copy_from_slice(x);
    sec1[1 + COORDINATE_LEN..].copy_from_slice(y);
    // Rejects coordinates >= p as well as points off the curve.
    p256::PublicKey::from_sec1_bytes(&sec1)
        .map(|_| ())
        .map_err(|_| KeyError::NotOnCurve)
}

#[cfg(test)]
#[path = "key_tests.rs"]
mod tests;
