//! A Raspberry Pi's pipeline: fetch a reading, transform it, then upload
//! it to three servers at once, each step only after the last one
//! succeeded, and a report when every upload has ended, whatever they
//! did. The steps go in as one graph; each step returns an output that the
//! next reads from its parent. The three uploads are the members of a
//! batch whose `on_finish` callback is the report: it reads the batch's
//! counters and each upload's output. The batch's `on_failure` callback,
//! an alert, runs only if an upload failed.
//!
//! ```text
//! cargo run --example pipeline [-- --fail-upload] [--db PATH]
//! ```
//!
//! With `--fail-upload` the upload to the backup server fails for good:
//! the report still runs and says so, and the alert runs. Without `--db`
//! the queue file lives in a temporary folder removed at the end.

use std::time::Duration;

use serde_json::json;
use tickler::{Graph, JobContext, JobError, JobState, NewBatch, NewJob, Queue, WorkerPool};

/// Where the reading goes: one upload job each.
const SERVERS: [&str; 3] = ["primary", "backup", "archive"];

/// The output of the one parent of the running job.
fn parent_output(ctx: &JobContext) -> Result<serde_json::Value, JobError> {
    let parents = ctx.parents().map_err(JobError::retry)?;
    let parent = parents
        .first()
        .ok_or_else(|| JobError::permanent("this step runs after another"))?;
    Ok(parent.output.clone().unwrap_or(json!(null)))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let fail_upload = args.iter().any(|a| a == "--fail-upload");
    let temp = tempfile::tempdir()?;
    let path = args
        .iter()
        .position(|a| a == "--db")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| temp.path().join("pipeline.db"), Into::into);
    let queue = Queue::open(&path)?;

    // The batch first: its callbacks wait from now on, and the uploads
    // join it as the graph stores them.
    let batch = queue.open_batch(
        NewBatch::new()
            .description("greenhouse uploads")
            .on_finish(NewJob::new("report"))
            .on_failure(NewJob::new("alert")),
    )?;
    let mut graph = Graph::new()
        .step(
            "fetch",
            NewJob::new("fetch").payload(json!({"sensor": "greenhouse"})),
        )
        .step("transform", NewJob::new("transform"))
        .edge("fetch", "transform");
    for server in SERVERS {
        let upload = NewJob::new("upload")
            .payload(json!({"server": server}))
            .max_attempts(2)
            .batch(batch.id);
        graph = graph.step(server, upload).edge("transform", server);
    }
    let ids = queue.enqueue_graph(graph)?;
    let report = batch.on_finish.expect("opened with on_finish");
    // Unsealed, a batch never finishes: explain says so.
    println!("why the report waits: {}", queue.explain(report)?);
    queue.seal_batch(batch.id)?;
    println!("sealed: {}", queue.explain(report)?);

    let mut pool = WorkerPool::builder(&queue)
        .handler("fetch", |ctx: &JobContext| {
            let sensor = ctx.payload()["sensor"].as_str().unwrap_or("?").to_owned();
            ctx.progress(1.0, "read").ok();
            Ok(json!({"sensor": sensor, "celsius": [21.5, 22.0, 22.75]}))
        })
        .handler("transform", |ctx: &JobContext| {
            let reading = parent_output(ctx)?;
            let values: Vec<f64> = serde_json::from_value(reading["celsius"].clone())
                .map_err(|e| JobError::permanent(format!("bad reading: {e}")))?;
            let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
            Ok(json!({"sensor": reading["sensor"], "mean_celsius": mean}))
        })
        .handler("upload", move |ctx: &JobContext| {
            let summary = parent_output(ctx)?;
            let server = ctx.payload()["server"].as_str().unwrap_or("?").to_owned();
            if fail_upload && server == "backup" {
                return Err(JobError::retry("the server answered 503"));
            }
            let url = format!("https://{server}.example.invalid/readings/1");
            Ok(json!({"server": server, "url": url, "mean_celsius": summary["mean_celsius"]}))
        })
        .handler("report", |ctx: &JobContext| {
            let batch = ctx
                .batch()
                .map_err(JobError::retry)?
                .ok_or_else(|| JobError::permanent("the report is a batch's callback"))?;
            println!(
                "report: {} of {} uploads succeeded, {} dead, {} cancelled",
                batch.succeeded, batch.members, batch.dead, batch.cancelled
            );
            // One page holds this batch; a larger one is read page by
            // page, from the last id seen.
            for upload in ctx.queue().batch_members(batch.id, None, 100)? {
                match upload.state {
                    JobState::Succeeded => {
                        let output = upload.output.unwrap_or(json!(null));
                        let url = output["url"].as_str().unwrap_or("?");
                        println!("  {} -> {url}", output["server"].as_str().unwrap_or("?"));
                    }
                    state => println!(
                        "  {} {state}: {}",
                        upload.payload["server"].as_str().unwrap_or("?"),
                        upload.last_error.as_deref().unwrap_or("-")
                    ),
                }
            }
            Ok(())
        })
        .handler("alert", |ctx: &JobContext| {
            let batch = ctx.batch().map_err(JobError::retry)?;
            let failed = batch.map_or(0, |b| b.dead + b.cancelled);
            println!("alert: {failed} upload(s) failed");
            Ok(())
        })
        .start()?;

    let waited = queue.wait(report, Duration::from_secs(60))?;
    // The alert is released with the report, or cancelled if every upload
    // succeeded: either way it ends.
    let alert = queue.wait(
        batch.on_failure.expect("opened with on_failure"),
        Duration::from_secs(60),
    )?;
    pool.shutdown(Duration::from_secs(5));
    for name in ["fetch", "transform"].into_iter().chain(SERVERS) {
        println!("{name:>9}: {}", queue.get(ids[name])?.state);
    }
    for (name, job) in [("report", waited.job()), ("alert", alert.job())] {
        if let Some(job) = job {
            println!("{name:>9}: {}", job.state);
        }
    }
    Ok(())
}
