//! Helpers for the tests that run the `tickler` binary (tests/cli_*.rs).
#![allow(dead_code)]

pub mod batch;
pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tickler::{Job, JobFilter, JobId, JobState, Queue};

/// The built binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_tickler");

/// A temporary folder (mode 0700) with a queue file path inside it.
pub struct Env {
    /// The folder; removed on drop.
    pub dir: tempfile::TempDir,
    /// `<dir>/jobs.db`.
    pub db: PathBuf,
}

/// What a finished run of the binary left.
#[derive(Debug)]
pub struct Run {
    /// Exit code (-1 if killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Asserts exit code 0; returns stdout.
    #[track_caller]
    pub fn ok(self) -> String {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        self.stdout
    }

    /// Drops the progress lines of `enqueue --from` (`tickler: N job(s)
    /// committed, through line L`) from stderr.
    pub fn without_progress(mut self) -> Run {
        self.stderr = self
            .stderr
            .lines()
            .filter(|l| {
                !(l.starts_with("tickler: ") && l.contains(" job(s) committed, through line "))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        self
    }

    /// Asserts the exit code, and that stderr is one line starting with
    /// `tickler: ` and containing each of `needles`.
    #[track_caller]
    pub fn fails(self, code: i32, needles: &[&str]) -> Run {
        assert_eq!(self.code, code, "exit code: {self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:#?}");
        assert!(lines[0].starts_with("tickler: "), "{self:#?}");
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "stderr lacks {needle:?}: {self:#?}"
            );
        }
        self
    }
}

impl Env {
    /// A fresh folder; no queue file yet.
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("jobs.db");
        Env { dir, db }
    }

    /// A command for the binary on this queue file (via TICKLER_DB), run in
    /// the folder, with times shown in UTC+05:30 unless `--utc`.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_of(Path::new(BIN), args)
    }

    /// As [`Env::command`], for a copy of the binary at `program`.
    pub fn command_of(&self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        super::engine::current().pass_to(&mut cmd);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("TICKLER_DB", &self.db)
            .env("TZ", "Asia/Kolkata")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the binary to its end.
    pub fn run(&self, args: &[&str]) -> Run {
        let out = self.command(args).output().expect("run tickler");
        run_of(out)
    }

    /// Runs the binary with `input` on stdin.
    pub fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tickler");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
        drop(stdin);
        run_of(child.wait_with_output().unwrap())
    }

    /// Starts the binary in the background, output captured.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tickler")
    }

    /// `tickler enqueue ARGS… --create` (the file is made on first use),
    /// returning the printed id.
    #[track_caller]
    pub fn enqueue(&self, args: &[&str]) -> JobId {
        let mut all = vec!["enqueue"];
        all.extend_from_slice(args);
        all.push("--create");
        let out = self.run(&all).ok();
        JobId(out.trim().parse().expect("enqueue prints an id"))
    }

    /// Enqueues a `shell` job running `argv`, with more options.
    #[track_caller]
    pub fn enqueue_shell(&self, argv: &[&str], extra: &[&str]) -> JobId {
        let payload = serde_json::json!({ "argv": argv }).to_string();
        let mut args = vec!["shell", payload.as_str()];
        args.extend_from_slice(extra);
        self.enqueue(&args)
    }

    /// The queue file, opened by the library.
    pub fn queue(&self) -> Queue {
        Queue::open(&self.db).expect("open queue")
    }

    /// Enqueues a job of kind `export` and records it succeeded with
    /// `output`, as a handler returning it would (claimed and recorded by
    /// the library's manual API): for the commands that print outputs.
    #[track_caller]
    pub fn succeeded_with(&self, output: &serde_json::Value) -> JobId {
        let queue = self.queue();
        let id = queue.enqueue(tickler::NewJob::new("export")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "test", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(lease.job_id, id);
        let output = tickler::Output::new(output).unwrap().expect("not null");
        queue
            .manual()
            .record_outcomes(&[(&lease, tickler::Outcome::CompleteWith(output))])
            .unwrap()
            .remove(0)
            .unwrap();
        id
    }

    /// A job, read by the library.
    pub fn job(&self, id: JobId) -> Job {
        self.queue().get(id).expect("get job")
    }

    /// Jobs in `state`.
    pub fn in_state(&self, state: JobState) -> Vec<Job> {
        self.queue()
            .list(&JobFilter {
                state: Some(state),
                limit: 100_000,
                ..JobFilter::default()
            })
            .unwrap()
    }
}

fn run_of(out: Output) -> Run {
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits until `f` holds, up to `limit`.
#[track_caller]
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child up to `limit`; kills it and panics past that.
/// (For children that print little: the pipes are read only at the end.)
#[track_caller]
pub fn wait_for(mut child: Child, limit: Duration) -> Run {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let run = run_of(child.wait_with_output().unwrap());
            panic!("tickler did not exit within {limit:?}: {run:#?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    run_of(child.wait_with_output().unwrap())
}

/// Sends `signal` to a child.
pub fn signal(child: &Child, signal: i32) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on a child we own.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// File mode bits (permissions) of a path.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Whether `pid` is a live process: a zombie (dead, not yet reaped)
/// counts as gone. Linux only (reads /proc).
#[cfg(target_os = "linux")]
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name, which may
            // itself hold a parenthesis.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Live processes (zombies excluded) whose environment holds `var=value`:
/// a variable a test gives a command is inherited by everything the
/// command starts, even by what leaves its process group or session.
/// Linux only (reads /proc; only this user's processes are readable).
#[cfg(target_os = "linux")]
pub fn processes_with_env(var: &str, value: &str) -> Vec<i32> {
    let wanted = format!("{var}={value}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // A zombie's environment reads as empty.
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|entry| entry == wanted.as_bytes())
            })
        })
        .filter(|pid| alive(*pid))
        .collect();
    found.sort_unstable();
    found
}
