//! Leases on PostgreSQL: heartbeats (all in one statement, each in a
//! savepoint once the server refused that), whether leases are still held,
//! the reaper's look (after moving leases a backward step of the clock left
//! "in the future"), and the upkeep of the reaper's rounds: a vacuum of the
//! jobs table when it needs one.

use super::connection::{statement_level, storable, Tx};
use super::outcome::{GIVE_BACK_SQL, LOCK_IN_ORDER_SQL, REAP_SQL};
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::fence;
use crate::engine::types::*;
use crate::engine::Leases;
use crate::error::{Error, Result};
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// $1 now, $2 margin: leases granted "in the future" (a backward step of
/// the clock) expire one lease length from now; see the SQLite engine.
const LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status = 'running' AND lease_expires_at > $1::bigint + $2::bigint
      AND lease_expires_at > $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at) + $2::bigint";

const CANCELLED_LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status <> 'running' AND lease_expires_at IS NOT NULL
      AND lease_expires_at > $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at) + $2::bigint";

/// How often [`Store::maybe_vacuum`] looks at the dead row versions.
const VACUUM_CHECK: Duration = Duration::from_secs(1);

/// Dead row versions below which the jobs table is left to autovacuum.
const VACUUM_DEAD_MIN: i64 = 10_000;

/// What keeps the oldest snapshot of the server (which decides what any
/// vacuum may remove), as words for the log, and its transaction id: a
/// session's open transaction, a replication slot, a standby's
/// `hot_standby_feedback` without a slot (its walsender's, of no
/// database) or a prepared transaction. `None` if nothing does.
const HORIZON_SQL: &str = "SELECT what, xmin FROM (
      SELECT format('process %s (%s, %s, %s since %s: %s)', pid, usename, application_name,
                    state, xact_start, left(query, 100)) AS what,
             coalesce(backend_xmin, backend_xid)::text AS xmin,
             age(coalesce(backend_xmin, backend_xid)) AS age
      FROM pg_stat_activity
      WHERE coalesce(backend_xmin, backend_xid) IS NOT NULL AND pid <> pg_backend_pid()
        AND datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      UNION ALL
      SELECT format('replication slot %s', slot_name), xmin::text, age(xmin)
      FROM pg_replication_slots WHERE xmin IS NOT NULL
      UNION ALL
      SELECT format('standby %s at %s (hot_standby_feedback)', application_name, client_addr),
             backend_xmin::text, age(backend_xmin)
      FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
      UNION ALL
      SELECT format('prepared transaction %s', gid), transaction::text, age(transaction)
      FROM pg_prepared_xacts WHERE database = current_database()) AS holders
    ORDER BY age DESC LIMIT 1";

/// The longest a vacuum is held off for one holder: past it, tickler
/// vacuums again (and says so again) whatever holds the rows.
const VACUUM_HOLD_MAX: Duration = Duration::from_secs(600);

/// How long a vacuum is held off after one that removed little for a
/// reason tickler could not find (it would otherwise read the whole table
/// each second for nothing), or after one that failed.
const VACUUM_UNEXPLAINED_HOLD: Duration = Duration::from_secs(60);

/// Whether tickler's role may vacuum the jobs table (its owner, a member
/// of the owner's role, the database's owner or a superuser): otherwise
/// the server only warns in its log, at every try.
const MAY_VACUUM_SQL: &str = "SELECT pg_has_role(c.relowner, 'MEMBER')
        OR pg_has_role(d.datdba, 'MEMBER')
        OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
     FROM pg_class AS c, pg_database AS d
     WHERE c.oid = 'tickler_jobs'::regclass AND d.datname = current_database()";

