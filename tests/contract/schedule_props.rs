//! Property: over random expressions, zones, misfire policies and random
//! walks of the clock (small and large steps forward, steps backward), the
//! ticks a schedule enqueues are unique (no instant fires twice, also
//! after backward steps), never ahead of the clock, and each one is a tick
//! of the expression. They increase in enqueue order only while the clock
//! does not step back: after a backward step the schedule goes on from the
//! new now.

use crate::support::schedule;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use proptest::prelude::*;
use schedule::{piling, queue_at, run_ats, temp_db, utc};
use std::time::Duration;
use tickler::{Error, MisfirePolicy};

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Forward by this many seconds.
    Forward(i64),
    /// Backward by this many seconds.
    Backward(i64),
    /// Forward by this many days (the device was off).
    Off(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1i64..900).prop_map(Step::Forward),
        2 => (1i64..7200).prop_map(Step::Backward),
        1 => (1i64..30).prop_map(Step::Off),
    ]
}

fn expression() -> impl Strategy<Value = String> {
    let seconds = prop::sample::select(vec!["", "", "0 ", "*/20 ", "15,45 "]);
    let minute = prop::sample::select(vec!["*", "*/15", "0", "30", "0,30", "10-50/20"]);
    let hour = prop::sample::select(vec!["*", "1", "2", "*/2", "1-3", "0,12"]);
    let dom = prop::sample::select(vec!["*", "*", "1", "L", "15-31", "30"]);
    let month = prop::sample::select(vec!["*", "*", "2", "3,10,11", "*/2"]);
    let dow = prop::sample::select(vec!["*", "*", "SUN", "1-5", "5#2", "6L"]);
    (seconds, minute, hour, dom, month, dow)
        .prop_map(|(s, mi, h, d, mo, w)| format!("{s}{mi} {h} {d} {mo} {w}"))
}

fn policy() -> impl Strategy<Value = MisfirePolicy> {
    prop_oneof![
        Just(MisfirePolicy::Skip),
        Just(MisfirePolicy::FireOnce),
        (1u32..20).prop_map(|max| MisfirePolicy::FireAll { max }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    fn ticks_are_unique_and_real(
        cron in expression(),
        zone in prop::sample::select(vec!["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
        start_day in prop::sample::select(vec![
            utc(2026, 3, 7, 12, 0, 0), utc(2026, 3, 28, 12, 0, 0),
            utc(2026, 10, 24, 12, 0, 0), utc(2026, 10, 31, 12, 0, 0),
            utc(2026, 4, 4, 0, 0, 0), utc(2026, 1, 30, 0, 0, 0),
        ]),
        start_shift in 0i64..86_400,
        misfire in policy(),
        grace_secs in 0u64..120,
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let (_dir, path) = temp_db();
        let start = start_day + ChronoDuration::seconds(start_shift);
        let (queue, clock) = queue_at(&path, start);
        let spec = piling("s", cron.clone(), "tick")
            .time_zone(zone)
            .misfire(misfire)
            .misfire_grace(Duration::from_secs(grace_secs));
        match queue.upsert_schedule(spec.clone()) {
            Ok(_) => {}
            // 30 February and friends: refused, nothing to walk.
            Err(Error::InvalidSchedule { .. }) => return Ok(()),
            Err(e) => panic!("{e}"),
        }
        // A second queue file, only to ask "is this instant a tick?".
        let (_oracle_dir, oracle_path) = temp_db();
        let (oracle, oracle_clock) = queue_at(&oracle_path, start);

        let mut now: DateTime<Utc> = start;
        let mut earliest_now = start;
        let mut fired_so_far = 0;
        for step in steps {
            now = match step {
                Step::Forward(s) => now + ChronoDuration::seconds(s),
                Step::Backward(s) => now - ChronoDuration::seconds(s),
                Step::Off(d) => now + ChronoDuration::days(d),
            };
            clock.set(now);
            earliest_now = earliest_now.min(now);
            let run = queue.manual().run_due_ticks().unwrap();
            let fired = run_ats(&queue, "tick");
            prop_assert_eq!(fired.len(), fired_so_far + run.jobs.len());
            for at in &fired[fired_so_far..] {
                prop_assert!(*at <= now, "tick {} enqueued ahead of the clock {}", at, now);
            }
            fired_so_far = fired.len();
            // Everything due fired.
            if let Some(next) = run.next_tick_at {
                prop_assert!(next > now, "next tick {} is not after the clock {}", next, now);
            }
        }
        // No tick instant fires twice. (In enqueue order they need not
        // increase: after a backward step the schedule goes on from the new
        // now, which may lie before ticks that fired.)
        let fired = run_ats(&queue, "tick");
        let mut sorted = fired.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), fired.len(), "a tick fired twice: {:?} ({} in {})", fired, cron, zone);
        for at in &fired {
            // Before the clock's earliest reading nothing was ever due.
            prop_assert!(*at >= earliest_now);
            oracle_clock.set(*at);
            let first = oracle.next_ticks(&spec, 1).unwrap();
            prop_assert_eq!(first[0].at, *at, "{} is not a tick of {} in {}", at, cron, zone);
        }
    }
}

// The property is a contract body: proptest! without `#[test]` makes it
// a plain function, and each engine gets a case of its own.
mod ticks_are_unique_and_real {
    crate::engine_cases!(super::ticks_are_unique_and_real);
}
