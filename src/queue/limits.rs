//! Concurrency limits: the operator's calls (set, delete, read) and the
//! rules that keep a limit, written once for every engine and run by each
//! inside its own write transaction through its `LimitTx`.
//!
//! A slot is a lease: a job holds `weight` slots of its key exactly while
//! its row holds a lease (running, or stopping after a cancel), and the
//! count is read from the rows. Two rules keep the limit:
//!
//! - **after a claim** ([`settle`]), the limited jobs it took are checked
//!   against the rows, and those that do not fit are pushed back to
//!   `blocked` in the same transaction, with their attempt given back;
//! - **after a lease ends** (an outcome, the reaper, a holder that stopped,
//!   a stopping lease that ran out), the blocked jobs that now fit are made
//!   pending in the same transaction.
//!
//! Both run under the limit's lock (on a server engine the limit's row,
//! taken after the job rows, in the lock order `LimitTx` documents;
//! SQLite's single writer on a file), so a claim that blocks a job and a
//! release of the same key are never both unaware of each other:
//! whichever runs second sees the other's commit. A claim never reads
//! blocked jobs: they are in a state of their own.

use super::validate::check_limit_name;
use super::Queue;
use crate::engine::types::cut_error;
use crate::engine::LimitTx;
use crate::error::{Error, Result};
use crate::job::{JobId, LimitSlot};
use crate::lease::Lease;
use crate::limit::Rate;
use crate::limit::{Limit, LimitInfo, LimitKeyUsage};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

impl Queue {
    /// Stores the concurrency limit `name`, or changes it, for every
    /// process sharing the queue (see [`Limit`] for what it guarantees).
    /// Jobs name it with [`NewJob::limit`](crate::NewJob::limit). A raise
    /// hands the new slots to blocked jobs in the same transaction; a
    /// lowering lets the current holders finish and admits nothing until
    /// they weigh less than the new value. Setting it before the jobs that
    /// name it are enqueued is the usual order; set after, it limits the
    /// runs that start from then on.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use tickler::{Limit, NewJob};
    /// queue.set_limit("sync", Limit::per_key(1))?;
    /// queue.enqueue(NewJob::new("sync").limit("sync", "account-42"))?;
    /// # Ok::<(), tickler::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or too long name
    /// ([`crate::MAX_LIMIT_NAME_BYTES`]), a value of 0, a limit with
    /// neither `max_per_key` nor a rate, or a rate outside what
    /// [`Rate`] keeps (a period under 1 ms or over 366 days,
    /// more than one start per microsecond); the engine's
    /// errors ([`Error::Busy`], [`Error::Sqlite`], …);
    /// [`Error::Unsupported`] on an engine without limits.
    pub fn set_limit(&self, name: &str, limit: Limit) -> Result<()> {
        check_limit_name(name)?;
        if limit.max_per_key == Some(0) || limit.max_total == Some(0) {
            return Err(Error::InvalidArgument(format!(
                "limit {name:?}: max_per_key and max_total are at least 1 \
                 (delete the limit to stop limiting, pause the queue to stop running)"
            )));
        }
        if limit.max_per_key.is_none() && limit.rate.is_none() {
            return Err(Error::InvalidArgument(format!(
                "limit {name:?} limits nothing: give it a max_per_key (Limit::per_key) \
                 or a rate (Limit::rate), or both"
            )));
        }
        if let Some(rate) = &limit.rate {
            let period_ms = rate.period.as_millis();
            if rate.count == 0
                || period_ms == 0
                || rate.period.subsec_nanos() % 1_000_000 != 0
                || rate.period.as_micros() < u128::from(rate.count)
            {
                return Err(Error::InvalidArgument(format!(
                    "limit {name:?}: a rate of {} per {:?} is not one tickler keeps: count is at \
                     least 1, the period whole milliseconds and at least 1 ms, and the rate at \
                     most one start per microsecond",
                    rate.count, rate.period
                )));
            }
            if period_ms > MAX_RATE_PERIOD_MS {
                return Err(Error::InvalidArgument(format!(
                    "limit {name:?}: a rate's period is at most 366 days, not {:?}",
                    rate.period
                )));
            }
        }
        self.engine().set_limit(name, &limit)?;
        self.engine().wake_watchers();
        Ok(())
    }

    /// Deletes the limit `name`: its jobs run unlimited from now on, and
    /// the blocked ones become pending at once. Returns whether it
    /// existed.
    ///
    /// # Errors
    /// As [`Queue::set_limit`].
    pub fn delete_limit(&self, name: &str) -> Result<bool> {
        check_limit_name(name)?;
        let deleted = self.engine().delete_limit(name)?;
        self.engine().wake_watchers();
        Ok(deleted)
    }

    /// The stored limits, by name.
    ///
    /// # Errors
    /// The engine's read errors.
    pub fn limits(&self) -> Result<Vec<LimitInfo>> {
        self.engine().limits()
    }

    /// Each key with a job that is not finished, of limit `name` (of every
    /// limit for `None`), by limit and key: the weight its lease holders
    /// hold, and how many jobs hold, wait blocked and wait pending. Reads
    /// every unfinished limited job: an operator's reading, not a hot path.
    ///
    /// # Errors
    /// The engine's read errors.
    pub fn limit_usage(&self, name: Option<&str>) -> Result<Vec<LimitKeyUsage>> {
        self.engine().limit_usage(name)
    }

