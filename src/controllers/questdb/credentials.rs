//! The credentials step: the Secret the database's passwords come from exists (generated once
//! when the user names none), holds every key, and its digest goes into the pod template.
//!
//! Like the ILP keys, Secret data is read with a GET only when the Secret's resourceVersion
//! changed, and only the check and digest are kept. A generated Secret is created, never
//! rewritten; only its owner reference follows `volume.retainOnDelete`, as the PVC's does.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, warn};

use crate::api::{CredentialsReason, EventReason, QuestDB, MANAGER};
use crate::cache::compacted::CachedMeta;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::credentials::{self, Check};
use crate::desired::owner_references;
use crate::plan::conditions::Verdict;

/// What the children step needs: the digest for the pod template (None until the Secret is
/// usable: the template then keeps no digest and the kubelet reports the missing Secret), and
/// the condition.
pub(crate) struct Resolution {
    pub secret: String,
    /// The Secret's resourceVersion, HTTP digest and pgwire digest, when it is usable.
    pub usable: Option<(String, String, String)>,
    pub condition: Verdict<CredentialsReason>,
}

impl Resolution {
    pub(crate) fn seen(&self) -> Option<credentials::Seen<'_>> {
        self.usable
            .as_ref()
            .map(|(version, digest, pg_digest)| credentials::Seen {
                version,
                digest,
                pg_digest,
            })
    }
}

pub(crate) async fn resolve(qdb: &QuestDB, ctx: &Context) -> Result<Resolution, Error> {
    prune(ctx);
    let ns = qdb.namespace().ok_or(Error::MissingNamespace)?;
    let name = credentials::secret_name(qdb);
    let key = ObjectRef::<Secret>::new(&name).within(&ns);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let meta = ctx.caches.secrets.get(&ObjectRef::new(&name).within(&ns));
    let read = match meta.as_deref() {
        None if credentials::generated(qdb) => Some(generate(qdb, ctx, &api, &key).await?),
        None => None,
        Some(meta) => {
            if credentials::generated(qdb) {
                follow_retention(qdb, &api, meta).await?;
            }
            read(qdb, ctx, &api, &key, meta).await?
        }
    };
    let condition = verdict(qdb, &name, read.as_ref().map(|(_, c)| c));
    report(qdb, ctx, &condition).await;
    let usable = match read {
        Some((version, Check::Usable { digest, pg_digest })) => Some((version, digest, pg_digest)),
        _ => None,
    };
    Ok(Resolution {
        secret: name,
        usable,
        condition,
    })
}

/// What the StatefulSet says it was built from (`<resourceVersion>:<digest>:<pg digest>`), if
/// anything.
fn seen_by_statefulset(qdb: &QuestDB, ctx: &Context) -> Option<(String, Check)> {
    let ns = qdb.namespace()?;
    let sts = ctx
        .caches
        .statefulsets
        .get(&ObjectRef::new(&crate::desired::names::statefulset(qdb)).within(&ns))?;
    let value = sts.annotation(credentials::CREDENTIALS_SEEN_ANNOTATION)?;
    let seen = credentials::Seen::parse(value)?;
    Some((
        seen.version.to_string(),
        Check::Usable {
            digest: seen.digest.to_string(),
            pg_digest: seen.pg_digest.to_string(),
        },
    ))
}

/// The condition for what was found; messages name the Secret and keys, never a value.
fn verdict(qdb: &QuestDB, name: &str, check: Option<&Check>) -> Verdict<CredentialsReason> {
    match check {
        Some(Check::Usable { .. }) => Verdict::new(
            true,
            CredentialsReason::CredentialsFound,
            format!("database users and passwords come from Secret {name}"),
        ),
        Some(Check::MissingKeys(keys)) => Verdict::new(
            false,
            CredentialsReason::MissingKeys,
            format!(
                "Secret {name} lacks {}: the database does not start without them",
                keys.join(", ")
            ),
        ),
        Some(Check::DefaultPassword(keys)) => Verdict::new(
            false,
            CredentialsReason::DefaultPassword,
            format!(
                "Secret {name} sets {} to QuestDB's well-known default: choose another password",
                keys.join(", ")
            ),
        ),
        None => Verdict::new(
            false,
            CredentialsReason::SecretNotFound,
            format!(
                "Secret {name} (spec.credentials.secretName{}) does not exist: the database does not start until it does",
                if credentials::generated(qdb) { ", generated" } else { "" }
            ),
        ),
    }
}

/// One log line and one Warning event per distinct problem (the condition already saying it
/// means it was reported).
async fn report(qdb: &QuestDB, ctx: &Context, condition: &Verdict<CredentialsReason>) {
    let reason = match condition.reason {
        CredentialsReason::CredentialsFound => return,
        CredentialsReason::SecretNotFound => EventReason::SecretNotFound,
        CredentialsReason::MissingKeys => EventReason::MissingKeys,
        CredentialsReason::DefaultPassword => EventReason::DefaultPassword,
    };
    let already = qdb
        .status
        .as_ref()
        .is_some_and(|s| super::record::already_reported(s, condition));
    if already {
        return;
    }
    warn!(questdb = %qdb.name_any(), reason = %condition.reason, message = %condition.message, "database credentials not usable");
    ctx.event(
        qdb,
        EventType::Warning,
        reason,
        "Credentials",
        condition.message.clone(),
    )
    .await;
}

