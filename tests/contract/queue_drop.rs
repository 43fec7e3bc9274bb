//! A dropped `Queue` leaves nothing behind in the process: an application
//! that opens and closes queues (a desktop app per document, a CLI, a test
//! suite) must not collect threads or open files. Threads and files are
//! counted for the whole process, so the count runs in a child process of
//! its own (this test binary, given only that case), where no other test
//! runs beside it.

use crate::support::common;

use std::process::Stdio;
use std::time::{Duration, Instant};
use tickler::{JobState, NewJob, Queue};

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .count()
}

fn threads() -> usize {
    count_entries("/proc/self/task")
}

fn open_files() -> usize {
    count_entries("/proc/self/fd")
}

/// Set in the child process that does the counting.
const CHILD_ENV: &str = "TICKLER_TEST_QUEUE_DROP_CHILD";
const CHILD_TEST: &str = "count_in_a_process_of_its_own";

contract! {
fn dropping_queues_stops_their_threads_and_closes_their_files() {
    let out = crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the counting child");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the counting child failed:\n{output}");
    // A filter that matched nothing would pass without counting.
    assert!(
        output.contains("1 passed"),
        "the counting child ran no test:\n{output}"
    );
}
}

contract! {
/// The child side: a no-op unless `TICKLER_TEST_QUEUE_DROP_CHILD` is set.
fn count_in_a_process_of_its_own() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drop.db");
    // The first open creates the file; measure from an open file onwards.
    let path = common::engine::target(&path);
    let first = Queue::open(&path).unwrap();
    first.enqueue(NewJob::new("warm")).unwrap();
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    let (threads_before, files_before) = (threads(), open_files());

    for round in 0..20 {
        let queue = Queue::open(&path).unwrap();
        queue.enqueue(NewJob::new("work")).unwrap();
        // Reads check out pooled read connections.
        assert_eq!(queue.count(JobState::Pending).unwrap(), round + 2);
        let _ = queue.list(&Default::default()).unwrap();
    }

    // Let helper threads notice their pools are gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (threads() > threads_before || open_files() > files_before) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // At most as many as before: the first queue's helper thread may still
    // have been stopping when the baseline was taken.
    let (threads_after, files_after) = (threads(), open_files());
    assert!(
        threads_after <= threads_before,
        "20 opened and dropped queues left threads running: {threads_before} before, {threads_after} after"
    );
    assert!(
        files_after <= files_before,
        "20 opened and dropped queues left files open: {files_before} before, {files_after} after"
    );
}
}