    /// One round of the reaper's safety sweep: the next [`SWEEP_KEYS`]
    /// keys with blocked jobs, each released if it has room. Returns how
    /// many jobs it made pending: each one a release that some path
    /// missed, counted in `tickler_limit_sweep_unblocked_total` and
    /// [`Ops::limit_sweep_unblocked`](crate::Ops::limit_sweep_unblocked),
    /// and logged; it should stay 0.
    pub(crate) fn sweep_limits_round(&self) -> Result<u64> {
        let state = &self.inner.limit_sweep;
        let after = state
            .after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (unblocked, next) = self.engine().sweep_limits(after.as_ref())?;
        *state.after.lock().unwrap_or_else(|e| e.into_inner()) = next;
        if unblocked > 0 {
            state
                .unblocked
                .fetch_add(unblocked, std::sync::atomic::Ordering::Relaxed);
            crate::observe::limit_sweep_unblocked(unblocked);
            log::warn!(
                "the limits' safety sweep found {unblocked} blocked job(s) with a free slot \
                 that no release had handed it to; they are pending now"
            );
            self.engine().wake_watchers();
        }
        Ok(unblocked)
    }

    /// A whole pass of the safety sweep, every key; see
    /// [`Manual::sweep_limits`](crate::Manual::sweep_limits).
    pub(crate) fn sweep_limits(&self) -> Result<u64> {
        *self
            .inner
            .limit_sweep
            .after
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        let mut total = 0;
        loop {
            total += self.sweep_limits_round()?;
            let done = self
                .inner
                .limit_sweep
                .after
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none();
            if done {
                return Ok(total);
            }
        }
    }

