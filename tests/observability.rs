//! Features `tracing` and `metrics`: a span per job run that a handler's
//! own events nest under; counters, histograms and gauges through the
//! `metrics` facade; and the log lines of dead and retried jobs. One test
//! (the recorder, subscriber and logger are process-wide).

#[path = "support/mod.rs"]
mod support;

use support::pool;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use pool::{open_queue_slow_retry, secs, temp_db, wait_until};
use std::sync::{Arc, Mutex};
use tickler::{JobContext, JobError, JobState, NewJob, WorkerPool};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Remembers each span's name and fields, and for each event the name of
/// the span it was emitted in.
#[derive(Default)]
struct Spans {
    spans: Mutex<Vec<(String, String)>>,
    events_in: Mutex<Vec<Option<String>>>,
    current: Mutex<std::collections::HashMap<std::thread::ThreadId, Vec<u64>>>,
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

#[derive(Clone, Default)]
struct Sub(Arc<Spans>);

impl Subscriber for Sub {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        let mut spans = self.0.spans.lock().unwrap();
        spans.push((span.metadata().name().to_owned(), fields.0));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        let tid = std::thread::current().id();
        let inside = self
            .0
            .current
            .lock()
            .unwrap()
            .get(&tid)
            .and_then(|s| s.last().copied());
        let name = inside.map(|id| self.0.spans.lock().unwrap()[id as usize - 1].1.clone());
        self.0.events_in.lock().unwrap().push(name);
    }
    fn enter(&self, span: &Id) {
        let tid = std::thread::current().id();
        self.0
            .current
            .lock()
            .unwrap()
            .entry(tid)
            .or_default()
            .push(span.into_u64());
    }
    fn exit(&self, _: &Id) {
        let tid = std::thread::current().id();
        self.0.current.lock().unwrap().entry(tid).or_default().pop();
    }
}

/// Keeps warn and info lines of tickler.
struct Lines(Mutex<Vec<(log::Level, String)>>);

impl log::Log for Lines {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("tickler")
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0
                .lock()
                .unwrap()
                .push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

static LINES: Lines = Lines(Mutex::new(Vec::new()));

#[test]
fn spans_metrics_and_log_lines() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let sub = Sub::default();
    tracing::subscriber::set_global_default(sub.clone()).unwrap();
    log::set_logger(&LINES).unwrap();
    log::set_max_level(log::LevelFilter::Info);

    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let mut pool = WorkerPool::builder(&queue)
        .queue("mail")
        .threads(2)
        .metrics_interval(std::time::Duration::from_millis(100))
        .handler("send", |ctx: &JobContext| {
            tracing::info!("sending");
            match ctx.payload().as_str() {
                Some("fail") => Err(JobError::retry("smtp down")),
                _ => Ok(()),
            }
        })
        .start()
        .unwrap();
    // Two jobs of one key of a limit of 1, in a queue the pool does not
    // serve: one claimed by hand, one blocked.
    queue.set_limit("sync", tickler::Limit::per_key(1)).unwrap();
    for _ in 0..2 {
        queue
            .enqueue(NewJob::new("sync").limit("sync", "a"))
            .unwrap();
    }
    let _held = queue
        .manual()
        .claim("default", "w", 10, std::time::Duration::from_secs(60))
        .unwrap();
    let ok = queue.enqueue(NewJob::new("send").queue("mail")).unwrap();
    queue
        .enqueue(NewJob::new("send").queue("mail").payload("fail".into()))
        .unwrap();
    let dead = queue
        .enqueue(
            NewJob::new("send")
                .queue("mail")
                .max_attempts(1)
                .payload("fail".into()),
        )
        .unwrap();
    wait_until("all three ran", secs(10), || {
        queue.count(JobState::Succeeded).unwrap() == 1
            && queue.count(JobState::Dead).unwrap() == 1
            && queue.count(JobState::Scheduled).unwrap() == 1
    });
    std::thread::sleep(std::time::Duration::from_millis(400));
    pool.shutdown(secs(5));

    // tracing: one span per run, the handler's event inside it.
    let spans = sub.0.spans.lock().unwrap().clone();
    let runs: Vec<&(String, String)> = spans.iter().filter(|(n, _)| n == "tickler.job").collect();
    assert_eq!(runs.len(), 3, "{spans:?}");
    assert!(
        runs.iter().any(|(_, f)| f.contains("kind=send")
            && f.contains(&format!("id={}", ok.0))
            && f.contains("attempt=1")),
        "{runs:?}"
    );
    let events_in = sub.0.events_in.lock().unwrap().clone();
    let inside = events_in
        .iter()
        .filter(|s| s.as_deref().is_some_and(|f| f.contains("kind=send")))
        .count();
    assert_eq!(
        inside, 3,
        "handler events outside the job span: {events_in:?}"
    );

    // metrics.
    let mut started = 0;
    let mut finished = std::collections::HashMap::new();
    let (mut lateness, mut run_time) = (0, 0);
    let mut gauge_dead = None;
    let mut limit_gauges = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        match (key.name(), value) {
            ("tickler_jobs_started_total", DebugValue::Counter(n)) => started += n,
            ("tickler_jobs_finished_total", DebugValue::Counter(n)) => {
                *finished.entry(label("outcome").unwrap()).or_insert(0) += n;
            }
            ("tickler_job_lateness_seconds", DebugValue::Histogram(v)) => lateness += v.len(),
            ("tickler_job_run_seconds", DebugValue::Histogram(v)) => run_time += v.len(),
            ("tickler_jobs", DebugValue::Gauge(v)) if label("state").as_deref() == Some("dead") => {
                gauge_dead = Some(v.into_inner());
            }
            ("tickler_limit_held", DebugValue::Gauge(v)) => {
                limit_gauges.insert(format!("{}:held", label("limit").unwrap()), v.into_inner());
            }
            ("tickler_limit_jobs", DebugValue::Gauge(v)) => {
                let name = format!("{}:{}", label("limit").unwrap(), label("state").unwrap());
                limit_gauges.insert(name, v.into_inner());
            }
            _ => {}
        }
    }
    assert_eq!(started, 3);
    assert_eq!(finished.get("succeeded"), Some(&1), "{finished:?}");
    assert_eq!(finished.get("failed"), Some(&1), "{finished:?}");
    assert_eq!(finished.get("dead"), Some(&1), "{finished:?}");
    assert_eq!((lateness, run_time), (3, 3));
    assert_eq!(gauge_dead, Some(1.0));
    let expected: std::collections::BTreeMap<String, f64> = [
        ("sync:held", 1.0),
        ("sync:holding", 1.0),
        ("sync:blocked", 1.0),
        ("sync:deferred", 0.0),
        ("sync:pending", 0.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(limit_gauges, expected);

    // log: warn for the dead job, info for the retried one.
    let lines = LINES.0.lock().unwrap().clone();
    assert!(
        lines.iter().any(|(l, m)| *l == log::Level::Warn
            && m.contains(&format!("job {dead}"))
            && m.contains("dead")
            && m.contains("smtp down")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|(l, m)| *l == log::Level::Info
            && m.contains("failed attempt 1 of")
            && m.contains("retry in")),
        "{lines:?}"
    );
}
