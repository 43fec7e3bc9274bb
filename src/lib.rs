//! # tickler
//!
//! An embedded, durable job queue and scheduler on one SQLite file (WAL
//! mode), for programs without a database server: desktop apps, Raspberry
//! Pi and other edge boxes, single-binary services. Any number of threads
//! and processes on one machine may share the file; programs that outgrow
//! one machine point the same code at PostgreSQL (feature `postgres`).
//!
//! ```no_run
//! use std::time::Duration;
//! use tickler::{NewJob, Queue};
//!
//! # fn main() -> tickler::Result<()> {
//! let queue = Queue::open("jobs.db")?;
//! queue.enqueue(NewJob::new("send_email").payload(serde_json::json!({"to": "ada@example.com"})))?;
//! for lease in queue.manual().claim("default", "worker-1", 10, Duration::from_secs(30))? {
//!     // ... do the work, outside any transaction ...
//!     queue.manual().complete(&lease)?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Guarantees
//!
//! 1. **Enqueue is durable.** When [`Queue::enqueue`] returns `Ok`, the job is
//!    committed. With [`Durability::Full`] (the default, fsync on commit) it
//!    survives power loss; with [`Durability::Normal`] a process crash.
//! 2. **One holder at a time.** A claim is one `BEGIN IMMEDIATE` transaction
//!    holding one conditional `UPDATE … RETURNING`; two claimers never get
//!    the same job.
//! 3. **Leases, fenced.** Each claim writes a fresh [`RunToken`] and a lease
//!    expiry. Heartbeats and outcomes only apply while the job is `running`
//!    with that token; otherwise they return [`Error::LeaseLost`] and change
//!    nothing.
//! 4. **The reaper only takes what is really stale** ([`Manual::reap`]): its
//!    update repeats the expiry condition, so a heartbeat that lands first
//!    wins. Reaped jobs wait for a backoff, or are `dead` once their attempts
//!    are used up.
//! 5. **At-least-once execution, exactly-once ownership.** A job whose holder
//!    crashed after doing the work runs again. Handlers get the job id,
//!    attempt number and run_token: use them to make side effects idempotent.
//! 6. **Short write transactions.** No transaction is open while a handler runs.
//! 7. **Bad input gets a typed [`Error`]** and nothing stored is lost.
//! 8. **One bad job fails alone.** A row that cannot be read, an error text
//!    too long to store, a handler that ignores its timeout: each costs that
//!    job (it fails or goes `dead` with an error that says why), never the
//!    other jobs of its batch, its queue or its pool. Error texts are cut to
//!    [`MAX_ERROR_BYTES`]; every attempt's error is kept in [`Job::errors`].
//! 9. **A crash costs only the run it interrupted.** An attempt counts when
//!    its handler starts: a worker pool claims ahead of its free threads
//!    ([`Manual::record_and_claim_ahead`]) and records each start about a
//!    second after it ([`Manual::mark_started`]), and a job whose lease is
//!    taken back before its start was recorded gets its attempt back
//!    ([`Lease::given_back`] counts these). A job given back once has its
//!    next start recorded before the handler runs, so a handler that kills
//!    its process at once is given back uncounted at most once. Under
//!    [`Durability::Full`], recorded starts are synced, and so are a pool's
//!    first 32 claims: a handler that takes the machine down (a kernel
//!    panic, a brown-out) is counted like one that kills its process,
//!    since after the reboot it runs among the new pool's first claims.
//!    Each lease
//!    records its holder ([`holder`]): when a queue opens, and at each
//!    pass of the reaper, the leases of a holder of this machine that is
//!    gone (a process that ended, or one of an earlier boot) are taken back
//!    at once, by the reaper's fenced statements; leases of other machines,
//!    containers and live processes wait for their expiry. Holders are
//!    judged on Linux only (from `/proc`); elsewhere every lease waits for
//!    its expiry.
//! 10. **Shared limits are leases** ([`Queue::set_limit`], see below): at
//!     every instant, for each key of a limit, the jobs of that key that
//!     hold a lease weigh at most its `max_per_key`, on every engine and
//!     across every process sharing the queue.
//!
//! ## PostgreSQL
//!
//! With the `postgres` feature, [`Queue::open`] also takes a
//! `postgres://` URL: the same API, guarantees and CLI on a database that
//! several machines share. Claims use `FOR UPDATE SKIP LOCKED` in short
//! READ COMMITTED transactions; due times and leases are judged by the
//! database server's clock (unless [`QueueBuilder::clock`] sets one);
//! other processes' work wakes watchers by `LISTEN`/`NOTIFY` (or a poll,
//! [`PostgresOptions::listen`], [`PostgresOptions::fallback_poll`]); lost
//! connections and server restarts are retried for the builder's
//! `busy_timeout + busy_retry` before `Error::Postgres` reaches the
//! caller. The application's own transactions: [`Queue::enqueue_tx`] with
//! a `&mut postgres::Transaction` (the same call as on SQLite, over
//! [`AppTx`]), and [`Queue::complete_with`] with a closure over one
//! (`|tx: &mut postgres::Transaction|`, over [`AppWrites`]). TLS takes
//! libpq's `sslmode` ([`SslMode`], default `prefer`), `sslrootcert`
//! ([`RootCerts`]), `sslcert` and `sslkey`, in the URL or with
//! [`PostgresOptions::ssl_mode`] and its neighbours. The README's
//! "PostgreSQL" section has the details.
//!
//! ```no_run
//! # fn main() -> tickler::Result<()> {
//! let queue = tickler::Queue::open("postgres://app@db.internal/jobs")?;
//! assert_eq!(queue.ops().engine(), "PostgreSQL");
//! // The server's certificate signed by this authority, for this host.
//! let checked = tickler::Queue::open(
//!     "postgres://app@db.internal/jobs?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
//! )?;
//! // The same from the builder, which wins over the URL.
//! use tickler::{RootCerts, SslMode};
//! let checked_too = tickler::Queue::builder("postgres://app@db.internal/jobs")
//!     .postgres(|o| {
//!         o.ssl_mode(SslMode::VerifyFull)
//!             .ssl_root_certs(RootCerts::File("/etc/ssl/db-ca.pem".into()))
//!     })
//!     .open()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## MySQL and MariaDB
//!
//! With the `mysql` feature, [`Queue::open`] also takes a `mysql://` or
//! `mariadb://` URL naming a database: the same API, guarantees and CLI on
//! InnoDB. Tested on MariaDB 10.11; written for MariaDB 10.8 and later and
//! MySQL 8.0.1 and later, and refused, with the reason, on older servers,
//! on a binary log in `STATEMENT` format and on tables of another storage
//! engine. Claims lock rows with `FOR UPDATE SKIP LOCKED` and then update
//! those rows in the same short READ COMMITTED transaction; due times and
//! leases are judged by the server's clock; other processes' work is seen
//! by a cheap look at the queue's last change (MySQL has no `LISTEN`);
//! deadlocks, lock wait timeouts, lost connections and restarts are
//! retried for `busy_timeout + busy_retry` before `Error::Mysql` (with the
//! server's code and message) reaches the caller. Queue names, kinds and
//! schedule names are at most 255 bytes there. The pool size and the
//! longest poll are [`PostgresOptions::max_connections`] and
//! [`PostgresOptions::fallback_poll`], the options of both server engines.
//! The application's own transactions: [`Queue::enqueue_tx`] with a
//! `&mut mysql::Transaction`, and [`Queue::complete_with`] with a closure
//! over one (`|tx: &mut mysql::Transaction|`). TLS (feature `mysql-tls`,
//! rustls) is asked for in the URL: `ssl-mode=VERIFY_IDENTITY`,
//! `VERIFY_CA`, `REQUIRED` or `DISABLED` (the default), and `ssl-ca=PATH`
//! for an authority to trust besides the built-in roots; a TLS mode
//! without the feature, `PREFERRED`, or a certificate that fails its check
//! is [`Error::Config`] at open, naming the setting or the check.
//!
//! ```no_run
//! # fn main() -> tickler::Result<()> {
//! let queue = tickler::Queue::open("mysql://app:secret@db.internal/jobs")?;
//! assert_eq!(queue.ops().engine(), "MySQL");
//! # Ok(())
//! # }
//! ```
//!
//! ## Where things are
//!
//! - `src/queue/`: [`Queue`], the application's API and its contract,
//!   engine-neutral, with the rules every engine shares: the claim's
//!   (`queue/claim.rs`: paused queues, promotion, fair share, priority
//!   aging), the outcomes' (`queue/outcome.rs`), the limits'
//!   (`queue/limits.rs`), the dependencies' (`queue/deps.rs`), the
//!   reaper's (`queue/reap.rs`: two clean looks) and the schedules' firing
//!   (`queue/schedules.rs`, `src/schedule/firing.rs`).
//! - `src/engine/`: the storage seam, the only place an engine is named.
//!   `engine/mod.rs` holds the traits an engine implements and
//!   `engine::open`, which picks the engine a location names;
//!   `engine/types.rs` the types both sides share. Each engine is a folder
//!   with the same files (`sqlite/`, `postgres/`, `mysql/`): `connection`,
//!   `migrate` and `schema.sql`, `enqueue`, `claim` (the claim's
//!   statements), `outcome` (the fenced outcome statements, built from one
//!   `fence!` and one `retry_or_dead!` per dialect), `lease` (heartbeats,
//!   the reaper's look), `limits`, `deps` (the edges of jobs that run
//!   after others), `admin`, `read`, `schedules`, `rows`, `watch`.
//! - `src/worker/`: [`WorkerPool`]; `src/schedule/`: schedules and the tick
//!   arithmetic; `src/clock.rs`: every read of "now" goes through a
//!   [`Clock`].
//!
//! ## Job states
//!
//! ```text
//!   enqueue ─► scheduled ──(due)──► pending ──claim──► running ──► succeeded
//!                  ▲                   ▲                │ │ │
//!                  ├── fail, backoff ──┼────────────────┘ │ ├──► dead
//!                  ├── snooze ─────────┘ (no attempt)     │ └──► cancelled
//!                  └── lease expired (reaper) ────────────┘
//! ```
//!
//! `scheduled` is the design's "pending with a future run_at": kept as its
//! own state so that a claim never scans jobs that are not due. `blocked`
//! is a due job that waits for a slot of its concurrency limit (below):
//! out of the claim's index too, made pending by the transaction that
//! frees a slot. `waiting` is a job that runs after others
//! ([`NewJob::after`]) whose last parent has not ended yet, or a batch's
//! callback whose batch has not finished (see "Batches"): out of the
//! claim's index, made pending (or cancelled) by the transaction of that
//! end.
//!
//! ## Jobs that run after jobs
//!
//! "Transcode, then upload, then tell the user": a job may run after
//! others ([`NewJob::after`], [`NewJob::after_with`]), and a [`Graph`]
//! stores named steps and their edges in one transaction
//! ([`Queue::enqueue_graph`]).
//!
//! ```
//! # fn main() -> tickler::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let queue = tickler::Queue::open(dir.path().join("jobs.db"))?;
//! use tickler::{Graph, IfParentFails, NewJob};
//! let ids = queue.enqueue_graph(
//!     Graph::new()
//!         .step("fetch", NewJob::new("fetch"))
//!         .step("transcode", NewJob::new("transcode"))
//!         .step("upload", NewJob::new("upload"))
//!         .step("notify", NewJob::new("notify"))
//!         .edge("fetch", "transcode")
//!         .edge("transcode", "upload")
//!         .edge_with("upload", "notify", IfParentFails::Run),
//! )?;
//! println!("{}", queue.explain(ids["upload"])?); // waiting for 2 (waiting)
//! # Ok(())
//! # }
//! ```
//!
//! - **Released in the transaction of the end.** One function
//!   (`src/queue/deps.rs`) takes every end of a job into account: an
//!   outcome, the reaper making a job dead, a cancel, a claim that buries
//!   a job, `complete_with` in the application's transaction. A child is
//!   pending the moment its last parent's success commits, never before,
//!   and a stale holder's outcome, refused by its run_token, ends nothing.
//! - **A failed parent is never silent.** When a parent ends dead or
//!   cancelled, each child does what it asked: cancelled with an error
//!   naming the parent (the default, and so in turn its own children),
//!   held until the parent is retried and succeeds, or run anyway.
//! - **No cycles, no dangling edges.** A parent must be stored before its
//!   child ([`Error::ParentNotFound`] otherwise, nothing stored); a graph's
//!   cycle is refused naming its steps ([`Error::DependencyCycle`]). A
//!   child inserted while its parent ends sees that end (the insert reads
//!   its parents with a lock). The pruner keeps a parent while a child
//!   that has not finished runs after it, so a child can read its
//!   parents' outputs ([`Queue::parents`], [`Job::output`]).
//! - **Why is it waiting?** [`Queue::explain`] names the parents it waits
//!   for and where each is ("waiting for 17 (running on pi-2, lease until
//!   …)").
//!
//! ## Batches
//!
//! "Send 10,000 mails, then tell me how it went": jobs enqueued from any
//! number of calls and processes join a batch ([`Queue::open_batch`],
//! [`NewJob::batch`]); once it is sealed ([`Queue::seal_batch`]) and its
//! last member has ended, its callbacks run. Not to be confused with
//! [`Queue::enqueue_batch`], which stores many jobs in one transaction.
//!
//! ```
//! # fn main() -> tickler::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let queue = tickler::Queue::open(dir.path().join("jobs.db"))?;
//! use serde_json::json;
//! use tickler::{testing::run_one, JobContext, JobError, NewBatch, NewJob};
//! let batch = queue.open_batch(NewBatch::new().on_finish(NewJob::new("report")))?;
//! for n in [1, 2] {
//!     queue.enqueue(NewJob::new("resize").payload(json!(n)).batch(batch.id))?;
//! }
//! let report = batch.on_finish.expect("opened with one");
//! // Nobody sealed it yet: the report waits for the seal too.
//! assert!(queue.explain(report)?.to_string().contains("not sealed"));
//! queue.seal_batch(batch.id)?;
//!
//! let resize = |ctx: &JobContext| Ok::<_, JobError>(ctx.payload().as_u64().unwrap_or(0) * 10);
//! run_one(&queue, "default", "resize", &resize)?;
//! run_one(&queue, "default", "resize", &resize)?;
//! // The last member's end released the report; it reads its batch.
//! let read = |ctx: &JobContext| -> Result<serde_json::Value, JobError> {
//!     let batch = ctx.batch()?.expect("a callback has its batch");
//!     let members = ctx.queue().batch_members(batch.id, None, 100)?;
//!     let outputs: Vec<_> = members.into_iter().filter_map(|m| m.output).collect();
//!     Ok(json!({ "succeeded": batch.succeeded, "of": batch.members, "outputs": outputs }))
//! };
//! run_one(&queue, "default", "report", &read)?;
//! assert_eq!(
//!     queue.get(report)?.output,
//!     Some(json!({ "succeeded": 2, "of": 2, "outputs": [10, 20] }))
//! );
//! # Ok(())
//! # }
//! ```
//!
//! - **Which callback runs.** Each callback ([`NewBatch`]) is stored
//!   `waiting` when the batch opens and decided once, in the transaction
//!   that leaves the sealed batch with no member remaining (the last
//!   member's end, or the seal if none remains): `on_success` is released
//!   if every member succeeded (so also for a batch with no member),
//!   `on_failure` if any ended dead or cancelled, `on_finish` in either
//!   case; the one not released is cancelled, saying why. The counters
//!   ([`Batch`]) move in the transactions that add and end members.
//! - **A member ends once it ends for good.** A failed attempt that is
//!   retried is not an end; its last attempt failing (dead), a cancel or
//!   the reaper burying it is. A member retried by hand ([`Queue::retry`])
//!   after it ended remains again until it ends again; if the batch had
//!   finished, its callbacks stay as they were decided and do not run
//!   again.
//! - **An unsealed batch never finishes**, however many members have
//!   ended: its callbacks wait for [`Queue::seal_batch`], and
//!   [`Queue::explain`] of a callback says so ("the batch is not sealed")
//!   with how many members remain. A sealed batch refuses new members
//!   ([`Error::BatchSealed`]).
//! - **The pruner keeps what a callback reads.** [`Queue::prune`] keeps
//!   every member until the batch has finished and its callbacks have
//!   ended, so a callback reads the members' outputs
//!   ([`Queue::batch_members`], page by page); the batch goes with its
//!   last job. A handler reads its own batch with [`JobContext::batch`].
//!
//! ## Concurrency limits
//!
//! "At most one sync per account", "at most two transcodes on this Pi":
//! a limit is stored in the queue under a name ([`Queue::set_limit`], or
//! `tickler limit set`) and a job names it with a key
//! ([`NewJob::limit`]) and, if it is heavy, a weight
//! ([`NewJob::limit_weight`]).
//!
//! ```
//! # fn main() -> tickler::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let queue = tickler::Queue::open(dir.path().join("jobs.db"))?;
//! use tickler::{Limit, NewJob};
//! queue.set_limit("sync", Limit::per_key(1).total(4))?;
//! queue.enqueue(NewJob::new("sync").limit("sync", "account-42"))?;
//! # Ok(())
//! # }
//! ```
//!
//! - **A slot is a lease.** A job holds `weight` slots of its key exactly
//!   while its row holds a lease: running, or a run that may still be going
//!   after its outcome was decided without it (cancelled, timed out,
//!   retried) until its holder reports or its lease runs out. Nothing is
//!   counted apart from the rows: a holder that lost its lease frees
//!   nothing a second time, and a killed process's slots come back when
//!   its leases are taken back (at once on this machine, see guarantee 9).
//! - **Blocked jobs wait out of the claim's way.** A claim takes due jobs
//!   as usual, counts the holders of each limited job's key in the same
//!   transaction, and pushes back to `blocked` those that do not fit, with
//!   their attempt given back and no error written. Every transaction that
//!   ends a lease (an outcome, the reaper, a stopped holder) makes pending
//!   the blocked jobs its slots now fit, first in, first out per key. On a
//!   server, both sides lock the limit's row (in name order, after the job
//!   rows they lock), so a release and a claim that blocks a job of the
//!   same key never miss each other; SQLite's single writer does the same
//!   on a file. The reaper sweeps a bounded part of the blocked keys each
//!   round as a safety net and counts what it finds
//!   ([`Ops::limit_sweep_unblocked`], `tickler_limit_sweep_unblocked_total`):
//!   it should stay 0.
//! - **Changes at run time.** Raising a limit hands out the new slots at
//!   once; lowering it lets the holders finish and admits nothing until
//!   they weigh less than the new value (a blocked job heavier than the
//!   new value can never run, and is made dead saying why); deleting it
//!   makes its blocked jobs pending. A job that names a limit no one set
//!   runs unlimited (`tickler limit list` shows such keys). With a
//!   `max_total`, a freed slot may go to any key: the freed keys are served
//!   first, then the others round the key order, so one busy key never
//!   hides another's jobs.
//! - **What it cannot promise.** A handler that runs on after losing its
//!   lease (a frozen process, a handler deaf to its timeout past its
//!   lease) runs beside the job that took its slot, as it would beside the
//!   job's own retry. Blocked jobs of a paused queue are passed over, and
//!   their keys released when it resumes.
//!
//! - **Why is it not running?** [`Queue::explain`] (and `tickler show`,
//!   its `why:` line) says: "blocked by limit sync/42: 1 of 1 held by job
//!   881 (worker pi-1, lease until …)", "deferred by rate limit
//!   openai/team-7 until … (4th in line)", a paused queue, a backoff.
//!   `tickler limit list` gives each key's held weight and its holding,
//!   blocked, deferred and pending jobs; with the `metrics` feature a pool
//!   sets `tickler_limit_held{limit}` and `tickler_limit_jobs{limit,
//!   state}`, summed over keys.
//!
//! ## Rate limits
//!
//! "At most 100 calls a minute per API key": the same limit may carry a
//! rate ([`Limit::rate`], [`Limit::with_rate`], `tickler limit set
//! --rate 100/1m --burst 10`), alone or beside its concurrency limit.
//!
//! ```
//! # fn main() -> tickler::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let queue = tickler::Queue::open(dir.path().join("jobs.db"))?;
//! use std::time::Duration;
//! use tickler::{Limit, NewJob};
//! queue.set_limit("openai", Limit::rate(100, Duration::from_secs(60)).burst(10))?;
//! queue.enqueue(NewJob::new("summarise").limit("openai", "team-7"))?;
//! # Ok(())
//! # }
//! ```
//!
//! - **Exact, with no windows.** In every span of a period, the runs of a
//!   key that claims hand out number at most `count + burst` (see
//!   [`Rate`]): GCRA keeps one instant per key, moved in the claim's
//!   transaction under the limit's lock, on the engine's clock.
//! - **Deferred, not failed.** A job over the rate is scheduled at exactly
//!   the instant it may start, with its attempt given back and no error;
//!   a key's deferred jobs are one interval apart, first in, first out.
//! - **The remote side's word.** A handler told "too many requests, retry
//!   after 30 s" returns [`JobContext::rate_limited`]: its job is snoozed
//!   and its key held back until then in every process.
//! - **Clock steps.** A step forward admits no flood; a step back of the
//!   wall clock (a Raspberry Pi without a real-time clock, fixed by NTP)
//!   of over a minute is undone for the rate within the reaper's next
//!   pass, and a smaller one holds a key back by at most itself.
//!
//! ## Time
//!
//! Stored as INTEGER milliseconds since the Unix epoch, UTC; the API takes
//! and returns `chrono::DateTime<Utc>`. "Now" is always read through a
//! [`Clock`].
//!
//! ## Schedules
//!
//! A [`NewSchedule`] is a cron expression (5 fields, or 6 with seconds)
//! read in an IANA time zone, with a job template and a [`MisfirePolicy`],
//! stored with [`Queue::upsert_schedule`]. Each occurrence (tick) becomes
//! one job due at exactly the tick's instant, enqueued once however many
//! [`Scheduler`]s (every [`WorkerPool`] runs one) share the file. What
//! happens on DST nights, after the device was off and when the wall clock
//! is stepped is defined on [`NewSchedule`].
//!
//! ```no_run
//! # fn main() -> tickler::Result<()> {
//! let queue = tickler::Queue::open("jobs.db")?;
//! queue.upsert_schedule(
//!     tickler::NewSchedule::new("nightly-backup", "30 2 * * *", "backup")
//!         .time_zone("Europe/Berlin"),
//! )?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Worker pools
//!
//! A [`WorkerPool`] claims jobs of the kinds it has handlers for, runs each
//! handler outside any transaction, renews leases with one heartbeat
//! transaction per tick, and records outcomes by **group commit**: the
//! outcomes of every job that finished since the last commit and the claim
//! of the next jobs share one transaction.
//!
//! What a pool claims beyond its free threads is bounded by time: about as
//! many jobs as it expects to start within half of
//! [`WorkerPoolBuilder::prefetch_hold`] (20 ms), from the measured run time
//! of its handlers, at most [`WorkerPoolBuilder::prefetch`] (512). A flood
//! of short jobs is claimed hundreds at a time; long jobs one per free
//! thread; and a job claimed ahead that still waits for a thread after the
//! holding time is handed back for any process to run. Measured in
//! `BENCHMARKS.md` (`cargo bench --bench tickler_bench -- --only burn`): with
//! default settings a 4-thread pool drains no-op jobs at about the rate of a
//! hand-written loop that claims and completes 32 jobs per transaction.
//!
//! ## Events, pauses and observability
//!
//! [`Queue::subscribe`] and [`WorkerPool::subscribe`] hand out a
//! [`Subscription`]: a bounded buffer of [`Event`]s, one per transition
//! (enqueued, started with attempt and run_token, succeeded, failed with
//! its retry delay, dead, snoozed, cancelled, retried, lease lost, timed
//! out; a schedule's tick fired or skipped), each with the job's id, kind
//! and queue, how long it waited since due and how long it ran. A reader
//! that falls behind loses events (counted in
//! [`Subscription::dropped`]), never slows the pool.
//!
//! Events are **this process's only**. Nothing is sent between
//! processes: a queue's subscribers see what was done through that
//! `Queue` (and its clones), its pools and its schedulers; a pool's, what
//! that pool did. Another process's enqueues, runs and operator actions
//! are not seen, and neither is a job cancelled elsewhere until this
//! pool's run of it loses its lease. Read the queue ([`Queue::stats`],
//! [`Queue::list`]) for what every process did.
//!
//! [`Queue::pause_queue`] is the opposite: a flag stored with the jobs,
//! respected by every process's claims until [`Queue::resume_queue`].
//!
//! A job that goes `dead` is logged at `warn`, a failure that will be
//! retried at `info` (through `log`).
//!
//! For numbers read from the queue itself (every process's work):
//! [`Queue::stats`] (exact, one snapshot, through the state indexes),
//! [`Ops::counts_by_queue`] and [`Ops::list_state`] (capped, for big
//! files), [`Ops::page`] (a state's jobs a page at a time by key,
//! filtered; a page deep in a big file costs what the first does),
//! [`Ops::holding_unique_key`], and [`Ops::activity`] (jobs finished and dead per slice of
//! time, with their lateness and run time).

