//! Real P-256 keys and key Secrets for tests: the unit tests here and the integration tests of
//! the operator (which cannot see `#[cfg(test)]` items of the library).
//!
//! Every key carries its private scalar `d`, as a user's Secret would, so that tests can check
//! that `d` never leaves the Secret.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use p256::elliptic_curve::sec1::ToSec1Point as _;

use super::KEY_TYPE;
use crate::api::SECRET_QUESTDB_ANNOTATION;

/// Namespace of the Secrets made by [`secret`].
pub const NAMESPACE: &str = "team-a";
/// QuestDB named by the Secrets made by [`secret`].
pub const QUESTDB: &str = "db1";

/// A client's full JWK, private scalar included, as a user would put it in a Secret.
#[derive(Clone, Debug)]
pub struct TestKey {
    pub kid: String,
    pub x: String,
    pub y: String,
    pub d: String,
}

impl TestKey {
    /// The EC P-256 key of RFC 7515 appendix A.3 (with a kid added).
    pub fn rfc7515_a3(kid: &str) -> Self {
        Self {
            kid: kid.into(),
            x: "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU".into(),
            y: "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0".into(),
            d: "jpsQnnGQmL-YBIffH1136cspYG6-0iY7X1fCE9-E9LI".into(),
        }
    }

    /// A key derived from the private scalar `[seed; 32]`, so tests are deterministic.
    ///
    /// # Panics
    /// When `seed` is 0 (the zero scalar is no private key).
    pub fn derived(kid: &str, seed: u8) -> Self {
        let scalar = [seed; 32];
        let (x, y) = public_coordinates(&scalar);
        Self {
            kid: kid.into(),
            x,
            y,
            d: URL_SAFE_NO_PAD.encode(scalar),
        }
    }

    /// The JWK as JSON, `d` included.
    pub fn jwk_json(&self) -> String {
        serde_json::json!({
            "kty": "EC",
            "crv": "P-256",
            "kid": self.kid,
            "x": self.x,
            "y": self.y,
            "d": self.d,
        })
        .to_string()
    }

    /// The line QuestDB's auth file must hold for this key (newline included).
    pub fn auth_line(&self) -> String {
        format!("{} {KEY_TYPE} {} {}\n", self.kid, self.x, self.y)
    }

    /// A Secret in [`NAMESPACE`] annotated for [`QUESTDB`], holding the JWK JSON in `auth.json`.
    pub fn json_secret(&self, name: &str) -> Secret {
        secret(name, &[("auth.json", self.jwk_json().as_bytes())])
    }

    /// Like [`TestKey::json_secret`], in any namespace and for any QuestDB.
    pub fn json_secret_for(&self, namespace: &str, name: &str, questdb: &str) -> Secret {
        annotated_secret(
            namespace,
            name,
            questdb,
            &[("auth.json", self.jwk_json().as_bytes())],
        )
    }

    /// A Secret in [`NAMESPACE`] annotated for [`QUESTDB`], holding the JWK as separate data
    /// keys, `d` included.
    pub fn separate_secret(&self, name: &str) -> Secret {
        secret(
            name,
            &[
                ("kid", self.kid.as_bytes()),
                ("x", self.x.as_bytes()),
                ("y", self.y.as_bytes()),
                ("d", self.d.as_bytes()),
                ("kty", b"EC"),
                ("crv", b"P-256"),
            ],
        )
    }
}

/// The public point of a private scalar, as base64url JWK coordinates.
///
/// # Panics
/// When `scalar` is not a valid P-256 private scalar (zero, or not below the group order).
pub fn public_coordinates(scalar: &[u8]) -> (String, String) {
    let secret = p256::SecretKey::from_slice(scalar).expect("scalar in range");
    let point = secret.public_key().to_sec1_point(false);
    let x = point.x().expect("uncompressed point has x");
    let y = point.y().expect("uncompressed point has y");
    (URL_SAFE_NO_PAD.encode(x), URL_SAFE_NO_PAD.encode(y))
}

/// A Secret in [`NAMESPACE`] annotated for [`QUESTDB`] with the given data.
pub fn secret(name: &str, data: &[(&str, &[u8])]) -> Secret {
    annotated_secret(NAMESPACE, name, QUESTDB, data)
}

/// A Secret in `namespace` annotated `crd.questdb.io/name: <questdb>` with the given data.
pub fn annotated_secret(
    namespace: &str,
    name: &str,
    questdb: &str,
    data: &[(&str, &[u8])],
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            annotations: Some(BTreeMap::from([(
                SECRET_QUESTDB_ANNOTATION.to_string(),
                questdb.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}
