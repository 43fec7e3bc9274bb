//! `/batches/ID`: one batch: its description, times, counters with a
//! progress bar (members ended of members), its callbacks with their
//! states, and its members [`PAGE`] at a time by id
//! ([`Queue::batch_members`] from an `after` cursor), each with its
//! state, last error and output, shortened. The job page names the batch
//! of a member or callback ([`job_row`]). Like every page: no script, all
//! stored text escaped, outputs with `--hide-payload-key` values hidden.

use super::find::{field_row, frame, time, time_or_dash, Hide};
use super::{cut, esc, form_value};
use crate::batch::{callback_states, ended, membership};
use std::fmt::Write as _;
use tickler::{BatchId, Job, JobId, Queue};

/// Members per page.
pub(super) const PAGE: usize = 50;

/// Bytes of a member's output (as compact JSON) and of its last error's
/// first line shown in its row; its job page has them whole.
const SHOWN: usize = 200;

/// `GET /batches/ID?after=JOB`.
pub(super) fn page(queue: &Queue, id: &str, query: &str, hide: &Hide) -> tickler::Result<String> {
    let id = id
        .parse::<i64>()
        .map(BatchId)
        .map_err(|_| tickler::Error::InvalidArgument(format!("{id:?} is not a batch id")))?;
    let after = form_value(query, "after")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<i64>().map(JobId).map_err(|_| {
                tickler::Error::InvalidArgument(format!("after={v:?} is not a job id"))
            })
        })
        .transpose()?;
    let batch = queue.batch(id)?;
    // One more than shown, to know whether there is a next page.
    let mut members = queue.batch_members(id, after, PAGE + 1)?;
    let more = members.len() > PAGE;
    members.truncate(PAGE);
    let now = queue.clock().now();

    let mut body = String::from("<table id=fields>");
    let mut row = |name: &str, value: String| field_row(&mut body, name, &value);
    row(
        "description",
        batch.description.as_deref().map_or_else(|| "-".into(), esc),
    );
    row("created", time(now, batch.created_at));
    row(
        "sealed",
        batch.sealed_at.map_or_else(
            || "- (open: jobs can still join it)".into(),
            |t| time(now, t),
        ),
    );
    row("finished", time_or_dash(now, batch.finished_at));
    body.push_str("</table>");

    let ended = ended(&batch);
    let _ = write!(
        body,
        "<p id=progress><progress value={ended} max={max}></progress> {ended} of {} members ended</p>\
         <table id=counters><tr><th>members</th><th>remaining</th><th>succeeded</th><th>dead</th><th>cancelled</th></tr>\
         <tr><td class=n data-counter=members>{}</td><td class=n data-counter=remaining>{}</td>\
         <td class=n data-counter=succeeded>{}</td><td class=n data-counter=dead>{}</td>\
         <td class=n data-counter=cancelled>{}</td></tr></table>",
        batch.members,
        batch.members,
        batch.remaining,
        batch.succeeded,
        batch.dead,
        batch.cancelled,
        // A batch with no member yet shows an empty bar, not a full one.
        max = batch.members.max(1),
    );

    body.push_str(
        "<h2>Callbacks</h2><table id=callbacks><tr><th>callback</th><th>job</th><th>kind</th><th>state</th><th>note</th></tr>",
    );
    let callbacks = callback_states(queue, &batch)?;
    if callbacks.is_empty() {
        body.push_str("<tr><td colspan=5>none</td></tr>");
    }
    for (role, job_id, job) in &callbacks {
        let (kind, state, note) = match job {
            Some(job) => (esc(&job.kind), job.state.as_str(), last_error(job)),
            None => ("-".into(), "pruned", String::new()),
        };
        let _ = write!(
            body,
            "<tr data-role={role}><td>{role}</td><td><a href=/jobs/{job_id}>{job_id}</a></td>\
             <td>{kind}</td><td data-column=state>{state}</td><td class=err>{note}</td></tr>"
        );
    }
    body.push_str("</table>");

    let _ = write!(
        body,
        "<h2>Members{}</h2><table id=members><tr><th>id</th><th>kind</th><th>state</th>\
         <th>attempts</th><th>finished</th><th>output</th><th>last error</th></tr>",
        after.map_or_else(String::new, |a| format!(" after job {a}"))
    );
    for job in &members {
        let _ = write!(
            body,
            "<tr data-id={id}><td><a href=/jobs/{id}>{id}</a></td><td>{}</td>\
             <td data-column=state>{}</td><td class=n>{}/{}</td><td>{}</td>\
             <td class=output><code>{}</code></td><td class=err>{}</td></tr>",
            esc(&job.kind),
            job.state.as_str(),
            job.attempts,
            job.max_attempts,
            time_or_dash(now, job.finished_at),
            output(job, hide),
            last_error(job),
            id = job.id,
        );
    }
    if members.is_empty() {
        body.push_str("<tr><td colspan=7>no members</td></tr>");
    }
    body.push_str("</table>");
    if after.is_some() {
        let _ = write!(body, "<a id=first href=/batches/{id}>first members</a> ");
    }
    if let (true, Some(last)) = (more, members.last()) {
        let _ = write!(
            body,
            "<a id=next href=\"/batches/{id}?after={}\">next {PAGE} members</a>",
            last.id
        );
    }
    Ok(frame(&format!("batch {id}"), &body))
}

/// A member's output as compact JSON, its hidden keys' values replaced,
/// shortened to [`SHOWN`] bytes and escaped; empty if it has none.
fn output(job: &Job, hide: &Hide) -> String {
    let Some(output) = &job.output else {
        return String::new();
    };
    let text = serde_json::to_string(&hide.redact(output)).unwrap_or_default();
    let mut left = 0;
    esc(&cut(&text, SHOWN, &mut left))
}

/// The first line of a job's last error, shortened and escaped (a
/// cancelled callback's says why).
fn last_error(job: &Job) -> String {
    let first = job
        .last_error
        .as_deref()
        .and_then(|e| e.lines().next())
        .unwrap_or("");
    let mut left = 0;
    esc(&cut(first, SHOWN, &mut left))
}

/// The job page's `batch` row: what the job is to its batch, linked to
/// the batch's page (its `why` row says what a waiting callback waits
/// for); `None` for a job of no batch.
pub(super) fn job_row(queue: &Queue, job: &Job) -> tickler::Result<Option<String>> {
    let Some(m) = membership(queue, job)? else {
        return Ok(None);
    };
    let link = format!("<a href=/batches/{id} id=batch>batch {id}</a>", id = m.id);
    let row = match m.role {
        Some("member") => format!("member of {link}"),
        Some(role) => format!("{role} callback of {link}"),
        None => format!("of batch {} (the batch is gone: pruned)", m.id),
    };
    Ok(Some(row))
}
