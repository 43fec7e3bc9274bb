//! The dashboard's "at a glance" part: per queue its counts by state, how
//! long its oldest due job has waited, whether it is paused, and a mark on
//! what needs attention; per schedule whether it missed its tick. The
//! marks are a word and a colour both, so that they survive colour
//! blindness, a grey screenshot and a screen reader. Read once per page or
//! per live refresh (`/api/summary`), through capped, indexed reads only.
//!
//! A pool's stuck threads are not marked: a pool knows of them in its own
//! process only (it writes them off and starts a replacement), and nothing
//! of them is stored where this server could read it.

use super::{button, esc, Settings, COUNT_CAP};
use chrono::{DateTime, Utc};
use std::fmt::Write as _;
use std::time::Duration;
use tickler::{JobState, Queue, Schedule};

/// One queue's row.
pub(super) struct QueueRow {
    pub name: String,
    /// Per state: the count (up to the cap) and whether it reached it.
    pub counts: Vec<(JobState, u64, bool)>,
    pub paused: bool,
    /// How long its oldest due job has waited.
    pub oldest_wait: Option<Duration>,
    /// Why it needs attention; empty when it does not.
    pub attention: Vec<String>,
}

/// One schedule's row.
pub(super) struct ScheduleRow {
    pub schedule: Schedule,
    /// How far in the past its next tick is, when beyond the grace.
    pub missed_by: Option<Duration>,
}

/// What the page shows at a glance.
pub(super) struct Glance {
    pub queues: Vec<QueueRow>,
    pub schedules: Vec<ScheduleRow>,
}

pub(super) fn read(queue: &Queue, settings: &Settings) -> tickler::Result<Glance> {
    let stats = queue.ops().counts_by_queue(COUNT_CAP)?;
    let paused = queue.paused_queues()?;
    // The queue's own clock: on a server engine the server's, which due
    // times and ticks use.
    let now = queue.clock().now();
    let mut names: std::collections::BTreeSet<String> =
        stats.counts.keys().map(|(q, _)| q.clone()).collect();
    names.extend(paused.iter().cloned());
    let mut queues = Vec::with_capacity(names.len());
    for name in names {
        let counts: Vec<(JobState, u64, bool)> = JobState::ALL
            .iter()
            .map(|&state| {
                let key = (name.clone(), state);
                (
                    state,
                    stats.counts.get(&key).copied().unwrap_or(0),
                    stats.capped.contains(&key),
                )
            })
            .collect();
        let count = |state: JobState| {
            counts
                .iter()
                .find(|(s, _, _)| *s == state)
                .map_or((0, false), |&(_, n, capped)| (n, capped))
        };
        let oldest_wait = queue.ops().oldest_due(&name)?.map(|at| waited(now, at));
        let is_paused = paused.contains(&name);
        let mut attention = Vec::new();
        let (dead, dead_capped) = count(JobState::Dead);
        if dead > 0 {
            attention.push(format!(
                "{dead}{} dead job{}",
                if dead_capped { "+" } else { "" },
                if dead == 1 { "" } else { "s" }
            ));
        }
        if let Some(wait) = oldest_wait {
            if wait > settings.wait_threshold {
                attention.push(format!(
                    "oldest due job waited {} (over {})",
                    span(wait),
                    span(settings.wait_threshold)
                ));
            }
            if is_paused {
                attention.push("paused with due work".to_owned());
            }
        }
        queues.push(QueueRow {
            name,
            counts,
            paused: is_paused,
            oldest_wait,
            attention,
        });
    }
    let schedules = queue
        .list_schedules()?
        .into_iter()
        .map(|schedule| {
            let missed_by = schedule
                .next_tick_at
                .filter(|_| !schedule.paused)
                .map(|at| waited(now, at))
                .filter(|late| *late > settings.missed_grace);
            ScheduleRow {
                schedule,
                missed_by,
            }
        })
        .collect();
    Ok(Glance { queues, schedules })
}

/// How long ago `at` was (zero for a time not yet come).
fn waited(now: DateTime<Utc>, at: DateTime<Utc>) -> Duration {
    (now - at).to_std().unwrap_or_default()
}

