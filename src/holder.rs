//! Who holds a lease: this process, named precisely enough that another
//! process of the same machine can tell that the holder is gone, and take
//! its leases back at once instead of waiting for them to run out.
//!
//! A claim writes the claiming process's [`Holder`] beside the lease. When
//! a queue opens, and at each pass of the background reaper, leases whose
//! holder is a process of this machine that no longer exists (or a
//! process of an earlier boot of this machine) are taken back at once, by
//! the reaper's own fenced statements. Leases of other machines, of other
//! PID namespaces (containers) and of holders this process cannot judge
//! wait for their expiry as before.
//!
//! A holder is judged gone only on Linux (`/proc`): elsewhere every lease
//! waits for its expiry.
//!
//! What a holder is made of, and why each part:
//! - **machine**: `/etc/machine-id` (stable across reboots) and the host
//!   name. Leases of another machine are never judged.
//! - **boot**: the kernel's boot id and when this boot began. A holder of
//!   an earlier boot is gone, but only if its lease was last renewed
//!   before this boot began: two machines that share a machine id (a
//!   cloned image) and a host name never take each other's live leases.
//! - **PID and network namespaces**: a process id means something only
//!   within its PID namespace (containers on one kernel share the boot id
//!   but not the namespace), and the mark below is seen only from within
//!   its network namespace. A holder of other namespaces is not judged.
//! - **process id and start time** (in clock ticks since boot): a process
//!   id that the kernel gave to an unrelated process since is not mistaken
//!   for the holder.
//! - **a mark**: an abstract Unix socket that the holder binds, which a
//!   child process may inherit ([`pass_to`]); while any process keeps it
//!   open the holder is not gone, so a child that outlives a killed holder
//!   (a shell command's supervisor that is still stopping the command's
//!   processes) keeps the job from starting again beside it.

use std::fmt;
use std::sync::OnceLock;

/// The identity a lease records of the process holding it. Written as one
/// line of text (`Display`); see the module docs for its parts.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Machine id and host name.
    pub machine: String,
    /// The kernel's boot id (empty where unknown).
    pub boot: String,
    /// When this boot began, ms since the Unix epoch (0 where unknown).
    pub booted_at_ms: i64,
    /// The PID namespace (empty where unknown).
    pub pid_ns: String,
    /// The network namespace (empty where unknown): the mark, an abstract
    /// socket, is seen only from within it.
    pub net_ns: String,
    /// The process id.
    pub pid: u32,
    /// The process's start, in clock ticks since boot (0 where unknown).
    pub start: u64,
}

/// The text's first field: a later format can be told apart.
const FORMAT: &str = "h1";

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{FORMAT}|{}|{}|{}|{}|{}|{}|{}",
            self.machine,
            self.boot,
            self.booted_at_ms,
            self.pid_ns,
            self.net_ns,
            self.pid,
            self.start
        )
    }
}

impl Holder {
    /// The holder text of `self`'s machine, up to and including the
    /// separator after it: the prefix every lease of this machine starts
    /// with.
    pub(crate) fn machine_prefix(&self) -> String {
        format!("{FORMAT}|{}|", self.machine)
    }

    fn parse(text: &str) -> Option<Holder> {
        let mut parts = text.split('|');
        if parts.next()? != FORMAT {
            return None;
        }
        let holder = Holder {
            machine: parts.next()?.to_owned(),
            boot: parts.next()?.to_owned(),
            booted_at_ms: parts.next()?.parse().ok()?,
            pid_ns: parts.next()?.to_owned(),
            net_ns: parts.next()?.to_owned(),
            pid: parts.next()?.parse().ok()?,
            start: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(holder)
    }

    /// This process. Also binds its mark, once.
    pub fn this_process() -> Holder {
        static THIS: OnceLock<Holder> = OnceLock::new();
        THIS.get_or_init(|| {
            let holder = os::this_process();
            os::bind_mark(&holder);
            holder
        })
        .clone()
    }

    /// Whether the process that `text` names (a lease's holder, last
    /// renewed at `renewed_ms`, by the clock leases are written with) is
    /// known to be gone, judged from `self`, a process of this machine.
    /// `false` whenever it cannot be told.
    pub(crate) fn sees_gone(&self, text: &str, renewed_ms: i64) -> bool {
        let Some(other) = Holder::parse(text) else {
            return false;
        };
        if other.machine != self.machine || self.boot.is_empty() || other.boot.is_empty() {
            return false;
        }
        if other.boot != self.boot {
            // An earlier boot of this machine ended before this one began;
            // a holder seen alive since then is another machine.
            return self.booted_at_ms > 0 && renewed_ms < self.booted_at_ms;
        }
        // Process ids mean something only within one PID namespace, and
        // the mark is seen only from within its network namespace.
        if other.pid_ns.is_empty()
            || other.pid_ns != self.pid_ns
            || other.net_ns.is_empty()
            || other.net_ns != self.net_ns
        {
            return false;
        }
        if other.pid == self.pid && other.start == self.start {
            return false;
        }
        os::process_gone(&other)
    }
}

/// The number a lease stores for the holder `text` (its row in
/// `tickler_holders` has the text): a 63-bit FNV-1a hash, so that every
/// process computes it alike and a claim writes 8 bytes, not the text
/// (the text in every claimed row cost a third of a burn-down's speed).
pub(crate) fn holder_id(text: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash >> 1) as i64
}

