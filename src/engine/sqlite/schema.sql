-- tickler schema.
--
-- The whole schema of a tickler file, split into migrations. Each migration
-- starts with a line `-- migration: N`; a file at `PRAGMA user_version = K`
-- gets every migration with N > K applied, in order, in one transaction, and
-- then `user_version` set to the last N. A file whose user_version is newer
-- than the last migration here is refused (Error::SchemaTooNew).
--
-- Time: every timestamp is INTEGER milliseconds since the Unix epoch, UTC.
-- Names: every table and index starts with `tickler_`, so the schema can live
-- in an application's own database file beside its tables.
--
-- Job states (status column):
--   scheduled  waiting for run_at (the design's "pending with a future
--              run_at"); promoted to pending by the claim transaction once due.
--              Kept apart so a claim never scans jobs that are not due.
--   pending    due, waiting for a worker.
--   blocked    due, waiting for a slot of its concurrency limit (migration 9).
--   running    claimed: has a run_token and a lease.
--   succeeded, dead, cancelled: terminal, have finished_at.

-- migration: 1
CREATE TABLE tickler_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL CHECK (length(queue) > 0),
    kind             TEXT    NOT NULL CHECK (length(kind) > 0),
    payload          TEXT    NOT NULL CHECK (json_valid(payload)),
    status           TEXT    NOT NULL CHECK (status IN
                       ('scheduled', 'pending', 'running', 'succeeded', 'dead', 'cancelled')),
    -- Higher runs first.
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    unique_key       TEXT,
    timeout_ms       INTEGER CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    run_token        TEXT,
    claimed_by       TEXT,
    claimed_at       INTEGER,
    lease_expires_at INTEGER,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    CHECK (status <> 'running'
           OR (run_token IS NOT NULL AND lease_expires_at IS NOT NULL AND claimed_at IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL))
) STRICT;

-- The claim: due jobs of one queue in priority, due time, id order.
CREATE INDEX tickler_jobs_pending
    ON tickler_jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';

-- Promotion of due jobs and "when is the next job due" for sleeping fetchers.
CREATE INDEX tickler_jobs_scheduled
    ON tickler_jobs (queue, run_at) WHERE status = 'scheduled';

-- The reaper: leases that ran out.
CREATE INDEX tickler_jobs_running
    ON tickler_jobs (lease_expires_at) WHERE status = 'running';

-- Pruning of finished jobs.
CREATE INDEX tickler_jobs_finished
    ON tickler_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- A unique_key is held by at most one job that is not finished.
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'pending', 'running');

-- migration: 2
-- Recurring schedules (src/schedule.rs). A schedule fires ticks: each tick
-- enqueues one job from the template columns, with run_at = the tick's
-- instant and unique_key 'tickler:schedule:<name>:<instant ms>'. The
-- transaction that enqueues a tick also moves next_tick_at past it, with
-- an UPDATE conditional on the next_tick_at it read, so a tick is enqueued
-- once however many schedulers share the file. next_tick_at only moves
-- forward (NULL: the expression fires no more).
CREATE TABLE tickler_schedules (
    name             TEXT    PRIMARY KEY CHECK (length(name) > 0),
    -- Cron expression (5 fields, or 6 with seconds first), parsed by croner.
    cron             TEXT    NOT NULL CHECK (length(cron) > 0),
    -- IANA time zone name the expression is read in, e.g. 'Europe/Berlin'.
    time_zone        TEXT    NOT NULL CHECK (length(time_zone) > 0),
    -- Job template.
    queue            TEXT    NOT NULL CHECK (length(queue) > 0),
    kind             TEXT    NOT NULL CHECK (length(kind) > 0),
    payload          TEXT    NOT NULL CHECK (json_valid(payload)),
    priority         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    timeout_ms       INTEGER CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    -- What to do with ticks that were due while no scheduler ran.
    misfire          TEXT    NOT NULL CHECK (misfire IN ('skip', 'fire_once', 'fire_all')),
    -- fire_all only: most catch-up ticks per misfire.
    misfire_max      INTEGER CHECK (misfire_max IS NULL OR misfire_max >= 1),
    -- A tick at most this late (ms) is on time, not a misfire.
    misfire_grace_ms INTEGER NOT NULL CHECK (misfire_grace_ms >= 0),
    paused           INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    next_tick_at     INTEGER,
    last_tick_at     INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    CHECK ((misfire = 'fire_all') = (misfire_max IS NOT NULL)),
    CHECK (next_tick_at IS NULL OR last_tick_at IS NULL OR next_tick_at > last_tick_at)
) STRICT;

