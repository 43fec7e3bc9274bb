//! A tokio application (say, the back end of a desktop app) that keeps its
//! background work in tickler: typed jobs, a delayed job, a job that fails
//! twice and succeeds on its third attempt with its own backoff, a cron
//! schedule, async handlers, an export whose progress the app shows as a
//! bar and whose result (the file it wrote) the app awaits, and a graceful
//! shutdown on Ctrl-C.
//!
//! ```text
//! cargo run --features tokio --example desktop_app [-- --seconds N] [--db PATH]
//! ```
//!
//! Runs for `N` seconds (default 4) or until Ctrl-C, then shuts the pool
//! down (jobs not started go back to pending for the next start) and
//! prints what the queue holds. Without `--db` the queue file lives in a
//! temporary folder removed at the end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tickler::{
    AsyncQueue, Event, JobArgs, JobContext, JobError, JobEventKind, JobState, NewJob, NewSchedule,
    RetryPolicy, Waited, WorkerPool,
};

/// Make a thumbnail of a picture the user added.
#[derive(Debug, Serialize, Deserialize)]
struct Thumbnail {
    path: String,
    width: u32,
}

impl JobArgs for Thumbnail {
    const KIND: &'static str = "thumbnail";

    // One thumbnail job per picture and size while one is waiting.
    fn unique_key(&self) -> Option<String> {
        Some(format!("thumb:{}:{}", self.path, self.width))
    }
}

/// Show the user a reminder (enqueued with a delay).
#[derive(Debug, Serialize, Deserialize)]
struct Reminder {
    text: String,
}

impl JobArgs for Reminder {
    const KIND: &'static str = "reminder";

    fn priority(&self) -> i32 {
        10
    }
}

/// Upload a backup to a server that is flaky: the first two attempts fail.
#[derive(Debug, Serialize, Deserialize)]
struct Upload {
    file: String,
}

impl JobArgs for Upload {
    const KIND: &'static str = "upload";

    fn max_attempts(&self) -> u32 {
        5
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(30))
    }

    // Short waits for the example; a real app would wait longer.
    fn retry_policy() -> Option<RetryPolicy> {
        Some(RetryPolicy {
            base: Duration::from_millis(300),
            cap: Duration::from_secs(5),
            jitter: false,
        })
    }
}

/// Export a video: reports its progress, returns what it wrote.
#[derive(Debug, Serialize, Deserialize)]
struct Export {
    name: String,
}

impl JobArgs for Export {
    const KIND: &'static str = "export";
}

/// What an export produced: the app opens `path` once the job succeeded.
#[derive(Debug, Serialize, Deserialize)]
struct Exported {
    path: String,
    frames: u32,
}

/// A text progress bar: `[#####.....]  50 % encoding`.
fn bar(fraction: f64, message: &str) -> String {
    let done = (fraction * 20.0).round() as usize;
    format!(
        "[{}{}] {:>3.0} % {message}",
        "#".repeat(done),
        ".".repeat(20 - done.min(20)),
        fraction * 100.0
    )
}

