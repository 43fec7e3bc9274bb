//! SQLite's connections and transactions: the process's one write
//! connection per `Queue` behind a mutex, `BEGIN IMMEDIATE` and the busy
//! handler for other processes, the retry of a busy transaction, the
//! group commit of concurrent enqueues, the bound on the WAL, the pool of
//! read connections; and the engine's [`Capabilities`].

use super::Store;
use crate::clock::Clock;
use crate::engine::types::{AppTxKind, Checkpoint, ConnectionHook, Durability, ValidJob};
use crate::engine::{Capabilities, Watch};
use crate::error::{Error, Result};
use crate::job::JobId;
use crate::metrics::WriteLockWaits;
use rusqlite::{Connection, TransactionBehavior};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// Calls of the busy handler on this thread so far: a change tells a
/// caller that another connection held the lock it asked for.
pub(crate) fn busy_waits() -> u64 {
    BUSY_WAITS.with(Cell::get)
}

impl Store {
    /// Now, in ms since the epoch, from the queue's clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// See [`crate::Queue::open_connection`].
    pub(crate) fn open_connection(&self) -> Result<Connection> {
        let conn = Connection::open(&self.path)?;
        configure_connection(&conn, self.durability, false, self.on_connection.as_ref())?;
        Ok(conn)
    }

