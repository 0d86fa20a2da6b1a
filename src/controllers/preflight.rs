//! The preflight: what the operator will need, checked as the cloud and the cluster can answer
//! without side effects, so a wrong subnet or a missing API is named once, with its fix,
//! instead of every database waiting on a launch or a backup that cannot work.
//!
//! Each failure is one log line, a Warning Event on the operator's own Pod (when it runs in
//! one: `POD_NAME` and `POD_NAMESPACE`), and the `questdb_operator_preflight_failures{check}`
//! gauge. A certain network mistake (EC2 says the subnet does not exist, or lies in another
//! zone, or a security group is in another VPC) also holds every launch back: the databases
//! that would need a node say so in `NodeReady` (`PreflightFailed`) instead of waiting. A
//! check that could not be asked (throttled, denied, unreachable) is reported and holds nothing
//! back. The checks run when the leader starts, again every minute while one fails, and every
//! ten minutes otherwise; a fix is seen within a minute.
//!
//! The launch check dry-runs the RunInstances a launch would make (`DryRun`: EC2 checks the
//! operator's permissions, `iam:PassRole` of the instance profile included, and answers
//! UnauthorizedOperation when its policy denies the launch) for each image, instance type and
//! zone the QuestDBs ask for, at most [`LAUNCH_SAMPLES`] a run; with no QuestDB on a dedicated
//! node it has nothing to ask. moto, which the tests run against, enforces no IAM: it checks
//! the instance profile exists, which the tests see.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::api::{EventReason, QuestDB};
use crate::controllers::context::Context;
use crate::plan::preflight::{
    blocks_launches, hosted_zone, instance_type, launch, network, snapshot_api, storage_class,
    Check, Finding,
};

/// At most this many distinct launches (image, instance type, zone, public address) are
/// dry-run per preflight run.
pub(crate) const LAUNCH_SAMPLES: usize = 8;

/// The distinct launches the QuestDBs ask for, each with words for the finding.
fn launch_samples(questdbs: &[&QuestDB]) -> Vec<(String, crate::cloud::LaunchRequest)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for &qdb in questdbs {
        let Some(node) = &qdb.spec.node else { continue };
        let public = qdb.spec.dns.as_ref().is_some_and(|d| d.public);
        let key = (
            node.image.clone(),
            node.instance_type.clone(),
            node.zone.clone(),
            public,
        );
        if !seen.insert(key) {
            continue;
        }
        let dedicated = crate::desired::DedicatedNode::for_questdb(qdb);
        // The dry run carries the tags a launch carries (the IAM policy requires them), under
        // an identity no instance has.
        let Some(mut req) =
            crate::plan::node::launch_request(qdb, "questdb-operator-preflight", 0, &dedicated)
        else {
            continue;
        };
        req.fallback_instance_types.clear();
        let what = format!(
            "{} from {} in {}{} (as {}/{} asks)",
            node.instance_type,
            node.image,
            node.zone,
            if public { " with a public address" } else { "" },
            qdb.namespace().unwrap_or_default(),
            qdb.name_any()
        );
        out.push((what, req));
        if out.len() == LAUNCH_SAMPLES {
            break;
        }
    }
    out
}

/// Every finding of one preflight run, checks in their order.
pub(crate) async fn run_checks(ctx: &Context, snapshot_namespace: &str) -> Vec<Finding> {
    // Borrowed from the cache, not copied: the checks read a few fields of each.
    let cached = ctx.caches.questdbs.state();
    let questdbs: Vec<&QuestDB> = cached.iter().filter_map(|q| q.0.as_ref().ok()).collect();
    check(
        ctx.cloud.as_ref().map(|c| c.nodes.as_ref()),
        ctx.cloud.as_ref().and_then(|c| c.dns.as_deref()),
        &ctx.client,
        snapshot_namespace,
        &questdbs,
    )
    .await
}

/// The checks themselves, on what they need: the running operator's caches
/// ([`run_checks`]), or `questdb-operator preflight`'s one-off reads (the chart's `helm test`).
pub(crate) async fn check(
    nodes: Option<&dyn crate::cloud::NodeProvider>,
    dns: Option<&dyn crate::cloud::DnsProvider>,
    client: &kube::Client,
    snapshot_namespace: &str,
    questdbs: &[&QuestDB],
) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some(nodes) = nodes {
        findings.extend(network(nodes.check_network().await));
        let zones: Vec<String> = nodes.zones();
        for name in nodes
            .allowed_instance_types()
            .iter()
            .filter(|t| !t.contains('*'))
        {
            let mut answers = Vec::new();
            for zone in &zones {
                answers.push((zone.clone(), nodes.instance_type_facts(name, zone).await));
            }
            findings.extend(instance_type(name, &answers));
        }
        for (what, req) in launch_samples(questdbs) {
            findings.extend(launch(&what, nodes.check_launch(&req).await));
        }
        if let Some(dns) = dns {
            // A name no record has: the read answers empty when the zone is readable.
            let read = dns
                .read_a("questdb-operator-preflight.invalid")
                .await
                .map(|_| ());
            findings.extend(hosted_zone(&dns.zone_id(), read));
        }
    }
    let classes = Api::<StorageClass>::all(client.clone());
    for (name, asked_by) in storage_classes(questdbs) {
        let exists = classes.get_opt(&name).await.map(|c| c.is_some());
        findings.extend(storage_class(&name, &asked_by, exists));
    }
    findings.extend(snapshot_api(
        crate::controllers::backup::snapshot::api_served(client, snapshot_namespace).await,
    ));
    findings
}

