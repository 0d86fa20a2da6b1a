//! Why the database container is not running, as the kubelet reports it: a QuestDB that exits
//! at start (a value it cannot parse, a malformed auth line: exit code 55), an image that
//! cannot be pulled (a version that does not exist), or env the kubelet cannot build (a
//! missing credentials Secret or key). The on-call engineer reads the cause in `Ready`'s
//! message instead of the pod's events.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;

use crate::controllers::cached_pod::CachedPod;

use crate::api::{EventReason, ReadyReason};
use crate::desired::CONTAINER_NAME;

/// Most of a log tail kept in a condition message (the kubelet's own termination message is
/// at most 4 KiB; status is read on a terminal).
const LOG_TAIL_MAX: usize = 1500;

/// How long the scheduler's refusal must last before it is the database's trouble: its
/// retries of a pod that failed for an unbound claim come within a second or two.
pub(crate) const SCHEDULER_RETRY_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Why the database container cannot run: the reason and a message whose first line is the
/// cause (what one Warning event is sent for) and whose rest is the last log lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Trouble {
    pub reason: ReadyReason,
    pub message: String,
}

impl Trouble {
    /// The first line: the same cause gives the same line, however often it repeats.
    pub(crate) fn cause(message: &str) -> &str {
        message.lines().next().unwrap_or_default()
    }
}

/// The event said once per cause while `Ready` carries `reason`: only the reasons that say the
/// database cannot run have one.
pub(crate) fn event_reason(reason: ReadyReason) -> Option<EventReason> {
    Some(match reason {
        ReadyReason::CrashLoop => EventReason::CrashLoop,
        ReadyReason::OutOfMemory => EventReason::OutOfMemory,
        ReadyReason::ImagePullFailed => EventReason::ImagePullFailed,
        ReadyReason::ContainerConfigError => EventReason::ContainerConfigError,
        ReadyReason::Unschedulable => EventReason::Unschedulable,
        ReadyReason::PodRefused => EventReason::PodRefused,
        ReadyReason::VolumePending => EventReason::VolumePending,
        ReadyReason::Creating
        | ReadyReason::RollingOut
        | ReadyReason::PodNotReady
        | ReadyReason::Running
        | ReadyReason::Paused
        | ReadyReason::InvalidSpec
        | ReadyReason::ChildConflict
        | ReadyReason::NodeNotReady
        | ReadyReason::RestoreSourceNotFound
        | ReadyReason::RestoreSourceNotReady
        | ReadyReason::RestoreRefused => return None,
    })
}

/// The scheduler's word on a pod it cannot place (`PodScheduled=False`, `Unschedulable`):
/// "0/3 nodes are available: ...".
/// Not before the refusal has lasted [`SCHEDULER_RETRY_GRACE`]: a new database's first
/// attempt routinely fails for a claim not bound yet ("pod has unbound immediate
/// PersistentVolumeClaims") and succeeds a moment later, and reporting that costs a status
/// write and says nothing a user should act on.
pub(crate) fn unschedulable(pod: &CachedPod, now: Timestamp) -> Option<Trouble> {
    let condition = not_scheduled(pod)?;
    let fresh = condition.last_transition_time.as_ref().is_some_and(|t| {
        now.duration_since(t.0).as_secs() < SCHEDULER_RETRY_GRACE.as_secs() as i64
    });
    (condition.reason.as_deref() == Some("Unschedulable") && !fresh).then(|| Trouble {
        reason: ReadyReason::Unschedulable,
        message: format!(
            "the database pod cannot be scheduled: {}",
            condition.message.as_deref().unwrap_or("no reason given")
        ),
    })
}

/// The pod's `PodScheduled=False` condition, while the scheduler has not placed it.
pub(crate) fn not_scheduled(pod: &CachedPod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
}

/// The StatefulSet controller's last refusal to create the pod (its `FailedCreate` event),
/// while there is no pod: "pods "db1-0" is forbidden: violates PodSecurity ...".
pub(crate) fn refused(message: &str) -> Trouble {
    Trouble {
        reason: ReadyReason::PodRefused,
        message: format!("the database pod cannot be created: {message}"),
    }
}

