//! Guarantee 1, enqueue is durable: once `enqueue` returned `Ok`, the job is
//! in the file, even if the process is killed (SIGKILL, no destructors, no
//! clean close) right after, possibly in the middle of its next enqueue.
//! Checked for both `Durability::Full` and `Durability::Normal`. (Power loss
//! cannot be simulated here; this proves the crash-of-the-process half.)

use crate::support::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tickler::{Durability, JobId, JobState, NewJob, Queue};

const CHILD_DB_ENV: &str = "TICKLER_TEST_DURABILITY_DB";
const CHILD_MODE_ENV: &str = "TICKLER_TEST_DURABILITY_MODE";
const CHILD_TEST: &str = "child_enqueuer";
const ID_LINE: &str = "TICKLER_ENQUEUED ";
const IDS_BEFORE_KILL: usize = 50;

contract! {
/// The child side: a no-op unless `TICKLER_TEST_DURABILITY_DB` is set. Then
/// enqueues jobs one by one, printing each id after `enqueue` returned, until
/// it is killed (or a minute passed, so an orphan cannot run forever).
fn child_enqueuer() {
    let Some(db) = std::env::var_os(CHILD_DB_ENV) else {
        return;
    };
    let durability = match std::env::var(CHILD_MODE_ENV).as_deref() {
        Ok("full") => Durability::Full,
        Ok("normal") => Durability::Normal,
        other => panic!("bad mode {other:?}"),
    };
    let queue = Queue::builder(common::engine::target(Path::new(&db)))
        .sqlite(|o| o.durability(durability))
        .open()
        .expect("child open");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0u64;
    while Instant::now() < deadline {
        let id = queue
            .enqueue(NewJob::new("survivor").payload(serde_json::json!({ "n": n })))
            .expect("child enqueue");
        // println! flushes at the newline: the parent sees the id only after Ok.
        println!("{ID_LINE}{} {n}", id.0);
        n += 1;
    }
}
}

fn enqueue_then_kill(mode: &str) {
    let (_dir, path) = common::temp_db();
    let mut child = crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(CHILD_DB_ENV, &path)
        .env(CHILD_MODE_ENV, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");

    let mut acknowledged: Vec<(JobId, u64)> = Vec::new();
    let stdout = child.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        // The harness may print "test child_enqueuer ... " in front of the first line.
        let Some(at) = line.find(ID_LINE) else {
            continue;
        };
        let mut parts = line[at + ID_LINE.len()..].split(' ');
        let id = JobId(parts.next().unwrap().parse().unwrap());
        let n: u64 = parts.next().unwrap().parse().unwrap();
        acknowledged.push((id, n));
        if acknowledged.len() == IDS_BEFORE_KILL {
            break;
        }
    }
    // SIGKILL on Unix: no unwinding, no close of the database.
    child.kill().expect("kill child");
    let status = child.wait().expect("wait child");
    assert_eq!(
        acknowledged.len(),
        IDS_BEFORE_KILL,
        "child stopped early ({status})"
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "child was not killed by SIGKILL: {status}"
        );
    }

    // A file left by a killed process must be whole; a server outlives
    // its client, so there is nothing to check there.
    if !common::engine::on_postgres() {
        let conn = common::raw(&path);
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }

    let queue = Queue::open(common::engine::target(&path)).expect("reopen after crash");
    for (id, n) in &acknowledged {
        let job = queue
            .get(*id)
            .unwrap_or_else(|e| panic!("acknowledged job {id} lost after kill: {e}"));
        assert_eq!(job.state, JobState::Pending, "{job:?}");
        assert_eq!(job.kind, "survivor");
        assert_eq!(job.payload, serde_json::json!({ "n": n }));
    }
    // And they are claimable by whoever opens the file next.
    let claimed: std::collections::HashSet<JobId> = queue
        .manual()
        .claim("default", "after-crash", 10_000, Duration::from_secs(60))
        .unwrap()
        .iter()
        .map(|l| l.job_id)
        .collect();
    for (id, _) in &acknowledged {
        assert!(
            claimed.contains(id),
            "acknowledged job {id} was not claimable"
        );
    }
}

contract! {
fn acknowledged_enqueues_survive_sigkill_with_full_durability() {
    enqueue_then_kill("full");
}
}

contract! {
fn acknowledged_enqueues_survive_sigkill_with_normal_durability() {
    enqueue_then_kill("normal");
}
}

contract! {
/// The durability a queue reports is the one its engine keeps. One builder
/// carries each engine's options (the same code opens either), and only
/// the engine the location names applies its own: SQLite's `Normal` on a
/// file; on PostgreSQL the server's (every acknowledged commit is durable),
/// on MySQL the server's as its InnoDB settings make it, whatever the
/// SQLite options say.
fn the_reported_durability_is_the_one_the_engine_keeps() {
    let (_dir, path) = common::temp_db();
    let queue = Queue::builder(common::engine::target(&path))
        .sqlite(|o| o.durability(Durability::Normal).read_connections(2))
        .postgres(|o| o.max_connections(3))
        .open()
        .expect("open");
    let expected = if common::engine::on_postgres() {
        Durability::Full
    } else if common::engine::on_mysql() {
        // The server's: InnoDB flushes its log at each commit only with
        // innodb_flush_log_at_trx_commit = 1.
        let flush = common::engine::query_int(
            &path,
            "SELECT @@innodb_flush_log_at_trx_commit",
            &[],
        );
        if flush == 1 {
            Durability::Full
        } else {
            Durability::Normal
        }
    } else {
        Durability::Normal
    };
    assert_eq!(queue.durability(), expected);
    let id = queue.enqueue(NewJob::new("k")).expect("enqueue");
    assert_eq!(queue.get(id).expect("get").state, JobState::Pending);
}
}
