//! Hunt (issue 13 review): `OverlapPolicy::Forbid` and a cancelled run
//! whose holder has not stopped.
//!
//! `cancel` of a running job keeps its lease (and unique_key) until its
//! holder reports, "so two runs for one key never overlap". Each tick of
//! a schedule has its own unique_key, so that guard does not cover ticks;
//! Forbid's "earlier run not finished" only looks at scheduled, pending and
//! running jobs.

use crate::support::schedule;

use chrono::Duration as ChronoDuration;
use schedule::{queue_at, temp_db, utc};
use std::time::Duration;
use tickler::{NewSchedule, OverlapPolicy};

contract! {
fn forbid_waits_for_a_cancelled_run_whose_holder_has_not_stopped() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    queue
        .upsert_schedule(
            NewSchedule::new("backup", "* * * * * *", "tick").overlap(OverlapPolicy::Forbid),
        )
        .unwrap();
    let first = queue.run_due_ticks().unwrap().jobs[0];
    let holder = queue
        .claim("default", "w1", 1, Duration::from_secs(60))
        .unwrap()
        .remove(0);
    assert_eq!(holder.job_id, first);

    // An operator cancels the running backup; its holder has not stopped
    // yet (it has not reported, its lease runs for another minute).
    queue.cancel(first).unwrap();
    let job = queue.get(first).unwrap();
    assert!(job.lease_expires_at.is_some(), "the cancel keeps the lease");

    clock.set(start + ChronoDuration::seconds(1));
    let run = queue.run_due_ticks().unwrap();
    let second = queue
        .claim("default", "w2", 1, Duration::from_secs(60))
        .unwrap();
    assert!(
        run.jobs.is_empty() && second.is_empty(),
        "a second backup run started while the first one's holder was still running: \
         fired {:?}, skipped {}, claimed {:?}",
        run.jobs,
        run.skipped,
        second.iter().map(|l| l.job_id).collect::<Vec<_>>()
    );
}
}
