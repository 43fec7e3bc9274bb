//! The built-in `shell` job kind: runs a command without a shell, under a
//! supervisor process (`supervise.rs`) that stops the command's whole
//! process tree with it: on a timeout, a lost lease (cancel), a shutdown,
//! or the death of `tickler work`; the job's outcome is reported only once
//! the tree is gone.

use crate::supervise;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tickler::{CancelReason, JobContext, JobError};

/// The job kind this handler serves.
pub const KIND: &str = "shell";

/// How much of the end of stderr is kept as the error of a failed attempt.
pub const STDERR_TAIL: usize = 4096;

/// The payload of a `shell` job.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    /// The program and its arguments.
    argv: Vec<String>,
    /// Working directory (default: that of `tickler work`).
    cwd: Option<PathBuf>,
    /// Variables added to the inherited environment.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Time limit, e.g. "30s".
    timeout: Option<String>,
}

/// Runs `shell` jobs. `hard_stop` is set on the second SIGINT/SIGTERM:
/// running commands are killed and their jobs handed back.
#[derive(Debug, Clone)]
pub struct Shell {
    /// Set when `work` must stop at once.
    pub hard_stop: Arc<AtomicBool>,
    /// Print one line per job on stderr.
    pub verbose: bool,
}

/// Why a command was killed.
#[derive(Debug, Clone, Copy)]
enum Kill {
    Timeout(Duration),
    LeaseLost,
    Shutdown,
}

enum End {
    Exited(ExitStatus),
    Killed(Kill),
}

