-- tickler schema on MySQL/MariaDB (InnoDB).
--
-- Split into migrations by lines "-- migration: N", and each migration into
-- statements at every semicolon that ends a line. Applied versions are
-- recorded in tickler_schema_migrations. MySQL commits every DDL statement
-- at once, so a migration is not one transaction: each statement can run
-- again after a crash halfway (IF NOT EXISTS), and one process at a time
-- migrates (GET_LOCK).
--
-- The same columns, states and meanings as the SQLite and PostgreSQL
-- schemas: every timestamp is BIGINT milliseconds since the Unix epoch,
-- UTC, read from the database server's clock.
--
-- InnoDB has no partial indexes: every index of jobs in a state leads with
-- status, so a claim, a promotion or the reaper reads the entries of its
-- state only, in the order it wants them, with no sort. The unique key of
-- unfinished jobs is a unique index on unique_live, a stored generated
-- column that holds unique_key while the job is scheduled, pending or
-- running and NULL after (a unique index admits any number of NULLs).
--
-- Names are VARBINARY: compared byte for byte (no collation folds case,
-- accents or trailing spaces), as on the other engines. Text that JSON
-- functions read (errors) and free text (errors, worker ids) is utf8mb4.
--
-- ROW_FORMAT = DYNAMIC on every table: a server configured (or upgraded)
-- with COMPACT rows refuses an index on a column over 767 bytes, such as
-- unique_live.

