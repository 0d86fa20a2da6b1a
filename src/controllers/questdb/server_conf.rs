//! The `server.conf` Secret: the rendered settings and the pgwire users, which the pod reads as
//! `conf/server.conf` (see `desired::credentials::server_conf_secret`). It is rewritten only
//! when what it was rendered from changed (its source annotation, in the metadata cache), so a
//! converged database reads no credentials and writes nothing.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::info;

use crate::api::{EventReason, QuestDB, MANAGER};
use crate::controllers::children::controlled_by;
use crate::controllers::context::Context;
use crate::controllers::Error;
use crate::desired::credentials::{self, Check, PgCredentials};
use crate::desired::names;

use super::apply::{described, Written};
use super::credentials::Resolution;

/// Writes the Secret when its source differs. Nothing is written while the credentials are not
/// usable: the database keeps the users it has (or, new, waits for its file), and
/// `CredentialsReady` says why.
pub(super) async fn step(
    qdb: &QuestDB,
    ctx: &Context,
    creds: &Resolution,
    server_conf: &str,
) -> Result<Written, Error> {
    let Some((_, _, pg_digest)) = &creds.usable else {
        return Ok(Written::Unchanged);
    };
    let ns = qdb.namespace().ok_or(Error::MissingNamespace)?;
    let uid = qdb.uid().ok_or(Error::MissingUid)?;
    let name = names::server_conf_secret(qdb);
    let what = described::<Secret>(&name);
    let meta = ctx.caches.secrets.get(&ObjectRef::new(&name).within(&ns));
    if let Some(existing) = meta.as_deref() {
        // Someone else's Secret of that name is never overwritten; the database does not get
        // its users from it either (the StatefulSet waits, as for any conflicting child).
        if !controlled_by(existing, &uid) {
            let by = existing.owner_references().first().map_or_else(
                || "no owner".to_string(),
                |o| format!("{} {}", o.kind, o.name),
            );
            return Ok(Written::Blocked { what, by });
        }
        let source = credentials::server_conf_source(server_conf, pg_digest);
        if existing
            .annotations()
            .get(credentials::SERVER_CONF_SOURCE_ANNOTATION)
            == Some(&source)
        {
            return Ok(Written::Unchanged);
        }
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(secret) = api.get_opt(&creds.secret).await.map_err(Error::Kube)? else {
        return Ok(Written::Unchanged); // deleted since: its watch event brings the next reconcile
    };
    let data = secret.data.unwrap_or_default();
    // Rendered from what was read now, which may be newer than what was resolved.
    let (Check::Usable { pg_digest, .. }, Some(pg)) =
        (credentials::check(&data), PgCredentials::from_data(&data))
    else {
        return Ok(Written::Unchanged);
    };
    let source = credentials::server_conf_source(server_conf, &pg_digest);
    let mut desired = credentials::server_conf_secret(qdb, server_conf, &pg, &source);
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let written = match meta.as_deref() {
        None => api
            .create(&pp, &desired)
            .await
            .map(|_| EventReason::Created),
        Some(existing) => {
            // A merge patch (the operator may patch, not update, Secrets), kept from racing
            // another writer by the resourceVersion it read.
            desired.metadata.resource_version = existing.resource_version();
            let pp = PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            api.patch(&name, &pp, &Patch::Merge(&desired))
                .await
                .map(|_| EventReason::Updated)
        }
    };
    match written {
        Ok(reason) => {
            info!(questdb = %qdb.name_any(), secret = %name, "wrote the server.conf Secret");
            Ok(Written::Applied { reason, what })
        }
        // Changed or made meanwhile: its watch event brings the next reconcile.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Written::Unchanged),
        Err(e) => Err(Error::Kube(e)),
    }
}
