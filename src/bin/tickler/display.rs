//! How times, durations, sizes, tables and jobs are printed.

use chrono::{DateTime, Local, SecondsFormat, Utc};
use serde_json::json;
use std::time::Duration;
use tickler::Job;

/// Prints times in local time with the zone's offset, or in UTC.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    /// Print UTC instead of local time.
    pub utc: bool,
}

impl Times {
    /// A time for people: `2026-05-01 09:30:00 +02:00`, or `… UTC` with `--utc`.
    pub fn show(&self, t: DateTime<Utc>) -> String {
        if self.utc {
            t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
        } else {
            t.with_timezone(&Local)
                .format("%Y-%m-%d %H:%M:%S %:z")
                .to_string()
        }
    }

    /// As [`Times::show`], or `-` for none.
    pub fn show_opt(&self, t: Option<DateTime<Utc>>) -> String {
        t.map_or_else(|| "-".to_owned(), |t| self.show(t))
    }
}

/// `s` made safe to print on a terminal: control characters (C0, DEL and
/// C1, which start escape sequences) and the bidirectional-override
/// characters (which reorder what is shown) are written as `\x1b` or
/// `\u{202e}`. Kinds, queue names, errors and a command's stderr come
/// from whoever can enqueue or from the command, not from the operator.
pub fn safe(s: &str) -> std::borrow::Cow<'_, str> {
    escape(s, false)
}

