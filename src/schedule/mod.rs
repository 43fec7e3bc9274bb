//! Recurring jobs, engine-neutral: the types ([`NewSchedule`],
//! [`Schedule`], the misfire and overlap policies, ticks) here, the tick
//! arithmetic (cron expression + IANA time zone → UTC instants) in
//! `cron.rs`, and the firing rules (misfires, overlap, clock steps) in
//! `firing.rs`. The schedules' `Queue` methods, and `Queue::fire`, which
//! applies the rules, are in `src/queue/schedules.rs`; the statements on
//! `tickler_schedules` are each engine's (`ScheduleStore`, and the
//! `ScheduleTx` that `Queue::fire` runs in, in the engine's
//! `schedules.rs`).
//!
//! The rules (one tick per occurrence, DST, misfires, clock steps) are
//! documented on [`NewSchedule`], next to the API.

mod cron;
mod firing;

pub(crate) use cron::*;
pub(crate) use firing::*;

use crate::job::{JobId, LimitSlot, NewJob, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE};
use chrono::{DateTime, FixedOffset, Utc};
use serde::Serialize;
use std::time::Duration;

/// Default misfire grace: a tick up to this late is on time.
pub const DEFAULT_MISFIRE_GRACE: Duration = Duration::from_secs(60);

/// Longest misfire grace a schedule may have (1 hour).
pub const MAX_MISFIRE_GRACE: Duration = Duration::from_secs(3600);

/// Largest `max` of [`MisfirePolicy::FireAll`].
pub const MAX_CATCH_UP: u32 = 10_000;

/// What to do with ticks that were due while no scheduler ran (the device
/// was off, or the clock was stepped forward). See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Fire none of the missed ticks; continue with the next one.
    Skip,
    /// Collapse every due tick into one job, for the latest due tick.
    #[default]
    FireOnce,
    /// Fire the oldest `max` missed ticks (1 to [`MAX_CATCH_UP`]), oldest
    /// first, and drop the rest.
    FireAll {
        /// Most catch-up ticks per misfire.
        max: u32,
    },
}

impl MisfirePolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MisfirePolicy::Skip => "skip",
            MisfirePolicy::FireOnce => "fire_once",
            MisfirePolicy::FireAll { .. } => "fire_all",
        }
    }

    pub(crate) fn max(self) -> Option<u32> {
        match self {
            MisfirePolicy::FireAll { max } => Some(max),
            _ => None,
        }
    }

    pub(crate) fn from_columns(name: &str, max: Option<u32>) -> rusqlite::Result<Self> {
        match (name, max) {
            ("skip", _) => Ok(MisfirePolicy::Skip),
            ("fire_once", _) => Ok(MisfirePolicy::FireOnce),
            ("fire_all", Some(max)) => Ok(MisfirePolicy::FireAll { max }),
            _ => Err(rusqlite::Error::FromSqlConversionFailure(
                0,
                rusqlite::types::Type::Text,
                format!("unknown misfire policy {name:?}").into(),
            )),
        }
    }
}

/// What a tick does while an earlier run of the same schedule is not
/// finished (its job is pending, scheduled or running). The names are those
/// of Kubernetes CronJob's `concurrencyPolicy`.
///
/// The default is [`OverlapPolicy::Forbid`]: a schedule is usually a job
/// that must not run twice at once (a nightly backup, a report, a sync);
/// when one run is still going, or is stuck waiting for a worker, firing
/// another only piles up copies that fight over the same files. Say
/// [`OverlapPolicy::Allow`] for ticks that are independent of each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Fire every tick, whatever earlier runs are doing (tickler's only
    /// behaviour before overlap policies; schedules stored before them keep
    /// it).
    Allow,
    /// Skip a tick while an earlier run is not finished. The skipped tick
    /// is handled (the schedule moves past it), counted in
    /// [`Schedule::skipped_ticks`] and logged; it is not fired later.
    #[default]
    Forbid,
    /// Cancel the unfinished earlier runs
    /// ([`Queue::cancel`](crate::Queue::cancel)) and fire the tick. A cancelled
    /// run that is running is fenced: its holder gets
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) for its heartbeat and its
    /// outcome, which is refused. The cancel is made right after the new run's
    /// job is committed.
    Replace,
}

