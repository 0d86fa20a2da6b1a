//! The database's own credentials: which Secret holds them, the Secret the operator generates
//! when the user names none, how they reach QuestDB, and the digests that restart the database
//! or reload it when they change.
//!
//! QuestDB ships with pgwire `admin`/`quest` and an open HTTP API (`/exec`, ILP over HTTP on
//! `/write`); ILP auth guards port 9009 only. Setting `pg.user`/`pg.password` disables the
//! default user, and `http.user`/`http.password` puts `/exec` and `/write` behind basic auth.
//! Never through a ConfigMap. The HTTP pair travels as env from `secretKeyRef` (QuestDB maps
//! `QDB_HTTP_PASSWORD` onto `http.password` and cannot reload it: a change restarts). The pgwire
//! users are reloadable, but only from `server.conf` (QuestDB's environment would win over the
//! file at every reload), so they are written into the `server.conf` the pod reads from its own
//! Secret ([`server_conf_secret`]): a rotation reaches the running database with a reload.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, Secret, SecretKeySelector};
use k8s_openapi::ByteString;
use kube::ResourceExt;
use rand::distr::{Alphanumeric, SampleString};
use rand::Rng;
use sha2::{Digest, Sha256};

use super::labels::child_meta;
use super::names;
use crate::api::QuestDB;

pub const PG_USER: &str = "QDB_PG_USER";
pub const PG_PASSWORD: &str = "QDB_PG_PASSWORD";
pub const PG_READONLY_USER: &str = "QDB_PG_READONLY_USER";
pub const PG_READONLY_PASSWORD: &str = "QDB_PG_READONLY_PASSWORD";
pub const HTTP_USER: &str = "QDB_HTTP_USER";
pub const HTTP_PASSWORD: &str = "QDB_HTTP_PASSWORD";

/// The keys QuestDB reads from `server.conf`, reloadable.
pub const PG_KEYS: [&str; 4] = [PG_USER, PG_PASSWORD, PG_READONLY_USER, PG_READONLY_PASSWORD];
/// The keys QuestDB reads from its environment at start, in the order the env lists them.
pub const HTTP_KEYS: [&str; 2] = [HTTP_USER, HTTP_PASSWORD];

/// Every key a credentials Secret must hold.
pub const KEYS: [&str; 6] = [
    PG_USER,
    PG_PASSWORD,
    PG_READONLY_USER,
    PG_READONLY_PASSWORD,
    HTTP_USER,
    HTTP_PASSWORD,
];

/// User names of a generated Secret. `admin` stays QuestDB's familiar name; what protects it
/// is the password, which is never `quest`.
const GENERATED_PG_USER: &str = "admin";
const GENERATED_READONLY_USER: &str = "reader";
const GENERATED_HTTP_USER: &str = "admin";
/// 32 alphanumeric characters: about 190 bits, and nothing a shell, a URL or a JDBC string
/// has to escape.
const PASSWORD_LENGTH: usize = 32;

/// Annotation on a generated Secret naming the QuestDB uid it was made for: the operator only
/// ever changes (the owner reference of) a Secret that carries it.
pub const GENERATED_FOR_ANNOTATION: &str = "crd.questdb.io/generated-for";

/// Pod-template annotation carrying the digest of the HTTP credentials ([`check`]), so a changed
/// HTTP password restarts the database (QuestDB reads its env at start only).
pub const CREDENTIALS_HASH_ANNOTATION: &str = "crd.questdb.io/credentials-hash";

/// StatefulSet annotation (on the object, not the pod template: it restarts nothing) with the
/// resourceVersion of the credentials Secret the digests were computed from,
/// `<resourceVersion>:<digest>:<pg digest>`: a restarted operator whose Secret is unchanged
/// takes the digests from here instead of reading every database's Secret again.
pub const CREDENTIALS_SEEN_ANNOTATION: &str = "crd.questdb.io/credentials-seen";

