//! Leases on MySQL: heartbeats (the rows locked in id order, those still
//! held renewed in one statement; each in a savepoint once the server
//! refused that), whether leases are still held, and the reaper's look
//! (after moving leases a backward step of the clock left "in the future").

use super::connection::{args, marks, named, statement_level, Tx};
use super::outcome::{lock_running_in_order, GIVE_BACK_SQL, REAP_SQL};
use super::rows::get;
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::fence;
use crate::engine::types::*;
use crate::engine::Leases;
use crate::error::{Error, Result};
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use mysql::Value;
use std::collections::HashMap;
use std::time::Duration;

/// Leases granted "in the future" (a backward step of the clock) expire
/// one lease length from now; see the SQLite engine. Markers :now, :margin.
const STEP_SET: &str =
    "lease_expires_at = :now + coalesce(lease_ms, lease_expires_at - claimed_at)";

/// The running leases, and the kept leases of stopping holders, that a
/// backward step of the clock left "in the future".
const STEPPED: [&str; 2] = [
    "status = 'running' AND lease_expires_at > :now + :margin
       AND lease_expires_at > :now + coalesce(lease_ms, lease_expires_at - claimed_at) + :margin",
    "status IN ('scheduled', 'pending', 'cancelled', 'dead') AND lease_expires_at > :now + :margin
       AND lease_expires_at > :now + coalesce(lease_ms, lease_expires_at - claimed_at) + :margin",
];

