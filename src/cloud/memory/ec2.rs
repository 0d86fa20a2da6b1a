//! An in-process EC2 with the behaviours the operator must survive: ClientToken idempotency,
//! throttling, capacity shortages, AMI / instance type validation, launch latency, eventual
//! consistency and the pending → running → shutting-down → terminated lifecycle.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use async_trait::async_trait;
use tokio::sync::broadcast;
use tokio::time::{Duration, Instant};

use crate::cloud::backend::{Ec2Api, InstanceQuery, Page, RunSpec};
use crate::cloud::{ApiError, Instance, InstanceState};

/// The one VPC of the memory cloud.
const SANDBOX_VPC: &str = "vpc-sandbox";

/// Lifecycle news for whoever simulates the kubelet (the sandbox registers a Node per running
/// instance and removes it on termination).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceEvent {
    Running(Box<Instance>),
    /// StopInstances began: `graceful`, the OS shuts down (containers get their termination
    /// signal, the kernel writes its cache back) and EC2 reports `stopped` once it has halted
    /// ([`MemoryEc2::os_halted`]) or [`MemoryEc2Options::os_shutdown`] has passed; forced,
    /// the instance loses power at once (what was not on its volumes is lost).
    Stopping {
        id: String,
        graceful: bool,
    },
    /// Stopped (by StopInstances or a power loss): the kubelet is gone, the Node stays.
    Stopped(String),
    Terminated(String),
}

/// The account that owns every known image unless `image_owners` says otherwise (the
/// account of the EKS-optimised AMIs in us-east-1 and most regions).
pub const IMAGE_OWNER: &str = "602401143452";

/// Static behaviour of the fake.
#[derive(Clone, Debug)]
pub struct MemoryEc2Options {
    /// AMIs that exist; anything else is `InvalidAMIID.NotFound`.
    pub known_images: BTreeSet<String>,
    /// Instance types that exist; anything else is `InvalidParameterValue`.
    pub instance_types: BTreeSet<String>,
    /// First two octets of private IPs, e.g. `10.0` (strings only; nothing is contacted).
    pub private_ip_prefix: String,
    /// Give instances a public IP (from 203.0.113.0/24, a documentation range).
    pub assign_public_ip: bool,
    /// Results per DescribeInstances page, so paging is exercised.
    pub page_size: usize,
    /// How long RunInstances takes to answer *after* the instance exists: a caller cancelled
    /// in this window has launched an instance without knowing its id.
    pub launch_latency: Duration,
    pub pending_to_running: Duration,
    pub shutting_down_to_terminated: Duration,
    /// Images built for arm64 (all others are x86_64).
    pub arm64_images: BTreeSet<String>,
    /// The region in instances' private DNS names.
    pub region: String,
    /// Owners (`OwnerId`) of images other than [`IMAGE_OWNER`]: a tenant's own build, say.
    pub image_owners: BTreeMap<String, String>,
    /// Instance types with Graviton (arm64) processors (all others are x86_64).
    pub arm64_instance_types: BTreeSet<String>,
    /// Images whose instances run but never join the cluster (their bootstrap fails): no
    /// `Running` event reaches whoever joins Nodes.
    pub never_join_images: BTreeSet<String>,
    /// A stop hangs in `stopping` (a stuck EBS detach, a host problem) until StopInstances is
    /// sent again while it is `stopping`, as AWS advises for an instance stuck stopping.
    pub hang_stops: bool,
    /// How long a normal stop (no `Force`) waits for the OS to halt before EC2 stops the
    /// instance anyway (a hard stop, as AWS describes for a shutdown that does not complete).
    pub os_shutdown: Duration,
}

