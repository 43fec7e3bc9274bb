//! Jobs that run after others (`NewJob::after`, `Graph`), by hand on a
//! manual clock: a child is `waiting`, out of every claim's way, until the
//! end of its last parent resolves it in the transaction of that end
//! (checked right after the call that ends the parent, with no wait);
//! a parent that ends dead or cancelled cancels, holds or runs each child
//! by its rule, and a cancelled child cancels its own children in turn; a
//! child stored after its parent ended is resolved at once; a stale
//! holder's outcome resolves nothing; bad graphs and unknown parents are
//! refused with nothing stored. Runs by worker pools, a killed holder and
//! the race of a child's insert with its parent's end are in
//! `dependencies_running`.

use crate::support::app_tx::{app_effects, complete_writing, create_app_effects};
use crate::support::common;
use crate::support::deps;
use crate::support::limits;

use common::{fixed_policy, manual_queue_with_policy, ms, row_count, secs, t0, temp_db};
use deps::{assert_cancelled_by, complete_with, edge, Family};
use limits::{claim, ids, run_due, state};
use serde_json::json;
use tickler::{Error, Graph, IfParentFails, JobId, JobState, NewJob, Waited};

contract! {
/// A child of two parents is claimed by no claim, however many slots it
/// asks for, until the last parent succeeds; the success that resolves
/// its last edge makes it pending (scheduled, if its run_at is ahead) in
/// its own transaction; it then runs and reads its parents' outputs.
fn a_child_waits_until_its_last_parent_succeeds_then_is_pending_at_once() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let first = queue.enqueue(NewJob::new("fetch")).unwrap();
    let second = queue.enqueue(NewJob::new("fetch")).unwrap();
    let child = queue
        .enqueue(NewJob::new("upload").after(&[second, first]))
        .unwrap();
    let later = queue
        .enqueue(
            NewJob::new("upload")
                .after(&[first])
                .run_at(t0() + chrono::Duration::hours(1)),
        )
        .unwrap();
    for id in [child, later] {
        assert_eq!(state(&queue, id), JobState::Waiting);
    }
    assert_eq!(queue.count(JobState::Waiting).unwrap(), 2);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 2);
    assert_eq!(
        queue.parents(child).unwrap(),
        vec![
            edge(first, IfParentFails::Cancel, false),
            edge(second, IfParentFails::Cancel, false),
        ],
        "the edges, by parent id"
    );
    assert_eq!(queue.parents(first).unwrap(), vec![]);

    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![first, second], "a waiting child was claimed");
    assert!(claim(&queue, 100).is_empty(), "a waiting child was claimed");
    let lease = |id: JobId| leases.iter().find(|l| l.job_id == id).unwrap();

    let recorded = queue
        .manual()
        .record_outcomes(&[(lease(first), complete_with(json!({"rows": 1})))])
        .unwrap();
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    assert_eq!(
        state(&queue, child),
        JobState::Waiting,
        "released before its last parent succeeded"
    );
    assert_eq!(
        queue.parents(child).unwrap(),
        vec![
            edge(first, IfParentFails::Cancel, true),
            edge(second, IfParentFails::Cancel, false),
        ]
    );
    assert_eq!(
        state(&queue, later),
        JobState::Scheduled,
        "a released child whose run_at is ahead is scheduled"
    );
    assert!(claim(&queue, 100).is_empty());

    let recorded = queue
        .manual()
        .record_outcomes(&[(lease(second), complete_with(json!({"rows": 2})))])
        .unwrap();
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    assert_eq!(
        state(&queue, child),
        JobState::Pending,
        "not pending in the transaction of its last parent's success"
    );
    assert_eq!(
        queue.parents(child).unwrap(),
        vec![
            edge(first, IfParentFails::Cancel, true),
            edge(second, IfParentFails::Cancel, true),
        ]
    );

    // It runs, and reads what its parents produced.
    let mine = claim(&queue, 100);
    assert_eq!(ids(&mine), vec![child]);
    let outputs: Vec<serde_json::Value> = queue
        .parents(mine[0].job_id)
        .unwrap()
        .iter()
        .map(|dep| queue.get(dep.parent).unwrap().output.expect("a parent's output"))
        .collect();
    assert_eq!(outputs, vec![json!({"rows": 1}), json!({"rows": 2})]);
    queue.manual().complete(&mine[0]).unwrap();
    assert_eq!(state(&queue, child), JobState::Succeeded);

    clock.advance(secs(3600));
    assert_eq!(run_due(&queue), vec![later]);
    assert_eq!(queue.count(JobState::Waiting).unwrap(), 0);
}
}

