//! Where outcomes are written: batches of finished jobs recorded in one
//! transaction (with the dispatcher's next claim), their events and log
//! lines, and the deferred fsync of what was recorded.

use super::context::CancelReason;
use super::in_flight::{entry_of, remove_run};
use super::shared::Shared;
use crate::engine::types::{ClaimRequest, Outcome, OutcomeSync};
use crate::error::Error;
use crate::events::JobEventKind;
use crate::job::JobId;
use crate::lease::Lease;
use crate::queue::Queue;
use crossbeam_channel::Receiver;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Most outcomes written in one dispatcher transaction.
const MAX_OUTCOME_BATCH: usize = 512;

/// Outcomes committed without an fsync ([`OutcomeSync::Deferred`]), so
/// that claims never wait behind one; they are synced within
/// `outcome_sync_interval` by [`Queue::sync`], which fsyncs the log outside
/// SQLite's write lock.
pub(super) struct UnsyncedOutcomes {
    interval: Duration,
    since: Option<Instant>,
}

impl UnsyncedOutcomes {
    pub(super) fn new(interval: Duration) -> Self {
        UnsyncedOutcomes {
            interval,
            since: None,
        }
    }

    fn recorded(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// `wait`, shortened so the sleeper wakes when a sync is due.
    pub(super) fn cap(&self, wait: Duration) -> Duration {
        match self.since {
            Some(since) => {
                wait.min((since + self.interval).saturating_duration_since(Instant::now()))
            }
            None => wait,
        }
    }

    pub(super) fn sync_if_due(&mut self, queue: &Queue, force: bool) {
        if let Some(since) = self.since {
            if force || since.elapsed() >= self.interval {
                if let Err(e) = queue.sync() {
                    log::error!("syncing recorded outcomes failed: {e}; the next commit retries");
                    return;
                }
                self.since = None;
            }
        }
    }
}

/// Finished jobs waiting to be recorded, without blocking.
pub(super) fn take_outcomes(
    shared: &Shared,
    outcomes: &Receiver<(Lease, Outcome)>,
) -> Vec<(Lease, Outcome)> {
    take_outcomes_from(shared, None, outcomes)
}

/// Marks each finished job as finishing (the heartbeat leaves it alone) and
/// drops, with a warning, the outcome of any job whose lease was lost.
pub(super) fn take_outcomes_from(
    shared: &Shared,
    first: Option<(Lease, Outcome)>,
    outcomes: &Receiver<(Lease, Outcome)>,
) -> Vec<(Lease, Outcome)> {
    let batch: Vec<(Lease, Outcome)> = first
        .into_iter()
        .chain(outcomes.try_iter())
        .take(MAX_OUTCOME_BATCH)
        .collect();
    if batch.is_empty() {
        return batch;
    }
    let mut in_flight = shared.lock_in_flight();
    for (lease, outcome) in &batch {
        let lost = entry_of(&mut in_flight, lease).is_some_and(|job| {
            job.finishing = true;
            job.cancel.get() == Some(CancelReason::LeaseLost)
        });
        if lost {
            // Still sent to the queue: refused there (fenced), it tells a
            // cancelled job's unique_key that its holder has stopped.
            log::warn!(
                "job {} lost its lease while running (reaped or cancelled); its outcome {outcome:?} is refused",
                lease.job_id
            );
        }
    }
    batch
}

/// Writes outcomes (and claims, if asked) in one transaction, retrying
/// transient failures a few times: a lost outcome means the job runs again.
/// Returns the claimed leases, or `None` if the transaction failed.
pub(super) fn record(
    shared: &Shared,
    finished: &[(Lease, Outcome)],
    claim: Option<&ClaimRequest<'_>>,
    worker_id: &str,
    unsynced: &mut UnsyncedOutcomes,
) -> Option<Vec<Lease>> {
    // The last progress a finished run reported, before its outcome ends
    // the lease that fences it.
    let reports = {
        let in_flight = shared.lock_in_flight();
        super::heartbeat::unstored_progress(finished.iter().filter_map(|(lease, _)| {
            in_flight
                .get(&lease.job_id)
                .filter(|job| job.lease.run_token == lease.run_token)
        }))
    };
    super::heartbeat::store_progress(shared, &reports);
    let outcomes: Vec<(&Lease, Outcome)> = finished.iter().map(|(l, o)| (l, o.clone())).collect();
    // Runs already known to have lost their lease were reported when taken.
    let (known_lost, run_times): (HashSet<JobId>, Vec<Option<Duration>>) = {
        let mut in_flight = shared.lock_in_flight();
        let known_lost = finished
            .iter()
            .filter(|(lease, _)| {
                entry_of(&mut in_flight, lease)
                    .is_some_and(|job| job.cancel.get() == Some(CancelReason::LeaseLost))
            })
            .map(|(lease, _)| lease.job_id)
            .collect();
        let run_times = finished
            .iter()
            .map(|(lease, _)| {
                entry_of(&mut in_flight, lease)
                    .and_then(|job| job.started)
                    .map(|at| at.elapsed())
            })
            .collect();
        (known_lost, run_times)
    };
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    let result = loop {
        match shared
            .queue
            .manual()
            .record_and_claim_ahead(&outcomes, claim, OutcomeSync::Deferred)
        {
            Err(e) if tries < 5 && (e.is_busy() || matches!(e, Error::DiskFull)) => {
                log::warn!("worker {worker_id}: write failed: {e}; retrying");
                std::thread::sleep(pause);
                pause *= 2;
                tries += 1;
            }
            other => break other,
        }
    };
    let mut in_flight = shared.lock_in_flight();
    for (lease, _) in finished {
        remove_run(&mut in_flight, lease);
    }
    drop(in_flight);
    match result {
        Ok((results, leases)) => {
            if !finished.is_empty() {
                unsynced.recorded();
            }
            for (((lease, outcome), result), run_time) in
                finished.iter().zip(results).zip(run_times)
            {
                match result {
                    Err(e) if e.is_lease_lost() && known_lost.contains(&lease.job_id) => {
                        crate::observe::finished(lease, "lease_lost", run_time);
                    }
                    // A hand-back of a run that already lost its lease:
                    // nothing was lost (said when the run was let go).
                    Err(e) if e.is_lease_lost() && *outcome == Outcome::Release => {}
                    Err(e) => {
                        log::warn!("outcome {outcome:?} of job {} refused: {e}", lease.job_id);
                        if e.is_lease_lost() {
                            crate::observe::finished(lease, "lease_lost", run_time);
                            shared.emit(lease, || JobEventKind::LeaseLost, None, run_time);
                        }
                    }
                    Ok(()) => recorded(shared, lease, outcome, run_time),
                }
            }
            Some(leases)
        }
        Err(e) => {
            log::error!(
                "worker {worker_id}: {} outcome(s) not recorded: {e}; the reaper will take those jobs back and they will run again",
                finished.len()
            );
            None
        }
    }
}

/// What a recorded outcome tells this pool's observers: its event, its
/// log line.
fn recorded(shared: &Shared, lease: &Lease, outcome: &Outcome, run_time: Option<Duration>) {
    let last = lease.attempt >= lease.max_attempts;
    let failure = match outcome {
        Outcome::FailPermanently(error) => Some((error, None)),
        Outcome::Fail(error) => Some((
            error,
            Some(shared.queue.retry_policy().backoff(lease.attempt)),
        )),
        Outcome::FailRetryAfter(error, delay) => Some((error, Some(*delay))),
        _ => None,
    };
    let what = match outcome {
        Outcome::Complete | Outcome::CompleteWith(_) => JobEventKind::Succeeded,
        Outcome::Fail(_) | Outcome::FailRetryAfter(..) | Outcome::FailPermanently(_) => {
            let Some((error, retry_in)) = failure else {
                return;
            };
            match retry_in.filter(|_| !last) {
                None => {
                    log::warn!(
                        "job {} ({}, queue {}) is dead after attempt {} of {}: {error}",
                        lease.job_id,
                        lease.kind,
                        lease.queue,
                        lease.attempt,
                        lease.max_attempts
                    );
                    JobEventKind::Dead {
                        error: error.clone(),
                    }
                }
                Some(retry_in) => {
                    log::info!(
                        "job {} ({}, queue {}) failed attempt {} of {}, retry in {retry_in:?}: {error}",
                        lease.job_id,
                        lease.kind,
                        lease.queue,
                        lease.attempt,
                        lease.max_attempts
                    );
                    JobEventKind::Failed {
                        error: error.clone(),
                        retry_in,
                    }
                }
            }
        }
        Outcome::Snooze(until) => JobEventKind::Snoozed { until: *until },
        Outcome::TimedOut(error) => {
            if last {
                log::warn!(
                    "job {} ({}, queue {}) is dead after attempt {} of {} timed out: {error}",
                    lease.job_id,
                    lease.kind,
                    lease.queue,
                    lease.attempt,
                    lease.max_attempts
                );
            }
            JobEventKind::TimedOut { dead: last }
        }
        // Handed back unstarted: no transition of the job's own.
        Outcome::Release => return,
    };
    let label = match &what {
        JobEventKind::Succeeded => "succeeded",
        JobEventKind::Failed { .. } => "failed",
        JobEventKind::Dead { .. } => "dead",
        JobEventKind::Snoozed { .. } => "snoozed",
        _ => "timed_out",
    };
    crate::observe::finished(lease, label, run_time);
    shared.emit(lease, || what, None, run_time);
}
