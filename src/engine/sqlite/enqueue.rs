//! Storing new jobs on SQLite: validated jobs inserted with their unique
//! keys, through the group commit or in the application's own
//! transaction.

use super::Store;
use crate::engine::types::*;
use crate::engine::Enqueue;
use crate::error::Result;
use crate::job::JobId;
use rusqlite::params;

/// Inserts validated jobs in `tx`; a job whose unique_key is held by an
/// unfinished job inserts nothing and yields that job's id.
pub(crate) fn insert_valid(
    tx: &rusqlite::Transaction<'_>,
    rows: &[ValidJob],
    now: i64,
) -> Result<Vec<JobId>> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
             max_attempts, unique_key, timeout_ms, created_at, limit_name, limit_key,
             limit_weight)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
         ON CONFLICT DO NOTHING",
    )?;
    let mut held = tx.prepare_cached(
        "SELECT id FROM tickler_jobs WHERE unique_key = ?1
           AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')",
    )?;
    crate::queue::deps::check_parents(&mut super::deps::Deps(tx), rows)?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut children = Vec::new();
    let mut stored = Vec::with_capacity(rows.len());
    for row in rows {
        let job = &row.job;
        let run_at = row.due.resolve(now)?;
        let state = row.state_at(run_at, now);
        let (limit_name, limit_key) = match &job.limit {
            Some((name, key)) => (Some(name), Some(key)),
            None => (None, None),
        };
        let inserted = insert.execute(params![
            job.queue,
            job.kind,
            row.payload,
            state.as_str(),
            job.priority,
            run_at,
            job.max_attempts,
            job.unique_key,
            row.timeout_ms,
            now,
            limit_name,
            limit_key,
            job.limit_weight
        ])?;
        stored.push(inserted == 1);
        if inserted == 1 {
            let id = JobId(tx.last_insert_rowid());
            if !row.after.is_empty() {
                children.push((id, crate::engine::types::parents_of(row, &ids)));
            }
            ids.push(id);
        } else {
            ids.push(JobId(held.query_row([&job.unique_key], |r| r.get(0))?));
        }
    }
    super::deps::store_edges(tx, &children, now)?;
    let joins = batch_joins(rows, &ids, |i| stored[i]);
    if !joins.is_empty() {
        crate::queue::batches::join(&mut super::deps::Deps(tx), &joins, now)?;
    }
    Ok(ids)
}

impl Enqueue for Store {
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>> {
        let ids = self.commit_grouped(rows, |tx, group| {
            let now = self.now_ms();
            group
                .iter()
                .map(|rows| insert_valid(tx, rows, now))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(ids)
    }
}

/// Jobs written inside the application's own transaction on the same
/// file, a part of the `Queue` API only SQLite has.
impl Store {
    /// See [`crate::Queue::enqueue_batch_tx`].
    pub(crate) fn enqueue_tx(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rows: &[ValidJob],
        now: i64,
    ) -> Result<Vec<JobId>> {
        let ids = insert_valid(tx, rows, now)?;
        // Wakes this process's fetchers; they find the job once the caller
        // commits (the commit also changes data_version for every watcher).
        self.notify_watchers();
        Ok(ids)
    }
}
