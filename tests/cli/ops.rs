//! The `tickler` binary's operator commands, run as a user would: the happy
//! path of each, and each error path with its exit code and its one-line
//! message that says what to do.

use crate::support::cli;

use cli::{mode, Env, BIN};
use std::process::Command;
use std::time::Duration;
use tickler::{JobId, JobState, NewJob, Queue};

#[test]
fn every_subcommand_has_help_with_an_example() {
    let env = Env::new();
    let subcommands: &[&[&str]] = &[
        &[],
        &["init"],
        &["enqueue"],
        &["list"],
        &["show"],
        &["batch"],
        &["stats"],
        &["retry"],
        &["cancel"],
        &["prune"],
        &["reap"],
        &["work"],
        &["checkpoint"],
        &["schedule"],
        &["schedule", "add"],
        &["schedule", "list"],
        &["schedule", "rm"],
        &["schedule", "pause"],
        &["schedule", "resume"],
        &["schedule", "next"],
    ];
    for sub in subcommands {
        let mut args = sub.to_vec();
        args.push("--help");
        let out = env.run(&args).ok();
        assert!(
            out.contains("Example"),
            "{sub:?} --help has no example:\n{out}"
        );
        assert!(out.contains("tickler "), "{sub:?}:\n{out}");
    }
}

#[test]
fn init_creates_an_owner_only_file_and_reports_the_schema_version() {
    let env = Env::new();
    let version = tickler::Ops::schema_version();
    let out = env.run(&["init"]).ok();
    assert_eq!(
        out.trim(),
        format!("created {}: schema version {version}", env.db.display())
    );
    assert_eq!(mode(&env.db), 0o600);
    let out = env.run(&["init"]).ok();
    assert!(
        out.contains(&format!("schema version {version}, up to date")),
        "{out}"
    );

    // An older file is migrated.
    let old = env.dir.path().join("old.db");
    rusqlite::Connection::open(&old)
        .unwrap()
        .execute_batch("PRAGMA user_version = 0; CREATE TABLE unrelated (x);")
        .unwrap();
    // Made with the umask's 0644: `init` refuses a file others can read.
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = env.run(&["--db", old.to_str().unwrap(), "init"]).ok();
    assert!(out.contains(&format!("schema version {version}")), "{out}");
    assert_eq!(
        tickler::Ops::file_schema_version(&old).unwrap(),
        Some(version)
    );
}

#[test]
fn the_file_defaults_to_tickler_db_in_the_working_folder() {
    let env = Env::new();
    let out = Command::new(BIN)
        .arg("init")
        .current_dir(env.dir.path())
        .env_remove("TICKLER_DB")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(env.dir.path().join("tickler.db").exists());
    assert!(!env.db.exists());
}

