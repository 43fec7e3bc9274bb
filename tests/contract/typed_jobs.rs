//! Typed jobs: `JobArgs` ties a payload type to its kind and
//! defaults; `enqueue_args` (and its batch and `_tx` forms) stores them; a
//! `handler_for` handler gets them deserialized, a payload that does not
//! fit is a permanent failure naming the kind and the serde error, and a
//! kind's retry policy is the one its failures wait for.

use crate::support::pool;

use pool::{open_queue_slow_retry, secs, temp_db, wait_until};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tickler::{JobArgs, JobContext, JobError, JobState, NewJob, RetryPolicy, WorkerPool};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    user_id: u64,
    template: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";

    fn queue(&self) -> String {
        "mail".into()
    }

    fn priority(&self) -> i32 {
        7
    }

    fn max_attempts(&self) -> u32 {
        3
    }

    fn timeout(&self) -> Option<Duration> {
        Some(secs(90))
    }

    fn unique_key(&self) -> Option<String> {
        Some(format!("email:{}:{}", self.template, self.user_id))
    }

    fn limit(&self) -> Option<(String, String)> {
        Some(("mail-template".into(), self.template.clone()))
    }

    fn limit_weight(&self) -> u32 {
        2
    }
}

/// Only the kind: every default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Plain {
    n: u32,
}

impl JobArgs for Plain {
    const KIND: &'static str = "plain";
}

/// Fails every time; its own backoff is two hours, without jitter.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Flaky {
    n: u32,
}

impl JobArgs for Flaky {
    const KIND: &'static str = "flaky";

    fn retry_policy() -> Option<RetryPolicy> {
        Some(RetryPolicy {
            base: secs(7200),
            cap: secs(7200),
            jitter: false,
        })
    }
}

fn email(user_id: u64) -> SendEmail {
    SendEmail {
        user_id,
        template: "welcome".into(),
    }
}

contract! {
fn enqueue_args_stores_the_kind_payload_and_defaults_of_the_type() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let id = queue.enqueue_args(&email(42)).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.kind, "send_email");
    assert_eq!(
        job.payload,
        serde_json::json!({"user_id": 42, "template": "welcome"})
    );
    assert_eq!(job.queue, "mail");
    assert_eq!(job.priority, 7);
    assert_eq!(job.max_attempts, 3);
    assert_eq!(job.timeout, Some(secs(90)));
    assert_eq!(job.unique_key.as_deref(), Some("email:welcome:42"));
    assert_eq!(
        job.limit,
        Some(tickler::LimitSlot {
            name: "mail-template".into(),
            key: "welcome".into(),
            weight: 2
        })
    );
    // The unique key computed from the args deduplicates.
    assert_eq!(queue.enqueue_args(&email(42)).unwrap(), id);

    let plain = queue
        .get(queue.enqueue_args(&Plain { n: 1 }).unwrap())
        .unwrap();
    assert_eq!(plain.kind, "plain");
    assert_eq!(plain.queue, tickler::DEFAULT_QUEUE);
    assert_eq!(plain.priority, 0);
    assert_eq!(plain.max_attempts, tickler::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(plain.timeout, None);
    assert_eq!(plain.unique_key, None);
    assert_eq!(plain.limit, None);

    // from_args gives a NewJob whose setters still apply.
    let delayed = queue
        .enqueue(NewJob::from_args(&Plain { n: 2 }).unwrap().delay(secs(600)))
        .unwrap();
    assert_eq!(queue.get(delayed).unwrap().state, JobState::Scheduled);
}
}

