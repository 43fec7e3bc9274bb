-- tickler schema on PostgreSQL.
--
-- Split into migrations by lines `-- migration: N`. Applied versions are
-- recorded in tickler_schema_migrations (one row per version); a database
-- holding a version newer than the last migration here is refused
-- (Error::SchemaTooNew). Migrations run in one transaction under an
-- advisory lock, so processes starting together migrate once.
--
-- The same columns, states and meanings as the SQLite schema (schema.sql
-- at the top of the repository): every timestamp is BIGINT milliseconds
-- since the Unix epoch, UTC, read from the database server's clock (see
-- src/postgres/clock.rs), so machines whose clocks differ agree on what
-- is due and which leases ran out.
--
-- Churn: a job row is updated three or four times in its life (claimed,
-- finished, perhaps retried) and then deleted by pruning. Every status
-- change moves the row between partial indexes, so it cannot be a HOT
-- update; the indexes that change are the small partial ones (pending,
-- scheduled, running), which stay as small as the work waiting. The table
-- leaves room in each page (fillfactor) for the updated versions of its
-- rows, and autovacuum is asked to visit it after 1 % of its rows changed
-- rather than PostgreSQL's default 20 %: a queue table is small and hot.

-- migration: 1
CREATE TABLE tickler_jobs (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            TEXT    NOT NULL CHECK (length(queue) > 0),
    kind             TEXT    NOT NULL CHECK (length(kind) > 0),
    -- JSON text, as serialized by tickler (not jsonb: jsonb refuses the
    -- escaped NUL character that JSON allows).
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN
                       ('scheduled', 'pending', 'running', 'succeeded', 'dead', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           BIGINT  NOT NULL,
    attempts         BIGINT  NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     BIGINT  NOT NULL CHECK (max_attempts >= 1),
    -- Byte order ("C"), so that the key ranges of a schedule's runs are
    -- ranges of the index whatever the database's collation.
    unique_key       TEXT    COLLATE "C",
    timeout_ms       BIGINT  CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    run_token        TEXT,
    claimed_by       TEXT,
    claimed_at       BIGINT,
    lease_expires_at BIGINT,
    lease_ms         BIGINT  CHECK (lease_ms IS NULL OR lease_ms >= 0),
    -- A random id per claiming transaction: a claimer whose COMMIT was
    -- not acknowledged (the connection dropped) finds what it took.
    claim_id         BIGINT,
    -- A random id per enqueue call and each job's place in it: a retry
    -- after a COMMIT whose answer was lost with the connection finds the
    -- jobs already stored rather than storing them twice.
    enqueue_batch    BIGINT,
    enqueue_seq      INTEGER,
    last_error       TEXT,
    errors           JSONB   NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(errors) = 'array'),
    created_at       BIGINT  NOT NULL,
    finished_at      BIGINT,
    CHECK (status <> 'running'
           OR (run_token IS NOT NULL AND lease_expires_at IS NOT NULL AND claimed_at IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL))
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX tickler_jobs_pending
    ON tickler_jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';
CREATE INDEX tickler_jobs_pending_age
    ON tickler_jobs (queue, run_at, id) WHERE status = 'pending';
CREATE INDEX tickler_jobs_scheduled
    ON tickler_jobs (queue, run_at) WHERE status = 'scheduled';
CREATE INDEX tickler_jobs_running
    ON tickler_jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX tickler_jobs_finished
    ON tickler_jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'pending', 'running');
CREATE INDEX tickler_jobs_stopping
    ON tickler_jobs (unique_key)
    WHERE status IN ('cancelled', 'dead') AND lease_expires_at IS NOT NULL;

CREATE TABLE tickler_schedules (
    name             TEXT    PRIMARY KEY CHECK (length(name) > 0),
    cron             TEXT    NOT NULL CHECK (length(cron) > 0),
    time_zone        TEXT    NOT NULL CHECK (length(time_zone) > 0),
    queue            TEXT    NOT NULL CHECK (length(queue) > 0),
    kind             TEXT    NOT NULL CHECK (length(kind) > 0),
    payload          TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    max_attempts     BIGINT  NOT NULL CHECK (max_attempts >= 1),
    timeout_ms       BIGINT  CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    misfire          TEXT    NOT NULL CHECK (misfire IN ('skip', 'fire_once', 'fire_all')),
    misfire_max      BIGINT  CHECK (misfire_max IS NULL OR misfire_max >= 1),
    misfire_grace_ms BIGINT  NOT NULL CHECK (misfire_grace_ms >= 0),
    paused           BOOLEAN NOT NULL DEFAULT false,
    next_tick_at     BIGINT,
    last_tick_at     BIGINT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    overlap          TEXT    NOT NULL DEFAULT 'forbid' CHECK (overlap IN ('allow', 'forbid', 'replace')),
    skipped_ticks    BIGINT  NOT NULL DEFAULT 0 CHECK (skipped_ticks >= 0),
    handled_from     BIGINT,
    handled_through  BIGINT,
    ahead_from       BIGINT,
    ahead_until      BIGINT,
    CHECK ((misfire = 'fire_all') = (misfire_max IS NOT NULL)),
    CHECK (next_tick_at IS NULL OR last_tick_at IS NULL OR next_tick_at > last_tick_at),
    CHECK ((ahead_from IS NULL) = (ahead_until IS NULL) AND (ahead_until IS NULL OR ahead_until >= ahead_from))
);

