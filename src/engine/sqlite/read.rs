//! Reads on SQLite, on the pool's read connections: jobs, counts, stats
//! and the dashboard's readings, each through the index its question
//! names.

use super::claim::kind_filter;
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{FinishedSample, Reads, STATS_COUNTS_SQL};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};

impl Reads for Store {
    fn dependencies(&self, id: JobId) -> Result<Vec<crate::Dependency>> {
        self.read(|conn| super::deps::dependencies(conn, id))
    }

    fn get(&self, id: JobId) -> Result<Job> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = ?1"
            ))?
            .query_row([id.0], job_from_row)
            .optional()?
            .ok_or(Error::NotFound(id))
        })
    }

    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs
                     WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR queue = ?2)
                       AND (?3 IS NULL OR kind = ?3)
                     ORDER BY id LIMIT +?4"
                ))?
                .query_map(
                    params![
                        filter.state.map(JobState::as_str),
                        filter.queue,
                        filter.kind,
                        limit
                    ],
                    job_from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn count(&self, state: JobState) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM tickler_jobs WHERE status = '{}'",
                    state.as_str()
                ))?
                .query_row([], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|conn| {
            let mut stats = Stats::default();
            let mut stmt = conn.prepare_cached(STATS_COUNTS_SQL)?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, status, count) = row?;
                stats
                    .counts
                    .insert((queue, status.parse()?), u64::try_from(count).unwrap_or(0));
            }
            let mut stmt = conn.prepare_cached(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' GROUP BY queue, priority
                 UNION ALL
                 SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND run_at <= ?1 GROUP BY queue, priority",
            )?;
            let rows = stmt.query_map([now], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i32>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, priority, at) = row?;
                let at = ms_to_datetime(at);
                let e = stats
                    .oldest_due_by_priority
                    .entry((queue, priority))
                    .or_insert(at);
                *e = (*e).min(at);
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached("SELECT count(*) FROM tickler_jobs WHERE finished_at >= ?1")?
                .query_row([since.timestamp_millis()], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let queue_marks: Vec<String> = (1..=queues.len()).map(|i| format!("?{i}")).collect();
        let kind_filter = kind_filter(kinds, queues.len() + 1);
        // One subquery per state, so each can use that state's partial index.
        let count = |state: JobState| {
            format!(
                "(SELECT count(*) FROM tickler_jobs WHERE {}
                  AND queue IN ({}) {kind_filter})",
                crate::engine::state_index(state).0,
                queue_marks.join(", ")
            )
        };
        let sql = format!(
            "SELECT {} + {} + {} + {} + {}",
            count(JobState::Waiting),
            count(JobState::Scheduled),
            count(JobState::Pending),
            count(JobState::Blocked),
            count(JobState::Running)
        );
        self.read(|conn| {
            let mut values: Vec<&dyn rusqlite::ToSql> =
                queues.iter().map(|q| q as &dyn rusqlite::ToSql).collect();
            if let Some(kinds) = kinds {
                values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
            }
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(values.as_slice(), |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>> {
        let (cond, _) = crate::engine::state_index(state);
        self.read(|conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT min(queue) FROM tickler_jobs WHERE {cond} AND queue > ?1"
                ))?
                .query_row([after], |r| r.get(0))?)
        })
    }

    fn count_matching(
        &self,
        state: JobState,
        queue: Option<&str>,
        kind: Option<&str>,
        cap: u64,
    ) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        // A filter not given is left out of the statement, not written as
        // `?1 IS NULL OR …`, so that a given queue leads the index.
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond}{}{} LIMIT ?3)",
            if queue.is_some() {
                " AND queue = ?1"
            } else {
                " AND ?1 IS NULL"
            },
            if kind.is_some() {
                " AND kind = ?2"
            } else {
                " AND ?2 IS NULL"
            },
        );
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(params![queue, kind, cap], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn oldest_due_in_queue(&self, queue: &str) -> Result<Option<i64>> {
        let now = self.now_ms();
        self.read(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT min(at) FROM (
                         SELECT min(run_at) AS at FROM tickler_jobs
                         WHERE status = 'pending' AND queue = ?1
                         UNION ALL
                         SELECT min(run_at) FROM tickler_jobs
                         WHERE status = 'scheduled' AND queue = ?1 AND run_at <= ?2)",
                )?
                .query_row(params![queue, now], |r| r.get(0))?)
        })
    }

    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = ?1 LIMIT ?2)"
                ))?
                .query_row(params![queue, cap], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn page_in_queue(&self, page: &JobPage, queue: &str) -> Result<Vec<Job>> {
        let (cond, order) = crate::engine::state_index(page.state);
        let retrying = page_retrying(page.retrying);
        self.read(|conn| {
            let mut jobs = Vec::new();
            for after in page_after(page.state, page.after.as_ref()) {
                let left = page.limit.saturating_sub(jobs.len());
                if left == 0 {
                    break;
                }
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE {cond} AND queue = ?1
                       AND (?2 IS NULL OR kind = ?2){retrying} AND {after}
                     ORDER BY {order} LIMIT ?3"
                );
                // A cursor's numbers are in the text: such statements are
                // not kept in the cache, where they would push out others.
                let (mut cached, mut plain);
                let stmt: &mut rusqlite::Statement = match page.after {
                    None => {
                        cached = conn.prepare_cached(&sql)?;
                        &mut cached
                    }
                    Some(_) => {
                        plain = conn.prepare(&sql)?;
                        &mut plain
                    }
                };
                let left = i64::try_from(left).unwrap_or(i64::MAX);
                let rows = stmt
                    .query_map(params![queue, page.kind, left], job_from_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                jobs.extend(rows);
            }
            Ok(jobs)
        })
    }

    fn holding_unique_key(&self, key: &str) -> Result<Option<Job>> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE unique_key = ?1
                       AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')"
                ))?
                .query_row([key], job_from_row)
                .optional()?)
        })
    }

    fn finished_between(
        &self,
        from_ms: i64,
        to_ms: i64,
        cap: u64,
        sample: usize,
        dead_queues: &[String],
    ) -> Result<(u64, u64, Vec<FinishedSample>)> {
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let sample = i64::try_from(sample).unwrap_or(i64::MAX);
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs
                        WHERE finished_at >= ?1 AND finished_at < ?2 LIMIT ?3)",
                )?
                .query_row(params![from_ms, to_ms, cap], |r| r.get(0))?;
            let (cond, _) = crate::engine::state_index(JobState::Dead);
            let mut dead: i64 = 0;
            for queue in dead_queues {
                if dead >= cap {
                    break;
                }
                dead += conn
                    .prepare_cached(&format!(
                        "SELECT count(*) FROM
                           (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = ?3
                            AND finished_at >= ?1 AND finished_at < ?2 LIMIT ?4)"
                    ))?
                    .query_row(params![from_ms, to_ms, queue, cap - dead], |r| {
                        r.get::<_, i64>(0)
                    })?;
            }
            let rows = conn
                .prepare_cached(
                    "SELECT status, run_at, claimed_at, finished_at FROM tickler_jobs
                     WHERE finished_at >= ?1 AND finished_at < ?2
                     ORDER BY finished_at DESC LIMIT ?3",
                )?
                .query_map(params![from_ms, to_ms, sample], |r| {
                    Ok(FinishedSample {
                        state: r.get::<_, String>(0)?.parse().ok(),
                        run_at_ms: r.get(1)?,
                        claimed_at_ms: r.get(2)?,
                        finished_at_ms: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((
                u64::try_from(n).unwrap_or(0),
                u64::try_from(dead).unwrap_or(0),
                rows,
            ))
        })
    }
}