contract! {
/// Attempts used up through `fail`: a failed attempt with attempts left
/// resolves nothing; the last one cancels the `Cancel` child (its error
/// naming the parent) and its child, keeps the `Hold` child waiting and
/// makes the `Run` child pending; a retry of the parent that succeeds
/// releases the held child.
fn a_parent_dead_by_its_failures_cancels_holds_or_runs_each_child() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(2)).unwrap();
    let family = Family::after(&queue, parent);

    let first = claim(&queue, 100);
    assert_eq!(ids(&first), vec![parent]);
    queue.manual().fail(&first[0], "disk full").unwrap();
    assert_eq!(state(&queue, parent), JobState::Scheduled);
    family.assert_all_waiting(&queue);

    clock.advance(secs(2));
    let last = claim(&queue, 100);
    assert_eq!(ids(&last), vec![parent]);
    queue.manual().fail(&last[0], "disk full").unwrap();
    assert_eq!(state(&queue, parent), JobState::Dead);
    family.assert_parent_failed(&queue, "dead");
    family.release_hold_by_retry(&queue);
}
}

contract! {
/// Attempts used up through the reaper: a parent with one attempt whose
/// lease runs out is dead, and its end is resolved in the reaper's
/// transaction as a failure's is.
fn a_parent_dead_by_the_reaper_cancels_holds_or_runs_each_child() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let family = Family::after(&queue, parent);
    let lease = queue.manual().claim("default", "w", 100, secs(10)).unwrap();
    assert_eq!(ids(&lease), vec![parent]);

    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(state(&queue, parent), JobState::Dead);
    family.assert_parent_failed(&queue, "dead");
    assert!(queue.manual().complete(&lease[0]).unwrap_err().is_lease_lost());
    family.assert_parent_failed(&queue, "dead");
    family.release_hold_by_retry(&queue);
}
}

contract! {
/// A parent whose row cannot be read is made dead by the claim that
/// finds it, and its end is resolved in that claim's transaction.
fn a_parent_buried_by_a_claim_cancels_or_holds_its_children() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(5)).unwrap();
    let family = Family::after(&queue, parent);
    // Deeper than serde_json reads (enqueue refuses it; a hand edit does not).
    let deep = format!("{}0{}", "[".repeat(300), "]".repeat(300));
    common::engine::execute_batch(
        &path,
        &format!("UPDATE tickler_jobs SET payload = '{deep}' WHERE id = {parent}"),
    );
    assert!(claim(&queue, 100).is_empty(), "the unreadable parent was handed out");
    assert_eq!(state(&queue, parent), JobState::Dead);
    family.assert_parent_failed(&queue, "dead");
    assert_eq!(ids(&claim(&queue, 100)), vec![family.run]);
}
}

contract! {
/// A parent completed in one transaction with the application's writes
/// (`Queue::complete_with`) releases its child in that transaction; a
/// stale holder's, refused, releases nothing.
fn a_parent_completed_with_the_applications_writes_releases_its_child() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    create_app_effects(&path);
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(3)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let stale = queue.manual().claim("default", "w1", 100, secs(10)).unwrap();
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2));
    let current = claim(&queue, 100);
    assert_eq!(ids(&current), vec![parent]);
    assert!(complete_writing(&queue, &stale[0]).unwrap_err().is_lease_lost());
    assert_eq!(state(&queue, child), JobState::Waiting);

    complete_writing(&queue, &current[0]).unwrap();
    assert_eq!(app_effects(&path), 1);
    assert_eq!(state(&queue, child), JobState::Pending);
    assert_eq!(run_due(&queue), vec![child]);
}
}

