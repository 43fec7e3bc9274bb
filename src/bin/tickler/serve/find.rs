//! Finding jobs on the dashboard: `/jobs`, one state's jobs a page at a
//! time (`Ops::page`, by key), filtered by queue, kind and, for scheduled
//! jobs, retrying or delayed on purpose, with a search by id or unique
//! key; and `/jobs/ID`, one job with all it holds: its fields, its lease
//! and holder, its whole error history, progress, output, limit and
//! payload. Every page works without JavaScript (the CSP allows none):
//! filters are a GET form, pages are links.
//!
//! Payloads can carry secrets: `--hide-payload` keeps every payload off
//! the pages, and `--hide-payload-key KEY` replaces the value of each
//! object key `KEY`, at any depth, of payloads and outputs by
//! `"[hidden]"` before the page is built, so a hidden value never reaches
//! the HTML.

use super::{button, esc, form_value};
use chrono::{DateTime, Utc};
use std::fmt::Write as _;
use tickler::{Job, JobCursor, JobId, JobPage, JobState, Queue};

/// Jobs per page of `/jobs`.
pub(super) const PAGE: usize = 50;

/// What stands in for a hidden value.
const HIDDEN: &str = "[hidden]";

/// What of payloads the pages leave out (`--hide-payload`,
/// `--hide-payload-key`).
#[derive(Debug, Clone, Default)]
pub(super) struct Hide {
    /// No payload is shown at all.
    pub all: bool,
    /// Object keys whose values are hidden, at any depth, whatever the
    /// case of their ASCII letters: a payload's `Password` is as secret
    /// as its `password`.
    pub keys: Vec<String>,
}

impl Hide {
    /// `value` with the value of every object key of [`Hide::keys`]
    /// replaced by `"[hidden]"`, at any depth.
    pub(super) fn redact(&self, value: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let v = if self.keys.iter().any(|h| h.eq_ignore_ascii_case(k)) {
                            Value::String(HIDDEN.into())
                        } else {
                            self.redact(v)
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.redact(v)).collect()),
            other => other.clone(),
        }
    }
}

/// A value for a query string.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// How long ago (or how far ahead) `t` is from `now`, in words: "3 min
/// ago", "in 2 h".
fn relative(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let ms = (now - t).num_milliseconds();
    let words = span(ms.unsigned_abs());
    if ms >= 0 {
        format!("{words} ago")
    } else {
        format!("in {words}")
    }
}

/// A span of `ms` milliseconds in its largest whole unit.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `t` in words relative to `now`, with the exact time (UTC) on hover.
pub(super) fn time(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let exact = t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    format!(
        "<time datetime=\"{exact}\" title=\"{exact}\">{}</time>",
        relative(now, t)
    )
}

/// As [`time`], or `-`.
pub(super) fn time_or_dash(now: DateTime<Utc>, t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| time(now, t))
}

