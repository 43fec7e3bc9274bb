//! Batches: the rules, written once for every engine and run by each
//! inside its own write transaction through its `BatchTx`, and the
//! `Queue` methods that open, seal and read them.
//!
//! A member joins in the transaction that stores it, which locks the
//! batch's row, refuses a sealed one and counts it (`members`,
//! `remaining`). A member's end is counted by [`count_ends`], which
//! `crate::queue::deps::resolve` calls: the one function every path that
//! ends a job already calls in that end's transaction (an outcome, the
//! reaper making a job dead, a cancel, a claim that buries a job, a
//! limit's doom, `complete_with`). So the counters move in the same
//! commit as the member's state, and a stale holder, whose outcome ends
//! nothing, counts nothing. The member's row carries whether it was
//! counted, so a second path over the same end counts nothing more.
//!
//! The callbacks are decided once: by the transaction that leaves a
//! sealed batch with no member remaining (a member's end, or the seal
//! itself), which marks the batch finished under its row lock. Whichever
//! of two last ends commits second sees the first's counters, and a seal
//! racing a last end takes the same row lock: the one that commits second
//! decides, and only it.
//!
//! A member retried by hand after it ended ([`revive`]) is uncounted and
//! remains again; if the batch had finished, its callbacks stay decided.
//! A callback cancelled by hand and retried by hand before its batch
//! finished waits again (`BatchTx::wait_for_batch`): the end decides it.
//!
//! A member that runs after other jobs may be cancelled by its own insert
//! (a parent had failed), before it joins: [`join`] counts that end.

use crate::batch::{Batch, BatchId, BatchRow, Callback, NewBatch};
use crate::engine::DepTx;
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::queue::deps::ChildChange;
use crate::queue::Queue;
use std::collections::{BTreeMap, BTreeSet};

/// A job an insert stored that joins a batch, as a member or (`role`) as
/// one of its callbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Joining {
    pub job: JobId,
    pub batch: BatchId,
    pub role: Option<Callback>,
    /// It runs after other jobs: one of them may have ended before the
    /// insert, which then already cancelled it.
    pub runs_after: bool,
    /// The jobs stored before this insert that it runs after.
    pub stored_parents: Vec<JobId>,
}

/// In the transaction that stored them, after their edges: `members` join
/// their batches. A job named twice (a unique_key repeated in one call
/// yields the same id) joins once, the first batch named. A member the
/// insert already ended (a parent it runs after had failed) is counted
/// ended at once, or its batch would wait for it forever. Refuses an
/// unknown batch ([`Error::BatchNotFound`]) and one sealed
/// ([`Error::BatchSealed`]), and a member that runs after a callback of
/// its own batch ([`Error::InvalidArgument`]: the batch would wait for it
/// forever); the caller's transaction then stores nothing.
pub(crate) fn join(tx: &mut dyn DepTx, members: &[Joining], now: i64) -> Result<()> {
    let mut joining: BTreeMap<BatchId, Vec<JobId>> = BTreeMap::new();
    let mut seen: BTreeSet<JobId> = BTreeSet::new();
    let mut maybe_ended: Vec<JobId> = Vec::new();
    let mut after_stored: BTreeMap<BatchId, Vec<(JobId, JobId)>> = BTreeMap::new();
    for m in members {
        if !seen.insert(m.job) {
            continue;
        }
        match m.role {
            Some(role) => tx.join_batch(m.batch, Some(role), &[m.job])?,
            None => {
                joining.entry(m.batch).or_default().push(m.job);
                if m.runs_after {
                    maybe_ended.push(m.job);
                }
                let after = after_stored.entry(m.batch).or_default();
                after.extend(m.stored_parents.iter().map(|p| (m.job, *p)));
            }
        }
    }
    if joining.is_empty() {
        return Ok(());
    }
    for (batch, edges) in &after_stored {
        if edges.is_empty() {
            continue;
        }
        let callbacks = tx.batch_callbacks(*batch)?;
        if let Some((job, parent)) = edges
            .iter()
            .find(|(_, p)| callbacks.iter().any(|(c, _)| c == p))
        {
            return Err(Error::InvalidArgument(format!(
                "job {job} of batch {batch} would run after {parent}, a callback of the same batch, \
                 which runs only once every member ended: neither would ever run"
            )));
        }
    }
    let ids: Vec<BatchId> = joining.keys().copied().collect();
    let rows = tx.lock_batches(&ids)?;
    for (batch, jobs) in joining {
        let Some(row) = rows.iter().find(|r| r.id == batch) else {
            return Err(Error::BatchNotFound(batch));
        };
        if row.sealed {
            return Err(Error::BatchSealed(batch));
        }
        tx.join_batch(batch, None, &jobs)?;
        let mut row = row.clone();
        let n = i64::try_from(jobs.len()).unwrap_or(i64::MAX);
        row.members += n;
        row.remaining += n;
        tx.write_batch(&row, now)?;
    }
    if !maybe_ended.is_empty() {
        // Each batch is open (checked above), so this counts and decides
        // nothing else.
        count_ends(tx, &maybe_ended, now)?;
    }
    Ok(())
}

