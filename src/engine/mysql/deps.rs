//! Jobs that run after others on MySQL/MariaDB: the edges' statements for
//! the rules in `crate::queue::deps`. As on PostgreSQL, a child's insert
//! reads its parents with a shared lock and a parent's end reads the
//! edges with a lock (current reads, never a snapshot's); MariaDB has no
//! `UPDATE … RETURNING`, so the children changed are read first, under
//! the lock `lock_children` took.

use super::connection::{args, marks, Tx};
use super::rows::get;
use crate::batch::{BatchId, BatchRow, Callback};
use crate::engine::{BatchTx, DepTx};
use crate::error::{Error, Result};
use crate::job::{IfParentFails, JobId, JobState};
use crate::queue::deps::{ChildChange, Ended, EndedEdge};
use mysql::prelude::Queryable;
use mysql::Value;
use std::collections::{BTreeMap, HashMap};

/// The [`DepTx`] of a transaction (tickler's, or the application's in
/// `complete_with`).
pub(crate) struct Deps<'a, 'b, Q: Queryable>(pub(crate) &'a mut Tx<'b, Q>);

fn state(text: &str) -> Result<JobState> {
    text.parse()
        .map_err(|_| Error::Config(format!("a job's status {text:?} is not one tickler knows")))
}

fn values(ids: &[JobId]) -> Vec<Value> {
    values_of(ids).collect()
}

fn values_of(ids: &[JobId]) -> impl Iterator<Item = Value> + '_ {
    ids.iter().map(|id| Value::from(id.0))
}

/// Rows (or ids) one statement writes at most: well under the server's
/// 65,535 placeholders.
const CHUNK: usize = 1_000;

impl<Q: Queryable> BatchTx for Deps<'_, '_, Q> {
    fn join_batch(&mut self, batch: BatchId, role: Option<Callback>, jobs: &[JobId]) -> Result<()> {
        for chunk in jobs.chunks(CHUNK) {
            let mut args = vec![
                Value::from(batch.0),
                Value::from(role.map(Callback::as_str)),
            ];
            args.extend(values_of(chunk));
            self.0.exec(
                &format!(
                    "UPDATE tickler_jobs SET batch_id = ?, batch_end = ? WHERE id IN ({})",
                    marks(chunk.len())
                ),
                args,
            )?;
        }
        Ok(())
    }

