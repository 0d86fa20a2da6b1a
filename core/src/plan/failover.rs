//! Failover of a dedicated node that stopped responding: when to start, and the one next step.
//! Pure, so every state is a unit test; `questdb::failover` performs the steps.
//!
//! The order is what keeps the volume safe: the old instance is **fenced** (stopped or
//! terminated, as EC2 reports it) before anything lets the volume go. Only then is the old Node
//! tainted `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, which lets the
//! pod-garbage-collector remove the pod stuck on it and the attach-detach controller detach at
//! once (Kubernetes "non-graceful node shutdown", GA 1.28; the docs require the node to be
//! shut down first). A partitioned instance that still runs therefore never shares its volume
//! with the replacement. Each step is recorded in `status.failover` before its side effect, and
//! each side effect is idempotent (stop a stopped instance, taint a tainted node), so a crash at
//! any line resumes where it was.
//!
//! The instance is stopped, not terminated, to fence it: on EKS the cloud controller deletes the
//! Node of a terminated instance within seconds, and a deleted Node's volumes wait for the
//! attach-detach controller's 6-minute force detach; a stopped instance keeps its Node, which
//! takes the out-of-service taint. The stopped instance is terminated once the database is back.

use std::time::Duration;

use crate::api::{EventReason, FailoverReason, SuppressionReason};
use crate::api::{FailoverCause, FailoverPhase, FailoverSpec, FailoverStatus, QuestDBStatus};
use crate::cloud::{InstanceState, StopMode};
use crate::plan::conditions::Verdict;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
/// `spec.failover.unhealthyAfterSeconds`, but never under the kubelets' Lease duration.
pub fn effective_threshold(unhealthy_after_seconds: i64, lease_duration: Duration) -> Duration {
    Duration::from_secs(unhealthy_after_seconds.max(0) as u64).max(lease_duration)
}

/// The event reason of entering `phase`.
pub fn step_reason(phase: FailoverPhase) -> EventReason {
    match phase {
        FailoverPhase::Fencing => EventReason::FailoverFencing,
        FailoverPhase::Releasing => EventReason::FailoverReleasing,
        FailoverPhase::Reattaching => EventReason::FailoverReattaching,
        FailoverPhase::Recovering => EventReason::FailoverRecovering,
        FailoverPhase::Draining => EventReason::FailoverDraining,
        FailoverPhase::Healthy => EventReason::FailoverHealthy,
    }
}

/// The steps whose durations `questdb_operator_failover_step_duration_seconds` records.
pub const STEPS: [FailoverPhase; 5] = [
    FailoverPhase::Fencing,
    FailoverPhase::Releasing,
    FailoverPhase::Reattaching,
    FailoverPhase::Recovering,
    FailoverPhase::Draining,
];

/// `metadata.annotations` key that turns failover off for one QuestDB (maintenance).
pub const SKIP_ANNOTATION: &str = "crd.questdb.io/skip-failover";

/// The taint that lets a fenced node's pods and volumes go (`v1.TaintNodeOutOfService`).
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";

/// A failover does not start again within this long of the last one's start: a replacement
/// that dies at once is a pattern for a person, not a loop.
pub const MIN_INTERVAL: Duration = Duration::from_secs(600);

/// How long `Recovering` waits for the DNS record to follow a database that answers again:
/// Route53 applies a change within about a minute; past this the failover goes on and
/// `DnsReady` keeps reporting and retrying the record.
pub const DNS_FOLLOW_WAIT: Duration = Duration::from_secs(180);

/// How long a fence's side effects may hang before the operator escalates them
/// (`--fence-stop-escalation`, `--fence-detach-escalation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Escalation {
    /// A normal stop (the OS shuts down and flushes) not ended after this long is forced.
    pub graceful_stop: Duration,
    /// A forced stop still under way after this long is forced again, once per period.
    pub stop: Duration,
    /// A volume still attached to the fenced node this long into Releasing, with its pod gone,
    /// is stuck detaching (EBS can leave a volume `detaching`): the fenced instance, already
    /// stopped, is terminated, and EC2 detaches a terminated instance's volumes.
    pub detach: Duration,
}

