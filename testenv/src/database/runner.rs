//! One database pod on one node, from "volumes attached" to "containers stopped": pull (the
//! jar), set up (init containers, mounted files, environment), run QuestDB, probe it, report
//! every change of its status, restart it after an exit with the kubelet's doubling back-off,
//! and stop it on request (SIGTERM, SIGKILL after the grace period).
//! The node's faults act on the process: a power-off SIGKILLs it (and a power-on starts it
//! again, as a rebooted kubelet does for the pods still bound to its node); a partition stops
//! the status reports and pauses the process (SIGSTOP, SIGCONT when it heals or the instance
//! shuts down) so that nothing outside the node reaches it; a kubelet cut off from the API
//! server only stops the status reports, the process keeps running and answering; a stopped
//! instance ends it.
//! Sources: pkg/kubelet/kuberuntime/kuberuntime_container.go (start, kill with grace period,
//! termination message), pkg/kubelet/kubelet.go and pod_workers.go (back-off, CrashLoopBackOff),
//! pkg/kubelet/status/status_manager.go (status patches carry the pod's UID).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::env::{self, Sources};
use super::mounts::{self, MountTable};
use super::probe::{self, Check, Kind};
use super::status::{self, Model, State};
use super::watcher::DatabaseProcess;
use super::{jar, process, questdb_version, Runtime};
use crate::kubelet::{Fault, NodeHandle};
use crate::timings;

/// Where the official image keeps QuestDB's root (`-d`), the operator's PVC mount path.
const QUESTDB_ROOT: &str = "/var/lib/questdb";

/// The listeners QuestDB opens by default, with their ports. A bind to `0.0.0.0` would take the
/// port on every loopback address, so such binds are narrowed to the pod's address through
/// the environment, which QuestDB reads before `server.conf`.
const BINDS: &[(&str, &str, u16)] = &[
    ("http.net.bind.to", "http.bind.to", 9000),
    ("http.min.net.bind.to", "http.min.bind.to", 9003),
    ("pg.net.bind.to", "pg.net.bind.to", 8812),
    ("line.tcp.net.bind.to", "line.tcp.net.bind.to", 9009),
];

/// kubelet: `MaxContainerTerminationMessageLogLines` / `...LogLength`.
const TERMINATION_LOG_LINES: usize = 80;
const TERMINATION_LOG_BYTES: usize = 2048;

/// The kubelet's side of a running database pod.
pub(crate) struct PodHandle {
    stop: watch::Sender<Option<Duration>>,
    finished: Arc<AtomicBool>,
    grace: Duration,
}

impl PodHandle {
    /// Stop the containers, giving QuestDB `grace` (capped at [`timings::DATABASE_STOP_MAX`])
    /// after SIGTERM. The first request wins.
    pub(crate) fn stop(&self, grace: Duration) {
        self.stop.send_if_modified(|g| {
            if g.is_none() {
                *g = Some(grace);
                true
            } else {
                false
            }
        });
    }

    /// Stop with the pod's `terminationGracePeriodSeconds` (the pod object is gone).
    pub(crate) fn stop_with_spec_grace(&self) {
        self.stop(self.grace)
    }

    /// Every process of the pod has exited: its volumes may be unmounted.
    pub(crate) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }
}

/// Starts the pod on `node`; `claims` maps the pod's PVC volume names to volume handles.
/// `done` is nudged when the pod's processes are all gone.
pub(crate) fn start(
    rt: Arc<Runtime>,
    pod: Pod,
    node: NodeHandle,
    claims: BTreeMap<String, String>,
    done: UnboundedSender<()>,
) -> PodHandle {
    let spec = pod.spec.clone().unwrap_or_default();
    let grace =
        Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64);
    let (stop_tx, stop_rx) = watch::channel(None);
    let finished = Arc::new(AtomicBool::new(false));
    let container = super::database_container(&pod).cloned().unwrap_or_default();
    let image = container.image.clone().unwrap_or_default();
    let pod_ip = node.next_pod_ip();
    let host_ip = node.internal_ip();
    let uid = pod.uid().unwrap_or_default();
    let runner = Runner {
        api: Api::namespaced(rt.client.clone(), &pod.namespace().unwrap_or_default()),
        ns: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        model: Model::new(&pod, &container.name, &pod_ip, &host_ip),
        version: questdb_version(&image).unwrap_or_else(|| Err("not a QuestDB image".into())),
        claim_handles: claims,
        claims: BTreeMap::new(),
        pod_dir: rt.rootfs.join(&uid),
        uid,
        image,
        container,
        faults: node.faults(),
        node_stopped: node.stopped(),
        node,
        pod_ip,
        host_ip,
        posted: None,
        unposted_since_fault: false,
        stop_rx,
        pod_stop: rt.stop.child_token(),
        backoff: timings::RESTART_BACKOFF_INITIAL,
        grace,
        pod,
        rt,
    };
    let flag = finished.clone();
    tokio::spawn(async move {
        let pod_stop = runner.pod_stop.clone();
        runner.run().await;
        pod_stop.cancel();
        flag.store(true, Ordering::SeqCst);
        let _ = done.send(());
    });
    PodHandle {
        stop: stop_tx,
        finished,
        grace,
    }
}

