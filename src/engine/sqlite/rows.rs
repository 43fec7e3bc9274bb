//! Reading rows of the jobs table column by column, so that one value that
//! cannot be read costs its job, not the claim or the listing.

use crate::clock::ms_to_datetime;
use crate::engine::types::{ClaimedRow, StoredAttemptError};
use crate::job::{Job, JobId, JobState, RunToken};
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use std::time::Duration;

pub(crate) const LEASE_COLUMNS: &str =
    "id, queue, kind, payload, priority, run_at, attempts, max_attempts, run_token, lease_expires_at, timeout_ms, given_back, \
    CASE WHEN limit_name IS NOT NULL THEN json_array(limit_name, limit_key, limit_weight) END";

pub(crate) const JOB_COLUMNS: &str =
    "id, queue, kind, payload, status, priority, run_at, attempts, max_attempts, \
    unique_key, timeout_ms, run_token, claimed_by, claimed_at, lease_expires_at, last_error, \
    created_at, finished_at, errors, progress, progress_message, limit_name, limit_key, limit_weight, rate_deferrals, output, batch_id";

pub(crate) fn claimed_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ClaimedRow> {
    let job_id = JobId(r.get(0)?);
    let run_token: String = r.get(8)?;
    let mut row = RowReader::new(r);
    let lease = Lease {
        job_id,
        queue: row.text(1, "queue"),
        kind: row.text(2, "kind"),
        payload: row.json(3, "payload"),
        priority: row.get(4, "priority"),
        run_at: row.time(5, "run_at"),
        attempt: row.get(6, "attempts"),
        max_attempts: row.get(7, "max_attempts"),
        run_token: RunToken(run_token.clone()),
        lease_expires_at: row.time(9, "lease_expires_at"),
        timeout: row
            .get::<Option<i64>>(10, "timeout_ms")
            .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        given_back: row.get(11, "given_back"),
        limit: row.limit(12),
    };
    Ok(match row.finish() {
        None => ClaimedRow::Readable(lease),
        Some(problems) => ClaimedRow::Unreadable {
            job_id,
            run_token,
            problems,
        },
    })
}

use crate::engine::types::{limit_slot, progress};

pub(crate) fn job_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let id = JobId(r.get(0)?);
    let mut row = RowReader::new(r);
    let status = row.text(4, "status");
    let state = status.parse::<JobState>().unwrap_or_else(|e| {
        row.note("status", e);
        JobState::Dead
    });
    let mut job = Job {
        id,
        queue: row.text(1, "queue"),
        kind: row.text(2, "kind"),
        payload: row.json(3, "payload"),
        state,
        priority: row.get(5, "priority"),
        run_at: row.time(6, "run_at"),
        attempts: row.get(7, "attempts"),
        max_attempts: row.get(8, "max_attempts"),
        unique_key: row.opt_text(9, "unique_key"),
        timeout: row
            .get::<Option<i64>>(10, "timeout_ms")
            .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        run_token: row.opt_text(11, "run_token").map(RunToken),
        claimed_by: row.opt_text(12, "claimed_by"),
        claimed_at: row.opt_time(13, "claimed_at"),
        lease_expires_at: row.opt_time(14, "lease_expires_at"),
        last_error: row.opt_text(15, "last_error"),
        created_at: row.time(16, "created_at"),
        finished_at: row.opt_time(17, "finished_at"),
        errors: row.errors(18),
        unreadable: None,
        progress: progress(
            row.get::<Option<f64>>(19, "progress"),
            row.opt_text(20, "progress_message"),
        ),
        limit: limit_slot(
            row.opt_text(21, "limit_name"),
            row.opt_text(22, "limit_key"),
            row.get(23, "limit_weight"),
        ),
        rate_deferrals: u32::try_from(row.get::<i64>(24, "rate_deferrals").max(0))
            .unwrap_or(u32::MAX),
        output: row.opt_json(25, "output"),
        batch: row.get::<Option<i64>>(26, "batch_id").map(crate::BatchId),
    };
    job.unreadable = row.finish();
    Ok(job)
}

