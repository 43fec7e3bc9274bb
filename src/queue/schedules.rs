//! The schedule methods of [`Queue`]: storing, pausing and previewing
//! schedules, and firing due ticks (`Queue::fire`, the rules of misfire,
//! overlap and clock steps) through the engine's [`ScheduleTx`].

use super::Queue;
use crate::clock::ms_to_datetime;
use crate::engine::ScheduleTx;
use crate::error::{Error, Result};
use crate::job::{JobId, NewJob};
use crate::schedule::*;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// Most schedules one `run_due_ticks` transaction handles; more are done
/// in further short transactions.
const SCHEDULE_BATCH: i64 = 100;

impl Queue {
    /// Stores `job` due `delay` from now (read from the queue's clock); the
    /// same as `enqueue(job.delay(delay))`.
    ///
    /// # Errors
    /// As [`Queue::enqueue`].
    pub fn enqueue_in(&self, job: NewJob, delay: Duration) -> Result<JobId> {
        self.enqueue(job.delay(delay))
    }

    /// Stores `schedule`, or replaces the stored one of that name, and
    /// returns it as stored. Committed when this returns `Ok`. Its ticks
    /// fire wherever a [`Scheduler`](crate::Scheduler) runs on the file
    /// (every [`WorkerPool`](crate::WorkerPool) starts one by default); the
    /// rules are on [`NewSchedule`].
    ///
    /// A new schedule's first tick is the first at or after now. Replacing
    /// a schedule keeps its paused flag and its last tick; if the expression
    /// or the time zone changed, its next tick is recomputed as the first at
    /// or after now (and after its last tick), otherwise it is kept, so
    /// missed ticks stay missed.
    ///
    /// # Errors
    /// Nothing is stored on any of these: [`Error::InvalidSchedule`] (the
    /// expression does not parse, or can never fire, like `0 0 30 2 *`),
    /// [`Error::UnknownTimeZone`], [`Error::InvalidArgument`] (empty name,
    /// misfire grace over 1 h, `FireAll` max outside 1..=10 000), the job
    /// template's errors as [`Queue::enqueue`] would give them
    /// ([`Error::EmptyKind`], [`Error::PayloadTooLarge`], …);
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn upsert_schedule(&self, schedule: NewSchedule) -> Result<Schedule> {
        if schedule.name.is_empty() {
            return Err(Error::InvalidArgument(
                "schedule name is empty: give every schedule a name".into(),
            ));
        }
        if schedule.misfire_grace > MAX_MISFIRE_GRACE {
            return Err(Error::InvalidArgument(format!(
                "misfire grace of {:?} is over the limit of 1 hour",
                schedule.misfire_grace
            )));
        }
        if let MisfirePolicy::FireAll { max } = schedule.misfire {
            if !(1..=MAX_CATCH_UP).contains(&max) {
                return Err(Error::InvalidArgument(format!(
                    "MisfirePolicy::FireAll max is {max}: it must be 1 to {MAX_CATCH_UP} (use Skip for none)"
                )));
            }
        }
        let now = self.now_ms();
        let ticks = Ticks::new_firing(&schedule.cron, &schedule.time_zone, now)?;
        self.validate(schedule.template(), now)?;
        let payload = serde_json::to_string(&schedule.payload)?;
        let timeout_ms = schedule
            .timeout
            .map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
        self.engine()
            .upsert_schedule(&schedule, &ticks, &payload, timeout_ms)
    }

    /// Pauses the schedule: it fires nothing until resumed, and the ticks
    /// that fall meanwhile are never fired. Pausing a paused schedule does
    /// nothing.
    ///
    /// # Errors
    /// [`Error::UnknownSchedule`]; [`Error::Busy`], [`Error::Sqlite`].
    pub fn pause_schedule(&self, name: &str) -> Result<()> {
        self.engine().pause_schedule(name)
    }

