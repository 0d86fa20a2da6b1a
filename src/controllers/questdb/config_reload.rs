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
use crate::controllers::Error;
use crate::desired::credentials::{self, PgCredentials};
use crate::desired::reload::{self, Settle};
use crate::plan::config_reload::{decide, record, ConfigStep, ConfigView, RELOAD_RETRY};
use crate::questdb_http::{Database, Login, QueryError};
use crate::questdb_pgwire;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

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

/// How long a pgwire login may take before the database counts as not answering.
const LOGIN_LIMIT: Duration = Duration::from_secs(3);

/// The digest `status.config` records: the spec's reloadable settings and the pgwire users of
/// the credentials Secret (`pg_digest`, from its check), which reach `server.conf` too.
pub(crate) fn wanted_digest(qdb: &QuestDB, pg_digest: Option<&str>) -> String {
    let settings = reload::reloadable_digest(qdb);
    match pg_digest {
        Some(pg) => format!("{settings}-{}", pg.get(..8).unwrap_or(pg)),
        None => settings,
    }
}

/// Runs one step. `pg_digest`: the credentials Secret's pgwire digest, once it is usable.
pub(super) async fn step(
    qdb: &mut QuestDB,
    ctx: &Context,
    template: &TemplateMarks,
    pod: Option<&CachedPod>,
    pg_digest: Option<&str>,
) -> Result<Outcome, Error> {
    let wanted = wanted_digest(qdb, pg_digest);
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
        let Some((db, settle)) = ask(qdb, ctx, pod).await else {
            let reloading = status
                .as_ref()
                .is_some_and(|s| s.reloading_digest.as_deref() == Some(wanted.as_str()));
            return Ok(Outcome {
                again: Some(if reloading { RELOAD_RETRY } else { ASK_AGAIN }),
                status: None,
            });
        };
        step = decide(&view, Some(&settle));
        // A version that cannot report its parameters, looked at for the first time: it read
        // its file at start, so what it runs is recorded, not restarted for.
        let first_look = status
            .as_ref()
            .and_then(|s| s.applied_digest.as_ref())
            .is_none();
        if first_look && settle == refused_parameters() {
            step = ConfigStep::Record(ConfigApplied::Restart);
        }
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
            if let Err(e) = db.http.reload_config().await {
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

/// What a database that refuses `SHOW PARAMETERS` needs for any change of its file.
fn refused_parameters() -> Settle {
    Settle::NeedsRestart(vec![
        "every reloadable setting (this version refuses SHOW PARAMETERS)".to_string(),
    ])
}

/// The database at the pod's address, with the credentials Secret's logins.
struct Asked {
    http: Database,
    pgwire: std::net::SocketAddr,
    pg: Option<PgCredentials>,
}

/// Connects to the database and compares its parameters (and, for the pgwire users, a login
/// with each) with what `server.conf` holds; `None` when it cannot be asked now.
async fn ask(qdb: &QuestDB, ctx: &Context, pod: Option<&CachedPod>) -> Option<(Asked, Settle)> {
    let ip: std::net::IpAddr = pod?.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    let ns = qdb.namespace()?;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret = api
        .get_opt(&credentials::secret_name(qdb))
        .await
        .ok()
        .flatten();
    let login = secret.as_ref().and_then(Login::from_secret);
    let pg = secret
        .and_then(|s| s.data)
        .and_then(|d| PgCredentials::from_data(&d));
    let asked = Asked {
        http: Database::at(
            std::net::SocketAddr::new(ip, crate::desired::HTTP_PORT as u16),
            login.as_ref(),
        ),
        pgwire: std::net::SocketAddr::new(ip, crate::desired::PGWIRE_PORT as u16),
        pg,
    };
    let settle = settle_of(qdb, &asked).await?;
    Some((asked, settle))
}

async fn settle_of(qdb: &QuestDB, asked: &Asked) -> Option<Settle> {
    let mut wanted = reload::reloadable_in_file(qdb);
    if let Some(pg) = &asked.pg {
        wanted.insert("pg.user".into(), pg.user.clone());
        wanted.insert("pg.readonly.user".into(), pg.readonly_user.clone());
    }
    let settle = match asked.http.parameters(reload::RELOADABLE_KEYS).await {
        Ok(rows) => reload::settle(&wanted, &rows),
        // It answered, and refused: a version without `SHOW PARAMETERS`' columns (or without
        // the function) cannot say what it reloads, so what the file brings needs a restart;
        // polling it would never end.
        Err(QueryError::Refused { message, .. }) => {
            debug!(questdb = %qdb.name_any(), %message, "the database refused SHOW PARAMETERS");
            return Some(refused_parameters());
        }
        Err(e) => {
            debug!(questdb = %qdb.name_any(), error = %e, "could not read the database's parameters");
            return None;
        }
    };
    if settle != Settle::Settled {
        return Some(settle);
    }
    // Passwords are masked in the parameters: a login says whether the new one took.
    let Some(pg) = &asked.pg else {
        return Some(settle);
    };
    let mut refused = vec![];
    for (key, user, password) in [
        ("pg.password", &pg.user, &pg.password),
        (
            "pg.readonly.password",
            &pg.readonly_user,
            &pg.readonly_password,
        ),
    ] {
        match questdb_pgwire::logs_in(asked.pgwire, user, password, LOGIN_LIMIT).await {
            Ok(true) => {}
            Ok(false) => refused.push(key.to_string()),
            Err(e) => {
                debug!(questdb = %qdb.name_any(), error = %e, "could not log in over pgwire");
                return None;
            }
        }
    }
    Some(if refused.is_empty() {
        Settle::Settled
    } else {
        Settle::Pending(refused)
    })
}

async fn announce_applied(qdb: &QuestDB, ctx: &Context, by: ConfigApplied) {
    if by != ConfigApplied::Reload {
        return;
    }
    let keys: Vec<String> = reload::reloadable_settings(qdb).into_keys().collect();
    let settings = if keys.is_empty() {
        "no reloadable setting in spec.config.server (QuestDB's defaults)".to_string()
    } else {
        keys.join(", ")
    };
    let secret = credentials::secret_name(qdb);
    info!(questdb = %qdb.name_any(), %settings, %secret, "settings and pgwire users reloaded without a restart");
    // The note names what is in force, not what changed: the digest alone says a change.
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::ConfigReloaded,
        "Reload",
        format!(
            "reloaded in place, no restart: {settings}, and the pgwire users of Secret {secret}; the database reports every value and accepts their logins"
        ),
    )
    .await;
}
