//! The DNS provider on top of any [`Route53Api`]: read before write, so steady state costs one
//! read and no change, and deletes carry the exact current record as Route53 requires.

use std::sync::Arc;

use async_trait::async_trait;

use super::backend::{ChangeAction, Route53Api};
use super::rate_limit::TokenBucket;
use super::retry::{CallRunner, NotFound};
use super::{display_name, fqdn, ARecord, CloudConfig, CloudError, DnsProvider, SharedObserver};

/// [`DnsProvider`] for one hosted zone of any Route53 backend.
pub struct Route53DnsProvider<A> {
    api: Arc<A>,
    zone_id: String,
    calls: CallRunner,
}

impl<A: Route53Api> Route53DnsProvider<A> {
    /// Fails when the configuration names no hosted zone.
    pub fn new(
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
        let limiter = Arc::new(TokenBucket::new(&config.rate_limit));
        let calls = CallRunner::new("route53", observer, limiter, config.retry.clone());
        Ok(Self {
            api,
            zone_id,
            calls,
        })
    }

    pub fn api(&self) -> &Arc<A> {
        &self.api
    }

    async fn read(&self, fqdn: &str) -> Result<Option<ARecord>, CloudError> {
        self.calls
            .call("ListResourceRecordSets", NotFound::Return, || {
                self.api.find_a(&self.zone_id, fqdn)
            })
            .await
            .map_err(|e| CloudError::from_api("ListResourceRecordSets", e))
    }

    async fn change(&self, action: ChangeAction, record: &ARecord) -> Result<(), CloudError> {
        self.calls
            .call("ChangeResourceRecordSets", NotFound::Return, || {
                self.api.change_a(&self.zone_id, action, record)
            })
            .await
            .map_err(|e| CloudError::from_api("ChangeResourceRecordSets", e))
    }
}

#[async_trait]
impl<A: Route53Api + 'static> DnsProvider for Route53DnsProvider<A> {
    async fn upsert_a(&self, name: &str, ip: &str, ttl: i64) -> Result<(), CloudError> {
        let name = fqdn(name);
        let wanted = ARecord {
            name: name.clone(),
            ips: vec![ip.to_string()],
            ttl,
        };
        if let Some(current) = self.read(&name).await? {
            if current.ips == wanted.ips && current.ttl == ttl {
                return Ok(());
            }
        }
        tracing::info!(record = %display_name(&name), ip, ttl, "upserting DNS record");
        self.change(ChangeAction::Upsert, &wanted).await
    }

    async fn read_a(&self, name: &str) -> Result<Option<ARecord>, CloudError> {
        Ok(self.read(&fqdn(name)).await?.map(|mut r| {
            r.name = display_name(&r.name);
            r
        }))
    }

    async fn delete_a(&self, name: &str) -> Result<(), CloudError> {
        let name = fqdn(name);
        let Some(current) = self.read(&name).await? else {
            return Ok(());
        };
        match self.change(ChangeAction::Delete, &current).await {
            Ok(()) => {}
            // Changed or removed between our read and our DELETE (Route53 rejects a DELETE
            // whose values are not the current ones): look once more.
            Err(CloudError::Permanent { code, .. }) if code == "InvalidChangeBatch" => {
                if let Some(changed) = self.read(&name).await? {
                    self.change(ChangeAction::Delete, &changed).await?;
                }
            }
            Err(e) => return Err(e),
        }
        tracing::info!(record = %display_name(&name), "deleted DNS record");
        Ok(())
    }
}
