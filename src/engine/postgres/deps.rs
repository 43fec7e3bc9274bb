//! Jobs that run after others on PostgreSQL: the edges' statements for
//! the rules in `crate::queue::deps`. A child's insert reads its parents
//! `FOR SHARE`, which waits for a parent's change of state in flight and
//! then reads it (READ COMMITTED): whichever of the two commits second
//! sees the other. The edges a parent's end resolves are read `FOR
//! UPDATE`, after that end's write to the parent row.

use super::limits::Exec;
use crate::batch::{BatchId, BatchRow, Callback};
use crate::engine::{BatchTx, DepTx};
use crate::error::{Error, Result};
use crate::job::{IfParentFails, JobId, JobState};
use crate::queue::deps::{ChildChange, Ended, EndedEdge};
use std::collections::HashMap;

/// The [`DepTx`] of a transaction (tickler's, or the application's in
/// `complete_with`).
pub(crate) struct Deps<'a, E: Exec>(pub(crate) &'a mut E);

fn state(text: &str) -> Result<JobState> {
    text.parse()
        .map_err(|_| Error::Config(format!("a job's status {text:?} is not one tickler knows")))
}

fn ids(ids: &[JobId]) -> Vec<i64> {
    ids.iter().map(|id| id.0).collect()
}

fn batch_ids(ids: &[BatchId]) -> Vec<i64> {
    ids.iter().map(|b| b.0).collect()
}

impl<E: Exec> BatchTx for Deps<'_, E> {
    fn join_batch(&mut self, batch: BatchId, role: Option<Callback>, jobs: &[JobId]) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_jobs SET batch_id = $1, batch_end = $2 WHERE id = ANY($3::bigint[])",
            &[&batch.0, &role.map(Callback::as_str), &ids(jobs)],
        )?;
        Ok(())
    }

    fn lock_batches(&mut self, batches: &[BatchId]) -> Result<Vec<BatchRow>> {
        let rows = self.0.rows(
            "SELECT id, sealed_at IS NOT NULL, finished_at IS NOT NULL, members, remaining,
                    succeeded, dead, cancelled
             FROM tickler_batches WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE",
            &[&batch_ids(batches)],
        )?;
        Ok(rows
            .iter()
            .map(|r| BatchRow {
                id: BatchId(r.get(0)),
                sealed: r.get(1),
                finished: r.get(2),
                members: r.get(3),
                remaining: r.get(4),
                succeeded: r.get(5),
                dead: r.get(6),
                cancelled: r.get(7),
            })
            .collect())
    }

    fn write_batch(&mut self, row: &BatchRow, now: i64) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_batches SET members = $2, remaining = $3, succeeded = $4,
                 dead = $5, cancelled = $6,
                 sealed_at = coalesce(sealed_at, CASE WHEN $7 THEN $9::bigint END),
                 finished_at = coalesce(finished_at, CASE WHEN $8 THEN $9::bigint END)
             WHERE id = $1",
            &[
                &row.id.0,
                &row.members,
                &row.remaining,
                &row.succeeded,
                &row.dead,
                &row.cancelled,
                &row.sealed,
                &row.finished,
                &now,
            ],
        )?;
        Ok(())
    }

    fn count_members(&mut self, members: &[JobId]) -> Result<Vec<(JobId, BatchId, JobState)>> {
        let rows = self.0.rows(
            "UPDATE tickler_jobs SET batch_end = status
             WHERE id = ANY($1::bigint[]) AND batch_id IS NOT NULL AND batch_end IS NULL
               AND status IN ('succeeded', 'dead', 'cancelled')
             RETURNING id, batch_id, status",
            &[&ids(members)],
        )?;
        rows.iter()
            .map(|r| Ok((JobId(r.get(0)), BatchId(r.get(1)), state(r.get(2))?)))
            .collect()
    }

    fn uncount_members(&mut self, members: &[JobId]) -> Result<Vec<(BatchId, JobState)>> {
        // The old mark, read in the statement that clears it.
        let rows = self.0.rows(
            "UPDATE tickler_jobs AS j SET batch_end = NULL
             FROM tickler_jobs AS old
             WHERE j.id = old.id AND j.id = ANY($1::bigint[])
               AND j.batch_end IN ('succeeded', 'dead', 'cancelled')
             RETURNING j.batch_id, old.batch_end",
            &[&ids(members)],
        )?;
        rows.iter()
            .map(|r| Ok((BatchId(r.get(0)), state(r.get(1))?)))
            .collect()
    }

    fn batch_callbacks(&mut self, batch: BatchId) -> Result<Vec<(JobId, Callback)>> {
        let rows = self.0.rows(
            "SELECT id, batch_end FROM tickler_jobs
             WHERE batch_id = $1 AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
            &[&batch.0],
        )?;
        Ok(rows
            .iter()
            .filter_map(|r| Some((JobId(r.get(0)), Callback::from_stored(r.get(1))?)))
            .collect())
    }
}

