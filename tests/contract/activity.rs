//! `Queue::activity`: finished jobs per slice of time with their lateness
//! and run time (the dashboard's plot). Runs on either engine
//! (`contract!`, tests/support/engine.rs); time moves by a manual clock.

use crate::support::common;

use common::{manual_queue, ms, secs, t0, temp_db};
use tickler::{Error, NewJob, ACTIVITY_MAX_BUCKETS, ACTIVITY_SAMPLE};

contract! {
fn slices_count_finished_jobs_with_their_lateness_and_run_time() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    // Minute 0: two jobs due at t0, started 5 s and 20 s late, running
    // 2 s and 4 s; one of them dies.
    let ids = queue
        .enqueue_batch(vec![
            NewJob::new("k").max_attempts(1),
            NewJob::new("k").max_attempts(1),
        ])
        .unwrap();
    clock.advance(secs(5));
    let first = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
    clock.advance(secs(2));
    queue.manual().complete(&first).unwrap();
    clock.advance(secs(13));
    let second = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
    assert_ne!(first.job_id, second.job_id);
    assert!(ids.contains(&second.job_id));
    clock.advance(secs(4));
    queue.manual().fail(&second, "boom").unwrap();
    // Minute 2: a job cancelled before it ran counts as finished but has
    // no lateness or run time.
    let cancelled = queue.enqueue(NewJob::new("k")).unwrap();
    clock.set(t0() + chrono::Duration::seconds(150));
    queue.cancel(cancelled).unwrap();
    // A pending job never shows up.
    queue.enqueue(NewJob::new("k")).unwrap();
    clock.set(t0() + chrono::Duration::seconds(180));

    let slices = queue.ops().activity(3, secs(60), 1_000).unwrap();
    assert_eq!(slices.len(), 3);
    assert_eq!(slices[0].start, t0());
    assert_eq!(slices[2].end, t0() + chrono::Duration::seconds(180));
    let m0 = &slices[0];
    assert_eq!((m0.finished, m0.capped), (2, false));
    assert_eq!((m0.sampled, m0.sampled_dead), (2, 1));
    // The median of two is the upper one (index len/2).
    assert_eq!(m0.lateness_p50, Some(secs(20)));
    assert_eq!(m0.lateness_max, Some(secs(20)));
    assert_eq!(m0.run_time_p50, Some(secs(4)));
    let m1 = &slices[1];
    assert_eq!((m1.finished, m1.sampled), (0, 0));
    assert_eq!(m1.lateness_p50, None);
    let m2 = &slices[2];
    assert_eq!((m2.finished, m2.sampled, m2.sampled_dead), (1, 1, 0));
    assert_eq!((m2.lateness_p50, m2.run_time_p50), (None, None));
}
}

contract! {
fn a_slice_counts_up_to_the_cap_and_samples_at_most_the_sample_size() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let n = ACTIVITY_SAMPLE + 50;
    queue
        .enqueue_batch((0..n).map(|_| NewJob::new("k")).collect())
        .unwrap();
    clock.advance(ms(1500));
    let leases = queue.manual().claim("default", "w", n, secs(60)).unwrap();
    assert_eq!(leases.len(), n);
    clock.advance(ms(500));
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    clock.advance(secs(1));

    let whole = queue.ops().activity(1, secs(10), 10_000).unwrap();
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].finished, n as u64);
    assert!(!whole[0].capped);
    assert_eq!(whole[0].sampled, ACTIVITY_SAMPLE as u64);
    assert_eq!(whole[0].lateness_max, Some(ms(1500)));
    assert_eq!(whole[0].run_time_p50, Some(ms(500)));

    let capped = queue.ops().activity(1, secs(10), 100).unwrap();
    assert_eq!((capped[0].finished, capped[0].capped), (100, true));
}
}

