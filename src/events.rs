//! Job events for the application: a bounded subscription per reader, fed
//! by what this process does ([`crate::Queue::subscribe`],
//! [`crate::WorkerPool::subscribe`]).
//!
//! Sending never blocks and never waits for a reader: an event that does
//! not fit a subscriber's buffer is counted in its
//! [`Subscription::dropped`] and thrown away, so a slow or absent reader
//! costs the pool one failed `try_send` per event. With no subscriber an
//! event is not even built.

use crate::job::{JobId, RunToken};
use chrono::{DateTime, Utc};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// Buffer size of [`crate::Queue::subscribe`] and
/// [`crate::WorkerPool::subscribe`] when a caller has no better number:
/// 4,096 events (a second of a busy pool's starts and ends).
pub const DEFAULT_EVENT_BUFFER: usize = 4096;

/// Something that happened in this process: to a job, or to a schedule's
/// tick.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A job changed state.
    Job(JobEvent),
    /// A schedule's tick was handled by this process's scheduler.
    Tick(TickEvent),
}

/// A job's transition, as this process caused or observed it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobEvent {
    /// What happened.
    pub what: JobEventKind,
    /// The job.
    pub job_id: JobId,
    /// Its kind (which handler runs it).
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// The attempt this run is (1 for the first), for the events of a run
    /// (started and every outcome of a pool's run); `None` otherwise.
    pub attempt: Option<u32>,
    /// How long the job waited from its due time (`run_at`) until its
    /// handler started, by this queue's clock: on [`JobEventKind::Started`]
    /// only. Zero if it started before it was due (a clock step).
    pub queue_time: Option<Duration>,
    /// How long the handler ran, from its start until the pool took its
    /// result (within about a millisecond of its return): on the outcome
    /// events of a pool's run ([`JobEventKind::Succeeded`], `Failed`,
    /// `Dead`, `Snoozed`, `TimedOut`, and `LeaseLost` once it returned).
    pub run_time: Option<Duration>,
    /// When the event was emitted, by this queue's clock.
    pub at: DateTime<Utc>,
}

/// What happened to a job; see [`JobEvent`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum JobEventKind {
    /// Stored by [`crate::Queue::enqueue`] or `enqueue_batch` (an enqueue
    /// that found its unique_key held reports the holder's id). Jobs
    /// enqueued inside the application's own transaction
    /// ([`crate::Queue::enqueue_tx`]) are not reported: their commit is
    /// the application's.
    Enqueued,
    /// A pool's worker started its handler.
    Started {
        /// The run's fencing token.
        run_token: RunToken,
    },
    /// The run succeeded and that was recorded.
    Succeeded,
    /// The attempt failed and the job waits for a retry.
    Failed {
        /// The error the handler returned (or its panic message).
        error: String,
        /// The retry is due this long after the outcome was recorded.
        retry_in: Duration,
    },
    /// The job went `dead`: a permanent failure, or the last attempt
    /// failed.
    Dead {
        /// The error of the last attempt.
        error: String,
    },
    /// The handler snoozed the job; no attempt was used.
    Snoozed {
        /// When it is due again.
        until: DateTime<Utc>,
    },
    /// Cancelled by [`crate::Queue::cancel`] through this process.
    Cancelled,
    /// Made pending again by [`crate::Queue::retry`] through this process.
    Retried,
    /// The run lost its lease (cancelled or reaped elsewhere, or its
    /// lease ran out): its handler's result is not recorded.
    LeaseLost,
    /// The handler ran past the job's timeout plus the pool's grace and
    /// was given up on; the attempt is failed (or the job `dead` when this
    /// was its last attempt).
    TimedOut {
        /// Whether the job is now `dead`.
        dead: bool,
    },
    /// A run this process claimed did not fit its limit's free slots: it
    /// was handed back unstarted, without using an attempt, and waits as
    /// `blocked` until a slot of its key is freed.
    Blocked {
        /// The limit's name.
        limit: String,
        /// The job's key of it.
        key: String,
    },
    /// A slot freed by a run this process recorded (its outcome ended the
    /// lease) went to this blocked job, which is pending again. Slots a
    /// job gets otherwise (the reaper, an operator raising or deleting the
    /// limit, another process) are not reported here.
    Unblocked {
        /// The limit's name.
        limit: String,
        /// The job's key of it.
        key: String,
    },
    /// A run this process claimed was over its limit's rate: it was handed
    /// back unstarted, without using an attempt, and is due at `until`,
    /// its place in its key's line.
    Deferred {
        /// The limit's name.
        limit: String,
        /// The job's key of it.
        key: String,
        /// When it may start.
        until: DateTime<Utc>,
    },
    /// The last job this one runs after ([`crate::NewJob::after`]) ended,
    /// and this outcome, recorded by this process, released it: it is
    /// pending (or scheduled, its run_at ahead). A job a parent's failure
    /// cancels is reported `Cancelled`. Releases by another process, or by
    /// a reaper or an enqueue, are not reported here.
    Released,
    /// The handler reported how far it is
    /// ([`crate::JobContext::progress`]): every report, from memory, as it
    /// is made (the stored value, written a few times a second at most,
    /// is what other processes see).
    Progress {
        /// From 0 to 1.
        fraction: f64,
        /// What it is doing.
        message: String,
    },
}

