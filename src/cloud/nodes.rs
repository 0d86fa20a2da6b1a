//! The node provider on top of any [`Ec2Api`]: idempotent launch, batched describe, idempotent
//! terminate.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::Engine;
use tokio::time::Instant;

/// A launch's DescribeImages answer (`None`: EC2 does not know the image), asked once.
type ImageCell = tokio::sync::OnceCell<Option<ImageFacts>>;

use super::backend::{Ec2Api, InstanceQuery, Page, RunSpec};
use super::rate_limit::TokenBucket;
use super::retry::{CallRunner, NotFound};
use super::{
    client_token, desired_instance_tags, fallback_client_token, identity_tags, pick_subnet,
    user_data, ApiError, CloudConfig, CloudError, ImageFacts, ImageVerdict, Instance,
    InstanceTypeFacts, LaunchRequest, NodeFacts, NodeProvider, SharedObserver, StopMode,
    TAG_CLUSTER, TAG_UID,
};

/// The code of the refusal to stop or terminate an instance that is not provably the
/// caller's (`Ec2NodeProvider::check_owner`).
pub(crate) const INSTANCE_NOT_OWNED: &str = "InstanceNotOwned";

/// The code of a launch the allow-list refuses ([`super::LaunchAllowList`]).
pub(crate) const LAUNCH_NOT_ALLOWED: &str = "LaunchNotAllowed";

/// RunInstances' answer when the zone has no capacity for the type (EC2 API reference, error
/// codes): the one error a fallback instance type can help with.
const NO_CAPACITY: &str = "InsufficientInstanceCapacity";

/// EC2 documents no hard limit on ids per request; 100 keeps request URLs and responses small.
const IDS_PER_CALL: usize = 100;

/// [`NodeProvider`] for any EC2 backend (the SDK or the in-memory fake).
pub struct Ec2NodeProvider<A> {
    api: Arc<A>,
    config: CloudConfig,
    calls: CallRunner,
    /// Instances this provider launched within the eventual-consistency window: only for
    /// these does `InvalidInstanceID.NotFound` mean "not visible yet" rather than "gone".
    recent_launches: Mutex<HashMap<String, Instant>>,
}

impl<A: Ec2Api> Ec2NodeProvider<A> {
    pub(crate) fn new(api: Arc<A>, config: CloudConfig, observer: SharedObserver) -> Self {
        let limiter = Arc::new(TokenBucket::new(&config.rate_limit));
        let calls = CallRunner::new("ec2", observer, limiter, config.retry.clone());
        Self {
            api,
            config,
            calls,
            recent_launches: Mutex::new(HashMap::new()),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.recent_launches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn remember_launch(&self, id: &str) {
        let window = self.config.retry.eventual_consistency_window;
        let mut recent = self.recent();
        recent.retain(|_, at| at.elapsed() < window);
        recent.insert(id.to_string(), Instant::now());
    }

    fn launched_recently(&self, id: &str) -> bool {
        let window = self.config.retry.eventual_consistency_window;
        self.recent()
            .get(id)
            .is_some_and(|at| at.elapsed() < window)
    }

    async fn describe_all(
        &self,
        query: &InstanceQuery,
        not_found: NotFound,
    ) -> Result<Vec<Instance>, ApiError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page: Page<Instance> = self
                .calls
                .call("DescribeInstances", not_found, || {
                    self.api.describe_instances(query, token.as_deref())
                })
                .await?;
            out.extend(page.items);
            match page.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(out),
            }
        }
    }

    fn run_spec(&self, req: &LaunchRequest) -> Result<RunSpec, CloudError> {
        let subnet_id = pick_subnet(&req.zone, req.public_ip, &self.config)?.to_string();
        let user_data = user_data::user_data_for(req, &self.config)?;
        let mut tags = desired_instance_tags(
            &self.config.cluster_name,
            &req.namespace,
            &req.name,
            &req.uid,
            req.node_generation,
        );
        if let Some(id) = &req.cluster_id {
            tags.insert(super::TAG_CLUSTER_ID.to_string(), id.clone());
        }
        // Checked at start-up never to name one of the operator's keys; still, ours win.
        for (k, v) in &self.config.node_tags {
            tags.entry(k.clone()).or_insert_with(|| v.clone());
        }
        Ok(RunSpec {
            image: req.image.clone(),
            instance_type: req.instance_type.clone(),
            zone: req.zone.clone(),
            subnet_id,
            security_group_ids: self.config.security_group_ids.clone(),
            instance_profile: self.config.instance_profile.clone(),
            user_data_base64: base64::engine::general_purpose::STANDARD.encode(user_data),
            tags,
            client_token: client_token(&req.uid, req.node_generation),
            block_devices: Vec::new(),
            kms_key_id: self.config.volumes.kms_key_id.clone(),
            public_ip: req.public_ip,
            dry_run: false,
        })
    }
}