impl OverlapPolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Forbid => "forbid",
            OverlapPolicy::Replace => "replace",
        }
    }

    pub(crate) fn from_column(name: &str) -> rusqlite::Result<Self> {
        match name {
            "allow" => Ok(OverlapPolicy::Allow),
            "forbid" => Ok(OverlapPolicy::Forbid),
            "replace" => Ok(OverlapPolicy::Replace),
            _ => Err(rusqlite::Error::FromSqlConversionFailure(
                17,
                rusqlite::types::Type::Text,
                format!("unknown overlap policy {name:?}").into(),
            )),
        }
    }
}

impl std::fmt::Display for OverlapPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A schedule to store with
/// [`Queue::upsert_schedule`](crate::Queue::upsert_schedule): a name, a cron
/// expression read in a time zone, and the template of the job each tick
/// enqueues.
///
/// ```
/// use std::time::Duration;
/// use tickler::{MisfirePolicy, NewSchedule, OverlapPolicy};
///
/// let nightly = NewSchedule::new("backup", "30 2 * * *", "run_backup")
///     .time_zone("Europe/Berlin")
///     .payload(serde_json::json!({"target": "/mnt/usb"}))
///     .queue("maintenance")
///     .max_attempts(3)
///     .timeout(Duration::from_secs(600))
///     .misfire(MisfirePolicy::FireOnce)
///     .overlap(OverlapPolicy::Forbid);
/// ```
///
/// # How a schedule fires
///
/// A schedule is a cron expression read in a time zone, a job template and
/// a [`MisfirePolicy`]. Each occurrence of the expression is a **tick**.
/// [`Manual::run_due_ticks`](crate::Manual::run_due_ticks) (run by a
/// [`Scheduler`](crate::Scheduler) thread, which a
/// [`WorkerPool`](crate::WorkerPool) starts by default) turns every due tick
/// into one job, due (`run_at`) at exactly the tick's instant, so a job's
/// lateness is measured against its tick.
///
/// **One tick per occurrence.** The transaction (`BEGIN IMMEDIATE`) that
/// enqueues a schedule's due ticks also moves its `next_tick_at` past them,
/// with an `UPDATE … WHERE name = ? AND next_tick_at = <the value read>`.
/// Any number of schedulers in any number of processes may run on one
/// file: whoever commits first enqueues the tick, the others find it
/// already past. This holds after the tick's job has finished and been
/// pruned. As a second guard each tick's job carries the unique_key
/// `tickler:schedule:<name>:<tick instant in ms>`, so while it is
/// unfinished no other job for that tick can be inserted.
///
/// # Time zones and daylight saving time
///
/// The expression is matched against the wall clock of the schedule's time
/// zone (chrono-tz's compiled IANA database). Two rules decide the nights
/// when the clocks change; which one applies depends on whether the
/// expression's **hour field matches every hour** (`*`, `*/1`, `0-23`):
///
/// | expression | local time that does not exist (spring forward) | local time that happens twice (fall back) |
/// |---|---|---|
/// | names particular hours (`30 2 * * *`, `0 */2 * * *`, `*/10 1 * * *`) | fires **once, at the first instant after the gap** (however many of its times fell in the gap) | fires **once, at its first occurrence** |
/// | matches every hour (`*/15 * * * *`, `0 * * * *`, `* * * * * *`) | does not fire: the schedule runs on real time and the hour that does not exist is not owed | fires at **both** occurrences: the repeated hour is a real hour |
///
/// So `30 2 * * *` in America/New_York fires at 03:00 EDT (07:00 UTC) on
/// 2026-03-08 and at 01:30 EDT (05:30 UTC), not 01:30 EST, on 2026-11-01 for
/// `30 1 * * *`; and `*/15 * * * *` fires every 15 real minutes through both
/// nights. The rules are the ones Vixie cron applies, with the split
/// between the two kinds made on the hour field alone.
///
/// # Misfires
///
/// A tick is **on time** if it is at most the schedule's misfire grace
/// (default 60 s, at most 1 h) older than now when a scheduler gets to it;
/// older ticks are **missed** (no scheduler ran: the device was off, or the
/// clock was stepped forward). On-time ticks always fire. Missed ticks:
///
/// - [`MisfirePolicy::Skip`]: none of them fires; the schedule continues
///   with its next tick.
/// - [`MisfirePolicy::FireOnce`] (default): every due tick, missed and on
///   time, collapses into one job for the **latest** due tick (its run_at is
///   that tick's instant, in the past, so it runs at once).
/// - [`MisfirePolicy::FireAll`]: the oldest `max` missed ticks fire (oldest
///   first), the rest are dropped, then the on-time ones fire.
///
/// Whatever the gap, the work is bounded: Skip and FireOnce find the latest
/// due tick and the next future tick by search (about 40 steps for years of
/// missed ticks), never by walking the missed ticks; FireAll walks at most
/// `max` (at most 10 000) of them; and at most one hour's worth of on-time
/// ticks exists.
///
/// # Overlap
///
/// A tick whose schedule still has an unfinished run (a job of an earlier
/// tick that is pending, scheduled for a retry, or running) follows the
/// schedule's [`OverlapPolicy`]: `Forbid` (the default) skips it, `Replace`
/// cancels the earlier run and fires, `Allow` fires. Only the schedule's own
/// tick jobs count (they are found by their unique_key). The policy also
/// applies among the ticks of one run: after a misfire,
/// [`MisfirePolicy::FireAll`] under `Forbid` fires only the oldest missed
/// tick, and under `Replace` only the newest.
///
/// # Clock steps
///
/// Ticks are computed from the queue's [`Clock`](crate::Clock) (the wall
/// clock in production).
///
/// - **Backward step** (the clock was in the future: a bad real-time clock
///   at boot, a manual fix, an NTP correction): the schedule resumes at
///   its first tick at or after the new now, and **no tick instant fires
///   twice**. The schedule keeps the span of ticks it handled since its
///   last misfire (`[handled_from, last_tick_at]`); after a step back, the
///   part of that span ahead of the new now is a window whose ticks are
///   passed over when the clock gets there again, and the ticks before it
///   fire normally. So a box that booted in 2031, fired a few ticks and was
///   set right goes on at the next tick and skips those few ticks in 2031;
///   a clock set back by two hours while the schedule had been running for
///   days does not repeat the two hours of ticks it already fired (it
///   fires again after them, as it always did). The step is noticed from
///   the stored data (a schedule written "later" than now), so also by a
///   scheduler started after it. Ticks that were handled but not fired
///   count as handled (a tick skipped by the overlap policy, a tick
///   missed while paused); ticks that were missed because the clock
///   jumped forward before the step are not, so they fire.
/// - **Forward step**: the ticks stepped over are due at once and are
///   missed ticks: the misfire policy applies.
///
/// Jobs, leases and backoff store wall-clock instants too (ms, UTC), so the
/// same steps move them: after a forward step of X, scheduled jobs and
/// backoffs fall due X early and leases look X shorter. Leases do not
/// mass-expire: a [`crate::Reaper`] that sees the wall clock jump forward
/// (further than the monotonic clock moved) takes nothing back for
/// [`crate::ReaperConfig::clock_step_hold`] (15 s by default), during which
/// live workers renew their leases from the new time at their next
/// heartbeat (every third of the lease, on the monotonic clock); a worker
/// that is really gone loses its job once the hold is over. A reaper that
/// did not see the step (started after it) can still take a live job whose
/// lease looks expired: its holder then gets
/// [`Error::LeaseLost`](crate::Error::LeaseLost) for its outcome and the job
/// runs again, which the at-least-once contract allows; it never has two
/// recorded outcomes.
/// After a backward step of X, scheduled jobs and backoffs wait X longer;
/// leases do not: the reaper treats a lease that expires further ahead
/// than its own length (plus [`crate::BACKWARD_STEP_MARGIN`], 2 s) as
/// expiring one lease length from now, so a crashed worker's job is taken
/// back one lease length after the step and a live holder renews as usual
/// (see [`crate::ReaperConfig`]). Waits inside a process
/// (heartbeat intervals, job timeouts, the scheduler's and fetcher's
/// sleeps) are measured on the monotonic clock and are not moved by steps.
/// On a device without a real-time clock (most Raspberry Pis), start the
/// program after the clock is synchronised (systemd: `After=time-sync.target`
/// with `systemd-time-wait-sync` enabled), so the boot-time step happens
/// before any lease is held.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    pub(crate) name: String,
    pub(crate) cron: String,
    pub(crate) time_zone: String,
    pub(crate) kind: String,
    pub(crate) payload: serde_json::Value,
    pub(crate) queue: String,
    pub(crate) priority: i32,
    pub(crate) max_attempts: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) misfire: MisfirePolicy,
    pub(crate) misfire_grace: Duration,
    pub(crate) overlap: OverlapPolicy,
    pub(crate) limit: Option<(String, String)>,
    pub(crate) limit_weight: u32,
}

