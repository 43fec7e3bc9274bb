//! Two schedulers in two OS processes on one file, over 200 ticks of a
//! per-second schedule, enqueue exactly 200 jobs.
//!
//! Each child process re-runs this test binary on `child_scheduler` with
//! the database path in an environment variable. Both walk their own manual
//! clock over the same 200 seconds, one second at a time, firing due ticks
//! after each step, racing each other for every tick.

use crate::support::engine;
use crate::support::schedule;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use schedule::{piling, queue_at, run_ats, temp_db, utc};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CHILD_DB: &str = "TICKLER_SCHEDULE_CHILD_DB";
const TICKS: i64 = 200;

fn t0() -> DateTime<Utc> {
    utc(2026, 7, 1, 12, 0, 0)
}

fn go_file(db: &str) -> PathBuf {
    PathBuf::from(format!("{db}.go"))
}

contract! {
/// Runs only as a child process (the variable is set); a no-op otherwise.
fn child_scheduler() {
    let Ok(db) = std::env::var(CHILD_DB) else {
        return;
    };
    let (queue, clock) = queue_at(db.as_ref(), t0());
    // Start together with the other child.
    let waiting = Instant::now();
    while !go_file(&db).exists() {
        assert!(waiting.elapsed() < Duration::from_secs(20), "no go signal");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut enqueued = 0;
    for second in 1..=TICKS {
        clock.set(t0() + ChronoDuration::seconds(second));
        enqueued += queue.manual().run_due_ticks().unwrap().jobs.len();
        if fastrand::bool() {
            std::thread::yield_now();
        }
    }
    println!("\nCHILD-ENQUEUED {enqueued}");
}
}

contract! {
fn two_processes_enqueue_each_tick_of_a_per_second_schedule_once() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, t0() + ChronoDuration::milliseconds(500));
    // Every tick is on time whatever the children's clocks read: when one
    // child stalls holding the schedule's row and the other walks its clock
    // on past the default 60 s grace, the one ahead rightly takes the ticks
    // not yet fired for misfires, and this test is about each tick firing
    // once, not about misfires.
    let stored = queue
        .upsert_schedule(
            piling("every-second", "* * * * * *", "tick").misfire_grace(Duration::from_secs(3600)),
        )
        .unwrap();
    assert_eq!(stored.next_tick_at, Some(t0() + ChronoDuration::seconds(1)));
    let db = path.to_str().unwrap().to_owned();
    // The same case of the child body as this one (its engine's).
    let children: Vec<_> = (0..2)
        .map(|_| {
            engine::child_case(module_path!(), "child_scheduler")
                .env(CHILD_DB, &db)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(go_file(&db), b"go").unwrap();
    let mut per_child = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let count: usize = stdout
            .lines()
            .find_map(|l| l.split_once("CHILD-ENQUEUED ").map(|(_, n)| n))
            .unwrap_or_else(|| panic!("child printed no count: {stdout}"))
            .trim()
            .parse()
            .unwrap();
        per_child.push(count);
    }
    let fired = run_ats(&queue, "tick");
    let expected: Vec<_> = (1..=TICKS)
        .map(|s| t0() + ChronoDuration::seconds(s))
        .collect();
    assert_eq!(fired.len(), 200, "per child: {per_child:?}");
    let mut sorted = fired.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
    assert_eq!(per_child.iter().sum::<usize>(), 200, "{per_child:?}");
    println!("ticks enqueued per process: {per_child:?}");
}
}
