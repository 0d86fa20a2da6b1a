//! Measures the simulator: resident memory holding 1,000 QuestDB-like objects with their
//! children, then requests/s for an operator-like mix from concurrent clients.
//! `cargo run -p questdb-sim --example bench -- [objects] [seconds] [concurrency]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use questdb_sim::{Sim, SimConfig};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("valid fixture")
}

fn crd() -> CustomResourceDefinition {
    typed(json!({
        "metadata": {"name": "questdbs.bench.example.com"},
        "spec": {
            "group": "bench.example.com", "scope": "Namespaced",
            "names": {"kind": "QuestDB", "plural": "questdbs", "singular": "questdb"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"volume": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                            "x-kubernetes-validations": [{"rule": "self.size == oldSelf.size || self.size != ''", "message": "size"}]}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
        }
    }))
}

fn labels(i: usize) -> Value {
    json!({"app.kubernetes.io/name": "questdb", "app.kubernetes.io/instance": format!("db{i}"),
           "app.kubernetes.io/managed-by": "questdb-operator"})
}

async fn populate(client: &kube::Client, qdb: &Api<DynamicObject>, i: usize) {
    let ns = "default";
    let name = format!("db{i}");
    let mut cr = DynamicObject::new(&name, &ar());
    cr.data = json!({"spec": {"image": "questdb/questdb:9.0.0", "volume": {"size": "50Gi", "storageClassName": "gp3"},
        "config": {"server": {"cairo.commit.lag": "1000", "shared.worker.count": "2"}},
        "failover": {"enabled": true, "unhealthyAfterSeconds": 90}, "dns": {"name": format!("{name}.example.com"), "ttl": 60}}});
    let created = qdb.create(&PostParams::default(), &cr).await.expect("cr");
    let owner = json!([{"apiVersion": "bench.example.com/v1", "kind": "QuestDB", "name": name,
        "uid": created.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    let meta = json!({"name": name, "labels": labels(i), "ownerReferences": owner});
    let env: Vec<Value> = (0..10)
        .map(|e| json!({"name": format!("QDB_SETTING_{e}"), "value": "some-value"}))
        .collect();
    let sts: StatefulSet = typed(json!({"metadata": meta, "spec": {
        "replicas": 1, "serviceName": name, "selector": {"matchLabels": labels(i)},
        "template": {"metadata": {"labels": labels(i)}, "spec": {
            "securityContext": {"fsGroup": 10001},
            "containers": [{"name": "questdb", "image": "questdb/questdb:9.0.0", "env": env,
                "ports": [{"name": "http", "containerPort": 9000}, {"name": "pg", "containerPort": 8812},
                          {"name": "ilp", "containerPort": 9009}, {"name": "min", "containerPort": 9003}],
                "readinessProbe": {"httpGet": {"path": "/status", "port": 9003}},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/questdb"},
                                 {"name": "config", "mountPath": "/var/lib/questdb/conf"}],
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}}],
            "volumes": [{"name": "config", "configMap": {"name": name}}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": "gp3", "resources": {"requests": {"storage": "50Gi"}}}}]}}));
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await
        .expect("sts");
    let svc: Service = typed(
        json!({"metadata": meta, "spec": {"selector": labels(i), "ports": [
        {"name": "http", "port": 9000}, {"name": "pg", "port": 8812}, {"name": "ilp", "port": 9009}]}}),
    );
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("svc");
    let cm: ConfigMap = typed(json!({"metadata": meta, "data": {
        "server.conf": "http.net.bind.to=0.0.0.0:9000\npg.net.bind.to=0.0.0.0:8812\nline.tcp.net.bind.to=0.0.0.0:9009\ncairo.commit.lag=1000\n",
        "log.conf": "writers=stdout\nw.stdout.class=io.questdb.log.LogConsoleWriter\n"}}));
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("cm");
    let secret: Secret = typed(
        json!({"metadata": {"name": format!("{name}-ilp"), "labels": labels(i)},
        "stringData": {"auth.txt": "testUser1 ec-p-256-sha256 AKfkxOBXJWgkMS1vK1SfScO8RjabC3P3xb4oTo5DHdvX AL0GG2hQ6mbc3hlsgK4Njh2jwxaPHwqKnwNE3ZSzxqtz"}}),
    );
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let pod: Pod = typed(
        json!({"metadata": {"name": format!("{name}-0"), "labels": labels(i), "ownerReferences": owner},
        "spec": sts.spec.as_ref().map(|s| s.template.spec.clone()).unwrap_or_default()}),
    );
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .ok();
    for e in 0..2 {
        let ev: Event = typed(
            json!({"metadata": {"name": format!("{name}.{e}")}, "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "questdb-operator", "reportingInstance": "questdb-operator-0",
            "action": "Reconcile", "reason": "Created", "type": "Normal", "note": "created the StatefulSet",
            "regarding": {"apiVersion": "bench.example.com/v1", "kind": "QuestDB", "name": name, "namespace": ns}}),
        );
        Api::<Event>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &ev)
            .await
            .expect("event");
    }
}

fn ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("bench.example.com", "v1", "QuestDB"),
        "questdbs",
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let objects: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let concurrency: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);

    let sim = Sim::start(SimConfig::default()).await?;
    let client = sim.client().await;
    let before = rss_mib();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd())
        .await?;
    let qdb: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar());
    for i in 0..objects {
        populate(&client, &qdb, i).await;
    }
    let after = rss_mib();
    println!("{objects} QuestDBs with children: RSS {after:.1} MiB (started at {before:.1} MiB), resourceVersion {}", sim.resource_version());

    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = vec![];
    for t in 0..concurrency {
        let client = client.clone();
        let qdb = qdb.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let sts: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let mut n = t;
            while Instant::now() < deadline {
                let name = format!("db{}", n % objects);
                // A reconcile: read the CR and its children, write status, now and then a child.
                let _ = qdb.get(&name).await;
                let _ = sts.get(&name).await;
                let _ = cms.get(&name).await;
                let _ = pods
                    .list(
                        &ListParams::default()
                            .labels(&format!("app.kubernetes.io/instance={name}")),
                    )
                    .await;
                let status =
                    json!({"status": {"phase": "Running", "observedGeneration": 1, "n": n}});
                let _ = qdb
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
                let mut reqs = 5;
                if n % 4 == 0 {
                    let p = json!({"metadata": {"annotations": {"bench/n": n.to_string()}}});
                    let _ = cms
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                        .await;
                    reqs += 1;
                }
                done.fetch_add(reqs, Ordering::Relaxed);
                n += concurrency;
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = done.load(Ordering::Relaxed);
    println!(
        "{total} requests in {elapsed:.1}s from {concurrency} clients: {:.0} requests/s; RSS {:.1} MiB",
        total as f64 / elapsed,
        rss_mib()
    );
    sim.shutdown().await;
    Ok(())
}
