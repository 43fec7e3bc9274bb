//! Jobs that run after others, tried the way users of other queues
//! found their dependencies broken: a child retried by hand after it was
//! cancelled while it waited (it must wait again, not run before its
//! parent, yet run if that parent was pruned); a parent between attempts, snoozed or given back (its child
//! must neither run nor be cancelled); a parent retried after its
//! failure cancelled its children (they stay cancelled, and a child
//! retried by hand then runs); a child cancelled with its parent (it
//! gives up its unique_key); and parents shared by several children,
//! ended at once by a pool's threads (each child runs once, after all);
//! a success that releases a child wakes the pools at once.

use crate::support::common;
use crate::support::deps;
use crate::support::limits;
use crate::support::pool;

use common::{fixed_policy, manual_queue_with_policy, ms, secs, temp_db};
use deps::{assert_cancelled_by, edge};
use limits::{claim, ids, run_due, state};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tickler::{
    Clock, Error, Graph, IfParentFails, JobContext, JobError, JobState, NewJob, Waited, WorkerPool,
};

contract! {
/// A child cancelled by hand while it waits, then retried by hand
/// before its parent succeeded, waits again: a retry gives a job fresh
/// attempts, not leave to skip the parents it has not seen end. The
/// edge of a parent that had already succeeded stays resolved; the
/// last parent's success releases it as before.
fn a_child_cancelled_while_it_waited_then_retried_waits_again_for_its_parents() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let first = queue.enqueue(NewJob::new("parent")).unwrap();
    let second = queue.enqueue(NewJob::new("parent")).unwrap();
    let child = queue
        .enqueue(NewJob::new("child").after(&[first, second]))
        .unwrap();
    let grandchild = queue.enqueue(NewJob::new("grandchild").after(&[child])).unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![first, second]);
    let lease = |id| leases.iter().find(|l| l.job_id == id).unwrap();
    queue.manual().complete(lease(first)).unwrap();
    assert_eq!(state(&queue, child), JobState::Waiting);

    queue.cancel(child).unwrap();
    assert_eq!(state(&queue, child), JobState::Cancelled);
    assert_cancelled_by(&queue, grandchild, child, "cancelled");
    queue.retry(child).unwrap();
    assert_eq!(
        state(&queue, child),
        JobState::Waiting,
        "a retried child skipped the parent it still waits on"
    );
    assert_eq!(
        queue.parents(child).unwrap(),
        vec![
            edge(first, IfParentFails::Cancel, true),
            edge(second, IfParentFails::Cancel, false),
        ]
    );
    assert!(
        claim(&queue, 100).is_empty(),
        "a retried child was claimed before its parent succeeded"
    );

    queue.manual().complete(lease(second)).unwrap();
    assert_eq!(state(&queue, child), JobState::Pending);
    assert_eq!(run_due(&queue), vec![child]);
    assert_eq!(
        state(&queue, grandchild),
        JobState::Cancelled,
        "the grandchild cancelled with its parent came back"
    );
}
}

contract! {
/// A child cancelled by hand while its `Hold` parent was dead, then
/// retried, waits again on that unresolved edge; the parent retried and
/// succeeding releases it. A child whose every edge was resolved while
/// it was cancelled (its parent then succeeded) is pending at its retry.
fn a_retried_child_waits_only_on_edges_still_unresolved() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let held = queue
        .enqueue(NewJob::new("child").after_with(parent, IfParentFails::Hold))
        .unwrap();
    let late = queue
        .enqueue(NewJob::new("child").after_with(parent, IfParentFails::Hold))
        .unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().fail(&leases[0], "boom").unwrap();
    assert_eq!(state(&queue, parent), JobState::Dead);
    assert_eq!(state(&queue, held), JobState::Waiting);

    queue.cancel(held).unwrap();
    queue.retry(held).unwrap();
    assert_eq!(
        state(&queue, held),
        JobState::Waiting,
        "a retried child ran although its held parent is dead"
    );
    assert!(claim(&queue, 100).is_empty());

    queue.cancel(late).unwrap();
    queue.retry(parent).unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().complete(&leases[0]).unwrap();
    assert_eq!(state(&queue, held), JobState::Pending);
    assert_eq!(state(&queue, late), JobState::Cancelled, "a cancelled child was released");
    queue.retry(late).unwrap();
    assert_eq!(
        state(&queue, late),
        JobState::Pending,
        "a retried child whose parent succeeded while it was cancelled waits for nothing"
    );
    let mut ran = run_due(&queue);
    ran.sort();
    assert_eq!(ran, vec![held, late]);
}
}

