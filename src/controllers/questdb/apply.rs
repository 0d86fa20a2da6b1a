//! Applies desired children, each read from its own cache, and reports what it did: created,
//! adopted, updated, or blocked by another owner. Only a child that differs is written; one
//! event per kind of change goes out at the end of the reconcile.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info};

use crate::api::QuestDB;
use crate::api::{EventReason, ReadyReason};
use crate::cache::Caches;
use crate::controllers::children::{self, Applied, ChildAction};
use crate::controllers::context::Context;
use crate::controllers::Error;

/// A kind of child the operator applies, and the cache it is read from.
pub(crate) trait Child:
    crate::cache::compacted::OwnedChild
    + Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Serialize
    + DeserializeOwned
    + Clone
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    fn cache(caches: &Caches) -> &Store<Self::Cached>;
}

impl Child for ConfigMap {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.configmaps
    }
}

impl Child for Service {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.services
    }
}

impl Child for StatefulSet {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.statefulsets
    }
}

impl Child for PersistentVolumeClaim {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.pvcs
    }
}

impl Child for k8s_openapi::api::policy::v1::PodDisruptionBudget {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.pdbs
    }
}

impl Child for NetworkPolicy {
    fn cache(caches: &Caches) -> &Store<Self::Cached> {
        &caches.network_policies
    }
}

/// What the applier did in one reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Children that exist but are controlled by another object ("Kind name").
    pub blocked: Vec<String>,
    /// Children created, adopted, updated or deleted (not yet visible as converged).
    pub changed: Vec<String>,
    /// What was written, by event reason ("Created", "Adopted", "Updated").
    pub applied: Vec<(EventReason, String)>,
}

impl Report {
    /// Whether this reconcile created the child `what` ("Kind name", as [`described`] says).
    pub(crate) fn created(&self, what: &str) -> bool {
        self.applied
            .iter()
            .any(|(reason, w)| *reason == EventReason::Created && w == what)
    }
}

/// A child as the report names it: "Kind name".
pub(crate) fn described<K: Resource<DynamicType = ()>>(name: &str) -> String {
    format!("{} {name}", K::kind(&()))
}

/// What one write of a child did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    Unchanged,
    /// Controlled by another object (`by`): left alone.
    Blocked {
        what: String,
        by: String,
    },
    /// Created, adopted or updated.
    Applied {
        reason: EventReason,
        what: String,
    },
    /// Deleted: switched off in the spec.
    Removed(String),
}

/// Applies the children of one QuestDB.
pub(crate) struct Applier<'a> {
    ctx: &'a Context,
    qdb: &'a QuestDB,
    uid: String,
    ns: String,
    pub report: Report,
}

impl<'a> Applier<'a> {
    /// Goes on from `report` (what earlier steps of the same reconcile applied).
    pub(crate) fn new(ctx: &'a Context, qdb: &'a QuestDB, report: Report) -> Result<Self, Error> {
        Ok(Self {
            ctx,
            qdb,
            uid: qdb.uid().ok_or(Error::MissingUid)?,
            ns: qdb.namespace().ok_or(Error::MissingNamespace)?,
            report,
        })
    }

