//! What thousands of unrelated Secrets cost the operator, and how fast a key rotation reaches
//! the pod template: the real operator binary, run as a child process against the real control
//! plane (questdb-testenv).
//!
//! ```text
//! cargo bench --profile dev --bench secrets               # debug build (fast to compile)
//! cargo bench --profile dev --bench secrets -- --quick    # smoke run: 500 Secrets
//! cargo bench --bench secrets                             # optimised build
//! ```
//! `SECRETS_BENCH_QUICK=1` does what `--quick` does; `SECRETS_BENCH_COUNT=<n>` sets the number
//! of unrelated Secrets; `QUESTDB_OPERATOR_BIN=<path>` runs another operator binary. The child's
//! log goes to a temporary file whose path is printed when something fails.
//!
//! Prints a table, then one JSON line (`{"bench":"secrets",...}`) for scripts.

mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::Client;
use questdb_operator::api::QuestDB;
use questdb_operator::desired::testing;
use questdb_operator::ilp_auth::testing::TestKey;

use support::control_plane::Cluster;
use support::operator::{self, Memory, Operator, RunArgs};
use support::{cluster, wait};

const NS: &str = "bench";
const DB: &str = "db1";
const AUTH_CM: &str = "db1-ilp-auth";
const KEY_SECRET: &str = "client-key";
const CONFIG_HASH: &str = "crd.questdb.io/config-hash";
const FULL_COUNT: usize = 10_000;
const QUICK_COUNT: usize = 500;
const SECRET_BYTES: usize = 10 * 1024;
const IN_FLIGHT: usize = 16;
/// Budget for the operator's memory growth with 10,000 unrelated Secrets.
const TARGET_GROWTH_KIB: u64 = 20 * 1024;
/// How long any single wait may take; generous for a debug build on a busy 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(300);

struct Settings {
    secrets: usize,
    quick: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        // Cargo passes `--bench` to every bench binary; other arguments are ours.
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("SECRETS_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let secrets = match std::env::var("SECRETS_BENCH_COUNT") {
            Ok(n) => n
                .parse()
                .with_context(|| format!("SECRETS_BENCH_COUNT={n:?} is not a number"))?,
            Err(_) if quick => QUICK_COUNT,
            Err(_) => FULL_COUNT,
        };
        Ok(Self { secrets, quick })
    }
}

fn ilp_keys_loaded(q: &QuestDB, kid: &str) -> bool {
    let Some(status) = q.status.as_ref() else {
        return false;
    };
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let keys = status
        .conditions
        .iter()
        .any(|c| c.type_ == "IlpAuthReady" && c.reason == "KeysLoaded" && c.message.contains(kid));
    ready && keys
}

fn config_hash(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(CONFIG_HASH)
        .cloned()
}

fn unrelated_secret(i: usize, payload: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("unrelated-{i:05}")),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([(
                "app".to_string(),
                "neighbour".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "blob".to_string(),
            ByteString(payload.to_vec()),
        )])),
        ..Secret::default()
    }
}

/// Waits until `db1` is Ready with the key `kid` loaded and deployed.
async fn wait_key_live(
    client: &Client,
    operator: &mut Operator,
    key: &TestKey,
) -> anyhow::Result<()> {
    let qdbs: Api<QuestDB> = Api::namespaced(client.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let line = key.auth_line();
    wait::until(
        &format!("key {} deployed and db1 Ready", key.kid),
        TIMEOUT,
        operator,
        || {
            let (qdbs, cms, line) = (qdbs.clone(), cms.clone(), line.clone());
            async move {
                let file_has_key = cms.get_opt(AUTH_CM).await.ok().flatten().is_some_and(|cm| {
                    cm.data
                        .as_ref()
                        .and_then(|d| d.get("auth.txt"))
                        .is_some_and(|f| f.contains(&line))
                });
                let ready = qdbs
                    .get_opt(DB)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|q| ilp_keys_loaded(&q, &key.kid));
                file_has_key && ready
            }
        },
    )
    .await
}