/// A schedule's tick handled by this process.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TickEvent {
    /// The schedule's name.
    pub schedule: String,
    /// The tick's instant (the job's due time), UTC.
    pub tick_at: DateTime<Utc>,
    /// The job enqueued for the tick; `None` when the tick was skipped by
    /// the schedule's overlap policy (an earlier run had not finished).
    pub job_id: Option<JobId>,
    /// When the event was emitted, by this queue's clock.
    pub at: DateTime<Utc>,
}

/// A reader's end of a subscription: up to its capacity of events wait
/// here; what does not fit is counted and dropped. Dropping it ends the
/// subscription.
#[derive(Debug)]
pub struct Subscription {
    rx: Receiver<Event>,
    state: Arc<SubState>,
}

#[derive(Debug, Default)]
struct SubState {
    dropped: AtomicU64,
    /// The reader dropped its end.
    closed: AtomicBool,
    /// Wakes an async reader ([`Subscription::recv`]) after each send.
    #[cfg(feature = "tokio")]
    sent: tokio::sync::Notify,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.state.closed.store(true, Ordering::Relaxed);
    }
}

impl Subscription {
    /// The next event, waiting up to `timeout`; `None` if none came.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next event if one is waiting.
    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Every event waiting now, without blocking.
    pub fn drain(&self) -> Vec<Event> {
        self.rx.try_iter().collect()
    }

    /// Events thrown away because this subscription's buffer was full,
    /// since it was made.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// The next event, waited for without blocking a thread (feature
    /// `tokio`; any runtime, or none: it is a plain future). `None` once
    /// every queue and pool that could send to it is gone. Events that did
    /// not fit the buffer meanwhile are counted in [`Subscription::dropped`].
    ///
    /// ```no_run
    /// # async fn app(queue: tickler::AsyncQueue) {
    /// let events = queue.subscribe(tickler::DEFAULT_EVENT_BUFFER);
    /// while let Some(event) = events.recv().await {
    ///     println!("{event:?}");
    /// }
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn recv(&self) -> Option<Event> {
        loop {
            // Registered before the look, so that a send between the look
            // and the wait still wakes it.
            let mut sent = std::pin::pin!(self.state.sent.notified());
            sent.as_mut().enable();
            match self.rx.try_recv() {
                Ok(event) => return Some(event),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
                Err(crossbeam_channel::TryRecvError::Empty) => sent.await,
            }
        }
    }

    /// The channel itself, for `crossbeam_channel::select!` with other
    /// channels.
    pub fn receiver(&self) -> &Receiver<Event> {
        &self.rx
    }
}

/// Where events are sent: every live subscription of a queue or pool.
#[derive(Debug, Default)]
pub(crate) struct EventHub {
    subscribers: RwLock<Vec<(Sender<Event>, Arc<SubState>)>>,
    /// Read without a lock on every emit: most programs never subscribe.
    any: AtomicBool,
    /// Operations that publish their events after their commit (enqueue,
    /// cancel, retry), and the job events held back meanwhile.
    order: Mutex<Announcements>,
    /// Some operation is announcing or some event is held: emit must look
    /// at `order`. Read without a lock otherwise.
    ordering: AtomicBool,
}

