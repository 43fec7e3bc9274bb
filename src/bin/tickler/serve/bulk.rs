//! Bulk actions with the safety of the single ones: a POST (with the CSRF
//! token) to `/confirm` shows how many jobs or schedules the action would
//! change and a second form; its POST to `/bulk` (with the token again)
//! does it and redirects to the dashboard, which then says what was done.
//! GET changes nothing. The sentence that says what was done is kept here
//! under a random id and the redirect names only the id, so that no link
//! can make the page show text of its author's choosing.

use super::{esc, form_value, COUNT_CAP};
use std::collections::VecDeque;
use std::fmt::Write as _;
use tickler::{JobState, Queue};

/// Sentences kept for the redirect after an action: enough for a few
/// browsers acting at once.
const DONE_KEPT: usize = 32;

/// One bulk action and what it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// Dead jobs of a queue and of a kind (each if given) made pending.
    RetryDead {
        queue: Option<String>,
        kind: Option<String>,
    },
    /// Dead jobs of a queue and of a kind (each if given) deleted.
    DeleteDead {
        queue: Option<String>,
        kind: Option<String>,
    },
    /// Pending jobs of a queue and of a kind (each if given) cancelled.
    CancelPending {
        queue: Option<String>,
        kind: Option<String>,
    },
    PauseSchedule(String),
    ResumeSchedule(String),
}

impl Action {
    /// The action a form asks for.
    pub fn from_form(body: &str) -> tickler::Result<Action> {
        let field = |name: &str| form_value(body, name).filter(|v| !v.trim().is_empty());
        let schedule = || {
            field("schedule")
                .ok_or_else(|| tickler::Error::InvalidArgument("a schedule name is needed".into()))
        };
        let (queue, kind) = (field("queue"), field("kind"));
        match form_value(body, "action").as_deref() {
            Some("retry-dead") => Ok(Action::RetryDead { queue, kind }),
            Some("delete-dead") => Ok(Action::DeleteDead { queue, kind }),
            Some("cancel-pending") => Ok(Action::CancelPending { queue, kind }),
            Some("pause-schedule") => Ok(Action::PauseSchedule(schedule()?)),
            Some("resume-schedule") => Ok(Action::ResumeSchedule(schedule()?)),
            other => Err(tickler::Error::InvalidArgument(format!(
                "unknown bulk action {:?}",
                other.unwrap_or("")
            ))),
        }
    }

    /// Its form fields, for the confirm page's second form.
    fn fields(&self) -> Vec<(&'static str, &str)> {
        let (action, queue, kind) = match self {
            Action::RetryDead { queue, kind } => ("retry-dead", queue, kind),
            Action::DeleteDead { queue, kind } => ("delete-dead", queue, kind),
            Action::CancelPending { queue, kind } => ("cancel-pending", queue, kind),
            Action::PauseSchedule(name) => {
                return vec![("action", "pause-schedule"), ("schedule", name)]
            }
            Action::ResumeSchedule(name) => {
                return vec![("action", "resume-schedule"), ("schedule", name)]
            }
        };
        let mut fields = vec![("action", action)];
        fields.extend(queue.as_deref().map(|q| ("queue", q)));
        fields.extend(kind.as_deref().map(|k| ("kind", k)));
        fields
    }
}

/// "of queue mail", "of kind email", "of kind email in queue mail", or
/// "in every queue".
fn scope(queue: &Option<String>, kind: &Option<String>) -> String {
    match (queue, kind) {
        (Some(q), None) => format!("of queue {q}"),
        (None, Some(k)) => format!("of kind {k}"),
        (Some(q), Some(k)) => format!("of kind {k} in queue {q}"),
        (None, None) => "in every queue".to_owned(),
    }
}

fn jobs(n: u64) -> String {
    format!("{n} dead job{}", if n == 1 { "" } else { "s" })
}

