//! A real QuestDB behind the database pod (the test environment's kubelet runs the Maven jar
//! of the image's version): what the operator renders is what QuestDB reads, and data is
//! counted in rows.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use questdb_operator::api::QuestDB;
use questdb_operator::desired::credentials;
use questdb_operator::ilp_auth::testing::TestKey;
use questdb_testenv::{ControlPlaneOptions, Databases};

use crate::db_client::{self, count, exec, ilp_http, ilp_tcp, parameter, psql, Login};
use crate::harness::{cluster, has_condition, is_ready, wait_for, wait_for_event, wait_until, Env};

pub(crate) const NS: &str = "db";

/// The control plane with real QuestDB processes for database pods.
pub(crate) async fn env() -> Env {
    let options = ControlPlaneOptions {
        databases: Databases::Real,
        ..cluster()
    };
    let env = Env::start_on(options, Default::default(), crate::harness::questdb_crd()).await;
    env.namespace(NS).await;
    env
}

/// A version Maven Central serves (the test environment runs its jar).
pub const VERSION: &str = "9.2.0";

pub fn real(q: &mut QuestDB) {
    q.spec.image = format!("questdb/questdb:{VERSION}");
}

/// The generated (or named) credentials, as a client would read them from the Secret.
pub(crate) struct Credentials(BTreeMap<String, String>);

impl Credentials {
    pub(crate) async fn of(env: &Env, secret: &str) -> Credentials {
        let s: Secret = env.api(NS).get(secret).await.expect("credentials Secret");
        Credentials(
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8(v.0).expect("utf-8")))
                .collect(),
        )
    }

    pub(crate) fn http(&self) -> Login<'_> {
        Some((
            &self.0[credentials::HTTP_USER],
            &self.0[credentials::HTTP_PASSWORD],
        ))
    }

    fn pg(&self) -> (&str, &str) {
        (
            &self.0[credentials::PG_USER],
            &self.0[credentials::PG_PASSWORD],
        )
    }

    fn readonly(&self) -> (&str, &str) {
        (
            &self.0[credentials::PG_READONLY_USER],
            &self.0[credentials::PG_READONLY_PASSWORD],
        )
    }
}

/// The database pod's address (its own loopback address in the test environment).
/// Pauses or unpauses the QuestDB `name` in [`NS`].
pub(crate) async fn set_paused(env: &Env, name: &str, paused: bool) {
    env.api::<QuestDB>(NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": paused}})),
        )
        .await
        .expect("paused changed");
}

pub(crate) async fn pod_ip(env: &Env, name: &str) -> String {
    let pod: Pod = env.api(NS).get(&format!("{name}-0")).await.expect("pod");
    pod.status
        .and_then(|s| s.pod_ip)
        .expect("a running pod has an IP")
}

/// Ready, and its HTTP port answering (anything, 401 included): the probes watch the health
/// port, and a QuestDB just started on a loaded machine may answer its first query later.
pub(crate) async fn ready(env: &Env, name: &str) -> QuestDB {
    let q = wait_for(
        &env.api(NS),
        name,
        "QuestDB Ready on a real QuestDB",
        is_ready(),
    )
    .await;
    let http = format!("{}:9000", pod_ip(env, name).await);
    wait_until("the database's HTTP port answers", || {
        let http = http.clone();
        async move { exec(&http, "select 1", None).await.is_ok() }
    })
    .await;
    q
}

fn line(table: &str, i: usize) -> String {
    format!("{table},src=test v={i}i\n")
}

pub(crate) fn lines(table: &str, n: usize) -> String {
    (0..n).map(|i| line(table, i)).collect()
}

