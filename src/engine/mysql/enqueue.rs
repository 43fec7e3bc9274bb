//! Storing new jobs on MySQL: validated jobs inserted with their unique
//! keys (a job whose key is held yields the holder's id, in the same
//! statement), a batch without keys in multi-row statements whose ids are
//! read back by the batch's mark, found again after a COMMIT whose answer
//! was lost, and jobs in the application's own transaction.

use super::connection::{args, Attempt, Tx};
use super::rows::get;
use super::Store;
use crate::engine::types::*;
use crate::engine::Enqueue;
use crate::error::{Error, Result};
use crate::job::JobId;
use mysql::prelude::Queryable;

/// The longest queue, kind or schedule name the schema holds, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 255;

/// A job; if its unique_key is held by an unfinished job, nothing is
/// inserted and the holder's id is the statement's insert id. (With
/// `CLIENT_FOUND_ROWS` both cases match one row.)
const INSERT_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority,
         run_at, max_attempts, unique_key, timeout_ms, created_at, enqueue_batch, enqueue_seq,
         limit_name, limit_key, limit_weight, errors)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '[]')
     ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)";

/// Jobs per multi-row INSERT: 14 values each, well under the 65,535
/// placeholders a statement may have.
const ROWS_PER_INSERT: usize = 500;

/// Bytes per multi-row INSERT at most: a statement travels in one packet,
/// which the server refuses over `max_allowed_packet` (16 MiB on MariaDB's
/// defaults, 64 MiB on MySQL 8's, and as low as a DBA sets it), so a batch
/// is cut where its rows would pass this or [`insert_budget`]. A row
/// larger alone goes in a statement of its own (open checked that one
/// payload fits with its row).
const BYTES_PER_INSERT: usize = 2 * 1024 * 1024;

/// What a row adds to a multi-row INSERT besides its payload and names:
/// seven numbers, the state's name and the placeholders' types, with
/// room to spare.
const ROW_BYTES: usize = 128;

/// Bytes of rows one multi-row INSERT may carry on a server whose
/// `max_allowed_packet` is `packet`: the statement's text and a row's
/// worth of headroom are kept out.
pub(super) fn insert_budget(packet: usize) -> usize {
    BYTES_PER_INSERT.min(packet.saturating_sub(crate::engine::types::ROW_HEADROOM))
}

pub(super) const HELD_SQL: &str = "SELECT id FROM tickler_jobs WHERE unique_live = ?";

