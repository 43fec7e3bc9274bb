//! `tickler __supervise -- PROGRAM ARGS…`: the process that `tickler work`
//! runs each shell command under, so that the command's whole process tree
//! stops with its job. Internal and hidden from `--help`: its only caller
//! is `shell.rs`, which holds the other end of its stdin.
//!
//! # Why a supervisor process
//!
//! A shell job is usually `sh -c "a | b"` or a script, so stopping "the
//! command" must stop every process it started, including ones that left
//! its process group (`setsid`, a daemonizing double fork), and the job's
//! outcome (which releases its unique key and lets the retry run) must
//! come only once they are all gone. `tickler work` cannot do this itself:
//! killing a process group misses processes that left it, and orphans go
//! to init, where nobody can wait for them. A child subreaper
//! (`PR_SET_CHILD_SUBREAPER`) adopts them instead, but it must be a process
//! of its own: `work` runs many jobs at once, and a subreaper dies with its
//! process, which is exactly when `work` is SIGKILLed. So each command runs
//! under this small process, the tickler binary run again (the same build
//! as `work`, so the two always speak the same protocol). It:
//!
//! - makes itself a child subreaper (Linux), and starts the command in a
//!   process group of its own, stdin closed, stdout and stderr inherited
//!   (stderr is `work`'s pipe, whose tail becomes the job's error);
//! - on [`STOP`] from `work` (a timeout, or the end of a graceful
//!   shutdown's grace), or on SIGTERM, SIGINT or SIGHUP from anyone else,
//!   sends SIGTERM (and SIGCONT, for stopped processes) to the command's
//!   group and to each of its own children, including orphans adopted
//!   later, then SIGKILL to all of them [`KILL_GRACE`] later;
//! - on [`KILL`] (a lost lease: cancelled or reaped, the job is no longer
//!   ours; or a second SIGINT/SIGTERM to `work`), and when `work` dies,
//!   sends SIGKILL at once: no grace can be afforded once nobody renews the
//!   lease, since its expiry hands the job, or its unique key, to another
//!   run;
//! - when the command exits on its own, stops what it left running the
//!   same way as on [`STOP`]: a job is its tree, a leftover would run
//!   beside the next run of the job, and waiting for it instead would let
//!   one daemonizing command hold a worker thread for ever;
//! - in every case waits until it has no child left (`waitpid` until
//!   `ECHILD`, which as a subreaper covers the orphans), and only then
//!   exits, with the command's status passed on: the same exit code, or
//!   death by the same signal.
//!
//! `tickler work` waits for this process before it records the outcome,
//! so the outcome, the release of the unique key and the retry all come
//! after the tree is gone.
//!
//! # Why a socket on stdin, not signals, from `work`
//!
//! `work` talks to the supervisor over one end of a socket pair given as
//! its stdin ([`STOP`], [`KILL`]; the supervisor writes back only why the
//! command could not start). When `work` dies, however it dies, the kernel
//! closes its end, and the supervisor reads end-of-file: unlike
//! `PR_SET_PDEATHSIG`, this is portable, fires on the death of the
//! process rather than of the thread that spawned the child, and has no
//! window between fork and setup in which the death goes unseen (a
//! socket already closed reads as end-of-file). Only `work` holds its end
//! (close-on-exec, so no other child keeps it open), and the supervisor's
//! end does not reach the command, whose stdin is /dev/null.
//!
//! # Limits
//!
//! - A process that is SIGKILLed but cannot die (stuck in the kernel, say
//!   on a dead NFS mount) keeps the supervisor, and so the job, waiting:
//!   the tree is not gone.
//! - If the supervisor itself is SIGKILLed, the command gets SIGKILL
//!   (`PR_SET_PDEATHSIG`, Linux), but what the command started is orphaned.
//! - Without a subreaper (macOS, the BSDs: `PROC_REAP_ACQUIRE` of FreeBSD
//!   is not used here) only the command's process group is signalled, and
//!   only while the command runs (once it is reaped, its group id could be
//!   reused): processes that left the group, or that the command left
//!   behind when it exited, live on, and the supervisor cannot wait for
//!   them since they are not its children.

use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The hidden subcommand that runs the supervisor.
pub const SUBCOMMAND: &str = "__supervise";

/// From `work`: SIGTERM to the tree, SIGKILL [`KILL_GRACE`] later.
pub const STOP: u8 = b'T';

/// From `work`: SIGKILL to the tree at once.
pub const KILL: u8 = b'K';

