//! Delayed and recurring jobs: [`NewSchedule`], [`Schedule`], the tick
//! arithmetic (cron expression + IANA time zone → UTC instants), and the
//! rules of firing (misfire and overlap policies, clock steps), engine-
//! neutral. The statements on `tickler_schedules` are the engine's
//! (`crate::engine::ScheduleStore`; SQLite: `src/sqlite/schedules.rs`),
//! which runs [`Queue::fire`]'s decisions through a [`ScheduleTx`] inside
//! its own transaction.
//!
//! The rules (one tick per occurrence, DST, misfires, clock steps) are
//! documented on [`NewSchedule`], next to the API.

use crate::clock::ms_to_datetime;
use crate::engine::types::MAX_TIMESTAMP_MS;
use crate::error::{Error, Result};
use crate::job::{JobId, NewJob, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE};
use chrono::{DateTime, FixedOffset, LocalResult, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;
use std::time::Duration;

/// Default misfire grace: a tick up to this late is on time.
pub const DEFAULT_MISFIRE_GRACE: Duration = Duration::from_secs(60);

/// Longest misfire grace a schedule may have (1 hour).
pub const MAX_MISFIRE_GRACE: Duration = Duration::from_secs(3600);

/// Largest `max` of [`MisfirePolicy::FireAll`].
pub const MAX_CATCH_UP: u32 = 10_000;

/// Offsets are probed this far apart when looking for a time zone
/// transition between two instants (transitions are months apart).
const PROBE_STEP_MS: i64 = 3_600_000;

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
    /// Cancel the unfinished earlier runs ([`Queue::cancel`]) and fire the
    /// tick. A cancelled run that is running is fenced: its holder gets
    /// [`Error::LeaseLost`] for its heartbeat and its outcome, which is
    /// refused. The cancel is made right after the new run's job is
    /// committed.
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

/// A schedule to store with [`Queue::upsert_schedule`]: a name, a cron
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
/// [`Queue::run_due_ticks`] (run by a [`Scheduler`](crate::Scheduler)
/// thread, which a [`WorkerPool`](crate::WorkerPool) starts by default)
/// turns every due tick into one job, due (`run_at`) at exactly the tick's
/// instant, so a job's lateness is measured against its tick.
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
/// lease looks expired: its holder then gets [`Error::LeaseLost`] for its
/// outcome and the job runs again, which the at-least-once contract
/// allows; it never has two recorded outcomes.
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
    /// [`Error::InvalidSchedule`] naming the field and its range.
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

    pub(crate) fn template(&self) -> NewJob {
        let mut job = NewJob::new(self.kind.clone())
            .payload(self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts);
        if let Some(timeout) = self.timeout {
            job = job.timeout(timeout);
        }
        job
    }
}

/// A stored schedule, as read by [`Queue::list_schedules`].
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
}

/// One occurrence of a schedule, as previewed by [`Queue::next_ticks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The instant, UTC (the job's run_at).
    pub at: DateTime<Utc>,
    /// The same instant on the schedule's wall clock, with the UTC offset
    /// in force then.
    pub local: DateTime<FixedOffset>,
}

/// Which schedule [`Queue::next_ticks`] previews: a stored one by name, or
/// a spec that is not stored.
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

/// What [`Queue::run_due_ticks`] did.
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
/// [`Queue::upcoming_ticks`]); ends when the expression fires no more
/// (before year 5000).
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

/// A parsed expression in its time zone: the tick set, as UTC milliseconds.
#[derive(Debug, Clone)]
pub(crate) struct Ticks {
    cron: Cron,
    tz: Tz,
    /// The hour field matches every hour: real-time DST rules.
    every_hour: bool,
    /// Ticks in this window (inclusive, ms) are not ticks: they already
    /// fired before a backward step of the clock.
    hole: Option<(i64, i64)>,
}

