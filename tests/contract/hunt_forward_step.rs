//! Hunt (issue 13 review): OptimalBits/bull "jobs stalled after the
//! machine slept" / BullMQ stalled-job reports: after the wall clock jumps
//! forward every live lease looks expired. tickler's reaper holds off for
//! `clock_step_hold` (15 s by default), but a pool starts its own reaper
//! with that default whatever its heartbeat interval (a third of its
//! lease): with `lease(60 s)` the first heartbeat after the step comes up
//! to 20 s later, after the hold.

use crate::support::pool;

use pool::{secs, temp_db, Recorder};
use std::sync::Arc;
use tickler::{Durability, JobState, ManualClock, Queue};

contract! {
fn a_forward_step_does_not_cost_a_live_holder_its_job() {
    let (_dir, path) = temp_db();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let queue = Queue::builder(pool::engine::target(&path))
        .clock(clock.clone())
        .durability(Durability::Normal)
        .open()
        .unwrap();
    let rec = Recorder::new();
    let (mut pool, id) = pool::one_blocked_job(&queue, &rec, secs(60));
    let token = queue.get(id).unwrap().run_token;
    // NTP steps the clock of a box without an RTC, or the box resumes
    // from suspend: 10 minutes forward.
    clock.advance(std::time::Duration::from_secs(600));
    std::thread::sleep(secs(19));
    let job = queue.get(id).unwrap();
    rec.gate.open();
    pool.shutdown(secs(5));
    assert!(
        job.state == JobState::Running && job.run_token == token,
        "the live holder lost its job: state {}, last_error {:?}",
        job.state,
        job.last_error
    );
}
}
