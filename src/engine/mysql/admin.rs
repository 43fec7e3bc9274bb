//! Operators' writes on MySQL: cancel, retry, prune and retry dead jobs in
//! batches (skipping rows another process holds), pause and resume queues;
//! each wakes this process's watchers where jobs may have become claimable.

use super::claim::paused_in;
use super::connection::{args, marks, Tx};
use super::enqueue::{check_name, HELD_SQL};
use super::rows::get;
use super::Store;
use crate::engine::types::RetryDeadBatch;
use crate::engine::{revive, Admin};
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};
use mysql::Value;

/// The rows a prune or delete keeps for other jobs (`tickler_jobs` the
/// job): a parent while a child that has not finished runs after it, and
/// a batch's member until the batch has finished and its callbacks have
/// ended (they read the members).
macro_rules! needed_by_others {
    () => {
        "NOT EXISTS (
             SELECT 1 FROM tickler_deps AS d
             JOIN tickler_jobs AS c ON c.id = d.child_id
             WHERE d.parent_id = tickler_jobs.id AND c.finished_at IS NULL)
         AND (tickler_jobs.batch_id IS NULL OR NOT EXISTS (
             SELECT 1 FROM tickler_batches AS b WHERE b.id = tickler_jobs.batch_id
               AND (b.finished_at IS NULL OR EXISTS (
                   SELECT 1 FROM tickler_jobs AS c
                   WHERE c.batch_id = b.id AND c.finished_at IS NULL
                     AND c.batch_end IN ('on_success', 'on_failure', 'on_finish')))))"
    };
}