/// Counts the ends of those of `members` (jobs this transaction ended or
/// holds) that ended as a batch member not yet counted, and decides the
/// callbacks of each batch this leaves sealed with no member remaining.
/// Returns the callbacks released or cancelled; the caller resolves the
/// jobs that run after a cancelled one.
pub(crate) fn count_ends(
    tx: &mut dyn DepTx,
    members: &[JobId],
    now: i64,
) -> Result<Vec<ChildChange>> {
    let counted = tx.count_members(members)?;
    if counted.is_empty() {
        return Ok(Vec::new());
    }
    let mut delta: BTreeMap<BatchId, Vec<JobState>> = BTreeMap::new();
    for (_, batch, state) in counted {
        delta.entry(batch).or_default().push(state);
    }
    let ids: Vec<BatchId> = delta.keys().copied().collect();
    let mut changes = Vec::new();
    for mut row in tx.lock_batches(&ids)? {
        for state in &delta[&row.id] {
            add(&mut row, *state, 1);
        }
        let decide = row.sealed && row.remaining <= 0 && !row.finished;
        row.finished |= decide;
        tx.write_batch(&row, now)?;
        if decide {
            changes.extend(decide_callbacks(tx, &row, now)?);
        }
    }
    Ok(changes)
}

/// Moves one member into (`sign` 1) or out of (`sign` -1) the counter of
/// the state it ended in.
fn add(row: &mut BatchRow, state: JobState, sign: i64) {
    row.remaining -= sign;
    match state {
        JobState::Succeeded => row.succeeded += sign,
        JobState::Dead => row.dead += sign,
        _ => row.cancelled += sign,
    }
}

/// Releases or cancels the callbacks of `row`, which has just finished.
fn decide_callbacks(tx: &mut dyn DepTx, row: &BatchRow, now: i64) -> Result<Vec<ChildChange>> {
    let failed = row.dead + row.cancelled > 0;
    let mut release = Vec::new();
    let mut cancel = Vec::new();
    for (id, role) in tx.batch_callbacks(row.id)? {
        let why = match role {
            Callback::OnSuccess if failed => Some(format!(
                "cancelled: batch {} ended with {} dead and {} cancelled of {} members",
                row.id, row.dead, row.cancelled, row.members
            )),
            Callback::OnFailure if !failed => Some(format!(
                "cancelled: every member of batch {} succeeded ({})",
                row.id, row.succeeded
            )),
            _ => None,
        };
        match why {
            Some(why) => cancel.push((id, why)),
            None => release.push(id),
        }
    }
    release.sort_unstable();
    cancel.sort_unstable();
    // Locked as the children of an edge are, so a cancel by hand in
    // flight is seen, not overwritten.
    let mut locked: Vec<JobId> = release
        .iter()
        .chain(cancel.iter().map(|c| &c.0))
        .copied()
        .collect();
    locked.sort_unstable();
    if !locked.is_empty() {
        tx.lock_children(&locked)?;
    }
    let mut changes = tx.cancel_waiting(&cancel, now)?;
    changes.extend(tx.release_waiting(&release, now)?);
    Ok(changes)
}

/// After a retry by hand made the jobs `ids` run again in this
/// transaction (their rows locked): those counted as an ended member
/// remain again.
pub(crate) fn revive(tx: &mut dyn DepTx, ids: &[JobId], now: i64) -> Result<()> {
    let uncounted = tx.uncount_members(ids)?;
    if uncounted.is_empty() {
        return Ok(());
    }
    let mut delta: BTreeMap<BatchId, Vec<JobState>> = BTreeMap::new();
    for (batch, state) in uncounted {
        delta.entry(batch).or_default().push(state);
    }
    let ids: Vec<BatchId> = delta.keys().copied().collect();
    for mut row in tx.lock_batches(&ids)? {
        for state in &delta[&row.id] {
            add(&mut row, *state, -1);
        }
        tx.write_batch(&row, now)?;
    }
    Ok(())
}

