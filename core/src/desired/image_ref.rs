//! Container image references (`[registry/]repository[:tag][@digest]`), parsed by the grammar of
//! the distribution project's `reference` package, which container runtimes apply.
//!
//! Hand-written because the crates that parse references come with a registry client or a whole
//! OCI model; this is the grammar only, and an image the runtime would refuse is caught before a
//! pod is ever created.

use std::fmt;

/// The longest repository name (registry included) the grammar allows.
const NAME_MAX: usize = 255;

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (and port) when the reference names one, e.g. `ghcr.io`, `localhost:5000`.
    pub registry: Option<String>,
    /// Repository path, e.g. `questdb/questdb`.
    pub repository: String,
    /// Tag, e.g. `9.0.0`.
    pub tag: Option<String>,
    /// Digest, e.g. `sha256:<64 hex>`.
    pub digest: Option<String>,
}

/// Why a string is not an image reference; the text is shown to users in a condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRefError {
    Empty,
    NameTooLong(usize),
    InvalidRegistry(String),
    InvalidRepository(String),
    InvalidTag(String),
    InvalidDigest(String),
}

impl fmt::Display for ImageRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "the image reference is empty"),
            Self::NameTooLong(n) => write!(
                f,
                "the image name is {n} characters long, more than the {NAME_MAX} allowed"
            ),
            Self::InvalidRegistry(r) => write!(f, "{r:?} is not a valid registry host[:port]"),
            Self::InvalidRepository(r) => write!(
                f,
                "{r:?} is not a valid repository: use lower-case letters and digits separated by \
                 '.', '_', '__', '-' or '/'"
            ),
            Self::InvalidTag(t) => write!(
                f,
                "{t:?} is not a valid tag: up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'"
            ),
            Self::InvalidDigest(d) => write!(
                f,
                "{d:?} is not a valid digest: expected sha256:<64 hex digits> or sha512:<128 hex digits>"
            ),
        }
    }
}

impl std::error::Error for ImageRefError {}

impl ImageRef {
    /// Parses `reference`; see the module docs for the grammar.
    pub fn parse(reference: &str) -> Result<Self, ImageRefError> {
        if reference.is_empty() {
            return Err(ImageRefError::Empty);
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => (rest, Some(parse_digest(digest)?)),
            None => (reference, None),
        };
        // A ':' after the last '/' starts the tag; one before it belongs to a registry port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let (name, tag) = rest.split_at(last_slash + i);
                (name, Some(parse_tag(&tag[1..])?))
            }
            None => (rest, None),
        };
        if name.len() > NAME_MAX {
            return Err(ImageRefError::NameTooLong(name.len()));
        }
        let (registry, repository) = split_registry(name);
        if let Some(registry) = registry {
            if !is_registry(registry) {
                return Err(ImageRefError::InvalidRegistry(registry.to_string()));
            }
        }
        if !repository.split('/').all(is_path_component) {
            return Err(ImageRefError::InvalidRepository(repository.to_string()));
        }
        Ok(Self {
            registry: registry.map(str::to_string),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }
}

/// Like the runtimes: the first component is a registry if it looks like a host (a dot, a port
/// or `localhost`) or has capitals (never valid in a repository); otherwise Docker Hub.
fn split_registry(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

fn is_registry(registry: &str) -> bool {
    let (host, port) = if let Some(v6) = registry.strip_prefix('[') {
        match v6.split_once(']') {
            Some((addr, rest)) if is_ipv6(addr) => match rest {
                "" => return true,
                _ => match rest.strip_prefix(':') {
                    Some(port) => return is_port(port),
                    None => return false,
                },
            },
            _ => return false,
        }
    } else {
        match registry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    port.is_none_or(is_port) && !host.is_empty() && host.split('.').all(is_domain_component)
}

fn is_ipv6(addr: &str) -> bool {
    addr.contains(':')
        && addr
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
}

fn is_port(port: &str) -> bool {
    !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
}

fn is_domain_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        }
        _ => false,
    }
}

