//! The reload step: carries out `plan::config_reload` against the running database. It asks
//! `SHOW PARAMETERS` only while the recorded digest is not the spec's, so a converged database
//! costs no query and no write.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use tracing::{debug, info};

use crate::api::{ConfigApplied, ConfigStatus, EventReason, QuestDB};
use crate::controllers::cached_pod::CachedPod;
use crate::controllers::context::Context;
use crate::controllers::write_health::{self, Logins};
use crate::controllers::Error;
use crate::desired::reload::{self, Settle};
use crate::plan::config_reload::{decide, record, ConfigStep, ConfigView, RELOAD_RETRY};
use crate::questdb_http::Database;

use super::record as status_record;

/// What the pod template asks for, as its annotations carry it.
pub(super) struct TemplateMarks {
    pub config_hash: Option<String>,
    pub restarted_for: Option<String>,
}

/// What the step leaves to the reconcile.
#[derive(Default)]
pub(super) struct Outcome {
    /// When to look again (`None`: the next change wakes it).
    pub again: Option<Duration>,
    /// A record no side effect waits for: it goes with the reconcile's own status write.
    pub status: Option<ConfigStatus>,
}

/// How long a database that cannot be asked (its HTTP port unreachable from the operator, a
/// query refused) waits for the next question, unless a reload is under way.
const ASK_AGAIN: Duration = Duration::from_secs(60);

/// Runs one step.
pub(super) async fn step(
    qdb: &mut QuestDB,
    ctx: &Context,
    template: &TemplateMarks,
    pod: Option<&CachedPod>,
) -> Result<Outcome, Error> {
    let wanted = reload::reloadable_digest(qdb);
    let status = qdb.status.as_ref().and_then(|s| s.config.clone());
    let mark = |key: &str| {
        pod.and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(key))
            .cloned()
    };
    let pod_hash = mark(crate::desired::CONFIG_HASH_ANNOTATION);
    let pod_restarted_for = mark(crate::desired::CONFIG_RESTART_ANNOTATION);
    let view = ConfigView {
        wanted: &wanted,
        status: status.as_ref(),
        pod_ready: pod.is_some_and(super::status::pod_ready),
        pod_current: pod_hash.is_some()
            && pod_hash == template.config_hash
            && pod_restarted_for == template.restarted_for,
        pod_restarted_for: pod_restarted_for.as_deref(),
        now: Timestamp::now(),
    };
    let mut step = decide(&view, None);
    let mut database = None;
    if step == ConfigStep::Ask {
        let Some((db, settle)) = ask(qdb, ctx).await else {
            let reloading = status
                .as_ref()
                .is_some_and(|s| s.reloading_digest.as_deref() == Some(wanted.as_str()));
            return Ok(Outcome {
                again: Some(if reloading { RELOAD_RETRY } else { ASK_AGAIN }),
                status: None,
            });
        };
        step = decide(&view, Some(&settle));
        database = Some(db);
    }
    let recorded = record(&view, &step);
    if let ConfigStep::Record(by) = step {
        announce_applied(qdb, ctx, by).await;
        return Ok(Outcome {
            again: None,
            status: recorded,
        });
    }
    if let Some(new) = recorded {
        // Before its side effect: the reload's clock, or the template's restart mark.
        status_record::persist(qdb, ctx, |s| s.config = Some(new.clone())).await?;
    }
    match step {
        ConfigStep::Idle | ConfigStep::Ask | ConfigStep::Record(_) => Ok(Outcome::default()),
        ConfigStep::Restart { keys, timed_out } => {
            let why = if timed_out {
                "the mounted file did not bring them within the reload timeout"
            } else {
                "the running version cannot reload them"
            };
            info!(questdb = %qdb.name_any(), ?keys, why, "restarting the database for settings");
            ctx.event(
                qdb,
                EventType::Normal,
                EventReason::ConfigRestart,
                "Restart",
                format!("restarting for {}: {why}", keys.join(", ")),
            )
            .await;
            Ok(Outcome::default())
        }
        ConfigStep::Reload { .. } => {
            let retry = Outcome {
                again: Some(RELOAD_RETRY),
                status: None,
            };
            let Some(db) = database else {
                return Ok(retry);
            };
            if let Err(e) = db.reload_config().await {
                debug!(questdb = %qdb.name_any(), error = %e, "reload_config() failed; trying again");
                return Ok(retry);
            }
            // The kubelet may have brought the file already: then the reload took it now.
            if !matches!(settle_of(qdb, &db).await, Some(Settle::Settled)) {
                return Ok(retry);
            }
            let status = qdb.status.as_ref().and_then(|s| s.config.clone());
            let view = ConfigView {
                status: status.as_ref(),
                now: Timestamp::now(),
                ..view
            };
            announce_applied(qdb, ctx, ConfigApplied::Reload).await;
            Ok(Outcome {
                again: None,
                status: record(&view, &ConfigStep::Record(ConfigApplied::Reload)),
            })
        }
    }
}

/// Connects to the database and compares its parameters with the spec's settings; `None`
/// when it cannot be asked now.
async fn ask(qdb: &QuestDB, ctx: &Context) -> Option<(Database, Settle)> {
    let mut logins = Logins::new();
    let db = write_health::connect(ctx, qdb, None, &mut logins).await?;
    let settle = settle_of(qdb, &db).await?;
    Some((db, settle))
}

async fn settle_of(qdb: &QuestDB, db: &Database) -> Option<Settle> {
    match db.parameters(reload::RELOADABLE_KEYS).await {
        Ok(rows) => Some(reload::settle(&reload::reloadable_in_file(qdb), &rows)),
        Err(e) => {
            debug!(questdb = %qdb.name_any(), error = %e, "could not read the database's parameters");
            None
        }
    }
}

async fn announce_applied(qdb: &QuestDB, ctx: &Context, by: ConfigApplied) {
    if by != ConfigApplied::Reload {
        return;
    }
    let keys: Vec<String> = reload::reloadable_settings(qdb).into_keys().collect();
    let what = if keys.is_empty() {
        "the reloadable settings' defaults".to_string()
    } else {
        keys.join(", ")
    };
    info!(questdb = %qdb.name_any(), settings = %what, "settings reloaded without a restart");
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::ConfigReloaded,
        "Reload",
        format!("reloaded in place, no restart ({what}); the database reports every value"),
    )
    .await;
}
