//! Model-based test of the job state machine.
//!
//! proptest generates random sequences of operations (enqueue, claim,
//! heartbeat, complete, fail, fail permanently, snooze, release, cancel,
//! retry, reap, advance the manual clock, reopen the file) and runs each
//! against tickler and against [`Model`], a plain in-memory version of the
//! state machine of `shared/design.md` with tickler's `scheduled` state
//! (pending with a future run_at, promoted to pending by a claim once due).
//! After every step the two must agree on each call's result (ids, claimed
//! jobs in claim order, attempts, lease expiries, which error) and on every
//! job: state, attempts, run_at, lease expiry, and whether each run_token
//! ever handed out is still valid. Backoff is `RetryPolicy { jitter: false }`,
//! so every time is determined.

use crate::support::reliability;

use proptest::prelude::*;
use proptest::sample::Index;
use reliability::{engine, temp_db};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tickler::{
    Clock, Durability, Error, JobFilter, JobId, JobState, Lease, ManualClock, NewJob, Queue,
    RetryPolicy,
};

const POLICY: RetryPolicy = RetryPolicy {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(8),
    jitter: false,
};

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        delay_ms: Option<u64>,
        priority: i32,
        max_attempts: u32,
        unique: Option<u8>,
    },
    Claim {
        max: usize,
        lease_ms: u64,
    },
    Heartbeat {
        lease: Index,
        extend_ms: u64,
    },
    Complete {
        lease: Index,
    },
    Fail {
        lease: Index,
    },
    FailPermanently {
        lease: Index,
    },
    Snooze {
        lease: Index,
        delay_ms: u64,
    },
    Release {
        lease: Index,
    },
    Cancel {
        job: Index,
    },
    Retry {
        job: Index,
    },
    Reap,
    Advance {
        ms: u64,
    },
    /// Advance the clock to just before, at or just after a time the state
    /// machine turns on: a lease expiry or a due time (picked by `at`).
    AdvanceToEdge {
        at: Index,
        offset: i64,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            prop::option::of(prop_oneof![Just(0u64), 1..4_000u64]),
            -1..=1i32,
            1..=3u32,
            prop::option::weighted(0.3, 0..3u8),
        )
            .prop_map(|(delay_ms, priority, max_attempts, unique)| Op::Enqueue {
                delay_ms,
                priority,
                max_attempts,
                unique,
            }),
        3 => (1..=3usize, 100..3_000u64).prop_map(|(max, lease_ms)| Op::Claim { max, lease_ms }),
        1 => (any::<Index>(), 100..3_000u64)
            .prop_map(|(lease, extend_ms)| Op::Heartbeat { lease, extend_ms }),
        2 => any::<Index>().prop_map(|lease| Op::Complete { lease }),
        2 => any::<Index>().prop_map(|lease| Op::Fail { lease }),
        1 => any::<Index>().prop_map(|lease| Op::FailPermanently { lease }),
        1 => (any::<Index>(), prop_oneof![Just(0u64), 1..4_000u64])
            .prop_map(|(lease, delay_ms)| Op::Snooze { lease, delay_ms }),
        1 => any::<Index>().prop_map(|lease| Op::Release { lease }),
        1 => any::<Index>().prop_map(|job| Op::Cancel { job }),
        1 => any::<Index>().prop_map(|job| Op::Retry { job }),
        1 => Just(Op::Reap),
        3 => prop_oneof![Just(1u64), 1..2_000u64, 2_000..10_000u64].prop_map(|ms| Op::Advance { ms }),
        2 => (any::<Index>(), -1..=1i64).prop_map(|(at, offset)| Op::AdvanceToEdge { at, offset }),
        1 => Just(Op::Reopen),
    ]
}

// ------------------------------------------------------------------ model

/// One job as the model sees it.
#[derive(Debug, Clone)]
struct MJob {
    state: JobState,
    priority: i32,
    run_at: i64,
    attempts: u32,
    max_attempts: u32,
    unique_key: Option<String>,
    /// Index (into the run's leases) of the latest claim.
    claim: Option<usize>,
    lease_expires: Option<i64>,
}

/// What a call returned, in the model's terms.
#[derive(Debug, Clone, PartialEq)]
enum Res {
    Ok,
    Id(usize),
    Claimed(Vec<(usize, u32, i64)>),
    Expires(i64),
    Reaped(u64),
    LeaseLost,
    NotFound,
    InvalidState,
    UniqueKeyHeld,
}

