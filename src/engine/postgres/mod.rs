//! The PostgreSQL engine (feature `postgres`): one database shared by any
//! number of machines. What sets it apart from SQLite:
//!
//! - no lock on the whole queue: short READ COMMITTED transactions on an
//!   r2d2 pool of synchronous `postgres` clients, retried through lost
//!   connections, server restarts and failovers; a COMMIT whose answer was
//!   lost may have landed, so enqueues and claims mark their rows and look
//!   for them on the next try;
//! - claims take due rows with `SELECT … FOR UPDATE SKIP LOCKED` inside
//!   `UPDATE … WHERE id = ANY(ARRAY(…))`: pollers on many machines take
//!   disjoint batches without waiting for each other, and the array form
//!   keeps the plan an index scan also when PostgreSQL switches the
//!   prepared statement to a generic plan. The reaper reads the same way;
//! - every statement that changes a claimed job is fenced as on SQLite
//!   (`id AND run_token AND status = 'running'`); statements that lock
//!   several known rows lock them in id order, so two transactions of one
//!   pool (heartbeats, outcomes) never deadlock;
//! - each job leaves dead row versions behind, faster than autovacuum comes
//!   by: the reaper's rounds vacuum the jobs table when it needs it;
//! - wake-ups across machines by `LISTEN`/`NOTIFY`.
//!
//! The files are those of every engine: `connection.rs` (the pool,
//! transactions and their retries, the capabilities), `migrate.rs` (with
//! `schema.sql`), `enqueue.rs`, `claim.rs`, `outcome.rs`, `lease.rs`,
//! `admin.rs`, `read.rs`, `schedules.rs`, `rows.rs` and `watch.rs`; and
//! `tls.rs` (libpq's `sslmode` and certificates, through rustls) and
//! `pooler.rs` (poolers in transaction mode: found, and talked to without
//! named statements, session settings or `LISTEN`).
//! Machines' clocks differ, so every "now" that decides whether a job is
//! due or a lease ran out is the server's (`engine/server_clock.rs`).

mod admin;
mod batches;
mod claim;
mod connection;
pub(crate) mod deps;
mod enqueue;
mod lease;
mod limits;
mod migrate;
mod outcome;
mod pooler;
mod read;
mod rows;
mod schedules;
mod tls;
mod watch;

use crate::clock::Clock;
use crate::engine::group_commit::{EnqueueGroup, ENQUEUE_GROUPS};
use crate::engine::server_clock::ServerClock;
use crate::engine::types::Pooler;
use crate::engine::OpenSettings;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use connection::{connection_pool, Manager};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The connections of one opened `Queue` (shared by its clones).
pub(crate) struct Store {
    url: String,
    pool: r2d2::Pool<Manager>,
    /// The pool's last refusal of a connection that no retry cures.
    refused: connection::Refused,
    clock: Arc<dyn Clock>,
    retry_policy: RetryPolicy,
    /// This process, as each lease it claims records it: the text, and
    /// the number the rows store (`crate::holder::holder_id`).
    holder: String,
    holder_id: i64,
    /// This process's row of `tickler_holders` is written (by the first
    /// claim).
    holder_registered: std::sync::atomic::AtomicBool,
    retry_window: Duration,
    signals: Arc<watch::Signals>,
    pooling: Arc<pooler::Pooling>,
    /// When this store last looked whether the jobs table needs a vacuum.
    vacuum_checked: Mutex<Instant>,
    /// The oldest snapshot's transaction id when a vacuum last removed
    /// little, and when: the table is not vacuumed again until it changes
    /// (or for `VACUUM_HOLD_MAX`); `None` for an id when no holder was
    /// found, the vacuum failed or the role may not vacuum (held for
    /// `VACUUM_UNEXPLAINED_HOLD`).
    vacuum_held: Mutex<Option<(Option<String>, Instant)>>,
    /// Concurrent enqueues, stored together.
    enqueues: EnqueueGroup,
}

