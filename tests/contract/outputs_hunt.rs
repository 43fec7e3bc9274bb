//! Failures other queues had with results, result waiting and progress,
//! tried on tickler. Each body names the report it is modelled on; the
//! guarantee it checks is tickler's own (see outputs.rs, wait.rs).

use crate::support::common;
use crate::support::pool;

use common::{ms, secs, temp_db};
use pool::{no_backoff, open_queue};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tickler::{JobContext, JobError, JobState, NewJob, Output, Queue, Waited, WorkerPool};

fn queue_without_backoff(path: &std::path::Path) -> Queue {
    Queue::builder(crate::support::engine::target(path))
        .retry_policy(no_backoff())
        .open()
        .expect("open queue")
}

contract! {
/// Celery's `AsyncResult.get()` raised on the first failed attempt of a
/// task that was being retried, instead of waiting for its last
/// (celery/celery#2687, and #2677 for chains). A wait answers when the
/// job ends, not when an attempt fails: here after two failed attempts,
/// with the third attempt's output.
fn a_wait_answers_after_the_retries_with_the_last_attempts_output() {
    let (_dir, path) = temp_db();
    let queue = queue_without_backoff(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("flaky", |ctx: &JobContext| {
            if ctx.attempt() < 3 {
                return Err(JobError::retry(format!("attempt {} failed", ctx.attempt())));
            }
            Ok::<_, JobError>(json!({"attempt": ctx.attempt()}))
        })
        .start()
        .unwrap();
    let id = queue.enqueue(NewJob::new("flaky").max_attempts(5)).unwrap();
    match queue.wait(id, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!((job.attempts, job.output), (3, Some(json!({"attempt": 3}))));
            assert_eq!(job.errors.len(), 2, "{:?}", job.errors);
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

contract! {
/// Bull stopped filling `returnvalue` (OptimalBits/bull#579), and RQ kept
/// no result for a job that returned `None`, taking it for "no result"
/// (rq/rq#115). Every value but JSON `null` is stored as it was returned,
/// the "falsy" ones too: 0, false, "", [], {}.
fn falsy_outputs_are_stored_as_returned() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("echo", |ctx: &JobContext| Ok::<_, JobError>(ctx.payload()["out"].clone()))
        .start()
        .unwrap();
    for out in [json!(0), json!(false), json!(""), json!([]), json!({}), json!(0.0)] {
        let id = queue.enqueue(NewJob::new("echo").payload(json!({"out": out}))).unwrap();
        match queue.wait(id, secs(30)).unwrap() {
            Waited::Succeeded(job) => assert_eq!(job.output, Some(out)),
            other => panic!("{other:?}"),
        }
    }
    // JSON null is "nothing to store", as documented on Output::new.
    let id = queue.enqueue(NewJob::new("echo").payload(json!({"out": null}))).unwrap();
    match queue.wait(id, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, None),
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

contract! {
/// RQ wrote a job's status and its result in two steps, so a reader saw
/// "finished" with a result of `None` about one time in twenty
/// (rq/rq#1724). A reader polling while jobs end never sees a succeeded
/// job without its output, from another handle either.
fn a_succeeded_job_is_never_read_without_its_output() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let reader = open_queue(&path);
    let ids: Vec<_> = (0..40u64)
        .map(|n| queue.enqueue(NewJob::new("n").payload(json!({"n": n}))).unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let polling = {
        let ids = ids.clone();
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for id in &ids {
                    let job = reader.get(*id).unwrap();
                    if job.state == JobState::Succeeded {
                        assert!(job.output.is_some(), "succeeded without output: {job:?}");
                        seen += 1;
                    }
                }
            }
            seen
        })
    };
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("n", |ctx: &JobContext| Ok::<_, JobError>(ctx.payload()["n"].clone()))
        .start()
        .unwrap();
    for (n, id) in ids.iter().enumerate() {
        match queue.wait(*id, secs(30)).unwrap() {
            Waited::Succeeded(job) => assert_eq!(job.output, Some(json!(n))),
            other => panic!("{other:?}"),
        }
    }
    pool.shutdown(secs(5));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(polling.join().unwrap() > 0);
}
}

contract! {
/// Airbyte's and Phoenix's PostgreSQL destinations refused JSON holding
/// `\u0000` ("cannot be converted to text": airbytehq/airbyte#3476,
/// Arize-ai/phoenix#9123); JSON numbers past 2^53 lost digits on the way
/// (hhyo/Archery#3230). An output keeps NUL, control and non-ASCII
/// characters, integers at both ends of i64 and u64, and floats, on every
/// engine, exactly.
fn outputs_keep_nul_non_ascii_and_extreme_numbers_exactly() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let out = json!({
        "nul": "a\u{0}b",
        "controls": "\t\r\n\u{1b}[31m\u{7f}",
        "text": "naïve café 東京 🚀 \u{202e}rtl",
        "quotes": "\"'\\`",
        "u64_max": u64::MAX,
        "i64_min": i64::MIN,
        "i64_max": i64::MAX,
        "small": 5e-324,
        "big": f64::MAX,
        "tenth": 0.1,
        "third": 1.0 / 3.0,
        "neg_zero": -0.0,
        "key with \u{0} nul": 1,
    });
    let mut pool = WorkerPool::builder(&queue)
        .handler("echo", |ctx: &JobContext| Ok::<_, JobError>(ctx.payload().clone()))
        .start()
        .unwrap();
    let id = queue.enqueue(NewJob::new("echo").payload(out.clone())).unwrap();
    match queue.wait(id, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            let got = job.output.expect("an output");
            assert_eq!(got, out);
            assert_eq!(got["u64_max"].as_u64(), Some(u64::MAX));
            assert_eq!(got["third"].as_f64().map(f64::to_bits), Some((1.0f64 / 3.0).to_bits()));
            assert_eq!(job.unreadable, None);
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

contract! {
/// A result that the store's own limit refused: Django Q failed on
/// results over 4000 characters (Koed00/django-q#719), Celery and
/// Temporal retried a result the store could never take
/// (celery/celery#6533, pydantic/pydantic-ai#7157). The cap counts
/// bytes of the stored JSON text, escapes included: an output of
/// multi-byte characters and escaped quotes exactly at it is stored
/// whole, one byte more makes the job dead at once.
fn the_cap_counts_bytes_of_the_json_text_multibyte_and_escapes_included() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let cap = tickler::MAX_OUTPUT_BYTES;
    // "é" is 2 bytes; `"` is written `\"`, 2 bytes; the two quotes around.
    let text = |bytes: usize| {
        let body = bytes - 2;
        let mut s = "é".repeat(body / 4);
        s.push_str(&"\"".repeat(body / 4));
        s.push_str(&"x".repeat(body % 4));
        s
    };
    assert_eq!(serde_json::to_string(&text(cap)).unwrap().len(), cap);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("big", move |ctx: &JobContext| {
            Ok::<_, JobError>(text(ctx.payload()["bytes"].as_u64().unwrap() as usize))
        })
        .start()
        .unwrap();
    let at_cap = queue.enqueue(NewJob::new("big").payload(json!({"bytes": cap}))).unwrap();
    let over = queue
        .enqueue(NewJob::new("big").payload(json!({"bytes": cap + 1})).max_attempts(3))
        .unwrap();
    match queue.wait(at_cap, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!(serde_json::to_string(&job.output.unwrap()).unwrap().len(), cap);
        }
        other => panic!("{other:?}"),
    }
    match queue.wait(over, secs(30)).unwrap() {
        Waited::Dead(job) => assert_eq!((job.attempts, job.output), (1, None)),
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

contract! {
/// Celery's JSON result serializer raised inside the worker on a value it
/// could not encode (celery/celery#422, #2441). An output that cannot be
/// serialized (a map with non-string keys) makes its job dead at once,
/// with an error that says so; the pool goes on with the next job.
fn an_output_that_cannot_be_serialized_kills_its_job_alone() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("pairs", |_: &JobContext| {
            let mut map = BTreeMap::new();
            map.insert((1, 2), "a");
            Ok::<_, JobError>(map)
        })
        .handler("fine", |_: &JobContext| Ok::<_, JobError>("ok"))
        .start()
        .unwrap();
    let bad = queue.enqueue(NewJob::new("pairs").max_attempts(5)).unwrap();
    let good = queue.enqueue(NewJob::new("fine")).unwrap();
    match queue.wait(bad, secs(30)).unwrap() {
        Waited::Dead(job) => {
            let error = job.last_error.unwrap_or_default();
            assert!(error.contains("key must be a string"), "{error}");
            assert!(error.contains("output") && !error.contains("payload"), "{error}");
            assert_eq!((job.attempts, job.output), (1, None));
        }
        other => panic!("{other:?}"),
    }
    match queue.wait(good, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, Some(json!("ok"))),
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

/// `depth` arrays inside one another around a 1.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |inner, _| Value::Array(vec![inner]))
}

contract! {
/// JSON written but not read back: serde_json, which tickler reads
/// outputs with, writes any nesting but refuses to read past 128 levels,
/// which broke Delta's schemas and VibeSQL's json() on documents they had
/// accepted (delta-io/delta-kernel-rs#1896, rjwalters/vibesql#6052). An output nested deeper than can be read is
/// refused when made, and its job is dead with an error that says why,
/// rather than succeeded with an output no one can read; one at the depth
/// that reads back is stored.
fn an_output_nested_too_deep_to_read_back_is_refused_when_made() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("deep", |ctx: &JobContext| {
            Ok::<_, JobError>(nested(ctx.payload()["depth"].as_u64().unwrap() as usize))
        })
        .start()
        .unwrap();
    let fine = queue.enqueue(NewJob::new("deep").payload(json!({"depth": 100}))).unwrap();
    match queue.wait(fine, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!((job.output, job.unreadable), (Some(nested(100)), None));
        }
        other => panic!("{other:?}"),
    }
    let deep = queue.enqueue(NewJob::new("deep").payload(json!({"depth": 200}))).unwrap();
    match queue.wait(deep, secs(30)).unwrap() {
        Waited::Dead(job) => {
            let error = job.last_error.clone().unwrap_or_default();
            assert!(error.contains("recursion limit"), "{error}");
            assert!(error.contains("output") && !error.contains("payload"), "{error}");
            assert_eq!((job.attempts, job.output, job.unreadable), (1, None, None));
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
    assert!(matches!(Output::new(&nested(200)), Err(tickler::Error::Json(_))));
}
}

contract! {
/// Xenon's `waitUntilDone(Long.MAX_VALUE)` overflowed and returned at
/// once (xenon-middleware/xenon#416); Python's waits raised OverflowError
/// on large timeouts (ipython/ipyparallel#269). `Duration::MAX` waits
/// until the job ends, without a panic or an early answer.
fn a_wait_with_the_longest_timeout_neither_panics_nor_answers_early() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let finisher = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            std::thread::sleep(ms(300));
            let lease = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
            let out = Output::new(&json!("done")).unwrap().unwrap();
            queue
                .manual()
                .record_outcomes(&[(&lease, tickler::Outcome::CompleteWith(out))])
                .unwrap();
        })
    };
    let started = Instant::now();
    match queue.wait(id, Duration::MAX).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, Some(json!("done"))),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= ms(250), "{:?}", started.elapsed());
    finisher.join().unwrap();
    // And on a job that has already ended: at once.
    assert!(matches!(queue.wait(id, Duration::MAX).unwrap(), Waited::Succeeded(_)));
}
}