/// Supervisor to `work`: a signal from outside (SIGTERM, SIGINT, SIGHUP)
/// asked this supervisor to stop, as systemd's default `KillMode` does to
/// every process of a service it stops: the command's end is then not its
/// own fault, and `work` hands the job back without using an attempt.
pub const SIGNALLED: u8 = b'S';

/// To `work`, before the rest of the message (the error's text): the
/// command could not start, and trying again will not help (not found,
/// not executable).
pub const CANNOT_RUN_PERMANENT: u8 = b'P';

/// To `work`, before the error's text: the command could not start, for a
/// reason that may pass (out of processes or memory).
pub const CANNOT_RUN_RETRY: u8 = b'R';

/// Between SIGTERM and SIGKILL. Short: a timed-out job's outcome waits for
/// it, and it must end well within the pool's grace for a handler past its
/// timeout, and within `work`'s wait for outcomes after a shutdown (both
/// checked in `work.rs`).
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The exit code when the command could not start (as a shell's).
const CANNOT_RUN_EXIT: i32 = 127;

/// How often a running supervisor looks whether `work` is stopped.
const FOLLOW_WORK: Duration = Duration::from_millis(200);

/// Set by SIGTERM, SIGINT and SIGHUP: stop the tree as on [`STOP`].
static STOP_SIGNALLED: AtomicBool = AtomicBool::new(false);

/// The program to run the supervisor with: this very binary. On Linux,
/// /proc/self/exe (resolved in the child, which is still a copy of `work`)
/// names it even when the file was replaced or deleted since `work`
/// started, by an upgrade say.
pub fn program() -> std::io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// The mark `work` passed on (`tickler::holder::pass_to`) keeps its
/// leases from being taken back early while this process lives: the
/// command is not to carry it on (a process that left the tree and the
/// kills would keep `work`'s jobs from ever being taken back early).
fn keep_holder_mark_to_itself() {
    let Some(fd) = std::env::var(tickler::holder::MARK_FD_VAR)
        .ok()
        .and_then(|v| v.parse::<libc::c_int>().ok())
    else {
        return;
    };
    // SAFETY: fcntl on a descriptor number; a wrong one fails harmlessly.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
    std::env::remove_var(tickler::holder::MARK_FD_VAR);
}

/// Runs `argv` under supervision, then exits as it did.
pub fn run(argv: &[OsString]) -> ! {
    // SAFETY: fd 0 is the socket `shell.rs` passed as stdin; nothing else
    // in this process uses fd 0, and this is its only owner.
    let mut control = unsafe { UnixStream::from_raw_fd(0) };
    keep_holder_mark_to_itself();
    become_subreaper();
    // Before the command starts, so that no exit goes unseen.
    let wake = match wake_on_signals() {
        Ok(wake) => wake,
        Err(e) => cannot_run(&mut control, &e),
    };
    let Some((program, args)) = argv.split_first() else {
        cannot_run(
            &mut control,
            &std::io::Error::new(ErrorKind::InvalidInput, "no command given"),
        )
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        // Signals go to the group while the command lives.
        .process_group(0);
    die_with_supervisor(&mut command);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => cannot_run(&mut control, &e),
    };
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    // Reaped by `waitpid(-1)` with the rest of the tree.
    drop(child);
    let mut tree = Tree {
        command: pid,
        status: None,
        group_termed: false,
        termed: Vec::new(),
        frozen: false,
    };
    let status = supervise(&mut tree, control, &wake);
    exit_like(status)
}

/// How far the tree is in being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The command runs.
    Running,
    /// SIGTERM sent; SIGKILL at `kill_at`.
    Stopping { kill_at: Instant },
    /// SIGKILL to everything, until nothing is left.
    Killing,
}

/// The command and what was signalled.
struct Tree {
    /// The command's pid, also its process group's id.
    command: libc::pid_t,
    /// The command's wait status, once reaped.
    status: Option<libc::c_int>,
    /// Whether the command's group got SIGTERM.
    group_termed: bool,
    /// Children that got SIGTERM, so that none gets it twice (a second
    /// SIGTERM would run a shell's trap again).
    termed: Vec<libc::pid_t>,
    /// Stopped, following a stopped `work` (see [`Tree::follow`]).
    frozen: bool,
}