/// Refuses a name longer than the schema holds, naming it.
pub(crate) fn check_name(what: &str, value: &str) -> Result<()> {
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes long, but the MySQL engine stores at most {MAX_NAME_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

/// Inserts validated jobs in `tx`; a job whose unique_key is held by an
/// unfinished job inserts nothing and yields that job's id. Concurrent
/// inserts of one key on several machines: the unique index makes one
/// wait for the other's commit and then find its job.
pub(crate) fn insert_valid<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
    packet: usize,
) -> Result<Vec<JobId>> {
    let mut ids: Vec<Option<JobId>> = vec![None; rows.len()];
    let mut bulk = Vec::new();
    crate::queue::deps::check_parents(&mut super::deps::Deps(tx), rows)?;
    for (i, row) in rows.iter().enumerate() {
        check_name("queue", &row.job.queue)?;
        check_name("kind", &row.job.kind)?;
        if let Some((name, _)) = &row.job.limit {
            check_name("limit name", name)?;
        }
        let run_at = row.due.resolve(now)?;
        if row.job.unique_key.is_none() && rows.len() > 1 {
            bulk.push((i, run_at));
            continue;
        }
        ids[i] = Some(insert_one(tx, row, run_at, now, (batch, i))?);
    }
    let mut first_id: Option<u64> = None;
    let mut chunks: Vec<&[(usize, i64)]> = Vec::new();
    let budget = insert_budget(packet);
    let (mut from, mut bytes) = (0, 0);
    for (n, &(i, _)) in bulk.iter().enumerate() {
        let row = &rows[i];
        let size = row.payload.len()
            + row.job.queue.len()
            + row.job.kind.len()
            + row.job.limit.as_ref().map_or(0, |(n, k)| n.len() + k.len())
            + ROW_BYTES;
        if n > from && (n - from == ROWS_PER_INSERT || bytes + size > budget) {
            chunks.push(&bulk[from..n]);
            (from, bytes) = (n, 0);
        }
        bytes += size;
    }
    if from < bulk.len() {
        chunks.push(&bulk[from..]);
    }
    for chunk in chunks {
        let mut sql = String::from(
            "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
                 max_attempts, timeout_ms, created_at, enqueue_batch, enqueue_seq, limit_name,
                 limit_key, limit_weight, errors) VALUES ",
        );
        let mut values = Vec::with_capacity(chunk.len() * 14);
        for (n, &(i, run_at)) in chunk.iter().enumerate() {
            if n > 0 {
                sql.push_str(", ");
            }
            sql.push_str("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '[]')");
            let row = &rows[i];
            values.extend(args![
                row.job.queue.as_str(),
                row.job.kind.as_str(),
                row.payload.as_str(),
                row.state_at(run_at, now).as_str(),
                row.job.priority,
                run_at,
                i64::from(row.job.max_attempts),
                row.timeout_ms,
                now,
                batch,
                seq_of(i),
                row.job.limit.as_ref().map(|l| l.0.as_str()),
                row.job.limit.as_ref().map(|l| l.1.as_str()),
                i64::from(row.job.limit_weight),
            ]);
        }
        let (_, first) = tx.insert(&sql, values)?;
        first_id = first_id.or(first);
    }
    if let Some(first) = first_id {
        // The ids of one statement ascend in row order from its first, and
        // later statements' are higher: the batch's rows are found from
        // there by their mark, whatever other sessions inserted between.
        let found = tx.rows(
            "SELECT enqueue_seq, id FROM tickler_jobs
             WHERE id >= ? AND enqueue_batch = ? ORDER BY id LIMIT ?",
            args![first, batch, bulk.len() as u64],
        )?;
        let found = found
            .iter()
            .map(|r| Ok((get(r, 0)?, get(r, 1)?)))
            .collect::<Result<Vec<(i64, i64)>>>()?;
        for (i, id) in ids_by_seq(rows.len(), found).into_iter().enumerate() {
            if id.is_some() {
                ids[i] = id;
            }
        }
    }
    let ids: Vec<JobId> = ids
        .into_iter()
        .map(|id| id.ok_or_else(|| Error::Config("a stored job's id could not be read".into())))
        .collect::<Result<_>>()?;
    // A keyed child whose key was held stored nothing: the holder keeps
    // its own edges. What this call stored carries its batch mark.
    let mut children = Vec::new();
    let mut stored = vec![true; rows.len()];
    for (i, (row, id)) in rows.iter().zip(&ids).enumerate() {
        if !row.is_linked() {
            continue;
        }
        if row.job.unique_key.is_some()
            && tx
                .first(
                    "SELECT 1 FROM tickler_jobs WHERE id = ? AND enqueue_batch = ?",
                    args![id.0, batch],
                )?
                .is_none()
        {
            stored[i] = false;
            continue;
        }
        if !row.after.is_empty() {
            children.push((*id, crate::engine::types::parents_of(row, &ids)));
        }
    }
    super::deps::store_edges(tx, &children, now)?;
    let joins = batch_joins(rows, &ids, |i| stored[i]);
    if !joins.is_empty() {
        crate::queue::batches::join(&mut super::deps::Deps(tx), &joins, now)?;
    }
    Ok(ids)
}