/// Waits until `table` holds exactly `want` rows (ILP commits on its own schedule).
/// On timeout the failure shows the count QuestDB gave and its log tail.
pub(crate) async fn rows_become(env: &Env, addr: &str, table: &str, want: i64, login: Login<'_>) {
    let deadline = tokio::time::Instant::now() + crate::harness::TIMEOUT;
    loop {
        let now = count(addr, table, login).await;
        if now == Some(want) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "{table} holds {now:?} rows, not {want}; QuestDB's log:\n{}",
                env.cp.database_log(NS, "db1-0")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_database_never_accepts_anonymous_queries_writes_or_the_default_password() {
    let env = env().await;
    env.create_questdb(NS, "db1", real).await;
    let q = ready(&env, "db1").await;
    let status = q.status.clone().unwrap_or_default();
    assert_eq!(
        status.credentials_secret.as_deref(),
        Some("db1-credentials")
    );
    let creds = Credentials::of(&env, "db1-credentials").await;
    let ip = pod_ip(&env, "db1").await;
    let http = format!("{ip}:9000");

    // Anonymous and wrong-password HTTP: refused, and nothing is written.
    assert_eq!(exec(&http, "select 1", None).await.unwrap().0, 401);
    let wrong = Some((creds.http().unwrap().0, "quest"));
    assert_eq!(exec(&http, "select 1", wrong).await.unwrap().0, 401);
    assert_eq!(
        ilp_http(&http, &lines("anon", 10), None).await.unwrap(),
        401
    );
    // With the generated login: acknowledged writes are there, row for row.
    assert_eq!(
        ilp_http(&http, &lines("acked", 100), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(&env, &http, "acked", 100, creds.http()).await;
    assert_eq!(
        count(&http, "anon", creds.http()).await,
        None,
        "no anonymous table"
    );

    // pgwire: QuestDB's default admin/quest is refused; the generated users work, and the
    // read-only one cannot write.
    assert!(psql(&ip, 8812, "admin", "quest", "select 1").await.is_err());
    let (user, password) = creds.pg();
    assert_eq!(
        psql(&ip, 8812, user, password, "select count() from acked").await,
        Ok("100".into())
    );
    psql(
        &ip,
        8812,
        user,
        password,
        "insert into acked(src, v, timestamp) values('pg', 1, now())",
    )
    .await
    .expect("the pgwire user writes");
    rows_become(&env, &http, "acked", 101, creds.http()).await;
    let (reader, reader_password) = creds.readonly();
    assert_eq!(
        psql(
            &ip,
            8812,
            reader,
            reader_password,
            "select count() from acked"
        )
        .await,
        Ok("101".into())
    );
    assert!(psql(
        &ip,
        8812,
        reader,
        reader_password,
        "insert into acked(src, v, timestamp) values('ro', 1, now())"
    )
    .await
    .is_err());

    // The probes' health port stays open; QuestDB's own metrics are on it.
    let health = format!("{ip}:9003");
    assert_eq!(
        db_client::http(&health, "GET", "/status", None, "")
            .await
            .unwrap()
            .0,
        200
    );
    let (code, metrics) = db_client::http(&health, "GET", "/metrics", None, "")
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("questdb_"), "QuestDB metrics are on");
    env.stop().await;
}

#[tokio::test]
async fn ilp_over_tcp_writes_only_with_a_key_the_questdb_was_given() {
    let env = env().await;
    let known = TestKey::derived("ingest", 3);
    let revoked = TestKey::derived("revoked", 4);
    let stranger = TestKey::derived("stranger", 5);
    for (name, key) in [("key-ingest", &known), ("key-revoked", &revoked)] {
        let s = key.json_secret_for(NS, name, "db1");
        env.api::<Secret>(NS)
            .create(&PostParams::default(), &s)
            .await
            .expect("key Secret");
    }
    env.create_questdb(NS, "db1", real).await;
    wait_for(
        &env.api(NS),
        "db1",
        "both keys loaded",
        has_condition("IlpAuthReady", "KeysLoaded"),
    )
    .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let ip = pod_ip(&env, "db1").await;
    let (http, ilp) = (format!("{ip}:9000"), format!("{ip}:9009"));

    // Refused first, then a known key as the sentinel: once its rows are counted, the
    // connections before it were handled (and wrote nothing).
    ilp_tcp(&ilp, None, &lines("anon", 10)).await.unwrap();
    ilp_tcp(&ilp, Some(&stranger), &lines("stranger", 10))
        .await
        .unwrap();
    ilp_tcp(&ilp, Some(&revoked), &lines("before_revoke", 10))
        .await
        .unwrap();
    ilp_tcp(&ilp, Some(&known), &lines("signed", 50))
        .await
        .unwrap();
    rows_become(&env, &http, "signed", 50, creds.http()).await;
    rows_become(&env, &http, "before_revoke", 10, creds.http()).await;
    for table in ["anon", "stranger"] {
        assert_eq!(
            count(&http, table, creds.http()).await,
            None,
            "{table} wrote rows"
        );
    }

    // Revocation: deleting the key's Secret restarts the database without that key.
    let old_pod = env.api::<Pod>(NS).get("db1-0").await.unwrap().uid();
    env.api::<Secret>(NS)
        .delete("key-revoked", &Default::default())
        .await
        .unwrap();
    wait_until("the database restarted without the revoked key", || {
        let pods: Api<Pod> = env.api(NS);
        let old_pod = old_pod.clone();
        let creds = &creds;
        async move {
            let Some(pod) = pods.get_opt("db1-0").await.ok().flatten() else {
                return false;
            };
            let Some(ip) = pod.status.clone().and_then(|s| s.pod_ip) else {
                return false;
            };
            pod.uid() != old_pod
                && count(&format!("{ip}:9000"), "signed", creds.http()).await == Some(50)
        }
    })
    .await;
    let ip = pod_ip(&env, "db1").await;
    let (http, ilp) = (format!("{ip}:9000"), format!("{ip}:9009"));
    ilp_tcp(&ilp, Some(&revoked), &lines("after_revoke", 10))
        .await
        .unwrap();
    ilp_tcp(&ilp, Some(&known), &lines("signed_again", 5))
        .await
        .unwrap();
    rows_become(&env, &http, "signed_again", 5, creds.http()).await;
    assert_eq!(count(&http, "after_revoke", creds.http()).await, None);
    rows_become(&env, &http, "before_revoke", 10, creds.http()).await;
    env.stop().await;
}

/// `db1` on a real QuestDB with one `spec.config.server` property.
async fn create_with_server_property(env: &Env, key: &str, value: &str) {
    env.create_questdb(NS, "db1", |q| {
        real(q);
        q.spec.config.server.insert(key.into(), value.into());
    })
    .await;
}

#[tokio::test]
async fn the_configuration_in_the_spec_is_the_one_questdb_runs_with() {
    let env = env().await;
    create_with_server_property(&env, "cairo.max.uncommitted.rows", "12345").await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    let p = |key: &'static str| {
        let http = http.clone();
        let creds = &creds;
        async move { parameter(&http, key, creds.http()).await }
    };
    assert_eq!(
        p("cairo.max.uncommitted.rows").await,
        Some(("12345".into(), "conf".into()))
    );
    assert_eq!(
        p("metrics.enabled").await,
        Some(("true".into(), "conf".into()))
    );
    assert_eq!(
        p("http.health.check.authentication.required").await,
        Some(("false".into(), "conf".into()))
    );
    assert_eq!(
        p("pg.readonly.user.enabled").await,
        Some(("true".into(), "conf".into()))
    );
    // From server.conf, where QuestDB reloads it (its environment would win over the file).
    let (user, source) = p("pg.user").await.expect("pg.user listed");
    assert_eq!((user.as_str(), source.as_str()), ("admin", "conf"));
    env.stop().await;
}

/// The pod's uid and its database container's restart count: the same pair means the same
/// process never stopped.
async fn pod_identity(env: &Env, name: &str) -> (Option<String>, i32) {
    let pod = env
        .api::<Pod>(NS)
        .get(&format!("{name}-0"))
        .await
        .expect("database pod");
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "questdb"))
        .map_or(-1, |c| c.restart_count);
    (pod.uid(), restarts)
}

