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
use crate::retry::RetryPolicy;
use rusqlite::Connection;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Settings for opening a [`Queue`]; get one from [`Queue::builder`].
#[derive(Clone)]
pub struct QueueBuilder {
    pub(super) path: PathBuf,
    pub(super) durability: Durability,
    pub(super) busy_timeout: Duration,
    pub(super) busy_retry: Duration,
    pub(super) max_payload_bytes: usize,
    pub(super) retry_policy: RetryPolicy,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) read_connections: u32,
    pub(super) on_connection: Option<ConnectionHook>,
    /// `clock` was set by the caller (on PostgreSQL it then replaces the
    /// server's clock).
    pub(super) clock_set: bool,
    pub(super) max_connections: u32,
    pub(super) listen: bool,
    pub(super) fallback_poll: Duration,
}

impl std::fmt::Debug for QueueBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueBuilder")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retry", &self.busy_retry)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("retry_policy", &self.retry_policy)
            .field("clock", &self.clock)
            .field("read_connections", &self.read_connections)
            .field("on_connection", &self.on_connection.is_some())
            .field("clock_set", &self.clock_set)
            .field("max_connections", &self.max_connections)
            .field("listen", &self.listen)
            .field("fallback_poll", &self.fallback_poll)
            .finish()
    }
}

impl QueueBuilder {
    /// [`Durability::Full`] (default) or [`Durability::Normal`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long one attempt to get SQLite's write lock waits for another
    /// process, in short jittered sleeps (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// After the busy timeout, how long the whole transaction is retried
    /// with jittered backoff before [`Error::Busy`] (default 25 s).
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

    /// PostgreSQL: most connections this `Queue` (and its clones) keeps in
    /// its pool (default 10, at least 2). A worker pool uses about two
    /// (claims and outcomes, heartbeats) plus one per enqueueing thread at
    /// a time; the listening connection comes on top. Ignored on SQLite.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// PostgreSQL: whether watchers `LISTEN` for other processes' commits
    /// (default true). Turn it off behind a connection pooler in
    /// transaction mode (PgBouncer's `pool_mode = transaction`), where
    /// `LISTEN` does not work: watchers then look for work every
    /// [`QueueBuilder::fallback_poll`]. Ignored on SQLite.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// PostgreSQL: how often a watcher looks for other processes' work
    /// while it cannot listen (listening turned off, or its connection
    /// lost and not yet back); default 1 s. Ignored on SQLite.
    pub fn fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every.max(Duration::from_millis(1));
        self
    }

    /// Size of the pool of read connections (default 4, at least 1).
    pub fn read_connections(mut self, n: u32) -> Self {
        self.read_connections = n.max(1);
        self
    }

    /// Runs `hook` on every connection tickler opens on the file (the
    /// writer, readers and [`Queue::open_connection`]), after
    /// tickler's own pragmas: for settings such as `cache_size` or
    /// `mmap_size`. Must not change `journal_mode` or `synchronous`.
    pub fn on_connection(
        mut self,
        hook: impl Fn(&Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.on_connection = Some(Arc::new(hook));
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
    pub fn open(self) -> Result<Queue> {
        let engine = crate::engine::open(&OpenSettings {
            location: &self.path,
            durability: self.durability,
            busy_timeout: self.busy_timeout,
            busy_retry: self.busy_retry,
            max_payload_bytes: self.max_payload_bytes,
            retry_policy: self.retry_policy,
            clock: Arc::clone(&self.clock),
            clock_set: self.clock_set,
            read_connections: self.read_connections,
            on_connection: self.on_connection.as_ref(),
            max_connections: self.max_connections,
            listen: self.listen,
            fallback_poll: self.fallback_poll,
        })?;
        Ok(Queue {
            inner: Arc::new(Inner {
                clock: engine.clock(),
                config: self,
                engine,
                events: EventHub::default(),
            }),
        })
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
            durability: Durability::default(),
            busy_timeout: Duration::from_secs(5),
            busy_retry: Duration::from_secs(25),
            max_payload_bytes: 1024 * 1024,
            retry_policy: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            read_connections: 4,
            on_connection: None,
            clock_set: false,
            max_connections: 10,
            listen: true,
            fallback_poll: Duration::from_secs(1),
        }
    }
}
