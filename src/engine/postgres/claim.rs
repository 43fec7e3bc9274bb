//! Claiming on PostgreSQL: when work is next due, the claiming statement
//! (`FOR UPDATE SKIP LOCKED`, the pause read in the same snapshot), and
//! [`Claims::record_and_claim`], which records outcomes (`outcome.rs`) and
//! claims through the [`ClaimTx`] the queue's claim rules run on, taking up
//! the jobs of a claim whose COMMIT answer was lost.

use super::connection::{statement_level, storable, Tx};
use super::enqueue::check_text;
use super::outcome::{complete_many, DEAD_SQL};
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::server_tx::{record_beside_claim, record_then_claim, PARALLEL_OUTCOMES};
use crate::engine::types::*;
use crate::engine::{Claim, ClaimTx, Claims, Recorded};
use crate::error::Result;
use crate::job::JobId;
use crate::lease::Lease;
use crate::queue::outcome::record_all;
use chrono::{DateTime, Utc};

const PROMOTE_SQL: &str = "UPDATE tickler_jobs SET status = 'pending'
    WHERE id = ANY(ARRAY(
        SELECT id FROM tickler_jobs
        WHERE status = 'scheduled' AND queue = $1 AND run_at <= $2::bigint
        ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED))";

/// A condition on `job`: its unique_key is not held by a cancelled run
/// whose holder may still be running (see the SQLite engine's `unblocked`).
const UNBLOCKED: &str = "(job.unique_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM tickler_jobs AS stopping
         WHERE stopping.unique_key = job.unique_key
           AND stopping.status IN ('cancelled', 'dead')
           AND stopping.lease_expires_at >= $2::bigint))";

/// The largest claim prepared once per connection (a statement for each
/// size up to it); a larger one is sent unprepared, planned at each run
/// (a pool's claims ahead are the rare large ones).
const PREPARED_LIMITS: i64 = 64;

/// The claiming UPDATE: $1 worker_id, $2 now, $3 lease expiry, $4 queue,
/// $5 limit, $6 the claim's id, $7 holder_id, $8 started_at (NULL for a claim
/// ahead of the handlers), $9 kinds (if filtered). The queue's pause
/// flag is read by the same statement, in its snapshot: read by an earlier
/// statement, a pause and an enqueue both committed in between would let
/// the claim take the new jobs of the paused queue. It names the queue
/// ($4), not each row's: uncorrelated, it is a one-time filter, checked
/// once before the index is read. Correlated with each row, the planner
/// took it to leave one row in a thousand and priced the `LIMIT` as a read
/// of every pending job (an estimated cost of 8 million at 1,000,000
/// jobs, past the JIT thresholds, for a claim that reads 32). The outer update
/// repeats no condition on `status`: the rows are locked by the inner
/// select, and with one the planner may look the ids up through a partial
/// index rather than the primary key (seen: 200 ms for 512 rows of a table
/// not yet analyzed).
///
/// Every claim has its size written into the statement (`limit`), with
/// `$5` only checked once: the planner prices a `LIMIT $5` it cannot see
/// as a tenth of the rows the scan could return, so the generic plan a
/// server switches to after five runs of a prepared statement cost more
/// the deeper the queue (75,000 at 100,000 pending jobs, 812 at 1,000, for
/// a read of a few rows; 86,000 at 100,000 for a claim of 512, which the
/// depth benchmark printed): past `jit_above_cost` on a session with JIT,
/// and a plan a planner may trade for a sort.
fn claim_sql(kinds: bool, order: ClaimOrder, limit: i64) -> String {
    let order = order.sql();
    let kind_filter = if kinds { "AND kind = ANY($9)" } else { "" };
    format!(
        "UPDATE tickler_jobs
         SET status = 'running', run_token = gen_random_uuid()::text, attempts = attempts + 1,
             claimed_by = $1, claimed_at = $2::bigint, lease_expires_at = $3::bigint,
             lease_ms = $3::bigint - $2::bigint, claim_id = $6::bigint,
             holder_id = $7::bigint, started_at = $8::bigint
         WHERE id = ANY(ARRAY(
             SELECT id FROM tickler_jobs AS job
             WHERE status = 'pending' AND queue = $4 {kind_filter} AND {UNBLOCKED}
               AND $5::bigint > 0
               AND NOT EXISTS (SELECT 1 FROM tickler_paused_queues AS paused
                               WHERE paused.queue = $4)
             ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED))
         RETURNING {LEASE_COLUMNS}"
    )
}

