//! Helpers for the worker-pool tests (`tests/pool_*.rs`): a scripted handler
//! whose payload picks the outcome and that records every run, a gate that
//! blocks handlers until the test opens it, and a bounded polling wait.
//!
//! Payload fields read by [`Script`] (all optional; `{}` or `null` is "ok"):
//!
//! - `"block": true` — wait until the recorder's gate opens (at most 30 s);
//! - `"sleep_ms": N` — sleep N ms;
//! - `"wait_cancel_ms": N` — poll `is_cancelled` every 2 ms, up to N ms;
//! - `"snooze_ms": N` — end with `JobError::Snooze(now + N ms)`;
//! - `"action"`: `"ok"` (default), `"error"` (`JobError::Retry`),
//!   `"permanent"` (`JobError::Permanent`), `"panic"`, `"shape"`
//!   (`payload_as` into a struct the payload does not fit, returned with `?`);
//! - `"message"` — the error or panic message (default `"scripted <action>"`).
//!
//! Steps run in that order, so `{"block": true, "wait_cancel_ms": 5000,
//! "action": "permanent"}` blocks, then waits to be cancelled, then fails.
#![allow(dead_code)]

pub use super::common::{ms, secs, temp_db, wait_until};
pub use super::engine;

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tickler::{
    CancelReason, Durability, Handler, JobContext, JobError, JobId, Queue, RetryPolicy, RunToken,
};

/// A queue on `path` with the system clock and `Durability::Normal`.
pub fn open_queue(path: &Path) -> Queue {
    Queue::builder(engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue")
}

/// A backoff of one hour, without jitter: a failed job is `scheduled` far
/// enough ahead that no pool runs it again during a test.
pub fn hour_backoff() -> RetryPolicy {
    RetryPolicy {
        base: secs(3600),
        cap: secs(3600),
        jitter: false,
    }
}

/// No backoff: a failed job is due again at once.
pub fn no_backoff() -> RetryPolicy {
    RetryPolicy {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        jitter: false,
    }
}

/// As [`open_queue`], with a one-hour fixed backoff ([`hour_backoff`]).
pub fn open_queue_slow_retry(path: &Path) -> Queue {
    Queue::builder(engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(hour_backoff())
        .open()
        .expect("open queue")
}

/// Runs `n` jobs of `kind` (whose handler must return at once) through the
/// pools serving it and waits until all have succeeded: a pool that has seen
/// its handlers return fast claims ahead of its free threads.
pub fn warm_up(queue: &Queue, kind: &str, n: usize) {
    let before = queue.count(tickler::JobState::Succeeded).unwrap();
    queue
        .enqueue_batch((0..n).map(|_| tickler::NewJob::new(kind)).collect())
        .unwrap();
    wait_until("the warm-up jobs ran", secs(30), || {
        queue.count(tickler::JobState::Succeeded).unwrap() == before + n as u64
    });
}

/// A gate handlers wait on until the test opens it.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    /// Lets every current and future waiter through.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// Waits until the gate is open, at most `timeout`. True if it opened.
    pub fn wait(&self, timeout: Duration) -> bool {
        let guard = self.open.lock().unwrap();
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |open| !*open)
            .unwrap();
        *guard
    }
}

/// One start of a handler.
#[derive(Debug, Clone)]
pub struct Run {
    pub job_id: JobId,
    pub run_token: RunToken,
    pub attempt: u32,
    pub kind: String,
    /// Name of the worker thread that ran it.
    pub thread: String,
    /// When the handler started, by the queue's clock (on PostgreSQL the
    /// server's, which is what due times and snoozes are measured by).
    pub started_at: DateTime<Utc>,
    pub started: Instant,
}

/// One end of a handler (not recorded when it panicked).
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub job_id: JobId,
    pub run_token: RunToken,
    /// `ctx.cancel_reason()` as the handler returned.
    pub cancel_reason: Option<CancelReason>,
    /// `ctx.cancel_reason()` when the handler's cancel wait (if any) ended.
    pub seen_cancel: Option<CancelReason>,
    pub ended: Instant,
}

/// What handlers did, shared between a test and its handlers.
#[derive(Debug, Default)]
pub struct Recorder {
    pub runs: Mutex<Vec<Run>>,
    pub ends: Mutex<Vec<RunEnd>>,
    pub gate: Gate,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    /// A handler recording into this recorder.
    pub fn script(self: &Arc<Self>) -> Script {
        Script {
            rec: Arc::clone(self),
        }
    }