impl Store {
    /// Connects, migrates the schema and starts the server clock.
    pub(crate) fn open(url: &str, settings: &OpenSettings<'_>) -> Result<Store> {
        // PostgreSQL holds at most 1 GB in a value (and in a message): a
        // larger limit would let payloads through that the server then
        // refuses, so it is refused here, with SQLite's documented limit,
        // which fits under it with the row's other columns.
        if settings.max_payload_bytes > crate::engine::types::MAX_PAYLOAD_BYTES_LIMIT {
            return Err(Error::Config(format!(
                "max_payload_bytes is {}, but PostgreSQL stores at most 1 GB in a value, so \
                 the largest payload limit is {} bytes (MAX_PAYLOAD_BYTES_LIMIT)",
                settings.max_payload_bytes,
                crate::engine::types::MAX_PAYLOAD_BYTES_LIMIT
            )));
        }
        let (client_url, url_tls, url_pooler) = tls::split_url(url)?;
        let tls = tls::Tls::new(&url_tls, settings.postgres_tls)?;
        let mut config: postgres::Config = client_url
            .parse()
            .map_err(|e| Error::Config(format!("not a PostgreSQL URL ({e})")))?;
        if config.get_ssl_mode() != postgres::config::SslMode::Prefer {
            // The client library read an sslmode that was not taken out.
            return Err(Error::Config(format!(
                "{}: sslmode in a place tickler does not read it (percent-encode `?` and `@` \
                 in the user and password)",
                crate::engine::redacted_location(url)
            )));
        }
        tls.apply(&mut config);
        if config.get_application_name().is_none() {
            config.application_name("tickler");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        connection::detect_a_silent_peer(&mut config);
        let retry_window = settings.busy_timeout + settings.busy_retry;
        let describe = crate::engine::redacted_location(url);
        let first = connection::first_connection(&config, &tls, &describe, retry_window)?;
        let pooling = Arc::new(pooler::Pooling::new(
            settings.pooler.or(url_pooler).unwrap_or(Pooler::Detect),
        ));
        pooling.detect(first, &config, &tls, &describe);
        let refused = connection::Refused::default();
        let connected = Arc::default();
        let pool = connection_pool(
            &config,
            &tls,
            settings.max_connections,
            &refused,
            &pooling,
            &connected,
        );
        let signals = watch::Signals::new(
            config,
            tls,
            settings.listen,
            settings.fallback_poll,
            Arc::clone(&pooling),
        );
        let mut store = Store {
            url: url.to_owned(),
            pool,
            refused,
            clock: Arc::new(crate::clock::SystemClock),
            retry_policy: settings.retry_policy,
            holder: settings.holder.to_owned(),
            holder_id: crate::holder::holder_id(settings.holder),
            holder_registered: std::sync::atomic::AtomicBool::new(false),
            // Connection losses and restarts are retried as long as a
            // SQLite writer would wait for the lock and retry.
            retry_window,
            signals,
            pooling,
            vacuum_checked: Mutex::new(Instant::now()),
            vacuum_held: Mutex::new(None),
            enqueues: EnqueueGroup::concurrent(ENQUEUE_GROUPS),
        };
        store.migrate()?;
        store.clock = if settings.clock_set {
            Arc::clone(&settings.clock)
        } else {
            // A cut between the migration and the first sample must not
            // fail the open; each try is timed on its own (a sample whose
            // round trip spanned failed tries would set the clock ahead).
            let clock = connection::RETRIES.run(store.retry_window, || {
                let pool = store.pool.clone();
                let connected = Arc::clone(&connected);
                ServerClock::start(
                    move || {
                        let mut conn = pool.get()?;
                        // Unnamed: one round trip, and nothing left on a
                        // pooler's server connection.
                        let row = conn.client.query_typed_one(
                            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                            &[],
                        )?;
                        Ok(row.get(0))
                    },
                    connected,
                )
            })?;
            Arc::new(clock)
        };
        Ok(store)
    }
}