/// `status.config`'s applied digest and how it was applied, once it is not `other` and no
/// reload is under way.
fn applied(
    q: Option<&QuestDB>,
    other: Option<&str>,
) -> Option<(String, questdb_operator::api::ConfigApplied)> {
    let config = q?.status.as_ref()?.config.as_ref()?;
    let digest = config.applied_digest.clone()?;
    (config.reloading_digest.is_none() && Some(digest.as_str()) != other)
        .then_some((digest, config.applied_by?))
}

/// A connection limit raised for a busy day must not restart the database (every client cut
/// off, a replay of its WAL): a setting QuestDB reloads reaches the running database in
/// place, and the operator says so only once QuestDB reports the new value.
#[tokio::test]
async fn a_reloadable_setting_reaches_the_running_database_without_a_restart() {
    use questdb_operator::api::ConfigApplied;
    const KEY: &str = "pg.net.connection.limit";
    let env = env().await;
    create_with_server_property(&env, KEY, "20").await;
    ready(&env, "db1").await;
    let qdbs: Api<QuestDB> = env.api(NS);
    // The database started with its settings: recorded as read at start.
    let q = wait_for(
        &qdbs,
        "db1",
        "the settings it started with recorded",
        |q: Option<&QuestDB>| applied(q, None).is_some(),
    )
    .await;
    let (first, by) = applied(Some(&q), None).unwrap();
    assert_eq!(by, ConfigApplied::Restart);
    let before = pod_identity(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert_eq!(
        parameter(&http, KEY, creds.http()).await,
        Some(("20".into(), "conf".into()))
    );

    qdbs.patch(
        "db1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"config": {"server": {KEY: "30"}}}})),
    )
    .await
    .unwrap();
    let q = wait_for(
        &qdbs,
        "db1",
        "the new value reloaded",
        |q: Option<&QuestDB>| {
            applied(q, Some(&first)).is_some_and(|(_, by)| by == ConfigApplied::Reload)
        },
    )
    .await;
    let (second, _) = applied(Some(&q), None).unwrap();
    assert_eq!(
        parameter(&http, KEY, creds.http()).await,
        Some(("30".into(), "conf".into())),
        "the operator reports only what QuestDB runs with"
    );
    assert_eq!(
        pod_identity(&env, "db1").await,
        before,
        "the same pod, never restarted"
    );
    wait_for_event(&env, NS, "ConfigReloaded", |e| {
        e.reason.as_deref() == Some("ConfigReloaded")
            && e.note.as_deref().is_some_and(|n| n.contains(KEY))
    })
    .await;

    // Taken out of the spec: back to QuestDB's default, still in place.
    qdbs.patch(
        "db1",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(serde_json::json!([
                {"op": "remove", "path": "/spec/config/server/pg.net.connection.limit"}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    wait_for(
        &qdbs,
        "db1",
        "the removal reloaded",
        |q: Option<&QuestDB>| {
            applied(q, Some(&second)).is_some_and(|(_, by)| by == ConfigApplied::Reload)
        },
    )
    .await;
    assert_eq!(
        parameter(&http, KEY, creds.http())
            .await
            .map(|(_, source)| source),
        Some("default".into())
    );
    assert_eq!(pod_identity(&env, "db1").await, before);
    env.stop().await;
}

/// `resources.limits.memory` of the database container.
fn memory_limit(q: &mut QuestDB, limit: &str) {
    q.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(limit.into()),
        )])),
        ..Default::default()
    });
}