    fn lock_batches(&mut self, batches: &[BatchId]) -> Result<Vec<BatchRow>> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.0.rows(
            &format!(
                "SELECT id, sealed_at IS NOT NULL, finished_at IS NOT NULL, members, remaining,
                        succeeded, dead, cancelled
                 FROM tickler_batches WHERE id IN ({}) ORDER BY id FOR UPDATE",
                marks(batches.len())
            ),
            batches.iter().map(|b| Value::from(b.0)).collect(),
        )?;
        rows.iter()
            .map(|r| {
                Ok(BatchRow {
                    id: BatchId(get(r, 0)?),
                    sealed: get::<i64>(r, 1)? != 0,
                    finished: get::<i64>(r, 2)? != 0,
                    members: get(r, 3)?,
                    remaining: get(r, 4)?,
                    succeeded: get(r, 5)?,
                    dead: get(r, 6)?,
                    cancelled: get(r, 7)?,
                })
            })
            .collect()
    }

    fn write_batch(&mut self, row: &BatchRow, now: i64) -> Result<()> {
        self.0.exec(
            "UPDATE tickler_batches SET members = ?, remaining = ?, succeeded = ?, dead = ?,
                 cancelled = ?,
                 sealed_at = coalesce(sealed_at, CASE WHEN ? THEN ? END),
                 finished_at = coalesce(finished_at, CASE WHEN ? THEN ? END)
             WHERE id = ?",
            vec![
                Value::from(row.members),
                Value::from(row.remaining),
                Value::from(row.succeeded),
                Value::from(row.dead),
                Value::from(row.cancelled),
                Value::from(row.sealed),
                Value::from(now),
                Value::from(row.finished),
                Value::from(now),
                Value::from(row.id.0),
            ],
        )?;
        Ok(())
    }

    fn count_members(&mut self, members: &[JobId]) -> Result<Vec<(JobId, BatchId, JobState)>> {
        // Read, then marked: the rows are the caller's (see the trait).
        let mut out = Vec::new();
        for chunk in members.chunks(CHUNK) {
            let rows = self.0.rows(
                &format!(
                    "SELECT id, batch_id, status FROM tickler_jobs
                     WHERE id IN ({}) AND batch_id IS NOT NULL AND batch_end IS NULL
                       AND status IN ('succeeded', 'dead', 'cancelled')
                     FOR UPDATE",
                    marks(chunk.len())
                ),
                values(chunk),
            )?;
            let mut found = Vec::new();
            for r in &rows {
                let id = JobId(get(r, 0)?);
                found.push(id);
                out.push((id, BatchId(get(r, 1)?), state(&get::<String>(r, 2)?)?));
            }
            if !found.is_empty() {
                self.0.exec(
                    &format!(
                        "UPDATE tickler_jobs SET batch_end = status WHERE id IN ({})",
                        marks(found.len())
                    ),
                    values(&found),
                )?;
            }
        }
        Ok(out)
    }

    fn uncount_members(&mut self, members: &[JobId]) -> Result<Vec<(BatchId, JobState)>> {
        let mut out = Vec::new();
        for chunk in members.chunks(CHUNK) {
            let rows = self.0.rows(
                &format!(
                    "SELECT id, batch_id, batch_end FROM tickler_jobs
                     WHERE id IN ({}) AND batch_end IN ('succeeded', 'dead', 'cancelled')
                     FOR UPDATE",
                    marks(chunk.len())
                ),
                values(chunk),
            )?;
            let mut found = Vec::new();
            for r in &rows {
                found.push(JobId(get(r, 0)?));
                out.push((BatchId(get(r, 1)?), state(&get::<String>(r, 2)?)?));
            }
            if !found.is_empty() {
                self.0.exec(
                    &format!(
                        "UPDATE tickler_jobs SET batch_end = NULL WHERE id IN ({})",
                        marks(found.len())
                    ),
                    values(&found),
                )?;
            }
        }
        Ok(out)
    }

    fn batch_callbacks(&mut self, batch: BatchId) -> Result<Vec<(JobId, Callback)>> {
        let rows = self.0.rows(
            "SELECT id, batch_end FROM tickler_jobs
             WHERE batch_id = ? AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
            vec![Value::from(batch.0)],
        )?;
        let mut out = Vec::new();
        for r in &rows {
            if let Some(role) = Callback::from_stored(&get::<String>(r, 1)?) {
                out.push((JobId(get(r, 0)?), role));
            }
        }
        Ok(out)
    }
}

impl<Q: Queryable> DepTx for Deps<'_, '_, Q> {
    fn lock_parents(&mut self, parents: &[JobId]) -> Result<HashMap<JobId, JobState>> {
        let mut rows = Vec::new();
        for chunk in parents.chunks(CHUNK) {
            rows.extend(self.0.rows(
                &format!(
                    "SELECT id, status FROM tickler_jobs WHERE id IN ({}) ORDER BY id
                     LOCK IN SHARE MODE",
                    marks(chunk.len())
                ),
                values(chunk),
            )?);
        }
        rows.iter()
            .map(|r| Ok((JobId(get(r, 0)?), state(&get::<String>(r, 1)?)?)))
            .collect()
    }

    fn insert_edges(&mut self, edges: &[(JobId, JobId, IfParentFails)]) -> Result<()> {
        // Many rows a statement: a fan-out of thousands is a few round
        // trips, not one an edge.
        for chunk in edges.chunks(CHUNK) {
            let rows = vec!["(?, ?, ?)"; chunk.len()].join(", ");
            let values = chunk
                .iter()
                .flat_map(|(parent, child, if_fails)| {
                    [
                        Value::from(parent.0),
                        Value::from(child.0),
                        Value::from(if_fails.as_str()),
                    ]
                })
                .collect();
            self.0.exec(
                &format!(
                    "INSERT INTO tickler_deps (parent_id, child_id, if_fails) VALUES {rows}
                     ON DUPLICATE KEY UPDATE if_fails = VALUES(if_fails)"
                ),
                values,
            )?;
        }
        Ok(())
    }

