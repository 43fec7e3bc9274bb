//! Leases on SQLite: heartbeats, whether leases are still held, and the
//! reaper's look, which takes back expired leases (after moving those a
//! backward step of the clock left "in the future").

use super::connection::{busy_waits, isolated, Commit};
use super::outcome::{fenced, GIVE_BACK_SQL, REAP_SQL};
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::fence;
use crate::engine::types::*;
use crate::engine::Leases;
use crate::error::Result;
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use rusqlite::params;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A reaper look that got the write lock within this got it "without
/// waiting" (in-process writers are short; another connection's hold is
/// seen by the busy handler being called at all).
const REAP_CLEAN_WAIT: Duration = Duration::from_millis(2);

/// ?1 now, ?2 margin (ms). See reap_look; leases granted before
/// lease_ms existed count from their claim.
pub(crate) const LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = ?1 + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status = 'running' AND lease_expires_at > ?1 + ?2
      AND lease_expires_at > ?1 + coalesce(lease_ms, lease_expires_at - claimed_at) + ?2";

/// LEASE_STEP_SQL for the kept leases of holders that have not stopped:
/// cancelled, dead or retried jobs (see KEPT_LEASE).
pub(crate) const CANCELLED_LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = ?1 + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status <> 'running' AND lease_expires_at IS NOT NULL
      AND lease_expires_at > ?1 + coalesce(lease_ms, lease_expires_at - claimed_at) + ?2";

