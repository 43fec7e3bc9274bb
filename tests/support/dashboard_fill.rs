//! Fills a tickler file fast with jobs in every state, through one
//! `INSERT … SELECT` from a recursive CTE on a raw connection (shared by
//! tests/sqlite/dashboard_plan.rs and the `dashboard` benchmark row).
//!
//! Of every 1,000 jobs, in three queues q0, q1, q2: 10 dead, 10
//! cancelled, 20 pending, 10 scheduled (an hour ahead), 10 blocked (limit
//! `l`, keys k0 to k4), 10 waiting (each after the blocked job before
//! it), 1 running (a lease an hour ahead), the rest
//! succeeded. Finished jobs finish one per
//! millisecond from 1,000 s ago, each 50 ms after it started.

/// Inserts `n` jobs into the tickler file open on `conn` (its schema
/// must exist: open a `Queue` on it first).
pub fn fill(conn: &rusqlite::Connection, n: u64) -> rusqlite::Result<usize> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1),
              s(i, st) AS (SELECT i, CASE
                  WHEN i % 100 = 0 THEN 'dead'
                  WHEN i % 100 = 1 THEN 'cancelled'
                  WHEN i % 100 IN (2, 3) THEN 'pending'
                  WHEN i % 100 = 4 THEN 'scheduled'
                  WHEN i % 100 = 6 THEN 'blocked'
                  WHEN i % 100 = 7 THEN 'waiting'
                  WHEN i % 1000 = 5 THEN 'running'
                  ELSE 'succeeded' END FROM n)
         INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at, attempts,
             max_attempts, run_token, claimed_by, claimed_at, lease_expires_at, last_error,
             created_at, finished_at, limit_name, limit_key)
         SELECT 'q' || (i % 3), 'k' || (i % 7), '{\"n\":' || i || '}', st, i % 3,
             CASE st WHEN 'scheduled' THEN ?2 + 3600000 ELSE ?2 - 3600000 + i % 1000 END,
             CASE WHEN st IN ('pending', 'scheduled', 'blocked', 'waiting') THEN 0 ELSE 1 END, 3,
             CASE st WHEN 'running' THEN 'tok' || i END,
             CASE st WHEN 'running' THEN 'w' END,
             CASE WHEN st = 'running' THEN ?2
                  WHEN st IN ('succeeded', 'dead') THEN ?2 - 1000050 + i END,
             CASE st WHEN 'running' THEN ?2 + 3600000 END,
             CASE st WHEN 'dead' THEN 'boom' END,
             ?2 - 7200000,
             CASE WHEN st IN ('succeeded', 'dead', 'cancelled') THEN ?2 - 1000000 + i END,
             CASE st WHEN 'blocked' THEN 'l' END,
             CASE st WHEN 'blocked' THEN 'k' || (i % 5) END
         FROM s",
        rusqlite::params![n as i64, now],
    )
    .and_then(|inserted| {
        conn.execute(
            "INSERT INTO tickler_deps (parent_id, child_id, if_fails)
             SELECT id - 1, id, 'cancel' FROM tickler_jobs WHERE status = 'waiting'",
            [],
        )?;
        Ok(inserted)
    })
}