struct Figures {
    secrets: usize,
    baseline: Memory,
    loaded: Memory,
    create_secs: f64,
    settle_secs: f64,
    rotation_ms: f64,
}

impl Figures {
    fn growth_kib(&self) -> i64 {
        self.loaded.rss_kib as i64 - self.baseline.rss_kib as i64
    }

    /// Whether the growth meets the target; `None` for a run with fewer Secrets than the target
    /// is set for, where fixed costs and noise would dominate a scaled-down budget.
    fn within_target(&self) -> Option<bool> {
        (self.secrets >= FULL_COUNT).then(|| self.growth_kib() < TARGET_GROWTH_KIB as i64)
    }

    fn print(&self, profile: &str) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let growth = self.growth_kib() as f64 / 1024.0;
        let target = TARGET_GROWTH_KIB as f64 / 1024.0;
        let verdict = match self.within_target() {
            Some(true) => "ok",
            Some(false) => "OVER",
            None => "(smoke)",
        };
        println!();
        println!(
            "secrets bench ({profile} build, {} unrelated {} KiB Secrets)",
            self.secrets,
            SECRET_BYTES / 1024
        );
        println!("{:-<64}", "");
        let row = |label: &str, value: String| println!("{label:<40} {value:>12}");
        row(
            "operator RSS before (MiB)",
            format!("{:.1}", mib(self.baseline.rss_kib)),
        );
        row(
            "operator RSS after (MiB)",
            format!("{:.1}", mib(self.loaded.rss_kib)),
        );
        row(
            &format!("RSS growth (MiB, target < {target:.0} at {FULL_COUNT})"),
            format!("{growth:.1} {verdict}"),
        );
        row(
            "peak RSS, VmHWM (MiB)",
            format!("{:.1}", mib(self.loaded.hwm_kib)),
        );
        row(
            "creating the Secrets (s)",
            format!("{:.1}", self.create_secs),
        );
        row(
            "barrier key live, pod rolled (s)",
            format!("{:.1}", self.settle_secs),
        );
        row(
            "key edit -> pod template hash (ms)",
            format!("{:.0}", self.rotation_ms),
        );
        println!("{:-<64}", "");
        let json = serde_json::json!({
            "bench": "secrets",
            "profile": profile,
            "unrelated_secrets": self.secrets,
            "secret_bytes": SECRET_BYTES,
            "rss_before_kib": self.baseline.rss_kib,
            "rss_after_kib": self.loaded.rss_kib,
            "rss_growth_kib": self.growth_kib(),
            "hwm_after_kib": self.loaded.hwm_kib,
            "target_growth_kib": TARGET_GROWTH_KIB,
            "target_secrets": FULL_COUNT,
            "within_target": self.within_target(),
            "create_seconds": self.create_secs,
            "catch_up_seconds": self.settle_secs,
            "rotation_to_template_ms": self.rotation_ms,
        });
        println!("{json}");
        let _ = std::io::stdout().flush();
    }
}

