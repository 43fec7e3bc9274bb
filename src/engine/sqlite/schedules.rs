//! `tickler_schedules` on SQLite: the [`ScheduleStore`] operations, and
//! the [`ScheduleTx`] through which the queue's firing rules
//! (`Queue::fire`) read and write inside the engine's transaction.

use super::enqueue::insert_valid;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::ValidJob;
use crate::engine::{FireRound, ScheduleStore, ScheduleTx};
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};
use crate::schedule::{
    grace_ms, rebase, resume_point, stepped_back, Fired, Handled, MisfirePolicy, NewSchedule,
    OverlapPolicy, Schedule, Ticks,
};
use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};
use std::time::Duration;

impl ScheduleStore for Store {
    fn upsert_schedule(
        &self,
        schedule: &NewSchedule,
        ticks: &Ticks,
        payload: &str,
        timeout_ms: Option<i64>,
    ) -> Result<Schedule> {
        let stored = self.write(|tx| {
            let now = self.now_ms();
            let existing: Option<(String, String, Option<i64>, Option<i64>)> = tx
                .prepare_cached(
                    "SELECT cron, time_zone, next_tick_at, last_tick_at
                     FROM tickler_schedules WHERE name = ?1",
                )?
                .query_row([&schedule.name], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .optional()?;
            let next = match &existing {
                Some((cron, zone, next, _))
                    if *cron == schedule.cron && *zone == schedule.time_zone =>
                {
                    *next
                }
                Some((_, _, _, last)) => resume_point(ticks, now, *last),
                None => ticks.at_or_after(now),
            };
            // A new schedule has handled nothing before now (handled_from).
            tx.prepare_cached(
                "INSERT INTO tickler_schedules (name, cron, time_zone, kind, payload, queue,
                     priority, max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms,
                     paused, next_tick_at, last_tick_at, created_at, updated_at, overlap,
                     handled_from, limit_name, limit_key, limit_weight)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 0, ?13, NULL, ?14, ?14,
                     ?15, ?14, ?16, ?17, ?18)
                 ON CONFLICT (name) DO UPDATE SET
                     cron = excluded.cron, time_zone = excluded.time_zone,
                     kind = excluded.kind, payload = excluded.payload, queue = excluded.queue,
                     priority = excluded.priority, max_attempts = excluded.max_attempts,
                     timeout_ms = excluded.timeout_ms, misfire = excluded.misfire,
                     misfire_max = excluded.misfire_max,
                     misfire_grace_ms = excluded.misfire_grace_ms,
                     overlap = excluded.overlap, limit_name = excluded.limit_name,
                     limit_key = excluded.limit_key, limit_weight = excluded.limit_weight,
                     next_tick_at = excluded.next_tick_at, updated_at = excluded.updated_at",
            )?
            .execute(params![
                schedule.name,
                schedule.cron,
                schedule.time_zone,
                schedule.kind,
                payload,
                schedule.queue,
                schedule.priority,
                schedule.max_attempts,
                timeout_ms,
                schedule.misfire.as_str(),
                schedule.misfire.max(),
                grace_ms(schedule.misfire_grace),
                next,
                now,
                schedule.overlap.as_str(),
                schedule.limit.as_ref().map(|l| &l.0),
                schedule.limit.as_ref().map(|l| &l.1),
                schedule.limit_weight,
            ])?;
            get_in(tx, &schedule.name)
        })?;
        self.notify_watchers();
        Ok(stored)
    }

    fn pause_schedule(&self, name: &str) -> Result<()> {
        let now = self.now_ms();
        let changed = self.write(|tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE tickler_schedules SET paused = 1, updated_at = ?1 WHERE name = ?2",
                )?
                .execute(params![now, name])?)
        })?;
        if changed == 0 {
            return Err(Error::UnknownSchedule {
                name: name.to_owned(),
            });
        }
        self.notify_watchers();
        Ok(())
    }

    fn resume_schedule(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            let now = self.now_ms();
            let stored = get_in(tx, name)?;
            if !stored.paused {
                return Ok(());
            }
            let ticks = Ticks::new(&stored.cron, &stored.time_zone)?;
            // The clock may have stepped back while it was paused.
            let handled = rebase(&ticks, now, handled_in(tx, name)?);
            write_handled(tx, name, &handled, now)?;
            tx.prepare_cached("UPDATE tickler_schedules SET paused = 0 WHERE name = ?1")?
                .execute([name])?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn delete_schedule(&self, name: &str) -> Result<bool> {
        let deleted = self.write(|tx| {
            Ok(tx
                .prepare_cached("DELETE FROM tickler_schedules WHERE name = ?1")?
                .execute([name])?)
        })?;
        if deleted > 0 {
            self.notify_watchers();
        }
        Ok(deleted > 0)
    }

    fn get_schedule(&self, name: &str) -> Result<Schedule> {
        self.read(|conn| get_in(conn, name))
    }

    fn list_schedules(&self) -> Result<Vec<Schedule>> {
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules ORDER BY name"
                ))?
                .query_map([], schedule_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn schedule_and_handled(&self, name: &str) -> Result<(Schedule, Handled)> {
        self.read(|conn| Ok((get_in(conn, name)?, handled_in(conn, name)?)))
    }

    fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>> {
        self.read(|conn| next_tick_in(conn, self.now_ms()))
    }

    fn fire_due_schedules(
        &self,
        round: &mut FireRound<'_>,
    ) -> Result<(Fired, bool, Option<DateTime<Utc>>)> {
        self.write(|tx| round(&InTransaction(tx), self.now_ms()))
    }
}