    /// See [`crate::Queue::sync`].
    pub(crate) fn sync(&self) -> Result<()> {
        if self.durability == Durability::Normal {
            return Ok(());
        }
        let wal = wal_path(&self.path);
        let io_error = |source| Error::Io {
            path: wal.clone(),
            source,
        };
        match std::fs::File::open(&wal) {
            Ok(file) => file.sync_data().map_err(io_error),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(e)),
        }
    }

    /// See [`crate::Queue::checkpoint`].
    pub(crate) fn checkpoint(&self) -> Result<Checkpoint> {
        let wal = wal_path(&self.path);
        let wal_bytes_before = std::fs::metadata(&wal).map_or(0, |m| m.len());
        let writer = self.lock_writer()?;
        let outcome = truncate_wal(&writer.conn, self.busy_timeout);
        set_busy_limit(self.busy_timeout);
        let complete = outcome? == WalTruncate::Truncated;
        drop(writer);
        Ok(Checkpoint {
            wal_bytes_before,
            wal_bytes_after: std::fs::metadata(&wal).map_or(0, |m| m.len()),
            complete,
        })
    }

    /// Commits `rows` together with those of concurrent callers, in one
    /// durable write transaction per group (group commit); `write` inserts
    /// each caller's rows and returns their ids. Wakes this process's
    /// fetchers. See [`EnqueueGroup`](crate::engine::group_commit::EnqueueGroup).
    pub(crate) fn commit_grouped(
        &self,
        rows: Vec<ValidJob>,
        mut write: impl FnMut(&rusqlite::Transaction<'_>, &[Vec<ValidJob>]) -> Result<Vec<Vec<JobId>>>,
    ) -> Result<Vec<JobId>> {
        // Joining a group while holding the writer would wait for ourselves.
        Store::refuse_reentry()?;
        let ids = self.enqueues.commit(rows, |group| {
            let mut writer = self.lock_writer()?;
            self.write_locked(&mut writer, Commit::Durable, |tx| write(tx, group))
        })?;
        // Fetchers first: the WAL bound may take a while.
        self.notify_watchers();
        self.bound_wal();
        Ok(ids)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the process's write
    /// connection and commits. On `SQLITE_BUSY` (another process held the
    /// write lock past the busy timeout) the whole transaction is retried
    /// with jittered backoff until the retry window ends, then
    /// [`Error::Busy`]. `f` may run more than once: it must not have effects
    /// outside the transaction.
    pub(crate) fn write<T>(
        &self,
        f: impl FnMut(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.write_with(Commit::Durable, f)
    }

    pub(crate) fn write_with<T>(
        &self,
        commit: Commit,
        f: impl FnMut(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut writer = self.lock_writer()?;
        let value = self.write_locked(&mut writer, commit, f)?;
        drop(writer);
        self.bound_wal();
        Ok(value)
    }

    pub(crate) fn refuse_reentry() -> Result<()> {
        if HOLDS_WRITER.with(Cell::get) {
            return Err(Error::InvalidArgument(
                "a Queue write was called while this thread is inside complete_with; \
                 write through the transaction it gives you (for jobs: Queue::enqueue_tx)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The process's write connection. Refuses a second write from a thread
    /// that already holds it (a `Queue` write called inside
    /// [`crate::Queue::complete_with`]), which would otherwise wait for itself
    /// forever.
    fn lock_writer(&self) -> Result<WriterGuard<'_>> {
        Store::refuse_reentry()?;
        let guard = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        HOLDS_WRITER.with(|h| h.set(true));
        Ok(WriterGuard(guard))
    }

    fn write_locked<T>(
        &self,
        writer: &mut Writer,
        commit: Commit,
        mut f: impl FnMut(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let config = self;
        let asked = Instant::now();
        let synchronous = match commit {
            Commit::Durable => config.durability,
            Commit::Lazy => Durability::Normal,
        };
        if writer.synchronous != synchronous {
            writer.conn.execute_batch(&format!(
                "PRAGMA synchronous = {}",
                synchronous.pragma_value()
            ))?;
            writer.synchronous = synchronous;
        }
        set_busy_limit(config.busy_timeout);
        let started = Instant::now();
        let mut retries = 0u32;
        loop {
            let result: Result<T> = (|| {
                let tx = writer
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                self.lock_waits.record(asked.elapsed());
                let value = f(&tx)?;
                tx.commit()?;
                Ok(value)
            })();
            match result {
                Err(e) if e.is_busy() => {
                    let waited = started.elapsed();
                    if waited >= config.busy_timeout + config.busy_retry {
                        return Err(Error::Busy {
                            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                        });
                    }
                    let ceiling_ms = 2u64.saturating_pow(retries.min(6)) * 5;
                    std::thread::sleep(Duration::from_millis(fastrand::u64(1..=ceiling_ms)));
                    retries += 1;
                }
                Ok(value) => return Ok(value),
                other => return other,
            }
        }
    }

    /// Keeps the WAL from growing without bound; called after each write
    /// transaction, once this thread let go of the write connection.
    /// SQLite's automatic checkpoints are PASSIVE: with writers from
    /// several connections committing all the time, the log is copied back
    /// but never restarted, and the file grows for as long as the writing
    /// goes on ("checkpoint starvation", SQLite's WAL documentation,
    /// section 4). Past `WAL_TRUNCATE_BYTES` this empties the WAL with
    /// [`truncate_wal`], one thread per opened `Queue` at a time: on a read
    /// connection of the pool, so that the `Queue`'s other threads go on
    /// writing meanwhile (`query_only` refuses writing statements, not
    /// checkpoints); past twice that, on the write connection, so that they
    /// wait for it. SQLite's own automatic checkpoint still runs inside the
    /// commit on the write connection: the first commit after a long reader
    /// left copies most of the backlog there, with this `Queue`'s writers
    /// waiting (known limit). The thread that pays is whichever wrote: an
    /// enqueuing caller, or a pool's dispatcher or heartbeat thread. A failed attempt is only logged. When a reader pins an
    /// old snapshot (or on an error) the WAL is looked at again after
    /// `WAL_TRUNCATE_BACKOFF`; when another connection was in the way, at
    /// the next commit.
    pub(crate) fn bound_wal(&self) {
        let inner = self;
        let not_before = *inner
            .next_wal_truncate
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if Instant::now() < not_before {
            return;
        }
        let wal_bytes = std::fs::metadata(wal_path(&inner.path)).map_or(0, |m| m.len());
        if wal_bytes <= WAL_TRUNCATE_BYTES || inner.wal_truncating.swap(true, Ordering::SeqCst) {
            return;
        }
        // Cleared however this returns, a panic (say, in a logger)
        // included: a flag left set would end the bounding for good.
        struct Clear<'a>(&'a AtomicBool);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let _clear = Clear(&inner.wal_truncating);
        // Past twice the threshold, writing has outrun the checkpoints
        // (slow disk, busy machine): this process's writers then wait for
        // the checkpoint, which runs on the write connection.
        let hard = wal_bytes > 2 * WAL_TRUNCATE_BYTES;
        let result = if hard {
            self.lock_writer().and_then(|writer| {
                let result = truncate_wal(&writer.conn, WAL_TRUNCATE_WAIT);
                set_busy_limit(inner.busy_timeout);
                result
            })
        } else {
            inner
                .readers
                .get_timeout(WAL_TRUNCATE_WAIT)
                .map_err(Error::from)
                .and_then(|conn| {
                    let result = truncate_wal(&conn, WAL_TRUNCATE_WAIT);
                    set_busy_limit(inner.busy_timeout);
                    result
                })
        };
        let back_off = match result {
            Ok(WalTruncate::Truncated) => {
                log::debug!("WAL of {wal_bytes} bytes checkpointed and truncated");
                false
            }
            // Someone else's checkpoint or writer: the next commit tries
            // again, as waiting 250 ms lets nonstop writers add 40 MiB.
            Ok(WalTruncate::Busy) => false,
            Ok(kept) => {
                log::info!(
                    "WAL of {wal_bytes} bytes not truncated ({kept:?}); next try in {WAL_TRUNCATE_BACKOFF:?}"
                );
                true
            }
            Err(e) => {
                log::warn!("WAL of {wal_bytes} bytes: truncating checkpoint failed: {e}");
                true
            }
        };
        if back_off {
            *inner
                .next_wal_truncate
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Instant::now() + WAL_TRUNCATE_BACKOFF;
        }
    }

    /// A read on the write connection, outside any transaction (so without
    /// SQLite's write lock): for a read when a queue opens. The read pool
    /// opens its connections in background threads on first use; a short
    /// process (a CLI command) would exit with them still open, and SQLite
    /// then leaves the -wal and -shm files behind.
    pub(crate) fn read_on_writer<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        set_busy_limit(self.busy_timeout);
        let writer = self.lock_writer()?;
        f(&writer.conn)
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        set_busy_limit(self.busy_timeout);
        let conn = self.readers.get()?;
        f(&conn)
    }
}

impl Capabilities for Store {
    fn name(&self) -> &'static str {
        "SQLite"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn file(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn sync(&self) -> Result<()> {
        Store::sync(self)
    }

    fn checkpoint(&self) -> Result<Checkpoint> {
        Store::checkpoint(self)
    }

    fn write_lock_waits(&self) -> WriteLockWaits {
        self.lock_waits.snapshot()
    }

    fn watcher(&self) -> Result<Box<dyn Watch>> {
        Ok(Box::new(Store::watcher(self)?))
    }

    fn open_connection(&self) -> Result<Connection> {
        Store::open_connection(self)
    }

    fn enqueue_in_app_tx(
        &self,
        tx: AppTxKind<'_, '_>,
        rows: &[ValidJob],
        now: i64,
    ) -> Result<Vec<JobId>> {
        match tx {
            AppTxKind::Sqlite(tx) => self.enqueue_tx(tx, rows, now),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            other => Err(crate::engine::wrong_app_tx(&other, "SQLite")),
        }
    }

    fn complete_with(
        &self,
        lease: &crate::lease::Lease,
        app_writes: &mut dyn FnMut(AppTxKind<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        Store::complete_with(self, lease, &mut |tx| app_writes(AppTxKind::Sqlite(tx)))
    }
}

/// Whether the file at `path` and its `-wal` and `-shm` files (those that
/// exist) are private to their owner; see [`crate::Queue::file_is_private`].
pub(crate) fn file_is_private(path: &Path) -> Result<bool> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let shared = |m: &std::fs::Metadata| m.permissions().mode() & 0o077 != 0;
        if shared(&meta) {
            return Ok(false);
        }
        for suffix in ["-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            if std::fs::metadata(PathBuf::from(name)).is_ok_and(|m| shared(&m)) {
                return Ok(false);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(true)
}

/// WAL size past which the write path runs a truncating checkpoint (16 MiB).
const WAL_TRUNCATE_BYTES: u64 = 16 * 1024 * 1024;

/// How long that checkpoint waits for other connections to let go.
const WAL_TRUNCATE_WAIT: Duration = Duration::from_millis(100);

/// After a truncating checkpoint stopped by a reader pinning the WAL, the
/// write path waits this long before it looks at the WAL again.
const WAL_TRUNCATE_BACKOFF: Duration = Duration::from_millis(250);

/// WAL frames (pages; tickler creates files with 4 KiB pages) a passive
/// checkpoint may leave uncopied before the log counts as pinned by a
/// reader. Under nonstop writers even a read of ~30 ms holds back 1,500 or
/// more frames and counts as a pin; the cost is one retry 250 ms later.
const WAL_PINNED_FRAMES: i64 = 1_000;

/// How long opening retries a busy switch to WAL mode.
const OPEN_BUSY_RETRY: Duration = Duration::from_secs(30);

/// The process's write connection and the `synchronous` level it is set to.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) synchronous: Durability,
}

/// The locked write connection; clears the thread's "holds the writer"
/// mark when dropped.
struct WriterGuard<'a>(std::sync::MutexGuard<'a, Writer>);

impl std::ops::Deref for WriterGuard<'_> {
    type Target = Writer;
    fn deref(&self) -> &Writer {
        &self.0
    }
}

impl std::ops::DerefMut for WriterGuard<'_> {
    fn deref_mut(&mut self) -> &mut Writer {
        &mut self.0
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        HOLDS_WRITER.with(|h| h.set(false));
    }
}

/// How a write transaction's commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// With the queue's [`Durability`]: an `Ok` means the promise is kept
    /// (enqueue, outcomes, operator actions).
    Durable,
    /// `synchronous=NORMAL` even under [`Durability::Full`]: no fsync of its
    /// own. For writes whose loss on power failure is harmless: a lost
    /// claim leaves the job pending, a lost heartbeat or reap leaves a lease
    /// that the reaper takes after restart. In WAL mode the next synced
    /// commit makes these durable too, since the log is written in order.
    Lazy,
}

/// The helper thread of a `Queue`'s read-connection pool: r2d2 opens read
/// connections and closes idle ones from it, so they are opened one at a
/// time. r2d2's default is three threads per pool that run the pool's
/// pending upkeep, up to 30 s, after the pool is dropped; one thread that
/// stops with its pool is enough for a few read connections.
pub(super) fn reader_pool_threads() -> Arc<scheduled_thread_pool::ScheduledThreadPool> {
    Arc::new(
        scheduled_thread_pool::ScheduledThreadPool::builder()
            .num_threads(1)
            .thread_name_pattern("tickler-readers-{}")
            .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    )
}

/// Copies the whole WAL back into the database and truncates it, on
/// `conn`, each lock wait taking at most `wait`:
///
/// 1. PASSIVE checkpoints copy what they can without taking the write lock
///    or waiting for readers, so a large backlog is copied while other
///    connections keep writing; while a round saw more than
///    `WAL_PINNED_FRAMES` frames appended since the last, another round
///    (at most 4) copies those too. If a round had to leave more than
///    `WAL_PINNED_FRAMES` frames uncopied, a reader pins an old snapshot:
///    the next step would hold every writer for the whole `wait` and then
///    fail, so this stops here;
/// 2. a TRUNCATE checkpoint takes the write lock (through the busy
///    handler), copies the little that was committed meanwhile, waits for
///    the readers still inside the log and empties the file.
///
/// Leaves the thread's busy limit changed: callers set it back.
fn truncate_wal(conn: &Connection, wait: Duration) -> Result<WalTruncate> {
    let mut last_log_frames: Option<i64> = None;
    for _ in 0..4 {
        let passive = wal_checkpoint(conn, "PASSIVE", Instant::now() + wait)?;
        if passive.log_frames < 0 {
            return Ok(WalTruncate::Busy);
        }
        if passive.log_frames - passive.copied > WAL_PINNED_FRAMES {
            return Ok(WalTruncate::Pinned);
        }
        let appended = last_log_frames.map_or(i64::MAX, |last| passive.log_frames - last);
        last_log_frames = Some(passive.log_frames);
        if appended <= WAL_PINNED_FRAMES {
            break;
        }
    }
    Ok(
        if wal_checkpoint(conn, "TRUNCATE", Instant::now() + wait)?.finished {
            WalTruncate::Truncated
        } else {
            WalTruncate::Busy
        },
    )
}

/// How [`truncate_wal`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalTruncate {
    /// The WAL was copied back and the file emptied.
    Truncated,
    /// A reader holds an old snapshot; nothing can empty the log until it
    /// lets go.
    Pinned,
    /// Another connection's checkpoint, writer or short reader did not let
    /// go within the wait.
    Busy,
}

/// What one `PRAGMA wal_checkpoint` reported.
struct WalCheckpoint {
    /// Nothing kept it from doing all its mode asks for.
    finished: bool,
    /// Frames in the log, or -1 if it never got the checkpoint lock.
    log_frames: i64,
    /// Frames of the log copied back into the database.
    copied: i64,
}

/// Runs `PRAGMA wal_checkpoint(mode)` on `conn`, letting the busy handler
/// wait until `deadline`. SQLite answers a checkpoint lock held by another
/// connection with SQLITE_BUSY at once, without calling the busy handler,
/// and under steady writing another connection's automatic checkpoint holds
/// it much of the time; so that answer is retried after a short sleep until
/// `deadline`. Leaves the thread's busy limit set to what remained.
fn wal_checkpoint(conn: &Connection, mode: &str, deadline: Instant) -> Result<WalCheckpoint> {
    let sql = format!("PRAGMA wal_checkpoint({mode})");
    loop {
        set_busy_limit(deadline.saturating_duration_since(Instant::now()));
        let (busy, log_frames, copied): (i64, i64, i64) =
            conn.query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        if busy == 0 || log_frames >= 0 || Instant::now() >= deadline {
            return Ok(WalCheckpoint {
                finished: busy == 0,
                log_frames,
                copied,
            });
        }
        std::thread::sleep(Duration::from_micros(fastrand::u64(50..=500)));
    }
}

/// The `-wal` file next to a database file.
pub(crate) fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Creates the file (0600 on Unix) if it does not exist; never truncates.
pub(super) fn create_owner_only(path: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(Error::ReadOnly {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(super) fn configure_connection(
    conn: &Connection,
    durability: Durability,
    reader: bool,
    hook: Option<&ConnectionHook>,
) -> Result<()> {
    conn.busy_handler(Some(busy_handler))?;
    conn.set_prepared_statement_cache_capacity(64);
    // Switching a new file to WAL takes an exclusive lock, and SQLite can
    // answer SQLITE_BUSY at once (without the busy handler) when several
    // connections open the new file together: retry with short jittered
    // sleeps for a bounded time.
    let started = Instant::now();
    let mode: String = loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(f, _))
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && started.elapsed() < OPEN_BUSY_RETRY =>
            {
                std::thread::sleep(Duration::from_micros(fastrand::u64(200..=5_000)));
            }
            other => break other?,
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::NotWal { mode });
    }
    // On Apple systems fsync() leaves the data in the drive's cache, where
    // a power cut loses it and reorders what reached the platters: SQLite
    // flushes the drive (F_FULLFSYNC) only when told. Full syncs every
    // commit that way; a checkpoint, which overwrites pages of the main
    // file, does under either durability, so that a cut in one can never
    // damage the file. Elsewhere both settings change nothing.
    let fullfsync = i64::from(durability == Durability::Full);
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}; PRAGMA foreign_keys = ON; PRAGMA journal_size_limit = 67108864;
         PRAGMA fullfsync = {fullfsync}; PRAGMA checkpoint_fullfsync = 1;",
        durability.pragma_value()
    ))?;
    if reader {
        conn.execute_batch("PRAGMA query_only = ON")?;
    }
    if let Some(hook) = hook {
        hook(conn)?;
    }
    // Read back after the hook too, so that it cannot weaken durability.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::NotWal { mode });
    }
    expect_pragma(conn, "synchronous", durability.pragma_value())?;
    expect_pragma(conn, "foreign_keys", 1)?;
    expect_pragma(conn, "fullfsync", fullfsync)?;
    expect_pragma(conn, "checkpoint_fullfsync", 1)?;
    if reader {
        expect_pragma(conn, "query_only", 1)?;
    }
    Ok(())
}