fn supervise(tree: &mut Tree, mut control: UnixStream, wake: &UnixStream) -> libc::c_int {
    // SAFETY: getppid(2) has no memory effects. `work` is the parent until
    // it dies, which the control socket tells.
    let work = unsafe { libc::getppid() };
    let mut phase = Phase::Running;
    let mut control_open = true;
    loop {
        if tree.reap() {
            // No child left: the command was reaped, so its status is set.
            return tree.status.unwrap_or(CANNOT_RUN_EXIT << 8);
        }
        let asked_to_stop = STOP_SIGNALLED.swap(false, Ordering::SeqCst);
        if asked_to_stop && control_open {
            let _ = control.write_all(&[SIGNALLED]);
        }
        let now = Instant::now();
        phase = match phase {
            Phase::Running if asked_to_stop || tree.status.is_some() => Phase::Stopping {
                kill_at: now + KILL_GRACE,
            },
            Phase::Stopping { kill_at } if now >= kill_at => Phase::Killing,
            phase => phase,
        };
        match phase {
            Phase::Running => tree.follow(work),
            Phase::Stopping { .. } => tree.terminate(),
            Phase::Killing => tree.kill(),
        }
        let timeout = match phase {
            // Signals and `work` wake us; the bound is how soon a
            // stopped `work` is followed.
            Phase::Running => FOLLOW_WORK,
            Phase::Stopping { kill_at } => kill_at.saturating_duration_since(now),
            // Each round kills the children adopted since the last one.
            Phase::Killing => Duration::from_millis(20),
        };
        let readable = wait_for_event(control_open.then_some(&control), wake, timeout);
        if readable {
            match read_control(&mut control) {
                Control::Nothing => {}
                Control::Stop => {
                    if phase == Phase::Running {
                        phase = Phase::Stopping {
                            kill_at: Instant::now() + KILL_GRACE,
                        };
                        tree.terminate();
                    }
                }
                Control::Kill => phase = Phase::Killing,
                Control::Gone => {
                    control_open = false;
                    phase = Phase::Killing;
                }
            }
            if phase == Phase::Killing {
                tree.kill();
            }
        }
    }
}

impl Tree {
    /// Reaps every child that ended; true once no child is left.
    fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 {
                if pid == self.command {
                    self.status = Some(status);
                }
                self.termed.retain(|p| *p != pid);
                continue;
            }
            if pid == 0 {
                return false;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => return true,
                _ => return false,
            }
        }
    }

    /// SIGTERM, then SIGCONT so that a stopped process sees it: to the
    /// command's group once, and to each child (adopted orphans included)
    /// that did not get it yet.
    fn terminate(&mut self) {
        if !self.group_termed && self.status.is_none() {
            signal_group(self.command, libc::SIGTERM);
            signal_group(self.command, libc::SIGCONT);
            self.group_termed = true;
            self.termed.push(self.command);
        }
        for child in direct_children() {
            if self.termed.contains(&child) {
                continue;
            }
            self.termed.push(child);
            if self.group_termed && same_group(child, self.command) {
                // It got the group's SIGTERM.
                continue;
            }
            send(child, libc::SIGTERM);
            send(child, libc::SIGCONT);
        }
    }

    /// SIGKILL to the command's group and to every child: processes
    /// further down become children as their parents die, and go in the
    /// next round.
    fn kill(&self) {
        if self.status.is_none() {
            signal_group(self.command, libc::SIGKILL);
        }
        for child in direct_children() {
            send(child, libc::SIGKILL);
        }
    }

    /// Stops the tree while `work` is stopped (SIGSTOP, a shell's Ctrl-Z,
    /// a debugger, a frozen cgroup) and lets it go on when `work` does: a
    /// stopped `work` renews no lease, the job may run again elsewhere,
    /// and this copy must not run beside it. When `work` goes on, it
    /// learns at its next look that the lease was lost and has the tree
    /// killed.
    fn follow(&mut self, work: libc::pid_t) {
        let stopped = is_stopped(work);
        if stopped == self.frozen {
            return;
        }
        let signal = if stopped {
            libc::SIGSTOP
        } else {
            libc::SIGCONT
        };
        if self.status.is_none() {
            signal_group(self.command, signal);
        }
        for child in direct_children() {
            send(child, signal);
        }
        self.frozen = stopped;
    }
}

/// Whether process `pid` is stopped (state `T`) or stopped by a tracer
/// (`t`), from `/proc/PID/stat`; false where that cannot be read.
fn is_stopped(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
            Some(matches!(state, "T" | "t"))
        })
        .unwrap_or(false)
}

/// Only while the command is not reaped: until then its pid, and so its
/// group's id, cannot belong to anyone else.
fn signal_group(leader: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory effects; a negative pid names a group.
    unsafe {
        libc::kill(-leader, signal);
    }
}

