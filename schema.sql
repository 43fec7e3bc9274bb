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