fn expect_pragma(conn: &Connection, pragma: &'static str, expected: i64) -> Result<()> {
    let found: i64 = conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))?;
    if found == expected {
        Ok(())
    } else {
        Err(Error::PragmaMismatch {
            pragma,
            expected: expected.to_string(),
            found: found.to_string(),
        })
    }
}

pub(crate) fn open_error(path: &Path, e: impl Into<Error>) -> Error {
    let e = e.into();
    let code = match &e {
        Error::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => Some(f.code),
        _ => None,
    };
    match code {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            Error::NotADatabase {
                path: path.to_path_buf(),
            }
        }
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => Error::ReadOnly {
            path: path.to_path_buf(),
        },
        _ => e,
    }
}

pub(super) fn to_rusqlite(e: Error) -> rusqlite::Error {
    match e {
        Error::Sqlite(inner) => inner,
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

thread_local! {
    /// This thread holds the process's write connection (see `lock_writer`).
    static HOLDS_WRITER: Cell<bool> = const { Cell::new(false) };
    static BUSY_LIMIT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    static BUSY_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Calls of the busy handler on this thread: a change tells a caller
    /// that another connection held the lock it asked for.
    static BUSY_WAITS: Cell<u64> = const { Cell::new(0) };
}

pub(super) fn set_busy_limit(limit: Duration) {
    BUSY_LIMIT.with(|l| l.set(limit));
}

/// SQLite's busy handler for contention between processes: short random
/// sleeps (0.1 to 2 ms, then up to 10 ms) instead of SQLite's default
/// schedule that grows to 100 ms per sleep, until the thread's busy limit.
/// A plain `fn` (SQLite's handler takes no closure), so the limit is
/// per thread, set before each transaction.
pub(super) fn busy_handler(count: i32) -> bool {
    BUSY_WAITS.with(|n| n.set(n.get().wrapping_add(1)));
    let now = Instant::now();
    let since = BUSY_SINCE.with(|s| {
        if count == 0 || s.get().is_none() {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(since) >= BUSY_LIMIT.with(Cell::get) {
        BUSY_SINCE.with(|s| s.set(None));
        return false;
    }
    let (min_us, max_us) = match count {
        0..=99 => (20, 300),
        100..=999 => (100, 2_000),
        _ => (1_000, 10_000),
    };
    std::thread::sleep(Duration::from_micros(fastrand::u64(min_us..=max_us)));
    true
}

/// Runs one statement of a batch (one outcome, one heartbeat). An error
/// SQLite confined to that statement (a constraint or trigger, a value over
/// its length limit) is that item's own, `Ok(Err(_))`: SQLite has undone
/// the statement alone and the transaction goes on with the rest of the
/// batch. Any other error, or one after which SQLite ended the
/// transaction (disk full, I/O), fails the batch: `Err(_)`.
pub(crate) fn isolated<T>(
    tx: &rusqlite::Transaction<'_>,
    statement: impl FnOnce() -> Result<T>,
) -> Result<Result<T>> {
    match statement() {
        Ok(value) => Ok(Ok(value)),
        Err(e) if statement_level(&e) && !tx.is_autocommit() => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

pub(crate) fn statement_level(e: &Error) -> bool {
    match e {
        Error::ConstraintViolated { .. } => true,
        Error::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => matches!(
            f.code,
            rusqlite::ErrorCode::TooBig
                // SQLITE_ERROR from a statement, e.g. a JSON function on a
                // damaged value; `isolated` also checks the transaction is
                // still open.
                | rusqlite::ErrorCode::Unknown
                | rusqlite::ErrorCode::ConstraintViolation
                | rusqlite::ErrorCode::TypeMismatch
                | rusqlite::ErrorCode::ParameterOutOfRange
        ),
        _ => false,
    }
}

/// The file system a queue file lives on, when it is one where SQLite's
/// WAL is not safe: a network file system, or one that shares a folder
/// between a virtual machine or container and its host (Docker Desktop,
/// WSL's 9p, virtiofs). WAL keeps its index in shared memory that only one
/// kernel's processes see; two kernels writing one file through such a
/// mount damage it (SQLite's WAL documentation, and reports of zero-filled
/// pages from apps whose host and container opened the same file). Read
/// from `/proc/self/mountinfo` on Linux; `None` elsewhere or when unsure.
pub(super) fn risky_file_system(path: &Path) -> Option<String> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let fs_type = file_system_in(&mounts, &path)?;
    let risky = fs_type.starts_with("nfs")
        || [
            "cifs",
            "smb3",
            "smbfs",
            "9p",
            "virtiofs",
            "fakeowner",
            "ceph",
            "afs",
        ]
        .contains(&fs_type.as_str())
        || [
            "fuse.grpcfuse",
            "fuse.sshfs",
            "fuse.glusterfs",
            "fuse.s3fs",
            "fuse.rclone",
        ]
        .contains(&fs_type.as_str());
    risky.then_some(fs_type)
}

/// The type of the file system `path` (absolute, resolved) is on, by the
/// longest mount point of `mountinfo` (the format of
/// `/proc/self/mountinfo`) that holds it.
fn file_system_in(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(dash)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let Some(fs_type) = fields.get(dash + 1) else {
            continue;
        };
        // Spaces and the like are octal escapes (`\040`).
        let point = PathBuf::from(unescape_mount(point));
        let depth = point.components().count();
        if path.starts_with(&point) && best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, (*fs_type).to_owned()));
        }
    }
    best.map(|(_, fs_type)| fs_type)
}

fn unescape_mount(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod mount_tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/share rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2
41 40 0:36 / /mnt/share/local rw,relatime shared:21 - ext4 /dev/sdb1 rw
42 22 0:37 / /mnt/my\\040docs rw,relatime - virtiofs docs rw
";

    #[test]
    fn the_longest_mount_point_that_holds_the_file_names_its_file_system() {
        let fs = |p: &str| file_system_in(MOUNTINFO, Path::new(p));
        assert_eq!(fs("/home/app/q.db").as_deref(), Some("ext4"));
        assert_eq!(fs("/mnt/share/q.db").as_deref(), Some("nfs4"));
        assert_eq!(fs("/mnt/share/local/q.db").as_deref(), Some("ext4"));
        assert_eq!(
            fs("/mnt/shared/q.db").as_deref(),
            Some("ext4"),
            "not a prefix by characters"
        );
        assert_eq!(fs("/mnt/my docs/q.db").as_deref(), Some("virtiofs"));
    }
}
