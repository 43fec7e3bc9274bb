//! Jobs that run after others, run for real: a parent whose holder is
//! killed with SIGKILL holds its child back until its retry succeeds; a
//! child's insert racing its parent's end never leaves it waiting on an
//! ended parent; the pruner, run all along, never takes a parent from a
//! child that needs it; a fan-out of 1,000 steps and back runs its last
//! step once, after all of them. What ran and when is recorded in the
//! test process (an oracle beside the queue), not read back from it.

use crate::support::common;
use crate::support::deps;
use crate::support::limits;
use crate::support::pool;
use crate::support::reliability;

use common::{ms, row_count, secs, temp_db, wait_until};
use deps::assert_cancelled_by;
use limits::state;
use reliability::{child_output, engine, spawn_child};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tickler::{
    Durability, Graph, IfParentFails, JobContext, JobError, JobId, JobState, NewJob, Queue,
    ReaperConfig, RetryPolicy, Waited, WorkerPool,
};

const ENV_DB: &str = "TICKLER_DEPS_DOOMED_HOLDER_DB";
const DOOMED: &str = "dependencies_doomed_holder";

/// Kills the helper process if the test fails before it does.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a handler of the test saw, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    ParentStarted,
    ParentReturned,
    /// A start of the child, with its parent's state as it read it then.
    ChildStarted(JobState),
}

contract! {
/// The parent's holder is a child process, killed with SIGKILL while it
/// holds the parent; the pool of this process beside it does not start
/// the child while the parent is held, its reaper takes the parent back,
/// the retry succeeds, and only then does the child start, once.
fn a_parents_holder_killed_mid_run_holds_its_child_until_the_retry_succeeds() {
    let (dir, path) = temp_db();
    let queue = Queue::builder(engine::target(&path))
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(RetryPolicy { base: ms(1), cap: ms(1), jitter: false })
        .open()
        .unwrap();
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(3)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let mut holder = Guard(spawn_child(
        &engine::case_name(module_path!(), DOOMED),
        dir.path(),
        "holder",
        &[(ENV_DB, path.to_str().unwrap())],
    ));
    wait_until("the helper claimed the parent", secs(30), || {
        child_output(dir.path(), "holder").contains(&format!("CLAIMED {parent}"))
    });
    assert_eq!(state(&queue, parent), JobState::Running);

    let seen: Arc<Mutex<Vec<(Seen, Instant)>>> = Arc::default();
    let note = |seen: &Arc<Mutex<Vec<(Seen, Instant)>>>, what: Seen| {
        seen.lock().unwrap().push((what, Instant::now()));
    };
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .poll_interval(ms(20))
        .reaper(ReaperConfig { interval: ms(50), ..ReaperConfig::default() })
        .handler("parent", {
            let seen = seen.clone();
            move |_: &JobContext| {
                note(&seen, Seen::ParentStarted);
                std::thread::sleep(ms(20));
                note(&seen, Seen::ParentReturned);
                Ok::<_, JobError>(json!("parent's result"))
            }
        })
        .handler("child", {
            let seen = seen.clone();
            move |ctx: &JobContext| {
                let parent = ctx.queue().get(parent).map(|j| j.state).unwrap_or(JobState::Pending);
                note(&seen, Seen::ChildStarted(parent));
                Ok::<(), JobError>(())
            }
        })
        .start()
        .unwrap();
    // The pool's reaper and claims run beside the live holder.
    std::thread::sleep(ms(300));
    assert_eq!(*seen.lock().unwrap(), vec![], "a job ran while the helper held the parent");
    assert_eq!(state(&queue, child), JobState::Waiting);

    holder.0.kill().unwrap();
    let status = holder.0.wait().unwrap();
    assert!(!status.success(), "the helper was not killed: {status}");
    match queue.wait(child, secs(10)).unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.attempts, 1, "{job:?}"),
        other => panic!("{other:?}\nthe pool saw: {:?}", seen.lock().unwrap()),
    }
    // Nothing more runs after a while.
    std::thread::sleep(ms(200));
    pool.shutdown(secs(5));

    let seen: Vec<(Seen, Instant)> = seen.lock().unwrap().clone();
    let what: Vec<Seen> = seen.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(
        what,
        vec![
            Seen::ParentStarted,
            Seen::ParentReturned,
            Seen::ChildStarted(JobState::Succeeded),
        ],
        "the child must start once, after its parent's retry succeeded"
    );
    let job = queue.get(parent).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 2), "{job:?}");
    assert_eq!(job.errors.len(), 1, "the killed run is in the history: {job:?}");
}
}

