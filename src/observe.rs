//! What a worker pool reports to the `tracing` and `metrics` facades
//! (features `tracing` and `metrics`); without them every function here is
//! empty and compiles away.
//!
//! Metric names and labels (all per `queue` and `kind`):
//!
//! - `tickler_jobs_started_total` (counter): handlers started.
//! - `tickler_jobs_finished_total` (counter, label `outcome`: `succeeded`,
//!   `failed`, `dead`, `snoozed`, `timed_out`, `lease_lost`): outcomes.
//! - `tickler_job_lateness_seconds` (histogram): from the job's due time
//!   to its handler's start.
//! - `tickler_job_run_seconds` (histogram, label `outcome`): how long the
//!   handler ran.
//! - `tickler_jobs` (gauge, labels `queue` and `state`): jobs in the file,
//!   from [`crate::Queue::stats`], set by each pool every
//!   [`crate::WorkerPoolBuilder::metrics_interval`].

use crate::lease::Lease;
use std::time::Duration;

/// Entered for the whole run of one handler: a `tracing` span
/// `tickler.job` with the job's `kind`, `id`, `attempt` and `queue`; an
/// async handler's task runs inside it too ([`in_run_span`]).
#[cfg(feature = "tracing")]
pub(crate) fn run_span(lease: &Lease) -> tracing::span::EnteredSpan {
    job_span(lease).entered()
}

#[cfg(feature = "tracing")]
fn job_span(lease: &Lease) -> tracing::Span {
    tracing::info_span!(
        "tickler.job",
        kind = %lease.kind,
        id = lease.job_id.0,
        attempt = lease.attempt,
        queue = %lease.queue
    )
}

/// An async handler's run inside the span of [`run_span`], entered at
/// each poll.
#[cfg(all(feature = "tracing", feature = "tokio"))]
pub(crate) fn in_run_span<F: std::future::Future>(
    lease: &Lease,
    run: F,
) -> tracing::instrument::Instrumented<F> {
    tracing::Instrument::instrument(run, job_span(lease))
}

#[cfg(all(not(feature = "tracing"), feature = "tokio"))]
pub(crate) fn in_run_span<F: std::future::Future>(_lease: &Lease, run: F) -> F {
    run
}

/// What `run_span` returns without the `tracing` feature: nothing to enter.
#[cfg(not(feature = "tracing"))]
pub(crate) struct NoSpan;

#[cfg(not(feature = "tracing"))]
pub(crate) fn run_span(_lease: &Lease) -> NoSpan {
    NoSpan
}

/// The limits' safety sweep made `n` blocked jobs pending.
#[cfg(feature = "metrics")]
pub(crate) fn limit_sweep_unblocked(n: u64) {
    metrics::counter!("tickler_limit_sweep_unblocked_total").increment(n);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn limit_sweep_unblocked(_n: u64) {}

/// A handler starts, `lateness` after its job was due.
#[cfg(feature = "metrics")]
pub(crate) fn started(lease: &Lease, lateness: Duration) {
    let labels = [("queue", lease.queue.clone()), ("kind", lease.kind.clone())];
    metrics::counter!("tickler_jobs_started_total", &labels).increment(1);
    metrics::histogram!("tickler_job_lateness_seconds", &labels).record(lateness.as_secs_f64());
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn started(_lease: &Lease, _lateness: Duration) {}

/// A run's outcome was recorded (or refused: `lease_lost`).
#[cfg(feature = "metrics")]
pub(crate) fn finished(lease: &Lease, outcome: &'static str, run_time: Option<Duration>) {
    let labels = [
        ("queue", lease.queue.clone()),
        ("kind", lease.kind.clone()),
        ("outcome", outcome.to_owned()),
    ];
    metrics::counter!("tickler_jobs_finished_total", &labels).increment(1);
    if let Some(run_time) = run_time {
        metrics::histogram!("tickler_job_run_seconds", &labels).record(run_time.as_secs_f64());
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn finished(_lease: &Lease, _outcome: &'static str, _run_time: Option<Duration>) {}

/// Sets the `tickler_jobs` gauges from the queue's counts: every state of
/// every queue seen so far (`known`), so that a count that fell to zero
/// reads zero rather than its last value.
#[cfg(feature = "metrics")]
pub(crate) fn job_gauges(queue: &crate::Queue, known: &mut std::collections::BTreeSet<String>) {
    let stats = match queue.stats() {
        Ok(stats) => stats,
        Err(e) => {
            log::warn!("reading job counts for the tickler_jobs gauges failed: {e}");
            return;
        }
    };
    known.extend(stats.counts.keys().map(|(name, _)| name.clone()));
    for name in known.iter() {
        for state in crate::JobState::ALL {
            let n = stats
                .counts
                .get(&(name.clone(), state))
                .copied()
                .unwrap_or(0);
            metrics::gauge!("tickler_jobs", "queue" => name.clone(), "state" => state.as_str())
                .set(n as f64);
        }
    }
}

/// Sets the per-limit gauges from [`crate::Queue::limit_usage`], summed over
/// each limit's keys (a label per key could be one per user):
/// `tickler_limit_held{limit}`, the weight its lease holders hold, and
/// `tickler_limit_jobs{limit, state}` for `holding`, `blocked`, `deferred`
/// and `pending`; every limit seen so far (`known`), so that a count that
/// fell to zero reads zero. Reads every unfinished limited job, once per
/// metrics interval.
#[cfg(feature = "metrics")]
pub(crate) fn limit_gauges(queue: &crate::Queue, known: &mut std::collections::BTreeSet<String>) {
    let usage = match queue.limit_usage(None) {
        Ok(usage) => usage,
        Err(e) => {
            log::warn!("reading limit usage for the tickler_limit gauges failed: {e}");
            return;
        }
    };
    let mut sums: std::collections::BTreeMap<&str, [u64; 5]> = std::collections::BTreeMap::new();
    for u in &usage {
        let sum = sums.entry(u.name.as_str()).or_default();
        for (i, n) in [u.held, u.holders, u.blocked, u.deferred, u.pending]
            .into_iter()
            .enumerate()
        {
            sum[i] += n;
        }
    }
    known.extend(usage.iter().map(|u| u.name.clone()));
    for name in known.iter() {
        let sum = sums.get(name.as_str()).copied().unwrap_or_default();
        metrics::gauge!("tickler_limit_held", "limit" => name.clone()).set(sum[0] as f64);
        for (state, n) in [
            ("holding", sum[1]),
            ("blocked", sum[2]),
            ("deferred", sum[3]),
            ("pending", sum[4]),
        ] {
            metrics::gauge!("tickler_limit_jobs", "limit" => name.clone(), "state" => state)
                .set(n as f64);
        }
    }
}
