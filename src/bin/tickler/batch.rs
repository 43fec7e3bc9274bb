//! `tickler batch ID`: a batch's description, times, counters and
//! callbacks (with their states); and what a job is to its batch, for
//! `tickler show`.

use crate::cli::BatchArgs;
use crate::display::{self, Times};
use crate::error::CliError;
use serde_json::json;
use std::path::Path;
use tickler::{Batch, BatchId, Job, Queue};

/// What a job is to the batch its [`Job::batch`] names.
pub struct Membership {
    /// The batch's id.
    pub id: BatchId,
    /// `member`, or the callback's role (`on_success`, ...); `None` if
    /// the batch is gone.
    pub role: Option<&'static str>,
}

/// What `job` is to its batch; `None` for a job of no batch.
pub fn membership(queue: &Queue, job: &Job) -> tickler::Result<Option<Membership>> {
    let Some(id) = job.batch else {
        return Ok(None);
    };
    let batch = match queue.batch(id) {
        Ok(batch) => Some(batch),
        Err(tickler::Error::BatchNotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let role = batch.as_ref().map(|b| display::batch_role(b, job.id));
    Ok(Some(Membership { id, role }))
}

/// The state of each of `batch`'s callbacks, with its role; `None` for
/// one pruned since.
pub fn callback_states(
    queue: &Queue,
    batch: &Batch,
) -> tickler::Result<Vec<(&'static str, tickler::JobId, Option<Job>)>> {
    display::batch_callbacks(batch)
        .into_iter()
        .map(|(role, id)| match queue.get(id) {
            Ok(job) => Ok((role, id, Some(job))),
            Err(tickler::Error::NotFound(_)) => Ok((role, id, None)),
            Err(e) => Err(e),
        })
        .collect()
}

/// Members that have ended: `members - remaining`.
pub fn ended(batch: &Batch) -> u64 {
    batch.members.saturating_sub(batch.remaining)
}

/// `tickler batch ID`.
pub fn show(db: &Path, args: &BatchArgs, times: Times) -> Result<(), CliError> {
    let queue = crate::ops::open(db, false)?;
    let lib = |e| CliError::from_lib(e, db);
    let batch = queue.batch(BatchId(args.id)).map_err(lib)?;
    let callbacks = callback_states(&queue, &batch).map_err(lib)?;
    let state_of = |job: &Option<Job>| job.as_ref().map_or("pruned", |j| j.state.as_str());
    if args.json {
        let mut json = json!({
            "id": batch.id.0,
            "description": batch.description,
            "created_at": display::rfc3339(batch.created_at),
            "sealed_at": batch.sealed_at.map(display::rfc3339),
            "finished_at": batch.finished_at.map(display::rfc3339),
            "members": batch.members,
            "remaining": batch.remaining,
            "succeeded": batch.succeeded,
            "dead": batch.dead,
            "cancelled": batch.cancelled,
        });
        for role in ["on_success", "on_failure", "on_finish"] {
            json[role] = serde_json::Value::Null;
        }
        for (role, id, job) in &callbacks {
            json[*role] = json!({ "id": id.0, "state": job.as_ref().map(|j| j.state.as_str()) });
        }
        println!("{json}");
        return Ok(());
    }
    let mut fields: Vec<(&str, String)> = vec![
        ("id", batch.id.to_string()),
        (
            "description",
            display::safe_lines(batch.description.as_deref().unwrap_or("-")).into_owned(),
        ),
        ("created_at", times.show(batch.created_at)),
        (
            "sealed_at",
            batch.sealed_at.map_or_else(
                || "- (open: jobs can still join it)".to_owned(),
                |t| times.show(t),
            ),
        ),
        ("finished_at", times.show_opt(batch.finished_at)),
        (
            "ended",
            format!("{} of {} members", ended(&batch), batch.members),
        ),
        ("remaining", batch.remaining.to_string()),
        ("succeeded", batch.succeeded.to_string()),
        ("dead", batch.dead.to_string()),
        ("cancelled", batch.cancelled.to_string()),
    ];
    for role in ["on_success", "on_failure", "on_finish"] {
        let shown = callbacks.iter().find(|(r, _, _)| *r == role).map_or_else(
            || "-".to_owned(),
            |(_, id, job)| format!("job {id} ({})", state_of(job)),
        );
        fields.push((role, shown));
    }
    display::print_fields(&fields);
    Ok(())
}
