//! `Ops::page` on every engine: the pages of a state, walked by cursor,
//! give each of its jobs once, in the state's order (the order of
//! `Ops::list_state`), filtered by queue and kind; scheduled jobs waiting
//! for a retry are told apart from those delayed on purpose; a cursor
//! reads back from its text and refuses another state's page; and
//! `Ops::holding_unique_key` finds the unfinished holder of a key.

use crate::support::common;
use crate::support::limits::claim_in;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use tickler::{Error, Job, JobCursor, JobId, JobPage, JobState, NewJob, Queue};

/// Every job of `page`'s filters, walked `page.limit` at a time.
fn walk(queue: &Queue, mut page: JobPage) -> Vec<JobId> {
    let mut all = Vec::new();
    loop {
        let jobs = queue.ops().page(&page).unwrap();
        assert!(jobs.len() <= page.limit);
        all.extend(jobs.iter().map(|j| j.id));
        match jobs.last() {
            Some(last) if jobs.len() == page.limit => {
                // The cursor travels as text, as a link carries it.
                let text = JobCursor::after(last).to_string();
                page.after = Some(text.parse().unwrap());
            }
            _ => return all,
        }
    }
}

/// `state`'s jobs in its order (one unpaged list), kept by `keep`.
fn listed(queue: &Queue, state: JobState, keep: impl Fn(&Job) -> bool) -> Vec<JobId> {
    let all = queue.ops().list_state(state, 1_000).unwrap();
    all.iter().filter(|j| keep(j)).map(|j| j.id).collect()
}

contract! {
fn pages_walk_each_state_in_order_by_cursor() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());

    // Pending: two queues, two kinds, three priorities, due times that
    // tie (one clock reading) and differ.
    for i in 0..23 {
        let q = if i % 3 == 0 { "a" } else { "b" };
        let kind = if i % 2 == 0 { "x" } else { "y" };
        let priority = [0, 5, -1][i % 3 * (i % 2)];
        queue
            .enqueue(NewJob::new(kind).queue(q).priority(priority))
            .unwrap();
        if i % 4 == 0 {
            clock.advance(secs(1));
        }
    }
    let pending = listed(&queue, JobState::Pending, |_| true);
    assert_eq!(pending.len(), 23);
    for limit in [1, 4, 23, 50] {
        let page = JobPage { limit, ..JobPage::new(JobState::Pending) };
        assert_eq!(walk(&queue, page), pending, "limit {limit}");
    }
    let page = JobPage {
        queue: Some("b".into()),
        kind: Some("y".into()),
        limit: 3,
        ..JobPage::new(JobState::Pending)
    };
    let by_b_y = listed(&queue, JobState::Pending, |j| j.queue == "b" && j.kind == "y");
    assert!(by_b_y.len() > 3);
    assert_eq!(walk(&queue, page), by_b_y);

    // Dead, newest first: some finish in the same millisecond.
    for (i, lease) in claim_in(&queue, "b", 9).iter().enumerate() {
        if i % 3 == 0 {
            clock.advance(secs(2));
        }
        queue.manual().fail_permanently(lease, "gone").unwrap();
    }
    for lease in claim_in(&queue, "a", 4) {
        queue.manual().fail_permanently(&lease, "gone").unwrap();
    }
    let dead = listed(&queue, JobState::Dead, |_| true);
    assert_eq!(dead.len(), 13);
    let page = JobPage { limit: 2, ..JobPage::new(JobState::Dead) };
    assert_eq!(walk(&queue, page), dead);
    let page = JobPage { queue: Some("b".into()), limit: 4, ..JobPage::new(JobState::Dead) };
    assert_eq!(walk(&queue, page), listed(&queue, JobState::Dead, |j| j.queue == "b"));

    // Running, soonest lease expiry first.
    let running: Vec<JobId> = claim_in(&queue, "b", 5).iter().map(|l| l.job_id).collect();
    assert_eq!(running.len(), 5);
    let page = JobPage { limit: 2, ..JobPage::new(JobState::Running) };
    assert_eq!(walk(&queue, page), listed(&queue, JobState::Running, |_| true));

    // Scheduled: a retry after a failed attempt, apart from a job delayed
    // on purpose.
    let delayed = queue
        .enqueue(NewJob::new("x").queue("a").delay(secs(3600)))
        .unwrap();
    let lease = claim_in(&queue, "a", 1).remove(0);
    queue.manual().fail(&lease, "try again").unwrap();
    assert_eq!(queue.get(lease.job_id).unwrap().state, JobState::Scheduled);
    let scheduled = |retrying| JobPage { retrying, ..JobPage::new(JobState::Scheduled) };
    assert_eq!(walk(&queue, scheduled(Some(true))), vec![lease.job_id]);
    assert_eq!(walk(&queue, scheduled(Some(false))), vec![delayed]);
    assert_eq!(walk(&queue, scheduled(None)), vec![lease.job_id, delayed]);

    // A cursor of one state does not continue another's page.
    let a_dead = queue.get(dead[0]).unwrap();
    let page = JobPage {
        after: Some(JobCursor::after(&a_dead)),
        ..JobPage::new(JobState::Pending)
    };
    assert!(matches!(queue.ops().page(&page), Err(Error::InvalidArgument(_))));
    for text in ["", "dead", "dead.1.2", "dead.x.0.0", "lost.1.0.0", "dead.1.0.0.0"] {
        assert!(
            matches!(text.parse::<JobCursor>(), Err(Error::InvalidArgument(_))),
            "{text:?}"
        );
    }
    assert_eq!(JobCursor::after(&a_dead).id(), a_dead.id);
}
}

contract! {
fn the_holder_of_a_unique_key_is_found() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue
        .enqueue(NewJob::new("x").unique_key("invoice-7").delay(secs(60)))
        .unwrap();
    queue.enqueue(NewJob::new("x").unique_key("invoice-8")).unwrap();
    let found = queue.ops().holding_unique_key("invoice-7").unwrap().unwrap();
    assert_eq!(found.id, id);
    assert_eq!(found.unique_key.as_deref(), Some("invoice-7"));
    assert!(queue.ops().holding_unique_key("invoice-9").unwrap().is_none());
    // A finished job no longer holds its key.
    queue.cancel(id).unwrap();
    assert!(queue.ops().holding_unique_key("invoice-7").unwrap().is_none());
}
}
