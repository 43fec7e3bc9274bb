//! Wake-ups on MySQL, which has no `LISTEN`: this process's watchers are
//! woken at once after its own commits; other processes' commits are seen
//! by a cheap look at the queue's last change (the highest job ids, the
//! set of paused queues, the schedules' last write: index lookups and one
//! short range, never a count of all jobs), taken every 50 ms while things
//! change and backing off to the fallback poll (1 s by default) while
//! nothing does.
//!
//! What the look does not see: a job of another process made claimable
//! again without a new row (a retry, a cancelled holder that stopped), or
//! one committed more than [`RECENT_IDS`] ids behind the newest, is found
//! at the watcher's next timeout, which callers bound by the next due time
//! they know of.

use super::Store;
use crossbeam_channel::{Receiver, Sender};
use mysql::prelude::Queryable;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The first step between looks after a change.
const FIRST_STEP: Duration = Duration::from_millis(50);

/// The queue's last change as a look sees it.
type Fingerprint = (i64, i64, i64, i64, i64);

/// Jobs' ids counted below the highest one at each look. A transaction
/// draws its ids when it inserts and may commit after one that drew
/// higher ids (an application's transaction, a batch), so the highest id
/// alone would not change when it commits; the count of the last ids
/// does, for any commit this far behind the newest.
const RECENT_IDS: i64 = 1_000;

/// The highest job id and how many of the last [`RECENT_IDS`] ids exist
/// (one short range of the primary key); the paused queues as a set (a
/// pause of one and a resume of another leave their count as it was);
/// the schedules' last write.
const FINGERPRINT_SQL: &str = "SELECT
    (SELECT coalesce(max(id), 0) FROM tickler_jobs),
    (SELECT count(*) FROM tickler_jobs
     WHERE id > (SELECT coalesce(max(id), 0) FROM tickler_jobs) - ?),
    (SELECT count(*) FROM tickler_paused_queues),
    (SELECT coalesce(BIT_XOR(CRC32(queue)), 0) FROM tickler_paused_queues),
    (SELECT coalesce(max(updated_at), 0) + count(*) FROM tickler_schedules)";

/// The wake-up machinery of one `Store`.
pub(crate) struct Signals {
    fallback_poll: Duration,
    watchers: Mutex<Vec<Sender<()>>>,
}

impl Signals {
    pub(crate) fn new(fallback_poll: Duration) -> Arc<Self> {
        Arc::new(Signals {
            fallback_poll,
            watchers: Mutex::new(Vec::new()),
        })
    }

    fn wake_all(&self) {
        let mut senders = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        senders.retain(|w| match w.try_send(()) {
            Ok(()) | Err(crossbeam_channel::TrySendError::Full(())) => true,
            Err(crossbeam_channel::TrySendError::Disconnected(())) => false,
        });
    }
}

/// The MySQL side of a [`crate::ChangeWatcher`].
pub(crate) struct PollWatcher {
    wake: Receiver<()>,
    wake_tx: Sender<()>,
    pool: super::connection::Connections,
    seen: Option<Fingerprint>,
    step: Duration,
    max_step: Duration,
}

impl std::fmt::Debug for PollWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollWatcher")
            .field("step", &self.step)
            .finish()
    }
}

impl PollWatcher {
    /// Whether the queue's last change differs from the last look's. A
    /// look that fails (the server is away) says "changed": the caller
    /// looks, and meets the error with its own retries.
    fn changed_elsewhere(&mut self) -> bool {
        let look = (|| -> crate::Result<Option<Fingerprint>> {
            let mut conn = self.pool.get()?;
            let look = conn
                .conn
                .exec_first(FINGERPRINT_SQL, (RECENT_IDS,))
                .map_err(crate::Error::from);
            if let Err(e) = &look {
                conn.mark_broken_by(e);
            }
            look
        })();
        match look {
            Ok(now) => {
                let changed = now != self.seen;
                self.seen = now;
                changed
            }
            Err(e) => {
                log::debug!("could not look for changes: {e}");
                true
            }
        }
    }
}

impl crate::engine::Watch for PollWatcher {
    fn wait(&mut self, timeout: Duration, poll: Duration) -> crate::Result<bool> {
        let deadline = Instant::now() + timeout;
        let first = poll.max(FIRST_STEP);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if self.wake.recv_timeout(self.step.min(left)).is_ok() {
                self.step = first;
                return Ok(true);
            }
            if self.changed_elsewhere() {
                self.step = first;
                return Ok(true);
            }
            self.step = (self.step * 2).min(self.max_step.max(first));
        }
    }

    fn changed(&mut self) -> crate::Result<bool> {
        let woken = self.wake.try_recv().is_ok();
        Ok(self.changed_elsewhere() || woken)
    }

    fn wake_sender(&self) -> Sender<()> {
        self.wake_tx.clone()
    }
}

impl Store {
    /// Wakes this process's watchers (other processes' look for changes).
    pub(crate) fn notify_watchers(&self) {
        self.signals.wake_all();
    }

    /// Wakes this process's watchers.
    pub(crate) fn notify_local(&self) {
        self.signals.wake_all();
    }

    /// See [`crate::Queue::watcher`].
    pub(crate) fn watcher(&self) -> PollWatcher {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.signals
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx.clone());
        let mut watcher = PollWatcher {
            wake: rx,
            wake_tx: tx,
            pool: self.pool.clone(),
            seen: None,
            step: FIRST_STEP,
            max_step: self.signals.fallback_poll,
        };
        watcher.changed_elsewhere();
        watcher
    }
}