contract! {
/// `Queue::cancel` of a parent, pending or running, ends it as a failure
/// does for its children; the running parent's late success is refused
/// and changes nothing for them.
fn a_cancelled_parent_cancels_holds_or_runs_each_child() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let pending = queue.enqueue(NewJob::new("parent")).unwrap();
    let family = Family::after(&queue, pending);
    queue.cancel(pending).unwrap();
    assert_eq!(state(&queue, pending), JobState::Cancelled);
    family.assert_parent_failed(&queue, "cancelled");
    family.release_hold_by_retry(&queue);

    let running = queue.enqueue(NewJob::new("parent")).unwrap();
    let family = Family::after(&queue, running);
    let lease = claim(&queue, 100);
    assert_eq!(ids(&lease), vec![running]);
    queue.cancel(running).unwrap();
    family.assert_parent_failed(&queue, "cancelled");
    assert!(queue.manual().complete(&lease[0]).unwrap_err().is_lease_lost());
    family.assert_parent_failed(&queue, "cancelled");
}
}

contract! {
/// A waiting child can be cancelled: it ends cancelled, and its own
/// children follow their rules as for any cancelled parent; its parent's
/// later success does not bring it back.
fn cancelling_a_waiting_child_cancels_its_own_children() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent")).unwrap();
    let waiting = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let family = Family::after(&queue, waiting);

    queue.cancel(waiting).unwrap();
    assert_eq!(state(&queue, waiting), JobState::Cancelled);
    family.assert_parent_failed(&queue, "cancelled");
    assert!(
        matches!(queue.cancel(waiting), Err(Error::InvalidState { .. })),
        "a cancelled job cannot be cancelled again"
    );

    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent, family.run]);
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    assert_eq!(state(&queue, waiting), JobState::Cancelled, "the parent's success revived it");
    assert_eq!(state(&queue, family.hold), JobState::Waiting);
    assert!(claim(&queue, 100).is_empty());
}
}

/// The ids a refused enqueue would have stored, or its error.
type Stored = tickler::Result<Vec<JobId>>;

/// Checks one enqueue that must be refused with nothing stored: returns
/// its error, or what went wrong in words (what it stored, the rows it
/// left) for the verdict at the end of the test; `rows` is the count of
/// rows before it and after.
fn refusal(
    queue: &tickler::Queue,
    path: &std::path::Path,
    rows: &mut i64,
    result: Stored,
) -> Result<Error, String> {
    let now = row_count(path);
    let left = if now == *rows {
        String::new()
    } else {
        let jobs = queue.list(&tickler::JobFilter::default()).unwrap();
        let last: Vec<(JobId, JobState)> = jobs
            .iter()
            .rev()
            .take((now - *rows).max(0) as usize)
            .map(|j| (j.id, j.state))
            .collect();
        format!("; the rows went from {rows} to {now}, the last ones {last:?}")
    };
    *rows = now;
    match result {
        Ok(ids) => {
            let stored: Vec<(JobId, JobState, Vec<tickler::Dependency>)> = ids
                .into_iter()
                .map(|id| (id, state(queue, id), queue.parents(id).unwrap()))
                .collect();
            Err(format!("stored as (job, state, edges) {stored:?}{left}"))
        }
        Err(e) if left.is_empty() => Ok(e),
        Err(e) => Err(format!("refused with {e:?}{left}")),
    }
}

/// Panics unless `steps` is the cycle `cycle` (its steps in edge order,
/// from any of them), its first step repeated last.
fn assert_cycle(steps: &[String], cycle: &[&str]) {
    let n = cycle.len();
    assert_eq!(steps.len(), n + 1, "{steps:?}");
    assert_eq!(
        steps[0], steps[n],
        "the first step is repeated last: {steps:?}"
    );
    let at = cycle
        .iter()
        .position(|s| *s == steps[0])
        .unwrap_or_else(|| panic!("{steps:?} starts outside the cycle {cycle:?}"));
    let expected: Vec<&str> = (0..=n).map(|i| cycle[(at + i) % n]).collect();
    assert_eq!(steps, expected.as_slice(), "not the cycle in edge order");
}