contract! {
/// The helper of the test above: claims the parent with a 3 s lease and
/// sleeps until it is killed (a minute at most). Does nothing unless
/// started by that test.
fn dependencies_doomed_holder() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let queue = Queue::builder(engine::target(&PathBuf::from(db)))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .unwrap();
    let leases = queue.manual().claim("default", "doomed", 10, secs(3)).unwrap();
    assert_eq!(leases.len(), 1, "the child was claimable: {leases:?}");
    println!("CLAIMED {}", leases[0].job_id);
    std::thread::sleep(secs(60));
}
}

/// Spins for `d`: a head start finer than a sleep's.
fn spin(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

contract! {
/// A child is inserted while its parent's end commits, from two threads
/// let go at once, each going first in turn by head starts up to 1 ms;
/// the parent succeeds, dies or is cancelled. Whichever commits second
/// must see the other: the child is never left waiting on an ended
/// parent.
fn a_childs_insert_racing_its_parents_end_never_leaves_it_waiting() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    const ROUNDS: usize = 300;
    let mut stranded = Vec::new();
    for round in 0..ROUNDS {
        let how = round % 3;
        let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
        let lease = if how < 2 {
            let mut leases = limits::claim(&queue, 1);
            assert_eq!(limits::ids(&leases), vec![parent]);
            leases.pop()
        } else {
            None
        };
        let head_start = ms(1) * ((round / 6) % 11) as u32 / 10;
        let (parent_first, child_first) = if round % 2 == 0 {
            (head_start, Duration::ZERO)
        } else {
            (Duration::ZERO, head_start)
        };
        let barrier = Barrier::new(2);
        let child = std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                spin(child_first);
                match (how, &lease) {
                    (0, Some(lease)) => queue.manual().complete(lease).unwrap(),
                    (1, Some(lease)) => queue.manual().fail(lease, "broken").unwrap(),
                    _ => queue.cancel(parent).unwrap(),
                }
            });
            let inserter = s.spawn(|| {
                barrier.wait();
                spin(parent_first);
                queue.enqueue(NewJob::new("child").after(&[parent])).unwrap()
            });
            inserter.join().unwrap()
        });
        let now = state(&queue, child);
        match how {
            0 if now == JobState::Pending => {}
            1 if now == JobState::Cancelled => assert_cancelled_by(&queue, child, parent, "dead"),
            2 if now == JobState::Cancelled => {
                assert_cancelled_by(&queue, child, parent, "cancelled")
            }
            _ => stranded.push((round, state(&queue, parent), now)),
        }
        if now == JobState::Pending {
            assert_eq!(limits::run_due(&queue), vec![child]);
        }
    }
    assert_eq!(
        stranded,
        vec![],
        "(round, parent's end, child's state) of {ROUNDS} rounds where the child missed its \
         parent's end"
    );
    assert_eq!(queue.count(JobState::Waiting).unwrap(), 0);
}
}

/// The step `level`-`i` of graph `g`.
fn step(g: usize, level: usize, i: usize) -> String {
    format!("g{g}-L{level}-{i}")
}