/// Why a process ended.
enum End {
    /// By itself, or killed after failing a probe.
    Exited,
    /// The kubelet stopped it (pod deleted).
    Stopped,
    /// Its node lost power.
    PowerLost,
    /// Its node's kubelet (the instance) is gone for good.
    NodeGone,
    /// Its node's OS shut down normally (SIGTERM and the grace period).
    ShutDown,
    /// It used more memory than its container's limit, and the kernel's OOM killer ended it.
    OomKilled,
}

struct Runner {
    rt: Arc<Runtime>,
    api: Api<Pod>,
    pod: Pod,
    ns: String,
    name: String,
    uid: String,
    container: Container,
    image: String,
    version: Result<String, String>,
    node: NodeHandle,
    pod_ip: String,
    host_ip: String,
    /// The pod's PVC volume names → volume handles.
    claim_handles: BTreeMap<String, String>,
    /// The pod's PVC volume names → the directories mounted for them on this node.
    claims: BTreeMap<String, PathBuf>,
    pod_dir: PathBuf,
    model: Model,
    posted: Option<Value>,
    unposted_since_fault: bool,
    stop_rx: watch::Receiver<Option<Duration>>,
    faults: watch::Receiver<Fault>,
    node_stopped: CancellationToken,
    /// Ends what lives as long as the pod: host-port forwarders, probe workers.
    pod_stop: CancellationToken,
    backoff: Duration,
    grace: Duration,
}

/// Returns when the pod is to stop (deleted, its kubelet gone, or its handle dropped).
async fn until_stopped(mut stop: watch::Receiver<Option<Duration>>, node: CancellationToken) {
    tokio::select! {
        _ = stop.wait_for(|g| g.is_some()) => {}
        _ = node.cancelled() => {}
    }
}

impl Runner {
    fn stopping(&self) -> bool {
        self.stop_rx.borrow().is_some()
            || self.node_stopped.is_cancelled()
            || self.stop_rx.has_changed().is_err()
    }

    async fn run(mut self) {
        self.run_until_stopped().await;
        // The kubelet unmounts a pod's volumes once its containers are gone: a clean unmount
        // writes back what the node's kernel holds (unless the power went first).
        self.unmount_claims().await;
    }

    async fn unmount_claims(&self) {
        self.rt.pod_unmounted(&self.uid);
        for handle in self.claim_handles.values() {
            self.rt.unmount_volume(self.node.index(), handle).await;
        }
    }

