//! The storage seam: what the engine-neutral [`crate::Queue`] asks of an
//! engine. Each engine (today `crate::sqlite`) implements it with its own
//! SQL; the worker pool, reaper, scheduler and CLI use only the `Queue`
//! API above it.
//!
//! Every write here runs in short transactions of the engine's own (one,
//! or a few for the bulk operator actions); what a method promises (fencing by run_token, the reaper's conditions, unique
//! keys) is documented on the `Queue` method of the same name. Nothing in
//! this trait assumes `UPDATE … RETURNING`: an engine may claim with a
//! locking read followed by an update.

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod sqlite;

use crate::error::Result;
use crate::job::{Job, JobId, JobState};
use crate::lease::Lease;
pub(crate) mod types;

use crate::error::Error;
use crate::schedule::{Fired, Handled, NewSchedule, Schedule, Ticks};
use chrono::{DateTime, Utc};
use std::time::Duration;
use types::{ClaimRequest, JobFilter, Outcome, OutcomeSync, Stats, ValidJob};

/// Decides and applies one due schedule's firing through the engine's
/// transaction (the schedule, its record of handled ticks, the engine's
/// "now" in ms); see `Queue::fire`.
pub(crate) type FireTicks<'a> =
    dyn FnMut(&dyn ScheduleTx, &Schedule, Handled, i64) -> Result<Fired> + 'a;

/// An engine's schedules: where they are stored, and the transaction in
/// which due ticks fire. What to fire is decided by the queue
/// (`Queue::fire`), engine-neutral, through a [`ScheduleTx`].
pub(crate) trait ScheduleStore {
    /// Stores `schedule` (validated, its `ticks` parsed, its payload
    /// serialized) or replaces the one of that name; see
    /// [`crate::Queue::upsert_schedule`].
    fn upsert_schedule(
        &self,
        schedule: &NewSchedule,
        ticks: &Ticks,
        payload: &str,
        timeout_ms: Option<i64>,
    ) -> Result<Schedule>;

    /// See [`crate::Queue::pause_schedule`].
    fn pause_schedule(&self, name: &str) -> Result<()>;

    /// See [`crate::Queue::resume_schedule`].
    fn resume_schedule(&self, name: &str) -> Result<()>;

    /// See [`crate::Queue::delete_schedule`].
    fn delete_schedule(&self, name: &str) -> Result<bool>;

    /// See [`crate::Queue::get_schedule`].
    fn get_schedule(&self, name: &str) -> Result<Schedule>;

    /// See [`crate::Queue::list_schedules`].
    fn list_schedules(&self) -> Result<Vec<Schedule>>;

    /// A stored schedule and its record of handled ticks, for previews.
    fn schedule_and_handled(&self, name: &str) -> Result<(Schedule, Handled)>;

    /// See [`crate::Queue::next_schedule_tick`].
    fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>>;

    /// One transaction of [`crate::Queue::run_due_ticks`]: moves schedules
    /// written "after" now (a backward clock step) to their next unhandled
    /// tick, then calls `fire` for each of up to `batch` due active
    /// schedules, with the engine's "now" (ms). Returns what was fired,
    /// whether the batch was full (more may be due), and the next tick of
    /// any active schedule. Wakes this process's fetchers if jobs were
    /// fired.
    fn fire_due_schedules(
        &self,
        batch: i64,
        fire: &mut FireTicks<'_>,
    ) -> Result<(Fired, bool, Option<DateTime<Utc>>)>;
}

/// An engine: where jobs are stored, claimed and fenced, and schedules
/// fire.
pub(crate) trait Engine: ScheduleStore + Send + Sync {
    /// Stores validated jobs in one transaction (all or none) and wakes
    /// this process's fetchers; see [`crate::Queue::enqueue_batch`].
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>>;

    /// See [`crate::Queue::next_due`].
    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>>;

    /// See [`crate::Queue::heartbeat_many`].
    fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>>;

    /// See [`crate::Queue::leases_held`].
    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>>;

    /// See [`crate::Queue::record_and_claim`].
    fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&ClaimRequest<'_>>,
        sync: OutcomeSync,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)>;

    /// One look of [`crate::Queue::reap`]: leases expired before
    /// `cutoff` (ms; `None`: now), taken back at once.
    fn reap_expired_before(&self, cutoff: Option<i64>) -> Result<u64>;

    /// See [`crate::Queue::reap_at`]: `cutoff` is "now" in ms, as read
    /// before waiting for the write lock.
    fn reap_settled(&self, cutoff: i64) -> Result<u64>;

    /// See [`crate::Queue::cancel`].
    fn cancel(&self, id: JobId) -> Result<()>;

    /// See [`crate::Queue::retry`].
    fn retry(&self, id: JobId) -> Result<()>;

    /// See [`crate::Queue::prune`].
    fn prune(&self, finished_before: DateTime<Utc>) -> Result<u64>;

    /// See [`crate::Queue::get`].
    fn get(&self, id: JobId) -> Result<Job>;

    /// See [`crate::Queue::list`].
    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>>;

    /// See [`crate::Queue::count`].
    fn count(&self, state: JobState) -> Result<u64>;

    /// See [`crate::Queue::stats`].
    fn stats(&self) -> Result<Stats>;

    /// See [`crate::Queue::retry_dead`].
    fn retry_dead(&self, queue: Option<&str>) -> Result<(u64, u64)>;

    /// See [`crate::Queue::prune_state`].
    fn prune_state(&self, finished_before: DateTime<Utc>, state: JobState) -> Result<u64>;

    /// See [`crate::Queue::finished_since`].
    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64>;

    /// See [`crate::Queue::unfinished`].
    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64>;

    /// See [`crate::Queue::pause_queue`] and [`crate::Queue::resume_queue`];
    /// resuming wakes the watchers of every process.
    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()>;

    /// See [`crate::Queue::paused_queues`].
    fn paused_queues(&self) -> Result<Vec<String>>;

    /// The first queue after `after` (byte order) with jobs in `state`: one
    /// step through an index of that state (for `counts_by_queue` and
    /// `list_state`).
    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>>;

    /// Jobs of `queue` in `state`, counted through an index, up to `cap`.
    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64>;

    /// Up to `limit` jobs of `queue` in `state`, in the order of that
    /// state's index: pending in claim order (priority, due time, id),
    /// scheduled soonest due first, running soonest lease expiry first,
    /// finished newest first.
    fn list_in_queue(&self, state: JobState, queue: &str, limit: usize) -> Result<Vec<Job>>;

    /// The jobs that finished at or after `from_ms` and before `to_ms`:
    /// their number, counted through the finish-time index up to `cap`,
    /// and up to `sample` of them, the last to finish first (for
    /// `Queue::activity`).
    fn finished_between(
        &self,
        from_ms: i64,
        to_ms: i64,
        cap: u64,
        sample: usize,
    ) -> Result<(u64, Vec<FinishedSample>)>;
}

