//! The database's memory, sized from its pod's memory limit.
//!
//! Left alone, QuestDB does not fit a container: the JVM sizes its heap from the container's
//! limit (a quarter of it by default), but QuestDB's own native allocations are capped by
//! `ram.usage.limit.percent`, 90% of the RAM the *machine* has, so a database on a 64 GiB node
//! with a 4 GiB limit may allocate far past its limit and be OOMKilled. From
//! `resources.limits.memory` (or `requests.memory` when there is no limit) the operator splits
//! the limit into
//! - the JVM heap (`-Xmx`, through `JVM_PREPEND`, which the official image's entrypoint puts
//!   on the `java` command line): a quarter, at least 256 MiB (9.2.0 keeps about 93 MiB live
//!   at start; 96 MiB heaps failed at start now and then), at most half the limit and 31 GiB
//!   (compressed object pointers);
//! - what the JVM needs beyond its heap (metaspace, code cache, thread stacks, GC): an eighth,
//!   at most 256 MiB;
//! - the page cache of the column files QuestDB maps and writes, which the kernel charges to
//!   the pod: a tenth;
//! - QuestDB's native memory, `ram.usage.limit.bytes`: the rest. Past it QuestDB refuses the
//!   allocation (a query or a commit fails with an error) instead of the kernel killing the
//!   whole database.
//!
//! A user who sets `JVM_PREPEND` in `spec.env` keeps their heap; one who sets
//! `ram.usage.limit.bytes` or `ram.usage.limit.percent` in `spec.config.server` keeps their
//! limit (and an env `QDB_RAM_USAGE_LIMIT_BYTES` overrides server.conf, as QuestDB reads it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::parse_quantity;
use crate::api::{QuestDB, QuestDBSpec};

/// The official image's entrypoint adds this variable's words to the `java` command line
/// (questdb/questdb `docker/docker-entrypoint.sh`: "Found on-demand JVM arguments").
pub const JVM_OPTIONS_ENV: &str = "JVM_PREPEND";
/// QuestDB's cap on its native (off-heap) allocations.
pub const RAM_USAGE_LIMIT_KEY: &str = "ram.usage.limit.bytes";
/// The other way to say the cap: a user who sets either keeps theirs.
const RAM_USAGE_LIMIT_KEYS: [&str; 2] = [RAM_USAGE_LIMIT_KEY, "ram.usage.limit.percent"];

const MIB: u64 = 1 << 20;
const HEAP_MIN: u64 = 256 * MIB;
/// Above 32 GiB the JVM gives up compressed object pointers: 31 GiB holds more than 33.
const HEAP_MAX: u64 = 31 * 1024 * MIB;
const JVM_OVERHEAD_MAX: u64 = 256 * MIB;

/// How a memory limit is shared out, in bytes. The four parts add up to the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySplit {
    pub limit: u64,
    /// `-Xmx`, a whole number of MiB.
    pub heap: u64,
    pub jvm_overhead: u64,
    pub page_cache: u64,
    /// `ram.usage.limit.bytes`.
    pub native: u64,
}

impl MemorySplit {
    /// The split of `limit` bytes ([`self`]'s module documentation says why each part).
    pub fn of(limit: u64) -> MemorySplit {
        let heap = (limit / 4).clamp(HEAP_MIN, HEAP_MAX).min(limit / 2) / MIB * MIB;
        let jvm_overhead = (limit / 8).min(JVM_OVERHEAD_MAX);
        let page_cache = limit / 10;
        let native = limit.saturating_sub(heap + jvm_overhead + page_cache);
        MemorySplit {
            limit,
            heap,
            jvm_overhead,
            page_cache,
            native,
        }
    }

    /// The JVM options: the heap's maximum in MiB.
    pub fn jvm_options(&self) -> String {
        format!("-Xmx{}m", self.heap / MIB)
    }
}

/// The memory the database's container may use: its limit, else its request (a pod without a
/// limit is still scheduled for its request, and QuestDB sized to it stays within it). `None`
/// when the spec sets neither, or a quantity that is not a whole number of bytes.
pub fn memory_bytes(spec: &QuestDBSpec) -> Option<u64> {
    let resources = spec.resources.as_ref()?;
    let bytes =
        memory_of(resources.limits.as_ref()).or_else(|| memory_of(resources.requests.as_ref()))?;
    (bytes >= 1.0).then_some(bytes as u64)
}

fn memory_of(list: Option<&BTreeMap<String, Quantity>>) -> Option<f64> {
    parse_quantity(&list?.get("memory")?.0)
}

/// The split for a spec that gives the container a memory size.
pub fn split(spec: &QuestDBSpec) -> Option<MemorySplit> {
    memory_bytes(spec).map(MemorySplit::of)
}

/// Whether `spec.config.server` sets QuestDB's native memory cap itself.
pub fn native_from_user(spec: &QuestDBSpec) -> bool {
    RAM_USAGE_LIMIT_KEYS
        .iter()
        .any(|k| spec.config.server.contains_key(*k))
}

