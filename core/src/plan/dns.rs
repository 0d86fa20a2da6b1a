//! Planning for a QuestDB's DNS record. Pure; the shell in `questdb::cloud` performs the step.
//!
//! `status.dnsName` + `status.dnsIP` say what the record was last set to, so a converged
//! QuestDB costs no Route53 call at all: the provider is asked only when they differ from what
//! is wanted.

use crate::api::DnsReason;
use crate::api::{DnsSpec, QuestDBStatus};
use crate::cloud::display_name;
use crate::plan::conditions::Verdict;

#[derive(Clone, Debug, PartialEq)]
pub enum DnsStep {
    /// No record wanted and none recorded.
    Nothing,
    /// The record is as wanted.
    InSync(Verdict<DnsReason>),
    /// Point `name` at `ip`.
    Upsert { name: String, ip: String, ttl: i64 },
    /// Remove the record status names and its ownership (deleted, renamed, or `spec.dns`
    /// removed): the name is free again.
    Delete { name: String },
    /// Remove the A record and keep the ownership (paused): the name points nowhere and stays
    /// this QuestDB's until it is deleted.
    Withdraw { name: String },
    /// A record is wanted but cannot be written yet (no node address, no hosted zone).
    Blocked(Verdict<DnsReason>),
}

pub struct DnsView<'a> {
    pub spec: Option<&'a DnsSpec>,
    /// Paused or being deleted.
    pub release: bool,
    /// Being deleted (a pause keeps the name reserved; only deletion frees it).
    pub deleting: bool,
    pub status: &'a QuestDBStatus,
    /// The private address the record may name (the instance's, or its pod's: `pod_addressed`)
    /// and the instance's public one, once known.
    pub private_ip: Option<&'a str>,
    pub public_ip: Option<&'a str>,
    /// The database binds no host ports: the private record names the pod's address.
    pub pod_addressed: bool,
    pub provider_configured: bool,
}

/// The pod address a private record may name for a database without host ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodAddress {
    /// The pod runs on the dedicated instance's Node and EC2 shows the address assigned to
    /// that instance.
    Verified(String),
    /// The pod reports an address EC2 has not assigned the instance: a kubelet may report any
    /// address, so the record never moves there (on-call hears of it).
    Unassigned(String),
    /// No pod on the instance's Node with an address yet.
    NotYet,
}

/// `pod_ip` as its kubelet reports it, `on_instance_node` when the pod is bound to the Node of
/// the instance EC2 describes with `assigned` addresses. The VPC CNI gives pods addresses
/// from the node's network interfaces (secondary IPs, or /28 prefixes with prefix
/// delegation), which EC2 reports: an address outside them is not one of this instance's
/// pods, whatever the pod status says.
pub fn pod_address(
    pod_ip: Option<&str>,
    on_instance_node: bool,
    assigned: &crate::cloud::PodAddresses,
) -> PodAddress {
    match pod_ip.filter(|_| on_instance_node) {
        None => PodAddress::NotYet,
        Some(ip) if assigned.contains(ip) => PodAddress::Verified(ip.to_string()),
        Some(ip) => PodAddress::Unassigned(ip.to_string()),
    }
}

pub fn plan(v: &DnsView) -> DnsStep {
    let wanted = v.spec.filter(|_| !v.release);
    let recorded = v.status.dns_name.as_deref();
    let reserved = v
        .spec
        .filter(|_| v.release && !v.deleting)
        .map(|d| display_name(&d.name))
        .filter(|name| recorded == Some(name.as_str()));
    if let Some(name) = reserved {
        if !v.provider_configured {
            return DnsStep::Blocked(not_configured());
        }
        return if v.status.dns_ip.is_some() {
            DnsStep::Withdraw { name }
        } else {
            DnsStep::InSync(reserved_while_paused(&name))
        };
    }
    if let Some(old) = recorded {
        let renamed = wanted.is_none_or(|d| display_name(&d.name) != old);
        if renamed {
            if !v.provider_configured {
                return DnsStep::Blocked(not_configured());
            }
            return DnsStep::Delete {
                name: old.to_string(),
            };
        }
    }
    let Some(dns) = wanted else {
        return DnsStep::Nothing;
    };
    if !v.provider_configured {
        return DnsStep::Blocked(not_configured());
    }
    let ip = if dns.public {
        v.public_ip
    } else {
        v.private_ip
    };
    let Some(ip) = ip else {
        let waiting = if dns.public {
            "waiting for the dedicated node's public IP"
        } else if v.pod_addressed {
            "waiting for the database pod's address on its dedicated node, as EC2 assigns it to the instance"
        } else {
            "waiting for the dedicated node's private IP"
        };
        return DnsStep::Blocked(Verdict::new(false, DnsReason::WaitingForNode, waiting));
    };
    let name = display_name(&dns.name);
    if recorded == Some(name.as_str()) && v.status.dns_ip.as_deref() == Some(ip) {
        return DnsStep::InSync(published(&name, ip));
    }
    DnsStep::Upsert {
        name,
        ip: ip.to_string(),
        ttl: dns.ttl,
    }
}