    /// Releases every key of every limit, as the sweep does, but counts
    /// nothing missed: after a queue was resumed, its blocked jobs may take
    /// slots that were free while they were passed over.
    pub(crate) fn release_all_limits(&self) -> Result<()> {
        let mut after = None;
        loop {
            let (_, next) = self.engine().sweep_limits(after.as_ref())?;
            match next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Holds back `key` of limit `name` until `until` in every process
    /// (see [`JobContext::rate_limited`](crate::JobContext::rate_limited));
    /// false if the limit has no rate.
    pub(crate) fn hold_rate(
        &self,
        lease: &Lease,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool> {
        let Some(slot) = &lease.limit else {
            return Ok(false);
        };
        let until = until.timestamp_millis().min(crate::MAX_TIMESTAMP_MS);
        let run = Some((lease.job_id, lease.run_token.0.as_str()));
        self.engine().hold_rate(&slot.name, &slot.key, until, run)
    }

    /// See [`Ops::limit_sweep_unblocked`](crate::Ops::limit_sweep_unblocked).
    pub(crate) fn limit_sweep_unblocked(&self) -> u64 {
        self.inner
            .limit_sweep
            .unblocked
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The safety sweep's place and findings in this process.
#[derive(Debug, Default)]
pub(crate) struct SweepState {
    after: std::sync::Mutex<Option<(String, String)>>,
    unblocked: std::sync::atomic::AtomicU64,
}

/// The longest period of a rate, in ms: 366 days.
const MAX_RATE_PERIOD_MS: u128 = 366 * 24 * 3_600_000;

/// Most blocked jobs a deleted limit's release makes pending per key in
/// one transaction (deleting it makes them all pending at once).
pub(crate) const RELEASE_MAX: i64 = 1_000;

/// Keys the reaper's sweep looks at per pass, and keys besides the freed
/// ones a release under a limit with a `max_total` looks at (a slot freed
/// by one key may go to any other).
pub(crate) const SWEEP_KEYS: i64 = 64;

/// How a release counts the room of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// What the holders leave: right after a lease ended, every slot it
    /// freed is handed on, even if a pending job of the key might take it
    /// (a claim pushes back whatever does not fit).
    Freed,
    /// What the holders and the pending jobs (of queues not paused) leave:
    /// a sweep hands on only slots no one is about to take, so what it
    /// finds is a release that was missed.
    Unclaimed,
}

/// What a transaction did to limits: runs pushed back, jobs made pending,
/// runs deferred over a rate, each job's change as this process's
/// subscribers are told it once the transaction committed.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Settled {
    pub blocked: u64,
    pub unblocked: u64,
    pub deferred: u64,
    pub changes: Vec<LimitChange>,
}

/// A limited job's change of state in a transaction: pushed back to
/// `blocked`, made pending by a freed slot, or deferred by its rate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LimitChange {
    pub job_id: JobId,
    pub kind: String,
    pub queue: String,
    /// The run's attempt, for a run pushed back or deferred.
    pub attempt: Option<u32>,
    pub what: crate::events::JobEventKind,
}

impl LimitChange {
    fn of_run(lease: &Lease, what: crate::events::JobEventKind) -> Self {
        LimitChange {
            job_id: lease.job_id,
            kind: lease.kind.clone(),
            queue: lease.queue.clone(),
            attempt: Some(lease.attempt),
            what,
        }
    }

    /// The event, emitted at `at`.
    pub(crate) fn event(self, at: chrono::DateTime<chrono::Utc>) -> crate::events::Event {
        crate::events::Event::Job(crate::events::JobEvent {
            what: self.what,
            job_id: self.job_id,
            kind: self.kind,
            queue: self.queue,
            attempt: self.attempt,
            queue_time: None,
            run_time: None,
            at,
        })
    }
}

impl Settled {
    /// Adds what a later step of the same transaction did.
    pub(crate) fn add(&mut self, other: Settled) {
        self.blocked += other.blocked;
        self.unblocked += other.unblocked;
        self.deferred += other.deferred;
        self.changes.extend(other.changes);
    }
}

/// Keeps the limits after the engine's transaction ended the leases of
/// `freed` (the slots they held) and claimed `claimed` (in claim order):
/// returns the claimed leases that fit, having pushed the others back to
/// `blocked` (a job heavier than its limit can ever hold is made dead,
/// saying why), and made pending the blocked jobs that now fit. Cheap when
/// nothing is limited: no statement at all.
pub(crate) fn settle(
    tx: &mut dyn LimitTx,
    freed: &[&LimitSlot],
    claimed: Vec<Lease>,
    now: i64,
) -> Result<(Vec<Lease>, Settled)> {
    let mut names: BTreeSet<&str> = freed.iter().map(|s| s.name.as_str()).collect();
    names.extend(
        claimed
            .iter()
            .filter_map(|l| l.limit.as_ref())
            .map(|s| s.name.as_str()),
    );
    if names.is_empty() {
        return Ok((claimed, Settled::default()));
    }
    let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
    let limits = tx.lock_limits(&names)?;
    let mut settled = Settled::default();
    let (kept, deferred) = admit(tx, &limits, claimed, now, &mut settled)?;
    let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for slot in freed {
        keys.entry(&slot.name).or_default().insert(&slot.key);
    }
    // A run deferred over its rate gave back the slot its claim took,
    // maybe one a release had just handed it: it goes on to the next
    // blocked job of its key, as any freed slot does.
    for slot in &deferred {
        keys.entry(&slot.name).or_default().insert(&slot.key);
    }
    for (name, keys) in keys {
        // A limit of rate alone frees no slot: nothing waits blocked on it
        // (setting it so released those that did).
        if limits
            .get(name)
            .is_some_and(|l| l.max_per_key.is_none() && l.max_total.is_none())
        {
            continue;
        }
        let keys: Vec<&str> = keys.into_iter().collect();
        settled.unblocked += release(
            tx,
            name,
            limits.get(name),
            &keys,
            Room::Freed,
            now,
            &mut settled.changes,
        )?;
    }
    Ok((kept, settled))
}

/// The claimed leases that fit under their limits, in claim order; the
/// others are pushed back (or made dead if they can never fit), or, over
/// a rate, deferred to the instant they may start (their slots are
/// returned second).
fn admit(
    tx: &mut dyn LimitTx,
    limits: &HashMap<String, Limit>,
    claimed: Vec<Lease>,
    now: i64,
    settled: &mut Settled,
) -> Result<(Vec<Lease>, Vec<LimitSlot>)> {
    if claimed.iter().all(|l| l.limit.is_none()) {
        return Ok((claimed, Vec::new()));
    }
    // What the rows hold besides this claim, per key and per limit; the
    // rows already count this claim's runs.
    let mut held: HashMap<(String, String), i64> = HashMap::new();
    let mut total: HashMap<String, i64> = HashMap::new();
    let mut ours: HashMap<(String, String), i64> = HashMap::new();
    let mut ours_total: HashMap<String, i64> = HashMap::new();
    let mut rated = Vec::new();
    for lease in &claimed {
        let Some(slot) = &lease.limit else { continue };
        *ours
            .entry((slot.name.clone(), slot.key.clone()))
            .or_default() += weight(slot);
        *ours_total.entry(slot.name.clone()).or_default() += weight(slot);
        if limits.get(&slot.name).is_some_and(|l| l.rate.is_some()) {
            rated.push(lease.job_id);
        }
    }
    for (name_key, own) in &ours {
        if limits
            .get(&name_key.0)
            .is_some_and(|l| l.max_per_key.is_some())
        {
            let rows = tx.held(&name_key.0, Some(&name_key.1), now)?;
            held.insert(name_key.clone(), rows - own);
        }
    }
    for (name, own) in &ours_total {
        if limits.get(name).is_some_and(|l| l.max_total.is_some()) {
            total.insert(name.clone(), tx.held(name, None, now)? - own);
        }
    }
    let deferred_runs = if rated.is_empty() {
        HashSet::new()
    } else {
        tx.deferred_runs(&rated)?
    };
    // Runs deferred to now first: they are the head of their key's line,
    // ahead of runs the claim took beside them (due earlier, by run_at).
    let (mut claimed, rest): (Vec<Lease>, Vec<Lease>) = claimed
        .into_iter()
        .partition(|l| deferred_runs.contains(&l.job_id));
    claimed.extend(rest);
    let mut rates = Rates::default();
    let mut kept = Vec::with_capacity(claimed.len());
    let mut pushed = Vec::new();
    let mut never = Vec::new();
    let mut deferred = Vec::new();
    for lease in claimed {
        let Some(slot) = &lease.limit else {
            kept.push(lease);
            continue;
        };
        let Some(limit) = limits.get(&slot.name) else {
            // A limit that is not set limits nothing.
            kept.push(lease);
            continue;
        };
        let w = weight(slot);
        let per_key = limit.max_per_key.map(i64::from);
        let max_total = limit.max_total.map(i64::from);
        if per_key.is_some_and(|p| w > p) || max_total.is_some_and(|t| w > t) {
            never.push(lease);
            continue;
        }
        let name_key = (slot.name.clone(), slot.key.clone());
        let fits_key = match per_key {
            Some(p) => held.get(&name_key).copied().unwrap_or(0) + w <= p,
            None => true,
        };
        let fits_total = match max_total {
            Some(t) => total.get(&slot.name).copied().unwrap_or(0) + w <= t,
            None => true,
        };
        if !(fits_key && fits_total) {
            pushed.push(lease);
            continue;
        }
        if let Some(rate) = &limit.rate {
            let deferred_run = deferred_runs.contains(&lease.job_id);
            let state = rates.get(tx, &slot.name, &slot.key, now)?;
            if let Rated::Defer(at) = decide(rate, state, now, deferred_run) {
                deferred.push((lease, at));
                continue;
            }
        }
        if per_key.is_some() {
            *held.entry(name_key).or_default() += w;
        }
        if max_total.is_some() {
            *total.entry(slot.name.clone()).or_default() += w;
        }
        kept.push(lease);
    }
    rates.store(tx)?;
    if !pushed.is_empty() {
        let leases: Vec<&Lease> = pushed.iter().collect();
        tx.block(&leases)?;
        settled.blocked += pushed.len() as u64;
        settled.changes.extend(pushed.iter().filter_map(|lease| {
            let slot = lease.limit.as_ref()?;
            Some(LimitChange::of_run(
                lease,
                crate::events::JobEventKind::Blocked {
                    limit: slot.name.clone(),
                    key: slot.key.clone(),
                },
            ))
        }));
    }
    let mut deferred_slots = Vec::new();
    if !deferred.is_empty() {
        let runs: Vec<(&Lease, i64)> = deferred.iter().map(|(l, at)| (l, *at)).collect();
        tx.defer(&runs)?;
        settled.deferred += deferred.len() as u64;
        settled
            .changes
            .extend(deferred.iter().filter_map(|(lease, at)| {
                let slot = lease.limit.as_ref()?;
                Some(LimitChange::of_run(
                    lease,
                    crate::events::JobEventKind::Deferred {
                        limit: slot.name.clone(),
                        key: slot.key.clone(),
                        until: crate::clock::ms_to_datetime(*at),
                    },
                ))
            }));
        deferred_slots.extend(deferred.iter().filter_map(|(l, _)| l.limit.clone()));
    }
    for lease in never {
        let slot = lease.limit.as_ref().expect("a limited lease");
        let limit = limits[&slot.name];
        let error = cut_error(&too_heavy(slot.weight.into(), &slot.name, &limit, "")).into_owned();
        tx.bury(lease.job_id, &lease.run_token.0, &error, now)?;
        settled.changes.push(LimitChange::of_run(
            &lease,
            crate::events::JobEventKind::Dead { error },
        ));
    }
    Ok((kept, deferred_slots))
}

/// Why a job heavier than its limit can never run.
fn too_heavy(weight: i64, name: &str, limit: &Limit, now: &str) -> String {
    let mut allows = Vec::new();
    if let Some(p) = limit.max_per_key {
        allows.push(format!("max_per_key {p}"));
    }
    if let Some(t) = limit.max_total {
        allows.push(format!("max_total {t}"));
    }
    format!(
        "this job takes {weight} slots of limit {name:?} (limit_weight), more than it allows{now} \
         ({}): it can never run; enqueue it with a smaller weight or raise the limit, \
         then retry it",
        allows.join(", ")
    )
}

/// Makes pending the blocked jobs of `keys` of limit `name` that fit now,
/// each key's in claim order (first in, first out per key, so a heavy job
/// is not passed for ever by light ones of its key); returns how many.
/// Under a limit with a `max_total`, the freed keys come first, then the
/// keys after them with blocked jobs, round the key order: one busy key
/// never keeps a slot from another. A blocked job heavier than the limit
/// now allows (it was lowered) can never run: it is made dead, saying why.
/// Blocked jobs of paused queues are left: a slot goes to a job that can
/// run (resuming the queue releases its keys).
fn release(
    tx: &mut dyn LimitTx,
    name: &str,
    limit: Option<&Limit>,
    keys: &[&str],
    room_of: Room,
    now: i64,
    changes: &mut Vec<LimitChange>,
) -> Result<u64> {
    let mut made_pending: Vec<(Blocked, String)> = Vec::new();
    let note = |changes: &mut Vec<LimitChange>, made_pending: Vec<(Blocked, String)>| {
        changes.extend(made_pending.into_iter().map(|(job, key)| LimitChange {
            job_id: job.id,
            kind: job.kind,
            queue: job.queue,
            attempt: None,
            what: crate::events::JobEventKind::Unblocked {
                limit: name.to_owned(),
                key,
            },
        }));
    };
    let mut dead_notes = Vec::new();
    let Some(limit) = limit else {
        // Deleted or never set: nothing limits its jobs any more.
        let mut ids = Vec::new();
        for key in keys {
            for job in tx.blocked(name, key, RELEASE_MAX)? {
                ids.push(job.id);
                made_pending.push((job, (*key).to_owned()));
            }
        }
        tx.unblock(&ids)?;
        note(changes, made_pending);
        return Ok(ids.len() as u64);
    };
    let per_key = limit.max_per_key.map_or(i64::MAX, i64::from);
    let max_total = limit.max_total.map(i64::from);
    let mut total_room = match max_total {
        Some(t) => {
            let mut room = t - tx.held(name, None, now)?;
            if room_of == Room::Unclaimed {
                room -= tx.pending(name, None)?;
            }
            if room <= 0 {
                return Ok(0);
            }
            room
        }
        None => i64::MAX,
    };
    let mut order: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    if max_total.is_some() {
        let last = (
            name.to_owned(),
            keys.last().map_or(String::new(), |k| (*k).to_owned()),
        );
        let mut more = tx.blocked_keys(Some(&last), Some(name), SWEEP_KEYS)?;
        if (more.len() as i64) < SWEEP_KEYS {
            more.extend(tx.blocked_keys(None, Some(name), SWEEP_KEYS)?);
        }
        for (_, key) in more {
            if !order.contains(&key) {
                order.push(key);
            }
        }
    }
    let mut ids = Vec::new();
    let mut doomed = Vec::new();
    for key in &order {
        if total_room <= 0 {
            break;
        }
        let mut room = match limit.max_per_key {
            Some(_) => per_key - tx.held(name, Some(key), now)?,
            None => i64::MAX,
        };
        if room_of == Room::Unclaimed && limit.max_per_key.is_some() {
            room -= tx.pending(name, Some(key))?;
        }
        let mut room = room.min(total_room);
        if room <= 0 {
            continue;
        }
        // Each takes at least one slot: `room` jobs at most, and the
        // doomed ones besides.
        for job in tx.blocked(name, key, room.saturating_add(8).min(RELEASE_MAX))? {
            let w = job.weight;
            if w > per_key || max_total.is_some_and(|t| w > t) {
                doomed.push((job.id, w));
                dead_notes.push(job);
                continue;
            }
            if w > room {
                break;
            }
            room -= w;
            total_room -= w;
            ids.push(job.id);
            made_pending.push((job, key.clone()));
            if room == 0 {
                break;
            }
        }
    }
    for ((id, w), job) in doomed.into_iter().zip(dead_notes) {
        let error = cut_error(&too_heavy(w, name, limit, " now")).into_owned();
        tx.doom(id, &error, now)?;
        changes.push(LimitChange {
            job_id: job.id,
            kind: job.kind,
            queue: job.queue,
            attempt: None,
            what: crate::events::JobEventKind::Dead { error },
        });
    }
    tx.unblock(&ids)?;
    note(changes, made_pending);
    Ok(ids.len() as u64)
}

/// The reaper's safety sweep: up to [`SWEEP_KEYS`] keys with blocked
/// jobs, after `after` (name, key) in key order, released as if a slot of
/// each had just been freed. Returns how many jobs it made pending (each
/// one a wake-up some release missed, so it should stay 0) and where to
/// go on from (`None`: the end was reached, start over).
pub(crate) fn sweep(
    tx: &mut dyn LimitTx,
    after: Option<&(String, String)>,
    now: i64,
) -> Result<(u64, Option<(String, String)>)> {
    let keys = tx.blocked_keys(after, None, SWEEP_KEYS)?;
    let next = if keys.len() as i64 >= SWEEP_KEYS {
        keys.last().cloned()
    } else {
        None
    };
    Ok((release_keys(tx, keys, now)?, next))
}

/// Makes pending every blocked job of limit `name` that fits now, key by
/// key: after the limit was raised, or set for jobs that named it first.
pub(crate) fn release_limit(tx: &mut dyn LimitTx, name: &str, now: i64) -> Result<()> {
    let mut after = None;
    loop {
        let keys = tx.blocked_keys(after.as_ref(), Some(name), SWEEP_KEYS)?;
        let Some(last) = keys.last().cloned() else {
            return Ok(());
        };
        release_keys(tx, keys, now)?;
        after = Some(last);
    }
}

/// Releases `keys` (limit, key) under their locks, counting as room only
/// what neither holders nor pending jobs take; returns how many jobs it
/// made pending.
pub(crate) fn release_keys(
    tx: &mut dyn LimitTx,
    keys: Vec<(String, String)>,
    now: i64,
) -> Result<u64> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, key) in keys {
        by_name.entry(name).or_default().push(key);
    }
    let names: Vec<String> = by_name.keys().cloned().collect();
    if names.is_empty() {
        return Ok(0);
    }
    let limits = tx.lock_limits(&names)?;
    let mut unblocked = 0;
    for (name, mut keys) in by_name {
        keys.sort();
        keys.dedup();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Not reported: the reaper's sweep and an operator's change of a
        // limit are no run of this process's.
        unblocked += release(
            tx,
            &name,
            limits.get(&name),
            &keys,
            Room::Unclaimed,
            now,
            &mut Vec::new(),
        )?;
    }
    Ok(unblocked)
}