/// Whether `spec.env` sets the JVM's options (and so its heap) itself.
pub fn heap_from_user(spec: &QuestDBSpec) -> bool {
    spec.env.iter().any(|e| e.name == JVM_OPTIONS_ENV)
}

/// `ram.usage.limit.bytes` for server.conf, unless the user sets the cap themselves.
pub fn ram_usage_limit(qdb: &QuestDB) -> Option<u64> {
    (!native_from_user(&qdb.spec))
        .then(|| split(&qdb.spec))
        .flatten()
        .map(|s| s.native)
}

/// The heap option as env, unless the user's `spec.env` sets [`JVM_OPTIONS_ENV`] themselves.
pub fn env(qdb: &QuestDB) -> Option<EnvVar> {
    if heap_from_user(&qdb.spec) {
        return None;
    }
    split(&qdb.spec).map(|s| EnvVar {
        name: JVM_OPTIONS_ENV.to_string(),
        value: Some(s.jvm_options()),
        ..EnvVar::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    const GIB: u64 = 1024 * MIB;

    fn with_memory(limit: Option<&str>, request: Option<&str>) -> QuestDB {
        let mut qdb = questdb("db1", "tenant-a");
        let list = |v: Option<&str>| {
            v.map(|v| BTreeMap::from([("memory".to_string(), Quantity(v.into()))]))
        };
        qdb.spec.resources = Some(ResourceRequirements {
            limits: list(limit),
            requests: list(request),
            ..ResourceRequirements::default()
        });
        qdb
    }

    #[test]
    fn every_split_adds_up_to_the_limit_and_keeps_the_heap_within_its_bounds() {
        for limit in [
            512 * MIB,
            GIB,
            1536 * MIB,
            2 * GIB,
            3 * GIB + 7,
            8 * GIB,
            64 * GIB,
            256 * GIB,
        ] {
            let s = MemorySplit::of(limit);
            assert_eq!(
                s.heap + s.jvm_overhead + s.page_cache + s.native,
                limit,
                "{s:?}"
            );
            assert!(s.heap <= limit / 2 && s.heap <= HEAP_MAX, "{s:?}");
            assert_eq!(s.heap % MIB, 0, "{s:?}");
            assert!(s.native > 0, "{s:?}");
        }
    }

    #[test]
    fn a_four_gib_database_gets_a_one_gib_heap_and_a_native_cap_that_leaves_room() {
        let s = MemorySplit::of(4 * GIB);
        assert_eq!(s.heap, GIB);
        assert_eq!(s.jvm_overhead, 256 * MIB);
        assert_eq!(s.page_cache, 4 * GIB / 10);
        assert_eq!(s.native, 4 * GIB - GIB - 256 * MIB - 4 * GIB / 10);
        assert_eq!(s.jvm_options(), "-Xmx1024m");
    }

    #[test]
    fn small_limits_keep_the_heap_questdb_needs_to_start_and_large_ones_stop_at_31_gib() {
        assert_eq!(MemorySplit::of(GIB).heap, 256 * MIB);
        // Half the limit at most, even below the floor: the rest must fit somewhere.
        assert_eq!(MemorySplit::of(384 * MIB).heap, 192 * MIB);
        assert_eq!(MemorySplit::of(512 * GIB).heap, HEAP_MAX);
    }

    #[test]
    fn the_limit_wins_over_the_request_and_the_request_serves_without_a_limit() {
        let both = with_memory(Some("2Gi"), Some("1Gi"));
        assert_eq!(memory_bytes(&both.spec), Some(2 * GIB));
        let request_only = with_memory(None, Some("1Gi"));
        assert_eq!(memory_bytes(&request_only.spec), Some(GIB));
        let decimal = with_memory(Some("2G"), None);
        assert_eq!(memory_bytes(&decimal.spec), Some(2_000_000_000));
        assert_eq!(memory_bytes(&questdb("db1", "tenant-a").spec), None);
        assert_eq!(memory_bytes(&with_memory(None, None).spec), None);
    }

    #[test]
    fn a_database_without_a_memory_size_gets_no_memory_settings() {
        let qdb = questdb("db1", "tenant-a");
        assert_eq!(env(&qdb), None);
        assert_eq!(ram_usage_limit(&qdb), None);
    }

    #[test]
    fn the_users_own_heap_and_native_cap_are_kept() {
        let mut qdb = with_memory(Some("4Gi"), None);
        assert_eq!(
            env(&qdb).and_then(|e| e.value),
            Some("-Xmx1024m".to_string())
        );
        assert_eq!(ram_usage_limit(&qdb), Some(MemorySplit::of(4 * GIB).native));
        qdb.spec.env.push(EnvVar {
            name: JVM_OPTIONS_ENV.into(),
            value: Some("-Xmx3g".into()),
            ..EnvVar::default()
        });
        assert_eq!(env(&qdb), None);
        for key in RAM_USAGE_LIMIT_KEYS {
            let mut qdb = qdb.clone();
            qdb.spec.config.server.insert(key.into(), "50".into());
            assert_eq!(ram_usage_limit(&qdb), None, "{key}");
        }
    }
}