contract! {
/// Graphs and parents that cannot be stored are refused with a typed
/// error naming what is wrong, and nothing of them is stored. Every case
/// is tried before the verdict, which lists those that went wrong.
fn graphs_and_parents_that_cannot_be_stored_are_refused_with_nothing_stored() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let pruned = queue.enqueue(NewJob::new("gone")).unwrap();
    queue.cancel(pruned).unwrap();
    assert_eq!(queue.prune(t0() + chrono::Duration::hours(1)).unwrap(), 1);
    let stored = queue.enqueue(NewJob::new("stored")).unwrap();
    let mut rows = row_count(&path);
    let job = || NewJob::new("step");
    let graph = |graph: Graph| -> Stored {
        queue.enqueue_graph(graph).map(|ids| ids.into_values().collect())
    };
    let one = |job: NewJob| -> Stored { queue.enqueue(job).map(|id| vec![id]) };
    // (case, what went wrong)
    let mut wrong: Vec<(&str, String)> = Vec::new();
    let mut expect = |case: &'static str, rows: &mut i64, result: Stored, ok: &dyn Fn(&Error) -> bool| {
        match refusal(&queue, &path, rows, result) {
            Ok(e) if ok(&e) => {}
            Ok(e) => wrong.push((case, format!("refused with {e:?}"))),
            Err(what) => wrong.push((case, what)),
        }
    };

    // A cycle beside a step that is not in it: the cycle alone is named.
    let cycle = Graph::new()
        .step("lead", job())
        .step("a", job())
        .step("b", job())
        .step("c", job())
        .edge("lead", "a")
        .edge("a", "b")
        .edge("b", "c")
        .edge("c", "a");
    expect("a cycle", &mut rows, graph(cycle), &|e| match e {
        Error::DependencyCycle { steps } => {
            assert_cycle(steps, &["a", "b", "c"]);
            e.to_string().contains(&steps.join(" -> "))
        }
        _ => false,
    });
    let itself = Graph::new()
        .step("ok", job())
        .step("a", job())
        .edge("ok", "a")
        .edge("a", "a");
    expect("a step after itself", &mut rows, graph(itself), &|e| {
        matches!(e, Error::DependencyCycle { steps } if steps == &["a", "a"])
    });
    let unknown = Graph::new().step("a", job()).edge("a", "nowhere");
    expect("an edge to no step", &mut rows, graph(unknown), &|e| {
        matches!(e, Error::InvalidArgument(m) if m.contains("\"nowhere\""))
    });
    let unknown_parent = Graph::new().step("a", job()).edge("elsewhere", "a");
    expect("an edge from no step", &mut rows, graph(unknown_parent), &|e| {
        matches!(e, Error::InvalidArgument(m) if m.contains("\"elsewhere\""))
    });
    let twice = Graph::new()
        .step("a", job())
        .step("twice", job())
        .step("twice", job())
        .edge("a", "twice");
    expect("two steps of one name", &mut rows, graph(twice), &|e| {
        matches!(e, Error::InvalidArgument(m) if m.contains("\"twice\""))
    });

    // Unknown parents: one pruned, one never assigned, of a single job, a
    // batch and a graph's step.
    let never = JobId(stored.0 + 1_000_000);
    for missing in [pruned, never] {
        let not_found = move |e: &Error| matches!(e, Error::ParentNotFound(id) if *id == missing);
        expect("a job after a missing job", &mut rows, one(job().after(&[stored, missing])), &not_found);
        expect(
            "a batch with a job after a missing job",
            &mut rows,
            queue.enqueue_batch(vec![job(), job().after(&[missing]), job()]),
            &not_found,
        );
        let step_after = Graph::new()
            .step("a", job())
            .step("b", job().after(&[missing]))
            .edge("a", "b");
        expect("a graph's step after a missing job", &mut rows, graph(step_after), &not_found);
    }

    // Ids not yet assigned, the next ones (each guessed right after a job
    // is stored, so the engine's next ids follow it): the job itself would
    // get it, or a job of its own batch or graph stored with it. Accepted,
    // it would wait on itself, on a later job, or in a cycle, forever.
    let mut probes = Vec::new();
    let mut probe = |rows: &mut i64| {
        let id = queue.enqueue(job()).unwrap();
        probes.push(id);
        *rows += 1;
        id.0
    };
    let next = |largest: i64, k: i64| move |e: &Error| matches!(e, Error::ParentNotFound(id) if id.0 == largest + k);
    let largest = probe(&mut rows);
    expect(
        "a job after its own id",
        &mut rows,
        one(job().after(&[JobId(largest + 1)])),
        &next(largest, 1),
    );
    let largest = probe(&mut rows);
    expect(
        "a batch with a job after the batch's first",
        &mut rows,
        queue.enqueue_batch(vec![job(), job().after(&[JobId(largest + 1)]), job()]),
        &next(largest, 1),
    );
    let largest = probe(&mut rows);
    expect(
        "a batch of two jobs after each other",
        &mut rows,
        queue.enqueue_batch(vec![
            job().after(&[JobId(largest + 2)]),
            job().after(&[JobId(largest + 1)]),
        ]),
        &|e| next(largest, 1)(e) || next(largest, 2)(e),
    );
    let largest = probe(&mut rows);
    let later_step = Graph::new()
        .step("a", job().after(&[JobId(largest + 2)]))
        .step("b", job());
    expect(
        "a graph's step after the id of a later step",
        &mut rows,
        graph(later_step),
        &next(largest, 2),
    );
    assert_eq!(wrong, vec![], "(case, what went wrong) of the refusals");

    // Nothing was left of them: the next job stored waits on nothing, and
    // the stored jobs have no child.
    let after_refusals = queue.enqueue(job()).unwrap();
    assert_eq!(state(&queue, after_refusals), JobState::Pending);
    assert_eq!(queue.parents(after_refusals).unwrap(), vec![]);
    assert_eq!(queue.count(JobState::Waiting).unwrap(), 0);
    let leases = claim(&queue, 100);
    let mut expected = vec![stored];
    expected.extend(probes);
    expected.push(after_refusals);
    assert_eq!(ids(&leases), expected);
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
    assert_eq!(queue.count(JobState::Waiting).unwrap(), 0);
    assert!(matches!(queue.parents(pruned), Err(Error::NotFound(_))));
}
}