    async fn run_until_stopped(&mut self) {
        self.post().await;
        let Some(jar) = self.pull().await else { return };
        self.forward_host_ports();
        let mut power_lost = false;
        loop {
            if !self.wait_powered().await {
                return;
            }
            if power_lost {
                // A kubelet that boots again syncs its pods from the API before it starts any.
                match self.api.get_opt(&self.name).await {
                    Ok(Some(p))
                        if p.uid().as_deref() == Some(self.uid.as_str())
                            && p.metadata.deletion_timestamp.is_none() =>
                    {
                        power_lost = false
                    }
                    Ok(_) => {
                        until_stopped(self.stop_rx.clone(), self.node_stopped.clone()).await;
                        return;
                    }
                    Err(_) => {
                        if !self.pause(timings::CONTAINER_CONFIG_RETRY).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let (env, root) = match self.prepare().await {
                Ok(p) => p,
                Err((reason, message)) => {
                    debug!(pod = %self.name, %reason, %message, "container not created");
                    self.model.db().state = State::Waiting {
                        reason: reason.into(),
                        message: Some(message),
                    };
                    self.post().await;
                    if !self.pause(timings::CONTAINER_CONFIG_RETRY).await {
                        return;
                    }
                    continue;
                }
            };
            let restart = self.model.db_ref().restart_count;
            let log = self.rt.pod_log(
                &self.ns,
                &self.name,
                &self.uid,
                &self.container.name,
                restart,
            );
            let mut child = match process::spawn(&jar, &root, &env, &log) {
                Ok(c) => c,
                Err(e) => {
                    self.model.db().state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: Some(format!("starting java: {e}")),
                    };
                    self.post().await;
                    if !self.pause(timings::RESTART_BACKOFF_MAX).await {
                        return;
                    }
                    continue;
                }
            };
            let pid = child.id().unwrap_or_default();
            self.rt.registry.register(DatabaseProcess {
                namespace: self.ns.clone(),
                pod: self.name.clone(),
                uid: self.uid.clone(),
                node: self.node.name.clone(),
                pid,
                dir: self.rt.backing_of(&root),
                started: SystemTime::now(),
                node_index: self.node.index(),
            });
            info!(pod = %format!("{}/{}", self.ns, self.name), node = %self.node.name, pid, root = %root.display(), "QuestDB started");
            let started_at = status::now();
            let since = Instant::now();
            let id = format!("containerd://{}-{restart}", self.uid);
            {
                let db = self.model.db();
                db.state = State::Running {
                    started_at: started_at.clone(),
                };
                db.id = Some(id.clone());
                db.ready = false;
                db.started = false;
            }
            self.model.phase = "Running";
            self.post().await;
            let (exit, end) = self.supervise(&mut child, pid).await;
            self.rt.registry.unregister(pid, exit);
            let code = process::exit_code(exit);
            info!(pod = %format!("{}/{}", self.ns, self.name), pid, code, "QuestDB ended");
            let message = (code != 0
                && self.container.termination_message_policy.as_deref()
                    == Some("FallbackToLogsOnError"))
            .then(|| termination_log(&log));
            let mut term = status::terminated(code, &started_at, message, Some(&id));
            if matches!(end, End::OomKilled) {
                term["reason"] = json!("OOMKilled");
            }
            {
                let db = self.model.db();
                db.ready = false;
                db.started = false;
            }
            match end {
                End::Stopped => {
                    self.model.db().state = State::Terminated(term);
                    self.post().await;
                    return;
                }
                End::NodeGone => return,
                End::ShutDown => {
                    // The OS stopped the container and unmounts its volumes cleanly; the node
                    // reports nothing more until its instance is gone.
                    self.unmount_claims().await;
                    until_stopped(self.stop_rx.clone(), self.node_stopped.clone()).await;
                    return;
                }
                End::PowerLost => {
                    // After a reboot the runtime has lost the container: the kubelet reports
                    // it Unknown (kuberuntime_manager.go, containers not found after restart).
                    let db = self.model.db();
                    db.last = Some(
                        json!({"exitCode": 255, "reason": "Unknown", "startedAt": started_at, "finishedAt": status::now(), "containerID": id}),
                    );
                    db.restart_count += 1;
                    db.state = State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    };
                    power_lost = true;
                }
                End::Exited | End::OomKilled => {
                    if !self.restart_after(code, term, since).await {
                        return;
                    }
                }
            }
        }
    }

    /// After an exit: the restart policy, the back-off, the `CrashLoopBackOff` report.
    /// False when the pod is to stop.
    async fn restart_after(&mut self, code: i32, term: Value, since: Instant) -> bool {
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let restart = policy == "Always" || (policy == "OnFailure" && code != 0);
        if !restart {
            self.model.db().state = State::Terminated(term);
            self.model.phase = if code == 0 { "Succeeded" } else { "Failed" };
            self.post().await;
            until_stopped(self.stop_rx.clone(), self.node_stopped.clone()).await;
            return false;
        }
        if since.elapsed() >= timings::RESTART_BACKOFF_RESET {
            self.backoff = timings::RESTART_BACKOFF_INITIAL;
        }
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(timings::RESTART_BACKOFF_MAX);
        let message = format!(
            "back-off {} restarting failed container={} pod={}_{}({})",
            go_duration(delay),
            self.container.name,
            self.name,
            self.ns,
            self.uid
        );
        let db = self.model.db();
        db.last = Some(term);
        db.restart_count += 1;
        db.state = State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: Some(message),
        };
        self.post().await;
        self.pause(delay).await
    }

