//! The dispatcher thread: where claims are asked for (together with the
//! writing of finished jobs' outcomes), and where it sleeps when nothing
//! is due.

use super::context::CancelFlag;
use super::in_flight::{remove_run, InFlight};
use super::outcomes::{record, take_outcomes, take_outcomes_from, UnsyncedOutcomes};
use super::prefetch::Ahead;
use super::shared::{lock, Shared};
use crate::engine::types::{ClaimRequest, Outcome};
use crate::lease::Lease;
use crate::queue::ChangeWatcher;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most jobs a task lane claims in one transaction (its slots may be
/// thousands): a batch this size is spawned and recorded while the next
/// is claimed, and the heartbeat's looks at every run in flight stay
/// short.
const TASK_CLAIM_MAX: usize = 256;

/// How often a stopping dispatcher looks whether the last worker ended.
const STOPPING_POLL: Duration = Duration::from_millis(10);

/// A pool's first claims that hand out jobs are synced (under
/// `Durability::Full`) before their jobs reach a handler. A claim commits
/// without a sync, and a run's start is synced about a second after it: a
/// handler that takes the machine down sooner (a kernel panic, a brown-out
/// on a Raspberry Pi) left no trace on disk, and could run again uncounted
/// after every reboot. A machine in such a loop restarts its pool each
/// time, and runs the job among the pool's first claims (the jobs ahead of
/// it finish and are synced, boot after boot, until it is): synced, its
/// run is found after the reboot with its holder gone, given back once,
/// and counted from its next start on (recorded before the handler, as
/// for every job given back) until the job is dead. Later claims are not
/// synced: a sync per claim would cost a busy pool a sync per few jobs.
const SYNCED_FIRST_CLAIMS: u32 = 32;

/// Counts one dispatcher out of `Shared::claimers` once it will claim no
/// more: when it sees `stopping`, or when its thread ends, however it
/// ends, so that `shutdown` never waits for a dispatcher that is gone.
pub(super) struct ClaimsOver<'a> {
    shared: &'a Shared,
    counted: std::cell::Cell<bool>,
}

impl<'a> ClaimsOver<'a> {
    pub(super) fn new(shared: &'a Shared) -> Self {
        ClaimsOver {
            shared,
            counted: std::cell::Cell::new(false),
        }
    }