impl Default for MemoryEc2Options {
    fn default() -> Self {
        Self {
            // Two images that join normally (an upgrade moves between them) and one whose
            // nodes never join (an upgrade to it aborts).
            known_images: [
                "ami-0123456789abcdef0".to_string(),
                "ami-0fedcba9876543210".to_string(),
                "ami-0000000000000dead".to_string(),
                "ami-0a64a64a64a64a64a".to_string(),
            ]
            .into(),
            arm64_images: ["ami-0a64a64a64a64a64a".to_string()].into(),
            image_owners: BTreeMap::new(),
            region: "sim-region-1".into(),
            arm64_instance_types: ["m7g.large".to_string()].into(),
            instance_types: [
                "t3.micro",
                "t3.large",
                "m6i.large",
                "m6i.xlarge",
                "r6i.large",
                "m7g.large",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            private_ip_prefix: "10.0".into(),
            assign_public_ip: false,
            page_size: 50,
            launch_latency: Duration::ZERO,
            pending_to_running: Duration::from_millis(100),
            shutting_down_to_terminated: Duration::from_millis(100),
            never_join_images: ["ami-0000000000000dead".to_string()].into(),
            hang_stops: false,
            os_shutdown: Duration::from_secs(30),
        }
    }
}

#[derive(Debug)]
struct Record {
    instance: Instance,
    client_token: String,
    subnet_id: String,
    /// As RunInstances received it (base64): what the instance's kubelet is bootstrapped from.
    user_data_base64: String,
    /// Remaining describes that do not see this instance yet (eventual consistency).
    hidden_for: u32,
    /// Its stop hangs in `stopping` until StopInstances is sent again with `Force`.
    stop_hung: bool,
    /// A normal stop is under way: the OS is shutting down.
    os_stopping: bool,
}

#[derive(Debug, Default)]
struct Faults {
    throttle_next: u32,
    throttled_operations: BTreeSet<&'static str>,
    no_capacity_zones: BTreeSet<String>,
    /// (zone, instance type) pairs without capacity.
    no_capacity_types: BTreeSet<(String, String)>,
    hide_new_instances_for: u32,
    /// Instances that filtered DescribeInstances answers (tags, `instance-id` filter) leave
    /// out while asking by id still finds them: EC2's reads are eventually consistent
    /// ("Eventual consistency in the Amazon EC2 API"), and a filter's silence is no proof.
    omitted_from_filters: BTreeSet<String>,
}

#[derive(Debug)]
struct State {
    options: MemoryEc2Options,
    faults: Faults,
    records: BTreeMap<String, Record>,
    by_token: HashMap<String, String>,
    next_serial: u64,
    calls: Vec<(&'static str, Instant)>,
    /// Events AWS scheduled ([`MemoryEc2::schedule_event`]), completed ones included.
    scheduled: Vec<crate::cloud::ScheduledEvent>,
}

/// The fake. Cheap to share: wrap it in an `Arc` and hand it to [`crate::cloud::Ec2NodeProvider`].
pub struct MemoryEc2 {
    state: Mutex<State>,
    events: broadcast::Sender<InstanceEvent>,
    me: Weak<MemoryEc2>,
}

/// A fault or option a test turns on (`member`) or off for one key.
fn switch<T: Ord>(set: &mut BTreeSet<T>, key: T, member: bool) {
    if member {
        set.insert(key);
    } else {
        set.remove(&key);
    }
}

impl MemoryEc2 {
    pub(crate) fn new(options: MemoryEc2Options) -> Arc<Self> {
        let (events, _) = broadcast::channel(1024);
        Arc::new_cyclic(|me| Self {
            state: Mutex::new(State {
                options,
                faults: Faults::default(),
                records: BTreeMap::new(),
                by_token: HashMap::new(),
                next_serial: 1,
                calls: Vec::new(),
                scheduled: Vec::new(),
            }),
            events,
            me: me.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Lifecycle events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<InstanceEvent> {
        self.events.subscribe()
    }

    /// The next `n` calls (any operation) fail with `RequestLimitExceeded`.
    pub fn throttle_next(&self, n: u32) {
        self.lock().faults.throttle_next = n;
    }

    /// Every call of `operation` fails with `RequestLimitExceeded` until cleared: EC2 throttles
    /// each API action by its own token bucket ("Request throttling for the Amazon EC2 API"),
    /// so one action can be refused for minutes while the others answer.
    pub fn set_throttled(&self, operation: &'static str, throttled: bool) {
        let mut state = self.lock();
        if throttled {
            state.faults.throttled_operations.insert(operation);
        } else {
            state.faults.throttled_operations.remove(operation);
        }
    }

    /// Instances of `image` that reach `running` from now on never register a Node (no
    /// instance profile, no access entry, user data the kubelet refuses), until cleared.
    pub fn set_never_joins(&self, image: &str, never: bool) {
        switch(
            &mut self.lock().options.never_join_images,
            image.to_string(),
            never,
        );
    }

    /// RunInstances in `zone` fails with `InsufficientInstanceCapacity` until cleared.
    pub fn set_no_capacity(&self, zone: &str, no_capacity: bool) {
        switch(
            &mut self.lock().faults.no_capacity_zones,
            zone.to_string(),
            no_capacity,
        );
    }

    /// RunInstances of `instance_type` in `zone` fails with `InsufficientInstanceCapacity`
    /// until cleared (other types launch: EC2's shortages are per type and zone).
    pub fn set_no_capacity_for(&self, zone: &str, instance_type: &str, no_capacity: bool) {
        let key = (zone.to_string(), instance_type.to_string());
        switch(&mut self.lock().faults.no_capacity_types, key, no_capacity);
    }

    /// Instances launched from now on stay invisible to the next `n` DescribeInstances /
    /// TerminateInstances calls that would include them (by id: `InvalidInstanceID.NotFound`;
    /// by filter: absent).
    pub fn hide_new_instances_for(&self, n: u32) {
        self.lock().faults.hide_new_instances_for = n;
    }

    /// Filtered DescribeInstances answers leave `id` out (while `omit`), asking by id does not.
    pub fn omit_from_filters(&self, id: &str, omit: bool) {
        let mut state = self.lock();
        if omit {
            state.faults.omitted_from_filters.insert(id.to_string());
        } else {
            state.faults.omitted_from_filters.remove(id);
        }
    }

    pub fn set_launch_latency(&self, latency: Duration) {
        self.lock().options.launch_latency = latency;
    }

    pub fn set_pending_to_running(&self, delay: Duration) {
        self.lock().options.pending_to_running = delay;
    }

    pub fn add_image(&self, image: &str) {
        self.lock().options.known_images.insert(image.to_string());
    }

    /// The user data (base64) an instance was launched with.
    pub fn user_data(&self, id: &str) -> Option<String> {
        self.lock()
            .records
            .get(id)
            .map(|r| r.user_data_base64.clone())
    }

    /// From now on, stops hang until they are repeated (see [`MemoryEc2Options::hang_stops`]).
    pub fn set_hang_stops(&self, hang: bool) {
        self.lock().options.hang_stops = hang;
    }

    /// The instance is stopped outside the operator (a user, a scheduled EC2 event): EC2
    /// reports it `stopped`. A hardware failure is not this: EC2 keeps such an instance
    /// `running` (failed status checks), which is a kubelet fault with no EC2 change. Returns
    /// whether it was running.
    pub fn power_off(&self, id: &str) -> bool {
        let stopped = {
            let mut state = self.lock();
            match state.records.get_mut(id) {
                Some(r) if r.instance.state == InstanceState::Running => {
                    r.instance.state = InstanceState::Stopped;
                    true
                }
                _ => false,
            }
        };
        if stopped {
            let _ = self.events.send(InstanceEvent::Stopped(id.to_string()));
        }
        stopped
    }

    /// AWS schedules `code` (one of [`crate::cloud::SCHEDULED_EVENT_CODES`]) for instance `id`,
    /// not before `not_before`: `DescribeInstanceStatus` reports it from now on, and at
    /// `not_before` it takes place unless canceled. A stop or a retirement stops the instance
    /// as EC2 does (`stopped`, the kubelet gone: what the OS had not written back is lost, as
    /// at [`MemoryEc2::power_off`]); the event then reads `[Completed]`. Reboots and power
    /// maintenance are only marked completed: the fake has no reboot. Returns the event's id.
    pub fn schedule_event(&self, id: &str, code: &str, not_before: SystemTime) -> String {
        let event_id = {
            let mut state = self.lock();
            let event_id = format!("instance-event-{:017x}", state.next_serial);
            state.next_serial += 1;
            state.scheduled.push(crate::cloud::ScheduledEvent {
                instance_id: id.to_string(),
                id: Some(event_id.clone()),
                code: code.to_string(),
                description: format!("The instance is scheduled for {code}"),
                not_before: Some(not_before),
                not_after: not_before.checked_add(Duration::from_secs(2 * 3600)),
            });
            event_id
        };
        let me = self.me.clone();
        let (instance, event, code) = (id.to_string(), event_id.clone(), code.to_string());
        let delay = not_before
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(ec2) = me.upgrade() else { return };
            let due = {
                let mut state = ec2.lock();
                let Some(e) = state
                    .scheduled
                    .iter_mut()
                    .find(|e| e.id.as_deref() == Some(event.as_str()) && e.pending())
                else {
                    return;
                };
                e.description = format!("[Completed] {}", e.description);
                true
            };
            if due && matches!(code.as_str(), "instance-stop" | "instance-retirement") {
                ec2.power_off(&instance);
            }
        });
        event_id
    }

    /// The OS of an instance that is being stopped normally has halted: EC2 reports it
    /// `stopped` now. Returns whether it was such an instance.
    pub fn os_halted(&self, id: &str) -> bool {
        let halted = {
            let mut state = self.lock();
            match state.records.get_mut(id) {
                Some(r) if r.instance.state == InstanceState::Stopping && r.os_stopping => {
                    r.instance.state = InstanceState::Stopped;
                    r.os_stopping = false;
                    true
                }
                _ => false,
            }
        };
        if halted {
            let _ = self.events.send(InstanceEvent::Stopped(id.to_string()));
        }
        halted
    }

    /// `AssignPrivateIpAddresses --ipv4-prefixes` on the instance's primary network interface:
    /// the blocks the VPC CNI's ipamd draws pod addresses from (prefix delegation). Returns
    /// whether the instance exists.
    pub fn assign_ipv4_prefixes(&self, id: &str, prefixes: &[String]) -> bool {
        let mut state = self.lock();
        let Some(r) = state.records.get_mut(id) else {
            return false;
        };
        let held = &mut r.instance.pod_addresses.prefixes;
        for p in prefixes {
            if !held.contains(p) {
                held.push(p.clone());
            }
        }
        true
    }

    /// Every instance ever launched, whatever its state, ignoring eventual consistency.
    pub fn instances(&self) -> Vec<Instance> {
        self.lock()
            .records
            .values()
            .map(|r| r.instance.clone())
            .collect()
    }

    /// Every API call so far: operation name and when it arrived (tokio clock).
    pub fn calls(&self) -> Vec<(&'static str, Instant)> {
        self.lock().calls.clone()
    }

    /// How many times `operation` was called.
    pub fn call_count(&self, operation: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|(op, _)| *op == operation)
            .count()
    }

