//! Storing new jobs on PostgreSQL: validated jobs inserted with their
//! unique keys (a batch without keys in one statement), found again after a
//! COMMIT whose answer was lost, and jobs in the application's own
//! transaction.

use super::connection::{Attempt, Session, Statements, Tx};
use super::watch::CHANNEL;
use super::Store;
use crate::engine::types::*;
use crate::engine::Enqueue;
use crate::error::{Error, Result};
use crate::job::JobId;

const INSERT_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority,
         run_at, max_attempts, unique_key, timeout_ms, created_at, enqueue_batch, enqueue_seq,
         limit_name, limit_key, limit_weight)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
     ON CONFLICT DO NOTHING RETURNING id";

/// Many jobs without a unique_key: $1 queues, $2 kinds, $3 payloads,
/// $4 states, $5 priorities, $6 run_ats, $7 max_attempts, $8 timeouts,
/// $9 now, $10 the batch's id, $11 each job's place in the batch, $12
/// limit names, $13 limit keys, $14 limit weights. Rows are
/// produced in input order (`ORDER BY ord`), so their ids ascend in that
/// order.
const INSERT_MANY_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority,
         run_at, max_attempts, timeout_ms, created_at, enqueue_batch, enqueue_seq, limit_name,
         limit_key, limit_weight)
     SELECT queue, kind, payload, status, priority, run_at, max_attempts, timeout_ms, $9::bigint,
            $10::bigint, seq, limit_name, limit_key, limit_weight
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[],
                 $7::bigint[], $8::bigint[], $11::int[], $12::text[], $13::text[], $14::bigint[])
          WITH ORDINALITY AS t(queue, kind, payload, status, priority, run_at, max_attempts,
                               timeout_ms, seq, limit_name, limit_key, limit_weight, ord)
     ORDER BY ord
     RETURNING id";

pub(super) const HELD_SQL: &str = "SELECT id FROM tickler_jobs WHERE unique_key = $1
       AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')";

fn i64_of(n: u32) -> i64 {
    i64::from(n)
}

/// Refuses text PostgreSQL cannot store in a name.
pub(crate) fn check_text(what: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{what} contains a NUL character, which PostgreSQL cannot store"
        )));
    }
    Ok(())
}

