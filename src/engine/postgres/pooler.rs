//! Connection poolers between tickler and the server ([`Pooler`]): which
//! way a `Store` talks (statements prepared once per connection, or each
//! sent unnamed in the round trip that runs it), finding a pooler in
//! transaction mode at open and by its symptoms later, and the parameter
//! types an unnamed statement must be sent with.

use super::tls::Tls;
use crate::engine::types::Pooler;
use crate::error::{Error, Result};
use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use std::sync::atomic::{AtomicBool, Ordering};

/// How one `Store`'s connections talk, shared by its pool, its listener
/// and its transactions.
#[derive(Debug)]
pub(crate) struct Pooling {
    /// The setting, for the rules of switching.
    setting: Pooler,
    /// Each transaction may run on another server connection: no named
    /// statements, no session settings, no `LISTEN`.
    transaction: AtomicBool,
}

impl Pooling {
    pub(super) fn new(setting: Pooler) -> Pooling {
        Pooling {
            setting,
            transaction: AtomicBool::new(setting == Pooler::Transaction),
        }
    }

    /// True while statements must not outlive their transaction.
    pub(crate) fn transaction_mode(&self) -> bool {
        self.transaction.load(Ordering::SeqCst)
    }

    /// What an error of a transaction becomes: a server's answer that only
    /// a pooler in transaction mode causes ([`symptom`]) switches a
    /// `Store` that was to detect one, and is retried; with the pooler
    /// named otherwise it is a setting to change, and fails at once
    /// saying so ([`Error::Config`]).
    pub(super) fn after_error(&self, e: Error) -> Error {
        match &e {
            Error::Postgres(pg) if symptom(pg) && !self.switch_on_symptom(&e) => {
                if self.setting == Pooler::Detect {
                    // Switched already, by another transaction: retried.
                    return e;
                }
                Error::Config(format!(
                    "{} (the server answers so to statements prepared by name only through a \
                     pooler in transaction mode; the URL says pooler={}: set \
                     pooler=transaction)",
                    crate::error::postgres_text(pg),
                    self.setting.as_str()
                ))
            }
            _ => e,
        }
    }

    /// A server's answer that only a pooler in transaction mode causes
    /// switches a `Store` that was to detect one ([`symptom`]). True if
    /// this call switched it.
    pub(super) fn switch_on_symptom(&self, e: &Error) -> bool {
        if self.setting != Pooler::Detect || self.transaction_mode() {
            return false;
        }
        let Error::Postgres(e) = e else { return false };
        if !symptom(e) {
            return false;
        }
        if !self.transaction.swap(true, Ordering::SeqCst) {
            log::warn!(
                "the server answered as only a pooler in transaction mode makes it answer ({}): \
                 tickler now sends no prepared statements, makes no session settings and does \
                 not LISTEN (set pooler=transaction in the URL to start that way)",
                crate::error::postgres_text(e)
            );
            return true;
        }
        false
    }

    /// Looks, with `Pooler::Detect`, whether two connections share a
    /// server connection: a session setting made on one is seen by the
    /// other, or one server process serves both, only through a pooler in
    /// transaction mode (each new client of a direct server or of a
    /// session pooler has a session of its own). A pooler busy with other clients may give the second
    /// connection another server connection: then nothing is found, and
    /// [`Pooling::switch_on_symptom`] is left to find it.
    pub(super) fn detect(
        &self,
        first: postgres::Client,
        config: &postgres::Config,
        tls: &Tls,
        describe: &str,
    ) {
        if self.setting != Pooler::Detect {
            return;
        }
        match shares_server_connections(first, config, tls) {
            Ok(true) => {
                self.transaction.store(true, Ordering::SeqCst);
                log::info!(
                    "{describe}: a pooler in transaction mode is between tickler and the server \
                     (a session setting of one connection was seen by another); tickler sends \
                     no prepared statements, makes no session settings and does not LISTEN \
                     (set pooler=transaction in the URL to skip this check)"
                );
            }
            Ok(false) => {}
            Err(e) => log::debug!("{describe}: could not look for a pooler: {e}"),
        }
    }
}