contract! {
/// Five graphs of five levels (edges between levels, and from the root to
/// the last two levels) run by a pool while `prune` runs in a loop with a
/// bound past every finished job: every step runs once, none is stranded
/// waiting, and each reads the outputs of all its parents, which the
/// pruner keeps while a child that has not finished needs them.
fn the_pruner_keeps_every_parent_a_child_still_needs() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    // parents[name] = names of its parents.
    let mut parents: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let widths = [1, 3, 3, 3, 1];
    let mut graphs = Vec::new();
    for g in 0..5 {
        let mut graph = Graph::new();
        for (level, width) in widths.iter().enumerate() {
            for i in 0..*width {
                let name = step(g, level, i);
                let mine: Vec<String> = match level {
                    0 => vec![],
                    1 => vec![step(g, 0, 0)],
                    2 => vec![step(g, 1, i), step(g, 1, (i + 1) % 3)],
                    3 => vec![step(g, 0, 0), step(g, 2, 0), step(g, 2, 1), step(g, 2, 2)],
                    _ => vec![step(g, 0, 0), step(g, 3, 0), step(g, 3, 1), step(g, 3, 2)],
                };
                for parent in &mine {
                    graph = graph.edge(parent, &name);
                }
                graph = graph.step(name.clone(), NewJob::new("step").payload(json!({"step": name})));
                parents.insert(name, mine);
            }
        }
        graphs.push(graph);
    }
    let total = parents.len();

    // (step, the outputs of its parents as it read them, or what failed).
    type Run = (String, Result<BTreeSet<String>, String>);
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("step", {
            let runs = runs.clone();
            move |ctx: &JobContext| {
                let name = ctx.payload()["step"].as_str().unwrap().to_owned();
                let read = (|| -> Result<BTreeSet<String>, String> {
                    let mut outputs = BTreeSet::new();
                    for dep in ctx.queue().parents(ctx.job_id()).map_err(|e| e.to_string())? {
                        if !dep.resolved {
                            return Err(format!("started before its parent {} ended", dep.parent));
                        }
                        let parent = ctx.queue().get(dep.parent).map_err(|e| {
                            format!("its parent {} could not be read: {e}", dep.parent)
                        })?;
                        let output = parent.output.ok_or("a parent without its output")?;
                        outputs.insert(output["made_by"].as_str().unwrap_or("?").to_owned());
                    }
                    Ok(outputs)
                })();
                runs.lock().unwrap().push((name.clone(), read));
                Ok::<_, JobError>(json!({ "made_by": name }))
            }
        })
        .start()
        .unwrap();
    let stop = AtomicBool::new(false);
    let pruned = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let bound = chrono::Utc::now() + chrono::Duration::hours(1);
                pruned.fetch_add(queue.prune(bound).unwrap() as usize, Ordering::Relaxed);
                std::thread::sleep(ms(2));
            }
        });
        for graph in graphs {
            queue.enqueue_graph(graph).unwrap();
            std::thread::sleep(ms(20));
        }
        let ran = wait_until("every step ran", secs(20), || runs.lock().unwrap().len() >= total);
        eprintln!("{total} steps ran in {ran:?}");
        wait_until("every step was pruned", secs(10), || row_count(&path) == 0);
        stop.store(true, Ordering::Relaxed);
    });
    pool.shutdown(secs(5));

    let runs = runs.lock().unwrap().clone();
    let mut once: BTreeMap<String, usize> = BTreeMap::new();
    for (name, read) in &runs {
        *once.entry(name.clone()).or_default() += 1;
        let expected: BTreeSet<String> = parents[name].iter().cloned().collect();
        assert_eq!(read.as_ref(), Ok(&expected), "what step {name} read of its parents");
    }
    assert_eq!(once.len(), total, "steps that never ran: {once:?}");
    assert!(once.values().all(|n| *n == 1), "steps that ran twice: {once:?}");
    assert_eq!(pruned.load(Ordering::Relaxed), total, "the pruner took every job, each once");
}
}

contract! {
/// A fan-out of one step to 1,000 and back to one, stored as one graph
/// and run by a pool: the last step runs once, when all 1,000 have
/// succeeded, its 1,000 edges resolved.
fn a_fan_out_of_a_thousand_runs_its_last_step_once_after_all() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    const WIDE: usize = 1_000;
    let mut graph = Graph::new()
        .step("root", NewJob::new("root"))
        .step("last", NewJob::new("last"));
    for i in 0..WIDE {
        let name = format!("m{i}");
        graph = graph
            .step(name.clone(), NewJob::new("middle"))
            .edge("root", &name)
            .edge(&name, "last");
    }
    let ids = queue.enqueue_graph(graph).unwrap();
    assert_eq!(ids.len(), WIDE + 2);
    assert_eq!(queue.count(JobState::Waiting).unwrap(), WIDE as u64 + 1);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 1);

    let middles = Arc::new(AtomicUsize::new(0));
    // Each start of the last step: the succeeded count it read then.
    let lasts: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("root", |_: &JobContext| Ok::<(), JobError>(()))
        .handler("middle", {
            let middles = middles.clone();
            move |_: &JobContext| {
                middles.fetch_add(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
        .handler("last", {
            let lasts = lasts.clone();
            move |ctx: &JobContext| {
                let done = ctx.queue().count(JobState::Succeeded).unwrap();
                lasts.lock().unwrap().push(done);
                Ok::<(), JobError>(())
            }
        })
        .start()
        .unwrap();
    let last = ids["last"];
    match queue.wait(last, secs(60)).unwrap() {
        Waited::Succeeded(_) => {}
        other => panic!("{other:?}; {} middles ran", middles.load(Ordering::SeqCst)),
    }
    std::thread::sleep(ms(100));
    pool.shutdown(secs(5));
    assert_eq!(*lasts.lock().unwrap(), vec![WIDE as u64 + 1], "starts of the last step");
    assert_eq!(middles.load(Ordering::SeqCst), WIDE);
    let edges = queue.parents(last).unwrap();
    assert_eq!(edges.len(), WIDE);
    assert!(edges.iter().all(|e| e.resolved && e.if_fails == IfParentFails::Cancel));
    let mut parent_ids: Vec<JobId> = edges.iter().map(|e| e.parent).collect();
    parent_ids.dedup();
    assert_eq!(parent_ids.len(), WIDE);
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), WIDE as u64 + 2);
}
}