    fn ended_edges(&mut self, parents: &[JobId]) -> Result<Ended> {
        // In chunks: the jobs a cancel cascades to may be more than a
        // statement takes placeholders (65,535). The rules read the edges
        // by child, as one statement would give them. The jobs themselves
        // are this transaction's (it ended them) or read locked (a
        // child's insert): their batch mark is current.
        let mut rows = Vec::new();
        for chunk in parents.chunks(CHUNK) {
            let mut args = values(chunk);
            args.extend(values_of(chunk));
            rows.extend(self.0.rows(
                &format!(
                    "(SELECT d.parent_id, p.status, d.child_id, d.if_fails
                      FROM tickler_deps AS d JOIN tickler_jobs AS p ON p.id = d.parent_id
                      WHERE d.parent_id IN ({0}) AND NOT d.resolved
                        AND p.status IN ('succeeded', 'dead', 'cancelled')
                      FOR UPDATE)
                     UNION ALL
                     (SELECT id, status, NULL, NULL FROM tickler_jobs
                      WHERE id IN ({0}) AND batch_id IS NOT NULL AND batch_end IS NULL
                        AND status IN ('succeeded', 'dead', 'cancelled'))",
                    marks(chunk.len())
                ),
                args,
            )?);
        }
        let mut ended = Ended::default();
        for r in &rows {
            let parent = JobId(get(r, 0)?);
            match (get::<Option<i64>>(r, 2)?, get::<Option<String>>(r, 3)?) {
                (Some(child), Some(if_fails)) => ended.edges.push(EndedEdge {
                    parent,
                    parent_state: state(&get::<String>(r, 1)?)?,
                    child: JobId(child),
                    if_fails: IfParentFails::from_stored(&if_fails).unwrap_or_default(),
                }),
                _ => ended.members.push(parent),
            }
        }
        Ok(ended)
    }

    fn lock_children(&mut self, children: &[JobId]) -> Result<()> {
        if children.is_empty() {
            return Ok(());
        }
        // In chunks, in id order: a parent of more children than a
        // statement takes placeholders (65,535) still ends.
        for chunk in children.chunks(CHUNK) {
            self.0.rows(
                &format!(
                    "SELECT id FROM tickler_jobs WHERE id IN ({}) ORDER BY id FOR UPDATE",
                    marks(chunk.len())
                ),
                values(chunk),
            )?;
        }
        Ok(())
    }

    fn mark_resolved(&mut self, edges: &[(JobId, JobId)]) -> Result<()> {
        // One statement per parent (and chunk of its children): a parent
        // of thousands ends in a few round trips.
        let mut by_parent: BTreeMap<JobId, Vec<JobId>> = BTreeMap::new();
        for (parent, child) in edges {
            by_parent.entry(*parent).or_default().push(*child);
        }
        for (parent, children) in by_parent {
            for chunk in children.chunks(CHUNK) {
                let mut values = vec![Value::from(parent.0)];
                values.extend(values_of(chunk));
                self.0.exec(
                    &format!(
                        "UPDATE tickler_deps SET resolved = TRUE
                         WHERE parent_id = ? AND child_id IN ({})",
                        marks(chunk.len())
                    ),
                    values,
                )?;
            }
        }
        Ok(())
    }

    fn cancel_waiting(
        &mut self,
        children: &[(JobId, String)],
        now: i64,
    ) -> Result<Vec<ChildChange>> {
        let mut out = Vec::new();
        for (child, error) in children {
            let Some(row) = self.0.first(
                "SELECT kind, queue FROM tickler_jobs WHERE id = ? AND status = 'waiting'",
                args![child.0],
            )?
            else {
                continue;
            };
            self.0.exec(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?, last_error = ?
                 WHERE id = ? AND status = 'waiting'",
                args![now, error.as_str(), child.0],
            )?;
            out.push(ChildChange {
                job_id: *child,
                kind: get(&row, 0)?,
                queue: get(&row, 1)?,
                state: JobState::Cancelled,
            });
        }
        Ok(out)
    }

    fn release_waiting(&mut self, children: &[JobId], now: i64) -> Result<Vec<ChildChange>> {
        if children.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = Vec::new();
        for chunk in children.chunks(CHUNK) {
            rows.extend(self.0.rows(
                &format!(
                    "SELECT job.id, job.kind, job.queue, job.run_at, job.created_at
                     FROM tickler_jobs AS job
                     WHERE job.id IN ({}) AND job.status = 'waiting'
                       AND NOT EXISTS (SELECT 1 FROM tickler_deps AS d
                                       WHERE d.child_id = job.id AND NOT d.resolved)",
                    marks(chunk.len())
                ),
                values(chunk),
            )?);
        }
        let mut out = Vec::new();
        for r in &rows {
            let run_at: i64 = get(r, 3)?;
            let created_at: i64 = get(r, 4)?;
            out.push(ChildChange {
                job_id: JobId(get(r, 0)?),
                kind: get(r, 1)?,
                queue: get(r, 2)?,
                state: if run_at <= now.max(created_at) {
                    JobState::Pending
                } else {
                    JobState::Scheduled
                },
            });
        }
        // One statement per new state (and chunk): the rows are locked
        // (lock_children), so what was read is what is changed.
        for to in [JobState::Pending, JobState::Scheduled] {
            let ids: Vec<JobId> = out
                .iter()
                .filter(|c| c.state == to)
                .map(|c| c.job_id)
                .collect();
            for chunk in ids.chunks(CHUNK) {
                let mut values = vec![Value::from(to.as_str())];
                values.extend(values_of(chunk));
                self.0.exec(
                    &format!(
                        "UPDATE tickler_jobs SET status = ? WHERE id IN ({}) AND status = 'waiting'",
                        marks(chunk.len())
                    ),
                    values,
                )?;
            }
        }
        Ok(out)
    }

    fn wait_again(&mut self, id: JobId) -> Result<bool> {
        // The job's row is locked; its edges and its batch are read
        // afresh (READ COMMITTED), so a resolution or a batch's end that
        // committed before is seen.
        let unresolved = self
            .0
            .first(
                "SELECT 1 FROM tickler_jobs AS j
                 WHERE j.id = ?
                   AND (EXISTS (SELECT 1 FROM tickler_deps AS d JOIN tickler_jobs AS p ON p.id = d.parent_id
                                WHERE d.child_id = j.id AND NOT d.resolved)
                        OR (j.batch_end IN ('on_success', 'on_failure', 'on_finish')
                            AND EXISTS (SELECT 1 FROM tickler_batches AS b
                                        WHERE b.id = j.batch_id AND b.finished_at IS NULL)))",
                args![id.0],
            )?
            .is_some();
        if !unresolved {
            return Ok(false);
        }
        self.0.exec(
            "UPDATE tickler_jobs SET status = 'waiting'
             WHERE id = ? AND status IN ('pending', 'scheduled')",
            args![id.0],
        )?;
        Ok(true)
    }
}