/// Which DNS names a namespace's databases may take in the shared hosted zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsNames<'a> {
    /// The default: the name's second label is the namespace (`<db>.<namespace>.<zone>`), so
    /// each name belongs to exactly one namespace and no tenant can take (or squat, during
    /// another's restore) a name meant for another namespace's clients.
    Namespaced,
    /// Under `<namespace>.<suffix>` (`--dns-namespace-suffix`).
    UnderSuffix(&'a str),
    /// Any name in the zone, first come first served (`--dns-names-first-come`).
    FirstCome,
}

/// The refusal of `name` for a QuestDB of `namespace` that holds `recorded` (`status.dnsName`),
/// if it is refused: a name it already holds is kept whatever the rule says now (a rule
/// tightened by an operator upgrade or a new flag must not delete the records its clients use).
pub fn refusal(
    name: &str,
    namespace: &str,
    names: DnsNames,
    recorded: Option<&str>,
) -> Option<Verdict<DnsReason>> {
    if recorded == Some(display_name(name).as_str()) {
        return None;
    }
    outside_namespace(name, namespace, names)
}

/// The refusal of a DNS name the namespace may not take, if it may not.
pub fn outside_namespace(
    name: &str,
    namespace: &str,
    names: DnsNames,
) -> Option<Verdict<DnsReason>> {
    let name = display_name(name);
    let refuse = |why: String| Some(Verdict::new(false, DnsReason::DnsRejected, why));
    match names {
        DnsNames::FirstCome => None,
        DnsNames::UnderSuffix(suffix) => {
            let zone = format!("{namespace}.{suffix}");
            if name.ends_with(&format!(".{zone}")) {
                return None;
            }
            refuse(format!("{name} is not under {zone}: this namespace's databases are named *.{zone} (--dns-namespace-suffix)"))
        }
        DnsNames::Namespaced => {
            let labels: Vec<&str> = name.split('.').collect();
            if labels.len() >= 3 && labels[1] == namespace && !labels[0].is_empty() {
                return None;
            }
            refuse(format!("{name}: this namespace's databases are named <name>.{namespace}.<zone> (the second label is the namespace, so no other namespace can take the name; the operator's --dns-names-first-come lifts this)"))
        }
    }
}

/// `DnsReady` of a paused QuestDB whose name stays its own.
pub fn reserved_while_paused(name: &str) -> Verdict<DnsReason> {
    Verdict::new(
        false,
        DnsReason::Removed,
        format!("record {name} removed while compute is released; the name stays reserved for this QuestDB until it is deleted"),
    )
}

pub fn published(name: &str, ip: &str) -> Verdict<DnsReason> {
    Verdict::new(true, DnsReason::Published, format!("{name} points at {ip}"))
}