    /// The jar of the image's version; `ErrImagePull` / `ImagePullBackOff` while there is none.
    async fn pull(&mut self) -> Option<PathBuf> {
        loop {
            let outcome = match self.version.clone() {
                Ok(v) => tokio::select! {
                    r = jar::resolve(&v) => r,
                    _ = until_stopped(self.stop_rx.clone(), self.node_stopped.clone()) => return None,
                },
                Err(e) => Err(e),
            };
            let why = match outcome {
                Ok(jar) => return Some(jar),
                Err(why) => why,
            };
            let image = self.image.clone();
            self.model.db().state = State::Waiting {
                reason: "ErrImagePull".into(),
                message: Some(format!("Failed to pull image {image:?}: {why}")),
            };
            self.post().await;
            if !self.pause(timings::IMAGE_PULL_BACKOFF).await {
                return None;
            }
            self.model.db().state = State::Waiting {
                reason: "ImagePullBackOff".into(),
                message: Some(format!("Back-off pulling image {image:?}: {why}")),
            };
            self.post().await;
            if !self.pause(timings::RESTART_BACKOFF_MAX).await {
                return None;
            }
        }
    }

    /// Init containers, mounted files and the environment; `Err` is a waiting reason and its
    /// message.
    async fn prepare(
        &mut self,
    ) -> Result<(Vec<(String, String)>, PathBuf), (&'static str, String)> {
        let failed = |e: std::io::Error| {
            (
                "CreateContainerError",
                format!("preparing the container's directories: {e}"),
            )
        };
        self.claims.clear();
        for (volume, handle) in &self.claim_handles {
            let dir = self
                .rt
                .mount_volume(self.node.index(), handle)
                .await
                .map_err(|e| ("CreateContainerError", e.to_string()))?;
            self.claims.insert(volume.clone(), dir);
        }
        let claim_names: BTreeMap<String, String> = self
            .pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| {
                Some((
                    v.name.clone(),
                    v.persistent_volume_claim.as_ref()?.claim_name.clone(),
                ))
            })
            .collect();
        let mounted = self
            .claims
            .iter()
            .filter_map(|(volume, dir)| {
                Some(super::MountedClaim {
                    volume: volume.clone(),
                    claim: claim_names.get(volume)?.clone(),
                    dir: dir.clone(),
                })
            })
            .collect();
        self.rt
            .pod_mounted(&self.ns, &self.name, &self.uid, self.node.index(), mounted);
        mounts::run_init(&self.pod, &self.claims, &self.pod_dir).map_err(failed)?;
        self.model.initialized();
        let table = MountTable::of(&self.pod, &self.container, &self.claims, &self.pod_dir);
        table.create().map_err(failed)?;
        let client = self.rt.client.clone();
        let mut sources = Sources::new(&client, &self.ns);
        mounts::write_files(&mut sources, &self.pod, &self.container, &table)
            .await
            .map_err(|m| ("ContainerCreating", m))?;
        let mut env = env::resolve(
            &mut sources,
            &self.pod,
            &self.container,
            &self.pod_ip,
            &self.host_ip,
        )
        .await
        .map_err(|m| ("CreateContainerConfigError", m))?;
        let root = table.map(QUESTDB_ROOT);
        std::fs::create_dir_all(&root).map_err(failed)?;
        let conf =
            properties(&std::fs::read_to_string(root.join("conf/server.conf")).unwrap_or_default());
        // The defaults stand for the small machine a test runs on; a pod that sizes QuestDB's
        // native memory in its server.conf keeps its own size (QuestDB's env would win).
        let sized_in_conf = conf.keys().any(|k| k.starts_with("ram.usage.limit."));
        for (k, v) in process::SMALL_DEFAULTS {
            let sized = sized_in_conf && k.starts_with("QDB_RAM_USAGE_LIMIT_");
            if !sized && !env.iter().any(|(n, _)| n == k) {
                env.push((k.to_string(), v.to_string()));
            }
        }
        bind_to_pod_ip(&mut env, &conf, &self.pod_ip);
        Ok((env, root))
    }

    /// Runs until the process ends, probing it and reporting readiness.
    async fn supervise(
        &mut self,
        child: &mut tokio::process::Child,
        pid: u32,
    ) -> (ExitStatus, End) {
        let checks = Check::of(&self.container, &self.pod_ip);
        let threshold = |kind: Kind| {
            checks
                .iter()
                .find(|c| c.kind == kind)
                .map(|c| (c.success_threshold, c.failure_threshold))
        };
        let (startup, readiness, liveness) = (
            threshold(Kind::Startup),
            threshold(Kind::Readiness),
            threshold(Kind::Liveness),
        );
        let probes = self.pod_stop.child_token();
        let _probes_end = probes.clone().drop_guard();
        let (tx, mut results) = tokio::sync::mpsc::unbounded_channel();
        probe::spawn(checks, tx, probes);
        let mut started = startup.is_none();
        let mut counts: BTreeMap<&'static str, (u32, u32)> = BTreeMap::new();
        {
            let db = self.model.db();
            db.started = started;
            db.ready = started && readiness.is_none();
        }
        self.post().await;
        let mut tick = tokio::time::interval(timings::PROBE_PERIOD_MAX);
        let memory_limit = memory_limit(&self.container);
        let mut memory_tick = tokio::time::interval(timings::MEMORY_CHECK_PERIOD);
        let mut volume_tick = tokio::time::interval(timings::VOLUME_REFRESH);
        volume_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let volume_table = MountTable::of(&self.pod, &self.container, &self.claims, &self.pod_dir);
        let mut stop = self.stop_rx.clone();
        // Paused by a partition (see `Fault::Partition`): whatever ends the process first
        // resumes it, so that a SIGTERM is acted on.
        let mut paused = false;
        let pause_for = |fault: Fault, paused: &mut bool| {
            let pause = fault == Fault::Partition;
            if pause != *paused {
                process::signal(pid, if pause { libc::SIGSTOP } else { libc::SIGCONT });
                *paused = pause;
            }
        };
        pause_for(*self.faults.borrow(), &mut paused);
        loop {
            tokio::select! {
                _ = memory_tick.tick(), if memory_limit.is_some() => {
                    let limit = memory_limit.unwrap_or(u64::MAX);
                    if let Some(used) = process::resident_bytes(pid).filter(|used| *used > limit) {
                        // The cgroup's OOM killer: SIGKILL to the container's processes, and
                        // the kubelet reports OOMKilled with 137.
                        info!(pod = %self.name, used, limit, "QuestDB used more memory than its limit: OOM-killed");
                        process::signal(pid, libc::SIGKILL);
                        return (wait(child).await, End::OomKilled);
                    }
                }
                status = child.wait() => {
                    let status = status.unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(255 << 8));
                    let end = if self.node_stopped.is_cancelled() {
                        End::NodeGone
                    } else if *self.faults.borrow() == Fault::PowerOff {
                        End::PowerLost
                    } else {
                        End::Exited
                    };
                    return (status, end);
                }
                grace = async { stop.wait_for(|g| g.is_some()).await.ok().and_then(|g| *g).unwrap_or_default() } => {
                    pause_for(Fault::None, &mut paused);
                    return (terminate(child, pid, grace).await, End::Stopped);
                }
                _ = self.faults.changed() => {
                    let fault = *self.faults.borrow();
                    pause_for(fault, &mut paused);
                    if fault == Fault::PowerOff {
                        // The node has cut its volume layers already (`Runtime::kill_node`).
                        process::signal(pid, libc::SIGKILL);
                        return (wait(child).await, End::PowerLost);
                    }
                    if fault == Fault::ShuttingDown {
                        return (terminate(child, pid, self.grace).await, End::ShutDown);
                    }
                }
                _ = self.node_stopped.cancelled() => {
                    // The instance went without a normal shutdown: a power cut.
                    self.rt.cut_node(self.node.index());
                    process::signal(pid, libc::SIGKILL);
                    return (wait(child).await, End::NodeGone);
                }
                Some((kind, ok)) = results.recv() => {
                    if paused {
                        // A paused process answers no probe, but a partition cuts the node
                        // off from outside, not from itself: its kubelet's probes would pass.
                        continue;
                    }
                    let key = match kind { Kind::Startup => "startup", Kind::Readiness => "readiness", Kind::Liveness => "liveness" };
                    let c = counts.entry(key).or_default();
                    *c = if ok { (c.0 + 1, 0) } else { (0, c.1 + 1) };
                    let (successes, failures) = *c;
                    let failed_probe = match (kind, startup, readiness, liveness) {
                        (Kind::Startup, Some((_, fail)), _, _) if !started => {
                            if ok {
                                started = true;
                                let db = self.model.db();
                                db.started = true;
                                db.ready = readiness.is_none();
                            }
                            (failures >= fail).then_some("startup")
                        }
                        (Kind::Readiness, _, Some((succ, fail)), _) if started => {
                            if successes >= succ {
                                self.model.db().ready = true;
                            } else if failures >= fail {
                                self.model.db().ready = false;
                            }
                            None
                        }
                        (Kind::Liveness, _, _, Some((_, fail))) if started => (failures >= fail).then_some("liveness"),
                        _ => None,
                    };
                    if let Some(which) = failed_probe {
                        info!(pod = %self.name, "Container {} failed {which} probe, will be restarted", self.container.name);
                        return (terminate(child, pid, self.grace).await, End::Exited);
                    }
                    self.post().await;
                }
                _ = tick.tick() => self.post().await,
                _ = volume_tick.tick() => {
                    let client = self.rt.client.clone();
                    let mut sources = Sources::new(&client, &self.ns);
                    mounts::refresh_files(&mut sources, &self.pod, &self.container, &volume_table).await;
                }
            }
        }
    }

    /// Waits while the node is powered off; false when the pod is to stop.
    async fn wait_powered(&mut self) -> bool {
        loop {
            if self.stopping() {
                return false;
            }
            if !matches!(*self.faults.borrow(), Fault::PowerOff | Fault::ShuttingDown) {
                return true;
            }
            tokio::select! {
                _ = self.faults.changed() => {}
                _ = until_stopped(self.stop_rx.clone(), self.node_stopped.clone()) => return false,
            }
        }
    }

    /// Waits `d`, reporting status meanwhile; false when the pod is to stop.
    async fn pause(&mut self, d: Duration) -> bool {
        let until = tokio::time::Instant::now() + d;
        loop {
            if self.stopping() {
                return false;
            }
            let next = until.min(tokio::time::Instant::now() + timings::PROBE_PERIOD_MAX);
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = until_stopped(self.stop_rx.clone(), self.node_stopped.clone()) => return false,
            }
            self.post().await;
            if tokio::time::Instant::now() >= until {
                return !self.stopping();
            }
        }
    }

    /// Posts the status when it changed and the kubelet can reach the apiserver. After a fault
    /// the next report is posted whatever it holds: the node-lifecycle controller marks pods of
    /// a silent node not ready, and a kubelet that is back reconciles what the API shows
    /// (status_manager.go `needsReconcile`).
    async fn post(&mut self) {
        if !self.node.healthy() {
            self.unposted_since_fault = true;
            return;
        }
        if std::mem::take(&mut self.unposted_since_fault) {
            self.posted = None;
        }
        let status = self.model.status();
        if self.posted.as_ref() == Some(&status) {
            return;
        }
        let patch = json!({"metadata": {"uid": self.uid}, "status": status});
        match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => self.posted = Some(status),
            Err(e) => debug!(pod = %self.name, error = %e, "database pod status update failed"),
        }
    }

    /// Host ports of every container, when the node's address is a loopback one.
    fn forward_host_ports(&self) {
        let Ok(node_ip) = self.host_ip.parse::<Ipv4Addr>() else {
            return;
        };
        if !node_ip.is_loopback() {
            return;
        }
        let Ok(pod_ip) = self.pod_ip.parse::<Ipv4Addr>() else {
            return;
        };
        let spec = self.pod.spec.clone().unwrap_or_default();
        for port in spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
        {
            let Some(host_port) = port.host_port.filter(|p| *p > 0) else {
                continue;
            };
            if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let listen_ip = port
                .host_ip
                .as_deref()
                .and_then(|h| h.parse::<Ipv4Addr>().ok())
                .filter(|ip| !ip.is_unspecified())
                .unwrap_or(node_ip);
            let listen = SocketAddr::from((listen_ip, host_port as u16));
            let target = SocketAddr::from((pod_ip, port.container_port as u16));
            if let Err(e) = super::forward::spawn(listen, target, self.pod_stop.clone()) {
                warn!(pod = %self.name, %listen, error = %e, "host port not forwarded");
            }
        }
    }
}

