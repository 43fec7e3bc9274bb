//! Reading rows of tickler's tables on MySQL. Names and payloads are bytes
//! on the server, so what can go wrong is bytes that are not UTF-8 or not
//! the JSON they should be (a hand edit): that costs its own job, not the
//! claim or the listing.

use crate::clock::ms_to_datetime;
use crate::engine::types::{ClaimedRow, StoredAttemptError};
use crate::error::{Error, Result};
use crate::job::{AttemptError, Job, JobId, JobState, RunToken};
use crate::lease::Lease;
use crate::schedule::{Handled, MisfirePolicy, OverlapPolicy, Schedule};
use mysql::prelude::FromValue;
use mysql::Row;
use std::time::Duration;

pub(crate) const LEASE_COLUMNS: &str =
    "id, queue, kind, payload, priority, run_at, attempts, max_attempts, run_token, \
     lease_expires_at, timeout_ms, given_back, limit_name, limit_key, limit_weight";

pub(crate) const JOB_COLUMNS: &str =
    "id, queue, kind, payload, status, priority, run_at, attempts, max_attempts, \
    unique_key, timeout_ms, run_token, claimed_by, claimed_at, lease_expires_at, last_error, \
    created_at, finished_at, errors, progress, progress_message, \
    limit_name, limit_key, limit_weight, rate_deferrals, output, batch_id";

/// Column `i` of `r` as a `T`.
pub(crate) fn get<T: FromValue>(r: &Row, i: usize) -> Result<T> {
    match r.get_opt::<T, usize>(i) {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(Error::Mysql(mysql::Error::FromValueError(e.0))),
        None => Err(Error::Config(format!("a row without column {i}"))),
    }
}

/// Column `i` as bytes (a `VARBINARY` or `BLOB`), NULL as none.
fn bytes(r: &Row, i: usize) -> Result<Option<Vec<u8>>> {
    get::<Option<Vec<u8>>>(r, i)
}

/// Column `i` as UTF-8 text; bytes that are not UTF-8 are noted in
/// `problems` and read lossily.
fn text(r: &Row, i: usize, what: &str, problems: &mut Vec<String>) -> Result<String> {
    let raw = bytes(r, i)?.unwrap_or_default();
    Ok(match String::from_utf8(raw) {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!("{what}: not UTF-8 ({e})"));
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        }
    })
}

