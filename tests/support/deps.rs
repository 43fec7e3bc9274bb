//! Jobs that run after others (`NewJob::after`, `Graph`) and batches
//! (`Queue::open_batch`), and what their tests read of them.

use super::limits::state;
use tickler::{
    Batch, BatchId, Dependency, IfParentFails, JobId, JobState, NewBatch, NewJob, Outcome, Output,
    Queue,
};

/// The edge of a child to `parent`, as `Queue::parents` reads it.
pub fn edge(parent: JobId, if_fails: IfParentFails, resolved: bool) -> Dependency {
    Dependency {
        parent,
        if_fails,
        resolved,
    }
}

/// A success with `value` as its output.
pub fn complete_with(value: serde_json::Value) -> Outcome {
    Outcome::CompleteWith(Output::new(&value).unwrap().expect("an output"))
}

/// Panics unless job `id` is cancelled with an error that names `parent`
/// and how it ended (`dead`, `cancelled`), and is finished (so that it
/// can be pruned like any cancelled job).
pub fn assert_cancelled_by(queue: &Queue, id: JobId, parent: JobId, how: &str) {
    let job = queue.get(id).unwrap();
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "job {id} should be cancelled since its parent {parent} ended {how}: {job:?}"
    );
    let error = job.last_error.clone().unwrap_or_default();
    let named = format!("job {parent} it runs after ended {how}");
    assert!(
        error.contains(&named),
        "job {id}'s error should name its parent ({named:?}): {error:?}"
    );
    assert!(
        job.finished_at.is_some(),
        "a cancelled job has finished: {job:?}"
    );
}

/// Children of one parent, one per rule, and a grandchild under the one
/// that is cancelled with it.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub parent: JobId,
    /// `IfParentFails::Cancel` (the default of `after`).
    pub cancel: JobId,
    /// After `cancel`, with the default rule.
    pub grandchild: JobId,
    /// `IfParentFails::Hold`.
    pub hold: JobId,
    /// `IfParentFails::Run`, kind `cleanup`.
    pub run: JobId,
}

impl Family {
    /// Enqueues the children of `parent` (which has not ended), all
    /// waiting.
    pub fn after(queue: &Queue, parent: JobId) -> Family {
        let cancel = queue
            .enqueue(NewJob::new("child").after(&[parent]))
            .unwrap();
        let grandchild = queue
            .enqueue(NewJob::new("grandchild").after(&[cancel]))
            .unwrap();
        let hold = queue
            .enqueue(NewJob::new("child").after_with(parent, IfParentFails::Hold))
            .unwrap();
        let run = queue
            .enqueue(NewJob::new("cleanup").after_with(parent, IfParentFails::Run))
            .unwrap();
        let family = Family {
            parent,
            cancel,
            grandchild,
            hold,
            run,
        };
        family.assert_all_waiting(queue);
        family
    }

    /// The children and the grandchild.
    pub fn descendants(&self) -> [JobId; 4] {
        [self.cancel, self.grandchild, self.hold, self.run]
    }

    /// Panics unless every descendant is still waiting.
    pub fn assert_all_waiting(&self, queue: &Queue) {
        for id in self.descendants() {
            assert_eq!(
                state(queue, id),
                JobState::Waiting,
                "job {id} should still wait on its parent"
            );
        }
    }

    /// Panics unless the parent's end as `how` (`dead`, `cancelled`) was
    /// taken into account, at once: the `Cancel` child and its child
    /// cancelled, the `Hold` child waiting on an unresolved edge, the
    /// `Run` child pending on a resolved one.
    pub fn assert_parent_failed(&self, queue: &Queue, how: &str) {
        assert_cancelled_by(queue, self.cancel, self.parent, how);
        assert_cancelled_by(queue, self.grandchild, self.cancel, "cancelled");
        assert_eq!(state(queue, self.hold), JobState::Waiting);
        assert_eq!(
            queue.parents(self.hold).unwrap(),
            vec![edge(self.parent, IfParentFails::Hold, false)]
        );
        assert_eq!(state(queue, self.run), JobState::Pending);
        assert_eq!(
            queue.parents(self.run).unwrap(),
            vec![edge(self.parent, IfParentFails::Run, true)]
        );
    }

    /// After [`Family::assert_parent_failed`]: retries the parent, runs it
    /// and the `Run` child by hand, and checks that the parent's success
    /// released the `Hold` child in its own transaction while the
    /// cancelled stay cancelled; then runs the `Hold` child.
    pub fn release_hold_by_retry(&self, queue: &Queue) {
        queue.retry(self.parent).unwrap();
        assert_eq!(state(queue, self.parent), JobState::Pending);
        assert_eq!(state(queue, self.hold), JobState::Waiting);
        let leases = super::limits::claim(queue, 100);
        assert_eq!(
            super::limits::ids(&leases),
            vec![self.parent, self.run],
            "only the retried parent and the child that runs anyway are claimable"
        );
        let parent = leases.iter().find(|l| l.job_id == self.parent).unwrap();
        queue.manual().complete(parent).unwrap();
        assert_eq!(
            state(queue, self.hold),
            JobState::Pending,
            "the retried parent's success did not release the held child"
        );
        assert_eq!(
            queue.parents(self.hold).unwrap(),
            vec![edge(self.parent, IfParentFails::Hold, true)]
        );
        for id in [self.cancel, self.grandchild] {
            assert_eq!(state(queue, id), JobState::Cancelled, "job {id} came back");
        }
        let run = leases.iter().find(|l| l.job_id == self.run).unwrap();
        queue.manual().complete(run).unwrap();
        assert_eq!(super::limits::run_due(queue), vec![self.hold]);
        assert_eq!(state(queue, self.hold), JobState::Succeeded);
    }
}

/// The counters of `batch` as (members, remaining, succeeded, dead,
/// cancelled).
pub fn counts(batch: &Batch) -> (u64, u64, u64, u64, u64) {
    (
        batch.members,
        batch.remaining,
        batch.succeeded,
        batch.dead,
        batch.cancelled,
    )
}

/// A batch described `campaign` with all three callbacks: kinds
/// `all_sent`, `some_failed`, `campaign_done`.
pub fn with_callbacks() -> NewBatch {
    NewBatch::new()
        .description("campaign")
        .on_success(NewJob::new("all_sent"))
        .on_failure(NewJob::new("some_failed"))
        .on_finish(NewJob::new("campaign_done"))
}

/// Member `n` of `batch`: kind `send`, one attempt.
pub fn member(batch: BatchId, n: u64) -> NewJob {
    NewJob::new("send")
        .payload(serde_json::json!({ "n": n }))
        .batch(batch)
        .max_attempts(1)
}
