//! ILP authentication end to end: key Secrets annotated `crd.questdb.io/name` become QuestDB's
//! `auth.txt`, as a database owner rotating keys (and making mistakes) sees it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::Condition;
use kube::ResourceExt;
use questdb_operator::api::{QuestDB, SECRET_QUESTDB_ANNOTATION};
use questdb_operator::ilp_auth::testing::{annotated_secret, TestKey};
use questdb_testenv::Verb;
use serde::Serialize;
use serde_json::json;

use crate::harness::{is_ready, wait_for, wait_for_event, wait_until, Env};

const NS: &str = "ingest";
const DB: &str = "db1";
const AUTH_CM: &str = "db1-ilp-auth";
const CONFIG_CM: &str = "db1-config";
const POD: &str = "db1-0";
const AUTH_PATH_LINE: &str = "line.tcp.auth.db.path=conf/auth.txt";

/// The QuestDB's `IlpAuthReady` condition has this status and reason.
fn ilp_auth(status: &'static str, reason: &'static str) -> impl Condition<QuestDB> {
    move |q: Option<&QuestDB>| {
        q.and_then(|q| q.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "IlpAuthReady" && c.status == status && c.reason == reason)
        })
    }
}

fn ilp_auth_message(q: &QuestDB) -> String {
    q.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "IlpAuthReady"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The auth ConfigMap holds exactly `expected` as `auth.txt`.
fn auth_txt_is(expected: String) -> impl Condition<ConfigMap> {
    move |c: Option<&ConfigMap>| c.is_some_and(|c| auth_txt(c) == Some(expected.as_str()))
}

fn auth_txt(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get("auth.txt").map(String::as_str)
}

fn server_conf(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("server.conf"))
        .cloned()
        .unwrap_or_default()
}

/// Whether the pod template mounts the auth ConfigMap as `conf/auth.txt`.
fn mounts_auth_txt(sts: &StatefulSet) -> bool {
    let Some(pod) = sts.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return false;
    };
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.config_map.as_ref().is_some_and(|c| c.name == AUTH_CM));
    let Some(volume) = volume else {
        return false;
    };
    pod.containers.iter().any(|c| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == volume.name && m.mount_path.ends_with("/conf/auth.txt"))
    })
}

async fn pod_uid(env: &Env) -> String {
    // The pod may be between its deletion and its replacement by the StatefulSet controller.
    let pod = wait_for(
        &env.api::<Pod>(NS),
        POD,
        "database pod exists",
        |p: Option<&Pod>| p.is_some(),
    )
    .await;
    pod.uid().expect("pod has a uid")
}

async fn wait_pod_replaced(env: &Env, before: &str, what: &str) {
    let before = before.to_string();
    wait_for(&env.api::<Pod>(NS), POD, what, move |p: Option<&Pod>| {
        p.is_some_and(|p| p.uid().is_some_and(|uid| uid != before))
    })
    .await;
}

async fn create_secret(env: &Env, secret: &Secret) {
    let ns = secret.namespace().expect("fixture Secrets are namespaced");
    env.api::<Secret>(&ns)
        .create(&PostParams::default(), secret)
        .await
        .expect("Secret created");
}

/// Replaces the data of an existing Secret (its annotation stays), like `kubectl apply` of an
/// edited manifest.
async fn replace_secret_data(env: &Env, name: &str, data: Option<BTreeMap<String, ByteString>>) {
    let api = env.api::<Secret>(NS);
    let mut secret = api.get(name).await.expect("Secret exists");
    secret.data = data;
    api.replace(name, &PostParams::default(), &secret)
        .await
        .expect("Secret replaced");
}

/// A key Secret for `db1` in [`NS`].
fn key_secret(key: &TestKey, name: &str) -> Secret {
    key.json_secret_for(NS, name, DB)
}

/// A JWK that is not a P-256 key: `crv` says P-384 (`d` included, as a user would paste it).
fn wrong_curve_jwk(key: &TestKey) -> String {
    json!({"kty": "EC", "crv": "P-384", "kid": key.kid, "x": key.x, "y": key.y, "d": key.d})
        .to_string()
}