CREATE INDEX tickler_schedules_due
    ON tickler_schedules (next_tick_at) WHERE NOT paused AND next_tick_at IS NOT NULL;
CREATE INDEX tickler_schedules_updated
    ON tickler_schedules (updated_at) WHERE NOT paused;

-- migration: 2
-- Paused queues (Queue::pause_queue), as in the SQLite schema: a claim
-- skips the queues listed here. Read by the claiming transaction itself;
-- under READ COMMITTED, each claim statement sees the pauses committed
-- before it began.
CREATE TABLE tickler_paused_queues (
    queue     TEXT    PRIMARY KEY CHECK (length(queue) > 0),
    paused_at BIGINT  NOT NULL
);

-- migration: 3
-- Finished jobs per state and queue, as in the SQLite schema: the
-- dashboard's counts and lists of finished jobs.
CREATE INDEX tickler_jobs_finished_state
    ON tickler_jobs (status, queue, finished_at) WHERE finished_at IS NOT NULL;

-- migration: 4
-- What a crash costs, as in the SQLite schema (migration 7 there): the
-- process holding a lease (by its row in tickler_holders), when its run
-- was known to have started, and
-- the runs given back uncounted. Adding nullable columns, and one with a
-- constant default, rewrites no row.
CREATE TABLE tickler_holders (
    id     BIGINT PRIMARY KEY,
    holder TEXT   COLLATE "C" NOT NULL
);
ALTER TABLE tickler_jobs ADD COLUMN holder_id BIGINT;
ALTER TABLE tickler_jobs ADD COLUMN started_at BIGINT;
ALTER TABLE tickler_jobs ADD COLUMN given_back BIGINT NOT NULL DEFAULT 0
    CHECK (given_back >= 0);

-- migration: 5
-- A running job's progress, as in the SQLite schema (migration 8 there).
ALTER TABLE tickler_jobs
    ADD COLUMN progress DOUBLE PRECISION
        CHECK (progress IS NULL OR (progress >= 0 AND progress <= 1)),
    ADD COLUMN progress_message TEXT;

-- migration: 6
-- Concurrency limits, as in the SQLite schema (migration 9 there): the
-- stored limits, the limit, key and weight a job names, the state
-- `blocked`, and a blocked job keeping its unique_key.
CREATE TABLE tickler_limits (
    name        TEXT   COLLATE "C" PRIMARY KEY CHECK (length(name) > 0),
    max_per_key BIGINT NOT NULL CHECK (max_per_key >= 1),
    max_total   BIGINT CHECK (max_total IS NULL OR max_total >= 1),
    updated_at  BIGINT NOT NULL
);
ALTER TABLE tickler_jobs
    ADD COLUMN limit_name TEXT COLLATE "C",
    ADD COLUMN limit_key TEXT COLLATE "C",
    ADD COLUMN limit_weight BIGINT NOT NULL DEFAULT 1 CHECK (limit_weight >= 1),
    DROP CONSTRAINT tickler_jobs_status_check,
    ADD CONSTRAINT tickler_jobs_status_check CHECK (status IN
        ('scheduled', 'pending', 'blocked', 'running', 'succeeded', 'dead', 'cancelled'));
DROP INDEX tickler_jobs_unique_key;
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('scheduled', 'pending', 'blocked', 'running');
CREATE INDEX tickler_jobs_limit
    ON tickler_jobs (limit_name, status, limit_key, lease_expires_at) WHERE limit_name IS NOT NULL;
CREATE INDEX tickler_jobs_blocked
    ON tickler_jobs (limit_name, limit_key, priority DESC, run_at, id) WHERE status = 'blocked';
