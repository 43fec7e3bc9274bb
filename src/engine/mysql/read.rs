//! Reads on MySQL, each in a transaction of its own: jobs, counts, stats and
//! the dashboard's readings, each through the index its question names
//! (every index of a state leads with `status`).

use super::connection::{args, marks};
use super::enqueue::check_name;
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{FinishedSample, Reads, STATS_COUNTS_SQL};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use chrono::{DateTime, Utc};
use mysql::Value;

fn unsigned(n: i64) -> u64 {
    n.unsigned_abs()
}

impl Reads for Store {
    fn dependencies(&self, id: JobId) -> Result<Vec<crate::Dependency>> {
        self.read(|tx| super::deps::dependencies(tx, id))
    }

    fn get(&self, id: JobId) -> Result<Job> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = ?");
        self.read(|tx| match tx.first(&sql, args![id.0])? {
            Some(r) => job_from_row(&r),
            None => Err(Error::NotFound(id)),
        })
    }

    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        for (what, value) in [("queue", &filter.queue), ("kind", &filter.kind)] {
            if let Some(value) = value {
                check_name(what, value)?;
            }
        }
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs
             WHERE (:state IS NULL OR status = :state) AND (:queue IS NULL OR queue = :queue)
               AND (:kind IS NULL OR kind = :kind)
             ORDER BY id LIMIT :limit"
        );
        let values = [
            ("state", Value::from(filter.state.map(JobState::as_str))),
            ("queue", Value::from(filter.queue.as_deref())),
            ("kind", Value::from(filter.kind.as_deref())),
            ("limit", Value::from(limit)),
        ];
        self.read(|tx| {
            tx.rows_named(&sql, &values)?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }

    fn count(&self, state: JobState) -> Result<u64> {
        self.read(|tx| {
            let r = tx.first(
                "SELECT count(*) FROM tickler_jobs WHERE status = ?",
                args![state.as_str()],
            )?;
            Ok(unsigned(r.map_or(Ok(0), |r| get(&r, 0))?))
        })
    }

    fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|tx| {
            let mut stats = Stats::default();
            for r in tx.rows(STATS_COUNTS_SQL, Vec::new())? {
                let status: String = get(&r, 1)?;
                stats
                    .counts
                    .insert((get(&r, 0)?, status.parse()?), unsigned(get(&r, 2)?));
            }
            for r in tx.rows(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' GROUP BY queue, priority
                 UNION ALL
                 SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND run_at <= ? GROUP BY queue, priority",
                args![now],
            )? {
                let at = ms_to_datetime(get(&r, 2)?);
                let e = stats
                    .oldest_due_by_priority
                    .entry((get(&r, 0)?, get(&r, 1)?))
                    .or_insert(at);
                *e = (*e).min(at);
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|tx| {
            let r = tx.first(
                "SELECT count(*) FROM tickler_jobs WHERE finished_at >= ?",
                args![since.timestamp_millis()],
            )?;
            Ok(unsigned(r.map_or(Ok(0), |r| get(&r, 0))?))
        })
    }

    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let kind_filter = match kinds {
            Some(k) => format!("AND kind IN ({})", marks(k.len())),
            None => String::new(),
        };
        let sql = format!(
            "SELECT count(*) FROM tickler_jobs
             WHERE status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
               AND queue IN ({}) {kind_filter}",
            marks(queues.len())
        );
        let mut values: Vec<Value> = queues.iter().map(|q| Value::from(*q)).collect();
        values.extend(kinds.unwrap_or_default().iter().map(|k| Value::from(*k)));
        self.read(|tx| {
            let r = tx.first(&sql, values.clone())?;
            Ok(unsigned(r.map_or(Ok(0), |r| get(&r, 0))?))
        })
    }

    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>> {
        let (cond, _) = crate::engine::state_index(state);
        let sql = format!("SELECT min(queue) FROM tickler_jobs WHERE {cond} AND queue > ?");
        self.read(|tx| match tx.first(&sql, args![after])? {
            Some(r) => get(&r, 0),
            None => Ok(None),
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
        // A filter not given is left out, so that a given queue leads the
        // index.
        let mut values = Vec::new();
        let mut sql = format!("SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond}");
        if let Some(queue) = queue {
            sql.push_str(" AND queue = ?");
            values.push(Value::from(queue));
        }
        if let Some(kind) = kind {
            sql.push_str(" AND kind = ?");
            values.push(Value::from(kind));
        }
        sql.push_str(" LIMIT ?) AS capped");
        values.push(Value::from(cap));
        self.read(|tx| {
            let r = tx.first(&sql, values.clone())?;
            Ok(unsigned(r.map_or(Ok(0), |r| get(&r, 0))?))
        })
    }

    fn oldest_due_in_queue(&self, queue: &str) -> Result<Option<i64>> {
        self.read(|tx| {
            let now = self.now_ms();
            // Two reads of one step each: least() of MySQL is NULL when
            // either is.
            let pending = tx.first(
                "SELECT min(run_at) FROM tickler_jobs WHERE status = 'pending' AND queue = ?",
                args![queue],
            )?;
            let scheduled = tx.first(
                "SELECT min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND queue = ? AND run_at <= ?",
                args![queue, now],
            )?;
            let at = |r: Option<mysql::Row>| -> Result<Option<i64>> {
                r.map_or(Ok(None), |r| get::<Option<i64>>(&r, 0))
            };
            Ok(match (at(pending)?, at(scheduled)?) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
    }

    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = ? \
             LIMIT ?) AS capped"
        );
        self.read(|tx| {
            let r = tx.first(&sql, args![queue, cap])?;
            Ok(unsigned(r.map_or(Ok(0), |r| get(&r, 0))?))
        })
    }

    fn page_in_queue(&self, page: &JobPage, queue: &str) -> Result<Vec<Job>> {
        if let Some(kind) = &page.kind {
            check_name("kind", kind)?;
        }
        check_name("queue", queue)?;
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
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE {cond} AND queue = :queue
                       AND (:kind IS NULL OR kind = :kind){retrying} AND {after}
                     ORDER BY {order} LIMIT :limit"
                );
                let values = [
                    ("queue", Value::from(queue)),
                    ("kind", Value::from(page.kind.as_deref())),
                    ("limit", Value::from(left as u64)),
                ];
                for row in tx.rows_named(&sql, &values)? {
                    jobs.push(job_from_row(&row)?);
                }
            }
            Ok(jobs)
        })
    }

    fn holding_unique_key(&self, key: &str) -> Result<Option<Job>> {
        check_name("unique key", key)?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE unique_live = ?");
        self.read(|tx| {
            tx.first(&sql, args![key])?
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
        self.read(|tx| {
            let n: i64 = match tx.first(
                "SELECT count(*) FROM
                   (SELECT 1 FROM tickler_jobs
                    WHERE finished_at >= ? AND finished_at < ? LIMIT ?) AS capped",
                args![from_ms, to_ms, cap],
            )? {
                Some(r) => get(&r, 0)?,
                None => 0,
            };
            let (cond, _) = crate::engine::state_index(JobState::Dead);
            let sql = format!(
                "SELECT count(*) FROM
                   (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = ?
                    AND finished_at >= ? AND finished_at < ? LIMIT ?) AS capped"
            );
            let mut dead: u64 = 0;
            for queue in dead_queues {
                if dead >= cap {
                    break;
                }
                let r = tx.first(&sql, args![queue, from_ms, to_ms, cap - dead])?;
                dead += unsigned(r.map_or(Ok(0), |r| get(&r, 0))?);
            }
            let rows = tx
                .rows(
                    "SELECT status, run_at, claimed_at, finished_at FROM tickler_jobs
                     WHERE finished_at >= ? AND finished_at < ?
                     ORDER BY finished_at DESC LIMIT ?",
                    args![from_ms, to_ms, sample as u64],
                )?
                .iter()
                .map(|r| {
                    Ok(FinishedSample {
                        state: get::<String>(r, 0)?.parse().ok(),
                        run_at_ms: get(r, 1)?,
                        claimed_at_ms: get(r, 2)?,
                        finished_at_ms: get(r, 3)?,
                    })
                })
                .collect::<Result<_>>()?;
            Ok((unsigned(n), dead, rows))
        })
    }
}