impl Leases for Store {
    fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        let extend_ms = duration_ms(extend_by, "lease extension")?;
        self.write_with(Commit::Lazy, |tx| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            // lease_ms: the length granted, for the reaper's backward-step rule.
            let mut stmt = tx.prepare_cached(concat!(
                "UPDATE tickler_jobs SET lease_expires_at = ?1, lease_ms = ?1 - ?4 ",
                fence!("?2", "?3")
            ))?;
            leases
                .iter()
                .map(|lease| {
                    let renewed = isolated(tx, || {
                        Ok(stmt.execute(params![
                            expires,
                            lease.job_id.0,
                            lease.run_token.0,
                            now
                        ])?)
                    })?;
                    Ok(renewed.and_then(|changed| {
                        fenced(changed, lease).map(|()| ms_to_datetime(expires))
                    }))
                })
                .collect()
        })
    }

    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        let ids = serde_json::to_string(&leases.iter().map(|l| l.job_id.0).collect::<Vec<_>>())?;
        // One statement, so one read transaction, for all of them: a pool
        // asks this ten times a second while it works.
        let running: HashMap<i64, String> = self.read(|conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT id, run_token FROM tickler_jobs
                     WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'running'",
                )?
                .query_map([ids], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })?;
        Ok(leases
            .iter()
            .map(|l| running.get(&l.job_id.0) == Some(&l.run_token.0))
            .collect())
    }

    fn reap_look(
        &self,
        cutoff: Option<i64>,
        take: &mut dyn FnMut(&ExpiredLease, bool) -> bool,
    ) -> Result<ReapLook> {
        let policy = self.retry_policy;
        let asked = Instant::now();
        let busy_before = busy_waits();
        self.write_with(Commit::Lazy, |tx| {
            let waited = busy_waits() != busy_before || asked.elapsed() > REAP_CLEAN_WAIT;
            // A backward step of the wall clock leaves leases that were
            // granted "in the future": one whose expiry lies further ahead
            // than its length (lease_ms, plus a margin for noise) is set to
            // expire one length from now, so an abandoned job is taken back
            // on time while a live holder's next heartbeat renews it as
            // usual. Judged against the time inside this transaction: every
            // lease committed before it was granted at or before then.
            let stepped_now = self.now_ms();
            let margin = crate::engine::types::BACKWARD_STEP_MARGIN.as_millis() as i64;
            tx.prepare_cached(LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            // The same for a cancelled job's kept lease, which holds its
            // unique_key (a separate statement: each uses its own index).
            tx.prepare_cached(CANCELLED_LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let expired: Vec<HeldRun> = tx
                .prepare_cached(&format!(
                    "SELECT {HELD_RUN_COLUMNS} FROM tickler_jobs
                     WHERE status = 'running' AND lease_expires_at < ?1
                     ORDER BY lease_expires_at LIMIT +?2"
                ))?
                .query_map(params![now, REAP_BATCH], held_run)?
                .collect::<rusqlite::Result<_>>()?;
            // A cancelled job's holder that never reported is gone once its
            // lease ran out: its unique_key no longer waits for it.
            let stopped = tx
                .prepare_cached(
                    "UPDATE tickler_jobs SET lease_expires_at = NULL
                     WHERE status <> 'running' AND lease_expires_at < ?1
                     RETURNING limit_name, limit_key, limit_weight",
                )?
                .query_map([now], slot_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let batch_full = expired.len() as i64 >= REAP_BATCH;
            let mut left = Vec::new();
            let mut chosen = Vec::new();
            for run in expired {
                if take(&run.lease, waited) {
                    chosen.push(run);
                } else {
                    left.push(run.lease);
                }
            }
            let taken = take_back_runs(tx, &chosen, now, now, &policy)?;
            release_slots(tx, &chosen, &stopped, stepped_now)?;
            Ok(ReapLook {
                taken,
                left,
                batch_full,
            })
        })
    }

    fn wake_watchers(&self) {
        self.notify_watchers();
    }

    fn lease_holders(&self, machine_prefix: &str) -> Result<Vec<(String, i64)>> {
        self.read_on_writer(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT holder.holder, max(held.renewed) FROM (
                         SELECT holder_id, {RENEWED} AS renewed FROM tickler_jobs
                         WHERE status = 'running'
                         UNION ALL
                         SELECT holder_id, {RENEWED} FROM tickler_jobs
                         WHERE status <> 'running' AND lease_expires_at IS NOT NULL)
                         AS held
                     JOIN tickler_holders AS holder ON holder.id = held.holder_id
                     WHERE substr(holder.holder, 1, ?2) = ?1
                     GROUP BY holder.holder"
                ))?
                .query_map(
                    params![machine_prefix, machine_prefix.chars().count() as i64],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })
    }

    fn take_back_from(&self, holders: &[String]) -> Result<u64> {
        let policy = self.retry_policy;
        let ids: Vec<i64> = holders
            .iter()
            .map(|h| crate::holder::holder_id(h))
            .collect();
        let holders = serde_json::to_string(&ids)?;
        let taken = self.write_with(Commit::Lazy, |tx| {
            let now = self.now_ms();
            let runs: Vec<HeldRun> = tx
                .prepare_cached(&format!(
                    "SELECT {HELD_RUN_COLUMNS} FROM tickler_jobs
                     WHERE status = 'running'
                       AND holder_id IN (SELECT value FROM json_each(?1))"
                ))?
                .query_map([&holders], held_run)?
                .collect::<rusqlite::Result<_>>()?;
            // A stopping job (cancelled, or dead past its timeout) whose
            // holder is gone keeps its unique_key no longer.
            let stopped = tx
                .prepare_cached(
                    "UPDATE tickler_jobs SET lease_expires_at = NULL
                     WHERE status <> 'running' AND lease_expires_at IS NOT NULL
                       AND holder_id IN (SELECT value FROM json_each(?1))
                     RETURNING limit_name, limit_key, limit_weight",
                )?
                .query_map([&holders], slot_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let taken = take_back_runs(tx, &runs, now, MAX_TIMESTAMP_MS, &policy)?;
            release_slots(tx, &runs, &stopped, now)?;
            Ok(taken)
        })?;
        self.notify_watchers();
        Ok(taken)
    }

    fn mark_started(&self, leases: &[&Lease]) -> Result<()> {
        self.write_with(Commit::Lazy, |tx| {
            let now = self.now_ms();
            let mut stmt = tx.prepare_cached(MARK_STARTED_SQL)?;
            for lease in leases {
                stmt.execute(params![now, lease.job_id.0, lease.run_token.0])?;
            }
            Ok(())
        })?;
        // A start is what counts an attempt. Lost to a power cut or an OS
        // crash, it would leave a handler that takes the machine down free
        // to run after every reboot; synced (under Full, outside the write
        // lock, at most about once a second per pool), it counts.
        self.sync()
    }

    fn record_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()> {
        self.write_with(Commit::Lazy, |tx| {
            let mut stmt = tx.prepare_cached(PROGRESS_SQL)?;
            for (lease, fraction, message) in updates {
                stmt.execute(params![
                    fraction,
                    message,
                    lease.job_id.0,
                    lease.run_token.0
                ])?;
            }
            Ok(())
        })
    }
}

/// When a lease was last granted or renewed (ms): its expiry less its
/// length (a lease granted before lease_ms existed counts from its claim).
const RENEWED: &str = "lease_expires_at - coalesce(lease_ms, lease_expires_at - claimed_at)";

/// ?1 progress, ?2 message, ?3 id, ?4 run_token.
const PROGRESS_SQL: &str = concat!(
    "UPDATE tickler_jobs SET progress = ?1, progress_message = ?2 ",
    fence!("?3", "?4")
);

/// ?1 now, ?2 id, ?3 run_token.
const MARK_STARTED_SQL: &str = concat!(
    "UPDATE tickler_jobs SET started_at = ?1 ",
    fence!("?2", "?3"),
    " AND started_at IS NULL"
);

/// The limit slot in `limit_name, limit_key, limit_weight`, if any.
fn slot_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<crate::job::LimitSlot>> {
    Ok(limit_slot(r.get(0)?, r.get(1)?, r.get(2)?))
}

/// Hands the slots of `runs` (taken back, or left running if a heartbeat
/// won: an extra look costs nothing) and of stopped holders to the jobs
/// blocked on them, in the transaction that freed them.
fn release_slots(
    tx: &rusqlite::Transaction<'_>,
    runs: &[HeldRun],
    stopped: &[Option<crate::job::LimitSlot>],
    now: i64,
) -> Result<()> {
    let freed: Vec<&crate::job::LimitSlot> = runs
        .iter()
        .filter_map(|r| r.limit.as_ref())
        .chain(stopped.iter().flatten())
        .collect();
    if !freed.is_empty() {
        crate::queue::limits::settle(
            &mut super::limits::InTransaction(tx),
            &freed,
            Vec::new(),
            now,
        )?;
    }
    Ok(())
}

/// The columns of a [`HeldRun`].
const HELD_RUN_COLUMNS: &str =
    "id, run_token, lease_expires_at, attempts, coalesce(claimed_by, '?'), started_at IS NOT NULL, \
    limit_name, limit_key, limit_weight";

fn held_run(r: &rusqlite::Row<'_>) -> rusqlite::Result<HeldRun> {
    Ok(HeldRun {
        lease: ExpiredLease {
            id: r.get(0)?,
            run_token: r.get(1)?,
            expires_at: r.get(2)?,
        },
        attempts: r.get(3)?,
        worker: r.get(4)?,
        started: r.get(5)?,
        limit: limit_slot(r.get(6)?, r.get(7)?, r.get(8)?),
    })
}

/// Takes back `runs` whose leases expired before `cutoff` (ms; at
/// `MAX_TIMESTAMP_MS`, whatever their expiry: their holder is gone), at `now`,
/// by the reaper's rule ([`reap_statement`]); returns how many.
fn take_back_runs(
    tx: &rusqlite::Transaction<'_>,
    runs: &[HeldRun],
    now: i64,
    cutoff: i64,
    policy: &crate::retry::RetryPolicy,
) -> Result<u64> {
    let mut taken = 0u64;
    for run in runs {
        let lease = &run.lease;
        // One row SQLite refuses (a trigger, damage) must not keep every
        // other lease from being taken back.
        let done = isolated(tx, || {
            Ok(
                match reap_statement(run, now, policy, cutoff == MAX_TIMESTAMP_MS) {
                    ReapStatement::GiveBack { note } => {
                        tx.prepare_cached(GIVE_BACK_SQL)?.execute(params![
                            now,
                            cut_error(&note),
                            lease.id,
                            lease.run_token,
                            cutoff
                        ])?
                    }
                    ReapStatement::Fail { retry_at, error } => {
                        tx.prepare_cached(REAP_SQL)?.execute(params![
                            now,
                            retry_at,
                            cut_error(&error),
                            lease.id,
                            lease.run_token,
                            cutoff
                        ])?
                    }
                },
            )
        })?;
        match done {
            Ok(n) => taken += n as u64,
            Err(e) => log::error!("reaper could not take back job {}: {e}", lease.id),
        }
    }
    // Those made dead end: the jobs that run after them learn it here.
    let ids: Vec<crate::job::JobId> = runs.iter().map(|r| crate::job::JobId(r.lease.id)).collect();
    super::deps::resolve(tx, &ids, now)?;
    Ok(taken)
}
