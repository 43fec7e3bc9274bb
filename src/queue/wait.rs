//! Waiting for a job to end: [`Queue::wait`], a definite answer within a
//! bound, whichever process runs the job.

use super::Queue;
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest a waiter goes without reading its job again. Commits that end a
/// job wake it sooner where the engine reports them (SQLite's file
/// notifications of every commit, this process's own outcomes); on a
/// server engine, whose notifications are of new work only, another
/// process's outcome is seen within this.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// How a job stood when [`Queue::wait`] returned. Every answer is
/// definite: a job that ended, one that is not there, or one that had not
/// ended when the time was up, with its state then.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Waited {
    /// It succeeded.
    Succeeded(Job),
    /// It is dead: its last attempt failed, or it failed permanently
    /// ([`Job::last_error`] says why). [`Queue::retry`] revives it.
    Dead(Job),
    /// It was cancelled.
    Cancelled(Job),
    /// No such job: it never existed, or it ended and was pruned
    /// ([`Queue::prune`]) before it was read.
    NotFound,
    /// It had not ended when the timeout ran out; the job as it was then
    /// (scheduled, pending, blocked or running).
    TimedOut(Job),
}

impl Waited {
    /// The job, unless it was not found.
    pub fn job(&self) -> Option<&Job> {
        match self {
            Waited::Succeeded(job)
            | Waited::Dead(job)
            | Waited::Cancelled(job)
            | Waited::TimedOut(job) => Some(job),
            Waited::NotFound => None,
        }
    }
}

impl Queue {
    /// Waits up to `timeout` for job `id` to end, and says how it stands:
    /// [`Waited::Succeeded`], [`Waited::Dead`] or [`Waited::Cancelled`] as
    /// soon as it ends, [`Waited::NotFound`] if there is no such job (never
    /// enqueued, or pruned), or [`Waited::TimedOut`] with the job as it was
    /// when `timeout` ran out. A zero `timeout` reads it once.
    ///
    /// It watches for commits before it reads the job, so an end that
    /// commits in between is not missed, and it sees every process's
    /// outcomes: on SQLite at the commit (the file's change notifications),
    /// on a server engine within 50 ms (the waiter reads its job again
    /// that often while nothing wakes it). Each waiting call holds a
    /// watcher ([`crate::Manual::watcher`]) and reads one row per wake-up:
    /// fine for the jobs a program awaits, not a way to follow thousands.
    ///
    /// A dead job is an answer, not an error: its [`Job::last_error`] says
    /// why. `Err` is kept for a queue that cannot be read.
    ///
    /// ```
    /// # fn main() -> tickler::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let queue = tickler::Queue::open(dir.path().join("jobs.db"))?;
    /// let id = queue.enqueue(tickler::NewJob::new("export"))?;
    /// // No worker runs it here: the wait ends with the job still pending.
    /// match queue.wait(id, std::time::Duration::from_millis(10))? {
    ///     tickler::Waited::TimedOut(job) => assert_eq!(job.state, tickler::JobState::Pending),
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// The engine's read errors ([`Error::Sqlite`], [`Error::Busy`], a
    /// server's error), and the watcher's.
    pub fn wait(&self, id: JobId, timeout: Duration) -> Result<Waited> {
        self.wait_unless(id, timeout, &AtomicBool::new(false))
    }

    /// [`Queue::wait`], which stops within one poll once `given_up` is set
    /// (its answer then is the job as it stood, unread by anyone): the
    /// async wait's future sets it when dropped, so a wait a caller gave
    /// up on does not keep a thread of tokio's blocking pool until its
    /// timeout, which a runtime's shutdown would wait for.
    pub(crate) fn wait_unless(
        &self,
        id: JobId,
        timeout: Duration,
        given_up: &AtomicBool,
    ) -> Result<Waited> {
        let deadline = Instant::now().checked_add(timeout);
        // Before the first read: a commit between the two is seen.
        let mut watcher = self.watcher()?;
        loop {
            let job = match self.get(id) {
                Ok(job) => job,
                Err(Error::NotFound(_)) => return Ok(Waited::NotFound),
                Err(e) => return Err(e),
            };
            match job.state {
                JobState::Succeeded => return Ok(Waited::Succeeded(job)),
                JobState::Dead => return Ok(Waited::Dead(job)),
                JobState::Cancelled => return Ok(Waited::Cancelled(job)),
                _ => {}
            }
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() || given_up.load(Ordering::SeqCst) {
                return Ok(Waited::TimedOut(job));
            }
            watcher.wait(left.min(WAIT_POLL), WAIT_POLL)?;
        }
    }
}
