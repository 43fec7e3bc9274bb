//! The MySQL/MariaDB engine (feature `mysql`, InnoDB): one database shared
//! by any number of machines, as on PostgreSQL. Tested on MariaDB 10.11;
//! written for MariaDB 10.8 and later and MySQL 8.0.1 and later: the first
//! with both `SKIP LOCKED` and descending indexes (MariaDB 10.6 and 10.7
//! ignore `DESC` in an index, so the claim in priority order would sort,
//! and lock, every pending job of its queue). What sets it apart:
//!
//! - no `UPDATE … RETURNING` (MySQL has none): a claim locks due rows with
//!   `SELECT … FOR UPDATE SKIP LOCKED` and then updates exactly those rows,
//!   by id, in the same short READ COMMITTED transaction (REPEATABLE READ,
//!   InnoDB's default, would take gap and next-key locks); each row gets a
//!   run_token of its own, made here;
//! - no partial indexes: every index leads with `status`, so a lookup of
//!   one state reads that state's entries only, and the unique key of
//!   unfinished jobs is a unique index on a generated column that is NULL
//!   for finished jobs;
//! - names (queues, kinds, unique keys) are bytes (`VARBINARY`): compared
//!   byte for byte, with no collation that would make `"a"` and `"A"` or
//!   `"a "` the same queue; their lengths are bounded (255 bytes for a queue,
//!   a kind or a schedule's name, 1,024 for a unique key) and a longer one is
//!   refused with [`crate::Error::InvalidArgument`];
//! - MySQL evaluates an UPDATE's assignments from left to right, each
//!   seeing the values already assigned: every statement assigns a column
//!   only after the assignments that read its old value;
//! - the connections count rows matched, not rows changed
//!   (`CLIENT_FOUND_ROWS`), so that a fenced statement that happens to
//!   write the values already there still says that its lease holds;
//! - wake-ups: this process's watchers at once; other processes by a
//!   cheap look at the queue's last change, backing off while nothing
//!   changes (`watch.rs`); MySQL has no `LISTEN`.
//!
//! Refused at open, with the reason: a server older than those above, a
//! binary log in `STATEMENT` format (statements with `SKIP LOCKED` are not
//! safe to replay), tables of another storage engine than InnoDB, and a
//! payload limit above what the server's `max_allowed_packet` lets
//! through.
//!
//! The files are those of every engine: `connection.rs` (the pool,
//! transactions and their retries, the capabilities), `migrate.rs` (with
//! `schema.sql`), `enqueue.rs`, `claim.rs`, `outcome.rs`, `lease.rs`,
//! `admin.rs`, `read.rs`, `schedules.rs`, `rows.rs` and `watch.rs`. Every
//! "now" that decides whether a job is due or a lease ran out is the
//! server's (`engine/server_clock.rs`).

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
mod read;
mod rows;
mod schedules;
mod watch;

use crate::clock::Clock;
use crate::engine::group_commit::{EnqueueGroup, ENQUEUE_GROUPS};
use crate::engine::server_clock::ServerClock;
use crate::engine::types::Durability;
use crate::engine::OpenSettings;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use connection::connection_pool;
use mysql::prelude::Queryable;
use std::sync::Arc;
use std::time::Duration;

/// The connections of one opened `Queue` (shared by its clones).
pub(crate) struct Store {
    url: String,
    pool: connection::Connections,
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
    /// `Full` when the server flushes InnoDB's log at every commit
    /// (`innodb_flush_log_at_trx_commit = 1`), else `Normal`.
    durability: Durability,
    /// The server's `max_allowed_packet`, in bytes: how large one
    /// statement may be.
    max_packet: usize,
    /// Concurrent enqueues, stored together.
    enqueues: EnqueueGroup,
}

/// The oldest servers with `SKIP LOCKED` and descending indexes.
const MARIADB_MIN: (u16, u16) = (10, 8);
const MYSQL_MIN: (u16, u16) = (8, 0);

