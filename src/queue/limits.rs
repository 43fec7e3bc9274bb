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
//! Both run under the limit's lock (the limit's row, taken in name order,
//! on a server engine; SQLite's single writer on a file), so a claim that
//! blocks a job and a release of the same key are never both unaware of
//! each other: whichever runs second sees the other's commit. A claim
//! never reads blocked jobs: they are in a state of their own.

use super::validate::check_limit_name;
use super::Queue;
use crate::engine::types::cut_error;
use crate::engine::LimitTx;
use crate::error::{Error, Result};
use crate::job::{JobId, LimitSlot};
use crate::lease::Lease;
use crate::limit::{Limit, LimitInfo, LimitKeyUsage};
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
    /// ([`crate::MAX_LIMIT_NAME_BYTES`]) or a value of 0; the engine's
    /// errors ([`Error::Busy`], [`Error::Sqlite`], …);
    /// [`Error::Unsupported`] on an engine without limits.
    pub fn set_limit(&self, name: &str, limit: Limit) -> Result<()> {
        check_limit_name(name)?;
        if limit.max_per_key == 0 || limit.max_total == Some(0) {
            return Err(Error::InvalidArgument(format!(
                "limit {name:?}: max_per_key and max_total are at least 1 \
                 (delete the limit to stop limiting, pause the queue to stop running)"
            )));
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

/// What a transaction did to limits: runs pushed back, jobs made pending.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    pub blocked: u64,
    pub unblocked: u64,
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
    let kept = admit(tx, &limits, claimed, now, &mut settled)?;
    let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for slot in freed {
        keys.entry(&slot.name).or_default().insert(&slot.key);
    }
    for (name, keys) in keys {
        let keys: Vec<&str> = keys.into_iter().collect();
        settled.unblocked += release(tx, name, limits.get(name), &keys, Room::Freed, now)?;
    }
    Ok((kept, settled))
}

/// The claimed leases that fit under their limits, in claim order; the
/// others are pushed back (or made dead if they can never fit).
fn admit(
    tx: &mut dyn LimitTx,
    limits: &HashMap<String, Limit>,
    claimed: Vec<Lease>,
    now: i64,
    settled: &mut Settled,
) -> Result<Vec<Lease>> {
    if claimed.iter().all(|l| l.limit.is_none()) {
        return Ok(claimed);
    }
    // What the rows hold besides this claim, per key and per limit; the
    // rows already count this claim's runs.
    let mut held: HashMap<(String, String), i64> = HashMap::new();
    let mut total: HashMap<String, i64> = HashMap::new();
    let mut ours: HashMap<(String, String), i64> = HashMap::new();
    let mut ours_total: HashMap<String, i64> = HashMap::new();
    for slot in claimed.iter().filter_map(|l| l.limit.as_ref()) {
        *ours
            .entry((slot.name.clone(), slot.key.clone()))
            .or_default() += weight(slot);
        *ours_total.entry(slot.name.clone()).or_default() += weight(slot);
    }
    for (name_key, own) in &ours {
        if limits.contains_key(&name_key.0) {
            let rows = tx.held(&name_key.0, Some(&name_key.1), now)?;
            held.insert(name_key.clone(), rows - own);
        }
    }
    for (name, own) in &ours_total {
        if limits.get(name).is_some_and(|l| l.max_total.is_some()) {
            total.insert(name.clone(), tx.held(name, None, now)? - own);
        }
    }
    let mut kept = Vec::with_capacity(claimed.len());
    let mut pushed = Vec::new();
    let mut never = Vec::new();
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
        let per_key = i64::from(limit.max_per_key);
        let max_total = limit.max_total.map(i64::from);
        if w > per_key || max_total.is_some_and(|t| w > t) {
            never.push(lease);
            continue;
        }
        let key_held = held
            .get_mut(&(slot.name.clone(), slot.key.clone()))
            .expect("every claimed key was read");
        let fits_key = *key_held + w <= per_key;
        let fits_total = match max_total {
            Some(t) => total.get(&slot.name).copied().unwrap_or(0) + w <= t,
            None => true,
        };
        if fits_key && fits_total {
            *key_held += w;
            if max_total.is_some() {
                *total.entry(slot.name.clone()).or_default() += w;
            }
            kept.push(lease);
        } else {
            pushed.push(lease);
        }
    }
    if !pushed.is_empty() {
        let leases: Vec<&Lease> = pushed.iter().collect();
        tx.block(&leases)?;
        settled.blocked += pushed.len() as u64;
    }
    for lease in never {
        let slot = lease.limit.as_ref().expect("a limited lease");
        let limit = limits[&slot.name];
        let error = format!(
            "this job takes {} slots of limit {:?} (limit_weight), more than it allows \
             (max_per_key {}{}): it can never run; enqueue it with a smaller weight or \
             raise the limit, then retry it",
            slot.weight,
            slot.name,
            limit.max_per_key,
            limit
                .max_total
                .map(|t| format!(", max_total {t}"))
                .unwrap_or_default()
        );
        tx.bury(lease.job_id, &lease.run_token.0, &cut_error(&error), now)?;
    }
    Ok(kept)
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
) -> Result<u64> {
    let Some(limit) = limit else {
        // Deleted or never set: nothing limits its jobs any more.
        let mut ids = Vec::new();
        for key in keys {
            ids.extend(tx.blocked(name, key, RELEASE_MAX)?.into_iter().map(|b| b.0));
        }
        tx.unblock(&ids)?;
        return Ok(ids.len() as u64);
    };
    let per_key = i64::from(limit.max_per_key);
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
        let mut room = per_key - tx.held(name, Some(key), now)?;
        if room_of == Room::Unclaimed {
            room -= tx.pending(name, Some(key))?;
        }
        let mut room = room.min(total_room);
        if room <= 0 {
            continue;
        }
        // Each takes at least one slot: `room` jobs at most, and the
        // doomed ones besides.
        for (id, _, w) in tx.blocked(name, key, room + 8)? {
            if w > per_key || max_total.is_some_and(|t| w > t) {
                doomed.push((id, w));
                continue;
            }
            if w > room {
                break;
            }
            room -= w;
            total_room -= w;
            ids.push(id);
            if room == 0 {
                break;
            }
        }
    }
    for (id, w) in doomed {
        let error = format!(
            "this job takes {w} slots of limit {name:?} (limit_weight), more than it allows \
             now (max_per_key {}{}): it can never run; enqueue it with a smaller weight or \
             raise the limit, then retry it",
            limit.max_per_key,
            limit
                .max_total
                .map(|t| format!(", max_total {t}"))
                .unwrap_or_default()
        );
        tx.doom(id, &cut_error(&error), now)?;
    }
    tx.unblock(&ids)?;
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
        unblocked += release(tx, &name, limits.get(&name), &keys, Room::Unclaimed, now)?;
    }
    Ok(unblocked)
}

fn weight(slot: &LimitSlot) -> i64 {
    i64::from(slot.weight.max(1))
}

/// Ids of blocked jobs, as a `LimitTx` reads them: the id, its key and
/// its weight.
pub(crate) type Blocked = (JobId, String, i64);
