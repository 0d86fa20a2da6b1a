//! What `status` tells users: where to connect, and which version is running.

use kube::ResourceExt;

use super::image_ref::ImageRef;
use super::{names, HTTP_PORT, ILP_PORT, PGWIRE_PORT};
use crate::api::{Endpoints, QuestDB};

/// Length of a digest shown as a version: enough to tell builds apart, short enough for a column.
const SHORT_DIGEST_HEX: usize = 12;

/// In-cluster `host:port` of each protocol through the client Service, e.g.
/// `db1.tenant-a.svc:8812`. The `.svc` form works from any namespace without assuming the
/// cluster domain is `cluster.local`.
pub fn endpoints(qdb: &QuestDB) -> Endpoints {
    let host = format!(
        "{}.{}.svc",
        names::client_service(qdb),
        qdb.namespace().unwrap_or_default()
    );
    Endpoints {
        http: format!("{host}:{HTTP_PORT}"),
        pgwire: format!("{host}:{PGWIRE_PORT}"),
        ilp: format!("{host}:{ILP_PORT}"),
    }
}

/// The version an image runs, for `status.version`: its tag (`9.0.0`), or for a digest-only
/// reference the algorithm and the first 12 hex digits (`sha256:4d8ad1bd2da4`). `None` when the
/// image names no version: no tag (the runtime pulls `latest`), an explicit `latest`, or an
/// unparsable reference, because "latest" says nothing about what is actually running.
pub fn version_of(image: &str) -> Option<String> {
    let parsed = ImageRef::parse(image).ok()?;
    match (parsed.tag, parsed.digest) {
        (Some(tag), _) if tag != "latest" => Some(tag),
        (Some(_), _) => None,
        (None, Some(digest)) => {
            let (algorithm, hex) = digest.split_once(':')?;
            Some(format!(
                "{algorithm}:{}",
                &hex[..SHORT_DIGEST_HEX.min(hex.len())]
            ))
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;

    #[test]
    fn endpoints_point_at_the_client_service() {
        let e = endpoints(&questdb("db1", "tenant-a"));
        assert_eq!(e.http, "db1.tenant-a.svc:9000");
        assert_eq!(e.pgwire, "db1.tenant-a.svc:8812");
        assert_eq!(e.ilp, "db1.tenant-a.svc:9009");
    }

    #[test]
    fn version_is_the_tag() {
        assert_eq!(
            version_of("questdb/questdb:9.0.0").as_deref(),
            Some("9.0.0")
        );
        assert_eq!(
            version_of("localhost:5000/questdb/questdb:8.2.1").as_deref(),
            Some("8.2.1")
        );
    }

    #[test]
    fn version_prefers_the_tag_over_the_digest() {
        let image = "questdb/questdb:9.0.0@sha256:4d8ad1bd2da4c9c8ba4bc5e5b2e1a7b45c4b43cc2a3d3d2a9e4c3b0ad1b8c0f1";
        assert_eq!(version_of(image).as_deref(), Some("9.0.0"));
    }

    #[test]
    fn digest_only_image_shows_a_short_digest() {
        let image = "questdb/questdb@sha256:4d8ad1bd2da4c9c8ba4bc5e5b2e1a7b45c4b43cc2a3d3d2a9e4c3b0ad1b8c0f1";
        assert_eq!(version_of(image).as_deref(), Some("sha256:4d8ad1bd2da4"));
    }

    #[test]
    fn floating_or_unparsable_images_have_no_version() {
        assert_eq!(version_of("questdb/questdb"), None);
        assert_eq!(version_of("questdb/questdb:latest"), None);
        assert_eq!(version_of("Not An Image"), None);
    }
}