/// The variable [`pass_to`] sets in the child's environment: the number of
/// its file descriptor holding the mark.
pub const MARK_FD_VAR: &str = "TICKLER_HOLDER_MARK_FD";

/// Makes the child that `command` starts inherit this process's mark, so
/// that while the child lives, this process's leases are not taken back
/// early by another process of the machine, even after this process died
/// (they still run out as usual). For a child that must outlive this
/// process briefly to stop what it started: the leases' jobs start again
/// only after it exited (or closed the mark, which it receives as an open
/// file descriptor whose number is in the `TICKLER_HOLDER_MARK_FD`
/// variable). Does nothing where holders are not judged (outside Linux).
pub fn pass_to(command: &mut std::process::Command) {
    os::pass_mark(command);
}

#[cfg(target_os = "linux")]
mod os {
    use super::Holder;
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    use std::os::unix::process::CommandExt;
    use std::sync::OnceLock;

    static MARK: OnceLock<UnixListener> = OnceLock::new();

    fn read(path: &str) -> String {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// What `/proc/PID/stat` says of a process.
    enum Seen {
        /// Running (or sleeping, stopped…), started at this many clock
        /// ticks after boot (field 22).
        Started(u64),
        /// Exited: a zombie (state `Z`, a killed process its parent has
        /// not waited for yet) or dead (`X`); it runs nothing any more.
        Exited,
        /// No entry: no such process, or one that `/proc` hides from this
        /// user (mounted with `hidepid`).
        Absent,
    }

    fn seen(pid: u32) -> Seen {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return Seen::Absent;
        };
        // After the parenthesised command name, which may hold spaces and
        // parentheses.
        let Some(close) = stat.rfind(')') else {
            return Seen::Absent;
        };
        let mut fields = stat[close + 1..].split_whitespace();
        match fields.next() {
            Some("Z" | "X") => Seen::Exited,
            Some(_) => fields
                .nth(18)
                .and_then(|v| v.parse().ok())
                .map_or(Seen::Absent, Seen::Started),
            None => Seen::Absent,
        }
    }

    fn start_of(pid: u32) -> Option<u64> {
        match seen(pid) {
            Seen::Started(start) => Some(start),
            Seen::Exited | Seen::Absent => None,
        }
    }

