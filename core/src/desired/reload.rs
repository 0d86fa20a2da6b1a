//! Settings QuestDB takes without a restart, and how to tell that it took them.
//!
//! QuestDB re-reads `server.conf` when asked (`select reload_config()`) and applies the keys its
//! `SHOW PARAMETERS` marks `reloadable`; any other changed key it ignores ("was modified in the
//! config file but cannot be reloaded. Ignoring new value"), and a removed reloadable key goes
//! back to its default (all checked on 9.2.0). So the pod template's config hash leaves out the
//! reloadable keys of `spec.config.server` ([`restart_view`]): a change of only those reaches
//! the running database through the mounted file and a reload, anything else restarts it.
//! Whether the database took a change is never assumed: [`settle`] compares what
//! `SHOW PARAMETERS` reports with what the spec asks.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::api::QuestDB;

/// The keys QuestDB 9.2.0 reports `reloadable` (`(show parameters) where reloadable`). An upper
/// bound, not a promise: a version that does not report one of them reloadable is
/// restarted for it ([`Settle::NeedsRestart`]).
pub const RELOADABLE_KEYS: &[&str] = &[
    "cairo.mat.view.insert.as.select.batch.size",
    "cairo.mat.view.max.refresh.intervals",
    "cairo.mat.view.max.refresh.retries",
    "cairo.mat.view.rows.per.query.estimate",
    "cairo.parquet.export.copy.report.frequency.lines",
    "cairo.sql.asof.join.evacuation.threshold",
    "cairo.sql.asof.join.short.circuit.cache.capacity",
    "cairo.sql.copy.export.root",
    "cairo.sql.jit.max.in.list.size.threshold",
    "http.export.connection.limit",
    "http.ilp.connection.limit",
    "http.json.query.connection.limit",
    "http.multipart.header.buffer.size",
    "http.net.connection.limit",
    "http.recv.buffer.size",
    "http.request.header.buffer.size",
    "http.send.buffer.size",
    "line.http.max.recv.buffer.size",
    "line.tcp.net.connection.limit",
    "pg.named.statement.limit",
    "pg.net.connection.limit",
    "pg.password",
    "pg.readonly.password",
    "pg.readonly.user",
    "pg.readonly.user.enabled",
    "pg.recv.buffer.size",
    "pg.send.buffer.size",
    "pg.user",
    "query.tracing.enabled",
];

/// Whether `key` is one QuestDB can reload in place.
pub fn reloadable(key: &str) -> bool {
    RELOADABLE_KEYS.contains(&key)
}

/// The reloadable settings the spec asks for: the user's keys QuestDB can reload (the
/// operator's own keys are never reloadable, and the credentials are not the spec's).
pub fn reloadable_settings(qdb: &QuestDB) -> BTreeMap<String, String> {
    qdb.spec
        .config
        .server
        .iter()
        .filter(|(k, _)| reloadable(k) && !crate::api::RESERVED_SERVER_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Every reloadable key `server.conf` sets, with its value: the operator's own (such as
/// `pg.readonly.user.enabled`) and [`reloadable_settings`]. What [`settle`] compares with.
pub fn reloadable_in_file(qdb: &QuestDB) -> BTreeMap<String, String> {
    let mut settings: BTreeMap<String, String> =
        super::config::reserved_server_properties(qdb.spec.ilp_auth.enabled)
            .into_iter()
            .filter(|(k, _)| reloadable(k))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    settings.extend(reloadable_settings(qdb));
    settings
}

/// A short digest of [`reloadable_settings`]: what `status.config.reloadableDigest` records
/// once the database reports every one of them.
pub fn reloadable_digest(qdb: &QuestDB) -> String {
    let mut hasher = Sha256::new();
    for (key, value) in reloadable_settings(qdb) {
        for field in [key, value] {
            hasher.update((field.len() as u64).to_be_bytes());
            hasher.update(field.as_bytes());
        }
    }
    hex::encode(&hasher.finalize()[..8])
}

/// `server_conf` without the user's reloadable settings, and without comments (the user's
/// block has a heading only while it has settings): what the restart hash covers.
pub fn restart_view(server_conf: &str, qdb: &QuestDB) -> String {
    let settings = reloadable_settings(qdb);
    let user_lines: std::collections::BTreeSet<String> = settings
        .iter()
        .map(|(k, v)| super::config::property_line(k, v))
        .collect();
    server_conf
        .lines()
        .filter(|line| !line.starts_with('#') && !user_lines.contains(*line))
        .fold(String::new(), |mut out, line| {
            out.push_str(line);
            out.push('\n');
            out
        })
}

/// One row of QuestDB's `SHOW PARAMETERS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub key: String,
    pub value: String,
    /// `default`, `conf` or `env`.
    pub source: String,
    pub sensitive: bool,
    pub reloadable: bool,
}

/// What the running database's parameters say of the wanted reloadable settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// It runs with every one of them (and with none the spec no longer sets).
    Settled,
    /// These differ, and the database can take them in place: a reload (again), once the
    /// kubelet has refreshed the mounted file.
    Pending(Vec<String>),
    /// These differ and this version cannot reload them (or does not know them): a restart.
    NeedsRestart(Vec<String>),
}

