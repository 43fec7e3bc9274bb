//! Operators' writes on SQLite: cancel, retry, prune and retry dead jobs
//! in batches, pause and resume queues.

use super::claim::paused_in;
use super::Store;
use crate::engine::types::RetryDeadBatch;
use crate::engine::{revive, Admin};
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};
use rusqlite::{params, OptionalExtension};

/// A dead or cancelled job made pending again with fresh attempts, due at
/// ?1 (now). One whose holder may still be running (a cancelled run, or a
/// last attempt past its timeout, whose lease is kept) waits for that
/// lease to run out, so the retry never runs beside it, and keeps the
/// lease until then, and with it its unique_key's hold and its limit's
/// slot. ?2 id.
const REVIVE_SQL: &str = concat!("UPDATE tickler_jobs SET ", revive!("?1"), " WHERE id = ?2");

/// True for a row `j` no child that has not finished runs after.
macro_rules! needed_by_others {
    () => {
        "NOT EXISTS (SELECT 1 FROM tickler_deps AS d JOIN tickler_jobs AS c ON c.id = d.child_id
                     WHERE d.parent_id = j.id AND c.finished_at IS NULL)
         AND (j.batch_id IS NULL OR NOT EXISTS (
             SELECT 1 FROM tickler_batches AS b WHERE b.id = j.batch_id
               AND (b.finished_at IS NULL OR EXISTS (
                   SELECT 1 FROM tickler_jobs AS c INDEXED BY tickler_jobs_batch
                   WHERE c.batch_id = b.id AND c.finished_at IS NULL
                     AND c.batch_end IN ('on_success', 'on_failure', 'on_finish')))))"
    };
}

