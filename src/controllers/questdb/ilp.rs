//! ILP auth for one QuestDB: the annotated Secrets (found in the metadata-only cache) become an
//! auth file and the `IlpAuthReady` condition, following `crate::ilp_auth`'s policy.
//!
//! Secret data is read with a GET only when a Secret's resourceVersion changed; what is kept is
//! the parsed public half (or the problem found), never the Secret.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::{info, warn};

use crate::api::QuestDB;
use crate::api::{EventReason, IlpAuthReason};
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::ilp_auth;
use crate::plan::conditions::Verdict;

/// The auth file to mount (None: ILP auth disabled) and the condition to report.
pub(crate) struct Resolution {
    pub file: Option<String>,
    pub condition: Option<Verdict<IlpAuthReason>>,
}

pub(crate) async fn resolve(qdb: &QuestDB, ctx: &Context) -> Result<Resolution, Error> {
    prune_key_cache(ctx);
    if !qdb.spec.ilp_auth.enabled {
        return Ok(Resolution {
            file: None,
            condition: Some(Verdict::new(
                true,
                IlpAuthReason::Disabled,
                "ILP authentication is off (spec.ilpAuth.enabled: false): any client can write over ILP",
            )),
        });
    }
    let ns = qdb.namespace().unwrap_or_default();
    let name = qdb.name_any();
    let mut mine: Vec<_> = ctx
        .caches
        .secrets
        .in_namespace(&ns)
        .into_iter()
        .filter(|s| {
            ilp_auth::questdb_for_secret(&s.metadata)
                .is_some_and(|r| r.name == name && r.namespace.as_deref() == Some(ns.as_str()))
        })
        .collect();
    mine.sort_by_key(|s| s.name_any());

    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut parsed = Vec::with_capacity(mine.len());
    for meta in &mine {
        let secret_name = meta.name_any();
        let key = ObjectRef::<Secret>::new(&secret_name).within(&ns);
        let rv = meta.resource_version().unwrap_or_default();
        let cached = ctx
            .keys
            .lock()
            .expect("key cache lock")
            .get(&key)
            .filter(|(seen, _)| *seen == rv)
            .map(|(_, r)| r.clone());
        let result = match cached {
            Some(r) => r,
            None => {
                let Some(secret) = api.get_opt(&secret_name).await.map_err(Error::Kube)? else {
                    continue; // deleted since the cache saw it; its watch event follows
                };
                let r = ilp_auth::parse_secret(&secret);
                let seen = secret.resource_version().unwrap_or_default();
                ctx.keys
                    .lock()
                    .expect("key cache lock")
                    .insert(key, (seen, r.clone()));
                r
            }
        };
        parsed.push((secret_name, result));
    }

    let outcome = ilp_auth::collect_parsed(parsed);
    let decision = ilp_auth::decide(&outcome);

    let condition = Verdict::new(decision.ready, decision.reason, decision.message.clone());
    let unchanged = qdb
        .status
        .as_ref()
        .is_some_and(|s| super::record::already_reported(s, &condition));
    // No key yet is a state the user chose (auth on, keys to come): said once, at info. A
    // broken Secret is someone's to fix: a warning.
    let event = match decision.reason {
        IlpAuthReason::Disabled | IlpAuthReason::KeysLoaded => None,
        IlpAuthReason::NoKeys => Some((EventType::Normal, EventReason::NoKeys)),
        IlpAuthReason::InvalidSecret => Some((EventType::Warning, EventReason::InvalidSecret)),
        IlpAuthReason::DuplicateKid => Some((EventType::Warning, EventReason::DuplicateKid)),
    };
    if let Some((type_, reason)) = event.filter(|_| !unchanged) {
        if type_ == EventType::Normal {
            info!(questdb = %name, %reason, message = %decision.message, "ILP auth has no key yet");
        } else {
            warn!(questdb = %name, %reason, message = %decision.message, "ILP auth not ready");
        }
        ctx.event(qdb, type_, reason, "IlpAuth", decision.message.clone())
            .await;
    }
    Ok(Resolution {
        file: Some(decision.auth_file),
        condition: Some(condition),
    })
}

