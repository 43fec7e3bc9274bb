//! A pool serves exactly the queues it names, in whatever order they are
//! named, and `"default"` alone when it names none.
//!
//! The bug it guards: the first `queue()` call replaced the default, so
//! `.queue("default").queue("mail")` (and `tickler work --queue default
//! --queue mail`) served `mail` alone, and the `default` jobs waited for
//! ever with nothing said.

use crate::support::pool;

use pool::{open_queue, secs, temp_db, wait_until};
use tickler::{JobContext, JobError, JobState, NewJob, WorkerPool};

/// Runs a pool naming `named` over one job in each of `default`, `mail`
/// and `other`, and returns the queues whose job ran (`other` never named:
/// it shows the pool ran to the end of what it serves and no further).
fn served(named: &[&str]) -> Vec<String> {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let ids: Vec<_> = ["default", "mail", "other"]
        .iter()
        .map(|q| (*q, queue.enqueue(NewJob::new("k").queue(*q)).unwrap()))
        .collect();
    let mut builder = WorkerPool::builder(&queue)
        .handler("k", |_: &JobContext| -> Result<(), JobError> { Ok(()) });
    for name in named {
        builder = builder.queue(*name);
    }
    let expected = if named.is_empty() { 1 } else { named.len() };
    let mut pool = builder.start().unwrap();
    wait_until("the served queues' jobs ran", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() as usize >= expected
    });
    pool.shutdown(secs(5));
    ids.into_iter()
        .filter(|(_, id)| queue.get(*id).unwrap().state == JobState::Succeeded)
        .map(|(q, _)| q.to_owned())
        .collect()
}

contract! { poolers:
fn default_named_first_last_or_alone_is_served_with_the_others() {
    assert_eq!(served(&["default", "mail"]), ["default", "mail"]);
    assert_eq!(served(&["mail", "default"]), ["default", "mail"]);
    assert_eq!(served(&["default"]), ["default"]);
    assert_eq!(served(&["mail"]), ["mail"]);
    assert_eq!(served(&[]), ["default"]);
}
}