#[derive(Debug, Default)]
struct Model {
    now: i64,
    jobs: Vec<MJob>,
    /// Job index of each claim, in the order claims were made.
    leases: Vec<usize>,
}

fn backoff_ms(attempt: u32) -> i64 {
    i64::try_from(POLICY.backoff(attempt).as_millis()).unwrap()
}

fn unfinished(state: JobState) -> bool {
    matches!(
        state,
        JobState::Scheduled | JobState::Pending | JobState::Running
    )
}

impl Model {
    fn valid(&self, lease: usize) -> bool {
        let job = &self.jobs[self.leases[lease]];
        job.state == JobState::Running && job.claim == Some(lease)
    }

    /// Whether job `j`'s unique_key is held by a cancelled job whose holder
    /// may still run (its lease has not run out).
    fn key_waits_for_cancelled_holder(&self, j: usize) -> bool {
        let Some(key) = &self.jobs[j].unique_key else {
            return false;
        };
        self.jobs.iter().any(|other| {
            other.state == JobState::Cancelled
                && other.unique_key.as_ref() == Some(key)
                && other.lease_expires.is_some_and(|e| e >= self.now)
        })
    }

    /// After a failed attempt or an expired lease: dead when attempts are
    /// used up, else waiting for the backoff.
    fn retry_or_die(&mut self, j: usize, attempt: u32) {
        let now = self.now;
        let job = &mut self.jobs[j];
        job.lease_expires = None;
        if job.attempts >= job.max_attempts {
            job.state = JobState::Dead;
        } else {
            job.run_at = now + backoff_ms(attempt);
            job.state = if job.run_at <= now {
                JobState::Pending
            } else {
                JobState::Scheduled
            };
        }
    }

    /// Waiting until `until`: pending if that is now or past.
    fn wait_until(&mut self, j: usize, until: i64) {
        let now = self.now;
        let job = &mut self.jobs[j];
        job.run_at = until;
        job.state = if until <= now {
            JobState::Pending
        } else {
            JobState::Scheduled
        };
    }