contract! {
fn enqueue_args_batch() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let ids = queue
        .enqueue_args_batch(&[Plain { n: 1 }, Plain { n: 2 }, Plain { n: 3 }])
        .unwrap();
    let ns: Vec<u64> = ids
        .iter()
        .map(|id| queue.get(*id).unwrap().payload["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, [1, 2, 3]);
}
}

contract! { sqlite_only:
/// SQLite only: the `_tx` forms take the application's rusqlite
/// transaction (`Queue::open_connection` is SQLite's).
fn enqueue_args_tx_forms() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let mut conn = queue.open_connection().unwrap();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let kept = queue.enqueue_args_tx(&tx, &Plain { n: 4 }).unwrap();
    tx.commit().unwrap();
    assert_eq!(queue.get(kept).unwrap().payload["n"], 4);

    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let gone = queue
        .enqueue_args_batch_tx(&tx, &[Plain { n: 5 }, Plain { n: 6 }])
        .unwrap();
    tx.rollback().unwrap();
    for id in gone {
        assert!(
            matches!(queue.get(id), Err(tickler::Error::NotFound(_))),
            "{id}"
        );
    }
}
}

contract! {
fn typed_handler_gets_its_args_and_a_misfit_payload_fails_permanently() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let seen: Arc<Mutex<Vec<Plain>>> = Arc::default();
    let ok = queue.enqueue_args(&Plain { n: 9 }).unwrap();
    // The right kind, a payload of the wrong shape (hand-written).
    let misfit = queue
        .enqueue(NewJob::new("plain").payload(serde_json::json!({"n": "nine"})))
        .unwrap();
    let mut pool = {
        let seen = Arc::clone(&seen);
        WorkerPool::builder(&queue)
            .threads(1)
            .handler_for(move |ctx: &JobContext, args: Plain| {
                assert_eq!(ctx.kind(), "plain");
                seen.lock().unwrap().push(args);
                Ok::<(), JobError>(())
            })
            .start()
            .unwrap()
    };
    wait_until("both jobs finished", secs(15), || {
        queue.get(ok).unwrap().state == JobState::Succeeded
            && queue.get(misfit).unwrap().state == JobState::Dead
    });
    pool.shutdown(secs(5));
    assert_eq!(*seen.lock().unwrap(), [Plain { n: 9 }]);
    let dead = queue.get(misfit).unwrap();
    assert_eq!(dead.attempts, 1, "a misfit is not retried");
    let error = dead.last_error.unwrap();
    assert!(error.contains("\"plain\""), "names the kind: {error}");
    assert!(error.contains("Plain"), "names the type: {error}");
    assert!(
        error.contains("invalid type: string \"nine\", expected u32"),
        "carries the serde error: {error}"
    );
}
}

contract! {
fn a_kinds_retry_policy_decides_its_backoff_other_kinds_keep_the_queues() {
    let (_dir, path) = temp_db();
    // The queue's own policy: one hour, no jitter.
    let queue = open_queue_slow_retry(&path);
    let typed = queue.enqueue_args(&Flaky { n: 1 }).unwrap();
    let untyped = queue
        .enqueue(NewJob::new("untyped_flaky").max_attempts(5))
        .unwrap();
    let by_hand = queue
        .enqueue(NewJob::new("by_hand").max_attempts(5))
        .unwrap();
    let started = chrono::Utc::now();
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler_for(|_: &JobContext, _: Flaky| Err::<(), _>(JobError::retry("flaky says no")))
        .handler("untyped_flaky", |_: &JobContext| {
            Err::<(), _>(JobError::retry("untyped says no"))
        })
        .handler("by_hand", |_: &JobContext| -> Result<(), JobError> {
            panic!("by hand panics")
        })
        .retry_policy_for(
            "by_hand",
            RetryPolicy {
                base: secs(300),
                cap: secs(300),
                jitter: false,
            },
        )
        .start()
        .unwrap();
    wait_until("all three failed once", secs(15), || {
        [typed, untyped, by_hand]
            .iter()
            .all(|id| queue.get(*id).unwrap().state == JobState::Scheduled)
    });
    pool.shutdown(secs(5));
    let wait_of = |id| {
        let job = queue.get(id).unwrap();
        assert_eq!(job.attempts, 1);
        (job.run_at - started).num_seconds()
    };
    let near = |got: i64, want: i64| (want - 20..=want + 20).contains(&got);
    let typed_wait = wait_of(typed);
    assert!(near(typed_wait, 7200), "typed kind waited {typed_wait} s");
    let untyped_wait = wait_of(untyped);
    assert!(near(untyped_wait, 3600), "untyped waited {untyped_wait} s");
    let by_hand_wait = wait_of(by_hand);
    assert!(near(by_hand_wait, 300), "by_hand waited {by_hand_wait} s");
    assert!(queue
        .get(by_hand)
        .unwrap()
        .last_error
        .unwrap()
        .contains("by hand panics"));
}
}

