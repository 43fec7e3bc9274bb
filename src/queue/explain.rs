//! Why a job is where it is: [`Queue::explain`], the operator's answer to
//! "why is this job not running?", read from the job's row, its queue,
//! its limit, its parents and its batch. A reading, not a hot path: it
//! reads the key's holders and counts its line.

use super::Queue;
use crate::batch::{BatchCallback, BatchId};
use crate::error::Result;
use crate::job::{Job, JobId, JobState};
use crate::limit::Limit;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use std::fmt;

/// Most holders of a key an explanation lists.
const HOLDERS_SHOWN: i64 = 10;

/// A job and why it is where it is ([`Queue::explain`]). Its `Display`
/// is one line for a person, as `tickler show` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The job, as [`Queue::get`] reads it.
    pub job: Job,
    /// Why it is in its state.
    pub reason: Reason,
}

/// Why a job is in its state ([`Explanation::reason`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// Due, waiting for a worker of its queue to claim it.
    Due,
    /// Due, but its queue is paused ([`Queue::pause_queue`]).
    QueuePaused {
        /// The paused queue.
        queue: String,
    },
    /// Waiting for its time (a delay, a retry's backoff, a snooze).
    Waiting {
        /// When it is due, UTC.
        until: DateTime<Utc>,
    },
    /// Deferred by its limit's rate ([`crate::Rate`]) until its instant.
    Deferred {
        /// The limit.
        limit: String,
        /// The key.
        key: String,
        /// When it may start, UTC.
        until: DateTime<Utc>,
        /// Its place in the key's line, from 1.
        place: u64,
    },
    /// Waiting for a slot of its concurrency limit
    /// ([`JobState::Blocked`]).
    Blocked {
        /// The limit.
        limit: String,
        /// The key.
        key: String,
        /// The weight its lease holders hold.
        held: u64,
        /// The limit's `max_per_key`, if any; `None` with `limit_set`
        /// false: the limit is not stored (the job runs at its next
        /// release).
        max_per_key: Option<u32>,
        /// The limit's `max_total`, if any.
        max_total: Option<u32>,
        /// The weight the lease holders of all its keys hold.
        total_held: u64,
        /// Whether the total is what it waits for (its key has room for
        /// it): then `holders` are of any key.
        by_total: bool,
        /// Whether the limit is stored.
        limit_set: bool,
        /// The first holders, by lease end (at most 10).
        holders: Vec<Holder>,
    },
    /// Waiting for the jobs it runs after ([`JobState::Waiting`]): those
    /// whose end it has not taken yet, in id order (at most 10), and how
    /// many there are in all.
    AfterParents {
        /// The first parents it waits for.
        parents: Vec<ParentWait>,
        /// How many it waits for in all.
        count: usize,
    },
    /// A callback of a batch ([`crate::NewBatch`]), waiting
    /// ([`JobState::Waiting`]) for the batch to finish: sealed
    /// ([`Queue::seal_batch`]) with no member remaining. `callback` says
    /// what it is then: released or cancelled.
    AfterBatch {
        /// The batch.
        batch: BatchId,
        /// Which of the batch's callbacks this job is.
        callback: BatchCallback,
        /// Members that joined the batch.
        members: u64,
        /// Members that have not ended.
        remaining: u64,
        /// Members that ended dead or cancelled: with any, an
        /// `on_success` callback is cancelled and an `on_failure` one
        /// released when the batch finishes.
        failed: u64,
        /// Whether the batch is sealed. An unsealed batch never finishes,
        /// even with no member remaining: its callbacks wait for
        /// [`Queue::seal_batch`] too.
        sealed: bool,
    },
    /// Running, held by a worker until its lease's end.
    Running {
        /// The worker id that claimed it.
        worker: Option<String>,
        /// When its lease ends unless renewed, UTC.
        lease_until: Option<DateTime<Utc>>,
    },
    /// Finished: succeeded, dead or cancelled (see the job's
    /// `last_error`).
    Finished,
}

/// A job a waiting job runs after ([`Reason::AfterParents`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParentWait {
    /// The parent.
    pub job_id: JobId,
    /// Its state.
    pub state: JobState,
    /// The worker id of its latest claim, while running.
    pub worker: Option<String>,
    /// When its lease ends unless renewed, while running, UTC.
    pub lease_until: Option<DateTime<Utc>>,
    /// When it is due, UTC.
    pub run_at: DateTime<Utc>,
    /// What the waiting job does if this parent fails.
    pub if_fails: crate::IfParentFails,
}

/// A job holding a slot of a limit's key ([`Reason::Blocked`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// The holder's job.
    pub job_id: JobId,
    /// The worker id that claimed it.
    pub worker: Option<String>,
    /// When its lease ends unless renewed, UTC.
    pub lease_until: Option<DateTime<Utc>>,
    /// The slots it takes.
    pub weight: u32,
}