    fn apply(&mut self, op: &Op) -> Res {
        let now = self.now;
        match op {
            Op::Enqueue {
                delay_ms,
                priority,
                max_attempts,
                unique,
            } => {
                let key = unique.map(|k| format!("key-{k}"));
                if let Some(key) = &key {
                    if let Some(held) = self
                        .jobs
                        .iter()
                        .position(|j| unfinished(j.state) && j.unique_key.as_ref() == Some(key))
                    {
                        return Res::Id(held);
                    }
                }
                let run_at = now + i64::try_from(delay_ms.unwrap_or(0)).unwrap();
                self.jobs.push(MJob {
                    state: if run_at <= now {
                        JobState::Pending
                    } else {
                        JobState::Scheduled
                    },
                    priority: *priority,
                    run_at,
                    attempts: 0,
                    max_attempts: *max_attempts,
                    unique_key: key,
                    claim: None,
                    lease_expires: None,
                });
                Res::Id(self.jobs.len() - 1)
            }
            Op::Claim { max, lease_ms } => {
                for job in &mut self.jobs {
                    if job.state == JobState::Scheduled && job.run_at <= now {
                        job.state = JobState::Pending;
                    }
                }
                let mut due: Vec<usize> = (0..self.jobs.len())
                    .filter(|&j| {
                        self.jobs[j].state == JobState::Pending
                            && self.jobs[j].run_at <= now
                            && !self.key_waits_for_cancelled_holder(j)
                    })
                    .collect();
                due.sort_by_key(|&j| (-self.jobs[j].priority, self.jobs[j].run_at, j));
                due.truncate(*max);
                let expires = now + i64::try_from(*lease_ms).unwrap();
                let mut claimed = Vec::new();
                for j in due {
                    self.leases.push(j);
                    let job = &mut self.jobs[j];
                    job.state = JobState::Running;
                    job.attempts += 1;
                    job.claim = Some(self.leases.len() - 1);
                    job.lease_expires = Some(expires);
                    claimed.push((j, job.attempts, expires));
                }
                Res::Claimed(claimed)
            }
            Op::Reap => {
                let expired: Vec<usize> = (0..self.jobs.len())
                    .filter(|&j| {
                        self.jobs[j].state == JobState::Running
                            && self.jobs[j].lease_expires.is_some_and(|e| e < now)
                    })
                    .collect();
                for &j in &expired {
                    let attempt = self.jobs[j].attempts;
                    self.retry_or_die(j, attempt);
                }
                // A kept lease (of a cancelled job, or of one retried while
                // its holder may still run) that ran out: the holder is gone.
                for job in &mut self.jobs {
                    if job.state != JobState::Running && job.lease_expires.is_some_and(|e| e < now)
                    {
                        job.lease_expires = None;
                    }
                }
                Res::Reaped(expired.len() as u64)
            }
            Op::Advance { ms } => {
                self.now += i64::try_from(*ms).unwrap();
                Res::Ok
            }
            Op::Reopen | Op::AdvanceToEdge { .. } => Res::Ok,
            Op::Cancel { job } | Op::Retry { job } => {
                let Some(j) = self.pick_job(job) else {
                    return Res::NotFound;
                };
                let state = self.jobs[j].state;
                if let Op::Cancel { .. } = op {
                    if state.is_terminal() {
                        return Res::InvalidState;
                    }
                    // A running job keeps its lease until its holder stops;
                    // so does a retry that waits for the lease of a run not
                    // known to have stopped (the only rows with a lease
                    // while not running).
                    let job = &mut self.jobs[j];
                    job.state = JobState::Cancelled;
                    return Res::Ok;
                }
                if !matches!(state, JobState::Dead | JobState::Cancelled) {
                    return Res::InvalidState;
                }
                let key = self.jobs[j].unique_key.clone();
                if key.is_some()
                    && self
                        .jobs
                        .iter()
                        .any(|other| unfinished(other.state) && other.unique_key == key)
                {
                    return Res::UniqueKeyHeld;
                }
                let job = &mut self.jobs[j];
                job.attempts = 0;
                // A cancelled job's holder may still run: wait for its
                // lease, and keep it until then.
                match job.lease_expires {
                    Some(e) if e >= now => {
                        job.state = JobState::Scheduled;
                        job.run_at = e + 1;
                    }
                    _ => {
                        job.lease_expires = None;
                        job.state = JobState::Pending;
                        job.run_at = now;
                    }
                }
                Res::Ok
            }
            Op::Heartbeat { lease, .. }
            | Op::Complete { lease }
            | Op::Fail { lease }
            | Op::FailPermanently { lease }
            | Op::Snooze { lease, .. }
            | Op::Release { lease } => {
                let Some(l) = self.pick_lease(lease) else {
                    return Res::Ok;
                };
                if !self.valid(l) {
                    // A refused outcome of a cancelled job's holder says it
                    // has stopped.
                    let j = self.leases[l];
                    let job = &mut self.jobs[j];
                    if !matches!(op, Op::Heartbeat { .. })
                        && matches!(
                            job.state,
                            JobState::Cancelled | JobState::Scheduled | JobState::Pending
                        )
                        && job.claim == Some(l)
                    {
                        job.lease_expires = None;
                    }
                    return Res::LeaseLost;
                }
                let j = self.leases[l];
                match op {
                    Op::Heartbeat { extend_ms, .. } => {
                        let expires = now + i64::try_from(*extend_ms).unwrap();
                        self.jobs[j].lease_expires = Some(expires);
                        return Res::Expires(expires);
                    }
                    Op::Complete { .. } => {
                        self.jobs[j].state = JobState::Succeeded;
                        self.jobs[j].lease_expires = None;
                    }
                    Op::Fail { .. } => {
                        let attempt = self.jobs[j].attempts;
                        self.retry_or_die(j, attempt);
                    }
                    Op::FailPermanently { .. } => {
                        self.jobs[j].state = JobState::Dead;
                        self.jobs[j].lease_expires = None;
                    }
                    Op::Snooze { delay_ms, .. } => {
                        self.jobs[j].attempts -= 1;
                        self.jobs[j].lease_expires = None;
                        self.wait_until(j, now + i64::try_from(*delay_ms).unwrap());
                    }
                    Op::Release { .. } => {
                        let job = &mut self.jobs[j];
                        job.attempts -= 1;
                        job.state = JobState::Pending;
                        job.lease_expires = None;
                    }
                    _ => unreachable!(),
                }
                Res::Ok
            }
        }
    }

