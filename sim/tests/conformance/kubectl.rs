//! Plain kubectl 1.32 against the simulator: apply (create, then strategic-merge re-apply),
//! annotate/label (merge patches) and `get` through printer columns.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use questdb_sim::Sim;

use crate::support::*;

const KUBECTL: &str = "/usr/bin/kubectl";

fn kubectl_available() -> bool {
    let found = Path::new(KUBECTL).exists();
    if !found {
        eprintln!("note: {KUBECTL} is missing; skipping the kubectl checks");
    }
    found
}

struct Workdir(PathBuf);

impl Workdir {
    fn new(sim: &Sim, test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("questdb-sim-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kubeconfig"), sim.kubeconfig_yaml()).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    /// Runs kubectl off the async runtime and returns stdout, failing the test on a non-zero exit.
    async fn kubectl(&self, args: &[&str]) -> String {
        let kubeconfig = self.0.join("kubeconfig");
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(KUBECTL)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--request-timeout=20s")
                .args(&args)
                .output()
                .expect("kubectl runs")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "kubectl failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const POD_V1: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: app:1
    env:
    - {name: MODE, value: one}
  - name: sidecar
    image: sidecar:1
";

#[tokio::test]
async fn kubectl_apply_creates_then_reapplies_with_a_strategic_merge_patch() {
    if !kubectl_available() {
        return;
    }
    let sim = sim().await;
    let dir = Workdir::new(&sim, "apply");
    let file = dir.write("pod.yaml", POD_V1);
    let file = file.to_str().unwrap();
    assert!(dir
        .kubectl(&["apply", "-f", file])
        .await
        .contains("created"));
    dir.write(
        "pod.yaml",
        &POD_V1
            .replace("value: one", "value: two")
            .replace("app:1", "app:2"),
    );
    sim.reset_request_counts();
    assert!(dir
        .kubectl(&["apply", "-f", file])
        .await
        .contains("configured"));
    assert_eq!(
        sim.request_counts().get(questdb_sim::Verb::Patch, "pods"),
        1
    );

    let pod = Api::<Pod>::namespaced(sim.client().await, "default")
        .get("web")
        .await
        .unwrap();
    let containers = pod.spec.unwrap().containers;
    assert_eq!(containers.len(), 2, "sidecar kept by the list merge");
    assert_eq!(containers[0].image.as_deref(), Some("app:2"));
    assert_eq!(
        containers[0].env.as_ref().unwrap()[0].value.as_deref(),
        Some("two")
    );

    dir.kubectl(&["annotate", "pod", "web", "note=hello"]).await;
    dir.kubectl(&["label", "pod", "web", "tier=gold"]).await;
    let labelled = dir
        .kubectl(&["get", "pods", "-l", "tier=gold", "-o", "name"])
        .await;
    assert_eq!(labelled.trim(), "pod/web");
    let note = dir
        .kubectl(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.annotations.note}",
        ])
        .await;
    assert_eq!(note, "hello");
    sim.shutdown().await;
}

#[tokio::test]
async fn kubectl_get_shows_a_crds_printer_columns() {
    if !kubectl_available() {
        return;
    }
    let sim = sim().await;
    let dir = Workdir::new(&sim, "columns");
    let crd = serde_json::to_string(&widget_crd()).unwrap();
    let crd_file = dir.write("crd.json", &crd);
    dir.kubectl(&["apply", "-f", crd_file.to_str().unwrap()])
        .await;
    let w = dir.write(
        "w.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n",
    );
    dir.kubectl(&["apply", "-f", w.to_str().unwrap()]).await;
    let out = dir.kubectl(&["get", "wd"]).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "PHASE", "AGE"]);
    assert!(out.lines().nth(1).unwrap().starts_with("w1"), "{out}");

    // A rejected apply surfaces the CEL message to the kubectl user.
    dir.write(
        "w.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n",
    );
    let kubeconfig = dir.0.join("kubeconfig");
    let path = w.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["apply", "-f"])
            .arg(path)
            .output()
            .expect("kubectl runs")
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("size may not shrink"));
    sim.shutdown().await;
}

#[tokio::test]
async fn kubectl_describe_shows_events_recorded_through_events_k8s_io() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::Resource;

    if !kubectl_available() {
        return;
    }
    let sim = sim().await;
    let client = sim.client().await;
    let cm = configmaps(&client)
        .create(&kube::api::PostParams::default(), &configmap("described"))
        .await
        .unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("conformance"));
    let event = Event {
        type_: EventType::Warning,
        reason: "Probed".into(),
        note: Some("seen by kubectl".into()),
        action: "Probe".into(),
        secondary: None,
    };
    recorder.publish(&event, &cm.object_ref(&())).await.unwrap();
    let dir = Workdir::new(&sim, "describe");
    let out = dir.kubectl(&["describe", "configmap", "described"]).await;
    assert!(
        out.contains("Probed") && out.contains("seen by kubectl"),
        "{out}"
    );
    sim.shutdown().await;
}
