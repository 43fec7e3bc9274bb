//! Concurrent single `enqueue` calls share commits (group commit) without
//! losing, duplicating or mixing up any job: every caller gets the id of
//! exactly its own job, and the job is in the file when the call returns.

use crate::support::common;

use std::sync::{Arc, Barrier};
use tickler::{Durability, NewJob, Queue};

contract! {
fn concurrent_enqueues_each_get_their_own_committed_job() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group.db");
    let path = common::engine::target(&path);
    let queue = Queue::builder(&path)
        .sqlite(|o| o.durability(Durability::Full))
        .open()
        .unwrap();
    const THREADS: usize = 16;
    const PER_THREAD: usize = 100;
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let queue = queue.clone();
            let path = path.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                (0..PER_THREAD)
                    .map(|i| {
                        let id = queue
                            .enqueue(NewJob::new("k").payload(serde_json::json!([t, i])))
                            .unwrap();
                        // Visible to another connection as soon as enqueue returns.
                        let reader = Queue::open(&path).unwrap();
                        assert_eq!(reader.get(id).unwrap().payload, serde_json::json!([t, i]));
                        (id, t, i)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    let mut ids: Vec<_> = all.iter().map(|(id, _, _)| *id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        THREADS * PER_THREAD,
        "every enqueue got its own id"
    );
    let reopened = Queue::open(&path).unwrap();
    for (id, t, i) in all {
        assert_eq!(reopened.get(id).unwrap().payload, serde_json::json!([t, i]));
    }
}
}