impl Shell {
    /// Runs one job: the handler given to the worker pool.
    pub fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        let started = Instant::now();
        let result = self.execute(ctx);
        if self.verbose {
            let what = match &result {
                Ok(()) => "succeeded".to_owned(),
                Err(JobError::Retry(e)) if ctx.attempt() >= ctx.max_attempts() => {
                    format!("failed, attempts used up: {}", first_line(e))
                }
                Err(JobError::Retry(e)) => format!(
                    "failed (attempt {} of {}): {}",
                    ctx.attempt(),
                    ctx.max_attempts(),
                    first_line(e)
                ),
                Err(JobError::Permanent(e)) => format!("failed for good: {}", first_line(e)),
                Err(JobError::Snooze(_)) => "stopped; handed back to run again".to_owned(),
            };
            eprintln!(
                "tickler: job {} {} in {}",
                ctx.job_id(),
                what,
                crate::display::duration(started.elapsed())
            );
        }
        result
    }

    fn execute(&self, ctx: &JobContext) -> Result<(), JobError> {
        let payload: Payload = ctx.payload_as().map_err(|e| {
            let JobError::Permanent(m) = e else { return e };
            JobError::Permanent(format!(
                "{m}; a shell payload is {{\"argv\": [\"cmd\", \"arg\"], \"cwd\": \"dir\", \"env\": {{\"K\": \"V\"}}, \"timeout\": \"30s\"}}"
            ))
        })?;
        let Some(program) = payload.argv.first() else {
            return Err(JobError::permanent(
                "payload argv is empty: give the command and its arguments, e.g. {\"argv\": [\"echo\", \"hi\"]}",
            ));
        };
        let timeout = payload
            .timeout
            .as_deref()
            .map(crate::display::parse_duration)
            .transpose()
            .map_err(|e| JobError::permanent(format!("payload timeout: {e}")))?;
        let cannot_run = |e: std::io::Error| {
            let message = format!("cannot run {program:?}: {e}");
            match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    JobError::Permanent(message)
                }
                _ => JobError::Retry(message),
            }
        };
        // Ours is the end `work` keeps; its closing, when we die, tells the
        // supervisor to kill the tree.
        let (control, theirs) = UnixStream::pair().map_err(cannot_run)?;
        let mut supervisor_command = Command::new(supervise::program().map_err(cannot_run)?);
        supervisor_command
            .arg0("tickler")
            .arg(supervise::SUBCOMMAND)
            .arg("--")
            .args(&payload.argv)
            // The supervisor passes its environment and folder on to the
            // command, and a missing folder fails its start as it would
            // fail the command's.
            .envs(&payload.env)
            .env("TICKLER_JOB_ID", ctx.job_id().to_string())
            .env("TICKLER_ATTEMPT", ctx.attempt().to_string())
            .env("TICKLER_RUN_TOKEN", &ctx.run_token().0)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C at the terminal reaches
            // `tickler work` only, which then stops its jobs as it should.
            .process_group(0);
        if let Some(cwd) = &payload.cwd {
            supervisor_command.current_dir(cwd);
        }
        // Keeps this process's leases from being taken back early (as a dead
        // holder's) while the supervisor, and so the tree, still lives:
        tickler::holder::pass_to(&mut supervisor_command);
        let spawned = supervisor_command.spawn();
        // It holds this process's copy of the supervisor's end, which must
        // close for the supervisor to see end-of-file when `work` dies.
        drop(supervisor_command);
        let mut supervisor = Supervisor {
            child: spawned.map_err(cannot_run)?,
            control,
        };
        let tail = Arc::new(Mutex::new(Vec::new()));
        let reader_done = spawn_stderr_reader(&mut supervisor.child, Arc::clone(&tail));
        let mut end = self.wait(ctx, &mut supervisor, timeout);
        let (signalled, cannot_run) = supervisor.report(program);
        if let Some(e) = cannot_run {
            return Err(e);
        }
        if signalled && matches!(end, End::Exited(status) if !status.success()) {
            end = End::Killed(Kill::Shutdown);
        }
        // The tree is gone by now, but a process outside it that was given
        // the pipe (or, without a subreaper, one that left the command's
        // group) could keep it open: do not wait for it.
        let _ = reader_done.recv_timeout(Duration::from_secs(1));
        let stderr = stderr_text(&tail.lock().unwrap_or_else(PoisonError::into_inner));
        let with_stderr = |what: String| {
            if stderr.is_empty() {
                what
            } else {
                format!("{what}; stderr: {stderr}")
            }
        };
        match end {
            End::Exited(status) if status.success() => Ok(()),
            End::Exited(status) => Err(JobError::Retry(with_stderr(match status.code() {
                Some(code) => format!("exit code {code}"),
                None => format!(
                    "killed by signal {}",
                    status
                        .signal()
                        .map_or_else(|| "?".to_owned(), |s| s.to_string())
                ),
            }))),
            End::Killed(Kill::Timeout(limit)) => Err(JobError::Retry(with_stderr(format!(
                "timed out after {}; the command was killed",
                crate::display::duration(limit)
            )))),
            End::Killed(Kill::LeaseLost) => Err(JobError::retry(
                "lease lost while running; the command was killed",
            )),
            // Not the command's fault: run it again without using an attempt.
            End::Killed(Kill::Shutdown) => Err(JobError::Snooze(ctx.now())),
        }
    }

    /// Waits for the supervisor, which exits once the command and all it
    /// started are gone. A timeout, or the end of the shutdown's grace,
    /// asks it to stop the tree (SIGTERM, then SIGKILL); a lost lease or a
    /// second SIGINT/SIGTERM, to kill it at once (see `supervise.rs`).
    fn wait(
        &self,
        ctx: &JobContext,
        supervisor: &mut Supervisor,
        timeout: Option<Duration>,
    ) -> End {
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut stopping: Option<Kill> = None;
        let mut killing = false;
        loop {
            match supervisor.child.try_wait() {
                Ok(Some(status)) => {
                    return match stopping {
                        Some(kill) => End::Killed(kill),
                        None => End::Exited(status),
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    log::warn!("job {}: waiting for the command: {e}", ctx.job_id());
                }
            }
            let hard_stop = self.hard_stop.load(Ordering::SeqCst);
            let reason = ctx.cancel_reason();
            let urgent = hard_stop || reason == Some(CancelReason::LeaseLost);
            if stopping.is_none() {
                stopping = if hard_stop {
                    Some(Kill::Shutdown)
                } else {
                    match reason {
                        Some(CancelReason::LeaseLost) => Some(Kill::LeaseLost),
                        Some(CancelReason::Shutdown) => Some(Kill::Shutdown),
                        Some(CancelReason::Timeout) => Some(Kill::Timeout(
                            ctx.lease().timeout.unwrap_or_else(|| started.elapsed()),
                        )),
                        _ => timeout
                            .filter(|limit| started.elapsed() >= *limit)
                            .map(Kill::Timeout),
                    }
                };
                if stopping.is_some() && !urgent {
                    supervisor.send(supervise::STOP);
                }
            }
            // Also during a stop under way: its grace is for a job that is
            // still ours and a shutdown that is not hurried.
            if stopping.is_some() && urgent && !killing {
                supervisor.send(supervise::KILL);
                killing = true;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// A running supervisor and our end of its stdin.
struct Supervisor {
    child: Child,
    /// Dropped only once the supervisor exited: closing it earlier would
    /// make the supervisor kill the tree.
    control: UnixStream,
}

impl Supervisor {
    /// Sends [`supervise::STOP`] or [`supervise::KILL`]. A supervisor that
    /// already exited cannot read it, and needs not.
    fn send(&mut self, message: u8) {
        // `work` ignores SIGPIPE, so a closed socket is only an error here.
        let _ = self.control.write_all(&[message]);
    }

    /// What the supervisor wrote back, once it exited: whether a signal
    /// from outside asked it to stop ([`supervise::SIGNALLED`]), and why
    /// the command could not start, if it could not.
    fn report(&mut self, program: &str) -> (bool, Option<JobError>) {
        let mut report = Vec::new();
        // Not blocking: a copy of the supervisor's end may live on for a
        // moment in another job's supervisor between its fork and exec
        // (the end is close-on-exec), but what was written is there.
        if self.control.set_nonblocking(true).is_ok() {
            let _ = self.control.read_to_end(&mut report);
        }
        let signalled = report.first() == Some(&supervise::SIGNALLED);
        let start = report
            .iter()
            .take_while(|&&b| b == supervise::SIGNALLED)
            .count();
        let report = &report[start..];
        let cannot_run = report.split_first().map(|(&class, text)| {
            let message = format!("cannot run {program:?}: {}", String::from_utf8_lossy(text));
            if class == supervise::CANNOT_RUN_PERMANENT {
                JobError::Permanent(message)
            } else {
                JobError::Retry(message)
            }
        });
        (signalled, cannot_run)
    }
}

/// Reads the supervisor's stderr (the command's), keeping the last [`STDERR_TAIL`] bytes; the
/// receiver gets a message when the pipe closes.
fn spawn_stderr_reader(child: &mut Child, tail: Arc<Mutex<Vec<u8>>>) -> mpsc::Receiver<()> {
    let (done_tx, done_rx) = mpsc::channel();
    let Some(mut stderr) = child.stderr.take() else {
        let _ = done_tx.send(());
        return done_rx;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * STDERR_TAIL {
                        let cut = tail.len() - STDERR_TAIL;
                        tail.drain(..cut);
                    }
                }
            }
        }
        let _ = done_tx.send(());
    });
    done_rx
}

/// The last [`STDERR_TAIL`] bytes of stderr as text, trimmed, starting at a
/// character boundary.
fn stderr_text(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    let mut tail = &bytes[start..];
    if start > 0 {
        // Skip UTF-8 continuation bytes cut off from their character.
        while let Some((first, rest)) = tail.split_first() {
            if first & 0b1100_0000 != 0b1000_0000 {
                break;
            }
            tail = rest;
        }
    }
    String::from_utf8_lossy(tail).trim().to_owned()
}

/// The first line, escaped: it may come from the command's stderr.
fn first_line(s: &str) -> std::borrow::Cow<'_, str> {
    crate::display::safe(s.lines().next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_tail_keeps_the_end_on_a_char_boundary() {
        let mut bytes = "é".repeat(3000).into_bytes(); // 6000 bytes
        bytes.extend_from_slice(b"the end\n");
        let text = stderr_text(&bytes);
        assert!(text.ends_with("the end"));
        assert!(text.len() <= STDERR_TAIL);
        assert!(text.starts_with('é'));
    }
}