impl Ticks {
    /// Parses `expression` in `zone`.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`], [`Error::UnknownTimeZone`].
    pub(crate) fn new(expression: &str, zone: &str) -> Result<Ticks> {
        let invalid = |reason: String| Error::InvalidSchedule {
            expression: expression.to_owned(),
            reason,
        };
        let normalized = normalize_cron(expression).map_err(invalid)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(&normalized)
            .map_err(|e| invalid(e.to_string()))?;
        let tz: Tz = zone.parse().map_err(|_| Error::UnknownTimeZone {
            name: zone.to_owned(),
        })?;
        let every_hour = (0..24).all(|h| cron.pattern.hour_match(h).unwrap_or(false));
        Ok(Ticks {
            cron,
            tz,
            every_hour,
            hole: None,
        })
    }

    /// The same tick set without the ticks in `hole` (inclusive).
    pub(crate) fn without(mut self, hole: Option<(i64, i64)>) -> Ticks {
        self.hole = hole;
        self
    }

    /// As [`Ticks::new`], and refuses an expression with no tick at or
    /// after `now_ms` (30 February).
    pub(crate) fn new_firing(expression: &str, zone: &str, now_ms: i64) -> Result<Ticks> {
        let ticks = Ticks::new(expression, zone)?;
        if ticks.at_or_after(now_ms).is_none() {
            return Err(Error::InvalidSchedule {
                expression: expression.to_owned(),
                reason: "it never fires: no date matches all of its fields (like 30 February)"
                    .into(),
            });
        }
        Ok(ticks)
    }

    /// UTC offset in force at instant `at_ms`, in ms.
    fn offset_ms(&self, at_ms: i64) -> i64 {
        let utc = ms_to_datetime(at_ms).naive_utc();
        i64::from(
            self.tz
                .offset_from_utc_datetime(&utc)
                .fix()
                .local_minus_utc(),
        ) * 1000
    }

    /// The first tick at or after `from_ms`.
    pub(crate) fn at_or_after(&self, from_ms: i64) -> Option<i64> {
        self.next_after(from_ms.saturating_sub(1))
    }

