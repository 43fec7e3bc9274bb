//! The dashboard's reads (`Queue::counts_by_queue`, `Queue::list_state`,
//! `Queue::activity`, the pages of `/jobs` (`Ops::page`, also past a
//! cursor and filtered), the search by unique key, the job page's
//! `Queue::get`, and `Queue::stats` behind /metrics)
//! go through indexes: every statement they run on SQLite is recorded
//! (sqlite3_trace_v2 through an `on_connection` hook) and its
//! `EXPLAIN QUERY PLAN` must neither scan the jobs table nor sort. Their
//! answers agree with a plain count of the file.

use crate::support::common;
use crate::support::dashboard_fill;

use rusqlite::ffi;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tickler::{JobCursor, JobPage, JobState, Queue};

static RECORDING: AtomicBool = AtomicBool::new(false);
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

unsafe extern "C" fn on_statement(
    _event: c_uint,
    _ctx: *mut c_void,
    _stmt: *mut c_void,
    sql: *mut c_void,
) -> c_int {
    if RECORDING.load(Ordering::SeqCst) && !sql.is_null() {
        // SQLITE_TRACE_STMT: X is the statement's text, unexpanded.
        let text = unsafe { CStr::from_ptr(sql as *const c_char) }
            .to_string_lossy()
            .into_owned();
        SEEN.lock().unwrap().push(text);
    }
    0
}

