//! Outputs (`Handler::Output`, `Outcome::CompleteWith`, `Job::output`):
//! what a handler returns is stored by the statement that marks its job
//! succeeded, so there is never a success without its output nor an
//! output without its success; a stale holder's output is refused with its
//! outcome; an output that cannot be stored fails its job alone, dead,
//! with both sizes; `wait` answers with it.

use crate::support::common;
use crate::support::pool;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use pool::open_queue;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickler::{
    Error, JobArgs, JobContext, JobError, JobState, NewJob, Outcome, Output, Waited, WorkerPool,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Export {
    name: String,
}

/// What an export produced: where the file is and how big.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Exported {
    path: String,
    bytes: u64,
}

impl JobArgs for Export {
    const KIND: &'static str = "export";
}

contract! {
fn a_handlers_output_is_stored_with_its_success_and_waited_for() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler_for(|_: &JobContext, args: Export| {
            Ok::<_, JobError>(Exported { path: format!("exports/{}.mp4", args.name), bytes: 42 })
        })
        .handler("count", |ctx: &JobContext| {
            Ok::<_, JobError>(ctx.payload()["n"].as_u64().unwrap_or(0) * 2)
        })
        .handler("quiet", |_: &JobContext| Ok::<(), JobError>(()))
        .start()
        .unwrap();

    let export = queue.enqueue_args(&Export { name: "holiday".into() }).unwrap();
    let job = match queue.wait(export, secs(30)).unwrap() {
        Waited::Succeeded(job) => job,
        other => panic!("{other:?}"),
    };
    let expected = Exported { path: "exports/holiday.mp4".into(), bytes: 42 };
    assert_eq!(job.output_as::<Exported>().unwrap(), Some(expected.clone()));
    assert_eq!(queue.get(export).unwrap().output, Some(json!(expected)));

    let count = queue.enqueue(NewJob::new("count").payload(json!({"n": 21}))).unwrap();
    match queue.wait(count, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, Some(json!(42))),
        other => panic!("{other:?}"),
    }

    // `()` stores nothing; a job still waiting has no output.
    let quiet = queue.enqueue(NewJob::new("quiet")).unwrap();
    match queue.wait(quiet, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.output, None),
        other => panic!("{other:?}"),
    }
    let later = queue
        .enqueue(NewJob::new("count").run_at(chrono::Utc::now() + chrono::Duration::hours(1)))
        .unwrap();
    assert_eq!(queue.get(later).unwrap().output, None);
    pool.shutdown(secs(5));
}
}

contract! {
/// One byte past the cap fails that job alone, dead at once (a second
/// attempt would most likely return as much), with both sizes in its
/// error; the cap itself is stored; the pool's other jobs go on.
fn an_output_past_the_cap_makes_its_job_dead_with_both_sizes() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    // A JSON string of n bytes: its n - 2 characters and two quotes.
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("big", |ctx: &JobContext| {
            let n = ctx.payload()["n"].as_u64().unwrap() as usize;
            Ok::<_, JobError>("x".repeat(n - 2))
        })
        .start()
        .unwrap();
    let cap = tickler::MAX_OUTPUT_BYTES;
    let over = queue
        .enqueue(NewJob::new("big").payload(json!({"n": cap + 1})).max_attempts(5))
        .unwrap();
    let at_cap = queue.enqueue(NewJob::new("big").payload(json!({"n": cap}))).unwrap();
    let job = match queue.wait(over, secs(30)).unwrap() {
        Waited::Dead(job) => job,
        other => panic!("{other:?}"),
    };
    let error = job.last_error.clone().unwrap_or_default();
    assert!(
        error.contains(&(cap + 1).to_string()) && error.contains(&cap.to_string()),
        "{error}"
    );
    assert_eq!((job.attempts, job.output), (1, None));
    match queue.wait(at_cap, secs(30)).unwrap() {
        Waited::Succeeded(job) => {
            assert_eq!(job.output.unwrap().as_str().map(str::len), Some(cap - 2));
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));

    // Made by hand: refused with a typed error before anything is written.
    match Output::new(&"y".repeat(cap)) {
        Err(Error::OutputTooLarge { size, limit }) => assert_eq!((size, limit), (cap + 2, cap)),
        other => panic!("{other:?}"),
    }
    assert_eq!(Output::new(&()).unwrap(), None);
}
}

contract! { poolers:
/// A holder whose lease was reaped reports success with an output: it is
/// refused (LeaseLost) and nothing of it is stored; the new holder's
/// output is the job's. An outcome other than success stores none.
fn a_stale_holders_output_is_refused_and_the_holders_is_stored() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
    let first = queue.manual().claim("default", "w1", 1, secs(30)).unwrap().remove(0);
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2));
    let second = queue.manual().claim("default", "w2", 1, secs(30)).unwrap().remove(0);

    let stale = Outcome::CompleteWith(Output::new(&json!({"from": "w1"})).unwrap().unwrap());
    let recorded = queue.manual().record_outcomes(&[(&first, stale)]).unwrap();
    assert!(matches!(recorded[0], Err(Error::LeaseLost { .. })), "{recorded:?}");
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.output), (JobState::Running, None));

    // The holder fails first: a failed attempt stores no output.
    queue.manual().fail(&second, "try again").unwrap();
    clock.advance(secs(60));
    let third = queue.manual().claim("default", "w3", 1, secs(30)).unwrap().remove(0);
    assert_eq!(queue.get(id).unwrap().output, None);
    let mine = Outcome::CompleteWith(Output::new(&json!({"from": "w3"})).unwrap().unwrap());
    // Recorded beside a plain success of another job, which the engines
    // complete together in one statement.
    let other = queue.enqueue(NewJob::new("k")).unwrap();
    let fourth = queue.manual().claim("default", "w4", 1, secs(30)).unwrap().remove(0);
    assert_eq!(fourth.job_id, other);
    let recorded = queue
        .manual()
        .record_outcomes(&[(&third, mine), (&fourth, Outcome::Complete)])
        .unwrap();
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.output), (JobState::Succeeded, Some(json!({"from": "w3"}))));
    assert_eq!(queue.get(other).unwrap().output, None);
    // Refused after the end too.
    let late = Outcome::CompleteWith(Output::new(&json!("late")).unwrap().unwrap());
    assert!(queue.manual().record_outcomes(&[(&third, late)]).unwrap()[0].is_err());
    assert_eq!(queue.get(id).unwrap().output, Some(json!({"from": "w3"})));
}
}
