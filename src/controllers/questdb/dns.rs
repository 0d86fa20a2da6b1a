//! The DNS step of a QuestDB reconcile: the record the planner (`plan::dns`) decides is
//! written, withdrawn or deleted, persisting what it published in status, at the addresses EC2
//! gives the instance (a kubelet's report may confirm a record, never move it).

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use tracing::{info, warn};

use super::node::{cloud_error, WAITING_SYNC};
use super::outcome::Turn;
use super::placement;
use super::record::{already_reported, persist};
use crate::api::{DnsReason, EventReason, QuestDB, QuestDBStatus};
use crate::cloud::{display_name, CloudError, DnsOwner, OWNED_ELSEWHERE};
use crate::controllers::cloud_runtime::CloudRuntime;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::plan::conditions::Verdict;
use crate::plan::dns::{self, DnsStep, DnsView, PodAddress};

/// The addresses a record may name: the private one is the instance's, or its database pod's
/// (`pod_addressed`: no host ports).
#[derive(Default)]
pub(super) struct Ips {
    pub(super) private: Option<String>,
    pub(super) public: Option<String>,
    pub(super) pod_addressed: bool,
}

pub(super) fn node_address(node: &Node, kind: &str) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == kind)
        .map(|a| a.address.clone())
}

/// A dedicated Node that reports a private address EC2 does not give its instance: DNS keeps
/// EC2's, and on-call hears of it (a misconfigured or compromised node).
pub(super) async fn report_untrusted_address(
    qdb: &QuestDB,
    ctx: &Context,
    node: Option<&Node>,
    ec2: Option<&str>,
) {
    let (Some(node), Some(ec2)) = (node, ec2) else {
        return;
    };
    let Some(reported) = node_address(node, "InternalIP").filter(|r| r != ec2) else {
        return;
    };
    let note = format!(
        "node {} reports address {reported}, but EC2 gives its instance {ec2}: DNS follows EC2, never the node's report",
        node.name_any()
    );
    address_untrusted(qdb, ctx, note).await;
}

/// A kubelet's report of an address EC2 does not give the instance: one log line and one
/// Warning event (a misconfigured or compromised node); the record does not move there.
async fn address_untrusted(qdb: &QuestDB, ctx: &Context, note: String) {
    warn!(questdb = %qdb.name_any(), "{note}");
    ctx.event(
        qdb,
        EventType::Warning,
        EventReason::NodeAddressUntrusted,
        "DnsRecord",
        note,
    )
    .await;
}

/// The database pod's address on `node` when EC2 shows it assigned to `instance` (see
/// [`dns::pod_address`]); an address EC2 does not show is reported, never published.
pub(super) async fn pod_address(
    qdb: &QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    node: Option<&Node>,
    instance: &crate::cloud::Instance,
) -> Result<Option<String>, Error> {
    let Some(node) = node else {
        return Ok(None);
    };
    let (bound_to, reported) = placement::pod_placement(qdb, ctx);
    let on_instance_node = bound_to.as_deref() == Some(node.name_any().as_str());
    match dns::pod_address(
        reported.as_deref(),
        on_instance_node,
        &instance.pod_addresses,
    ) {
        PodAddress::Verified(ip) => Ok(Some(ip)),
        PodAddress::NotYet => Ok(None),
        PodAddress::Unassigned(ip) => {
            // The shared snapshot may predate the address (ipamd assigns more when its warm
            // pool runs low): EC2 is asked again, at most once per WAITING_SYNC for the whole
            // operator, before the address is called one EC2 does not give the instance.
            let fresh = cloud
                .instances
                .get_within(cloud.nodes.as_ref(), WAITING_SYNC)
                .await
                .map_err(cloud_error)?;
            if fresh
                .iter()
                .any(|i| i.id == instance.id && i.pod_addresses.contains(&ip))
            {
                return Ok(Some(ip));
            }
            let note = format!(
                "pod {} on node {} reports address {ip}, but EC2 has not assigned it to instance {}: DNS never names an address EC2 does not give the instance",
                crate::desired::names::pod(qdb),
                node.name_any(),
                instance.id
            );
            address_untrusted(qdb, ctx, note).await;
            Ok(None)
        }
    }
}