/// A limit's rate as its stored columns: count, period (ms), burst.
pub(crate) fn rate_columns(limit: &Limit) -> (Option<i64>, Option<i64>, i64) {
    match &limit.rate {
        Some(rate) => (
            Some(i64::from(rate.count)),
            Some(i64::try_from(rate.period.as_millis()).unwrap_or(i64::MAX)),
            i64::from(rate.burst),
        ),
        None => (None, None, 0),
    }
}

fn weight(slot: &LimitSlot) -> i64 {
    i64::from(slot.weight.max(1))
}

/// A blocked job as a `LimitTx` reads it: enough to hand it a slot and to
/// tell this process's subscribers that it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub id: JobId,
    /// Slots it takes.
    pub weight: i64,
    pub kind: String,
    pub queue: String,
}

/// A rated key's stored GCRA state (the table `tickler_limit_rates`):
/// `tat` and `horizon` in microseconds, `seen` in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateState {
    /// When the key's next start is due at the steady rate.
    pub tat: i64,
    /// The last instant handed to a job deferred over the rate.
    pub horizon: i64,
    /// The latest engine time that read it.
    pub seen: i64,
}

/// A key that has never started: every instant is long past.
pub(crate) const NEVER: i64 = i64::MIN / 4;

/// A step back of the clock smaller than this (ms) is not told from the
/// skew between processes: two processes on a server engine read its
/// clock through offsets sampled apart, and one behind the other by a
/// second must not move a key back at each of its claims (which would let
/// the two start the key's runs twice as often). A smaller step holds a
/// key back by at most itself.
pub(crate) const STEP_BACK_MS: i64 = 60_000;