fn plan(conn: &rusqlite::Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
    stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Fails on a statement of `seen` whose plan scans the jobs table, or
/// sorts in a temporary b-tree unless `sorts_allowed`.
fn check_plans(raw: &rusqlite::Connection, seen: &[String], sorts_allowed: bool) {
    for sql in seen {
        let lines = plan(raw, sql);
        println!("{sql}\n  -> {lines:?}");
        for line in &lines {
            assert!(
                !line.starts_with("SCAN tickler_jobs") || line.contains("INDEX"),
                "a full scan of the jobs table in {sql}: {lines:?}"
            );
            assert!(
                sorts_allowed || !line.contains("TEMP B-TREE"),
                "a sort in {sql}: {lines:?}"
            );
        }
    }
}

#[test]
fn dashboard_reads_use_indexes_and_match_the_file() {
    let (_dir, path) = common::temp_db();
    let queue = Queue::builder(&path)
        .sqlite(|o| {
            o.on_connection(|conn| {
                let rc = unsafe {
                    ffi::sqlite3_trace_v2(
                        conn.handle(),
                        ffi::SQLITE_TRACE_STMT as c_uint,
                        Some(on_statement),
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, ffi::SQLITE_OK);
                Ok(())
            })
        })
        .open()
        .unwrap();
    let raw = common::raw(&path);
    dashboard_fill::fill(&raw, 20_000).unwrap();

    RECORDING.store(true, Ordering::SeqCst);
    let counts = queue.ops().counts_by_queue(1_000).unwrap();
    let mut lists = BTreeMap::new();
    for state in JobState::ALL {
        lists.insert(state, queue.ops().list_state(state, 20).unwrap());
    }
    let minutes = queue
        .ops()
        .activity(60, std::time::Duration::from_secs(60), 100_000)
        .unwrap();
    // The pages of /jobs: the first, and the next past a cursor, filtered
    // by queue, kind and retrying; the search; the job page's read.
    let mut paged = BTreeMap::new();
    for state in JobState::ALL {
        let first = queue
            .ops()
            .page(&JobPage {
                limit: 10,
                ..JobPage::new(state)
            })
            .unwrap();
        let last = first.last().unwrap();
        let next = queue
            .ops()
            .page(&JobPage {
                queue: Some(last.queue.clone()),
                kind: Some(last.kind.clone()),
                // The fill's jobs that ran have had an attempt.
                retrying: Some(matches!(
                    state,
                    JobState::Running | JobState::Succeeded | JobState::Dead | JobState::Cancelled
                )),
                after: Some(JobCursor::after(last)),
                limit: 5,
                ..JobPage::new(state)
            })
            .unwrap();
        paged.insert(state, (first, next));
    }
    assert!(queue.ops().holding_unique_key("k").unwrap().is_none());
    queue.get(lists[&JobState::Dead][0].id).unwrap();
    // The marks' and the bulk actions' reads: each queue's oldest due job
    // and the counts a confirm page gives.
    let names: std::collections::BTreeSet<String> =
        counts.counts.keys().map(|(q, _)| q.clone()).collect();
    let mut oldest = BTreeMap::new();
    for q in &names {
        oldest.insert(q.clone(), queue.ops().oldest_due(q).unwrap());
        for state in [JobState::Dead, JobState::Pending] {
            queue
                .ops()
                .count_matching(state, Some(q), None, 1_000)
                .unwrap();
            queue
                .ops()
                .count_matching(state, Some(q), Some("k"), 1_000)
                .unwrap();
            queue
                .ops()
                .count_matching(state, None, Some("k"), 1_000)
                .unwrap();
        }
    }
    RECORDING.store(false, Ordering::SeqCst);
    let due: BTreeMap<String, Option<i64>> = names
        .iter()
        .map(|q| {
            let at: Option<i64> = raw
                .query_row(
                    "SELECT min(run_at) FROM tickler_jobs WHERE queue = ?1
                       AND (status = 'pending' OR (status = 'scheduled' AND run_at <= ?2))",
                    rusqlite::params![q, chrono::Utc::now().timestamp_millis()],
                    |r| r.get(0),
                )
                .unwrap();
            (q.clone(), at)
        })
        .collect();
    assert_eq!(
        oldest
            .iter()
            .map(|(q, at)| (q.clone(), at.map(|t| t.timestamp_millis())))
            .collect::<BTreeMap<_, _>>(),
        due,
        "each queue's oldest due job against a plain read of the file"
    );

    // What they ran, each statement once.
    let mut seen: Vec<String> = SEEN.lock().unwrap().clone();
    seen.retain(|s| s.contains("tickler_jobs"));
    seen.sort();
    seen.dedup();
    assert!(seen.len() >= 4, "statements recorded: {seen:#?}");
    check_plans(&raw, &seen, false);
    // The plot's statements read a range of the finish-time index, not the
    // whole index (which holds 97 % of the rows here).
    let ranged: Vec<&String> = seen
        .iter()
        .filter(|sql| sql.contains("finished_at >= ?1 AND finished_at < ?2"))
        .collect();
    assert_eq!(ranged.len(), 3, "the activity statements: {seen:#?}");
    for sql in ranged {
        let lines = plan(&raw, sql);
        assert!(
            lines.iter().any(|l| l.starts_with("SEARCH tickler_jobs")
                && l.contains("finished_at>? AND finished_at<?)")),
            "{sql}: {lines:?}"
        );
    }

    // The plot: the fill's finished jobs finished 1,000 s ago, one per
    // ms, in one or two minutes; each ran 50 ms.
    assert_eq!(minutes.len(), 60);
    let busy: Vec<_> = minutes.iter().filter(|m| m.finished > 0).collect();
    assert!((1..=2).contains(&busy.len()), "{minutes:#?}");
    let finished: i64 = raw
        .query_row(
            "SELECT count(*) FROM tickler_jobs WHERE finished_at IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        busy.iter().map(|m| m.finished).sum::<u64>(),
        finished as u64
    );
    let dead: i64 = raw
        .query_row(
            "SELECT count(*) FROM tickler_jobs WHERE status = 'dead'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(busy.iter().map(|m| m.dead).sum::<u64>(), dead as u64);
    for m in busy {
        assert!(!m.capped);
        assert_eq!(m.run_time_p50, Some(std::time::Duration::from_millis(50)));
    }

    // The counts: exact below the cap, marked capped at it.
    let mut exact: BTreeMap<(String, JobState), u64> = BTreeMap::new();
    let mut stmt = raw
        .prepare("SELECT queue, status, count(*) FROM tickler_jobs GROUP BY queue, status")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .unwrap();
    for row in rows {
        let (q, s, n) = row.unwrap();
        exact.insert((q, s.parse().unwrap()), n as u64);
    }
    assert_eq!(
        counts.counts.keys().collect::<Vec<_>>(),
        exact.keys().collect::<Vec<_>>()
    );
    for (key, n) in &exact {
        let shown = counts.counts[key];
        if *n >= 1_000 {
            assert_eq!(shown, 1_000, "{key:?}");
            assert!(counts.capped.contains(key), "{key:?} not marked capped");
        } else {
            assert_eq!(shown, *n, "{key:?}");
            assert!(!counts.capped.contains(key), "{key:?} marked capped");
        }
    }

    // A page past a cursor continues the first page's order (the kind and
    // queue filters keep only the cursor's own).
    for (state, (first, next)) in &paged {
        assert_eq!(&first[..], &lists[state][..10], "{state:?}");
        let last = first.last().unwrap();
        // (The fill's few running jobs may have no other of their kind.)
        assert!(!next.is_empty() || *state == JobState::Running, "{state:?}");
        for job in next {
            assert_eq!(
                (job.state, &job.queue, &job.kind),
                (*state, &last.queue, &last.kind)
            );
            assert!(
                !first.iter().any(|j| j.id == job.id),
                "{state:?}: listed twice"
            );
        }
    }

    // The lists: 20 jobs of the state each, in the state's order.
    for (state, jobs) in &lists {
        assert_eq!(jobs.len(), 20, "{state:?}");
        assert!(jobs.iter().all(|j| j.state == *state), "{state:?}");
    }
    let finished = |s| -> Vec<_> { lists[&s].iter().map(|j| j.finished_at).collect() };
    for s in [JobState::Succeeded, JobState::Dead, JobState::Cancelled] {
        let f = finished(s);
        assert!(f.windows(2).all(|w| w[0] >= w[1]), "{s:?}: newest first");
    }
    let due: Vec<_> = lists[&JobState::Scheduled]
        .iter()
        .map(|j| j.run_at)
        .collect();
    assert!(
        due.windows(2).all(|w| w[0] <= w[1]),
        "scheduled: soonest first"
    );
    let pending: Vec<_> = lists[&JobState::Pending]
        .iter()
        .map(|j| (-j.priority, j.run_at, j.id))
        .collect();
    assert!(
        pending.windows(2).all(|w| w[0] <= w[1]),
        "pending: claim order"
    );
    // Queue::stats (the CLI's stats and /metrics): exact, and no statement
    // of it reads the whole table (a GROUP BY over the few running jobs
    // may sort).
    SEEN.lock().unwrap().clear();
    RECORDING.store(true, Ordering::SeqCst);
    let stats = queue.stats().unwrap();
    RECORDING.store(false, Ordering::SeqCst);
    assert_eq!(stats.counts, exact);
    let mut seen: Vec<String> = SEEN.lock().unwrap().clone();
    seen.retain(|s| s.contains("tickler_jobs"));
    assert!(seen.len() >= 2, "statements recorded: {seen:#?}");
    check_plans(&raw, &seen, true);

    // The newest dead job of the file is listed first.
    let newest_dead: i64 = raw
        .query_row(
            "SELECT id FROM tickler_jobs WHERE status = 'dead' ORDER BY finished_at DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(lists[&JobState::Dead][0].id.0, newest_dead);
}
