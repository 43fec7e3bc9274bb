//! A `tickler work` killed with SIGKILL while a shell job runs must take
//! the command with it. Before, the command (in its own process group)
//! outlived the worker: the lease ran out, a second worker ran the job
//! again, and both copies ran side by side. Linux only (reads /proc); the
//! whole process tree is in `process_tree.rs`, other systems in
//! `supervise.rs`.
#![cfg(target_os = "linux")]

use crate::support::cli;

use cli::{alive, eventually, wait_for, Env};
use std::time::Duration;
use tickler::JobState;

#[test]
fn a_killed_worker_takes_its_command_with_it_and_the_retry_never_overlaps() {
    let env = Env::new();
    env.run(&["init"]).ok();
    // Each attempt writes its pid, then "start N", works 2 s, then "end N".
    // Runs are counted by the script: a run killed before its start was
    // recorded gives its attempt back, so attempts do not count runs.
    let script = "n=$(( $(cat runs 2>/dev/null || echo 0) + 1 )); echo $n > runs; \
                  echo $$ > pid.$n; echo start $n >> log; sleep 2; echo end $n >> log";
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
    // 1 if the killed run's start was not recorded yet (given back), else 2.
    assert!((1..=2).contains(&job.attempts), "{job:#?}");
    // The first copy never got to its end, before or during the retry.
    let log = std::fs::read_to_string(env.dir.path().join("log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines, ["start 1", "start 2", "end 2"], "{log}");
}