/// A [`ScheduleTx`] on an open SQLite write transaction.
struct InTransaction<'a, 'c>(&'a rusqlite::Transaction<'c>);

impl ScheduleTx for InTransaction<'_, '_> {
    fn unfinished_runs(&self, name: &str) -> Result<Vec<(JobId, JobState)>> {
        unfinished_runs(self.0, name)
    }

    fn stopping_run(&self, name: &str, now: i64) -> Result<Option<(JobId, JobState)>> {
        stopping_run(self.0, name, now)
    }

    fn pause_broken(&self, schedule: &Schedule, now: i64, error: &Error) -> Result<()> {
        pause_broken(self.0, schedule, now, error)
    }

    fn advance(
        &self,
        name: &str,
        first_due: i64,
        after: &Handled,
        skipped: u64,
        now: i64,
    ) -> Result<bool> {
        let advanced = self.0
            .prepare_cached(
                "UPDATE tickler_schedules SET next_tick_at = ?1, last_tick_at = ?2, updated_at = ?3,
                     handled_from = ?4, ahead_from = ?5, ahead_until = ?6,
                     skipped_ticks = skipped_ticks + ?7, handled_through = ?10
                 WHERE name = ?8 AND paused = 0 AND next_tick_at = ?9",
            )?
            .execute(params![
                after.next,
                after.last,
                now,
                after.from,
                after.ahead.map(|(from, _)| from),
                after.ahead.map(|(_, until)| until),
                skipped as i64,
                name,
                first_due,
                after.through
            ])?;
        Ok(advanced > 0)
    }

    fn rebase_stepped(&self, now: i64) -> Result<()> {
        rebase_stepped_in(self.0, now)
    }