    /// Every start so far.
    pub fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    /// Every end so far.
    pub fn ends(&self) -> Vec<RunEnd> {
        self.ends.lock().unwrap().clone()
    }

    pub fn started(&self) -> usize {
        self.runs.lock().unwrap().len()
    }

    pub fn ended(&self) -> usize {
        self.ends.lock().unwrap().len()
    }

    /// Starts of `id`.
    pub fn runs_of(&self, id: JobId) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.job_id == id).collect()
    }

    /// Ends of `id`.
    pub fn ends_of(&self, id: JobId) -> Vec<RunEnd> {
        self.ends().into_iter().filter(|r| r.job_id == id).collect()
    }

    /// Number of starts per job id.
    pub fn runs_per_id(&self) -> HashMap<JobId, usize> {
        let mut counts = HashMap::new();
        for run in self.runs.lock().unwrap().iter() {
            *counts.entry(run.job_id).or_insert(0) += 1;
        }
        counts
    }
}

/// The scripted handler; see the module docs for the payload.
#[derive(Debug, Clone)]
pub struct Script {
    pub rec: Arc<Recorder>,
}

/// A shape no test payload has: `payload_as::<Strict>()` fails on them.
#[derive(Debug, serde::Deserialize)]
pub struct Strict {
    pub must_have_this: u64,
}

impl Script {
    fn record_start(&self, ctx: &JobContext) {
        self.rec.runs.lock().unwrap().push(Run {
            job_id: ctx.job_id(),
            run_token: ctx.run_token().clone(),
            attempt: ctx.attempt(),
            kind: ctx.kind().to_owned(),
            thread: std::thread::current()
                .name()
                .unwrap_or("(unnamed)")
                .to_owned(),
            started_at: ctx.now(),
            started: Instant::now(),
        });
    }

    /// The steps after the waits: the snooze or the action, and the end.
    fn end_with(
        &self,
        ctx: &JobContext,
        seen_cancel: Option<CancelReason>,
    ) -> Result<(), JobError> {
        let p = ctx.payload().clone();
        let action = p["action"].as_str().unwrap_or("ok").to_owned();
        let message = p["message"]
            .as_str()
            .map_or_else(|| format!("scripted {action}"), str::to_owned);
        let end = |rec: &Recorder| {
            rec.ends.lock().unwrap().push(RunEnd {
                job_id: ctx.job_id(),
                run_token: ctx.run_token().clone(),
                cancel_reason: ctx.cancel_reason(),
                seen_cancel,
                ended: Instant::now(),
            });
        };
        if let Some(n) = p["snooze_ms"].as_u64() {
            end(&self.rec);
            return Err(ctx.snooze_for(ms(n)));
        }
        let result = match action.as_str() {
            "ok" => Ok(()),
            "error" => Err(JobError::retry(message)),
            "permanent" => Err(JobError::permanent(message)),
            "panic" => panic!("{message}"),
            "shape" => ctx.payload_as::<Strict>().map(|_| ()),
            other => panic!("test bug: unknown scripted action {other:?}"),
        };
        end(&self.rec);
        result
    }

    /// The same script as an async handler (feature `tokio`): the gate is
    /// waited for on the blocking pool, sleeps are tokio's, and the cancel
    /// wait is a `select!` on `ctx.cancelled()`.
    #[cfg(feature = "tokio")]
    pub async fn run_async(self, ctx: JobContext) -> Result<(), JobError> {
        self.record_start(&ctx);
        let p = ctx.payload().clone();
        if p["block"].as_bool() == Some(true) {
            let rec = Arc::clone(&self.rec);
            tokio::task::spawn_blocking(move || rec.gate.wait(secs(30)))
                .await
                .unwrap();
        }
        if let Some(n) = p["sleep_ms"].as_u64() {
            tokio::time::sleep(ms(n)).await;
        }
        let mut seen_cancel = None;
        if let Some(n) = p["wait_cancel_ms"].as_u64() {
            tokio::select! {
                _ = ctx.cancelled() => {}
                () = tokio::time::sleep(ms(n)) => {}
            }
            seen_cancel = ctx.cancel_reason();
        }
        self.end_with(&ctx, seen_cancel)
    }
}

impl Handler for Script {
    type Output = ();

    fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        self.record_start(ctx);
        let p = ctx.payload().clone();
        if p["block"].as_bool() == Some(true) {
            self.rec.gate.wait(secs(30));
        }
        if let Some(n) = p["sleep_ms"].as_u64() {
            std::thread::sleep(ms(n));
        }
        let mut seen_cancel = None;
        if let Some(n) = p["wait_cancel_ms"].as_u64() {
            let until = Instant::now() + ms(n);
            while !ctx.is_cancelled() && Instant::now() < until {
                std::thread::sleep(ms(2));
            }
            seen_cancel = ctx.cancel_reason();
        }
        self.end_with(ctx, seen_cancel)
    }
}

/// How a pool test registers its scripted handlers: as sync handlers, or
/// (feature `tokio`) as async handlers on a tokio runtime with one worker
/// thread. The guarantee tests run their one body in each flavor
/// ([`flavored_tests!`]).
pub enum Flavor {
    Sync,
    #[cfg(feature = "tokio")]
    Tokio(tokio::runtime::Runtime),
}

impl Flavor {
    pub fn sync() -> Flavor {
        Flavor::Sync
    }

    #[cfg(feature = "tokio")]
    pub fn tokio() -> Flavor {
        Flavor::Tokio(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a tokio runtime"),
        )
    }
}

/// `WorkerPoolBuilder::handler` for a [`Script`], in a test's [`Flavor`].
pub trait ScriptHandler {
    fn script_handler(self, flavor: &Flavor, kind: &str, script: Script) -> Self;
}

impl ScriptHandler for tickler::WorkerPoolBuilder {
    fn script_handler(self, flavor: &Flavor, kind: &str, script: Script) -> Self {
        match flavor {
            Flavor::Sync => self.handler(kind, script),
            #[cfg(feature = "tokio")]
            Flavor::Tokio(runtime) => self
                .runtime(runtime.handle().clone())
                .async_handler(kind, move |ctx| script.clone().run_async(ctx)),
        }
    }
}

/// For each `name`, a module `name` with the bodies `sync` (the body
/// `name(&Flavor::Sync)`) and, with the `tokio` feature, `tokio` (the same
/// body with async handlers), each run on every engine: one body, both
/// kinds of handler, every engine (`name::sync::sqlite`, …).
///
/// `flavored_tests!(poolers: …)` adds the cases through PgBouncer
/// (`contract! { poolers: … }`).
#[allow(unused_macros)]
macro_rules! flavored_tests {
    (poolers: $($name:ident),* $(,)?) => {
        $(
            mod $name {
                fn sync() {
                    super::$name(&$crate::support::pool::Flavor::sync());
                }

                mod sync {
                    $crate::engine_cases!(poolers: super::sync);
                }

                #[cfg(feature = "tokio")]
                fn tokio() {
                    super::$name(&$crate::support::pool::Flavor::tokio());
                }

                #[cfg(feature = "tokio")]
                mod tokio {
                    $crate::engine_cases!(poolers: super::tokio);
                }
            }
        )*
    };
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                fn sync() {
                    super::$name(&$crate::support::pool::Flavor::sync());
                }

                mod sync {
                    $crate::engine_cases!(super::sync);
                }

                #[cfg(feature = "tokio")]
                fn tokio() {
                    super::$name(&$crate::support::pool::Flavor::tokio());
                }

                #[cfg(feature = "tokio")]
                mod tokio {
                    $crate::engine_cases!(super::tokio);
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use flavored_tests;

/// A 1-thread pool with `lease` whose handler is the recorder's script,
/// and one job that blocks at the recorder's gate, already started.
pub fn one_blocked_job(
    queue: &Queue,
    rec: &Arc<Recorder>,
    lease: Duration,
) -> (tickler::WorkerPool, JobId) {
    one_blocked_job_in(&Flavor::Sync, queue, rec, lease)
}

/// [`one_blocked_job`] with the script registered in `flavor`.
pub fn one_blocked_job_in(
    flavor: &Flavor,
    queue: &Queue,
    rec: &Arc<Recorder>,
    lease: Duration,
) -> (tickler::WorkerPool, JobId) {
    let pool = tickler::WorkerPool::builder(queue)
        .threads(1)
        .lease(lease)
        .script_handler(flavor, "script", rec.script())
        .start()
        .unwrap();
    let id = queue
        .enqueue(tickler::NewJob::new("script").payload(serde_json::json!({"block": true})))
        .unwrap();
    wait_until("the handler started", secs(10), || rec.started() == 1);
    (pool, id)
}
