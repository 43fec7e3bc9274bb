//! A shell job's whole process tree stops with it: on cancel, on timeout,
//! when `tickler work` is killed with SIGKILL, on shutdown (graceful and
//! hard), and when the command exits leaving processes behind. The tree
//! of every test holds a background process, a pipeline and a process in
//! a session of its own (out of the command's process group, which a kill
//! of the group misses); some trees ignore SIGTERM. The next job with the
//! same unique key, and the retry, start only after the old tree exited.
//! Linux only: the subreaper and /proc; see `shell.rs` for other systems.
#![cfg(target_os = "linux")]

use crate::support::cli;

use cli::{eventually, processes_with_env, signal, wait_for, Env, Run};
use std::cell::RefCell;
use std::process::Child;
use std::time::Duration;
use tickler::{JobId, JobState};

/// The variable that marks every process of a test's tree: each process
/// inherits it, wherever it moves.
const MARK: &str = "TICKLER_TEST_TREE";

/// `sh tree.sh MODE NAME`, run in the queue's folder.
const TREE_SH: &str = r#"
# tree: record each pid in NAME.pids, then write NAME.ready and wait.
# TREE_TERM=ignore: every process ignores SIGTERM (the ignoring is
# inherited). TREE_TERM=record: the shell writes NAME.term on SIGTERM and
# exits; its children keep the default action.
# check: write "left:" and the pids of NAME.pids still alive to NAME.check.
# retry: tree on the first run, check on the later ones (runs, not
# attempts: a run killed before its start was recorded gives its attempt
# back).
# leave: start the same children, then exit 0 without waiting for them.
name=$2
exec > /dev/null
children() {
  sleep 60 &
  echo $! >> "$name.pids"
  sh -c 'echo $$ >> "$0.pids"; exec sleep 61' "$name" | sh -c 'echo $$ >> "$0.pids"; exec sleep 62' "$name" &
  setsid sh -c 'echo $$ >> "$0.pids"; exec sleep 63' "$name" &
  while [ "$(wc -l < "$name.pids")" -lt 5 ]; do sleep 0.01; done
  echo ready > "$name.ready"
}
tree() {
  case "$TREE_TERM" in
    ignore) trap '' TERM ;;
    record) trap 'echo TERM >> "$name.term"; exit 143' TERM ;;
  esac
  echo $$ >> "$name.pids"
  children
  wait
}
check() {
  left=
  for p in $(cat "$name.pids"); do
    if [ -r "/proc/$p/stat" ] && ! grep -q ') [ZX] ' "/proc/$p/stat"; then
      left="$left $p"
    fi
  done
  echo "left:$left" > "$name.check"
}
case "$1" in
  tree) tree ;;
  check) check ;;
  retry) if [ ! -e "$name.ran" ]; then : > "$name.ran"; tree; else check; fi ;;
  leave) echo $$ >> "$name.pids"; children; exit 0 ;;
esac
"#;

/// Flags that make retries and reaps quick.
const FAST: &[&str] = &[
    "--backoff",
    "10ms",
    "--backoff-cap",
    "20ms",
    "--reap-interval",
    "100ms",
    "--quiet",
];

/// A `tickler work` that is killed if the test ends before it (a failed
/// assertion), so that it does not run on.
struct Worker(Option<Child>);

impl Worker {
    fn signal(&self, sig: i32) {
        signal(self.0.as_ref().expect("running"), sig);
    }

