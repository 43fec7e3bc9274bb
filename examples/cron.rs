//! A recurring schedule running in a worker pool.
//!
//! ```text
//! cargo run --example cron [-- DB_PATH]
//! ```
//!
//! Stores a schedule that fires every second (a 6-field cron expression,
//! seconds first) read in Europe/Berlin, previews its next ticks, starts a
//! worker pool (which runs the scheduler thread by default), and exits
//! after the handler has run three ticks. Each job is due at exactly its
//! tick's instant; the handler prints how late it started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tickler::{JobContext, JobError, NewSchedule, Queue, WorkerPool};

fn main() -> tickler::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let path = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join(format!("tickler-cron-{}.db", std::process::id())),
        Into::into,
    );
    let queue = Queue::open(&path)?;

    let spec = NewSchedule::new("heartbeat-log", "* * * * * *", "log_tick")
        .time_zone("Europe/Berlin")
        .payload(serde_json::json!({"message": "still alive"}));
    println!("next ticks of {:?}:", spec.name());
    for tick in queue.next_ticks(&spec, 3)? {
        println!("  {} = {} local", tick.at, tick.local);
    }
    queue.upsert_schedule(spec)?;

    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("log_tick", move |ctx: &JobContext| {
            let late = ctx.now() - ctx.lease().run_at;
            println!(
                "tick {} ({}): {} ms after its instant",
                ctx.lease().run_at,
                ctx.payload()["message"],
                late.num_milliseconds()
            );
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<(), JobError>(())
        })
        .start()?;

    let deadline = Instant::now() + Duration::from_secs(10);
    while ran.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.shutdown(Duration::from_secs(2));
    queue.delete_schedule("heartbeat-log")?;
    println!("ran {} ticks", ran.load(Ordering::SeqCst));
    if std::env::args().nth(1).is_none() {
        drop(queue);
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(name);
        }
    }
    Ok(())
}