/// SIGTERM, then SIGKILL once `grace` (capped) has passed.
async fn terminate(child: &mut tokio::process::Child, pid: u32, grace: Duration) -> ExitStatus {
    process::signal(pid, libc::SIGTERM);
    match tokio::time::timeout(grace.min(timings::DATABASE_STOP_MAX), child.wait()).await {
        Ok(Ok(status)) => status,
        _ => {
            process::signal(pid, libc::SIGKILL);
            wait(child).await
        }
    }
}

async fn wait(child: &mut tokio::process::Child) -> ExitStatus {
    child
        .wait()
        .await
        .unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL))
}

/// The end of a failed container's log, as `FallbackToLogsOnError` reports it.
fn termination_log(log: &Path) -> String {
    let text = String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(TERMINATION_LOG_LINES)..].join("\n");
    let mut start = tail.len().saturating_sub(TERMINATION_LOG_BYTES);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

/// Go's `time.Duration` text for whole seconds, as the kubelet's messages print it.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Adds `QDB_<KEY>=<pod ip>:<port>` for each listener bound to `0.0.0.0` (by the pod's own
/// environment, `server.conf` (`conf`, its [`properties`]), or QuestDB's default).
fn bind_to_pod_ip(env: &mut Vec<(String, String)>, conf: &BTreeMap<String, String>, pod_ip: &str) {
    for (key, alias, port) in BINDS {
        let name = env_name(key);
        let current = env
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
            .or_else(|| conf.get(*key).cloned())
            .or_else(|| conf.get(*alias).cloned())
            .unwrap_or_else(|| format!("0.0.0.0:{port}"));
        let Some((host, port)) = current.rsplit_once(':') else {
            continue;
        };
        if host.is_empty() || host == "0.0.0.0" {
            env.retain(|(n, _)| *n != name);
            env.push((name, format!("{pod_ip}:{port}")));
        }
    }
}