    /// Record the call and apply throttling: the common prologue of every operation.
    fn begin(state: &mut State, operation: &'static str) -> Result<(), ApiError> {
        state.calls.push((operation, Instant::now()));
        let throttled = state.faults.throttled_operations.contains(operation);
        if throttled || state.faults.throttle_next > 0 {
            if !throttled {
                state.faults.throttle_next -= 1;
            }
            return Err(ApiError::new(
                "RequestLimitExceeded",
                "Request limit exceeded.",
            ));
        }
        Ok(())
    }

    fn validate(state: &State, spec: &RunSpec) -> Result<(), ApiError> {
        if !spec.image.starts_with("ami-") {
            return Err(ApiError::new(
                "InvalidAMIID.Malformed",
                format!("Invalid id: \"{}\" (expecting \"ami-...\")", spec.image),
            ));
        }
        if !state.options.known_images.contains(&spec.image) {
            return Err(ApiError::new(
                "InvalidAMIID.NotFound",
                format!("The image id '[{}]' does not exist", spec.image),
            ));
        }
        if !state.options.instance_types.contains(&spec.instance_type) {
            return Err(ApiError::new(
                "InvalidParameterValue",
                format!("Invalid value '{}' for InstanceType.", spec.instance_type),
            ));
        }
        let short_of_type = state
            .faults
            .no_capacity_types
            .contains(&(spec.zone.clone(), spec.instance_type.clone()));
        if short_of_type || state.faults.no_capacity_zones.contains(&spec.zone) {
            return Err(ApiError::new(
                "InsufficientInstanceCapacity",
                format!(
                    "We currently do not have sufficient {} capacity in the Availability Zone you requested ({}).",
                    spec.instance_type, spec.zone
                ),
            ));
        }
        Ok(())
    }

