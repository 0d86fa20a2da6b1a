//! What every reconcile shares: the client, one event recorder, the caches, metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::runtime::events::Recorder;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use tracing::warn;

use crate::api::{EventReason, QuestDB};

use crate::cache::{Caches, CheckpointWatch, CredentialsCache, DiskWatch, KeyCache, WriteHealth};
use crate::controllers::cloud_runtime::CloudRuntime;
pub(crate) use crate::controllers::keys::{polled, questdb_ref, GuardedQuestDB};
use crate::controllers::questdb::status_write::StatusWrite;
use crate::metrics::Metrics;

pub(crate) struct Context {
    pub client: Client,
    /// One recorder for the whole manager so its event series cache is shared.
    pub recorder: Recorder,
    pub caches: Caches,
    pub metrics: Arc<Metrics>,
    pub keys: KeyCache,
    pub credentials: CredentialsCache,
    /// Consecutive failures per object, for backoff and the retries metric.
    pub failures: Mutex<HashMap<ObjectRef<GuardedQuestDB>, u32>>,
    /// Node and DNS providers; `None` runs without dedicated nodes.
    pub cloud: Option<Arc<CloudRuntime>>,
    /// Asks the controller to reconcile another QuestDB (a freed node-move slot wakes the
    /// moves queued behind it instead of leaving them to their next poll).
    pub wake: Option<Wake>,
    /// The operator's own namespace (`POD_NAMESPACE`): its pods are admitted to each
    /// database's HTTP port (backups). `None` outside a pod.
    pub operator_namespace: Option<String>,
    /// The newest `WriteHealthy` verdict per QuestDB (see `write_health`).
    pub write_health: WriteHealth,
    /// The newest `CheckpointReleased` verdict per QuestDB (see `checkpoint_watch`).
    pub checkpoints: CheckpointWatch,
    /// The volumes' usage and suspended tables, written by the same poll.
    pub disk: DiskWatch,
    /// Clients for the kubelets' Summary API (`None`: the nodes are not watched, as in a
    /// namespaced install, and no usage is read).
    pub kubelets: Option<Arc<crate::kubelet_stats::Kubelets>>,
    /// The backup controller's cache of QuestDBBackups, once it runs (the checkpoint watchdog
    /// reads which backup opened a checkpoint).
    pub backups: std::sync::OnceLock<Store<crate::api::QuestDBBackup>>,
    /// When each QuestDB's status was last written and since when progress waits, for those
    /// whose window or settle still runs ([`StatusWrite::live`]): progress within a phase
    /// waits out [`StatusWrite::wait`].
    pub status_writes: Mutex<HashMap<ObjectRef<GuardedQuestDB>, StatusWrite>>,
    /// The platform team's allow-lists for images, priority classes and tolerations.
    pub tenancy: crate::desired::TenancyPolicy,
    /// What the newest preflight found wrong (see [`crate::controllers::preflight`]).
    pub preflight: crate::plan::preflight::PreflightState,
    /// Operator upgrades at a bounded rate (see [`crate::plan::operator_rollout`]).
    pub rolls: crate::plan::operator_rollout::OperatorRollouts,
}

pub(crate) type Wake = futures::channel::mpsc::UnboundedSender<ObjectRef<GuardedQuestDB>>;

impl Context {
    /// Publishes an event about `qdb`. Failing to record an event must never fail a reconcile.
    pub(crate) async fn event(
        &self,
        qdb: &QuestDB,
        type_: EventType,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        self.event_for(&qdb.object_ref(&()), type_, reason, action, note)
            .await
    }

    /// Publishes an event about any object. Failing to record an event must never fail a
    /// reconcile.
    pub(crate) async fn event_for(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.as_str().into(),
            note: Some(truncate(note, 1024)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            warn!(error = %e, %reason, "could not record event");
        }
    }

    /// Asks for a reconcile of the QuestDB `key` now (a background look saw something that
    /// changes its decision). Nothing when the controller is not running.
    pub(crate) fn wake_questdb(&self, key: ObjectRef<GuardedQuestDB>) {
        if let Some(wake) = &self.wake {
            let _ = wake.unbounded_send(key);
        }
    }

    pub(crate) fn metrics_conditions(&self, before: &[Condition], after: &[Condition]) {
        for c in crate::plan::conditions::transitions(before, after) {
            self.metrics
                .condition_transition(&c.type_, &c.status, &c.reason);
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