fn json(r: &Row, i: usize, what: &str, problems: &mut Vec<String>) -> Result<serde_json::Value> {
    let raw = bytes(r, i)?.unwrap_or_default();
    Ok(serde_json::from_slice(&raw).unwrap_or_else(|e| {
        problems.push(format!("{what}: not readable as JSON ({e})"));
        serde_json::Value::Null
    }))
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

fn timeout(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

/// What a claim just wrote into a row it read before its UPDATE.
pub(crate) struct Fresh<'a> {
    pub run_token: &'a str,
    pub expires: i64,
}

/// A claimed row (columns [`LEASE_COLUMNS`]): as stored, or, with
/// `fresh`, as read just before the claim's UPDATE gave it `fresh`'s
/// run_token and lease and one more attempt.
pub(crate) fn claimed_from_row(r: &Row, fresh: Option<&Fresh<'_>>) -> Result<ClaimedRow> {
    let job_id = JobId(get(r, 0)?);
    let mut problems = Vec::new();
    let (run_token, attempts, expires) = match fresh {
        Some(f) => (f.run_token.to_owned(), get::<i64>(r, 6)? + 1, f.expires),
        None => (get::<String>(r, 8)?, get(r, 6)?, get(r, 9)?),
    };
    let lease = Lease {
        job_id,
        queue: text(r, 1, "queue", &mut problems)?,
        kind: text(r, 2, "kind", &mut problems)?,
        payload: json(r, 3, "payload", &mut problems)?,
        priority: get(r, 4)?,
        run_at: ms_to_datetime(get(r, 5)?),
        attempt: count(attempts),
        max_attempts: count(get(r, 7)?),
        run_token: RunToken(run_token.clone()),
        lease_expires_at: ms_to_datetime(expires),
        timeout: timeout(get(r, 10)?),
        given_back: count(get(r, 11)?),
        limit: crate::engine::types::limit_slot(get(r, 12)?, get(r, 13)?, get(r, 14)?),
    };
    Ok(if problems.is_empty() {
        ClaimedRow::Readable(lease)
    } else {
        ClaimedRow::Unreadable {
            job_id,
            run_token,
            problems: problems.join("; "),
        }
    })
}

/// A whole job (columns [`JOB_COLUMNS`]).
pub(crate) fn job_from_row(r: &Row) -> Result<Job> {
    let mut problems = Vec::new();
    let payload = json(r, 3, "payload", &mut problems)?;
    let status = text(r, 4, "status", &mut problems)?;
    let state = status.parse::<JobState>().unwrap_or_else(|e| {
        problems.push(format!("status: {e}"));
        JobState::Dead
    });
    let errors: String = get::<Option<String>>(r, 18)?.unwrap_or_default();
    let errors = match serde_json::from_str::<Vec<StoredAttemptError>>(&errors) {
        Ok(stored) => stored.into_iter().map(AttemptError::from).collect(),
        Err(e) => {
            problems.push(format!("errors: not readable as an error history ({e})"));
            Vec::new()
        }
    };
    let output = match bytes(r, 25)? {
        Some(raw) => match serde_json::from_slice(&raw) {
            Ok(value) => Some(value),
            Err(e) => {
                problems.push(format!("output: not readable as JSON ({e})"));
                None
            }
        },
        None => None,
    };
    let opt_time = |i: usize| -> Result<_> { Ok(get::<Option<i64>>(r, i)?.map(ms_to_datetime)) };
    let unique_key = match bytes(r, 9)? {
        Some(_) => Some(text(r, 9, "unique_key", &mut problems)?),
        None => None,
    };
    Ok(Job {
        id: JobId(get(r, 0)?),
        queue: text(r, 1, "queue", &mut problems)?,
        kind: text(r, 2, "kind", &mut problems)?,
        payload,
        state,
        priority: get(r, 5)?,
        run_at: ms_to_datetime(get(r, 6)?),
        attempts: count(get(r, 7)?),
        max_attempts: count(get(r, 8)?),
        unique_key,
        timeout: timeout(get(r, 10)?),
        run_token: get::<Option<String>>(r, 11)?.map(RunToken),
        claimed_by: get(r, 12)?,
        claimed_at: opt_time(13)?,
        lease_expires_at: opt_time(14)?,
        last_error: get(r, 15)?,
        created_at: ms_to_datetime(get(r, 16)?),
        finished_at: opt_time(17)?,
        errors,
        unreadable: (!problems.is_empty()).then(|| problems.join("; ")),
        progress: crate::engine::types::progress(get(r, 19)?, get(r, 20)?),
        limit: crate::engine::types::limit_slot(get(r, 21)?, get(r, 22)?, get(r, 23)?),
        rate_deferrals: count(get(r, 24)?),
        output,
        batch: get::<Option<i64>>(r, 26)?.map(crate::BatchId),
    })
}

pub(crate) const SCHEDULE_COLUMNS: &str = "name, cron, time_zone, kind, payload, queue, priority, \
    max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms, paused, next_tick_at, \
    last_tick_at, created_at, updated_at, overlap, skipped_ticks, handled_from, ahead_from, \
    ahead_until, handled_through, limit_name, limit_key, limit_weight";

pub(crate) fn handled_from_row(r: &Row) -> Result<Handled> {
    let ahead = match (get::<Option<i64>>(r, 20)?, get::<Option<i64>>(r, 21)?) {
        (Some(from), Some(until)) => Some((from, until)),
        _ => None,
    };
    Ok(Handled {
        next: get(r, 13)?,
        from: get(r, 19)?,
        last: get(r, 14)?,
        through: get(r, 22)?,
        ahead,
    })
}

pub(crate) fn schedule_from_row(r: &Row) -> Result<Schedule> {
    let payload: Vec<u8> = get(r, 4)?;
    let misfire: String = get(r, 9)?;
    let misfire_max: Option<i64> = get(r, 10)?;
    let opt_time = |i: usize| -> Result<_> { Ok(get::<Option<i64>>(r, i)?.map(ms_to_datetime)) };
    Ok(Schedule {
        name: get(r, 0)?,
        cron: get(r, 1)?,
        time_zone: get(r, 2)?,
        kind: get(r, 3)?,
        payload: serde_json::from_slice(&payload)?,
        queue: get(r, 5)?,
        priority: get(r, 6)?,
        max_attempts: count(get(r, 7)?),
        timeout: timeout(get(r, 8)?),
        misfire: MisfirePolicy::from_columns(
            &misfire,
            misfire_max.map(|m| u32::try_from(m).unwrap_or(u32::MAX)),
        )
        .map_err(|e| Error::Config(format!("schedule misfire column: {e}")))?,
        misfire_grace: Duration::from_millis(get::<i64>(r, 11)?.unsigned_abs()),
        paused: get(r, 12)?,
        next_tick_at: opt_time(13)?,
        last_tick_at: opt_time(14)?,
        created_at: ms_to_datetime(get(r, 15)?),
        updated_at: ms_to_datetime(get(r, 16)?),
        overlap: OverlapPolicy::from_column(&get::<String>(r, 17)?)
            .map_err(|e| Error::Config(format!("schedule overlap column: {e}")))?,
        skipped_ticks: get::<i64>(r, 18)?.unsigned_abs(),
        limit: crate::engine::types::limit_slot(get(r, 23)?, get(r, 24)?, get(r, 25)?),
    })
}

pub(crate) fn stored_from_row(r: &Row) -> Result<(Schedule, Handled)> {
    Ok((schedule_from_row(r)?, handled_from_row(r)?))
}
