//! The reaper thread: takes back jobs whose lease ran out and, if asked,
//! prunes finished jobs. It calls [`Queue::reap_at`] (the two-look rule,
//! with the time its clock-step check read) and [`Queue::prune`] on a
//! timer, through the public API; the rules live with them in
//! `src/queue/reap.rs`, the conditional updates in each engine.
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
    /// After the wall clock jumps forward (NTP stepping the clock of a box
    /// without a real-time clock), take nothing back for this long (default
    /// 15 s), measured on the monotonic clock. Leases are wall-clock
    /// timestamps, so right after a forward step every live lease looks
    /// expired; holders renew theirs from the new time at their next
    /// heartbeat. Set it to at least the longest heartbeat interval of the
    /// pools on the file (a third of the lease by default).
    ///
    /// **Backward steps** need no hold and no setting. Leases are granted
    /// from the wall clock, so after the clock is set back by X every lease
    /// granted before the step looks X longer. Each pass of
    /// [`Manual::reap`](crate::Manual::reap) therefore treats a lease whose
    /// expiry lies further ahead than its own length (the length of its claim
    /// or of its latest heartbeat) plus
    /// [`BACKWARD_STEP_MARGIN`](crate::BACKWARD_STEP_MARGIN) (2 s) as expiring
    /// one lease length from now: an abandoned job is taken back one lease
    /// length after the step (not X later), while a live holder's next
    /// heartbeat renews its lease from the new time as usual. Steps back of
    /// less than the margin are left alone (they delay a take-back by at most
    /// the margin). This is judged from the stored leases alone, so a reaper
    /// started after the step (a reboot) applies it too.
    pub clock_step_hold: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval: Duration::from_secs(1),
            prune_finished_after: None,
            clock_step_hold: Duration::from_secs(15),
        }
    }
}

/// Forward jumps of the wall clock smaller than this are scheduling noise.
const CLOCK_STEP_THRESHOLD: Duration = Duration::from_secs(2);

/// A running reaper thread. Stops when [`Reaper::stop`] is called or it is
/// dropped.
#[derive(Debug)]
pub struct Reaper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts a thread that calls [`Manual::reap_at`](crate::Manual::reap_at)
    /// (and [`Queue::prune`] if configured) every `config.interval`. Errors are
    /// logged and the next pass tries again.
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
    let mut last = (queue.clock().now_ms(), Instant::now());
    let mut hold_until: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let now = (queue.clock().now_ms(), Instant::now());
        let wall_ms = now.0.saturating_sub(last.0);
        let mono_ms = i64::try_from(now.1.duration_since(last.1).as_millis()).unwrap_or(i64::MAX);
        last = now;
        let jump_ms = wall_ms.saturating_sub(mono_ms);
        if jump_ms > CLOCK_STEP_THRESHOLD.as_millis() as i64 {
            log::warn!(
                "wall clock jumped forward {jump_ms} ms; reaper holds off {:?} so live holders can renew their leases",
                config.clock_step_hold
            );
            hold_until = Some(now.1 + config.clock_step_hold);
        }
        if hold_until.is_some_and(|until| now.1 < until) {
            // Still inside the hold after a clock step.
        } else {
            hold_until = None;
            // Judged against the time the step check saw, not a time read
            // after waiting for the write lock (a step in between would
            // otherwise go unseen for this pass).
            match queue.manual().reap_at(crate::clock::ms_to_datetime(now.0)) {
                Ok(0) => {}
                Ok(n) => log::info!("reaper took back {n} job(s) with expired leases"),
                Err(e) => log::error!("reaper pass failed: {e}"),
            }
        }
        if let Some(age) = config.prune_finished_after {
            // An age beyond the calendar means "keep forever".
            let cutoff = chrono::Duration::from_std(age)
                .ok()
                .and_then(|age| queue.clock().now().checked_sub_signed(age));
            match cutoff.map_or(Ok(0), |cutoff| queue.prune(cutoff)) {
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