    fn due_schedules(&self, now: i64, batch: i64) -> Result<Vec<(Schedule, Handled)>> {
        Ok(self
            .0
            .prepare_cached(&format!(
                "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules
                 WHERE paused = 0 AND next_tick_at IS NOT NULL AND next_tick_at <= ?1
                 ORDER BY next_tick_at, name LIMIT +?2"
            ))?
            .query_map(params![now, batch], stored_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    fn next_tick(&self, now: i64) -> Result<Option<DateTime<Utc>>> {
        next_tick_in(self.0, now)
    }

    fn insert_jobs(&self, rows: &[ValidJob], now: i64) -> Result<Vec<JobId>> {
        insert_valid(self.0, rows, now)
    }
}

/// Moves every active schedule that was written "after" now (the wall
/// clock stepped back since) to its next tick after now that it has not
/// handled; see "Clock steps" on [`NewSchedule`].
fn rebase_stepped_in(tx: &rusqlite::Transaction<'_>, now: i64) -> Result<()> {
    let stepped = tx
        .prepare_cached(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules
             WHERE paused = 0 AND updated_at > ?1"
        ))?
        .query_map([now], stored_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (schedule, handled) in stepped {
        match stepped_back(&schedule, handled, now) {
            Ok(Some(rebased)) => write_handled(tx, &schedule.name, &rebased, now)?,
            Ok(None) => {
                tx.prepare_cached("UPDATE tickler_schedules SET updated_at = ?1 WHERE name = ?2")?
                    .execute(params![now, schedule.name])?;
            }
            Err(e) => pause_broken(tx, &schedule, now, &e)?,
        }
    }
    Ok(())
}

pub(crate) const SCHEDULE_COLUMNS: &str = "name, cron, time_zone, kind, payload, queue, priority, \
    max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms, paused, next_tick_at, \
    last_tick_at, created_at, updated_at, overlap, skipped_ticks, handled_from, ahead_from, \
    ahead_until, handled_through, limit_name, limit_key, limit_weight";

pub(crate) fn handled_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Handled> {
    let ahead = match (r.get::<_, Option<i64>>(20)?, r.get::<_, Option<i64>>(21)?) {
        (Some(from), Some(until)) => Some((from, until)),
        _ => None,
    };
    Ok(Handled {
        next: r.get(13)?,
        from: r.get(19)?,
        last: r.get(14)?,
        through: r.get(22)?,
        ahead,
    })
}

pub(crate) fn stored_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Schedule, Handled)> {
    Ok((schedule_from_row(r)?, handled_from_row(r)?))
}

pub(crate) fn schedule_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Schedule> {
    let payload: String = r.get(4)?;
    let payload = serde_json::from_str(&payload).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(4, rusqlite::types::Type::Text, Box::new(e))
    })?;
    let misfire: String = r.get(9)?;
    let opt_time = |i: usize| -> rusqlite::Result<Option<DateTime<Utc>>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(ms_to_datetime))
    };
    Ok(Schedule {
        name: r.get(0)?,
        cron: r.get(1)?,
        time_zone: r.get(2)?,
        kind: r.get(3)?,
        payload,
        queue: r.get(5)?,
        priority: r.get(6)?,
        max_attempts: r.get(7)?,
        timeout: r
            .get::<_, Option<i64>>(8)?
            .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        misfire: MisfirePolicy::from_columns(&misfire, r.get(10)?)?,
        misfire_grace: Duration::from_millis(r.get::<_, i64>(11)?.unsigned_abs()),
        paused: r.get(12)?,
        next_tick_at: opt_time(13)?,
        last_tick_at: opt_time(14)?,
        created_at: ms_to_datetime(r.get(15)?),
        updated_at: ms_to_datetime(r.get(16)?),
        overlap: OverlapPolicy::from_column(&r.get::<_, String>(17)?)?,
        skipped_ticks: r.get::<_, i64>(18)?.unsigned_abs(),
        limit: crate::engine::types::limit_slot(r.get(23)?, r.get(24)?, r.get(25)?),
    })
}

pub(crate) fn get_in(conn: &rusqlite::Connection, name: &str) -> Result<Schedule> {
    conn.prepare_cached(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = ?1"
    ))?
    .query_row([name], schedule_from_row)
    .optional()?
    .ok_or_else(|| Error::UnknownSchedule {
        name: name.to_owned(),
    })
}