/// A rated key not seen for this long (ms), whose state has run out, is
/// forgotten: one row per key ever used would otherwise stay for ever.
pub(crate) const FORGET_MS: i64 = 3_600_000;

/// What a rate says of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rated {
    Start,
    /// Deferred to this instant (ms).
    Defer(i64),
}

/// The rated keys one transaction read, written back at its end.
#[derive(Default)]
struct Rates {
    keys: BTreeMap<(String, String), RateState>,
}

impl Rates {
    /// The state of `key` of limit `name`, read once per transaction
    /// (moved back first if the clock stepped back since it was seen).
    fn get(
        &mut self,
        tx: &mut dyn LimitTx,
        name: &str,
        key: &str,
        now: i64,
    ) -> Result<&mut RateState> {
        let name_key = (name.to_owned(), key.to_owned());
        if !self.keys.contains_key(&name_key) {
            let state = read_rate(tx, name, key, now)?;
            self.keys.insert(name_key.clone(), state);
        }
        Ok(self.keys.get_mut(&name_key).expect("inserted above"))
    }

    fn store(self, tx: &mut dyn LimitTx) -> Result<()> {
        for ((name, key), state) in self.keys {
            tx.store_rate_state(&name, &key, &state)?;
        }
        Ok(())
    }
}

/// The state of `key` of limit `name` at `now` (ms): as stored, or moved
/// back by the step if the clock stepped back since it was last seen,
/// with the key's deferred jobs (their instants were read on the clock
/// before the step, so each would wait the step out as well).
fn read_rate(tx: &mut dyn LimitTx, name: &str, key: &str, now: i64) -> Result<RateState> {
    let Some(mut state) = tx.rate_state(name, key)? else {
        return Ok(RateState {
            tat: NEVER,
            horizon: NEVER,
            seen: now,
        });
    };
    if state.seen - now <= STEP_BACK_MS {
        state.seen = state.seen.max(now);
    } else {
        let step = state.seen - now;
        state.tat = state.tat.saturating_sub(step.saturating_mul(1_000));
        state.horizon = state.horizon.saturating_sub(step.saturating_mul(1_000));
        tx.shift_deferred(name, key, -step)?;
        log::warn!(
            "the clock stepped back {step} ms (limit {name:?}, key {key:?}): the key's rate \
             and its deferred jobs moved back with it"
        );
        state.seen = now;
    }
    Ok(state)
}