#[test]
fn enqueue_list_and_show() {
    let env = Env::new();
    let id = env.enqueue(&[
        "send_email",
        r#"{"to": "ada@example.com"}"#,
        "--queue",
        "mail",
        "--priority",
        "-3",
        "--max-attempts",
        "5",
        "--unique-key",
        "welcome-ada",
        "--timeout",
        "30s",
        "--in",
        "1h",
    ]);
    let job = env.job(id);
    assert_eq!(job.kind, "send_email");
    assert_eq!(job.queue, "mail");
    assert_eq!(job.priority, -3);
    assert_eq!(job.max_attempts, 5);
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.timeout, Some(Duration::from_secs(30)));
    assert_eq!(job.payload, serde_json::json!({"to": "ada@example.com"}));
    let wait = job.run_at - job.created_at;
    assert!((wait.num_seconds() - 3600).abs() <= 1, "{wait}");

    // The same unique key gives the same job.
    let again = env.enqueue(&["send_email", "--unique-key", "welcome-ada"]);
    assert_eq!(again, id);

    let due = env.enqueue(&["cleanup", "--at", "2030-01-02T03:04:05Z"]);
    assert_eq!(
        env.job(due).run_at.to_rfc3339(),
        "2030-01-02T03:04:05+00:00"
    );

    // Table, local time with the zone (TZ is Asia/Kolkata), or UTC.
    let table = env.run(&["list"]).ok();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("ID"), "{table}");
    assert!(
        lines[1].contains("scheduled") && lines[1].contains("mail"),
        "{table}"
    );
    assert!(lines[2].contains("2030-01-02 08:34:05 +05:30"), "{table}");
    // Columns line up.
    let state_col = lines[0].find("STATE").unwrap();
    assert_eq!(lines[1].find("scheduled"), Some(state_col), "{table}");
    let utc = env.run(&["list", "--utc"]).ok();
    assert!(utc.contains("2030-01-02 03:04:05 UTC"), "{utc}");

    // Filters.
    let mail = env.run(&["list", "--queue", "mail"]).ok();
    assert_eq!(mail.lines().count(), 2, "{mail}");
    let none = env.run(&["list", "--state", "dead"]);
    assert_eq!(none.code, 0);
    assert_eq!(none.stdout, "");
    let limited = env.run(&["list", "--limit", "1"]);
    assert_eq!(limited.stdout.lines().count(), 2);
    let held = env
        .run(&["list", "--json", "--unique-key", "welcome-ada"])
        .ok();
    let held: serde_json::Value = serde_json::from_str(held.trim()).unwrap();
    assert_eq!(held["id"], id.0);
    let free = env.run(&["list", "--unique-key", "welcome-bob"]);
    assert_eq!((free.code, free.stdout.as_str()), (0, ""));
    let both = env.run(&["list", "--unique-key", "welcome-ada", "--queue", "mail"]);
    assert_eq!(both.code, 2, "{}", both.stderr);

    // JSON: one object per line.
    let json = env.run(&["list", "--json", "--kind", "cleanup"]).ok();
    let objects: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0]["id"], due.0);
    assert_eq!(objects[0]["state"], "scheduled");
    assert_eq!(objects[0]["run_at"], "2030-01-02T03:04:05.000Z");

    // Show: every field.
    let shown = env.run(&["show", &id.to_string()]).ok();
    for field in [
        "id:",
        "state:",
        "queue:",
        "kind:",
        "priority:",
        "attempts:",
        "run_at:",
        "created_at:",
        "claimed_at:",
        "claimed_by:",
        "lease_expires_at:",
        "finished_at:",
        "timeout:",
        "unique_key:",
        "run_token:",
        "payload:",
        "last_error:",
    ] {
        assert!(shown.contains(field), "show lacks {field}:\n{shown}");
    }
    assert!(shown.contains("0 of 5"), "{shown}");
    assert!(shown.contains("welcome-ada"), "{shown}");
    assert!(shown.contains("+05:30"), "{shown}");
    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["show", &id.to_string(), "--json"]).ok()).unwrap();
    assert_eq!(json["unique_key"], "welcome-ada");
    assert_eq!(json["timeout_ms"], 30_000);
}

#[test]
fn show_prints_the_last_error_and_attempts() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let id = queue.enqueue(NewJob::new("flaky").max_attempts(1)).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    queue
        .manual()
        .fail(&lease, "boom: the mail server said no\nsecond line")
        .unwrap();
    let shown = env.run(&["show", &id.to_string()]).ok();
    assert!(shown.contains("state:            dead"), "{shown}");
    assert!(shown.contains("attempts:         1 of 1"), "{shown}");
    assert!(
        shown.contains("last_error:       boom: the mail server said no"),
        "{shown}"
    );
    assert!(shown.contains("\n                  second line"), "{shown}");
    let table = env.run(&["list"]).ok();
    assert!(table.contains("boom: the mail server said no…"), "{table}");
}

