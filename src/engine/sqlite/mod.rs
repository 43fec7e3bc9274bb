//! The SQLite engine: one file in WAL mode, shared by the processes of one
//! machine. What sets it apart from a server engine:
//!
//! - one write lock on the whole file: in-process writers queue on one
//!   write connection per `Queue` (a mutex, fair and without sleeps), other
//!   processes are waited for by `BEGIN IMMEDIATE` and a busy handler of
//!   short random sleeps, and a transaction that still finds the lock taken
//!   is retried whole;
//! - every durable commit is an fsync: concurrent enqueues share one (group
//!   commit), and writes whose loss on power failure is harmless (claims,
//!   heartbeats, reaps) skip theirs;
//! - a WAL that SQLite's own checkpoints let grow without bound under
//!   nonstop writers: the write path truncates it;
//! - no server to notify: other processes' commits are seen through
//!   file-change notifications of the `-wal` file and `PRAGMA data_version`.
//!
//! The files are those of every engine: `connection.rs` (connections, the
//! write path, the capabilities), `migrate.rs` (with `schema.sql`),
//! `enqueue.rs`, `claim.rs`, `outcome.rs`, `lease.rs`, `admin.rs`,
//! `read.rs`, `schedules.rs`, `rows.rs` and `watch.rs`; and one of its own,
//! `file_events.rs`: the operating system's file-change notifications,
//! which stand in for a server's `LISTEN`.

mod admin;
mod batches;
mod claim;
mod connection;
pub(crate) mod deps;
mod enqueue;
mod file_events;
mod lease;
mod limits;
mod migrate;
mod outcome;
mod read;
mod rows;
mod schedules;
mod watch;

pub(crate) use connection::{file_is_private, wal_path};
pub(crate) use migrate::{file_schema_version, schema_version};

use crate::clock::Clock;
use crate::engine::group_commit::EnqueueGroup;
use crate::engine::types::{
    check_payload_limit, ConnectionHook, Durability, MAX_PAYLOAD_BYTES_LIMIT, ROW_HEADROOM,
};

use crate::engine::OpenSettings;
use crate::error::{Error, Result};
use crate::metrics::WaitHistogram;
use crate::retry::RetryPolicy;
use connection::{
    configure_connection, create_owner_only, open_error, reader_pool_threads, risky_file_system,
    set_busy_limit, to_rusqlite, Writer,
};
use crossbeam_channel::Sender;
use file_events::FileEvents;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The connections of one opened `Queue` (shared by its clones) and what
/// goes with them.
pub(crate) struct Store {
    path: PathBuf,
    durability: Durability,
    busy_timeout: Duration,
    busy_retry: Duration,
    on_connection: Option<ConnectionHook>,
    /// Where "now" comes from.
    clock: Arc<dyn Clock>,
    /// Backoff after failed attempts and expired leases.
    retry_policy: RetryPolicy,
    /// This process, as each lease it claims records it: the text, and
    /// the number the rows store (`crate::holder::holder_id`).
    holder: String,
    holder_id: i64,
    /// This process's row of `tickler_holders` is written (by the first
    /// claim).
    holder_registered: std::sync::atomic::AtomicBool,
    /// The process's single write path: in-process writers queue on this
    /// mutex instead of racing through SQLite's busy handler (whose sleeps
    /// grow to 100 ms and are unfair).
    writer: Mutex<Writer>,
    readers: r2d2::Pool<SqliteConnectionManager>,
    /// In-process wake-ups for [`ChangeWatcher`](crate::ChangeWatcher)s, sent after each commit
    /// that may make a job claimable.
    watchers: Mutex<Vec<Sender<()>>>,
    /// Commits by other processes, from file-change notifications of the
    /// `-wal` file (started with the first watcher; see `file_events`).
    file_events: Arc<FileEvents>,
    file_events_started: std::sync::Once,
    lock_waits: WaitHistogram,
    enqueues: EnqueueGroup,
    /// No truncating checkpoint from the write path before this instant;
    /// see `Store::bound_wal`.
    next_wal_truncate: Mutex<Instant>,
    /// A thread is running `Store::bound_wal`'s checkpoint for this `Queue`
    /// and its clones (one per opened `Queue`, not per process).
    wal_truncating: AtomicBool,
}

impl Store {
    /// Opens the write connection and the read pool on `settings.path`
    /// (creating the file, owner-only, if needed) and migrates the schema.
    /// A payload limit that a row could not hold (with the length limit an
    /// `on_connection` hook may have lowered) is refused before anything is
    /// written.
    pub(crate) fn open(settings: &OpenSettings<'_>) -> Result<Store> {
        let path = settings.location.to_path_buf();
        // Refused before the file is made; the connection's own length
        // limit (lowered by an `on_connection` hook, maybe) is checked below.
        check_payload_limit(
            settings.max_payload_bytes,
            MAX_PAYLOAD_BYTES_LIMIT + ROW_HEADROOM,
        )?;
        create_owner_only(&path)?;
        let writer = Connection::open(&path).map_err(|e| open_error(&path, e))?;
        set_busy_limit(settings.busy_timeout);
        configure_connection(&writer, settings.durability, false, settings.on_connection)
            .map_err(|e| open_error(&path, e))?;
        // The hook may have lowered SQLite's length limit on this connection.
        let length_limit = writer.limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH)?;
        check_payload_limit(
            settings.max_payload_bytes,
            usize::try_from(length_limit).unwrap_or(0),
        )?;
        if writer.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            return Err(Error::ReadOnly { path });
        }
        let durability = settings.durability;
        let hook = settings.on_connection.cloned();
        let manager = SqliteConnectionManager::file(&path)
            .with_flags(OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .with_init(move |c| {
                configure_connection(c, durability, true, hook.as_ref()).map_err(to_rusqlite)
            });
        let readers = r2d2::Pool::builder()
            .max_size(settings.read_connections)
            .min_idle(Some(0))
            .thread_pool(reader_pool_threads())
            .build(manager)?;
        let store = Store {
            path: path.clone(),
            durability,
            busy_timeout: settings.busy_timeout,
            busy_retry: settings.busy_retry,
            on_connection: settings.on_connection.cloned(),
            clock: Arc::clone(&settings.clock),
            retry_policy: settings.retry_policy,
            holder: settings.holder.to_owned(),
            holder_id: crate::holder::holder_id(settings.holder),
            holder_registered: std::sync::atomic::AtomicBool::new(false),
            writer: Mutex::new(Writer {
                conn: writer,
                synchronous: durability,
            }),
            readers,
            watchers: Mutex::new(Vec::new()),
            file_events: Arc::default(),
            file_events_started: std::sync::Once::new(),
            lock_waits: WaitHistogram::default(),
            enqueues: EnqueueGroup::default(),
            next_wal_truncate: Mutex::new(Instant::now()),
            wal_truncating: AtomicBool::new(false),
        };
        store.migrate().map_err(|e| match e {
            Error::Sqlite(inner) => open_error(&path, inner),
            other => other,
        })?;
        if let Some(fs_type) = risky_file_system(&path) {
            log::warn!(
                "{} is on a {fs_type} file system, where SQLite's WAL is not safe if processes of another machine, virtual machine or container (or its host) open it too: they do not share the WAL's index and damage the file; keep the queue on a local disk or a container's own volume",
                path.display()
            );
        }
        if let Ok(false) = file_is_private(&path) {
            log::warn!(
                "{}: other users can read (or write) this queue file or its -wal/-shm file, and so every job's payload; `chmod 600` them unless they are meant to be shared",
                path.display()
            );
        }
        Ok(store)
    }
}
