//! Reading rows of tickler's tables on PostgreSQL. Columns are typed by
//! the server, so what can go wrong is text that is not the JSON it should
//! be (a hand edit): that costs its own job, not the claim or listing.

use crate::clock::ms_to_datetime;
use crate::engine::types::{ClaimedRow, StoredAttemptError};
use crate::job::{AttemptError, Job, JobId, JobState, RunToken};
use crate::lease::Lease;
use crate::schedule::{Handled, MisfirePolicy, OverlapPolicy, Schedule};
use postgres::Row;
use std::time::Duration;

pub(crate) const LEASE_COLUMNS: &str =
    "id, queue, kind, payload, priority, run_at, attempts, max_attempts, run_token, \
     lease_expires_at, timeout_ms, given_back, limit_name, limit_key, limit_weight";

pub(crate) const JOB_COLUMNS: &str =
    "id, queue, kind, payload, status, priority, run_at, attempts, max_attempts, \
    unique_key, timeout_ms, run_token, claimed_by, claimed_at, lease_expires_at, last_error, \
    created_at, finished_at, errors::text, progress, progress_message, \
    limit_name, limit_key, limit_weight, rate_deferrals, output, batch_id";

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

fn timeout(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

/// A claimed row (columns [`LEASE_COLUMNS`]).
pub(crate) fn claimed_from_row(r: &Row) -> crate::Result<ClaimedRow> {
    let job_id = JobId(r.try_get(0)?);
    let run_token: String = r.try_get(8)?;
    let payload: String = r.try_get(3)?;
    let lease = |payload| -> crate::Result<Lease> {
        Ok(Lease {
            job_id,
            queue: r.try_get(1)?,
            kind: r.try_get(2)?,
            payload,
            priority: r.try_get(4)?,
            run_at: ms_to_datetime(r.try_get(5)?),
            attempt: count(r.try_get(6)?),
            max_attempts: count(r.try_get(7)?),
            run_token: RunToken(run_token.clone()),
            lease_expires_at: ms_to_datetime(r.try_get(9)?),
            timeout: timeout(r.try_get(10)?),
            given_back: count(r.try_get(11)?),
            limit: crate::engine::types::limit_slot(r.try_get(12)?, r.try_get(13)?, r.try_get(14)?),
        })
    };
    Ok(match serde_json::from_str(&payload) {
        Ok(payload) => ClaimedRow::Readable(lease(payload)?),
        Err(e) => ClaimedRow::Unreadable {
            job_id,
            run_token,
            problems: format!("payload: not readable as JSON ({e})"),
        },
    })
}

/// A whole job (columns [`JOB_COLUMNS`]).
pub(crate) fn job_from_row(r: &Row) -> crate::Result<Job> {
    let mut problems = Vec::new();
    let payload: String = r.try_get(3)?;
    let payload = serde_json::from_str(&payload).unwrap_or_else(|e| {
        problems.push(format!("payload: not readable as JSON ({e})"));
        serde_json::Value::Null
    });
    let status: String = r.try_get(4)?;
    let state = status.parse::<JobState>().unwrap_or_else(|e| {
        problems.push(format!("status: {e}"));
        JobState::Dead
    });
    let errors: String = r.try_get(18)?;
    let errors = match serde_json::from_str::<Vec<StoredAttemptError>>(&errors) {
        Ok(stored) => stored.into_iter().map(AttemptError::from).collect(),
        Err(e) => {
            problems.push(format!("errors: not readable as an error history ({e})"));
            Vec::new()
        }
    };
    let output =
        r.try_get::<_, Option<String>>(25)?
            .and_then(|text| match serde_json::from_str(&text) {
                Ok(value) => Some(value),
                Err(e) => {
                    problems.push(format!("output: not readable as JSON ({e})"));
                    None
                }
            });
    let opt_time =
        |i: usize| -> crate::Result<_> { Ok(r.try_get::<_, Option<i64>>(i)?.map(ms_to_datetime)) };
    Ok(Job {
        id: JobId(r.try_get(0)?),
        queue: r.try_get(1)?,
        kind: r.try_get(2)?,
        payload,
        state,
        priority: r.try_get(5)?,
        run_at: ms_to_datetime(r.try_get(6)?),
        attempts: count(r.try_get(7)?),
        max_attempts: count(r.try_get(8)?),
        unique_key: r.try_get(9)?,
        timeout: timeout(r.try_get(10)?),
        run_token: r.try_get::<_, Option<String>>(11)?.map(RunToken),
        claimed_by: r.try_get(12)?,
        claimed_at: opt_time(13)?,
        lease_expires_at: opt_time(14)?,
        last_error: r.try_get(15)?,
        created_at: ms_to_datetime(r.try_get(16)?),
        finished_at: opt_time(17)?,
        errors,
        unreadable: (!problems.is_empty()).then(|| problems.join("; ")),
        progress: crate::engine::types::progress(r.try_get(19)?, r.try_get(20)?),
        limit: crate::engine::types::limit_slot(r.try_get(21)?, r.try_get(22)?, r.try_get(23)?),
        rate_deferrals: count(r.try_get(24)?),
        output,
        batch: r.try_get::<_, Option<i64>>(26)?.map(crate::BatchId),
    })
}

pub(crate) const SCHEDULE_COLUMNS: &str = "name, cron, time_zone, kind, payload, queue, priority, \
    max_attempts, timeout_ms, misfire, misfire_max, misfire_grace_ms, paused, next_tick_at, \
    last_tick_at, created_at, updated_at, overlap, skipped_ticks, handled_from, ahead_from, \
    ahead_until, handled_through, limit_name, limit_key, limit_weight";

pub(crate) fn handled_from_row(r: &Row) -> crate::Result<Handled> {
    let ahead = match (
        r.try_get::<_, Option<i64>>(20)?,
        r.try_get::<_, Option<i64>>(21)?,
    ) {
        (Some(from), Some(until)) => Some((from, until)),
        _ => None,
    };
    Ok(Handled {
        next: r.try_get(13)?,
        from: r.try_get(19)?,
        last: r.try_get(14)?,
        through: r.try_get(22)?,
        ahead,
    })
}

pub(crate) fn schedule_from_row(r: &Row) -> crate::Result<Schedule> {
    let payload: String = r.try_get(4)?;
    let misfire: String = r.try_get(9)?;
    let misfire_max: Option<i64> = r.try_get(10)?;
    let opt_time =
        |i: usize| -> crate::Result<_> { Ok(r.try_get::<_, Option<i64>>(i)?.map(ms_to_datetime)) };
    Ok(Schedule {
        name: r.try_get(0)?,
        cron: r.try_get(1)?,
        time_zone: r.try_get(2)?,
        kind: r.try_get(3)?,
        payload: serde_json::from_str(&payload)?,
        queue: r.try_get(5)?,
        priority: r.try_get(6)?,
        max_attempts: count(r.try_get(7)?),
        timeout: timeout(r.try_get(8)?),
        misfire: MisfirePolicy::from_columns(
            &misfire,
            misfire_max.map(|m| u32::try_from(m).unwrap_or(u32::MAX)),
        )
        .map_err(|e| crate::Error::Config(format!("schedule misfire column: {e}")))?,
        misfire_grace: Duration::from_millis(r.try_get::<_, i64>(11)?.unsigned_abs()),
        paused: r.try_get(12)?,
        next_tick_at: opt_time(13)?,
        last_tick_at: opt_time(14)?,
        created_at: ms_to_datetime(r.try_get(15)?),
        updated_at: ms_to_datetime(r.try_get(16)?),
        overlap: OverlapPolicy::from_column(&r.try_get::<_, String>(17)?)
            .map_err(|e| crate::Error::Config(format!("schedule overlap column: {e}")))?,
        skipped_ticks: r.try_get::<_, i64>(18)?.unsigned_abs(),
        limit: crate::engine::types::limit_slot(r.try_get(23)?, r.try_get(24)?, r.try_get(25)?),
    })
}

pub(crate) fn stored_from_row(r: &Row) -> crate::Result<(Schedule, Handled)> {
    Ok((schedule_from_row(r)?, handled_from_row(r)?))
}