impl<E: Exec> DepTx for Deps<'_, E> {
    fn lock_parents(&mut self, parents: &[JobId]) -> Result<HashMap<JobId, JobState>> {
        let rows = self.0.rows(
            "SELECT id, status FROM tickler_jobs WHERE id = ANY($1::bigint[])
             ORDER BY id FOR SHARE",
            &[&ids(parents)],
        )?;
        rows.iter()
            .map(|r| Ok((JobId(r.get(0)), state(r.get(1))?)))
            .collect()
    }

    fn insert_edges(&mut self, edges: &[(JobId, JobId, IfParentFails)]) -> Result<()> {
        let parents: Vec<i64> = edges.iter().map(|e| e.0 .0).collect();
        let children: Vec<i64> = edges.iter().map(|e| e.1 .0).collect();
        let policies: Vec<&str> = edges.iter().map(|e| e.2.as_str()).collect();
        self.0.rows(
            "INSERT INTO tickler_deps (parent_id, child_id, if_fails)
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[])
             ON CONFLICT (parent_id, child_id) DO UPDATE SET if_fails = excluded.if_fails",
            &[&parents, &children, &policies],
        )?;
        Ok(())
    }

    fn ended_edges(&mut self, parents: &[JobId]) -> Result<Ended> {
        // The jobs themselves are this transaction's (it ended them) or
        // read locked (a child's insert): their batch mark is current.
        let rows = self.0.rows(
            "WITH edges AS (
                 SELECT d.parent_id, p.status, d.child_id, d.if_fails
                 FROM tickler_deps AS d JOIN tickler_jobs AS p ON p.id = d.parent_id
                 WHERE d.parent_id = ANY($1::bigint[]) AND NOT d.resolved
                   AND p.status IN ('succeeded', 'dead', 'cancelled')
                 FOR UPDATE OF d)
             SELECT parent_id, status, child_id, if_fails FROM edges
             UNION ALL
             SELECT id, status, NULL, NULL FROM tickler_jobs
             WHERE id = ANY($1::bigint[]) AND batch_id IS NOT NULL AND batch_end IS NULL
               AND status IN ('succeeded', 'dead', 'cancelled')",
            &[&ids(parents)],
        )?;
        let mut ended = Ended::default();
        for r in &rows {
            let parent = JobId(r.get(0));
            match (r.get::<_, Option<i64>>(2), r.get::<_, Option<String>>(3)) {
                (Some(child), Some(if_fails)) => ended.edges.push(EndedEdge {
                    parent,
                    parent_state: state(r.get(1))?,
                    child: JobId(child),
                    if_fails: IfParentFails::from_stored(&if_fails).unwrap_or_default(),
                }),
                _ => ended.members.push(parent),
            }
        }
        Ok(ended)
    }

    fn lock_children(&mut self, children: &[JobId]) -> Result<()> {
        self.0.rows(
            "SELECT 1 FROM tickler_jobs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE",
            &[&ids(children)],
        )?;
        Ok(())
    }

    fn mark_resolved(&mut self, edges: &[(JobId, JobId)]) -> Result<()> {
        if edges.is_empty() {
            return Ok(());
        }
        let parents: Vec<i64> = edges.iter().map(|e| e.0 .0).collect();
        let children: Vec<i64> = edges.iter().map(|e| e.1 .0).collect();
        self.0.rows(
            "UPDATE tickler_deps AS d SET resolved = TRUE
             FROM unnest($1::bigint[], $2::bigint[]) AS e(parent_id, child_id)
             WHERE d.parent_id = e.parent_id AND d.child_id = e.child_id",
            &[&parents, &children],
        )?;
        Ok(())
    }

    fn cancel_waiting(
        &mut self,
        children: &[(JobId, String)],
        now: i64,
    ) -> Result<Vec<ChildChange>> {
        if children.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = children.iter().map(|c| c.0 .0).collect();
        let errors: Vec<&str> = children.iter().map(|c| c.1.as_str()).collect();
        let rows = self.0.rows(
            "UPDATE tickler_jobs AS job
             SET status = 'cancelled', finished_at = $1::bigint, last_error = c.error
             FROM unnest($2::bigint[], $3::text[]) AS c(id, error)
             WHERE job.id = c.id AND job.status = 'waiting'
             RETURNING job.id, job.kind, job.queue",
            &[&now, &ids, &errors],
        )?;
        Ok(rows
            .iter()
            .map(|r| ChildChange {
                job_id: JobId(r.get(0)),
                kind: r.get(1),
                queue: r.get(2),
                state: JobState::Cancelled,
            })
            .collect())
    }

    fn release_waiting(&mut self, children: &[JobId], now: i64) -> Result<Vec<ChildChange>> {
        if children.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.0.rows(
            "UPDATE tickler_jobs AS job
             SET status = CASE WHEN run_at <= greatest($1::bigint, created_at)
                               THEN 'pending' ELSE 'scheduled' END
             WHERE job.id = ANY($2::bigint[]) AND job.status = 'waiting'
               AND NOT EXISTS (SELECT 1 FROM tickler_deps AS d
                               WHERE d.child_id = job.id AND NOT d.resolved)
             RETURNING job.id, job.kind, job.queue, job.status",
            &[&now, &ids(children)],
        )?;
        rows.iter()
            .map(|r| {
                Ok(ChildChange {
                    job_id: JobId(r.get(0)),
                    kind: r.get(1),
                    queue: r.get(2),
                    state: state(r.get(3))?,
                })
            })
            .collect()
    }

    fn wait_again(&mut self, id: JobId) -> Result<bool> {
        let rows = self.0.rows(
            "UPDATE tickler_jobs SET status = 'waiting'
             WHERE id = $1 AND status IN ('pending', 'scheduled')
               AND (EXISTS (SELECT 1 FROM tickler_deps AS d JOIN tickler_jobs AS p ON p.id = d.parent_id
                            WHERE d.child_id = $1 AND NOT d.resolved)
                    OR (batch_end IN ('on_success', 'on_failure', 'on_finish')
                        AND EXISTS (SELECT 1 FROM tickler_batches AS b
                                    WHERE b.id = tickler_jobs.batch_id AND b.finished_at IS NULL)))
             RETURNING id",
            &[&id.0],
        )?;
        Ok(!rows.is_empty())
    }
}

