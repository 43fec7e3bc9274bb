//! The in-flight registry: one entry per claimed run, from its claim to
//! its recorded outcome, found by job id and run_token.

use super::context::{CancelFlag, ProgressCell, SelfCompletion};
use crate::engine::types::Outcome;
use crate::job::JobId;
use crate::lease::Lease;
use crossbeam_channel::Sender;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

/// Where one run of a handler is: running, ended, or written off by the
/// heartbeat thread as stuck past its timeout. Whoever moves it out of
/// `RUNNING` first decides what happens to the job.
#[derive(Debug, Default)]
pub(super) struct RunState(AtomicU8);

impl RunState {
    const RUNNING: u8 = 0;
    const ENDED: u8 = 1;
    /// Written off, and a replacement thread took its slot.
    pub(super) const REPLACED: u8 = 2;
    /// Written off, no replacement (the bound was reached): the thread
    /// keeps its slot until the handler returns.
    pub(super) const KEPT: u8 = 3;

    pub(super) fn end(&self) -> std::result::Result<(), u8> {
        self.0
            .compare_exchange(
                Self::RUNNING,
                Self::ENDED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map(|_| ())
    }

    pub(super) fn write_off(&self, to: u8) -> bool {
        self.0
            .compare_exchange(Self::RUNNING, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// The in-flight entry of this very run of the job (same run_token), never
/// that of a later run: a job can fail and be claimed again while a
/// heartbeat or outcome of its earlier run is still on its way.
pub(super) fn entry_of<'a>(
    in_flight: &'a mut HashMap<JobId, InFlight>,
    lease: &Lease,
) -> Option<&'a mut InFlight> {
    in_flight
        .get_mut(&lease.job_id)
        .filter(|job| job.lease.run_token == lease.run_token)
}

pub(super) fn remove_run(in_flight: &mut HashMap<JobId, InFlight>, lease: &Lease) {
    if entry_of(in_flight, lease).is_some() {
        in_flight.remove(&lease.job_id);
    }
}

pub(super) struct InFlight {
    pub(super) lease: Lease,
    pub(super) cancel: Arc<CancelFlag>,
    /// Set by the worker when the handler starts and the job has a timeout.
    pub(super) deadline: Option<Instant>,
    /// The handler returned; the dispatcher is writing the outcome, so the
    /// heartbeat leaves this job alone.
    pub(super) finishing: bool,
    /// Whether the handler completed the job itself
    /// (`JobContext::complete_with`); the heartbeat leaves it alone then.
    pub(super) completion: Arc<SelfCompletion>,
    pub(super) run: Arc<RunState>,
    /// The worker thread running the handler (set when it starts).
    pub(super) thread: Option<(ThreadId, Arc<str>)>,
    /// The run is a task on the application's runtime (set as it is
    /// spawned).
    #[cfg(feature = "tokio")]
    pub(super) task: Option<TaskSlot>,
    /// Where this run's outcomes go: its lane's dispatcher, the only one
    /// that records them, so that they are recorded in the order sent.
    pub(super) outcomes: Sender<(Lease, Outcome)>,
    /// What the handler last reported (`JobContext::progress`), until
    /// the heartbeat stores it.
    pub(super) progress: Arc<ProgressCell>,
    /// When the handler started.
    pub(super) started: Option<Instant>,
    /// The start is recorded in the job's row (`Manual::mark_started`), or
    /// being recorded: from then on, a crash counts the attempt.
    pub(super) start_recorded: bool,
}

/// A run that is a task: its lane (whose slot it holds), how to abort it,
/// and since when its lease is known lost.
#[cfg(feature = "tokio")]
pub(super) struct TaskSlot {
    pub(super) lane: Arc<super::async_handlers::TaskLane>,
    pub(super) abort: Option<tokio::task::AbortHandle>,
    pub(super) lost_at: Option<Instant>,
}