/// Creates `<name>-credentials` with fresh passwords. A conflict means it exists already (a
/// cache behind the apiserver): it is read, never overwritten.
async fn generate(
    qdb: &QuestDB,
    ctx: &Context,
    api: &Api<Secret>,
    key: &ObjectRef<Secret>,
) -> Result<(String, Check), Error> {
    let secret = credentials::generated_secret(qdb, &mut rand::rng());
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let created = match api.create(&pp, &secret).await {
        Ok(s) => {
            info!(questdb = %qdb.name_any(), secret = %key.name, "generated database credentials");
            ctx.event(
                qdb,
                EventType::Normal,
                EventReason::CredentialsGenerated,
                "Credentials",
                format!(
                    "generated Secret {} with the database's users and passwords",
                    key.name
                ),
            )
            .await;
            s
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            api.get(&key.name).await.map_err(Error::Kube)?
        }
        Err(e) => return Err(Error::Kube(e)),
    };
    Ok(remember(ctx, key, &created))
}

/// The Secret's resourceVersion and check: from memory, from the StatefulSet built from the
/// same resourceVersion (a restarted operator), or read.
async fn read(
    qdb: &QuestDB,
    ctx: &Context,
    api: &Api<Secret>,
    key: &ObjectRef<Secret>,
    meta: &PartialObjectMeta<Secret>,
) -> Result<Option<(String, Check)>, Error> {
    let rv = meta.resource_version().unwrap_or_default();
    let cached = ctx
        .credentials
        .lock()
        .expect("credentials cache lock")
        .get(key)
        .filter(|(seen, _)| *seen == rv)
        .map(|(_, c)| c.clone());
    if let Some(check) = cached {
        return Ok(Some((rv, check)));
    }
    if let Some((version, check)) = seen_by_statefulset(qdb, ctx).filter(|(v, _)| *v == rv) {
        ctx.credentials
            .lock()
            .expect("credentials cache lock")
            .insert(key.clone(), (version.clone(), check.clone()));
        return Ok(Some((version, check)));
    }
    // Deleted since the cache saw it: its watch event follows.
    let Some(secret) = api.get_opt(&key.name).await.map_err(Error::Kube)? else {
        return Ok(None);
    };
    Ok(Some(remember(ctx, key, &secret)))
}

fn remember(ctx: &Context, key: &ObjectRef<Secret>, secret: &Secret) -> (String, Check) {
    let check = credentials::check(&secret.data.clone().unwrap_or_default());
    let version = secret.resource_version().unwrap_or_default();
    ctx.credentials
        .lock()
        .expect("credentials cache lock")
        .insert(key.clone(), (version.clone(), check.clone()));
    (version, check)
}

/// A Secret this operator generated for this QuestDB (its annotation names the QuestDB's uid,
/// or that of an earlier QuestDB of the same name whose data it kept) is owned exactly when
/// the volume is: deleting the QuestDB takes both or neither.
async fn follow_retention(
    qdb: &QuestDB,
    api: &Api<Secret>,
    meta: &PartialObjectMeta<Secret>,
) -> Result<(), Error> {
    let Some(made_for) = meta
        .annotations()
        .get(credentials::GENERATED_FOR_ANNOTATION)
    else {
        return Ok(()); // the user's own Secret of that name: never changed
    };
    let uid = qdb.uid().ok_or(Error::MissingUid)?;
    let wanted = if qdb.spec.volume.retain_on_delete {
        vec![]
    } else {
        owner_references(qdb)
    };
    let has = meta.metadata.owner_references.clone().unwrap_or_default();
    if *made_for == uid && has == wanted {
        return Ok(());
    }
    // A foreign owner (someone else's object) is never replaced.
    let foreign = has.iter().any(|o| o.uid != uid && o.kind != "QuestDB");
    if foreign {
        return Ok(());
    }
    let patch = json!({
        "metadata": {
            "resourceVersion": meta.resource_version(),
            "annotations": {credentials::GENERATED_FOR_ANNOTATION: uid},
            "ownerReferences": if wanted.is_empty() { serde_json::Value::Null } else { json!(wanted) },
        }
    });
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api
        .patch(&meta.name_any(), &pp, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Changed meanwhile: its watch event brings the next reconcile.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Forgets checks of Secrets gone from the metadata cache, so the cache holds one entry per
/// live credentials Secret at most.
fn prune(ctx: &Context) {
    let mut cache = ctx.credentials.lock().expect("credentials cache lock");
    cache.retain(|secret, _| {
        secret.namespace.as_deref().is_some_and(|ns| {
            ctx.caches
                .secrets
                .get(&ObjectRef::new(&secret.name).within(ns))
                .is_some()
        })
    });
}