    /// SIGKILL, and reaped.
    fn kill(&mut self) {
        let child = self.0.as_mut().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn wait(mut self, limit: Duration) -> Run {
        wait_for(self.0.take().expect("running"), limit)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // Not reaped yet, so the pid is still this child's.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A queue folder with `tree.sh`. Its drop kills whatever the trees left,
/// so a failing test leaves no processes behind.
struct Trees {
    env: Env,
    marks: RefCell<Vec<String>>,
}

impl Trees {
    fn new() -> Trees {
        let env = Env::new();
        std::fs::write(env.dir.path().join("tree.sh"), TREE_SH).unwrap();
        Trees {
            env,
            marks: RefCell::new(Vec::new()),
        }
    }

    /// Unique on the machine: the folder is.
    fn mark(&self, name: &str) -> String {
        format!("{}/{name}", self.env.dir.path().display())
    }

    /// Enqueues `sh tree.sh MODE NAME` with the tree's mark in its
    /// environment, `TREE_TERM=term`, and `payload` merged in.
    fn enqueue(
        &self,
        mode: &str,
        name: &str,
        term: &str,
        payload: serde_json::Value,
        args: &[&str],
    ) -> JobId {
        let mark = self.mark(name);
        self.marks.borrow_mut().push(mark.clone());
        let mut full = serde_json::json!({
            "argv": ["sh", "tree.sh", mode, name],
            "env": {MARK: mark, "TREE_TERM": term},
        });
        if let serde_json::Value::Object(extra) = payload {
            full.as_object_mut().unwrap().extend(extra);
        }
        let full = full.to_string();
        let mut all = vec!["shell", full.as_str()];
        all.extend_from_slice(args);
        self.env.enqueue(&all)
    }

    fn work(&self, extra: &[&str]) -> Worker {
        let mut args = vec!["work"];
        args.extend_from_slice(FAST);
        args.extend_from_slice(extra);
        Worker(Some(self.env.spawn(&args)))
    }

    fn wait_ready(&self, name: &str) {
        let ready = self.env.dir.path().join(format!("{name}.ready"));
        eventually(Duration::from_secs(30), "the tree to start", || {
            ready.exists()
        });
    }

    /// Live processes of the tree (the supervisor too, which has the
    /// command's environment).
    fn left(&self, name: &str) -> Vec<i32> {
        processes_with_env(MARK, &self.mark(name))
    }

    fn file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.env.dir.path().join(name)).ok()
    }
}

impl Drop for Trees {
    fn drop(&mut self) {
        for mark in self.marks.borrow().iter() {
            for pid in processes_with_env(MARK, mark) {
                // SAFETY: kill(2) on a process of this test's own tree.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

#[test]
fn a_cancel_stops_the_whole_tree_before_the_next_job_with_its_key_starts() {
    let t = Trees::new();
    let first = t.enqueue(
        "tree",
        "first",
        "record",
        serde_json::json!({}),
        &["--unique-key", "nightly", "--max-attempts", "1"],
    );
    let worker = t.work(&["--lease", "2s"]);
    t.wait_ready("first");

    t.env.run(&["cancel", &first.to_string()]).ok();
    let next = t.env.enqueue_shell(
        &["sh", "tree.sh", "check", "first"],
        &["--unique-key", "nightly"],
    );
    assert_ne!(next, first);
    eventually(Duration::from_secs(30), "the next job to run", || {
        t.env.job(next).state == JobState::Succeeded
    });
    assert_eq!(
        t.file("first.check").unwrap().trim(),
        "left:",
        "processes of the cancelled job's tree were alive when the next job with its key started"
    );
    assert_eq!(t.left("first"), Vec::<i32>::new());
    assert_eq!(t.env.job(first).state, JobState::Cancelled);
    // SIGKILL at once: once the lease is lost, its expiry may hand the key
    // on, so there is no time for a grace.
    assert_eq!(t.file("first.term"), None);

    worker.signal(libc::SIGTERM);
    assert_eq!(worker.wait(Duration::from_secs(30)).code, 0);
}

/// One job times out by its payload's timeout (the shell handler's own
/// clock), one by the job's timeout (the pool's): SIGTERM first, then
/// SIGKILL for a tree that ignores it, and the outcome is recorded only
/// once the tree is gone.
#[test]
fn a_timeout_stops_the_whole_tree_sigterm_first_then_sigkill() {
    let t = Trees::new();
    let stubborn = t.enqueue(
        "tree",
        "stubborn",
        "ignore",
        serde_json::json!({"timeout": "2s"}),
        &["--max-attempts", "1"],
    );
    let polite = t.enqueue(
        "tree",
        "polite",
        "record",
        serde_json::json!({}),
        &["--timeout", "2s", "--max-attempts", "1"],
    );
    let worker = t.work(&["--lease", "2s", "--threads", "2"]);
    let mut waiting = vec![("stubborn", stubborn), ("polite", polite)];
    let mut found_left = Vec::new();
    eventually(Duration::from_secs(60), "both jobs to time out", || {
        waiting.retain(|(name, id)| {
            if t.env.job(*id).state != JobState::Dead {
                return true;
            }
            // At once: the outcome must come after the tree is gone.
            found_left.push((*name, t.left(name)));
            false
        });
        waiting.is_empty()
    });
    for (name, left) in found_left {
        assert_eq!(left, Vec::<i32>::new(), "{name}: processes left");
    }
    for (name, id) in [("stubborn", stubborn), ("polite", polite)] {
        assert!(
            t.file(&format!("{name}.ready")).is_some(),
            "{name}: the tree was not up before its timeout"
        );
        let error = t.env.job(id).last_error.unwrap();
        assert!(
            error.starts_with("timed out after 2s; the command was killed"),
            "{name}: {error}"
        );
    }
    assert_eq!(
        t.file("polite.term").as_deref(),
        Some("TERM\n"),
        "the command gets SIGTERM before SIGKILL"
    );

    worker.signal(libc::SIGTERM);
    assert_eq!(worker.wait(Duration::from_secs(30)).code, 0);
}

#[test]
fn a_killed_worker_takes_the_whole_tree_with_it_and_the_retry_starts_after() {
    let t = Trees::new();
    let id = t.enqueue(
        "retry",
        "killed",
        "ignore",
        serde_json::json!({}),
        &["--max-attempts", "2"],
    );
    let mut worker = t.work(&["--lease", "1s"]);
    t.wait_ready("killed");
    worker.kill();

    // At once, while the old tree may still be going: the retry must not
    // start before it is gone.
    let run = t
        .work(&["--lease", "1s", "--drain"])
        .wait(Duration::from_secs(60));
    assert_eq!(run.code, 0, "{run:#?}");
    let job = t.env.job(id);
    assert_eq!(job.state, JobState::Succeeded, "{job:#?}");
    // 1 if the killed run's start was not recorded yet (given back), else 2.
    assert!((1..=2).contains(&job.attempts), "{job:#?}");
    assert_eq!(
        t.file("killed.check").unwrap().trim(),
        "left:",
        "processes of the killed worker's tree were alive when the retry started"
    );
    eventually(
        Duration::from_secs(10),
        "the tree to die with its worker",
        || t.left("killed").is_empty(),
    );
}

#[test]
fn a_graceful_shutdown_stops_the_whole_tree_sigterm_first() {
    let t = Trees::new();
    let id = t.enqueue(
        "tree",
        "graceful",
        "record",
        serde_json::json!({}),
        &["--max-attempts", "5"],
    );
    let worker = t.work(&["--lease", "2s", "--grace", "200ms"]);
    t.wait_ready("graceful");
    worker.signal(libc::SIGTERM);
    let run = worker.wait(Duration::from_secs(30));
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(t.left("graceful"), Vec::<i32>::new());
    assert_eq!(t.file("graceful.term").as_deref(), Some("TERM\n"));
    let job = t.env.job(id);
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
}

#[test]
fn a_second_signal_stops_the_whole_tree_at_once() {
    let t = Trees::new();
    let id = t.enqueue(
        "tree",
        "hard",
        "ignore",
        serde_json::json!({}),
        &["--max-attempts", "5"],
    );
    let worker = t.work(&["--lease", "2s", "--grace", "60s"]);
    t.wait_ready("hard");
    worker.signal(libc::SIGINT);
    worker.signal(libc::SIGTERM);
    let run = worker.wait(Duration::from_secs(30));
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(t.left("hard"), Vec::<i32>::new());
    let job = t.env.job(id);
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
}

#[test]
fn what_a_finished_command_left_running_is_stopped_before_its_outcome() {
    let t = Trees::new();
    let id = t.enqueue(
        "leave",
        "leaver",
        "default",
        serde_json::json!({}),
        &["--max-attempts", "1"],
    );
    let worker = t.work(&["--lease", "2s"]);
    let mut left = None;
    eventually(Duration::from_secs(30), "the job to succeed", || {
        if t.env.job(id).state != JobState::Succeeded {
            return false;
        }
        left = Some(t.left("leaver"));
        true
    });
    assert!(t.file("leaver.ready").is_some());
    assert_eq!(left.unwrap(), Vec::<i32>::new());
    worker.signal(libc::SIGTERM);
    assert_eq!(worker.wait(Duration::from_secs(30)).code, 0);
}

/// The parent process id of `pid` (field 4 of `/proc/PID/stat`).
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// systemd's default `KillMode=control-group` stops a service by sending
/// SIGTERM to every process of its cgroup at once: `work`, each
/// supervisor and each command. The command then dies of the signal
/// before `work` asks anything; that is not the job's fault, and the job
/// is handed back without using an attempt, as a shutdown does.
#[test]
fn a_sigterm_to_every_process_at_once_hands_the_job_back_without_an_attempt() {
    let t = Trees::new();
    let id = t.enqueue(
        "tree",
        "cgroup",
        "default",
        serde_json::json!({}),
        &["--max-attempts", "5"],
    );
    let worker = t.work(&["--lease", "2s", "--grace", "60s"]);
    t.wait_ready("cgroup");
    let shell: i32 = t
        .file("cgroup.pids")
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let supervisor = parent_of(shell);
    worker.signal(libc::SIGTERM);
    for pid in [supervisor, shell] {
        // SAFETY: kill(2) on processes this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let run = worker.wait(Duration::from_secs(30));
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(t.left("cgroup"), Vec::<i32>::new());
    let job = t.env.job(id);
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Pending, 0),
        "a stop of the whole service used an attempt: {job:#?}"
    );
}

/// A stopped `work` (SIGSTOP, Ctrl-Z, a debugger) renews no lease, so its
/// job may run again elsewhere: its command is stopped with it, so that
/// the two copies never run side by side, and goes on when `work` does.
#[test]
fn a_stopped_worker_stops_its_command_too() {
    let env = Env::new();
    let ticks = env.dir.path().join("ticks");
    let script = format!(
        "for i in $(seq 1 100); do echo $i >> '{}'; sleep 0.02; done",
        ticks.display()
    );
    env.enqueue_shell(&["sh", "-c", &script], &[]);
    let worker = env.spawn(&["work", "--drain", "--lease", "1h", "--quiet"]);
    let lines = || {
        std::fs::read_to_string(&ticks)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    eventually(Duration::from_secs(30), "the command to tick", || {
        lines() >= 3
    });
    signal(&worker, libc::SIGSTOP);
    // Followed within a look of the supervisor (200 ms): then no tick.
    std::thread::sleep(Duration::from_millis(1_000));
    let frozen = lines();
    std::thread::sleep(Duration::from_millis(1_000));
    let still = lines();
    signal(&worker, libc::SIGCONT);
    assert_eq!(
        frozen, still,
        "the command ran on while its worker was stopped"
    );
    assert!(
        frozen < 100,
        "the command finished before the test stopped it"
    );
    let run = wait_for(worker, Duration::from_secs(60));
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(lines(), 100);
}