/// One job; with a unique_key held by an unfinished job, that job's id.
fn insert_one<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    row: &ValidJob,
    run_at: i64,
    now: i64,
    (batch, i): (i64, usize),
) -> Result<JobId> {
    let job = &row.job;
    insert_unique(job, || {
        let (_, id) = tx.insert(
            INSERT_SQL,
            args![
                job.queue.as_str(),
                job.kind.as_str(),
                row.payload.as_str(),
                row.state_at(run_at, now).as_str(),
                job.priority,
                run_at,
                i64::from(job.max_attempts),
                job.unique_key.as_deref(),
                row.timeout_ms,
                now,
                batch,
                seq_of(i),
                job.limit.as_ref().map(|l| l.0.as_str()),
                job.limit.as_ref().map(|l| l.1.as_str()),
                i64::from(job.limit_weight),
            ],
        )?;
        if let Some(id) = id
            .and_then(|id| i64::try_from(id).ok())
            .filter(|id| *id > 0)
        {
            return Ok(Some(JobId(id)));
        }
        // The OK packet's id is 0 after `ON DUPLICATE KEY UPDATE` when the
        // table has a trigger (MariaDB 10.11), so the holder is read here.
        // READ COMMITTED released the holder's row as soon as the no-op
        // update left it unchanged: it may have finished since, and then
        // the key is free and the next try stores the job.
        let Some(key) = job.unique_key.as_deref() else {
            return Err(Error::Config(
                "the server did not tell the id of a stored job".into(),
            ));
        };
        tx.first(HELD_SQL, args![key])?
            .map(|held| Ok(JobId(get(&held, 0)?)))
            .transpose()
    })
}

/// The ids of a batch whose earlier try committed after all (found by its
/// mark), or `None` if it did not commit. Only after a lost COMMIT: the
/// mark has no index, so this reads the table.
fn committed_before(
    tx: &mut Tx<'_>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
) -> Result<Option<Vec<JobId>>> {
    let found = tx
        .rows(
            "SELECT enqueue_seq, id FROM tickler_jobs WHERE enqueue_batch = ?",
            args![batch],
        )?
        .iter()
        .map(|r| Ok((get(r, 0)?, get(r, 1)?)))
        .collect::<Result<Vec<(i64, i64)>>>()?;
    ids_after_lost_commit(rows.len(), found, |i| {
        insert_one(tx, &rows[i], rows[i].due.resolve(now)?, now, (batch, i))
    })
}

impl Enqueue for Store {
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>> {
        // Callers that enqueue while another's commit is under way go in
        // together next: one transaction and one redo-log flush for all.
        // Jobs that run after others go alone: a group's rows are one
        // list, in which a graph's steps would lose their places.
        // So do a batch's members: a sealed batch refuses its caller's
        // insert alone.
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
        // answer was lost finds them instead of storing the jobs twice.
        let batch = fastrand::i64(..);
        let insert = |tx: &mut Tx<'_>, attempt: Attempt| {
            let now = self.now_ms();
            if attempt.after_unknown_commit {
                if let Some(ids) = committed_before(tx, rows, now, batch)? {
                    return Ok(ids);
                }
            }
            insert_valid(tx, rows, now, batch, self.max_packet)
        };
        // One job is one statement: no transaction of its own needed; not
        // so for a job that runs after others (its parents stay locked
        // until its edges are stored) or joins a batch.
        if rows.len() == 1 && !rows[0].is_linked() {
            self.write_autocommit(insert)
        } else {
            self.write(insert)
        }
    }
}

/// Jobs written inside the application's own MySQL transactions.
impl Store {
    /// See [`crate::Queue::enqueue_batch_tx`]. In a savepoint of the
    /// caller's transaction, so that a refused job leaves the caller's
    /// earlier writes as they were.
    pub(crate) fn enqueue_in(
        &self,
        app: &mut mysql::Transaction<'_>,
        rows: &[ValidJob],
        now: i64,
    ) -> Result<Vec<JobId>> {
        let mut tx = Tx::inside(app);
        let ids =
            tx.isolated(|tx| insert_valid(tx, rows, now, fastrand::i64(..), self.max_packet))??;
        // This process's fetchers look now; other processes' watchers see
        // the new jobs once the caller commits.
        self.notify_local();
        Ok(ids)
    }
}
