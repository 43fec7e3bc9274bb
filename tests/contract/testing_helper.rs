//! `tickler::testing::run_one`: one job run on the test's
//! thread, with a manual clock, its outcome recorded as a pool would.

use crate::support::common;

use common::{fixed_policy, manual_queue_with_policy, secs, t0, temp_db};
use serde::{Deserialize, Serialize};
use tickler::testing::run_one;
use tickler::{JobArgs, JobContext, JobError, JobState, Outcome};

#[derive(Serialize, Deserialize)]
struct Upload {
    file: String,
}

impl JobArgs for Upload {
    const KIND: &'static str = "upload";
}

/// Fails its first two attempts.
fn upload(ctx: &JobContext) -> Result<(), JobError> {
    let args: Upload = ctx.args()?;
    if ctx.attempt() < 3 {
        return Err(JobError::retry(format!("{}: server said 503", args.file)));
    }
    Ok(())
}

contract! {
fn a_retrying_job_runs_step_by_step_under_a_manual_clock() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue
        .enqueue_args(&Upload {
            file: "a.tar".into(),
        })
        .unwrap();

    let first = run_one(&queue, "default", "upload", &upload).unwrap();
    assert_eq!(
        first,
        Some((id, Outcome::Fail("a.tar: server said 503".into())))
    );
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, t0() + chrono::Duration::seconds(1));
    // Not due yet: nothing to run.
    assert_eq!(run_one(&queue, "default", "upload", &upload).unwrap(), None);

    clock.advance(secs(1));
    let second = run_one(&queue, "default", "upload", &upload).unwrap();
    assert!(matches!(second, Some((_, Outcome::Fail(_)))), "{second:?}");
    clock.advance(secs(2));
    let third = run_one(&queue, "default", "upload", &upload).unwrap();
    assert_eq!(third, Some((id, Outcome::Complete)));
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.attempts, 3);
}
}

contract! {
fn a_panic_and_a_misfit_payload_are_recorded_as_a_pool_would() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let misfit = queue
        .enqueue(tickler::NewJob::new("upload").payload(serde_json::json!({"file": 7})))
        .unwrap();
    let (id, outcome) = run_one(&queue, "default", "upload", &upload)
        .unwrap()
        .unwrap();
    assert_eq!(id, misfit);
    assert!(
        matches!(&outcome, Outcome::FailPermanently(m) if m.contains("\"upload\"")),
        "{outcome:?}"
    );
    assert_eq!(queue.get(misfit).unwrap().state, JobState::Dead);

    let boom = queue.enqueue(tickler::NewJob::new("boom")).unwrap();
    let panics = |_: &JobContext| -> Result<(), JobError> { panic!("out of widgets") };
    let (_, outcome) = run_one(&queue, "default", "boom", &panics)
        .unwrap()
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::Fail(m) if m.contains("out of widgets")),
        "{outcome:?}"
    );
    assert_eq!(queue.get(boom).unwrap().attempts, 1);
}
}