    fn create(state: &mut State, spec: &RunSpec) -> Instance {
        let serial = state.next_serial;
        state.next_serial += 1;
        let host = serial % 65_000;
        let instance = Instance {
            // Deterministic: ids follow launch order, so test failures reproduce.
            id: format!("i-{serial:017x}"),
            state: InstanceState::Pending,
            zone: spec.zone.clone(),
            image: spec.image.clone(),
            instance_type: spec.instance_type.clone(),
            private_ip: Some(format!(
                "{}.{}.{}",
                state.options.private_ip_prefix,
                host / 250,
                host % 250 + 4
            )),
            // EC2: a public address only when asked for, or when the subnet maps one on launch.
            public_ip: (spec.public_ip || state.options.assign_public_ip)
                .then(|| format!("203.0.113.{}", serial % 250 + 1)),
            tags: spec.tags.clone(),
            launched_at: Some(SystemTime::now()),
            state_reason: None,
            // EC2's resource-name hostnames (`i-....<region>.compute.internal`), the name the
            // test environment's kubelets register under.
            private_dns_name: Some(format!(
                "i-{serial:017x}.{}.compute.internal",
                state.options.region
            )),
            pod_addresses: Default::default(),
        };
        state
            .by_token
            .insert(spec.client_token.clone(), instance.id.clone());
        state.records.insert(
            instance.id.clone(),
            Record {
                instance: instance.clone(),
                client_token: spec.client_token.clone(),
                subnet_id: spec.subnet_id.clone(),
                user_data_base64: spec.user_data_base64.clone(),
                hidden_for: state.faults.hide_new_instances_for,
                stop_hung: false,
                os_stopping: false,
            },
        );
        instance
    }