impl NewSchedule {
    /// A schedule `name` firing on `cron`, each tick enqueueing a job of
    /// `kind` with a `null` payload on queue `"default"`, priority 0, 25
    /// attempts; read in UTC, [`MisfirePolicy::FireOnce`], 60 s grace,
    /// [`OverlapPolicy::Forbid`].
    ///
    /// `cron` has 5 fields (minute hour day-of-month month day-of-week) or 6
    /// with seconds first; names (`MON`, `JAN`), ranges, lists, steps, `L`
    /// (last day / last weekday of the month), `#` (nth weekday: `5#2`),
    /// `W` (nearest weekday) and the nicknames `@yearly`, `@annually`,
    /// `@monthly`, `@weekly`, `@daily`, `@midnight` (the same as `@daily`)
    /// and `@hourly` are accepted (the croner crate parses it). Day-of-month
    /// and day-of-week combine with OR, as in Vixie cron, unless the
    /// day-of-week starts with `+`.
    ///
    /// Ranges: second and minute 0-59, hour 0-23, day-of-month 1-31, month
    /// 1-12, day-of-week 0-7 (0 and 7 are Sunday). A step from a single
    /// value, `a/n`, means `a-max/n`, as in Kubernetes CronJob, Quartz and
    /// croniter: `0 1/3 * * *` fires at 01:00, 04:00, … 22:00; for it the
    /// day-of-week runs to 6, so `1/2` is Monday, Wednesday, Friday. (`*/n`
    /// starts at the field's minimum instead: `*/3` in the hour field is
    /// 00:00, 03:00, ….) A step with no start (`/10`) is refused. Errors are
    /// [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) naming the
    /// field and its range.
    pub fn new(name: impl Into<String>, cron: impl Into<String>, kind: impl Into<String>) -> Self {
        NewSchedule {
            name: name.into(),
            cron: cron.into(),
            time_zone: "UTC".to_owned(),
            kind: kind.into(),
            payload: serde_json::Value::Null,
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout: None,
            misfire: MisfirePolicy::default(),
            misfire_grace: DEFAULT_MISFIRE_GRACE,
            overlap: OverlapPolicy::default(),
            limit: None,
            limit_weight: 1,
        }
    }