/// Inserts validated jobs in `tx`; a job whose unique_key is held by an
/// unfinished job inserts nothing and yields that job's id. Concurrent
/// inserts of one key on several machines: the unique index makes one of
/// them wait for the other's commit and then insert nothing.
pub(crate) fn insert_valid(
    tx: &mut Tx<'_>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
) -> Result<Vec<JobId>> {
    let mut ids: Vec<Option<JobId>> = vec![None; rows.len()];
    // Jobs without a unique_key go in with one statement per batch (one
    // round trip, not one per job); a keyed one may meet its key's holder
    // and is inserted on its own.
    let mut bulk = Vec::new();
    crate::queue::deps::check_parents(&mut super::deps::Deps(tx), rows)?;
    lock_keys_in_order(tx, rows)?;
    for (i, row) in rows.iter().enumerate() {
        let job = &row.job;
        check_text("queue", &job.queue)?;
        check_text("kind", &job.kind)?;
        if let Some(key) = &job.unique_key {
            check_text("unique_key", key)?;
        }
        if let Some((name, key)) = &job.limit {
            check_text("limit name", name)?;
            check_text("limit key", key)?;
        }
        let run_at = row.due.resolve(now)?;
        if job.unique_key.is_none() && rows.len() > 1 {
            bulk.push((i, run_at));
            continue;
        }
        ids[i] = Some(insert_one(tx, row, run_at, now, (batch, i))?);
    }
    if !bulk.is_empty() {
        let column = |f: &dyn Fn(&ValidJob, i64) -> String| -> Vec<String> {
            bulk.iter().map(|&(i, at)| f(&rows[i], at)).collect()
        };
        let queues = column(&|r, _| r.job.queue.clone());
        let kinds = column(&|r, _| r.job.kind.clone());
        let payloads = column(&|r, _| r.payload.clone());
        let states = column(&|r, at| r.state_at(at, now).as_str().to_owned());
        let priorities: Vec<i32> = bulk.iter().map(|&(i, _)| rows[i].job.priority).collect();
        let run_ats: Vec<i64> = bulk.iter().map(|&(_, at)| at).collect();
        let max_attempts: Vec<i64> = bulk
            .iter()
            .map(|&(i, _)| i64_of(rows[i].job.max_attempts))
            .collect();
        let timeouts: Vec<Option<i64>> = bulk.iter().map(|&(i, _)| rows[i].timeout_ms).collect();
        let seqs: Vec<i32> = bulk.iter().map(|&(i, _)| seq_of(i)).collect();
        let limit_names: Vec<Option<&str>> = bulk
            .iter()
            .map(|&(i, _)| rows[i].job.limit.as_ref().map(|l| l.0.as_str()))
            .collect();
        let limit_keys: Vec<Option<&str>> = bulk
            .iter()
            .map(|&(i, _)| rows[i].job.limit.as_ref().map(|l| l.1.as_str()))
            .collect();
        let limit_weights: Vec<i64> = bulk
            .iter()
            .map(|&(i, _)| i64_of(rows[i].job.limit_weight))
            .collect();
        let mut inserted: Vec<i64> = tx
            .query(
                INSERT_MANY_SQL,
                &[
                    &queues,
                    &kinds,
                    &payloads,
                    &states,
                    &priorities,
                    &run_ats,
                    &max_attempts,
                    &timeouts,
                    &now,
                    &batch,
                    &seqs,
                    &limit_names,
                    &limit_keys,
                    &limit_weights,
                ],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if inserted.len() != bulk.len() {
            return Err(Error::Config(format!(
                "inserted {} of {} jobs",
                inserted.len(),
                bulk.len()
            )));
        }
        // The identity values are drawn as the rows come, in input order.
        inserted.sort_unstable();
        for ((i, _), id) in bulk.iter().zip(inserted) {
            ids[*i] = Some(JobId(id));
        }
    }
    let ids: Vec<JobId> = ids.into_iter().map(|id| id.unwrap_or(JobId(0))).collect();
    // A keyed child whose key was held stored nothing: the holder keeps
    // its own edges. What this call stored carries its batch mark.
    let keyed: Vec<i64> = rows
        .iter()
        .zip(&ids)
        .filter(|(row, _)| row.is_linked() && row.job.unique_key.is_some())
        .map(|(_, id)| id.0)
        .collect();
    let ours: std::collections::HashSet<i64> = if keyed.is_empty() {
        Default::default()
    } else {
        tx.query(
            "SELECT id FROM tickler_jobs WHERE id = ANY($1::bigint[]) AND enqueue_batch = $2::bigint",
            &[&keyed, &batch],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let children: Vec<_> = rows
        .iter()
        .zip(&ids)
        .filter(|(row, id)| {
            !row.after.is_empty() && (row.job.unique_key.is_none() || ours.contains(&id.0))
        })
        .map(|(row, id)| (*id, crate::engine::types::parents_of(row, &ids)))
        .collect();
    super::deps::store_edges(tx, &children, now)?;
    let joins = batch_joins(rows, &ids, |i| {
        rows[i].job.unique_key.is_none() || ours.contains(&ids[i].0)
    });
    if !joins.is_empty() {
        crate::queue::batches::join(&mut super::deps::Deps(tx), &joins, now)?;
    }
    Ok(ids)
}

/// The ids of a batch whose earlier try committed after all (found by its
/// mark; a job that try did not insert because its unique_key was held is
/// looked up, or inserted, again), or `None` if it did not commit. Only
/// after a lost COMMIT: the mark has no index, so this reads the table.
fn committed_before(
    tx: &mut Tx<'_>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
) -> Result<Option<Vec<JobId>>> {
    let found = tx
        .query(
            "SELECT enqueue_seq, id FROM tickler_jobs WHERE enqueue_batch = $1::bigint",
            &[&batch],
        )?
        .iter()
        .map(|r| (i64::from(r.get::<_, i32>(0)), r.get(1)))
        .collect();
    ids_after_lost_commit(rows.len(), found, |i| {
        insert_one(tx, &rows[i], rows[i].due.resolve(now)?, now, (batch, i))
    })
}

/// Unique keys up to which a batch locks each of its keys (the lock table
/// is shared by every session of the server: `max_locks_per_transaction`
/// × the connections, 6,400 entries on a stock server, and a batch of
/// 100,000 keys that took one lock each failed with "out of shared
/// memory", leaving none to the server's other clients while it ran).
const KEY_LOCKS_MAX: usize = 256;

/// Lock slots the keys of a larger batch are spread over instead.
const KEY_LOCK_SLOTS: i64 = 64;

/// Before a batch inserts several unique keys: takes a lock per key in key
/// order. Each insert of a key waits for another transaction's
/// uncommitted insert of it, so two batches holding keys in opposite
/// orders would each wait for the other (a deadlock, broken only after
/// `deadlock_timeout`); with the keys locked in one order, the second
/// waits before it holds any. The jobs still go in in input order, so
/// their ids ascend as given.
///
/// A batch of more than [`KEY_LOCKS_MAX`] keys takes, in slot order, the
/// lock of each of the [`KEY_LOCK_SLOTS`] slots its keys fall in (the
/// server's hash of the key, the same for every process): such batches
/// exclude each other as above, but not a smaller batch, with which one
/// in opposite key order deadlocks, broken after `deadlock_timeout` (1 s)
/// and retried as a whole.
fn lock_keys_in_order(tx: &mut Tx<'_>, rows: &[ValidJob]) -> Result<()> {
    let mut keys: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.job.unique_key.as_deref())
        .filter(|k| !k.contains('\0'))
        .collect();
    if keys.len() < 2 {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    if keys.len() <= KEY_LOCKS_MAX {
        tx.execute(
            "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 7369401254420385313)))
             FROM unnest($1::text[]) AS k",
            &[&keys],
        )?;
        return Ok(());
    }
    // The lock's first half names tickler ('tikl').
    tx.execute(
        "SELECT count(pg_advisory_xact_lock(1953066860, slot))
         FROM (SELECT DISTINCT (hashtextextended(k, 0) & ($2::bigint - 1))::int AS slot
               FROM unnest($1::text[]) AS k
               ORDER BY slot) AS slots",
        &[&keys, &KEY_LOCK_SLOTS],
    )?;
    Ok(())
}

/// One job; with a unique_key held by an unfinished job, that job's id.
fn insert_one(
    tx: &mut Tx<'_>,
    row: &ValidJob,
    run_at: i64,
    now: i64,
    (batch, i): (i64, usize),
) -> Result<JobId> {
    let job = &row.job;
    let state = row.state_at(run_at, now);
    let max_attempts = i64_of(job.max_attempts);
    let (limit_name, limit_key) = match &job.limit {
        Some((name, key)) => (Some(name.as_str()), Some(key.as_str())),
        None => (None, None),
    };
    let limit_weight = i64_of(job.limit_weight);
    insert_unique(job, || {
        let inserted = tx.query_opt(
            INSERT_SQL,
            &[
                &job.queue,
                &job.kind,
                &row.payload,
                &state.as_str(),
                &job.priority,
                &run_at,
                &max_attempts,
                &job.unique_key,
                &row.timeout_ms,
                &now,
                &batch,
                &seq_of(i),
                &limit_name,
                &limit_key,
                &limit_weight,
            ],
        )?;
        if let Some(r) = inserted {
            return Ok(Some(JobId(r.get(0))));
        }
        Ok(tx
            .query_opt(HELD_SQL, &[&job.unique_key])?
            .map(|r| JobId(r.get(0))))
    })
}

impl Enqueue for Store {
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>> {
        // Callers that enqueue while another's statement is under way go
        // in together next: one statement and one commit for all of them
        // instead of a round trip and a WAL flush each.
        // Jobs that run after others go alone: a group's rows are one
        // list, in which a graph's steps would lose their places. So do
        // a batch's members: a sealed batch refuses its caller's insert
        // alone.
        let ids = if rows.iter().any(ValidJob::is_linked) {
            self.insert_rows(&rows)?
        } else {
            self.enqueues
                .commit_together(rows, |rows| self.insert_rows(rows))?
        };
        self.notify_watchers();
        Ok(ids)
    }
}

impl Store {
    /// Stores `rows` in one transaction, their ids in order.
    fn insert_rows(&self, rows: &[ValidJob]) -> Result<Vec<JobId>> {
        // Marks this call's rows, so that a retry after a COMMIT whose
        // answer was lost with the connection finds them instead of
        // storing the jobs twice.
        let batch = fastrand::i64(..);
        let insert = |tx: &mut Tx<'_>, attempt: Attempt| {
            let now = self.now_ms();
            if attempt.after_unknown_commit {
                if let Some(ids) = committed_before(tx, rows, now, batch)? {
                    return Ok(ids);
                }
            }
            insert_valid(tx, rows, now, batch)
        };
        // One job is one INSERT (and, if its key is held, one read of the
        // holder's id), and jobs without keys are one INSERT together: no
        // transaction of their own needed.
        // Not so for a job that runs after others (its parents stay
        // locked until its edges are stored) or joins a batch.
        let edges = rows.iter().any(ValidJob::is_linked);
        if !edges && (rows.len() == 1 || rows.iter().all(|r| r.job.unique_key.is_none())) {
            self.write_autocommit(insert)
        } else {
            self.write(insert)
        }
    }
}

/// Jobs written inside the application's own PostgreSQL transactions.
impl Store {
    /// See [`crate::Queue::enqueue_batch_tx`]. In a savepoint of the
    /// caller's transaction, so that a refused job leaves the caller's
    /// transaction usable; with a `NOTIFY` in it, which PostgreSQL delivers
    /// when (and only if) the caller commits.
    pub(crate) fn enqueue_in(
        &self,
        app: &mut postgres::Transaction<'_>,
        rows: &[ValidJob],
    ) -> Result<Vec<JobId>> {
        // Named ones would be closed before the caller's commit, on its
        // server connection; unnamed behind a pooler in transaction mode.
        let mut statements = Statements::new(self.pooling.transaction_mode());
        let mut tx = Tx {
            tx: Session::Transaction(app.savepoint("tickler_enqueue")?),
            statements: &mut statements,
        };
        let now = self.now_ms();
        let ids = insert_valid(&mut tx, rows, now, fastrand::i64(..))?;
        tx.batch_execute(&format!("NOTIFY {}", CHANNEL))?;
        tx.commit()?;
        // This process's fetchers look once the caller commits (the
        // notification wakes them again then).
        self.notify_local();
        Ok(ids)
    }
}
