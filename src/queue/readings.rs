//! Readings for operators and dashboards, cheap at any size: counts and
//! lists through each state's index, capped; activity over time through
//! the finish-time index; what is left to do.

use super::Queue;
use crate::engine::types::JobPage;
use crate::error::{Error, Result};
use crate::job::{Job, JobState};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::time::Duration;

/// Counts from [`Ops::counts_by_queue`](crate::Ops::counts_by_queue).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// Number of jobs per (queue, state), at most the cap asked for; states
    /// with no jobs are absent.
    pub counts: BTreeMap<(String, JobState), u64>,
    /// The (queue, state) pairs whose count reached the cap: there are at
    /// least that many jobs.
    pub capped: std::collections::BTreeSet<(String, JobState)>,
}

/// One slice of time from [`Ops::activity`](crate::Ops::activity): how
/// many jobs finished in it and how many of them dead, counted, and how
/// late and how long a sample of them ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityBucket {
    /// Start of the slice (inclusive).
    pub start: DateTime<Utc>,
    /// End of the slice (exclusive); the next slice's start.
    pub end: DateTime<Utc>,
    /// Jobs that reached a finished state (succeeded, dead, cancelled) in
    /// the slice, counted up to the cap given to
    /// [`Ops::activity`](crate::Ops::activity).
    pub finished: u64,
    /// `finished` reached the cap: at least that many finished.
    pub capped: bool,
    /// Dead jobs that finished in the slice, counted up to the same cap
    /// (not read from the sample: jobs that fail finish last, after their
    /// retries, so the last to finish hold more of them than the slice).
    pub dead: u64,
    /// `dead` reached the cap: at least that many died.
    pub dead_capped: bool,
    /// How many of the slice's jobs the figures below are read from:
    /// the last [`ACTIVITY_SAMPLE`] to finish, or all of them.
    pub sampled: u64,
    /// Dead jobs among the sampled ones; `dead` is the slice's count.
    pub sampled_dead: u64,
    /// Median lateness of the sampled jobs that ran (succeeded or dead):
    /// from the due time of the attempt that finished to its start.
    /// `None` when none of them ran.
    pub lateness_p50: Option<Duration>,
    /// Largest such lateness.
    pub lateness_max: Option<Duration>,
    /// Median run time (start to finish) of the sampled jobs that ran.
    pub run_time_p50: Option<Duration>,
}

/// Sums up one slice's sample (see [`Queue::activity`]).
fn activity_bucket(
    start: i64,
    end: i64,
    finished: u64,
    capped: bool,
    dead: u64,
    dead_capped: bool,
    sample: &[crate::engine::FinishedSample],
) -> ActivityBucket {
    let ran = |s: &&crate::engine::FinishedSample| {
        matches!(s.state, Some(JobState::Succeeded | JobState::Dead))
    };
    let ms = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let mut lateness: Vec<i64> = sample
        .iter()
        .filter(ran)
        .filter_map(|s| Some(s.claimed_at_ms? - s.run_at_ms))
        .collect();
    let mut run_time: Vec<i64> = sample
        .iter()
        .filter(ran)
        .filter_map(|s| Some(s.finished_at_ms - s.claimed_at_ms?))
        .collect();
    lateness.sort_unstable();
    run_time.sort_unstable();
    let median = |v: &[i64]| (!v.is_empty()).then(|| ms(v[v.len() / 2]));
    ActivityBucket {
        start: crate::clock::ms_to_datetime(start),
        end: crate::clock::ms_to_datetime(end),
        finished,
        capped,
        dead,
        dead_capped,
        sampled: sample.len() as u64,
        sampled_dead: sample
            .iter()
            .filter(|s| s.state == Some(JobState::Dead))
            .count() as u64,
        lateness_p50: median(&lateness),
        lateness_max: lateness.last().map(|&l| ms(l)),
        run_time_p50: median(&run_time),
    }
}

/// Most finished jobs of one [`ActivityBucket`] read for its lateness and
/// run time.
pub const ACTIVITY_SAMPLE: usize = 200;

