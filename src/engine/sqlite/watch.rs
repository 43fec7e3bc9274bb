//! Wake-ups on commits: in-process at once, from other processes by
//! file-change notifications of the `-wal` file and `PRAGMA data_version`.

use super::connection::{busy_handler, wal_path};
use super::file_events::{self, FileEvents};
use super::Store;
use crate::error::Result;
use crossbeam_channel::{Receiver, Sender};
use rusqlite::{Connection, OpenFlags};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// The SQLite side of a [`crate::ChangeWatcher`]: commits through this
/// process's `Queue`s, and other processes' commits seen by file-change
/// notifications of the `-wal` file and `PRAGMA data_version`.
pub(crate) struct FileWatcher {
    conn: Connection,
    version: i64,
    wake: Receiver<()>,
    wake_tx: Sender<()>,
    /// Writes to the `-wal` file by any process.
    file: Receiver<()>,
    file_events: Arc<FileEvents>,
    /// After a write to the `-wal` file, `data_version` is polled quickly
    /// until then: the commit that wrote it becomes visible a moment later.
    hot_until: Option<Instant>,
    /// Current poll interval where there are no file notifications; grows
    /// while nothing changes.
    fallback_poll: Duration,
}

/// How long `data_version` is polled (from 1 ms, doubling) after a write
/// to the `-wal` file was reported: the commit marker is written before
/// the commit is published in the shared-memory index, and under
/// `Durability::Full` an fsync (5 ms and more on an SD card) lies between.
const HOT_POLL_WINDOW: Duration = Duration::from_millis(100);

/// Without file notifications, the poll interval doubles from the given
/// `poll` up to this while nothing changes: a bound on how late another
/// process's job is seen, and about 20 checks a second per idle watcher.
const FALLBACK_POLL_MAX: Duration = Duration::from_millis(50);

impl std::fmt::Debug for FileWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatcher")
            .field("version", &self.version)
            .finish()
    }
}

impl FileWatcher {
    /// A watcher on `conn` (its own connection to the file, whose
    /// `data_version` was `version`), woken by `wake` (its sender `wake_tx`
    /// registered with the store) and by the store's file notifications.
    pub(crate) fn new(
        conn: Connection,
        version: i64,
        wake: Receiver<()>,
        wake_tx: Sender<()>,
        file_events: &Arc<FileEvents>,
    ) -> FileWatcher {
        FileWatcher {
            conn,
            version,
            wake,
            wake_tx,
            file: file_events.subscribe(),
            file_events: Arc::clone(file_events),
            hot_until: None,
            fallback_poll: Duration::ZERO,
        }
    }

    /// Waits up to `timeout` for a change. Returns true on a change (or a
    /// [`crate::Waker::wake`]), false on timeout.
    ///
    /// Commits by other processes are seen when the operating system
    /// reports a write to the `-wal` file (then `PRAGMA data_version` is
    /// checked at 1, 2, 4 … ms for up to 100 ms, until the commit is
    /// visible); an idle watcher makes no other wake-up. Where there are
    /// no file notifications, `data_version` is checked every `poll`,
    /// doubling while nothing changes up to 50 ms (or `poll`, if longer).
    ///
    /// # Errors
    /// [`crate::Error::Sqlite`] if `PRAGMA data_version` fails.
    pub(crate) fn wait(&mut self, timeout: Duration, poll: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut hot_step = Duration::from_millis(1);
        loop {
            if self.changed()? {
                self.fallback_poll = Duration::ZERO;
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let slice = if self.hot_until.is_some_and(|until| now < until) {
                let step = hot_step;
                hot_step *= 2;
                step
            } else if self.file_events.live() {
                self.hot_until = None;
                deadline - now
            } else {
                let step = self.fallback_poll.max(poll);
                self.fallback_poll = (step * 2).min(poll.max(FALLBACK_POLL_MAX));
                step
            };
            let slice = slice.min(deadline - now).max(Duration::from_micros(100));
            crossbeam_channel::select! {
                recv(self.wake) -> _ => return Ok(true),
                recv(self.file) -> _ => {
                    self.hot_until = Some(Instant::now() + HOT_POLL_WINDOW);
                    hot_step = Duration::from_millis(1);
                }
                default(slice) => {}
            }
        }
    }

    /// The sender that wakes this watcher's `wait`.
    pub(crate) fn wake_sender(&self) -> Sender<()> {
        self.wake_tx.clone()
    }

    /// True if any connection committed since the last call (or since the
    /// watcher was made). Drains pending in-process wake-ups.
    ///
    /// # Errors
    /// [`crate::Error::Sqlite`] if `PRAGMA data_version` fails.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        let woken = self.wake.try_recv().is_ok();
        if self.file.try_recv().is_ok() {
            self.hot_until = Some(Instant::now() + HOT_POLL_WINDOW);
        }
        let version = data_version(&self.conn)?;
        let moved = version != self.version;
        self.version = version;
        Ok(woken || moved)
    }
}

pub(crate) fn data_version(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))?)
}

impl crate::engine::Watch for FileWatcher {
    fn wait(&mut self, timeout: Duration, poll: Duration) -> Result<bool> {
        FileWatcher::wait(self, timeout, poll)
    }

    fn changed(&mut self) -> Result<bool> {
        FileWatcher::changed(self)
    }

    fn wake_sender(&self) -> Sender<()> {
        FileWatcher::wake_sender(self)
    }
}

impl Store {
    /// See [`crate::Queue::watcher`].
    pub(crate) fn watcher(&self) -> Result<FileWatcher> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_handler(Some(busy_handler))?;
        let version = data_version(&conn)?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx.clone());
        self.file_events_started.call_once(|| {
            file_events::watch(&wal_path(&self.path), &self.file_events);
        });
        Ok(FileWatcher::new(conn, version, rx, tx, &self.file_events))
    }

    pub(crate) fn notify_watchers(&self) {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        watchers.retain(|w| match w.try_send(()) {
            Ok(()) | Err(crossbeam_channel::TrySendError::Full(())) => true,
            Err(crossbeam_channel::TrySendError::Disconnected(())) => false,
        });
    }
}