/// The persistent volume controller's (or provisioner's) last word on the database's claim,
/// while it is unbound and the pod waits for it: "no persistent volumes available for this
/// claim and no storage class is set", or `storageclass.storage.k8s.io "gp3" not found`.
pub(crate) fn volume_pending(message: &str) -> Trouble {
    Trouble {
        reason: ReadyReason::VolumePending,
        message: format!("the database volume cannot be bound: {message}"),
    }
}

/// The trouble of the database container (or of the init container before it), if any.
pub(crate) fn trouble(pod: &CachedPod) -> Option<Trouble> {
    let status = pod.status.as_ref()?;
    let init = status.init_container_statuses.iter().flatten();
    let main = status
        .container_statuses
        .iter()
        .flatten()
        .filter(|c| c.name == CONTAINER_NAME);
    init.chain(main).find_map(of_container)
}

/// The pod as the cache holds it; here because which container statuses it keeps is what
/// [`trouble`] reads.
impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        let mut metadata = pod.metadata;
        metadata.managed_fields = None;
        // Only the marks that say which config the pod was made for (the reload step compares
        // them with the template's).
        metadata.annotations = metadata
            .annotations
            .map(|a| {
                a.into_iter()
                    .filter(|(k, _)| {
                        k == crate::desired::CONFIG_HASH_ANNOTATION
                            || k == crate::desired::CONFIG_RESTART_ANNOTATION
                    })
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
            .filter(|a| !a.is_empty());
        Self {
            metadata,
            node_name: pod.spec.and_then(|s| s.node_name),
            status: pod.status.map(|status| PodStatus {
                phase: status.phase,
                conditions: status.conditions,
                host_ip: status.host_ip,
                // Where the write-health poll reaches the database's HTTP port.
                pod_ip: status.pod_ip,
                container_statuses: for_cache(status.container_statuses),
                init_container_statuses: for_cache(status.init_container_statuses),
                ..Default::default()
            }),
        }
    }
}

/// What the pod cache keeps of container statuses: only those [`trouble`] may read (a
/// container waiting or ended with an error), each without what it never reads. A healthy pod
/// keeps none, so the cache stays as small as before.
pub(crate) fn for_cache(statuses: Option<Vec<ContainerStatus>>) -> Option<Vec<ContainerStatus>> {
    let kept: Vec<ContainerStatus> = statuses
        .into_iter()
        .flatten()
        .filter(|c| {
            c.state.as_ref().is_some_and(|s| s.waiting.is_some()) || of_container(c).is_some()
        })
        .map(|c| ContainerStatus {
            name: c.name,
            image: c.image,
            state: c.state,
            last_state: c.last_state,
            restart_count: c.restart_count,
            ready: c.ready,
            ..ContainerStatus::default()
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

fn of_container(c: &ContainerStatus) -> Option<Trouble> {
    let state = c.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        let detail = w.message.clone().unwrap_or_default();
        return match reason {
            "CrashLoopBackOff" => Some(exited(c)),
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
                Some(Trouble {
                    reason: ReadyReason::ImagePullFailed,
                    // The kubelet alternates ErrImagePull and ImagePullBackOff: the cause
                    // line leaves both out, so it is one cause.
                    message: format!(
                        "image {} of container {} cannot be pulled\n{reason}: {detail}",
                        c.image, c.name
                    ),
                })
            }
            "CreateContainerConfigError" | "CreateContainerError" => Some(Trouble {
                reason: ReadyReason::ContainerConfigError,
                message: format!("container {} cannot be created: {detail}", c.name),
            }),
            _ => None,
        };
    }
    // Between an exit and the next back-off the container is terminated, not yet waiting.
    if state.terminated.as_ref().is_some_and(|t| t.exit_code != 0) {
        return Some(exited(c));
    }
    // Restarted after a crash and not ready yet: still the same crash loop (otherwise Ready
    // would flip to "not ready" and back at every restart, each flip a new event). A node that
    // rebooted reports its last exit as `Unknown`: that is no crash of the database.
    let crashed = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code != 0 && t.reason.as_deref() != Some("Unknown"));
    (state.running.is_some() && !c.ready && crashed).then(|| exited_before(c))
}

/// [`exited`] for a container running again after the exit `lastState` records.
fn exited_before(c: &ContainerStatus) -> Trouble {
    exited(&ContainerStatus {
        state: None,
        ..c.clone()
    })
}