/// This QuestDB as the owner of `name`: its uid, and the IP status says it published there.
fn dns_owner(qdb: &QuestDB, status: &QuestDBStatus, name: &str) -> DnsOwner {
    let published = status
        .dns_name
        .as_deref()
        .is_some_and(|n| display_name(n) == display_name(name));
    DnsOwner {
        uid: qdb.uid().unwrap_or_default(),
        published_ip: status.dns_ip.clone().filter(|_| published),
    }
}

/// A DNS error that needs a person (a name owned by someone else, a record Route53 refuses, no
/// hosted zone): a condition and one event, not a failed reconcile retried forever.
fn dns_refusal(e: &CloudError) -> Option<(DnsReason, EventReason)> {
    match e {
        CloudError::Permanent { code, .. } if code == OWNED_ELSEWHERE => Some((
            DnsReason::RecordOwnedElsewhere,
            EventReason::RecordOwnedElsewhere,
        )),
        CloudError::Permanent { .. } | CloudError::Config(_) => {
            Some((DnsReason::DnsRejected, EventReason::DnsRejected))
        }
        _ => None,
    }
}

/// The DNS step decided: `DnsReady`, or none without `spec.dns`.
fn decided(condition: Option<Verdict<DnsReason>>) -> DnsTurn {
    Some(Turn::decided(condition))
}

/// The DNS step's turn: `DnsReady` if `spec.dns` asks for a record; `None` when the fast path
/// (`from_node`: addresses read from the Node only) cannot decide.
pub(super) type DnsTurn = Option<Turn<DnsReason>>;

/// Performs the DNS step.
pub(super) async fn dns_step(
    qdb: &mut QuestDB,
    ctx: &Context,
    cloud: &CloudRuntime,
    ips: &Ips,
    from_node: bool,
) -> Result<DnsTurn, Error> {
    let status = qdb.status.clone().unwrap_or_default();
    let deleting = qdb.metadata.deletion_timestamp.is_some();
    let release = qdb.spec.paused || deleting;
    let refusal = refused_name(qdb, cloud, &status);
    if let Some(c) = &refusal {
        if !already_reported(&status, c) {
            warn!(questdb = %qdb.name_any(), "{}", c.message);
            ctx.event(
                qdb,
                EventType::Warning,
                EventReason::DnsRejected,
                "UpsertRecord",
                c.message.clone(),
            )
            .await;
        }
    }
    let step = dns::plan(&DnsView {
        spec: qdb.spec.dns.as_ref().filter(|_| refusal.is_none()),
        release,
        deleting,
        status: &status,
        private_ip: ips.private.as_deref(),
        public_ip: ips.public.as_deref(),
        pod_addressed: ips.pod_addressed,
        provider_configured: cloud.dns.is_some(),
    });
    let Some(provider) = cloud.dns.as_ref() else {
        return Ok(decided(match step {
            DnsStep::Blocked(c) => Some(c),
            _ => None,
        }));
    };
    match step {
        DnsStep::Nothing => Ok(decided(refusal)),
        DnsStep::InSync(c) => Ok(decided(Some(c))),
        DnsStep::Blocked(c) if c.reason == DnsReason::WaitingForNode && from_node => {
            // The fast path read the Node only; let the instance data decide.
            Ok(None)
        }
        // A Node's addresses are what its kubelet reports, and a compromised node can report
        // any: they may confirm the record, never move it. EC2's word decides a write.
        DnsStep::Upsert { .. } if from_node => Ok(None),
        DnsStep::Blocked(c) => Ok(decided(Some(c))),
        DnsStep::Upsert { name, ip, ttl } => {
            upsert(qdb, ctx, provider.as_ref(), &status, (name, ip, ttl)).await
        }
        DnsStep::Withdraw { name } => {
            let owner = dns_owner(qdb, &status, &name);
            provider
                .withdraw_a(&name, &owner)
                .await
                .map_err(cloud_error)?;
            info!(questdb = %qdb.name_any(), record = %name, "DNS record withdrawn; the name stays reserved");
            persist(qdb, ctx, |s| s.dns_ip = None).await?;
            Ok(decided(Some(dns::reserved_while_paused(&name))))
        }
        DnsStep::Delete { name } => {
            let owner = dns_owner(qdb, &status, &name);
            provider
                .delete_a(&name, &owner)
                .await
                .map_err(cloud_error)?;
            info!(questdb = %qdb.name_any(), record = %name, "DNS record deleted");
            persist(qdb, ctx, |s| {
                s.dns_name = None;
                s.dns_ip = None;
            })
            .await?;
            // The new record (if any) is written by the next reconcile, which the watch event
            // of this status write brings.
            Ok(decided(qdb.spec.dns.as_ref().filter(|_| release).map(
                |_| {
                    Verdict::new(
                        false,
                        DnsReason::Removed,
                        format!("record {name} removed while compute is released"),
                    )
                },
            )))
        }
    }
}

