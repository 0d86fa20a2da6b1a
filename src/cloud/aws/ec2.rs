//! [`Ec2Api`] over `aws-sdk-ec2`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, HttpTokensState, IamInstanceProfileSpecification,
    InstanceMetadataEndpointState, InstanceMetadataOptionsRequest,
    InstanceNetworkInterfaceSpecification, InstanceType, Placement, ResourceType, Tag,
    TagSpecification, VolumeType,
};
use aws_sdk_ec2::Client;

use super::api_error;
use crate::cloud::backend::{Ec2Api, InstanceQuery, Page, RunSpec};
use crate::cloud::{ApiError, Instance, InstanceState, PodAddresses};

/// The EC2 client.
#[derive(Clone, Debug)]
pub struct AwsEc2 {
    client: Client,
}

impl AwsEc2 {
    pub(crate) fn new(sdk: &SdkConfig) -> Self {
        Self {
            client: Client::new(sdk),
        }
    }
}

fn tag_spec(resource: ResourceType, tags: &BTreeMap<String, String>) -> TagSpecification {
    let tags = tags
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect();
    TagSpecification::builder()
        .resource_type(resource)
        .set_tags(Some(tags))
        .build()
}

/// Encrypted gp3, whatever the account's EBS defaults say.
fn node_volume(device: &crate::cloud::BlockDevice, kms_key_id: Option<&str>) -> BlockDeviceMapping {
    let ebs = EbsBlockDevice::builder()
        .volume_type(VolumeType::Gp3)
        .set_volume_size(device.size_gib)
        .encrypted(true)
        .delete_on_termination(true)
        .set_kms_key_id(kms_key_id.map(str::to_string))
        .build();
    BlockDeviceMapping::builder()
        .device_name(&device.device_name)
        .ebs(ebs)
        .build()
}

fn filter(name: impl Into<String>, values: Vec<String>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values))
        .build()
}

/// Our view of an SDK instance; `None` for a record without an id (never seen in practice).
fn convert(i: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
    let state = i
        .state()
        .and_then(|s| s.name())
        .and_then(|n| InstanceState::parse(n.as_str()))
        // An unknown future state is safest treated as "still coming up".
        .unwrap_or(InstanceState::Pending);
    Some(Instance {
        id: i.instance_id()?.to_string(),
        state,
        zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        image: i.image_id().unwrap_or_default().to_string(),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        private_ip: i.private_ip_address().map(str::to_string),
        private_dns_name: i
            .private_dns_name()
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        public_ip: i.public_ip_address().map(str::to_string),
        pod_addresses: PodAddresses {
            secondary_ips: i
                .network_interfaces()
                .iter()
                .flat_map(|n| n.private_ip_addresses())
                .filter(|a| a.primary() != Some(true))
                .filter_map(|a| a.private_ip_address().map(str::to_string))
                .collect(),
            prefixes: i
                .network_interfaces()
                .iter()
                .flat_map(|n| n.ipv4_prefixes())
                .filter_map(|p| p.ipv4_prefix().map(str::to_string))
                .collect(),
        },
        tags: i
            .tags()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_string(),
                    t.value().unwrap_or_default().to_string(),
                ))
            })
            .collect(),
        launched_at: i.launch_time().and_then(|t| SystemTime::try_from(*t).ok()),
        state_reason: i
            .state_reason()
            .and_then(|r| r.message())
            .map(str::to_string),
    })
}

