//! The scheduler thread: fires schedules' due ticks. The SQL and the tick
//! rules are in [`Queue::run_due_ticks`] (src/queue/schedules.rs); this module
//! only decides when to call it.
//!
//! It sleeps until the earliest `next_tick_at` of the active schedules (not
//! a poll once a second), woken early when this process changes a schedule
//! or any process commits to the file (a [`ChangeWatcher`]), and looks
//! again at least every `max_idle` in case the wall clock was stepped
//! (sleeps are measured on the monotonic clock, ticks on the wall clock).
//!
//! Any number of schedulers, in any number of processes, may run on one
//! file: each tick is enqueued by one transaction that also moves the
//! schedule past it, so a tick is enqueued once.

use crate::error::Result;
use crate::queue::{ChangeWatcher, Queue, Waker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Settings for a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Longest sleep without looking at the schedules (default 1 s): how
    /// soon a wall-clock step is noticed. One indexed read per look.
    pub max_idle: Duration,
    /// How often a sleeping scheduler checks for commits by other
    /// processes (`PRAGMA data_version`, default 100 ms): how soon a schedule
    /// changed by another process is seen. Changes made through this
    /// process's [`Queue`] wake it at once.
    pub poll: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_idle: Duration::from_secs(1),
            poll: Duration::from_millis(100),
        }
    }
}

/// A running scheduler thread: fires the due ticks of every schedule in
/// the file with [`Manual::run_due_ticks`](crate::Manual::run_due_ticks).
/// Stops when [`Scheduler::stop`] is called or it is dropped. A
/// [`WorkerPool`](crate::WorkerPool) starts one unless built with
/// `without_scheduler()`.
///
/// It sleeps until the earliest `next_tick_at` of the active schedules (no
/// poll once a second), woken at once when a schedule is changed through
/// this process's [`Queue`], within [`SchedulerConfig::poll`] when another
/// process commits, and at least every [`SchedulerConfig::max_idle`] to
/// notice a stepped wall clock (sleeps are measured on the monotonic clock,
/// ticks on the queue's [`Clock`](crate::Clock)). Any number of schedulers,
/// in any number of processes, may run on one file: a tick is enqueued once.
#[derive(Debug)]
pub struct Scheduler {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts a thread that fires due ticks with
    /// [`Manual::run_due_ticks`](crate::Manual::run_due_ticks) and sleeps until
    /// the next one. Errors are logged and retried with backoff (up to 5 s).
    ///
    /// # Errors
    /// [`Error::Sqlite`](crate::Error::Sqlite) if its watcher connection
    /// cannot be opened.
    pub fn spawn(queue: Queue, config: SchedulerConfig) -> Result<Scheduler> {
        let watcher = queue.manual().watcher()?;
        let waker = watcher.waker();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tickler-scheduler".into())
            .spawn(move || run(&queue, config, watcher, &stop_flag))
            .expect("spawning the scheduler thread");
        Ok(Scheduler {
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (at most one run of due ticks).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            self.waker.wake();
            let _ = thread.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(queue: &Queue, config: SchedulerConfig, mut watcher: ChangeWatcher, stop: &AtomicBool) {
    let poll = config.poll.max(Duration::from_millis(1));
    let max_idle = config.max_idle.max(Duration::from_millis(1));
    let mut error_pause = Duration::from_millis(50);
    while !stop.load(Ordering::SeqCst) {
        let next = match queue.manual().next_schedule_tick() {
            Ok(next) => next,
            Err(e) => {
                log::error!("scheduler: reading the next tick failed: {e}");
                pause(&mut watcher, &mut error_pause, poll);
                continue;
            }
        };
        let now = queue.clock().now();
        if next.is_some_and(|next| next <= now) {
            match queue.manual().run_due_ticks() {
                Ok(run) => {
                    error_pause = Duration::from_millis(50);
                    if !run.jobs.is_empty() {
                        log::debug!("scheduler enqueued {} tick job(s)", run.jobs.len());
                    }
                }
                Err(e) => {
                    log::error!("scheduler: firing due ticks failed: {e}");
                    pause(&mut watcher, &mut error_pause, poll);
                }
            }
            continue;
        }
        let until_tick = next.map_or(max_idle, |next| {
            (next - now)
                .to_std()
                .unwrap_or(Duration::ZERO)
                .clamp(Duration::from_millis(1), max_idle)
        });
        let deadline = Instant::now() + until_tick;
        match watcher.wait(until_tick, poll) {
            // A busy file commits often: after a wake-up by a commit, look
            // again after at most `poll`, and never past the tick.
            Ok(true) => sleep_until(Instant::now() + poll, deadline, stop),
            Ok(false) => {}
            Err(e) => {
                log::error!("scheduler: watching for changes failed: {e}");
                sleep_until(Instant::now() + poll, deadline, stop);
            }
        }
    }
}

/// Sleeps (monotonic) until the earlier of `a` and `b`, or until asked to stop.
fn sleep_until(a: Instant, b: Instant, stop: &AtomicBool) {
    let deadline = a.min(b);
    loop {
        let now = Instant::now();
        if now >= deadline || stop.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}

fn pause(watcher: &mut ChangeWatcher, error_pause: &mut Duration, poll: Duration) {
    let _ = watcher.wait(*error_pause, poll);
    *error_pause = (*error_pause * 2).min(Duration::from_secs(5));
}