    /// Resumes a paused schedule from its first tick at or after now (and
    /// after its last tick); the ticks that fell while it was paused are
    /// not fired. Resuming an active schedule does nothing.
    ///
    /// # Errors
    /// [`Error::UnknownSchedule`]; [`Error::InvalidSchedule`] or
    /// [`Error::UnknownTimeZone`] if the stored expression no longer parses
    /// with this build (replace it with [`Queue::upsert_schedule`]);
    /// [`Error::Busy`], [`Error::Sqlite`].
    pub fn resume_schedule(&self, name: &str) -> Result<()> {
        self.engine().resume_schedule(name)
    }

    /// Deletes the schedule; jobs its ticks already enqueued stay. Returns
    /// false if there was none of that name.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn delete_schedule(&self, name: &str) -> Result<bool> {
        self.engine().delete_schedule(name)
    }

    /// The stored schedule of this name.
    ///
    /// # Errors
    /// [`Error::UnknownSchedule`], [`Error::Sqlite`], [`Error::Pool`].
    pub fn get_schedule(&self, name: &str) -> Result<Schedule> {
        self.engine().get_schedule(name)
    }

    /// Every stored schedule, by name.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn list_schedules(&self) -> Result<Vec<Schedule>> {
        self.engine().list_schedules()
    }

    /// Previews the next `n` ticks, in UTC and on the schedule's wall
    /// clock, without storing anything: of a stored schedule (by name: its
    /// ticks at or after now and after its last tick, paused or not) or of a
    /// spec (its ticks at or after now). Fewer than `n` if the expression
    /// stops firing before year 5000.
    ///
    /// ```no_run
    /// # fn main() -> tickler::Result<()> {
    /// # let queue = tickler::Queue::open("jobs.db")?;
    /// let spec = tickler::NewSchedule::new("report", "0 9 * * MON-FRI", "report")
    ///     .time_zone("Europe/Berlin");
    /// for tick in queue.next_ticks(&spec, 3)? {
    ///     println!("{} ({})", tick.at, tick.local);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownSchedule`], [`Error::InvalidSchedule`],
    /// [`Error::UnknownTimeZone`], [`Error::Sqlite`], [`Error::Pool`].
    pub fn next_ticks<'a>(
        &self,
        schedule: impl Into<ScheduleRef<'a>>,
        n: usize,
    ) -> Result<Vec<Tick>> {
        let mut out = Vec::with_capacity(n.min(1024));
        out.extend(self.upcoming_ticks(schedule)?.take(n));
        Ok(out)
    }

    /// The ticks [`Queue::next_ticks`] previews, as an iterator that
    /// computes one tick at a time: memory stays flat however many are
    /// taken (`tickler schedule next -n <huge>` streams them). The start is
    /// read when this is called; nothing is stored.
    ///
    /// # Errors
    /// As [`Queue::next_ticks`].
    pub fn upcoming_ticks<'a>(
        &self,
        schedule: impl Into<ScheduleRef<'a>>,
    ) -> Result<UpcomingTicks> {
        let now = self.now_ms();
        let (ticks, cursor) = match schedule.into() {
            ScheduleRef::Name(name) => {
                let (stored, handled) = self.engine().schedule_and_handled(name)?;
                let ticks = Ticks::new(&stored.cron, &stored.time_zone)?;
                let handled = rebase(&ticks, now, handled);
                (ticks.without(handled.ahead), handled.next)
            }
            ScheduleRef::Spec(spec) => {
                let ticks = Ticks::new_firing(&spec.cron, &spec.time_zone, now)?;
                let first = ticks.at_or_after(now);
                (ticks, first)
            }
        };
        Ok(UpcomingTicks { ticks, cursor })
    }

    /// When the next tick of an active schedule is due (UTC); `None` with
    /// no active schedule. Now, if the wall clock stepped back since an
    /// active schedule was last written ([`Queue::run_due_ticks`] then moves
    /// it to its next tick after the new now). Two indexed reads; for
    /// schedulers that sleep until then.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>> {
        self.engine().next_schedule_tick()
    }

    /// Fires every due tick of every active schedule: each becomes one job
    /// (the schedule's template, run_at = the tick's instant, unique_key
    /// `tickler:schedule:<name>:<tick ms>`), missed ticks per the schedule's
    /// [`MisfirePolicy`], and the schedule's `next_tick_at` moves to its
    /// first tick after now, in the same `BEGIN IMMEDIATE` transaction
    /// (batches of 100 schedules per transaction). Safe to call from any
    /// number of threads and processes: a tick is enqueued once.
    ///
    /// The rules for DST nights, misfires and clock steps are on
    /// [`NewSchedule`].
    ///
    /// A schedule whose stored expression or template no longer validates
    /// with this build (a time zone dropped from the database, a payload
    /// over this queue's limit) is paused with an error in the log.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; ticks of
    /// earlier transactions stay fired.
    pub fn run_due_ticks(&self) -> Result<TickRun> {
        let mut run = TickRun::default();
        let mut replace = Vec::new();
        loop {
            let (fired, full, next) = self.engine().fire_due_schedules(&mut |tx, now| {
                tx.rebase_stepped(now)?;
                let due = tx.due_schedules(now, SCHEDULE_BATCH)?;
                let mut fired = Fired::default();
                for (schedule, handled) in &due {
                    fired.add(self.fire(tx, schedule, *handled, now)?);
                }
                let full = due.len() as i64 >= SCHEDULE_BATCH;
                Ok((fired, full, tx.next_tick(now)?))
            })?;
            if !fired.jobs.is_empty() {
                self.engine().wake_watchers();
            }
            run.jobs.extend(fired.jobs);
            run.skipped += fired.skipped;
            if self.events().active() {
                for (schedule, at, job_id) in fired.ticks {
                    self.events()
                        .emit(crate::events::Event::Tick(crate::events::TickEvent {
                            schedule,
                            tick_at: ms_to_datetime(at),
                            job_id,
                            at: self.clock().now(),
                        }));
                }
            }
            replace.extend(fired.replace);
            run.next_tick_at = next;
            if !full {
                break;
            }
        }
        // Replace: the new runs are committed; now fence the old ones. A run
        // that finished meanwhile needs nothing.
        for (schedule, id) in replace {
            match self.cancel(id) {
                Ok(()) => {
                    log::info!("schedule {schedule:?}: cancelled its earlier run {id} (overlap: replace)");
                    run.replaced.push(id);
                }
                Err(Error::InvalidState { .. } | Error::NotFound(_)) => {}
                Err(e) => log::error!(
                    "schedule {schedule:?}: cancelling its earlier run {id} (overlap: replace) failed: {e}"
                ),
            }
        }
        Ok(run)
    }

    /// Fires one due schedule's ticks in the engine's transaction `tx`:
    /// which ticks (misfire policy), which of them run (overlap policy), the
    /// jobs, and where the schedule goes on.
    fn fire(
        &self,
        tx: &dyn ScheduleTx,
        schedule: &Schedule,
        handled: Handled,
        now: i64,
    ) -> Result<Fired> {
        let Some(first_due) = handled.next else {
            return Ok(Fired::default());
        };
        let ticks = match Ticks::new(&schedule.cron, &schedule.time_zone) {
            Ok(ticks) => ticks.without(handled.ahead),
            Err(e) => {
                tx.pause_broken(schedule, now, &e)?;
                return Ok(Fired::default());
            }
        };
        let grace = grace_ms(schedule.misfire_grace);
        let plan = plan(&ticks, first_due, now, schedule.misfire, grace);
        let misfired = first_due < now.saturating_sub(grace);

        // Overlap: which of the planned ticks fire.
        let (fire, replace): (Vec<i64>, Vec<JobId>) = match schedule.overlap {
            OverlapPolicy::Allow => (plan.ticks.clone(), Vec::new()),
            OverlapPolicy::Forbid => match tx
                .unfinished_runs(&schedule.name)?
                .first()
                .copied()
                .or(tx.stopping_run(&schedule.name, now)?)
            {
                // Once the first fires, it is the unfinished run of the rest.
                None => (plan.ticks.iter().take(1).copied().collect(), Vec::new()),
                Some((id, state)) => {
                    if !plan.ticks.is_empty() {
                        log::info!(
                            "schedule {:?}: {} tick(s) up to {} skipped: its run {id} is {state} (overlap: forbid)",
                            schedule.name,
                            plan.ticks.len(),
                            ms_to_datetime(*plan.ticks.last().unwrap_or(&first_due))
                        );
                    }
                    (Vec::new(), Vec::new())
                }
            },
            OverlapPolicy::Replace => (
                plan.ticks.last().copied().into_iter().collect(),
                tx.unfinished_runs(&schedule.name)?
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect(),
            ),
        };
        let skipped = (plan.ticks.len() - fire.len()) as u64;
        if skipped > 0 && schedule.overlap == OverlapPolicy::Forbid && !fire.is_empty() {
            log::info!(
                "schedule {:?}: {skipped} catch-up tick(s) skipped behind the one fired (overlap: forbid)",
                schedule.name
            );
        }

        let template = template_of(schedule);
        let mut rows = Vec::with_capacity(fire.len());
        for &at in &fire {
            let job = template
                .clone()
                .run_at(ms_to_datetime(at))
                .unique_key(tick_key(&schedule.name, at));
            match self.validate(job, now) {
                Ok(row) => rows.push(row),
                Err(e) => {
                    tx.pause_broken(schedule, now, &e)?;
                    return Ok(Fired::default());
                }
            }
        }

        // Everything up to now is handled: fired, or skipped by a policy.
        let mut after = Handled {
            next: plan.next,
            from: handled.from,
            last: plan.ticks.last().copied().or(handled.last),
            through: handled.through,
            ahead: handled.ahead,
        };
        // Did the misfire policy drop ticks (not fire them)?
        let dropped = misfired
            && (plan.ticks.first() != Some(&first_due)
                || plan
                    .ticks
                    .windows(2)
                    .any(|w| ticks.next_after(w[0]) != Some(w[1])));
        if dropped {
            // The span restarts after the gap, so that the dropped ticks (a
            // forward jump of the clock stepped over them) can fire if the
            // clock is set back; everything before the gap stays handled.
            after.through = handled.last.max(handled.through).or(after.through);
            after.from = plan.ticks.first().copied();
        } else if after.from.is_none() {
            after.from = plan.ticks.first().copied();
        }
        if let Some((from, until)) = handled.ahead.filter(|(from, _)| now >= *from) {
            // The clock reached the window of ticks that fired before a
            // backward step: the span now runs through it.
            after.last = Some(after.last.map_or(until, |last| last.max(until)));
            after.from = Some(after.from.map_or(from, |f| f.min(from)));
            after.ahead = None;
        }
        let advanced = tx.advance(&schedule.name, first_due, &after, skipped, now)?;
        if !advanced {
            // Another scheduler handled these ticks first.
            return Ok(Fired::default());
        }
        let jobs = tx.insert_jobs(&rows, now)?;
        let fired_at: std::collections::HashMap<i64, JobId> =
            fire.iter().copied().zip(jobs.iter().copied()).collect();
        let ticks = plan
            .ticks
            .iter()
            .map(|at| (schedule.name.clone(), *at, fired_at.get(at).copied()))
            .collect();
        Ok(Fired {
            jobs,
            ticks,
            skipped,
            replace: replace
                .into_iter()
                .map(|id| (schedule.name.clone(), id))
                .collect(),
        })
    }
}