    /// Whether a process with this id exists, as `kill(pid, 0)` tells
    /// (also one `/proc` hides: the answer is then "not permitted").
    fn exists(pid: u32) -> bool {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 sends nothing; it only checks the process.
        let sent = unsafe { libc::kill(pid, 0) };
        sent == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    pub(super) fn this_process() -> Holder {
        let mut machine = read("/etc/machine-id");
        if machine.is_empty() {
            machine = read("/var/lib/dbus/machine-id");
        }
        let host = read("/proc/sys/kernel/hostname");
        let machine = format!("{machine}@{host}").replace('|', "_");
        let booted_at_ms = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<i64>().ok())
            })
            .map_or(0, |s| s.saturating_mul(1000));
        let namespace = |kind: &str| {
            std::fs::read_link(format!("/proc/self/ns/{kind}"))
                .map(|p| p.to_string_lossy().replace('|', "_"))
                .unwrap_or_default()
        };
        let pid = std::process::id();
        Holder {
            machine,
            boot: read("/proc/sys/kernel/random/boot_id").replace('|', "_"),
            booted_at_ms,
            pid_ns: namespace("pid"),
            net_ns: namespace("net"),
            pid,
            start: start_of(pid).unwrap_or(0),
        }
    }

    fn mark_name(holder: &Holder) -> String {
        format!(
            "tickler-holder|{}|{}|{}",
            holder.boot, holder.pid, holder.start
        )
    }

    fn mark_address(holder: &Holder) -> Option<SocketAddr> {
        SocketAddr::from_abstract_name(mark_name(holder).as_bytes()).ok()
    }

    pub(super) fn bind_mark(holder: &Holder) {
        if let Some(listener) = mark_address(holder).and_then(|a| UnixListener::bind_addr(&a).ok())
        {
            let _ = MARK.set(listener);
        }
    }

    /// Gone: no process with the holder's id and start time, and no
    /// process keeps its mark.
    pub(super) fn process_gone(holder: &Holder) -> bool {
        match seen(holder.pid) {
            Seen::Started(start) if start == holder.start => return false,
            // Another process has the id now, or the holder exited.
            Seen::Started(_) | Seen::Exited => {}
            // A process `/proc` does not show may still be the holder:
            // "cannot tell" is never "gone".
            Seen::Absent if exists(holder.pid) => return false,
            Seen::Absent => {}
        }
        // Binding the mark's name succeeds only if nobody holds it; the
        // probe lets go of it at once.
        match mark_address(holder) {
            Some(address) => UnixListener::bind_addr(&address).is_ok(),
            None => true,
        }
    }

    pub(super) fn pass_mark(command: &mut std::process::Command) {
        let _ = Holder::this_process();
        let Some(mark) = MARK.get() else { return };
        let fd = mark.as_raw_fd();
        command.env(super::MARK_FD_VAR, fd.to_string());
        // SAFETY: between fork and exec only async-signal-safe calls are
        // allowed; fcntl is one.
        unsafe {
            command.pre_exec(move || {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use super::Holder;

    pub(super) fn this_process() -> Holder {
        let host = std::env::var("HOSTNAME")
            .or_else(|_| std::env::var("COMPUTERNAME"))
            .unwrap_or_default()
            .replace('|', "_");
        Holder {
            machine: host,
            boot: String::new(),
            booted_at_ms: 0,
            pid_ns: String::new(),
            net_ns: String::new(),
            pid: std::process::id(),
            start: 0,
        }
    }

    pub(super) fn bind_mark(_: &Holder) {}

    pub(super) fn process_gone(_: &Holder) -> bool {
        false
    }

    pub(super) fn pass_mark(_: &mut std::process::Command) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_reads_back_as_written() {
        let me = Holder::this_process();
        assert_eq!(Holder::parse(&me.to_string()), Some(me.clone()));
        assert!(me.to_string().starts_with(&me.machine_prefix()));
        assert_eq!(Holder::parse("h2|a|b|1|c|d|2|3"), None);
        assert_eq!(Holder::parse("h1|a|b|1|c|d|2|3|4"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn judges_only_what_it_can_tell() {
        let me = Holder::this_process();
        assert!(!me.boot.is_empty() && me.start > 0 && me.booted_at_ms > 0);
        let now = me.booted_at_ms + 1_000_000;
        // Itself, alive.
        assert!(!me.sees_gone(&me.to_string(), now));
        // Another machine, whatever it looks like.
        let other_machine = Holder {
            machine: "elsewhere".into(),
            pid: 1 << 30,
            ..me.clone()
        };
        assert!(!me.sees_gone(&other_machine.to_string(), now));
        // An earlier boot: gone if last renewed before this boot began,
        // not if renewed since (another machine with the same identity).
        let earlier_boot = Holder {
            boot: "an-earlier-boot".into(),
            ..me.clone()
        };
        assert!(me.sees_gone(&earlier_boot.to_string(), me.booted_at_ms - 1));
        assert!(!me.sees_gone(&earlier_boot.to_string(), me.booted_at_ms + 1));
        // Another PID or network namespace: cannot tell.
        let container = Holder {
            pid_ns: "pid:[1]".into(),
            pid: 1 << 30,
            ..me.clone()
        };
        assert!(!me.sees_gone(&container.to_string(), now));
        let other_network = Holder {
            net_ns: "net:[1]".into(),
            pid: 1 << 30,
            ..me.clone()
        };
        assert!(!me.sees_gone(&other_network.to_string(), now));
        // A process id no process has.
        let vanished = Holder {
            pid: 1 << 30,
            ..me.clone()
        };
        assert!(me.sees_gone(&vanished.to_string(), now));
        // Unreadable text: cannot tell.
        assert!(!me.sees_gone("worker-7", now));
    }
}
