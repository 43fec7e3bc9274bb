//! Wake-ups across machines: `NOTIFY` after commits that may make work
//! claimable, `LISTEN` on one connection per opened `Queue`.
//!
//! PostgreSQL takes a lock for the whole cluster while a transaction that
//! notified commits, so a busy queue that notified inside every enqueue
//! transaction would serialise its commits. Here no transaction of
//! tickler's notifies: after a commit the store asks the notifier thread
//! for one, and the thread sends one `NOTIFY` (its own short transaction)
//! for every commit that asked since its last one. Under load many
//! commits share one notification; an idle worker elsewhere hears of a
//! job one round trip after its commit. A process that dies between its
//! commit and the notification leaves the job to be found by the fallback
//! poll or the next notification.

use super::connection::Manager;
use super::pooler::Pooling;
use super::tls::Tls;
use super::Store;
use crate::error::postgres_text;
use crossbeam_channel::{Receiver, Sender};
use postgres::fallible_iterator::FallibleIterator;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The channel tickler notifies and listens on.
pub(crate) const CHANNEL: &str = "tickler_jobs";

/// Longest wait between reconnection attempts of the listener.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A listening connection silent this long is checked with a round trip, so
/// that a connection lost without a word (a cable, a NAT) is noticed.
const LISTEN_CHECK: Duration = Duration::from_secs(30);

/// The wake-up machinery of one `Store`.
pub(crate) struct Signals {
    config: postgres::Config,
    tls: Tls,
    listen: bool,
    fallback_poll: Duration,
    /// Behind a pooler in transaction mode nothing is heard.
    pooling: Arc<Pooling>,
    /// In-process watchers.
    watchers: WakeSenders,
    /// The listening connection is up and listening.
    listening: AtomicBool,
    listener_started: Once,
    /// A notification is asked for and not yet sent.
    notify_wanted: Mutex<bool>,
    notify_cv: Condvar,
    notifier_started: Once,
}

impl Signals {
    pub(crate) fn new(
        config: postgres::Config,
        tls: Tls,
        listen: bool,
        fallback_poll: Duration,
        pooling: Arc<Pooling>,
    ) -> Arc<Self> {
        Arc::new(Signals {
            config,
            tls,
            listen,
            fallback_poll,
            pooling,
            watchers: Mutex::new(Vec::new()),
            listening: AtomicBool::new(false),
            listener_started: Once::new(),
            notify_wanted: Mutex::new(false),
            notify_cv: Condvar::new(),
            notifier_started: Once::new(),
        })
    }

    /// Wakes this process's watchers and asks the notifier for a `NOTIFY`.
    pub(crate) fn notify(self: &Arc<Self>, pool: &r2d2::Pool<Manager>) {
        wake_all(&self.watchers);
        self.notifier_started.call_once(|| {
            let weak = Arc::downgrade(self);
            let pool = pool.clone();
            let _ = std::thread::Builder::new()
                .name("tickler-pg-notify".into())
                .spawn(move || notifier(&weak, &pool));
        });
        *self
            .notify_wanted
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.notify_cv.notify_one();
    }

    /// Wakes this process's watchers only.
    pub(crate) fn wake_local(&self) {
        wake_all(&self.watchers);
    }

    /// A new watcher; starts the listener with the first one.
    pub(crate) fn watcher(self: &Arc<Self>) -> NotifyWatcher {
        if self.listen && !self.pooling.transaction_mode() {
            self.listener_started.call_once(|| {
                let weak = Arc::downgrade(self);
                let config = self.config.clone();
                let tls = self.tls.clone();
                let _ = std::thread::Builder::new()
                    .name("tickler-pg-listen".into())
                    .spawn(move || listener(&weak, &config, &tls));
            });
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx.clone());
        NotifyWatcher {
            wake: rx,
            wake_tx: tx,
            signals: Arc::clone(self),
        }
    }
}

