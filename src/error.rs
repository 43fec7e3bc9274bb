//! The one error type of tickler.

use crate::job::{JobId, JobState};
use std::path::PathBuf;

/// Result with tickler's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tickler. Each variant's message says what
/// happened and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease behind a heartbeat or an outcome is no longer held: the
    /// reaper took the job back, it was cancelled, or another outcome was
    /// already recorded. Nothing was changed; the caller must not act as if
    /// it still held the job.
    #[error("lease lost on job {job_id}: the job was reaped, cancelled or finished by someone else; drop this result")]
    LeaseLost {
        /// The job whose lease was lost.
        job_id: JobId,
    },

    /// Another process held SQLite's write lock for longer than the busy
    /// timeout plus the retry window.
    #[error("database stayed locked by another connection for {waited_ms} ms; a process may hold a long write transaction (or the file is on a network filesystem)")]
    Busy {
        /// How long tickler waited, in milliseconds.
        waited_ms: u64,
    },

    /// No job has this id (it may have been pruned).
    #[error("no job with id {0}")]
    NotFound(JobId),

    /// The job is in a state that does not allow the requested action.
    #[error("job {job_id} is {state}; cannot {action} it")]
    InvalidState {
        /// The job.
        job_id: JobId,
        /// Its current state.
        state: JobState,
        /// What was asked ("cancel", "retry").
        action: &'static str,
    },

    /// A job names a parent ([`crate::NewJob::after`]) that no job has:
    /// never stored, pruned, or an id not yet assigned. Nothing of the
    /// enqueue was stored.
    #[error("job {0} named as a parent does not exist (never stored, or pruned): a job can only run after a stored job or a step of the same Graph")]
    ParentNotFound(JobId),

    /// No batch has this id (never opened, or pruned).
    #[error("batch {0} does not exist (never opened, or pruned)")]
    BatchNotFound(crate::BatchId),

    /// A job was added to a batch already sealed
    /// ([`crate::Queue::seal_batch`]); nothing of that insert was stored.
    #[error("batch {0} is sealed: no job can join it after Queue::seal_batch")]
    BatchSealed(crate::BatchId),

    /// The edges of a [`crate::Graph`] form a cycle (a step after itself
    /// counts); nothing of it was stored.
    #[error("the graph's steps wait on each other in a cycle: {}", steps.join(" -> "))]
    DependencyCycle {
        /// The steps of one cycle, in edge order, the first repeated last.
        steps: Vec<String>,
    },

    /// A job's kind was empty.
    #[error("job kind is empty: give every job the name of the handler that runs it")]
    EmptyKind,

    /// A queue name was empty.
    #[error("queue name is empty: leave it unset to use \"default\"")]
    EmptyQueue,

    /// `max_attempts` was 0.
    #[error("max_attempts must be at least 1 (got 0)")]
    InvalidMaxAttempts,

    /// The payload, as JSON, is larger than the configured limit.
    #[error("payload is {size} bytes, over the limit of {limit} bytes: store large data elsewhere and pass a reference, or raise QueueBuilder::max_payload_bytes")]
    PayloadTooLarge {
        /// Size of the serialized payload, in bytes.
        size: usize,
        /// The configured limit, in bytes.
        limit: usize,
    },

    /// The payload nests arrays and objects deeper than
    /// [`crate::MAX_PAYLOAD_DEPTH`] levels: it could be stored but not read
    /// back (serde_json stops at 128), so it is refused. Nothing was stored.
    #[error("payload nests arrays/objects more than {limit} levels deep; tickler could not read it back: flatten it")]
    PayloadTooDeep {
        /// The limit, [`crate::MAX_PAYLOAD_DEPTH`].
        limit: usize,
    },

    /// A handler's output, as JSON, is larger than
    /// [`crate::MAX_OUTPUT_BYTES`] ([`crate::Output::new`]). Nothing was
    /// stored; a worker pool records the job dead with this message.
    #[error("the handler's output is {size} bytes of JSON, over the limit of {limit} bytes: store large results elsewhere and return where they are")]
    OutputTooLarge {
        /// Its size as JSON, in bytes.
        size: usize,
        /// The limit, [`crate::MAX_OUTPUT_BYTES`].
        limit: usize,
    },

    /// A unique_key is longer than [`crate::MAX_UNIQUE_KEY_BYTES`]. Nothing
    /// was stored.
    #[error("unique_key is {size} bytes, over the limit of {limit} bytes: use a hash of the identifying data as the key")]
    UniqueKeyTooLong {
        /// Its length in bytes (UTF-8).
        size: usize,
        /// The limit, [`crate::MAX_UNIQUE_KEY_BYTES`].
        limit: usize,
    },

    /// A `QueueBuilder` setting cannot work with this file or this SQLite
    /// build (for example `max_payload_bytes` above what SQLite stores). The
    /// queue was not opened.
    #[error("invalid queue setting: {0}")]
    Config(String),

    /// A write broke one of the schema's constraints (a `CHECK`, `NOT
    /// NULL`, or a `RAISE` in an application's trigger on tickler's tables).
    /// tickler validates its input first, so this means a row or trigger
    /// written outside tickler; nothing of the failed statement was written.
    #[error("the database refused the write ({message}); nothing of it was written: check triggers or hand edits on tickler's tables")]
    ConstraintViolated {
        /// SQLite's message, naming the constraint (`CHECK constraint failed: …`).
        message: String,
    },

    /// A time (run_at, delay, snooze) falls outside what tickler stores:
    /// 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z.
    #[error("{what} is outside the supported time range (1970-01-01 to 9999-12-31 UTC)")]
    TimeOutOfRange {
        /// Which input was out of range.
        what: &'static str,
    },

    /// A cron expression could not be parsed, or can never fire (30
    /// February). Nothing was stored.
    #[error("invalid cron expression {expression:?}: {reason}; write 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, e.g. \"*/15 * * * *\" or \"0 30 2 * * MON-FRI\"")]
    InvalidSchedule {
        /// The expression as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A time zone name is not in the IANA time zone database (as compiled
    /// into chrono-tz). Nothing was stored.
    #[error("unknown time zone {name:?}: use an IANA name such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\" (case-sensitive)")]
    UnknownTimeZone {
        /// The name as given.
        name: String,
    },

    /// No schedule has this name.
    #[error("no schedule named {name:?}; list_schedules shows the stored ones")]
    UnknownSchedule {
        /// The name asked for.
        name: String,
    },

    /// A setting or argument was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Retrying the job would give a unique_key to two unfinished jobs.
    #[error("job {job_id} cannot be retried: its unique_key {unique_key:?} is held by unfinished job {held_by}")]
    UniqueKeyHeld {
        /// The job asked to retry.
        job_id: JobId,
        /// The key.
        unique_key: String,
        /// The unfinished job that holds the key.
        held_by: JobId,
    },

    /// The file was written by a newer tickler.
    #[error("database schema version {found} is newer than this build supports ({supported}); upgrade tickler, the file was left unchanged")]
    SchemaTooNew {
        /// `PRAGMA user_version` of the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// The file could not be put in WAL mode.
    #[error("database is in journal mode {mode:?}, not WAL; tickler needs WAL (a network filesystem or a read-only folder can prevent it)")]
    NotWal {
        /// The journal mode SQLite reported.
        mode: String,
    },

    /// A pragma did not read back as set.
    #[error("PRAGMA {pragma} reads back {found:?}, expected {expected:?}")]
    PragmaMismatch {
        /// The pragma.
        pragma: &'static str,
        /// What was expected.
        expected: String,
        /// What SQLite reported.
        found: String,
    },

    /// The file is not a SQLite database, or is damaged.
    #[error("{path} is not a tickler database (not SQLite, or damaged); it was left unchanged: check the path, or restore from a backup")]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },

    /// The file or its folder cannot be written.
    #[error("{path} is read-only: tickler needs write access to the file and its folder (for the -wal and -shm files)")]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },

    /// The disk (or SQLite's max_page_count) is full. Nothing of the failed
    /// transaction was written; earlier commits are intact.
    #[error("disk full: the write was not committed and nothing stored before was lost; free space (or prune finished jobs) and try again")]
    DiskFull,

    /// An I/O error outside SQLite (creating the file, for example).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The application's part of a transaction tickler ran for it (for
    /// example the closure of `Queue::complete_with`) failed; everything in
    /// the transaction was rolled back.
    #[error("aborted by the application: {0}; nothing in the transaction was written")]
    Aborted(Box<dyn std::error::Error + Send + Sync>),

    /// A payload could not be (de)serialized.
    #[error("payload JSON error: {0}")]
    Json(#[from] serde_json::Error),

    /// The read connection pool failed.
    #[error("connection pool error: {0}")]
    Pool(#[from] r2d2::Error),

    /// Any other SQLite error.
    #[error("SQLite error: {0}")]
    Sqlite(rusqlite::Error),

    /// A PostgreSQL error that retrying did not cure (or that retrying
    /// cannot cure: a statement the server refused, a wrong password, a
    /// database that does not exist, a missing privilege). Its text gives
    /// the server's severity, message and SQLSTATE, and its detail and hint
    /// where the server sent them (`ERROR: relation "x" does not exist
    /// (SQLSTATE 42P01)`), or the client's error and the I/O error under
    /// it. Connection losses, server restarts, failovers, deadlocks and
    /// serialization failures are retried for `QueueBuilder::busy_retry`
    /// first, and the last error of that window is the one reported.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL error: {}", postgres_text(.0))]
    Postgres(postgres::Error),

    /// A MySQL/MariaDB error that retrying did not cure (or cannot cure: a
    /// statement the server refused), with the server's message and error
    /// code in its text. Lost connections, server restarts, deadlocks
    /// (1213) and lock wait timeouts (1205) are retried for
    /// `QueueBuilder::busy_retry` first.
    #[cfg(feature = "mysql")]
    #[error("MySQL error: {0}")]
    Mysql(mysql::Error),

    /// The operation exists only on another engine (for example
    /// `Queue::checkpoint`, which is about SQLite's WAL file, on a queue in
    /// PostgreSQL).
    #[error("{what} is not available on {engine}")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// The engine of this queue ("PostgreSQL", "SQLite").
        engine: &'static str,
    },
}

impl Error {
    /// Wraps an application error as [`Error::Aborted`], for use inside
    /// `Queue::complete_with`: `.map_err(Error::aborted)?`.
    pub fn aborted(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Aborted(e.into())
    }

    /// True for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// True when the error is SQLite's "database is locked" (`SQLITE_BUSY` or
    /// `SQLITE_LOCKED`), before or after tickler's retries.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Busy { .. } => true,
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            _ => false,
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(f, _) = &e {
            if f.code == rusqlite::ErrorCode::DiskFull {
                return Error::DiskFull;
            }
            // Unique conflicts are resolved in SQL (ON CONFLICT); any other
            // constraint failure is a row or trigger written outside tickler.
            if f.code == rusqlite::ErrorCode::ConstraintViolation
                && f.extended_code != rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                && f.extended_code != rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            {
                let message = match &e {
                    rusqlite::Error::SqliteFailure(_, Some(m)) => m.clone(),
                    _ => format!("constraint failed (code {})", f.extended_code),
                };
                return Error::ConstraintViolated { message };
            }
        }
        Error::Sqlite(e)
    }
}

/// The error of a read or write on a MySQL connection that waited longer
/// than the connection allows (`busy_timeout + busy_retry`, at least 10 s
/// and `busy_timeout` + 2 s),
/// in words that say so: the socket's own ("Resource temporarily
/// unavailable") name no cause. Other errors are returned as they are.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_unanswered(e: mysql::Error) -> mysql::Error {
    if mysql_waited_out(&e) {
        return mysql::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the server did not answer within the connection's wait for an answer \
             (busy_timeout + busy_retry, at least 10 s and busy_timeout + 2 s), so the connection \
             was given up",
        ));
    }
    e
}