/// `max_allowed_packet` on MariaDB's defaults, assumed until the server
/// tells its own.
const MARIADB_DEFAULT_PACKET: usize = 16 * 1024 * 1024;

impl Store {
    /// Connects, checks the server, migrates the schema and starts the
    /// server clock.
    pub(crate) fn open(url: &str, settings: &OpenSettings<'_>) -> Result<Store> {
        let retry_window = settings.busy_timeout + settings.busy_retry;
        let opts = connection::opts(url, settings.busy_timeout, retry_window)?;
        let mariadb = connection::first_connection(
            &opts,
            &crate::engine::redacted_location(url),
            retry_window,
        )?;
        let opts = connection::lift_statement_limit(opts, mariadb);
        let client_packet = opts.get_max_allowed_packet();
        let pool = connection_pool(opts, settings.max_connections);
        let mut store = Store {
            url: url.to_owned(),
            pool,
            clock: Arc::new(crate::clock::SystemClock),
            retry_policy: settings.retry_policy,
            holder: settings.holder.to_owned(),
            holder_id: crate::holder::holder_id(settings.holder),
            holder_registered: std::sync::atomic::AtomicBool::new(false),
            retry_window,
            signals: watch::Signals::new(settings.fallback_poll),
            durability: Durability::Full,
            max_packet: MARIADB_DEFAULT_PACKET,
            enqueues: EnqueueGroup::concurrent(ENQUEUE_GROUPS),
        };
        // The open's own steps run on pooled connections outside any
        // transaction (DDL commits by itself); a cut or restart during one
        // is retried like a write's, each step being safe to run again.
        (store.durability, store.max_packet) = store.on_connection(retry_window, |conn| {
            store.check_server(conn, settings.max_payload_bytes, client_packet)
        })?;
        store.on_connection(retry_window, |conn| store.migrate(conn))?;
        store.clock = if settings.clock_set {
            Arc::clone(&settings.clock)
        } else {
            // Each try of the first sample is timed on its own: a sample
            // whose round trip spanned failed tries and pauses would set
            // the clock ahead by half of them. A failed resample later
            // keeps the last one.
            let clock = connection::RETRIES.run(retry_window, || {
                let pool = store.pool.clone();
                let connected = Arc::clone(&pool.connected);
                ServerClock::start(
                    move || {
                        connection::on_connection(&pool, Duration::ZERO, &mut |conn| {
                            let ms: Option<i64> = conn.query_first(
                                "SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)",
                            )?;
                            ms.ok_or_else(|| {
                                Error::Config("the server did not tell its time".into())
                            })
                        })
                    },
                    connected,
                )
            })?;
            Arc::new(clock)
        };
        Ok(store)
    }

