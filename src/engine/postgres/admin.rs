//! Operators' writes on PostgreSQL: cancel, retry, prune and retry dead
//! jobs in batches (skipping rows another process holds), pause and resume
//! queues; each wakes the watchers of every process where jobs may have
//! become claimable.

use super::claim::paused_in;
use super::connection::Tx;
use super::enqueue::HELD_SQL;
use super::Store;
use crate::engine::types::RetryDeadBatch;
use crate::engine::{revive, Admin};
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};

/// The rows a prune or delete keeps for other jobs (`j` the job): a
/// parent while a child that has not finished runs after it, and a batch's
/// member until the batch has finished and its callbacks have ended (they
/// read the members).
macro_rules! needed_by_others {
    () => {
        "NOT EXISTS (
             SELECT 1 FROM tickler_deps AS d
             JOIN tickler_jobs AS c ON c.id = d.child_id
             WHERE d.parent_id = j.id AND c.finished_at IS NULL)
         AND (j.batch_id IS NULL OR NOT EXISTS (
             SELECT 1 FROM tickler_batches AS b WHERE b.id = j.batch_id
               AND (b.finished_at IS NULL OR EXISTS (
                   SELECT 1 FROM tickler_jobs AS c
                   WHERE c.batch_id = b.id AND c.finished_at IS NULL
                     AND c.batch_end IN ('on_success', 'on_failure', 'on_finish')))))"
    };
}

impl Admin for Store {
    fn cancel(&self, id: JobId) -> Result<()> {
        self.write(|tx, _| {
            let state = state_of(tx, id)?;
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            let now = self.now_ms();
            tx.execute(
                // The lease stays, as on SQLite (see there).
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = $1
                 WHERE id = $2",
                &[&now, &id.0],
            )?;
            super::deps::resolve(tx, &[id], now)?;
            Ok(())
        })?;
        // A holder in another process notices at its next look.
        self.notify_watchers();
        Ok(())
    }

    fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx, _| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder = tx.query_opt(
                "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                 JOIN tickler_jobs AS held ON held.unique_key = job.unique_key
                 WHERE job.id = $1 AND held.status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')",
                &[&id.0],
            )?;
            if let Some(r) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key: r.get(0),
                    held_by: JobId(r.get(1)),
                });
            }
            let now = self.now_ms();
            tx.execute(
                concat!(
                    "UPDATE tickler_jobs SET ",
                    revive!("$1::bigint"),
                    " WHERE id = $2"
                ),
                &[&now, &id.0],
            )?;
            // state_of locked the row: this statement sees the edges of
            // any resolution that committed before.
            crate::queue::deps::after_retry(&mut super::deps::Deps(tx), id, now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64> {
        let state = state.map(JobState::as_str);
        self.write(|tx, _| {
            // As on SQLite: a finished job whose holder may still be running
            // keeps its lease and its unique_key until that lease is gone.
            // A parent stays while a child that has not finished runs
            // after it (as on SQLite); a child's insert holds its parents
            // FOR SHARE, which SKIP LOCKED passes over.
            let now = self.now_ms();
            let ids: Vec<i64> = tx
                .query(
                    concat!(
                        "DELETE FROM tickler_jobs WHERE id = ANY(ARRAY(
                         SELECT id FROM tickler_jobs AS j
                         WHERE finished_at IS NOT NULL AND finished_at < $1::bigint
                           AND ($2::text IS NULL OR status = $2)
                           AND (lease_expires_at IS NULL
                                OR (lease_expires_at < $4::bigint AND limit_name IS NULL))
                           AND ",
                        needed_by_others!(),
                        "
                         LIMIT $3 FOR UPDATE SKIP LOCKED))
                     RETURNING id"
                    ),
                    &[&before, &state, &limit, &now],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            // A pruned child's edges go with it.
            tx.execute(
                "DELETE FROM tickler_deps WHERE child_id = ANY($1::bigint[])",
                &[&ids],
            )?;
            // A batch finished before the cut goes with its last job.
            tx.execute(
                "DELETE FROM tickler_batches AS b WHERE finished_at < $1::bigint
                   AND NOT EXISTS (SELECT 1 FROM tickler_jobs AS j WHERE j.batch_id = b.id)",
                &[&before],
            )?;
            Ok(ids.len() as u64)
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
            let dead = tx.query(
                "SELECT id, unique_key FROM tickler_jobs
                 WHERE status = 'dead' AND ($1::text IS NULL OR queue = $1)
                   AND ($4::text IS NULL OR kind = $4) AND id > $2
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
                &[&queue, &after_id, &limit, &kind],
            )?;
            let now = self.now_ms();
            let (mut retried, mut left_dead) = (0u64, 0u64);
            let mut last_id = None;
            let mut revived = Vec::new();
            for r in &dead {
                let id: i64 = r.get(0);
                let key: Option<String> = r.get(1);
                last_id = Some(id);
                if let Some(key) = &key {
                    if tx.query_opt(HELD_SQL, &[key])?.is_some() {
                        left_dead += 1;
                        continue;
                    }
                }
                let changed = tx.execute(
                    concat!(
                        "UPDATE tickler_jobs SET ",
                        revive!("$1::bigint"),
                        " WHERE id = $2 AND status = 'dead'"
                    ),
                    &[&now, &id],
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
            // child that has not finished runs after; rows another
            // transaction holds are left for a later batch.
            let now = self.now_ms();
            let ids: Vec<i64> = tx
                .query(
                    concat!(
                        "DELETE FROM tickler_jobs WHERE id IN (
                         SELECT id FROM tickler_jobs AS j
                         WHERE status = 'dead' AND finished_at IS NOT NULL
                           AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR kind = $2)
                           AND (lease_expires_at IS NULL OR (lease_expires_at < $3 AND limit_name IS NULL))
                           AND ",
                        needed_by_others!(),
                        "
                         LIMIT $4 FOR UPDATE SKIP LOCKED)
                     RETURNING id"
                    ),
                    &[&queue, &kind, &now, &limit],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            // A deleted child's edges go with it.
            tx.execute(
                "DELETE FROM tickler_deps WHERE child_id = ANY($1::bigint[])",
                &[&ids],
            )?;
            Ok(ids.len() as u64)
        })
    }

    fn cancel_pending_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<(u64, Vec<(String, String)>)> {
        self.write(|tx, _| {
            let now = self.now_ms();
            // Rows another transaction holds (a claim taking them) are
            // passed over: that claim wins them.
            let rows = tx.query(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = $1
                 WHERE id IN (
                     SELECT id FROM tickler_jobs WHERE status = 'pending'
                       AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR kind = $3)
                     LIMIT $4 FOR UPDATE SKIP LOCKED)
                   AND status = 'pending'
                 RETURNING limit_name, limit_key, id",
                &[&now, &queue, &kind, &limit],
            )?;
            // The jobs that run after them learn it here.
            let ended: Vec<JobId> = rows.iter().map(|r| JobId(r.get(2))).collect();
            super::deps::resolve(tx, &ended, now)?;
            let keys: std::collections::BTreeSet<(String, String)> = rows
                .iter()
                .filter_map(|r| {
                    let name: Option<String> = r.get(0);
                    let key: Option<String> = r.get(1);
                    name.map(|name| (name, key.unwrap_or_default()))
                })
                .collect();
            Ok((rows.len() as u64, keys.into_iter().collect()))
        })
    }

    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.write(|tx, _| {
            let now = self.now_ms();
            if paused {
                tx.execute(
                    "INSERT INTO tickler_paused_queues (queue, paused_at) VALUES ($1, $2)
                     ON CONFLICT (queue) DO NOTHING",
                    &[&queue, &now],
                )?;
            } else {
                tx.execute(
                    "DELETE FROM tickler_paused_queues WHERE queue = $1",
                    &[&queue],
                )?;
            }
            Ok(())
        })?;
        // NOTIFY: the pools of other processes wake up and look again.
        self.notify_watchers();
        Ok(())
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|tx| Ok(paused_in(tx)?.into_iter().collect()))
    }
}

fn state_of(tx: &mut Tx<'_>, id: JobId) -> Result<JobState> {
    let row = tx.query_opt(
        "SELECT status FROM tickler_jobs WHERE id = $1 FOR UPDATE",
        &[&id.0],
    )?;
    row.ok_or(Error::NotFound(id))?.get::<_, String>(0).parse()
}