fn pending(n: u64) -> String {
    format!("{n} pending job{}", if n == 1 { "" } else { "s" })
}

/// How many jobs (or schedules) `action` would change now, and whether
/// the count stopped at the cap. A schedule that does not exist is
/// `Error::NotFound`-like: a clear error, not a count of 0.
fn count(queue: &Queue, action: &Action) -> tickler::Result<(u64, bool)> {
    match action {
        Action::RetryDead { queue: q, kind } | Action::DeleteDead { queue: q, kind } => {
            let n = queue.ops().count_matching(
                JobState::Dead,
                q.as_deref(),
                kind.as_deref(),
                COUNT_CAP,
            )?;
            Ok((n, n >= COUNT_CAP))
        }
        Action::CancelPending { queue: q, kind } => {
            let n = queue.ops().count_matching(
                JobState::Pending,
                q.as_deref(),
                kind.as_deref(),
                COUNT_CAP,
            )?;
            Ok((n, n >= COUNT_CAP))
        }
        Action::PauseSchedule(name) | Action::ResumeSchedule(name) => {
            let s = queue.get_schedule(name)?;
            let changes = s.paused != matches!(action, Action::PauseSchedule(_));
            Ok((u64::from(changes), false))
        }
    }
}

/// The count as the confirm page shows it and its form sends it back:
/// `100000+` when it stopped at the cap.
fn count_text(n: u64, capped: bool) -> String {
    format!("{n}{}", if capped { "+" } else { "" })
}

/// The confirm page: what would change, how much, and the form that does
/// it.
pub(super) fn confirm_page(queue: &Queue, csrf: &str, body: &str) -> tickler::Result<String> {
    let action = Action::from_form(body)?;
    let (n, capped) = count(queue, &action)?;
    Ok(confirm_html(csrf, &action, n, capped, None))
}

/// The confirm page of `action` with its count `n`, after `changed` (the
/// count the operator confirmed, when it is no longer the count now).
fn confirm_html(
    csrf: &str,
    action: &Action,
    n: u64,
    capped: bool,
    changed: Option<&str>,
) -> String {
    let plus = if capped {
        " (at least; the count stops there)"
    } else {
        ""
    };
    let (question, label) = match action {
        Action::RetryDead { queue, kind } => (
            format!("Retry {} {}?{plus} Each is made pending, due now, with fresh attempts; one whose unique key another job holds stays dead.", jobs(n), scope(queue, kind)),
            format!("retry {}", jobs(n)),
        ),
        Action::DeleteDead { queue, kind } => (
            format!("Delete {} {}?{plus} They and their errors are gone for good.", jobs(n), scope(queue, kind)),
            format!("delete {}", jobs(n)),
        ),
        Action::CancelPending { queue, kind } => (
            format!("Cancel {} {}?{plus} Jobs due later, blocked or running are left alone.", pending(n), scope(queue, kind)),
            format!("cancel {}", pending(n)),
        ),
        Action::PauseSchedule(name) => (
            if n == 0 { format!("Schedule {name} is already paused.") } else { format!("Pause schedule {name}? 1 schedule stops ticking until resumed.") },
            format!("pause schedule {name}"),
        ),
        Action::ResumeSchedule(name) => (
            if n == 0 { format!("Schedule {name} is not paused.") } else { format!("Resume schedule {name}? 1 schedule ticks again from its next time.") },
            format!("resume schedule {name}"),
        ),
    };
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=utf-8><title>tickler: confirm</title>\
         <style>body{font-family:sans-serif;margin:1.5em}</style></head><body><h1>Confirm</h1>",
    );
    if let Some(confirmed) = changed {
        let _ = write!(
            html,
            "<p id=changed role=alert>Nothing was done: the count changed since the confirm page \
             (it said {}). Confirm again.</p>",
            esc(confirmed)
        );
    }
    let _ = write!(
        html,
        "<p id=confirm-what>{}</p><p>Count: <strong id=confirm-count>{}</strong></p>",
        esc(&question),
        count_text(n, capped)
    );
    if n > 0 {
        let _ = write!(
            html,
            "<form method=post action=/bulk><input type=hidden name=csrf value={csrf}>\
             <input type=hidden name=count value=\"{}\">",
            count_text(n, capped)
        );
        for (name, value) in action.fields() {
            let _ = write!(
                html,
                "<input type=hidden name={name} value=\"{}\">",
                esc(value)
            );
        }
        let _ = write!(
            html,
            "<button type=submit id=confirm>{}</button></form> ",
            esc(&label)
        );
    } else {
        html.push_str("<p id=nothing>Nothing to do.</p>");
    }
    html.push_str(
        "<p><a href=/ id=back>back to the dashboard, changing nothing</a></p></body></html>",
    );
    html
}