/// Without a cap of its own QuestDB would allocate up to 90% of the node's memory and be
/// OOMKilled at the container's limit: the cap QuestDB runs with is the one sized from the
/// limit, and the JVM runs with the heap sized from it.
#[tokio::test]
async fn a_database_is_sized_to_its_memory_limit_as_questdb_itself_reports() {
    use questdb_operator::desired::memory::MemorySplit;
    let env = env().await;
    env.create_questdb(NS, "db1", |q| {
        real(q);
        memory_limit(q, "1536Mi");
    })
    .await;
    ready(&env, "db1").await;
    let split = MemorySplit::of(1536 << 20);
    assert_eq!(split.heap, 384 << 20, "{split:?}");
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert_eq!(
        parameter(&http, "ram.usage.limit.bytes", creds.http()).await,
        Some((split.native.to_string(), "conf".into()))
    );
    // The JVM takes the last -Xmx on its command line: the image's entrypoint puts
    // JVM_PREPEND after its own flags.
    let pids: Vec<u32> = env.cp.database_processes().iter().map(|p| p.pid).collect();
    assert_eq!(pids.len(), 1, "one database process: {pids:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pids[0])).expect("cmdline");
    let heaps: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .filter(|a| a.starts_with("-Xmx"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        heaps.last().map(String::as_str),
        Some("-Xmx384m"),
        "{heaps:?}"
    );
    env.stop().await;
}

/// A database the kernel kills for memory restarts on its own and may look healthy between
/// kills: `Ready` names the kill, the limit and how it is shared out, and one Warning event
/// says it, so the engineer knows what to raise.
#[tokio::test]
async fn a_database_killed_for_memory_says_so_with_its_limit_and_one_event() {
    let env = env().await;
    env.create_questdb(NS, "db1", |q| {
        real(q);
        memory_limit(q, "1Gi");
        // A heap as large as the whole limit, touched at start: past the limit at once, as
        // a real node's cgroup would see it.
        q.spec.env.push(k8s_openapi::api::core::v1::EnvVar {
            name: "JVM_PREPEND".into(),
            value: Some("-Xms1g -Xmx1g -XX:+AlwaysPreTouch".into()),
            ..Default::default()
        });
    })
    .await;
    let q = wait_for(
        &env.api(NS),
        "db1",
        "Ready=False OutOfMemory",
        has_condition("Ready", "OutOfMemory"),
    )
    .await;
    let ready_condition = q
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    for words in [
        "OOMKilled",
        "its limit is 1024 MiB",
        "the JVM heap spec.env JVM_PREPEND sets",
        "raise resources.limits.memory",
    ] {
        assert!(
            ready_condition.message.contains(words),
            "{words:?} in {}",
            ready_condition.message
        );
    }
    wait_for_event(&env, NS, "an OutOfMemory Warning", |e| {
        e.reason.as_deref() == Some("OutOfMemory") && e.type_.as_deref() == Some("Warning")
    })
    .await;

    // Its own heap option taken out, the operator's sizing fits: it runs.
    env.api::<QuestDB>(NS)
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"env": null}})),
        )
        .await
        .unwrap();
    ready(&env, "db1").await;
    env.stop().await;
}

