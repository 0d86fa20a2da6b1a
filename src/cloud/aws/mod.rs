//! The AWS backend: EC2 and Route53 through the official SDK (and EKS, once, for what the
//! flags left out: [`discover`]).
//!
//! Credentials and region come from aws-config's standard chain (env, profile, web identity /
//! IRSA, instance metadata); `CloudConfig::region` wins over the chain's region and
//! `CloudConfig::endpoint_url` points both clients elsewhere (moto, the sandbox).

mod ec2;
mod eks;
mod route53;

use std::sync::Arc;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, Region, SdkConfig};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

pub(crate) use ec2::AwsEc2;
pub use eks::{discover, AwsEks};
pub(crate) use route53::AwsRoute53;

use super::{
    ApiError, CloudConfig, CloudError, Ec2NodeProvider, Route53DnsProvider, SharedObserver,
};

/// aws-config's loader set up from `config`. The SDK's own retries are off: the policy layer
/// retries, so that every attempt is rate limited and counted, and permanent errors are not
/// retried at all.
pub fn sdk_config_loader(config: &CloudConfig) -> ConfigLoader {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .retry_config(RetryConfig::disabled())
        // The policy layer bounds each attempt and the whole call; connecting is bounded here so
        // an unreachable endpoint fails fast as a transient error.
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(std::time::Duration::from_secs(3))
                .operation_attempt_timeout(config.retry.attempt_timeout)
                .build(),
        );
    if let Some(url) = &config.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    loader
}

/// Both providers on the AWS backend.
pub struct AwsCloud {
    pub nodes: Arc<Ec2NodeProvider<AwsEc2>>,
    /// `None` when the configuration names no hosted zone (DNS records are then unsupported).
    pub dns: Option<Arc<Route53DnsProvider<AwsRoute53>>>,
}

impl AwsCloud {
    /// Build both providers from a loaded SDK configuration ([`sdk_config_loader`]; tests pass
    /// one with dummy credentials) and a configuration already completed by [`discover`].
    pub fn from_sdk_config(
        sdk: &SdkConfig,
        config: CloudConfig,
        observer: SharedObserver,
    ) -> Result<Self, CloudError> {
        let dns = match config.hosted_zone_id.as_deref() {
            Some(zone) if !zone.is_empty() => Some(Arc::new(Route53DnsProvider::new(
                Arc::new(AwsRoute53::new(sdk)),
                &config,
                observer.clone(),
            )?)),
            _ => None,
        };
        let nodes = Arc::new(Ec2NodeProvider::new(
            Arc::new(AwsEc2::new(sdk)),
            config,
            observer,
        ));
        Ok(Self { nodes, dns })
    }
}

/// Reduce an SDK error to code + message. Failures without a service answer (timeouts,
/// connection errors) get a synthetic code so they classify as transient.
fn api_error<E, R>(err: SdkError<E, R>) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let synthetic = match &err {
        SdkError::ConstructionFailure(_) => Some("ConstructionFailure"),
        SdkError::TimeoutError(_) => Some("Timeout"),
        SdkError::DispatchFailure(_) => Some("Dispatch"),
        SdkError::ResponseError(_) => Some("ResponseError"),
        _ => None,
    };
    let code = err
        .code()
        .map(str::to_string)
        .or(synthetic.map(str::to_string))
        .unwrap_or_else(|| "Unknown".to_string());
    let message = err
        .message()
        .map(str::to_string)
        .unwrap_or_else(|| DisplayErrorContext(&err).to_string());
    ApiError { code, message }
}