/// As [`safe`], keeping line breaks (for values printed over several lines).
pub fn safe_lines(s: &str) -> std::borrow::Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| {
        (c.is_control() && !(keep_newlines && c == '\n'))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            let n = u32::from(c);
            if n < 0x100 {
                out.push_str(&format!("\\x{n:02x}"));
            } else {
                out.push_str(&format!("\\u{{{n:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A time for machines: RFC 3339, UTC, milliseconds.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A duration rounded to whole seconds (milliseconds under a second), as
/// humantime writes it: `1h 2m 3s`.
pub fn duration(d: Duration) -> String {
    let rounded = if d < Duration::from_secs(1) {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(d.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

/// How to write a duration, with examples in the forms [`duration`] prints,
/// so that what an error suggests is what the operator has seen the tool
/// print (humantime's own text suggests `30sec` and lists units as `min`,
/// `hours`).
pub const DURATION_FORMS: &str =
    "write a number and a unit, as tickler prints durations: 250ms, 5s, 2m, 1h 30m, 7days";

/// A duration typed by an operator: on the command line, in an NDJSON line
/// or in a `shell` payload. Any form humantime reads is taken; an error
/// says what is wrong and [`DURATION_FORMS`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    use humantime::DurationError as E;
    humantime::parse_duration(s).map_err(|e| {
        let what = match e {
            E::Empty => "the duration is empty".to_owned(),
            E::UnknownUnit { unit, .. } if unit.is_empty() => format!("{s:?} has no unit"),
            E::UnknownUnit { unit, .. } => format!("{s:?} has an unknown unit {unit:?}"),
            E::NumberOverflow => format!("{s:?} is too long"),
            E::NumberExpected(_) | E::InvalidCharacter(_) => format!("{s:?} is not a duration"),
        };
        format!("{what}; {DURATION_FORMS}")
    })
}

/// What `tickler limit list` and the dashboard show for a limit that jobs
/// name but no one set.
pub const LIMIT_NOT_SET: &str = "not set: unlimited";

/// A limit's settings, as `tickler limit list` and the dashboard show
/// them: `1 per key, 8 in all, 100 starts per 1m + 10 burst`.
pub fn limit_settings(limit: &tickler::Limit) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limit.max_per_key {
        parts.push(format!("{n} per key"));
    }
    if let Some(total) = limit.max_total {
        parts.push(format!("{total} in all"));
    }
    if let Some(rate) = limit.rate {
        let mut text = format!(
            "{} starts per {}",
            rate.count,
            humantime::format_duration(rate.period)
        );
        if rate.burst > 0 {
            text.push_str(&format!(" + {} burst", rate.burst));
        }
        parts.push(text);
    }
    parts.join(", ")
}

/// The weight a key's holders hold, against the limit's `max_per_key`
/// when it has one: `1 of 2`.
pub fn held(held: u64, max_per_key: Option<u32>) -> String {
    match max_per_key {
        Some(n) => format!("{held} of {n}"),
        None => held.to_string(),
    }
}

/// Bytes as `512 B`, `4.0 KiB`, `1.5 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A table with a header row; columns whose header is in `right` are
/// right-aligned. Returns the lines, without trailing spaces.
pub fn table(header: &[&str], rows: &[Vec<String>], right: &[&str]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            let pad = w - cell.chars().count();
            if right.contains(&header[i]) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(header.to_vec())];
    for row in rows {
        lines.push(line(row.iter().map(String::as_str).collect()));
    }
    lines
}

/// The first line of `s`, escaped ([`safe`]), cut to `max` characters
/// with `…`.
pub fn short(s: &str, max: usize) -> String {
    let first = safe(s.lines().next().unwrap_or("")).into_owned();
    let first = first.as_str();
    if first.chars().count() <= max && !s.trim_end().contains('\n') {
        first.to_owned()
    } else {
        let mut cut: String = first.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// A job as one JSON object; times in RFC 3339 UTC, the timeout in ms.
pub fn job_json(job: &Job) -> serde_json::Value {
    json!({
        "id": job.id.0,
        "queue": job.queue,
        "kind": job.kind,
        "state": job.state.as_str(),
        "priority": job.priority,
        "payload": job.payload,
        "run_at": rfc3339(job.run_at),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "unique_key": job.unique_key,
        "timeout_ms": job.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "run_token": job.run_token.as_ref().map(|t| t.0.clone()),
        "claimed_by": job.claimed_by,
        "claimed_at": job.claimed_at.map(rfc3339),
        "lease_expires_at": job.lease_expires_at.map(rfc3339),
        "last_error": job.last_error,
        "errors": job.errors.iter().map(|e| json!({
            "attempt": e.attempt,
            "at": rfc3339(e.at),
            "error": e.error,
            "worker": e.worker,
        })).collect::<Vec<_>>(),
        "unreadable": job.unreadable,
        "created_at": rfc3339(job.created_at),
        "finished_at": job.finished_at.map(rfc3339),
        "progress": job.progress.as_ref().map(|p| json!({
            "fraction": p.fraction,
            "message": p.message,
        })),
        "limit": job.limit.as_ref().map(|l| json!({
            "name": l.name,
            "key": l.key,
            "weight": l.weight,
        })),
        "rate_deferrals": job.rate_deferrals,
        "output": job.output,
        "batch": job.batch.map(|b| b.0),
    })
}

/// The callbacks of `batch` with their roles (`on_success`, `on_failure`,
/// `on_finish`), in that order: for `tickler batch` and the dashboard.
pub fn batch_callbacks(batch: &tickler::Batch) -> Vec<(&'static str, tickler::JobId)> {
    [
        ("on_success", batch.on_success),
        ("on_failure", batch.on_failure),
        ("on_finish", batch.on_finish),
    ]
    .into_iter()
    .filter_map(|(role, id)| Some((role, id?)))
    .collect()
}

/// What job `id` is to `batch`, which its [`Job::batch`] names: a
/// `member`, or the role of one of its callbacks (`on_success`, ...).
pub fn batch_role(batch: &tickler::Batch, id: tickler::JobId) -> &'static str {
    batch_callbacks(batch)
        .into_iter()
        .find_map(|(role, c)| (c == id).then_some(role))
        .unwrap_or("member")
}

/// Prints `fields` as `key: value` lines, the values aligned, a value of
/// several lines indented under its first (`tickler show`, `tickler
/// batch`).
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (key, value) in fields {
        let mut lines = value.lines();
        let first = lines.next().unwrap_or("");
        println!("{:width$} {first}", format!("{key}:"));
        for more in lines {
            println!("{:width$} {more}", "");
        }
    }
}

/// A job, one `field: value` per line, for `tickler show`.
pub fn job_fields(job: &Job, times: Times) -> Vec<(&'static str, String)> {
    let or_dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
    let fields = vec![
        ("id", job.id.to_string()),
        ("state", job.state.to_string()),
        ("queue", job.queue.clone()),
        ("kind", job.kind.clone()),
        ("priority", job.priority.to_string()),
        (
            "attempts",
            format!("{} of {}", job.attempts, job.max_attempts),
        ),
        ("run_at", times.show(job.run_at)),
        ("created_at", times.show(job.created_at)),
        ("claimed_at", times.show_opt(job.claimed_at)),
        ("claimed_by", or_dash(&job.claimed_by)),
        ("lease_expires_at", times.show_opt(job.lease_expires_at)),
        ("finished_at", times.show_opt(job.finished_at)),
        (
            "timeout",
            job.timeout.map_or_else(|| "-".to_owned(), duration),
        ),
        ("unique_key", or_dash(&job.unique_key)),
        (
            "limit",
            job.limit.as_ref().map_or_else(
                || "-".to_owned(),
                |l| {
                    let mut text = format!("{} key {} (weight {})", l.name, l.key, l.weight);
                    if job.rate_deferrals > 0 {
                        text.push_str(&format!(
                            ", deferred {} time(s) by its rate",
                            job.rate_deferrals
                        ));
                    }
                    text
                },
            ),
        ),
        (
            "run_token",
            job.run_token
                .as_ref()
                .map_or_else(|| "-".to_owned(), |t| t.0.clone()),
        ),
        ("payload", job.payload.to_string()),
        (
            "progress",
            job.progress.as_ref().map_or_else(
                || "-".to_owned(),
                |p| {
                    format!(
                        "{:.1} % {}",
                        (p.fraction * 1000.0).floor() / 10.0,
                        p.message
                    )
                },
            ),
        ),
        (
            "output",
            job.output
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string),
        ),
        ("last_error", or_dash(&job.last_error)),
        ("errors", error_history(job, times)),
        ("unreadable", or_dash(&job.unreadable)),
    ];
    fields
        .into_iter()
        .map(|(k, v)| (k, safe_lines(&v).into_owned()))
        .collect()
}

/// One line per failed attempt, oldest first: `#N at TIME by WORKER: ERROR`
/// (the error's first line only; `show --json` has it whole).
fn error_history(job: &Job, times: Times) -> String {
    if job.errors.is_empty() {
        return "-".to_owned();
    }
    job.errors
        .iter()
        .map(|e| {
            format!(
                "#{} at {} by {}: {}",
                e.attempt,
                times.show(e.at),
                e.worker.as_deref().unwrap_or("?"),
                e.error.lines().next().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