fn horizon_holder(conn: &mut super::connection::Conn) -> Result<Option<(String, String)>> {
    Ok(conn
        .client
        .query_typed_opt(HORIZON_SQL, &[])?
        .map(|r| (r.get(0), r.get(1))))
}

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
        let tokens: Vec<&str> = leases.iter().map(|l| l.run_token.0.as_str()).collect();
        let batch = self.write(|tx, _| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            tx.execute(LOCK_IN_ORDER_SQL, &[&ids])?;
            let renewed: HashMap<i64, String> = tx
                .query(
                    "UPDATE tickler_jobs AS j
                     SET lease_expires_at = $1::bigint, lease_ms = $1::bigint - $2::bigint
                     FROM unnest($3::bigint[], $4::text[]) AS h(id, run_token)
                     WHERE j.id = h.id AND j.run_token = h.run_token AND j.status = 'running'
                     RETURNING j.id, j.run_token",
                    &[&expires, &now, &ids, &tokens],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            Ok((renewed, expires))
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
        let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
        let running: HashMap<i64, String> = self.read(|tx| {
            Ok(tx
                .query(
                    "SELECT id, run_token FROM tickler_jobs
                     WHERE id = ANY($1::bigint[]) AND status = 'running'",
                    &[&ids],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
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
            let margin = crate::engine::types::BACKWARD_STEP_MARGIN.as_millis() as i64;
            tx.execute(LEASE_STEP_SQL, &[&stepped_now, &margin])?;
            tx.execute(CANCELLED_LEASE_STEP_SQL, &[&stepped_now, &margin])?;
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let expired = tx.query(
                &format!(
                    "SELECT {HELD_RUN_COLUMNS} FROM tickler_jobs
                     WHERE status = 'running' AND lease_expires_at < $1::bigint
                     ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
                ),
                &[&now, &REAP_BATCH],
            )?;
            let stopped = tx.query(
                "UPDATE tickler_jobs SET lease_expires_at = NULL
                 WHERE id = ANY(ARRAY(
                     SELECT id FROM tickler_jobs
                     WHERE status <> 'running' AND lease_expires_at IS NOT NULL
                       AND lease_expires_at < $1::bigint
                     FOR UPDATE SKIP LOCKED))
                 RETURNING limit_name, limit_key, limit_weight",
                &[&now],
            )?;
            let batch_full = expired.len() as i64 >= REAP_BATCH;
            let mut left = Vec::new();
            let mut chosen = Vec::new();
            for run in expired.iter().map(held_run) {
                // No look waits for a lock on the whole database here.
                if take(&run.lease, false) {
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

    fn upkeep(&self) {
        self.maybe_vacuum();
    }

    fn lease_holders(&self, machine_prefix: &str) -> Result<Vec<(String, i64)>> {
        let length = machine_prefix.chars().count() as i32;
        self.read(|tx| {
            Ok(tx
                .query(
                    &format!(
                        "SELECT holder.holder, max({RENEWED})::bigint FROM tickler_jobs AS job
                         JOIN tickler_holders AS holder ON holder.id = job.holder_id
                         WHERE (job.status = 'running'
                                OR (job.status <> 'running'
                                    AND job.lease_expires_at IS NOT NULL))
                           AND substr(holder.holder, 1, $2) = $1
                         GROUP BY holder.holder"
                    ),
                    &[&machine_prefix, &length],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    fn take_back_from(&self, holders: &[String]) -> Result<u64> {
        let policy = self.retry_policy;
        let holders: Vec<i64> = holders
            .iter()
            .map(|h| crate::holder::holder_id(h))
            .collect();
        let taken = self.write(|tx, _| {
            let now = self.now_ms();
            let runs = tx.query(
                &format!(
                    "SELECT {HELD_RUN_COLUMNS} FROM tickler_jobs
                     WHERE status = 'running' AND holder_id = ANY($1)
                     ORDER BY id FOR UPDATE SKIP LOCKED"
                ),
                &[&holders],
            )?;
            let stopped = tx.query(
                "UPDATE tickler_jobs SET lease_expires_at = NULL
                 WHERE id = ANY(ARRAY(
                     SELECT id FROM tickler_jobs
                     WHERE status <> 'running' AND lease_expires_at IS NOT NULL
                       AND holder_id = ANY($1)
                     FOR UPDATE SKIP LOCKED))
                 RETURNING limit_name, limit_key, limit_weight",
                &[&holders],
            )?;
            let runs: Vec<HeldRun> = runs.iter().map(held_run).collect();
            let taken = take_back_runs(tx, &runs, now, MAX_TIMESTAMP_MS, &policy)?;
            release_slots(tx, &runs, &stopped, now)?;
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
        let ids: Vec<i64> = order.iter().map(|l| l.job_id.0).collect();
        let tokens: Vec<&str> = order.iter().map(|l| l.run_token.0.as_str()).collect();
        self.write(|tx, _| {
            let now = self.now_ms();
            // A row locked by another transaction (its holder's
            // `complete_with` under way) is passed over, not waited for:
            // the pool's heartbeats must not wait behind it.
            tx.execute(
                "UPDATE tickler_jobs AS job SET started_at = $1::bigint
                 FROM (SELECT locked.id FROM tickler_jobs AS locked
                       JOIN unnest($2::bigint[], $3::text[]) AS asked(id, run_token)
                         ON locked.id = asked.id AND locked.run_token = asked.run_token
                       WHERE locked.status = 'running' AND locked.started_at IS NULL
                       ORDER BY locked.id
                       FOR UPDATE OF locked SKIP LOCKED) AS started
                 WHERE job.id = started.id",
                &[&now, &ids, &tokens],
            )?;
            Ok(())
        })
    }
}

impl Store {
    /// See `Leases::record_progress`.
    pub(super) fn store_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()> {
        // One report per run, the last given (as SQLite applies them in
        // order), in id order, as every batch of this engine locks rows;
        // the fence below keeps the run that holds the lease.
        let mut last: std::collections::BTreeMap<(i64, &str), &(&Lease, f64, &str)> =
            std::collections::BTreeMap::new();
        for update in updates {
            last.insert((update.0.job_id.0, update.0.run_token.0.as_str()), update);
        }
        let ids: Vec<i64> = last.keys().map(|(id, _)| *id).collect();
        let tokens: Vec<&str> = last
            .values()
            .map(|(l, ..)| l.run_token.0.as_str())
            .collect();
        let fractions: Vec<f64> = last.values().map(|(_, f, _)| *f).collect();
        let messages: Vec<String> = last
            .values()
            .map(|(.., m)| super::connection::storable(m).into_owned())
            .collect();
        self.write(|tx, _| {
            // A row locked by another transaction (its holder's
            // `complete_with` under way) is passed over, not waited for.
            tx.execute(
                "UPDATE tickler_jobs AS job
                 SET progress = asked.progress, progress_message = asked.message
                 FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::text[])
                        AS asked(id, run_token, progress, message),
                      (SELECT locked.id FROM tickler_jobs AS locked
                       JOIN unnest($1::bigint[], $2::text[]) AS held(id, run_token)
                         ON locked.id = held.id AND locked.run_token = held.run_token
                       WHERE locked.status = 'running'
                       ORDER BY locked.id
                       FOR UPDATE OF locked SKIP LOCKED) AS free
                 WHERE job.id = free.id AND asked.id = free.id
                   AND job.run_token = asked.run_token",
                &[&ids, &tokens, &fractions, &messages],
            )?;
            Ok(())
        })
    }
}

/// When a lease was last granted or renewed (ms); see the SQLite engine.
const RENEWED: &str = "lease_expires_at - coalesce(lease_ms, lease_expires_at - claimed_at)";

/// The columns of a [`HeldRun`].
const HELD_RUN_COLUMNS: &str = "id, run_token, attempts, coalesce(claimed_by, '?'), \
     lease_expires_at, started_at IS NOT NULL, limit_name, limit_key, limit_weight";

/// Hands the slots of `runs` (taken back, or left running if a heartbeat
/// won: an extra look costs nothing) and of the stopped holders whose
/// rows `stopped` returned to the jobs blocked on them, in this
/// transaction.
fn release_slots(
    tx: &mut Tx<'_>,
    runs: &[HeldRun],
    stopped: &[postgres::Row],
    now: i64,
) -> Result<()> {
    let stopped: Vec<crate::job::LimitSlot> = stopped
        .iter()
        .filter_map(|r| limit_slot(r.get(0), r.get(1), r.get(2)))
        .collect();
    let freed: Vec<&crate::job::LimitSlot> = runs
        .iter()
        .filter_map(|r| r.limit.as_ref())
        .chain(&stopped)
        .collect();
    if !freed.is_empty() {
        super::limits::settle(tx, &freed, Vec::new(), now)?;
    }
    Ok(())
}

fn held_run(row: &postgres::Row) -> HeldRun {
    let attempts: i64 = row.get(2);
    HeldRun {
        lease: ExpiredLease {
            id: row.get(0),
            run_token: row.get(1),
            expires_at: row.get(4),
        },
        attempts: u32::try_from(attempts.max(0)).unwrap_or(u32::MAX),
        worker: row.get(3),
        started: row.get(5),
        limit: limit_slot(row.get(6), row.get(7), row.get(8)),
    }
}

/// Takes back `runs` whose leases expired before `cutoff` (ms; at
/// `MAX_TIMESTAMP_MS`, whatever their expiry: their holder is gone), at `now`,
/// by the reaper's rule ([`reap_statement`]); returns how many.
fn take_back_runs(
    tx: &mut super::connection::Tx<'_>,
    runs: &[HeldRun],
    now: i64,
    cutoff: i64,
    policy: &crate::retry::RetryPolicy,
) -> Result<u64> {
    let mut taken = 0u64;
    for run in runs {
        let lease = &run.lease;
        taken += match reap_statement(run, now, policy, cutoff == MAX_TIMESTAMP_MS) {
            ReapStatement::GiveBack { note } => {
                let note = storable(&cut_error(&note)).into_owned();
                tx.execute(
                    GIVE_BACK_SQL,
                    &[&now, &note, &lease.id, &lease.run_token, &cutoff],
                )?
            }
            ReapStatement::Fail { retry_at, error } => {
                let error = storable(&cut_error(&error)).into_owned();
                tx.execute(
                    REAP_SQL,
                    &[
                        &now,
                        &retry_at,
                        &error,
                        &lease.id,
                        &lease.run_token,
                        &cutoff,
                    ],
                )?
            }
        };
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
    /// savepoint of its own (in id order, as the batch locks them), so the
    /// refusal costs that lease alone.
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
                    tx.execute(
                        concat!(
                            "UPDATE tickler_jobs
                             SET lease_expires_at = $1::bigint, lease_ms = $1::bigint - $2::bigint ",
                            fence!("$3", "$4")
                        ),
                        &[&expires, &now, &lease.job_id.0, &lease.run_token.0],
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

    /// Vacuums the jobs table when it holds many dead row versions, at most
    /// one look per `VACUUM_CHECK`. Each job leaves three or four dead
    /// versions behind (claimed, finished, pruned); a busy queue makes
    /// tens of thousands a second, and autovacuum looks at a table at most
    /// once per `autovacuum_naptime` (a minute by default), by which time
    /// the table and its indexes have grown many times over (measured: 8x
    /// in 12 s). The reaper thread calls this after each round; `SKIP_LOCKED`
    /// leaves the table to a vacuum already under way (autovacuum's, or
    /// another process's).
    pub(crate) fn maybe_vacuum(&self) {
        {
            let mut checked = self
                .vacuum_checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if checked.elapsed() < VACUUM_CHECK {
                return;
            }
            *checked = Instant::now();
        }
        let result = (|| -> Result<()> {
            let mut conn = self.connection()?;
            let dead = |conn: &mut super::connection::Conn| -> Result<(i64, i64)> {
                let row = conn.client.query_typed_one(
                    "SELECT coalesce(n_live_tup, 0), coalesce(n_dead_tup, 0)
                     FROM pg_stat_user_tables WHERE relid = 'tickler_jobs'::regclass",
                    &[],
                )?;
                Ok((row.get(0), row.get(1)))
            };
            let (live, before) = dead(&mut conn)?;
            if before < VACUUM_DEAD_MIN || before < live / 5 {
                return Ok(());
            }
            let mut held = self
                .vacuum_held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match held.as_ref() {
                // Nothing found that holds them, or no right to vacuum.
                Some((None, since)) if since.elapsed() < VACUUM_UNEXPLAINED_HOLD => {
                    return Ok(());
                }
                // The dead versions are still kept by the same oldest
                // snapshot: a vacuum would read the table for nothing.
                Some((Some(horizon), since))
                    if since.elapsed() < VACUUM_HOLD_MAX
                        && horizon_holder(&mut conn)?.map(|(_, xmin)| xmin).as_ref()
                            == Some(horizon) =>
                {
                    return Ok(());
                }
                _ => *held = None,
            }
            let may: Option<bool> = conn
                .client
                .query_typed_opt(MAY_VACUUM_SQL, &[])?
                .and_then(|r| r.get(0));
            if may == Some(false) {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::info!(
                        "the jobs table holds {before} dead row versions, and tickler's role may \
                     not vacuum it (only its owner may): autovacuum or its owner must"
                    )
                });
                *held = Some((None, Instant::now()));
                return Ok(());
            }
            let vacuums = |conn: &mut super::connection::Conn| -> Result<i64> {
                Ok(conn
                    .client
                    .query_typed_one(
                        "SELECT pg_stat_get_vacuum_count('tickler_jobs'::regclass)",
                        &[],
                    )?
                    .get(0))
            };
            let vacuums_before = vacuums(&mut conn)?;
            // A vacuum of a large table may outlast a DBA's
            // statement_timeout, which would cancel it at every try. (A
            // SET beside the VACUUM would make one transaction of both,
            // where VACUUM cannot run; behind a pooler in transaction mode
            // a SET would be another client's.)
            let own_session = !self.pooling.transaction_mode();
            if own_session {
                conn.client.batch_execute("SET statement_timeout = 0")?;
            }
            let vacuumed = conn
                .client
                .batch_execute("VACUUM (SKIP_LOCKED, ANALYZE) tickler_jobs");
            if own_session {
                conn.client.batch_execute("RESET statement_timeout")?;
            }
            if let Err(e) = vacuumed {
                *held = Some((None, Instant::now()));
                return Err(e.into());
            }
            let (_, after) = dead(&mut conn)?;
            // Judged only after a vacuum that ran (`SKIP_LOCKED` leaves the
            // table to one under way) and whose count the statistics have.
            if vacuums(&mut conn)? > vacuums_before && after * 2 >= before {
                if let Some((holder, xmin)) = horizon_holder(&mut conn)? {
                    log::warn!(
                        "a vacuum of the jobs table removed few of its {before} dead row \
                         versions: {holder} keeps them visible; tickler vacuums again once \
                         that is over"
                    );
                    *held = Some((Some(xmin), Instant::now()));
                } else {
                    *held = Some((None, Instant::now()));
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            log::warn!("could not vacuum the jobs table: {e}");
        }
    }
}