impl Escalation {
    /// Half a minute for a normal stop, a minute for a forced one, two for a detach: a healthy
    /// EC2 stop takes seconds to a minute, and a normal one waits for the OS to shut down.
    pub const DEFAULT: Escalation = Escalation {
        graceful_stop: Duration::from_secs(30),
        stop: Duration::from_secs(60),
        detach: Duration::from_secs(120),
    };
}

impl Default for Escalation {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Whether `elapsed` is at or past `period` and within the first 5 s of a period: an
/// escalation goes out once per period, not at every poll, and needs nothing recorded (a
/// restart changes nothing). Periods under 10 s are taken as 10 s.
fn escalation_due(elapsed: Duration, period: Duration) -> bool {
    let period = period.as_secs().max(10);
    elapsed.as_secs() >= period && elapsed.as_secs() % period < 5
}

/// How long each step may take before the QuestDB reports `FailoverStuck` (it keeps waiting;
/// every step's wait is a watch event or a slow requeue, never a busy loop).
pub fn step_timeout(phase: FailoverPhase) -> Duration {
    match phase {
        FailoverPhase::Fencing => Duration::from_secs(300),
        FailoverPhase::Releasing | FailoverPhase::Reattaching => Duration::from_secs(600),
        FailoverPhase::Recovering | FailoverPhase::Draining | FailoverPhase::Healthy => {
            Duration::from_secs(900)
        }
    }
}

/// Whether a failover is under way (not absent, not finished).
pub fn in_progress(status: &QuestDBStatus) -> bool {
    status
        .failover
        .as_ref()
        .is_some_and(|f| f.phase != FailoverPhase::Healthy)
}

/// A failover under way that has not brought the database back yet (not `Draining`): what
/// the phase column shows as `FailingOver`.
pub fn database_down(status: &QuestDBStatus) -> bool {
    in_progress(status)
        && status
            .failover
            .as_ref()
            .is_some_and(|f| f.phase != FailoverPhase::Draining)
}

/// What decides whether to start.
pub struct StartView<'a> {
    pub spec: &'a FailoverSpec,
    pub skip_annotation: bool,
    pub status: &'a QuestDBStatus,
    /// How long the node of `status.instanceId` has had a silent Lease (or has been missing
    /// while its instance runs), on the operator's own clock; `None` when it is healthy (or
    /// unknown to the tracker).
    pub unhealthy_for: Option<Duration>,
    /// The kubelets' Lease duration: no threshold is shorter (`--node-lease-duration`).
    pub lease_duration: Duration,
    /// Where too many nodes are unhealthy at once (a zone, or the cluster): a partition or an
    /// outage there, not a dead node. `None`: the breaker of the node's zone is closed.
    pub breaker: Option<String>,
    /// Seconds since the last failover started (from `status.failover.startedAt`).
    pub since_last_start: Option<Duration>,
}

/// The decision about starting a failover.
#[derive(Clone, Debug, PartialEq)]
pub enum Start {
    /// Nothing wrong (or not long enough).
    No,
    /// The node is unhealthy past the threshold, but a safety rule holds the failover back.
    Suppressed {
        reason: SuppressionReason,
        message: String,
    },
    /// Fence the instance in status and replace it.
    Go,
}

pub fn should_start(v: &StartView) -> Start {
    let Some(unhealthy) = v.unhealthy_for else {
        return Start::No;
    };
    let threshold = effective_threshold(v.spec.unhealthy_after_seconds, v.lease_duration);
    if unhealthy < threshold || v.status.instance_id.is_none() || in_progress(v.status) {
        return Start::No;
    }
    let node = v.status.node_name.as_deref().unwrap_or("its node");
    // The words stay the same while the silence lasts (the condition's lastTransitionTime says
    // since when): a message counting its seconds is news at every look, and each look would
    // write status, send an event and count one more suppression.
    let past = format!(
        "{node} has been unhealthy past its {}s threshold",
        threshold.as_secs()
    );
    if let Some(held) = held_back(v.spec, v.skip_annotation, v.breaker.as_deref(), &past) {
        return held;
    }
    if v.since_last_start.is_some_and(|d| d < MIN_INTERVAL) {
        return Start::Suppressed {
            reason: SuppressionReason::RecentFailover,
            message: format!(
                "{past}; the last failover started less than {} minutes ago",
                MIN_INTERVAL.as_secs() / 60
            ),
        };
    }
    Start::Go
}