/// GCRA for one run of a rated key at `now` (ms), moving `state`. A run
/// starts if the key is not ahead of its steady rate by more than its
/// tolerance, and either it was deferred to this instant (its turn) or no
/// deferred run waits (the last instant handed out is past); otherwise it is deferred to the end of the key's
/// line: one interval after the last instant handed out, and not before
/// it may start. A deferred run that does not fit when it comes due (the
/// key's runs were claimed late, and more came due at once than the burst
/// lets start) goes to the end of the line too: an instant nearer would
/// be one another run of the line already holds, and each would push the
/// next, again and again.
fn decide(rate: &Rate, state: &mut RateState, now: i64, deferred_run: bool) -> Rated {
    let now_us = now.saturating_mul(1_000);
    let interval = rate.interval_us();
    let earliest = state.tat.saturating_sub(rate.tolerance_us());
    state.seen = state.seen.max(now);
    if now_us >= earliest && (deferred_run || state.horizon < now_us) {
        state.tat = state.tat.max(now_us).saturating_add(interval);
        return Rated::Start;
    }
    let at = earliest
        .max(now_us)
        .max(state.horizon.saturating_add(interval));
    state.horizon = at;
    // Whole milliseconds, rounded up: never before the instant it may start.
    let at_ms = at.saturating_add(999).div_euclid(1_000);
    Rated::Defer(at_ms.min(crate::MAX_TIMESTAMP_MS))
}