//! ## Typed jobs
//!
//! A payload type that implements [`JobArgs`] names its kind and, if it
//! wants, its queue, priority, max_attempts, timeout, a unique key
//! computed from the args and a retry policy. [`Queue::enqueue_args`]
//! (also `_batch`, `_tx`) stores it as JSON; a handler registered with
//! [`WorkerPoolBuilder::handler_for`] gets it back deserialized, and a
//! payload that does not fit the type fails its job permanently with an
//! error naming the job, the kind, the type and serde's complaint.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use tickler::{JobArgs, JobContext, JobError, Queue, WorkerPool};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Resize { path: String, width: u32 }
//!
//! impl JobArgs for Resize {
//!     const KIND: &'static str = "resize";
//!     fn unique_key(&self) -> Option<String> {
//!         Some(format!("resize:{}:{}", self.path, self.width))
//!     }
//! }
//!
//! # fn main() -> tickler::Result<()> {
//! let queue = Queue::open("jobs.db")?;
//! queue.enqueue_args(&Resize { path: "a.png".into(), width: 640 })?;
//! let pool = WorkerPool::builder(&queue)
//!     .handler_for(|_ctx: &JobContext, job: Resize| {
//!         println!("resize {} to {} px", job.path, job.width);
//!         Ok::<(), JobError>(())
//!     })
//!     .start()?;
//! # Ok(())
//! # }
//! ```
//!
//! A kind's retry policy ([`JobArgs::retry_policy`], or
//! [`WorkerPoolBuilder::retry_policy_for`] for untyped kinds) is applied
//! by the pool that runs the kind: it records a failure with the kind's
//! backoff ([`Outcome::FailRetryAfter`]). It is not stored with the job, so
//! a lease that expires (the reaper, possibly in another process) and a
//! handler written off past its timeout wait per the queue's policy.
//!
//! ## Async applications
//!
//! Turn on the `tokio` feature (off by default; it adds only tokio's `rt`
//! and `sync`). A tokio application then uses tickler without ever
//! blocking its runtime:
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn app() -> tickler::Result<()> {
//! use std::time::Duration;
//! use tickler::{AsyncQueue, JobContext, JobError, NewJob, WorkerPool};
//!
//! let queue = AsyncQueue::open("app.db").await?;
//! let pool = WorkerPool::builder(queue.queue())
//!     .async_handler("fetch", |ctx: JobContext| async move {
//!         tokio::select! {
//!             _ = tokio::time::sleep(Duration::from_secs(1)) => Ok::<(), JobError>(()),
//!             why = ctx.cancelled() => Err(JobError::retry(format!("stopped: {why:?}"))),
//!         }
//!     })
//!     .start()?;
//! queue.enqueue(NewJob::new("fetch")).await?;
//! // … the application runs …
//! pool.shutdown_async(Duration::from_secs(10)).await;
//! # Ok(())
//! # }
//! # fn main() {}
//! ```
//!
//! - **The queue.** `AsyncQueue::open(path).await` (or
//!   `Queue::to_async()`) has every call of [`Queue`] (enqueue, reads,
//!   cancel and retry, pauses, schedules, the operator's readings) as an
//!   `async fn`, run on tokio's blocking pool: a runtime thread never
//!   waits for the write lock, a server or an fsync. Events come with
//!   `subscription.recv().await`.
//! - **Handlers are tasks.** `WorkerPoolBuilder::async_handler` (and
//!   `async_handler_for`, for typed jobs) runs each job as a task on your
//!   runtime: the one it is registered in, or the one named with
//!   `WorkerPoolBuilder::runtime`. A job waiting on a timer or a socket
//!   holds a slot, not a thread: a pool runs up to `async_concurrency`
//!   async jobs at once (default 10,000; `async_concurrency_for(kind, n)`
//!   gives a kind slots of its own), whatever its
//!   [`WorkerPoolBuilder::threads`], which run sync handlers only (a pool
//!   with no sync handler starts no worker thread). The pool's own few
//!   threads claim, renew leases, fence and group-commit exactly as for
//!   sync handlers.
//! - **Cancellation.** [`JobContext::cancelled`] is a future to `select!`
//!   on: ready at the job's timeout, when its lease is lost (cancelled,
//!   reaped) or at the end of the shutdown grace. A task that ignores it
//!   past its timeout plus [`WorkerPoolBuilder::timeout_grace`] is aborted
//!   at its next `.await`, and its attempt counts; one that ignores a lost
//!   lease for the grace is aborted too. The timeout counts from the
//!   task's first poll.
//! - **Blocking work** inside a handler (a long computation,
//!   [`JobContext::complete_with`], which is a write transaction) goes
//!   through `tokio::task::spawn_blocking`.
//! - **Stopping.** Call `WorkerPool::shutdown_async(grace).await` before
//!   your runtime ends: it hands back what has not started and waits up to
//!   `grace` for what runs, off the runtime's threads. Never call the
//!   blocking [`WorkerPool::shutdown`] on a runtime thread (on a
//!   `current_thread` runtime it would wait out its whole grace for
//!   handlers that need that very thread). A pool *dropped* on a runtime
//!   thread shuts down on a thread of its own, and the drop returns at
//!   once.
//! - **When the runtime ends first** (`#[tokio::main]` returns, a GUI
//!   quits and drops its runtime, `shutdown_timeout`), tokio drops the
//!   running tasks. tickler hands their jobs back with their attempts
//!   given back (even if the process exits right after), claims no more
//!   jobs of those kinds, and says so once in the log: quitting an app
//!   never spends an attempt, though its jobs start over next time.
//! - **GUI applications** (Tauri, egui or iced with a tokio runtime):
//!   start the pool from inside the runtime (or pass its
//!   `tokio::runtime::Handle` to `WorkerPoolBuilder::runtime`), keep it in
//!   the application's state, and when the window closes run
//!   `shutdown_async` on the runtime and wait for it before letting the
//!   runtime go.
//!
//! `tests/async_no_blocking.rs` holds the runtime to this: a 1-ms ticker
//! on a `current_thread` runtime stays under 20 ms p99 lateness while the
//! same thread enqueues and runs 10,000 jobs and shuts the pool down.
//! `examples/desktop_app.rs` is a whole tokio app (typed jobs, a delayed
//! job, a retrying job, a cron schedule, Ctrl-C):
//! `cargo run --features tokio --example desktop_app`.
//!
//! ## Testing handlers
//!
//! A handler is a function of a [`JobContext`]; to test one, open a queue
//! on a temporary file with a [`ManualClock`], enqueue a job and run it on
//! the test's thread with [`testing::run_one`], which claims it, runs the
//! handler as a pool would (panics included), records the outcome and
//! returns it. Move the clock to make a retry or a snooze due.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use tickler::{testing::run_one, JobContext, JobError, JobState, ManualClock, NewJob, Outcome, Queue};
//!
//! # fn main() -> tickler::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
//! let queue = Queue::builder(dir.path().join("jobs.db")).clock(clock.clone()).open()?;
//! let flaky = |ctx: &JobContext| match ctx.attempt() {
//!     1 => Err(JobError::retry("server said 503")),
//!     _ => Ok(()),
//! };
//! let id = queue.enqueue(NewJob::new("upload"))?;
//! let ran = run_one(&queue, "default", "upload", &flaky)?;
//! assert_eq!(ran, Some((id, Outcome::Fail("server said 503".into()))));
//! clock.advance(Duration::from_secs(3600)); // past any first backoff
//! assert_eq!(run_one(&queue, "default", "upload", &flaky)?, Some((id, Outcome::Complete)));
//! assert_eq!(queue.get(id)?.state, JobState::Succeeded);
//! # Ok(())
//! # }
//! ```
//!
//! ## What each write promises (and which ones fsync)
//!
//! | write | fsync under [`Durability::Full`] | if power fails before it is on disk |
//! | --- | --- | --- |
//! | `enqueue`, `enqueue_batch` | yes, before `Ok` (concurrent callers share one) | cannot happen: `Ok` means on disk |
//! | `record_outcomes`, `complete`, `fail`, `snooze`, cancel, retry, prune | yes | — |
//! | worker pool outcomes | within `outcome_sync_interval` (50 ms), outside the write lock | the job runs again (at-least-once), never lost |
//! | claim, heartbeat, reap | no fsync of their own | the job is pending again / its lease is older; the reaper handles it |
//!
//! In WAL mode a synced commit also makes every earlier commit durable, as
//! the log is written in order; that is what lets claims and heartbeats
//! skip their own fsync. See [`Queue::sync`] and [`OutcomeSync`].
//!
//! ## Jobs in the application's own transactions
//!
//! When the application keeps its data in the same file,
//! [`Queue::enqueue_tx`] writes a job inside the application's transaction
//! (the job exists if and only if it commits) and
//! [`JobContext::complete_with`] commits a handler's writes and the job's
//! completion together (a lost lease rolls both back). Effects inside the
//! file are then exactly-once; effects outside it (HTTP, e-mail) stay
//! at-least-once and should use the job id or run_token as an idempotency
//! key. [`Queue::open_connection`] opens a connection with tickler's
//! pragmas; tickler's tables and indexes are all named `tickler_*`.
//! One thing in the file is not namespaced: tickler keeps its schema
//! version in `PRAGMA user_version`, so an application sharing the file must
//! keep its own schema version in a table of its own, not in
//! `user_version`.
//!
//! ## Processes and `fork`
//!
//! Open the [`Queue`] in each process (or after `fork`), never before a
//! `fork` that both sides keep using: SQLite connections, their locks and
//! the threads of a pool do not survive being copied into a child process.
//! A child that only calls `exec` is fine.

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
mod async_queue;
mod batch;
mod clock;
mod engine;
mod error;
mod events;
mod graph;
pub mod holder;
mod job;
mod lease;
mod limit;
mod metrics;
mod observe;
mod queue;
mod reaper;
mod retry;
mod schedule;
mod scheduler;
mod typed;
mod watch;
mod worker;

/// The `rusqlite` this crate is built with: its types appear in the public
/// API ([`SqliteOptions::on_connection`], [`Queue::open_connection`],
/// [`Queue::enqueue_tx`], [`JobContext::complete_with`]). Use
/// `tickler::rusqlite` rather than a `rusqlite` dependency of your own, so
/// the versions always match.
pub use rusqlite;

/// The `postgres` client this crate is built with (feature `postgres`):
/// its transaction type appears in the public API ([`Queue::enqueue_tx`],
/// [`Queue::complete_with`]). Use `tickler::postgres`, or a `postgres`
/// dependency of the same version (0.19).
#[cfg(feature = "postgres")]
pub use postgres;

/// The `mysql` client this crate is built with (feature `mysql`): its
/// transaction type appears in the public API ([`Queue::enqueue_tx`],
/// [`Queue::complete_with`]). Use `tickler::mysql`, or a `mysql`
/// dependency of the same version (28).
#[cfg(feature = "mysql")]
pub use mysql;

#[cfg(feature = "tokio")]
pub use async_queue::AsyncQueue;
pub use batch::{Batch, BatchCallback, BatchId, NewBatch, MAX_BATCH_DESCRIPTION_BYTES};
pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::types::{
    AppTx, AppTxRef, AppWrites, Checkpoint, ClaimRequest, ConnectionHook, Durability, JobCursor,
    JobFilter, JobPage, Outcome, OutcomeSync, Pooler, PostgresOptions, RootCerts, SqliteOptions,
    SslMode, Stats, BACKWARD_STEP_MARGIN, ERROR_HISTORY_MAX, MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES_LIMIT, MAX_TIMESTAMP_MS,
};
pub use engine::{is_file_location, redacted_location};
pub use error::{Error, Result};
pub use events::{Event, JobEvent, JobEventKind, Subscription, TickEvent, DEFAULT_EVENT_BUFFER};
pub use graph::Graph;
pub use job::{
    AttemptError, Dependency, IfParentFails, Job, JobId, JobState, LimitSlot, NewJob, Output,
    Progress, RunToken, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, MAX_OUTPUT_BYTES,
    MAX_PROGRESS_MESSAGE_BYTES,
};
pub use lease::Lease;
pub use limit::{Limit, LimitInfo, LimitKeyUsage, Rate, MAX_LIMIT_KEY_BYTES, MAX_LIMIT_NAME_BYTES};
pub use metrics::WriteLockWaits;
pub use queue::{
    ActivityBucket, ChangeWatcher, Explanation, Holder, Manual, Ops, ParentWait, Queue,
    QueueBuilder, QueueCounts, Reason, Waited, Waker, ACTIVITY_MAX_BUCKETS, ACTIVITY_SAMPLE,
    MAX_PAYLOAD_DEPTH, MAX_UNIQUE_KEY_BYTES,
};
pub use reaper::{Reaper, ReaperConfig};
pub use retry::RetryPolicy;
pub use schedule::{
    MisfirePolicy, NewSchedule, OverlapPolicy, Schedule, ScheduleRef, Tick, TickRun, UpcomingTicks,
    DEFAULT_MISFIRE_GRACE, MAX_CATCH_UP, MAX_MISFIRE_GRACE,
};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use typed::JobArgs;
#[cfg(feature = "tokio")]
pub use worker::DEFAULT_ASYNC_CONCURRENCY;
pub use worker::{
    CancelReason, Handler, JobContext, JobError, PoolStats, ShutdownReport, WorkerPool,
    WorkerPoolBuilder, DEFAULT_PREFETCH, DEFAULT_PREFETCH_HOLD, DEFAULT_PRIORITY_AGING,
};

/// Helpers for testing handlers; see "Testing handlers" in the crate docs.
pub mod testing {
    pub use crate::worker::run_one;
}

/// The README's code examples, compiled (and the runnable ones run) by
/// `cargo test` as doctests so that they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
