//! Group commit of concurrent enqueues, for every engine: callers that
//! enqueue while another's commit is under way share the next commit (one
//! fsync on SQLite, one statement and one WAL flush on a server) instead
//! of each paying one.

use crate::engine::types::ValidJob;
use crate::error::Result;
use crate::job::JobId;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest an enqueue group's leader waits for the callers of the last
/// round to come back (see `EnqueueGroup`); a commit that waited long for
/// another process's write lock must not make the next one wait as long.
const ENQUEUE_LINGER_MAX: Duration = Duration::from_millis(10);

/// How many enqueue groups a server engine has under way at once.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const ENQUEUE_GROUPS: usize = 4;

/// Group commit of enqueues: while one caller (the leader) commits, others
/// queue up; the next leader commits all of them in one transaction (one
/// fsync), and each caller returns once the commit holding its jobs is done.
/// Callers wait on a condition variable, not on the write lock, so a
/// finished group's members return at once and can queue again.
///
/// A leader lingers (at most half of the last commit's duration, and at
/// most `ENQUEUE_LINGER_MAX`) until as
/// many callers are waiting as took part in the last round: the last group
/// plus those that arrived while it committed. Without that, 16 callers
/// settle into two alternating groups of about 8, each paying a full fsync.
///
/// A server takes several commits at once (on connections of their own),
/// so there a few groups may be under way together
/// ([`EnqueueGroup::concurrent`]), and no leader lingers: a caller that
/// finds a leader's place free starts a group at once.
pub(crate) struct EnqueueGroup {
    /// How many groups may be under way at once.
    leaders_max: usize,
    /// How long a leader may wait for the callers of the last round.
    linger_max: Duration,
    state: Mutex<GroupState>,
    changed: std::sync::Condvar,
    /// Wakes a lingering leader when a caller arrives.
    arrived: std::sync::Condvar,
}

#[derive(Default)]
struct GroupState {
    next_ticket: u64,
    waiting: Vec<(u64, Vec<ValidJob>)>,
    /// Finished tickets: their ids, or their rows back when the group's
    /// transaction failed (the owner then commits them alone).
    done: HashMap<u64, std::result::Result<Vec<JobId>, Vec<ValidJob>>>,
    /// Groups under way.
    leaders_active: usize,
    /// A leader is waiting on `arrived` for more callers.
    lingering: bool,
    /// Callers in the last round: the last group plus those that arrived
    /// while it committed; how many a leader waits for.
    expected: usize,
    /// How long the last group's commit took.
    last_commit: Duration,
}

impl Default for EnqueueGroup {
    /// One group at a time, lingering: SQLite's single writer.
    fn default() -> Self {
        EnqueueGroup {
            leaders_max: 1,
            linger_max: ENQUEUE_LINGER_MAX,
            state: Mutex::default(),
            changed: std::sync::Condvar::new(),
            arrived: std::sync::Condvar::new(),
        }
    }
}

impl EnqueueGroup {
    /// Up to `leaders` groups under way at once, none lingering: a server
    /// engine's, each group on a connection of its own.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn concurrent(leaders: usize) -> Self {
        EnqueueGroup {
            leaders_max: leaders.max(1),
            linger_max: Duration::ZERO,
            ..EnqueueGroup::default()
        }
    }

    /// Commits `rows` with whatever else is waiting, where one call of
    /// `write` stores the rows of all members together (in order) and
    /// returns their ids in that order: each member is given its own.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn commit_together(
        &self,
        rows: Vec<ValidJob>,
        write: impl Fn(&[ValidJob]) -> Result<Vec<JobId>>,
    ) -> Result<Vec<JobId>> {
        self.commit(rows, |group| match group {
            [rows] => Ok(vec![write(rows)?]),
            _ => {
                let mut ids = write(&group.concat())?.into_iter();
                Ok(group
                    .iter()
                    .map(|rows| ids.by_ref().take(rows.len()).collect())
                    .collect())
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits `rows` with whatever else is waiting, using `write` (given
    /// each member's rows, returns each member's ids, in order).
    pub(crate) fn commit(
        &self,
        rows: Vec<ValidJob>,
        mut write: impl FnMut(&[Vec<ValidJob>]) -> Result<Vec<Vec<JobId>>>,
    ) -> Result<Vec<JobId>> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push((ticket, rows));
        if state.lingering {
            self.arrived.notify_one();
        }
        loop {
            match state.done.remove(&ticket) {
                Some(Ok(ids)) => return Ok(ids),
                Some(Err(rows)) => {
                    // The group failed: perhaps for another member's job.
                    drop(state);
                    return Self::alone(&mut write, rows);
                }
                None => {}
            }
            // A place for a leader, and our rows not yet in a group
            // under way.
            if state.leaders_active < self.leaders_max
                && state.waiting.iter().any(|(t, _)| *t == ticket)
            {
                break;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.leaders_active += 1;
        // Members of the last group are returning and queueing again; wait
        // a little for them to join this group rather than the next fsync.
        let linger_until = Instant::now() + (state.last_commit / 2).min(self.linger_max);
        while state.waiting.len() < state.expected {
            let left = linger_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state.lingering = true;
            state = self
                .arrived
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.lingering = false;
        }
        let group: Vec<(u64, Vec<ValidJob>)> = std::mem::take(&mut state.waiting);
        drop(state);
        let group_size = group.len();
        let (tickets, rows): (Vec<u64>, Vec<Vec<ValidJob>>) = group.into_iter().unzip();
        let started = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&rows)));
        let mut state = self.lock();
        state.leaders_active -= 1;
        state.last_commit = started.elapsed();
        state.expected = group_size + state.waiting.len();
        let result = match result {
            Ok(result) => result,
            Err(panic) => {
                // Hand the others their rows back before unwinding, so
                // nobody waits for a leader that is gone.
                for (t, rows) in tickets.into_iter().zip(rows) {
                    if t != ticket {
                        state.done.insert(t, Err(rows));
                    }
                }
                drop(state);
                self.changed.notify_all();
                std::panic::resume_unwind(panic);
            }
        };
        let own = match result {
            Ok(ids) => {
                let mut own = Vec::new();
                for (t, ids) in tickets.into_iter().zip(ids) {
                    if t == ticket {
                        own = ids;
                    } else {
                        state.done.insert(t, Ok(ids));
                    }
                }
                Ok(own)
            }
            Err(e) if group_size == 1 => Err(e),
            Err(_) => {
                let mut own = Vec::new();
                for (t, rows) in tickets.into_iter().zip(rows) {
                    if t == ticket {
                        own = rows;
                    } else {
                        state.done.insert(t, Err(rows));
                    }
                }
                drop(state);
                self.changed.notify_all();
                return Self::alone(&mut write, own);
            }
        };
        drop(state);
        self.changed.notify_all();
        own
    }

    /// After a group failed: stores one member's rows on their own, so
    /// that a job the engine refuses fails its caller alone. Outside the
    /// group and its limit on leaders, so that the members of a group
    /// that failed for want of a server each wait at most one more retry
    /// window, side by side, rather than a window each in turn.
    fn alone(
        write: &mut impl FnMut(&[Vec<ValidJob>]) -> Result<Vec<Vec<JobId>>>,
        rows: Vec<ValidJob>,
    ) -> Result<Vec<JobId>> {
        Ok(write(&[rows])?.pop().unwrap_or_default())
    }
}