    /// The `AdvanceToEdge` op as a plain `Advance` (0 ms if there is no
    /// edge ahead).
    fn edge(&self, at: &Index, offset: i64) -> Op {
        let mut edges: Vec<i64> = self
            .jobs
            .iter()
            .filter_map(|j| match j.state {
                JobState::Running => j.lease_expires,
                JobState::Scheduled => Some(j.run_at),
                _ => None,
            })
            .map(|t| t + offset)
            .filter(|&t| t >= self.now)
            .collect();
        edges.sort_unstable();
        let ms = if edges.is_empty() {
            0
        } else {
            edges[at.index(edges.len())] - self.now
        };
        Op::Advance {
            ms: u64::try_from(ms).unwrap(),
        }
    }

    fn pick_lease(&self, index: &Index) -> Option<usize> {
        (!self.leases.is_empty()).then(|| index.index(self.leases.len()))
    }

    fn pick_job(&self, index: &Index) -> Option<usize> {
        (!self.jobs.is_empty()).then(|| index.index(self.jobs.len()))
    }
}

// --------------------------------------------------------------- tickler

struct Real<'a> {
    path: &'a Path,
    clock: Arc<ManualClock>,
    queue: Option<Queue>,
    ids: Vec<JobId>,
    leases: Vec<Lease>,
}

impl Real<'_> {
    fn open(&mut self) {
        self.queue = None;
        self.queue = Some(
            Queue::builder(engine::target(self.path))
                .clock(self.clock.clone())
                .sqlite(|o| o.durability(Durability::Normal))
                .retry_policy(POLICY)
                .open()
                .expect("open queue"),
        );
    }

    fn queue(&self) -> &Queue {
        self.queue.as_ref().expect("queue is open")
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn job_index(&self, id: JobId) -> usize {
        self.ids
            .iter()
            .position(|&i| i == id)
            .unwrap_or_else(|| panic!("tickler returned unknown job {id}"))
    }

    fn result(&self, r: tickler::Result<()>) -> Res {
        match r {
            Ok(()) => Res::Ok,
            Err(e) => error(e),
        }
    }

    /// Runs `op` (with the model's pick of lease or job, made before the
    /// model applied it) against tickler.
    fn apply(&mut self, op: &Op, lease: Option<usize>, job: Option<usize>) -> Res {
        match op {
            Op::Enqueue {
                delay_ms,
                priority,
                max_attempts,
                unique,
            } => {
                let mut new = NewJob::new("model")
                    .priority(*priority)
                    .max_attempts(*max_attempts);
                if let Some(ms) = delay_ms {
                    new = new.delay(Duration::from_millis(*ms));
                }
                if let Some(k) = unique {
                    new = new.unique_key(format!("key-{k}"));
                }
                let id = self.queue().enqueue(new).expect("enqueue");
                if !self.ids.contains(&id) {
                    self.ids.push(id);
                }
                Res::Id(self.job_index(id))
            }
            Op::Claim { max, lease_ms } => {
                let leases = self
                    .queue()
                    .manual()
                    .claim("default", "model", *max, Duration::from_millis(*lease_ms))
                    .expect("claim");
                let claimed = leases
                    .iter()
                    .map(|l| {
                        (
                            self.job_index(l.job_id),
                            l.attempt,
                            l.lease_expires_at.timestamp_millis(),
                        )
                    })
                    .collect();
                self.leases.extend(leases);
                Res::Claimed(claimed)
            }
            Op::Reap => Res::Reaped(self.queue().manual().reap().expect("reap")),
            Op::Advance { ms } => {
                self.clock.advance(Duration::from_millis(*ms));
                Res::Ok
            }
            Op::Reopen => {
                self.open();
                Res::Ok
            }
            Op::AdvanceToEdge { .. } => unreachable!("turned into Advance by run()"),
            Op::Cancel { .. } | Op::Retry { .. } => {
                // With no job yet, an id that does not exist.
                let id = job.map_or(JobId(1_000_000), |j| self.ids[j]);
                let r = match op {
                    Op::Cancel { .. } => self.queue().cancel(id),
                    _ => self.queue().retry(id),
                };
                self.result(r)
            }
            _ => {
                let Some(l) = lease else {
                    return Res::Ok;
                };
                let lease = &self.leases[l];
                let q = self.queue();
                match op {
                    Op::Heartbeat { extend_ms, .. } => {
                        match q
                            .manual()
                            .heartbeat(lease, Duration::from_millis(*extend_ms))
                        {
                            Ok(at) => Res::Expires(at.timestamp_millis()),
                            Err(e) => error(e),
                        }
                    }
                    Op::Complete { .. } => self.result(q.manual().complete(lease)),
                    Op::Fail { .. } => self.result(q.manual().fail(lease, "model failure")),
                    Op::FailPermanently { .. } => {
                        self.result(q.manual().fail_permanently(lease, "model failure"))
                    }
                    Op::Snooze { delay_ms, .. } => {
                        let until = q.clock().now()
                            + chrono::Duration::milliseconds(i64::try_from(*delay_ms).unwrap());
                        self.result(q.manual().snooze(lease, until))
                    }
                    Op::Release { .. } => self.result(q.manual().release(lease)),
                    _ => unreachable!(),
                }
            }
        }
    }
}