-- The scheduler's "when is the next tick due" and "which ticks are due".
CREATE INDEX tickler_schedules_due
    ON tickler_schedules (next_tick_at) WHERE paused = 0 AND next_tick_at IS NOT NULL;

-- migration: 3
-- Every attempt's error, newest last, at most 20 entries (src/queue.rs,
-- ERROR_HISTORY_MAX): a JSON array of {"attempt", "at" (ms), "error",
-- "worker"}. last_error stays the error of the latest failed attempt and is
-- cleared when the job succeeds.
ALTER TABLE tickler_jobs ADD COLUMN errors TEXT NOT NULL DEFAULT '[]'
    CHECK (json_valid(errors) AND json_type(errors) = 'array');

-- Priority aging: a pool's share of claims that take the oldest due job of
-- a queue whatever its priority.
CREATE INDEX tickler_jobs_pending_age
    ON tickler_jobs (queue, run_at, id) WHERE status = 'pending';

-- A running job that was cancelled, or failed for good while its handler
-- ran on past its timeout, keeps its run_token and lease until its holder
-- has stopped (its fenced outcome clears the lease) or the lease ran out;
-- until then no other job with its unique_key starts.
CREATE INDEX tickler_jobs_stopping
    ON tickler_jobs (unique_key)
    WHERE status IN ('cancelled', 'dead') AND lease_expires_at IS NOT NULL;

-- migration: 4
-- Schedules and clocks at the edges (src/schedule.rs, the reaper in
-- src/queue.rs).
--
-- overlap: what a tick does while an earlier run of the same schedule is
-- not finished. Schedules stored before this migration keep the behaviour
-- they had ('allow'); new ones default to 'forbid' (NewSchedule).
ALTER TABLE tickler_schedules ADD COLUMN overlap TEXT NOT NULL DEFAULT 'allow'
    CHECK (overlap IN ('allow', 'forbid', 'replace'));
-- Ticks not fired because of the overlap policy, since the schedule was stored.
ALTER TABLE tickler_schedules ADD COLUMN skipped_ticks INTEGER NOT NULL DEFAULT 0
    CHECK (skipped_ticks >= 0);
-- Backward steps of the wall clock. Every tick in [handled_from,
-- last_tick_at] was handled (fired or deliberately skipped); the span
-- restarts at a misfire. After a backward step the handled ticks that lie
-- ahead of the clock are kept in [ahead_from, ahead_until]: they are never
-- fired again, and the schedule resumes with the first tick after the new
-- now that is not in that window.
-- When a misfire drops ticks (a forward jump of the clock, a device that
-- was off), the span restarts after the gap and handled_through keeps
-- "every tick at or before this was handled", so that after a backward
-- step the dropped ticks can fire and the ones before them cannot.
ALTER TABLE tickler_schedules ADD COLUMN handled_from INTEGER;
ALTER TABLE tickler_schedules ADD COLUMN handled_through INTEGER;
ALTER TABLE tickler_schedules ADD COLUMN ahead_from INTEGER;
ALTER TABLE tickler_schedules ADD COLUMN ahead_until INTEGER
    CHECK ((ahead_from IS NULL) = (ahead_until IS NULL) AND (ahead_until IS NULL OR ahead_until >= ahead_from));
-- Nothing earlier than its creation can have fired.
UPDATE tickler_schedules SET handled_from = created_at;

-- "Did the clock step back since this schedule was last written?"
-- (updated_at > now), one indexed read for a sleeping scheduler.
CREATE INDEX tickler_schedules_updated
    ON tickler_schedules (updated_at) WHERE paused = 0;

-- Length (ms) of the lease last granted to a running job, by its claim or
-- its latest heartbeat. The reaper uses it after a backward step of the
-- wall clock: a lease whose expiry lies further ahead than this (plus a
-- margin) was granted "in the future" and is treated as expiring one lease
-- length from now. NULL for leases granted before this migration.
ALTER TABLE tickler_jobs ADD COLUMN lease_ms INTEGER CHECK (lease_ms IS NULL OR lease_ms >= 0);