/// A span to the second, as `tickler` writes durations (`1h 2m 3s`).
pub(super) fn span(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

impl QueueRow {
    /// The text of its status cell: "ok" or "needs attention: …".
    pub fn status(&self) -> String {
        if self.attention.is_empty() {
            "ok".to_owned()
        } else {
            format!("needs attention: {}", self.attention.join("; "))
        }
    }

    pub fn wait_text(&self) -> String {
        self.oldest_wait.map_or_else(|| "-".to_owned(), span)
    }
}

impl ScheduleRow {
    pub fn status(&self) -> String {
        match self.missed_by {
            Some(late) => format!("needs attention: missed its tick by {}", span(late)),
            None if self.schedule.paused => "paused".to_owned(),
            None => "ok".to_owned(),
        }
    }
}

/// The class of a status cell: its colour, beside the word.
fn mark_class(needs_attention: bool) -> &'static str {
    if needs_attention {
        "mark attention"
    } else {
        "mark ok"
    }
}

/// Style of the marks, for the page's `<style>`.
pub(super) const STYLE: &str = ".mark.attention{background:#fdd;color:#900;font-weight:bold}\
     .mark.ok{background:#dfd;color:#060}#attention li{color:#900;font-weight:bold}\
     #done{background:#eef;border:1px solid #99c;padding:.4em .8em}";

/// The list of what needs attention, above everything else; "all ok" when
/// nothing does.
pub(super) fn attention_html(glance: &Glance) -> String {
    let mut items = Vec::new();
    for q in &glance.queues {
        for why in &q.attention {
            items.push(format!("queue {}: {}", q.name, why));
        }
    }
    for s in &glance.schedules {
        if let Some(late) = s.missed_by {
            items.push(format!(
                "schedule {}: missed its tick by {}",
                s.schedule.name,
                span(late)
            ));
        }
    }
    if items.is_empty() {
        return "<div id=attention><p class=\"mark ok\">all ok: nothing needs attention</p></div>"
            .to_owned();
    }
    let mut html = String::from("<div id=attention><h2>Needs attention</h2><ul>");
    for item in items {
        let _ = write!(html, "<li>ATTENTION: {}</li>", esc(&item));
    }
    html.push_str("</ul></div>");
    html
}

/// The "Queues" table: counts, oldest wait, status mark, pause and resume,
/// and the bulk actions on a queue's dead jobs.
pub(super) fn queues_html(glance: &Glance, csrf: &str) -> String {
    let mut html = String::from("<h2>Queues</h2><table id=counts><tr><th>queue</th>");
    for state in JobState::ALL {
        let _ = write!(html, "<th>{}</th>", state.as_str());
    }
    html.push_str(
        "<th>oldest due waited</th><th>status</th><th>runs</th><th>all at once</th></tr>",
    );
    for q in &glance.queues {
        let _ = write!(
            html,
            "<tr data-queue-row=\"{}\"><td>{}</td>",
            esc(&q.name),
            esc(&q.name)
        );
        for &(state, n, capped) in &q.counts {
            let _ = write!(
                html,
                "<td class=n data-queue=\"{}\" data-state={}>{n}{}</td>",
                esc(&q.name),
                state.as_str(),
                if capped { "+" } else { "" }
            );
        }
        let control = if q.paused {
            format!(
                "paused {}",
                button(csrf, "resume", "queue", &q.name, "resume")
            )
        } else {
            format!(
                "running {}",
                button(csrf, "pause", "queue", &q.name, "pause")
            )
        };
        let dead = q
            .counts
            .iter()
            .any(|&(s, n, _)| s == JobState::Dead && n > 0);
        let mut bulk = String::new();
        if dead {
            let _ = write!(
                bulk,
                "{} {} ",
                confirm_button(csrf, "retry-dead", &[("queue", &q.name)], "retry all dead"),
                confirm_button(
                    csrf,
                    "delete-dead",
                    &[("queue", &q.name)],
                    "delete all dead"
                )
            );
        }
        if q.counts
            .iter()
            .any(|&(s, n, _)| s == JobState::Pending && n > 0)
        {
            bulk.push_str(&confirm_button(
                csrf,
                "cancel-pending",
                &[("queue", &q.name)],
                "cancel all pending",
            ));
        }
        let _ = write!(
            html,
            "<td class=n data-wait=\"{n}\">{}</td><td class=\"{}\" data-status=\"{n}\">{}</td>\
             <td>{control}</td><td>{bulk}</td></tr>",
            esc(&q.wait_text()),
            mark_class(!q.attention.is_empty()),
            esc(&q.status()),
            n = esc(&q.name),
        );
    }
    html.push_str("</table>");
    // Jobs of one kind, in every queue or in one.
    let _ = write!(
        html,
        "<form id=bulk-kind method=post action=/confirm><input type=hidden name=csrf value={csrf}>\
         jobs of kind <input name=kind required size=16> in queue \
         <input name=queue size=12 placeholder=\"any queue\">: \
         <button type=submit name=action value=retry-dead id=bulk-kind-retry>retry all dead</button> \
         <button type=submit name=action value=delete-dead id=bulk-kind-delete>delete all dead</button> \
         <button type=submit name=action value=cancel-pending id=bulk-kind-cancel>cancel all pending</button></form>"
    );
    html
}