/// Writes the record `name` -> `ip` (ours, or adopted), then records what it published. A
/// name Route53 or another owner refuses is a condition and one event, not a retry.
async fn upsert(
    qdb: &mut QuestDB,
    ctx: &Context,
    provider: &dyn crate::cloud::DnsProvider,
    status: &QuestDBStatus,
    (name, ip, ttl): (String, String, i64),
) -> Result<DnsTurn, Error> {
    let owner = dns_owner(qdb, status, &name);
    if let Err(e) = provider.upsert_a(&name, &ip, ttl, &owner).await {
        return match dns_refusal(&e) {
            Some((reason, event_reason)) => {
                let c = Verdict::new(false, reason, e.to_string());
                if !already_reported(status, &c) {
                    warn!(questdb = %qdb.name_any(), record = %name, error = %e, "DNS record not written");
                    ctx.event(
                        qdb,
                        EventType::Warning,
                        event_reason,
                        "UpsertRecord",
                        e.to_string(),
                    )
                    .await;
                }
                Ok(decided(Some(c)))
            }
            None => Err(cloud_error(e)),
        };
    }
    info!(questdb = %qdb.name_any(), record = %name, %ip, "DNS record published");
    let (n, a) = (name.clone(), ip.clone());
    persist(qdb, ctx, |s| {
        s.dns_name = Some(n.clone());
        s.dns_ip = Some(a.clone());
    })
    .await?;
    ctx.event(
        qdb,
        EventType::Normal,
        EventReason::DnsPublished,
        "UpsertRecord",
        format!("{name} -> {ip}"),
    )
    .await;
    Ok(decided(Some(dns::published(&name, &ip))))
}

/// Why the spec's name may not be written here, if it may not. A name outside this
/// namespace's zone is not wanted: never written (and a recorded one of an earlier spec is
/// deleted as for any rename). A name this QuestDB already holds is kept: a rule tightened by
/// an upgrade or a flag never deletes records clients use.
fn refused_name(
    qdb: &QuestDB,
    cloud: &CloudRuntime,
    status: &QuestDBStatus,
) -> Option<Verdict<DnsReason>> {
    qdb.spec.dns.as_ref().and_then(|d| {
        let names = match (
            cloud.settings.dns_namespace_suffix.as_deref(),
            cloud.settings.dns_names_first_come,
        ) {
            (Some(suffix), _) => dns::DnsNames::UnderSuffix(suffix),
            (None, true) => dns::DnsNames::FirstCome,
            (None, false) => dns::DnsNames::Namespaced,
        };
        dns::refusal(
            &d.name,
            &qdb.namespace().unwrap_or_default(),
            names,
            status.dns_name.as_deref(),
        )
    })
}