/// Annotation of the `server.conf` Secret: what it was rendered from
/// (`<server.conf digest>:<pg digest>`, [`server_conf_source`]), so a converged database reads
/// no credentials to know its file is current.
pub const SERVER_CONF_SOURCE_ANNOTATION: &str = "crd.questdb.io/server-conf-source";

/// The credentials Secret as last read: its resourceVersion and the digests of its
/// credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen<'a> {
    pub version: &'a str,
    /// The HTTP credentials' digest: the pod template's.
    pub digest: &'a str,
    /// The pgwire users' digest: what a reload brings.
    pub pg_digest: &'a str,
}

impl<'a> Seen<'a> {
    /// The annotation's value.
    pub fn annotation(&self) -> String {
        format!("{}:{}:{}", self.version, self.digest, self.pg_digest)
    }

    /// Reads the annotation's value back (one written before the pgwire digest: `None`).
    pub fn parse(value: &'a str) -> Option<Seen<'a>> {
        let mut parts = value.split(':');
        let (version, digest, pg_digest) = (parts.next()?, parts.next()?, parts.next()?);
        let whole =
            parts.next().is_none() && [version, digest, pg_digest].iter().all(|p| !p.is_empty());
        whole.then_some(Seen {
            version,
            digest,
            pg_digest,
        })
    }
}

/// The pgwire users of a credentials Secret (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct PgCredentials {
    pub user: String,
    pub password: String,
    pub readonly_user: String,
    pub readonly_password: String,
}

impl std::fmt::Debug for PgCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCredentials")
            .field("user", &self.user)
            .field("readonly_user", &self.readonly_user)
            .finish_non_exhaustive()
    }
}

impl PgCredentials {
    /// From a Secret's data, when every pgwire key is there and not empty.
    pub fn from_data(data: &BTreeMap<String, ByteString>) -> Option<PgCredentials> {
        let value = |key: &str| {
            data.get(key)
                .filter(|v| !v.0.is_empty())
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        Some(PgCredentials {
            user: value(PG_USER)?,
            password: value(PG_PASSWORD)?,
            readonly_user: value(PG_READONLY_USER)?,
            readonly_password: value(PG_READONLY_PASSWORD)?,
        })
    }
}

/// What the `server.conf` Secret renders: `server_conf`'s text and the pgwire users of the
/// digest `pg_digest`.
pub fn server_conf_source(server_conf: &str, pg_digest: &str) -> String {
    let text = hex::encode(&Sha256::digest(server_conf.as_bytes())[..8]);
    let pg = pg_digest.get(..16).unwrap_or(pg_digest);
    format!("{text}:{pg}")
}

/// The `<name>-server-conf` Secret the pod reads `server.conf` from: the rendered settings
/// (the ConfigMap's `server.conf`, which users read) followed by the pgwire users. A Secret,
/// because it holds passwords; refreshed in the pod by the kubelet, so a rotation is reloaded.
pub fn server_conf_secret(
    qdb: &QuestDB,
    server_conf: &str,
    pg: &PgCredentials,
    source: &str,
) -> Secret {
    let mut metadata = child_meta(qdb, names::server_conf_secret(qdb));
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            SERVER_CONF_SOURCE_ANNOTATION.to_string(),
            source.to_string(),
        );
    let mut text = server_conf.to_string();
    text.push_str(&format!(
        "# pgwire users, from Secret {}\n",
        secret_name(qdb)
    ));
    for (key, value) in [
        ("pg.user", &pg.user),
        ("pg.password", &pg.password),
        ("pg.readonly.user", &pg.readonly_user),
        ("pg.readonly.password", &pg.readonly_password),
    ] {
        text.push_str(&super::config::property_line(key, value));
        text.push('\n');
    }
    Secret {
        metadata,
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(
            super::SERVER_CONF_KEY.to_string(),
            ByteString(text.into_bytes()),
        )])),
        ..Secret::default()
    }
}