impl Admin for Store {
    fn cancel(&self, id: JobId) -> Result<()> {
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            // A running job keeps its run_token and lease: until its holder
            // has stopped (its outcome, refused, clears the lease) or the
            // lease runs out, no other job with its unique_key starts and
            // its limit's slot stays taken. So does a retry that kept the
            // lease of a run given up on (timed out, its thread maybe still
            // at work): only such rows have a lease when not running.
            let now = self.now_ms();
            tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?1
                 WHERE id = ?2",
            )?
            .execute(params![now, id.0])?;
            super::deps::resolve(tx, &[id], now)?;
            Ok(())
        })?;
        // A job that ran after it anyway may be pending now.
        self.notify_watchers();
        Ok(())
    }

    fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder: Option<(String, i64)> = tx
                .prepare_cached(
                    "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                     JOIN tickler_jobs AS held ON held.unique_key = job.unique_key
                     WHERE job.id = ?1 AND held.status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')",
                )?
                .query_row([id.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((unique_key, held_by)) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key,
                    held_by: JobId(held_by),
                });
            }
            let now = self.now_ms();
            tx.prepare_cached(REVIVE_SQL)?.execute(params![now, id.0])?;
            crate::queue::deps::after_retry(&mut super::deps::Deps(tx), id, now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64> {
        let deleted = self.write(|tx| {
            // A cancelled (or timed-out dead) job whose holder may still be
            // running keeps its lease, and with it its unique_key: it is
            // pruned once that lease is cleared or has run out, or the next
            // job with its key would start beside the old run. A lease of a
            // limit's slot that ran out waits for the reaper's pass, which
            // hands the slot on: a deleted row would free it to no one.
            let now = self.now_ms();
            // A parent stays while a child that has not finished runs
            // after it: the child waits on its end, then reads its output.
            // Two statements, so that each keeps the plan of its index.
            let ids: Vec<i64> = match state {
                None => tx
                    .prepare_cached(concat!(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs AS j WHERE finished_at IS NOT NULL AND finished_at < ?1
                               AND (lease_expires_at IS NULL OR (lease_expires_at < ?3 AND limit_name IS NULL))
                               AND ",
                        needed_by_others!(),
                        " LIMIT +?2) RETURNING id"
                    ))?
                    .query_map(params![before, limit, now], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?,
                Some(state) => tx
                    .prepare_cached(concat!(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs AS j
                             WHERE finished_at IS NOT NULL AND finished_at < ?1 AND status = ?2
                               AND (lease_expires_at IS NULL OR (lease_expires_at < ?4 AND limit_name IS NULL))
                               AND ",
                        needed_by_others!(),
                        " LIMIT +?3) RETURNING id"
                    ))?
                    .query_map(params![before, state.as_str(), limit, now], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?,
            };
            // A pruned child's edges go with it.
            tx.prepare_cached(
                "DELETE FROM tickler_deps WHERE child_id IN (SELECT value FROM json_each(?1))",
            )?
            .execute([serde_json::to_string(&ids)?])?;
            // A batch finished before the cut goes with its last job.
            tx.prepare_cached(
                "DELETE FROM tickler_batches WHERE finished_at < ?1
                   AND NOT EXISTS (SELECT 1 FROM tickler_jobs AS j WHERE j.batch_id = tickler_batches.id)",
            )?
            .execute([before])?;
            Ok(ids.len())
        })?;
        Ok(deleted as u64)
    }

    fn retry_dead_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        after_id: i64,
        limit: i64,
    ) -> Result<RetryDeadBatch> {
        self.write(|tx| {
            let dead: Vec<(i64, Option<String>)> = tx
                .prepare_cached(
                    "SELECT id, unique_key FROM tickler_jobs
                     WHERE status = 'dead' AND (?1 IS NULL OR queue = ?1)
                       AND (?4 IS NULL OR kind = ?4) AND id > ?2
                     ORDER BY id LIMIT +?3",
                )?
                .query_map(params![queue, after_id, limit, kind], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut held = tx.prepare_cached(
                "SELECT 1 FROM tickler_jobs WHERE unique_key = ?1
                   AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')",
            )?;
            let mut revive = tx.prepare_cached(concat!(
                "UPDATE tickler_jobs SET ",
                revive!("?1"),
                " WHERE id = ?2 AND status = 'dead'"
            ))?;
            let now = self.now_ms();
            let (mut retried, mut left_dead) = (0u64, 0u64);
            let mut revived = Vec::new();
            for (id, key) in &dead {
                if let Some(key) = key {
                    if held.exists([key])? {
                        left_dead += 1;
                        continue;
                    }
                }
                if revive.execute(params![now, id])? == 1 {
                    retried += 1;
                    revived.push(JobId(*id));
                }
            }
            drop((held, revive));
            // A batch's member runs again: it remains in its batch.
            crate::queue::batches::revive(&mut super::deps::Deps(tx), &revived, now)?;
            Ok(RetryDeadBatch {
                retried,
                left_dead,
                last_id: dead.last().map(|(id, _)| *id),
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
        let now = self.now_ms();
        let deleted = self.write(|tx| {
            // The lease rule of prune_batch: a dead job whose holder may
            // still run keeps its row (and unique_key) until the lease ends;
            // and its rule for a parent a child that has not finished runs
            // after.
            let ids: Vec<i64> = tx
                .prepare_cached(concat!(
                    "DELETE FROM tickler_jobs WHERE id IN (
                         SELECT id FROM tickler_jobs AS j
                         WHERE status = 'dead' AND finished_at IS NOT NULL
                           AND (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR kind = ?2)
                           AND (lease_expires_at IS NULL OR (lease_expires_at < ?3 AND limit_name IS NULL))
                           AND ",
                    needed_by_others!(),
                    " LIMIT +?4) RETURNING id"
                ))?
                .query_map(params![queue, kind, now, limit], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            // A deleted child's edges go with it.
            tx.prepare_cached(
                "DELETE FROM tickler_deps WHERE child_id IN (SELECT value FROM json_each(?1))",
            )?
            .execute([serde_json::to_string(&ids)?])?;
            Ok(ids.len())
        })?;
        Ok(deleted as u64)
    }

    fn cancel_pending_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<(u64, Vec<(String, String)>)> {
        let now = self.now_ms();
        self.write(|tx| {
            let mut keys = std::collections::BTreeSet::new();
            let mut n = 0u64;
            let mut stmt = tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?1
                 WHERE id IN (
                     SELECT id FROM tickler_jobs WHERE status = 'pending'
                       AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3)
                     LIMIT +?4)
                 RETURNING limit_name, limit_key, id",
            )?;
            let mut rows = stmt.query(params![now, queue, kind, limit])?;
            let mut ended = Vec::new();
            while let Some(r) = rows.next()? {
                n += 1;
                ended.push(JobId(r.get(2)?));
                if let Some(name) = r.get::<_, Option<String>>(0)? {
                    keys.insert((name, r.get::<_, Option<String>>(1)?.unwrap_or_default()));
                }
            }
            drop(rows);
            drop(stmt);
            // The jobs that run after them learn it here.
            super::deps::resolve(tx, &ended, now)?;
            Ok((n, keys.into_iter().collect()))
        })
    }

    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()> {
        let now = self.now_ms();
        self.write(|tx| {
            if paused {
                tx.prepare_cached(
                    "INSERT INTO tickler_paused_queues (queue, paused_at) VALUES (?1, ?2)
                     ON CONFLICT (queue) DO NOTHING",
                )?
                .execute(params![queue, now])?;
            } else {
                tx.prepare_cached("DELETE FROM tickler_paused_queues WHERE queue = ?1")?
                    .execute([queue])?;
            }
            Ok(())
        })?;
        // Other processes see the commit (a change of the -wal file); this
        // process's fetchers are woken here.
        self.notify_watchers();
        Ok(())
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|conn| Ok(paused_in(conn)?.into_iter().collect()))
    }
}

pub(crate) fn state_of(tx: &rusqlite::Transaction<'_>, id: JobId) -> Result<JobState> {
    let status: Option<String> = tx
        .prepare_cached("SELECT status FROM tickler_jobs WHERE id = ?1")?
        .query_row([id.0], |r| r.get(0))
        .optional()?;
    status.ok_or(Error::NotFound(id))?.parse()
}