-- migration: 5
-- Paused queues (Queue::pause_queue): a claim skips the queues listed
-- here, in the transaction that claims, so a pause committed before a
-- claim starts holds for every process on the file. Jobs already claimed
-- run on and their outcomes are recorded; nothing else about the jobs
-- changes. A row per paused queue; resuming deletes it.
CREATE TABLE tickler_paused_queues (
    queue     TEXT    PRIMARY KEY CHECK (length(queue) > 0),
    paused_at INTEGER NOT NULL
) STRICT;

-- migration: 6
-- Finished jobs per state and queue, newest last: the dashboard's counts
-- and lists of succeeded, dead and cancelled jobs (Queue::counts_by_queue,
-- Queue::list_state) read this instead of scanning the table. One entry
-- per finished job, written when it finishes and removed when it is
-- pruned or retried.
CREATE INDEX tickler_jobs_finished_state
    ON tickler_jobs (status, queue, finished_at) WHERE finished_at IS NOT NULL;

-- migration: 7
-- What a crash costs (src/holder.rs, the reaper's rule in
-- src/engine/types.rs):
--
-- holder_id: the process holding a running job's lease, by its row in
-- tickler_holders (machine, boot, PID and network namespaces, process id
-- and start time; see src/holder.rs), written by the claim. A queue that
-- opens, and the reaper, take back at once the leases of a holder of this
-- machine that is gone, instead of waiting for them to run out.
CREATE TABLE tickler_holders (
    -- A hash of the text (src/holder.rs, holder_id): every process
    -- computes its own.
    id     INTEGER PRIMARY KEY,
    holder TEXT    NOT NULL
) STRICT;
ALTER TABLE tickler_jobs ADD COLUMN holder_id INTEGER;
-- started_at: when this run's handler was known to have started (ms),
-- NULL until then. A pool claims ahead of its free threads and records
-- starts shortly after they happen; an expired or abandoned lease whose
-- run never started gives its attempt back (given_back + 1) instead of
-- counting it.
ALTER TABLE tickler_jobs ADD COLUMN started_at INTEGER;
-- given_back: runs of this job given back uncounted. Once a job has one,
-- its pools record each start before the handler runs, so that a handler
-- that kills its process at once cannot be given back for ever.
ALTER TABLE tickler_jobs ADD COLUMN given_back INTEGER NOT NULL DEFAULT 0
    CHECK (given_back >= 0);

-- migration: 8
-- A running job's progress (JobContext::progress): a fraction from 0 to 1
-- and a short message, written by its holder, fenced by its run_token,
-- at most a few times a second. NULL until the first report; kept once
-- the job finished, as the last thing its handler said.
ALTER TABLE tickler_jobs ADD COLUMN progress REAL
    CHECK (progress IS NULL OR (progress >= 0 AND progress <= 1));
ALTER TABLE tickler_jobs ADD COLUMN progress_message TEXT;

-- migration: 9
-- Concurrency limits (src/limit.rs, the rules in src/queue/limits.rs).
--
-- A limit stored by name: at most max_per_key slots taken per key, and
-- at most max_total over all its keys if set.
CREATE TABLE tickler_limits (
    name        TEXT    PRIMARY KEY CHECK (length(name) > 0),
    max_per_key INTEGER NOT NULL CHECK (max_per_key >= 1),
    max_total   INTEGER CHECK (max_total IS NULL OR max_total >= 1),
    updated_at  INTEGER NOT NULL
) STRICT;
-- The limit, key and weight a job names. A job holds limit_weight slots
-- of its key while its row holds a lease: running, or cancelled or dead
-- with lease_expires_at set (a holder that has not stopped yet). Nothing
-- else counts slots, so there is nothing to get out of step with the rows.
ALTER TABLE tickler_jobs ADD COLUMN limit_name TEXT;
ALTER TABLE tickler_jobs ADD COLUMN limit_key TEXT;
ALTER TABLE tickler_jobs ADD COLUMN limit_weight INTEGER NOT NULL DEFAULT 1
    CHECK (limit_weight >= 1);