contract! {
/// A child cancelled by hand while it waited on a dead `Hold` parent
/// lets the pruner take that parent (nothing unfinished needs it); a
/// retry of the child then runs it, rather than leave it waiting for
/// ever on a parent that no longer exists.
fn a_retried_child_whose_unresolved_parent_was_pruned_runs() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let child = queue
        .enqueue(NewJob::new("child").after_with(parent, IfParentFails::Hold))
        .unwrap();
    let leases = claim(&queue, 100);
    queue.manual().fail(&leases[0], "boom").unwrap();
    let later = clock.now() + chrono::Duration::seconds(1);
    assert_eq!(queue.prune_state(later, JobState::Dead).unwrap(), 0, "a needed parent was pruned");
    queue.cancel(child).unwrap();
    assert_eq!(queue.prune_state(later, JobState::Dead).unwrap(), 1, "the dead parent is pruned");
    assert!(matches!(queue.get(parent), Err(Error::NotFound(_))));
    queue.retry(child).unwrap();
    assert_eq!(
        state(&queue, child),
        JobState::Pending,
        "a retried child waits for ever on a pruned parent"
    );
    assert_eq!(run_due(&queue), vec![child]);
}
}

contract! {
/// A parent that fails with attempts left (its retry ahead), snoozes,
/// or is given back has not ended: its children stay waiting on an
/// unresolved edge, none cancelled, none released, whatever their rule;
/// its later success releases them all.
fn a_parent_between_attempts_neither_releases_nor_cancels_its_children() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(3)).unwrap();
    let children: Vec<_> = [IfParentFails::Cancel, IfParentFails::Hold, IfParentFails::Run]
        .into_iter()
        .map(|rule| {
            queue
                .enqueue(NewJob::new("child").after_with(parent, rule))
                .unwrap()
        })
        .collect();
    let assert_waiting = |when: &str| {
        for id in &children {
            assert_eq!(state(&queue, *id), JobState::Waiting, "job {id} after its parent {when}");
            assert!(!queue.parents(*id).unwrap()[0].resolved, "{when}");
        }
    };
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().fail(&leases[0], "try again").unwrap();
    assert_waiting("failed with attempts left");
    clock.advance(secs(3600));
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent], "only the parent is claimable");
    queue
        .manual()
        .snooze(&leases[0], clock.now() + chrono::Duration::seconds(5))
        .unwrap();
    assert_waiting("snoozed");
    clock.advance(secs(6));
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().release(&leases[0]).unwrap();
    assert_waiting("given back");
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().complete(&leases[0]).unwrap();
    for id in &children {
        assert_eq!(state(&queue, *id), JobState::Pending);
    }
}
}

contract! {
/// A parent retried by hand after its death cancelled its `Cancel`
/// children does not bring them back when it then succeeds (their
/// edge was resolved by the death); a cancelled child retried by hand
/// then runs, since it waits on nothing.
fn a_retried_parent_leaves_the_children_its_death_cancelled_cancelled() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let child = queue.enqueue(NewJob::new("child").after(&[parent])).unwrap();
    let leases = claim(&queue, 100);
    queue.manual().fail(&leases[0], "boom").unwrap();
    assert_cancelled_by(&queue, child, parent, "dead");

    queue.retry(parent).unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    queue.manual().complete(&leases[0]).unwrap();
    assert_eq!(state(&queue, child), JobState::Cancelled);
    queue.retry(child).unwrap();
    assert_eq!(state(&queue, child), JobState::Pending);
    assert_eq!(run_due(&queue), vec![child]);
}
}