contract! {
/// Bull's `job.finished()` and BullMQ's `waitUntilFinished` never
/// resolved when the job was removed on completion before the waiter
/// looked (OptimalBits/bull#1371, #1906, taskforcesh/bullmq#85, #2341).
/// A job that ends and is pruned while a wait is on answers Succeeded or
/// NotFound, promptly, whichever came first: never a timeout.
fn a_job_ended_and_pruned_while_waited_for_is_answered_not_hung() {
    let (_dir, path) = temp_db();
    let waiter = open_queue(&path);
    let worker = open_queue(&path);
    for round in 0..30u64 {
        let id = waiter.enqueue(NewJob::new("k")).unwrap();
        let lease = worker.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
        let finisher = {
            let worker = worker.clone();
            std::thread::spawn(move || {
                std::thread::sleep(ms(round % 5));
                worker.manual().complete(&lease).unwrap();
                worker.prune(chrono::Utc::now() + chrono::Duration::hours(1)).unwrap();
            })
        };
        let started = Instant::now();
        match waiter.wait(id, secs(20)).unwrap() {
            Waited::Succeeded(_) | Waited::NotFound => {}
            other => panic!("round {round}: {other:?}"),
        }
        assert!(started.elapsed() < secs(5), "round {round}: {:?}", started.elapsed());
        finisher.join().unwrap();
        assert_eq!(waiter.wait(id, ms(0)).unwrap(), Waited::NotFound);
    }
}
}

