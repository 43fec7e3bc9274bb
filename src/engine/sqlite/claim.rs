//! Claiming on SQLite: when work is next due, the claiming `UPDATE …
//! RETURNING` of a batch, and [`Claims::record_and_claim`], which records
//! outcomes (`outcome.rs`) and claims in one write transaction, through the
//! [`ClaimTx`] the queue's claim rules run on.

use super::connection::{isolated, Commit};
use super::outcome::{complete_many, record_in, DEAD_SQL};
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{Claim, ClaimTx, Claims, Recorded};
use crate::error::Result;
use crate::job::JobId;
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};

/// A fresh random UUID (v4) per row, from SQLite's own CSPRNG
/// (`random()`), so one claiming UPDATE can give each job its own
/// run_token: 122 random bits, the version nibble 4 and the variant bits
/// 10, in lowercase hex. One `printf` of six random numbers, rather than
/// the five `randomblob`s, five `hex` and `lower` and the `substr`s and
/// concatenations it used to take per claimed job.
pub(crate) const RUN_TOKEN_SQL: &str = "printf('%08x-%04x-4%03x-%x%03x-%012x', \
    random() & 0xffffffff, random() & 0xffff, random() & 0xfff, \
    8 | (random() & 3), random() & 0xfff, random() & 0xffffffffffff)";

/// Every `LIMIT` of a bound parameter in this engine is written `LIMIT +?N`:
/// SQLite (3.47 and later) reads a bare `LIMIT ?N` as a constant when it
/// plans the statement, and then re-plans the whole statement (parse and
/// code generation, ~100 times the cost of running a claim of one job)
/// each time `?N` is bound again, i.e. on every execution. The unary plus
/// keeps the limit a run-time value; the plan is the same.
pub(crate) const PROMOTE_SQL: &str = "UPDATE tickler_jobs SET status = 'pending'
    WHERE id IN (SELECT id FROM tickler_jobs
                 WHERE status = 'scheduled' AND queue = ?1 AND run_at <= ?2
                 ORDER BY run_at LIMIT +?3)";

/// `AND kind IN (?first, ?first+1, …)` for `kinds`, or nothing when all
/// kinds are wanted.
pub(crate) fn kind_filter(kinds: Option<&[&str]>, first: usize) -> String {
    match kinds {
        None => String::new(),
        Some(kinds) => {
            let marks: Vec<String> = (0..kinds.len())
                .map(|i| format!("?{}", first + i))
                .collect();
            format!("AND kind IN ({})", marks.join(", "))
        }
    }
}

/// The claiming UPDATE; ?1 worker_id, ?2 now, ?3 lease expiry, ?4 queue,
/// ?5 limit, ?6 holder_id, ?7 started_at (NULL for a claim ahead of the
/// handlers), ?8… kinds.
pub(crate) fn claim_sql(kinds: Option<&[&str]>, order: ClaimOrder) -> String {
    let order = order.sql();
    let kind_filter = kind_filter(kinds, 8);
    let unblocked = unblocked("?2");
    format!(
        "UPDATE tickler_jobs
         SET status = 'running', run_token = {RUN_TOKEN_SQL}, attempts = attempts + 1,
             claimed_by = ?1, claimed_at = ?2, lease_expires_at = ?3, lease_ms = ?3 - ?2,
             holder_id = ?6, started_at = ?7
         WHERE id IN (SELECT id FROM tickler_jobs AS job
                      WHERE status = 'pending' AND queue = ?4 {kind_filter} AND {unblocked}
                      ORDER BY {order} LIMIT +?5)
         RETURNING {LEASE_COLUMNS}"
    )
}

/// A condition on `job` (a row aliased so): its unique_key is not held by
/// a cancelled job whose holder may still be running (its lease, kept by
/// the cancel, runs to `now` or later). A cancelled run keeps its key until
/// its holder reports (its refused outcome clears the lease) or its lease
/// runs out, so the next job with that key never runs beside it.
pub(crate) fn unblocked(now: &str) -> String {
    format!(
        "(job.unique_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM tickler_jobs AS stopping
             WHERE stopping.unique_key = job.unique_key
               AND stopping.status <> 'running' AND stopping.status IN ('cancelled', 'dead')
               AND stopping.lease_expires_at >= {now}))"
    )
}

