//! What the pool's threads share ([`Shared`]), and the small helpers they
//! all use: a lock that survives poisoning, named threads.

use super::handler::RunJob;
use super::in_flight::InFlight;
use super::prefetch::RunTime;
use crate::engine::types::Outcome;
use crate::events::{Event, EventHub, JobEvent, JobEventKind};
use crate::job::JobId;
use crate::lease::Lease;
use crate::queue::{Queue, Waker};
use crate::retry::RetryPolicy;
use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

pub(super) struct Shared {
    pub(super) queue: Queue,
    pub(super) handlers: HashMap<String, Arc<dyn RunJob>>,
    /// Per-kind backoff (`WorkerPoolBuilder::retry_policy_for`).
    pub(super) retry_policies: HashMap<String, RetryPolicy>,
    /// Jobs claimed and not yet finished; the heartbeat renews these.
    pub(super) in_flight: Mutex<HashMap<JobId, InFlight>>,
    /// Worker slots taken: jobs claimed whose handler has not returned.
    pub(super) busy_slots: AtomicUsize,
    pub(super) stopping: AtomicBool,
    pub(super) stop_background: AtomicBool,
    pub(super) fetcher_waker: Waker,
    pub(super) lease: Duration,
    /// The heartbeat thread sleeps a whole heartbeat interval (not
    /// `LOST_LEASE_CHECK`) while nothing is in flight; whoever adds a job
    /// to `in_flight` then unparks it (`Shared::wake_heartbeat`).
    pub(super) heartbeat_idle: AtomicBool,
    pub(super) heartbeat_thread: std::sync::OnceLock<std::thread::Thread>,
    /// For worker threads started later (replacements).
    pub(super) jobs: Receiver<Lease>,
    /// The worker threads' lane's outcomes (each task lane has its own).
    pub(super) outcomes: Sender<(Lease, Outcome)>,
    /// Claims that committed after shutdown began and were handed back by
    /// a task lane (the worker threads' are counted by `shutdown`).
    pub(super) released_late: AtomicUsize,
    /// Every worker thread started, replacements too.
    pub(super) workers: Mutex<Vec<JoinHandle<()>>>,
    /// Threads written off: their handler ran past its timeout plus the
    /// grace and has not returned.
    pub(super) stuck: Mutex<HashSet<ThreadId>>,
    /// Replacement threads started so far.
    pub(super) replaced: AtomicUsize,
    pub(super) max_replacements: usize,
    pub(super) timeout_grace: Duration,
    /// Leases taken off the job channel so far: by workers, and by the
    /// dispatcher handing back those that waited past the holding time.
    pub(super) received: AtomicU64,
    /// How long handlers run, for what to claim ahead.
    pub(super) run_time: RunTime,
    /// Jobs handed back for waiting past the holding time.
    pub(super) handed_back: AtomicUsize,
    /// Dispatchers that may still claim: each counts itself out once it
    /// has seen `stopping` (every lease it claimed is in the job channel,
    /// with a worker or spawned as a task by then) or its thread ended.
    pub(super) claimers: AtomicUsize,
    /// Wakes every dispatcher (one per lane).
    pub(super) wakers: Vec<Waker>,
    /// The slots of async handlers' runs.
    #[cfg(feature = "tokio")]
    pub(super) task_lanes: Vec<Arc<super::async_handlers::TaskLane>>,
    /// Set by `shutdown` when it takes the unstarted leases out of the job
    /// channel. A claim that commits after shutdown began sends its leases
    /// to the channel while this is unset (shutdown then hands them back
    /// and counts them), and hands them back itself once it is set.
    pub(super) channel_taken: Mutex<bool>,
    /// This pool's subscribers (`WorkerPool::subscribe`); the queue's get
    /// the same events.
    pub(super) events: EventHub,
}

impl Shared {
    /// Sends a job's event to this pool's and its queue's subscribers;
    /// builds nothing when no one listens or every buffer is full.
    pub(super) fn emit(
        &self,
        lease: &Lease,
        what: impl FnOnce() -> JobEventKind,
        queue_time: Option<Duration>,
        run_time: Option<Duration>,
    ) {
        let (pool, queue) = (self.events.offer(), self.queue.events().offer());
        if !pool && !queue {
            return;
        }
        let event = Event::Job(JobEvent {
            what: what(),
            job_id: lease.job_id,
            kind: lease.kind.clone(),
            queue: lease.queue.clone(),
            attempt: Some(lease.attempt),
            queue_time,
            run_time,
            at: self.queue.clock().now(),
        });
        if pool && queue {
            self.events.emit(event.clone());
        }
        if pool && !queue {
            self.events.emit(event);
        } else {
            self.queue.events().emit(event);
        }
    }

    /// Ends an idle heartbeat thread's long sleep: a job is in flight now,
    /// and its cancellation and timeout are watched every 100 ms.
    pub(super) fn wake_heartbeat(&self) {
        if self.heartbeat_idle.load(Ordering::SeqCst) {
            if let Some(thread) = self.heartbeat_thread.get() {
                thread.unpark();
            }
        }
    }

    pub(super) fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, InFlight>> {
        lock(&self.in_flight)
    }

    #[cfg(feature = "tokio")]
    /// Every outcome sent so far is recorded (or refused): no lane's
    /// channel holds one and no dispatcher is writing one.
    pub(super) fn outcomes_recorded(&self) -> bool {
        #[cfg(feature = "tokio")]
        if self.task_lanes.iter().any(|lane| !lane.outcomes.is_empty()) {
            return false;
        }
        self.outcomes.is_empty() && !self.lock_in_flight().values().any(|job| job.finishing)
    }

    pub(super) fn wake_dispatchers(&self) {
        for waker in &self.wakers {
            waker.wake();
        }
    }

    /// Every run has ended: worker threads (but those written off as
    /// stuck) and tasks.
    pub(super) fn runs_over(&self) -> bool {
        #[cfg(feature = "tokio")]
        if self
            .task_lanes
            .iter()
            .any(|lane| lane.busy.load(Ordering::SeqCst) > 0)
        {
            return false;
        }
        self.live_workers_finished()
    }

    /// Every worker thread has ended, but those written off as stuck.
    pub(super) fn live_workers_finished(&self) -> bool {
        let stuck = lock(&self.stuck);
        lock(&self.workers)
            .iter()
            .all(|w| w.is_finished() || stuck.contains(&w.thread().id()))
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .expect("spawning a worker pool thread")
}
