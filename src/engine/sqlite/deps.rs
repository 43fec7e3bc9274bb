//! Jobs that run after others on SQLite: the edges' statements for the
//! rules in `crate::queue::deps`. The file's single writer orders a
//! parent's end and a child's insert: no row locks are needed.

use crate::engine::DepTx;
use crate::error::{Error, Result};
use crate::job::{IfParentFails, JobId, JobState};
use crate::queue::deps::{ChildChange, EndedEdge};
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

    fn ended_edges(&mut self, parents: &[JobId]) -> Result<Vec<EndedEdge>> {
        let rows: Vec<(i64, String, i64, String)> = self
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
                 WHERE d.resolved = 0 AND p.status IN ('succeeded', 'dead', 'cancelled')
                 ORDER BY d.child_id, d.parent_id",
            )?
            .query_map([id_list(parents)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        rows.into_iter()
            .map(|(parent, status, child, if_fails)| {
                Ok(EndedEdge {
                    parent: JobId(parent),
                    parent_state: state(&status)?,
                    child: JobId(child),
                    if_fails: IfParentFails::from_stored(&if_fails).unwrap_or_default(),
                })
            })
            .collect()
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