#[async_trait]
impl Ec2Api for AwsEc2 {
    async fn run_instance(&self, spec: &RunSpec) -> Result<Instance, ApiError> {
        let mut req = self
            .client
            .run_instances()
            .image_id(&spec.image)
            .instance_type(InstanceType::from(spec.instance_type.as_str()))
            .min_count(1)
            .max_count(1)
            .user_data(&spec.user_data_base64)
            .client_token(&spec.client_token)
            .set_dry_run(spec.dry_run.then_some(true))
            .tag_specifications(tag_spec(ResourceType::Instance, &spec.tags))
            .tag_specifications(tag_spec(ResourceType::Volume, &spec.tags))
            .tag_specifications(tag_spec(ResourceType::NetworkInterface, &spec.tags))
            // The subnet map decides the zone too; naming it makes a wrong map an error
            // instead of a node in another zone than its volume.
            .placement(Placement::builder().availability_zone(&spec.zone).build())
            // IMDSv2 only, one hop: the token's response dies at the node's network namespace,
            // so the database pod cannot read the node role's credentials
            // (docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-existing-instances.html).
            .metadata_options(
                InstanceMetadataOptionsRequest::builder()
                    .http_endpoint(InstanceMetadataEndpointState::Enabled)
                    .http_tokens(HttpTokensState::Required)
                    .http_put_response_hop_limit(1)
                    .build(),
            )
            .set_block_device_mappings(Some(
                spec.block_devices
                    .iter()
                    .map(|d| node_volume(d, spec.kms_key_id.as_deref()))
                    .collect(),
            ));
        if spec.public_ip {
            // A public address is an interface setting; with an interface in the request, the
            // subnet and groups go there too (EC2 refuses them at both levels).
            req = req.network_interfaces(
                InstanceNetworkInterfaceSpecification::builder()
                    .device_index(0)
                    .subnet_id(&spec.subnet_id)
                    .set_groups(Some(spec.security_group_ids.clone()))
                    .associate_public_ip_address(true)
                    .delete_on_termination(true)
                    .build(),
            );
        } else {
            req = req.subnet_id(&spec.subnet_id);
            if !spec.security_group_ids.is_empty() {
                req = req.set_security_group_ids(Some(spec.security_group_ids.clone()));
            }
        }
        if let Some(profile) = &spec.instance_profile {
            let p = IamInstanceProfileSpecification::builder();
            let p = if profile.starts_with("arn:") {
                p.arn(profile)
            } else {
                p.name(profile)
            };
            req = req.iam_instance_profile(p.build());
        }
        let out = req.send().await.map_err(api_error)?;
        out.instances()
            .iter()
            .find_map(convert)
            .ok_or_else(|| ApiError::new("EmptyResponse", "RunInstances returned no instance"))
    }

    async fn describe_instances(
        &self,
        query: &InstanceQuery,
        next_token: Option<&str>,
    ) -> Result<Page<Instance>, ApiError> {
        let mut req = self
            .client
            .describe_instances()
            .set_next_token(next_token.map(str::to_string));
        req = match query {
            InstanceQuery::Tags(tags) => tags.iter().fold(req, |r, (k, v)| {
                r.filters(filter(format!("tag:{k}"), vec![v.clone()]))
            }),
            InstanceQuery::Ids(ids) => req.set_instance_ids(Some(ids.clone())),
            InstanceQuery::IdFilter(ids) => req.filters(filter("instance-id", ids.clone())),
        };
        let out = req.send().await.map_err(api_error)?;
        let items = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(convert)
            .collect();
        Ok(Page {
            items,
            next_token: out.next_token().map(str::to_string),
        })
    }