/// Seals `batch` in this transaction; if no member remains, decides its
/// callbacks (and resolves the jobs that run after one cancelled).
/// Sealing a sealed batch changes nothing.
pub(crate) fn seal(tx: &mut dyn DepTx, batch: BatchId, now: i64) -> Result<Vec<ChildChange>> {
    let Some(mut row) = tx.lock_batches(&[batch])?.pop() else {
        return Err(Error::BatchNotFound(batch));
    };
    if row.sealed {
        return Ok(Vec::new());
    }
    row.sealed = true;
    let decide = row.remaining <= 0 && !row.finished;
    row.finished |= decide;
    tx.write_batch(&row, now)?;
    if !decide {
        return Ok(Vec::new());
    }
    let mut changes = decide_callbacks(tx, &row, now)?;
    let cancelled: Vec<JobId> = changes
        .iter()
        .filter(|c| c.state == JobState::Cancelled)
        .map(|c| c.job_id)
        .collect();
    changes.extend(crate::queue::deps::resolve(tx, &cancelled, now)?);
    Ok(changes)
}

impl Queue {
    /// Opens a batch: stores it, open, with its callbacks `waiting` (see
    /// [`NewBatch`]), all or nothing. Add members with
    /// [`NewJob::batch`](crate::NewJob::batch) from any process, then
    /// [`Queue::seal_batch`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a description longer than
    /// [`crate::MAX_BATCH_DESCRIPTION_BYTES`] or a callback with a
    /// unique_key, parents or a batch of its own; any input error of
    /// [`Queue::enqueue`] for a callback. Nothing is stored.
    pub fn open_batch(&self, batch: NewBatch) -> Result<Batch> {
        if let Some(text) = &batch.description {
            if text.len() > crate::MAX_BATCH_DESCRIPTION_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "batch description is {} bytes; the longest is {} (MAX_BATCH_DESCRIPTION_BYTES)",
                    text.len(),
                    crate::MAX_BATCH_DESCRIPTION_BYTES
                )));
            }
        }
        let now = self.now_ms();
        let mut callbacks = Vec::new();
        for (role, job) in [
            (Callback::OnSuccess, batch.on_success),
            (Callback::OnFailure, batch.on_failure),
            (Callback::OnFinish, batch.on_finish),
        ] {
            let Some(job) = job else { continue };
            let refused = if job.unique_key.is_some() {
                Some("a unique_key")
            } else if !job.after.is_empty() {
                Some("jobs it runs after")
            } else if job.batch.is_some() {
                Some("a batch of its own")
            } else {
                None
            };
            if let Some(what) = refused {
                return Err(Error::InvalidArgument(format!(
                    "the batch's {} callback has {what}: a callback runs when its batch ends, and only then",
                    role.as_str()
                )));
            }
            callbacks.push((role, self.validate(job, now)?));
        }
        let id = self
            .engine()
            .open_batch(batch.description.as_deref(), callbacks)?;
        self.batch(id)
    }

    /// Seals batch `id`: no member can join it after. If none remains (all
    /// ended, or it has none), its callbacks are decided in this call;
    /// otherwise when its last member ends. Sealing a sealed batch does
    /// nothing. Returns the batch as sealed.
    ///
    /// # Errors
    /// [`Error::BatchNotFound`] if no batch has this id.
    pub fn seal_batch(&self, id: BatchId) -> Result<Batch> {
        self.engine().seal_batch(id)?;
        self.batch(id)
    }

    /// Batch `id` as stored: its counters, times and callbacks.
    ///
    /// # Errors
    /// [`Error::BatchNotFound`] if no batch has this id (never opened, or
    /// pruned).
    pub fn batch(&self, id: BatchId) -> Result<Batch> {
        self.engine().batch(id)
    }

    /// The members of batch `id` with ids above `after` (from the start if
    /// `None`), in id order, at most `limit` of them: each with its state
    /// and [`Job::output`]. A callback reads its members' outputs so, page
    /// by page. Members are kept by [`Queue::prune`] until the batch has
    /// finished and its callbacks have ended.
    ///
    /// # Errors
    /// [`Error::BatchNotFound`] if no batch has this id.
    pub fn batch_members(
        &self,
        id: BatchId,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<Job>> {
        self.engine().batch_members(id, after, limit)
    }
}