/// A job type with no fields, as a schedule's job often is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Heartbeat {}

impl JobArgs for Heartbeat {
    const KIND: &'static str = "heartbeat";

    fn queue(&self) -> String {
        "beats".into()
    }

    fn max_attempts(&self) -> u32 {
        2
    }
}

contract! {
/// A schedule made from a typed value carries its kind, payload and
/// settings, so that kind and payload cannot disagree: a schedule of a
/// typed kind made with `NewSchedule::new` stored a `null` payload, and
/// every tick of `struct Heartbeat {}` went dead at run time. Its limit
/// too: a tick's job ran beside the kind's other jobs of its key, unlimited.
fn a_schedule_for_typed_args_carries_their_kind_payload_and_settings() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let stored = queue
        .upsert_schedule(
            tickler::NewSchedule::for_args("beat", "*/5 * * * *", &Heartbeat {})
                .unwrap()
                .time_zone("Europe/Berlin"),
        )
        .unwrap();
    assert_eq!(stored.kind, "heartbeat");
    assert_eq!(stored.payload, serde_json::json!({}));
    assert_eq!(stored.queue, "beats");
    assert_eq!(stored.max_attempts, 2);
    assert_eq!(stored.time_zone, "Europe/Berlin");
    assert_eq!(stored.limit, None);

    let mail = queue
        .upsert_schedule(tickler::NewSchedule::for_args("digest", "0 8 * * *", &email(4)).unwrap())
        .unwrap();
    assert_eq!(mail.kind, "send_email");
    assert_eq!(serde_json::from_value::<SendEmail>(mail.payload).unwrap(), email(4));
    assert_eq!((mail.queue.as_str(), mail.priority, mail.timeout), ("mail", 7, Some(secs(90))));
    let slot = mail.limit.expect("the args' limit");
    assert_eq!((slot.name.as_str(), slot.key.as_str(), slot.weight), ("mail-template", "welcome", 2));
}
}

contract! {
/// A job of a type with no fields (or of a unit type) runs from a `null`
/// payload, as a schedule made with `NewSchedule::new` or a job enqueued by
/// kind alone (`tickler enqueue heartbeat`) has: it went dead with "invalid
/// type: null, expected struct Heartbeat".
fn a_typed_handler_of_an_empty_type_runs_a_job_without_payload() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let id = queue.enqueue(NewJob::new("heartbeat").queue("beats")).unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .queue("beats")
        .threads(1)
        .handler_for(|_: &JobContext, _: Heartbeat| Ok::<(), JobError>(()))
        .start()
        .unwrap();
    wait_until("the job finished", secs(15), || {
        queue.get(id).unwrap().state.is_terminal()
    });
    pool.shutdown(secs(5));
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.last_error);
}
}

contract! {
/// A payload that does not fit its type is an event as well as a dead
/// job, so that an application without a logger sees why: the `Dead`
/// event names the kind, the type and serde's error.
fn a_misfit_payload_is_a_dead_event_that_says_why() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let sub = queue.subscribe(64);
    let misfit = queue
        .enqueue(NewJob::new("plain").payload(serde_json::json!({"n": "nine"})))
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler_for(|_: &JobContext, _: Plain| Ok::<(), JobError>(()))
        .start()
        .unwrap();
    let deadline = std::time::Instant::now() + secs(15);
    let error = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match sub.recv_timeout(left) {
            Some(tickler::Event::Job(e)) if e.job_id == misfit => {
                if let tickler::JobEventKind::Dead { error } = e.what {
                    break error;
                }
            }
            Some(_) => {}
            None => panic!("no Dead event for job {misfit}"),
        }
    };
    pool.shutdown(secs(5));
    assert!(error.contains("\"plain\"") && error.contains("Plain"), "{error}");
    assert!(error.contains("expected u32"), "{error}");
}
}