#[tokio::test]
async fn a_database_that_cannot_start_says_why_in_status_and_one_event() {
    let env = env().await;
    create_with_server_property(&env, "cairo.commit.lag", "abc").await;
    let q = wait_for(
        &env.api(NS),
        "db1",
        "Ready=False CrashLoop",
        has_condition("Ready", "CrashLoop"),
    )
    .await;
    let status = q.status.unwrap_or_default();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(cond.message.contains("code 55"), "{}", cond.message);
    assert_eq!(status.phase.map(|p| p.as_str()), Some("Failed"));
    wait_for_event(&env, NS, "a CrashLoop Warning", |e| {
        e.reason.as_deref() == Some("CrashLoop") && e.type_.as_deref() == Some("Warning")
    })
    .await;
    // It keeps crashing with the same cause: still one event (a series, not a new one).
    let restarts = |n: i32| {
        let pods: Api<Pod> = env.api(NS);
        async move {
            pods.get_opt("db1-0")
                .await
                .ok()
                .flatten()
                .and_then(|p| {
                    p.status?
                        .container_statuses?
                        .first()
                        .map(|c| c.restart_count)
                })
                .is_some_and(|r| r >= n)
        }
    };
    wait_until("two more restarts", || restarts(3)).await;
    let events: Vec<_> = env
        .api::<k8s_openapi::api::events::v1::Event>(NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CrashLoop"))
        .collect();
    assert_eq!(events.len(), 1, "one event per cause: {events:#?}");

    // Fixed: it runs.
    env.api::<QuestDB>(NS)
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"config": {"server": {"cairo.commit.lag": null}}}}),
            ),
        )
        .await
        .unwrap();
    ready(&env, "db1").await;
    env.stop().await;
}

/// A leaked pgwire password is rotated at once, without cutting off every client or replaying
/// the WAL: the new password works in the same database process, and the old one is refused.
#[tokio::test]
async fn a_rotated_pgwire_password_takes_without_a_restart_and_the_old_one_is_refused() {
    use questdb_operator::api::ConfigApplied;
    let env = env().await;
    env.create_questdb(NS, "db1", real).await;
    ready(&env, "db1").await;
    let qdbs: Api<QuestDB> = env.api(NS);
    let q = wait_for(
        &qdbs,
        "db1",
        "the users it started with recorded",
        |q: Option<&QuestDB>| applied(q, None).is_some(),
    )
    .await;
    let (first, _) = applied(Some(&q), None).unwrap();
    let before = pod_identity(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let ip = pod_ip(&env, "db1").await;
    let (user, old) = creds.pg();
    psql(&ip, 8812, user, old, "select 1")
        .await
        .expect("old password works");
    let secrets: Api<Secret> = env.api(NS);
    secrets
        .patch(
            "db1-credentials",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"stringData": {credentials::PG_PASSWORD: "a-new-password-1"}}),
            ),
        )
        .await
        .unwrap();
    wait_for(
        &qdbs,
        "db1",
        "the rotation reloaded",
        |q: Option<&QuestDB>| {
            applied(q, Some(&first)).is_some_and(|(_, by)| by == ConfigApplied::Reload)
        },
    )
    .await;
    psql(&ip, 8812, user, "a-new-password-1", "select 1")
        .await
        .expect("the new password works once the operator says so");
    let refused = psql(&ip, 8812, user, old, "select 1").await.unwrap_err();
    assert!(refused.contains("invalid username/password"), "{refused}");
    assert_eq!(
        pod_identity(&env, "db1").await,
        before,
        "the same pod, never restarted"
    );
    // Never rewritten by the operator: the user's password stays.
    let after = Credentials::of(&env, "db1-credentials").await;
    assert_eq!(after.0[credentials::PG_PASSWORD], "a-new-password-1");
    env.stop().await;
}