    /// Move `id` from `from` to `to` after `delay`, announcing the result.
    fn schedule_transition(
        &self,
        id: String,
        from: InstanceState,
        to: InstanceState,
        delay: Duration,
    ) {
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(ec2) = me.upgrade() else { return };
            let event = {
                let mut state = ec2.lock();
                let never_join = state.options.never_join_images.clone();
                let Some(record) = state.records.get_mut(&id) else {
                    return;
                };
                if record.instance.state != from {
                    return;
                }
                record.instance.state = to;
                record.os_stopping = false;
                match to {
                    InstanceState::Running if never_join.contains(&record.instance.image) => return,
                    InstanceState::Running => {
                        InstanceEvent::Running(Box::new(record.instance.clone()))
                    }
                    InstanceState::Stopped => InstanceEvent::Stopped(id.clone()),
                    _ => InstanceEvent::Terminated(id.clone()),
                }
            };
            // Nobody listening is fine: the sandbox may not care about nodes.
            let _ = ec2.events.send(event);
        });
    }

    fn matches(query: &InstanceQuery, instance: &Instance) -> bool {
        match query {
            InstanceQuery::Tags(tags) => tags.iter().all(|(k, v)| instance.tags.get(k) == Some(v)),
            InstanceQuery::Ids(ids) | InstanceQuery::IdFilter(ids) => ids.contains(&instance.id),
        }
    }
}

#[async_trait]
impl Ec2Api for MemoryEc2 {
    async fn run_instance(&self, spec: &RunSpec) -> Result<Instance, ApiError> {
        let (instance, latency, created) = {
            let mut state = self.lock();
            // A dry run is counted apart: it launches nothing, and a test counting launches
            // must not see the preflight's.
            Self::begin(
                &mut state,
                if spec.dry_run {
                    crate::cloud::backend::DRY_RUN_OPERATION
                } else {
                    "RunInstances"
                },
            )?;
            // Like EC2: the ClientToken is checked first, so a retry gets the original answer
            // even if capacity or the AMI went away since.
            if let Some(id) = state.by_token.get(&spec.client_token).cloned() {
                let record = &state.records[&id];
                if record.instance.image != spec.image
                    || record.instance.instance_type != spec.instance_type
                    || record.subnet_id != spec.subnet_id
                {
                    return Err(ApiError::new(
                        "IdempotentParameterMismatch",
                        "The client token you have provided is associated with a resource that is already deleted or has different parameters.",
                    ));
                }
                debug_assert_eq!(record.client_token, spec.client_token);
                (record.instance.clone(), state.options.launch_latency, false)
            } else {
                Self::validate(&state, spec)?;
                if spec.dry_run {
                    return Err(ApiError::new(
                        crate::cloud::backend::DRY_RUN_PASSED,
                        "Request would have succeeded, but DryRun flag is set.",
                    ));
                }
                let instance = Self::create(&mut state, spec);
                (instance, state.options.launch_latency, true)
            }
        };
        if created {
            let delay = self.lock().options.pending_to_running;
            self.schedule_transition(
                instance.id.clone(),
                InstanceState::Pending,
                InstanceState::Running,
                delay,
            );
        }
        // The instance already exists: a caller dropped during this sleep is the "crash between
        // launch and status write" case.
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(instance)
    }