/// The safety rules that hold back a due fence, whether it starts a failover or replaces a
/// failed replacement: the spec, the annotation, the breaker. `past` says what is due.
fn held_back(
    spec: &FailoverSpec,
    skip_annotation: bool,
    breaker: Option<&str>,
    past: &str,
) -> Option<Start> {
    let suppressed = |reason, message: String| Some(Start::Suppressed { reason, message });
    if !spec.enabled {
        return suppressed(
            SuppressionReason::Disabled,
            format!("{past}; spec.failover.enabled is false"),
        );
    }
    if skip_annotation {
        return suppressed(
            SuppressionReason::SkipAnnotation,
            format!("{past}; {SKIP_ANNOTATION} is set"),
        );
    }
    if let Some(place) = breaker {
        return suppressed(
            SuppressionReason::TooManyUnhealthyNodes,
            format!("{past}, but so are too many other nodes in {place}: that looks like a partition or an outage there, not a dead node"),
        );
    }
    None
}

/// How many replacements one failover launches. A replacement that dies, stops or never
/// joins before the failover ends is fenced and replaced in turn, up to this many in all: a
/// third death in a row is a pattern for a person (an image that never joins, a zone that
/// kills its nodes), not a loop.
pub const MAX_ATTEMPTS: u32 = 3;

/// Whether the replacement of a failover under way may be judged at all: only once the old
/// node has let the volume go (the replacement's death before that is seen when the failover
/// gets there, so two fences never overlap), and never when status still names the instance
/// fenced.
pub fn replacement_judged(status: &QuestDBStatus) -> Option<&str> {
    let f = status.failover.as_ref()?;
    if !matches!(
        f.phase,
        FailoverPhase::Reattaching | FailoverPhase::Recovering | FailoverPhase::Draining
    ) {
        return None;
    }
    let id = status.instance_id.as_deref()?;
    (!f.fenced().any(|fenced| fenced == id)).then_some(id)
}

/// A failover's replacement that failed the way a node fails (silent, missing, never joined,
/// stopped past the threshold) is fenced and replaced as the first node was, under the same
/// safety rules but not the interval between failovers (it is the same failover, so
/// `since_last_start` is not read); `unhealthy_for` is the replacement's, the instance in
/// `status.instanceId`. After [`MAX_ATTEMPTS`] replacements the failover stays where it is and
/// says what a person must do.
pub fn replace_again(v: &StartView) -> Start {
    let (Some(unhealthy), Some(id), Some(f)) = (
        v.unhealthy_for,
        replacement_judged(v.status),
        v.status.failover.as_ref(),
    ) else {
        return Start::No;
    };
    let threshold = effective_threshold(v.spec.unhealthy_after_seconds, v.lease_duration);
    if unhealthy < threshold {
        return Start::No;
    }
    let past = format!(
        "the replacement instance {id} has been unhealthy past its {}s threshold",
        threshold.as_secs()
    );
    if let Some(held) = held_back(v.spec, v.skip_annotation, v.breaker.as_deref(), &past) {
        return held;
    }
    if f.attempt() >= MAX_ATTEMPTS {
        return Start::Suppressed {
            reason: SuppressionReason::AttemptsExhausted,
            message: format!(
                "{past}; it is this failover's {}th replacement, the most one failover launches: check spec.node's image and instance type and the zone's health, then pause and unpause the database to start over",
                f.attempt()
            ),
        };
    }
    Start::Go
}

/// What the database said when the operator asked it, over its HTTP channel, right before a
/// fence.
#[derive(Clone, Debug, PartialEq)]
pub enum DatabaseWord {
    /// It answered a query behind its login (rows, or a refused query: a live database) at
    /// this address.
    Answered { at: String },
    /// No answer: no pod address on the silent node, a refused or timed-out connection, a
    /// refused login (not proof that it is this database), a broken answer.
    Silent,
}