/// Compares `reported` (the rows of [`RELOADABLE_KEYS`]) with `wanted` ([`reloadable_in_file`]).
/// A key the pod's environment sets is the environment's (QuestDB's env wins over the file),
/// and a sensitive value is masked in the report: neither can be compared.
pub fn settle(wanted: &BTreeMap<String, String>, reported: &[Parameter]) -> Settle {
    let mut pending = vec![];
    let mut restart = vec![];
    for key in RELOADABLE_KEYS {
        let want = wanted.get(*key);
        let Some(row) = reported.iter().find(|p| p.key == *key) else {
            if want.is_some() {
                restart.push(key.to_string());
            }
            continue;
        };
        if row.source == "env" || row.sensitive {
            continue;
        }
        let differs = match want {
            Some(value) => !same_value(value, &row.value),
            // Removed from the spec: the file's value goes at the next reload.
            None => row.source == "conf",
        };
        if !differs {
            continue;
        }
        if row.reloadable {
            pending.push(key.to_string());
        } else {
            restart.push(key.to_string());
        }
    }
    if !restart.is_empty() {
        Settle::NeedsRestart(restart)
    } else if !pending.is_empty() {
        Settle::Pending(pending)
    } else {
        Settle::Settled
    }
}

/// Whether the spec's `wanted` and the reported `value` are the same setting: QuestDB reports
/// sizes in bytes (`2m` is `2097152`) and booleans in lower case.
fn same_value(wanted: &str, value: &str) -> bool {
    let (wanted, value) = (wanted.trim(), value.trim());
    if wanted == value || wanted.eq_ignore_ascii_case(value) && is_bool(value) {
        return true;
    }
    matches!((size(wanted), size(value)), (Some(a), Some(b)) if a == b)
}

fn is_bool(s: &str) -> bool {
    s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false")
}

