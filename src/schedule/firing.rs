//! The firing rules of schedules, engine-neutral: which ticks of a due
//! schedule fire or are skipped (misfire grace, catch-up, overlap), the
//! record of handled ticks, and what a backward step of the clock does.
//! `Queue::fire` applies them through the engine's `ScheduleTx`.

use super::*;
use crate::error::Result;
use crate::job::{JobId, NewJob};
use std::time::Duration;

/// What one run does for one schedule: the ticks to enqueue (strictly
/// increasing, all at or before now) and the next tick after now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) ticks: Vec<i64>,
    pub(crate) next: Option<i64>,
}

/// The ticks to fire when `first_due` (a tick <= now) is the oldest due
/// one; see the module docs for the rules.
pub(crate) fn plan(
    ticks: &Ticks,
    first_due: i64,
    now: i64,
    misfire: MisfirePolicy,
    grace_ms: i64,
) -> Plan {
    let on_time_from = now.saturating_sub(grace_ms);
    let mut fire = Vec::new();
    let mut cursor = Some(first_due);
    if first_due < on_time_from {
        match misfire {
            MisfirePolicy::Skip => {}
            MisfirePolicy::FireOnce => {
                return Plan {
                    ticks: vec![ticks.latest_at_or_before(first_due, now)],
                    next: ticks.next_after(now),
                };
            }
            MisfirePolicy::FireAll { max } => {
                let max = max.min(MAX_CATCH_UP) as usize;
                while let Some(tick) = cursor {
                    if fire.len() >= max {
                        break;
                    }
                    fire.push(tick);
                    cursor = ticks.next_after_until(tick, on_time_from - 1);
                }
            }
        }
        cursor = ticks.next_after_until(on_time_from - 1, now);
    }
    while let Some(tick) = cursor {
        fire.push(tick);
        cursor = ticks.next_after_until(tick, now);
    }
    Plan {
        ticks: fire,
        next: ticks.next_after(now),
    }
}

/// The unique_key of the job of `schedule`'s tick at `at_ms`.
pub(crate) fn tick_key(schedule: &str, at_ms: i64) -> String {
    format!("tickler:schedule:{schedule}:{at_ms}")
}

pub(crate) fn grace_ms(grace: Duration) -> i64 {
    i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
}

/// A schedule's record of the ticks it handled, for backward clock steps
/// (see "Clock steps" on [`NewSchedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handled {
    /// The next tick to fire.
    pub(crate) next: Option<i64>,
    /// Every tick in `[from, last]` was handled (`from` None: only `last`).
    pub(crate) from: Option<i64>,
    pub(crate) last: Option<i64>,
    /// Every tick at or before this was handled (set when a misfire
    /// dropped ticks after it; `from` then starts after the gap).
    pub(crate) through: Option<i64>,
    /// Handled ticks ahead of the clock after a backward step: never fired again.
    pub(crate) ahead: Option<(i64, i64)>,
}

/// Where a schedule goes on at `now` if the clock may have stepped back
/// since it was last written: its first tick at or after now that it has
/// not handled, and the record that keeps it so. Without a step this is
/// the first tick at or after now and after its last tick.
pub(crate) fn rebase(ticks: &Ticks, now: i64, h: Handled) -> Handled {
    let mut span = match (h.from, h.last) {
        (Some(from), Some(last)) if from <= last => Some((from, last)),
        (_, Some(last)) => Some((last, last)),
        _ => None,
    };
    let mut ahead = h.ahead;
    // A window the clock has reached joins the span behind it.
    if let Some((from, until)) = ahead.filter(|(from, _)| now >= *from) {
        span = Some(span.map_or((from, until), |(f, l)| (f.min(from), l.max(until))));
        ahead = None;
    }
    let ticks_ahead = ticks.clone().without(ahead);
    // The first tick at or after now that is not handled, ignoring the span.
    let unhandled_from_now = |ticks: &Ticks| match h.through {
        Some(through) if through >= now => ticks.next_after(through),
        _ => ticks.at_or_after(now),
    };
    let keep = |next| Handled {
        next,
        from: span.map(|(from, _)| from),
        last: span.map(|(_, last)| last),
        through: h.through,
        ahead,
    };
    match span {
        Some((from, last)) if now < from => {
            // Stepped back before the span: all of it lies ahead. (After a
            // second step back the span and the window merge: the ticks
            // between them are counted as handled, so none fires twice.)
            let window = (from, ahead.map_or(last, |(_, until)| until));
            match unhandled_from_now(ticks) {
                Some(tick) if tick < from => Handled {
                    next: Some(tick),
                    from: None,
                    last: None,
                    through: h.through,
                    ahead: Some(window),
                },
                _ => Handled {
                    next: ticks.next_after(window.1),
                    from: Some(window.0),
                    last: Some(window.1),
                    through: h.through,
                    ahead: None,
                },
            }
        }
        // Stepped back into the span: go on after it.
        Some((_, last)) if now <= last => keep(ticks_ahead.next_after(last)),
        _ => keep(unhandled_from_now(&ticks_ahead)),
    }
}

