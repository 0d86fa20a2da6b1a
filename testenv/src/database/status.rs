//! The pod status a real database's kubelet reports, kept whole and posted when it changes:
//! container states (`waiting` with the kubelet's reasons, `running`, `lastState.terminated`),
//! restart counts, readiness, and the pod conditions derived from them, each with the time it
//! last changed. Sources: pkg/kubelet/status/generate.go (condition reasons and messages),
//! pkg/kubelet/kuberuntime/kuberuntime_container.go (terminated states).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::{json, Value};

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Time,
    },
    Terminated(Value),
}

#[derive(Clone, Debug)]
pub(crate) struct ContainerModel {
    pub name: String,
    image: String,
    pub state: State,
    pub last: Option<Value>,
    pub restart_count: i32,
    pub ready: bool,
    pub started: bool,
    pub id: Option<String>,
}

impl ContainerModel {
    fn new(c: &Container, state: State) -> Self {
        ContainerModel {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state,
            last: None,
            restart_count: 0,
            ready: false,
            started: false,
            id: None,
        }
    }

    fn to_json(&self) -> Value {
        let state = match &self.state {
            State::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
            State::Terminated(t) => json!({"terminated": t}),
        };
        json!({
            "name": self.name, "image": self.image,
            "imageID": format!("docker.io/{}", self.image),
            "containerID": self.id,
            "state": state,
            "lastState": self.last.as_ref().map(|t| json!({"terminated": t})).unwrap_or(json!({})),
            "ready": self.ready, "started": self.started, "restartCount": self.restart_count,
        })
    }
}

/// A `terminated` container state.
pub(crate) fn terminated(
    code: i32,
    started_at: &Time,
    message: Option<String>,
    container_id: Option<&str>,
) -> Value {
    json!({
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "message": message,
        "startedAt": started_at, "finishedAt": now(),
        "containerID": container_id,
    })
}

pub(crate) struct Model {
    pub phase: &'static str,
    pod_ip: String,
    host_ip: String,
    start_time: Time,
    pub containers: Vec<ContainerModel>,
    db: usize,
    pub init: Vec<ContainerModel>,
    transitions: BTreeMap<&'static str, (bool, Time)>,
}

impl Model {
    /// A pod whose sandbox exists (it has its address) and whose containers wait for the init
    /// containers. Containers other than the database are not run: they are reported running
    /// and ready.
    pub(crate) fn new(pod: &Pod, db_container: &str, pod_ip: &str, host_ip: &str) -> Model {
        let spec = pod.spec.clone().unwrap_or_default();
        let start_time = now();
        let init: Vec<ContainerModel> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                ContainerModel::new(
                    c,
                    State::Waiting {
                        reason: "PodInitializing".into(),
                        message: None,
                    },
                )
            })
            .collect();
        let containers: Vec<ContainerModel> = spec
            .containers
            .iter()
            .map(|c| {
                if c.name == db_container {
                    let reason = if init.is_empty() {
                        "ContainerCreating"
                    } else {
                        "PodInitializing"
                    };
                    ContainerModel::new(
                        c,
                        State::Waiting {
                            reason: reason.into(),
                            message: None,
                        },
                    )
                } else {
                    let mut m = ContainerModel::new(
                        c,
                        State::Running {
                            started_at: start_time.clone(),
                        },
                    );
                    m.ready = true;
                    m.started = true;
                    m.id = Some(format!(
                        "containerd://{}-{}",
                        pod.uid().unwrap_or_default(),
                        c.name
                    ));
                    m
                }
            })
            .collect();
        let db = containers
            .iter()
            .position(|c| c.name == db_container)
            .unwrap_or(0);
        Model {
            phase: "Pending",
            pod_ip: pod_ip.into(),
            host_ip: host_ip.into(),
            start_time,
            containers,
            db,
            init,
            transitions: BTreeMap::new(),
        }
    }

    pub(crate) fn db(&mut self) -> &mut ContainerModel {
        &mut self.containers[self.db]
    }

    pub(crate) fn db_ref(&self) -> &ContainerModel {
        &self.containers[self.db]
    }

    /// Every init container ran to completion.
    pub(crate) fn initialized(&mut self) {
        for c in &mut self.init {
            if !matches!(c.state, State::Terminated(_)) {
                let t = now();
                c.id = Some(format!("containerd://init-{}", c.name));
                c.state = State::Terminated(terminated(0, &t, None, c.id.as_deref()));
                c.ready = true;
            }
        }
    }

    /// The whole `status`, as a merge patch replaces it (condition transition times move on).
    pub(crate) fn status(&mut self) -> Value {
        let unready: Vec<String> = self
            .containers
            .iter()
            .filter(|c| !c.ready)
            .map(|c| c.name.clone())
            .collect();
        let uninit: Vec<String> = self
            .init
            .iter()
            .filter(|c| !matches!(c.state, State::Terminated(_)))
            .map(|c| c.name.clone())
            .collect();
        let ready = unready.is_empty();
        let list = |names: &[String]| format!("[{}]", names.join(" "));
        let conditions = [
            ("PodReadyToStartContainers", true, None, None),
            (
                "Initialized",
                uninit.is_empty(),
                Some("ContainersNotInitialized"),
                Some(format!(
                    "containers with incomplete status: {}",
                    list(&uninit)
                )),
            ),
            (
                "Ready",
                ready,
                Some("ContainersNotReady"),
                Some(format!(
                    "containers with unready status: {}",
                    list(&unready)
                )),
            ),
            (
                "ContainersReady",
                ready,
                Some("ContainersNotReady"),
                Some(format!(
                    "containers with unready status: {}",
                    list(&unready)
                )),
            ),
            ("PodScheduled", true, None, None),
        ];
        let conditions: Vec<Value> = conditions
            .into_iter()
            .map(|(kind, status, reason, message)| {
                let entry = self.transitions.entry(kind).or_insert_with(|| (status, now()));
                if entry.0 != status {
                    *entry = (status, now());
                }
                let mut c = json!({"type": kind, "status": if status { "True" } else { "False" }, "lastTransitionTime": entry.1});
                if !status {
                    c["reason"] = json!(reason);
                    c["message"] = json!(message);
                }
                c
            })
            .collect();
        json!({
            "phase": self.phase,
            "conditions": conditions,
            "podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}],
            "hostIP": self.host_ip, "hostIPs": [{"ip": self.host_ip}],
            "startTime": self.start_time,
            "initContainerStatuses": self.init.iter().map(ContainerModel::to_json).collect::<Vec<_>>(),
            "containerStatuses": self.containers.iter().map(ContainerModel::to_json).collect::<Vec<_>>(),
        })
    }
}
