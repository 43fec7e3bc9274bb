//! A `tickler work` killed with SIGKILL while a shell job runs must take
//! the command with it. Before, the command (in its own process group)
//! outlived the worker: the lease ran out, a second worker ran the job
//! again, and both copies ran side by side. Linux only (the kernel's
//! parent-death signal); see `shell.rs` for other systems.
#![cfg(target_os = "linux")]

use crate::support::cli;

use cli::{eventually, wait_for, Env};
use std::time::Duration;
use tickler::JobState;

/// Whether `pid` is a live process (a zombie, dead but not yet reaped by
/// its new parent, counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

#[test]
fn a_killed_worker_takes_its_command_with_it_and_the_retry_never_overlaps() {
    let env = Env::new();
    env.run(&["init"]).ok();
    // Each attempt writes its pid, then "start N", works 2 s, then "end N".
    let script = "echo $$ > pid.$TICKLER_ATTEMPT; echo start $TICKLER_ATTEMPT >> log; \
                  sleep 2; echo end $TICKLER_ATTEMPT >> log";
    let id = env.enqueue_shell(&["sh", "-c", script], &["--max-attempts", "3"]);
    let fast = [
        "--lease",
        "600ms",
        "--reap-interval",
        "100ms",
        "--backoff",
        "10ms",
        "--backoff-cap",
        "20ms",
        "--quiet",
    ];
    let mut args = vec!["work"];
    args.extend_from_slice(&fast);
    let mut worker = env.spawn(&args);
    let pid_file = env.dir.path().join("pid.1");
    eventually(
        Duration::from_secs(10),
        "the first attempt to start",
        || std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')),
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));

    worker.kill().unwrap(); // SIGKILL
    worker.wait().unwrap();
    eventually(
        Duration::from_secs(1),
        "the command to die with its worker",
        || !alive(pid),
    );

    let mut args = vec!["work", "--drain"];
    args.extend_from_slice(&fast);
    let run = wait_for(env.spawn(&args), Duration::from_secs(30));
    assert_eq!(run.code, 0, "{run:#?}");
    let job = env.job(id);
    assert_eq!(job.state, JobState::Succeeded, "{job:#?}");
    assert_eq!(job.attempts, 2);
    // The first copy never got to its end, before or during the retry.
    let log = std::fs::read_to_string(env.dir.path().join("log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines, ["start 1", "start 2", "end 2"], "{log}");
}