/// Of the instances tagged for one uid+generation, the one that stands for it: a live one if
/// any (the oldest, so the answer is stable), else the most recently launched gone one.
fn pick_existing(mut found: Vec<Instance>) -> Option<Instance> {
    found.sort_by(|a, b| a.launched_at.cmp(&b.launched_at).then(a.id.cmp(&b.id)));
    let live = found.iter().position(|i| !i.state.is_gone());
    match live {
        Some(idx) => Some(found.swap_remove(idx)),
        None => found.pop(),
    }
}

impl<A: Ec2Api + 'static> Ec2NodeProvider<A> {
    /// The launch allow-list, before any RunInstances of `req` (its fallback types included):
    /// a refusal names the rule and launches nothing. `image` holds the launch's one
    /// DescribeImages answer, asked only if an owner rule needs it.
    async fn check_allowed(
        &self,
        req: &LaunchRequest,
        image: &ImageCell,
    ) -> Result<(), CloudError> {
        let list = &self.config.allow_list;
        let refused = |message: String| CloudError::Permanent {
            operation: "RunInstances".to_string(),
            code: LAUNCH_NOT_ALLOWED.to_string(),
            message,
        };
        let types = std::iter::once(&req.instance_type).chain(&req.fallback_instance_types);
        if let Some(why) = types.filter_map(|t| list.refuse_instance_type(t)).next() {
            return Err(refused(why));
        }
        match list.image(&req.image) {
            ImageVerdict::Allowed => Ok(()),
            ImageVerdict::Refused(why) => Err(refused(why)),
            ImageVerdict::AskOwner => {
                let facts = self.image_facts(image, &req.image).await?;
                match list.image_owned(&req.image, facts) {
                    None => Ok(()),
                    Some(why) => Err(refused(why)),
                }
            }
        }
    }

    /// What DescribeImages says of `image`, asked at most once per `cell`.
    async fn image_facts<'c>(
        &self,
        cell: &'c ImageCell,
        image: &str,
    ) -> Result<Option<&'c ImageFacts>, CloudError> {
        let facts = cell
            .get_or_try_init(|| async {
                self.calls
                    .call("DescribeImages", NotFound::Return, || {
                        self.api.describe_image(image)
                    })
                    .await
                    .map_err(|e| CloudError::from_api("DescribeImages", e))
            })
            .await?;
        Ok(facts.as_ref())
    }

    /// Proof, read live from EC2, that instance `id` is the one of the QuestDB `owner` in this
    /// cluster before it is stopped or terminated. The ids come from status records, which
    /// anyone allowed to write `questdbs/status` can forge, and the IAM policy can only require
    /// that a uid tag exists, not whose it is. An instance EC2 does not know passes: the call
    /// that follows treats it as gone (or waits for one launched moments ago).
    async fn check_owner(&self, action: &str, id: &str, owner: &str) -> Result<(), CloudError> {
        let Some(instance) = self.look_up(id).await? else {
            return Ok(());
        };
        let tag = |k: &str| instance.tags.get(k).map(String::as_str);
        if tag(TAG_CLUSTER) == Some(self.config.cluster_name.as_str())
            && tag(TAG_UID) == Some(owner)
        {
            return Ok(());
        }
        Err(CloudError::Permanent {
            operation: action.to_string(),
            code: INSTANCE_NOT_OWNED.to_string(),
            message: format!(
                "instance {id} is not this QuestDB's (its tags say cluster {}, uid {}; this QuestDB is {owner}): nothing done to it",
                tag(TAG_CLUSTER).unwrap_or("none"),
                tag(TAG_UID).unwrap_or("none"),
            ),
        })
    }
}