/// A job's events in the order they happened, across the threads of a
/// process. An operation publishes its event after its commit returns;
/// meanwhile another thread (a pool's) may act on what that commit made
/// visible and publish first: start, even finish, a job whose `Enqueued`
/// is still to come. So each such operation takes a ticket before it
/// writes, and a job event emitted while a ticket taken earlier is out
/// waits, in order, until every ticket up to the latest one taken when it
/// was emitted has published. An event can depend only on commits that
/// happened before it, made by operations that took their tickets before
/// it was emitted: nothing waits for an operation that started later.
#[derive(Debug, Default)]
struct Announcements {
    /// The next ticket.
    next: u64,
    /// Tickets out, their operations not yet published.
    out: BTreeSet<u64>,
    /// Held events, oldest first, each with the latest ticket taken when
    /// it was emitted (so never decreasing).
    held: VecDeque<(u64, Event)>,
}

/// An operation's ticket (see [`Announcements`]): [`Announcing::publish`]
/// sends its events, then what waited for it. Dropped unpublished (the
/// operation failed), it releases what waited.
#[derive(Debug)]
pub(crate) struct Announcing<'a> {
    hub: &'a EventHub,
    ticket: u64,
}

impl Announcing<'_> {
    /// Sends `events` (built only now, as an operation knows its ids once
    /// committed), then every held event whose tickets have all published.
    pub(crate) fn publish(self, events: impl IntoIterator<Item = Event>) {
        let mut order = self
            .hub
            .order
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for event in events {
            self.hub.send(event);
        }
        self.hub.finish(&mut order, self.ticket);
        drop(order);
        std::mem::forget(self);
    }
}

impl Drop for Announcing<'_> {
    fn drop(&mut self) {
        let mut order = self
            .hub
            .order
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.hub.finish(&mut order, self.ticket);
    }
}

impl EventHub {
    pub(crate) fn subscribe(&self, capacity: usize) -> Subscription {
        let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
        let state = Arc::new(SubState::default());
        let mut subs = self
            .subscribers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        subs.push((tx, Arc::clone(&state)));
        self.any.store(true, Ordering::Release);
        Subscription { rx, state }
    }

    /// Whether anyone listens (so that callers can skip building events).
    pub(crate) fn active(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether an event emitted now would reach a subscriber: some live
    /// subscriber has room. When none has, every full subscriber counts
    /// the event as dropped here and the caller builds and emits nothing,
    /// so a subscriber that stopped reading costs a check per event, not
    /// an event built and thrown away. Call [`EventHub::emit`] after a
    /// `true`; it counts any subscriber that filled up in between.
    pub(crate) fn offer(&self) -> bool {
        if !self.active() {
            return false;
        }
        let subs = self
            .subscribers
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let open = |state: &SubState| !state.closed.load(Ordering::Relaxed);
        if subs.iter().any(|(tx, state)| open(state) && !tx.is_full()) {
            return true;
        }
        let mut gone = false;
        for (_, state) in subs.iter() {
            if open(state) {
                state.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                gone = true;
            }
        }
        drop(subs);
        if gone {
            // As emit does: without this, dropped subscriptions would
            // stay (with the events in their buffers) as long as the
            // others were full.
            self.forget_closed();
        }
        false
    }

    /// A ticket for an operation that publishes its events after its
    /// commit (see [`Announcements`]), taken before it writes; `None` when
    /// no one listens (then nothing is held for it either).
    pub(crate) fn announcing(&self) -> Option<Announcing<'_>> {
        if !self.active() {
            return None;
        }
        let mut order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        let ticket = order.next;
        order.next += 1;
        order.out.insert(ticket);
        self.ordering.store(true, Ordering::SeqCst);
        Some(Announcing { hub: self, ticket })
    }

    /// Ends `ticket`, then sends the held events nothing earlier holds.
    fn finish(&self, order: &mut Announcements, ticket: u64) {
        order.out.remove(&ticket);
        let oldest_out = order.out.first().copied().unwrap_or(u64::MAX);
        while order
            .held
            .front()
            .is_some_and(|(latest, _)| *latest < oldest_out)
        {
            let (_, event) = order.held.pop_front().expect("front exists");
            self.send(event);
        }
        if order.out.is_empty() && order.held.is_empty() {
            self.ordering.store(false, Ordering::SeqCst);
        }
    }

    /// Sends `event` to every subscriber without waiting, or holds it (a
    /// job event) while an operation that began before it has its own
    /// events still to publish; see [`Announcements`].
    pub(crate) fn emit(&self, event: Event) {
        if self.ordering.load(Ordering::SeqCst) && matches!(event, Event::Job(_)) {
            let mut order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
            // Nothing is held while no ticket is out (`finish` sends it all).
            if !order.out.is_empty() {
                let latest = order.next - 1;
                order.held.push_back((latest, event));
                return;
            }
        }
        self.send(event);
    }