/// A button that asks for the confirm page of a bulk `action`.
pub(super) fn confirm_button(
    csrf: &str,
    action: &str,
    fields: &[(&str, &str)],
    label: &str,
) -> String {
    let mut html = format!(
        "<form method=post action=/confirm style=display:inline>\
         <input type=hidden name=csrf value={csrf}><input type=hidden name=action value={action}>"
    );
    let mut id = action.to_owned();
    for (name, value) in fields {
        let _ = write!(
            html,
            "<input type=hidden name={name} value=\"{}\">",
            esc(value)
        );
        id.push('-');
        id.push_str(value);
    }
    let _ = write!(
        html,
        "<button type=submit id=\"{}\">{label}</button></form>",
        esc(&id)
    );
    html
}

/// The "Schedules" table, with each one's mark and its pause or resume.
pub(super) fn schedules_html(glance: &Glance, csrf: &str) -> String {
    let mut html = String::from(
        "<h2>Schedules</h2><table id=schedules><tr><th>name</th><th>cron</th><th>zone</th>\
         <th>queue</th><th>kind</th><th>next tick (in its zone)</th><th>status</th><th></th></tr>",
    );
    for row in &glance.schedules {
        let s = &row.schedule;
        let next = match (s.paused, s.next_tick_at) {
            (true, _) => "paused".to_owned(),
            (false, Some(at)) => match s.time_zone.parse::<chrono_tz::Tz>() {
                Ok(tz) => at.with_timezone(&tz).to_rfc3339(),
                Err(_) => at.to_rfc3339(),
            },
            (false, None) => "none".to_owned(),
        };
        let action = if s.paused {
            confirm_button(csrf, "resume-schedule", &[("schedule", &s.name)], "resume")
        } else {
            confirm_button(csrf, "pause-schedule", &[("schedule", &s.name)], "pause")
        };
        let _ = write!(
            html,
            "<tr data-schedule=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"{}\">{}</td><td>{action}</td></tr>",
            esc(&s.name),
            esc(&s.name),
            esc(&s.cron),
            esc(&s.time_zone),
            esc(&s.queue),
            esc(&s.kind),
            esc(&next),
            mark_class(row.missed_by.is_some()),
            esc(&row.status()),
        );
    }
    html.push_str("</table>");
    html
}

/// The figures `/api/summary` gives the live refresh: per queue its count
/// cells' texts, oldest wait and status; per schedule its status; the
/// attention list and the plot, as the page writes them.
pub(super) fn summary_json(glance: &Glance, activity_html: &str) -> String {
    let queues: Vec<serde_json::Value> = glance
        .queues
        .iter()
        .map(|q| {
            let counts: serde_json::Map<String, serde_json::Value> = q
                .counts
                .iter()
                .map(|&(state, n, capped)| {
                    (
                        state.as_str().to_owned(),
                        format!("{n}{}", if capped { "+" } else { "" }).into(),
                    )
                })
                .collect();
            serde_json::json!({
                "queue": q.name,
                "counts": counts,
                "wait": q.wait_text(),
                "status": q.status(),
                "attention": !q.attention.is_empty(),
            })
        })
        .collect();
    let schedules: Vec<serde_json::Value> = glance
        .schedules
        .iter()
        .map(|s| {
            serde_json::json!({
                "schedule": s.schedule.name,
                "status": s.status(),
                "attention": s.missed_by.is_some(),
            })
        })
        .collect();
    serde_json::json!({
        "queues": queues,
        "schedules": schedules,
        "attention_html": attention_html(glance),
        "activity_html": activity_html,
    })
    .to_string()
}