/// Forgets the parsed keys of Secrets that are gone from the metadata cache or no longer map to
/// a QuestDB. Without this the key cache would grow with every key Secret ever seen (deleted,
/// re-created under a new name, un-annotated), for the life of the process. Done on every
/// reconcile, wherever the Secret was: the QuestDB it belonged to may be gone too.
fn prune_key_cache(ctx: &Context) {
    let mut keys = ctx.keys.lock().expect("key cache lock");
    keys.retain(|secret, _| {
        let Some(ns) = secret.namespace.as_deref() else {
            return false;
        };
        ctx.caches
            .secrets
            .get(&ObjectRef::new(&secret.name).within(ns))
            .is_some_and(|meta| ilp_auth::questdb_for_secret(&meta.metadata).is_some())
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::runtime::events::Recorder;
    use kube::core::PartialObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;

    use super::*;
    use crate::api::SECRET_QUESTDB_ANNOTATION;
    use crate::cache::Caches;
    use crate::ilp_auth::testing::TestKey;
    use crate::metrics::Metrics;

    fn meta(ns: &str, name: &str, annotation: Option<&str>) -> PartialObjectMeta<Secret> {
        let mut m = PartialObjectMeta::<Secret>::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some(ns.into());
        m.metadata.annotations = annotation
            .map(|a| BTreeMap::from([(SECRET_QUESTDB_ANNOTATION.to_string(), a.to_string())]));
        m
    }

    /// A Context whose Secret cache is fed by the returned writer. The client points at a
    /// closed local port: pruning must never need the apiserver.
    fn context() -> (Context, Writer<PartialObjectMeta<Secret>>) {
        // ring and aws-lc-rs are both linked: rustls needs to be told which one to use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let uri: http::Uri = "http://127.0.0.1:9".parse().expect("static URI");
        let client = kube::Client::try_from(kube::Config::new(uri)).expect("plain-HTTP client");
        let (secrets, writer) = reflector::store();
        let caches = Caches {
            questdbs: reflector::store().0,
            statefulsets: reflector::store().0,
            configmaps: reflector::store().0,
            services: reflector::store().0,
            pvcs: reflector::store().0,
            pods: reflector::store().0,
            network_policies: reflector::store().0,
            pdbs: reflector::store().0,
            nodes: reflector::store().0,
            leases: reflector::store().0,
            refusals: Vec::new(),
            secrets: crate::cache::SecretIndex::single(secrets),
            owner_index: Default::default(),
        };
        let ctx = Context {
            recorder: Recorder::new(client.clone(), "test", None),
            client,
            caches,
            metrics: Metrics::new(),
            keys: Default::default(),
            credentials: Default::default(),
            failures: Default::default(),
            cloud: None,
            wake: None,
            operator_namespace: None,
            write_health: Default::default(),
            checkpoints: Default::default(),
            disk: Default::default(),
            kubelets: None,
            backups: Default::default(),
            status_writes: Default::default(),
            tenancy: Default::default(),
            preflight: Default::default(),
            rolls: Default::default(),
        };
        (ctx, writer)
    }

    fn cache_key(ctx: &Context, ns: &str, name: &str) {
        let key = TestKey::derived(name, 1);
        let parsed = ilp_auth::PublicKey::new(name, &key.x, &key.y);
        ctx.keys
            .lock()
            .expect("key cache lock")
            .insert(ObjectRef::new(name).within(ns), ("1".into(), parsed));
    }

    fn cached(ctx: &Context) -> Vec<String> {
        let mut names: Vec<String> = ctx
            .keys
            .lock()
            .expect("key cache lock")
            .keys()
            .map(|k| format!("{}/{}", k.namespace.as_deref().unwrap_or_default(), k.name))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn pruning_forgets_keys_of_deleted_and_unannotated_secrets_only() {
        let (ctx, mut writer) = context();
        for m in [
            meta("a", "kept", Some("db1")),
            meta("a", "unannotated", None),
            meta("b", "other-db", Some("db2")),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(m));
        }
        for (ns, name) in [
            ("a", "kept"),
            ("a", "unannotated"),
            ("b", "other-db"),
            ("a", "deleted"),
            ("gone-namespace", "deleted"),
        ] {
            cache_key(&ctx, ns, name);
        }

        prune_key_cache(&ctx);

        assert_eq!(cached(&ctx), ["a/kept", "b/other-db"]);
    }
}