async fn run(settings: &Settings) -> anyhow::Result<Figures> {
    let binary = operator::binary()?;
    let workers = [
        ("worker-a1", "zone-a"),
        ("worker-a2", "zone-a"),
        ("worker-b1", "zone-b"),
    ]
    .map(|(n, z)| (n.to_string(), z.to_string()));
    let cluster = Cluster::start(&workers).await?;
    let client = cluster.bench_client();
    cluster::install_crd(&client, TIMEOUT).await?;
    cluster::create_namespace(&client, NS).await?;

    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    // Kept after the run so a failure can be investigated.
    let dir = dir.keep();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.operator_kubeconfig()).context("writing the kubeconfig")?;
    let args = RunArgs {
        kubeconfig,
        // Not scraped: any free port the operator picks.
        metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
        health: operator::free_addr()?,
        concurrency: None,
    };
    let health = args.health;
    let mut operator = Operator::start(&binary, &args, dir.join("operator.log"))?;
    eprintln!(
        "operator pid {} ({}), log {}",
        operator.pid(),
        binary.display(),
        operator.log().display()
    );
    wait::until(
        "the operator's /readyz",
        TIMEOUT,
        &mut operator,
        || async move { operator::http_get(health, "/readyz").await.is_some() },
    )
    .await?;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let first = TestKey::derived("bench-first", 21);
    secrets
        .create(
            &PostParams::default(),
            &first.json_secret_for(NS, KEY_SECRET, DB),
        )
        .await
        .context("creating the key Secret")?;
    let mut qdb = testing::questdb(DB, NS);
    qdb.metadata = ObjectMeta {
        name: Some(DB.into()),
        namespace: Some(NS.into()),
        ..ObjectMeta::default()
    };
    Api::<QuestDB>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &qdb)
        .await
        .context("creating the QuestDB")?;
    wait_key_live(&client, &mut operator, &first).await?;
    let baseline = operator.memory()?;

    let started = Instant::now();
    let payload: Vec<u8> = (0..SECRET_BYTES).map(|i| (i % 251) as u8).collect();
    futures::stream::iter(0..settings.secrets)
        .map(|i| {
            let (secrets, secret) = (secrets.clone(), unrelated_secret(i, &payload));
            async move { secrets.create(&PostParams::default(), &secret).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("creating the unrelated Secrets")?;
    let create_secs = started.elapsed().as_secs_f64();

    // Secret events reach the operator in order on one watch: once a key Secret created after
    // all of them is deployed, the metadata cache has seen every unrelated Secret.
    let caught_up = Instant::now();
    let second = TestKey::derived("bench-second", 22);
    secrets
        .create(
            &PostParams::default(),
            &second.json_secret_for(NS, "second-key", DB),
        )
        .await
        .context("creating the second key Secret")?;
    wait_key_live(&client, &mut operator, &second).await?;
    let settle_secs = caught_up.elapsed().as_secs_f64();
    let loaded = operator.memory()?;

    // Rotation: edit the first key Secret; time until the pod template's config hash changes.
    // The watch is opened after the edit, so the figure includes one list round trip.
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let sts = statefulsets
        .get(DB)
        .await
        .context("reading the StatefulSet")?;
    let hash_before = config_hash(&sts);
    let rotated = TestKey::derived("bench-rotated", 23);
    let mut key_secret = secrets
        .get(KEY_SECRET)
        .await
        .context("reading the key Secret")?;
    key_secret.data = rotated.json_secret_for(NS, KEY_SECRET, DB).data;
    let hash_changed = {
        let before = hash_before.clone();
        await_condition(statefulsets.clone(), DB, move |s: Option<&StatefulSet>| {
            s.is_some_and(|s| config_hash(s) != before)
        })
    };
    let edit = Instant::now();
    secrets
        .replace(KEY_SECRET, &PostParams::default(), &key_secret)
        .await
        .context("rotating the key")?;
    tokio::time::timeout(TIMEOUT, hash_changed)
        .await
        .context("waiting for the pod template to change")?
        .context("watching the StatefulSet")?;
    let rotation_ms = edit.elapsed().as_secs_f64() * 1000.0;
    operator.ensure_running()?;

    drop(operator);
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Figures {
        secrets: settings.secrets,
        baseline,
        loaded,
        create_secs,
        settle_secs,
        rotation_ms,
    })
}

fn main() -> std::process::ExitCode {
    // Two TLS backends are linked (ring for kube, aws-lc-rs via the AWS SDK), so rustls cannot
    // pick one by itself; the operator binary makes the same choice.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("secrets bench: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("secrets bench: starting tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "optimised"
    };
    match runtime.block_on(run(&settings)) {
        Ok(figures) => {
            if settings.quick {
                println!("(quick run: {} Secrets, no target check)", figures.secrets);
            }
            figures.print(profile);
            // A full run over budget fails, so a script or CI job running it notices.
            if figures.within_target() == Some(false) {
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("secrets bench failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