/// Holds back `key` of limit `name` until `until` (ms) in every process:
/// its next start is due then, and runs claimed meanwhile are deferred to
/// after it (a handler told by the remote side to wait,
/// [`JobContext::rate_limited`](crate::JobContext::rate_limited)). `run`,
/// the handler's own run (job, run_token), is marked as deferred to
/// `until`, so that its snooze keeps its turn at the head of the line.
/// Returns false if the limit has no rate, which holds nothing back.
pub(crate) fn hold_rate(
    tx: &mut dyn LimitTx,
    name: &str,
    key: &str,
    until: i64,
    run: Option<(JobId, &str)>,
    now: i64,
) -> Result<bool> {
    // The run's row before the limit's (the lock order of `LimitTx`): a
    // reaper taking its lease back holds the row and waits for the limit.
    if let Some((job_id, run_token)) = run {
        tx.lock_run(job_id, run_token)?;
    }
    let limits = tx.lock_limits(&[name.to_owned()])?;
    let Some(rate) = limits.get(name).and_then(|l| l.rate) else {
        return Ok(false);
    };
    let mut state = read_rate(tx, name, key, now)?;
    let until_us = until.saturating_mul(1_000);
    state.tat = state.tat.max(until_us.saturating_add(rate.tolerance_us()));
    state.horizon = state.horizon.max(until_us);
    tx.store_rate_state(name, key, &state)?;
    if let Some((job_id, run_token)) = run {
        tx.mark_deferred(job_id, run_token, until)?;
    }
    Ok(true)
}

/// After limit `name` was set (it was `old`, it is `new`; `None`: not
/// stored) under its lock: if its rate changed, the jobs deferred under
/// the old one are lined up again under the new one (due now, in order:
/// each claim defers again what the new rate does not let start), rather
/// than waiting out instants the old rate gave; then its blocked jobs that
/// now fit are released.
pub(crate) fn limit_set(
    tx: &mut dyn LimitTx,
    name: &str,
    old: Option<&Limit>,
    new: Option<&Limit>,
    now: i64,
) -> Result<()> {
    let (old_rate, new_rate) = (old.and_then(|l| l.rate), new.and_then(|l| l.rate));
    if old_rate != new_rate {
        tx.reline_deferred(name, now, new_rate.is_some())?;
        // A key's next start was its last start and the old interval: it
        // is its last start and the new one now.
        let shift = match (old_rate, new_rate) {
            (Some(old), Some(new)) => Some(new.interval_us() - old.interval_us()),
            (None, Some(_)) => Some(0),
            (_, None) => None,
        };
        tx.reset_rates(name, shift)?;
    }
    if new.is_some() {
        release_limit(tx, name, now)?;
    }
    Ok(())
}

/// After a deferred job of `key` of limit `name` left its line other than
/// by starting (it was cancelled): the end of the line is the last
/// deferred job that still waits, so that a job claimed next does not
/// queue behind instants no one holds.
pub(crate) fn reline_key(tx: &mut dyn LimitTx, name: &str, key: &str, now: i64) -> Result<()> {
    tx.lock_limits(&[name.to_owned()])?;
    let Some(mut state) = tx.rate_state(name, key)? else {
        return Ok(());
    };
    let last = tx
        .last_deferred(name, key)?
        .map_or(NEVER, |at| at.saturating_mul(1_000));
    if last < state.horizon {
        state.horizon = last;
        state.seen = state.seen.max(now);
        tx.store_rate_state(name, key, &state)?;
    }
    Ok(())
}

