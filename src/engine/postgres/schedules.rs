//! `tickler_schedules` on PostgreSQL: the [`ScheduleStore`] operations and
//! the [`ScheduleTx`] the queue's firing rules (`Queue::fire`) run in.
//!
//! Schedulers on several machines may look at the same due schedule: each
//! reads the due schedules with `FOR UPDATE SKIP LOCKED` (one fires it, the
//! others pass it by), and the move to the next tick is conditional on the
//! tick it read, as on SQLite; the tick's job carries a unique_key per
//! occurrence besides. One tick fires once.

use super::connection::Tx;
use super::enqueue::{check_text, insert_valid};
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::ValidJob;
use crate::engine::{FireRound, ScheduleStore, ScheduleTx};
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};
use crate::schedule::{
    grace_ms, rebase, resume_point, stepped_back, Fired, Handled, NewSchedule, Schedule, Ticks,
};
use chrono::{DateTime, Utc};
use std::cell::RefCell;

/// A name PostgreSQL cannot store (a NUL character) names no schedule.
fn storable_name(name: &str) -> Result<()> {
    if name.contains('\0') {
        return Err(unknown(name));
    }
    Ok(())
}

fn unknown(name: &str) -> Error {
    Error::UnknownSchedule {
        name: name.to_owned(),
    }
}

fn get_in(tx: &mut Tx<'_>, name: &str) -> Result<Schedule> {
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = $1");
    match tx.query_opt(&sql, &[&name])? {
        Some(r) => schedule_from_row(&r),
        None => Err(unknown(name)),
    }
}

fn handled_in(tx: &mut Tx<'_>, name: &str) -> Result<Handled> {
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = $1");
    match tx.query_opt(&sql, &[&name])? {
        Some(r) => handled_from_row(&r),
        None => Err(unknown(name)),
    }
}

fn write_handled(tx: &mut Tx<'_>, name: &str, handled: &Handled, now: i64) -> Result<()> {
    tx.execute(
        "UPDATE tickler_schedules SET next_tick_at = $1, last_tick_at = $2, handled_from = $3,
             ahead_from = $4, ahead_until = $5, updated_at = $6, handled_through = $8
         WHERE name = $7",
        &[
            &handled.next,
            &handled.last,
            &handled.from,
            &handled.ahead.map(|(from, _)| from),
            &handled.ahead.map(|(_, until)| until),
            &now,
            &name,
            &handled.through,
        ],
    )?;
    Ok(())
}

fn pause_broken(tx: &mut Tx<'_>, schedule: &Schedule, now: i64, error: &Error) -> Result<()> {
    log::error!(
        "schedule {:?} cannot fire and was paused: {error}",
        schedule.name
    );
    tx.execute(
        "UPDATE tickler_schedules SET paused = true, updated_at = $1 WHERE name = $2",
        &[&now, &schedule.name],
    )?;
    Ok(())
}

/// The key range and digit pattern of schedule `name`'s tick jobs.
fn run_keys(name: &str) -> (String, String, i64) {
    let prefix = format!("tickler:schedule:{name}:");
    // ';' sorts right after ':' (unique_key is in byte order, COLLATE "C").
    let end = format!("tickler:schedule:{name};");
    let tail_from = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX) + 1;
    (prefix, end, tail_from)
}

fn runs_from(rows: Vec<postgres::Row>) -> Result<Vec<(JobId, JobState)>> {
    rows.into_iter()
        .map(|r| Ok((JobId(r.get(0)), r.get::<_, String>(1).parse()?)))
        .collect()
}

fn unfinished_runs(tx: &mut Tx<'_>, name: &str) -> Result<Vec<(JobId, JobState)>> {
    let (prefix, end, tail_from) = run_keys(name);
    let rows = tx.query(
        "SELECT id, status FROM tickler_jobs
         WHERE unique_key >= $1 AND unique_key < $2
           AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
           AND substr(unique_key, $3::int) ~ '^[0-9]+$'
         ORDER BY id",
        &[&prefix, &end, &(tail_from as i32)],
    )?;
    runs_from(rows)
}

fn stopping_run(tx: &mut Tx<'_>, name: &str, now: i64) -> Result<Option<(JobId, JobState)>> {
    let (prefix, end, tail_from) = run_keys(name);
    let rows = tx.query(
        "SELECT id, status FROM tickler_jobs
         WHERE unique_key >= $1 AND unique_key < $2
           AND status IN ('cancelled', 'dead') AND lease_expires_at >= $4::bigint
           AND substr(unique_key, $3::int) ~ '^[0-9]+$'
         ORDER BY id LIMIT 1",
        &[&prefix, &end, &(tail_from as i32), &now],
    )?;
    Ok(runs_from(rows)?.into_iter().next())
}

