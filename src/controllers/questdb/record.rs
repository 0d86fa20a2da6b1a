//! Status records of the cloud steps: each is written (with the object's resourceVersion)
//! before the side effect it announces, and an event goes out only when a condition is news.

use kube::api::{Api, PostParams};
use kube::ResourceExt;

use crate::api::{QuestDB, QuestDBStatus, MANAGER};
use crate::controllers::conditions::Verdict;
use crate::controllers::context::Context;
use crate::controllers::Error;

/// Writes `edit` of the status (with the object's resourceVersion, so a stale view of the
/// status yields a conflict instead of being acted on) and continues with the stored object.
pub async fn persist(
    qdb: &mut QuestDB,
    ctx: &Context,
    mut edit: impl FnMut(&mut QuestDBStatus),
) -> Result<(), Error> {
    let api: Api<QuestDB> =
        Api::namespaced(ctx.client.clone(), &qdb.namespace().unwrap_or_default());
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    // A user's edit of the spec between two writes of one reconcile bumps resourceVersion: the
    // record of a side effect already done (a DNS record written, an instance switched) must
    // not be lost to that conflict, so the edit is applied again to the object as it is now.
    // The operator is the only writer of status, so re-applying it is the same record.
    for attempt in 0.. {
        let mut obj = qdb.clone();
        let mut status = obj.status.take().unwrap_or_default();
        edit(&mut status);
        obj.status = Some(status);
        obj.metadata.managed_fields = None;
        match api.replace_status(&qdb.name_any(), &pp, &obj).await {
            Ok(written) => {
                *qdb = written;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 3 => {
                *qdb = api.get(&qdb.name_any()).await.map_err(Error::Kube)?;
            }
            Err(e) => return Err(Error::from_status_write(e)),
        }
    }
    unreachable!("the loop returns")
}

/// The condition already says this: its event was sent when it first did.
pub fn already_reported(status: &QuestDBStatus, c: &Verdict) -> bool {
    status
        .conditions
        .iter()
        .any(|k| k.type_ == c.type_ && k.reason == c.reason && k.message == c.message)
}