    async fn describe_instance_events(
        &self,
        next_token: Option<&str>,
    ) -> Result<Page<crate::cloud::ScheduledEvent>, ApiError> {
        let codes = crate::cloud::SCHEDULED_EVENT_CODES
            .map(str::to_string)
            .to_vec();
        let out = self
            .client
            .describe_instance_status()
            .filters(filter("event.code", codes))
            .set_next_token(next_token.map(str::to_string))
            .send()
            .await
            .map_err(api_error)?;
        let time = |t: Option<&aws_sdk_ec2::primitives::DateTime>| {
            t.and_then(|t| SystemTime::try_from(*t).ok())
        };
        let items = out
            .instance_statuses()
            .iter()
            .flat_map(|status| {
                let id = status.instance_id().unwrap_or_default().to_string();
                status
                    .events()
                    .iter()
                    .filter_map(move |e| {
                        Some(crate::cloud::ScheduledEvent {
                            instance_id: id.clone(),
                            id: e.instance_event_id().map(str::to_string),
                            code: e.code()?.as_str().to_string(),
                            description: e.description().unwrap_or_default().to_string(),
                            not_before: time(e.not_before()),
                            not_after: time(e.not_after()),
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|e| !e.instance_id.is_empty())
            .collect();
        Ok(Page {
            items,
            next_token: out.next_token().map(str::to_string),
        })
    }

    async fn describe_subnets(
        &self,
        ids: &[String],
    ) -> Result<Vec<crate::cloud::Subnet>, ApiError> {
        Ok(self
            .subnets_by_id(ids)
            .await?
            .iter()
            .filter_map(|s| {
                Some(crate::cloud::Subnet {
                    id: s.subnet_id()?.to_string(),
                    zone: s.availability_zone()?.to_string(),
                    vpc_id: s.vpc_id()?.to_string(),
                })
            })
            .collect())
    }

    async fn security_group_vpcs(&self, ids: &[String]) -> Result<Vec<(String, String)>, ApiError> {
        let out = self
            .client
            .describe_security_groups()
            // As for subnets: a filter leaves an unknown group out instead of failing the call.
            .filters(filter("group-id", ids.to_vec()))
            .send()
            .await
            .map_err(api_error)?;
        Ok(out
            .security_groups()
            .iter()
            .filter_map(|g| Some((g.group_id()?.to_string(), g.vpc_id()?.to_string())))
            .collect())
    }

    async fn describe_image(&self, id: &str) -> Result<Option<crate::cloud::ImageFacts>, ApiError> {
        let out = self
            .client
            .describe_images()
            .filters(filter("image-id", vec![id.to_string()]))
            .send()
            .await
            .map_err(api_error)?;
        Ok(out.images().iter().find_map(|i| {
            Some(crate::cloud::ImageFacts {
                id: i.image_id()?.to_string(),
                state: i.state()?.as_str().to_string(),
                architecture: i.architecture()?.as_str().to_string(),
                root_device_type: i.root_device_type()?.as_str().to_string(),
                root_device_name: i.root_device_name().map(str::to_string),
                ebs_devices: i
                    .block_device_mappings()
                    .iter()
                    .filter_map(|m| {
                        let ebs = m.ebs()?;
                        Some(crate::cloud::ImageDevice {
                            device_name: m.device_name()?.to_string(),
                            size_gib: ebs.volume_size(),
                        })
                    })
                    .collect(),
                owner: i.owner_id().unwrap_or_default().to_string(),
                owner_alias: i.image_owner_alias().map(str::to_string),
            })
        }))
    }

    async fn describe_instance_type(
        &self,
        name: &str,
        zone: &str,
    ) -> Result<Option<crate::cloud::InstanceTypeFacts>, ApiError> {
        let types = self
            .client
            .describe_instance_types()
            .instance_types(InstanceType::from(name))
            .send()
            .await;
        let types = match types {
            Ok(t) => t,
            // EC2 names an unknown type in the request's error rather than answering empty.
            Err(e) => {
                let e = api_error(e);
                if e.code == "InvalidInstanceType" {
                    return Ok(None);
                }
                return Err(e);
            }
        };
        let Some(info) = types.instance_types().first() else {
            return Ok(None);
        };
        let architectures = info
            .processor_info()
            .map(|p| {
                p.supported_architectures()
                    .iter()
                    .map(|a| a.as_str().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let offerings = self
            .client
            .describe_instance_type_offerings()
            .location_type(aws_sdk_ec2::types::LocationType::AvailabilityZone)
            .filters(filter("location", vec![zone.to_string()]))
            .filters(filter("instance-type", vec![name.to_string()]))
            .send()
            .await
            .map_err(api_error)?;
        Ok(Some(crate::cloud::InstanceTypeFacts {
            name: name.to_string(),
            architectures,
            offered_in_zone: !offerings.instance_type_offerings().is_empty(),
        }))
    }

    async fn stop_instances(&self, ids: &[String], force: bool) -> Result<(), ApiError> {
        self.client
            .stop_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .force(force)
            .send()
            .await
            .map_err(api_error)?;
        Ok(())
    }

    async fn terminate_instances(&self, ids: &[String]) -> Result<(), ApiError> {
        self.client
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map_err(api_error)?;
        Ok(())
    }
}

/// Start-up discovery's questions (`cloud::discovery`): not part of [`Ec2Api`], asked once
/// before the providers exist.
impl AwsEc2 {
    /// DescribeSubnets of these ids. A filter, not `SubnetIds`: EC2 answers an id it does not
    /// know in `SubnetIds` with InvalidSubnetID.NotFound for the whole call (naming one), where
    /// a filter leaves it out, so every missing subnet is named at once beside the rest.
    async fn subnets_by_id(
        &self,
        ids: &[String],
    ) -> Result<Vec<aws_sdk_ec2::types::Subnet>, ApiError> {
        let out = self
            .client
            .describe_subnets()
            .filters(filter("subnet-id", ids.to_vec()))
            .send()
            .await
            .map_err(api_error)?;
        Ok(out.subnets().to_vec())
    }

    /// The cluster's subnets, each told private or public.
    pub(crate) async fn cluster_subnets(
        &self,
        ids: &[String],
    ) -> Result<Vec<crate::cloud::discovery::ClusterSubnet>, ApiError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .subnets_by_id(ids)
            .await?
            .iter()
            .filter_map(|s| {
                let tags = s
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
                    .collect();
                Some(crate::cloud::discovery::ClusterSubnet::classify(
                    s.subnet_id()?.to_string(),
                    s.availability_zone()?.to_string(),
                    &tags,
                    s.map_public_ip_on_launch().unwrap_or(false),
                    s.available_ip_address_count().unwrap_or(0),
                ))
            })
            .collect())
    }

    /// Ids of the security groups carrying `key=value`.
    pub(crate) async fn security_groups_tagged(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<String>, ApiError> {
        let out = self
            .client
            .describe_security_groups()
            .filters(filter(format!("tag:{key}"), vec![value.to_string()]))
            .send()
            .await
            .map_err(api_error)?;
        let mut ids: Vec<String> = out
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect();
        ids.sort();
        Ok(ids)
    }
}
