//! `tickler_schedules` on MySQL: the [`ScheduleStore`] operations and the
//! [`ScheduleTx`] the queue's firing rules (`Queue::fire`) run in.
//!
//! As on PostgreSQL, schedulers on several machines read the due schedules
//! with `FOR UPDATE SKIP LOCKED` (one fires a schedule, the others pass it
//! by), the move to the next tick is conditional on the tick it read, and
//! the tick's job carries a unique_key per occurrence besides. One tick
//! fires once.

use super::connection::{args, Tx};
use super::enqueue::{check_name, insert_valid};
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

/// A name longer than the schema holds names no schedule.
fn storable_name(name: &str) -> Result<()> {
    if check_name("schedule name", name).is_err() {
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
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = ?");
    match tx.first(&sql, args![name])? {
        Some(r) => schedule_from_row(&r),
        None => Err(unknown(name)),
    }
}

fn stored_in(tx: &mut Tx<'_>, name: &str, lock: bool) -> Result<Option<(Schedule, Handled)>> {
    let sql = format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tickler_schedules WHERE name = ?{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    tx.first(&sql, args![name])?
        .map(|r| stored_from_row(&r))
        .transpose()
}

fn write_handled(tx: &mut Tx<'_>, name: &str, handled: &Handled, now: i64) -> Result<()> {
    tx.exec(
        "UPDATE tickler_schedules SET next_tick_at = ?, last_tick_at = ?, handled_from = ?,
             ahead_from = ?, ahead_until = ?, updated_at = ?, handled_through = ?
         WHERE name = ?",
        args![
            handled.next,
            handled.last,
            handled.from,
            handled.ahead.map(|(from, _)| from),
            handled.ahead.map(|(_, until)| until),
            now,
            handled.through,
            name,
        ],
    )?;
    Ok(())
}

fn pause_broken(tx: &mut Tx<'_>, schedule: &Schedule, now: i64, error: &Error) -> Result<()> {
    log::error!(
        "schedule {:?} cannot fire and was paused: {error}",
        schedule.name
    );
    tx.exec(
        "UPDATE tickler_schedules SET paused = TRUE, updated_at = ? WHERE name = ?",
        args![now, schedule.name.as_str()],
    )?;
    Ok(())
}

/// The key range of schedule `name`'s tick jobs, and the length of its
/// prefix: a run's key is the prefix and the tick's digits.
fn run_keys(name: &str) -> (String, String, usize) {
    let prefix = format!("tickler:schedule:{name}:");
    // ';' sorts right after ':' (unique_key is compared as bytes).
    let end = format!("tickler:schedule:{name};");
    let len = prefix.len();
    (prefix, end, len)
}

/// Rows (id, status, unique_key) whose key is a run key of the prefix of
/// length `prefix_len`: the rest is digits. Checked here, not in SQL:
/// MySQL's regular expressions refuse binary strings beside text.
fn runs_from(rows: Vec<mysql::Row>, prefix_len: usize) -> Result<Vec<(JobId, JobState)>> {
    let mut runs = Vec::new();
    for r in &rows {
        let key: Vec<u8> = get(r, 2)?;
        let tail = key.get(prefix_len..).unwrap_or_default();
        if tail.is_empty() || !tail.iter().all(u8::is_ascii_digit) {
            continue;
        }
        runs.push((JobId(get(r, 0)?), get::<String>(r, 1)?.parse()?));
    }
    Ok(runs)
}

fn unfinished_runs(tx: &mut Tx<'_>, name: &str) -> Result<Vec<(JobId, JobState)>> {
    let (prefix, end, len) = run_keys(name);
    let rows = tx.rows(
        "SELECT id, status, unique_key FROM tickler_jobs
         WHERE unique_key >= ? AND unique_key < ?
           AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
         ORDER BY id",
        args![prefix.as_str(), end.as_str()],
    )?;
    runs_from(rows, len)
}

fn stopping_run(tx: &mut Tx<'_>, name: &str, now: i64) -> Result<Option<(JobId, JobState)>> {
    let (prefix, end, len) = run_keys(name);
    let rows = tx.rows(
        "SELECT id, status, unique_key FROM tickler_jobs
         WHERE unique_key >= ? AND unique_key < ?
           AND status IN ('cancelled', 'dead') AND lease_expires_at >= ?
         ORDER BY id",
        args![prefix.as_str(), end.as_str(), now],
    )?;
    Ok(runs_from(rows, len)?.into_iter().next())
}

fn next_tick_in(tx: &mut Tx<'_>, now: i64) -> Result<Option<DateTime<Utc>>> {
    let r = tx.first(
        "SELECT (SELECT min(next_tick_at) FROM tickler_schedules
                 WHERE NOT paused AND next_tick_at IS NOT NULL),
                coalesce((SELECT max(updated_at) FROM tickler_schedules WHERE NOT paused)
                         > ?, FALSE)",
        args![now],
    )?;
    let Some(r) = r else { return Ok(None) };
    let next: Option<i64> = get(&r, 0)?;
    let stepped: bool = get(&r, 1)?;
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
         WHERE NOT paused AND updated_at > ? FOR UPDATE SKIP LOCKED"
    );
    let stepped = tx
        .rows(&sql, args![now])?
        .iter()
        .map(stored_from_row)
        .collect::<Result<Vec<_>>>()?;
    for (schedule, handled) in stepped {
        match stepped_back(&schedule, handled, now) {
            Ok(Some(rebased)) => write_handled(tx, &schedule.name, &rebased, now)?,
            Ok(None) => {
                tx.exec(
                    "UPDATE tickler_schedules SET updated_at = ? WHERE name = ?",
                    args![now, schedule.name.as_str()],
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
        check_name("schedule name", &schedule.name)?;
        check_name("time zone", &schedule.time_zone)?;
        check_name("kind", &schedule.kind)?;
        check_name("queue", &schedule.queue)?;
        let stored = self.write(|tx, _| {
            let now = self.now_ms();
            let existing = tx.first(
                "SELECT cron, time_zone, next_tick_at, last_tick_at
                 FROM tickler_schedules WHERE name = ? FOR UPDATE",
                args![schedule.name.as_str()],
            )?;
            let next = match &existing {
                Some(r)
                    if get::<String>(r, 0)? == schedule.cron
                        && get::<String>(r, 1)? == schedule.time_zone =>
                {
                    get::<Option<i64>>(r, 2)?
                }
                Some(r) => resume_point(ticks, now, get::<Option<i64>>(r, 3)?),
                None => ticks.at_or_after(now),
            };
            tx.exec(
                "INSERT INTO tickler_schedules (name, cron, time_zone, kind, payload, queue,
                     priority, max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms,
                     paused, next_tick_at, last_tick_at, created_at, updated_at, overlap,
                     handled_from, limit_name, limit_key, limit_weight)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, FALSE, ?, NULL, ?, ?, ?, ?, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE
                     cron = VALUES(cron), time_zone = VALUES(time_zone),
                     kind = VALUES(kind), payload = VALUES(payload), queue = VALUES(queue),
                     priority = VALUES(priority), max_attempts = VALUES(max_attempts),
                     timeout_ms = VALUES(timeout_ms), misfire = VALUES(misfire),
                     misfire_max = VALUES(misfire_max),
                     misfire_grace_ms = VALUES(misfire_grace_ms),
                     overlap = VALUES(overlap), limit_name = VALUES(limit_name),
                     limit_key = VALUES(limit_key), limit_weight = VALUES(limit_weight),
                     next_tick_at = VALUES(next_tick_at), updated_at = VALUES(updated_at)",
                args![
                    schedule.name.as_str(),
                    schedule.cron.as_str(),
                    schedule.time_zone.as_str(),
                    schedule.kind.as_str(),
                    payload,
                    schedule.queue.as_str(),
                    schedule.priority,
                    i64::from(schedule.max_attempts),
                    timeout_ms,
                    schedule.misfire.as_str(),
                    schedule.misfire.max().map(i64::from),
                    grace_ms(schedule.misfire_grace),
                    next,
                    now,
                    now,
                    schedule.overlap.as_str(),
                    now,
                    schedule.limit.as_ref().map(|l| l.0.as_str()),
                    schedule.limit.as_ref().map(|l| l.1.as_str()),
                    i64::from(schedule.limit_weight),
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
            tx.exec(
                "UPDATE tickler_schedules SET paused = TRUE, updated_at = ? WHERE name = ?",
                args![now, name],
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
            let Some((stored, handled)) = stored_in(tx, name, true)? else {
                return Err(unknown(name));
            };
            if !stored.paused {
                return Ok(());
            }
            let ticks = Ticks::new(&stored.cron, &stored.time_zone)?;
            let handled = rebase(&ticks, now, handled);
            write_handled(tx, name, &handled, now)?;
            tx.exec(
                "UPDATE tickler_schedules SET paused = FALSE WHERE name = ?",
                args![name],
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
            .write(|tx, _| tx.exec("DELETE FROM tickler_schedules WHERE name = ?", args![name]))?;
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
        self.read(|tx| {
            tx.rows(&sql, Vec::new())?
                .iter()
                .map(schedule_from_row)
                .collect()
        })
    }

    fn schedule_and_handled(&self, name: &str) -> Result<(Schedule, Handled)> {
        storable_name(name)?;
        self.read(|tx| stored_in(tx, name, false)?.ok_or_else(|| unknown(name)))
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
            round(&InTransaction(RefCell::new(&mut *tx), self.max_packet), now)
        })
    }
}

/// A [`ScheduleTx`] on an open MySQL transaction, with the server's
/// `max_allowed_packet` for the jobs it inserts.
struct InTransaction<'t, 'c>(RefCell<&'t mut Tx<'c>>, usize);

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
        let advanced = self.0.borrow_mut().exec(
            "UPDATE tickler_schedules SET next_tick_at = ?, last_tick_at = ?, updated_at = ?,
                 handled_from = ?, ahead_from = ?, ahead_until = ?,
                 skipped_ticks = skipped_ticks + ?, handled_through = ?
             WHERE name = ? AND NOT paused AND next_tick_at = ?",
            args![
                after.next,
                after.last,
                now,
                after.from,
                after.ahead.map(|(from, _)| from),
                after.ahead.map(|(_, until)| until),
                i64::try_from(skipped).unwrap_or(i64::MAX),
                after.through,
                name,
                first_due,
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
             WHERE NOT paused AND next_tick_at IS NOT NULL AND next_tick_at <= ?
             ORDER BY next_tick_at, name LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        self.0
            .borrow_mut()
            .rows(&sql, args![now, batch])?
            .iter()
            .map(stored_from_row)
            .collect()
    }

    fn next_tick(&self, now: i64) -> Result<Option<DateTime<Utc>>> {
        next_tick_in(&mut self.0.borrow_mut(), now)
    }

    fn insert_jobs(&self, rows: &[ValidJob], now: i64) -> Result<Vec<JobId>> {
        insert_valid(
            &mut self.0.borrow_mut(),
            rows,
            now,
            fastrand::i64(..),
            self.1,
        )
    }
}
