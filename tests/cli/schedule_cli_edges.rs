//! `tickler schedule …` at the edges: the overlap policy on `add` and
//! `list`, and a bounded `schedule next -n <huge>`.

use crate::support::cli;

use cli::Env;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;
use tickler::OverlapPolicy;

#[test]
fn add_takes_an_overlap_policy_and_list_shows_it_with_the_skipped_count() {
    let env = Env::new();
    env.run(&["schedule", "add", "backup", "30 2 * * *", "backup"])
        .ok();
    env.run(&[
        "schedule",
        "add",
        "poll",
        "*/5 * * * *",
        "poll",
        "--overlap",
        "allow",
    ])
    .ok();
    env.run(&[
        "schedule",
        "add",
        "report",
        "0 9 * * *",
        "report",
        "--overlap",
        "replace",
    ])
    .ok();
    let queue = env.queue();
    assert_eq!(
        queue.get_schedule("backup").unwrap().overlap,
        OverlapPolicy::Forbid
    );
    assert_eq!(
        queue.get_schedule("poll").unwrap().overlap,
        OverlapPolicy::Allow
    );
    assert_eq!(
        queue.get_schedule("report").unwrap().overlap,
        OverlapPolicy::Replace
    );
    drop(queue);

    let out = env.run(&["schedule", "list"]).ok();
    let header = out.lines().next().unwrap();
    assert!(header.contains("OVERLAP"), "{out}");
    assert!(header.contains("SKIPPED"), "{out}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {out}"))
            .to_owned()
    };
    assert!(line("backup").contains("forbid"), "{out}");
    assert!(line("poll").contains("allow"), "{out}");
    assert!(line("report").contains("replace"), "{out}");

    let json = env.run(&["schedule", "list", "--json"]).ok();
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["name"], "backup");
    assert_eq!(first["overlap"], "forbid");
    assert_eq!(first["skipped_ticks"], 0);
}

#[test]
fn an_unknown_overlap_policy_is_a_usage_error() {
    let env = Env::new();
    let run = env.run(&[
        "schedule",
        "add",
        "s",
        "* * * * *",
        "k",
        "--overlap",
        "queue",
    ]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("forbid"), "{run:#?}");
    assert!(!env.db.exists() || env.queue().list_schedules().unwrap().is_empty());
}

#[test]
fn add_refuses_an_out_of_range_value_naming_the_field() {
    let env = Env::new();
    env.run(&["schedule", "add", "s", "0 24 * * *", "k"])
        .fails(2, &["hour 24 is out of range 0-23"]);
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The bug: `schedule next -n 1000000000000` collected every tick before
/// printing and grew without bound (661 MB in 8 s). Now the ticks stream:
/// the first ones come at once and memory stays flat.
#[test]
fn next_with_a_huge_count_streams_in_bounded_memory() {
    let env = Env::new();
    let mut child = env
        .command(&["schedule", "next", "* * * * * *", "-n", "1000000000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for _ in 0..20_000 {
            match lines.next() {
                Some(Ok(line)) => {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
        // Dropping the pipe here makes the writer stop.
    });
    let mut seen = 0usize;
    let mut peak = 0u64;
    while seen < 20_000 {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(_) => seen += 1,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if let Some(rss) = rss_kib(pid) {
            peak = peak.max(rss);
            assert!(
                rss < 200 * 1024,
                "schedule next grew to {rss} KiB after {seen} lines"
            );
        }
    }
    assert_eq!(seen, 20_000, "the ticks did not stream");
    reader.join().unwrap();
    // With its reader gone the command ends by itself, as `| head` wants
    // (the CLI takes SIGPIPE's default action, like other Unix tools).
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}"
    );
    assert!(peak < 200 * 1024);
}

#[test]
fn next_prints_the_asked_number_of_ticks() {
    let env = Env::new();
    let out = env
        .run(&["schedule", "next", "0 1/3 * * *", "-n", "3", "--utc"])
        .ok();
    assert_eq!(out.lines().count(), 3, "{out}");
}
