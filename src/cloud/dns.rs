//! The DNS provider on top of any [`Route53Api`]: read before write, so steady state costs one
//! read and no change, and deletes carry the exact current record as Route53 requires.

use std::sync::Arc;

use async_trait::async_trait;

use super::backend::{ChangeAction, RecordSet, Route53Api};
use super::rate_limit::TokenBucket;
use super::retry::{CallRunner, NotFound};
use super::{
    display_name, fqdn, ARecord, CloudConfig, CloudError, DnsOwner, DnsProvider, SharedObserver,
};

/// [`DnsProvider`] for one hosted zone of any Route53 backend.
pub struct Route53DnsProvider<A> {
    api: Arc<A>,
    zone_id: String,
    cluster: String,
    calls: CallRunner,
}

impl<A: Route53Api> Route53DnsProvider<A> {
    /// Fails when the configuration names no hosted zone.
    pub(crate) fn new(
        api: Arc<A>,
        config: &CloudConfig,
        observer: SharedObserver,
    ) -> Result<Self, CloudError> {
        let zone_id = config
            .hosted_zone_id
            .clone()
            .filter(|z| !z.is_empty())
            .ok_or_else(|| {
                CloudError::Config("no hosted zone configured for DNS records".into())
            })?;
        let limiter = Arc::new(TokenBucket::new(&config.route53_rate_limit));
        let calls = CallRunner::new("route53", observer, limiter, config.retry.clone());
        Ok(Self {
            api,
            zone_id,
            cluster: config.cluster_name.clone(),
            calls,
        })
    }

    async fn read(&self, fqdn: &str) -> Result<Vec<RecordSet>, CloudError> {
        self.calls
            .call("ListResourceRecordSets", NotFound::Return, || {
                self.api.find(&self.zone_id, fqdn)
            })
            .await
            .map_err(|e| CloudError::from_api("ListResourceRecordSets", e))
    }

    async fn change(&self, changes: &[(ChangeAction, RecordSet)]) -> Result<(), CloudError> {
        self.calls
            .call("ChangeResourceRecordSets", NotFound::Return, || {
                self.api.change(&self.zone_id, changes)
            })
            .await
            .map_err(|e| CloudError::from_api("ChangeResourceRecordSets", e))
    }
}

/// TXT values are quoted strings in Route53.
fn quoted(value: &str) -> String {
    format!("\"{value}\"")
}

fn owned_elsewhere(name: &str, why: &str) -> CloudError {
    CloudError::Permanent {
        operation: "ChangeResourceRecordSets".into(),
        code: OWNED_ELSEWHERE.into(),
        message: format!(
            "{} {why}; the operator does not overwrite it",
            display_name(name)
        ),
    }
}

/// The error code of a name that is not this QuestDB's to write.
pub(crate) const OWNED_ELSEWHERE: &str = "RecordOwnedElsewhere";