fn shares_server_connections(
    mut first: postgres::Client,
    config: &postgres::Config,
    tls: &Tls,
) -> Result<bool> {
    let mut second = tls.connect(config)?;
    // A few looks, each way: a pooler busy with other clients may give a
    // look another server connection, each time by chance. Two signs, so
    // that a pooler which clears settings between transactions is still
    // seen: one client's setting seen by the other, or one server process
    // serving both clients or one client from two server processes (a
    // direct or session-pooled client keeps its one process).
    let mut pids: [Option<i32>; 2] = [None, None];
    for round in 0..3 {
        let (setter, reader) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        let (setter_client, reader_client) = if setter == 0 {
            (&mut first, &mut second)
        } else {
            (&mut second, &mut first)
        };
        let token = format!("{:016x}", fastrand::u64(..));
        // Session-level, in autocommit: it stays on the server connection
        // that ran it, whichever client that is given to next.
        let set_pid = look(
            setter_client,
            &format!("SET tickler.pooler_probe = '{token}'; SELECT pg_backend_pid()::text"),
        )?;
        let seen = look(
            reader_client,
            "SELECT pg_backend_pid()::text || ' ' || \
             coalesce(current_setting('tickler.pooler_probe', true), '')",
        )?;
        // Taken back from whichever server connection this reaches
        // (harmless elsewhere).
        let _ = setter_client.batch_execute("RESET tickler.pooler_probe");
        let (read_pid, read_token) = seen.split_once(' ').unwrap_or((seen.as_str(), ""));
        let set_pid: i32 = set_pid.parse().unwrap_or(0);
        let read_pid: i32 = read_pid.parse().unwrap_or(0);
        if read_token == token || set_pid == read_pid {
            return Ok(true);
        }
        for (client, pid) in [(setter, set_pid), (reader, read_pid)] {
            if *pids[client].get_or_insert(pid) != pid {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The first column of the last row a simple query returns.
fn look(client: &mut postgres::Client, sql: &str) -> Result<String> {
    let rows = client.simple_query(sql)?;
    Ok(rows
        .iter()
        .rev()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_default())
}

/// Answers of the server that only a pooler in transaction mode causes
/// for a client that prepares statements once per connection: its
/// statement is not on the server connection it was given (26000), or one
/// of that name from another client is (42P05), or that other client's
/// takes a different number of parameters (08P01, "bind message
/// supplies …"). Retried: the statement did not run.
pub(crate) fn symptom(e: &postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME
        || *db.code() == SqlState::DUPLICATE_PSTATEMENT
        || (*db.code() == SqlState::PROTOCOL_VIOLATION
            && db.message().starts_with("bind message supplies"))
}

/// The types a statement sent unnamed declares for its parameters: for
/// each, the first of [`NAMED_TYPES`] its Rust value encodes to, as the
/// server would have inferred it for a prepared statement (tickler's
/// statements cast where the type is not the value's own).
pub(super) fn parameter_types(sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Type>> {
    let mut scratch = bytes::BytesMut::new();
    params
        .iter()
        .enumerate()
        .map(|(i, param)| {
            NAMED_TYPES
                .iter()
                .find(|ty| {
                    scratch.clear();
                    param.to_sql_checked(ty, &mut scratch).is_ok()
                })
                .cloned()
                .ok_or_else(|| {
                    Error::Config(format!(
                        "parameter ${} of a statement sent unnamed (a pooler in transaction \
                         mode) has a type tickler cannot name: {sql}",
                        i + 1
                    ))
                })
        })
        .collect()
}

/// The PostgreSQL types of the Rust values tickler binds, most used first.
const NAMED_TYPES: [Type; 12] = [
    Type::INT8,
    Type::TEXT,
    Type::INT4,
    Type::BOOL,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT4_ARRAY,
    Type::FLOAT8,
    Type::FLOAT8_ARRAY,
    Type::JSONB,
    Type::BYTEA,
    Type::INT2,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's own answers to a statement name that is missing and
    /// to one taken already (as a pooler in transaction mode makes them
    /// come to a client that prepares by name) switch a queue that was to
    /// detect a pooler, once, and no other; other errors switch nothing.
    /// Needs a server (`TICKLER_TEST_DATABASE_URL`): skipped without one,
    /// failed without one under CI.
    #[test]
    fn the_servers_answers_to_a_pooler_switch_a_detecting_queue() {
        let url = match std::env::var("TICKLER_TEST_DATABASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                assert!(
                    std::env::var("CI").map_or(true, |v| v != "true"),
                    "TICKLER_TEST_DATABASE_URL is not set (.ci/postgres sets it)"
                );
                return;
            }
        };
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let missing = client
            .batch_execute("EXECUTE tickler_no_such_statement")
            .unwrap_err();
        let taken = client
            .batch_execute("PREPARE tickler_twice AS SELECT 1; PREPARE tickler_twice AS SELECT 1")
            .unwrap_err();
        let other = client.batch_execute("SELECT 1/0").unwrap_err();
        assert!(symptom(&missing) && symptom(&taken) && !symptom(&other));
        let (missing, taken, other) = (
            Error::Postgres(missing),
            Error::Postgres(taken),
            Error::Postgres(other),
        );

        let detecting = Pooling::new(Pooler::Detect);
        assert!(!detecting.switch_on_symptom(&other));
        assert!(!detecting.transaction_mode());
        assert!(detecting.switch_on_symptom(&missing));
        assert!(detecting.transaction_mode());
        assert!(!detecting.switch_on_symptom(&taken), "switched once");

        let told = Pooling::new(Pooler::Session);
        assert!(!told.switch_on_symptom(&missing));
        assert!(!told.transaction_mode(), "a named setting is kept");
        assert!(Pooling::new(Pooler::Transaction).transaction_mode());

        let mut symptom_again = || {
            Error::Postgres(
                client
                    .batch_execute("EXECUTE tickler_no_such_statement")
                    .unwrap_err(),
            )
        };
        // Named otherwise, the answer is a setting to change, said at once.
        match told.after_error(symptom_again()) {
            Error::Config(text) => {
                assert!(
                    text.contains("26000") && text.contains("set pooler=transaction"),
                    "{text}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Detecting, it is retried (the connection is replaced).
        let fresh = Pooling::new(Pooler::Detect);
        let e = fresh.after_error(symptom_again());
        assert!(matches!(e, Error::Postgres(_)) && fresh.transaction_mode());
        assert!(super::super::connection::retryable(&e));
    }

    #[test]
    fn parameters_are_named_by_their_rust_type() {
        let text: Option<&str> = None;
        let kinds: Vec<&str> = vec!["a"];
        let ids: Vec<i64> = vec![1, 2];
        let params: [&(dyn ToSql + Sync); 6] = [&7i64, &"x", &text, &kinds, &ids, &3i32];
        assert_eq!(
            parameter_types("SELECT", &params).unwrap(),
            [
                Type::INT8,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT_ARRAY,
                Type::INT8_ARRAY,
                Type::INT4
            ]
        );
        let when = std::time::SystemTime::now();
        match parameter_types("SELECT $1", &[&when]) {
            Err(Error::Config(text)) => assert!(text.contains("parameter $1"), "{text}"),
            other => panic!("{other:?}"),
        }
    }
}
