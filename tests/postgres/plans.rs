//! PostgreSQL's: the statements tickler runs for enqueues, claims,
//! heartbeats, outcomes and the reaper are planned as index reads whose
//! estimated cost does not grow with the table. Each statement is read,
//! as tickler sent it, from `pg_prepared_statements` on tickler's own
//! connections after a workload, and its generic plan (as a server plans a prepared statement after
//! five runs, or always under `plan_cache_mode = force_generic_plan`) is
//! compared at 1,000 and 100,000 jobs. A cost that grows with the table
//! is what crossed the JIT thresholds: the claim once cost 8 million at
//! 1,000,000 jobs for a read of 32 rows.
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::collections::BTreeMap;
use std::time::Duration;
use tickler::{NewJob, Outcome, Queue};

/// Runs what a busy queue runs: enqueues, a claim, a heartbeat, each
/// outcome, a look for due work and the reaper.
fn workload(queue: &Queue) {
    for _ in 0..3 {
        queue.enqueue(NewJob::new("k").priority(5)).unwrap();
    }
    queue
        .enqueue_batch((0..10).map(|_| NewJob::new("k")).collect())
        .unwrap();
    queue
        .enqueue(NewJob::new("k").unique_key(format!("key-{}", fastrand::u64(..))))
        .unwrap();
    let manual = queue.manual();
    let leases = manual
        .claim("default", "w", 5, Duration::from_secs(60))
        .unwrap();
    assert_eq!(leases.len(), 5);
    manual
        .heartbeat(&leases[0], Duration::from_secs(60))
        .unwrap();
    manual.complete(&leases[0]).unwrap();
    manual.fail(&leases[1], "again").unwrap();
    manual
        .record_outcomes(&[
            (&leases[2], Outcome::Complete),
            (&leases[3], Outcome::Complete),
        ])
        .unwrap();
    manual.release(&leases[4]).unwrap();
    manual.next_due(&["default"], None).unwrap();
    manual.reap().unwrap();
}

/// The statements on `tickler_jobs` that tickler's connections prepared,
/// as they sent them, with their markers' types: read on those
/// connections themselves (`pg_prepared_statements` is each session's
/// own), through `complete_with`, a few times to reach each of the pool's.
fn statements(queue: &Queue) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    for _ in 0..12 {
        let lease = pg::enqueue_and_claim(queue, NewJob::new("k").priority(1_000));
        let rows = queue
            .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                Ok(tx.query(
                    "SELECT statement, parameter_types::text[] FROM pg_prepared_statements
                     WHERE NOT from_sql AND statement LIKE '%tickler_jobs%'
                       AND statement NOT LIKE '%pg_prepared_statements%'",
                    &[],
                )?)
            })
            .unwrap();
        for row in rows {
            found.insert(row.get::<_, String>(0), row.get::<_, Vec<String>>(1));
        }
    }
    found
}

/// The generic plan of `sql` (markers of `types`) on the test's own
/// connection: its estimated total cost and the plan as JSON text.
fn generic_plan(client: &mut postgres::Client, sql: &str, types: &[String]) -> (f64, String) {
    client
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .unwrap();
    let prepare = if types.is_empty() {
        format!("PREPARE tickler_plan AS {sql}")
    } else {
        format!("PREPARE tickler_plan ({}) AS {sql}", types.join(", "))
    };
    client
        .batch_execute(&prepare)
        .unwrap_or_else(|e| panic!("{}: {sql}", pg::describe(&e)));
    let execute = if types.is_empty() {
        "EXPLAIN (FORMAT JSON) EXECUTE tickler_plan".to_owned()
    } else {
        format!(
            "EXPLAIN (FORMAT JSON) EXECUTE tickler_plan({})",
            vec!["NULL"; types.len()].join(", ")
        )
    };
    // As text: the column is of type json.
    let text = client
        .simple_query(&execute)
        .unwrap()
        .into_iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a plan");
    client.batch_execute("DEALLOCATE tickler_plan").unwrap();
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cost = plan[0]["Plan"]["Total Cost"].as_f64().unwrap();
    (cost, text)
}

/// Each statement's generic plan, after the workload on the queue as it is.
fn plans(db: &pg::TestDb, queue: &Queue) -> BTreeMap<String, (f64, String)> {
    let mut client = db.connect();
    client.batch_execute("ANALYZE tickler_jobs").unwrap();
    // A few times: each of the pool's connections prepares what it runs.
    for _ in 0..4 {
        workload(queue);
    }
    statements(queue)
        .into_iter()
        .map(|(sql, types)| {
            let plan = generic_plan(&mut client, &sql, &types);
            (sql, plan)
        })
        .collect()
}

/// Enqueues `pending` due jobs and `future` ones due in a day at a higher
/// priority (a claim must not read past those).
fn fill(queue: &Queue, pending: usize, future: usize) {
    let due_tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let jobs: Vec<NewJob> = (0..pending)
        .map(|i| NewJob::new("k").priority((i % 7) as i32))
        .chain((0..future).map(|_| NewJob::new("k").priority(100).run_at(due_tomorrow)))
        .collect();
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        queue
            .enqueue_batch(jobs.by_ref().take(5_000).collect())
            .unwrap();
    }
}

#[test]
fn hot_statements_cost_the_same_at_1000_and_100000_jobs() {
    let Some(db) = pg::test_database() else {
        return;
    };
    // Two connections (the fewest a pool has), which the workload and the
    // reads of their prepared statements both reach.
    let queue = Queue::builder(db.url())
        .postgres(|o| o.max_connections(2))
        .open()
        .expect("open");
    // The depth that grows is the pending jobs': the scheduled ones stay as
    // many, since the generic plan of the promotion prices its `run_at <=
    // now` as a third of them, whatever now is (a range on a parameter);
    // its literal batch size bounds it.
    fill(&queue, 1_000, 1_000);
    let small = plans(&db, &queue);
    fill(&queue, 99_000, 0);
    let big = plans(&db, &queue);

    let claim = big
        .keys()
        .find(|sql| sql.contains("SKIP LOCKED") && sql.contains("claim_id ="))
        .unwrap_or_else(|| panic!("no claim among the statements: {:#?}", big.keys()));
    assert!(small.contains_key(claim), "the claim ran only at one size");
    let mut compared = 0;
    for (sql, (cost, plan)) in &big {
        println!(
            "{cost:>12.1}  {}",
            sql.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        // A statement that locks or writes rows must not scan the table (a
        // read that stops at its first row, such as the look for due work
        // when nearly every row is pending, may: its cost is a few rows').
        let writes = sql.contains("FOR UPDATE") || sql.trim_start().starts_with("UPDATE");
        assert!(
            !writes
                || !plan.contains("\"Seq Scan\"")
                || !plan.contains("\"Relation Name\": \"tickler_jobs\""),
            "a full scan of the jobs table at 100,000 jobs:\n{sql}\n{plan}"
        );
        let Some((small_cost, _)) = small.get(sql) else {
            continue;
        };
        compared += 1;
        assert!(
            *cost <= small_cost * 3.0 + 50.0,
            "estimated cost {small_cost:.1} at 1,000 jobs, {cost:.1} at 100,000:\n{sql}\n{plan}"
        );
    }
    assert!(
        compared >= 8,
        "only {compared} statements compared: {:#?}",
        big.keys()
    );
}
