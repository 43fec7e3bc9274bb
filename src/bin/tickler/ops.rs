//! The operator commands: init, enqueue (one job), list, show, stats, retry,
//! cancel, prune, reap, checkpoint, queue pause/resume/list, limit
//! set/delete/list.

use crate::cli::{
    CancelArgs, EnqueueArgs, LimitCommand, ListArgs, PruneArgs, QueueCommand, RetryArgs, ShowArgs,
    StatsArgs, WaitArgs,
};
use crate::display::{self, Times};
use crate::error::CliError;
use serde_json::json;
use std::path::Path;
use tickler::{Job, JobFilter, JobId, JobState, NewJob, Queue, Waited};

/// Opens the queue file. Only commands that add to the queue may create
/// it; the others refuse a missing file, so a mistyped path is not
/// silently made into an empty queue.
pub fn open(db: &Path, create: bool) -> Result<Queue, CliError> {
    crate::files::check_path(db)?;
    if !create && !crate::files::is_url(db) && !db.exists() {
        return Err(CliError::failed(format!(
            "{} does not exist; create it with `tickler init`, or point --db (or TICKLER_DB) at your queue file",
            crate::files::shown(db)
        )));
    }
    Queue::open(db).map_err(|e| CliError::from_lib(e, db))
}

/// Opens the queue file for `enqueue`: a missing file is created only
/// with `--create`, so a mistyped path does not become a queue that no
/// worker watches.
pub fn open_to_add(db: &Path, create: bool) -> Result<Queue, CliError> {
    crate::files::check_path(db)?;
    if !create && !crate::files::is_url(db) && !db.exists() {
        return Err(CliError::failed(format!(
            "{} does not exist; create it with `tickler init` (or pass --create), or point --db (or TICKLER_DB) at your queue file",
            crate::files::shown(db)
        )));
    }
    open(db, true)
}

/// `tickler init`.
pub fn init(db: &Path, allow_shared_db: bool) -> Result<(), CliError> {
    crate::files::check_path(db)?;
    crate::files::check_private(db, allow_shared_db)?;
    if crate::files::is_url(db) {
        let queue = open(db, true)?;
        println!(
            "{}: schema created or migrated, up to date",
            queue.location()
        );
        return Ok(());
    }
    let before = tickler::Ops::file_schema_version(db).map_err(|e| CliError::from_lib(e, db))?;
    open(db, true)?;
    let now = tickler::Ops::schema_version();
    match before {
        None => println!("created {}: schema version {now}", crate::files::shown(db)),
        Some(0) => println!(
            "initialized {}: schema version {now}",
            crate::files::shown(db)
        ),
        Some(v) if v < now => {
            println!(
                "migrated {} from schema version {v} to {now}",
                crate::files::shown(db)
            )
        }
        Some(_) => println!(
            "{}: schema version {now}, up to date",
            crate::files::shown(db)
        ),
    }
    Ok(())
}

/// The options shared by `enqueue KIND` and each line of `enqueue --from`,
/// applied to a job.
pub fn apply_defaults(mut job: NewJob, args: &EnqueueArgs) -> NewJob {
    if let Some(queue) = &args.queue {
        job = job.queue(queue.clone());
    }
    if let Some(at) = args.at {
        job = job.run_at(at);
    }
    if let Some(delay) = args.delay {
        job = job.delay(delay);
    }
    if let Some(priority) = args.priority {
        job = job.priority(priority);
    }
    if let Some(max) = args.max_attempts {
        job = job.max_attempts(max);
    }
    if let Some(timeout) = args.timeout {
        job = job.timeout(timeout);
    }
    if let Some((name, key)) = &args.limit {
        job = job.limit(name.clone(), key.clone());
    }
    if let Some(weight) = args.limit_weight {
        job = job.limit_weight(weight);
    }
    job
}

/// `tickler enqueue KIND [PAYLOAD]`.
pub fn enqueue_one(db: &Path, args: &EnqueueArgs) -> Result<(), CliError> {
    let kind = args.kind.clone().unwrap_or_default();
    let mut job = apply_defaults(NewJob::new(kind), args);
    if let Some(payload) = &args.payload {
        job = job.payload(payload.clone());
    }
    if let Some(key) = &args.unique_key {
        job = job.unique_key(key.clone());
    }
    let queue = open_to_add(db, args.create)?;
    // Bad input on the command line is a usage error.
    queue
        .validate_job(&job)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let id = queue.enqueue(job).map_err(|e| CliError::from_lib(e, db))?;
    println!("{id}");
    Ok(())
}

