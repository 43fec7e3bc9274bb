//! Jobs that run after others: the rules, written once for every engine
//! and run by each inside its own write transaction through its `DepTx`.
//!
//! An edge says "child runs after parent". A child with an edge not yet
//! resolved is `waiting`, out of the claim's way. [`resolve`] is the one
//! function every path that ends a job calls, in the transaction of that
//! end (an outcome, the reaper making a job dead, a cancel, a claim that
//! buries a job, `complete_with` in the application's transaction), so a
//! child is released exactly when its last parent's end commits, and by
//! nothing else. A stale holder's outcome changes no row, ends nothing,
//! and so resolves nothing.
//!
//! A new child and its parent's end never miss each other: the insert
//! reads its parents' states with a lock (a server engine's `FOR SHARE`,
//! SQLite's single writer), so whichever commits second sees the other.
//! The insert then resolves the edges of parents that had already ended,
//! with the same function.
//!
//! A job cancelled while it waited keeps the edges not yet resolved
//! (a parent's end still resolves them, and releases nothing). A retry
//! by hand of such a job ([`after_retry`]) puts it back to waiting on
//! them: a retry gives fresh attempts, not leave to run before parents
//! whose end it has not seen. Edges resolved meanwhile stay resolved, so
//! a job whose parents all ended while it was cancelled is due at once,
//! and so is one whose unresolved parent was pruned meanwhile (it had
//! ended, and a job pruned can never resolve an edge).
//!
//! In the lock order `LimitTx` documents, these are job rows (and the
//! edges beside them): a path resolves before it settles limits.

use crate::engine::types::cut_error;
use crate::engine::DepTx;
use crate::error::Result;
use crate::job::{IfParentFails, JobId, JobState};
use std::collections::{BTreeMap, BTreeSet};

impl From<ChildChange> for crate::queue::limits::LimitChange {
    fn from(change: ChildChange) -> Self {
        crate::queue::limits::LimitChange {
            job_id: change.job_id,
            kind: change.kind,
            queue: change.queue,
            attempt: None,
            what: match change.state {
                JobState::Cancelled => crate::events::JobEventKind::Cancelled,
                _ => crate::events::JobEventKind::Released,
            },
        }
    }
}

/// An edge whose parent has ended, as [`DepTx::ended_edges`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndedEdge {
    pub parent: JobId,
    pub parent_state: JobState,
    pub child: JobId,
    pub if_fails: IfParentFails,
}

/// What [`DepTx::ended_edges`] reads of the jobs a transaction ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ended {
    /// Their unresolved edges.
    pub edges: Vec<EndedEdge>,
    /// Those that ended as a batch member not yet counted.
    pub members: Vec<JobId>,
}

/// A waiting job whose state a resolution changed, for the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildChange {
    pub job_id: JobId,
    pub kind: String,
    pub queue: String,
    /// `Pending` or `Scheduled` (released), or `Cancelled`.
    pub state: JobState,
}

/// Takes the end of `ended` (jobs this transaction ended, or any jobs:
/// those that have not ended are passed over) into account for the jobs
/// waiting on them: each edge of a parent that succeeded, or failed with
/// [`IfParentFails::Run`], is resolved; a parent that ended dead or
/// cancelled cancels the children that asked so
/// ([`IfParentFails::Cancel`]), and in turn theirs; `Hold` keeps waiting.
/// A child with no edge left unresolved is made pending (scheduled if its
/// run_at is ahead). Costs one read when no edge waits on `ended`.
pub(crate) fn resolve(tx: &mut dyn DepTx, ended: &[JobId], now: i64) -> Result<Vec<ChildChange>> {
    let mut changes = Vec::new();
    let mut ended: Vec<JobId> = ended.to_vec();
    // Each round goes down one level of cancels; it ends, since a job is
    // cancelled from waiting once at most.
    while !ended.is_empty() {
        ended.sort_unstable();
        ended.dedup();
        let Ended { mut edges, members } = tx.ended_edges(&ended)?;
        if edges.is_empty() && members.is_empty() {
            break;
        }
        let mut next: Vec<JobId> = Vec::new();
        // By child, then parent, whatever order the engine read them in:
        // the children are locked in id order, each once.
        edges.sort_unstable_by_key(|e| (e.child, e.parent));
        let mut done: Vec<(JobId, JobId)> = Vec::new();
        let mut cancel: BTreeMap<JobId, String> = BTreeMap::new();
        let mut touched: BTreeSet<JobId> = BTreeSet::new();
        for edge in &edges {
            match (edge.parent_state, edge.if_fails) {
                (JobState::Succeeded, _) | (_, IfParentFails::Run) => {
                    done.push((edge.parent, edge.child));
                    touched.insert(edge.child);
                }
                (_, IfParentFails::Cancel) => {
                    done.push((edge.parent, edge.child));
                    cancel.entry(edge.child).or_insert_with(|| {
                        cut_error(&format!(
                            "cancelled: job {} it runs after ended {}",
                            edge.parent, edge.parent_state
                        ))
                        .into_owned()
                    });
                }
                (_, IfParentFails::Hold) => {}
            }
        }
        let mut children: Vec<JobId> = edges.iter().map(|e| e.child).collect();
        children.dedup();
        if !children.is_empty() {
            tx.lock_children(&children)?;
        }
        tx.mark_resolved(&done)?;
        let cancel: Vec<(JobId, String)> = cancel.into_iter().collect();
        let cancelled = tx.cancel_waiting(&cancel, now)?;
        for c in &cancelled {
            touched.remove(&c.job_id);
        }
        let touched: Vec<JobId> = touched.into_iter().collect();
        changes.extend(tx.release_waiting(&touched, now)?);
        next.extend(cancelled.iter().map(|c| c.job_id));
        changes.extend(cancelled);
        // Batch rows after the job rows above, as `BatchTx` orders them.
        // A batch's callbacks cancelled here end in turn.
        if !members.is_empty() {
            let decided = crate::queue::batches::count_ends(tx, &members, now)?;
            next.extend(
                decided
                    .iter()
                    .filter(|c| c.state == JobState::Cancelled)
                    .map(|c| c.job_id),
            );
            changes.extend(decided);
        }
        ended = next;
    }
    Ok(changes)
}

