//! `tickler`: operate a tickler queue file from the shell, and run
//! shell-command jobs as a durable at/cron. Uses only the public API of the
//! `tickler` library. `tickler --help` lists the subcommands.

mod batch;
mod cli;
mod display;
mod error;
mod files;
mod import;
mod ops;
mod schedule;
#[cfg(feature = "serve")]
mod serve;
mod shell;
mod supervise;
mod work;

use clap::Parser;
use cli::{Cli, Command};
use display::Times;
use error::CliError;

fn main() {
    let cli = Cli::parse();
    if let Command::Supervise(args) = &cli.command {
        // Before the logger (its stderr is the job's) and with SIGPIPE
        // still ignored (it must not die writing to a `work` that is gone).
        supervise::run(&args.argv);
    }
    if !matches!(cli.command, Command::Work(_)) {
        // Like other Unix tools, end quietly when the reader of our output
        // goes away (`tickler list | head`) instead of failing on a write.
        // `work` keeps ignoring SIGPIPE: it must not die with its jobs.
        // SAFETY: called before any other thread exists; SIG_DFL is a
        // valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp_secs()
        .init();
    if let Err(e) = run(&cli) {
        eprintln!("tickler: {e}");
        std::process::exit(e.exit_code());
    }
}

fn run(cli: &Cli) -> Result<(), CliError> {
    let db = cli.db.as_path();
    let times = Times { utc: cli.utc };
    match &cli.command {
        Command::Init(args) => ops::init(db, args.allow_shared_db),
        Command::Enqueue(args) if args.from.is_some() => import::import(db, args),
        Command::Enqueue(args) => ops::enqueue_one(db, args),
        Command::List(args) => ops::list(db, args, times),
        Command::Show(args) => ops::show(db, args, times),
        Command::Batch(args) => batch::show(db, args, times),
        Command::Wait(args) => ops::wait(db, args),
        Command::Stats(args) => ops::stats(db, args, times),
        Command::Retry(args) => ops::retry(db, args),
        Command::Cancel(args) => ops::cancel(db, args),
        Command::Prune(args) => ops::prune(db, args),
        Command::Reap => ops::reap(db),
        Command::Checkpoint => ops::checkpoint(db),
        Command::Work(args) => work::work(db, args),
        Command::Schedule(command) => schedule::run(db, command, times),
        Command::Supervise(args) => supervise::run(&args.argv),
        Command::Queue(command) => ops::queue(db, command),
        Command::Limit(command) => ops::limit(db, command),
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve::serve(db, args),
    }
}