/// The kubelet's reason for a container the kernel's OOM killer ended.
const OOM_KILLED: &str = "OOMKilled";

fn exited(c: &ContainerStatus) -> Trouble {
    let last = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()));
    if last.is_some_and(|t| t.reason.as_deref() == Some(OOM_KILLED)) {
        // No log tail: the process was killed mid-stride and its last lines say nothing of
        // why; the limit and how it is shared out do ([`with_memory_split`]).
        return Trouble {
            reason: ReadyReason::OutOfMemory,
            message: format!(
                "container {} used more memory than its limit and was killed (OOMKilled); it is \
                 restarted",
                c.name
            ),
        };
    }
    let (code, log) = match last {
        Some(t) => (
            t.exit_code.to_string(),
            t.message.clone().unwrap_or_default(),
        ),
        None => ("unknown".to_string(), String::new()),
    };
    let mut message = format!(
        "container {} exits at start with code {code} and is restarted with back-off",
        c.name
    );
    let tail = log_tail(&log);
    if !tail.is_empty() {
        message.push_str("; last log lines:\n");
        // The error that stopped it, when its stack trace and the shutdown lines after it
        // pushed it out of the tail (seen: "SymbolMap is too short: .../quotes~9/src.o" lost
        // behind the trace, the table it names with it).
        if let Some(error) = last_error(&log).filter(|e| !tail.contains(e.as_str())) {
            message.push_str(&error);
            message.push_str("\n...\n");
        }
        message.push_str(&tail);
    }
    Trouble {
        reason: ReadyReason::CrashLoop,
        message,
    }
}

/// An out-of-memory trouble with the limit it crossed and how the operator shares it out, so
/// the engineer reading `Ready` knows what to raise; any other trouble as it is.
pub(crate) fn with_memory_split(trouble: Trouble, spec: &crate::api::QuestDBSpec) -> Trouble {
    if trouble.reason != ReadyReason::OutOfMemory {
        return trouble;
    }
    use crate::desired::memory;
    let detail = match memory::split(spec) {
        Some(split) => {
            let heap = if memory::heap_from_user(spec) {
                "the JVM heap spec.env JVM_PREPEND sets".to_string()
            } else {
                format!("a JVM heap of {} MiB", split.heap >> 20)
            };
            let native = if memory::native_from_user(spec) {
                "the native memory spec.config.server ram.usage.limit.* allows".to_string()
            } else {
                format!("{} MiB of native memory for QuestDB", split.native >> 20)
            };
            format!(
                "\nits limit is {} MiB, with {heap} and {native}: raise \
                 resources.limits.memory",
                split.limit >> 20
            )
        }
        None => "\nthe container has no memory size the operator could fit QuestDB to: set \
                 resources.limits.memory"
            .to_string(),
    };
    Trouble {
        message: trouble.message + &detail,
        ..trouble
    }
}

/// The most an error line brought back before the tail keeps.
const ERROR_LINE_MAX: usize = 400;

/// The log's last error: an exception's message (`io.questdb.cairo.CairoException: ...`) or a
/// QuestDB log line at level `E` or `C` (`2026-11-29T12:21:22.385346Z E i.q.c...`), cut to
/// [`ERROR_LINE_MAX`] bytes and withheld like any line that may carry a credential.
fn last_error(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| {
        let level = l.split_whitespace().nth(1);
        l.contains("Exception: ") || matches!(level, Some("E" | "C"))
    })?;
    let lower = line.to_ascii_lowercase();
    if SENSITIVE.iter().any(|word| lower.contains(word)) {
        return Some("[a line that may hold a credential, withheld]".to_string());
    }
    let mut end = line.len().min(ERROR_LINE_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_string())
}

/// Words of a log line that may carry a credential: QuestDB's `*.password` settings, a
/// user's env or sidecar secrets and tokens, an HTTP Authorization header, a PEM block and a
/// JWK's private part (`"d":`, the ILP auth key a user may paste into the wrong place).
const SENSITIVE: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "credential",
    "private",
    "authorization",
    "bearer",
    "-----begin",
    "\"d\":",
    "\"d\" :",
];