contract! {
/// A waiting child keeps its unique_key (a second enqueue names it), a
/// child cancelled with its parent gives it up (the next job with the
/// key is stored), and a cancelled child retried while another job
/// holds its key is refused with the holder named.
fn a_child_cancelled_with_its_parent_gives_up_its_unique_key() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let child = queue
        .enqueue(NewJob::new("child").after(&[parent]).unique_key("report-7"))
        .unwrap();
    assert_eq!(
        queue.enqueue(NewJob::new("child").unique_key("report-7")).unwrap(),
        child,
        "a waiting child lost its unique_key"
    );
    let leases = claim(&queue, 100);
    queue.manual().fail(&leases[0], "boom").unwrap();
    assert_cancelled_by(&queue, child, parent, "dead");
    let next = queue
        .enqueue(NewJob::new("child").unique_key("report-7"))
        .unwrap();
    assert_ne!(next, child, "a child cancelled with its parent kept its unique_key");
    match queue.retry(child) {
        Err(Error::UniqueKeyHeld { held_by, .. }) => assert_eq!(held_by, next),
        other => panic!("a retry over a held unique_key: {other:?}"),
    }
    assert_eq!(state(&queue, child), JobState::Cancelled);
}
}

contract! {
/// Three children each after the same 300 parents, stored as one
/// graph, their parents ended by a pool's four threads at once (their
/// resolutions lock the same children): each child runs once, after
/// all 300 succeeded, and none of the parents' outcomes failed.
fn parents_shared_by_several_children_and_ended_at_once_release_each_child_once() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    const PARENTS: usize = 300;
    const CHILDREN: usize = 3;
    let mut graph = Graph::new();
    for c in 0..CHILDREN {
        graph = graph.step(format!("c{c}"), NewJob::new("child"));
    }
    for p in 0..PARENTS {
        let name = format!("p{p}");
        graph = graph.step(name.clone(), NewJob::new("parent").max_attempts(1));
        for c in 0..CHILDREN {
            graph = graph.edge(&name, &format!("c{c}"));
        }
    }
    let ids = queue.enqueue_graph(graph).unwrap();
    let parents_done = Arc::new(AtomicUsize::new(0));
    // Each start of a child: the parents that had returned by then.
    let starts: Arc<Mutex<Vec<(tickler::JobId, usize)>>> = Arc::default();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("parent", {
            let parents_done = parents_done.clone();
            move |_: &JobContext| {
                parents_done.fetch_add(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
        .handler("child", {
            let starts = starts.clone();
            let parents_done = parents_done.clone();
            move |ctx: &JobContext| {
                let done = parents_done.load(Ordering::SeqCst);
                starts.lock().unwrap().push((ctx.job_id(), done));
                Ok::<(), JobError>(())
            }
        })
        .start()
        .unwrap();
    for c in 0..CHILDREN {
        match queue.wait(ids[&format!("c{c}")], secs(60)).unwrap() {
            Waited::Succeeded(_) => {}
            other => panic!("child c{c}: {other:?}; {} parents ran", parents_done.load(Ordering::SeqCst)),
        }
    }
    pool.shutdown(secs(5));
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), CHILDREN, "starts of the children: {starts:?}");
    assert!(
        starts.iter().all(|(_, done)| *done == PARENTS),
        "a child started before all its parents returned: {starts:?}"
    );
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), (PARENTS + CHILDREN) as u64);
    assert_eq!(queue.count(JobState::Dead).unwrap(), 0);
}
}

contract! {
/// A success that releases a child wakes this process's watchers in
/// its own call, as a new job does: a pool serving only the child's
/// queue looks at once, not at its next poll (before, it waited about
/// a second on a server engine). Checked without waiting: a watcher
/// that has taken in every earlier change has one when `complete`
/// returns.
fn a_success_that_releases_a_child_wakes_the_watchers_at_once() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let parent = queue.enqueue(NewJob::new("parent")).unwrap();
    let child = queue
        .enqueue(NewJob::new("child").queue("other").after(&[parent]))
        .unwrap();
    let leases = claim(&queue, 100);
    assert_eq!(ids(&leases), vec![parent]);
    let mut watcher = queue.manual().watcher().unwrap();
    // Takes in the enqueues and the claim (a wake-up they sent late
    // could only hide a missing one).
    watcher.changed().unwrap();
    for _ in 0..10 {
        if !watcher.wait(ms(1), ms(1)).unwrap() {
            break;
        }
    }
    queue.manual().complete(&leases[0]).unwrap();
    assert_eq!(state(&queue, child), JobState::Pending);
    assert!(
        watcher.wait(ms(1), ms(1)).unwrap(),
        "the release of a child woke no watcher"
    );
}
}