/// `show` of a batch's callback says which batch and callback it is, how
/// many members remain, and that an unsealed batch waits for its seal;
/// `--json` carries the same as fields.
#[test]
fn show_explains_a_batch_callback_and_an_unsealed_batch() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let batch = queue
        .open_batch(tickler::NewBatch::new().on_failure(NewJob::new("alert")))
        .unwrap();
    queue.enqueue(NewJob::new("send").batch(batch.id)).unwrap();
    let callback = batch.on_failure.unwrap().to_string();
    let shown = env.run(&["show", &callback]).ok();
    assert!(
        shown.contains(&format!(
            "why:              on_failure callback of batch {} (released if any member ends \
             dead or cancelled, else cancelled): 1 of 1 members remaining; the batch is not sealed",
            batch.id
        )),
        "{shown}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["show", &callback, "--json"]).ok()).unwrap();
    assert_eq!(
        json["reason"],
        serde_json::json!({
            "reason": "after_batch",
            "batch": batch.id.0,
            "callback": "on_failure",
            "members": 1,
            "remaining": 1,
            "failed": 0,
            "sealed": false,
        })
    );
    queue.seal_batch(batch.id).unwrap();
    let shown = env.run(&["show", &callback]).ok();
    assert!(shown.contains("1 of 1 members remaining\n"), "{shown}");
}

#[test]
fn stats_counts_per_queue_and_state() {
    let env = Env::new();
    env.enqueue(&["a"]);
    env.enqueue(&["a"]);
    env.enqueue(&["b", "--queue", "mail", "--in", "1d"]);
    let c = env.enqueue(&["c", "--queue", "mail"]);
    env.run(&["cancel", &c.to_string()]).ok();
    let out = env.run(&["stats"]).ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("QUEUE"), "{out}");
    assert!(
        lines[0].contains("PENDING") && lines[0].contains("CANCELLED"),
        "{out}"
    );
    let default: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        default,
        ["default", "0", "0", "2", "0", "0", "0", "0", "0"],
        "{out}"
    );
    let mail: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        mail,
        ["mail", "0", "1", "0", "0", "0", "0", "0", "1"],
        "{out}"
    );
    assert!(out.contains("oldest due job: waiting"), "{out}");
    assert!(out.contains("finished in the last minute: 1"), "{out}");
    assert!(out.contains("WAL file: "), "{out}");

    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["stats", "--json"]).ok()).unwrap();
    assert_eq!(json["queues"]["default"]["pending"], 2);
    assert_eq!(json["queues"]["mail"]["scheduled"], 1);
    assert_eq!(json["finished_last_minute"], 1);
    assert!(json["wal_bytes"].is_u64());
    assert!(json["oldest_due_wait_ms"].is_u64());
}

/// A dead job, made through the library.
fn dead_job(queue: &Queue, kind: &str, queue_name: &str) -> JobId {
    let id = queue
        .enqueue(NewJob::new(kind).queue(queue_name).max_attempts(1))
        .unwrap();
    let lease = queue
        .manual()
        .claim(queue_name, "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, id);
    queue.manual().fail_permanently(&lease, "broken").unwrap();
    id
}

#[test]
fn retry_one_job_or_every_dead_one() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let a = dead_job(&queue, "a", "default");
    let b = dead_job(&queue, "b", "default");
    let m = dead_job(&queue, "m", "mail");

    let out = env.run(&["retry", &a.to_string()]).ok();
    assert!(out.contains(&format!("job {a} is pending again")), "{out}");
    assert_eq!(env.job(a).state, JobState::Pending);
    assert_eq!(env.job(a).attempts, 0);

    let out = env.run(&["retry", "--dead", "--queue", "mail"]).ok();
    assert!(out.contains("retried 1 dead job(s)"), "{out}");
    assert_eq!(env.job(m).state, JobState::Pending);
    assert_eq!(env.job(b).state, JobState::Dead);

    let out = env.run(&["retry", "--dead"]).ok();
    assert!(out.contains("retried 1 dead job(s)"), "{out}");
    assert_eq!(env.job(b).state, JobState::Pending);

    // Errors.
    env.run(&["retry", &a.to_string()]).fails(
        1,
        &[
            &format!("job {a} is pending; cannot retry it"),
            "dead or cancelled",
        ],
    );
    env.run(&["retry", "999"])
        .fails(1, &["no job with id 999", "tickler list"]);
    let usage = env.run(&["retry"]);
    assert_eq!(usage.code, 2, "{usage:#?}");
    let usage = env.run(&["retry", "1", "--dead"]);
    assert_eq!(usage.code, 2, "{usage:#?}");
}