/// `tickler limit …`.
pub fn limit(db: &Path, command: &LimitCommand) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let lib = |e| CliError::from_lib(e, db);
    match command {
        LimitCommand::Set(args) => {
            let mut limit = match (args.per_key, args.rate) {
                (Some(n), _) => tickler::Limit::per_key(n),
                (None, Some((count, period))) => tickler::Limit::rate(count, period),
                (None, None) => unreachable!("clap requires --per-key or --rate"),
            };
            if let (Some(_), Some((count, period))) = (args.per_key, args.rate) {
                limit = limit.with_rate(count, period);
            }
            if let Some(burst) = args.burst {
                limit = limit.burst(burst);
            }
            if let Some(total) = args.total {
                limit = limit.total(total);
            }
            queue.set_limit(&args.name, limit).map_err(lib)
        }
        LimitCommand::Delete(args) => {
            if !queue.delete_limit(&args.name).map_err(lib)? {
                eprintln!("no limit named {}", display::safe(&args.name));
            }
            Ok(())
        }
        LimitCommand::List(args) => {
            let limits = queue.limits().map_err(lib)?;
            let usage = queue.limit_usage(args.name.as_deref()).map_err(lib)?;
            let shown = |name: &str| args.name.as_deref().is_none_or(|n| n == name);
            if args.json {
                for l in limits.iter().filter(|l| shown(&l.name)) {
                    let keys: Vec<_> = usage.iter().filter(|u| u.name == l.name).collect();
                    println!(
                        "{}",
                        json!({
                            "name": l.name,
                            "max_per_key": l.limit.max_per_key,
                            "max_total": l.limit.max_total,
                            "rate": l.limit.rate,
                            "updated_at": display::rfc3339(l.updated_at),
                            "keys": keys,
                        })
                    );
                }
                return Ok(());
            }
            let mut rows = Vec::new();
            for l in limits.iter().filter(|l| shown(&l.name)) {
                rows.push(vec![
                    display::safe(&l.name).into_owned(),
                    "*".into(),
                    display::limit_settings(&l.limit),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
                for u in usage.iter().filter(|u| u.name == l.name) {
                    rows.push(vec![
                        String::new(),
                        display::safe(&u.key).into_owned(),
                        display::held(u.held, l.limit.max_per_key),
                        u.holders.to_string(),
                        u.blocked.to_string(),
                        u.deferred.to_string(),
                        u.pending.to_string(),
                    ]);
                }
            }
            // Jobs may name a limit that is not set: they run unlimited.
            for u in usage
                .iter()
                .filter(|u| !limits.iter().any(|l| l.name == u.name))
            {
                rows.push(vec![
                    display::safe(&u.name).into_owned(),
                    display::safe(&u.key).into_owned(),
                    display::LIMIT_NOT_SET.into(),
                    u.holders.to_string(),
                    u.blocked.to_string(),
                    u.deferred.to_string(),
                    u.pending.to_string(),
                ]);
            }
            if rows.is_empty() {
                eprintln!("no limits");
                return Ok(());
            }
            let header = [
                "LIMIT", "KEY", "HELD", "HOLDERS", "BLOCKED", "DEFERRED", "PENDING",
            ];
            let right = ["HOLDERS", "BLOCKED", "DEFERRED", "PENDING"];
            for line in display::table(&header, &rows, &right) {
                println!("{line}");
            }
            Ok(())
        }
    }
}

/// `tickler list`.
pub fn list(db: &Path, args: &ListArgs, times: Times) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let filter = JobFilter {
        state: args.state.map(Into::into),
        queue: args.queue.clone(),
        kind: args.kind.clone(),
        limit: args.limit as usize,
    };
    let jobs = match &args.unique_key {
        Some(key) => queue.ops().holding_unique_key(key).map(Vec::from_iter),
        None => queue.list(&filter),
    }
    .map_err(|e| CliError::from_lib(e, db))?;
    if args.json {
        for job in &jobs {
            println!("{}", display::job_json(job));
        }
        return Ok(());
    }
    if jobs.is_empty() {
        eprintln!("no jobs match");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            vec![
                job.id.to_string(),
                job.state.to_string(),
                display::safe(&job.queue).into_owned(),
                display::safe(&job.kind).into_owned(),
                job.priority.to_string(),
                format!("{}/{}", job.attempts, job.max_attempts),
                times.show(job.run_at),
                job.last_error
                    .as_deref()
                    .map_or_else(String::new, |e| display::short(e, 60)),
            ]
        })
        .collect();
    let header = [
        "ID",
        "STATE",
        "QUEUE",
        "KIND",
        "PRI",
        "ATTEMPTS",
        "RUN_AT",
        "LAST_ERROR",
    ];
    for line in display::table(&header, &rows, &["ID", "PRI", "ATTEMPTS"]) {
        println!("{line}");
    }
    if jobs.len() == args.limit as usize {
        eprintln!(
            "(showing the first {} jobs; raise --limit or filter to see more)",
            args.limit
        );
    }
    Ok(())
}