/// One finished job as `Queue::activity` reads it: what lateness and run
/// time are computed from, without the payload.
#[derive(Debug, Clone)]
pub(crate) struct FinishedSample {
    /// `None` for a status this build does not know (a newer writer).
    pub state: Option<JobState>,
    pub run_at_ms: i64,
    /// Start of the attempt that finished; absent for a job cancelled
    /// before it ever ran.
    pub claimed_at_ms: Option<i64>,
    pub finished_at_ms: i64,
}

/// Jobs per (queue, state) for `Queue::stats`, in one statement (one
/// snapshot) on either engine: one part per state, each in the words of
/// that state's partial index (see [`state_index`]), so that no part reads
/// the table itself except for running jobs, which are few. A plain
/// `GROUP BY queue, status` reads every row, payloads included.
pub(crate) const STATS_COUNTS_SQL: &str =
    "SELECT queue, 'pending', count(*) FROM tickler_jobs WHERE status = 'pending' GROUP BY queue
     UNION ALL
     SELECT queue, 'scheduled', count(*) FROM tickler_jobs WHERE status = 'scheduled' GROUP BY queue
     UNION ALL
     SELECT queue, 'running', count(*) FROM tickler_jobs WHERE status = 'running' GROUP BY queue
     UNION ALL
     SELECT queue, status, count(*) FROM tickler_jobs
     WHERE status IN ('succeeded', 'dead', 'cancelled') AND finished_at IS NOT NULL
     GROUP BY status, queue";

/// The condition that selects `state` in words an index of that state
/// matches (its partial index's WHERE clause), and the order of that index
/// within one queue. Shared by the engines' dashboard reads.
pub(crate) fn state_index(state: JobState) -> (&'static str, &'static str) {
    match state {
        JobState::Pending => ("status = 'pending'", "priority DESC, run_at, id"),
        JobState::Scheduled => ("status = 'scheduled'", "run_at, id"),
        JobState::Running => ("status = 'running'", "lease_expires_at, id"),
        JobState::Succeeded => (
            "status = 'succeeded' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
        JobState::Dead => (
            "status = 'dead' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
        JobState::Cancelled => (
            "status = 'cancelled' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
    }
}
/// Whether `location` names a PostgreSQL database (`postgres://…` or
/// `postgresql://…`) rather than a file.
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// `location` (a path or URL) as it may be shown in messages and logs: a
/// password in a URL is replaced by `***`.
pub fn redacted_location(location: &str) -> String {
    let Some(scheme_end) = location.find("://").map(|i| i + 3) else {
        return location.to_owned();
    };
    let rest = &location[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &location[..scheme_end],
            &authority[..colon],
            &rest[at..]
        ),
        _ => location.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_in_urls() {
        assert_eq!(
            redacted_location("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redacted_location("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted_location("./jobs.db"), "./jobs.db");
    }
}
/// What firing a schedule asks of the engine, inside the transaction in
/// which the engine holds the due schedules (SQLite: `BEGIN IMMEDIATE`).
pub(crate) trait ScheduleTx {
    /// The unfinished runs (tick jobs scheduled, pending or running) of
    /// schedule `name`, oldest first.
    fn unfinished_runs(&self, name: &str) -> Result<Vec<(JobId, JobState)>>;
    /// A cancelled or dead run of schedule `name` whose lease, kept for
    /// its handler, has not run out at `now`.
    fn stopping_run(&self, name: &str, now: i64) -> Result<Option<(JobId, JobState)>>;
    /// Pauses a schedule that cannot fire with this build, with `error` in
    /// the log.
    fn pause_broken(&self, schedule: &Schedule, now: i64, error: &Error) -> Result<()>;
    /// Moves schedule `name` on to `after`, adding `skipped` skipped ticks,
    /// if it is still active and still due at `first_due`; false if another
    /// scheduler handled these ticks first.
    fn advance(
        &self,
        name: &str,
        first_due: i64,
        after: &Handled,
        skipped: u64,
        now: i64,
    ) -> Result<bool>;
    /// Inserts the tick jobs (validated by the queue).
    fn insert_jobs(&self, rows: &[ValidJob], now: i64) -> Result<Vec<JobId>>;
}