contract! {
/// Bull's `finished()` on a job added with a deduplicating `jobId` raced
/// the job's end (OptimalBits/bull#1906). A unique job enqueued again
/// while held gives the same id, and a wait on it answers with the one
/// run's output; a dead job retried and waited for again answers with
/// the new run's output.
fn a_unique_jobs_duplicate_and_a_retried_dead_job_are_waited_for() {
    let (_dir, path) = temp_db();
    let queue = queue_without_backoff(&path);
    let first = queue.enqueue(NewJob::new("u").unique_key("report-7")).unwrap();
    let again = queue.enqueue(NewJob::new("u").unique_key("report-7")).unwrap();
    assert_eq!(first, again);
    let failing = queue.enqueue(NewJob::new("fails-once").max_attempts(1)).unwrap();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut pool = {
        let runs = std::sync::Arc::clone(&runs);
        WorkerPool::builder(&queue)
            .threads(2)
            .handler("u", |ctx: &JobContext| Ok::<_, JobError>(ctx.job_id().0))
            .handler("fails-once", move |_: &JobContext| {
                if runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    return Err(JobError::permanent("first run fails"));
                }
                Ok::<_, JobError>("second run")
            })
            .start()
            .unwrap()
    };
    match queue.wait(again, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, Some(json!(first.0))),
        other => panic!("{other:?}"),
    }
    match queue.wait(failing, secs(30)).unwrap() {
        Waited::Dead(job) => assert_eq!(job.output, None),
        other => panic!("{other:?}"),
    }
    queue.retry(failing).unwrap();
    match queue.wait(failing, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!(job.output, Some(json!("second run")));
            assert_eq!(job.last_error, None);
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

#[cfg(feature = "tokio")]
contract! {
/// BullMQ's `waitUntilFinished` without a timeout kept its promise (and
/// what it held) forever once no one wanted the answer
/// (taskforcesh/bullmq#2341). An `AsyncQueue::wait` answers with the
/// output of a job another thread ends; one given up by a `select!` or
/// `tokio::time::timeout` must not hold a thread of tokio's blocking pool for
/// the rest of its own timeout: the runtime that ran it shuts down
/// promptly, although the job never ends and the wait's timeout is
/// `Duration::MAX`.
fn an_async_wait_given_up_by_select_frees_its_thread() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let id = queue.enqueue(NewJob::new("never-run")).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let aq = queue.to_async();
        let other = queue.enqueue(NewJob::new("k").queue("other")).unwrap();
        let finisher = std::thread::spawn(move || {
            std::thread::sleep(ms(200));
            let lease = queue.manual().claim("other", "w", 1, secs(60)).unwrap().remove(0);
            let out = Output::new(&json!({"rows": 3})).unwrap().unwrap();
            queue
                .manual()
                .record_outcomes(&[(&lease, tickler::Outcome::CompleteWith(out))])
                .unwrap();
        });
        let gave_up = rt.block_on(async {
            // Answered: the output of a job another thread ends.
            match aq.wait(other, secs(30)).await.unwrap() {
                Waited::Succeeded(job) => assert_eq!(job.output, Some(json!({"rows": 3}))),
                waited => panic!("{waited:?}"),
            }
            // Given up, by tokio's timeout and by select!.
            assert!(tokio::time::timeout(ms(100), aq.wait(id, Duration::MAX)).await.is_err());
            tokio::select! {
                waited = aq.wait(id, Duration::MAX) => panic!("{waited:?}"),
                () = tokio::time::sleep(ms(200)) => true,
            }
        });
        finisher.join().unwrap();
        // A plain drop waits for the runtime's blocking threads.
        drop(rt);
        done.send(gave_up).unwrap();
    });
    let gave_up = finished.recv_timeout(secs(10));
    assert_eq!(gave_up, Ok(true), "the runtime did not shut down: a given-up wait holds its thread");
}
}

