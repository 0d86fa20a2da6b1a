//! [`Route53Api`] over `aws-sdk-route53`.

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_route53::types::{Change, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType};
use aws_sdk_route53::Client;

use super::api_error;
use crate::cloud::backend::{ChangeAction, Route53Api};
use crate::cloud::{fqdn, ARecord, ApiError};

/// The Route53 client.
#[derive(Clone, Debug)]
pub struct AwsRoute53 {
    client: Client,
}

impl AwsRoute53 {
    pub fn new(sdk: &SdkConfig) -> Self {
        Self {
            client: Client::new(sdk),
        }
    }
}

fn build_error(e: impl std::fmt::Display) -> ApiError {
    // Only reachable if a required builder field is missing: a bug here, not in AWS.
    ApiError::new(
        "InvalidInput",
        format!("could not build Route53 request: {e}"),
    )
}

#[async_trait]
impl Route53Api for AwsRoute53 {
    async fn find_a(&self, zone_id: &str, name: &str) -> Result<Option<ARecord>, ApiError> {
        let wanted = fqdn(name);
        // Record sets are listed in (name, type) order starting at the given pair, so the
        // first one is ours if it exists at all.
        let out = self
            .client
            .list_resource_record_sets()
            .hosted_zone_id(zone_id)
            .start_record_name(&wanted)
            .start_record_type(RrType::A)
            .max_items(1)
            .send()
            .await
            .map_err(api_error)?;
        Ok(out
            .resource_record_sets()
            .iter()
            .find(|set| fqdn(set.name()) == wanted && *set.r#type() == RrType::A)
            .map(|set| ARecord {
                name: wanted.clone(),
                ips: set
                    .resource_records()
                    .iter()
                    .map(|r| r.value().to_string())
                    .collect(),
                ttl: set.ttl().unwrap_or_default(),
            }))
    }

    async fn change_a(
        &self,
        zone_id: &str,
        action: ChangeAction,
        record: &ARecord,
    ) -> Result<(), ApiError> {
        let records = record
            .ips
            .iter()
            .map(|ip| ResourceRecord::builder().value(ip).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(build_error)?;
        let set = ResourceRecordSet::builder()
            .name(fqdn(&record.name))
            .r#type(RrType::A)
            .ttl(record.ttl)
            .set_resource_records(Some(records))
            .build()
            .map_err(build_error)?;
        let action = match action {
            ChangeAction::Create => aws_sdk_route53::types::ChangeAction::Create,
            ChangeAction::Upsert => aws_sdk_route53::types::ChangeAction::Upsert,
            ChangeAction::Delete => aws_sdk_route53::types::ChangeAction::Delete,
        };
        let change = Change::builder()
            .action(action)
            .resource_record_set(set)
            .build()
            .map_err(build_error)?;
        let batch = ChangeBatch::builder()
            .changes(change)
            .build()
            .map_err(build_error)?;
        self.client
            .change_resource_record_sets()
            .hosted_zone_id(zone_id)
            .change_batch(batch)
            .send()
            .await
            .map_err(api_error)?;
        Ok(())
    }
}