fn next_tick_in(tx: &mut Tx<'_>, now: i64) -> Result<Option<DateTime<Utc>>> {
    let r = tx.query_one(
        "SELECT (SELECT min(next_tick_at) FROM tickler_schedules
                 WHERE NOT paused AND next_tick_at IS NOT NULL),
                coalesce((SELECT max(updated_at) FROM tickler_schedules WHERE NOT paused)
                         > $1::bigint, false)",
        &[&now],
    )?;
    let next: Option<i64> = r.get(0);
    let stepped: bool = r.get(1);
    let next = if stepped {
        Some(next.map_or(now, |n| n.min(now)))
    } else {
        next
    };
    Ok(next.map(ms_to_datetime))
}

/// Moves every active schedule written "after" now (the clock stepped
/// back since) to its next unhandled tick after now.
fn rebase_stepped_in(tx: &mut Tx<'_>, now: i64) -> Result<()> {
    let sql = format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules
         WHERE NOT paused AND updated_at > $1::bigint FOR UPDATE SKIP LOCKED"
    );
    let stepped = tx
        .query(&sql, &[&now])?
        .iter()
        .map(stored_from_row)
        .collect::<Result<Vec<_>>>()?;
    for (schedule, handled) in stepped {
        match stepped_back(&schedule, handled, now) {
            Ok(Some(rebased)) => write_handled(tx, &schedule.name, &rebased, now)?,
            Ok(None) => {
                tx.execute(
                    "UPDATE tickler_schedules SET updated_at = $1 WHERE name = $2",
                    &[&now, &schedule.name],
                )?;
            }
            Err(e) => pause_broken(tx, &schedule, now, &e)?,
        }
    }
    Ok(())
}