-- The state `blocked`: due, but waiting for a slot of its limit, out of
-- the claim's index. The status CHECK above gains it in place (SQLite's
-- documented way to loosen a CHECK: the stored rows do not change), as
-- an alternative of its own: a list of seven in the CHECK cost every
-- change of status 3 % more instructions than the list of six and one
-- comparison.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '(''scheduled'', ''pending'', ''running'', ''succeeded'', ''dead'', ''cancelled'')',
                     '(''scheduled'', ''pending'', ''running'', ''succeeded'', ''dead'', ''cancelled'')
                       OR status = ''blocked''')
 WHERE type = 'table' AND name = 'tickler_jobs';
PRAGMA writable_schema = RESET;
-- A blocked job keeps its unique_key like any unfinished job.
DROP INDEX tickler_jobs_unique_key;
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'pending', 'blocked', 'running');
-- Slots held per key: the rows of limited jobs by state (a lease kept
-- past its run, in lease order).
CREATE INDEX tickler_jobs_limit
    ON tickler_jobs (limit_name, status, limit_key, lease_expires_at) WHERE limit_name IS NOT NULL;
-- Blocked jobs of a key in claim order: the next to get a freed slot.
-- Its condition leads with the limit, so that a change of status of a
-- job without one passes it at one test of NULL.
CREATE INDEX tickler_jobs_blocked
    ON tickler_jobs (limit_name, limit_key, priority DESC, run_at, id)
    WHERE limit_name IS NOT NULL AND status = 'blocked';
-- Leases kept by rows that are not running (a cancelled run whose holder
-- has not stopped, a last attempt past its timeout, a retry waiting for
-- the old run's lease): the unique_key they hold, and the reaper's look
-- at those that ran out, which hands their limit slots on. It replaces
-- the index of migration 3 (cancelled and dead rows only): one index on
-- the path of every change of status rather than two.
DROP INDEX tickler_jobs_stopping;
CREATE INDEX tickler_jobs_stopping
    ON tickler_jobs (unique_key) WHERE status <> 'running' AND lease_expires_at IS NOT NULL;
-- The operator's lists of blocked jobs by queue, in claim order.
CREATE INDEX tickler_jobs_blocked_queue
    ON tickler_jobs (queue, priority DESC, run_at, id)
    WHERE limit_name IS NOT NULL AND status = 'blocked';

-- migration: 10
-- Rate limits on the same limits (src/limit.rs, `Rate`): a limit may have
-- a rate (count per period, plus a burst) besides or instead of its
-- concurrency limit, so max_per_key may be NULL. SQLite cannot loosen a
-- NOT NULL in place: the table of a few rows is copied.
CREATE TABLE tickler_limits_new (
    name           TEXT    PRIMARY KEY CHECK (length(name) > 0),
    max_per_key    INTEGER CHECK (max_per_key IS NULL OR max_per_key >= 1),
    max_total      INTEGER CHECK (max_total IS NULL OR max_total >= 1),
    rate_count     INTEGER CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period_ms INTEGER CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    rate_burst     INTEGER NOT NULL DEFAULT 0 CHECK (rate_burst >= 0),
    updated_at     INTEGER NOT NULL,
    CHECK (max_per_key IS NOT NULL OR rate_count IS NOT NULL),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL))
) STRICT;
INSERT INTO tickler_limits_new (name, max_per_key, max_total, updated_at)
    SELECT name, max_per_key, max_total, updated_at FROM tickler_limits;
DROP TABLE tickler_limits;
ALTER TABLE tickler_limits_new RENAME TO tickler_limits;
-- Each rated key's GCRA state, in microseconds: tat, when its next start
-- is due at the steady rate; horizon, the last instant handed to a job
-- deferred over the rate (the tail of the key's line); seen, the latest
-- engine time (ms) that read it, by which a step back of the clock is
-- told from time passing. A key with no row has never started.
CREATE TABLE tickler_limit_rates (
    name    TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    tat     INTEGER NOT NULL,
    horizon INTEGER NOT NULL,
    seen    INTEGER NOT NULL,
    PRIMARY KEY (name, key)
) STRICT, WITHOUT ROWID;
-- The reaper's look for keys that saw a later time than now.
CREATE INDEX tickler_limit_rates_seen ON tickler_limit_rates (seen);
-- A job deferred over its rate: the instant it was given (its run_at
-- while it waits, so a claim tells a deferred run from a new one) and how
-- often it was deferred.
ALTER TABLE tickler_jobs ADD COLUMN rate_slot INTEGER;
ALTER TABLE tickler_jobs ADD COLUMN rate_deferrals INTEGER NOT NULL DEFAULT 0;

-- migration: 11
-- The limit a schedule's jobs name (NewSchedule::limit): every tick's job
-- takes a slot of it, as a job enqueued with NewJob::limit does.
ALTER TABLE tickler_schedules ADD COLUMN limit_name TEXT;
ALTER TABLE tickler_schedules ADD COLUMN limit_key TEXT;
ALTER TABLE tickler_schedules ADD COLUMN limit_weight INTEGER NOT NULL DEFAULT 1
    CHECK (limit_weight >= 1);

-- migration: 12
-- What a job's handler returned when it succeeded (JSON text, at most
-- 64 KiB), written by the statement that marks it succeeded.
ALTER TABLE tickler_jobs ADD COLUMN output TEXT;

-- migration: 13
-- Jobs that run after others (NewJob::after, src/queue/deps.rs). The
-- state `waiting`: a job with an edge not yet resolved, out of the
-- claim's index, gained in place as `blocked` was (migration 9).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, 'OR status = ''blocked''', 'OR status = ''blocked'' OR status = ''waiting''')
 WHERE type = 'table' AND name = 'tickler_jobs';