    /// The first tick strictly after `after_ms`.
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.next_after_until(after_ms, MAX_TIMESTAMP_MS)
    }

    /// The first tick strictly after `after_ms`, if it is at most `limit_ms`.
    ///
    /// Walks the time line in spans of constant UTC offset: within one, the
    /// parser's next wall-clock match gives the tick; where a span ends
    /// before that match, the transition decides (a gap tick for a
    /// wall-clock time the gap swallowed, otherwise go on in the next span).
    fn next_after_until(&self, after_ms: i64, limit_ms: i64) -> Option<i64> {
        let tick = self.next_after_until_all(after_ms, limit_ms)?;
        match self.hole {
            Some((from, until)) if (from..=until).contains(&tick) => {
                self.next_after_until_all(until, limit_ms)
            }
            _ => Some(tick),
        }
    }

    /// [`Ticks::next_after_until`] ignoring the hole.
    fn next_after_until_all(&self, after_ms: i64, limit_ms: i64) -> Option<i64> {
        let limit_ms = limit_ms.min(MAX_TIMESTAMP_MS);
        let mut lo = after_ms.max(-1);
        // The offset in force at `lo`: a transition at lo + 1 is then seen
        // as a change, so a gap ending exactly there still gets its tick.
        let mut off = self.offset_ms(lo);
        loop {
            if lo >= limit_ms {
                return None;
            }
            // The parser works in whole seconds and `false` means "strictly
            // after", so start it from the wall-clock second holding lo.
            let local_second = (lo + off).div_euclid(1000) * 1000;
            let start = ms_to_datetime(local_second).naive_utc();
            let wall = self.cron.find_next_occurrence(&start, false).ok()?;
            let wall_ms = wall.and_utc().timestamp_millis();
            let candidate = wall_ms - off;
            match self.first_offset_change(lo + 1, candidate.min(limit_ms), off) {
                None if candidate > limit_ms => return None,
                None => {
                    // No transition up to the candidate: it is a real
                    // instant showing `wall`. A fixed-time expression fires
                    // a repeated wall-clock time only at its first instant.
                    if !self.every_hour {
                        if let LocalResult::Ambiguous(first, _) = self.tz.from_local_datetime(&wall)
                        {
                            if first.timestamp_millis() != candidate {
                                lo = candidate;
                                continue;
                            }
                        }
                    }
                    return Some(candidate);
                }
                Some(change) => {
                    let new_off = self.offset_ms(change);
                    // Wall-clock times in [change + off, change + new_off)
                    // do not exist; `wall` is the first match at or after
                    // change + off.
                    if new_off > off && wall_ms < change + new_off && !self.every_hour {
                        return Some(change);
                    }
                    lo = change - 1;
                    off = new_off;
                }
            }
        }
    }

    /// The first instant in `[from_ms, to_ms]` whose offset is not `off`.
    fn first_offset_change(&self, from_ms: i64, to_ms: i64, off: i64) -> Option<i64> {
        if self.offset_ms(from_ms) != off {
            return Some(from_ms);
        }
        let mut probe = from_ms;
        while probe < to_ms {
            let next = probe.saturating_add(PROBE_STEP_MS).min(to_ms);
            if self.offset_ms(next) != off {
                // Offsets differ somewhere in (probe, next]: bisect.
                let (mut same, mut changed) = (probe, next);
                while changed - same > 1 {
                    let mid = same + (changed - same) / 2;
                    if self.offset_ms(mid) == off {
                        same = mid;
                    } else {
                        changed = mid;
                    }
                }
                return Some(changed);
            }
            probe = next;
        }
        None
    }

    /// The latest tick at or before `to_ms`, given that `from_ms` is a tick
    /// at or before it: a bisection over instants, about 40 steps for years.
    fn latest_at_or_before(&self, from_ms: i64, to_ms: i64) -> i64 {
        // Invariant: `good` is a tick <= to_ms; no tick in [bad, to_ms].
        let (mut good, mut bad) = (from_ms, to_ms.saturating_add(1));
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            match self.next_after_until(mid - 1, to_ms) {
                Some(tick) => good = tick,
                None => bad = mid,
            }
        }
        good
    }

    /// The tick at `at_ms` as a [`Tick`].
    fn tick(&self, at_ms: i64) -> Tick {
        let at = ms_to_datetime(at_ms);
        Tick {
            at,
            local: at.with_timezone(&self.tz).fixed_offset(),
        }
    }
}

// ------------------------------------------------------------ cron fields

/// Name, minimum, maximum and maximum for a step from a single value, of
/// each field of a 6-field expression (a 5-field one has no seconds).
/// Day-of-week accepts 7 for Sunday, but `a/n` runs to 6 as in Quartz,
/// croniter and Kubernetes, so that `1/2` does not include Sunday twice over.
const CRON_FIELDS: [(&str, u32, u32, u32); 6] = [
    ("second", 0, 59, 59),
    ("minute", 0, 59, 59),
    ("hour", 0, 23, 23),
    ("day-of-month", 1, 31, 31),
    ("month", 1, 12, 12),
    ("day-of-week", 0, 7, 6),
];