/// The database's own word on a due fence (after [`should_start`] or [`replace_again`] said
/// `Go`; EC2's word that the instance is terminated leaves nothing to ask): a database that answers is not fenced, since fencing it
/// would stop a database its clients still reach, for a fault of the kubelet's link to the API
/// server (an access entry, a certificate, a security group, a saturated network). It is asked
/// again at every look, and fenced once it stops answering. `node` is the silent node.
pub fn heed_the_database(word: &DatabaseWord, node: &str) -> Start {
    match word {
        DatabaseWord::Silent => Start::Go,
        DatabaseWord::Answered { at } => Start::Suppressed {
            reason: SuppressionReason::DatabaseAnswers,
            message: format!(
                "{node} is silent past its threshold, but its database still answers at {at}: the kubelet has lost the API server, the database is not down; it is fenced once it stops answering (check the node's network path to the API server, its access entry and certificate)"
            ),
        },
    }
}

/// The record of the next attempt: the failed replacement `instance` (on `node`) is fenced as
/// the first node was, the instances fenced so far are kept to be terminated at the end, and
/// the downtime still counts from the first fence.
pub fn next_attempt(
    f: &FailoverStatus,
    cause: FailoverCause,
    instance: &str,
    node: &str,
    now: Time,
) -> FailoverStatus {
    let mut fenced = f.fenced_instance_ids.clone();
    fenced.extend(f.old_instance_id.clone());
    FailoverStatus {
        phase: FailoverPhase::Fencing,
        reason: Some(cause),
        started_at: f.started_at.clone(),
        phase_started_at: Some(now),
        old_node: Some(node.to_string()).filter(|n| !n.is_empty()),
        old_instance_id: Some(instance.to_string()),
        message: Some(format!(
            "fencing replacement instance {instance} (attempt {} of {MAX_ATTEMPTS})",
            f.attempt() + 1
        )),
        attempt: Some(i64::from(f.attempt()) + 1),
        fenced_instance_ids: fenced,
        ..Default::default()
    }
}

/// The Failover condition of a database with no failover under way and a healthy node:
/// `Armed` with what silence fails its node over, or, with `spec.failover.enabled: false`,
/// `False Disabled`: an on-call engineer reading `Armed` expects a dead node to be replaced.
pub fn idle_condition(
    spec: &FailoverSpec,
    lease_duration: Duration,
) -> (bool, FailoverReason, String) {
    if !spec.enabled {
        return (
            false,
            FailoverReason::Disabled,
            "spec.failover.enabled is false: a dedicated node that stops responding is not replaced automatically".into(),
        );
    }
    (
        true,
        FailoverReason::Armed,
        armed_message(spec.unhealthy_after_seconds, lease_duration),
    )
}

/// The `Failover=True Armed` message: what silence fails the node over, and why it is longer
/// than asked when the spec asks for less than the kubelets' Lease duration.
pub fn armed_message(unhealthy_after_seconds: i64, lease_duration: Duration) -> String {
    let threshold = effective_threshold(unhealthy_after_seconds, lease_duration);
    let mut message = format!(
        "the dedicated node is replaced automatically once its kubelet Lease has been silent for {}s",
        threshold.as_secs()
    );
    if threshold.as_secs() as i64 != unhealthy_after_seconds {
        message.push_str(&format!(
            " (spec.failover.unhealthyAfterSeconds is {unhealthy_after_seconds}; no threshold is shorter than the kubelets' {}s Lease, which a live kubelet renews every {}s)",
            lease_duration.as_secs(),
            lease_duration.as_secs() / 4
        ));
    }
    message
}

/// The circuit breaker: more than max(1, 20%) of the managed dedicated nodes unhealthy at once.
pub fn breaker_open(unhealthy: usize, managed: usize) -> bool {
    unhealthy > (managed / 5).max(1)
}

/// The unhealthy nodes the breaker counts, from each namespace's `(unhealthy, managed)`: a
/// namespace counts at most one more than its own breaker allows, so alone it trips the
/// breaker only when it is (nearly) the whole fleet. One tenant whose nodes never come up (a
/// broken image, on purpose or not) cannot hold every other tenant's failovers back; an outage
/// that takes nodes of many namespaces still trips it.
pub fn breaker_count(by_namespace: impl IntoIterator<Item = (usize, usize)>) -> usize {
    by_namespace
        .into_iter()
        .map(|(unhealthy, managed)| unhealthy.min((managed / 5).max(1) + 1))
        .sum()
}