/// The page's frame: its title, styles and the way back.
pub(super) fn frame(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{t} - tickler</title>\
         <style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin-bottom:1.5em}}\
         td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}}td.n{{text-align:right}}\
         .err,pre{{font-family:monospace;white-space:pre-wrap}}.err{{color:#a00}}form.filters *{{margin-right:.5em}}</style>\
         </head><body><p><a href=/>tickler</a> / <a href=/jobs>jobs</a></p><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

/// One `name: value` row of a page's fields table (`value` is HTML).
pub(super) fn field_row(body: &mut String, name: &str, value: &str) {
    let _ = write!(
        body,
        "<tr data-field={name}><th>{name}</th><td>{value}</td></tr>"
    );
}

/// A job's last reported progress as a bar with its percentage and
/// message (an HTML `<progress>`: no script), or nothing.
pub(super) fn progress_bar(job: &Job) -> String {
    job.progress.as_ref().map_or_else(String::new, |p| {
        let fraction = p.fraction.clamp(0.0, 1.0);
        format!(
            " <progress class=bar value=\"{fraction:.3}\" max=1></progress> {:.0} % {}",
            fraction * 100.0,
            esc(&p.message)
        )
    })
}

/// What a listed job waits for or did, in words, by its state.
fn when(now: DateTime<Utc>, job: &Job) -> String {
    match job.state {
        JobState::Pending | JobState::Blocked => format!("due {}", time(now, job.run_at)),
        JobState::Scheduled if job.attempts > 0 => format!(
            "retry {}/{} {}",
            job.attempts + 1,
            job.max_attempts,
            time(now, job.run_at)
        ),
        JobState::Scheduled => format!("delayed, due {}", time(now, job.run_at)),
        // A batch's callback waits for its batch, a member for the jobs
        // it runs after: which one, its page says.
        JobState::Waiting => match job.batch {
            Some(b) => format!(
                "waiting since {}, in <a href=/batches/{b}>batch {b}</a>",
                time(now, job.created_at)
            ),
            None => format!(
                "waiting for the jobs it runs after since {}",
                time(now, job.created_at)
            ),
        },
        JobState::Running => {
            format!(
                "running for {} by {}, lease ends {}",
                job.claimed_at.map_or_else(
                    || "-".into(),
                    |t| span((now - t).num_milliseconds().max(0) as u64)
                ),
                esc(job.claimed_by.as_deref().unwrap_or("-")),
                time_or_dash(now, job.lease_expires_at)
            ) + &progress_bar(job)
        }
        JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
            format!("finished {}", time_or_dash(now, job.finished_at))
        }
    }
}

/// `GET /jobs?state=&queue=&kind=&retrying=&after=&q=`: one page of a
/// state's jobs (dead by default), or what a search by id or unique key
/// (`q`) found.
pub(super) fn list(queue: &Queue, query: &str) -> tickler::Result<String> {
    let field = |name| form_value(query, name).filter(|v| !v.is_empty());
    let now = queue.clock().now();
    let state: JobState = field("state").as_deref().unwrap_or("dead").parse()?;
    let retrying = match field("retrying").as_deref() {
        Some("yes") => Some(true),
        Some("no") => Some(false),
        _ => None,
    };
    let page = JobPage {
        state,
        queue: field("queue"),
        kind: field("kind"),
        retrying,
        after: field("after").map(|a| a.parse()).transpose()?,
        limit: PAGE,
    };
    let search = field("q");

    let mut body = String::from(
        "<form class=filters method=get action=/jobs><label>state <select name=state>",
    );
    for s in JobState::ALL {
        let selected = if s == state { " selected" } else { "" };
        let _ = write!(body, "<option{selected}>{}</option>", s.as_str());
    }
    let input = |name: &str, value: &Option<String>| {
        format!(
            "<label>{name} <input name={name} value=\"{}\"></label>",
            esc(value.as_deref().unwrap_or(""))
        )
    };
    let _ = write!(
        body,
        "</select></label>{}{}<label>scheduled <select name=retrying>",
        input("queue", &page.queue),
        input("kind", &page.kind)
    );
    for (value, label, is) in [
        ("", "all", None),
        ("yes", "retrying (failed, waiting for backoff)", Some(true)),
        ("no", "delayed on purpose", Some(false)),
    ] {
        let selected = if is == retrying { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{value}\"{selected}>{label}</option>");
    }
    body.push_str(
        "</select></label><button type=submit id=filter>list</button></form>\
         <form class=filters method=get action=/jobs><label>find by id or unique key \
         <input name=q id=q></label><button type=submit id=search>find</button></form>",
    );

    let (title, jobs, more) = match &search {
        Some(q) => {
            let mut found = Vec::new();
            if let Ok(id) = q.trim().parse::<i64>() {
                match queue.get(JobId(id)) {
                    Ok(job) => found.push(job),
                    Err(tickler::Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if let Some(job) = queue.ops().holding_unique_key(q)? {
                if !found.iter().any(|f| f.id == job.id) {
                    found.push(job);
                }
            }
            (format!("Jobs found for {q:?}"), found, None)
        }
        None => {
            let jobs = queue.ops().page(&page)?;
            let more = match jobs.last() {
                Some(last) if jobs.len() == page.limit => Some(JobCursor::after(last)),
                _ => None,
            };
            (format!("{} jobs", state.as_str()), jobs, more)
        }
    };
    if search.is_some() && jobs.is_empty() {
        body.push_str(
            "<p id=none>No job has that id, and no unfinished job holds that unique key.</p>",
        );
    }
    let _ = write!(
        body,
        "<table id=jobs><tr><th>id</th><th>state</th><th>queue</th><th>kind</th><th>attempts</th><th>when</th><th>last error</th></tr>"
    );
    for job in &jobs {
        let error = job
            .last_error
            .as_deref()
            .map(|e| {
                e.lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr data-id={id}><td><a href=/jobs/{id}>{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=n>{}/{}</td><td>{}</td><td class=err>{}</td></tr>",
            job.state.as_str(),
            esc(&job.queue),
            esc(&job.kind),
            job.attempts,
            job.max_attempts,
            when(now, job),
            esc(&error),
            id = job.id,
        );
    }
    body.push_str("</table>");
    let filters = {
        let mut f = format!("state={}", state.as_str());
        for (name, value) in [("queue", &page.queue), ("kind", &page.kind)] {
            if let Some(v) = value {
                let _ = write!(f, "&{name}={}", url_encode(v));
            }
        }
        if let Some(r) = retrying {
            f.push_str(if r { "&retrying=yes" } else { "&retrying=no" });
        }
        f
    };
    if page.after.is_some() {
        let _ = write!(
            body,
            "<a id=first href=\"/jobs?{}\">first page</a> ",
            esc(&filters)
        );
    }
    if let Some(cursor) = more {
        let _ = write!(
            body,
            "<a id=next href=\"/jobs?{}&amp;after={}\">next {PAGE}</a>",
            esc(&filters),
            url_encode(&cursor.to_string())
        );
    }
    Ok(frame(&title, &body))
}

/// `GET /jobs/ID`: one job, all of it.
pub(super) fn job(queue: &Queue, id: &str, hide: &Hide, csrf: &str) -> tickler::Result<String> {
    let id = id
        .parse::<i64>()
        .map(JobId)
        .map_err(|_| tickler::Error::InvalidArgument(format!("{id:?} is not a job id")))?;
    let job = queue.get(id)?;
    let now = queue.clock().now();
    let mut body = String::from("<table id=fields>");
    let mut row = |name: &str, value: String| field_row(&mut body, name, &value);
    row("state", job.state.as_str().to_owned());
    row("queue", esc(&job.queue));
    row("kind", esc(&job.kind));
    row("priority", job.priority.to_string());
    row("due", time(now, job.run_at));
    row(
        "attempts",
        format!("{} of {}", job.attempts, job.max_attempts),
    );
    row(
        "unique key",
        job.unique_key.as_deref().map_or_else(|| "-".into(), esc),
    );
    row(
        "timeout",
        job.timeout.map_or_else(|| "-".into(), |t| format!("{t:?}")),
    );
    row("created", time(now, job.created_at));
    row("claimed", time_or_dash(now, job.claimed_at));
    row("holder", esc(job.claimed_by.as_deref().unwrap_or("-")));
    row("lease ends", time_or_dash(now, job.lease_expires_at));
    row("finished", time_or_dash(now, job.finished_at));
    row(
        "progress",
        if job.progress.is_some() {
            progress_bar(&job)
        } else {
            "-".into()
        },
    );
    row(
        "limit",
        job.limit.as_ref().map_or_else(
            || "-".into(),
            |l| format!("{} key {:?} weight {}", esc(&l.name), esc(&l.key), l.weight),
        ),
    );
    row("rate deferrals", job.rate_deferrals.to_string());
    let parents = queue.parents(job.id)?;
    if !parents.is_empty() {
        let links: Vec<String> = parents
            .iter()
            .map(|p| {
                format!(
                    "<a href=/jobs/{id}>{id}</a> (if it fails: {}{})",
                    p.if_fails.as_str(),
                    if p.resolved { ", done" } else { "" },
                    id = p.parent
                )
            })
            .collect();
        row("runs after", links.join(", "));
    }
    if let Some(batch) = super::batch::job_row(queue, &job)? {
        row("batch", batch);
    }
    let why = match queue.explain(job.id) {
        Ok(e) => esc(&e.to_string()),
        Err(e) => esc(&format!("(cannot be explained: {e})")),
    };
    row("why", why);
    if let Some(unreadable) = &job.unreadable {
        row("unreadable", esc(unreadable));
    }
    body.push_str("</table>");
    let action = match job.state {
        JobState::Dead | JobState::Cancelled => {
            button(csrf, "retry", "id", &job.id.0.to_string(), "retry")
        }
        JobState::Succeeded => String::new(),
        _ => button(csrf, "cancel", "id", &job.id.0.to_string(), "cancel"),
    };
    body.push_str(&action);

    let _ = write!(
        body,
        "<h2>Errors ({})</h2><table id=errors><tr><th>attempt</th><th>at</th><th>worker</th><th>error</th></tr>",
        job.errors.len()
    );
    for e in job.errors.iter().rev() {
        let _ = write!(
            body,
            "<tr><td class=n>{}</td><td>{}</td><td>{}</td><td class=err>{}</td></tr>",
            e.attempt,
            time(now, e.at),
            esc(e.worker.as_deref().unwrap_or("-")),
            esc(&e.error)
        );
    }
    body.push_str("</table><h2>Payload</h2>");
    if hide.all {
        body.push_str("<p id=payload>hidden (tickler serve --hide-payload)</p>");
    } else {
        let shown = serde_json::to_string_pretty(&hide.redact(&job.payload)).unwrap_or_default();
        let _ = write!(body, "<pre id=payload>{}</pre>", esc(&shown));
    }
    if let Some(output) = &job.output {
        let shown = serde_json::to_string_pretty(&hide.redact(output)).unwrap_or_default();
        let _ = write!(body, "<h2>Output</h2><pre id=output>{}</pre>", esc(&shown));
    }
    Ok(frame(&format!("job {}", job.id), &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_keys_are_replaced_at_any_depth() {
        let hide = Hide {
            all: false,
            keys: vec!["password".into(), "token".into()],
        };
        let v = serde_json::json!({
            "user": "ada",
            "password": "s3cret",
            "nested": [{"token": {"deep": "t0k"}, "keep": 1}],
        });
        let shown = hide.redact(&v).to_string();
        assert!(
            !shown.contains("s3cret") && !shown.contains("t0k"),
            "{shown}"
        );
        assert!(
            shown.contains("ada") && shown.contains("\"keep\":1"),
            "{shown}"
        );
        assert_eq!(shown.matches(HIDDEN).count(), 2, "{shown}");
    }

    #[test]
    fn relative_times_name_their_unit() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let at = |s: i64| now - chrono::Duration::seconds(s);
        assert_eq!(relative(now, at(0)), "0 ms ago");
        assert_eq!(relative(now, at(45)), "45 s ago");
        assert_eq!(relative(now, at(180)), "3 min ago");
        assert_eq!(relative(now, at(2 * 3600)), "2 h ago");
        assert_eq!(relative(now, at(-3 * 86_400)), "in 3 d");
        assert!(time(now, at(180)).contains("title=\"1970-01-12T13:43:40.000Z\""));
    }
}