fn json_data(jwk: String) -> Option<BTreeMap<String, ByteString>> {
    Some(BTreeMap::from([(
        "auth.json".to_string(),
        ByteString(jwk.into_bytes()),
    )]))
}

/// Starts an operator, creates `db1` in [`NS`] with one key Secret (`client-key`) and waits
/// until the key is deployed and the database is Ready.
async fn start_with_key(key: &TestKey) -> Env {
    let env = Env::start().await;
    env.namespace(NS).await;
    create_secret(&env, &key_secret(key, "client-key")).await;
    env.create_questdb(NS, DB, |_| {}).await;
    let qdbs = env.api::<QuestDB>(NS);
    wait_for(&qdbs, DB, "QuestDB Ready", is_ready()).await;
    wait_for(&qdbs, DB, "key loaded", ilp_auth("True", "KeysLoaded")).await;
    wait_for(
        &env.api::<ConfigMap>(NS),
        AUTH_CM,
        "auth file deployed",
        auth_txt_is(key.auth_line()),
    )
    .await;
    env
}

/// Sum of `controller_runtime_reconcile_total` of the questdb controller, all results.
fn reconciles(metrics: &str) -> f64 {
    metric_sum(metrics, "controller_runtime_reconcile_total{")
}

/// Sum of `questdb_operator_triggers_total` of the questdb controller: every request a watch
/// handed it.
fn triggers(metrics: &str) -> f64 {
    metric_sum(metrics, "questdb_operator_triggers_total{")
}

fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains("\"questdb\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the operator is idle: no reconcile and no trigger for a whole second.
async fn wait_idle(env: &Env) {
    let metrics = env.handle.metrics.clone();
    let sample = move || {
        let text = metrics.render();
        (reconciles(&text), triggers(&text))
    };
    let last = Arc::new(Mutex::new(sample()));
    wait_until("operator idle for a second", || {
        let (sample, last) = (sample.clone(), last.clone());
        async move {
            // The quiet period IS the condition: a second without any trigger or reconcile.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = sample();
            let mut last = last.lock().expect("sample lock");
            let idle = *last == now;
            *last = now;
            idle
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_key_secret_is_deployed_and_restarts_the_pod() {
    let env = Env::start().await;
    env.namespace(NS).await;
    env.create_questdb(NS, DB, |_| {}).await;
    let qdbs = env.api::<QuestDB>(NS);
    wait_for(&qdbs, DB, "QuestDB Ready", is_ready()).await;
    // Before any key: auth on, empty file (fail closed).
    wait_for(&qdbs, DB, "no keys yet", ilp_auth("False", "NoKeys")).await;
    let cms = env.api::<ConfigMap>(NS);
    wait_for(&cms, AUTH_CM, "empty auth file", auth_txt_is(String::new())).await;
    let before = pod_uid(&env).await;

    let key = TestKey::rfc7515_a3("ingest-client");
    create_secret(&env, &key_secret(&key, "client-key")).await;

    let cm = wait_for(
        &cms,
        AUTH_CM,
        "key in auth.txt",
        auth_txt_is(key.auth_line()),
    )
    .await;
    assert_eq!(
        auth_txt(&cm),
        Some(
            "ingest-client ec-p-256-sha256 f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU \
             x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0\n"
        ),
        "one line in QuestDB's format"
    );
    let conf = server_conf(&cms.get(CONFIG_CM).await.expect("config ConfigMap"));
    assert!(
        conf.lines().any(|l| l == AUTH_PATH_LINE),
        "server.conf: {conf}"
    );
    let sts = env
        .api::<StatefulSet>(NS)
        .get(DB)
        .await
        .expect("StatefulSet");
    assert!(mounts_auth_txt(&sts), "auth.txt mounted into conf/");

    wait_pod_replaced(&env, &before, "pod restarted to read the new auth file").await;
    let q = wait_for(&qdbs, DB, "key loaded", ilp_auth("True", "KeysLoaded")).await;
    assert!(
        ilp_auth_message(&q).contains("ingest-client"),
        "the condition names the kid: {}",
        ilp_auth_message(&q)
    );
    wait_for(&qdbs, DB, "Ready again", is_ready()).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_key_in_the_secret_alone_redeploys_and_restarts() {
    let old = TestKey::derived("ingest-2025", 7);
    let env = start_with_key(&old).await;
    let qdbs = env.api::<QuestDB>(NS);
    let generation = qdbs.get(DB).await.expect("QuestDB").metadata.generation;
    let before = pod_uid(&env).await;

    // Same Secret, same annotation, new key; the QuestDB is not touched.
    let new = TestKey::derived("ingest-2026", 8);
    replace_secret_data(&env, "client-key", json_data(new.jwk_json())).await;

    wait_for(
        &env.api::<ConfigMap>(NS),
        AUTH_CM,
        "rotated key in auth.txt",
        auth_txt_is(new.auth_line()),
    )
    .await;
    wait_pod_replaced(&env, &before, "pod restarted after the rotation").await;
    let q = wait_for(&qdbs, DB, "new key loaded", |q: Option<&QuestDB>| {
        ilp_auth("True", "KeysLoaded").matches_object(q)
            && q.is_some_and(|q| ilp_auth_message(q).contains("ingest-2026"))
    })
    .await;
    assert_eq!(
        q.metadata.generation, generation,
        "the QuestDB itself was not edited"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_leaked_keys_secret_revokes_it_while_another_secret_is_broken() {
    let good = TestKey::derived("ingest", 3);
    let env = start_with_key(&good).await;
    let qdbs = env.api::<QuestDB>(NS);
    let cms = env.api::<ConfigMap>(NS);
    let leaked = TestKey::derived("partner", 5);
    create_secret(&env, &key_secret(&leaked, "partner-key")).await;
    let mut both = [good.auth_line(), leaked.auth_line()];
    both.sort();
    wait_for(
        &cms,
        AUTH_CM,
        "both keys deployed",
        auth_txt_is(both.concat()),
    )
    .await;

    // client-key is broken mid-edit: only its own key is withheld.
    let next = TestKey::derived("ingest", 4);
    replace_secret_data(&env, "client-key", json_data(wrong_curve_jwk(&next))).await;
    let q = wait_for(&qdbs, DB, "problem reported", |q: Option<&QuestDB>| {
        ilp_auth("False", "InvalidSecret").matches_object(q)
            && q.is_some_and(|q| ilp_auth_message(q).contains("Secret client-key"))
    })
    .await;
    assert!(
        ilp_auth_message(&q).contains("withheld"),
        "{}",
        ilp_auth_message(&q)
    );
    wait_for(
        &cms,
        AUTH_CM,
        "the broken Secret's key withheld, the other kept",
        auth_txt_is(leaked.auth_line()),
    )
    .await;
    wait_for_warning(&env, "InvalidSecret", "client-key").await;

    // partner's key leaked: deleting its Secret revokes it at once, broken Secret or not.
    env.api::<Secret>(NS)
        .delete("partner-key", &DeleteParams::default())
        .await
        .expect("Secret deleted");
    wait_for(
        &cms,
        AUTH_CM,
        "the leaked key revoked",
        auth_txt_is(String::new()),
    )
    .await;

    // Fixing the Secret applies its new key.
    replace_secret_data(&env, "client-key", json_data(next.jwk_json())).await;
    wait_for(
        &cms,
        AUTH_CM,
        "fixed key deployed",
        auth_txt_is(next.auth_line()),
    )
    .await;
    wait_for(
        &qdbs,
        DB,
        "keys loaded again",
        ilp_auth("True", "KeysLoaded"),
    )
    .await;
    env.stop().await;
}

/// A Warning event about the QuestDB with `reason` whose note names `secret`.
async fn wait_for_warning(env: &Env, reason: &'static str, secret: &'static str) {
    wait_for_event(env, NS, "a Warning event names the Secret", |e| {
        e.type_.as_deref() == Some("Warning")
            && e.reason.as_deref() == Some(reason)
            && e.note.as_deref().is_some_and(|n| n.contains(secret))
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(DB)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_secrets_trigger_no_reconcile_and_no_secret_read() {
    let env = start_with_key(&TestKey::derived("ingest", 5)).await;
    wait_for(&env.api::<QuestDB>(NS), DB, "Ready", is_ready()).await;
    wait_idle(&env).await;
    let before = env.handle.metrics.render();
    env.cp.reset_request_counts();

    // Busy neighbours: Secrets without the annotation, one with another annotation, edited and
    // deleted. (Periodic requeues come every 300 s, so none falls into this test.)
    let secrets = env.api::<Secret>(NS);
    for i in 0..20 {
        let mut s = annotated_secret(NS, &format!("app-{i}"), DB, &[("password", b"hunter2")]);
        s.metadata.annotations = Some(BTreeMap::from([(
            "example.com/owner".to_string(),
            "db1".to_string(),
        )]));
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("unrelated Secret created");
    }
    let patch = json!({"data": {"password": STANDARD.encode("correct horse")}});
    secrets
        .patch("app-3", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("unrelated Secret edited");
    secrets
        .delete("app-4", &DeleteParams::default())
        .await
        .expect("unrelated Secret deleted");

    // A barrier: a Secret annotated for a QuestDB that does not exist. Secret events arrive in
    // order on one watch, so once its trigger is counted every earlier Secret event was mapped.
    let ghost = annotated_secret(NS, "zz-barrier", "no-such-db", &[("x", b"y")]);
    create_secret(&env, &ghost).await;
    let metrics = env.handle.metrics.clone();
    let triggers_before = triggers(&before);
    wait_until("the barrier Secret's trigger is counted", || {
        let m = metrics.clone();
        async move { triggers(&m.render()) > triggers_before }
    })
    .await;

    let after = env.handle.metrics.render();
    assert_eq!(
        triggers(&after),
        triggers_before + 1.0,
        "only the barrier enqueued anything"
    );
    assert_eq!(
        reconciles(&after),
        reconciles(&before),
        "no QuestDB reconciled"
    );
    let counts = env.cp.request_counts();
    assert_eq!(
        counts.get(Verb::Get, "secrets"),
        0,
        "no Secret data read; requests were {counts:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_another_namespace_never_reaches_the_questdb() {
    let mine = TestKey::derived("team-a-client", 9);
    let env = start_with_key(&mine).await;
    let before = pod_uid(&env).await;

    // Namespace "intruder" has no db1, but its Secret names one.
    env.namespace("intruder").await;
    let foreign = TestKey::derived("intruder-client", 10);
    create_secret(&env, &foreign.json_secret_for("intruder", "client-key", DB)).await;
    // A second key in the QuestDB's own namespace, created after the foreign one: Secret events
    // arrive in order, so once it is deployed the foreign Secret has been seen too.
    let second = TestKey::derived("team-a-second", 11);
    create_secret(&env, &key_secret(&second, "second-key")).await;

    // Sorted by kid.
    let expected = format!("{}{}", mine.auth_line(), second.auth_line());
    let cm = wait_for(
        &env.api::<ConfigMap>(NS),
        AUTH_CM,
        "own namespace's keys only",
        auth_txt_is(expected),
    )
    .await;
    let file = auth_txt(&cm).unwrap_or_default();
    assert!(!file.contains(&foreign.x), "foreign key absent: {file}");
    assert!(!file.contains("intruder"), "foreign kid absent: {file}");
    wait_pod_replaced(&env, &before, "pod restarted for the second own key").await;
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        DB,
        "two keys",
        ilp_auth("True", "KeysLoaded"),
    )
    .await;
    assert!(
        !ilp_auth_message(&q).contains("intruder"),
        "{}",
        ilp_auth_message(&q)
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_last_key_keeps_auth_on_with_an_empty_file() {
    let first = TestKey::derived("first", 12);
    let env = start_with_key(&first).await;
    let second = TestKey::derived("second", 13);
    create_secret(&env, &key_secret(&second, "second-key")).await;
    let cms = env.api::<ConfigMap>(NS);
    let both = format!("{}{}", first.auth_line(), second.auth_line());
    wait_for(&cms, AUTH_CM, "both keys", auth_txt_is(both)).await;

    // Un-annotating a Secret takes its key out.
    let secrets = env.api::<Secret>(NS);
    let unannotate = json!({"metadata": {"annotations": {SECRET_QUESTDB_ANNOTATION: null}}});
    secrets
        .patch(
            "client-key",
            &PatchParams::default(),
            &Patch::Merge(&unannotate),
        )
        .await
        .expect("annotation removed");
    wait_for(
        &cms,
        AUTH_CM,
        "first key removed",
        auth_txt_is(second.auth_line()),
    )
    .await;

    let before = pod_uid(&env).await;
    secrets
        .delete("second-key", &DeleteParams::default())
        .await
        .expect("last key Secret deleted");
    wait_for(&cms, AUTH_CM, "empty auth file", auth_txt_is(String::new())).await;
    let q = wait_for(
        &env.api::<QuestDB>(NS),
        DB,
        "NoKeys",
        ilp_auth("False", "NoKeys"),
    )
    .await;
    assert!(
        ilp_auth_message(&q).contains("refused"),
        "{}",
        ilp_auth_message(&q)
    );

    let conf = server_conf(&cms.get(CONFIG_CM).await.expect("config ConfigMap"));
    assert!(
        conf.lines().any(|l| l == AUTH_PATH_LINE),
        "auth stays on: {conf}"
    );
    let sts = env
        .api::<StatefulSet>(NS)
        .get(DB)
        .await
        .expect("StatefulSet");
    assert!(mounts_auth_txt(&sts), "the empty auth.txt stays mounted");
    wait_pod_replaced(&env, &before, "pod restarted to drop the last key").await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_ilp_auth_writes_no_auth_path_and_mounts_nothing() {
    let env = Env::start().await;
    env.namespace(NS).await;
    // A key Secret exists, but the owner turned authentication off.
    create_secret(
        &env,
        &key_secret(&TestKey::derived("unused", 14), "client-key"),
    )
    .await;
    env.create_questdb(NS, DB, |q| q.spec.ilp_auth.enabled = false)
        .await;
    let qdbs = env.api::<QuestDB>(NS);
    wait_for(&qdbs, DB, "QuestDB Ready", is_ready()).await;
    let q = wait_for(&qdbs, DB, "auth reported off", ilp_auth("True", "Disabled")).await;
    assert!(
        ilp_auth_message(&q).contains("any client"),
        "{}",
        ilp_auth_message(&q)
    );

    let cms = env.api::<ConfigMap>(NS);
    let conf = server_conf(&cms.get(CONFIG_CM).await.expect("config ConfigMap"));
    assert!(
        conf.contains("line.tcp.net.bind.to"),
        "a real server.conf: {conf}"
    );
    assert!(!conf.contains("line.tcp.auth"), "no auth path: {conf}");
    let sts = env
        .api::<StatefulSet>(NS)
        .get(DB)
        .await
        .expect("StatefulSet");
    assert!(!mounts_auth_txt(&sts), "no auth.txt mount");
    let pod = env.api::<Pod>(NS).get(POD).await.expect("pod");
    let mounts: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.mount_path.clone())
        .collect();
    assert!(
        !mounts.iter().any(|m| m.ends_with("auth.txt")),
        "pod mounts: {mounts:?}"
    );
    assert!(
        cms.get_opt(AUTH_CM).await.expect("get").is_none(),
        "no auth ConfigMap"
    );
    env.stop().await;
}

/// Every representation in which a private key could leak: the JWK's base64url `d` and the
/// standard base64 of the same bytes.
fn private_forms(key: &TestKey) -> Vec<String> {
    let bytes = URL_SAFE_NO_PAD.decode(&key.d).expect("d is base64url");
    vec![key.d.clone(), STANDARD.encode(bytes)]
}

/// Serializes every object of `api` to JSON.
async fn dump<K>(api: Api<K>, kind: &str) -> Vec<(String, String)>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing {kind}: {e}"))
        .items
        .iter()
        .map(|o| {
            let json = serde_json::to_string(o).expect("objects serialize");
            (format!("{kind} {}", o.name_any()), json)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_private_key_appears_nowhere_outside_its_secret() {
    let first = TestKey::rfc7515_a3("first");
    let env = start_with_key(&first).await;
    let cms = env.api::<ConfigMap>(NS);
    let qdbs = env.api::<QuestDB>(NS);

    // A key given as separate data keys, `d` among them.
    let separate = TestKey::derived("separate", 15);
    let mut s = separate.separate_secret("separate-key");
    s.metadata.namespace = Some(NS.into());
    create_secret(&env, &s).await;
    let both = format!("{}{}", first.auth_line(), separate.auth_line());
    wait_for(&cms, AUTH_CM, "both keys", auth_txt_is(both)).await;

    // A rotation, then a broken key (with its `d`) that is reported, not deployed.
    let rotated = TestKey::derived("rotated", 16);
    replace_secret_data(&env, "client-key", json_data(rotated.jwk_json())).await;
    let both = format!("{}{}", rotated.auth_line(), separate.auth_line());
    wait_for(&cms, AUTH_CM, "rotated", auth_txt_is(both)).await;
    let broken = TestKey::derived("broken", 17);
    replace_secret_data(&env, "client-key", json_data(wrong_curve_jwk(&broken))).await;
    wait_for(
        &qdbs,
        DB,
        "broken key reported",
        ilp_auth("False", "InvalidSecret"),
    )
    .await;
    wait_for(&qdbs, DB, "Ready", is_ready()).await;
    wait_for_event(&env, NS, "the Warning event is recorded", |e| {
        e.reason.as_deref() == Some("InvalidSecret")
    })
    .await;

    let mut objects = Vec::new();
    objects.extend(dump(env.api::<ConfigMap>(NS), "ConfigMap").await);
    objects.extend(dump(env.api::<StatefulSet>(NS), "StatefulSet").await);
    objects.extend(dump(env.api::<Pod>(NS), "Pod").await);
    objects.extend(dump(env.api::<Service>(NS), "Service").await);
    objects.extend(dump(env.api::<PersistentVolumeClaim>(NS), "PVC").await);
    objects.extend(dump(env.api::<k8s_openapi::api::core::v1::Event>(NS), "Event").await);
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api(NS);
    objects.extend(dump(events, "events.k8s.io Event").await);
    objects.extend(dump(qdbs, "QuestDB").await);
    objects.push(("metrics".into(), env.handle.metrics.render()));
    assert!(
        objects
            .iter()
            .any(|(what, _)| what.starts_with("events.k8s.io Event")),
        "the scan covers the events"
    );
    assert!(
        objects.iter().any(|(_, json)| json.contains(&separate.x)),
        "the scan sees public key material, so it would see private material too"
    );

    for key in [&first, &separate, &rotated, &broken] {
        for form in private_forms(key) {
            for (what, json) in &objects {
                assert!(
                    !json.contains(&form),
                    "the private key of {} leaked into {what}",
                    key.kid
                );
            }
        }
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_ilp_auth_deletes_its_configmap() {
    let env = start_with_key(&TestKey::derived("ingest", 21)).await;
    let qdbs = env.api::<QuestDB>(NS);
    qdbs.patch(
        DB,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ilpAuth": {"enabled": false}}})),
    )
    .await
    .expect("auth off");
    wait_for(&qdbs, DB, "auth reported off", ilp_auth("True", "Disabled")).await;
    wait_until("the auth ConfigMap is deleted", || {
        let cms = env.api::<ConfigMap>(NS);
        async move { cms.get_opt(AUTH_CM).await.expect("read").is_none() }
    })
    .await;
    let sts = env
        .api::<StatefulSet>(NS)
        .get(DB)
        .await
        .expect("StatefulSet");
    assert!(!mounts_auth_txt(&sts), "the pod no longer mounts it");
    wait_for(&qdbs, DB, "Ready without auth", is_ready()).await;
    env.stop().await;
}
