//! `tickler work`: a worker pool running `shell` jobs until a signal.

use crate::cli::WorkArgs;
use crate::error::CliError;
use crate::files;
use crate::shell::{self, Shell};
use crate::supervise;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{JobContext, Queue, ReaperConfig, RetryPolicy, WorkerPool};

/// How long to wait, after the grace period, for killed commands' outcomes
/// to be recorded.
const AFTER_GRACE: Duration = Duration::from_secs(5);

/// How long past a job's timeout the pool waits for its handler before it
/// fails the job without it (and may run it again).
const TIMEOUT_GRACE: Duration = Duration::from_secs(5);

// A stopped command's tree gets SIGKILL after `KILL_GRACE` and its
// outcome is recorded once the tree is gone: within both waits, with room
// for a loaded machine, or the job would be recorded (and run again)
// while the old tree still runs, or `work` would exit without waiting for
// it.
const _: () = assert!(
    2 * supervise::KILL_GRACE.as_millis() <= AFTER_GRACE.as_millis()
        && 2 * supervise::KILL_GRACE.as_millis() <= TIMEOUT_GRACE.as_millis()
);

/// `tickler work`.
pub fn work(db: &Path, args: &WorkArgs) -> Result<(), CliError> {
    let allow_shared_db = args.allow_shared_db;
    let lib = |e| CliError::from_lib(e, db);
    if args.lease < Duration::from_millis(30) {
        return Err(CliError::Usage(
            "--lease must be at least 30ms (heartbeats renew it every third of it)".into(),
        ));
    }
    files::check_path(db)?;
    check_permissions(db, allow_shared_db)?;
    let queue = Queue::builder(db)
        .retry_policy(RetryPolicy {
            base: args.backoff,
            cap: args.backoff_cap.max(args.backoff),
            jitter: true,
        })
        .open()
        .map_err(lib)?;
    // Again, now that the file and its -wal and -shm files exist.
    check_permissions(db, allow_shared_db)?;

    let signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| CliError::failed(format!("cannot handle SIGINT/SIGTERM: {e}")))?;
    let received = Arc::new(AtomicUsize::new(0));
    let hard_stop = Arc::new(AtomicBool::new(false));
    spawn_signal_thread(signals, &received, &hard_stop, args.grace);

    let queues: Vec<String> = if args.queue.is_empty() {
        vec![tickler::DEFAULT_QUEUE.to_owned()]
    } else {
        args.queue.clone()
    };
    let handler = Shell {
        hard_stop: Arc::clone(&hard_stop),
        verbose: !args.quiet,
    };
    let mut builder = WorkerPool::builder(&queue)
        .threads(args.threads as usize)
        .lease(args.lease)
        .shutdown_grace(args.grace)
        .timeout_grace(TIMEOUT_GRACE)
        .reaper(ReaperConfig {
            interval: args.reap_interval,
            prune_finished_after: None,
            ..ReaperConfig::default()
        })
        .handler(shell::KIND, move |ctx: &JobContext| handler.run(ctx));
    for name in &queues {
        builder = builder.queue(name.clone());
    }
    let mut pool = builder.start().map_err(lib)?;
    if !args.quiet {
        eprintln!(
            "tickler: working on {} (queues: {}; {} thread(s)); SIGINT or SIGTERM to stop",
            crate::files::shown(db),
            queues.join(", "),
            args.threads
        );
    }

    let queue_refs: Vec<&str> = queues.iter().map(String::as_str).collect();
    let mut idle_checks = 0;
    while received.load(Ordering::SeqCst) == 0 {
        if args.drain {
            // Twice in a row, so a job between two states is not missed.
            let idle = pool.in_flight() == 0
                && queue
                    .ops()
                    .unfinished(&queue_refs, Some(&[shell::KIND]))
                    .map_err(lib)?
                    == 0;
            idle_checks = if idle { idle_checks + 1 } else { 0 };
            if idle_checks >= 2 {
                break;
            }
        }
        std::thread::park_timeout(if args.drain {
            Duration::from_millis(20)
        } else {
            Duration::from_secs(1)
        });
    }

    let report = pool.shutdown(args.grace);
    if report.still_running > 0 {
        // Their commands are being killed (the cancellation flags are set);
        // give their outcomes a moment to be written.
        let deadline = Instant::now() + AFTER_GRACE;
        while pool.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let left = pool.in_flight();
    if left > 0 {
        eprintln!(
            "tickler: stopped with {left} job(s) unrecorded; the reaper takes them back when their lease runs out"
        );
    } else if !args.quiet {
        eprintln!("tickler: stopped");
    }
    Ok(())
}

fn spawn_signal_thread(
    mut signals: Signals,
    received: &Arc<AtomicUsize>,
    hard_stop: &Arc<AtomicBool>,
    grace: Duration,
) {
    let received = Arc::clone(received);
    let hard_stop = Arc::clone(hard_stop);
    let main = std::thread::current();
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let name = if signal == SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            if received.fetch_add(1, Ordering::SeqCst) == 0 {
                eprintln!(
                    "tickler: {name}: no new jobs; waiting up to {} for running commands (send it again to stop them now)",
                    crate::display::duration(grace)
                );
            } else {
                eprintln!(
                    "tickler: {name} again: killing running commands; their jobs run again later"
                );
                hard_stop.store(true, Ordering::SeqCst);
            }
            main.unpark();
        }
    });
}

/// Refuses a queue file that other users can write (they could run
/// commands as us) or read (payloads hold commands' environments), unless
/// `allow`; then only warns.
fn check_permissions(db: &Path, allow: bool) -> Result<(), CliError> {
    let Some(problem) = files::shared_write_problem(db, true) else {
        return files::check_private(db, allow);
    };
    if allow {
        eprintln!(
            "tickler: warning: {problem}; whoever can write it can run commands as you (running anyway: --allow-shared-db)"
        );
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "refusing to run shell jobs: {problem}, and whoever can write it can run commands as you; `chmod go-w` it, or pass --allow-shared-db to run anyway"
        )))
    }
}