CREATE INDEX tickler_jobs_blocked_queue
    ON tickler_jobs (queue, priority DESC, run_at, id) WHERE status = 'blocked';
-- Leases kept by rows that are not running (a cancelled run whose holder
-- has not stopped, a last attempt past its timeout, a retry waiting for
-- the old run's lease): the reaper clears those that ran out, and hands
-- their limit slots on.
CREATE INDEX tickler_jobs_kept_lease
    ON tickler_jobs (lease_expires_at) WHERE status <> 'running' AND lease_expires_at IS NOT NULL;

-- migration: 7
-- Rate limits, as in the SQLite schema (migration 10 there).
ALTER TABLE tickler_limits
    ALTER COLUMN max_per_key DROP NOT NULL,
    ADD COLUMN rate_count BIGINT CHECK (rate_count IS NULL OR rate_count >= 1),
    ADD COLUMN rate_period_ms BIGINT CHECK (rate_period_ms IS NULL OR rate_period_ms >= 1),
    ADD COLUMN rate_burst BIGINT NOT NULL DEFAULT 0 CHECK (rate_burst >= 0),
    ADD CONSTRAINT tickler_limits_some CHECK (max_per_key IS NOT NULL OR rate_count IS NOT NULL),
    ADD CONSTRAINT tickler_limits_rate CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL));
CREATE TABLE tickler_limit_rates (
    name    TEXT   COLLATE "C" NOT NULL,
    key     TEXT   COLLATE "C" NOT NULL,
    tat     BIGINT NOT NULL,
    horizon BIGINT NOT NULL,
    seen    BIGINT NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE INDEX tickler_limit_rates_seen ON tickler_limit_rates (seen);
ALTER TABLE tickler_jobs
    ADD COLUMN rate_slot BIGINT,
    ADD COLUMN rate_deferrals BIGINT NOT NULL DEFAULT 0;

-- migration: 8
-- The limit a schedule's jobs name, as in the SQLite schema (migration 11
-- there).
ALTER TABLE tickler_schedules
    ADD COLUMN limit_name TEXT COLLATE "C",
    ADD COLUMN limit_key TEXT COLLATE "C",
    ADD COLUMN limit_weight BIGINT NOT NULL DEFAULT 1 CHECK (limit_weight >= 1);

-- migration: 9
-- What a job's handler returned, as in the SQLite schema (migration 12
-- there).
ALTER TABLE tickler_jobs ADD COLUMN output TEXT;

-- migration: 10
-- Jobs that run after others, as in the SQLite schema (migration 13
-- there): the state `waiting`, a waiting job keeping its unique_key, and
-- the edges.
ALTER TABLE tickler_jobs
    DROP CONSTRAINT tickler_jobs_status_check,
    ADD CONSTRAINT tickler_jobs_status_check CHECK (status IN
        ('scheduled', 'pending', 'blocked', 'running', 'succeeded', 'dead', 'cancelled', 'waiting'));
DROP INDEX tickler_jobs_unique_key;
CREATE UNIQUE INDEX tickler_jobs_unique_key
    ON tickler_jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting');
CREATE INDEX tickler_jobs_waiting ON tickler_jobs (queue, id) WHERE status = 'waiting';
CREATE TABLE tickler_deps (
    parent_id BIGINT  NOT NULL,
    child_id  BIGINT  NOT NULL,
    if_fails  TEXT    NOT NULL CHECK (if_fails IN ('cancel', 'hold', 'run')),
    resolved  BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX tickler_deps_child ON tickler_deps (child_id, resolved);
-- migration: 11
-- Batches, as in the SQLite schema (migration 14 there). open_mark finds
-- a batch again after a COMMIT whose answer was lost.
ALTER TABLE tickler_jobs
    ADD COLUMN batch_id BIGINT,
    ADD COLUMN batch_end TEXT CHECK (batch_end IN
        ('succeeded', 'dead', 'cancelled', 'on_success', 'on_failure', 'on_finish'));
CREATE INDEX tickler_jobs_batch ON tickler_jobs (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE TABLE tickler_batches (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    description TEXT,
    created_at  BIGINT NOT NULL,
    sealed_at   BIGINT,
    finished_at BIGINT,
    members     BIGINT NOT NULL DEFAULT 0,
    remaining   BIGINT NOT NULL DEFAULT 0,
    succeeded   BIGINT NOT NULL DEFAULT 0,
    dead        BIGINT NOT NULL DEFAULT 0,
    cancelled   BIGINT NOT NULL DEFAULT 0,
    open_mark   BIGINT
);