const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// Rewrites what croner refuses but other tools accept into croner's
/// syntax, and gives out-of-range values a message naming the field:
/// `@midnight` becomes `@daily`, and a step from a single value `a/n`
/// becomes `a-max/n` (croner's own "sloppy" mode would also accept `/n`
/// and run day-of-week steps to 7). Everything else is left to croner.
fn normalize_cron(expression: &str) -> std::result::Result<String, String> {
    let trimmed = expression.trim();
    if let Some(word) = trimmed
        .split_whitespace()
        .next()
        .filter(|w| w.starts_with('@'))
    {
        if word.eq_ignore_ascii_case("@midnight") && trimmed.len() == word.len() {
            return Ok("@daily".to_owned());
        }
        if NICKNAMES.iter().any(|n| n.eq_ignore_ascii_case(word)) {
            return Ok(trimmed.to_owned());
        }
        return Err(format!(
            "{word} is not a schedule tickler knows; use one of {}, @midnight, or cron fields",
            NICKNAMES.join(", ")
        ));
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let specs = match fields.len() {
        5 => &CRON_FIELDS[1..],
        6 => &CRON_FIELDS[..],
        // croner says how many fields it wants.
        _ => return Ok(trimmed.to_owned()),
    };
    let mut out = Vec::with_capacity(fields.len());
    for (field, spec) in fields.iter().zip(specs) {
        let parts = field
            .split(',')
            .map(|part| normalize_part(part, *spec))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        out.push(parts.join(","));
    }
    Ok(out.join(" "))
}

/// One comma-separated part of a field; see [`normalize_cron`].
fn normalize_part(
    part: &str,
    (name, min, max, step_max): (&str, u32, u32, u32),
) -> std::result::Result<String, String> {
    let in_range = |value: &str, top: u32, note: &str| -> std::result::Result<(), String> {
        match value.parse::<u32>() {
            Ok(v) if (min..=top).contains(&v) => Ok(()),
            Ok(v) => Err(format!("{name} {v} is out of range {min}-{top}{note}")),
            // Names and modifiers (L, W, #) are croner's to check.
            Err(_) => Ok(()),
        }
    };
    let sunday = if name == "day-of-week" {
        " (0 and 7 are Sunday)"
    } else {
        ""
    };
    let Some((base, step)) = part.split_once('/') else {
        for bound in part.split('-') {
            in_range(bound, max, sunday)?;
        }
        return Ok(part.to_owned());
    };
    let n = match step.parse::<u32>() {
        Ok(0) => return Err(format!("{name} step in {part:?} is 0; a step is 1 or more")),
        Ok(n) => n,
        Err(_) => {
            return Err(format!(
                "{name} step in {part:?} is not a number; write a step as start/n, e.g. \"{min}/5\""
            ))
        }
    };
    if base.is_empty() {
        return Err(format!(
            "{name} {part:?} has a step but no start: write \"*/{n}\" for every {n} from {min}, or \"{min}/{n}\" to say where it starts"
        ));
    }
    if base == "*" || base.contains('-') {
        for bound in base.split('-').filter(|b| *b != "*") {
            in_range(bound, max, sunday)?;
        }
        return Ok(part.to_owned());
    }
    let named = base.chars().all(|c| c.is_ascii_alphabetic());
    let numeric = base.chars().all(|c| c.is_ascii_digit());
    if numeric {
        let for_step = if step_max < max { " for a step" } else { "" };
        in_range(base, step_max, for_step)?;
        // Kubernetes CronJob, Quartz and croniter read a/n as a-max/n.
        return Ok(format!("{base}-{step_max}/{n}"));
    }
    if named && matches!(name, "month" | "day-of-week") {
        return Ok(format!("{base}-{step_max}/{n}"));
    }
    Err(format!(
        "{name} {base:?} in {part:?} is not a number{}",
        if named {
            " (names are for month and day-of-week)"
        } else {
            ""
        }
    ))
}

/// What one run does for one schedule: the ticks to enqueue (strictly
/// increasing, all at or before now) and the next tick after now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) ticks: Vec<i64>,
    pub(crate) next: Option<i64>,
}

/// The ticks to fire when `first_due` (a tick <= now) is the oldest due
/// one; see the module docs for the rules.
pub(crate) fn plan(
    ticks: &Ticks,
    first_due: i64,
    now: i64,
    misfire: MisfirePolicy,
    grace_ms: i64,
) -> Plan {
    let on_time_from = now.saturating_sub(grace_ms);
    let mut fire = Vec::new();
    let mut cursor = Some(first_due);
    if first_due < on_time_from {
        match misfire {
            MisfirePolicy::Skip => {}
            MisfirePolicy::FireOnce => {
                return Plan {
                    ticks: vec![ticks.latest_at_or_before(first_due, now)],
                    next: ticks.next_after(now),
                };
            }
            MisfirePolicy::FireAll { max } => {
                let max = max.min(MAX_CATCH_UP) as usize;
                while let Some(tick) = cursor {
                    if fire.len() >= max {
                        break;
                    }
                    fire.push(tick);
                    cursor = ticks.next_after_until(tick, on_time_from - 1);
                }
            }
        }
        cursor = ticks.next_after_until(on_time_from - 1, now);
    }
    while let Some(tick) = cursor {
        fire.push(tick);
        cursor = ticks.next_after_until(tick, now);
    }
    Plan {
        ticks: fire,
        next: ticks.next_after(now),
    }
}