impl Claims for Store {
    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>> {
        let kind_filter = kind_filter(kinds, 2);
        let now = self.now_ms();
        let now_mark = format!("?{}", kinds.map_or(0, <[&str]>::len) + 2);
        let earliest = self.read(|conn| {
            let mut earliest: Option<i64> = None;
            let paused = paused_in(conn)?;
            for queue in queues.iter().filter(|q| !paused.contains(**q)) {
                let mut values: Vec<&dyn rusqlite::ToSql> = vec![queue];
                if let Some(kinds) = kinds {
                    values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
                }
                values.push(&now);
                let unblocked = unblocked(&now_mark);
                // A pending job is due whatever its run_at: it was due when
                // it became pending, and a run_at ahead of now only means
                // the wall clock was stepped back since (waiting for it to
                // catch up could take hours). Pending jobs whose unique_key
                // waits for a cancelled holder to stop are left out: they
                // are due when it stops (a commit, which wakes fetchers) or
                // its lease runs out (below).
                let pending: bool = conn
                    .prepare_cached(&format!(
                        "SELECT EXISTS (SELECT 1 FROM tickler_jobs AS job
                         WHERE status = 'pending' AND queue = ?1 {kind_filter} AND {unblocked})"
                    ))?
                    .query_row(values.as_slice(), |r| r.get(0))?;
                if pending {
                    return Ok(Some(now));
                }
                let scheduled: Option<i64> = conn
                    .prepare_cached(&format!(
                        "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = ?1
                         {kind_filter} ORDER BY run_at LIMIT 1"
                    ))?
                    .query_row(&values[..values.len() - 1], |r| r.get(0))
                    .optional()?;
                if let Some(at) = scheduled {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            // When the first cancelled holder's lease runs out, a job
            // waiting for its unique_key may start (an over-estimate at
            // worst: one claim that finds nothing).
            let stopping: Option<i64> = conn
                .prepare_cached(
                    "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                     WHERE status <> 'running' AND status IN ('cancelled', 'dead')
                       AND lease_expires_at >= ?1
                       AND unique_key IS NOT NULL",
                )?
                .query_row([now], |r| r.get(0))?;
            if let Some(at) = stopping {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
            Ok(earliest)
        })?;
        Ok(earliest.map(ms_to_datetime))
    }

    fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&Claim<'_>>,
        sync: OutcomeSync,
    ) -> Result<Recorded> {
        let claim = match claim {
            Some(claim @ Claim { request: c, .. })
                if c.max > 0 && !c.kinds.is_some_and(|k| k.is_empty()) =>
            {
                let sql = (
                    claim_sql(c.kinds, ClaimOrder::Priority),
                    claim_sql(c.kinds, ClaimOrder::Oldest),
                );
                Some((claim, duration_ms(c.lease, "lease")?, sql))
            }
            _ => None,
        };
        if outcomes.is_empty() && claim.is_none() {
            return Ok(Recorded {
                results: Vec::new(),
                leases: Vec::new(),
                limit_changes: Vec::new(),
            });
        }
        let policy = self.retry_policy;
        let commit = if outcomes.is_empty() || sync == OutcomeSync::Deferred {
            Commit::Lazy
        } else {
            Commit::Durable
        };
        let mut pending_outcomes = outcomes;
        let mut commit = commit;
        let mut results = Vec::with_capacity(outcomes.len());
        let mut limit_changes = Vec::new();
        let leases = loop {
            let (recorded, claimed, settled) = self.write_with(commit, |tx| {
                let now = self.now_ms();
                let mut recorded = Vec::with_capacity(pending_outcomes.len());
                let mut rest = pending_outcomes;
                while let Some(((lease, outcome), after)) = rest.split_first() {
                    // A run of successes is one statement (see complete_many).
                    let run = rest
                        .iter()
                        .take_while(|(_, o)| *o == Outcome::Complete)
                        .count();
                    if run > 1 {
                        complete_many(tx, &rest[..run], now, &policy, &mut recorded)?;
                        rest = &rest[run..];
                    } else {
                        recorded.push(record_in(tx, lease, outcome, now, &policy)?);
                        rest = after;
                    }
                }
                // The jobs that run after those these outcomes ended learn
                // it here (before the limits, in the lock order).
                let ended: Vec<JobId> = pending_outcomes
                    .iter()
                    .zip(&recorded)
                    .filter(|(_, r)| r.is_ok())
                    .map(|((lease, _), _)| lease.job_id)
                    .collect();
                let released = super::deps::resolve(tx, &ended, now)?;
                // The slots these outcomes gave up go to the jobs blocked
                // on them, in this transaction.
                let freed: Vec<&crate::job::LimitSlot> = pending_outcomes
                    .iter()
                    .filter_map(|(lease, _)| lease.limit.as_ref())
                    .collect();
                // Released before the claim: a job the outcomes' slots
                // make pending is claimed by this same transaction (the
                // file's one writer needs no lock order to keep).
                let (_, mut settled) = crate::queue::limits::settle(
                    &mut super::limits::InTransaction(tx),
                    &freed,
                    Vec::new(),
                    now,
                )?;
                settled.changes.extend(released.into_iter().map(Into::into));
                let Some((claim, lease_ms, sql)) = &claim else {
                    return Ok((recorded, Some(Vec::new()), settled));
                };
                let expires = now.saturating_add(*lease_ms).min(MAX_TIMESTAMP_MS);
                let mut claim_tx = InTransaction {
                    tx,
                    sql,
                    holder_id: self.holder_id,
                    starts: claim.starts,
                };
                if !self
                    .holder_registered
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    tx.prepare_cached(
                        "INSERT OR IGNORE INTO tickler_holders (id, holder) VALUES (?1, ?2)",
                    )?
                    .execute(params![self.holder_id, self.holder])?;
                }
                let claimed = (claim.rules)(&mut claim_tx, claim.request, now, expires)?;
                let limits = &mut super::limits::InTransaction(tx);
                let claimed = match claimed {
                    Some(claimed) => {
                        let (kept, more) = crate::queue::limits::settle(limits, &[], claimed, now)?;
                        settled.add(more);
                        Some(kept)
                    }
                    None => None,
                };
                Ok((recorded, claimed, settled))
            })?;
            if claim.is_some() {
                self.holder_registered
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            results.extend(recorded);
            limit_changes.extend(settled.changes);
            pending_outcomes = &[];
            commit = Commit::Lazy;
            if let Some(claimed) = claimed {
                break claimed;
            }
        };
        Ok(Recorded {
            results,
            leases,
            limit_changes,
        })
    }
}

/// The paused queues, in byte order: a read of a table of a few rows at
/// most, cheap enough for every claim.
pub(super) fn paused_in(conn: &rusqlite::Connection) -> Result<std::collections::BTreeSet<String>> {
    let mut stmt = conn.prepare_cached("SELECT queue FROM tickler_paused_queues")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A [`ClaimTx`] on an open SQLite write transaction, with the claiming
/// statements of this claim's kinds in either order.
struct InTransaction<'a, 'c> {
    tx: &'a rusqlite::Transaction<'c>,
    /// The claiming UPDATE by priority, and by age.
    sql: &'a (String, String),
    /// Written as each claimed job's holder.
    holder_id: i64,
    /// The claim starts the runs (see [`Claim::starts`]).
    starts: bool,
}

impl ClaimTx for InTransaction<'_, '_> {
    fn paused_queues(&mut self) -> Result<std::collections::BTreeSet<String>> {
        paused_in(self.tx)
    }

    fn promote_due(&mut self, queue: &str, now: i64, limit: i64) -> Result<u64> {
        let promoted = self
            .tx
            .prepare_cached(PROMOTE_SQL)?
            .execute(params![queue, now, limit])?;
        Ok(promoted as u64)
    }

    fn claim_batch(
        &mut self,
        request: &ClaimRequest<'_>,
        queue: &str,
        want: i64,
        order: ClaimOrder,
        now: i64,
        expires: i64,
    ) -> Result<Vec<ClaimedRow>> {
        let started_at = self.starts.then_some(now);
        let mut values: Vec<&dyn rusqlite::ToSql> = vec![
            &request.worker_id,
            &now,
            &expires,
            &queue,
            &want,
            &self.holder_id,
            &started_at,
        ];
        if let Some(kinds) = request.kinds {
            values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
        }
        let sql = match order {
            ClaimOrder::Priority => &self.sql.0,
            ClaimOrder::Oldest => &self.sql.1,
        };
        let mut stmt = self.tx.prepare_cached(sql)?;
        let rows = stmt
            .query_map(values.as_slice(), claimed_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        let tx = self.tx;
        let dead = isolated(tx, || {
            Ok(tx
                .prepare_cached(DEAD_SQL)?
                .execute(params![now, error, job_id.0, run_token])?)
        })?;
        match dead {
            Ok(_) => {
                super::deps::resolve(tx, &[job_id], now)?;
            }
            // Left running: its lease runs out and the reaper tries again.
            Err(e) => log::error!("job {job_id}: could not be made dead either: {e}"),
        }
        Ok(())
    }
}