    async fn describe_instances(
        &self,
        query: &InstanceQuery,
        next_token: Option<&str>,
    ) -> Result<Page<Instance>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeInstances")?;
        let mut unknown = Vec::new();
        let mut visible = Vec::new();
        if let InstanceQuery::Ids(ids) = query {
            for id in ids {
                match state.records.get(id) {
                    Some(r) if r.hidden_for == 0 => {}
                    _ => unknown.push(id.clone()),
                }
            }
        }
        let by_id = matches!(query, InstanceQuery::Ids(_));
        let State {
            records, faults, ..
        } = &mut *state;
        for record in records.values_mut() {
            if !Self::matches(query, &record.instance) {
                continue;
            }
            if !by_id && faults.omitted_from_filters.contains(&record.instance.id) {
                continue;
            }
            if record.hidden_for > 0 {
                record.hidden_for -= 1;
            } else {
                visible.push(record.instance.clone());
            }
        }
        if !unknown.is_empty() {
            return Err(ApiError::new(
                "InvalidInstanceID.NotFound",
                format!("The instance IDs '{}' do not exist", unknown.join(", ")),
            ));
        }
        let start: usize = match next_token {
            None => 0,
            Some(token) => token.parse().map_err(|_| {
                ApiError::new("InvalidParameterValue", format!("bad NextToken {token}"))
            })?,
        };
        let page_size = state.options.page_size.max(1);
        let end = (start + page_size).min(visible.len());
        let items = visible.get(start..end).unwrap_or_default().to_vec();
        let next_token = (end < visible.len()).then(|| end.to_string());
        Ok(Page { items, next_token })
    }

    /// The sandbox's subnets are named `subnet-<zone>`, all in one VPC.
    /// Only running instances, as `DescribeInstanceStatus` without `IncludeAllInstances`.
    async fn describe_instance_events(
        &self,
        next_token: Option<&str>,
    ) -> Result<Page<crate::cloud::ScheduledEvent>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeInstanceStatus")?;
        let running: Vec<crate::cloud::ScheduledEvent> = state
            .scheduled
            .iter()
            .filter(|e| {
                state
                    .records
                    .get(&e.instance_id)
                    .is_some_and(|r| r.instance.state == InstanceState::Running)
            })
            .cloned()
            .collect();
        let start: usize = next_token.and_then(|t| t.parse().ok()).unwrap_or(0);
        let size = state.options.page_size.max(1);
        let items: Vec<_> = running.iter().skip(start).take(size).cloned().collect();
        let next_token = (start + size < running.len()).then(|| (start + size).to_string());
        Ok(Page { items, next_token })
    }

    async fn describe_subnets(
        &self,
        ids: &[String],
    ) -> Result<Vec<crate::cloud::Subnet>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeSubnets")?;
        // As EC2 answers a `subnet-id` filter: an id it does not know is left out.
        Ok(ids
            .iter()
            .filter_map(|id| {
                let zone = id.strip_prefix("subnet-")?;
                Some(crate::cloud::Subnet {
                    id: id.clone(),
                    zone: zone.to_string(),
                    vpc_id: SANDBOX_VPC.to_string(),
                })
            })
            .collect())
    }

    /// Any `sg-` id is a group of the sandbox's VPC.
    async fn security_group_vpcs(&self, ids: &[String]) -> Result<Vec<(String, String)>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeSecurityGroups")?;
        // As EC2 answers a `group-id` filter: an id it does not know is left out.
        Ok(ids
            .iter()
            .filter(|id| id.starts_with("sg-"))
            .map(|id| (id.clone(), SANDBOX_VPC.to_string()))
            .collect())
    }

    async fn describe_image(&self, id: &str) -> Result<Option<crate::cloud::ImageFacts>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeImages")?;
        let arch = if state.options.arm64_images.contains(id) {
            "arm64"
        } else {
            "x86_64"
        };
        Ok(state
            .options
            .known_images
            .contains(id)
            .then(|| crate::cloud::ImageFacts {
                id: id.to_string(),
                state: "available".into(),
                architecture: arch.into(),
                root_device_type: "ebs".into(),
                root_device_name: Some(crate::cloud::node_volumes::DEFAULT_ROOT_DEVICE.into()),
                // The EKS-optimized AL2023 image's one volume.
                ebs_devices: vec![crate::cloud::ImageDevice {
                    device_name: crate::cloud::node_volumes::DEFAULT_ROOT_DEVICE.into(),
                    size_gib: Some(20),
                }],
                owner: state
                    .options
                    .image_owners
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| IMAGE_OWNER.to_string()),
                // The memory cloud's images name their owner account only.
                owner_alias: None,
            }))
    }

    /// Every known type is offered in every zone.
    async fn describe_instance_type(
        &self,
        name: &str,
        _zone: &str,
    ) -> Result<Option<crate::cloud::InstanceTypeFacts>, ApiError> {
        let mut state = self.lock();
        Self::begin(&mut state, "DescribeInstanceTypes")?;
        if !state.options.instance_types.contains(name) {
            return Ok(None);
        }
        let arch = if state.options.arm64_instance_types.contains(name) {
            "arm64"
        } else {
            "x86_64"
        };
        Ok(Some(crate::cloud::InstanceTypeFacts {
            name: name.to_string(),
            architectures: vec![arch.into()],
            offered_in_zone: true,
        }))
    }

    /// StopInstances: `running`/`pending` → `stopping` → `stopped`; stopped or gone instances
    /// are left as they are (EC2 answers with their current state, no error). Without `force`
    /// the OS shuts down first ([`InstanceEvent::Stopping`]); with it the power goes, also
    /// for an instance whose normal stop is under way or hung.
    async fn stop_instances(&self, ids: &[String], force: bool) -> Result<(), ApiError> {
        let mut events = Vec::new();
        let (to_schedule, delay) = {
            let mut state = self.lock();
            Self::begin(&mut state, "StopInstances")?;
            if let Some(id) = ids.iter().find(|id| !state.records.contains_key(*id)) {
                return Err(ApiError::new(
                    "InvalidInstanceID.NotFound",
                    format!("The instance ID '{id}' does not exist"),
                ));
            }
            let hang = state.options.hang_stops;
            let delay = if force {
                state.options.shutting_down_to_terminated
            } else {
                state.options.os_shutdown
            };
            let mut to_schedule = Vec::new();
            for id in ids {
                let Some(record) = state.records.get_mut(id) else {
                    continue;
                };
                let begins = match record.instance.state {
                    InstanceState::Running | InstanceState::Pending => {
                        record.instance.state = InstanceState::Stopping;
                        record.stop_hung = hang;
                        !hang
                    }
                    // A forced stop gets a hung stop going, and cuts a normal one short.
                    InstanceState::Stopping
                        if force && (record.stop_hung || record.os_stopping) =>
                    {
                        record.stop_hung = false;
                        true
                    }
                    _ => false,
                };
                if begins {
                    record.os_stopping = !force;
                    events.push(InstanceEvent::Stopping {
                        id: id.clone(),
                        graceful: !force,
                    });
                    to_schedule.push(id.clone());
                }
            }
            (to_schedule, delay)
        };
        for event in events {
            let _ = self.events.send(event);
        }
        for id in to_schedule {
            self.schedule_transition(id, InstanceState::Stopping, InstanceState::Stopped, delay);
        }
        Ok(())
    }

    async fn terminate_instances(&self, ids: &[String]) -> Result<(), ApiError> {
        let (to_schedule, delay) = {
            let mut state = self.lock();
            Self::begin(&mut state, "TerminateInstances")?;
            let mut unknown = Vec::new();
            for id in ids {
                match state.records.get_mut(id) {
                    Some(r) if r.hidden_for == 0 => {}
                    Some(r) => {
                        r.hidden_for -= 1;
                        unknown.push(id.as_str());
                    }
                    None => unknown.push(id.as_str()),
                }
            }
            if !unknown.is_empty() {
                let list = unknown;
                return Err(ApiError::new(
                    "InvalidInstanceID.NotFound",
                    format!("The instance IDs '{}' do not exist", list.join(", ")),
                ));
            }
            let mut to_schedule = Vec::new();
            for id in ids {
                if let Some(record) = state.records.get_mut(id) {
                    if !record.instance.state.is_gone() {
                        record.instance.state = InstanceState::ShuttingDown;
                        to_schedule.push(id.clone());
                    }
                }
            }
            (to_schedule, state.options.shutting_down_to_terminated)
        };
        for id in to_schedule {
            self.schedule_transition(
                id,
                InstanceState::ShuttingDown,
                InstanceState::Terminated,
                delay,
            );
        }
        Ok(())
    }
}