/// `QDB_` + the key upper-cased, dots to underscores (QuestDB's environment overrides).
fn env_name(key: &str) -> String {
    format!("QDB_{}", key.to_uppercase().replace('.', "_"))
}

/// `key=value` lines of a Java properties file (comments and blank lines skipped).
fn properties(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .filter_map(|l| l.split_once(['=', ':']))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The container's memory limit in bytes, when it has one the stand-in can read.
fn memory_limit(container: &k8s_openapi::api::core::v1::Container) -> Option<u64> {
    let q = container
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("memory")?;
    u64::try_from(crate::csi::bytes(&q.0))
        .ok()
        .filter(|b| *b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_to_all_addresses_are_narrowed_to_the_pod_address() {
        let conf = properties(
            "http.net.bind.to=0.0.0.0:9000\npg.net.bind.to=127.0.0.1:8812\n# line.tcp.net.bind.to=x\n",
        );
        let mut env = vec![(
            "QDB_HTTP_MIN_NET_BIND_TO".to_string(),
            "0.0.0.0:9103".to_string(),
        )];
        bind_to_pod_ip(&mut env, &conf, "127.10.0.1");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("QDB_HTTP_NET_BIND_TO"), Some("127.10.0.1:9000"));
        assert_eq!(get("QDB_HTTP_MIN_NET_BIND_TO"), Some("127.10.0.1:9103"));
        assert_eq!(
            get("QDB_PG_NET_BIND_TO"),
            None,
            "an explicit address is kept"
        );
        assert_eq!(
            get("QDB_LINE_TCP_NET_BIND_TO"),
            Some("127.10.0.1:9009"),
            "the default binds all"
        );
    }

    #[test]
    fn a_failed_containers_message_is_its_last_log_lines_within_2048_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let text: String = (0..200)
            .map(|i| format!("line {i:03} {}\n", "x".repeat(20)))
            .collect();
        std::fs::write(&log, text).unwrap();
        let m = termination_log(&log);
        assert!(m.len() <= 2048);
        assert!(m.ends_with(&format!("line 199 {}", "x".repeat(20))));
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    }
}
