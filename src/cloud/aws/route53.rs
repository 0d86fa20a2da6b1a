//! [`Route53Api`] over `aws-sdk-route53`.

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_route53::types::{Change, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType};
use aws_sdk_route53::Client;

use super::api_error;
use crate::cloud::backend::{ChangeAction, RecordSet, Route53Api};
use crate::cloud::{fqdn, ApiError};

/// The Route53 client.
#[derive(Clone, Debug)]
pub struct AwsRoute53 {
    client: Client,
}

impl AwsRoute53 {
    pub(crate) fn new(sdk: &SdkConfig) -> Self {
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
    async fn find(&self, zone_id: &str, name: &str) -> Result<Vec<RecordSet>, ApiError> {
        let wanted = fqdn(name);
        // Record sets are listed in (name, type) order starting at the given name; a name has
        // a handful of types at most, so one short page holds all of them.
        let out = self
            .client
            .list_resource_record_sets()
            .hosted_zone_id(zone_id)
            .start_record_name(&wanted)
            .max_items(16)
            .send()
            .await
            .map_err(api_error)?;
        Ok(out
            .resource_record_sets()
            .iter()
            .filter(|set| fqdn(set.name()) == wanted)
            .map(|set| RecordSet {
                name: wanted.clone(),
                kind: set.r#type().as_str().to_string(),
                values: set
                    .resource_records()
                    .iter()
                    .map(|r| r.value().to_string())
                    .collect(),
                ttl: set.ttl().unwrap_or_default(),
            })
            .collect())
    }

    async fn change(
        &self,
        zone_id: &str,
        changes: &[(ChangeAction, RecordSet)],
    ) -> Result<(), ApiError> {
        let mut batch = ChangeBatch::builder();
        for (action, record) in changes {
            let records = record
                .values
                .iter()
                .map(|v| ResourceRecord::builder().value(v).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(build_error)?;
            let set = ResourceRecordSet::builder()
                .name(fqdn(&record.name))
                .r#type(RrType::from(record.kind.as_str()))
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
            batch = batch.changes(change);
        }
        self.client
            .change_resource_record_sets()
            .hosted_zone_id(zone_id)
            .change_batch(batch.build().map_err(build_error)?)
            .send()
            .await
            .map_err(api_error)?;
        Ok(())
    }
}