/// A QuestDB size (`Numbers.parseLongSize`: digits, then `k`, `m` or `g`, any case) in bytes.
fn size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&s[..i], Some(c.to_ascii_lowercase())),
        _ => (s, None),
    };
    let n: u64 = digits.parse().ok()?;
    let factor = match unit {
        None => 1,
        Some('k') => 1 << 10,
        Some('m') => 1 << 20,
        Some('g') => 1 << 30,
        Some(_) => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::testing::questdb;

    fn row(key: &str, value: &str, source: &str, reloadable: bool) -> Parameter {
        Parameter {
            key: key.into(),
            value: value.into(),
            source: source.into(),
            sensitive: false,
            reloadable,
        }
    }

    fn wanted(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_users_reloadable_keys_are_reloadable_settings() {
        let mut qdb = questdb("db", "ns");
        qdb.spec.config.server = BTreeMap::from([
            ("pg.net.connection.limit".into(), "20".into()),
            ("cairo.wal.enabled.default".into(), "true".into()),
            // Reserved (the credentials are never the spec's), reloadable or not.
            ("pg.password".into(), "x".into()),
        ]);
        assert_eq!(
            reloadable_settings(&qdb),
            wanted(&[("pg.net.connection.limit", "20")])
        );
    }

    #[test]
    fn the_operators_own_reloadable_keys_are_compared_too() {
        let mut qdb = questdb("db", "ns");
        qdb.spec
            .config
            .server
            .insert("pg.net.connection.limit".into(), "20".into());
        let in_file = reloadable_in_file(&qdb);
        assert_eq!(
            in_file,
            wanted(&[
                ("pg.net.connection.limit", "20"),
                ("pg.readonly.user.enabled", "true")
            ])
        );
        // The database started with both: nothing pending for the operator's key.
        let rows = [
            row("pg.net.connection.limit", "20", "conf", true),
            row("pg.readonly.user.enabled", "true", "conf", true),
        ];
        assert_eq!(settle(&in_file, &rows), Settle::Settled);
    }

    #[test]
    fn a_reloadable_change_leaves_the_restart_view_alone_and_any_other_change_does_not() {
        let mut qdb = questdb("db", "ns");
        qdb.spec.config.server = BTreeMap::from([
            ("pg.net.connection.limit".into(), "20".into()),
            ("cairo.wal.enabled.default".into(), "true".into()),
        ]);
        let view = |qdb: &QuestDB| restart_view(&super::super::server_conf(qdb, false), qdb);
        let before = view(&qdb);
        assert!(!before.contains("pg.net.connection.limit"));
        assert!(before.contains("cairo.wal.enabled.default=true"));
        let digest = reloadable_digest(&qdb);

        let mut reloadable_change = qdb.clone();
        reloadable_change
            .spec
            .config
            .server
            .insert("pg.net.connection.limit".into(), "30".into());
        assert_eq!(view(&reloadable_change), before);
        assert_ne!(reloadable_digest(&reloadable_change), digest);

        // The last reloadable setting taken out: its block's heading goes with it.
        let mut emptied = qdb.clone();
        emptied.spec.config.server.remove("pg.net.connection.limit");
        assert_eq!(view(&emptied), before);
        let mut only_reloadable = qdb.clone();
        only_reloadable
            .spec
            .config
            .server
            .remove("cairo.wal.enabled.default");
        let mut none = only_reloadable.clone();
        none.spec.config.server.clear();
        assert_eq!(view(&none), view(&only_reloadable));

        let mut other_change = qdb.clone();
        other_change
            .spec
            .config
            .server
            .insert("cairo.wal.enabled.default".into(), "false".into());
        assert_ne!(view(&other_change), before);
        assert_eq!(reloadable_digest(&other_change), digest);
    }

    #[test]
    fn the_database_reporting_every_wanted_value_is_settled() {
        let rows = [
            row("pg.net.connection.limit", "20", "conf", true),
            row("http.send.buffer.size", "2097152", "conf", true),
            row("query.tracing.enabled", "true", "conf", true),
            row("pg.named.statement.limit", "10000", "default", true),
        ];
        let want = wanted(&[
            ("pg.net.connection.limit", "20"),
            ("http.send.buffer.size", "2m"),
            ("query.tracing.enabled", "TRUE"),
        ]);
        assert_eq!(settle(&want, &rows), Settle::Settled);
    }

    #[test]
    fn a_value_the_file_has_not_brought_yet_is_pending() {
        let rows = [row("pg.net.connection.limit", "64", "default", true)];
        assert_eq!(
            settle(&wanted(&[("pg.net.connection.limit", "20")]), &rows),
            Settle::Pending(vec!["pg.net.connection.limit".into()])
        );
    }

    #[test]
    fn a_setting_removed_from_the_spec_is_pending_until_the_database_drops_it() {
        let rows = [row("pg.net.connection.limit", "20", "conf", true)];
        assert_eq!(
            settle(&wanted(&[]), &rows),
            Settle::Pending(vec!["pg.net.connection.limit".into()])
        );
        let dropped = [row("pg.net.connection.limit", "64", "default", true)];
        assert_eq!(settle(&wanted(&[]), &dropped), Settle::Settled);
    }

    #[test]
    fn a_version_that_cannot_reload_or_does_not_know_a_key_needs_a_restart() {
        let rows = [row("pg.net.connection.limit", "64", "default", false)];
        let want = wanted(&[("pg.net.connection.limit", "20")]);
        assert_eq!(
            settle(&want, &rows),
            Settle::NeedsRestart(vec!["pg.net.connection.limit".into()])
        );
        assert_eq!(
            settle(&want, &[]),
            Settle::NeedsRestart(vec!["pg.net.connection.limit".into()])
        );
    }

    #[test]
    fn what_the_environment_sets_or_masks_is_not_compared() {
        let mut masked = row("pg.readonly.user", "****", "conf", true);
        masked.sensitive = true;
        let rows = [row("pg.net.connection.limit", "64", "env", true), masked];
        let want = wanted(&[
            ("pg.net.connection.limit", "20"),
            ("pg.readonly.user", "reader"),
        ]);
        assert_eq!(settle(&want, &rows), Settle::Settled);
    }

    #[test]
    fn sizes_compare_in_bytes_and_other_text_exactly() {
        assert!(same_value("2m", "2097152"));
        assert!(same_value("64K", "65536"));
        assert!(same_value(" 20 ", "20"));
        assert!(!same_value("2m", "2000000"));
        assert!(!same_value("export", "Export"));
        assert!(same_value("False", "false"));
        assert_eq!(size("1g"), Some(1 << 30));
        assert_eq!(size("x"), None);
        assert_eq!(size("99999999999999999999g"), None);
    }
}