#[tokio::test]
async fn a_questdb_version_that_does_not_exist_says_so_instead_of_waiting_forever() {
    let env = env().await;
    env.create_questdb(NS, "db1", |q| q.spec.image = "questdb/questdb:9.9.9".into())
        .await;
    let q = wait_for(
        &env.api(NS),
        "db1",
        "Ready=False ImagePullFailed",
        has_condition("Ready", "ImagePullFailed"),
    )
    .await;
    let status = q.status.unwrap_or_default();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        cond.message.contains("questdb/questdb:9.9.9"),
        "{}",
        cond.message
    );
    wait_for_event(&env, NS, "an ImagePullFailed Warning", |e| {
        e.reason.as_deref() == Some("ImagePullFailed")
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn every_acknowledged_row_survives_a_questdb_version_upgrade() {
    let env = env().await;
    env.create_questdb(NS, "db1", |q| q.spec.image = "questdb/questdb:9.1.0".into())
        .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    for batch in 0..5 {
        let code = ilp_http(&http, &lines(&format!("t{batch}"), 100), creds.http())
            .await
            .unwrap();
        assert_eq!(code, 204);
    }
    set_image(&env, &format!("questdb/questdb:{VERSION}")).await;
    wait_until("the database runs 9.2.0 with every row", || {
        let pods: Api<Pod> = env.api(NS);
        let creds = &creds;
        async move {
            let Some(pod) = pods.get_opt("db1-0").await.ok().flatten() else {
                return false;
            };
            let image = pod.spec.as_ref().map(|s| s.containers[0].image.clone());
            let Some(ip) = pod.status.and_then(|s| s.pod_ip) else {
                return false;
            };
            if image != Some(Some(format!("questdb/questdb:{VERSION}"))) {
                return false;
            }
            let http = format!("{ip}:9000");
            let mut all = true;
            for batch in 0..5 {
                all &= count(&http, &format!("t{batch}"), creds.http()).await == Some(100);
            }
            all
        }
    })
    .await;
    let q = ready(&env, "db1").await;
    assert_eq!(
        q.status.unwrap_or_default().version.as_deref(),
        Some(VERSION)
    );
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    let (code, body) = exec(
        &http,
        "select name from wal_tables() where suspended",
        creds.http(),
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    let suspended: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        suspended["count"], 0,
        "no table suspended after the upgrade: {body}"
    );
    env.stop().await;
}

/// An upgrade to a version that exits at start is undone with every acknowledged row: QuestDB
/// 9.3.2 no longer knows `cairo.sql.backup.root`, which 9.2.0 reads, and under
/// `config.validation.strict` it exits (code 55) at start. The operator snapshots the volume
/// after 9.2.0 stopped, gives 9.3.2 its timeout, then keeps the volume 9.3.2 ran on, restores
/// the snapshot into the claim and runs 9.2.0 on it.
#[tokio::test]
async fn an_upgrade_to_a_version_that_exits_at_start_is_rolled_back_with_every_acknowledged_row() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use questdb_operator::api::VersionUpgradeStep;
    const FAILING: &str = "questdb/questdb:9.3.2";
    let env = env().await;
    env.create_questdb(NS, "db1", |q| refused_by_9_3_2(q, "30s"))
        .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    for batch in 0..5 {
        write_acked(&http, &format!("t{batch}"), 100, &creds).await;
    }
    let claims: Api<PersistentVolumeClaim> = env.api(NS);
    let before = claims.get("db1-data").await.expect("the claim");
    let volume_before = before.spec.as_ref().and_then(|s| s.volume_name.clone());
    set_image(&env, FAILING).await;
    let q = wait_for(
        &env.api(NS),
        "db1",
        "VersionUpgrade=False RolledBack",
        has_condition("VersionUpgrade", "RolledBack"),
    )
    .await;
    let record = q
        .status
        .as_ref()
        .and_then(|s| s.version_upgrade.clone())
        .unwrap();
    assert_eq!(record.step, VersionUpgradeStep::RolledBack);
    assert_eq!(record.to_image, FAILING);
    let message = record.message.clone().unwrap_or_default();
    assert!(message.contains("not ready within 30s"), "{message}");
    // The volume 9.3.2 ran on is kept, and named.
    assert_eq!(record.retained_volume, volume_before);
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let kept = pvs
        .get(volume_before.as_deref().unwrap())
        .await
        .expect("the kept volume");
    assert_eq!(
        kept.spec
            .and_then(|s| s.persistent_volume_reclaim_policy)
            .as_deref(),
        Some("Retain")
    );
    let after = claims.get("db1-data").await.expect("the restored claim");
    assert_ne!(
        after.uid(),
        before.uid(),
        "the claim is the one from the snapshot"
    );
    // 9.2.0 runs again, with every row acknowledged before the change.
    let q = ready(&env, "db1").await;
    let status = q.status.unwrap_or_default();
    assert_eq!(status.version.as_deref(), Some(VERSION));
    assert_eq!(status.data_version.as_deref(), Some(VERSION));
    let pod: Pod = env.api(NS).get("db1-0").await.unwrap();
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone());
    assert_eq!(image, Some(format!("questdb/questdb:{VERSION}")));
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    for batch in 0..5 {
        assert_eq!(
            count(&http, &format!("t{batch}"), creds.http()).await,
            Some(100),
            "table t{batch} after the rollback"
        );
    }
    wait_for_event(&env, NS, "a VersionRolledBack Warning", |e| {
        e.reason.as_deref() == Some("VersionRolledBack")
    })
    .await;
    // The image set back: the record goes, the database keeps running on the same pod.
    let uid = pod.uid();
    set_image(&env, &format!("questdb/questdb:{VERSION}")).await;
    wait_for(
        &env.api(NS),
        "db1",
        "the record gone",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.version_upgrade.is_none())
        },
    )
    .await;
    let pod: Pod = env.api(NS).get("db1-0").await.unwrap();
    assert_eq!(pod.uid(), uid, "setting the image back restarts nothing");
    env.stop().await;
}