/// See [`crate::Queue::parents`].
pub(crate) fn dependencies<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    id: JobId,
) -> Result<Vec<crate::Dependency>> {
    if tx
        .first("SELECT 1 FROM tickler_jobs WHERE id = ?", args![id.0])?
        .is_none()
    {
        return Err(Error::NotFound(id));
    }
    let rows = tx.rows(
        "SELECT parent_id, if_fails, resolved FROM tickler_deps WHERE child_id = ?
         ORDER BY parent_id",
        args![id.0],
    )?;
    rows.iter()
        .map(|r| {
            Ok(crate::Dependency {
                parent: JobId(get(r, 0)?),
                if_fails: IfParentFails::from_stored(&get::<String>(r, 1)?).unwrap_or_default(),
                resolved: get::<i64>(r, 2)? != 0,
            })
        })
        .collect()
}

/// Resolves the children of those of `ended` that ended, in `tx` (see
/// `crate::queue::deps::resolve`).
pub(crate) fn resolve<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    ended: &[JobId],
    now: i64,
) -> Result<Vec<ChildChange>> {
    crate::queue::deps::resolve(&mut Deps(tx), ended, now)
}

/// Stores the edges of the children one insert stored (see
/// `crate::queue::deps::store_edges`).
pub(crate) fn store_edges<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    children: &[(JobId, Vec<(JobId, IfParentFails)>)],
    now: i64,
) -> Result<Vec<ChildChange>> {
    crate::queue::deps::store_edges(&mut Deps(tx), children, now)
}