/// The most silences that began together, within `window` of one another, each group weighed
/// by `weigh` over how many of its silences each key (a namespace, or nothing) has. An outage
/// silences its nodes at once (a renewal interval and the watch's lag apart); a node that died
/// long before (an unrelated worker left powered off, a node whose database's failover is off)
/// is alone in its group and no longer adds to a later, lone death. `silences` are how long
/// each node has been silent: two began within `window` when those differ by at most that.
pub fn together<K: Clone + Eq + std::hash::Hash>(
    silences: &[(Duration, K)],
    window: Duration,
    weigh: impl Fn(&std::collections::HashMap<K, usize>) -> usize,
) -> usize {
    let mut sorted: Vec<&(Duration, K)> = silences.iter().collect();
    sorted.sort_by_key(|(silent, _)| *silent);
    let mut counts: std::collections::HashMap<K, usize> = Default::default();
    let (mut best, mut first) = (0, 0);
    for (last, (silent, key)) in sorted.iter().enumerate() {
        *counts.entry(key.clone()).or_default() += 1;
        while silent.saturating_sub(sorted[first].0) > window {
            let key = &sorted[first].1;
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
            first += 1;
        }
        debug_assert!(first <= last);
        best = best.max(weigh(&counts));
    }
    best
}

/// What the steps look at.
pub struct StepView<'a> {
    pub failover: &'a FailoverStatus,
    /// EC2's state of the old instance (`None`: EC2 no longer knows it, i.e. long terminated).
    pub old_instance: Option<InstanceState>,
    /// The old Node object still exists.
    pub old_node_exists: bool,
    pub old_node_tainted: bool,
    /// A pod of this QuestDB is still bound to the old node, or its volume is still attached
    /// there (a VolumeAttachment for the old node).
    pub old_node_holds_pod: bool,
    pub old_node_holds_volume: bool,
    /// The database pod runs (Running) on the node of the new instance.
    pub pod_running_on_new_node: bool,
    pub pod_ready: bool,
    /// `spec.dns` is unset, or the record points at the new node.
    pub dns_follows: bool,
    /// The DNS record's TTL (zero without `spec.dns`): resolvers may send clients to the old
    /// address that long after the switch, so the fenced instance keeps it (a terminated
    /// instance's private address can go to another instance at once).
    pub dns_ttl: Duration,
    /// Time in the current step.
    pub in_step_for: Duration,
    /// Time since `failover.fenceStop` was recorded.
    pub fence_stop_for: Duration,
    pub escalation: Escalation,
}

/// The next step of a failover under way.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Record that the fence now stops the old instance this way (before it is sent).
    RecordStop(StopMode),
    /// Stop the old instance; repeated until EC2 reports it stopped or terminated.
    Fence(String, StopMode),
    /// Record the next phase (before the side effect that belongs to it).
    Advance(FailoverPhase),
    /// Taint the old Node out-of-service.
    TaintOutOfService(String),
    /// Terminate the fenced (stopped) instance whose volume is stuck detaching; it gives up
    /// holding its address for the DNS TTL, which matters less than a database that cannot
    /// start.
    TerminateFenced(String),
    /// Delete the database pod still bound to the old node, without a grace period: EC2 has
    /// reported the instance stopped or terminated (the fence), so nothing of it runs. Pod
    /// garbage collection would do the same only once the node is NotReady, and by then the
    /// cloud controller may have deleted the Node of a terminated instance, which leaves the
    /// volume to the attach-detach controller's 6-minute force detach.
    ForceDeletePod,
    /// Nothing to do but wait for the cluster; the string says for what.
    Wait(String),
    /// The database is back: terminate the fenced instance and record the end.
    Finish(String),
}

