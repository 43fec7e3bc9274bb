//! The heartbeat thread: renews the leases of running jobs, notices lost
//! leases, sets timeouts' cancellation flags, and writes off threads stuck
//! past their timeout.

use super::context::CancelReason;
use super::execute::start_worker;
use super::in_flight::{entry_of, InFlight, RunState};
use super::shared::{lock, Shared};
use crate::engine::types::Outcome;
use crate::events::JobEventKind;
use crate::lease::Lease;
use crate::queue::ChangeWatcher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Fails, as timed out, every job whose handler is still running its
/// timeout plus the pool's grace after it started, and writes its thread
/// off: no more heartbeats for it, its slot goes to a replacement thread
/// (up to the pool's bound), and whatever the handler returns later is
/// dropped. A task is aborted instead (see `task_to_abort`), also one
/// still running the grace after its lease was lost. A handler
/// completing its job itself (`complete_with` under way) is left to
/// finish.
fn write_off_stuck(shared: &Arc<Shared>, now: Instant) {
    let grace = shared.timeout_grace;
    let mut stuck = Vec::new();
    // Aborted (and their slots freed) once the in-flight lock is let go:
    // a dropped task sends its refused hand-back under that lock.
    #[cfg(feature = "tokio")]
    let mut aborted = Vec::new();
    {
        let mut in_flight = shared.lock_in_flight();
        for job in in_flight.values_mut() {
            #[cfg(feature = "tokio")]
            if job.task.is_some() {
                if let Some(abort) = task_to_abort(shared, job, now) {
                    aborted.push(abort);
                }
                continue;
            }
            let overdue = job.deadline.is_some_and(|d| now >= d + grace);
            if !overdue || job.finishing || job.completion.started() {
                continue;
            }
            let Some((thread_id, name)) = job.thread.clone() else {
                continue;
            };
            let replace = shared
                .replaced
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < shared.max_replacements).then_some(n + 1)
                })
                .is_ok();
            let to = if replace {
                RunState::REPLACED
            } else {
                RunState::KEPT
            };
            if !job.run.write_off(to) {
                // The handler returned just now.
                if replace {
                    shared.replaced.fetch_sub(1, Ordering::SeqCst);
                }
                continue;
            }
            job.finishing = true;
            job.cancel.set(CancelReason::Timeout);
            // Before the in-flight lock is let go: the handler may return
            // at once, and it takes its thread back out of the set.
            lock(&shared.stuck).insert(thread_id);
            timed_out(job, grace, &format!("thread {name} written off"));
            stuck.push((job.lease.clone(), name, replace));
        }
    }
    for (lease, name, replace) in stuck {
        let timeout = lease.timeout.unwrap_or_default();
        log::warn!(
            "job {} ({}) is still running on thread {name} {grace:?} after its timeout of {timeout:?}; \
             failing it as timed out and writing the thread off ({})",
            lease.job_id,
            lease.kind,
            if replace {
                "a replacement thread starts"
            } else {
                "replacement bound reached: the pool runs one thread short until it returns"
            }
        );
        if replace {
            let n = shared.replaced.load(Ordering::SeqCst);
            start_worker(shared, format!("tickler-worker-r{n}"));
            shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
        }
        shared.wake_dispatchers();
    }
    #[cfg(feature = "tokio")]
    for (abort, lane) in aborted {
        if let Some(abort) = abort {
            abort.abort();
        }
        // Its slot is free now: should the task never reach an `.await`
        // (blocking its runtime thread), the lane goes on without it, as
        // a replacement thread stands in for a stuck one.
        lane.free();
    }
}

/// A task to write off now, if any: past its timeout plus the grace (its
/// job failed as timed out, the attempt counted), or past the grace
/// since its lease was lost (nothing to record: the lease is gone), in
/// either case deaf to `ctx.cancelled()`. Unlike a thread, a task can be
/// made to stop: it is aborted and ends at its next `.await`.
#[cfg(feature = "tokio")]
fn task_to_abort(
    shared: &Shared,
    job: &mut InFlight,
    now: Instant,
) -> Option<(
    Option<tokio::task::AbortHandle>,
    Arc<super::async_handlers::TaskLane>,
)> {
    let grace = shared.timeout_grace;
    if job.finishing || job.completion.started() {
        return None;
    }
    let task = job.task.as_mut()?;
    let lost = job.cancel.get() == Some(CancelReason::LeaseLost);
    if lost {
        task.lost_at.get_or_insert(now);
    }
    let overdue = job.deadline.is_some_and(|d| now >= d + grace);
    let lost_long = task.lost_at.is_some_and(|at| now >= at + grace);
    if !(overdue || lost_long) || !job.run.write_off(RunState::KEPT) {
        return None;
    }
    job.finishing = true;
    let task = job.task.as_ref()?;
    let written_off = (task.abort.clone(), Arc::clone(&task.lane));
    if lost {
        log::warn!(
            "job {} ({}): its task ran on {grace:?} after its lease was lost; aborting it",
            job.lease.job_id,
            job.lease.kind
        );
    } else {
        job.cancel.set(CancelReason::Timeout);
        log::warn!(
            "job {} ({}) is still running on its task {grace:?} after its timeout of {:?}; failing it as timed out and aborting the task at its next await",
            job.lease.job_id,
            job.lease.kind,
            job.lease.timeout.unwrap_or_default()
        );
        timed_out(job, grace, "its task aborted");
    }
    Some(written_off)
}