/// The manager killed at each recorded step of an upgrade and its rollback: every step is
/// recorded before its side effect and safe to do again, so the end is the same as without the
/// crashes: one snapshot, one kept volume, the old version on the restored claim with every row.
#[tokio::test]
async fn killing_the_manager_at_every_upgrade_and_rollback_step_still_restores_every_row_once() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::runtime::{watcher, WatchStreamExt};
    use questdb_operator::api::VersionUpgradeStep;
    let mut env = env().await;
    env.create_questdb(NS, "db1", |q| refused_by_9_3_2(q, "20s"))
        .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    write_acked(&http, "t", 300, &creds).await;
    set_image(&env, "questdb/questdb:9.3.2").await;

    let cfg = watcher::Config::default().fields("metadata.name=db1");
    let mut events = std::pin::pin!(watcher(env.api::<QuestDB>(NS), cfg).applied_objects());
    let mut killed = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let q = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("rolled back in time; killed in {killed:?}"))
            .expect("watch open")
            .expect("watch event");
        let Some(step) = q
            .status
            .as_ref()
            .and_then(|s| s.version_upgrade.as_ref())
            .map(|r| r.step)
        else {
            continue;
        };
        if step == VersionUpgradeStep::RolledBack {
            break;
        }
        if killed.insert(step.to_string()) {
            env.kill_and_restart_manager(Default::default()).await;
        }
    }
    for step in [
        "Stopping",
        "Snapshotting",
        "Starting",
        "StoppingNew",
        "ReleasingVolume",
        "Restoring",
    ] {
        assert!(killed.contains(step), "killed at {step}: {killed:?}");
    }
    assert_eq!(
        env.cp.ebs_snapshots().len(),
        1,
        "one snapshot for one upgrade"
    );
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let kept: Vec<PersistentVolume> = pvs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pv| {
            pv.annotations()
                .contains_key("crd.questdb.io/kept-by-version-rollback")
        })
        .collect();
    assert_eq!(kept.len(), 1, "one kept volume");
    ready(&env, "db1").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert_eq!(count(&http, "t", creds.http()).await, Some(300));
    env.stop().await;
}

