//! The contract: what tickler guarantees on every engine. Each test body
//! here is written once and run once per engine by `contract!` (see
//! `support::engine`): `fencing::stale_worker_cannot_complete::sqlite`,
//! `…::postgres` (feature `postgres`, with `TICKLER_TEST_DATABASE_URL`).
//! A body that only makes sense on SQLite is generated for SQLite alone
//! (`contract! { sqlite_only: … }`) and its doc says why.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

// Claims, fencing, the reaper, leases and clocks.
mod backoff;
mod claim_exclusivity;
mod clock_step;
mod clock_step_backward;
mod concurrency_limits;
mod crash_costs;
mod fencing;
mod paused_holder;
mod poison_job;
mod rate_limits;
mod rate_reported;
mod rate_soak;
mod reaper;

// Bad input, limits, one bad job fails alone, operator actions.
mod bad_input;
mod cancel_keeps_unique_key;
mod deadlock_soak;
mod durability;
mod enqueue_group_commit;
mod error_history;
mod explain;
mod limits_at_the_edges;
mod limits_reported;
#[cfg(unix)]
mod limits_soak;
mod operator;
mod operator_cli_support;
mod outcome_fails_alone;
mod paging;
mod queue_drop;
mod unreadable_row_fails_alone;

// Worker pools.
#[cfg(feature = "tokio")]
mod async_task_lanes;
mod no_starvation;
mod pool_exactly_once;
mod pool_lease_loss;
mod pool_outcomes;
mod pool_panic;
mod pool_queues;
mod pool_shutdown;
mod pool_slots;
mod pool_two_processes;
mod pool_wakeup;
mod prefetch_by_time;
mod progress;
mod timeout_enforced;

// Schedules.
mod schedule_api;
mod schedule_cron_forms;
mod schedule_dst;
mod schedule_misfire;
mod schedule_overlap;
mod schedule_pool;
mod schedule_props;
mod schedule_two_processes;

// Jobs that run after others.
mod batches;
mod batches_hunt;
mod batches_pool;
#[cfg(unix)]
mod batches_running;
mod dependencies;
mod dependencies_hunt;
mod dependencies_running;

// The model of the state machine.
mod model;

// Paused queues, the dashboard's plot, the application's transactions,
// events, typed jobs, the testing helper.
mod activity;
mod app_tx;
mod job_events;
mod limits_hunt;
mod outputs;
mod outputs_hunt;
mod queue_pause;
mod testing_helper;
mod typed_jobs;
mod wait;

// Failures other queues reported against their storage abstractions,
// tried on every engine.
mod seam_hunt;
