//! The reaper thread: takes back jobs whose lease ran out and, if asked,
//! prunes finished jobs. The SQL is [`Queue::reap`] and [`Queue::prune`];
//! this module only runs them on a timer.
//!
//! Any number of reapers, in any number of processes, may run on one file:
//! each take-back is a conditional update, so a job is taken back once and a
//! heartbeat that landed first wins.

use crate::queue::Queue;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Settings for a [`Reaper`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Time between two passes (default 1 s). A pass is one indexed query
    /// when nothing is stale.
    pub interval: Duration,
    /// Delete finished jobs (succeeded, dead, cancelled) this long after they
    /// finished; `None` (default) keeps them until pruned by hand.
    pub prune_finished_after: Option<Duration>,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval: Duration::from_secs(1),
            prune_finished_after: None,
        }
    }
}

/// A running reaper thread. Stops when [`Reaper::stop`] is called or it is
/// dropped.
#[derive(Debug)]
pub struct Reaper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts a thread that calls [`Queue::reap`] (and [`Queue::prune`] if
    /// configured) every `config.interval`. Errors are logged and the next
    /// pass tries again.
    pub fn spawn(queue: Queue, config: ReaperConfig) -> Reaper {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tickler-reaper".into())
            .spawn(move || run(&queue, config, &stop_flag))
            .expect("spawning the reaper thread");
        Reaper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and waits for it (at most one pass).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(queue: &Queue, config: ReaperConfig, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match queue.reap() {
            Ok(0) => {}
            Ok(n) => log::info!("reaper took back {n} job(s) with expired leases"),
            Err(e) => log::error!("reaper pass failed: {e}"),
        }
        if let Some(age) = config.prune_finished_after {
            let cutoff = queue.clock().now() - chrono::Duration::from_std(age).unwrap_or_default();
            match queue.prune(cutoff) {
                Ok(0) => {}
                Ok(n) => log::info!("reaper pruned {n} finished job(s)"),
                Err(e) => log::error!("prune failed: {e}"),
            }
        }
        let wake_at = Instant::now() + config.interval;
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= wake_at {
                break;
            }
            std::thread::park_timeout(wake_at - now);
        }
    }
}