#[test]
fn cancel_jobs() {
    let env = Env::new();
    let a = env.enqueue(&["a"]);
    let b = env.enqueue(&["b", "--in", "1h"]);
    let out = env.run(&["cancel", &a.to_string(), &b.to_string()]).ok();
    assert!(out.contains(&format!("job {a} cancelled")), "{out}");
    assert_eq!(env.job(a).state, JobState::Cancelled);
    assert_eq!(env.job(b).state, JobState::Cancelled);
    env.run(&["cancel", &a.to_string()])
        .fails(1, &[&format!("job {a} is cancelled; cannot cancel it")]);
    // A cancelled job can be retried.
    env.run(&["retry", &a.to_string()]).ok();
    assert_eq!(env.job(a).state, JobState::Pending);
    assert_eq!(env.run(&["cancel"]).code, 2);
    assert_eq!(env.run(&["cancel", "x"]).code, 2);
}

#[test]
fn prune_finished_jobs_by_age_and_state() {
    let env = Env::new();
    let done = env.enqueue(&["a"]);
    let cancelled = env.enqueue(&["b"]);
    let waiting = env.enqueue(&["c"]);
    let queue = env.queue();
    let lease = queue
        .manual()
        .claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, done);
    queue.manual().complete(&lease).unwrap();
    queue.cancel(cancelled).unwrap();
    drop(queue);

    let out = env.run(&["prune", "--older-than", "7d"]).ok();
    assert!(
        out.contains("pruned 0 job(s) finished more than 7days ago"),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(5));
    let out = env
        .run(&["prune", "--older-than", "1ms", "--state", "succeeded"])
        .ok();
    assert!(out.contains("pruned 1 job(s)"), "{out}");
    let queue = env.queue();
    assert!(queue.get(done).is_err());
    assert_eq!(queue.get(cancelled).unwrap().state, JobState::Cancelled);
    let out = env.run(&["prune", "--older-than", "1ms"]).ok();
    assert!(out.contains("pruned 1 job(s)"), "{out}");
    assert!(queue.get(cancelled).is_err());
    assert_eq!(queue.get(waiting).unwrap().state, JobState::Pending);

    let usage = env.run(&["prune", "--older-than", "1ms", "--state", "pending"]);
    assert_eq!(usage.code, 2, "{usage:#?}");
    let usage = env.run(&["prune", "--older-than", "a week"]);
    assert_eq!(usage.code, 2, "{usage:#?}");
    assert!(
        usage
            .stderr
            .contains("as tickler prints durations: 250ms, 5s"),
        "{usage:#?}"
    );
    assert_eq!(env.run(&["prune"]).code, 2);
}

#[test]
fn reap_takes_back_expired_leases() {
    let env = Env::new();
    let id = env.enqueue(&["a"]);
    let queue = env.queue();
    let lease = queue
        .manual()
        .claim("default", "crashed-worker", 1, Duration::from_millis(1))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, id);
    std::thread::sleep(Duration::from_millis(10));
    let out = env.run(&["reap"]).ok();
    assert_eq!(out.trim(), "took back 1 job(s) with expired leases");
    let job = env.job(id);
    assert_ne!(job.state, JobState::Running);
    assert!(job.last_error.unwrap().contains("lease expired"));
    let out = env.run(&["reap"]).ok();
    assert_eq!(out.trim(), "took back 0 job(s) with expired leases");
}

#[test]
fn checkpoint_reports_the_wal_size() {
    let env = Env::new();
    env.run(&["init"]).ok();
    // Keep a connection open so the WAL file stays after the writes.
    let queue = env.queue();
    for i in 0..200 {
        queue
            .enqueue(NewJob::new("a").payload(serde_json::json!(i)))
            .unwrap();
    }
    assert!(queue.ops().wal_bytes() > 0);
    let out = env.run(&["checkpoint"]).ok();
    assert!(out.starts_with("WAL file: "), "{out}");
    assert!(out.trim().ends_with("before, 0 B after"), "{out}");
    assert!(!out.contains("0 B before"), "{out}");
}