/// Reads a row column by column, noting each column that cannot be read
/// and putting a placeholder in its place, so that one damaged row (a hand
/// edit, a disk error, a newer build's data) is reported instead of failing
/// every read or claim it is part of.
pub(crate) struct RowReader<'a, 'r> {
    row: &'a rusqlite::Row<'r>,
    problems: Vec<String>,
}

impl<'a, 'r> RowReader<'a, 'r> {
    fn new(row: &'a rusqlite::Row<'r>) -> Self {
        RowReader {
            row,
            problems: Vec::new(),
        }
    }

    fn note(&mut self, column: &str, what: impl std::fmt::Display) {
        self.problems.push(format!("{column}: {what}"));
    }

    /// What could not be read, or `None` if the whole row was fine.
    fn finish(self) -> Option<String> {
        (!self.problems.is_empty()).then(|| self.problems.join("; "))
    }

    fn get<T: rusqlite::types::FromSql + Default>(&mut self, i: usize, column: &str) -> T {
        self.row.get(i).unwrap_or_else(|e| {
            self.note(column, e);
            T::default()
        })
    }

    fn opt_text(&mut self, i: usize, column: &str) -> Option<String> {
        use rusqlite::types::ValueRef;
        match self.row.get_ref(i) {
            Ok(ValueRef::Null) => None,
            Ok(ValueRef::Text(bytes)) => Some(match std::str::from_utf8(bytes) {
                Ok(text) => text.to_owned(),
                Err(e) => {
                    self.note(column, format!("not UTF-8 ({e})"));
                    String::from_utf8_lossy(bytes).into_owned()
                }
            }),
            Ok(other) => {
                self.note(
                    column,
                    format!("{:?} where text was expected", other.data_type()),
                );
                None
            }
            Err(e) => {
                self.note(column, e);
                None
            }
        }
    }

    fn text(&mut self, i: usize, column: &str) -> String {
        self.opt_text(i, column).unwrap_or_else(|| {
            if !self.problems.iter().any(|p| p.starts_with(column)) {
                self.note(column, "NULL where text was expected");
            }
            String::new()
        })
    }

    fn json(&mut self, i: usize, column: &str) -> serde_json::Value {
        let text = self.text(i, column);
        serde_json::from_str(&text).unwrap_or_else(|e| {
            self.note(column, format!("not readable as JSON ({e})"));
            serde_json::Value::Null
        })
    }

    fn opt_json(&mut self, i: usize, column: &str) -> Option<serde_json::Value> {
        let text = self.opt_text(i, column)?;
        match serde_json::from_str(&text) {
            Ok(value) => Some(value),
            Err(e) => {
                self.note(column, format!("not readable as JSON ({e})"));
                None
            }
        }
    }

    fn time(&mut self, i: usize, column: &str) -> DateTime<Utc> {
        ms_to_datetime(self.get(i, column))
    }

    fn opt_time(&mut self, i: usize, column: &str) -> Option<DateTime<Utc>> {
        self.get::<Option<i64>>(i, column).map(ms_to_datetime)
    }

    /// The limit slot in column `i`, as the claim returns it: NULL for a
    /// job without a limit, else `[name, key, weight]` (one column rather
    /// than three: a claim returns it for every job it takes).
    fn limit(&mut self, i: usize) -> Option<crate::job::LimitSlot> {
        let text = self.opt_text(i, "limit")?;
        match serde_json::from_str::<(String, Option<String>, i64)>(&text) {
            Ok((name, key, weight)) => limit_slot(Some(name), key, weight),
            Err(e) => {
                self.note("limit", format!("not readable ({e})"));
                None
            }
        }
    }

    fn errors(&mut self, i: usize) -> Vec<crate::job::AttemptError> {
        let text = self.text(i, "errors");
        match serde_json::from_str::<Vec<StoredAttemptError>>(&text) {
            Ok(stored) => stored
                .into_iter()
                .map(crate::job::AttemptError::from)
                .collect(),
            Err(e) => {
                self.note("errors", format!("not readable as an error history ({e})"));
                Vec::new()
            }
        }
    }
}