#[async_trait]
impl<A: Ec2Api + 'static> NodeProvider for Ec2NodeProvider<A> {
    async fn launch(&self, req: &LaunchRequest) -> Result<Instance, CloudError> {
        // Validate the request against our configuration before spending any API call.
        let spec = self.run_spec(req)?;
        // Tags first: finds the instance of an earlier, interrupted launch even after EC2 has
        // forgotten the ClientToken. The ClientToken then covers the opposite window (launched
        // but not yet visible to DescribeInstances).
        let query = InstanceQuery::Tags(identity_tags(
            &self.config.cluster_name,
            &req.uid,
            req.node_generation,
        ));
        let existing = self
            .describe_all(&query, NotFound::Return)
            .await
            .map_err(|e| CloudError::from_api("DescribeInstances", e))?;
        // A gone instance of this generation is returned as is (EC2 would do the same for the
        // reused ClientToken): the caller must bump node_generation to get a new node.
        if let Some(instance) = pick_existing(existing) {
            return Ok(instance);
        }
        // One DescribeImages per launch, shared by the owner rule and the volumes.
        let image = ImageCell::new();
        self.check_allowed(req, &image).await?;
        let mut spec = spec;
        spec.block_devices = super::block_devices(
            &self.config.volumes,
            self.image_facts(&image, &req.image).await?,
        );
        tracing::info!(
            namespace = %req.namespace,
            name = %req.name,
            node_generation = req.node_generation,
            image = %req.image,
            instance_type = %req.instance_type,
            zone = %req.zone,
            "launching dedicated instance"
        );
        let mut short = Vec::new();
        let types = std::iter::once(req.instance_type.clone())
            .chain(req.fallback_instance_types.iter().cloned());
        for (i, kind) in types.enumerate() {
            if i > 0 {
                // Same zone (the volume is zonal), same tags: only the type and its token change.
                spec.client_token = fallback_client_token(&req.uid, req.node_generation, &kind);
                spec.instance_type = kind.clone();
                tracing::info!(namespace = %req.namespace, name = %req.name, instance_type = %kind, "no capacity for the earlier instance type(s); trying a fallback");
            }
            match self
                .calls
                .call("RunInstances", NotFound::Return, || {
                    self.api.run_instance(&spec)
                })
                .await
            {
                Ok(instance) => {
                    self.remember_launch(&instance.id);
                    return Ok(instance);
                }
                Err(e) if e.code == NO_CAPACITY => short.push((kind, e)),
                Err(e) => return Err(CloudError::from_api("RunInstances", e)),
            }
        }
        let tried: Vec<String> = short.iter().map(|(k, _)| k.clone()).collect();
        let mut last = short
            .pop()
            .map(|(_, e)| e)
            .unwrap_or_else(|| ApiError::new(NO_CAPACITY, ""));
        last.message = format!(
            "no capacity in {} for {}{}: {}",
            req.zone,
            tried.join(", "),
            if req.fallback_instance_types.is_empty() {
                " (spec.node.fallbackInstanceTypes may name alternatives)"
            } else {
                ""
            },
            last.message
        );
        Err(CloudError::from_api("RunInstances", last))
    }

    async fn describe_cluster(&self) -> Result<Vec<Instance>, CloudError> {
        let query = InstanceQuery::Tags(
            [(TAG_CLUSTER.to_string(), self.config.cluster_name.clone())].into(),
        );
        self.describe_all(&query, NotFound::Return)
            .await
            .map_err(|e| CloudError::from_api("DescribeInstances", e))
    }

    async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>, CloudError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(IDS_PER_CALL) {
            // A filter, not InstanceIds: one unknown id (terminated over an hour ago) must not
            // fail the whole batch.
            let lenient = InstanceQuery::IdFilter(chunk.to_vec());
            let found = self
                .describe_all(&lenient, NotFound::Return)
                .await
                .map_err(|e| CloudError::from_api("DescribeInstances", e))?;
            let missing: Vec<String> = chunk
                .iter()
                .filter(|id| !found.iter().any(|i| &i.id == *id))
                .filter(|id| self.launched_recently(id))
                .cloned()
                .collect();
            out.extend(found);
            if missing.is_empty() {
                continue;
            }
            // Launched moments ago and not visible yet: ask by id, which says
            // InvalidInstanceID.NotFound until EC2 catches up, and wait for it (bounded). One
            // id per call, so one that never shows up cannot hide the others.
            for id in missing {
                let strict = InstanceQuery::Ids(vec![id]);
                match self.describe_all(&strict, NotFound::Retry).await {
                    Ok(found) => out.extend(found),
                    Err(e) if e.code == "InvalidInstanceID.NotFound" => {}
                    Err(e) => return Err(CloudError::from_api("DescribeInstances", e)),
                }
            }
        }
        Ok(out)
    }

    async fn look_up(&self, id: &str) -> Result<Option<Instance>, CloudError> {
        let recent = self.launched_recently(id);
        let not_found = if recent {
            NotFound::Retry
        } else {
            NotFound::Return
        };
        let strict = InstanceQuery::Ids(vec![id.to_string()]);
        match self.describe_all(&strict, not_found).await {
            Ok(found) => match found.into_iter().find(|i| i.id == id) {
                Some(instance) => Ok(Some(instance)),
                None => Err(CloudError::Transient {
                    operation: "DescribeInstances".into(),
                    code: "InstanceMissingFromAnswer".into(),
                    message: format!("EC2 answered a query for {id} without it"),
                }),
            },
            Err(e) if e.code == "InvalidInstanceID.NotFound" && !recent => Ok(None),
            Err(e) if e.code == "InvalidInstanceID.NotFound" => Err(CloudError::Transient {
                operation: "DescribeInstances".into(),
                code: e.code,
                message: format!("instance {id}, launched moments ago, is not visible yet"),
            }),
            Err(e) => Err(CloudError::from_api("DescribeInstances", e)),
        }
    }

    async fn terminate(&self, id: &str, owner: &str) -> Result<(), CloudError> {
        self.check_owner("TerminateInstances", id, owner).await?;
        let ids = [id.to_string()];
        // "Not found" right after our own launch means "not visible yet", not "gone": keep
        // asking, or the instance would be leaked while we report success.
        let recent = self.launched_recently(id);
        let not_found = if recent {
            NotFound::Retry
        } else {
            NotFound::Return
        };
        match self
            .calls
            .call("TerminateInstances", not_found, || {
                self.api.terminate_instances(&ids)
            })
            .await
        {
            Ok(()) => Ok(()),
            // Never existed or long gone: nothing left to terminate.
            Err(e) if e.code == "InvalidInstanceID.NotFound" && !recent => Ok(()),
            Err(e) => Err(CloudError::from_api("TerminateInstances", e)),
        }
    }

    async fn check_network(&self) -> Result<(), CloudError> {
        if self.config.subnets_by_zone.is_empty() {
            return Err(CloudError::Config(
                "--aws-subnets maps no zone to a subnet: no node could be launched".into(),
            ));
        }
        let sets = [
            ("--aws-subnets", &self.config.subnets_by_zone),
            ("--aws-public-subnets", &self.config.public_subnets_by_zone),
        ];
        let ids: Vec<String> = sets
            .iter()
            .flat_map(|(_, set)| set.values().cloned())
            .collect();
        let found = self
            .calls
            .call("DescribeSubnets", NotFound::Return, || {
                self.api.describe_subnets(&ids)
            })
            .await
            .map_err(|e| CloudError::from_api("DescribeSubnets", e))?;
        let mut wrong = Vec::new();
        for (flag, set) in sets {
            let mistakes: Vec<String> = set
                .iter()
                .filter_map(
                    |(zone, subnet)| match found.iter().find(|s| &s.id == subnet) {
                        Some(s) if &s.zone == zone => None,
                        Some(s) => Some(format!("{subnet} is in {}, not {zone}", s.zone)),
                        None => Some(format!("{subnet} does not exist")),
                    },
                )
                .collect();
            if !mistakes.is_empty() {
                wrong.push(format!("{flag}: {}", mistakes.join("; ")));
            }
        }
        let vpcs: BTreeSet<&str> = found.iter().map(|s| s.vpc_id.as_str()).collect();
        if vpcs.len() > 1 {
            wrong.push(format!(
                "--aws-subnets and --aws-public-subnets span several VPCs ({}): the nodes' security groups belong to one",
                vpcs.into_iter().collect::<Vec<_>>().join(", ")
            ));
        } else if let Some(vpc) = vpcs.first() {
            let groups = &self.config.security_group_ids;
            if !groups.is_empty() {
                let found = self
                    .calls
                    .call("DescribeSecurityGroups", NotFound::Return, || {
                        self.api.security_group_vpcs(groups)
                    })
                    .await
                    .map_err(|e| {
                        CloudError::Config(format!(
                            "--aws-security-group-ids: {}",
                            CloudError::from_api("DescribeSecurityGroups", e)
                        ))
                    })?;
                let mistakes: Vec<String> = groups
                    .iter()
                    .filter_map(|g| match found.iter().find(|(id, _)| id == g) {
                        Some((_, v)) if v == vpc => None,
                        Some((_, v)) => Some(format!("{g} is in {v}, not the subnets' {vpc}")),
                        None => Some(format!("{g} does not exist")),
                    })
                    .collect();
                if !mistakes.is_empty() {
                    wrong.push(format!("--aws-security-group-ids: {}", mistakes.join("; ")));
                }
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(CloudError::Config(wrong.join("; ")))
        }
    }

    async fn instance_type_facts(
        &self,
        instance_type: &str,
        zone: &str,
    ) -> Result<Option<InstanceTypeFacts>, CloudError> {
        self.calls
            .call("DescribeInstanceTypes", NotFound::Return, || {
                self.api.describe_instance_type(instance_type, zone)
            })
            .await
            .map_err(|e| CloudError::from_api("DescribeInstanceTypes", e))
    }

    fn zones(&self) -> Vec<String> {
        self.config.subnets_by_zone.keys().cloned().collect()
    }

    fn allowed_instance_types(&self) -> Vec<String> {
        self.config.allow_list.instance_types.clone()
    }

    async fn check_launch(&self, req: &LaunchRequest) -> Result<(), CloudError> {
        let mut spec = self.run_spec(req)?;
        let image = ImageCell::new();
        match self.check_allowed(req, &image).await {
            Err(CloudError::Permanent { code, .. }) if code == LAUNCH_NOT_ALLOWED => return Ok(()),
            other => other?,
        }
        spec.block_devices = super::block_devices(
            &self.config.volumes,
            self.image_facts(&image, &req.image).await?,
        );
        spec.dry_run = true;
        // A dry run never uses the launch's ClientToken: EC2 would tie the token to this
        // request's answer.
        spec.client_token = format!("dry-run-{}", spec.client_token);
        let answer = self
            .calls
            .call(
                super::backend::DRY_RUN_OPERATION,
                NotFound::Return,
                || async {
                    match self.api.run_instance(&spec).await {
                        Err(e) if e.code == super::backend::DRY_RUN_PASSED => Ok(None),
                        Err(e) => Err(e),
                        Ok(instance) => Ok(Some(instance)),
                    }
                },
            )
            .await
            .map_err(|e| CloudError::from_api(super::backend::DRY_RUN_OPERATION, e))?;
        if let Some(instance) = answer {
            // Never seen: EC2 does not launch with DryRun. Remembered so it is found, and left
            // to the orphan sweep (its uid tag names no QuestDB).
            tracing::error!(instance = %instance.id, "a dry-run RunInstances launched an instance");
            self.remember_launch(&instance.id);
        }
        Ok(())
    }

    async fn node_facts(
        &self,
        image: &str,
        instance_type: &str,
        zone: &str,
    ) -> Result<NodeFacts, CloudError> {
        let image = self
            .calls
            .call("DescribeImages", NotFound::Return, || {
                self.api.describe_image(image)
            })
            .await
            .map_err(|e| CloudError::from_api("DescribeImages", e))?;
        let instance_type = self.instance_type_facts(instance_type, zone).await?;
        Ok(NodeFacts {
            image,
            instance_type,
        })
    }

    async fn scheduled_events(&self) -> Result<Vec<crate::cloud::ScheduledEvent>, CloudError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .calls
                .call("DescribeInstanceStatus", NotFound::Return, || {
                    self.api.describe_instance_events(token.as_deref())
                })
                .await
                .map_err(|e| CloudError::from_api("DescribeInstanceStatus", e))?;
            out.extend(page.items.into_iter().filter(|e| e.pending()));
            match page.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(out),
            }
        }
    }

    async fn stop(&self, id: &str, owner: &str, mode: StopMode) -> Result<(), CloudError> {
        self.check_owner("StopInstances", id, owner).await?;
        let ids = [id.to_string()];
        let force = mode == StopMode::Forced;
        match self
            .calls
            .call("StopInstances", NotFound::Return, || {
                self.api.stop_instances(&ids, force)
            })
            .await
        {
            Ok(()) => Ok(()),
            // Gone is as fenced as stopped.
            Err(e) if e.code == "InvalidInstanceID.NotFound" => Ok(()),
            // EC2 refuses to stop an instance that is already terminating.
            Err(e) if e.code == "IncorrectInstanceState" => Ok(()),
            Err(e) => Err(CloudError::from_api("StopInstances", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::InstanceState;
    use std::time::{Duration, SystemTime};

    fn inst(id: &str, state: InstanceState, launched_secs: u64) -> Instance {
        Instance {
            id: id.into(),
            state,
            zone: "z".into(),
            image: "ami-1".into(),
            instance_type: "t3.micro".into(),
            private_ip: None,
            public_ip: None,
            tags: Default::default(),
            launched_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(launched_secs)),
            state_reason: None,
            private_dns_name: None,
            pod_addresses: Default::default(),
        }
    }

    #[test]
    fn a_live_instance_wins_over_gone_ones() {
        let picked = pick_existing(vec![
            inst("i-1", InstanceState::Terminated, 1),
            inst("i-2", InstanceState::Pending, 2),
            inst("i-3", InstanceState::ShuttingDown, 3),
        ]);
        assert_eq!(picked.unwrap().id, "i-2");
    }

    #[test]
    fn without_live_instances_the_latest_gone_one_is_reported() {
        let picked = pick_existing(vec![
            inst("i-3", InstanceState::Terminated, 3),
            inst("i-1", InstanceState::Terminated, 1),
        ]);
        assert_eq!(picked.unwrap().id, "i-3");
        assert_eq!(pick_existing(vec![]), None);
    }
}