/// `tickler show ID`.
pub fn show(db: &Path, args: &ShowArgs, times: Times) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let explained = queue
        .explain(JobId(args.id))
        .map_err(|e| CliError::from_lib(e, db))?;
    let job = &explained.job;
    let parents = queue
        .parents(job.id)
        .map_err(|e| CliError::from_lib(e, db))?;
    let membership =
        crate::batch::membership(&queue, job).map_err(|e| CliError::from_lib(e, db))?;
    if args.json {
        let mut json = display::job_json(job);
        json["why"] = json!(explained.to_string());
        json["reason"] = serde_json::to_value(&explained.reason).unwrap_or_default();
        json["after"] = serde_json::to_value(&parents).unwrap_or_default();
        json["batch_role"] = json!(membership.as_ref().and_then(|m| m.role));
        println!("{json}");
        return Ok(());
    }
    let mut fields = display::job_fields(job, times);
    fields.insert(
        2,
        ("why", display::safe(&explained.to_string()).into_owned()),
    );
    if !parents.is_empty() {
        let after: Vec<String> = parents
            .iter()
            .map(|p| {
                format!(
                    "{} (if it fails: {}{})",
                    p.parent,
                    p.if_fails.as_str(),
                    if p.resolved { ", done" } else { "" }
                )
            })
            .collect();
        fields.insert(3, ("after", after.join(", ")));
    }
    if let Some(m) = membership {
        let shown = match m.role {
            Some("member") => format!("{} (member)", m.id),
            Some(role) => format!("{} ({role} callback)", m.id),
            None => format!("{} (the batch is gone: pruned)", m.id),
        };
        fields.insert(3, ("batch", shown));
    }
    display::print_fields(&fields);
    Ok(())
}

/// `tickler wait`: prints how the job stands, then exits with the code of
/// its outcome (see the command's help) rather than returning.
pub fn wait(db: &Path, args: &WaitArgs) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let id = JobId(args.id);
    let waited = queue
        .wait(id, args.timeout)
        .map_err(|e| CliError::from_lib(e, db))?;
    let (outcome, code) = match &waited {
        Waited::Succeeded(_) => ("succeeded", 0),
        Waited::Dead(_) => ("dead", 3),
        Waited::Cancelled(_) => ("cancelled", 4),
        Waited::NotFound => ("not_found", 5),
        _ => ("timed_out", 124),
    };
    if args.json {
        let job = waited.job().map(display::job_json);
        println!(
            "{}",
            json!({ "id": args.id, "outcome": outcome, "job": job })
        );
    } else {
        let line = match &waited {
            Waited::NotFound => format!("job {id} not found: never enqueued, or pruned"),
            Waited::Dead(job) => format!(
                "job {id} is dead: {}",
                display::safe(job.last_error.as_deref().unwrap_or("(no error recorded)"))
            ),
            Waited::TimedOut(job) => format!(
                "job {id} is still {} after {}",
                job.state,
                display::duration(args.timeout)
            ),
            // Its output, if the handler returned one: what a script
            // waits for (a path, a count).
            Waited::Succeeded(Job {
                output: Some(output),
                ..
            }) => format!("job {id} succeeded: {}", display::safe(&output.to_string())),
            _ => format!("job {id} {outcome}"),
        };
        println!("{line}");
    }
    std::process::exit(code);
}

