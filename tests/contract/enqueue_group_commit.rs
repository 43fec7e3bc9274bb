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

contract! {
/// Callers of one unique key that meet in one group get the one job that
/// holds the key, as they would one after another: a group is stored as
/// one batch, and the batch's rule for a key given twice is the same.
fn concurrent_enqueues_of_shared_unique_keys_get_the_holders_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("group-keys.db");
    let path = common::engine::target(&path);
    let queue = Queue::open(&path).unwrap();
    const THREADS: usize = 16;
    const PER_THREAD: usize = 40;
    const KEYS: usize = 8;
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let queue = queue.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                (0..PER_THREAD)
                    .map(|i| {
                        // Keyed and unkeyed calls alternate, so that groups
                        // hold both.
                        let key = (i % 2 == 0).then(|| format!("key-{}", (t + i) % KEYS));
                        let mut job = NewJob::new("k").payload(serde_json::json!([t, i]));
                        if let Some(key) = &key {
                            job = job.unique_key(key);
                        }
                        (queue.enqueue(job).unwrap(), key, t, i)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    let mut by_key = std::collections::HashMap::new();
    for (id, key, t, i) in &all {
        match key {
            Some(key) => {
                let holder = *by_key.entry(key.clone()).or_insert(*id);
                assert_eq!(*id, holder, "every enqueue of {key} got its holder's id");
            }
            None => assert_eq!(
                queue.get(*id).unwrap().payload,
                serde_json::json!([t, i]),
                "an unkeyed enqueue got its own job"
            ),
        }
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, id) in &by_key {
        assert_eq!(queue.get(*id).unwrap().unique_key.as_deref(), Some(key.as_str()));
    }
    let stored: u64 = queue.stats().unwrap().counts.values().sum();
    assert_eq!(
        stored as usize,
        THREADS * PER_THREAD / 2 + KEYS,
        "one job per unkeyed call and one per key"
    );
}
}