/// The unique_key of the job of `schedule`'s tick at `at_ms`.
pub(crate) fn tick_key(schedule: &str, at_ms: i64) -> String {
    format!("tickler:schedule:{schedule}:{at_ms}")
}

pub(crate) fn grace_ms(grace: Duration) -> i64 {
    i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
}

/// A schedule's record of the ticks it handled, for backward clock steps
/// (see "Clock steps" on [`NewSchedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handled {
    /// The next tick to fire.
    pub(crate) next: Option<i64>,
    /// Every tick in `[from, last]` was handled (`from` None: only `last`).
    pub(crate) from: Option<i64>,
    pub(crate) last: Option<i64>,
    /// Every tick at or before this was handled (set when a misfire
    /// dropped ticks after it; `from` then starts after the gap).
    pub(crate) through: Option<i64>,
    /// Handled ticks ahead of the clock after a backward step: never fired again.
    pub(crate) ahead: Option<(i64, i64)>,
}

/// Where a schedule goes on at `now` if the clock may have stepped back
/// since it was last written: its first tick at or after now that it has
/// not handled, and the record that keeps it so. Without a step this is
/// the first tick at or after now and after its last tick.
pub(crate) fn rebase(ticks: &Ticks, now: i64, h: Handled) -> Handled {
    let mut span = match (h.from, h.last) {
        (Some(from), Some(last)) if from <= last => Some((from, last)),
        (_, Some(last)) => Some((last, last)),
        _ => None,
    };
    let mut ahead = h.ahead;
    // A window the clock has reached joins the span behind it.
    if let Some((from, until)) = ahead.filter(|(from, _)| now >= *from) {
        span = Some(span.map_or((from, until), |(f, l)| (f.min(from), l.max(until))));
        ahead = None;
    }
    let ticks_ahead = ticks.clone().without(ahead);
    // The first tick at or after now that is not handled, ignoring the span.
    let unhandled_from_now = |ticks: &Ticks| match h.through {
        Some(through) if through >= now => ticks.next_after(through),
        _ => ticks.at_or_after(now),
    };
    let keep = |next| Handled {
        next,
        from: span.map(|(from, _)| from),
        last: span.map(|(_, last)| last),
        through: h.through,
        ahead,
    };
    match span {
        Some((from, last)) if now < from => {
            // Stepped back before the span: all of it lies ahead. (After a
            // second step back the span and the window merge: the ticks
            // between them are counted as handled, so none fires twice.)
            let window = (from, ahead.map_or(last, |(_, until)| until));
            match unhandled_from_now(ticks) {
                Some(tick) if tick < from => Handled {
                    next: Some(tick),
                    from: None,
                    last: None,
                    through: h.through,
                    ahead: Some(window),
                },
                _ => Handled {
                    next: ticks.next_after(window.1),
                    from: Some(window.0),
                    last: Some(window.1),
                    through: h.through,
                    ahead: None,
                },
            }
        }
        // Stepped back into the span: go on after it.
        Some((_, last)) if now <= last => keep(ticks_ahead.next_after(last)),
        _ => keep(unhandled_from_now(&ticks_ahead)),
    }
}

/// The template of a stored schedule's tick jobs.
pub(crate) fn template_of(s: &Schedule) -> NewJob {
    let mut job = NewJob::new(s.kind.clone())
        .payload(s.payload.clone())
        .queue(s.queue.clone())
        .priority(s.priority)
        .max_attempts(s.max_attempts);
    if let Some(timeout) = s.timeout {
        job = job.timeout(timeout);
    }
    job
}