/// See [`crate::Queue::parents`].
pub(crate) fn dependencies(tx: &mut impl Exec, id: JobId) -> Result<Vec<crate::Dependency>> {
    let found = tx.rows("SELECT 1 FROM tickler_jobs WHERE id = $1", &[&id.0])?;
    if found.is_empty() {
        return Err(Error::NotFound(id));
    }
    let rows = tx.rows(
        "SELECT parent_id, if_fails, resolved FROM tickler_deps WHERE child_id = $1
         ORDER BY parent_id",
        &[&id.0],
    )?;
    Ok(rows
        .iter()
        .map(|r| crate::Dependency {
            parent: JobId(r.get(0)),
            if_fails: IfParentFails::from_stored(r.get(1)).unwrap_or_default(),
            resolved: r.get(2),
        })
        .collect())
}

/// Resolves the children of those of `ended` that ended, in `tx` (see
/// `crate::queue::deps::resolve`).
pub(crate) fn resolve(tx: &mut impl Exec, ended: &[JobId], now: i64) -> Result<Vec<ChildChange>> {
    crate::queue::deps::resolve(&mut Deps(tx), ended, now)
}

/// Stores the edges of the children one insert stored (see
/// `crate::queue::deps::store_edges`).
pub(crate) fn store_edges(
    tx: &mut impl Exec,
    children: &[(JobId, Vec<(JobId, IfParentFails)>)],
    now: i64,
) -> Result<Vec<ChildChange>> {
    crate::queue::deps::store_edges(&mut Deps(tx), children, now)
}