impl Queue {
    /// Why job `id` is where it is: due, waiting for its time or a paused
    /// queue, deferred by its limit's rate (until when, which place in
    /// line), blocked on its concurrency limit (held by which jobs, until
    /// when), waiting for its parents or, a batch's callback, for its
    /// batch (how many members remain, whether it is sealed), running, or
    /// finished.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use tickler::{Limit, NewJob, Reason};
    /// queue.set_limit("sync", Limit::per_key(1))?;
    /// let first = queue.enqueue(NewJob::new("sync").limit("sync", "42"))?;
    /// let second = queue.enqueue(NewJob::new("sync").limit("sync", "42"))?;
    /// let _claimed = queue.manual().claim("default", "pi-1", 10, std::time::Duration::from_secs(60))?;
    /// let why = queue.explain(second)?;
    /// assert!(matches!(why.reason, Reason::Blocked { held: 1, .. }));
    /// assert!(why.to_string().starts_with("blocked by limit sync/42: 1 of 1 held by job"));
    /// # Ok::<(), tickler::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NotFound`](crate::Error::NotFound); the engine's read
    /// errors.
    pub fn explain(&self, id: JobId) -> Result<Explanation> {
        let job = self.get(id)?;
        let reason = match job.state {
            JobState::Pending => {
                if self.paused_queues()?.contains(&job.queue) {
                    Reason::QueuePaused {
                        queue: job.queue.clone(),
                    }
                } else {
                    Reason::Due
                }
            }
            JobState::Scheduled => match self.engine().deferred_place(job.id)? {
                Some(place) => {
                    let (limit, key) = job
                        .limit
                        .clone()
                        .map(|s| (s.name, s.key))
                        .unwrap_or_default();
                    Reason::Deferred {
                        limit,
                        key,
                        until: job.run_at,
                        place,
                    }
                }
                None => Reason::Waiting { until: job.run_at },
            },
            // A blocked job's queue paused: releases pass it over (a slot
            // goes to a job that can run), so it waits for the resume.
            JobState::Blocked if self.paused_queues()?.contains(&job.queue) => {
                Reason::QueuePaused {
                    queue: job.queue.clone(),
                }
            }
            // A blocked job names a limit (the schema has it so).
            JobState::Blocked if job.limit.is_some() => {
                let slot = job.limit.clone().expect("checked above");
                let limit: Option<Limit> = self
                    .limits()?
                    .into_iter()
                    .find(|l| l.name == slot.name)
                    .map(|l| l.limit);
                let usage = self.engine().limit_held(&slot.name)?;
                let held = usage
                    .iter()
                    .find(|(key, _)| *key == slot.key)
                    .map_or(0, |(_, held)| *held);
                let total_held: u64 = usage.iter().map(|(_, held)| held).sum();
                let max_per_key = limit.and_then(|l| l.max_per_key);
                let max_total = limit.and_then(|l| l.max_total);
                let weight = u64::from(slot.weight.max(1));
                let by_total = max_total.is_some()
                    && max_per_key.is_none_or(|max| held + weight <= u64::from(max));
                // The holders of its key, or of the busiest keys when the
                // total is what it waits for.
                let mut keys = vec![slot.key.clone()];
                if by_total {
                    let mut busy: Vec<_> = usage.iter().filter(|(_, held)| *held > 0).collect();
                    busy.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    keys = busy.into_iter().map(|(key, _)| key.clone()).collect();
                }
                let mut holders = Vec::new();
                for key in keys {
                    let room = HOLDERS_SHOWN - holders.len() as i64;
                    if room <= 0 {
                        break;
                    }
                    holders.extend(
                        self.engine()
                            .limit_holders(&slot.name, &key, room)?
                            .into_iter()
                            .map(|h| Holder {
                                job_id: h.id,
                                worker: h.claimed_by,
                                lease_until: h.lease_expires_at,
                                weight: h.limit.map_or(1, |l| l.weight),
                            }),
                    );
                }
                Reason::Blocked {
                    limit: slot.name,
                    key: slot.key,
                    held,
                    max_per_key,
                    max_total,
                    total_held,
                    by_total,
                    limit_set: limit.is_some(),
                    holders,
                }
            }
            JobState::Blocked => Reason::Due,
            JobState::Waiting => match self.batch_waited_for(&job)? {
                Some(reason) => reason,
                None => self.parents_waited_for(&job)?,
            },
            JobState::Running => Reason::Running {
                worker: job.claimed_by.clone(),
                lease_until: job.lease_expires_at,
            },
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => Reason::Finished,
        };
        Ok(Explanation { job, reason })
    }

