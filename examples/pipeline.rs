//! A Raspberry Pi's pipeline: fetch a reading, transform it, upload it,
//! each step only after the last one succeeded, then a report that runs
//! whatever happened. The steps go in as one graph; each step returns an
//! output that the next reads from its parent.
//!
//! ```text
//! cargo run --example pipeline [-- --fail-upload] [--db PATH]
//! ```
//!
//! With `--fail-upload` the upload fails for good: the report still runs
//! (it asked to, `IfParentFails::Run`) and says so. Without `--db` the
//! queue file lives in a temporary folder removed at the end.

use std::time::Duration;

use serde_json::json;
use tickler::{
    Graph, IfParentFails, JobContext, JobError, JobState, NewJob, Queue, Waited, WorkerPool,
};

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

    let ids = queue.enqueue_graph(
        Graph::new()
            .step(
                "fetch",
                NewJob::new("fetch").payload(json!({"sensor": "greenhouse"})),
            )
            .step("transform", NewJob::new("transform"))
            .step("upload", NewJob::new("upload").max_attempts(2))
            .step("report", NewJob::new("report"))
            .edge("fetch", "transform")
            .edge("transform", "upload")
            .edge_with("upload", "report", IfParentFails::Run),
    )?;
    println!("stored: {ids:?}");
    println!("upload: {}", queue.explain(ids["upload"])?);

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
            if fail_upload {
                return Err(JobError::retry("the server answered 503"));
            }
            Ok(json!({"uploaded": summary, "url": "https://example.invalid/readings/1"}))
        })
        .handler("report", |ctx: &JobContext| {
            let upload = ctx.parents().map_err(JobError::retry)?;
            let upload = &upload[0];
            let line = match upload.state {
                JobState::Succeeded => format!(
                    "report: uploaded {}",
                    upload.output.clone().unwrap_or(json!(null))
                ),
                state => format!(
                    "report: the upload ended {state}: {}",
                    upload.last_error.as_deref().unwrap_or("-")
                ),
            };
            println!("{line}");
            Ok(())
        })
        .start()?;

    let waited = queue.wait(ids["report"], Duration::from_secs(60))?;
    pool.shutdown(Duration::from_secs(5));
    match waited {
        Waited::Succeeded(_) => println!("report done"),
        other => println!("report ended: {other:?}"),
    }
    for (name, id) in &ids {
        let job = queue.get(*id)?;
        println!("{name:>9}: {}", job.state);
    }
    Ok(())
}