contract! {
/// PostgreSQL's text refuses U+0000 (airbytehq/airbyte#3476,
/// Arize-ai/phoenix#9123), and a progress message is a handler's text,
/// as likely to hold one as an error message. A report with a NUL is
/// stored (on PostgreSQL with U+FFFD in its place, as error messages
/// are), the job's row stays readable, and its output, NUL included, is
/// stored with its success.
fn a_progress_message_with_nul_is_stored_and_the_job_goes_on() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
    queue.manual().record_progress(&[(&lease, 0.5, "row\u{0}42 東京")]).unwrap();
    let job = queue.get(id).unwrap();
    let progress = job.progress.expect("a progress");
    assert!(
        ["row\u{0}42 東京", "row\u{FFFD}42 東京"].contains(&progress.message.as_str()),
        "{progress:?}"
    );
    assert_eq!((progress.fraction, job.unreadable), (0.5, None));
    let out = Output::new(&json!("done\u{0}")).unwrap().unwrap();
    let recorded = queue
        .manual()
        .record_outcomes(&[(&lease, tickler::Outcome::CompleteWith(out))])
        .unwrap();
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    match queue.wait(id, secs(5)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, Some(json!("done\u{0}"))),
        other => panic!("{other:?}"),
    }
}
}

/// Completes the job in the handler's own transaction, writing nothing
/// else, through the engine's own transaction type.
fn complete_in_own_tx(ctx: &JobContext, postgres: bool, mysql: bool) -> tickler::Result<()> {
    if postgres {
        return pg_complete(ctx);
    }
    if mysql {
        return my_complete(ctx);
    }
    ctx.complete_with(|_: &tickler::rusqlite::Transaction| Ok::<(), tickler::Error>(()))
}