/// What a name's record sets say about who owns it.
#[derive(Debug, PartialEq, Eq)]
enum Ownership {
    /// Nothing at this name.
    Free,
    /// Our TXT is there.
    Ours,
    /// An A record with exactly the IP this QuestDB published and no TXT: written before
    /// ownership records existed.
    OursUnmarked,
    /// Anything else: another owner's TXT, an unmarked A record we did not publish, a CNAME.
    Foreign(&'static str),
}

fn ownership(sets: &[RecordSet], owner: &DnsOwner, ours: &str) -> Ownership {
    let txt = sets.iter().find(|s| s.kind == "TXT");
    let a = sets.iter().find(|s| s.kind == "A");
    let ours = quoted(ours);
    match (txt, a) {
        (Some(t), _) if t.values.contains(&ours) => Ownership::Ours,
        (Some(t), _)
            if t.values
                .iter()
                .any(|v| v.contains("heritage=questdb-operator")) =>
        {
            Ownership::Foreign("belongs to another QuestDB")
        }
        (_, Some(a))
            if owner
                .published_ip
                .as_ref()
                .is_some_and(|ip| a.values == [ip.clone()]) =>
        {
            Ownership::OursUnmarked
        }
        (_, Some(_)) => Ownership::Foreign("is an A record this QuestDB did not write"),
        _ if sets.iter().any(|s| s.kind == "CNAME") => Ownership::Foreign("is a CNAME"),
        _ => Ownership::Free,
    }
}

#[async_trait]
impl<A: Route53Api + 'static> DnsProvider for Route53DnsProvider<A> {
    async fn upsert_a(
        &self,
        name: &str,
        ip: &str,
        ttl: i64,
        owner: &DnsOwner,
    ) -> Result<(), CloudError> {
        let name = fqdn(name);
        let sets = self.read(&name).await?;
        let wanted = RecordSet {
            name: name.clone(),
            kind: "A".into(),
            values: vec![ip.to_string()],
            ttl,
        };
        let marker = RecordSet {
            name: name.clone(),
            kind: "TXT".into(),
            values: vec![quoted(&owner.txt(&self.cluster))],
            ttl,
        };
        let current_a = sets.iter().find(|s| s.kind == "A");
        let changes = match ownership(&sets, owner, &owner.txt(&self.cluster)) {
            Ownership::Foreign(why) => return Err(owned_elsewhere(&name, why)),
            Ownership::Ours if current_a == Some(&wanted) => return Ok(()),
            Ownership::Ours => vec![(ChangeAction::Upsert, wanted)],
            // CREATE, not UPSERT, for the marker: if another writer got there between our read
            // and this batch, the whole batch fails instead of overwriting theirs.
            Ownership::OursUnmarked => vec![
                (ChangeAction::Create, marker),
                (ChangeAction::Upsert, wanted),
            ],
            Ownership::Free => vec![
                (ChangeAction::Create, marker),
                (ChangeAction::Create, wanted),
            ],
        };
        tracing::info!(record = %display_name(&name), ip, ttl, "writing DNS record");
        match self.change(&changes).await {
            Err(CloudError::Permanent { code, .. }) if code == "InvalidChangeBatch" => Err(
                owned_elsewhere(&name, "was written by someone else meanwhile"),
            ),
            other => other,
        }
    }

    async fn read_a(&self, name: &str) -> Result<Option<ARecord>, CloudError> {
        Ok(self
            .read(&fqdn(name))
            .await?
            .into_iter()
            .find(|s| s.kind == "A")
            .map(|s| ARecord {
                name: display_name(&s.name),
                ips: s.values,
                ttl: s.ttl,
            }))
    }

    async fn delete_a(&self, name: &str, owner: &DnsOwner) -> Result<(), CloudError> {
        self.remove(name, owner, false).await
    }

    async fn withdraw_a(&self, name: &str, owner: &DnsOwner) -> Result<(), CloudError> {
        self.remove(name, owner, true).await
    }

    fn zone_id(&self) -> String {
        self.zone_id.clone()
    }
}

impl<A: Route53Api> Route53DnsProvider<A> {
    /// Deletes the A record of `name` and, unless `keep_reservation`, its ownership TXT.
    async fn remove(
        &self,
        name: &str,
        owner: &DnsOwner,
        keep_reservation: bool,
    ) -> Result<(), CloudError> {
        let name = fqdn(name);
        // Twice at most: a DELETE carries the exact current values, so a record changed
        // between our read and our DELETE is read once more.
        for _ in 0..2 {
            let sets = self.read(&name).await?;
            let of = |kind: &str| sets.iter().find(|s| s.kind == kind).cloned();
            let ours = quoted(&owner.txt(&self.cluster));
            let changes: Vec<(ChangeAction, RecordSet)> = match ownership(
                &sets,
                owner,
                &owner.txt(&self.cluster),
            ) {
                Ownership::Ours | Ownership::OursUnmarked => [of("A"), of("TXT")]
                    .into_iter()
                    .flatten()
                    .filter(|s| s.kind == "A" || (!keep_reservation && s.values.contains(&ours)))
                    .map(|s| (ChangeAction::Delete, s))
                    .collect(),
                Ownership::Free => return Ok(()),
                Ownership::Foreign(why) => {
                    tracing::warn!(record = %display_name(&name), "not deleting a DNS record that {why}");
                    return Ok(());
                }
            };
            if changes.is_empty() {
                return Ok(());
            }
            match self.change(&changes).await {
                Ok(()) => {
                    tracing::info!(record = %display_name(&name), "deleted DNS record");
                    return Ok(());
                }
                Err(CloudError::Permanent { code, .. }) if code == "InvalidChangeBatch" => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CloudError::Transient {
            operation: "ChangeResourceRecordSets".into(),
            code: "InvalidChangeBatch".into(),
            message: format!("{} kept changing while being deleted", display_name(&name)),
        })
    }
}