contract! {
/// A holder whose lease was reaped and whose job was claimed again
/// reports success, or failure for good: refused, and the child still
/// waits on an unresolved edge until the current holder succeeds.
fn a_stale_holders_outcome_resolves_nothing() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(3)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let stale = queue.manual().claim("default", "w1", 100, secs(10)).unwrap();
    assert_eq!(ids(&stale), vec![parent]);
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2));
    let current = queue.manual().claim("default", "w2", 100, secs(10)).unwrap();
    assert_eq!(ids(&current), vec![parent]);

    assert!(queue.manual().complete(&stale[0]).unwrap_err().is_lease_lost());
    assert_eq!(state(&queue, child), JobState::Waiting);
    assert_eq!(queue.parents(child).unwrap(), vec![edge(parent, IfParentFails::Cancel, false)]);
    assert!(claim(&queue, 100).is_empty(), "the child was released by a stale success");
    let stale_failure = queue.manual().fail_permanently(&stale[0], "stale");
    assert!(stale_failure.unwrap_err().is_lease_lost());
    assert_eq!(state(&queue, child), JobState::Waiting, "a stale failure cancelled the child");
    assert_eq!(state(&queue, parent), JobState::Running);

    queue.manual().complete(&current[0]).unwrap();
    assert_eq!(state(&queue, child), JobState::Pending);
    assert_eq!(run_due(&queue), vec![child]);
}
}