/// After a retry by hand made job `id` pending (or scheduled) in this
/// transaction, which locked its row first: a job with an edge left
/// unresolved (it was cancelled while it waited) waits again (see the
/// module doc).
pub(crate) fn after_retry(tx: &mut dyn DepTx, id: JobId, now: i64) -> Result<()> {
    if !tx.wait_again(id)? {
        // A batch's callback cancelled while it waited, likewise, waits
        // for its batch again: its batch decides it, once.
        tx.wait_for_batch(id)?;
    }
    crate::queue::batches::revive(tx, &[id], now)
}

/// Before one insert stores `rows`: refuses a parent named by id that
/// no job stored before has ([`crate::Error::ParentNotFound`]), so an
/// edge cannot point at a job of the same insert by a guessed id, nor at
/// a later one: edges only point back in time, and no cycle can form. The
/// parents found stay locked (see [`DepTx::lock_parents`]).
pub(crate) fn check_parents(
    tx: &mut dyn DepTx,
    rows: &[crate::engine::types::ValidJob],
) -> Result<()> {
    let parents: BTreeSet<JobId> = rows
        .iter()
        .flat_map(|row| row.after.iter())
        .filter_map(|(parent, _)| match parent {
            crate::graph::Parent::Job(id) => Some(*id),
            crate::graph::Parent::Row(_) => None,
        })
        .collect();
    if parents.is_empty() {
        return Ok(());
    }
    let parents: Vec<JobId> = parents.into_iter().collect();
    let found = tx.lock_parents(&parents)?;
    match parents.iter().find(|p| !found.contains_key(p)) {
        Some(missing) => Err(crate::Error::ParentNotFound(*missing)),
        None => Ok(()),
    }
}

/// For the rows of one insert, each `(child, its parents)` stored as
/// `waiting`: checks that each parent exists (locking it, see the module
/// doc), stores the edges, then resolves those whose parent had already
/// ended. Parents of the same insert were stored just before.
pub(crate) fn store_edges(
    tx: &mut dyn DepTx,
    children: &[(JobId, Vec<(JobId, IfParentFails)>)],
    now: i64,
) -> Result<Vec<ChildChange>> {
    if children.is_empty() {
        return Ok(Vec::new());
    }
    let parents: BTreeSet<JobId> = children
        .iter()
        .flat_map(|(_, after)| after.iter().map(|(p, _)| *p))
        .collect();
    let parents: Vec<JobId> = parents.into_iter().collect();
    let states = tx.lock_parents(&parents)?;
    if let Some(missing) = parents.iter().find(|p| !states.contains_key(p)) {
        return Err(crate::Error::ParentNotFound(*missing));
    }
    let edges: Vec<(JobId, JobId, IfParentFails)> = children
        .iter()
        .flat_map(|(child, after)| after.iter().map(move |(p, f)| (*p, *child, *f)))
        .collect();
    tx.insert_edges(&edges)?;
    let ended: Vec<JobId> = states
        .into_iter()
        .filter(|(_, s)| s.is_terminal())
        .map(|(p, _)| p)
        .collect();
    resolve(tx, &ended, now)
}