/// A [`ClaimTx`] on an open PostgreSQL transaction: the claiming
/// statements of this claim's kinds, and the id marking its rows (for a
/// commit whose acknowledgement was lost).
struct InTransaction<'a, 'b> {
    tx: &'a mut Tx<'b>,
    claim_id: i64,
    /// Written as each claimed job's holder.
    holder_id: i64,
    /// The claim starts the runs (see `Claim::starts`).
    starts: bool,
}

impl ClaimTx for InTransaction<'_, '_> {
    fn paused_queues(&mut self) -> Result<std::collections::BTreeSet<String>> {
        paused_in(self.tx)
    }

    fn promote_due(&mut self, queue: &str, now: i64, limit: i64) -> Result<u64> {
        self.tx.execute(PROMOTE_SQL, &[&queue, &now, &limit])
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
        let sql = claim_sql(request.kinds.is_some(), order, want);
        let worker = storable(request.worker_id);
        let claim_id = self.claim_id;
        let holder = self.holder_id;
        let started_at = self.starts.then_some(now);
        let params: &[&(dyn postgres::types::ToSql + Sync)] = match &request.kinds {
            Some(kinds) => &[
                &worker,
                &now,
                &expires,
                &queue,
                &want,
                &claim_id,
                &holder,
                &started_at,
                kinds,
            ],
            None => &[
                &worker,
                &now,
                &expires,
                &queue,
                &want,
                &claim_id,
                &holder,
                &started_at,
            ],
        };
        let rows = if want <= PREPARED_LIMITS {
            self.tx.query(&sql, params)?
        } else {
            self.tx.query_unprepared(&sql, params)?
        };
        rows.iter().map(claimed_from_row).collect()
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        if self
            .tx
            .execute(DEAD_SQL, &[&now, &error, &job_id.0, &run_token])?
            == 1
        {
            super::deps::resolve(self.tx, &[job_id], now)?;
        }
        Ok(())
    }
}

/// The jobs the claim `claim_id` took, whose commit was not acknowledged
/// (the connection was lost during COMMIT).
fn adopt_claimed(tx: &mut Tx<'_>, claim_id: i64) -> Result<Vec<Lease>> {
    let rows = tx.query(
        &format!(
            "SELECT {LEASE_COLUMNS} FROM tickler_jobs
             WHERE status = 'running' AND claim_id = $1::bigint
             ORDER BY priority DESC, run_at, id"
        ),
        &[&claim_id],
    )?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        // Unreadable rows were made dead by the claim that committed.
        if let ClaimedRow::Readable(lease) = claimed_from_row(row)? {
            leases.push(lease);
        }
    }
    if !leases.is_empty() {
        log::warn!(
            "took up {} jobs claimed by a transaction whose commit was not acknowledged",
            leases.len()
        );
    }
    Ok(leases)
}