#[test]
fn usage_errors_exit_2() {
    let env = Env::new();
    env.run(&["init"]).ok();
    for args in [
        &["frobnicate"][..],
        &["enqueue"],
        &["enqueue", "a", "{not json"],
        &["enqueue", "a", "--in", "soon"],
        &["enqueue", "a", "--at", "tomorrow"],
        &["enqueue", "a", "--at", "2030-01-01T00:00:00Z", "--in", "1h"],
        &["enqueue", "a", "--max-attempts", "0"],
        &["enqueue", "a", "--priority", "high"],
        &["list", "--state", "sleeping"],
        &["show"],
        &["show", "seven"],
        &["work", "--threads", "0"],
    ] {
        let run = env.run(args);
        assert_eq!(run.code, 2, "{args:?}: {run:#?}");
        assert!(run.stderr.contains("error:"), "{args:?}: {run:#?}");
    }
    let run = env.run(&["enqueue", "a", "--at", "tomorrow"]);
    assert!(run.stderr.contains("RFC 3339"), "{run:#?}");
    let run = env.run(&["enqueue", "a", "{not json"]);
    assert!(run.stderr.contains("not valid JSON"), "{run:#?}");
    // Caught by the library's checks rather than by clap.
    env.run(&["enqueue", ""]).fails(2, &["kind is empty"]);
    env.run(&["enqueue", "a", "--queue", ""])
        .fails(2, &["queue name is empty"]);
}