/// The distinct StorageClasses the QuestDBs name (at most [`LAUNCH_SAMPLES`]), each with the
/// first QuestDB naming it. One that names none gets the cluster's default class, which the
/// operator may not list (`get` only).
fn storage_classes(questdbs: &[&QuestDB]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for qdb in questdbs {
        let Some(name) = &qdb.spec.volume.storage_class_name else {
            continue;
        };
        if out.iter().any(|(n, _)| n == name) {
            continue;
        }
        out.push((
            name.clone(),
            format!("{}/{}", qdb.namespace().unwrap_or_default(), qdb.name_any()),
        ));
        if out.len() == LAUNCH_SAMPLES {
            break;
        }
    }
    out
}

/// How often the checks run while one fails, and while none does.
pub(crate) const AGAIN_WHILE_FAILING: Duration = Duration::from_secs(60);
pub(crate) const AGAIN_WHILE_PASSING: Duration = Duration::from_secs(600);

/// Runs the checks until `token` is cancelled, reporting each change (see the module doc).
pub(crate) async fn run(
    ctx: Arc<Context>,
    operator_pod: Option<ObjectReference>,
    snapshot_namespace: String,
    token: CancellationToken,
) {
    // The launch check reads the QuestDBs from the caches.
    tokio::select! {
        () = token.cancelled() => return,
        _ = ctx.caches.questdbs.wait_until_ready() => {}
    }
    loop {
        let found = tokio::select! {
            () = token.cancelled() => return,
            found = run_checks(&ctx, &snapshot_namespace) => found,
        };
        let failing = !found.is_empty();
        report(&ctx, operator_pod.as_ref(), found).await;
        let again = if failing {
            AGAIN_WHILE_FAILING
        } else {
            AGAIN_WHILE_PASSING
        };
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(again) => {}
        }
    }
}

/// Publishes what changed since the last run: a line, an Event and the gauge per new finding;
/// a line per check that passes again; the databases a lifted launch hold waits on are woken.
async fn report(ctx: &Context, operator_pod: Option<&ObjectReference>, found: Vec<Finding>) {
    use strum::IntoEnumIterator;
    for check in Check::iter() {
        let n = found.iter().filter(|f| f.check == check).count();
        ctx.metrics.set_preflight_failures(check.into(), n as i64);
    }
    let before = ctx.preflight.replace(found.clone());
    for f in found.iter().filter(|f| !before.contains(f)) {
        error!(check = %f.check, fix = %f.fix, "preflight: {}", f.problem);
        if let Some(pod) = operator_pod {
            // An action per check: the recorder folds events of one object, reason and action
            // into one series, which would keep only the first check's note.
            ctx.event_for(
                pod,
                EventType::Warning,
                EventReason::PreflightFailed,
                &format!("Preflight:{}", f.check),
                f.line(),
            )
            .await;
        }
    }
    for check in Check::iter() {
        let failed = |fs: &[Finding]| fs.iter().any(|f| f.check == check);
        if failed(&before) && !failed(&found) {
            info!(check = %check, "preflight: passes now");
        }
    }
    if blocks_launches(&before).is_some() && blocks_launches(&found).is_none() {
        wake_waiting_for_a_node(ctx);
    }
}

/// Asks for a reconcile of every QuestDB that wants a dedicated node and has none yet.
fn wake_waiting_for_a_node(ctx: &Context) {
    let Some(wake) = &ctx.wake else { return };
    for q in ctx.caches.questdbs.state() {
        let Ok(qdb) = q.0.as_ref() else { continue };
        let wants =
            qdb.spec.node.is_some() && qdb.status.as_ref().is_none_or(|s| s.instance_id.is_none());
        if wants {
            let _ = wake.unbounded_send(ObjectRef::from_obj(&*q));
        }
    }
}

/// The operator's own Pod, from the downward API's `POD_NAME` and `POD_NAMESPACE`: what its
/// preflight Events are about. `None` outside a pod.
pub(crate) fn operator_pod_from_env() -> Option<ObjectReference> {
    let name = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty())?;
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())?;
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name),
        namespace: Some(namespace),
        ..Default::default()
    })
}