/// The unfinished runs (tick jobs that are scheduled, pending or running)
/// of schedule `name`, oldest first. Found by their unique_key
/// `tickler:schedule:<name>:<digits>` on the unique_key index: the range
/// of keys starting with the prefix, then only digits after it (so that
/// schedule "a" does not see the runs of schedule "a:1").
pub(crate) fn unfinished_runs(
    conn: &rusqlite::Connection,
    name: &str,
) -> Result<Vec<(JobId, JobState)>> {
    let prefix = format!("tickler:schedule:{name}:");
    // ';' sorts right after ':'.
    let end = format!("tickler:schedule:{name};");
    let tail_from = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX) + 1;
    let runs = conn
        .prepare_cached(
            "SELECT id, status FROM tickler_jobs
             WHERE unique_key >= ?1 AND unique_key < ?2
               AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
               AND substr(unique_key, ?3) NOT GLOB '*[^0-9]*'
             ORDER BY id",
        )?
        .query_map(params![prefix, end, tail_from], |r| {
            Ok((JobId(r.get(0)?), r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    runs.into_iter()
        .map(|(id, state)| Ok((id, state.parse::<JobState>()?)))
        .collect()
}

/// A run of the schedule that was cancelled (or failed for good past its
/// timeout) while its handler may still be running: its lease, kept for
/// that, has not run out and its holder has not reported. `Forbid` waits
/// for it as for an unfinished run.
pub(crate) fn stopping_run(
    conn: &rusqlite::Connection,
    name: &str,
    now: i64,
) -> Result<Option<(JobId, JobState)>> {
    let prefix = format!("tickler:schedule:{name}:");
    let end = format!("tickler:schedule:{name};");
    let tail_from = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX) + 1;
    let run = conn
        .prepare_cached(
            "SELECT id, status FROM tickler_jobs
             WHERE unique_key >= ?1 AND unique_key < ?2
               AND status <> 'running' AND status IN ('cancelled', 'dead')
               AND lease_expires_at >= ?4
               AND substr(unique_key, ?3) NOT GLOB '*[^0-9]*'
             ORDER BY id LIMIT 1",
        )?
        .query_row(params![prefix, end, tail_from, now], |r| {
            Ok((JobId(r.get(0)?), r.get::<_, String>(1)?))
        })
        .optional()?;
    run.map(|(id, state)| Ok((id, state.parse::<JobState>()?)))
        .transpose()
}

pub(crate) fn handled_in(conn: &rusqlite::Connection, name: &str) -> Result<Handled> {
    conn.prepare_cached(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = ?1"
    ))?
    .query_row([name], handled_from_row)
    .optional()?
    .ok_or_else(|| Error::UnknownSchedule {
        name: name.to_owned(),
    })
}

pub(crate) fn write_handled(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    handled: &Handled,
    now: i64,
) -> Result<()> {
    tx.prepare_cached(
        "UPDATE tickler_schedules SET next_tick_at = ?1, last_tick_at = ?2, handled_from = ?3,
             ahead_from = ?4, ahead_until = ?5, updated_at = ?6, handled_through = ?8
         WHERE name = ?7",
    )?
    .execute(params![
        handled.next,
        handled.last,
        handled.from,
        handled.ahead.map(|(from, _)| from),
        handled.ahead.map(|(_, until)| until),
        now,
        name,
        handled.through
    ])?;
    Ok(())
}

/// Pauses a schedule that cannot fire with this build, so it does not
/// block the others; resuming it reports the error.
pub(crate) fn pause_broken(
    tx: &rusqlite::Transaction<'_>,
    schedule: &Schedule,
    now: i64,
    error: &Error,
) -> Result<()> {
    log::error!(
        "schedule {:?} cannot fire and was paused: {error}",
        schedule.name
    );
    tx.prepare_cached("UPDATE tickler_schedules SET paused = 1, updated_at = ?1 WHERE name = ?2")?
        .execute(params![now, schedule.name])?;
    Ok(())
}

/// The earliest next tick of the active schedules, or `now` if one of them
/// was written after now (the clock stepped back: it needs a rebase).
pub(crate) fn next_tick_in(conn: &rusqlite::Connection, now: i64) -> Result<Option<DateTime<Utc>>> {
    let (next, stepped): (Option<i64>, bool) = conn
        .prepare_cached(
            "SELECT (SELECT min(next_tick_at) FROM tickler_schedules
                     WHERE paused = 0 AND next_tick_at IS NOT NULL),
                    (SELECT max(updated_at) FROM tickler_schedules WHERE paused = 0) > ?1",
        )?
        .query_row([now], |r| {
            Ok((r.get(0)?, r.get::<_, Option<bool>>(1)?.unwrap_or(false)))
        })?;
    let next = if stepped {
        Some(next.map_or(now, |n| n.min(now)))
    } else {
        next
    };
    Ok(next.map(ms_to_datetime))
}
