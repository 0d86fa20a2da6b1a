//! The cloud's model as the planners read it: instances and their facts, the tags that prove
//! ownership, and the errors a cloud call reduces to. The providers that make the calls are
//! the operator's (`questdb_operator::cloud`).

mod error;
mod model;
mod tags;

pub use error::{classify, ApiError, CloudError, ErrorClass};
pub use model::{
    display_name, fqdn, ARecord, ImageDevice, ImageFacts, Instance, InstanceState,
    InstanceTypeFacts, LaunchRequest, NodeFacts, PodAddresses, ScheduledEvent, StopMode, Taint,
    SCHEDULED_EVENT_CODES,
};
pub use tags::{
    client_token, desired_instance_tags, fallback_client_token, identity_tags, parse_node_tags,
    parse_provider_id, provider_id, reserved_tag_key, ProviderId, TAG_CLUSTER, TAG_CLUSTER_ID,
    TAG_NAME, TAG_NAMESPACE, TAG_NAME_AWS, TAG_NODE_GENERATION, TAG_UID,
};