    /// Refuses a server tickler cannot claim on safely, naming what to
    /// change; returns how durable its commits are and its
    /// `max_allowed_packet`.
    fn check_server(
        &self,
        conn: &mut mysql::Conn,
        max_payload_bytes: usize,
        client_packet: Option<usize>,
    ) -> Result<(Durability, usize)> {
        let version: String = conn.query_first("SELECT VERSION()")?.unwrap_or_default();
        // VERSION(), not the handshake's version: MariaDB's handshake says
        // 5.5.5 before its own version for old clients.
        let (major, minor, patch) = parse_version(&version);
        let mariadb = version.contains("MariaDB");
        let (name, min) = if mariadb {
            ("MariaDB", MARIADB_MIN)
        } else {
            ("MySQL", MYSQL_MIN)
        };
        // MySQL 8.0.0 was a milestone release; SKIP LOCKED came with 8.0.1.
        let too_old = (major, minor) < min || (!mariadb && (major, minor) == (8, 0) && patch < 1);
        if too_old {
            return Err(Error::Config(format!(
                "{} runs {name} {version}, but tickler needs {name} {}.{}{} or later \
                 (FOR UPDATE SKIP LOCKED and descending indexes)",
                self.describe(),
                min.0,
                min.1,
                if mariadb { "" } else { ".1" },
            )));
        }
        let (log_bin, format): (Option<i64>, Option<String>) = conn
            .query_first("SELECT @@log_bin, @@binlog_format")?
            .unwrap_or((None, None));
        if log_bin == Some(1)
            && format
                .as_deref()
                .is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT"))
        {
            return Err(Error::Config(format!(
                "{} writes its binary log with binlog_format = STATEMENT, in which claims \
                 (SELECT … FOR UPDATE SKIP LOCKED) are not safe to replay and READ COMMITTED \
                 writes are refused; set binlog_format = ROW (or MIXED)",
                self.describe()
            )));
        }
        // MariaDB always has the variable; MySQL only with Galera built in.
        let wsrep: Option<(String, String)> =
            conn.query_first("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")?;
        refuse_galera(&self.describe(), wsrep.as_ref().map(|(_, on)| on.as_str()))?;
        // A URL's max_allowed_packet is what the client holds itself to;
        // the server refuses what passes its own.
        let server_packet: Option<u64> = conn.query_first("SELECT @@max_allowed_packet")?;
        let server_packet = server_packet.map(|p| usize::try_from(p).unwrap_or(usize::MAX));
        let packet = match (client_packet, server_packet) {
            (Some(c), Some(s)) => Some(c.min(s)),
            (c, s) => c.or(s),
        };
        let max_packet = packet.unwrap_or(MARIADB_DEFAULT_PACKET);
        if let Some(packet) = packet {
            // A payload travels in one packet with the row's other values.
            let room = packet.saturating_sub(crate::engine::types::ROW_HEADROOM);
            if max_payload_bytes > room {
                return Err(Error::Config(format!(
                    "max_payload_bytes is {max_payload_bytes}, but {} lets at most {packet} \
                     bytes through in one packet (max_allowed_packet), so the largest payload \
                     limit there is {room} bytes: raise max_allowed_packet or lower \
                     max_payload_bytes",
                    self.describe()
                )));
            }
        }
        // 0 and 2 write the log to the operating system at commit and
        // flush it once a second: a crash of the server keeps commits (with
        // 2), a power cut may lose the last second's.
        let flush: Option<i64> = conn.query_first("SELECT @@innodb_flush_log_at_trx_commit")?;
        let durability = if flush == Some(1) {
            Durability::Full
        } else {
            Durability::Normal
        };
        Ok((durability, max_packet))
    }
}

/// The leading `major.minor.patch` of a server's `VERSION()`.
fn parse_version(version: &str) -> (u16, u16, u16) {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u16>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Refuses a Galera cluster node (`wsrep_on` is ON): its row locks are
/// the node's alone, so claims on two nodes meet only at commit, where
/// one fails, and it refuses `GET_LOCK`, which keeps a second process from
/// migrating at the same time.
fn refuse_galera(describe: &str, wsrep_on: Option<&str>) -> Result<()> {
    if wsrep_on.is_some_and(|on| on.eq_ignore_ascii_case("ON") || on == "1") {
        return Err(Error::Config(format!(
            "{describe} is a node of a Galera cluster (wsrep_on = ON), which tickler does not \
             support: row locks are each node's own and GET_LOCK is refused there; point \
             tickler at one server (a primary with asynchronous replicas)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_parse_from_the_leading_numbers() {
        assert_eq!(
            super::parse_version("10.11.19-MariaDB-0+deb12u1"),
            (10, 11, 19)
        );
        assert_eq!(super::parse_version("8.0.36"), (8, 0, 36));
        assert_eq!(super::parse_version("8.4.0-log"), (8, 4, 0));
    }

    #[test]
    fn a_galera_node_is_refused_and_a_lone_server_is_not() {
        let refused = super::refuse_galera("db", Some("ON")).unwrap_err();
        assert!(refused.to_string().contains("Galera"), "{refused}");
        assert!(super::refuse_galera("db", Some("OFF")).is_ok());
        // MySQL without Galera has no such variable.
        assert!(super::refuse_galera("db", None).is_ok());
    }
}
