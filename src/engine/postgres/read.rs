//! Reads on PostgreSQL, each in a transaction of its own: jobs, counts,
//! stats and the dashboard's readings, each through the index its question
//! names.

use super::enqueue::check_text;
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{FinishedSample, Reads, STATS_COUNTS_SQL};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use chrono::{DateTime, Utc};

impl Reads for Store {
    fn dependencies(&self, id: JobId) -> Result<Vec<crate::Dependency>> {
        self.read(|tx| super::deps::dependencies(tx, id))
    }

    fn get(&self, id: JobId) -> Result<Job> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = $1");
        self.read(|tx| match tx.query_opt(&sql, &[&id.0])? {
            Some(r) => job_from_row(&r),
            None => Err(Error::NotFound(id)),
        })
    }

    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        for (what, value) in [("queue", &filter.queue), ("kind", &filter.kind)] {
            if let Some(value) = value {
                check_text(what, value)?;
            }
        }
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs
             WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR queue = $2)
               AND ($3::text IS NULL OR kind = $3)
             ORDER BY id LIMIT $4"
        );
        let state = filter.state.map(JobState::as_str);
        self.read(|tx| {
            tx.query(&sql, &[&state, &filter.queue, &filter.kind, &limit])?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }

    fn count(&self, state: JobState) -> Result<u64> {
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs WHERE status = $1",
                    &[&state.as_str()],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|tx| {
            let mut stats = Stats::default();
            for r in tx.query(STATS_COUNTS_SQL, &[])? {
                let status: String = r.get(1);
                stats.counts.insert(
                    (r.get(0), status.parse()?),
                    r.get::<_, i64>(2).unsigned_abs(),
                );
            }
            for r in tx.query(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' GROUP BY queue, priority
                 UNION ALL
                 SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND run_at <= $1::bigint GROUP BY queue, priority",
                &[&now],
            )? {
                let at = ms_to_datetime(r.get(2));
                let e = stats
                    .oldest_due_by_priority
                    .entry((r.get(0), r.get(1)))
                    .or_insert(at);
                *e = (*e).min(at);
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs WHERE finished_at >= $1::bigint",
                    &[&since.timestamp_millis()],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let queues: Vec<&str> = queues.to_vec();
        let kinds: Option<Vec<&str>> = kinds.map(<[&str]>::to_vec);
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs
                     WHERE status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
                       AND queue = ANY($1) AND ($2::text[] IS NULL OR kind = ANY($2))",
                    &[&queues, &kinds],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>> {
        let (cond, _) = crate::engine::state_index(state);
        let sql = format!("SELECT min(queue) FROM tickler_jobs WHERE {cond} AND queue > $1");
        self.read(|tx| Ok(tx.query_one(&sql, &[&after])?.get(0)))
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
        // A filter not given is left out, so that a given queue leads the
        // index.
        let sql =
            format!(
            "SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond}{}{} LIMIT $3) AS capped",
            if queue.is_some() { " AND queue = $1" } else { " AND $1::text IS NULL" },
            if kind.is_some() { " AND kind = $2" } else { " AND $2::text IS NULL" },
        );
        self.read(|tx| {
            let n: i64 = tx.query_one(&sql, &[&queue, &kind, &cap])?.get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn oldest_due_in_queue(&self, queue: &str) -> Result<Option<i64>> {
        self.read(|tx| {
            let now = self.now_ms();
            Ok(tx
                .query_one(
                    "SELECT least(
                         (SELECT min(run_at) FROM tickler_jobs
                          WHERE status = 'pending' AND queue = $1),
                         (SELECT min(run_at) FROM tickler_jobs
                          WHERE status = 'scheduled' AND queue = $1 AND run_at <= $2))",
                    &[&queue, &now],
                )?
                .get(0))
        })
    }

    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = $1 LIMIT $2) AS capped"
        );
        self.read(|tx| {
            let n: i64 = tx.query_one(&sql, &[&queue, &cap])?.get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn page_in_queue(&self, page: &JobPage, queue: &str) -> Result<Vec<Job>> {
        if let Some(kind) = &page.kind {
            check_text("kind", kind)?;
        }
        check_text("queue", queue)?;
        let (cond, order) = crate::engine::state_index(page.state);
        let retrying = page_retrying(page.retrying);
        let afters = page_after(page.state, page.after.as_ref());
        self.read(|tx| {
            let mut jobs = Vec::new();
            for after in &afters {
                let left = page.limit.saturating_sub(jobs.len());
                if left == 0 {
                    break;
                }
                let left = i64::try_from(left).unwrap_or(i64::MAX);
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE {cond} AND queue = $1
                       AND ($2::text IS NULL OR kind = $2){retrying} AND {after}
                     ORDER BY {order} LIMIT $3"
                );
                for row in tx.query(&sql, &[&queue, &page.kind, &left])? {
                    jobs.push(job_from_row(&row)?);
                }
            }
            Ok(jobs)
        })
    }

    fn holding_unique_key(&self, key: &str) -> Result<Option<Job>> {
        check_text("unique key", key)?;
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE unique_key = $1
               AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')"
        );
        self.read(|tx| {
            tx.query_opt(&sql, &[&key])?
                .as_ref()
                .map(job_from_row)
                .transpose()
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
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs
                        WHERE finished_at >= $1 AND finished_at < $2 LIMIT $3) AS capped",
                    &[&from_ms, &to_ms, &cap],
                )?
                .get(0);
            let (cond, _) = crate::engine::state_index(JobState::Dead);
            let sql = format!(
                "SELECT count(*) FROM
                   (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = $3
                    AND finished_at >= $1 AND finished_at < $2 LIMIT $4) AS capped"
            );
            let mut dead: i64 = 0;
            for queue in dead_queues {
                if dead >= cap {
                    break;
                }
                let left = cap - dead;
                dead += tx
                    .query_one(&sql, &[&from_ms, &to_ms, queue, &left])?
                    .get::<_, i64>(0);
            }
            let rows = tx
                .query(
                    "SELECT status, run_at, claimed_at, finished_at FROM tickler_jobs
                     WHERE finished_at >= $1 AND finished_at < $2
                     ORDER BY finished_at DESC LIMIT $3",
                    &[&from_ms, &to_ms, &sample],
                )?
                .iter()
                .map(|r| FinishedSample {
                    state: r.get::<_, &str>(0).parse().ok(),
                    run_at_ms: r.get(1),
                    claimed_at_ms: r.get(2),
                    finished_at_ms: r.get(3),
                })
                .collect();
            Ok((n.unsigned_abs(), dead.unsigned_abs(), rows))
        })
    }
}
