//! Claiming on MySQL: when work is next due, the claim (a locking read
//! with `SKIP LOCKED`, the pause read in the same statement, then an
//! UPDATE of exactly the rows it locked), and [`Claims::record_and_claim`],
//! which records outcomes (`outcome.rs`) and claims through the
//! [`ClaimTx`] the queue's claim rules run on, taking up the jobs of a
//! claim whose COMMIT answer was lost.

use super::connection::{args, marks, statement_level, Tx};
use super::enqueue::check_name;
use super::outcome::{complete_many, DEAD_SQL};
use super::rows::*;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::server_tx::{record_beside_claim, record_then_claim, PARALLEL_OUTCOMES};
use crate::engine::types::*;
use crate::engine::{Claim, ClaimTx, Claims, Recorded};
use crate::error::{Error, Result};
use crate::job::JobId;
use crate::lease::Lease;
use crate::queue::outcome::record_all;
use chrono::{DateTime, Utc};
use mysql::Value;

/// Claimed rows per UPDATE: 3 placeholders each, so 3,000 a statement,
/// whatever `max` a caller asks for.
const CLAIM_ROWS_PER_UPDATE: usize = 1_000;

/// The longest worker id the schema holds (`TEXT`), in bytes.
const MAX_WORKER_BYTES: usize = 65_535;

/// A condition on `job`: its unique_key is not held by a cancelled run
/// whose holder may still be running (see the SQLite engine's `unblocked`).
/// One marker: now.
const UNBLOCKED: &str = "(job.unique_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM tickler_jobs AS stopping
         WHERE stopping.unique_key = job.unique_key
           AND stopping.status IN ('cancelled', 'dead')
           AND stopping.lease_expires_at >= ?))";

/// The locking read of a claim: markers now, queue, the kinds (if
/// filtered), limit. The pause is read by the same statement: read by an
/// earlier one, a pause and an enqueue both committed in between would let
/// the claim take the new jobs of the paused queue. InnoDB locks the rows
/// this read returns, not those its subqueries look at.
///
/// The index is named: a claim must walk its order's index and stop after
/// `LIMIT` rows, or it would lock (and sort) every pending job of the
/// queue; the optimizer's estimates are not trusted with that.
fn claim_sql(kinds: Option<usize>, order: ClaimOrder) -> String {
    let kind_filter = match kinds {
        Some(n) => format!("AND kind IN ({})", marks(n)),
        None => String::new(),
    };
    let index = match order {
        ClaimOrder::Priority => "tickler_jobs_pending",
        ClaimOrder::Oldest => "tickler_jobs_due",
    };
    format!(
        "SELECT {LEASE_COLUMNS} FROM tickler_jobs AS job FORCE INDEX ({index})
         WHERE {UNBLOCKED} AND status = 'pending' AND queue = ? {kind_filter}
           AND NOT EXISTS (SELECT 1 FROM tickler_paused_queues AS paused
                           WHERE paused.queue = job.queue)
         ORDER BY {} LIMIT ? FOR UPDATE SKIP LOCKED",
        order.sql()
    )
}