pub fn next_step(v: &StepView) -> Step {
    let f = v.failover;
    let old = f.old_instance_id.clone().unwrap_or_default();
    match f.phase {
        FailoverPhase::Fencing => fence(v, old),
        FailoverPhase::Releasing => {
            let node = f.old_node.clone().unwrap_or_default();
            if v.old_node_exists
                && !v.old_node_tainted
                && (v.old_node_holds_pod || v.old_node_holds_volume)
            {
                Step::TaintOutOfService(node)
            } else if v.old_node_holds_pod {
                Step::ForceDeletePod
            } else if v.old_node_holds_volume && escalation_due(v.in_step_for, v.escalation.detach)
            {
                // Once per escalation period, not every poll: terminate is idempotent.
                Step::TerminateFenced(old)
            } else if !v.old_node_exists && v.old_node_holds_volume {
                // No Node to taint: the attach-detach controller's own timer releases it.
                Step::Wait(format!(
                    "the Node {node} is deleted: waiting for the attach-detach controller to detach the volume (up to 6 min after the pod is gone)"
                ))
            } else if v.old_node_holds_pod || v.old_node_holds_volume {
                Step::Wait(format!(
                    "waiting for the database pod and its volume to leave {node}"
                ))
            } else {
                Step::Advance(FailoverPhase::Reattaching)
            }
        }
        FailoverPhase::Reattaching => {
            if v.pod_running_on_new_node {
                Step::Advance(FailoverPhase::Recovering)
            } else {
                Step::Wait("waiting for the database pod to start on the new node".into())
            }
        }
        FailoverPhase::Recovering => {
            if v.pod_ready && (v.dns_follows || v.in_step_for >= DNS_FOLLOW_WAIT) {
                // A record Route53 refuses (or keeps failing) is `DnsReady`'s to report and
                // retry; the failover, which holds back backups, moves and the next failover,
                // does not wait on it for ever once the database answers.
                Step::Advance(FailoverPhase::Draining)
            } else if !v.pod_ready {
                Step::Wait("waiting for the database to answer its health check".into())
            } else {
                Step::Wait(format!(
                    "waiting for the DNS record to follow the database (at most {}s into this step; DnsReady says why it does not)",
                    DNS_FOLLOW_WAIT.as_secs()
                ))
            }
        }
        FailoverPhase::Draining => {
            if v.in_step_for >= v.dns_ttl {
                Step::Finish(old)
            } else {
                Step::Wait(format!(
                    "the database answers on the new node; instance {old} stays stopped, holding its address, until resolvers drop the old record ({}s TTL)",
                    v.dns_ttl.as_secs()
                ))
            }
        }
        FailoverPhase::Healthy => Step::Wait(String::new()),
    }
}

/// The fence: a normal stop first, so that an instance that still runs (a partitioned kubelet,
/// a deleted Node) shuts its database down and flushes what it wrote; forced once that has
/// not ended within `escalation.graceful_stop` (a dead host never shuts down); a forced stop
/// that hangs is forced again once per `escalation.stop`. Each mode is recorded before it is
/// sent, so a restart resumes the same stop with the same clock.
fn fence(v: &StepView, old: String) -> Step {
    use InstanceState::*;
    let Some(state) = v
        .old_instance
        .filter(|s| !matches!(s, Stopped | Terminated))
    else {
        return Step::Advance(FailoverPhase::Releasing);
    };
    let Some(stop) = v.failover.fence_stop.as_ref().filter(|s| s.instance == old) else {
        // Shutting down is a termination under way: nothing stops it faster.
        return if state == ShuttingDown {
            Step::Wait(format!("instance {old} is shutting down"))
        } else {
            Step::RecordStop(StopMode::Graceful)
        };
    };
    let age = v.fence_stop_for;
    match (stop.mode, state) {
        (StopMode::Graceful, _) if age >= v.escalation.graceful_stop => {
            Step::RecordStop(StopMode::Forced)
        }
        // Sent again while EC2 still says running: its reads lag, and a restart may have
        // come between the record and the call. Idempotent.
        (mode, Pending | Running) => Step::Fence(old, mode),
        // A forced stop can hang for minutes (a stuck EBS detach, a host problem): a forced
        // stop again is AWS's remedy. Once per period, not every poll.
        (StopMode::Forced, Stopping) if escalation_due(age, v.escalation.stop) => {
            Step::Fence(old, StopMode::Forced)
        }
        (StopMode::Graceful, _) => Step::Wait(format!(
            "instance {old} is shutting down normally, so the database flushes what it wrote ({}s of {}s before the stop is forced)",
            age.as_secs(),
            v.escalation.graceful_stop.as_secs()
        )),
        (StopMode::Forced, _) => Step::Wait(format!("instance {old} is being stopped (forced)")),
    }
}

/// The note of a fence that forces the stop of `instance` after its normal stop ran out.
pub fn forced_stop_note(instance: &str, graceful_stop: Duration) -> String {
    format!(
        "instance {instance} did not shut down within {}s of a normal stop: forcing the stop (what the database had not synced is lost)",
        graceful_stop.as_secs()
    )
}