/// To a child of ours: not reaped, so its pid cannot have been reused.
fn send(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid, signal);
    }
}

fn same_group(pid: libc::pid_t, group: libc::pid_t) -> bool {
    // SAFETY: getpgid has no memory effects.
    unsafe { libc::getpgid(pid) == group }
}

/// This process's children, adopted orphans included.
#[cfg(target_os = "linux")]
fn direct_children() -> Vec<libc::pid_t> {
    // Exact and cheap, but only with CONFIG_PROC_CHILDREN; orphans are
    // adopted by one of the subreaper's threads, so all of them are read.
    let mut found = Vec::new();
    let mut readable = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                readable = true;
                found.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<libc::pid_t>().ok()),
                );
            }
        }
    }
    if readable {
        return found;
    }
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …"; comm may hold spaces and parentheses.
        let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if after_comm.split_whitespace().nth(1) == Some(me.as_str()) {
            found.push(pid);
        }
    }
    found
}

/// Without a subreaper, orphans are not ours: the only child is the
/// command, reached through its group.
#[cfg(not(target_os = "linux"))]
fn direct_children() -> Vec<libc::pid_t> {
    Vec::new()
}

#[cfg(target_os = "linux")]
fn become_subreaper() {
    // Fails only on kernels older than 3.4; the group is still signalled.
    // SAFETY: prctl with these arguments has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() {}

/// A socket that gets a byte on SIGCHLD, SIGTERM, SIGINT and SIGHUP, so
/// that one `poll` waits for them and for `work`.
fn wake_on_signals() -> std::io::Result<UnixStream> {
    let (read, write) = UnixStream::pair()?;
    read.set_nonblocking(true)?;
    // The flag first: actions run in the order they were registered, and
    // the flag must be set when the wake-up is read.
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::flag::register(signal, &STOP_SIGNALLED)?;
    }
    for signal in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        signal_hook::low_level::pipe::register(signal, write.try_clone()?)?;
    }
    Ok(read)
}

/// Waits up to `timeout` for a signal or for `control`; true if `control`
/// is readable (a message, end-of-file or an error).
fn wait_for_event(control: Option<&UnixStream>, wake: &UnixStream, timeout: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            // poll skips a negative fd.
            fd: control.map_or(-1, AsRawFd::as_raw_fd),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // Rounded up: a timeout rounded down to 0 would spin until it passes.
    let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fds` is a valid array of two pollfd, alive for the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    let mut drain = [0u8; 64];
    while matches!((&*wake).read(&mut drain), Ok(n) if n > 0) {}
    ready > 0 && fds[1].revents != 0
}

enum Control {
    Nothing,
    Stop,
    Kill,
    /// End-of-file or an error: `work` is gone.
    Gone,
}

fn read_control(control: &mut UnixStream) -> Control {
    let mut buf = [0u8; 16];
    match control.read(&mut buf) {
        Ok(0) => Control::Gone,
        Ok(n) if buf[..n].contains(&KILL) => Control::Kill,
        Ok(n) if buf[..n].contains(&STOP) => Control::Stop,
        Ok(_) => Control::Nothing,
        Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {
            Control::Nothing
        }
        Err(_) => Control::Gone,
    }
}

/// Tells `work` why the command could not start, and exits.
fn cannot_run(control: &mut UnixStream, e: &std::io::Error) -> ! {
    let class = match e.kind() {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => CANNOT_RUN_PERMANENT,
        _ => CANNOT_RUN_RETRY,
    };
    let mut report = vec![class];
    report.extend_from_slice(e.to_string().as_bytes());
    let _ = control.write_all(&report);
    std::process::exit(CANNOT_RUN_EXIT)
}

/// Makes the kernel SIGKILL the command if the supervisor dies first
/// (it is SIGKILLed itself, say): the command, at least, does not run on
/// unsupervised. Tied to the spawning thread, which is this process's only
/// one.
#[cfg(target_os = "linux")]
fn die_with_supervisor(command: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let supervisor = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl, getppid and _exit, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor may have died between fork and prctl.
            if libc::getppid() != supervisor {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_supervisor(_command: &mut Command) {}

/// Exits with the command's exit code, or dies by the signal that killed
/// it, so that `work` reads the command's own status.
fn exit_like(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls on values owned here; the process is
        // single-threaded, so nothing installs a handler in between.
        unsafe {
            // The command's core file, if any, is the one worth having.
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
        // A signal whose default action is not to end the process.
        std::process::exit(128 + signal);
    }
    std::process::exit(libc::WEXITSTATUS(status))
}