/// `[a-z0-9]+` runs joined by `.`, `_`, `__` or one or more `-`.
fn is_path_component(c: &str) -> bool {
    let is_alnum = |ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit();
    if !c.starts_with(is_alnum) || !c.ends_with(is_alnum) {
        return false;
    }
    c.split(is_alnum)
        .filter(|sep| !sep.is_empty())
        .all(|sep| matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-'))
}

fn parse_tag(tag: &str) -> Result<String, ImageRefError> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let valid = tag.len() <= 128
        && tag.starts_with(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if valid {
        Ok(tag.to_string())
    } else {
        Err(ImageRefError::InvalidTag(tag.to_string()))
    }
}

fn parse_digest(digest: &str) -> Result<String, ImageRefError> {
    let hex_len = match digest.split_once(':') {
        Some(("sha256", hex)) => (hex, 64),
        Some(("sha512", hex)) => (hex, 128),
        _ => return Err(ImageRefError::InvalidDigest(digest.to_string())),
    };
    let (hex, len) = hex_len;
    if hex.len() == len
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(digest.to_string())
    } else {
        Err(ImageRefError::InvalidDigest(digest.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:4d8ad1bd2da4c9c8ba4bc5e5b2e1a7b45c4b43cc2a3d3d2a9e4c3b0ad1b8c0f1";

    fn ok(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn docker_hub_image_with_tag() {
        assert_eq!(
            ok("questdb/questdb:9.0.0"),
            ImageRef {
                registry: None,
                repository: "questdb/questdb".into(),
                tag: Some("9.0.0".into()),
                digest: None,
            }
        );
    }

    #[test]
    fn registry_with_port_is_not_mistaken_for_a_tag() {
        let r = ok("localhost:5000/questdb/questdb");
        assert_eq!(r.registry.as_deref(), Some("localhost:5000"));
        assert_eq!(r.repository, "questdb/questdb");
        assert_eq!(r.tag, None);

        let r = ok("registry.example.com:443/team/questdb:8.2.1-patched");
        assert_eq!(r.registry.as_deref(), Some("registry.example.com:443"));
        assert_eq!(r.tag.as_deref(), Some("8.2.1-patched"));
    }

    #[test]
    fn tag_and_digest_together_and_digest_alone() {
        let r = ok(&format!("ghcr.io/questdb/questdb:9.0.0@{DIGEST}"));
        assert_eq!(r.tag.as_deref(), Some("9.0.0"));
        assert_eq!(r.digest.as_deref(), Some(DIGEST));

        let r = ok(&format!("questdb/questdb@{DIGEST}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_deref(), Some(DIGEST));
    }

    #[test]
    fn single_name_and_ipv6_registries() {
        assert_eq!(ok("questdb").repository, "questdb");
        assert_eq!(
            ok("[::1]:5000/questdb:1").registry.as_deref(),
            Some("[::1]:5000")
        );
        assert_eq!(
            ok("my_org/quest__db-x.y:latest").repository,
            "my_org/quest__db-x.y"
        );
    }

    /// An input and a check of the error it must produce.
    type Case = (&'static str, fn(&ImageRefError) -> bool);

    #[test]
    fn rejects_invalid_references() {
        let cases: &[Case] = &[
            ("", |e| matches!(e, ImageRefError::Empty)),
            ("QuestDB", |e| {
                matches!(e, ImageRefError::InvalidRepository(_))
            }),
            ("questdb/QuestDB:1", |e| {
                matches!(e, ImageRefError::InvalidRepository(_))
            }),
            ("questdb//questdb", |e| {
                matches!(e, ImageRefError::InvalidRepository(_))
            }),
            ("questdb/questdb-", |e| {
                matches!(e, ImageRefError::InvalidRepository(_))
            }),
            ("questdb/a...b", |e| {
                matches!(e, ImageRefError::InvalidRepository(_))
            }),
            ("questdb/questdb:", |e| {
                matches!(e, ImageRefError::InvalidTag(_))
            }),
            ("questdb/questdb:.hidden", |e| {
                matches!(e, ImageRefError::InvalidTag(_))
            }),
            ("questdb/questdb:9.0 .0", |e| {
                matches!(e, ImageRefError::InvalidTag(_))
            }),
            ("questdb/questdb@sha256:abc", |e| {
                matches!(e, ImageRefError::InvalidDigest(_))
            }),
            (
                "questdb/questdb@md5:0123456789abcdef0123456789abcdef",
                |e| matches!(e, ImageRefError::InvalidDigest(_)),
            ),
            ("bad_host.example.com/questdb:1", |e| {
                matches!(e, ImageRefError::InvalidRegistry(_))
            }),
            ("example.com:port/questdb", |e| {
                matches!(e, ImageRefError::InvalidRegistry(_))
            }),
        ];
        for (input, expected) in cases {
            match ImageRef::parse(input) {
                Ok(r) => panic!("{input:?} should not parse, got {r:?}"),
                Err(e) => assert!(expected(&e), "{input:?}: unexpected error {e:?}"),
            }
        }
    }

    #[test]
    fn tag_length_limit_is_128() {
        let tag = "a".repeat(128);
        assert!(ImageRef::parse(&format!("questdb:{tag}")).is_ok());
        assert!(ImageRef::parse(&format!("questdb:{tag}a")).is_err());
    }

    #[test]
    fn name_length_limit_is_255() {
        let long = format!("questdb/{}", "a".repeat(250));
        assert_eq!(
            ImageRef::parse(&long),
            Err(ImageRefError::NameTooLong(long.len()))
        );
    }

    #[test]
    fn errors_read_as_sentences() {
        let e = ImageRef::parse("questdb/questdb:").unwrap_err();
        assert!(e.to_string().contains("not a valid tag"), "{e}");
    }
}