    /// IANA time zone the expression is read in, e.g. `"America/New_York"`
    /// (default `"UTC"`; case-sensitive).
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = zone.into();
        self
    }

    /// Payload of every tick's job (default `null`).
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }

    /// Queue of every tick's job (default `"default"`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Priority of every tick's job (default 0; higher runs first).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// max_attempts of every tick's job (default 25, at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Per-run timeout of every tick's job (default none; ms precision).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// What to do with missed ticks (default [`MisfirePolicy::FireOnce`]).
    pub fn misfire(mut self, policy: MisfirePolicy) -> Self {
        self.misfire = policy;
        self
    }

    /// How late (ms precision) a tick may be found and still count as on
    /// time rather than missed (default 60 s, at most 1 h).
    pub fn misfire_grace(mut self, grace: Duration) -> Self {
        self.misfire_grace = grace;
        self
    }

    /// What a tick does while an earlier run is not finished (default
    /// [`OverlapPolicy::Forbid`]; see the type's docs for why).
    pub fn overlap(mut self, policy: OverlapPolicy) -> Self {
        self.overlap = policy;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every tick's job runs under the concurrency limit `name` as one
    /// holder of `key`, as a job enqueued with
    /// [`NewJob::limit`](crate::NewJob::limit) does: a cron job that syncs
    /// an account keeps to the account's limit beside the syncs enqueued
    /// by hand. Weight 1 unless [`NewSchedule::limit_weight`] says
    /// otherwise. Checked as a job's limit is when the schedule is stored.
    ///
    /// ```
    /// let s = tickler::NewSchedule::new("sync-42", "*/5 * * * *", "sync")
    ///     .limit("sync", "account-42");
    /// ```
    pub fn limit(mut self, name: impl Into<String>, key: impl Into<String>) -> Self {
        self.limit = Some((name.into(), key.into()));
        self
    }

    /// Slots of its limit every tick's job takes (default 1, at least 1);
    /// see [`NewJob::limit_weight`](crate::NewJob::limit_weight). Without
    /// [`NewSchedule::limit`] it means nothing.
    pub fn limit_weight(mut self, weight: u32) -> Self {
        self.limit_weight = weight;
        self
    }

    pub(crate) fn template(&self) -> NewJob {
        let mut job = NewJob::new(self.kind.clone())
            .payload(self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts)
            .limit_weight(self.limit_weight);
        if let Some(timeout) = self.timeout {
            job = job.timeout(timeout);
        }
        if let Some((name, key)) = &self.limit {
            job = job.limit(name.clone(), key.clone());
        }
        job
    }
}

