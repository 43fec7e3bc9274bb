//! The async face (feature `tokio`): `AsyncQueue` calls, async
//! typed handlers, `shutdown_async`, and what dropping a pool on a runtime
//! thread does. The pool guarantees (exactly-once, lease loss, panics,
//! shutdown) run for async handlers in the `pool_*` tests' `tokio` cases.

#[path = "support/mod.rs"]
mod support;

use support::pool;

use pool::{open_queue_slow_retry, secs, temp_db};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tickler::{JobArgs, JobContext, JobError, JobFilter, JobState, NewBatch, NewJob, WorkerPool};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Greet {
    name: String,
}

impl JobArgs for Greet {
    const KIND: &'static str = "greet";
}

/// Polls `cond` (an async reading) every 5 ms, without blocking the runtime.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < timeout, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_async_api_reads_and_writes_like_the_queue() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path).to_async();
    let a = queue.enqueue(NewJob::new("plain")).await.unwrap();
    let b = queue
        .enqueue_args(&Greet { name: "ada".into() })
        .await
        .unwrap();
    let more = queue
        .enqueue_args_batch(&[Greet { name: "bo".into() }, Greet { name: "cy".into() }])
        .await
        .unwrap();
    assert_eq!(more.len(), 2);
    let batch = queue
        .enqueue_batch(vec![NewJob::new("plain"), NewJob::new("plain")])
        .await
        .unwrap();
    assert_eq!(batch.len(), 2);
    assert_eq!(queue.get(b).await.unwrap().payload["name"], "ada");
    let greets = queue
        .list(&JobFilter {
            kind: Some("greet".into()),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(greets.len(), 3);
    assert_eq!(queue.count(JobState::Pending).await.unwrap(), 6);
    assert_eq!(queue.stats().await.unwrap().total(JobState::Pending), 6);
    queue.cancel(a).await.unwrap();
    assert_eq!(queue.get(a).await.unwrap().state, JobState::Cancelled);
    queue.retry(a).await.unwrap();
    assert_eq!(queue.get(a).await.unwrap().state, JobState::Pending);
    assert!(matches!(
        queue.get(tickler::JobId(999)).await,
        Err(tickler::Error::NotFound(_))
    ));
    queue.sync().await.unwrap();
}

/// The rest of `Queue`'s API on `AsyncQueue`: opening, pauses, the dead
/// jobs' retry and pruning, schedules, the operator's readings, and events
/// read with `recv().await` (an app polled `drain()` on an interval or
/// parked a thread on `recv_timeout`).
#[tokio::test(flavor = "current_thread")]
async fn the_whole_queue_api_is_async_and_events_are_awaited() {
    let (_dir, path) = temp_db();
    let queue = tickler::AsyncQueue::open(&path).await.unwrap();
    let again = tickler::Queue::builder(&path)
        .busy_timeout(secs(5))
        .open_async()
        .await
        .unwrap();
    let events = queue.subscribe(64);

    queue.pause_queue("mail").await.unwrap();
    assert_eq!(again.paused_queues().await.unwrap(), ["mail"]);
    queue.resume_queue("mail").await.unwrap();
    assert!(queue.paused_queues().await.unwrap().is_empty());

    let id = queue
        .enqueue(NewJob::new("doomed").max_attempts(1))
        .await
        .unwrap();
    // The event arrives while this task waits on it, on one thread.
    let event = tokio::time::timeout(secs(5), events.recv()).await.unwrap();
    match event {
        Some(tickler::Event::Job(e)) => {
            assert_eq!((e.job_id, e.what), (id, tickler::JobEventKind::Enqueued));
        }
        other => panic!("{other:?}"),
    }
    queue.cancel(id).await.unwrap();
    assert_eq!(
        queue.retry_dead(None).await.unwrap(),
        (0, 0),
        "cancelled is not dead"
    );
    assert_eq!(
        queue.list_state(JobState::Cancelled, 10).await.unwrap()[0].id,
        id
    );
    let page = tickler::JobPage::new(JobState::Cancelled);
    assert_eq!(queue.page(page).await.unwrap()[0].id, id);
    assert!(queue
        .holding_unique_key("none".into())
        .await
        .unwrap()
        .is_none());
    assert_eq!(queue.counts_by_queue(100).await.unwrap().counts.len(), 1);
    assert_eq!(queue.unfinished(&["default"], None).await.unwrap(), 0);
    assert_eq!(
        queue
            .finished_since(chrono::DateTime::UNIX_EPOCH)
            .await
            .unwrap(),
        1
    );
    assert_eq!(queue.activity(4, secs(60), 100).await.unwrap().len(), 4);
    let future = chrono::Utc::now() + chrono::Duration::days(1);
    assert_eq!(
        queue
            .prune_state(future, JobState::Cancelled)
            .await
            .unwrap(),
        1
    );

    queue
        .upsert_schedule(
            tickler::NewSchedule::for_args("hello", "0 8 * * *", &Greet { name: "ada".into() })
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(queue.get_schedule("hello").await.unwrap().kind, "greet");
    assert_eq!(queue.next_ticks("hello", 3).await.unwrap().len(), 3);
    queue.pause_schedule("hello").await.unwrap();
    assert!(queue.list_schedules().await.unwrap()[0].paused);
    queue.resume_schedule("hello").await.unwrap();
    assert!(queue.delete_schedule("hello").await.unwrap());
    assert!(queue.list_schedules().await.unwrap().is_empty());

    // Once every queue that could send is gone, the reader is told so.
    let waiting = tokio::spawn(async move {
        let mut after = Vec::new();
        while let Some(event) = events.recv().await {
            after.push(event);
        }
        after
    });
    tokio::task::yield_now().await;
    drop((queue, again));
    let after = tokio::time::timeout(secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.len(), 1, "the cancel, then the end: {after:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn async_typed_handlers_run_and_shutdown_async_waits_for_them() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path).to_async();
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let pool = WorkerPool::builder(queue.queue())
        .threads(2)
        .async_handler_for(|ctx: JobContext, args: Greet| async move {
            STARTED.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            if args.name == "nobody" {
                return Err(JobError::permanent("no one to greet"));
            }
            assert_eq!(ctx.kind(), "greet");
            Ok(())
        })
        .start()
        .unwrap();
    let ok = queue
        .enqueue_args(&Greet { name: "ada".into() })
        .await
        .unwrap();
    let refused = queue
        .enqueue_args(&Greet {
            name: "nobody".into(),
        })
        .await
        .unwrap();
    let misfit = queue
        .enqueue(NewJob::new("greet").payload(serde_json::json!([1, 2])))
        .await
        .unwrap();
    eventually("the three jobs finished", secs(15), || async {
        queue.count(JobState::Succeeded).await.unwrap() == 1
            && queue.count(JobState::Dead).await.unwrap() == 2
    })
    .await;
    // A job still running when shutdown begins is waited for.
    let late = queue
        .enqueue_args(&Greet { name: "bo".into() })
        .await
        .unwrap();
    eventually("the late job started", secs(15), || async {
        STARTED.load(Ordering::SeqCst) == 3
    })
    .await;
    let report = pool.shutdown_async(secs(5)).await;
    assert_eq!(report.still_running, 0, "{report:?}");
    for id in [ok, late] {
        assert_eq!(queue.get(id).await.unwrap().state, JobState::Succeeded);
    }
    assert!(queue
        .get(refused)
        .await
        .unwrap()
        .last_error
        .unwrap()
        .contains("no one to greet"));
    let error = queue.get(misfit).await.unwrap().last_error.unwrap();
    assert!(
        error.contains("\"greet\"")
            && error.contains("invalid type: integer `1`, expected a string"),
        "{error}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_a_pool_on_a_runtime_thread_returns_at_once() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path).to_async();
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    // The handler needs this very (single) runtime thread to finish: a
    // drop that waited for it here would wait out the whole grace.
    let pool = WorkerPool::builder(queue.queue())
        .threads(1)
        .shutdown_grace(secs(10))
        .async_handler("slow", |_ctx: JobContext| async {
            STARTED.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        })
        .start()
        .unwrap();
    let id = queue.enqueue(NewJob::new("slow")).await.unwrap();
    eventually("the job started", secs(15), || async {
        STARTED.load(Ordering::SeqCst) == 1
    })
    .await;
    let began = Instant::now();
    drop(pool);
    assert!(
        began.elapsed() < Duration::from_millis(100),
        "drop blocked the runtime thread for {:?}",
        began.elapsed()
    );
    // The shutdown goes on in the background and records the outcome.
    eventually("the job succeeded after the drop", secs(15), || async {
        queue.get(id).await.unwrap().state == JobState::Succeeded
    })
    .await;
}

#[test]
fn an_async_handler_without_a_runtime_is_refused_at_start() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let err = WorkerPool::builder(&queue)
        .async_handler("lonely", |_ctx: JobContext| async { Ok(()) })
        .start()
        .unwrap_err();
    assert!(
        matches!(&err, tickler::Error::InvalidArgument(m) if m.contains("\"lonely\"") && m.contains("runtime")),
        "{err}"
    );
}

/// An async callback reads its batch and its members' outputs through
/// `AsyncQueue`, without blocking its runtime thread; the batch is opened
/// and sealed through it too.
#[tokio::test(flavor = "current_thread")]
async fn an_async_callback_reads_its_batch_through_the_async_queue() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path).to_async();
    let batch = queue
        .open_batch(NewBatch::new().on_finish(NewJob::new("report")))
        .await
        .unwrap();
    let members = queue
        .enqueue_batch(
            (1..=3)
                .map(|n| NewJob::new("double").payload(json!(n)).batch(batch.id))
                .collect(),
        )
        .await
        .unwrap();
    assert!(queue
        .seal_batch(batch.id)
        .await
        .unwrap()
        .sealed_at
        .is_some());
    let pool = WorkerPool::builder(queue.queue())
        .threads(2)
        .async_handler("double", |ctx: JobContext| async move {
            Ok::<_, JobError>(ctx.payload().as_u64().unwrap_or(0) * 2)
        })
        .async_handler("report", |ctx: JobContext| async move {
            let queue = ctx.queue().to_async();
            let id = queue
                .get(ctx.job_id())
                .await?
                .batch
                .expect("a callback's batch");
            let batch = queue.batch(id).await?;
            let outputs: Vec<_> = queue
                .batch_members(id, None, 10)
                .await?
                .into_iter()
                .filter_map(|m| m.output)
                .collect();
            Ok::<_, JobError>(json!({
                "callback": batch.which_callback(ctx.job_id()),
                "succeeded": batch.succeeded,
                "outputs": outputs,
            }))
        })
        .start()
        .unwrap();
    let report = batch.on_finish.unwrap();
    eventually("the report ran", secs(15), || async {
        queue.get(report).await.unwrap().state == JobState::Succeeded
    })
    .await;
    pool.shutdown_async(secs(5)).await;
    assert_eq!(
        queue.get(report).await.unwrap().output,
        Some(json!({ "callback": "on_finish", "succeeded": 3, "outputs": [2, 4, 6] }))
    );
    assert_eq!(
        queue
            .batch_members(batch.id, Some(members[1]), 10)
            .await
            .unwrap()
            .len(),
        1
    );
}