    fn over(&self) {
        if !self.counted.replace(true) {
            self.shared.claimers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for ClaimsOver<'_> {
    fn drop(&mut self) {
        self.over();
    }
}

/// Where a dispatcher's claimed jobs go, and whose free slots bound what
/// it claims.
pub(super) enum Lane {
    /// To the pool's worker threads through the job channel (closed, by
    /// dropping it, when claims end): slots are the threads, plus jobs
    /// claimed ahead of them.
    Threads(Option<Sender<Lease>>),
    /// As tasks on the application's runtime (feature `tokio`): slots are
    /// the lane's own concurrency, and no thread waits for a task.
    #[cfg(feature = "tokio")]
    Tasks(Arc<super::async_handlers::TaskLane>),
}

impl Lane {
    fn busy(&self, shared: &Shared) -> usize {
        match self {
            Lane::Threads(_) => shared.busy_slots.load(Ordering::SeqCst),
            #[cfg(feature = "tokio")]
            Lane::Tasks(lane) => lane.busy.load(Ordering::SeqCst),
        }
    }

    /// Every run this lane started has ended (but threads written off).
    fn runs_over(&self, shared: &Shared) -> bool {
        match self {
            Lane::Threads(_) => shared.live_workers_finished(),
            #[cfg(feature = "tokio")]
            Lane::Tasks(lane) => lane.busy.load(Ordering::SeqCst) == 0,
        }
    }

    /// Where the outcomes of this lane's runs go.
    fn outcomes(&self, shared: &Shared) -> Sender<(Lease, Outcome)> {
        match self {
            Lane::Threads(_) => shared.outcomes.clone(),
            #[cfg(feature = "tokio")]
            Lane::Tasks(lane) => lane.outcomes.clone(),
        }
    }

    fn close(&mut self) {
        match self {
            Lane::Threads(jobs) => *jobs = None,
            #[cfg(feature = "tokio")]
            Lane::Tasks(_) => {}
        }
    }

    /// Hands a claimed run to its runner; its in-flight entry exists.
    fn deliver(&self, shared: &Arc<Shared>, lease: Lease) {
        match self {
            Lane::Threads(jobs) => {
                shared.busy_slots.fetch_add(1, Ordering::SeqCst);
                if let Some(jobs) = jobs {
                    let _ = jobs.send(lease);
                }
            }
            #[cfg(feature = "tokio")]
            Lane::Tasks(lane) => {
                lane.busy.fetch_add(1, Ordering::SeqCst);
                super::async_handlers::spawn_run(shared, lane, lease);
            }
        }
    }
}

pub(super) struct DispatchConfig {
    pub(super) outcome_sync_interval: Duration,
    pub(super) queues: Vec<String>,
    pub(super) kinds: Vec<String>,
    pub(super) worker_id: String,
    pub(super) threads: usize,
    pub(super) prefetch: usize,
    pub(super) prefetch_hold: Duration,
    pub(super) claim_batch: usize,
    pub(super) max_idle: Duration,
    pub(super) poll: Duration,
    pub(super) aging_every: usize,
}

/// The dispatcher: records finished jobs' outcomes and claims new jobs for
/// free slots, both in one transaction when there is work for both, so a
/// busy pool pays one commit per batch rather than two per job. When there
/// is nothing to record and nothing due it sleeps until the next due time,
/// woken early by commits (its watcher) and by workers finishing.
pub(super) fn dispatch_loop(
    shared: &Arc<Shared>,
    config: &DispatchConfig,
    mut watcher: ChangeWatcher,
    mut lane: Lane,
    outcomes: &Receiver<(Lease, Outcome)>,
) {
    let over = ClaimsOver::new(shared);
    let threads = matches!(lane, Lane::Threads(_));
    let mut queues: Vec<&str> = config.queues.iter().map(String::as_str).collect();
    let kinds: Vec<&str> = config.kinds.iter().map(String::as_str).collect();
    // Jobs claimed so far, for priority aging.
    let mut claimed = 0usize;
    let mut claiming = true;
    // After a claim that got all it asked for, more may be due; otherwise
    // ask the (cheap, lock-free) read path before taking the write lock.
    let mut more_may_be_due = true;
    let mut error_pause = Duration::from_millis(50);
    let mut unsynced = UnsyncedOutcomes::new(config.outcome_sync_interval);
    let mut ahead = Ahead::default();
    let hold = config.prefetch_hold;
    // Claimed by a claim that committed after shutdown began: handed back
    // with the next commit, never sent to a worker.
    let mut claimed_too_late: Vec<(Lease, Outcome)> = Vec::new();
    let mut synced_claims = 0;
    loop {
        unsynced.sync_if_due(&shared.queue, false);
        let stopping = shared.stopping.load(Ordering::SeqCst);
        if stopping && claiming {
            // Workers end once the job channel is closed and empty. A claim
            // that committed while shutdown began has been sent by now, so
            // shutdown can hand back all that is in the channel.
            claiming = false;
            lane.close();
            over.over();
        }
        let mut finished = take_outcomes(shared, outcomes);
        finished.append(&mut claimed_too_late);
        // An outcome that gives up a limit's slot makes a blocked job
        // pending in the transaction that records it: claim with it.
        if finished.iter().any(|(lease, _)| lease.limit.is_some()) {
            more_may_be_due = true;
        }
        if claiming && threads {
            let expired = ahead.take_expired(shared, hold, Instant::now());
            if !expired.is_empty() {
                log::info!(
                    "handing back {} job(s) that waited over {hold:?} for a thread of this pool",
                    expired.len()
                );
                shared
                    .handed_back
                    .fetch_add(expired.len(), Ordering::SeqCst);
                let mut in_flight = shared.lock_in_flight();
                for lease in &expired {
                    remove_run(&mut in_flight, lease);
                }
                drop(in_flight);
                shared.busy_slots.fetch_sub(expired.len(), Ordering::SeqCst);
                finished.extend(expired.into_iter().map(|lease| (lease, Outcome::Release)));
            }
        }
        // Sleeps end when a lease claimed ahead has waited the holding time.
        let wake_by = |wait: Duration, ahead: &mut Ahead, unsynced: &UnsyncedOutcomes| {
            let wait = unsynced.cap(wait);
            match ahead.next_deadline(shared, hold) {
                Some(deadline) => wait.min(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ),
                None => wait,
            }
        };
        #[cfg(feature = "tokio")]
        let open_kinds: Vec<&str>;
        let kinds: &[&str] = match &lane {
            #[cfg(feature = "tokio")]
            Lane::Tasks(tasks) if tasks.any_runtime_gone() => {
                open_kinds = tasks.open_kinds(&kinds);
                &open_kinds
            }
            _ => &kinds,
        };
        let slots = match &lane {
            Lane::Threads(_) => config.threads + ahead.budget(shared, config),
            #[cfg(feature = "tokio")]
            Lane::Tasks(tasks) => tasks.limit,
        };
        let free = slots.saturating_sub(lane.busy(shared));
        let mut want = if claiming && free > 0 && !kinds.is_empty() {
            free.min(config.claim_batch)
                .min(if threads { usize::MAX } else { TASK_CLAIM_MAX })
        } else {
            0
        };
        if want > 0 && !more_may_be_due {
            match shared.queue.manual().next_due(&queues, Some(kinds)) {
                Ok(Some(due)) if due <= shared.queue.clock().now() => more_may_be_due = true,
                Ok(next) => {
                    want = 0;
                    if finished.is_empty() {
                        let sleep = wake_by(
                            next.map_or(config.max_idle, |due| {
                                (due - shared.queue.clock().now())
                                    .to_std()
                                    .unwrap_or(Duration::ZERO)
                                    .clamp(Duration::from_millis(1), config.max_idle)
                            }),
                            &mut ahead,
                            &unsynced,
                        );
                        if let Err(e) = watcher.wait(sleep, config.poll) {
                            log::error!("watching for new jobs failed: {e}");
                            std::thread::sleep(config.poll);
                        }
                        continue;
                    }
                }
                Err(e) => {
                    log::error!("reading the next due time failed: {e}");
                    want = 0;
                }
            }
        }
        if finished.is_empty() && want == 0 {
            if stopping || !claiming {
                // Short waits: shutdown is waiting for the last outcomes.
                match outcomes.recv_timeout(unsynced.cap(STOPPING_POLL)) {
                    Ok(first) => {
                        let batch = take_outcomes_from(shared, Some(first), outcomes);
                        record(shared, &batch, None, &config.worker_id, &mut unsynced);
                    }
                    // Under the in-flight lock: a run written off sends
                    // its timeout under it before it stops counting as
                    // running.
                    Err(_)
                        if {
                            let _in_flight = shared.lock_in_flight();
                            outcomes.is_empty() && lane.runs_over(shared)
                        } =>
                    {
                        unsynced.sync_if_due(&shared.queue, true);
                        return;
                    }
                    Err(_) => {}
                }
            } else {
                // All slots busy: a worker finishing wakes the watcher.
                let wait = wake_by(config.max_idle, &mut ahead, &unsynced);
                let _ = watcher.wait(wait, wait);
            }
            continue;
        }
        // Each queue leads in turn (see the builder).
        queues.rotate_left(1);
        // One job in `every` is the oldest due one: as many as this claim
        // crosses multiples of `every`, taken in one statement.
        let oldest_first = match config.aging_every {
            0 => 0,
            every => (claimed.wrapping_add(want) / every).saturating_sub(claimed / every),
        };
        let request = ClaimRequest {
            queues: &queues,
            worker_id: &config.worker_id,
            max: want,
            lease: shared.lease,
            kinds: Some(kinds),
            oldest_first,
        };
        let claim = (want > 0).then_some(&request);
        match record(shared, &finished, claim, &config.worker_id, &mut unsynced) {
            Some(leases) => {
                claimed = claimed.wrapping_add(leases.len());
                error_pause = Duration::from_millis(50);
                // The claim may have committed while shutdown began. Until
                // shutdown takes the channel (it waits for this loop to see
                // `stopping`), its leases go there, and shutdown hands them
                // back before it returns; after, shutdown may have returned
                // and they are handed back with the next commit.
                let channel = shared
                    .stopping
                    .load(Ordering::SeqCst)
                    .then(|| lock(&shared.channel_taken));
                if channel.as_ref().is_some_and(|taken| **taken) {
                    claimed_too_late.extend(leases.into_iter().map(|l| (l, Outcome::Release)));
                    continue;
                }
                more_may_be_due = want > 0 && leases.len() == want;
                if !leases.is_empty() && synced_claims < SYNCED_FIRST_CLAIMS {
                    synced_claims += 1;
                    if let Err(e) = shared.queue.sync() {
                        log::warn!(
                            "syncing a claim failed: {e}; should the machine go down during these runs, they may run again uncounted"
                        );
                    }
                }
                if threads {
                    ahead.sent(leases.len(), Instant::now());
                }
                {
                    let mut in_flight = shared.lock_in_flight();
                    for lease in &leases {
                        in_flight.insert(
                            lease.job_id,
                            InFlight {
                                lease: lease.clone(),
                                cancel: Arc::new(CancelFlag::default()),
                                deadline: None,
                                finishing: false,
                                completion: Arc::default(),
                                run: Arc::default(),
                                thread: None,
                                #[cfg(feature = "tokio")]
                                task: match &lane {
                                    Lane::Tasks(lane) => Some(super::in_flight::TaskSlot {
                                        lane: Arc::clone(lane),
                                        abort: None,
                                        lost_at: None,
                                    }),
                                    Lane::Threads(_) => None,
                                },
                                outcomes: lane.outcomes(shared),
                                progress: Arc::default(),
                                started: None,
                                start_recorded: false,
                            },
                        );
                    }
                }
                #[cfg(feature = "tokio")]
                if !threads {
                    record_given_back_starts(shared, &leases);
                }
                for lease in leases {
                    lane.deliver(shared, lease);
                }
                drop(channel);
                // The heartbeat sleeps long while idle.
                shared.wake_heartbeat();
            }
            None => {
                std::thread::sleep(error_pause);
                error_pause = (error_pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Records, in one write, the starts of the jobs of a task lane's claim
/// that were given back before (their next start counts, see
/// `execute::prepare`), rather than one write per job on this thread.
#[cfg(feature = "tokio")]
fn record_given_back_starts(shared: &Shared, leases: &[Lease]) {
    let given_back: Vec<&Lease> = leases.iter().filter(|l| l.given_back > 0).collect();
    if given_back.is_empty() {
        return;
    }
    {
        let mut in_flight = shared.lock_in_flight();
        for lease in &given_back {
            if let Some(job) = super::in_flight::entry_of(&mut in_flight, lease) {
                job.start_recorded = true;
            }
        }
    }
    if let Err(e) = shared.queue.manual().mark_started(&given_back) {
        log::warn!(
            "recording the start of {} job(s) given back before failed: {e}; should this process die during their runs, their attempts are given back again",
            given_back.len()
        );
    }
}