contract! {
fn bad_arguments_get_a_typed_error() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let cases = [
        (1, secs(0), "at least 1 ms"),
        (1, std::time::Duration::from_micros(999), "at least 1 ms"),
        (0, secs(1), "want 1 to"),
        (ACTIVITY_MAX_BUCKETS + 1, secs(1), "want 1 to"),
    ];
    for (slices, width, needle) in cases {
        match queue.ops().activity(slices, width, 10) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{slices} {width:?}: {other:?}"),
        }
    }
    // The last slice ends at now, and extreme widths do not overflow.
    let slices = queue.ops().activity(2, secs(60), 10).unwrap();
    assert_eq!(slices.len(), 2);
    assert_eq!(slices[1].end, t0());
    assert_eq!(slices[0].start, t0() - chrono::Duration::seconds(120));
    let wide = queue.ops().activity(3, std::time::Duration::MAX, 10).unwrap();
    assert_eq!(wide.len(), 3);
    assert!(wide.iter().all(|s| s.finished == 0));
}
}

contract! {
/// The bug it guards: the plot's dead share came from the sample of the
/// last jobs to finish in a slice, and jobs that fail finish last (after
/// their retries), so a minute with 11 % dead showed 80 %. The dead count
/// is counted over the same rows as `finished`, not read from the sample.
fn the_dead_count_is_counted_not_sampled() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let ok = ACTIVITY_SAMPLE + 50;
    let dead = ACTIVITY_SAMPLE + 30;
    queue
        .enqueue_batch((0..ok + dead).map(|_| NewJob::new("k").max_attempts(1)).collect())
        .unwrap();
    clock.advance(ms(100));
    let leases = queue.manual().claim("default", "w", ok + dead, secs(60)).unwrap();
    assert_eq!(leases.len(), ok + dead);
    clock.advance(ms(100));
    for lease in &leases[..ok] {
        queue.manual().complete(lease).unwrap();
    }
    // The dead finish last: the sample holds none but them.
    clock.advance(secs(1));
    for lease in &leases[ok..] {
        queue.manual().fail(lease, "boom").unwrap();
    }
    clock.advance(secs(1));

    let whole = queue.ops().activity(1, secs(10), 10_000).unwrap();
    let s = &whole[0];
    assert_eq!((s.finished, s.capped), ((ok + dead) as u64, false));
    assert_eq!((s.dead, s.dead_capped), (dead as u64, false));
    assert_eq!((s.sampled, s.sampled_dead), (ACTIVITY_SAMPLE as u64, ACTIVITY_SAMPLE as u64));

    // The dead are counted up to the cap as the finished are, each
    // saying whether it reached it.
    let capped = queue.ops().activity(1, secs(10), 300).unwrap();
    let c = &capped[0];
    assert_eq!((c.finished, c.capped), (300, true));
    assert_eq!((c.dead, c.dead_capped), (dead as u64, false));
    let capped = queue.ops().activity(1, secs(10), 100).unwrap();
    let c = &capped[0];
    assert_eq!((c.finished, c.capped), (100, true));
    assert_eq!((c.dead, c.dead_capped), (100, true));

    // A slice with none of them counts none.
    let before = queue.ops().activity(2, secs(10), 10_000).unwrap();
    assert_eq!((before[0].finished, before[0].dead), (0, 0));
    assert!(!before[0].dead_capped);
}
}

contract! {
/// The dead are counted queue by queue: a slice's count is their sum,
/// and the cap holds for the sum, not for each queue.
fn the_dead_count_sums_every_queue_under_one_cap() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let mut leases = Vec::new();
    for (name, n) in [("a", 3), ("b", 4), ("c", 5)] {
        queue
            .enqueue_batch((0..n).map(|_| NewJob::new("k").queue(name).max_attempts(1)).collect())
            .unwrap();
        leases.extend(queue.manual().claim(name, "w", n, secs(60)).unwrap());
    }
    assert_eq!(leases.len(), 12);
    clock.advance(ms(100));
    // One job of each queue succeeds; the others die.
    let mut seen = std::collections::BTreeSet::new();
    for lease in &leases {
        let job = queue.get(lease.job_id).unwrap();
        if seen.insert(job.queue) {
            queue.manual().complete(lease).unwrap();
        } else {
            queue.manual().fail(lease, "boom").unwrap();
        }
    }
    clock.advance(secs(1));

    let s = &queue.ops().activity(1, secs(10), 1_000).unwrap()[0];
    assert_eq!((s.finished, s.dead, s.capped, s.dead_capped), (12, 9, false, false));
    let s = &queue.ops().activity(1, secs(10), 5).unwrap()[0];
    assert_eq!((s.finished, s.dead, s.capped, s.dead_capped), (5, 5, true, true));
}
}
