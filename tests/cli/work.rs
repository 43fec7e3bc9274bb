//! `tickler work`: shell jobs (`true`, `false` with retries then dead, a
//! `sleep` past its timeout), shutdown on SIGTERM leaving no job stuck in
//! `running`, and the refusal of a queue file other users can write.

use crate::support::cli;

use cli::{eventually, signal, wait_for, Env};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tickler::{JobId, JobState};

/// Flags that make retries quick (add a short `--lease` per test).
const FAST: &[&str] = &[
    "--backoff",
    "10ms",
    "--backoff-cap",
    "20ms",
    "--reap-interval",
    "100ms",
];

fn work_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["work"];
    args.extend_from_slice(FAST);
    args.extend_from_slice(extra);
    args
}

fn shell_payload(value: serde_json::Value) -> String {
    value.to_string()
}

#[test]
fn shell_jobs_succeed_fail_retry_die_and_time_out() {
    let env = Env::new();
    let ok = env.enqueue_shell(&["true"], &[]);
    let fails = env.enqueue_shell(&["false"], &["--max-attempts", "3"]);
    let slow = env.enqueue(&[
        "shell",
        &shell_payload(serde_json::json!({"argv": ["sleep", "30"], "timeout": "300ms"})),
        "--max-attempts",
        "2",
    ]);
    let slow_job_timeout = env.enqueue_shell(
        &["sleep", "30"],
        &["--timeout", "300ms", "--max-attempts", "1"],
    );
    let noisy = env.enqueue_shell(
        &[
            "sh",
            "-c",
            "head -c 10000 /dev/zero | tr '\\0' x >&2; echo THE-END >&2; exit 4",
        ],
        &["--max-attempts", "1"],
    );
    let workdir = env.dir.path().join("work dir");
    std::fs::create_dir(&workdir).unwrap();
    let env_and_cwd = env.enqueue(&[
        "shell",
        &shell_payload(serde_json::json!({
            "argv": ["sh", "-c", "printf '%s %s %s' \"$FOO\" \"$TICKLER_ATTEMPT\" \"$(pwd)\" > out.txt"],
            "cwd": workdir,
            "env": {"FOO": "bar baz"},
        })),
    ]);
    let missing = env.enqueue_shell(&["/nonexistent/command"], &[]);
    let bad_payload = env.enqueue(&["shell", r#"{"cmd": "true"}"#]);
    let other_kind = env.enqueue(&["send_email"]);

    let run = wait_for(
        env.spawn(&work_args(&["--drain", "--lease", "1s"])),
        Duration::from_secs(30),
    );
    assert_eq!(run.code, 0, "{run:#?}");

    let job = |id: JobId| env.job(id);
    assert_eq!(job(ok).state, JobState::Succeeded);

    let f = job(fails);
    assert_eq!(f.state, JobState::Dead);
    assert_eq!(f.attempts, 3);
    assert_eq!(f.last_error.as_deref(), Some("exit code 1"));
    assert_eq!(
        run.stderr.matches(&format!("job {fails} failed")).count(),
        3,
        "{run:#?}"
    );

    let s = job(slow);
    assert_eq!(s.state, JobState::Dead);
    assert_eq!(s.attempts, 2);
    let error = s.last_error.unwrap();
    assert!(
        error.starts_with("timed out after 300ms; the command was killed"),
        "{error}"
    );

    let s = job(slow_job_timeout);
    assert_eq!(s.state, JobState::Dead);
    assert!(s.last_error.unwrap().starts_with("timed out after 300ms"));

    let n = job(noisy);
    assert_eq!(n.state, JobState::Dead);
    let error = n.last_error.unwrap();
    assert!(error.starts_with("exit code 4; stderr: xxx"), "{error}");
    assert!(error.ends_with("THE-END"), "{error}");
    let kept = error.len() - "exit code 4; stderr: ".len();
    assert!((4000..=4096).contains(&kept), "kept {kept} bytes of stderr");

    assert_eq!(job(env_and_cwd).state, JobState::Succeeded);
    let written = std::fs::read_to_string(workdir.join("out.txt")).unwrap();
    assert_eq!(written, format!("bar baz 1 {}", workdir.display()));

    let m = job(missing);
    assert_eq!((m.state, m.attempts), (JobState::Dead, 1));
    assert!(m
        .last_error
        .unwrap()
        .contains("cannot run \"/nonexistent/command\""));

    let b = job(bad_payload);
    assert_eq!((b.state, b.attempts), (JobState::Dead, 1));
    assert!(b.last_error.unwrap().contains("\"argv\""));

    // Other kinds are left for other workers.
    assert_eq!(job(other_kind).state, JobState::Pending);
}

/// A shell job that writes its pid to `pid` in the folder, then sleeps.
fn sleeper(env: &Env, secs: &str) -> JobId {
    env.enqueue_shell(
        &["sh", "-c", &format!("echo $$ > pid; exec sleep {secs}")],
        &["--max-attempts", "5"],
    )
}

fn wait_running(env: &Env, id: JobId) -> libc::pid_t {
    let pid_file = env.dir.path().join("pid");
    eventually(Duration::from_secs(10), "the job to run", || {
        env.job(id).state == JobState::Running
            && std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    });
    std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn sigterm_stops_gracefully_and_leaves_no_job_running() {
    let env = Env::new();
    let quick = env.enqueue_shell(&["true"], &[]);
    let id = sleeper(&env, "30");
    let child = env.spawn(&work_args(&[
        "--grace",
        "200ms",
        "--threads",
        "2",
        "--lease",
        "1s",
    ]));
    let pid = wait_running(&env, id);
    eventually(Duration::from_secs(10), "the quick job to succeed", || {
        env.job(quick).state == JobState::Succeeded
    });

    signal(&child, libc::SIGTERM);
    let run = wait_for(child, Duration::from_secs(10));
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("SIGTERM"), "{run:#?}");
    assert!(!alive(pid), "the command was not killed");

    env.run(&["reap"]).ok();
    assert!(env.in_state(JobState::Running).is_empty());
    // Stopped by the shutdown, not by its own fault: back to pending with
    // its attempt given back.
    let job = env.job(id);
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
}

#[test]
fn a_second_signal_stops_at_once() {
    let env = Env::new();
    let id = sleeper(&env, "30");
    let child = env.spawn(&work_args(&["--grace", "60s", "--lease", "1s"]));
    let pid = wait_running(&env, id);

    signal(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(pid), "the first signal must let the command run on");
    assert_eq!(env.job(id).state, JobState::Running);
    signal(&child, libc::SIGTERM);
    let run = wait_for(child, Duration::from_secs(10));
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(
        run.stderr.contains("SIGINT") && run.stderr.contains("again"),
        "{run:#?}"
    );
    assert!(!alive(pid));
    let job = env.job(id);
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
}

#[test]
fn a_killed_worker_loses_its_job_at_once_to_the_next_process() {
    let env = Env::new();
    let id = sleeper(&env, "30");
    // An hour's lease: the job comes back because its holder is gone, not
    // because the lease ran out.
    let child = env.spawn(&work_args(&["--lease", "1h"]));
    let pid = wait_running(&env, id);
    // Once the run's start is recorded (about a second after it), a crash
    // counts its attempt.
    let db = rusqlite::Connection::open(&env.db).unwrap();
    let started = Instant::now();
    while db
        .query_row(
            "SELECT started_at IS NULL FROM tickler_jobs WHERE id = ?1",
            [id.0],
            |r| r.get::<_, bool>(0),
        )
        .unwrap()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no start recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, libc::SIGKILL);
    // Reading its output ends when the command, which holds the pipes,
    // is gone: its supervisor kills it when the worker dies.
    let run = wait_for(child, Duration::from_secs(10));
    assert_eq!(run.code, -1);
    assert!(!alive(pid));

    // The next process to open the file takes the job back.
    env.run(&["stats"]).ok();
    let job = env.job(id);
    assert_ne!(job.state, JobState::Running, "{job:#?}");
    assert_eq!(job.attempts, 1);
    assert!(job.last_error.unwrap().contains("worker gone"));
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn refuses_a_queue_file_others_can_write() {
    let env = Env::new();
    let id = env.enqueue_shell(&["true"], &[]);
    chmod(&env.db, 0o666);
    env.run(&work_args(&["--drain", "--lease", "1s"])).fails(
        1,
        &[
            "refusing to run shell jobs",
            "is writable by other users (mode 666)",
            "can run commands as you",
            "--allow-shared-db",
        ],
    );
    assert_eq!(env.job(id).state, JobState::Pending);

    let run = env.run(&work_args(&[
        "--drain",
        "--lease",
        "1s",
        "--allow-shared-db",
    ]));
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("warning: "), "{run:#?}");
    assert_eq!(env.job(id).state, JobState::Succeeded);

    // The folder counts too.
    chmod(&env.db, 0o600);
    chmod(env.dir.path(), 0o777);
    let id = env.enqueue_shell(&["true"], &[]);
    env.run(&work_args(&["--drain", "--lease", "1s"]))
        .fails(1, &["its folder", "writable by other users (mode 777)"]);
    assert_eq!(env.job(id).state, JobState::Pending);
    chmod(env.dir.path(), 0o700);
    env.run(&work_args(&["--drain", "--lease", "1s"])).ok();
    assert_eq!(env.job(id).state, JobState::Succeeded);
}

/// `--queue default --queue mail` serves both: naming `default` first used
/// to replace it, the `default` job never ran and `--drain` never ended.
#[test]
fn work_serves_every_queue_it_names_and_drains() {
    let env = Env::new();
    let in_default = env.enqueue_shell(&["true"], &[]);
    let in_mail = env.enqueue_shell(&["true"], &["--queue", "mail"]);
    let elsewhere = env.enqueue_shell(&["true"], &["--queue", "other"]);
    env.run(&work_args(&[
        "--drain", "--lease", "1s", "--queue", "default", "--queue", "mail",
    ]))
    .ok();
    assert_eq!(env.job(in_default).state, JobState::Succeeded);
    assert_eq!(env.job(in_mail).state, JobState::Succeeded);
    assert_eq!(env.job(elsewhere).state, JobState::Pending);
}

/// The command's own status reaches the job's error as before, through
/// the process that supervises it: an exit code, or the signal that
/// killed it.
#[test]
fn a_command_killed_by_a_signal_fails_with_that_signal() {
    let env = Env::new();
    let signalled = env.enqueue_shell(&["sh", "-c", "kill -USR1 $$"], &["--max-attempts", "1"]);
    let exited = env.enqueue_shell(
        &["sh", "-c", "echo bye >&2; exit 7"],
        &["--max-attempts", "1"],
    );
    env.run(&work_args(&["--drain", "--lease", "1s"])).ok();
    assert_eq!(
        env.job(signalled).last_error.as_deref(),
        Some(format!("killed by signal {}", libc::SIGUSR1).as_str())
    );
    assert_eq!(
        env.job(exited).last_error.as_deref(),
        Some("exit code 7; stderr: bye")
    );
}

/// The supervisor's subcommand is internal.
#[test]
fn help_does_not_list_the_supervisor() {
    let env = Env::new();
    let help = env.run(&["--help"]).ok();
    assert!(help.contains("work"), "{help}");
    assert!(!help.contains("supervise"), "{help}");
}