/// Whether `e` is a connection's read or write timeout running out (the
/// socket's `EAGAIN`, not the kernel's own `ETIMEDOUT`).
#[cfg(feature = "mysql")]
pub(crate) fn mysql_waited_out(e: &mysql::Error) -> bool {
    use std::error::Error as _;
    let io = match e {
        mysql::Error::IoError(io) => Some(io),
        mysql::Error::CodecError(codec) => codec
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>()),
        _ => None,
    };
    io.is_some_and(|io| io.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(feature = "mysql")]
impl From<mysql::Error> for Error {
    fn from(e: mysql::Error) -> Self {
        let e = mysql_unanswered(e);
        if let mysql::Error::MySqlError(server) = &e {
            match server.code {
                // ER_RECORD_FILE_FULL, ER_DISK_FULL.
                1114 | 1021 => return Error::DiskFull,
                // A CHECK constraint, a NOT NULL, a foreign key, or a
                // trigger's SIGNAL (SQLSTATE class 45): a row or trigger
                // written outside tickler. Unique conflicts are tickler's
                // own to resolve.
                3819 | 4025 | 1048 | 1451 | 1452 | 1644 => {
                    return Error::ConstraintViolated {
                        message: format!("{} ({})", server.message, server.code),
                    }
                }
                _ => {}
            }
        }
        Error::Mysql(e)
    }
}

#[cfg(feature = "mysql")]
impl From<mysql::UrlError> for Error {
    fn from(e: mysql::UrlError) -> Self {
        Error::Config(format!("not a MySQL URL ({e})"))
    }
}

/// A PostgreSQL error with what its `Display` leaves out ("db error"): the
/// server's severity, message, SQLSTATE, detail and hint, or the cause
/// under a client error (the I/O error of a lost connection, say).
#[cfg(feature = "postgres")]
pub(crate) fn postgres_text(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(detail) = db.detail() {
            text.push_str(&format!("; detail: {detail}"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(feature = "postgres")]
impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        use postgres::error::SqlState;
        if let Some(code) = e.code() {
            if *code == SqlState::DISK_FULL {
                return Error::DiskFull;
            }
            // Unique conflicts are resolved in SQL (ON CONFLICT); any other
            // integrity failure, or an exception a trigger raised (class
            // P0, as SQLite's RAISE(ABORT)), is a row or trigger written
            // outside tickler.
            let class = &code.code()[..2];
            if (class == "23" && *code != SqlState::UNIQUE_VIOLATION) || class == "P0" {
                let message = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned());
                return Error::ConstraintViolated { message };
            }
        }
        Error::Postgres(e)
    }
}