/// Sends one `NOTIFY` for all the commits that asked since the last one.
fn notifier(signals: &Weak<Signals>, pool: &r2d2::Pool<Manager>) {
    loop {
        let Some(s) = signals.upgrade() else { return };
        {
            let wanted = s
                .notify_wanted
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (mut wanted, _) = s
                .notify_cv
                .wait_timeout_while(wanted, Duration::from_secs(1), |w| !*w)
                .unwrap_or_else(PoisonError::into_inner);
            if !*wanted {
                continue;
            }
            *wanted = false;
        }
        drop(s);
        let sent = pool
            .get()
            .map_err(crate::Error::from)
            .and_then(|mut c| Ok(c.client.batch_execute(&format!("NOTIFY {CHANNEL}"))?));
        if let Err(e) = sent {
            // Other processes find the work by their fallback poll, or by
            // the next notification.
            log::debug!("NOTIFY failed: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// True when the listener has no more use: its `Store` is gone, or a
/// pooler in transaction mode was found since it started (a LISTEN there
/// is on a server connection anyone may be given). The watchers are then
/// told to poll.
fn listener_done(signals: &Weak<Signals>) -> bool {
    match signals.upgrade() {
        None => true,
        Some(s) if s.pooling.transaction_mode() => {
            s.listening.store(false, Ordering::SeqCst);
            wake_all(&s.watchers);
            true
        }
        Some(_) => false,
    }
}

/// Keeps one connection listening, reconnecting after losses; wakes every
/// watcher on each notification and after each (re)connection (what was
/// sent meanwhile is lost).
fn listener(signals: &Weak<Signals>, config: &postgres::Config, tls: &Tls) {
    let mut pause = Duration::from_millis(100);
    loop {
        if listener_done(signals) {
            return;
        }
        // A listening connection is idle by nature: a DBA's
        // `idle_session_timeout` (PostgreSQL 14 and later) would end it at
        // each lull, and each notification sent until it was back would be
        // missed, so it is turned off for this one session.
        let connected = tls.connect(config).and_then(|mut client| {
            client.batch_execute(&format!(
                "LISTEN {CHANNEL}; SELECT set_config(name, '0', false) FROM pg_settings \
                 WHERE name = 'idle_session_timeout'"
            ))?;
            Ok(client)
        });
        let mut client = match connected {
            Ok(client) => client,
            Err(e) => {
                log::warn!(
                    "cannot listen for new jobs ({}); polling until it can",
                    postgres_text(&e)
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        pause = Duration::from_millis(100);
        if let Some(s) = signals.upgrade() {
            s.listening.store(true, Ordering::SeqCst);
            wake_all(&s.watchers);
        }
        let mut quiet_since = Instant::now();
        let lost = loop {
            let mut failed = None;
            {
                // Each notification wakes the watchers at once: the
                // iterator waits up to its timeout for the next one.
                let mut notifications = client.notifications();
                let mut heard = notifications.timeout_iter(Duration::from_secs(1));
                loop {
                    match heard.next() {
                        Ok(Some(_)) => {
                            let Some(s) = signals.upgrade() else { return };
                            quiet_since = Instant::now();
                            wake_all(&s.watchers);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
            }
            if listener_done(signals) {
                return;
            }
            if let Some(e) = failed {
                break postgres_text(&e);
            }
            if client.is_closed() {
                break "connection closed".to_owned();
            }
            if quiet_since.elapsed() >= LISTEN_CHECK {
                if let Err(e) = client.is_valid(Duration::from_secs(10)) {
                    break postgres_text(&e);
                }
                quiet_since = Instant::now();
            }
        };
        log::warn!("the listening connection was lost ({lost}); reconnecting");
        if let Some(s) = signals.upgrade() {
            s.listening.store(false, Ordering::SeqCst);
            wake_all(&s.watchers);
        }
    }
}

/// The PostgreSQL side of a [`crate::ChangeWatcher`].
pub(crate) struct NotifyWatcher {
    wake: Receiver<()>,
    wake_tx: Sender<()>,
    signals: Arc<Signals>,
}

impl std::fmt::Debug for NotifyWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyWatcher")
            .field("listening", &self.listening())
            .finish()
    }
}

impl NotifyWatcher {
    fn listening(&self) -> bool {
        self.signals.listening.load(Ordering::SeqCst) && !self.signals.pooling.transaction_mode()
    }

    pub(crate) fn wake_sender(&self) -> Sender<()> {
        self.wake_tx.clone()
    }

    /// See [`crate::ChangeWatcher::wait`].
    pub(crate) fn wait(&mut self, timeout: Duration, poll: Duration) -> bool {
        if self.listening() {
            return self.wake.recv_timeout(timeout).is_ok();
        }
        let step = poll.max(self.signals.fallback_poll);
        if step >= timeout {
            return self.wake.recv_timeout(timeout).is_ok();
        }
        // Not listening: a look every `step` is the only way to see other
        // processes' work.
        let _ = self.wake.recv_timeout(step);
        true
    }

    /// See [`crate::ChangeWatcher::changed`].
    pub(crate) fn changed(&mut self) -> bool {
        let woken = self.wake.try_recv().is_ok();
        woken || !self.listening()
    }
}

impl crate::engine::Watch for NotifyWatcher {
    fn wait(&mut self, timeout: Duration, poll: Duration) -> crate::error::Result<bool> {
        Ok(NotifyWatcher::wait(self, timeout, poll))
    }

    fn changed(&mut self) -> crate::error::Result<bool> {
        Ok(NotifyWatcher::changed(self))
    }

    fn wake_sender(&self) -> Sender<()> {
        NotifyWatcher::wake_sender(self)
    }
}

/// Keeps this type's uses in one place for the listener.
pub(crate) type WakeSenders = Mutex<Vec<Sender<()>>>;

pub(crate) fn wake_all(senders: &WakeSenders) {
    let mut senders = senders.lock().unwrap_or_else(PoisonError::into_inner);
    senders.retain(|w| match w.try_send(()) {
        Ok(()) | Err(crossbeam_channel::TrySendError::Full(())) => true,
        Err(crossbeam_channel::TrySendError::Disconnected(())) => false,
    });
}

impl Store {
    /// Wakes this process's watchers now and, through `NOTIFY`, those of
    /// every other process listening on the database.
    pub(crate) fn notify_watchers(&self) {
        self.signals.notify(&self.pool);
    }

    /// Wakes this process's watchers only.
    pub(crate) fn notify_local(&self) {
        self.signals.wake_local();
    }

    /// See [`crate::Queue::watcher`].
    pub(crate) fn watcher(&self) -> NotifyWatcher {
        self.signals.watcher()
    }
}
