//! Batches run by a worker pool: a handler reads its batch with
//! `JobContext::batch` (a member, a callback, a job of no batch), and the
//! `on_finish` callback, released by the last member's end, reads the
//! counters and, page by page, every member's output.

use crate::support::common;
use crate::support::pool;

use common::{secs, temp_db};
use pool::open_queue;
use serde_json::{json, Value};
use tickler::{
    BatchCallback, JobContext, JobError, JobState, NewBatch, NewJob, Waited, WorkerPool,
};

/// What a handler saw of its batch: `null` for none, else the batch's id,
/// which callback the job is (`null` for a member) and the counters.
fn seen(ctx: &JobContext) -> Result<Value, JobError> {
    let Some(batch) = ctx.batch().map_err(JobError::retry)? else {
        return Ok(Value::Null);
    };
    Ok(json!({
        "batch": batch.id.0,
        "callback": batch.which_callback(ctx.job_id()),
        "counts": [batch.members, batch.remaining, batch.succeeded, batch.dead, batch.cancelled],
    }))
}

contract! {
fn a_handler_reads_its_batch_and_the_callback_reads_the_members_outputs() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let batch = queue
        .open_batch(NewBatch::new().on_finish(NewJob::new("report")))
        .unwrap();
    let members = queue
        .enqueue_batch(
            (0..5)
                .map(|n| {
                    NewJob::new("upload")
                        .payload(json!({ "n": n }))
                        .batch(batch.id)
                        .max_attempts(1)
                })
                .collect(),
        )
        .unwrap();
    let alone = queue.enqueue(NewJob::new("upload").payload(json!({ "n": 9 }))).unwrap();
    queue.seal_batch(batch.id).unwrap();

    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("upload", |ctx: &JobContext| {
            let n = ctx.payload()["n"].as_u64().unwrap_or(0);
            if n == 3 {
                return Err(JobError::permanent("the server answered 403"));
            }
            Ok(json!({ "n": n, "seen": seen(ctx)? }))
        })
        .handler("report", |ctx: &JobContext| {
            let batch = ctx.batch().map_err(JobError::retry)?.expect("a callback has a batch");
            // Two members a page: the paging a callback of a large batch
            // needs.
            let mut outputs = Vec::new();
            let mut after = None;
            loop {
                let page = ctx
                    .queue()
                    .batch_members(batch.id, after, 2)
                    .map_err(JobError::retry)?;
                let Some(last) = page.last() else { break };
                after = Some(last.id);
                outputs.extend(page.into_iter().map(|m| {
                    json!([m.id.0, m.state.to_string(), m.output.map(|o| o["n"].clone())])
                }));
            }
            Ok(json!({ "seen": seen(ctx)?, "outputs": outputs }))
        })
        .start()
        .unwrap();

    let report = match queue.wait(batch.on_finish.unwrap(), secs(30)).unwrap() {
        Waited::Succeeded(job) => job.output.unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(matches!(queue.wait(alone, secs(30)).unwrap(), Waited::Succeeded(_)));
    pool.shutdown(secs(5));
    assert_eq!(
        report["seen"],
        json!({ "batch": batch.id.0, "callback": BatchCallback::OnFinish, "counts": [5, 0, 4, 1, 0] })
    );
    let outputs: Vec<Value> = members
        .iter()
        .enumerate()
        .map(|(n, id)| {
            if n == 3 {
                json!([id.0, "dead", null])
            } else {
                json!([id.0, "succeeded", n])
            }
        })
        .collect();
    assert_eq!(report["outputs"], json!(outputs));

    // A member sees its batch and is no callback; a job of no batch sees
    // none.
    let member = queue.get(members[0]).unwrap().output.unwrap();
    assert_eq!(member["seen"]["batch"], json!(batch.id.0));
    assert_eq!(member["seen"]["callback"], Value::Null);
    assert_eq!(queue.get(alone).unwrap().state, JobState::Succeeded);
    assert_eq!(queue.get(alone).unwrap().output.unwrap()["seen"], Value::Null);
}
}