contract! {
/// A child stored after its parent ended is resolved by its own insert:
/// pending (or scheduled) after a success, and after a failure as its
/// rule says (cancelled naming the parent, waiting, pending), also for
/// a graph's step and the steps after it.
fn a_child_of_a_parent_that_already_ended_is_resolved_at_its_insert() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let succeeded = queue.enqueue(NewJob::new("parent")).unwrap();
    let dead = queue.enqueue(NewJob::new("parent").max_attempts(5)).unwrap();
    let unfinished = queue
        .enqueue(NewJob::new("parent").run_at(t0() + chrono::Duration::hours(1)))
        .unwrap();
    for lease in claim(&queue, 100) {
        if lease.job_id == succeeded {
            queue.manual().complete(&lease).unwrap();
        } else {
            queue.manual().fail_permanently(&lease, "broken").unwrap();
        }
    }
    let cancelled = queue.enqueue(NewJob::new("parent")).unwrap();
    queue.cancel(cancelled).unwrap();
    assert_eq!(state(&queue, succeeded), JobState::Succeeded);
    assert_eq!(state(&queue, dead), JobState::Dead);

    let after = |parent: JobId, if_fails: IfParentFails| {
        queue.enqueue(NewJob::new("child").after_with(parent, if_fails)).unwrap()
    };
    let ready = after(succeeded, IfParentFails::Cancel);
    assert_eq!(state(&queue, ready), JobState::Pending);
    assert_eq!(queue.parents(ready).unwrap(), vec![edge(succeeded, IfParentFails::Cancel, true)]);
    let later = queue
        .enqueue(
            NewJob::new("child")
                .after(&[succeeded])
                .run_at(t0() + chrono::Duration::minutes(5)),
        )
        .unwrap();
    assert_eq!(state(&queue, later), JobState::Scheduled);

    let doomed = after(dead, IfParentFails::Cancel);
    assert_cancelled_by(&queue, doomed, dead, "dead");
    assert_eq!(queue.parents(doomed).unwrap(), vec![edge(dead, IfParentFails::Cancel, true)]);
    let held = after(dead, IfParentFails::Hold);
    assert_eq!(state(&queue, held), JobState::Waiting);
    assert_eq!(queue.parents(held).unwrap(), vec![edge(dead, IfParentFails::Hold, false)]);
    let cleanup = after(dead, IfParentFails::Run);
    assert_eq!(state(&queue, cleanup), JobState::Pending);
    let orphan = after(cancelled, IfParentFails::Cancel);
    assert_cancelled_by(&queue, orphan, cancelled, "cancelled");

    // One parent ended, one not: waiting; one succeeded, one dead: the
    // dead one's rule.
    let half = queue
        .enqueue(NewJob::new("child").after(&[succeeded, unfinished]))
        .unwrap();
    assert_eq!(state(&queue, half), JobState::Waiting);
    let mixed = queue
        .enqueue(NewJob::new("child").after(&[succeeded, dead]))
        .unwrap();
    assert_cancelled_by(&queue, mixed, dead, "dead");

    // A graph's step after a dead job is cancelled at the insert, and the
    // steps after it in turn; a step after a job that succeeded is
    // pending.
    let steps = queue
        .enqueue_graph(
            Graph::new()
                .step("first", NewJob::new("step").after(&[dead]))
                .step("second", NewJob::new("step"))
                .step("other", NewJob::new("step").after(&[succeeded]))
                .edge("first", "second"),
        )
        .unwrap();
    assert_cancelled_by(&queue, steps["first"], dead, "dead");
    assert_cancelled_by(&queue, steps["second"], steps["first"], "cancelled");
    assert_eq!(state(&queue, steps["other"]), JobState::Pending);

    // The held child is released by the dead parent's retried success.
    queue.retry(dead).unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![dead, ready, cleanup, steps["other"]]);
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    assert_eq!(state(&queue, held), JobState::Pending);
    for id in [doomed, mixed, steps["first"], steps["second"]] {
        assert_eq!(state(&queue, id), JobState::Cancelled, "job {id} came back");
    }
    clock.advance(secs(3600));
    let mut last = run_due(&queue);
    last.sort();
    assert_eq!(last, vec![unfinished, later, held]);
    assert_eq!(state(&queue, half), JobState::Pending);
}
}