/// The first tick at or after `now` and after `last` (a schedule's ticks
/// only move forward).
pub(crate) fn resume_point(ticks: &Ticks, now: i64, last: Option<i64>) -> Option<i64> {
    let from = match last {
        Some(last) => now.max(last.saturating_add(1)),
        None => now,
    };
    ticks.at_or_after(from)
}

/// What firing did, in one transaction.
#[derive(Debug, Default)]
pub(crate) struct Fired {
    pub(crate) jobs: Vec<JobId>,
    pub(crate) skipped: u64,
    /// Earlier runs to cancel once committed, with their schedule's name.
    pub(crate) replace: Vec<(String, JobId)>,
    /// Per handled tick: its schedule, its instant (ms) and its job
    /// (`None`: skipped by the overlap policy), for events.
    pub(crate) ticks: Vec<(String, i64, Option<JobId>)>,
}

impl Fired {
    /// Adds what firing another schedule did.
    pub(crate) fn add(&mut self, other: Fired) {
        self.jobs.extend(other.jobs);
        self.skipped += other.skipped;
        self.replace.extend(other.replace);
        self.ticks.extend(other.ticks);
    }
}

/// What a schedule written "after" now (the clock stepped back since it
/// was last written) is moved to: `Ok(Some(_))` its next unhandled tick
/// after now, when that is earlier than the one it has (logged); `Ok(None)`
/// when it keeps its ticks (only its `updated_at` moves to now); `Err` when
/// its expression cannot be read with this build (the engine pauses it).
/// The same rule for every engine's `rebase_stepped_in`.
pub(crate) fn stepped_back(
    schedule: &Schedule,
    handled: Handled,
    now: i64,
) -> Result<Option<Handled>> {
    let ticks = Ticks::new(&schedule.cron, &schedule.time_zone)?;
    let rebased = rebase(&ticks, now, handled);
    // Only ever earlier: ticks already due stay due.
    let earlier = match (rebased.next, handled.next) {
        (Some(new), Some(old)) => new < old,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !earlier {
        return Ok(None);
    }
    log::warn!(
        "schedule {:?}: the clock stepped back (it was last written at {}, now is {}); next tick {}",
        schedule.name,
        schedule.updated_at,
        crate::clock::ms_to_datetime(now),
        rebased
            .next
            .map_or("none".to_owned(), |t| crate::clock::ms_to_datetime(t).to_string())
    );
    Ok(Some(rebased))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis()
    }

    fn walk(t: &Ticks, from: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cur = t.at_or_after(from);
        while let Some(x) = cur {
            if out.len() == n {
                break;
            }
            out.push(x);
            cur = t.next_after(x);
        }
        out
    }

    #[test]
    fn utc_every_minute() {
        let t = Ticks::new("* * * * *", "UTC").unwrap();
        let from = ms(2026, 1, 1, 0, 0, 30);
        assert_eq!(
            walk(&t, from, 2),
            vec![ms(2026, 1, 1, 0, 1, 0), ms(2026, 1, 1, 0, 2, 0)]
        );
        assert_eq!(
            t.at_or_after(ms(2026, 1, 1, 0, 1, 0)),
            Some(ms(2026, 1, 1, 0, 1, 0))
        );
        assert_eq!(
            t.next_after(ms(2026, 1, 1, 0, 1, 0)),
            Some(ms(2026, 1, 1, 0, 2, 0))
        );
    }

    #[test]
    fn a_gap_tick_is_found_from_just_before_and_at_it() {
        let t = Ticks::new("30 2 * * *", "America/New_York").unwrap();
        let gap_end = ms(2026, 3, 8, 7, 0, 0);
        assert_eq!(t.at_or_after(gap_end), Some(gap_end));
        assert_eq!(t.next_after(gap_end - 1), Some(gap_end));
        assert_eq!(t.next_after(gap_end), Some(ms(2026, 3, 9, 6, 30, 0)));
    }

    #[test]
    fn latest_at_or_before_finds_the_last_tick() {
        let t = Ticks::new("0 3 * * *", "Europe/Berlin").unwrap();
        let first = t.at_or_after(ms(2023, 1, 1, 0, 0, 0)).unwrap();
        let now = ms(2026, 6, 15, 12, 0, 0);
        // 03:00 CEST = 01:00 UTC.
        assert_eq!(t.latest_at_or_before(first, now), ms(2026, 6, 15, 1, 0, 0));
    }

    #[test]
    fn plan_fire_all_takes_the_oldest() {
        let t = Ticks::new("0 * * * *", "UTC").unwrap();
        let first = ms(2026, 1, 1, 0, 0, 0);
        let now = ms(2026, 1, 2, 0, 0, 30);
        let p = plan(&t, first, now, MisfirePolicy::FireAll { max: 3 }, 60_000);
        assert_eq!(
            p.ticks,
            vec![
                first,
                first + 3_600_000,
                first + 7_200_000,
                ms(2026, 1, 2, 0, 0, 0)
            ]
        );
        assert_eq!(p.next, Some(ms(2026, 1, 2, 1, 0, 0)));
    }

    /// The tick set by definition, one minute at a time: a wall-clock
    /// match at its (first, unless every-hour) instant, or the first instant
    /// after a gap that swallowed a match (fixed-time expressions only).
    fn brute_force(t: &Ticks, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut s = from.div_euclid(60_000) * 60_000;
        while s <= to {
            let off = t.offset_ms(s);
            let wall = ms_to_datetime(s + off).naive_utc();
            let mut tick = t.cron.is_time_matching(&wall).unwrap()
                && (t.every_hour
                    || match t.tz.from_local_datetime(&wall) {
                        LocalResult::Ambiguous(first, _) => first.timestamp_millis() == s,
                        _ => true,
                    });
            let before = t.offset_ms(s - 1);
            if !tick && !t.every_hour && before < off {
                let mut gap = s + before;
                while gap < s + off {
                    if t.cron
                        .is_time_matching(&ms_to_datetime(gap).naive_utc())
                        .unwrap()
                    {
                        tick = true;
                    }
                    gap += 60_000;
                }
            }
            if tick && s >= from {
                out.push(s);
            }
            s += 60_000;
        }
        out
    }

    fn field(
        options: &'static [&'static str],
    ) -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(options)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The walk over spans of constant offset finds exactly the ticks
        /// of the definition, around real DST transitions.
        #[test]
        fn walk_matches_the_definition(
            minute in field(&["*", "*/15", "0", "30", "0,30", "10-50/20", "59"]),
            hour in field(&["*", "1", "2", "3", "*/2", "1-3", "0,12", "22-23"]),
            dom in field(&["*", "*", "1", "L", "25-31"]),
            dow in field(&["*", "*", "0", "SUN", "1-5", "6"]),
            zone in field(&["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "UTC", "America/Havana"]),
            day in field(&["2026-03-08", "2026-03-29", "2026-10-25", "2026-11-01", "2026-04-05", "2026-10-04", "2026-03-15"]),
            shift_minutes in -1500i64..1500,
        ) {
            let expression = format!("{minute} {hour} {dom} * {dow}");
            let t = Ticks::new(&expression, zone).unwrap();
            let base = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").unwrap()
                .and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp_millis();
            let from = base + shift_minutes * 60_000 - 86_400_000;
            let to = from + 2 * 86_400_000;
            let expected = brute_force(&t, from, to);
            let mut got = Vec::new();
            let mut cur = t.at_or_after(from);
            while let Some(x) = cur {
                if x > to {
                    break;
                }
                got.push(x);
                cur = t.next_after(x);
            }
            for &tick in &expected {
                // Each tick is found from just before it and from itself.
                proptest::prop_assert_eq!(t.at_or_after(tick), Some(tick));
                proptest::prop_assert_eq!(t.next_after(tick - 1), Some(tick));
            }
            proptest::prop_assert_eq!(got, expected, "{} in {}", expression, zone);
        }
    }
}