/// Sends the timeout of a run written off. Under the in-flight lock: a
/// handler that returns at once learns it was written off, and sends its
/// refused hand-back under the same lock, after this; the other way round
/// the hand-back would be recorded first, the job pending again with its
/// attempt given back.
fn timed_out(job: &InFlight, grace: Duration, written_off: &str) {
    let timeout = job.lease.timeout.unwrap_or_default();
    let error = format!(
        "timed out after {timeout:?}: the handler did not stop within {grace:?} of its cancellation ({written_off})"
    );
    let _ = job
        .outcomes
        .send((job.lease.clone(), Outcome::TimedOut(error)));
}

/// How long after a handler started its start is recorded in the job's
/// row, so that a crash from then on counts the attempt (before, the run
/// is given back uncounted, see `Manual::record_and_claim_ahead`). Short
/// runs finish first and cost no write; a start is written at most this
/// late, in one transaction with the others due.
pub(crate) const START_RECORD_DELAY: Duration = Duration::from_secs(1);

/// How often the heartbeat stores the progress handlers reported: a
/// handler may report in a tight loop, and what it says between two
/// stores costs no write.
pub(crate) const PROGRESS_STORE_INTERVAL: Duration = Duration::from_millis(500);

/// A report a run made and the pool has not stored yet.
pub(super) struct Unstored {
    lease: Lease,
    fraction: f64,
    message: String,
    cell: Arc<super::context::ProgressCell>,
    number: u64,
}

/// The reports of the runs of `jobs` not stored yet (read under the
/// in-flight lock, stored after it is let go); runs whose handler is
/// completing the job itself (it stores its last report first) or that
/// lost their lease are passed over.
pub(super) fn unstored_progress<'a>(jobs: impl Iterator<Item = &'a InFlight>) -> Vec<Unstored> {
    jobs.filter(|job| {
        !job.completion.started() && job.cancel.get() != Some(CancelReason::LeaseLost)
    })
    .filter_map(|job| {
        job.progress
            .unstored()
            .map(|(fraction, message, number)| Unstored {
                lease: job.lease.clone(),
                fraction,
                message,
                cell: Arc::clone(&job.progress),
                number,
            })
    })
    .collect()
}

/// Stores `reports` in one write; only once it committed do they count as
/// stored (a failed write is made again with the next reports, or before
/// the outcome).
pub(super) fn store_progress(shared: &Shared, reports: &[Unstored]) {
    if reports.is_empty() {
        return;
    }
    let updates: Vec<(&Lease, f64, &str)> = reports
        .iter()
        .map(|r| (&r.lease, r.fraction, r.message.as_str()))
        .collect();
    match shared.queue.manual().record_progress(&updates) {
        Ok(()) => {
            for report in reports {
                report.cell.stored(report.number);
            }
        }
        Err(e) => log::warn!(
            "storing the progress of {} job(s) failed: {e}",
            updates.len()
        ),
    }
}

/// Records the starts of the handlers that have run `START_RECORD_DELAY`.
fn record_starts(shared: &Shared, now: Instant) {
    let due: Vec<Lease> = {
        let mut in_flight = shared.lock_in_flight();
        in_flight
            .values_mut()
            .filter(|job| {
                // Not a job whose handler is completing it: that
                // transaction keeps its row locked (see the heartbeat).
                !job.start_recorded
                    && !job.finishing
                    && !job.completion.started()
                    && job
                        .started
                        .is_some_and(|at| now.duration_since(at) >= START_RECORD_DELAY)
            })
            .map(|job| {
                job.start_recorded = true;
                job.lease.clone()
            })
            .collect()
    };
    if due.is_empty() {
        return;
    }
    let refs: Vec<&Lease> = due.iter().collect();
    if let Err(e) = shared.queue.manual().mark_started(&refs) {
        log::warn!(
            "recording the start of {} job(s) failed: {e}; should this process die during their runs, their attempts are given back",
            due.len()
        );
    }
}

/// How often the heartbeat thread looks for leases lost between heartbeats
/// (a cancel, a reap), when any commit happened since the last look: how
/// soon a handler learns that its job was cancelled.
const LOST_LEASE_CHECK: Duration = Duration::from_millis(100);

