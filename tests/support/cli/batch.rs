//! A batch worth showing, for the tests of `tickler batch`, `tickler show`
//! and the dashboard's batch page (tests/cli/batch.rs).

use super::Env;
use tickler::{BatchId, JobId, NewBatch, NewJob, Outcome};

/// A description no page or terminal may take as markup or a control
/// sequence.
pub const HOSTILE: &str = "<script>alert('x')</script> & \"mail\" \u{1b}[2J";

/// The batch of [`batched`] and its jobs.
pub struct Batched {
    pub batch: BatchId,
    /// Succeeded with an output holding markup and a `token` key.
    pub succeeded: JobId,
    /// Dead, its error holding markup.
    pub dead: JobId,
    /// Pending.
    pub pending: JobId,
    /// Waiting: runs after `pending`.
    pub waiting: JobId,
    /// The `on_success` callback (kind `notify`), waiting.
    pub on_success: JobId,
    /// The `on_finish` callback (kind `report`), waiting.
    pub on_finish: JobId,
}

/// A sealed batch with [`HOSTILE`] as its description, an `on_success`
/// and an `on_finish` callback, and four members: one succeeded, one
/// dead, one pending and one waiting after it; so 4 members, 2 remaining,
/// 1 succeeded, 1 dead, 0 cancelled. Queue `default` holds nothing else.
pub fn batched(env: &Env) -> Batched {
    env.run(&["init"]).ok();
    let queue = env.queue();
    let batch = queue
        .open_batch(
            NewBatch::new()
                .description(HOSTILE)
                .on_success(NewJob::new("notify"))
                .on_finish(NewJob::new("report")),
        )
        .unwrap();
    let member = |kind: &str| {
        queue
            .enqueue(NewJob::new(kind).max_attempts(1).batch(batch.id))
            .unwrap()
    };
    let claim = |id: JobId| {
        let mut leases = crate::support::limits::claim(&queue, 1);
        assert_eq!(crate::support::limits::ids(&leases), vec![id]);
        leases.remove(0)
    };
    let succeeded = member("export");
    let output = tickler::Output::new(
        &serde_json::json!({"path": "<b>exports/a.mp4</b>", "token": "s3cret"}),
    )
    .unwrap()
    .expect("not null");
    queue
        .manual()
        .record_outcomes(&[(&claim(succeeded), Outcome::CompleteWith(output))])
        .unwrap()
        .remove(0)
        .unwrap();
    let dead = member("export");
    queue
        .manual()
        .fail_permanently(&claim(dead), "broken <i>pipe</i>")
        .unwrap();
    let pending = member("export");
    let waiting = queue
        .enqueue(NewJob::new("upload").after(&[pending]).batch(batch.id))
        .unwrap();
    let batch = queue.seal_batch(batch.id).unwrap();
    assert_eq!(
        (batch.members, batch.remaining, batch.succeeded, batch.dead),
        (4, 2, 1, 1)
    );
    Batched {
        batch: batch.id,
        succeeded,
        dead,
        pending,
        waiting,
        on_success: batch.on_success.unwrap(),
        on_finish: batch.on_finish.unwrap(),
    }
}