/// The reaper's upkeep of rate states: up to [`SWEEP_KEYS`] rated keys
/// that saw a later time than `now` (the clock stepped back), each moved
/// back with its deferred jobs (see [`read_rate`]); and up to as many not
/// seen for [`FORGET_MS`] whose state ran out (nothing deferred, every
/// start of the burst back), forgotten. Returns how many keys it changed.
pub(crate) fn upkeep_rates(tx: &mut dyn LimitTx, now: i64) -> Result<u64> {
    let stepped = tx.rates_seen_after(now + STEP_BACK_MS, SWEEP_KEYS)?;
    let unused = tx.rates_seen_before(now - FORGET_MS, SWEEP_KEYS)?;
    if stepped.is_empty() && unused.is_empty() {
        return Ok(0);
    }
    let mut names: Vec<String> = stepped
        .iter()
        .chain(&unused)
        .map(|(n, _)| n.clone())
        .collect();
    names.sort();
    names.dedup();
    let limits = tx.lock_limits(&names)?;
    let mut changed = 0;
    for (name, key) in &stepped {
        let state = read_rate(tx, name, key, now)?;
        tx.store_rate_state(name, key, &state)?;
        changed += 1;
    }
    let now_us = now.saturating_mul(1_000);
    for (name, key) in &unused {
        let Some(state) = tx.rate_state(name, key)? else {
            continue;
        };
        let tolerance = limits
            .get(name)
            .and_then(|l| l.rate)
            .map_or(0, |r| r.tolerance_us());
        let spent = state.tat <= now_us.saturating_sub(tolerance) && state.horizon <= now_us;
        if spent && tx.last_deferred(name, key)?.is_none() {
            tx.forget_rate(name, key)?;
        } else {
            // Still in use (a hold, a long line): looked at again in an hour.
            let seen = RateState { seen: now, ..state };
            tx.store_rate_state(name, key, &seen)?;
        }
        changed += 1;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rate(count: u32, period_ms: u64, burst: u32) -> Rate {
        Rate {
            count,
            period: Duration::from_millis(period_ms),
            burst,
        }
    }

    fn fresh(now: i64) -> RateState {
        RateState {
            tat: NEVER,
            horizon: NEVER,
            seen: now,
        }
    }

    #[test]
    fn a_backlog_starts_one_per_interval_each_deferred_once_in_order() {
        let rate = rate(10, 1_000, 0);
        let mut key = fresh(0);
        // 30 jobs claimed at t = 0: the first starts, the others are
        // deferred 100 ms apart.
        assert_eq!(decide(&rate, &mut key, 0, false), Rated::Start);
        let slots: Vec<Rated> = (1..30).map(|_| decide(&rate, &mut key, 0, false)).collect();
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(*slot, Rated::Defer(100 * (i as i64 + 1)));
        }
        // Each starts at its instant, a deferred run; a new job waits behind.
        for i in 1..30 {
            let at = 100 * i;
            assert_eq!(decide(&rate, &mut key, at, true), Rated::Start, "slot {i}");
            if i == 5 {
                assert_eq!(decide(&rate, &mut key, at, false), Rated::Defer(3_000));
            }
        }
    }

    #[test]
    fn a_burst_starts_at_once_after_a_quiet_spell_then_the_steady_rate() {
        let rate = rate(10, 1_000, 3);
        let mut key = fresh(0);
        let started = (0..10)
            .map(|_| decide(&rate, &mut key, 5_000, false))
            .take_while(|r| *r == Rated::Start)
            .count();
        assert_eq!(started, 4, "the steady start and a burst of 3");
    }

    #[test]
    fn a_rate_over_one_a_millisecond_starts_as_many_at_each_as_it_allows() {
        let rate = rate(3_000, 1_000, 0);
        let mut key = fresh(0);
        let at_once = (0..10)
            .map(|_| decide(&rate, &mut key, 7, false))
            .take_while(|r| *r == Rated::Start)
            .count();
        assert_eq!(at_once, 3);
    }

    /// Claims at random whole milliseconds, each of the deferred runs now
    /// due and of a few new ones: in every span of the period, at most
    /// count + burst start, whatever the rate, the burst and the gaps.
    #[test]
    fn no_span_of_a_period_holds_more_than_count_plus_burst_starts() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..300 {
            let count = rng.u32(1..40);
            let period = rng.u64(1..3_000);
            if u128::from(count) > u128::from(period) * 1_000 {
                continue;
            }
            let rate = rate(count, period, rng.u32(0..4));
            let mut key = fresh(0);
            let mut deferred: Vec<i64> = Vec::new();
            let mut starts: Vec<i64> = Vec::new();
            let mut now = 0i64;
            for _ in 0..400 {
                now += rng.i64(0..=(2 * period as i64 / i64::from(count)).max(1));
                deferred.sort_unstable();
                let due: Vec<i64> = deferred.iter().copied().filter(|at| *at <= now).collect();
                deferred.retain(|at| *at > now);
                let runs = due
                    .iter()
                    .map(|_| true)
                    .chain((0..rng.usize(0..4)).map(|_| false));
                for deferred_run in runs.collect::<Vec<_>>() {
                    match decide(&rate, &mut key, now, deferred_run) {
                        Rated::Start => starts.push(now),
                        Rated::Defer(at) => {
                            assert!(at >= now);
                            deferred.push(at);
                        }
                    }
                }
            }
            let most = (0..starts.len())
                .map(|i| {
                    starts[i..]
                        .iter()
                        .take_while(|t| **t < starts[i] + period as i64)
                        .count()
                })
                .max()
                .unwrap_or(0);
            assert!(
                most <= (rate.count + rate.burst) as usize,
                "{rate:?}: {most} starts in a span of {period} ms"
            );
        }
    }

    #[test]
    fn a_clock_step_forward_admits_no_more_than_the_burst() {
        let rate = rate(10, 1_000, 0);
        let mut key = fresh(0);
        for i in 0..5 {
            assert_eq!(decide(&rate, &mut key, 100 * i, false), Rated::Start);
        }
        // An hour later, every run claimed at once: one starts.
        let hour = 3_600_000;
        assert_eq!(decide(&rate, &mut key, hour, false), Rated::Start);
        assert_eq!(
            decide(&rate, &mut key, hour, false),
            Rated::Defer(hour + 100)
        );
    }

    #[test]
    fn a_rate_that_does_not_divide_its_period_rounds_the_interval_up() {
        let rate = rate(3, 1_000, 0);
        assert_eq!(rate.interval_us(), 333_334);
        let mut key = fresh(0);
        assert_eq!(decide(&rate, &mut key, 0, false), Rated::Start);
        // Whole milliseconds, as early as the tolerance of claims made at
        // whole milliseconds allows; the fourth not before 1 s.
        assert_eq!(decide(&rate, &mut key, 0, false), Rated::Defer(333));
        assert_eq!(decide(&rate, &mut key, 0, false), Rated::Defer(666));
        assert_eq!(decide(&rate, &mut key, 0, false), Rated::Defer(1_000));
    }
}