#[test]
fn failures_exit_1_with_one_line_that_says_what_to_do() {
    let env = Env::new();
    // No file yet: only commands that add jobs create one.
    for args in [
        &["list"][..],
        &["show", "1"],
        &["stats"],
        &["retry", "1"],
        &["cancel", "1"],
        &["prune", "--older-than", "1d"],
        &["reap"],
        &["checkpoint"],
    ] {
        env.run(args)
            .fails(1, &["does not exist", "tickler init", "--db"]);
    }
    assert!(!env.db.exists());

    env.run(&["init"]).ok();
    env.run(&["show", "42"]).fails(1, &["no job with id 42"]);

    // A file written by a newer tickler.
    let newer = env.dir.path().join("newer.db");
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute_batch("PRAGMA user_version = 999;")
        .unwrap();
    let newer_arg = newer.to_str().unwrap();
    env.run(&["--db", newer_arg, "list"]).fails(
        1,
        &[
            &format!("database {newer_arg} was written by a newer tickler"),
            &format!(
                "schema 999, this build knows {}",
                tickler::Ops::schema_version()
            ),
            "upgrade tickler",
        ],
    );

    // Not a database at all.
    let junk = env.dir.path().join("notes.txt");
    std::fs::write(&junk, "dear diary, ".repeat(1000)).unwrap();
    std::fs::set_permissions(&junk, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let junk_arg = junk.to_str().unwrap();
    env.run(&["--db", junk_arg, "init"])
        .fails(1, &["is not a tickler database"]);
    env.run(&["--db", junk_arg, "enqueue", "a"])
        .fails(1, &["is not a tickler database"]);
    assert!(std::fs::read_to_string(&junk)
        .unwrap()
        .starts_with("dear diary"));
}

#[test]
fn files_the_binary_creates_are_owner_only() {
    let env = Env::new();
    env.enqueue(&["a"]);
    assert_eq!(mode(&env.db), 0o600);
    // SQLite gives the -wal and -shm files the mode of the database file.
    let queue = env.queue();
    queue.enqueue(NewJob::new("b")).unwrap();
    let mut wal = env.db.clone().into_os_string();
    wal.push("-wal");
    assert_eq!(mode(std::path::Path::new(&wal)), 0o600);
}

/// `tickler limit` sets, lists and deletes concurrency limits, `enqueue
/// --limit NAME:KEY --limit-weight N` names one, and `list --state blocked`
/// and `show` show who waits for which.
#[test]
fn limits_are_set_listed_and_deleted_and_jobs_name_them() {
    let env = Env::new();
    env.run(&["init"]).ok();
    env.run(&["limit", "set", "sync", "--per-key", "1", "--total", "5"])
        .ok();
    let first = env.enqueue(&["k", "--limit", "sync:account:42"]);
    let second = env.enqueue(&["k", "--limit", "sync:account:42", "--limit-weight", "1"]);
    let claimed = env
        .queue()
        .manual()
        .claim("default", "t", 10, std::time::Duration::from_secs(3600))
        .unwrap();
    assert_eq!(
        claimed.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        [first]
    );

    let out = env.run(&["limit", "list"]).ok();
    assert!(out.contains("1 per key, 5 in all"), "{out}");
    let key: Vec<&str> = out
        .lines()
        .find(|l| l.contains("account:42"))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        key,
        ["account:42", "1", "of", "1", "1", "1", "0", "0"],
        "{out}"
    );
    let json = env.run(&["limit", "list", "sync", "--json"]).ok();
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["max_total"], 5);
    assert_eq!(json["keys"][0]["blocked"], 1);
    let blocked = env.run(&["list", "--state", "blocked"]).ok();
    assert!(blocked.contains(&second.to_string()), "{blocked}");
    let show = env.run(&["show", &second.to_string()]).ok();
    assert!(show.contains("sync key account:42 (weight 1)"), "{show}");
    assert!(
        show.contains(&format!(
            "blocked by limit sync/account:42: 1 of 1 held by job {first} (worker t, lease until"
        )),
        "{show}"
    );
    let json = env.run(&["show", &second.to_string(), "--json"]).ok();
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["reason"]["reason"], "blocked");
    assert_eq!(json["reason"]["holders"][0]["job_id"], first.0);

    for args in [
        &["enqueue", "k", "--limit", "nameless"][..],
        &["limit", "set", "sync", "--per-key", "0"],
    ] {
        let out = env.command(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    env.run(&["limit", "delete", "sync"]).ok();
    assert_eq!(
        env.queue().get(second).unwrap().state,
        tickler::JobState::Pending
    );
    env.run(&["limit", "delete", "sync"]).ok();
}

/// `tickler limit set --rate COUNT/PERIOD --burst N` sets a rate, alone or
/// beside a concurrency limit; `limit list` shows it; a job over it is
/// deferred, and `show` says how often; bad rates are usage errors.
#[test]
fn rate_limits_are_set_listed_and_defer_jobs() {
    let env = Env::new();
    env.run(&["init"]).ok();
    env.run(&["limit", "set", "api", "--rate", "2/1h", "--burst", "1"])
        .ok();
    env.run(&["limit", "set", "both", "--per-key", "2", "--rate", "10/1s"])
        .ok();
    let jobs: Vec<_> = (0..4)
        .map(|_| env.enqueue(&["k", "--limit", "api:team-7"]))
        .collect();
    let claimed = env
        .queue()
        .manual()
        .claim("default", "t", 10, std::time::Duration::from_secs(3600))
        .unwrap();
    assert_eq!(claimed.len(), 2, "one start and a burst of one");

    let out = env.run(&["limit", "list"]).ok();
    assert!(out.contains("2 starts per 1h + 1 burst"), "{out}");
    assert!(out.contains("2 per key, 10 starts per 1s"), "{out}");
    let key: Vec<&str> = out
        .lines()
        .find(|l| l.contains("team-7"))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .collect();
    // Two held (no concurrency limit: the weight alone), two deferred.
    assert_eq!(key, ["team-7", "2", "2", "0", "2", "0"], "{out}");
    let json = env.run(&["limit", "list", "api", "--json"]).ok();
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["max_per_key"], serde_json::Value::Null);
    assert_eq!(json["rate"]["count"], 2);
    assert_eq!(json["rate"]["period"], 3_600_000);
    assert_eq!(json["rate"]["burst"], 1);
    let show = env.run(&["show", &jobs[3].to_string()]).ok();
    assert!(show.contains("deferred 1 time(s) by its rate"), "{show}");
    assert!(show.contains("(2nd in line)"), "{show}");
    assert!(show.contains("scheduled"), "{show}");

    for args in [
        &["limit", "set", "x", "--rate", "10"][..],
        &["limit", "set", "x", "--rate", "ten/1s"],
        &["limit", "set", "x", "--rate", "0/1s"],
        &["limit", "set", "x", "--burst", "3"],
        &["limit", "set", "x"],
    ] {
        let out = env.command(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}