/// The template of a stored schedule's tick jobs.
pub(crate) fn template_of(s: &Schedule) -> NewJob {
    let mut job = NewJob::new(s.kind.clone())
        .payload(s.payload.clone())
        .queue(s.queue.clone())
        .priority(s.priority)
        .max_attempts(s.max_attempts);
    if let Some(timeout) = s.timeout {
        job = job.timeout(timeout);
    }
    if let Some(limit) = &s.limit {
        job = job
            .limit(limit.name.clone(), limit.key.clone())
            .limit_weight(limit.weight);
    }
    job
}

/// The first tick at or after `now` and after `last` (a schedule's ticks
/// only move forward).
pub(crate) fn resume_point(ticks: &Ticks, now: i64, last: Option<i64>) -> Option<i64> {
    let from = match last {
        Some(last) => now.max(last.saturating_add(1)),
        None => now,
    };
    ticks.at_or_after(from)
}

/// What firing did, in one transaction.
#[derive(Debug, Default)]
pub(crate) struct Fired {
    pub(crate) jobs: Vec<JobId>,
    pub(crate) skipped: u64,
    /// Earlier runs to cancel once committed, with their schedule's name.
    pub(crate) replace: Vec<(String, JobId)>,
    /// Per handled tick: its schedule, its instant (ms) and its job
    /// (`None`: skipped by the overlap policy), for events.
    pub(crate) ticks: Vec<(String, i64, Option<JobId>)>,
}

impl Fired {
    /// Adds what firing another schedule did.
    pub(crate) fn add(&mut self, other: Fired) {
        self.jobs.extend(other.jobs);
        self.skipped += other.skipped;
        self.replace.extend(other.replace);
        self.ticks.extend(other.ticks);
    }
}

/// What a schedule written "after" now (the clock stepped back since it
/// was last written) is moved to: `Ok(Some(_))` its next unhandled tick
/// after now, when that is earlier than the one it has (logged); `Ok(None)`
/// when it keeps its ticks (only its `updated_at` moves to now); `Err` when
/// its expression cannot be read with this build (the engine pauses it).
/// The same rule for every engine's `rebase_stepped_in`.
pub(crate) fn stepped_back(
    schedule: &Schedule,
    handled: Handled,
    now: i64,
) -> Result<Option<Handled>> {
    let ticks = Ticks::new(&schedule.cron, &schedule.time_zone)?;
    let rebased = rebase(&ticks, now, handled);
    // Only ever earlier: ticks already due stay due.
    let earlier = match (rebased.next, handled.next) {
        (Some(new), Some(old)) => new < old,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !earlier {
        return Ok(None);
    }
    log::warn!(
        "schedule {:?}: the clock stepped back (it was last written at {}, now is {}); next tick {}",
        schedule.name,
        schedule.updated_at,
        crate::clock::ms_to_datetime(now),
        rebased
            .next
            .map_or("none".to_owned(), |t| crate::clock::ms_to_datetime(t).to_string())
    );
    Ok(Some(rebased))
}