impl Leases for Store {
    fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        let extend_ms = duration_ms(extend_by, "lease extension")?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
        let batch = self.write(|tx, _| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            let running = lock_running_in_order(tx, &ids)?;
            let mut held: Vec<i64> = leases
                .iter()
                .filter(|l| running.get(&l.job_id.0) == Some(&l.run_token.0))
                .map(|l| l.job_id.0)
                .collect();
            held.sort_unstable();
            held.dedup();
            if !held.is_empty() {
                let mut values = args![expires, expires - now];
                values.extend(held.iter().map(|id| Value::from(*id)));
                tx.exec(
                    &format!(
                        "UPDATE tickler_jobs SET lease_expires_at = ?, lease_ms = ?
                         WHERE id IN ({}) AND status = 'running'",
                        marks(held.len())
                    ),
                    values,
                )?;
            }
            Ok((running, expires))
        });
        let (renewed, expires) = match batch {
            Err(e) if statement_level(&e) => return self.heartbeat_each(leases, extend_ms),
            other => other?,
        };
        Ok(leases
            .iter()
            .map(|l| {
                if renewed.get(&l.job_id.0) == Some(&l.run_token.0) {
                    Ok(ms_to_datetime(expires))
                } else {
                    Err(Error::LeaseLost { job_id: l.job_id })
                }
            })
            .collect())
    }

    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Value> = leases.iter().map(|l| Value::from(l.job_id.0)).collect();
        let sql = format!(
            "SELECT id, run_token FROM tickler_jobs WHERE id IN ({}) AND status = 'running'",
            marks(ids.len())
        );
        let running: HashMap<i64, String> = self.read(|tx| {
            tx.rows(&sql, ids.clone())?
                .iter()
                .map(|r| Ok((get(r, 0)?, get(r, 1)?)))
                .collect()
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
        self.write(|tx, _| {
            let stepped_now = self.now_ms();
            let margin = BACKWARD_STEP_MARGIN.as_millis() as i64;
            let step = [
                ("now", Value::from(stepped_now)),
                ("margin", Value::from(margin)),
            ];
            // Found by a plain read first: an UPDATE over the condition
            // would lock every live lease it passes (nearly all of them)
            // and wait behind each heartbeat and outcome in flight, to
            // change none but after a step of the clock.
            for stepped in STEPPED {
                let ids: Vec<Value> = tx
                    .rows_named(
                        &format!("SELECT id FROM tickler_jobs WHERE {stepped}"),
                        &step,
                    )?
                    .iter()
                    .map(|r| get::<i64>(r, 0).map(Value::from))
                    .collect::<Result<_>>()?;
                if ids.is_empty() {
                    continue;
                }
                let (sql, mut values) = named(
                    &format!(
                        "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET {STEP_SET}
                         WHERE {stepped} AND id IN ({})",
                        marks(ids.len())
                    ),
                    &step,
                );
                values.extend(ids);
                tx.exec(&sql, values)?;
            }
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let (expired, batch_full) = tx.lock_found(
                HELD_RUN_COLUMNS,
                "tickler_jobs_running",
                "status = 'running' AND lease_expires_at < ?",
                "ORDER BY lease_expires_at",
                args![now],
                REAP_BATCH,
            )?;
            // Cancelled jobs whose holder's lease ran out: their unique key
            // is free again.
            let (stopped, stopped_slots) = stopped_rows(
                tx.lock_found(
                    STOPPED_COLUMNS,
                    "tickler_jobs_running",
                    "status IN ('scheduled', 'pending', 'cancelled', 'dead') \
                     AND lease_expires_at < ?",
                    "",
                    args![now],
                    REAP_BATCH,
                )?
                .0,
            )?;
            if !stopped.is_empty() {
                tx.exec(
                    &format!(
                        "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET lease_expires_at = NULL
                         WHERE id IN ({})",
                        marks(stopped.len())
                    ),
                    stopped,
                )?;
            }
            let mut left = Vec::new();
            let mut chosen = Vec::new();
            for row in &expired {
                let run = held_run(row)?;
                // No look waits for a lock on the whole database here.
                if take(&run.lease, false) {
                    chosen.push(run);
                } else {
                    left.push(run.lease);
                }
            }
            let taken = take_back_runs(tx, &chosen, now, now, &policy)?;
            release_slots(tx, &chosen, &stopped_slots, stepped_now)?;
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
        let length = machine_prefix.len() as i64;
        self.read(|tx| {
            tx.rows(
                &format!(
                    "SELECT holder.holder, CAST(max({RENEWED}) AS SIGNED)
                     FROM tickler_jobs AS job FORCE INDEX (tickler_jobs_running)
                     JOIN tickler_holders AS holder ON holder.id = job.holder_id
                     WHERE job.status IN ('running', 'scheduled', 'pending', 'cancelled', 'dead')
                       AND job.lease_expires_at IS NOT NULL
                       AND substring(holder.holder, 1, ?) = ?
                     GROUP BY holder.holder"
                ),
                args![length, machine_prefix],
            )?
            .iter()
            .map(|r| Ok((get::<String>(r, 0)?, get::<i64>(r, 1)?)))
            .collect()
        })
    }

    fn take_back_from(&self, holders: &[String]) -> Result<u64> {
        let policy = self.retry_policy;
        let holders: Vec<Value> = holders
            .iter()
            .map(|h| Value::from(crate::holder::holder_id(h)))
            .collect();
        let condition = format!("holder_id IN ({})", marks(holders.len()));
        let taken = self.write(|tx, _| {
            let now = self.now_ms();
            let (runs, _) = tx.lock_found(
                HELD_RUN_COLUMNS,
                "tickler_jobs_running",
                &format!("status = 'running' AND {condition}"),
                "",
                holders.clone(),
                REAP_BATCH,
            )?;
            let (stopping, stopped_slots) = stopped_rows(
                tx.lock_found(
                    STOPPED_COLUMNS,
                    "tickler_jobs_running",
                    &format!(
                        "status IN ('scheduled', 'pending', 'cancelled', 'dead') \
                         AND lease_expires_at IS NOT NULL \
                         AND {condition}"
                    ),
                    "",
                    holders.clone(),
                    REAP_BATCH,
                )?
                .0,
            )?;
            if !stopping.is_empty() {
                tx.exec(
                    &format!(
                        "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET lease_expires_at = NULL
                         WHERE id IN ({})",
                        marks(stopping.len())
                    ),
                    stopping,
                )?;
            }
            let runs = runs.iter().map(held_run).collect::<Result<Vec<_>>>()?;
            let taken = take_back_runs(tx, &runs, now, MAX_TIMESTAMP_MS, &policy)?;
            release_slots(tx, &runs, &stopped_slots, now)?;
            Ok(taken)
        })?;
        self.notify_watchers();
        Ok(taken)
    }

    fn record_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()> {
        self.store_progress(updates)
    }

    fn mark_started(&self, leases: &[&Lease]) -> Result<()> {
        let mut order: Vec<&&Lease> = leases.iter().collect();
        // In id order, as every batch of this engine locks rows.
        order.sort_by_key(|l| l.job_id.0);
        let ids: Vec<Value> = order.iter().map(|l| Value::from(l.job_id.0)).collect();
        self.write(|tx, _| {
            let now = self.now_ms();
            let free = running_rows_not_locked(tx, &ids, " AND started_at IS NULL")?;
            for lease in order.iter().filter(|l| free.contains(&l.job_id.0)) {
                tx.exec_named(
                    concat!(
                        "UPDATE tickler_jobs SET started_at = :now ",
                        fence!(":id", ":token"),
                        " AND started_at IS NULL"
                    ),
                    &[
                        ("now", Value::from(now)),
                        ("id", Value::from(lease.job_id.0)),
                        ("token", Value::from(lease.run_token.0.as_str())),
                    ],
                )?;
            }
            Ok(())
        })
    }
}

/// Of the running jobs `ids` (in id order) and `also` (an extra
/// condition), those whose rows this transaction now holds: a row locked
/// by another transaction (its holder's `complete_with` under way) is
/// passed over, not waited for, as the pool's heartbeat thread must not
/// wait behind it.
fn running_rows_not_locked(
    tx: &mut Tx<'_>,
    ids: &[Value],
    also: &str,
) -> Result<std::collections::HashSet<i64>> {
    tx.rows(
        &format!(
            "SELECT id FROM tickler_jobs FORCE INDEX (PRIMARY)
             WHERE id IN ({}) AND status = 'running'{also}
             ORDER BY id FOR UPDATE SKIP LOCKED",
            marks(ids.len())
        ),
        ids.to_vec(),
    )?
    .iter()
    .map(|r| get::<i64>(r, 0))
    .collect()
}

impl Store {
    /// See `Leases::record_progress`.
    pub(super) fn store_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()> {
        let mut order: Vec<&(&Lease, f64, &str)> = updates.iter().collect();
        // In id order, as every batch of this engine locks rows.
        order.sort_by_key(|(l, ..)| l.job_id.0);
        let ids: Vec<Value> = order
            .iter()
            .map(|(l, ..)| Value::from(l.job_id.0))
            .collect();
        self.write(|tx, _| {
            let free = running_rows_not_locked(tx, &ids, "")?;
            for (lease, fraction, message) in order.iter().filter(|(l, ..)| free.contains(&l.job_id.0)) {
                tx.exec_named(
                    concat!(
                        "UPDATE tickler_jobs SET progress = :progress, progress_message = :message ",
                        fence!(":id", ":token")
                    ),
                    &[
                        ("progress", Value::from(*fraction)),
                        ("message", Value::from(*message)),
                        ("id", Value::from(lease.job_id.0)),
                        ("token", Value::from(lease.run_token.0.as_str())),
                    ],
                )?;
            }
            Ok(())
        })
    }
}

/// When a lease was last granted or renewed (ms); see the SQLite engine.
const RENEWED: &str = "lease_expires_at - coalesce(lease_ms, lease_expires_at - claimed_at)";

/// The columns of a [`HeldRun`].
const HELD_RUN_COLUMNS: &str = "id, run_token, attempts, coalesce(claimed_by, '?'), \
     lease_expires_at, started_at IS NOT NULL, limit_name, limit_key, limit_weight";

/// The columns of a stopped holder's row: its id and its limit slot.
const STOPPED_COLUMNS: &str = "id, limit_name, limit_key, limit_weight";

/// The ids of stopped holders' rows (as values to bind) and their slots.
fn stopped_rows(rows: Vec<mysql::Row>) -> Result<(Vec<Value>, Vec<Option<crate::job::LimitSlot>>)> {
    let mut ids = Vec::with_capacity(rows.len());
    let mut slots = Vec::with_capacity(rows.len());
    for r in &rows {
        ids.push(Value::from(get::<i64>(r, 0)?));
        slots.push(limit_slot(get(r, 1)?, get(r, 2)?, get(r, 3)?));
    }
    Ok((ids, slots))
}

/// Hands the slots of `runs` (taken back, or left running if a heartbeat
/// won: an extra look costs nothing) and of stopped holders to the jobs
/// blocked on them, in this transaction.
fn release_slots(
    tx: &mut Tx<'_>,
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
        super::limits::settle(tx, &freed, Vec::new(), now)?;
    }
    Ok(())
}

fn held_run(row: &mysql::Row) -> Result<HeldRun> {
    let attempts: i64 = get(row, 2)?;
    Ok(HeldRun {
        lease: ExpiredLease {
            id: get(row, 0)?,
            run_token: get(row, 1)?,
            expires_at: get(row, 4)?,
        },
        attempts: u32::try_from(attempts.max(0)).unwrap_or(u32::MAX),
        worker: get(row, 3)?,
        started: get::<i64>(row, 5)? != 0,
        limit: limit_slot(get(row, 6)?, get(row, 7)?, get(row, 8)?),
    })
}

/// Takes back `runs` whose leases expired before `cutoff` (ms; at
/// `MAX_TIMESTAMP_MS`, whatever their expiry: their holder is gone), at `now`,
/// by the reaper's rule ([`reap_statement`]); returns how many.
fn take_back_runs(
    tx: &mut Tx<'_>,
    runs: &[HeldRun],
    now: i64,
    cutoff: i64,
    policy: &crate::retry::RetryPolicy,
) -> Result<u64> {
    let mut taken = 0u64;
    for run in runs {
        let lease = &run.lease;
        let (sql, mut values) = match reap_statement(run, now, policy, cutoff == MAX_TIMESTAMP_MS) {
            ReapStatement::GiveBack { note } => (
                GIVE_BACK_SQL,
                vec![("error", Value::from(cut_error(&note).as_ref()))],
            ),
            ReapStatement::Fail { retry_at, error } => (
                REAP_SQL,
                vec![
                    ("retry_at", Value::from(retry_at)),
                    ("error", Value::from(cut_error(&error).as_ref())),
                ],
            ),
        };
        values.extend([
            ("now", Value::from(now)),
            ("id", Value::from(lease.id)),
            ("token", Value::from(lease.run_token.as_str())),
            ("cutoff", Value::from(cutoff)),
        ]);
        taken += tx.exec_named(sql, &values)?;
    }
    // Those made dead end: the jobs that run after them learn it here,
    // before the limits (the lock order of LimitTx).
    let ids: Vec<crate::job::JobId> = runs.iter().map(|r| crate::job::JobId(r.lease.id)).collect();
    super::deps::resolve(tx, &ids, now)?;
    Ok(taken)
}

impl Store {
    /// [`Leases::heartbeat_many`] after the server refused the statement
    /// that renews them all (a trigger, a damaged row): each lease in a
    /// savepoint of its own, in id order, so the refusal costs that lease
    /// alone.
    fn heartbeat_each(
        &self,
        leases: &[&Lease],
        extend_ms: i64,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by_key(|&i| leases[i].job_id.0);
        self.write(|tx, _| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            let mut results: Vec<Result<DateTime<Utc>>> = leases
                .iter()
                .map(|l| Err(Error::LeaseLost { job_id: l.job_id }))
                .collect();
            for &i in &order {
                let lease = leases[i];
                let renewed = tx.isolated(|tx| {
                    tx.exec_named(
                        concat!(
                            "UPDATE tickler_jobs SET lease_expires_at = :expires, lease_ms = :ms ",
                            fence!(":id", ":token")
                        ),
                        &[
                            ("expires", Value::from(expires)),
                            ("ms", Value::from(expires - now)),
                            ("id", Value::from(lease.job_id.0)),
                            ("token", Value::from(lease.run_token.0.as_str())),
                        ],
                    )
                })?;
                results[i] = match renewed {
                    Ok(1) => Ok(ms_to_datetime(expires)),
                    Ok(_) => Err(Error::LeaseLost {
                        job_id: lease.job_id,
                    }),
                    Err(refused) => Err(refused),
                };
            }
            Ok(results)
        })
    }
}
