//! Jobs that run after others on SQLite: the edges' statements for the
//! rules in `crate::queue::deps`. The file's single writer orders a
//! parent's end and a child's insert: no row locks are needed.

use crate::batch::{BatchId, BatchRow, Callback};
use crate::engine::{BatchTx, DepTx};
use crate::error::{Error, Result};
use crate::job::{IfParentFails, JobId, JobState};
use crate::queue::deps::{ChildChange, Ended, EndedEdge};
use rusqlite::params;
use std::collections::HashMap;

/// The [`DepTx`] of a write transaction on the file.
pub(crate) struct Deps<'a, 'b>(pub &'a rusqlite::Transaction<'b>);

/// The ids as a JSON array, read by `json_each`.
fn id_list(ids: &[JobId]) -> String {
    serde_json::to_string(&ids.iter().map(|id| id.0).collect::<Vec<_>>()).expect("integers")
}

fn state(text: &str) -> Result<JobState> {
    text.parse()
        .map_err(|_| Error::Config(format!("a job's status {text:?} is not one tickler knows")))
}

impl BatchTx for Deps<'_, '_> {
    fn join_batch(&mut self, batch: BatchId, role: Option<Callback>, ids: &[JobId]) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET batch_id = ?1, batch_end = ?2
                 WHERE id IN (SELECT value FROM json_each(?3))",
            )?
            .execute(params![batch.0, role.map(Callback::as_str), id_list(ids)])?;
        Ok(())
    }

    fn lock_batches(&mut self, ids: &[BatchId]) -> Result<Vec<BatchRow>> {
        let ids: Vec<i64> = ids.iter().map(|b| b.0).collect();
        let rows = self
            .0
            .prepare_cached(
                "SELECT id, sealed_at IS NOT NULL, finished_at IS NOT NULL, members, remaining,
                        succeeded, dead, cancelled
                 FROM tickler_batches WHERE id IN (SELECT value FROM json_each(?1)) ORDER BY id",
            )?
            .query_map([serde_json::to_string(&ids)?], |r| {
                Ok(BatchRow {
                    id: BatchId(r.get(0)?),
                    sealed: r.get(1)?,
                    finished: r.get(2)?,
                    members: r.get(3)?,
                    remaining: r.get(4)?,
                    succeeded: r.get(5)?,
                    dead: r.get(6)?,
                    cancelled: r.get(7)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn write_batch(&mut self, row: &BatchRow, now: i64) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE tickler_batches SET members = ?2, remaining = ?3, succeeded = ?4,
                     dead = ?5, cancelled = ?6,
                     sealed_at = coalesce(sealed_at, CASE WHEN ?7 THEN ?9 END),
                     finished_at = coalesce(finished_at, CASE WHEN ?8 THEN ?9 END)
                 WHERE id = ?1",
            )?
            .execute(params![
                row.id.0,
                row.members,
                row.remaining,
                row.succeeded,
                row.dead,
                row.cancelled,
                row.sealed,
                row.finished,
                now
            ])?;
        Ok(())
    }

    fn count_members(&mut self, ids: &[JobId]) -> Result<Vec<(JobId, BatchId, JobState)>> {
        let rows: Vec<(i64, i64, String)> = self
            .0
            .prepare_cached(
                "UPDATE tickler_jobs SET batch_end = status
                 WHERE id IN (SELECT value FROM json_each(?1))
                   AND batch_id IS NOT NULL AND batch_end IS NULL
                   AND status IN ('succeeded', 'dead', 'cancelled')
                 RETURNING id, batch_id, status",
            )?
            .query_map([id_list(ids)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        rows.into_iter()
            .map(|(id, batch, s)| Ok((JobId(id), BatchId(batch), state(&s)?)))
            .collect()
    }

    fn uncount_members(&mut self, ids: &[JobId]) -> Result<Vec<(BatchId, JobState)>> {
        let list = id_list(ids);
        let rows: Vec<(i64, String)> = self
            .0
            .prepare_cached(
                "SELECT batch_id, batch_end FROM tickler_jobs
                 WHERE id IN (SELECT value FROM json_each(?1))
                   AND batch_end IN ('succeeded', 'dead', 'cancelled')",
            )?
            .query_map([&list], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET batch_end = NULL
                 WHERE id IN (SELECT value FROM json_each(?1))
                   AND batch_end IN ('succeeded', 'dead', 'cancelled')",
            )?
            .execute([&list])?;
        rows.into_iter()
            .map(|(batch, s)| Ok((BatchId(batch), state(&s)?)))
            .collect()
    }

    fn wait_for_batch(&mut self, id: JobId) -> Result<bool> {
        let changed = self
            .0
            .prepare_cached(
                "UPDATE tickler_jobs SET status = 'waiting'
             WHERE id = ?1 AND status IN ('pending', 'scheduled')
               AND batch_end IN ('on_success', 'on_failure', 'on_finish')
               AND EXISTS (SELECT 1 FROM tickler_batches AS b
                           WHERE b.id = tickler_jobs.batch_id AND b.finished_at IS NULL)",
            )?
            .execute([id.0])?;
        Ok(changed == 1)
    }

    fn batch_callbacks(&mut self, batch: BatchId) -> Result<Vec<(JobId, Callback)>> {
        let rows: Vec<(i64, String)> = self
            .0
            .prepare_cached(
                "SELECT id, batch_end FROM tickler_jobs INDEXED BY tickler_jobs_batch
                 WHERE batch_id = ?1 AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
            )?
            .query_map([batch.0], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, role)| Some((JobId(id), Callback::from_stored(&role)?)))
            .collect())
    }
}

impl DepTx for Deps<'_, '_> {
    fn lock_parents(&mut self, ids: &[JobId]) -> Result<HashMap<JobId, JobState>> {
        let rows: Vec<(i64, String)> = self
            .0
            .prepare_cached(
                "SELECT id, status FROM tickler_jobs
                 WHERE id IN (SELECT value FROM json_each(?1))",
            )?
            .query_map([id_list(ids)], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        rows.into_iter()
            .map(|(id, s)| Ok((JobId(id), state(&s)?)))
            .collect()
    }

    fn insert_edges(&mut self, edges: &[(JobId, JobId, IfParentFails)]) -> Result<()> {
        let mut insert = self.0.prepare_cached(
            "INSERT INTO tickler_deps (parent_id, child_id, if_fails) VALUES (?1, ?2, ?3)
             ON CONFLICT DO UPDATE SET if_fails = excluded.if_fails",
        )?;
        for (parent, child, if_fails) in edges {
            insert.execute(params![parent.0, child.0, if_fails.as_str()])?;
        }
        Ok(())
    }

    fn ended_edges(&mut self, parents: &[JobId]) -> Result<Ended> {
        let ids = id_list(parents);
        let edges: Vec<(i64, String, i64, String)> = self
            .0
            .prepare_cached(
                // In this order (CROSS JOIN fixes it): from the ids, the
                // edges of each by their key, then each parent by its id.
                // Left to itself, with few edges stored, the planner
                // scanned the finished jobs for the parents' states.
                "SELECT d.parent_id, p.status, d.child_id, d.if_fails
                 FROM json_each(?1) AS e
                 CROSS JOIN tickler_deps AS d ON d.parent_id = e.value
                 CROSS JOIN tickler_jobs AS p ON p.id = d.parent_id
                 WHERE d.resolved = 0 AND p.status IN ('succeeded', 'dead', 'cancelled')",
            )?
            .query_map([&ids], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut ended = Ended::default();
        for (parent, status, child, if_fails) in edges {
            ended.edges.push(EndedEdge {
                parent: JobId(parent),
                parent_state: state(&status)?,
                child: JobId(child),
                if_fails: IfParentFails::from_stored(&if_fails).unwrap_or_default(),
            });
        }
        // The members not yet counted are in an index of their own, empty
        // when no batch runs: one look at it spares every other outcome
        // a read of each job it ended (2.5 % of a burn-down's
        // instructions when each was read).
        let any: bool = self
            .0
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM tickler_jobs INDEXED BY tickler_jobs_uncounted
                                WHERE batch_id IS NOT NULL AND batch_end IS NULL)",
            )?
            .query_row([], |r| r.get(0))?;
        if any {
            ended.members = self
                .0
                .prepare_cached(
                    "SELECT j.id FROM json_each(?1) AS e
                     CROSS JOIN tickler_jobs AS j INDEXED BY tickler_jobs_uncounted ON j.id = e.value
                     WHERE j.batch_id IS NOT NULL AND j.batch_end IS NULL
                       AND j.status IN ('succeeded', 'dead', 'cancelled')",
                )?
                .query_map([&ids], |r| Ok(JobId(r.get(0)?)))?
                .collect::<rusqlite::Result<_>>()?;
        }
        Ok(ended)
    }

    fn lock_children(&mut self, _children: &[JobId]) -> Result<()> {
        Ok(())
    }

    fn mark_resolved(&mut self, edges: &[(JobId, JobId)]) -> Result<()> {
        let mut mark = self.0.prepare_cached(
            "UPDATE tickler_deps SET resolved = 1 WHERE parent_id = ?1 AND child_id = ?2",
        )?;
        for (parent, child) in edges {
            mark.execute(params![parent.0, child.0])?;
        }
        Ok(())
    }

    fn cancel_waiting(
        &mut self,
        children: &[(JobId, String)],
        now: i64,
    ) -> Result<Vec<ChildChange>> {
        let mut cancel = self.0.prepare_cached(
            "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?1, last_error = ?2
             WHERE id = ?3 AND status = 'waiting'
             RETURNING kind, queue",
        )?;
        let mut out = Vec::new();
        for (child, error) in children {
            let mut rows = cancel.query(params![now, error, child.0])?;
            if let Some(row) = rows.next()? {
                out.push(ChildChange {
                    job_id: *child,
                    kind: row.get(0)?,
                    queue: row.get(1)?,
                    state: JobState::Cancelled,
                });
            }
        }
        Ok(out)
    }

    fn release_waiting(&mut self, children: &[JobId], now: i64) -> Result<Vec<ChildChange>> {
        let mut release = self.0.prepare_cached(
            "UPDATE tickler_jobs
             SET status = CASE WHEN run_at <= max(?1, created_at) THEN 'pending' ELSE 'scheduled' END
             WHERE id = ?2 AND status = 'waiting'
               AND NOT EXISTS (SELECT 1 FROM tickler_deps WHERE child_id = ?2 AND resolved = 0)
             RETURNING kind, queue, status",
        )?;
        let mut out = Vec::new();
        for child in children {
            let mut rows = release.query(params![now, child.0])?;
            if let Some(row) = rows.next()? {
                let status: String = row.get(2)?;
                out.push(ChildChange {
                    job_id: *child,
                    kind: row.get(0)?,
                    queue: row.get(1)?,
                    state: state(&status)?,
                });
            }
        }
        Ok(out)
    }

    fn wait_again(&mut self, id: JobId) -> Result<bool> {
        let changed = self
            .0
            .prepare_cached(
                "UPDATE tickler_jobs SET status = 'waiting'
                 WHERE id = ?1 AND status IN ('pending', 'scheduled')
                   AND EXISTS (SELECT 1 FROM tickler_deps AS d JOIN tickler_jobs AS p ON p.id = d.parent_id
                               WHERE d.child_id = ?1 AND d.resolved = 0)",
            )?
            .execute([id.0])?;
        Ok(changed == 1)
    }
}

/// See [`crate::Queue::parents`].
pub(crate) fn dependencies(
    conn: &rusqlite::Connection,
    id: JobId,
) -> Result<Vec<crate::Dependency>> {
    let exists: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM tickler_jobs WHERE id = ?1)")?
        .query_row([id.0], |r| r.get(0))?;
    if !exists {
        return Err(Error::NotFound(id));
    }
    let rows: Vec<(i64, String, bool)> = conn
        .prepare_cached(
            "SELECT parent_id, if_fails, resolved FROM tickler_deps WHERE child_id = ?1
             ORDER BY parent_id",
        )?
        .query_map([id.0], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows
        .into_iter()
        .map(|(parent, if_fails, resolved)| crate::Dependency {
            parent: JobId(parent),
            if_fails: IfParentFails::from_stored(&if_fails).unwrap_or_default(),
            resolved,
        })
        .collect())
}

/// Resolves the children of those of `ended` that ended, in `tx` (see
/// `crate::queue::deps::resolve`).
pub(crate) fn resolve(
    tx: &rusqlite::Transaction<'_>,
    ended: &[JobId],
    now: i64,
) -> Result<Vec<ChildChange>> {
    crate::queue::deps::resolve(&mut Deps(tx), ended, now)
}

/// Stores the edges of the children one insert stored (see
/// `crate::queue::deps::store_edges`).
pub(crate) fn store_edges(
    tx: &rusqlite::Transaction<'_>,
    children: &[(JobId, Vec<(JobId, IfParentFails)>)],
    now: i64,
) -> Result<Vec<ChildChange>> {
    crate::queue::deps::store_edges(&mut Deps(tx), children, now)
}