/// `tickler stats`.
pub fn stats(db: &Path, args: &StatsArgs, times: Times) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let lib = |e| CliError::from_lib(e, db);
    let stats = queue.stats().map_err(lib)?;
    // The queue's clock: on PostgreSQL the server's, which the finish times
    // were written by.
    let now = queue.clock().now();
    let finished = queue
        .ops()
        .finished_since(now - chrono::Duration::minutes(1))
        .map_err(lib)?;
    // A WAL file is SQLite's alone: a server's own log is not ours to size.
    let wal = (!crate::files::is_url(db)).then(|| queue.ops().wal_bytes());
    let wait = stats
        .oldest_due
        .map(|due| (now - due).to_std().unwrap_or_default());
    let mut queues: Vec<&str> = stats.counts.keys().map(|(q, _)| q.as_str()).collect();
    queues.dedup();
    if args.json {
        let per_queue: serde_json::Map<String, serde_json::Value> = queues
            .iter()
            .map(|q| {
                let counts: serde_json::Map<String, serde_json::Value> = JobState::ALL
                    .iter()
                    .map(|s| {
                        let n = stats.counts.get(&((*q).to_owned(), *s)).copied();
                        (s.as_str().to_owned(), json!(n.unwrap_or(0)))
                    })
                    .collect();
                ((*q).to_owned(), serde_json::Value::Object(counts))
            })
            .collect();
        let out = json!({
            "queues": per_queue,
            "oldest_due": stats.oldest_due.map(display::rfc3339),
            "oldest_due_wait_ms": wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            "oldest_due_by_priority": stats
                .oldest_due_by_priority
                .iter()
                .map(|((queue, priority), due)| json!({
                    "queue": queue,
                    "priority": priority,
                    "oldest_due": display::rfc3339(*due),
                    "wait_ms": u64::try_from((now - *due).num_milliseconds()).unwrap_or(0),
                }))
                .collect::<Vec<_>>(),
            "finished_last_minute": finished,
            "wal_bytes": wal,
        });
        println!("{out}");
        return Ok(());
    }
    if queues.is_empty() {
        println!("no jobs");
    } else {
        let mut header = vec!["QUEUE"];
        let names: Vec<String> = JobState::ALL
            .iter()
            .map(|s| s.as_str().to_uppercase())
            .collect();
        header.extend(names.iter().map(String::as_str));
        let rows: Vec<Vec<String>> = queues
            .iter()
            .map(|q| {
                let mut row = vec![display::safe(q).into_owned()];
                for s in JobState::ALL {
                    let n = stats.counts.get(&((*q).to_owned(), s)).copied();
                    row.push(n.unwrap_or(0).to_string());
                }
                row
            })
            .collect();
        let right: Vec<&str> = header[1..].to_vec();
        for line in display::table(&header, &rows, &right) {
            println!("{line}");
        }
    }
    match (stats.oldest_due, wait) {
        (Some(due), Some(wait)) => println!(
            "oldest due job: waiting {} (due {})",
            display::duration(wait),
            times.show(due)
        ),
        _ => println!("oldest due job: none waiting"),
    }
    if stats.oldest_due_by_priority.len() > 1 {
        for ((queue, priority), due) in &stats.oldest_due_by_priority {
            let wait = (now - *due).to_std().unwrap_or_default();
            println!(
                "  queue {queue}, priority {priority}: waiting {}",
                display::duration(wait)
            );
        }
    }
    println!("finished in the last minute: {finished}");
    if let Some(wal) = wal {
        println!("WAL file: {}", display::bytes(wal));
    }
    Ok(())
}

/// `tickler retry ID` and `tickler retry --dead [--queue Q]`.
pub fn retry(db: &Path, args: &RetryArgs) -> Result<(), CliError> {
    let queue = open(db, false)?;
    match args.id {
        Some(id) => {
            queue
                .retry(JobId(id))
                .map_err(|e| CliError::from_lib(e, db))?;
            println!("job {id} is pending again");
        }
        None => {
            let (retried, left) = queue
                .retry_dead(args.queue.as_deref())
                .map_err(|e| CliError::from_lib(e, db))?;
            println!("retried {retried} dead job(s)");
            if left > 0 {
                eprintln!(
                    "{left} dead job(s) stay dead: their unique_key is held by an unfinished job (`tickler retry ID` says which)"
                );
            }
        }
    }
    Ok(())
}

