//! Opening a queue: [`QueueBuilder`] and its settings; [`Queue::open`]
//! hands them to the seam (`engine::open`), which picks the engine the
//! location names.

use super::Inner;
use super::Queue;
use crate::clock::{Clock, SystemClock};
use crate::engine::types::*;
use crate::engine::OpenSettings;
use crate::error::Result;
use crate::events::EventHub;
use crate::holder::Holder;
use crate::retry::RetryPolicy;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Settings for opening a [`Queue`]; get one from [`Queue::builder`].
#[derive(Clone)]
pub struct QueueBuilder {
    pub(super) path: PathBuf,
    pub(super) busy_timeout: Duration,
    pub(super) busy_retry: Duration,
    pub(super) max_payload_bytes: usize,
    pub(super) retry_policy: RetryPolicy,
    pub(super) clock: Arc<dyn Clock>,
    /// `clock` was set by the caller (on PostgreSQL it then replaces the
    /// server's clock).
    pub(super) clock_set: bool,
    pub(super) sqlite: SqliteOptions,
    pub(super) postgres: PostgresOptions,
    /// This process, as its leases record it.
    pub(super) holder: Holder,
}

impl std::fmt::Debug for QueueBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueBuilder")
            .field("path", &self.path)
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retry", &self.busy_retry)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("retry_policy", &self.retry_policy)
            .field("clock", &self.clock)
            .field("clock_set", &self.clock_set)
            .field("sqlite", &self.sqlite)
            .field("postgres", &self.postgres)
            .field("holder", &self.holder)
            .finish()
    }
}

impl QueueBuilder {
    /// SQLite's own settings (durability, read connections, a hook on
    /// every connection), applied when the location is a file:
    /// `builder.sqlite(|o| o.durability(Durability::Normal))`. Calls add
    /// up.
    pub fn sqlite(mut self, set: impl FnOnce(SqliteOptions) -> SqliteOptions) -> Self {
        self.sqlite = set(self.sqlite);
        self
    }

    /// PostgreSQL's own settings (pool size, `LISTEN`, the fallback poll),
    /// applied when the location is a `postgres://` URL:
    /// `builder.postgres(|o| o.max_connections(20))`. Calls add up.
    pub fn postgres(mut self, set: impl FnOnce(PostgresOptions) -> PostgresOptions) -> Self {
        self.postgres = set(self.postgres);
        self
    }

    /// How long one attempt to get SQLite's write lock waits for another
    /// process, in short jittered sleeps (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// After the busy timeout, how long the whole transaction is retried
    /// with jittered backoff before [`Error::Busy`](crate::Error::Busy)
    /// (default 25 s).
    pub fn busy_retry(mut self, window: Duration) -> Self {
        self.busy_retry = window;
        self
    }

    /// Largest payload, as serialized JSON, in bytes (default 1 MiB).
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.max_payload_bytes = limit;
        self
    }

    /// Backoff after failed attempts and expired leases (default:
    /// [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = policy;
        self
    }

    /// Where "now" comes from (default [`SystemClock`]; on PostgreSQL,
    /// the database server's clock). A clock set here is used on either
    /// engine: tests move a [`crate::ManualClock`] by hand.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.clock_set = true;
        self
    }

    /// The process this queue's claims name as their leases' holder
    /// (default: this process). For tests that play another process, an
    /// earlier boot or another machine.
    #[doc(hidden)]
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// Opens (creating if needed) the file and migrates its schema.
    ///
    /// A new file is created readable and writable by its owner only (0600).
    /// Sets `journal_mode=WAL`, `synchronous` per [`Durability`],
    /// `foreign_keys=ON`, and reads each back.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] (the file is not SQLite or is damaged; it is
    /// not modified), [`Error::ReadOnly`], [`Error::SchemaTooNew`],
    /// [`Error::NotWal`], [`Error::PragmaMismatch`], [`Error::Io`],
    /// [`Error::Busy`].
    ///
    /// [`Error::NotADatabase`]: crate::Error::NotADatabase
    /// [`Error::ReadOnly`]: crate::Error::ReadOnly
    /// [`Error::SchemaTooNew`]: crate::Error::SchemaTooNew
    /// [`Error::NotWal`]: crate::Error::NotWal
    /// [`Error::PragmaMismatch`]: crate::Error::PragmaMismatch
    /// [`Error::Io`]: crate::Error::Io
    /// [`Error::Busy`]: crate::Error::Busy
    pub fn open(self) -> Result<Queue> {
        let engine = crate::engine::open(&OpenSettings {
            location: &self.path,
            durability: self.sqlite.durability,
            busy_timeout: self.busy_timeout,
            busy_retry: self.busy_retry,
            max_payload_bytes: self.max_payload_bytes,
            retry_policy: self.retry_policy,
            clock: Arc::clone(&self.clock),
            clock_set: self.clock_set,
            read_connections: self.sqlite.read_connections,
            on_connection: self.sqlite.on_connection.as_ref(),
            max_connections: self.postgres.max_connections,
            listen: self.postgres.listen,
            fallback_poll: self.postgres.fallback_poll,
            postgres_tls: &self.postgres.tls,
            pooler: self.postgres.pooler,
            holder: &self.holder.to_string(),
        })?;
        let queue = Queue {
            inner: Arc::new(Inner {
                clock: engine.clock(),
                config: self,
                engine,
                events: EventHub::default(),
                limit_sweep: Default::default(),
            }),
        };
        // A process that restarts after a crash takes its predecessor's
        // jobs back now rather than when their leases run out. Opening
        // does not fail for it: the reaper tries again.
        if let Err(e) = queue.take_back_from_gone_holders() {
            log::warn!("looking for leases of processes that are gone failed: {e}");
        }
        Ok(queue)
    }
}
impl Queue {
    /// Opens the file at `path` with default settings; see [`QueueBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Queue> {
        Queue::builder(path).open()
    }

    /// Settings for opening the file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> QueueBuilder {
        QueueBuilder {
            path: path.as_ref().to_path_buf(),
            busy_timeout: Duration::from_secs(5),
            busy_retry: Duration::from_secs(25),
            max_payload_bytes: 1024 * 1024,
            retry_policy: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            clock_set: false,
            sqlite: SqliteOptions::default(),
            postgres: PostgresOptions::default(),
            holder: Holder::this_process(),
        }
    }
}