impl Admin for Store {
    fn cancel(&self, id: JobId) -> Result<()> {
        self.write(|tx, attempt| {
            let state = state_of(tx, id)?;
            if attempt.after_unknown_commit && state == JobState::Cancelled {
                // The try whose COMMIT answer was lost cancelled it.
                return Ok(());
            }
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            let now = self.now_ms();
            // The lease stays, as on SQLite (see there).
            tx.exec(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?
                 WHERE id = ?",
                args![now, id.0],
            )?;
            super::deps::resolve(tx, &[id], now)?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx, attempt| {
            let state = state_of(tx, id)?;
            if attempt.after_unknown_commit
                && matches!(
                    state,
                    JobState::Pending | JobState::Scheduled | JobState::Waiting
                )
            {
                // The try whose COMMIT answer was lost retried it.
                return Ok(());
            }
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder = tx.first(
                "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                 JOIN tickler_jobs AS held ON held.unique_live = job.unique_key
                 WHERE job.id = ?",
                args![id.0],
            )?;
            if let Some(r) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key: get(&r, 0)?,
                    held_by: JobId(get(&r, 1)?),
                });
            }
            let now = self.now_ms();
            // Assignments in order: the lease is read before it is changed.
            tx.exec_named(
                concat!(
                    "UPDATE tickler_jobs SET ",
                    revive!(":now"),
                    " WHERE id = :id"
                ),
                &[("now", Value::from(now)), ("id", Value::from(id.0))],
            )?;
            crate::queue::deps::after_retry(&mut super::deps::Deps(tx), id, now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64> {
        let state = state.map(JobState::as_str);
        self.write(|tx, _| {
            // As on SQLite: a finished job whose holder may still be running
            // keeps its lease and its unique_key until that lease is gone,
            // and a parent stays while a child that has not finished runs
            // after it (a child's insert holds its parents in share mode,
            // which SKIP LOCKED passes over).
            let now = self.now_ms();
            let ids: Vec<Value> = tx
                .rows_named(
                    concat!(
                    "SELECT id FROM tickler_jobs
                     WHERE finished_at IS NOT NULL AND finished_at < :before
                       AND (:state IS NULL OR status = :state)
                       AND (lease_expires_at IS NULL OR (lease_expires_at < :now AND limit_name IS NULL))
                       AND ",
                    needed_by_others!(),
                    "
                     LIMIT :limit FOR UPDATE SKIP LOCKED"
                    ),
                    &[
                        ("before", Value::from(before)),
                        ("state", Value::from(state)),
                        ("now", Value::from(now)),
                        ("limit", Value::from(limit)),
                    ],
                )?
                .iter()
                .map(|r| get::<i64>(r, 0).map(Value::from))
                .collect::<Result<_>>()?;
            let deleted = delete_ids(tx, ids)?;
            // A batch finished before the cut goes with its last job.
            tx.exec(
                "DELETE FROM tickler_batches WHERE finished_at < ?
                   AND NOT EXISTS (SELECT 1 FROM tickler_jobs AS j
                                   WHERE j.batch_id = tickler_batches.id)",
                args![before],
            )?;
            Ok(deleted)
        })
    }

    fn retry_dead_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        after_id: i64,
        limit: i64,
    ) -> Result<RetryDeadBatch> {
        self.write(|tx, _| {
            let dead = tx.rows_named(
                "SELECT id, unique_key FROM tickler_jobs
                 WHERE status = 'dead' AND (:queue IS NULL OR queue = :queue)
                   AND (:kind IS NULL OR kind = :kind) AND id > :after
                 ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED",
                &[
                    ("queue", Value::from(queue)),
                    ("kind", Value::from(kind)),
                    ("after", Value::from(after_id)),
                    ("limit", Value::from(limit)),
                ],
            )?;
            let now = self.now_ms();
            let (mut retried, mut left_dead) = (0u64, 0u64);
            let mut last_id = None;
            let mut revived = Vec::new();
            for r in &dead {
                let id: i64 = get(r, 0)?;
                let key: Option<Vec<u8>> = get(r, 1)?;
                last_id = Some(id);
                if let Some(key) = key {
                    if tx.first(HELD_SQL, vec![Value::from(key)])?.is_some() {
                        left_dead += 1;
                        continue;
                    }
                }
                let changed = tx.exec_named(
                    concat!(
                        "UPDATE tickler_jobs SET ",
                        revive!(":now"),
                        " WHERE id = :id AND status = 'dead'"
                    ),
                    &[("now", Value::from(now)), ("id", Value::from(id))],
                )?;
                retried += changed;
                if changed == 1 {
                    revived.push(JobId(id));
                }
            }
            // A batch's member runs again: it remains in its batch.
            crate::queue::batches::revive(&mut super::deps::Deps(tx), &revived, now)?;
            Ok(RetryDeadBatch {
                retried,
                left_dead,
                last_id,
                seen: dead.len(),
            })
        })
    }

    fn delete_dead_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<u64> {
        self.write(|tx, _| {
            // The lease rule of prune_batch, and its rule for a parent a
            // child that has not finished runs after. MySQL refuses a LIMIT in a
            // subquery of IN and a DELETE reading its own table: the ids
            // are locked and read first, then deleted in one statement.
            let now = self.now_ms();
            let ids: Vec<Value> = tx
                .rows_named(
                    concat!(
                    "SELECT id FROM tickler_jobs
                     WHERE status = 'dead' AND finished_at IS NOT NULL
                       AND (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                       AND (lease_expires_at IS NULL OR (lease_expires_at < :now AND limit_name IS NULL))
                       AND ",
                    needed_by_others!(),
                    "
                     LIMIT :limit FOR UPDATE SKIP LOCKED"
                    ),
                    &[
                        ("queue", Value::from(queue)),
                        ("kind", Value::from(kind)),
                        ("now", Value::from(now)),
                        ("limit", Value::from(limit)),
                    ],
                )?
                .iter()
                .map(|r| get::<i64>(r, 0).map(Value::from))
                .collect::<Result<_>>()?;
            delete_ids(tx, ids)
        })
    }

    fn cancel_pending_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<(u64, Vec<(String, String)>)> {
        self.write(|tx, _| {
            // No UPDATE … RETURNING: the rows are locked and read, then
            // cancelled in one statement.
            let rows = tx.rows_named(
                "SELECT id, limit_name, limit_key FROM tickler_jobs
                 WHERE status = 'pending'
                   AND (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 LIMIT :limit FOR UPDATE SKIP LOCKED",
                &[
                    ("queue", Value::from(queue)),
                    ("kind", Value::from(kind)),
                    ("limit", Value::from(limit)),
                ],
            )?;
            if rows.is_empty() {
                return Ok((0, Vec::new()));
            }
            let mut ids = Vec::with_capacity(rows.len());
            let mut keys = std::collections::BTreeSet::new();
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            for r in &rows {
                ids.push(Value::from(get::<i64>(r, 0)?));
                if let Some(name) = get::<Option<Vec<u8>>>(r, 1)? {
                    let key = get::<Option<Vec<u8>>>(r, 2)?.map(text).unwrap_or_default();
                    keys.insert((text(name), key));
                }
            }
            let now = self.now_ms();
            let ended: Vec<crate::job::JobId> = rows
                .iter()
                .map(|r| get::<i64>(r, 0).map(crate::job::JobId))
                .collect::<Result<_>>()?;
            let mut values = vec![Value::from(now)];
            let marks = marks(ids.len());
            values.extend(ids);
            let n = tx.exec(
                &format!(
                    "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?
                     WHERE id IN ({marks}) AND status = 'pending'"
                ),
                values,
            )?;
            // The jobs that run after them learn it here.
            super::deps::resolve(tx, &ended, now)?;
            Ok((n, keys.into_iter().collect()))
        })
    }

    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()> {
        check_name("queue", queue)?;
        self.write(|tx, _| {
            let now = self.now_ms();
            if paused {
                tx.exec(
                    "INSERT INTO tickler_paused_queues (queue, paused_at) VALUES (?, ?)
                     ON DUPLICATE KEY UPDATE queue = queue",
                    args![queue, now],
                )?;
            } else {
                tx.exec(
                    "DELETE FROM tickler_paused_queues WHERE queue = ?",
                    args![queue],
                )?;
            }
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|tx| Ok(paused_in(tx)?.into_iter().collect()))
    }
}

fn state_of(tx: &mut Tx<'_>, id: JobId) -> Result<JobState> {
    let row = tx.first(
        "SELECT status FROM tickler_jobs WHERE id = ? FOR UPDATE",
        args![id.0],
    )?;
    get::<String>(&row.ok_or(Error::NotFound(id))?, 0)?.parse()
}

/// Deletes the rows of `ids` (locked by the caller's read) in one
/// statement; returns how many.
fn delete_ids(tx: &mut Tx<'_>, ids: Vec<Value>) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    // A deleted child's edges go with it.
    tx.exec(
        &format!(
            "DELETE FROM tickler_deps WHERE child_id IN ({})",
            marks(ids.len())
        ),
        ids.clone(),
    )?;
    tx.exec(
        &format!(
            "DELETE FROM tickler_jobs WHERE id IN ({})",
            marks(ids.len())
        ),
        ids,
    )
}