contract! {
/// `Queue::wait` on a waiting child does not end while it waits, and
/// ends with its end: succeeded after its parent's success and its own
/// run, cancelled (naming the parent) when its parent dies; a held child
/// goes on waiting.
fn waiting_for_a_waiting_child_ends_with_its_end() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    match queue.wait(child, ms(150)).unwrap() {
        Waited::TimedOut(job) => assert_eq!(job.state, JobState::Waiting),
        other => panic!("{other:?}"),
    }
    let waiter = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.wait(child, secs(30)).unwrap())
    };
    std::thread::sleep(ms(100));
    assert_eq!(run_due(&queue), vec![parent]);
    std::thread::sleep(ms(50));
    assert!(!waiter.is_finished(), "the wait ended when the child was released");
    assert_eq!(run_due(&queue), vec![child]);
    match waiter.join().unwrap() {
        Waited::Succeeded(job) => assert_eq!(job.id, child),
        other => panic!("{other:?}"),
    }

    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let held = queue
        .enqueue(NewJob::new("child").after_with(parent, IfParentFails::Hold))
        .unwrap();
    let waiter = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.wait(child, secs(30)).unwrap())
    };
    std::thread::sleep(ms(100));
    let lease = claim(&queue, 100);
    assert_eq!(ids(&lease), vec![parent]);
    queue.manual().fail(&lease[0], "out of paper").unwrap();
    match waiter.join().unwrap() {
        Waited::Cancelled(job) => {
            assert_eq!(job.id, child);
            assert!(
                job.last_error.unwrap_or_default().contains(&format!("job {parent} ")),
                "the cancel does not name the parent"
            );
        }
        other => panic!("{other:?}"),
    }
    match queue.wait(held, ms(150)).unwrap() {
        Waited::TimedOut(job) => assert_eq!(job.state, JobState::Waiting),
        other => panic!("{other:?}"),
    }
}
}

contract! {
/// The operator's bulk actions are ends too: cancelling all pending jobs
/// of a kind cancels the children that asked so and runs those that run
/// anyway; deleting all dead jobs keeps a dead parent that a held child
/// still waits on (and deletes it once the child is gone), and takes a
/// deleted child's edges with it.
fn bulk_cancels_resolve_and_bulk_deletes_keep_needed_parents() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("fetch")).unwrap();
    let cancelled = queue.enqueue(NewJob::new("upload").after(&[parent])).unwrap();
    let anyway = queue
        .enqueue(NewJob::new("clean").after_with(parent, IfParentFails::Run))
        .unwrap();
    assert_eq!(queue.cancel_pending(None, Some("fetch")).unwrap(), 1);
    assert_cancelled_by(&queue, cancelled, parent, "cancelled");
    assert_eq!(state(&queue, anyway), JobState::Pending);

    // A dead parent a held child waits on stays through a bulk delete.
    let doomed = queue.enqueue(NewJob::new("fetch").max_attempts(1)).unwrap();
    let held = queue
        .enqueue(NewJob::new("upload").after_with(doomed, IfParentFails::Hold))
        .unwrap();
    let leases = claim(&queue, 10);
    let lease = leases.iter().find(|l| l.job_id == doomed).unwrap();
    queue.manual().fail(lease, "boom").unwrap();
    assert_eq!(state(&queue, doomed), JobState::Dead);
    assert_eq!(queue.delete_dead(None, None).unwrap(), 0);
    assert_eq!(state(&queue, held), JobState::Waiting);
    // Once the child has ended, the parent goes, and the child's edges
    // with the child.
    queue.cancel(held).unwrap();
    assert_eq!(queue.delete_dead(None, None).unwrap(), 1);
    assert!(matches!(queue.get(doomed), Err(Error::NotFound(_))));
    assert_eq!(queue.parents(held).unwrap(), vec![edge(doomed, IfParentFails::Hold, false)]);
    // Pruning the cancelled jobs takes the held child, but not the
    // cancelled parent of a child that has not run yet.
    queue.prune_state(t0() + chrono::Duration::days(1), JobState::Cancelled).unwrap();
    assert!(matches!(queue.parents(held), Err(Error::NotFound(_))));
    assert!(matches!(queue.get(cancelled), Err(Error::NotFound(_))));
    assert_eq!(state(&queue, parent), JobState::Cancelled);
    assert_eq!(queue.parents(anyway).unwrap(), vec![edge(parent, IfParentFails::Run, true)]);
}
}