fn not_configured() -> Verdict<DnsReason> {
    Verdict::new(
        false,
        DnsReason::NotConfigured,
        "the operator has no Route53 hosted zone configured (--route53-hosted-zone-id)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(name: &str, public: bool) -> DnsSpec {
        DnsSpec {
            name: name.into(),
            ttl: 60,
            public,
        }
    }

    fn status(name: Option<&str>, ip: Option<&str>) -> QuestDBStatus {
        QuestDBStatus {
            dns_name: name.map(str::to_string),
            dns_ip: ip.map(str::to_string),
            ..QuestDBStatus::default()
        }
    }

    fn view<'a>(spec: Option<&'a DnsSpec>, status: &'a QuestDBStatus) -> DnsView<'a> {
        DnsView {
            spec,
            release: false,
            deleting: false,
            status,
            private_ip: Some("10.0.0.4"),
            public_ip: Some("203.0.113.9"),
            pod_addressed: false,
            provider_configured: true,
        }
    }

    #[test]
    fn a_new_record_points_at_the_private_ip_with_the_spec_ttl() {
        let d = dns("DB1.Example.com.", false);
        let s = status(None, None);
        assert_eq!(
            plan(&view(Some(&d), &s)),
            DnsStep::Upsert {
                name: "db1.example.com".into(),
                ip: "10.0.0.4".into(),
                ttl: 60
            }
        );
    }

    #[test]
    fn public_records_use_the_public_ip() {
        let d = dns("db1.example.com", true);
        let s = status(None, None);
        assert!(
            matches!(plan(&view(Some(&d), &s)), DnsStep::Upsert { ip, .. } if ip == "203.0.113.9")
        );
    }

    #[test]
    fn a_recorded_record_with_the_same_ip_costs_nothing() {
        let d = dns("db1.example.com", false);
        let s = status(Some("db1.example.com"), Some("10.0.0.4"));
        assert!(matches!(plan(&view(Some(&d), &s)), DnsStep::InSync(c) if c.status));
    }

    #[test]
    fn a_new_ip_is_upserted() {
        let d = dns("db1.example.com", false);
        let s = status(Some("db1.example.com"), Some("10.0.0.99"));
        assert!(matches!(plan(&view(Some(&d), &s)), DnsStep::Upsert { .. }));
    }

    #[test]
    fn a_renamed_removed_or_deleted_record_is_deleted_first_and_its_name_freed() {
        let s = status(Some("old.example.com"), Some("10.0.0.4"));
        let renamed = dns("new.example.com", false);
        let delete = DnsStep::Delete {
            name: "old.example.com".into(),
        };
        assert_eq!(plan(&view(Some(&renamed), &s)), delete);
        assert_eq!(plan(&view(None, &s)), delete);
        let same = dns("old.example.com", false);
        let mut deleting = view(Some(&same), &s);
        deleting.release = true;
        deleting.deleting = true;
        assert_eq!(plan(&deleting), delete);
        // Deleted while paused (the A record already withdrawn): the reservation goes too.
        let withdrawn = status(Some("old.example.com"), None);
        let mut deleting = view(Some(&same), &withdrawn);
        deleting.release = true;
        deleting.deleting = true;
        assert_eq!(plan(&deleting), delete);
    }

    #[test]
    fn a_paused_questdb_withdraws_its_record_and_keeps_its_name() {
        let d = dns("db1.example.com", false);
        let s = status(Some("db1.example.com"), Some("10.0.0.4"));
        let mut paused = view(Some(&d), &s);
        paused.release = true;
        assert_eq!(
            plan(&paused),
            DnsStep::Withdraw {
                name: "db1.example.com".into()
            }
        );
        // Withdrawn: nothing more to do while paused, the name still reserved.
        let withdrawn = status(Some("db1.example.com"), None);
        let mut paused = view(Some(&d), &withdrawn);
        paused.release = true;
        assert!(
            matches!(plan(&paused), DnsStep::InSync(c) if !c.status && c.message.contains("reserved"))
        );
        // Unpaused: the record comes back under the name it kept.
        assert_eq!(
            plan(&view(Some(&d), &withdrawn)),
            DnsStep::Upsert {
                name: "db1.example.com".into(),
                ip: "10.0.0.4".into(),
                ttl: 60
            }
        );
    }

    #[test]
    fn without_a_node_ip_or_a_hosted_zone_the_record_waits() {
        let d = dns("db1.example.com", false);
        let s = status(None, None);
        let mut v = view(Some(&d), &s);
        v.private_ip = None;
        assert!(matches!(plan(&v), DnsStep::Blocked(c) if c.reason == DnsReason::WaitingForNode));
        let mut v = view(Some(&d), &s);
        v.provider_configured = false;
        assert!(matches!(plan(&v), DnsStep::Blocked(c) if c.reason == DnsReason::NotConfigured));
    }

    #[test]
    fn a_pod_address_moves_the_record_only_once_ec2_shows_it_assigned_to_the_instance() {
        let assigned = crate::cloud::PodAddresses {
            secondary_ips: vec!["10.0.3.21".into()],
            prefixes: vec!["10.0.4.16/28".into()],
        };
        assert_eq!(
            pod_address(Some("10.0.3.21"), true, &assigned),
            PodAddress::Verified("10.0.3.21".into())
        );
        assert_eq!(
            pod_address(Some("10.0.4.31"), true, &assigned),
            PodAddress::Verified("10.0.4.31".into()),
            "inside a delegated /28"
        );
        for forged in ["10.0.4.32", "10.0.3.22", "169.254.169.254", "not-an-ip"] {
            assert_eq!(
                pod_address(Some(forged), true, &assigned),
                PodAddress::Unassigned(forged.into()),
                "{forged}"
            );
        }
        // A pod still bound to another Node (the old one during a failover) is not the
        // instance's, whatever address it has.
        assert_eq!(
            pod_address(Some("10.0.3.21"), false, &assigned),
            PodAddress::NotYet
        );
        assert_eq!(pod_address(None, true, &assigned), PodAddress::NotYet);
    }

    #[test]
    fn a_pod_addressed_record_says_it_waits_for_the_pod() {
        let d = dns("db1.example.com", false);
        let s = status(None, None);
        let mut v = view(Some(&d), &s);
        v.private_ip = None;
        v.pod_addressed = true;
        assert!(matches!(plan(&v), DnsStep::Blocked(c) if c.message.contains("pod's address")));
        v.private_ip = Some("10.0.3.21");
        assert_eq!(
            plan(&v),
            DnsStep::Upsert {
                name: "db1.example.com".into(),
                ip: "10.0.3.21".into(),
                ttl: 60
            }
        );
    }

    #[test]
    fn a_name_outside_the_namespaces_suffix_is_refused() {
        let suffix = DnsNames::UnderSuffix("db.example.com");
        assert_eq!(
            outside_namespace("db1.team-a.db.example.com.", "team-a", suffix),
            None
        );
        for name in [
            "db1.team-b.db.example.com",
            "team-a.db.example.com",
            "db1.example.com",
        ] {
            let refused = outside_namespace(name, "team-a", suffix).expect(name);
            assert!(
                refused.message.contains("*.team-a.db.example.com"),
                "{}",
                refused.message
            );
        }
        assert_eq!(
            outside_namespace("anything.example.com", "team-a", DnsNames::FirstCome),
            None
        );
    }

    /// The harm: an operator upgrade (or a new flag) that tightens the rule deleting the records
    /// existing clients resolve. A name the QuestDB already holds stays its own.
    #[test]
    fn a_name_already_held_is_kept_when_the_rule_tightens() {
        let names = DnsNames::Namespaced;
        assert_eq!(
            refusal(
                "db1.db.example.com",
                "team-a",
                names,
                Some("db1.db.example.com")
            ),
            None
        );
        assert!(refusal("db1.db.example.com", "team-a", names, None).is_some());
        // Another name than the one it holds follows the rule.
        assert!(refusal(
            "db2.db.example.com",
            "team-a",
            names,
            Some("db1.db.example.com")
        )
        .is_some());
    }

    /// By default every name belongs to exactly one namespace: its second label.
    #[test]
    fn by_default_a_name_is_the_namespace_its_second_label_names() {
        let names = DnsNames::Namespaced;
        for name in [
            "orders.team-a.db.example.com",
            "orders.team-a.example.com.",
            "orders.team-a.com",
        ] {
            assert_eq!(outside_namespace(name, "team-a", names), None, "{name}");
        }
        for name in [
            // Another namespace's, however it is dressed up.
            "orders.team-b.db.example.com",
            "team-a.orders.example.com",
            // Too short to carry a namespace.
            "team-a.com",
            "orders",
            ".team-a.example.com",
        ] {
            let refused = outside_namespace(name, "team-a", names).expect(name);
            assert_eq!(refused.reason, DnsReason::DnsRejected);
            assert!(
                refused.message.contains("<name>.team-a.<zone>"),
                "{}",
                refused.message
            );
        }
    }

    #[test]
    fn nothing_wanted_nothing_recorded_is_nothing() {
        let s = status(None, None);
        assert_eq!(plan(&view(None, &s)), DnsStep::Nothing);
    }
}