-- migration: 1
CREATE TABLE IF NOT EXISTS tickler_jobs (
    id               BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue            VARBINARY(255) NOT NULL,
    kind             VARBINARY(255) NOT NULL,
    payload          LONGBLOB       NOT NULL,
    status           VARBINARY(9)   NOT NULL,
    priority         INT            NOT NULL DEFAULT 0,
    run_at           BIGINT         NOT NULL,
    attempts         BIGINT         NOT NULL DEFAULT 0,
    max_attempts     BIGINT         NOT NULL,
    unique_key       VARBINARY(1024),
    unique_live      VARBINARY(1024) AS (CASE WHEN status IN ('scheduled', 'pending', 'running')
                                              THEN unique_key END) STORED,
    timeout_ms       BIGINT,
    run_token        VARBINARY(64),
    claimed_by       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    claimed_at       BIGINT,
    lease_expires_at BIGINT,
    lease_ms         BIGINT,
    -- A random id per claiming transaction: a claimer whose COMMIT was not
    -- acknowledged (the connection dropped) finds what it took.
    claim_id         BIGINT,
    -- A random id per enqueue call and each job's place in it: the ids of
    -- a batch are read back by it, and a retry after a COMMIT whose answer
    -- was lost finds the jobs already stored rather than storing them twice.
    enqueue_batch    BIGINT,
    enqueue_seq      INT,
    last_error       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    errors           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    created_at       BIGINT         NOT NULL,
    finished_at      BIGINT,
    CONSTRAINT tickler_jobs_status CHECK (status IN
        ('scheduled', 'pending', 'running', 'succeeded', 'dead', 'cancelled')),
    CONSTRAINT tickler_jobs_names CHECK (length(queue) > 0 AND length(kind) > 0),
    CONSTRAINT tickler_jobs_attempts CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT tickler_jobs_times CHECK ((timeout_ms IS NULL OR timeout_ms > 0)
                                         AND (lease_ms IS NULL OR lease_ms >= 0)),
    CONSTRAINT tickler_jobs_running CHECK (status <> 'running'
        OR (run_token IS NOT NULL AND lease_expires_at IS NOT NULL AND claimed_at IS NOT NULL)),
    CONSTRAINT tickler_jobs_finished CHECK ((status IN ('succeeded', 'dead', 'cancelled'))
                                            = (finished_at IS NOT NULL)),
    -- Pending jobs in claim order (priority first), and by age (aging,
    -- the oldest-first claims); scheduled jobs by due time share the second.
    KEY tickler_jobs_pending (status, queue, priority DESC, run_at, id),
    KEY tickler_jobs_due (status, queue, run_at, id),
    KEY tickler_jobs_running (status, lease_expires_at),
    KEY tickler_jobs_finished (finished_at),
    KEY tickler_jobs_finished_state (status, queue, finished_at),
    UNIQUE KEY tickler_jobs_unique_live (unique_live),
    -- Holders of a key (a cancelled run still stopping), and the key
    -- ranges of a schedule's runs.
    KEY tickler_jobs_unique_key (unique_key, status, lease_expires_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

CREATE TABLE IF NOT EXISTS tickler_schedules (
    name             VARBINARY(255) NOT NULL PRIMARY KEY,
    cron             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    time_zone        VARBINARY(255) NOT NULL,
    queue            VARBINARY(255) NOT NULL,
    kind             VARBINARY(255) NOT NULL,
    payload          LONGBLOB       NOT NULL,
    priority         INT            NOT NULL DEFAULT 0,
    max_attempts     BIGINT         NOT NULL,
    timeout_ms       BIGINT,
    misfire          VARBINARY(16)  NOT NULL,
    misfire_max      BIGINT,
    misfire_grace_ms BIGINT         NOT NULL,
    paused           BOOLEAN        NOT NULL DEFAULT FALSE,
    next_tick_at     BIGINT,
    last_tick_at     BIGINT,
    created_at       BIGINT         NOT NULL,
    updated_at       BIGINT         NOT NULL,
    overlap          VARBINARY(16)  NOT NULL DEFAULT 'forbid',
    skipped_ticks    BIGINT         NOT NULL DEFAULT 0,
    handled_from     BIGINT,
    handled_through  BIGINT,
    ahead_from       BIGINT,
    ahead_until      BIGINT,
    CONSTRAINT tickler_schedules_values CHECK (length(name) > 0 AND length(cron) > 0
        AND length(queue) > 0 AND length(kind) > 0 AND max_attempts >= 1
        AND misfire IN ('skip', 'fire_once', 'fire_all')
        AND overlap IN ('allow', 'forbid', 'replace') AND skipped_ticks >= 0
        AND misfire_grace_ms >= 0),
    CONSTRAINT tickler_schedules_misfire CHECK ((misfire = 'fire_all') = (misfire_max IS NOT NULL)),
    KEY tickler_schedules_due (paused, next_tick_at),
    KEY tickler_schedules_updated (paused, updated_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- Paused queues (Queue::pause_queue): a claim skips the queues listed here,
-- read by the claiming transaction itself.
CREATE TABLE IF NOT EXISTS tickler_paused_queues (
    queue     VARBINARY(255) NOT NULL PRIMARY KEY,
    paused_at BIGINT         NOT NULL
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- migration: 2
-- What a crash costs, as in the SQLite schema (migration 7 there): the
-- process holding a lease (by its row in tickler_holders), when its run
-- was known to have started, and the runs given back uncounted. The
-- columns in one statement, which both servers apply atomically and
-- without copying rows: run again after a cut that came before the
-- migration was recorded, it fails as a duplicate column, which the
-- migration takes for done.
ALTER TABLE tickler_jobs
    ADD COLUMN holder_id BIGINT,
    ADD COLUMN started_at BIGINT,
    ADD COLUMN given_back BIGINT NOT NULL DEFAULT 0 CHECK (given_back >= 0);

CREATE TABLE IF NOT EXISTS tickler_holders (
    id     BIGINT         NOT NULL PRIMARY KEY,
    holder VARBINARY(1024) NOT NULL
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- migration: 3
-- A running job's progress, as in the SQLite schema (migration 8 there),
-- in one statement (see migration 2 for a rerun after a cut).
ALTER TABLE tickler_jobs
    ADD COLUMN progress DOUBLE
        CHECK (progress IS NULL OR (progress >= 0 AND progress <= 1)),
    ADD COLUMN progress_message TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

-- migration: 4
-- Concurrency limits, as in the SQLite schema (migration 9 there): the
-- limit, key and weight a job names, the state `blocked`, a blocked job
-- keeping its unique_key, and the stored limits. The job table's part in
-- one statement (see migration 2 for a rerun after a cut).
ALTER TABLE tickler_jobs
    ADD COLUMN limit_name VARBINARY(255),
    ADD COLUMN limit_key VARBINARY(1024),
    ADD COLUMN limit_weight BIGINT NOT NULL DEFAULT 1 CHECK (limit_weight >= 1),
    DROP CONSTRAINT tickler_jobs_status,
    ADD CONSTRAINT tickler_jobs_status CHECK (status IN
        ('scheduled', 'pending', 'blocked', 'running', 'succeeded', 'dead', 'cancelled')),
    MODIFY COLUMN unique_live VARBINARY(1024)
        AS (CASE WHEN status IN ('scheduled', 'pending', 'blocked', 'running')
                 THEN unique_key END) STORED,
    ADD KEY tickler_jobs_limit (limit_name, status, limit_key, lease_expires_at),
    ADD KEY tickler_jobs_blocked (status, limit_name, limit_key, priority DESC, run_at, id);

CREATE TABLE IF NOT EXISTS tickler_limits (
    name        VARBINARY(255) NOT NULL PRIMARY KEY,
    max_per_key BIGINT         NOT NULL,
    max_total   BIGINT,
    updated_at  BIGINT         NOT NULL,
    CONSTRAINT tickler_limits_values CHECK (length(name) > 0 AND max_per_key >= 1
                                            AND (max_total IS NULL OR max_total >= 1))
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- migration: 5
-- Rate limits, as in the SQLite schema (migration 10 there). Each ALTER
-- is one statement (see migration 2 for a rerun after a cut).
ALTER TABLE tickler_jobs
    ADD COLUMN rate_slot BIGINT,
    ADD COLUMN rate_deferrals BIGINT NOT NULL DEFAULT 0;

ALTER TABLE tickler_limits
    ADD COLUMN rate_count BIGINT,
    ADD COLUMN rate_period_ms BIGINT,
    ADD COLUMN rate_burst BIGINT NOT NULL DEFAULT 0,
    MODIFY COLUMN max_per_key BIGINT NULL,
    DROP CONSTRAINT tickler_limits_values,
    ADD CONSTRAINT tickler_limits_values CHECK (length(name) > 0
        AND (max_per_key IS NULL OR max_per_key >= 1)
        AND (max_total IS NULL OR max_total >= 1)
        AND (rate_count IS NULL OR rate_count >= 1)
        AND (rate_period_ms IS NULL OR rate_period_ms >= 1)
        AND rate_burst >= 0
        AND (max_per_key IS NOT NULL OR rate_count IS NOT NULL)
        AND ((rate_count IS NULL) = (rate_period_ms IS NULL)));

CREATE TABLE IF NOT EXISTS tickler_limit_rates (
    name    VARBINARY(255)  NOT NULL,
    `key`   VARBINARY(1024) NOT NULL,
    tat     BIGINT          NOT NULL,
    horizon BIGINT          NOT NULL,
    seen    BIGINT          NOT NULL,
    PRIMARY KEY (name, `key`),
    KEY tickler_limit_rates_seen (seen)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- migration: 6
-- The limit a schedule's jobs name, as in the SQLite schema (migration 11
-- there). One statement (see migration 2 for a rerun after a cut).
ALTER TABLE tickler_schedules
    ADD COLUMN limit_name VARBINARY(255),
    ADD COLUMN limit_key VARBINARY(1024),
    ADD COLUMN limit_weight BIGINT NOT NULL DEFAULT 1 CHECK (limit_weight >= 1);

-- migration: 7
-- What a job's handler returned, as in the SQLite schema (migration 12
-- there): JSON text as bytes, as the payload is.
ALTER TABLE tickler_jobs ADD COLUMN output MEDIUMBLOB;

-- migration: 8
-- Jobs that run after others, as in the SQLite schema (migration 13
-- there): the state `waiting` (its index leads with status, as every
-- state's does), a waiting job keeping its unique_key, and the edges. The
-- job table's part in one statement (see migration 2 for a rerun after a
-- cut).
ALTER TABLE tickler_jobs
    DROP CONSTRAINT tickler_jobs_status,
    ADD CONSTRAINT tickler_jobs_status CHECK (status IN
        ('scheduled', 'pending', 'blocked', 'running', 'succeeded', 'dead', 'cancelled', 'waiting')),
    MODIFY COLUMN unique_live VARBINARY(1024)
        AS (CASE WHEN status IN ('scheduled', 'pending', 'blocked', 'running', 'waiting')
                 THEN unique_key END) STORED;

CREATE TABLE IF NOT EXISTS tickler_deps (
    parent_id BIGINT      NOT NULL,
    child_id  BIGINT      NOT NULL,
    if_fails  VARBINARY(6) NOT NULL,
    resolved  BOOLEAN     NOT NULL DEFAULT FALSE,
    PRIMARY KEY (parent_id, child_id),
    KEY tickler_deps_child (child_id, resolved),
    CONSTRAINT tickler_deps_if_fails CHECK (if_fails IN ('cancel', 'hold', 'run'))
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- migration: 9
-- Batches, as in the SQLite schema (migration 14 there). The job table's
-- part in one statement (see migration 2 for a rerun after a cut).
-- open_mark finds a batch again after a COMMIT whose answer was lost.
ALTER TABLE tickler_jobs
    ADD COLUMN batch_id BIGINT,
    ADD COLUMN batch_end VARBINARY(10)
        CHECK (batch_end IN ('succeeded', 'dead', 'cancelled', 'on_success', 'on_failure', 'on_finish')),
    ADD KEY tickler_jobs_batch (batch_id, id);

CREATE TABLE IF NOT EXISTS tickler_batches (
    id          BIGINT   NOT NULL AUTO_INCREMENT PRIMARY KEY,
    description TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    created_at  BIGINT   NOT NULL,
    sealed_at   BIGINT,
    finished_at BIGINT,
    members     BIGINT   NOT NULL DEFAULT 0,
    remaining   BIGINT   NOT NULL DEFAULT 0,
    succeeded   BIGINT   NOT NULL DEFAULT 0,
    dead        BIGINT   NOT NULL DEFAULT 0,
    cancelled   BIGINT   NOT NULL DEFAULT 0,
    open_mark   BIGINT,
    KEY tickler_batches_open_mark (open_mark)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