    /// Why waiting job `job` waits, if it is a batch's callback; `None`
    /// for any other job (a member waits for its parents like any job).
    fn batch_waited_for(&self, job: &Job) -> Result<Option<Reason>> {
        let Some(id) = job.batch else {
            return Ok(None);
        };
        // A batch pruned under a waiting callback is not expected (the
        // pruner keeps it); explained as the parents' wait rather than
        // failing the whole explanation.
        let batch = match self.batch(id) {
            Ok(batch) => batch,
            Err(crate::Error::BatchNotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(batch
            .which_callback(job.id)
            .map(|callback| Reason::AfterBatch {
                batch: batch.id,
                callback,
                members: batch.members,
                remaining: batch.remaining,
                failed: batch.dead + batch.cancelled,
                sealed: batch.sealed_at.is_some(),
            }))
    }

    /// Why waiting job `job` waits for the jobs it runs after.
    fn parents_waited_for(&self, job: &Job) -> Result<Reason> {
        let open: Vec<_> = self
            .parents(job.id)?
            .into_iter()
            .filter(|d| !d.resolved)
            .collect();
        let mut parents = Vec::new();
        for dep in open.iter().take(HOLDERS_SHOWN as usize) {
            // A parent pruned under a held edge is not expected
            // (the pruner keeps it); said as gone rather than
            // failing the whole explanation.
            let Ok(parent) = self.get(dep.parent) else {
                continue;
            };
            let running = parent.state == JobState::Running;
            parents.push(ParentWait {
                job_id: parent.id,
                state: parent.state,
                worker: parent.claimed_by.filter(|_| running),
                lease_until: parent.lease_expires_at.filter(|_| running),
                run_at: parent.run_at,
                if_fails: dep.if_fails,
            });
        }
        Ok(Reason::AfterParents {
            parents,
            count: open.len(),
        })
    }
}

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Reason::Due => write!(f, "due, waiting for a worker of queue {}", self.job.queue),
            Reason::QueuePaused { queue } => write!(f, "due, but queue {queue} is paused"),
            Reason::Waiting { until } => write!(f, "waiting until {}", at(*until)),
            Reason::Deferred {
                limit,
                key,
                until,
                place,
            } => write!(
                f,
                "deferred by rate limit {limit}/{key} until {} ({} in line)",
                at(*until),
                ordinal(*place)
            ),
            Reason::Blocked {
                limit,
                key,
                held,
                max_per_key,
                max_total,
                total_held,
                by_total,
                limit_set,
                holders,
            } => {
                if !limit_set {
                    return write!(
                        f,
                        "blocked by limit {limit}/{key}, which is not set any more: \
                         it runs at the next release or sweep"
                    );
                }
                match (by_total, max_total, max_per_key) {
                    (true, Some(total), _) => write!(
                        f,
                        "blocked by limit {limit}'s total (key {key} has room): \
                         {total_held} of {total} held over all its keys"
                    )?,
                    (_, _, Some(max)) => {
                        write!(f, "blocked by limit {limit}/{key}: {held} of {max} held")?;
                    }
                    _ => write!(f, "blocked by limit {limit}/{key}: {held} held")?,
                }
                let shown: Vec<String> = holders
                    .iter()
                    .map(|h| {
                        format!(
                            "job {} (worker {}, lease until {})",
                            h.job_id,
                            h.worker.as_deref().unwrap_or("-"),
                            h.lease_until.map_or_else(|| "-".to_owned(), at)
                        )
                    })
                    .collect();
                if !shown.is_empty() {
                    write!(f, " by {}", shown.join(", "))?;
                }
                Ok(())
            }
            Reason::AfterParents { parents, count } => {
                let shown: Vec<String> = parents
                    .iter()
                    .map(|p| {
                        let what = match p.state {
                            JobState::Running => format!(
                                "running on {}, lease until {}",
                                p.worker.as_deref().unwrap_or("-"),
                                p.lease_until.map_or_else(|| "-".to_owned(), at)
                            ),
                            JobState::Scheduled => format!("scheduled {}", at(p.run_at)),
                            // A parent that failed keeps a held child waiting.
                            JobState::Dead | JobState::Cancelled => {
                                format!("{}; held until it is retried and succeeds", p.state)
                            }
                            state => state.to_string(),
                        };
                        format!("{} ({what})", p.job_id)
                    })
                    .collect();
                write!(f, "waiting for {}", shown.join(" and "))?;
                if *count > parents.len() {
                    write!(f, " and {} more", count - parents.len())?;
                }
                Ok(())
            }
            Reason::AfterBatch {
                batch,
                callback,
                members,
                remaining,
                failed,
                sealed,
            } => {
                let decides = match callback {
                    BatchCallback::OnSuccess => "released if every member succeeds, else cancelled",
                    BatchCallback::OnFailure => {
                        "released if any member ends dead or cancelled, else cancelled"
                    }
                    BatchCallback::OnFinish => "released however the members end",
                };
                write!(
                    f,
                    "{callback} callback of batch {batch} ({decides}): \
                     {remaining} of {members} members remaining"
                )?;
                if *failed > 0 {
                    write!(f, ", {failed} failed")?;
                }
                if !sealed {
                    write!(
                        f,
                        "; the batch is not sealed: it never finishes until it is sealed \
                         (seal_batch), however many members have ended"
                    )?;
                }
                Ok(())
            }
            Reason::Running {
                worker,
                lease_until,
            } => write!(
                f,
                "running on worker {} (lease until {})",
                worker.as_deref().unwrap_or("-"),
                lease_until.map_or_else(|| "-".to_owned(), at)
            ),
            Reason::Finished => match &self.job.last_error {
                Some(error) if self.job.state != JobState::Succeeded => {
                    write!(f, "{}: {error}", self.job.state)
                }
                _ => write!(f, "{}", self.job.state),
            },
        }
    }
}