/// A stored schedule, as read by
/// [`Queue::list_schedules`](crate::Queue::list_schedules).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    /// Its name (unique in the file).
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The IANA time zone it is read in.
    pub time_zone: String,
    /// Kind of every tick's job.
    pub kind: String,
    /// Payload of every tick's job.
    pub payload: serde_json::Value,
    /// Queue of every tick's job.
    pub queue: String,
    /// Priority of every tick's job.
    pub priority: i32,
    /// max_attempts of every tick's job.
    pub max_attempts: u32,
    /// Per-run timeout of every tick's job.
    pub timeout: Option<Duration>,
    /// What happens to missed ticks.
    pub misfire: MisfirePolicy,
    /// How late a tick may be and still be on time.
    pub misfire_grace: Duration,
    /// What a tick does while an earlier run is not finished.
    pub overlap: OverlapPolicy,
    /// Ticks not fired because of the overlap policy (skipped under
    /// `Forbid`, superseded catch-up ticks under `Replace`) since the
    /// schedule was first stored; kept when it is replaced.
    pub skipped_ticks: u64,
    /// Paused schedules fire nothing; ticks that fall while paused are
    /// never fired.
    pub paused: bool,
    /// The next tick to fire, UTC; `None` if the expression fires no more
    /// (before year 5000). While paused it is not kept current.
    pub next_tick_at: Option<DateTime<Utc>>,
    /// The latest tick that was fired or deliberately skipped, UTC. Right
    /// after a backward step of the clock it is `None` until a tick fires.
    pub last_tick_at: Option<DateTime<Utc>>,
    /// When it was first stored, UTC.
    pub created_at: DateTime<Utc>,
    /// When it was last changed or fired, UTC.
    pub updated_at: DateTime<Utc>,
    /// The concurrency limit every tick's job takes a slot of
    /// ([`NewSchedule::limit`]).
    pub limit: Option<LimitSlot>,
}

/// One occurrence of a schedule, as previewed by
/// [`Queue::next_ticks`](crate::Queue::next_ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The instant, UTC (the job's run_at).
    pub at: DateTime<Utc>,
    /// The same instant on the schedule's wall clock, with the UTC offset
    /// in force then.
    pub local: DateTime<FixedOffset>,
}

/// Which schedule [`Queue::next_ticks`](crate::Queue::next_ticks)
/// previews: a stored one by name, or a spec that is not stored.
#[derive(Debug, Clone, Copy)]
pub enum ScheduleRef<'a> {
    /// A stored schedule.
    Name(&'a str),
    /// A schedule that need not be stored.
    Spec(&'a NewSchedule),
}

impl<'a> From<&'a str> for ScheduleRef<'a> {
    fn from(name: &'a str) -> Self {
        ScheduleRef::Name(name)
    }
}

impl<'a> From<&'a String> for ScheduleRef<'a> {
    fn from(name: &'a String) -> Self {
        ScheduleRef::Name(name)
    }
}

impl<'a> From<&'a NewSchedule> for ScheduleRef<'a> {
    fn from(spec: &'a NewSchedule) -> Self {
        ScheduleRef::Spec(spec)
    }
}

/// What [`Manual::run_due_ticks`](crate::Manual::run_due_ticks) did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickRun {
    /// Ids of the jobs the due ticks enqueued, per schedule in due order
    /// and oldest tick first.
    pub jobs: Vec<JobId>,
    /// When the next tick of an active schedule is due, UTC.
    pub next_tick_at: Option<DateTime<Utc>>,
    /// Ticks not fired because of their schedule's [`OverlapPolicy`].
    pub skipped: u64,
    /// Earlier runs cancelled by [`OverlapPolicy::Replace`].
    pub replaced: Vec<JobId>,
}

/// The upcoming ticks of a schedule, one at a time (see
/// [`Queue::upcoming_ticks`](crate::Queue::upcoming_ticks)); ends when the
/// expression fires no more (before year 5000).
#[derive(Debug, Clone)]
pub struct UpcomingTicks {
    pub(crate) ticks: Ticks,
    pub(crate) cursor: Option<i64>,
}

impl Iterator for UpcomingTicks {
    type Item = Tick;

    fn next(&mut self) -> Option<Tick> {
        let at = self.cursor?;
        self.cursor = self.ticks.next_after(at);
        Some(self.ticks.tick(at))
    }
}

// ------------------------------------------------------------- tick arithmetic

// ------------------------------------------------------------ cron fields