/// Most slices one [`Ops::activity`](crate::Ops::activity) call reads.
pub const ACTIVITY_MAX_BUCKETS: usize = 10_000;
impl Queue {
    /// See [`Ops::counts_by_queue`](crate::Ops::counts_by_queue).
    pub(crate) fn counts_by_queue(&self, cap: u64) -> Result<QueueCounts> {
        let engine = self.engine();
        let mut out = QueueCounts::default();
        for state in JobState::ALL {
            for queue in self.queues_in_state(state)? {
                let n = engine.count_in_queue(state, &queue, cap)?;
                if n == 0 {
                    continue;
                }
                if n >= cap {
                    out.capped.insert((queue.clone(), state));
                }
                out.counts.insert((queue, state), n);
            }
        }
        Ok(out)
    }

    /// See [`Ops::list_state`](crate::Ops::list_state).
    pub(crate) fn list_state(&self, state: JobState, limit: usize) -> Result<Vec<Job>> {
        self.page(&JobPage {
            limit,
            ..JobPage::new(state)
        })
    }

    /// See [`Ops::page`](crate::Ops::page).
    pub(crate) fn page(&self, page: &JobPage) -> Result<Vec<Job>> {
        if let Some(after) = &page.after {
            if after.state != page.state {
                return Err(Error::InvalidArgument(format!(
                    "a cursor of a page of {} jobs cannot continue a page of {} jobs",
                    after.state.as_str(),
                    page.state.as_str()
                )));
            }
        }
        let engine = self.engine();
        let queues = match &page.queue {
            Some(queue) => vec![queue.clone()],
            None => self.queues_in_state(page.state)?,
        };
        let limit = page.limit;
        let mut jobs = Vec::new();
        for queue in queues {
            jobs.extend(engine.page_in_queue(page, &queue)?);
        }
        match page.state {
            JobState::Pending | JobState::Blocked => {
                jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.run_at, j.id))
            }
            JobState::Scheduled => jobs.sort_by_key(|j| (j.run_at, j.id)),
            JobState::Waiting => jobs.sort_by_key(|j| j.id),
            JobState::Running => jobs.sort_by_key(|j| (j.lease_expires_at, j.id)),
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                jobs.sort_by_key(|j| std::cmp::Reverse((j.finished_at, j.id)))
            }
        }
        jobs.truncate(limit);
        Ok(jobs)
    }

    /// See [`Ops::activity`](crate::Ops::activity).
    pub(crate) fn activity(
        &self,
        slices: usize,
        width: Duration,
        cap: u64,
    ) -> Result<Vec<ActivityBucket>> {
        let now = self.now_ms();
        let width_ms = i64::try_from(width.as_millis()).unwrap_or(i64::MAX);
        if width_ms == 0 {
            return Err(Error::InvalidArgument(
                "activity: the slice width must be at least 1 ms".into(),
            ));
        }
        if slices == 0 || slices > ACTIVITY_MAX_BUCKETS {
            return Err(Error::InvalidArgument(format!(
                "activity: {slices} slices asked for, want 1 to {ACTIVITY_MAX_BUCKETS}"
            )));
        }
        let slices = slices as i64;
        let engine = self.engine();
        let dead_queues = self.queues_in_state(JobState::Dead)?;
        let mut out = Vec::with_capacity(slices as usize);
        for i in (0..slices).rev() {
            // Saturating: a manual clock may stand before 1970, and a
            // width may be near Duration::MAX.
            let end = now.saturating_sub(i.saturating_mul(width_ms));
            let start = end.saturating_sub(width_ms);
            let (finished, dead, sample) =
                engine.finished_between(start, end, cap, ACTIVITY_SAMPLE, &dead_queues)?;
            out.push(activity_bucket(
                start,
                end,
                finished,
                finished >= cap,
                dead,
                dead >= cap,
                &sample,
            ));
        }
        Ok(out)
    }

    /// The queues with jobs in `state`, in byte order, one index step each.
    fn queues_in_state(&self, state: JobState) -> Result<Vec<String>> {
        let mut queues: Vec<String> = Vec::new();
        while let Some(q) = self
            .engine()
            .next_queue_in_state(state, queues.last().map_or("", String::as_str))?
        {
            queues.push(q);
        }
        Ok(queues)
    }

    /// See [`Ops::finished_since`](crate::Ops::finished_since).
    pub(crate) fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.engine().finished_since(since)
    }

    /// See [`Ops::unfinished`](crate::Ops::unfinished).
    pub(crate) fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        self.engine().unfinished(queues, kinds)
    }
}