/// Stand-in for real async work (an HTTP call, image decoding on a
/// blocking thread, ...).
async fn work(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let seconds: u64 = arg("--seconds").map_or(Ok(4), |s| s.parse())?;
    let temp = tempfile::tempdir()?;
    let path = arg("--db").map_or_else(|| temp.path().join("app.db"), Into::into);

    // Opening migrates the schema: AsyncQueue does it off the runtime.
    let queue = AsyncQueue::open(path).await?;

    let ticks = Arc::new(AtomicU32::new(0));
    let pool = {
        let ticks = Arc::clone(&ticks);
        // Each job runs as a task on this runtime: a job waiting on the
        // network holds one of the pool's async slots, not a thread.
        WorkerPool::builder(queue.queue())
            .async_concurrency(64)
            .async_handler_for(|_ctx: JobContext, job: Thumbnail| async move {
                work(50).await;
                println!("thumbnail of {} at {} px done", job.path, job.width);
                Ok(())
            })
            .async_handler_for(|_ctx: JobContext, job: Reminder| async move {
                println!("reminder: {}", job.text);
                Ok(())
            })
            .async_handler_for(|ctx: JobContext, job: Upload| async move {
                tokio::select! {
                    () = work(100) => {}
                    reason = ctx.cancelled() => {
                        return Err(JobError::retry(format!("upload stopped: {reason:?}")));
                    }
                }
                if ctx.attempt() < 3 {
                    println!("upload of {} failed (attempt {})", job.file, ctx.attempt());
                    return Err(JobError::retry("server said 503"));
                }
                println!("upload of {} done on attempt {}", job.file, ctx.attempt());
                Ok(())
            })
            .async_handler_for(|ctx: JobContext, job: Export| async move {
                let frames = 5;
                for frame in 1..=frames {
                    work(60).await;
                    // Kept in memory and sent to this process's
                    // subscribers at once; stored a few times a second.
                    ctx.progress(f64::from(frame) / f64::from(frames), "encoding")?;
                }
                // Stored with the success, in the same statement.
                Ok(Exported {
                    path: format!("exports/{}.mp4", job.name),
                    frames,
                })
            })
            .async_handler("autosave", move |_ctx: JobContext| {
                let ticks = Arc::clone(&ticks);
                async move {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
            })
            .start()?
    };

    // A cron schedule (6 fields: every second), fired by the pool's scheduler.
    queue
        .upsert_schedule(NewSchedule::new("autosave", "* * * * * *", "autosave"))
        .await?;
    queue
        .enqueue_args_batch(&[
            Thumbnail {
                path: "beach.jpg".into(),
                width: 256,
            },
            Thumbnail {
                path: "cat.png".into(),
                width: 256,
            },
        ])
        .await?;
    queue
        .enqueue(
            NewJob::from_args(&Reminder {
                text: "stretch your legs".into(),
            })?
            .delay(Duration::from_secs(1)),
        )
        .await?;
    let upload = queue
        .enqueue_args(&Upload {
            file: "backup-1.tar".into(),
        })
        .await?;

    // The export: its progress as a bar (from this process's events),
    // then its result, awaited.
    let events = queue.subscribe(256);
    let export = queue
        .enqueue_args(&Export {
            name: "holiday".into(),
        })
        .await?;
    let show_progress = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let Event::Job(job) = event {
                if job.job_id != export {
                    continue;
                }
                match job.what {
                    JobEventKind::Progress { fraction, message } => {
                        println!("export {}", bar(fraction, &message));
                    }
                    JobEventKind::Succeeded | JobEventKind::Dead { .. } => return,
                    _ => {}
                }
            }
        }
    });
    match queue.wait(export, Duration::from_secs(10)).await? {
        Waited::Succeeded(job) => {
            let exported: Option<Exported> = job.output_as()?;
            if let Some(exported) = exported {
                println!(
                    "export done: {} ({} frames), ready to open",
                    exported.path, exported.frames
                );
            }
        }
        other => println!("export did not succeed: {other:?}"),
    }
    let _ = show_progress.await;

    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C: shutting down"),
        () = tokio::time::sleep(Duration::from_secs(seconds)) => println!("{seconds} s passed: shutting down"),
    }
    let report = pool.shutdown_async(Duration::from_secs(5)).await;
    println!(
        "pool stopped: {} job(s) handed back, {} still running",
        report.released, report.still_running
    );

    let stats = queue.stats().await?;
    let upload = queue.get(upload).await?;
    println!(
        "succeeded {}, waiting {}, dead {}; the upload is {} after {} attempt(s); autosave ran {} time(s)",
        stats.total(JobState::Succeeded),
        stats.total(JobState::Pending) + stats.total(JobState::Scheduled),
        stats.total(JobState::Dead),
        upload.state,
        upload.attempts,
        ticks.load(Ordering::Relaxed)
    );
    Ok(())
}
