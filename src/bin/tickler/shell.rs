//! The built-in `shell` job kind: runs a command without a shell.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
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
            .map(humantime::parse_duration)
            .transpose()
            .map_err(|e| {
                JobError::permanent(format!(
                    "payload timeout: {e}; write durations like 30s, 5m, 2h"
                ))
            })?;
        let mut command = Command::new(program);
        command
            .args(&payload.argv[1..])
            .envs(&payload.env)
            .env("TICKLER_JOB_ID", ctx.job_id().to_string())
            .env("TICKLER_ATTEMPT", ctx.attempt().to_string())
            .env("TICKLER_RUN_TOKEN", &ctx.run_token().0)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C at the terminal reaches
            // `tickler work` only (which then waits for the command), and a
            // kill reaches the command's own children too.
            .process_group(0);
        if let Some(cwd) = &payload.cwd {
            command.current_dir(cwd);
        }
        die_with_this_thread(&mut command);
        let mut child = command.spawn().map_err(|e| {
            let message = format!("cannot run {program:?}: {e}");
            match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    JobError::Permanent(message)
                }
                _ => JobError::Retry(message),
            }
        })?;
        let tail = Arc::new(Mutex::new(Vec::new()));
        let reader_done = spawn_stderr_reader(&mut child, Arc::clone(&tail));
        let end = self.wait(ctx, &mut child, timeout);
        // Grandchildren that left the process group could keep the pipe
        // open: do not wait for them.
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

    /// Waits for the command, killing it on timeout, lost lease or shutdown.
    fn wait(&self, ctx: &JobContext, child: &mut Child, timeout: Option<Duration>) -> End {
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return End::Exited(status),
                Ok(None) => {}
                Err(e) => {
                    log::warn!("job {}: waiting for the command: {e}", ctx.job_id());
                }
            }
            let kill = if self.hard_stop.load(Ordering::SeqCst) {
                Some(Kill::Shutdown)
            } else {
                match ctx.cancel_reason() {
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
            if let Some(kill) = kill {
                kill_group(child);
                let _ = child.wait();
                return End::Killed(kill);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// Makes the kernel SIGKILL the command when the thread that spawns it
/// ends, which is when `tickler work` dies for any reason (SIGKILL, a
/// crash, the OOM killer): otherwise the command, in its own process group,
/// would go on after its worker, and the job's retry by another worker
/// would run beside it.
///
/// Linux's `PR_SET_PDEATHSIG` is tied to the spawning *thread*, not the
/// process. That thread is the pool's worker thread running this handler,
/// which waits for the command before it returns, so it outlives the
/// command in normal operation. The signal reaches the command itself;
/// processes the command started in turn (a pipeline in `sh -c`) are
/// orphaned, as with any parent that dies, unless they were already
/// killed with the group (timeouts, lost leases, a second SIGTERM).
///
/// A subreaper (`PR_SET_CHILD_SUBREAPER`) would not help: it adopts
/// orphans of a living worker, and dies with it.
///
/// macOS and the BSDs have no such signal (FreeBSD's
/// `procctl(PROC_PDEATHSIG_CTL)` is not used here): there a command
/// outlives a killed worker; its late result is refused by run_token
/// fencing, but its side effects can overlap the retry's.
#[cfg(target_os = "linux")]
fn die_with_this_thread(command: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let worker = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl and getppid, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker may have died between fork and prctl.
            if libc::getppid() != worker {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_this_thread(_command: &mut Command) {}

/// SIGKILL to the command's process group (its children too), then to the
/// command itself in case it left the group.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) has no memory effects; a negative pid names the
        // process group the child leads (set by `process_group(0)`).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
}

/// Reads the child's stderr, keeping the last [`STDERR_TAIL`] bytes; the
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