/// `tickler cancel ID…`: cancels each; fails (exit 1) if any could not be.
pub fn cancel(db: &Path, args: &CancelArgs) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let mut first_error = None;
    for id in &args.ids {
        match queue.cancel(JobId(*id)) {
            Ok(()) => println!("job {id} cancelled"),
            Err(e) => {
                let e = CliError::from_lib(e, db);
                if args.ids.len() > 1 {
                    eprintln!("tickler: {e}");
                }
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if args.ids.len() > 1 => Err(CliError::failed(format!(
            "not every job was cancelled (first failure: {e})"
        ))),
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `tickler prune --older-than AGE [--state S]`.
pub fn prune(db: &Path, args: &PruneArgs) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let age = chrono::Duration::from_std(args.older_than)
        .map_err(|_| CliError::Usage("--older-than is too long".into()))?;
    // The queue's clock (the server's on PostgreSQL), as the finish times
    // were written by it.
    let cutoff = queue
        .clock()
        .now()
        .checked_sub_signed(age)
        .ok_or_else(|| CliError::Usage("--older-than is too long".into()))?;
    let deleted = match args.state {
        Some(state) => queue.prune_state(cutoff, state.into()),
        None => queue.prune(cutoff),
    }
    .map_err(|e| CliError::from_lib(e, db))?;
    println!(
        "pruned {deleted} job(s) finished more than {} ago",
        display::duration(args.older_than)
    );
    Ok(())
}

/// `tickler reap`.
pub fn reap(db: &Path) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let n = queue
        .manual()
        .reap_at(queue.clock().now())
        .map_err(|e| CliError::from_lib(e, db))?;
    println!("took back {n} job(s) with expired leases");
    Ok(())
}

/// `tickler checkpoint`.
pub fn checkpoint(db: &Path) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let c = queue
        .ops()
        .checkpoint()
        .map_err(|e| CliError::from_lib(e, db))?;
    println!(
        "WAL file: {} before, {} after",
        display::bytes(c.wal_bytes_before),
        display::bytes(c.wal_bytes_after)
    );
    if !c.complete {
        eprintln!(
            "the checkpoint did not finish: another connection is reading or writing; run it again later"
        );
    }
    Ok(())
}

/// `tickler queue pause|resume|list`.
pub fn queue(db: &Path, command: &QueueCommand) -> Result<(), CliError> {
    let queue = open(db, false)?;
    let lib = |e| CliError::from_lib(e, db);
    match command {
        QueueCommand::Pause(args) => {
            let name = display::safe(&args.name);
            let was_paused = queue.paused_queues().map_err(lib)?.contains(&args.name);
            queue.pause_queue(&args.name).map_err(lib)?;
            let counts = QueueCounts::read(&queue, &args.name).map_err(lib)?;
            // Pausing before a queue's first job is legitimate (a pool that
            // must not start on it yet), but so is a typo: say which queues
            // hold jobs and let the operator judge.
            if counts.total == 0 {
                eprintln!(
                    "tickler: note: queue {name} has no jobs yet; known queues: {}",
                    counts.known()
                );
            }
            let verb = if was_paused {
                format!("queue {name} was already paused")
            } else {
                format!("paused queue {name}")
            };
            println!(
                "{verb}: {} pending job(s) wait until `tickler queue resume {name}`; {} running job(s) finish",
                counts.pending, counts.running
            );
            Ok(())
        }
        QueueCommand::Resume(args) => {
            let name = display::safe(&args.name);
            let paused = queue.paused_queues().map_err(lib)?;
            queue.resume_queue(&args.name).map_err(lib)?;
            if paused.contains(&args.name) {
                let counts = QueueCounts::read(&queue, &args.name).map_err(lib)?;
                println!(
                    "resumed queue {name}: {} pending job(s) can be claimed again",
                    counts.pending
                );
            } else {
                let paused: Vec<String> = paused
                    .iter()
                    .map(|q| display::safe(q).into_owned())
                    .collect();
                println!(
                    "queue {name} was not paused; nothing changed (paused queues: {})",
                    if paused.is_empty() {
                        "none".to_owned()
                    } else {
                        paused.join(", ")
                    }
                );
            }
            Ok(())
        }
        QueueCommand::List => {
            for name in queue.paused_queues().map_err(lib)? {
                println!("{}", display::safe(&name));
            }
            Ok(())
        }
    }
}

/// What `queue pause` and `queue resume` report about one queue.
struct QueueCounts {
    pending: u64,
    running: u64,
    /// Jobs of the queue in any state.
    total: u64,
    /// Every queue that holds jobs, in byte order.
    queues: Vec<String>,
}

impl QueueCounts {
    fn read(queue: &Queue, name: &str) -> tickler::Result<QueueCounts> {
        let stats = queue.stats()?;
        let count = |state: JobState| {
            stats
                .counts
                .get(&(name.to_owned(), state))
                .copied()
                .unwrap_or(0)
        };
        let mut queues: Vec<String> = stats.counts.keys().map(|(q, _)| q.clone()).collect();
        queues.dedup();
        Ok(QueueCounts {
            pending: count(JobState::Pending),
            running: count(JobState::Running),
            total: JobState::ALL.into_iter().map(count).sum(),
            queues,
        })
    }

    /// The queues that hold jobs, for a message.
    fn known(&self) -> String {
        if self.queues.is_empty() {
            return "none".to_owned();
        }
        self.queues
            .iter()
            .map(|q| display::safe(q).into_owned())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