impl Claims for Store {
    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>> {
        let now = self.now_ms();
        let kinds: Option<Vec<&str>> = kinds.map(<[&str]>::to_vec);
        let kind_filter = if kinds.is_some() {
            "AND kind = ANY($3)"
        } else {
            ""
        };
        let pending_sql = format!(
            "SELECT EXISTS (SELECT 1 FROM tickler_jobs AS job
             WHERE status = 'pending' AND queue = $1 AND $2::bigint IS NOT NULL
               {kind_filter} AND {UNBLOCKED})"
        );
        let scheduled_sql = format!(
            "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = $1
               AND $2::bigint IS NOT NULL {kind_filter} ORDER BY run_at LIMIT 1"
        );
        let earliest = self.read(|tx| {
            let mut earliest: Option<i64> = None;
            let paused = paused_in(tx)?;
            for queue in queues.iter().filter(|q| !paused.contains(**q)) {
                let pending: bool = match &kinds {
                    Some(k) => tx.query_one(&pending_sql, &[queue, &now, k])?,
                    None => tx.query_one(&pending_sql, &[queue, &now])?,
                }
                .get(0);
                if pending {
                    return Ok(Some(now));
                }
                let scheduled = match &kinds {
                    Some(k) => tx.query_opt(&scheduled_sql, &[queue, &now, k])?,
                    None => tx.query_opt(&scheduled_sql, &[queue, &now])?,
                };
                if let Some(r) = scheduled {
                    let at: i64 = r.get(0);
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            let stopping: Option<i64> = tx
                .query_one(
                    "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                     WHERE status IN ('cancelled', 'dead') AND lease_expires_at >= $1::bigint
                       AND unique_key IS NOT NULL",
                    &[&now],
                )?
                .get(0);
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
        _sync: OutcomeSync,
    ) -> Result<Recorded> {
        if let Some(Claim { request: c, .. }) = claim {
            for queue in c.queues {
                check_text("queue", queue)?;
            }
            for kind in c.kinds.unwrap_or_default() {
                check_text("kind", kind)?;
            }
        }
        let claim = match claim {
            Some(claim @ Claim { request: c, .. })
                if c.max > 0 && !c.kinds.is_some_and(|k| k.is_empty()) =>
            {
                Some((claim, duration_ms(c.lease, "lease")?))
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
        if let (Some((request, _)), true) = (&claim, outcomes.len() >= PARALLEL_OUTCOMES) {
            // Two transactions at once (see `record_beside_claim`).
            return record_beside_claim(
                || self.record_and_claim(outcomes, None, OutcomeSync::Now),
                || self.record_and_claim(&[], Some(request), OutcomeSync::Now),
            );
        }
        let policy = self.retry_policy;
        // The id of the last try's claim: if its COMMIT was lost with the
        // connection, the jobs it claimed may be ours already, and are
        // taken up rather than left to run out their lease.
        let last_claim = std::cell::Cell::new(None::<i64>);
        let recorded = record_then_claim(outcomes, statement_level, |pending, isolate| {
            self.write(|tx, attempt| {
                let now = self.now_ms();
                let recorded =
                    record_all(tx, pending, now, &policy, attempt, isolate, complete_many)?;
                // The jobs that run after those these outcomes ended learn
                // it here, before the limits (the lock order of LimitTx).
                let ended: Vec<crate::job::JobId> = pending
                    .iter()
                    .zip(&recorded)
                    .filter(|(_, r)| r.is_ok())
                    .map(|((lease, _), _)| lease.job_id)
                    .collect();
                let released = super::deps::resolve(tx, &ended, now)?;
                // The slots these outcomes gave up go to the jobs blocked
                // on them, in this transaction, with this claim's check.
                let freed: Vec<&crate::job::LimitSlot> = pending
                    .iter()
                    .filter_map(|(lease, _)| lease.limit.as_ref())
                    .collect();
                let claimed = match (&claim, last_claim.get()) {
                    (Some(_), Some(claim_id)) if attempt.after_unknown_commit => {
                        last_claim.set(None);
                        Some(adopt_claimed(tx, claim_id)?)
                    }
                    (Some((claim, lease_ms)), _) => {
                        let claim_id = fastrand::i64(..);
                        last_claim.set(Some(claim_id));
                        let expires = now.saturating_add(*lease_ms).min(MAX_TIMESTAMP_MS);
                        if !self
                            .holder_registered
                            .load(std::sync::atomic::Ordering::Relaxed)
                        {
                            tx.execute(
                                "INSERT INTO tickler_holders (id, holder) VALUES ($1, $2)
                                 ON CONFLICT DO NOTHING",
                                &[&self.holder_id, &self.holder],
                            )?;
                        }
                        let mut claim_tx = InTransaction {
                            tx,
                            claim_id,
                            holder_id: self.holder_id,
                            starts: claim.starts,
                        };
                        (claim.rules)(&mut claim_tx, claim.request, now, expires)?
                    }
                    (None, _) => Some(Vec::new()),
                };
                let (claimed, mut settled) = match claimed {
                    Some(claimed) => {
                        let (kept, settled) = super::limits::settle(tx, &freed, claimed, now)?;
                        (Some(kept), settled)
                    }
                    None => (None, super::limits::settle(tx, &freed, Vec::new(), now)?.1),
                };
                settled.changes.extend(released.into_iter().map(Into::into));
                Ok((recorded, claimed, settled))
            })
        });
        if recorded.is_ok() && claim.is_some() {
            self.holder_registered
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        recorded
    }
}

/// The paused queues, in byte order (a table of a few rows at most).
pub(super) fn paused_in(tx: &mut Tx<'_>) -> Result<std::collections::BTreeSet<String>> {
    Ok(tx
        .query("SELECT queue FROM tickler_paused_queues", &[])?
        .iter()
        .map(|r| r.get(0))
        .collect())
}