pub(super) fn heartbeat_loop(shared: &Arc<Shared>, interval: Duration, mut watcher: ChangeWatcher) {
    let tick = interval.min(LOST_LEASE_CHECK);
    let mut next_beat = Instant::now() + interval;
    let mut next_progress = Instant::now() + PROGRESS_STORE_INTERVAL;
    loop {
        if shared.stop_background.load(Ordering::SeqCst) && shared.lock_in_flight().is_empty() {
            return;
        }
        // Idle means idle: with nothing in flight, sleep a whole
        // interval instead of ticking every 100 ms; the flag is set before
        // looking, so a claim in between unparks us (`wake_heartbeat`).
        shared.heartbeat_idle.store(true, Ordering::SeqCst);
        let idle = shared.lock_in_flight().is_empty();
        if !idle {
            // Busy: claims must not wake it (a busy pool claims hundreds of
            // times a second, and each wake-up reads every in-flight lease).
            shared.heartbeat_idle.store(false, Ordering::SeqCst);
        }
        std::thread::park_timeout(if idle { interval } else { tick });
        shared.heartbeat_idle.store(false, Ordering::SeqCst);
        notice_lost_leases(shared, &mut watcher);
        let now = Instant::now();
        record_starts(shared, now);
        if now >= next_progress {
            next_progress = now + PROGRESS_STORE_INTERVAL;
            let reports = unstored_progress(
                shared
                    .lock_in_flight()
                    .values()
                    .filter(|job| !job.finishing),
            );
            store_progress(shared, &reports);
        }
        write_off_stuck(shared, now);
        let leases: Vec<Lease> = {
            let in_flight = shared.lock_in_flight();
            for job in in_flight.values() {
                if job.deadline.is_some_and(|d| now >= d) {
                    job.cancel.set(CancelReason::Timeout);
                }
            }
            if now < next_beat {
                continue;
            }
            in_flight
                .values()
                // Not a job whose handler is completing it (`complete_with`):
                // that transaction keeps the job's row locked while the
                // application's writes run, and a heartbeat waiting for
                // the lock would renew none of the other leases, which then
                // run out. Should the completion fail, the next beat
                // renews the lease again.
                .filter(|job| {
                    !job.finishing
                        && !job.completion.started()
                        && job.cancel.get() != Some(CancelReason::LeaseLost)
                })
                .map(|job| job.lease.clone())
                .collect()
        };
        next_beat = now + interval;
        if leases.is_empty() {
            continue;
        }
        let refs: Vec<&Lease> = leases.iter().collect();
        match shared.queue.manual().heartbeat_many(&refs, shared.lease) {
            Ok(results) => {
                let mut in_flight = shared.lock_in_flight();
                for (lease, result) in leases.iter().zip(results) {
                    if let Err(e) = result {
                        if let Some(job) = entry_of(&mut in_flight, lease) {
                            // A failed renewal of a job whose handler is
                            // completing it is that completion's commit;
                            // if the completion fails instead, the next
                            // heartbeat fails again and reports it.
                            if !job.finishing && !job.completion.started() {
                                log::warn!("job {}: {e}; cancelling its handler", lease.job_id);
                                job.cancel.set(CancelReason::LeaseLost);
                                shared.emit(lease, || JobEventKind::LeaseLost, None, None);
                            }
                        }
                    }
                }
            }
            Err(e) => log::error!("heartbeat of {} lease(s) failed: {e}", leases.len()),
        }
    }
}

/// Sets the cancellation flag ([`CancelReason::LeaseLost`]) of every
/// in-flight job whose lease is no longer held (cancelled, or reaped), as
/// soon as a commit is seen rather than at the next heartbeat, which may be
/// seconds away. One indexed read per in-flight job, and only after a
/// commit.
fn notice_lost_leases(shared: &Shared, watcher: &mut ChangeWatcher) {
    let watched = |job: &InFlight| {
        !job.finishing
            && !job.completion.started()
            && job.cancel.get() != Some(CancelReason::LeaseLost)
    };
    if !shared.lock_in_flight().values().any(watched) {
        return;
    }
    match watcher.changed() {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            log::error!("watching for cancelled jobs failed: {e}");
            return;
        }
    }
    let leases: Vec<Lease> = shared
        .lock_in_flight()
        .values()
        .filter(|job| watched(job))
        .map(|job| job.lease.clone())
        .collect();
    let refs: Vec<&Lease> = leases.iter().collect();
    match shared.queue.manual().leases_held(&refs) {
        Ok(held) => {
            let mut in_flight = shared.lock_in_flight();
            for (lease, held) in leases.iter().zip(held) {
                if held {
                    continue;
                }
                if let Some(job) = entry_of(&mut in_flight, lease) {
                    if watched(job) {
                        log::info!(
                            "job {} is no longer held by this pool (cancelled or reaped); cancelling its handler",
                            lease.job_id
                        );
                        job.cancel.set(CancelReason::LeaseLost);
                        shared.emit(lease, || JobEventKind::LeaseLost, None, None);
                    }
                }
            }
        }
        Err(e) => log::error!("checking {} lease(s) failed: {e}", leases.len()),
    }
}