/// What a POST to `/bulk` did.
pub(super) enum Ran {
    /// The sentence that says what the action did.
    Done(String),
    /// Nothing: the action would change another number of jobs than the
    /// operator confirmed (jobs died, were retried or enqueued since the
    /// confirm page). The confirm page again, with the count now.
    Changed(String),
}

/// Does the action if it would change as many jobs as the operator
/// confirmed (the `count` field of the confirm page's form), so that jobs
/// that came in while the confirm page was open are not deleted or retried
/// unseen; the recount and the action are not one transaction, which
/// narrows the gap to the time between two statements.
pub(super) fn run(queue: &Queue, csrf: &str, body: &str) -> tickler::Result<Ran> {
    let action = Action::from_form(body)?;
    let (n, capped) = count(queue, &action)?;
    let confirmed = form_value(body, "count").unwrap_or_default();
    if confirmed != count_text(n, capped) {
        return Ok(Ran::Changed(confirm_html(
            csrf,
            &action,
            n,
            capped,
            Some(&confirmed),
        )));
    }
    Ok(Ran::Done(match action {
        Action::RetryDead { queue: q, kind } => {
            let (retried, kept) = queue.retry_dead_matching(q.as_deref(), kind.as_deref())?;
            let mut done = format!("retried {} {}", jobs(retried), scope(&q, &kind));
            if kept > 0 {
                let _ = write!(
                    done,
                    "; {} kept dead: another unfinished job holds its unique key",
                    jobs(kept)
                );
            }
            done
        }
        Action::DeleteDead { queue: q, kind } => {
            let n = queue.delete_dead(q.as_deref(), kind.as_deref())?;
            format!("deleted {} {}", jobs(n), scope(&q, &kind))
        }
        Action::CancelPending { queue: q, kind } => {
            let n = queue.cancel_pending(q.as_deref(), kind.as_deref())?;
            format!("cancelled {} {}", pending(n), scope(&q, &kind))
        }
        Action::PauseSchedule(name) => {
            queue.pause_schedule(&name)?;
            format!("paused schedule {name}")
        }
        Action::ResumeSchedule(name) => {
            queue.resume_schedule(&name)?;
            format!("resumed schedule {name}")
        }
    }))
}

/// The sentences of the last actions, under random ids.
#[derive(Default)]
pub(super) struct Done(std::sync::Mutex<VecDeque<(String, String)>>);

impl Done {
    /// Keeps `what` and returns the id the redirect names.
    pub fn keep(&self, what: String) -> String {
        let id = format!("{:016x}", fastrand::u64(..));
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= DONE_KEPT {
            kept.pop_front();
        }
        kept.push_back((id.clone(), what));
        id
    }

    /// The page's line for `?done=ID`, or nothing for an id not kept.
    pub fn html(&self, query: &str) -> String {
        let Some(id) = form_value(query, "done") else {
            return String::new();
        };
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .find(|(k, _)| *k == id)
            .map(|(_, what)| format!("<p id=done role=status>Done: {}.</p>", esc(what)))
            .unwrap_or_default()
    }
}
