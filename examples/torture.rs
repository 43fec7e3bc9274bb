//! The kill -9 torture run: worker processes killed with SIGKILL at random
//! while a producer enqueues, then a check that nothing was lost, no job
//! finished twice, and the database is intact. See `RELIABILITY.md`.
//!
//! ```text
//! cargo run --release --example torture [-- --seconds N | --minutes N]
//!     [--workers P] [--threads T] [--dir PATH] [--wal-bound-mib M]
//! cargo run --release --features postgres --example torture -- --db postgres://…
//!     [--restarts N] [--cut-every-ms MIN-MAX] [--pg-ctl CMD] [...]
//! cargo run --release --features mysql --example torture -- --db mysql://…
//!     [--restarts N] [--cut-every-ms MIN-MAX] [--mysql-ctl CMD] [...]
//! ```
//!
//! Defaults: 20 seconds, 3 worker processes of 4 threads, a WAL bound of
//! 64 MiB (tickler's `journal_size_limit`), a fresh folder in the
//! system's temporary folder (kept, and printed, so the ledgers can be read
//! afterwards). Exits non-zero on any violation.
//!
//! `--db URL` runs it on a fresh database on a server instead of a SQLite
//! file in the folder (which keeps the ledgers): PostgreSQL for a
//! `postgres://` URL (feature `postgres`; `--postgres URL` says the same),
//! MySQL/MariaDB for a `mysql://` or `mariadb://` one (feature `mysql`).
//! The supervisor then also cuts every connection to the database every
//! 3–10 s (`--cut-every-ms`) and restarts the server `--restarts` times
//! (default 3) with the shell command in `TICKLER_TEST_PG_CTL` or
//! `TICKLER_TEST_MYSQL_CTL` (`--pg-ctl CMD`, `--mysql-ctl CMD`), if any.

#[path = "../tests/support/torture.rs"]
mod torture;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    if std::env::var_os(torture::ENV_ROLE).is_some() {
        return match torture::run_role() {
            0 => ExitCode::SUCCESS,
            code => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        };
    }
    let settings = match parse_args(std::env::args().skip(1).collect()) {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!(
                "{message}\nusage: torture [--seconds N | --minutes N] [--workers P] [--threads T] [--dir PATH] [--wal-bound-mib M] [--db URL [--restarts N] [--cut-every-ms MIN-MAX] [--pg-ctl CMD | --mysql-ctl CMD]]"
            );
            return ExitCode::from(2);
        }
    };
    println!(
        "torture: {} s, {} worker processes x {} threads, folder {}",
        settings.duration.as_secs(),
        settings.workers,
        settings.threads,
        settings.dir.display()
    );
    if let Some(url) = &settings.db_url {
        println!(
            "on {}: connections cut every {}-{} ms, {} server restart(s)",
            if is_mysql_url(url) {
                "MySQL/MariaDB"
            } else {
                "PostgreSQL"
            },
            settings.cut_every.0.as_millis(),
            settings.cut_every.1.as_millis(),
            if settings.server_ctl.is_some() {
                settings.restarts
            } else {
                0
            }
        );
    }
    let report = torture::supervise(&settings, torture::Launcher::Example);
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse_args(args: Vec<String>) -> Result<torture::Settings, String> {
    let mut duration = Duration::from_secs(20);
    let mut workers = 3;
    let mut threads = 4;
    let mut dir: Option<PathBuf> = None;
    let mut wal_bound = torture::WAL_BOUND;
    let mut db_url: Option<String> = None;
    let mut restarts: Option<usize> = None;
    let mut cut_every: Option<(Duration, Duration)> = None;
    let ctl = |name: &str| std::env::var(name).ok().filter(|c| !c.trim().is_empty());
    let mut pg_ctl = ctl("TICKLER_TEST_PG_CTL");
    let mut mysql_ctl = ctl("TICKLER_TEST_MYSQL_CTL");
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--seconds" => duration = Duration::from_secs(number(value()?)?),
            "--minutes" => duration = Duration::from_secs(60 * number(value()?)?),
            "--workers" => workers = number(value()?)?.max(1) as usize,
            "--threads" => threads = number(value()?)?.max(1) as usize,
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--wal-bound-mib" => wal_bound = number(value()?)? * 1024 * 1024,
            "--db" | "--postgres" => {
                let url = value()?;
                let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
                if postgres {
                    if !cfg!(feature = "postgres") {
                        return Err(format!("{flag}: build with `--features postgres`"));
                    }
                } else if is_mysql_url(&url) && flag == "--db" {
                    if !cfg!(feature = "mysql") {
                        return Err(format!("{flag}: build with `--features mysql`"));
                    }
                } else {
                    return Err(format!(
                        "{flag}: not a PostgreSQL (postgres://…) or MySQL (mysql://…, mariadb://…) URL"
                    ));
                }
                db_url = Some(url);
            }
            "--restarts" => restarts = Some(number(value()?)? as usize),
            "--pg-ctl" => pg_ctl = Some(value()?),
            "--mysql-ctl" => mysql_ctl = Some(value()?),
            "--cut-every-ms" => {
                let range = value()?;
                let (min, max) = range
                    .split_once('-')
                    .ok_or(format!("{flag}: MIN-MAX, e.g. 3000-10000"))?;
                let (min, max) = (number(min.to_owned())?, number(max.to_owned())?);
                if min > max {
                    return Err(format!("{flag}: MIN is above MAX"));
                }
                cut_every = Some((Duration::from_millis(min), Duration::from_millis(max)));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "tickler-torture-{}-{}",
            std::process::id(),
            chrono::Utc::now().format("%Y%m%dT%H%M%S")
        ))
    });
    if dir.join("torture.db").exists() || dir.join("ledger").exists() {
        return Err(format!("{} already holds a torture run", dir.display()));
    }
    let mut settings = torture::Settings::new(dir, duration);
    settings.workers = workers;
    settings.threads = threads;
    settings.wal_bound = wal_bound;
    if db_url.is_none() && (restarts.is_some() || cut_every.is_some()) {
        return Err("--restarts and --cut-every-ms need --db URL".into());
    }
    settings.server_ctl = match &db_url {
        Some(url) if is_mysql_url(url) => mysql_ctl,
        Some(_) => pg_ctl,
        None => None,
    };
    settings.db_url = db_url;
    if let Some(restarts) = restarts {
        settings.restarts = restarts;
    }
    if let Some(cut_every) = cut_every {
        settings.cut_every = cut_every;
    }
    Ok(settings)
}

fn is_mysql_url(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}
