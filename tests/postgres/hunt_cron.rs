//! Schedules on several machines: each tick fires once, none is lost.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tickler::{JobFilter, ManualClock, NewSchedule, OverlapPolicy, Queue};

/// Solid Queue #636 and #638, and the Oban cron plugin's reason for unique
/// jobs: several scheduler processes fire the same recurring task at the
/// same moment. Four "machines" run the due ticks together every minute
/// for 30 minutes: 30 jobs, one per tick.
#[test]
fn schedulers_on_four_machines_fire_each_tick_once() {
    let Some(db) = test_database() else { return };
    let clock = Arc::new(ManualClock::new(
        chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
    ));
    let machines: Vec<Queue> = (0..4)
        .map(|_| {
            Queue::builder(db.url())
                .clock(clock.clone())
                .open()
                .expect("open")
        })
        .collect();
    for m in &machines {
        m.upsert_schedule(
            NewSchedule::new("every-minute", "* * * * *", "tick").overlap(OverlapPolicy::Allow),
        )
        .expect("every machine declares the schedule at start");
    }
    for _ in 0..30 {
        clock.advance(Duration::from_secs(60));
        let start = Arc::new(Barrier::new(machines.len()));
        let handles: Vec<_> = machines
            .iter()
            .map(|m| {
                let (m, start) = (m.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    m.run_due_ticks().expect("run_due_ticks").jobs.len()
                })
            })
            .collect();
        let fired: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        assert_eq!(fired, 1, "one job per tick across the machines");
    }
    let jobs = machines[0]
        .list(&JobFilter {
            kind: Some("tick".into()),
            limit: 1_000,
            ..Default::default()
        })
        .expect("list");
    assert_eq!(jobs.len(), 30);
    let mut per_due: HashMap<i64, usize> = HashMap::new();
    for j in &jobs {
        *per_due.entry(j.run_at.timestamp()).or_default() += 1;
    }
    assert!(per_due.values().all(|n| *n == 1), "{per_due:?}");
}