#[cfg(feature = "postgres")]
fn pg_complete(ctx: &JobContext) -> tickler::Result<()> {
    ctx.complete_with(|_: &mut tickler::postgres::Transaction| Ok::<(), tickler::Error>(()))
}

#[cfg(not(feature = "postgres"))]
fn pg_complete(_: &JobContext) -> tickler::Result<()> {
    unreachable!("a PostgreSQL case needs the `postgres` feature")
}

#[cfg(feature = "mysql")]
fn my_complete(ctx: &JobContext) -> tickler::Result<()> {
    ctx.complete_with(|_: &mut tickler::mysql::Transaction| Ok::<(), tickler::Error>(()))
}

#[cfg(not(feature = "mysql"))]
fn my_complete(_: &JobContext) -> tickler::Result<()> {
    unreachable!("a MySQL case needs the `mysql` feature")
}

contract! {
/// River records a job's output with the update that completes it, and
/// found its round trip untested (riverqueue/river#758, #1102). A handler
/// that completes its job in its own transaction
/// (`JobContext::complete_with`) and then returns a value: the job is
/// succeeded once, the wait answers Succeeded, and, as documented on
/// `complete_with`, the value returned after is not stored (the job had
/// already succeeded without it). Current behaviour, kept as it is: an
/// output is stored only by the statement that marks the job succeeded.
fn an_output_returned_after_completing_in_the_handlers_transaction_is_not_stored() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let (postgres, mysql) = (crate::support::engine::on_postgres(), crate::support::engine::on_mysql());
    let mut pool = WorkerPool::builder(&queue)
        .handler("own-tx", move |ctx: &JobContext| {
            complete_in_own_tx(ctx, postgres, mysql)?;
            Ok::<_, JobError>(json!({"returned": "after"}))
        })
        .start()
        .unwrap();
    let id = queue.enqueue(NewJob::new("own-tx").max_attempts(3)).unwrap();
    match queue.wait(id, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!((job.attempts, job.output, job.last_error), (1, None, None));
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1));
}
}