/// The Secret the database's credentials come from.
pub fn secret_name(qdb: &QuestDB) -> String {
    qdb.spec
        .credentials
        .secret_name
        .clone()
        .unwrap_or_else(|| names::credentials_secret(qdb))
}

/// Whether `secret` is the Secret [`secret_name`] gives, without building the name (the
/// Secret watch asks this of every QuestDB).
pub fn uses_secret(qdb: &QuestDB, secret: &str) -> bool {
    match &qdb.spec.credentials.secret_name {
        Some(name) => name == secret,
        None => secret
            .strip_suffix("-credentials")
            .is_some_and(|base| Some(base) == qdb.metadata.name.as_deref()),
    }
}

/// Whether the operator generates (and owns) the credentials Secret.
pub fn generated(qdb: &QuestDB) -> bool {
    qdb.spec.credentials.secret_name.is_none()
}

/// A new `<name>-credentials` Secret with random passwords, made once and never rewritten.
/// Like the PVC it carries no owner reference while `volume.retainOnDelete` is set, so a
/// recreated QuestDB finds the data and the passwords its clients know.
pub fn generated_secret(qdb: &QuestDB, rng: &mut impl Rng) -> Secret {
    let mut metadata = child_meta(qdb, names::credentials_secret(qdb));
    if qdb.spec.volume.retain_on_delete {
        metadata.owner_references = None;
    }
    // The operator's annotation only, never the QuestDB's: other controllers act on a
    // Secret's annotations (a service-account token controller, replicators, external-secrets
    // pushers), and a tenant must not steer them at the database's passwords.
    metadata.annotations = Some(BTreeMap::from([(
        GENERATED_FOR_ANNOTATION.to_string(),
        qdb.uid().unwrap_or_default(),
    )]));
    let mut password = || Alphanumeric.sample_string(rng, PASSWORD_LENGTH);
    let data = BTreeMap::from([
        (PG_USER, GENERATED_PG_USER.to_string()),
        (PG_PASSWORD, password()),
        (PG_READONLY_USER, GENERATED_READONLY_USER.to_string()),
        (PG_READONLY_PASSWORD, password()),
        (HTTP_USER, GENERATED_HTTP_USER.to_string()),
        (HTTP_PASSWORD, password()),
    ]);
    Secret {
        metadata,
        type_: Some("Opaque".to_string()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Env of the database container: each HTTP credential from its Secret key. Not optional: a
/// Secret without a key keeps the container from starting (`CreateContainerConfigError`)
/// rather than starting QuestDB with an open HTTP API. (The pgwire users are in `server.conf`,
/// whose Secret the operator writes only from a Secret that has every key.)
pub fn env(qdb: &QuestDB) -> Vec<EnvVar> {
    let secret = secret_name(qdb);
    HTTP_KEYS
        .iter()
        .map(|key| EnvVar {
            name: key.to_string(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.clone(),
                    key: key.to_string(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
        .collect()
}

/// What a credentials Secret's data says, without keeping any value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Every key present and non-empty; the hex SHA-256 over the HTTP keys (`digest`: a change
    /// restarts) and over the pgwire keys (`pg_digest`: a change is reloaded).
    Usable { digest: String, pg_digest: String },
    /// Keys missing or empty, by name (never a value).
    MissingKeys(Vec<String>),
    /// A password QuestDB ships as its default (`quest`): refused.
    DefaultPassword(Vec<String>),
}

/// Checks a Secret's data and digests the credential keys (length-prefixed, in [`HTTP_KEYS`]
/// and [`PG_KEYS`] order), so a digest changes exactly when one of its credentials does.
pub fn check(data: &BTreeMap<String, ByteString>) -> Check {
    let missing: Vec<String> = KEYS
        .iter()
        .filter(|k| data.get(**k).is_none_or(|v| v.0.is_empty()))
        .map(|k| k.to_string())
        .collect();
    if !missing.is_empty() {
        return Check::MissingKeys(missing);
    }
    let default: Vec<String> = [PG_PASSWORD, PG_READONLY_PASSWORD, HTTP_PASSWORD]
        .iter()
        .filter(|k| data.get(**k).is_some_and(|v| v.0 == b"quest"))
        .map(|k| k.to_string())
        .collect();
    if !default.is_empty() {
        return Check::DefaultPassword(default);
    }
    let digest = |keys: &[&str]| {
        let mut hasher = Sha256::new();
        for key in keys {
            let value = &data[*key].0;
            hasher.update((value.len() as u64).to_be_bytes());
            hasher.update(value);
        }
        hex::encode(hasher.finalize())
    };
    Check::Usable {
        digest: digest(&HTTP_KEYS),
        pg_digest: digest(&PG_KEYS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::labels::owner_references;
    use crate::desired::testing::questdb;
    use rand::SeedableRng;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    fn text(secret: &Secret, key: &str) -> String {
        String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
    }

    #[test]
    fn a_generated_secret_never_holds_questdbs_default_password() {
        let qdb = questdb("db1", "tenant-a");
        let s = generated_secret(&qdb, &mut rng());
        assert_eq!(s.metadata.name.as_deref(), Some("db1-credentials"));
        for key in [PG_PASSWORD, PG_READONLY_PASSWORD, HTTP_PASSWORD] {
            let p = text(&s, key);
            assert_eq!(p.len(), PASSWORD_LENGTH);
            assert!(p.chars().all(|c| c.is_ascii_alphanumeric()));
            assert_ne!(p, "quest");
        }
        let passwords: std::collections::BTreeSet<String> =
            [PG_PASSWORD, PG_READONLY_PASSWORD, HTTP_PASSWORD]
                .iter()
                .map(|k| text(&s, k))
                .collect();
        assert_eq!(passwords.len(), 3, "each credential has its own password");
        assert!(matches!(
            check(s.data.as_ref().unwrap()),
            Check::Usable { .. }
        ));
    }

    #[test]
    fn two_databases_never_share_generated_passwords() {
        let a = generated_secret(&questdb("a", "ns"), &mut rand::rng());
        let b = generated_secret(&questdb("b", "ns"), &mut rand::rng());
        assert_ne!(text(&a, PG_PASSWORD), text(&b, PG_PASSWORD));
    }

    #[test]
    fn retained_data_keeps_its_credentials_when_the_questdb_goes() {
        let mut qdb = questdb("db1", "tenant-a");
        qdb.spec.volume.retain_on_delete = true;
        assert_eq!(
            generated_secret(&qdb, &mut rng()).metadata.owner_references,
            None
        );
        qdb.spec.volume.retain_on_delete = false;
        assert_eq!(
            generated_secret(&qdb, &mut rng()).metadata.owner_references,
            Some(owner_references(&qdb))
        );
    }

    #[test]
    fn the_env_names_the_secret_and_every_key_and_holds_no_value() {
        let mut qdb = questdb("db1", "tenant-a");
        let vars = env(&qdb);
        assert_eq!(
            vars.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            HTTP_KEYS,
            "the pgwire users are in server.conf, where QuestDB reloads them"
        );
        for e in &vars {
            assert_eq!(e.value, None);
            let r = e
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap();
            assert_eq!(r.name, "db1-credentials");
            assert_eq!(r.key, e.name);
            assert_eq!(r.optional, Some(false));
        }
        assert!(uses_secret(&qdb, "db1-credentials"));
        assert!(!uses_secret(&qdb, "db1"));
        qdb.spec.credentials.secret_name = Some("team-db".into());
        assert!(!generated(&qdb));
        assert!(uses_secret(&qdb, "team-db"));
        assert!(!uses_secret(&qdb, "db1-credentials"));
        let r = env(&qdb)[0]
            .value_from
            .clone()
            .unwrap()
            .secret_key_ref
            .unwrap();
        assert_eq!(r.name, "team-db");
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    fn full(password: &str) -> Vec<(&'static str, String)> {
        KEYS.iter()
            .map(|k| (*k, format!("{k}-{password}")))
            .collect()
    }

    #[test]
    fn the_seen_annotation_reads_back_what_it_wrote() {
        let seen = Seen {
            version: "4711",
            digest: "ab12",
            pg_digest: "cd34",
        };
        assert_eq!(Seen::parse(&seen.annotation()), Some(seen));
        assert_eq!(Seen::parse("4711"), None);
        assert_eq!(Seen::parse(":ab:cd"), None);
        // Written by an operator before the pgwire digest: read again.
        assert_eq!(Seen::parse("4711:ab12"), None);
    }

    #[test]
    fn a_secret_missing_a_key_is_named_by_key_never_by_value() {
        let d = data(&[(PG_USER, "u"), (PG_PASSWORD, "")]);
        let Check::MissingKeys(missing) = check(&d) else {
            panic!("missing keys expected");
        };
        assert!(missing.contains(&PG_PASSWORD.to_string()));
        assert!(missing.contains(&HTTP_PASSWORD.to_string()));
        assert!(!missing.contains(&PG_USER.to_string()));
    }

    #[test]
    fn the_default_password_is_refused() {
        let mut pairs = full("x");
        pairs[1].1 = "quest".into();
        let d = data(
            &pairs
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            check(&d),
            Check::DefaultPassword(vec![PG_PASSWORD.to_string()])
        );
    }

    #[test]
    fn the_digest_changes_with_any_credential_and_ignores_other_keys() {
        let d = |pairs: &[(&'static str, String)], extra: Option<(&str, &str)>| {
            let mut m = data(
                &pairs
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect::<Vec<_>>(),
            );
            if let Some((k, v)) = extra {
                m.insert(k.into(), ByteString(v.into()));
            }
            check(&m)
        };
        let digests = |c: Check| match c {
            Check::Usable { digest, pg_digest } => (digest, pg_digest),
            other => panic!("usable expected: {other:?}"),
        };
        let base = digests(d(&full("a"), None));
        assert_eq!(base, digests(d(&full("a"), Some(("note", "hello")))));
        for i in 0..KEYS.len() {
            let mut changed = full("a");
            changed[i].1.push('!');
            let (restart, reload) = digests(d(&changed, None));
            if HTTP_KEYS.contains(&KEYS[i]) {
                assert_ne!(restart, base.0, "{} must restart", KEYS[i]);
                assert_eq!(reload, base.1);
            } else {
                assert_eq!(restart, base.0, "{} must not restart", KEYS[i]);
                assert_ne!(reload, base.1, "{} must be reloaded", KEYS[i]);
            }
        }
    }

    #[test]
    fn the_server_conf_secret_holds_the_settings_then_the_pgwire_users_escaped() {
        let qdb = questdb("db1", "tenant-a");
        let pg = PgCredentials {
            user: "admin".into(),
            password: "p=w\nx".into(),
            readonly_user: "reader".into(),
            readonly_password: "r".into(),
        };
        let s = server_conf_secret(&qdb, "a=1\n", &pg, "src");
        assert_eq!(s.metadata.name.as_deref(), Some("db1-server-conf"));
        assert_eq!(
            s.metadata.owner_references,
            Some(owner_references(&qdb)),
            "it goes with the QuestDB"
        );
        assert_eq!(
            s.metadata.annotations.clone().unwrap_or_default()[SERVER_CONF_SOURCE_ANNOTATION],
            "src"
        );
        let text = text(&s, "server.conf");
        assert_eq!(
            text,
            "a=1\n# pgwire users, from Secret db1-credentials\npg.user=admin\npg.password=p=w\\nx\npg.readonly.user=reader\npg.readonly.password=r\n"
        );
        assert!(!format!("{pg:?}").contains("p=w"), "never printed");
        assert_ne!(
            server_conf_source("a=1\n", "d1"),
            server_conf_source("a=2\n", "d1")
        );
        assert_ne!(
            server_conf_source("a=1\n", "d1"),
            server_conf_source("a=1\n", "d2")
        );
    }
}