/// The one field a user has to ask for a rollback: `spec.image` set back while the new version
/// starts (its timeout far away) rolls back at once, from the snapshot, with every row.
#[tokio::test]
async fn setting_the_image_back_while_the_new_version_starts_rolls_back_at_once_with_every_row() {
    use questdb_operator::api::VersionUpgradeStep;
    let env = env().await;
    env.create_questdb(NS, "db1", |q| refused_by_9_3_2(q, "1h"))
        .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    write_acked(&http, "t", 200, &creds).await;
    set_image(&env, "questdb/questdb:9.3.2").await;
    wait_for(
        &env.api(NS),
        "db1",
        "9.3.2 starting",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref())
                .and_then(|s| s.version_upgrade.as_ref())
                .is_some_and(|r| r.step == VersionUpgradeStep::Starting)
        },
    )
    .await;
    set_image(&env, &format!("questdb/questdb:{VERSION}")).await;
    let q = wait_for(
        &env.api(NS),
        "db1",
        "rolled back, the record gone",
        |q: Option<&QuestDB>| {
            q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
                s.version_upgrade.is_none()
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await;
    assert_eq!(
        q.status.and_then(|s| s.version).as_deref(),
        Some(VERSION),
        "the old version runs"
    );
    wait_for_event(&env, NS, "a VersionRolledBack Warning", |e| {
        e.reason.as_deref() == Some("VersionRolledBack")
    })
    .await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert_eq!(count(&http, "t", creds.http()).await, Some(200));
    env.stop().await;
}

/// QuestDB 9.2.0 with a key 9.3.2 no longer knows (`cairo.sql.backup.root`) under strict
/// validation: 9.3.2 exits (code 55) at start on it. `ready_timeout`: the new version's.
fn refused_by_9_3_2(q: &mut QuestDB, ready_timeout: &str) {
    real(q);
    let server = &mut q.spec.config.server;
    server.insert("config.validation.strict".into(), "true".into());
    server.insert(
        "cairo.sql.backup.root".into(),
        "/var/lib/questdb/backup".into(),
    );
    q.spec.version_upgrade.ready_timeout = Some(ready_timeout.into());
}

/// Sets `db1`'s `spec.image`.
async fn set_image(env: &Env, image: &str) {
    env.api::<QuestDB>(NS)
        .patch(
            "db1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"image": image}})),
        )
        .await
        .unwrap();
}

/// The address of the running database, once its pod is Ready again.
async fn http_when_ready(env: &Env) -> String {
    ready(env, "db1").await;
    format!("{}:9000", pod_ip(env, "db1").await)
}

async fn write_acked(http: &str, table: &str, n: usize, creds: &Credentials) {
    let code = ilp_http(http, &lines(table, n), creds.http())
        .await
        .unwrap();
    assert_eq!(code, 204, "rows acknowledged");
}

/// Waits until no QuestDB process runs for `db1` (stopped, not merely unready).
async fn no_database_process(env: &Env) {
    wait_until("no QuestDB process runs", || {
        let running = env
            .cp
            .database_processes()
            .iter()
            .any(|p| p.namespace == NS);
        async move { !running }
    })
    .await;
}

#[tokio::test]
async fn every_acknowledged_row_survives_pause_unpause_and_delete_with_retained_data() {
    let env = env().await;
    env.create_questdb(NS, "db1", real).await;
    let http = http_when_ready(&env).await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    write_acked(&http, "kept", 300, &creds).await;

    let qdbs: Api<QuestDB> = env.api(NS);
    let pause = |paused: bool| set_paused(&env, "db1", paused);
    pause(true).await;
    wait_for(&qdbs, "db1", "Paused", has_condition("Ready", "Paused")).await;
    no_database_process(&env).await;
    pause(false).await;
    let http = http_when_ready(&env).await;
    rows_become(&env, &http, "kept", 300, creds.http()).await;
    write_acked(&http, "kept", 100, &creds).await;
    rows_become(&env, &http, "kept", 400, creds.http()).await;

    qdbs.delete("db1", &Default::default())
        .await
        .expect("deleted");
    wait_until("the QuestDB is gone", || {
        let qdbs = qdbs.clone();
        async move { qdbs.get_opt("db1").await.is_ok_and(|q| q.is_none()) }
    })
    .await;
    no_database_process(&env).await;
    env.create_questdb(NS, "db1", real).await;
    let http = http_when_ready(&env).await;
    let again = Credentials::of(&env, "db1-credentials").await;
    assert_eq!(
        again.0, creds.0,
        "the kept Secret: clients' passwords still work"
    );
    rows_become(&env, &http, "kept", 400, creds.http()).await;
    env.stop().await;
}

/// [`env`], with the write-health poll (WAL tables, volume usage) every second.
pub(crate) async fn env_polled_every_second() -> Env {
    let options = ControlPlaneOptions {
        databases: Databases::Real,
        ..cluster()
    };
    let opts = questdb_operator::manager::ManagerOptions {
        write_health_interval: std::time::Duration::from_secs(1),
        ..Default::default()
    };
    let env = Env::start_on(options, opts, crate::harness::questdb_crd()).await;
    env.namespace(NS).await;
    env
}

#[tokio::test]
async fn a_suspended_wal_table_makes_write_healthy_false_naming_it_until_resumed() {
    let env = env_polled_every_second().await;
    env.create_questdb(NS, "db1", |q| {
        real(q);
        // QuestDB suspends a table by hand only in dev mode (a real suspension follows a
        // failed WAL apply: a full disk, a corrupt segment).
        q.spec
            .config
            .server
            .insert("dev.mode.enabled".into(), "true".into());
    })
    .await;
    ready(&env, "db1").await;
    let creds = Credentials::of(&env, "db1-credentials").await;
    let http = format!("{}:9000", pod_ip(&env, "db1").await);
    assert_eq!(
        ilp_http(&http, &lines("trades", 10), creds.http())
            .await
            .unwrap(),
        204
    );
    rows_become(&env, &http, "trades", 10, creds.http()).await;
    wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "WriteHealthy=True",
        has_condition("WriteHealthy", "WalHealthy"),
    )
    .await;

    let (code, body) = exec(&http, "alter table trades suspend wal", creds.http())
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "WriteHealthy=False TablesSuspended",
        has_condition("WriteHealthy", "TablesSuspended"),
    )
    .await;
    let message = q
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "WriteHealthy")
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(message.contains("trades"), "{message}");

    let (code, body) = exec(&http, "alter table trades resume wal", creds.http())
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    wait_for(
        &env.api::<QuestDB>(NS),
        "db1",
        "WriteHealthy=True again",
        has_condition("WriteHealthy", "WalHealthy"),
    )
    .await;
}