/// What a release (pause, deletion, `spec.node` removed) looks at when the database pod has
/// not left the dedicated node.
pub struct ReleaseView<'a> {
    pub node: &'a str,
    pub instance: &'a str,
    /// A pod of the database is still bound to the node.
    pub pod_on_node: bool,
    /// How long the node's Lease has been silent (tracker), `None` while it renews.
    pub silent_for: Option<Duration>,
    pub threshold: Duration,
    pub breaker_open: bool,
    /// EC2's state of the instance (`None`: long gone).
    pub instance_state: Option<InstanceState>,
    pub node_tainted: bool,
    /// The stop recorded for this instance (`status.fenceStop`) and its age.
    pub stop: Option<(StopMode, Duration)>,
    pub escalation: Escalation,
}

/// The next step of a release whose pod sits on a dead node.
#[derive(Clone, Debug, PartialEq)]
pub enum ReleaseFence {
    /// Nothing to do: the pod stops by itself (a live kubelet stops it gracefully).
    None,
    /// Record that the instance is now stopped this way (before it is sent).
    RecordStop(StopMode),
    /// Stop the instance: a silent kubelet never confirms the pod's end.
    Stop(String, StopMode),
    /// The instance is down: the out-of-service taint lets the pod and volume go.
    Taint(String),
    Wait(String),
}

/// A silent kubelet never stops the pod a release is waiting for, so the release would wait
/// forever (and a deletion's finalizer with it): past the failover threshold, the node is
/// fenced and tainted as a failover does. Nothing new is recorded: the release is the intent
/// (in the spec), and every step is idempotent.
pub fn release_fence(v: &ReleaseView) -> ReleaseFence {
    if !v.pod_on_node || v.silent_for.is_none_or(|s| s < v.threshold) {
        return ReleaseFence::None;
    }
    if v.breaker_open {
        return ReleaseFence::Wait(format!(
            "node {} is silent, but so are too many others (a partition or an outage): the release waits for the pod instead of fencing",
            v.node
        ));
    }
    use InstanceState::*;
    // As the failover's fence: a normal stop first, forced once it has not ended in time,
    // forced again once per period while it hangs; each mode recorded before it is sent.
    let instance = v.instance.to_string();
    match (v.instance_state, v.stop) {
        (Some(ShuttingDown), _) => {
            ReleaseFence::Wait(format!("instance {instance} is shutting down"))
        }
        (Some(Running | Pending | Stopping), None) => ReleaseFence::RecordStop(StopMode::Graceful),
        (Some(Running | Pending | Stopping), Some((StopMode::Graceful, age)))
            if age >= v.escalation.graceful_stop =>
        {
            ReleaseFence::RecordStop(StopMode::Forced)
        }
        (Some(Running | Pending), Some((mode, _))) => ReleaseFence::Stop(instance, mode),
        (Some(Stopping), Some((StopMode::Forced, age)))
            if escalation_due(age, v.escalation.stop) =>
        {
            ReleaseFence::Stop(instance, StopMode::Forced)
        }
        (Some(Stopping), Some((mode, _))) => ReleaseFence::Wait(format!(
            "instance {instance} is being stopped ({})",
            match mode {
                StopMode::Graceful => "normally: the database flushes what it wrote",
                StopMode::Forced => "forced",
            }
        )),
        _ if !v.node_tainted => ReleaseFence::Taint(v.node.to_string()),
        _ => ReleaseFence::Wait(format!(
            "node {} is fenced and tainted out-of-service: waiting for Kubernetes to remove the pod",
            v.node
        )),
    }
}

/// `FailoverStuck` once a step has run past its timeout.
pub fn stuck(failover: &FailoverStatus, in_step_for: Duration) -> Option<Verdict<FailoverReason>> {
    let limit = step_timeout(failover.phase);
    (in_step_for > limit).then(|| {
        Verdict::new(
            false,
            FailoverReason::FailoverStuck,
            format!(
                "step {} has not finished after {} minutes: {}",
                failover.phase,
                limit.as_secs() / 60,
                failover.message.clone().unwrap_or_default()
            ),
        )
    })
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
