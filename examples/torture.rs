//! The kill -9 torture run: worker processes killed with SIGKILL at random
//! while a producer enqueues, then a check that nothing was lost, no job
//! finished twice, and the file is intact. See `RELIABILITY.md`.
//!
//! ```text
//! cargo run --release --example torture [-- --seconds N | --minutes N]
//!     [--workers P] [--threads T] [--dir PATH] [--wal-bound-mib M]
//! ```
//!
//! Defaults: 20 seconds, 3 worker processes of 4 threads, a WAL bound of
//! 64 MiB (tickler's `journal_size_limit`), a fresh folder in the
//! system's temporary folder (kept, and printed, so the ledgers can be read
//! afterwards). Exits non-zero on any violation.

#[path = "../tests/reliability_common/torture.rs"]
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
                "{message}\nusage: torture [--seconds N | --minutes N] [--workers P] [--threads T] [--dir PATH] [--wal-bound-mib M]"
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
    if dir.join("torture.db").exists() {
        return Err(format!("{} already holds a torture run", dir.display()));
    }
    let mut settings = torture::Settings::new(dir, duration);
    settings.workers = workers;
    settings.threads = threads;
    settings.wal_bound = wal_bound;
    Ok(settings)
}