PRAGMA writable_schema = RESET;
-- A waiting job keeps its unique_key like any unfinished job.
DROP INDEX tickler_jobs_unique_key;
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting');
-- Waiting jobs by queue: counts and lists (a 100,000-job backlog of them
-- is never on the claim's path).
CREATE INDEX tickler_jobs_waiting ON tickler_jobs (queue, id) WHERE status = 'waiting';
-- One edge: child runs after parent. `resolved` once the parent's end was
-- taken into account; an unresolved edge keeps its child waiting. Kept
-- until the child is pruned, so a child reads its parents.
CREATE TABLE tickler_deps (
    parent_id INTEGER NOT NULL,
    child_id  INTEGER NOT NULL,
    if_fails  TEXT    NOT NULL CHECK (if_fails IN ('cancel', 'hold', 'run')),
    resolved  INTEGER NOT NULL DEFAULT 0 CHECK (resolved IN (0, 1)),
    PRIMARY KEY (parent_id, child_id)
) STRICT, WITHOUT ROWID;
-- A child's edges: whether any is left unresolved, and its parents.
CREATE INDEX tickler_deps_child ON tickler_deps (child_id, resolved);
-- migration: 14
-- Batches (src/queue/batches.rs). A job's batch_id names the batch it is
-- a member or a callback of. batch_end is, for a member, NULL until its
-- end is counted in the batch's counters, then the state it was counted
-- as; for a callback, which one it is.
ALTER TABLE tickler_jobs ADD COLUMN batch_id INTEGER;
ALTER TABLE tickler_jobs ADD COLUMN batch_end TEXT
    CHECK (batch_end IN ('succeeded', 'dead', 'cancelled', 'on_success', 'on_failure', 'on_finish'));
-- A batch's members and callbacks (and the pruner's check of a member).
CREATE INDEX tickler_jobs_batch ON tickler_jobs (batch_id, id) WHERE batch_id IS NOT NULL;
-- Members whose end is not counted yet: what an outcome's read of the jobs
-- it ended probes, empty when no batch runs, so a job in none pays a
-- look at an empty index rather than at its row.
CREATE INDEX tickler_jobs_uncounted ON tickler_jobs (id)
    WHERE batch_id IS NOT NULL AND batch_end IS NULL;
-- The counters always add up: members = remaining + succeeded + dead +
-- cancelled, kept in the transactions that add and end members.
CREATE TABLE tickler_batches (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    description TEXT,
    created_at  INTEGER NOT NULL,
    sealed_at   INTEGER,
    finished_at INTEGER,
    members     INTEGER NOT NULL DEFAULT 0,
    remaining   INTEGER NOT NULL DEFAULT 0,
    succeeded   INTEGER NOT NULL DEFAULT 0,
    dead        INTEGER NOT NULL DEFAULT 0,
    cancelled   INTEGER NOT NULL DEFAULT 0
) STRICT;