/// A fresh run_token: a UUID v4, as on the other engines.
fn run_token() -> String {
    let bits = fastrand::u128(..);
    // Version 4 in the 13th hex digit, variant 10xx in the 17th.
    let v = (bits & !(0xF << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        v >> 96,
        (v >> 80) & 0xFFFF,
        (v >> 64) & 0xFFFF,
        (v >> 48) & 0xFFFF,
        v & 0xFFFF_FFFF_FFFF
    )
}

/// A [`ClaimTx`] on an open MySQL transaction, with the id marking this
/// claim's rows (for a commit whose acknowledgement was lost).
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
        // Found by a plain read (usually nothing is due: no lock at all),
        // then locked by primary key: the range over this queue's due
        // times ends on the next entry of the index, another queue's
        // earliest scheduled job, and a locking scan would hold that one
        // until commit, so that queue's promote beside this claim would
        // skip it.
        let (due, _) = self.tx.lock_found(
            "id",
            "tickler_jobs_due",
            "status = 'scheduled' AND queue = ? AND run_at <= ?",
            "ORDER BY run_at",
            args![queue, now],
            limit,
        )?;
        if due.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Value> = due
            .iter()
            .map(|r| get::<i64>(r, 0).map(Value::from))
            .collect::<Result<_>>()?;
        self.tx.exec(
            &format!(
                "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET status = 'pending'
                 WHERE id IN ({}) AND status = 'scheduled'",
                marks(ids.len())
            ),
            ids,
        )
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
        let sql = claim_sql(request.kinds.map(<[&str]>::len), order);
        let mut values = args![now, queue];
        values.extend(
            request
                .kinds
                .unwrap_or_default()
                .iter()
                .map(|k| Value::from(*k)),
        );
        values.push(Value::from(want));
        let rows = self.tx.rows(&sql, values)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = rows.iter().map(|r| get(r, 0)).collect::<Result<_>>()?;
        let tokens: Vec<String> = ids.iter().map(|_| run_token()).collect();
        // The rows are locked by the read above and still pending. Three
        // placeholders a row: a claim of any size is cut into statements
        // well under the 65,535 a statement may have.
        for (ids, tokens) in ids
            .chunks(CLAIM_ROWS_PER_UPDATE)
            .zip(tokens.chunks(CLAIM_ROWS_PER_UPDATE))
        {
            let mut values = Vec::with_capacity(ids.len() * 3 + 7);
            for (id, token) in ids.iter().zip(tokens) {
                values.extend(args![*id, token.as_str()]);
            }
            values.extend(args![
                request.worker_id,
                now,
                expires,
                expires - now,
                self.claim_id,
                self.holder_id,
                self.starts.then_some(now)
            ]);
            values.extend(ids.iter().map(|id| Value::from(*id)));
            self.tx.exec(
                &format!(
                    "UPDATE tickler_jobs
                     SET status = 'running', run_token = CASE id {} END, attempts = attempts + 1,
                         claimed_by = ?, claimed_at = ?, lease_expires_at = ?, lease_ms = ?,
                         claim_id = ?, holder_id = ?, started_at = ?
                     WHERE id IN ({})",
                    "WHEN ? THEN ? ".repeat(ids.len()),
                    marks(ids.len())
                ),
                values,
            )?;
        }
        rows.iter()
            .zip(&tokens)
            .map(|(r, run_token)| claimed_from_row(r, Some(&Fresh { run_token, expires })))
            .collect()
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        let dead = self.tx.exec_named(
            DEAD_SQL,
            &[
                ("now", Value::from(now)),
                ("error", Value::from(error)),
                ("id", Value::from(job_id.0)),
                ("token", Value::from(run_token)),
            ],
        )?;
        if dead == 1 {
            super::deps::resolve(self.tx, &[job_id], now)?;
        }
        Ok(())
    }
}

/// The jobs the claim `claim_id` took, whose commit was not acknowledged
/// (the connection was lost during COMMIT).
fn adopt_claimed(tx: &mut Tx<'_>, claim_id: i64) -> Result<Vec<Lease>> {
    let rows = tx.rows(
        &format!(
            "SELECT {LEASE_COLUMNS} FROM tickler_jobs
             WHERE status = 'running' AND claim_id = ?
             ORDER BY priority DESC, run_at, id"
        ),
        args![claim_id],
    )?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        // Unreadable rows were made dead by the claim that committed.
        if let ClaimedRow::Readable(lease) = claimed_from_row(row, None)? {
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
        let kind_filter = match kinds {
            Some(k) => format!("AND kind IN ({})", marks(k.len())),
            None => String::new(),
        };
        let pending_sql = format!(
            "SELECT 1 FROM tickler_jobs AS job
             WHERE {UNBLOCKED} AND status = 'pending' AND queue = ? {kind_filter} LIMIT 1"
        );
        let scheduled_sql = format!(
            "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = ?
               {kind_filter} ORDER BY run_at LIMIT 1"
        );
        let kinds: Vec<Value> = kinds
            .unwrap_or_default()
            .iter()
            .map(|k| Value::from(*k))
            .collect();
        if kinds.is_empty() && !kind_filter.is_empty() {
            return Ok(None);
        }
        let earliest = self.read(|tx| {
            let mut earliest: Option<i64> = None;
            let paused = paused_in(tx)?;
            for queue in queues.iter().filter(|q| !paused.contains(**q)) {
                let mut values = args![now, *queue];
                values.extend(kinds.iter().cloned());
                if tx.first(&pending_sql, values)?.is_some() {
                    return Ok(Some(now));
                }
                let mut values = args![*queue];
                values.extend(kinds.iter().cloned());
                if let Some(r) = tx.first(&scheduled_sql, values)? {
                    let at: i64 = get(&r, 0)?;
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            let stopping: Option<i64> = match tx.first(
                "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                 WHERE status IN ('cancelled', 'dead') AND lease_expires_at >= ?
                   AND unique_key IS NOT NULL",
                args![now],
            )? {
                Some(r) => get(&r, 0)?,
                None => None,
            };
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
                check_name("queue", queue)?;
            }
            for kind in c.kinds.unwrap_or_default() {
                check_name("kind", kind)?;
            }
            if c.worker_id.len() > MAX_WORKER_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "the worker id is {} bytes long, but the MySQL engine stores at most \
                     {MAX_WORKER_BYTES}",
                    c.worker_id.len()
                )));
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
                            tx.exec(
                                "INSERT IGNORE INTO tickler_holders (id, holder) VALUES (?, ?)",
                                args![self.holder_id, self.holder.as_str()],
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
    tx.rows("SELECT queue FROM tickler_paused_queues", Vec::new())?
        .iter()
        .map(|r| get(r, 0))
        .collect()
}