impl ScheduleStore for Store {
    fn upsert_schedule(
        &self,
        schedule: &NewSchedule,
        ticks: &Ticks,
        payload: &str,
        timeout_ms: Option<i64>,
    ) -> Result<Schedule> {
        check_text("schedule name", &schedule.name)?;
        check_text("cron expression", &schedule.cron)?;
        check_text("time zone", &schedule.time_zone)?;
        check_text("kind", &schedule.kind)?;
        check_text("queue", &schedule.queue)?;
        let stored = self.write(|tx, _| {
            let now = self.now_ms();
            let existing = tx.query_opt(
                "SELECT cron, time_zone, next_tick_at, last_tick_at
                 FROM tickler_schedules WHERE name = $1 FOR UPDATE",
                &[&schedule.name],
            )?;
            let next = match &existing {
                Some(r)
                    if r.get::<_, String>(0) == schedule.cron
                        && r.get::<_, String>(1) == schedule.time_zone =>
                {
                    r.get::<_, Option<i64>>(2)
                }
                Some(r) => resume_point(ticks, now, r.get::<_, Option<i64>>(3)),
                None => ticks.at_or_after(now),
            };
            let max_attempts = i64::from(schedule.max_attempts);
            let misfire_max = schedule.misfire.max().map(i64::from);
            let limit_name = schedule.limit.as_ref().map(|l| l.0.as_str());
            let limit_key = schedule.limit.as_ref().map(|l| l.1.as_str());
            let limit_weight = i64::from(schedule.limit_weight);
            tx.execute(
                "INSERT INTO tickler_schedules (name, cron, time_zone, kind, payload, queue,
                     priority, max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms,
                     paused, next_tick_at, last_tick_at, created_at, updated_at, overlap,
                     handled_from, limit_name, limit_key, limit_weight)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, false, $13, NULL,
                     $14, $14, $15, $14, $16, $17, $18)
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
                &[
                    &schedule.name,
                    &schedule.cron,
                    &schedule.time_zone,
                    &schedule.kind,
                    &payload,
                    &schedule.queue,
                    &schedule.priority,
                    &max_attempts,
                    &timeout_ms,
                    &schedule.misfire.as_str(),
                    &misfire_max,
                    &grace_ms(schedule.misfire_grace),
                    &next,
                    &now,
                    &schedule.overlap.as_str(),
                    &limit_name,
                    &limit_key,
                    &limit_weight,
                ],
            )?;
            get_in(tx, &schedule.name)
        })?;
        self.notify_watchers();
        Ok(stored)
    }

    fn pause_schedule(&self, name: &str) -> Result<()> {
        storable_name(name)?;
        let changed = self.write(|tx, _| {
            let now = self.now_ms();
            tx.execute(
                "UPDATE tickler_schedules SET paused = true, updated_at = $1 WHERE name = $2",
                &[&now, &name],
            )
        })?;
        if changed == 0 {
            return Err(unknown(name));
        }
        self.notify_watchers();
        Ok(())
    }

    fn resume_schedule(&self, name: &str) -> Result<()> {
        storable_name(name)?;
        self.write(|tx, _| {
            let now = self.now_ms();
            let sql = format!(
                "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = $1 FOR UPDATE"
            );
            let Some(r) = tx.query_opt(&sql, &[&name])? else {
                return Err(unknown(name));
            };
            let (stored, handled) = stored_from_row(&r)?;
            if !stored.paused {
                return Ok(());
            }
            let ticks = Ticks::new(&stored.cron, &stored.time_zone)?;
            let handled = rebase(&ticks, now, handled);
            write_handled(tx, name, &handled, now)?;
            tx.execute(
                "UPDATE tickler_schedules SET paused = false WHERE name = $1",
                &[&name],
            )?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn delete_schedule(&self, name: &str) -> Result<bool> {
        if storable_name(name).is_err() {
            return Ok(false);
        }
        let deleted = self
            .write(|tx, _| tx.execute("DELETE FROM tickler_schedules WHERE name = $1", &[&name]))?;
        if deleted > 0 {
            self.notify_watchers();
        }
        Ok(deleted > 0)
    }

    fn get_schedule(&self, name: &str) -> Result<Schedule> {
        storable_name(name)?;
        self.read(|tx| get_in(tx, name))
    }

    fn list_schedules(&self) -> Result<Vec<Schedule>> {
        let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules ORDER BY name");
        self.read(|tx| tx.query(&sql, &[])?.iter().map(schedule_from_row).collect())
    }

    fn schedule_and_handled(&self, name: &str) -> Result<(Schedule, Handled)> {
        storable_name(name)?;
        self.read(|tx| Ok((get_in(tx, name)?, handled_in(tx, name)?)))
    }

    fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>> {
        self.read(|tx| next_tick_in(tx, self.now_ms()))
    }

    fn fire_due_schedules(
        &self,
        round: &mut FireRound<'_>,
    ) -> Result<(Fired, bool, Option<DateTime<Utc>>)> {
        self.write(|tx, _| {
            let now = self.now_ms();
            round(&InTransaction(RefCell::new(&mut *tx)), now)
        })
    }
}

/// A [`ScheduleTx`] on an open PostgreSQL transaction.
struct InTransaction<'t, 'c>(RefCell<&'t mut Tx<'c>>);

impl ScheduleTx for InTransaction<'_, '_> {
    fn unfinished_runs(&self, name: &str) -> Result<Vec<(JobId, JobState)>> {
        unfinished_runs(&mut self.0.borrow_mut(), name)
    }

    fn stopping_run(&self, name: &str, now: i64) -> Result<Option<(JobId, JobState)>> {
        stopping_run(&mut self.0.borrow_mut(), name, now)
    }

    fn pause_broken(&self, schedule: &Schedule, now: i64, error: &Error) -> Result<()> {
        pause_broken(&mut self.0.borrow_mut(), schedule, now, error)
    }

    fn advance(
        &self,
        name: &str,
        first_due: i64,
        after: &Handled,
        skipped: u64,
        now: i64,
    ) -> Result<bool> {
        let advanced = self.0.borrow_mut().execute(
            "UPDATE tickler_schedules SET next_tick_at = $1, last_tick_at = $2, updated_at = $3,
                 handled_from = $4, ahead_from = $5, ahead_until = $6,
                 skipped_ticks = skipped_ticks + $7, handled_through = $10
             WHERE name = $8 AND NOT paused AND next_tick_at = $9",
            &[
                &after.next,
                &after.last,
                &now,
                &after.from,
                &after.ahead.map(|(from, _)| from),
                &after.ahead.map(|(_, until)| until),
                &i64::try_from(skipped).unwrap_or(i64::MAX),
                &name,
                &first_due,
                &after.through,
            ],
        )?;
        Ok(advanced > 0)
    }

    fn rebase_stepped(&self, now: i64) -> Result<()> {
        rebase_stepped_in(&mut self.0.borrow_mut(), now)
    }

    fn due_schedules(&self, now: i64, batch: i64) -> Result<Vec<(Schedule, Handled)>> {
        let sql = format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules
             WHERE NOT paused AND next_tick_at IS NOT NULL AND next_tick_at <= $1::bigint
             ORDER BY next_tick_at, name LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        self.0
            .borrow_mut()
            .query(&sql, &[&now, &batch])?
            .iter()
            .map(stored_from_row)
            .collect()
    }

    fn next_tick(&self, now: i64) -> Result<Option<DateTime<Utc>>> {
        next_tick_in(&mut self.0.borrow_mut(), now)
    }

    fn insert_jobs(&self, rows: &[ValidJob], now: i64) -> Result<Vec<JobId>> {
        insert_valid(&mut self.0.borrow_mut(), rows, now, fastrand::i64(..))
    }
}