/// The end of the log, at most [`LOG_TAIL_MAX`] bytes on line boundaries. A line that may
/// carry a credential ([`SENSITIVE`]) is withheld: status is readable by everyone who may read
/// the QuestDB.
fn log_tail(log: &str) -> String {
    let mut kept: Vec<&str> = vec![];
    let mut size = 0;
    for line in log.trim_end().lines().rev() {
        let lower = line.to_ascii_lowercase();
        let line = if SENSITIVE.iter().any(|word| lower.contains(word)) {
            "[a line that may hold a credential, withheld]"
        } else {
            line
        };
        if size + line.len() + 1 > LOG_TAIL_MAX {
            break;
        }
        size += line.len() + 1;
        kept.push(line);
    }
    kept.reverse();
    kept.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(statuses: serde_json::Value) -> CachedPod {
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(json!({"metadata": {"name": "db-0"}, "status": statuses}))
                .unwrap();
        pod.into()
    }

    fn questdb(state: serde_json::Value, last: serde_json::Value) -> serde_json::Value {
        json!({"containerStatuses": [{"name": "questdb", "image": "questdb/questdb:9.2.0",
            "imageID": "", "ready": false, "restartCount": 3, "state": state, "lastState": last}]})
    }

    #[test]
    fn a_pod_the_scheduler_cannot_place_gives_its_words_and_a_scheduled_one_nothing() {
        let waiting = pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        }]}));
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let t = unschedulable(&waiting, now).expect("unschedulable");
        assert_eq!(t.reason, ReadyReason::Unschedulable);
        assert_eq!(
            t.message,
            "the database pod cannot be scheduled: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        );
        // Gated by a scheduling gate, or placed: not the scheduler's refusal.
        let gated = pod(json!({"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated"
        }]}));
        assert_eq!(unschedulable(&gated, now), None);
        let placed = pod(json!({"conditions": [{"type": "PodScheduled", "status": "True"}]}));
        assert_eq!(unschedulable(&placed, now), None);
        // A refusal the scheduler made a moment ago is its retry's business, not yet ours.
        let just_now = pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": "2023-11-14T22:13:19Z",
            "message": "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        }]}));
        assert_eq!(unschedulable(&just_now, now), None);
        let a_while_ago = pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": "2023-11-14T22:13:17Z",
            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        }]}));
        assert!(unschedulable(&a_while_ago, now).is_some());
    }

    #[test]
    fn a_database_that_exits_at_start_says_its_exit_code_and_last_log_lines() {
        let p = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}),
            json!({"terminated": {"exitCode": 55, "reason": "Error",
                "message": "2026-11-23T01:00:00Z E server-main invalid configuration value [key=cairo.commit.lag, value=abc]\n"}}),
        ));
        let t = trouble(&p).expect("a crash loop is trouble");
        assert_eq!(t.reason, ReadyReason::CrashLoop);
        assert!(t.message.contains("code 55"), "{}", t.message);
        assert!(t.message.contains("key=cairo.commit.lag"), "{}", t.message);
        assert_eq!(
            Trouble::cause(&t.message),
            "container questdb exits at start with code 55 and is restarted with back-off; last log lines:"
        );
    }

    #[test]
    fn the_error_that_stopped_the_database_is_kept_when_its_stack_trace_fills_the_tail() {
        let mut log = String::from(
            "2026-11-29T12:21:22.3Z I i.q.c.p.ReaderPool closed\n\
             io.questdb.cairo.CairoException: [0] SymbolMap is too short: /var/lib/questdb/db/quotes~9/src.o\n",
        );
        for i in 0..60 {
            log.push_str(&format!(
                "\tat io.questdb@9.2.0/io.questdb.cairo.Frame{i}.call(Frame{i}.java:{i})\n"
            ));
        }
        let p = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}),
            json!({"terminated": {"exitCode": 55, "reason": "Error", "message": log}}),
        ));
        let t = trouble(&p).unwrap();
        assert!(
            t.message
                .contains("SymbolMap is too short: /var/lib/questdb/db/quotes~9/src.o"),
            "{}",
            t.message
        );
        assert_eq!(
            Trouble::cause(&t.message),
            "container questdb exits at start with code 55 and is restarted with back-off; last log lines:"
        );
        // Within the tail already: not said twice.
        let short = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}),
            json!({"terminated": {"exitCode": 55, "reason": "Error",
                "message": "2026-11-29T12:00:00Z E server-main invalid configuration value\n"}}),
        ));
        let t = trouble(&short).unwrap();
        assert_eq!(t.message.matches("invalid configuration value").count(), 1);
        // An error line with a credential is withheld like any other.
        assert_eq!(
            last_error("x\n2026-11-29T12:00:00Z E pg.password=hunter2 refused\nok\n").as_deref(),
            Some("[a line that may hold a credential, withheld]")
        );
    }

    #[test]
    fn a_database_the_kernel_killed_for_memory_names_its_limit_and_how_it_is_shared() {
        let oom = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled",
            "message": "2026-11-29T10:00:00Z I i.q.c.TableWriter committing\n"}});
        // Waiting out its back-off, and running again but not ready yet: the same cause.
        let waiting = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}),
            oom.clone(),
        ));
        let restarted = pod(questdb(
            json!({"running": {"startedAt": "2026-11-29T10:00:12Z"}}),
            oom.clone(),
        ));
        let mut spec = crate::desired::testing::questdb("db1", "tenant-a").spec;
        spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(std::collections::BTreeMap::from([(
                "memory".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("4Gi".into()),
            )])),
            ..Default::default()
        });
        for p in [&waiting, &restarted] {
            let t = with_memory_split(trouble(p).expect("an OOM kill is trouble"), &spec);
            assert_eq!(t.reason, ReadyReason::OutOfMemory);
            assert_eq!(
                Trouble::cause(&t.message),
                "container questdb used more memory than its limit and was killed (OOMKilled); it is restarted"
            );
            assert!(
                t.message.contains("its limit is 4096 MiB, with a JVM heap of 1024 MiB and 2406 MiB of native memory"),
                "{}",
                t.message
            );
            assert_eq!(event_reason(t.reason), Some(EventReason::OutOfMemory));
        }
        // The user's own heap is named as theirs.
        spec.env.push(k8s_openapi::api::core::v1::EnvVar {
            name: "JVM_PREPEND".into(),
            value: Some("-Xmx3g".into()),
            ..Default::default()
        });
        let t = with_memory_split(trouble(&waiting).unwrap(), &spec);
        assert!(
            t.message.contains("the JVM heap spec.env JVM_PREPEND sets"),
            "{}",
            t.message
        );
        // Without a size: what to set.
        spec.resources = None;
        let t = with_memory_split(trouble(&waiting).unwrap(), &spec);
        assert!(
            t.message.contains("set resources.limits.memory"),
            "{}",
            t.message
        );
        // Any other exit is still a crash loop, untouched.
        let crash = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}),
            json!({"terminated": {"exitCode": 55, "reason": "Error"}}),
        ));
        let t = trouble(&crash).unwrap();
        assert_eq!(with_memory_split(t.clone(), &spec), t);
    }

    #[test]
    fn a_version_that_does_not_exist_is_an_image_pull_failure() {
        let p = pod(questdb(
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"questdb/questdb:9.9.9\""}}),
            json!({}),
        ));
        let t = trouble(&p).unwrap();
        assert_eq!(t.reason, ReadyReason::ImagePullFailed);
        assert!(t.message.contains("questdb/questdb:9.2.0"));
        let p2 = pod(questdb(
            json!({"waiting": {"reason": "ErrImagePull", "message": "not found"}}),
            json!({}),
        ));
        let t2 = trouble(&p2).unwrap();
        assert_eq!(Trouble::cause(&t.message), Trouble::cause(&t2.message));
    }

    #[test]
    fn a_missing_credentials_key_is_a_container_config_error() {
        let p = pod(questdb(
            json!({"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"db-credentials\" not found"}}),
            json!({}),
        ));
        let t = trouble(&p).unwrap();
        assert_eq!(t.reason, ReadyReason::ContainerConfigError);
        assert!(t.message.contains("db-credentials"));
    }

    #[test]
    fn a_starting_or_running_database_is_no_trouble() {
        for state in [
            json!({"waiting": {"reason": "ContainerCreating"}}),
            json!({"running": {"startedAt": "2026-11-23T01:00:00Z"}}),
            json!({"terminated": {"exitCode": 0}}),
        ] {
            assert_eq!(trouble(&pod(questdb(state, json!({})))), None);
        }
        assert_eq!(trouble(&pod(json!({}))), None);
    }

    /// Between two crashes the container runs for a moment: still the same crash loop, so
    /// status does not flip and no second event goes out for the same cause.
    #[test]
    fn a_database_restarted_after_a_crash_is_still_crash_looping_until_ready() {
        let crashed =
            json!({"terminated": {"exitCode": 55, "reason": "Error", "message": "bad value"}});
        let between = pod(questdb(json!({"running": {}}), crashed.clone()));
        let looping = pod(questdb(
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            crashed,
        ));
        let (a, b) = (trouble(&between).unwrap(), trouble(&looping).unwrap());
        assert_eq!(a.reason, ReadyReason::CrashLoop);
        assert_eq!(Trouble::cause(&a.message), Trouble::cause(&b.message));
        let mut cached = between.clone();
        let st = cached.status.as_mut().unwrap();
        st.container_statuses = for_cache(st.container_statuses.take());
        assert_eq!(trouble(&cached), Some(a));
        // A node that rebooted: the last exit is Unknown, and that is no crash loop.
        let rebooted = pod(questdb(
            json!({"running": {}}),
            json!({"terminated": {"exitCode": 255, "reason": "Unknown"}}),
        ));
        assert_eq!(trouble(&rebooted), None);
    }

    #[test]
    fn a_failing_init_container_is_reported_too() {
        let p = pod(
            json!({"initContainerStatuses": [{"name": "init-conf", "image": "questdb/questdb:9.2.0",
            "imageID": "", "ready": false, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "message": "mkdir: permission denied"}}}]}),
        );
        let t = trouble(&p).unwrap();
        assert!(t.message.contains("init-conf") && t.message.contains("permission denied"));
    }

    /// The controller reads pods from a trimmed cache: what it decides there must be what it
    /// would decide on the whole pod.
    #[test]
    fn the_cached_pod_says_the_same_trouble_and_a_healthy_one_keeps_no_status() {
        let pods = [
            pod(questdb(
                json!({"waiting": {"reason": "CrashLoopBackOff"}}),
                json!({"terminated": {"exitCode": 55, "message": "bad value"}}),
            )),
            pod(questdb(
                json!({"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}),
                json!({}),
            )),
            pod(questdb(json!({"terminated": {"exitCode": 1}}), json!({}))),
            pod(questdb(json!({"running": {}}), json!({}))),
        ];
        for p in pods {
            let mut cached = p.clone();
            let status = cached.status.as_mut().unwrap();
            status.container_statuses = for_cache(status.container_statuses.take());
            status.init_container_statuses = for_cache(status.init_container_statuses.take());
            assert_eq!(trouble(&cached), trouble(&p));
        }
        let healthy = pod(questdb(json!({"running": {}}), json!({})));
        assert_eq!(for_cache(healthy.status.unwrap().container_statuses), None);
    }

    #[test]
    fn log_lines_that_may_hold_a_credential_never_reach_status() {
        for leak in [
            "using pg.password=hunter2",
            "QDB_PG_PASSWD=hunter2",
            "export AWS_SECRET_ACCESS_KEY=hunter2",
            "github_token: hunter2",
            "Authorization: Basic aHVudGVyMg== hunter2",
            "curl -H 'bearer hunter2'",
            "-----BEGIN PRIVATE KEY----- hunter2",
            r#"{"kty":"EC","d":"hunter2","x":"..."}"#,
            "db credentials: admin/hunter2",
        ] {
            let log = format!("a\n{leak}\nb\n");
            let tail = log_tail(&log);
            assert!(!tail.contains("hunter2"), "{leak}: {tail}");
            assert!(tail.starts_with("a\n") && tail.ends_with("\nb"), "{tail}");
        }
        // An ordinary error line stays.
        let log = "java.lang.OutOfMemoryError: Java heap space\n";
        assert_eq!(log_tail(log), "java.lang.OutOfMemoryError: Java heap space");
    }

    #[test]
    fn the_log_tail_keeps_the_last_lines_within_its_bound() {
        let log: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let tail = log_tail(&log);
        assert!(tail.len() <= LOG_TAIL_MAX);
        assert!(tail.ends_with("line 999"));
        assert!(tail.lines().all(|l| l.starts_with("line ")));
    }
}