    fn send(&self, event: Event) {
        let mut gone = false;
        {
            let subs = self
                .subscribers
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            for (tx, state) in subs.iter() {
                match tx.try_send(event.clone()) {
                    Ok(()) => {
                        #[cfg(feature = "tokio")]
                        state.sent.notify_waiters();
                    }
                    Err(TrySendError::Full(_)) => {
                        state.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Disconnected(_)) => gone = true,
                }
            }
        }
        if gone {
            self.forget_closed();
        }
    }

    /// Drops the subscriptions whose reader is gone.
    fn forget_closed(&self) {
        let mut subs = self
            .subscribers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        subs.retain(|(_, state)| !state.closed.load(Ordering::Relaxed));
        self.any.store(!subs.is_empty(), Ordering::Release);
    }
}

/// The queue or pool is gone: an async reader waiting for its next event
/// learns that the channel is closed.
#[cfg(feature = "tokio")]
impl Drop for EventHub {
    fn drop(&mut self) {
        let subs = std::mem::take(
            self.subscribers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let states: Vec<Arc<SubState>> = subs.into_iter().map(|(_, state)| state).collect();
        for state in states {
            state.sent.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: i64) -> Event {
        Event::Job(JobEvent {
            what: JobEventKind::Enqueued,
            job_id: JobId(n),
            kind: "k".into(),
            queue: "q".into(),
            attempt: None,
            queue_time: None,
            run_time: None,
            at: Utc::now(),
        })
    }

    #[test]
    fn a_full_buffer_drops_and_counts_without_blocking() {
        let hub = EventHub::default();
        assert!(!hub.active());
        let sub = hub.subscribe(2);
        for n in 0..5 {
            hub.emit(event(n));
        }
        assert_eq!(sub.dropped(), 3);
        assert_eq!(sub.drain().len(), 2);
        // Through offer(): a full buffer counts without an event built.
        let mut built = 0;
        for n in 0..5 {
            if hub.offer() {
                built += 1;
                hub.emit(event(n));
            }
        }
        assert_eq!((built, sub.dropped()), (2, 6));
        assert_eq!(sub.drain().len(), 2);
        hub.emit(event(9));
        match sub.try_recv() {
            Some(Event::Job(e)) => assert_eq!(e.job_id, JobId(9)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn offer_forgets_dropped_subscriptions_while_the_others_are_full() {
        // Without it, a dropped full subscription would stay with its
        // buffered events for as long as the others were full.
        let hub = EventHub::default();
        let full = hub.subscribe(1);
        hub.emit(event(7));
        let other = hub.subscribe(1);
        hub.emit(event(8));
        assert_eq!(full.dropped(), 1);
        drop(full);
        assert!(!hub.offer());
        assert_eq!(other.dropped(), 1);
        assert_eq!(hub.subscribers.read().unwrap().len(), 1);
        drop(other);
        assert!(!hub.offer());
        assert!(!hub.active(), "no subscriber is left");
        assert!(hub.subscribers.read().unwrap().is_empty());
    }

    #[test]
    fn a_dropped_subscription_is_forgotten() {
        let hub = EventHub::default();
        let sub = hub.subscribe(1);
        drop(sub);
        hub.emit(event(1));
        assert!(!hub.active());
    }

    fn ids(sub: &Subscription) -> Vec<i64> {
        sub.drain()
            .into_iter()
            .map(|e| match e {
                Event::Job(e) => e.job_id.0,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn events_wait_for_the_operations_that_began_before_them_only() {
        let hub = EventHub::default();
        assert!(hub.announcing().is_none(), "no ticket without a reader");
        let sub = hub.subscribe(64);
        let first = hub.announcing().unwrap();
        hub.emit(event(1));
        let second = hub.announcing().unwrap();
        hub.emit(event(2));
        assert!(ids(&sub).is_empty(), "both wait for the first ticket");
        first.publish([event(10)]);
        // 1 waited for the first ticket only; 2 was emitted after the
        // second was taken, and waits for it.
        assert_eq!(ids(&sub), vec![10, 1]);
        // A failed operation (its ticket dropped) releases what waited.
        drop(second);
        assert_eq!(ids(&sub), vec![2]);
        hub.emit(event(3));
        assert_eq!(ids(&sub), vec![3], "nothing out: sent at once");
        assert!(!hub.ordering.load(Ordering::SeqCst));
    }
}