    pub(crate) fn context(&self) -> &'a Context {
        self.ctx
    }

    /// The existing child of this name, from its cache.
    pub(crate) fn cached<K: Child>(&self, name: &str) -> Option<std::sync::Arc<K::Cached>> {
        K::cache(&self.ctx.caches).get(&ObjectRef::new(name).within(&self.ns))
    }

    /// Brings one child in line with `desired`.
    pub(crate) async fn apply<K: Child>(&mut self, desired: K) -> Result<(), Error> {
        let written = self.write(desired).await?;
        self.record(written).await;
        Ok(())
    }

    /// Brings one child in line with `desired` and says what it did, for [`Self::record`]:
    /// independent children are written at once, each reconcile of a new database being
    /// otherwise a chain of round trips to the apiserver.
    pub(crate) async fn write<K: Child>(&self, mut desired: K) -> Result<Written, Error> {
        let name = desired.name_any();
        let what = described::<K>(&name);
        if K::SERVER_SIDE_APPLY {
            children::stamp_applied_hash(&mut desired);
        }
        let existing = self.cached::<K>(&name);
        let action = children::decide(&desired, existing.as_deref(), &self.uid);
        let api: Api<K> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let mut applied = children::apply(&api, &desired, existing.as_deref(), &action).await;
        if matches!(applied, Ok(Applied::Stale)) && action == ChildAction::Create {
            // The object exists but is not in our cache: created a moment ago, or stripped of the
            // operator's labels (the caches only see labelled children). Decide on the live one.
            let live = api
                .get_opt(&name)
                .await
                .map_err(Error::Kube)?
                .map(K::to_cached);
            let action = children::decide(&desired, live.as_ref(), &self.uid);
            applied = children::apply(&api, &desired, live.as_ref(), &action).await;
        }
        match applied {
            Ok(Applied::Unchanged) => Ok(Written::Unchanged),
            Ok(Applied::Blocked(by)) => Ok(Written::Blocked { what, by }),
            Ok(Applied::Stale) => {
                debug!(child = %what, "cache behind the apiserver; will retry");
                Err(Error::StaleCache(what))
            }
            Ok(done) => {
                let (reason, verb) = match done {
                    Applied::Created => (EventReason::Created, "created"),
                    Applied::Adopted => (EventReason::Adopted, "adopted"),
                    _ => (EventReason::Updated, "updated"),
                };
                info!(questdb = %self.qdb.name_any(), child = %what, "{verb}");
                Ok(Written::Applied { reason, what })
            }
            Err(e) => {
                let note = format!(
                    "could not apply {what}: {}",
                    crate::controllers::short_error(&e)
                );
                self.ctx
                    .event(
                        self.qdb,
                        EventType::Warning,
                        EventReason::ApplyFailed,
                        "Reconcile",
                        note,
                    )
                    .await;
                Err(Error::Write {
                    verb: "writing",
                    what,
                    source: e,
                })
            }
        }
    }

    /// Deletes the child `name` when this QuestDB controls it (never one it does not), `why`
    /// for the log, and says what it did for [`Self::record`].
    pub(crate) async fn remove<K: Child>(&self, name: &str, why: &str) -> Result<Written, Error> {
        let Some(existing) = self
            .cached::<K>(name)
            .filter(|o| children::controlled_by(o.as_ref(), &self.uid))
        else {
            return Ok(Written::Unchanged);
        };
        let api: Api<K> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let what = described::<K>(name);
        children::delete_owned(&api, existing.as_ref())
            .await
            .map_err(|source| Error::Write {
                verb: "deleting",
                what: what.clone(),
                source,
            })?;
        info!(questdb = %self.qdb.name_any(), child = %what, "deleted ({why})");
        Ok(Written::Removed(what))
    }

    /// Adds what a write did to the report, in the order the caller records them (the events
    /// and the status name children in that order), and warns of a conflict.
    pub(crate) async fn record(&mut self, written: Written) {
        match written {
            Written::Unchanged => {}
            Written::Blocked { what, by } => self.blocked(what, by).await,
            Written::Applied { reason, what } => {
                self.report.applied.push((reason, what.clone()));
                self.report.changed.push(what);
            }
            Written::Removed(what) => self.report.changed.push(what),
        }
    }

    /// One Warning per distinct conflict: the status already names reported ones.
    async fn blocked(&mut self, what: String, by: String) {
        let reported = self.qdb.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == crate::api::conditions::READY
                    && c.reason == ReadyReason::ChildConflict
                    && c.message.split(", ").any(|m| m.ends_with(&what))
            })
        });
        if !reported {
            let note = format!("{what} is controlled by {by}; leaving it alone");
            self.ctx
                .event(
                    self.qdb,
                    EventType::Warning,
                    EventReason::ChildConflict,
                    "Reconcile",
                    note,
                )
                .await;
        }
        self.report.blocked.push(what);
    }
}

impl Report {
    /// One event per reason ("created ConfigMap a, Service b, ..."), not one per child: fewer
    /// writes, and every child named. The recorder folds events with the same key into one
    /// series that keeps its first note, so the action carries a digest of the note: a repeat
    /// of the same change is counted in its series, a different change is a new event.
    pub(crate) async fn publish(&self, qdb: &QuestDB, ctx: &Context) {
        for reason in [
            EventReason::Created,
            EventReason::Adopted,
            EventReason::Updated,
        ] {
            let what: Vec<&str> = self
                .applied
                .iter()
                .filter(|(r, _)| *r == reason)
                .map(|(_, w)| w.as_str())
                .collect();
            if what.is_empty() {
                continue;
            }
            let note = format!("{} {}", reason.as_str().to_lowercase(), what.join(", "));
            let digest = {
                use sha2::Digest;
                hex::encode(&sha2::Sha256::digest(note.as_bytes())[..4])
            };
            ctx.event(
                qdb,
                EventType::Normal,
                reason,
                &format!("Reconcile-{digest}"),
                note,
            )
            .await;
        }
    }
}