fn error(e: Error) -> Res {
    match e {
        Error::LeaseLost { .. } => Res::LeaseLost,
        Error::NotFound(_) => Res::NotFound,
        Error::InvalidState { .. } => Res::InvalidState,
        Error::UniqueKeyHeld { .. } => Res::UniqueKeyHeld,
        other => panic!("unexpected error from tickler: {other:?}"),
    }
}

/// Every job and every run_token agree between the model and the file.
fn compare(model: &Model, real: &Real<'_>, step: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(model.now, real.now_ms());
    let rows = real
        .queue()
        .list(&JobFilter {
            limit: 10_000,
            ..JobFilter::default()
        })
        .expect("list");
    prop_assert_eq!(
        rows.len(),
        model.jobs.len(),
        "step {}: number of jobs",
        step
    );
    for row in &rows {
        let j = real.job_index(row.id);
        let m = &model.jobs[j];
        let seen = (
            row.state,
            row.attempts,
            row.run_at.timestamp_millis(),
            row.lease_expires_at.map(|t| t.timestamp_millis()),
            row.priority,
            row.max_attempts,
            row.unique_key.clone(),
        );
        let expected = (
            m.state,
            m.attempts,
            m.run_at,
            m.lease_expires,
            m.priority,
            m.max_attempts,
            m.unique_key.clone(),
        );
        prop_assert_eq!(
            seen,
            expected,
            "step {}: job {} (state, attempts, run_at, lease expiry, priority, max_attempts, unique_key)",
            step,
            row.id
        );
    }
    for (l, lease) in real.leases.iter().enumerate() {
        let row = &rows[real.job_index(lease.job_id)];
        let valid =
            row.state == JobState::Running && row.run_token.as_ref() == Some(&lease.run_token);
        prop_assert_eq!(
            valid,
            model.valid(l),
            "step {}: is run_token {} of job {} (claim {}) valid",
            step,
            lease.run_token,
            lease.job_id,
            l
        );
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let (_dir, path) = temp_db();
    let clock = Arc::new(ManualClock::new(
        chrono::DateTime::from_timestamp_millis(1_714_564_800_000).unwrap(),
    ));
    let mut real = Real {
        path: &path,
        clock: clock.clone(),
        queue: None,
        ids: Vec::new(),
        leases: Vec::new(),
    };
    real.open();
    let mut model = Model {
        now: clock.now_ms(),
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let edge;
        let op = match op {
            Op::AdvanceToEdge { at, offset } => {
                edge = model.edge(at, *offset);
                &edge
            }
            other => other,
        };
        let (lease, job) = match op {
            Op::Heartbeat { lease, .. }
            | Op::Complete { lease }
            | Op::Fail { lease }
            | Op::FailPermanently { lease }
            | Op::Snooze { lease, .. }
            | Op::Release { lease } => (model.pick_lease(lease), None),
            Op::Cancel { job } | Op::Retry { job } => (None, model.pick_job(job)),
            _ => (None, None),
        };
        let expected = model.apply(op);
        let got = real.apply(op, lease, job);
        prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
        compare(&model, &real, step)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    fn tickler_follows_the_state_machine(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}

// The property is a contract body: proptest! without `#[test]` makes it
// a plain function, and each engine gets a case of its own.
mod tickler_follows_the_state_machine {
    crate::engine_cases!(super::tickler_follows_the_state_machine);
}
