//! The command line, as clap sees it. Doc comments here are the `--help` text.

use crate::display::parse_duration;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tickler::JobState;

/// Operate a tickler queue file from the shell, and run shell-command jobs
/// as a durable at/cron.
#[derive(Debug, Parser)]
#[command(
    name = "tickler",
    version,
    after_help = "Examples:
  tickler init
  tickler enqueue shell '{\"argv\": [\"echo\", \"hello\"]}' --in 10m
  tickler work --threads 2
  tickler list --state dead
  tickler retry --dead

Exit codes: 0 success, 1 the operation failed, 2 usage error."
)]
pub struct Cli {
    /// The queue file, or a postgres:// or mysql:// URL (a tickler built
    /// with `cargo install --path . --features postgres,mysql`).
    #[arg(
        long,
        global = true,
        env = "TICKLER_DB",
        default_value = "./tickler.db",
        value_name = "PATH"
    )]
    pub db: PathBuf,

    /// Show times in UTC instead of local time.
    #[arg(long, global = true)]
    pub utc: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the queue file, or migrate it to this build's schema, and print
    /// the schema version.
    #[command(after_help = "Example:\n  tickler --db /var/lib/tickler/jobs.db init")]
    Init(InitArgs),

    /// Enqueue one job and print its id, or many from an NDJSON file.
    #[command(after_help = ENQUEUE_HELP)]
    Enqueue(EnqueueArgs),

    /// List jobs as a table, or as JSON (one object per line).
    #[command(
        after_help = "Examples:\n  tickler list --state dead --queue mail\n  tickler list --kind shell --limit 20 --json"
    )]
    List(ListArgs),

    /// Show every field of one job, including its last error and attempts.
    #[command(after_help = "Example:\n  tickler show 42")]
    Show(ShowArgs),

    /// Show a batch: its description, times, counters (members ended,
    /// remaining, succeeded, dead, cancelled) and callbacks with their
    /// states.
    #[command(after_help = "Examples:\n  tickler batch 7\n  tickler batch 7 --json")]
    Batch(BatchArgs),

    /// Wait for a job to end; the exit code says how: 0 succeeded, 3 dead,
    /// 4 cancelled, 5 not found (never enqueued, or pruned), 124 still
    /// unfinished when the timeout ran out (1 and 2 are errors, as for
    /// every command).
    #[command(
        after_help = "Examples:\n  tickler wait 42\n  tickler wait 42 --timeout 10m && open export.mp4"
    )]
    Wait(WaitArgs),

    /// Counts per queue and state, the oldest due job's wait, jobs finished
    /// in the last minute, and (SQLite) the size of the WAL file.
    #[command(after_help = "Example:\n  tickler stats --utc")]
    Stats(StatsArgs),

    /// Make a dead or cancelled job pending again with fresh attempts, or all
    /// dead jobs with --dead.
    #[command(after_help = "Examples:\n  tickler retry 42\n  tickler retry --dead --queue mail")]
    Retry(RetryArgs),

    /// Cancel jobs that have not finished.
    #[command(after_help = "Example:\n  tickler cancel 42 43")]
    Cancel(CancelArgs),

    /// Delete finished jobs (succeeded, dead, cancelled) older than a given age.
    #[command(after_help = "Example:\n  tickler prune --older-than 7d --state succeeded")]
    Prune(PruneArgs),

    /// Take back jobs whose lease ran out (their worker died or stalled).
    #[command(after_help = "Example:\n  tickler reap")]
    Reap,

    /// Recurring jobs: cron expressions in a time zone.
    #[command(subcommand, after_help = SCHEDULE_HELP)]
    Schedule(ScheduleCommand),

    /// Serve Prometheus metrics (/metrics) and a dashboard (/) over HTTP.
    #[cfg(feature = "serve")]
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),

    /// Pause or resume a queue: no process claims jobs of a paused queue.
    #[command(subcommand, after_help = QUEUE_HELP)]
    Queue(QueueCommand),

    /// Concurrency limits shared by every process: set, delete, list them
    /// with their holders and blocked jobs per key.
    #[command(subcommand, after_help = LIMIT_HELP)]
    Limit(LimitCommand),

    /// Run a worker pool on the file, executing jobs of kind `shell`, until
    /// SIGINT or SIGTERM.
    #[command(after_help = WORK_HELP)]
    Work(WorkArgs),

    /// Copy the WAL into the database file and truncate it; report the WAL
    /// size before and after.
    #[command(after_help = "Example:\n  tickler checkpoint")]
    Checkpoint,

    /// Internal: what `work` runs each shell command under, to stop the
    /// command's whole process tree with its job (see supervise.rs).
    #[command(name = crate::supervise::SUBCOMMAND, hide = true)]
    Supervise(SuperviseArgs),
}

/// `__supervise` arguments.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub argv: Vec<std::ffi::OsString>,
}

const ENQUEUE_HELP: &str = "Examples:
  tickler enqueue send_email '{\"to\": \"ada@example.com\"}' --queue mail --max-attempts 5
  tickler enqueue shell '{\"argv\": [\"backup.sh\", \"--full\"], \"timeout\": \"1h\"}' --at 2026-05-01T02:00:00+02:00
  tickler enqueue --from jobs.ndjson

An NDJSON line is one job:
  {\"kind\": \"shell\", \"payload\": {\"argv\": [\"true\"]}, \"queue\": \"default\", \"priority\": 0,
   \"run_at\": \"2026-05-01T02:00:00Z\", \"in\": \"10m\", \"max_attempts\": 5,
   \"unique_key\": \"k1\", \"timeout\": \"30s\"}
Only \"kind\" is required (or give KIND for lines without one); the options given on
the command line are the defaults. Lines are written in transactions of --batch-size
lines: a bad line stops the import, nothing from its batch is written, and earlier
batches stay.";

const WORK_HELP: &str = "Example:
  tickler work --queue default --queue mail --threads 4

The `shell` payload: {\"argv\": [\"cmd\", \"arg\"], \"cwd\": \"/some/dir\", \"env\": {\"K\": \"V\"},
\"timeout\": \"30s\"}. The command runs without a shell, stdin closed, stdout passed
through; TICKLER_JOB_ID, TICKLER_ATTEMPT and TICKLER_RUN_TOKEN are set for it. Exit 0
means succeeded; another exit code fails the attempt (retried after a backoff, dead
when attempts are used up) with the exit code and the last 4 KiB of stderr as the
error; past its timeout the command is stopped and the attempt fails. Jobs of other
kinds are left for other workers. `work` also fires the due ticks of every schedule
in the file (`tickler schedule add`), whatever their kind.

First SIGINT/SIGTERM: stop claiming and wait up to --grace for running commands.
Second: kill them now; they run again later without losing an attempt.

A command is stopped with every process it started, and its job's outcome waits
until they are all gone: SIGTERM, then SIGKILL 2s later, past its timeout or the
--grace; SIGKILL at once on `tickler cancel`, on a second signal, or if `work` dies
(each command runs under `tickler __supervise`). What a command leaves running when
it exits is stopped too. Linux only for processes that left the command's process
group.

Whoever can write the queue file can run commands as you, so `work` refuses a file
(or folder) that other users can write, unless --allow-shared-db.";

const SCHEDULE_HELP: &str = "Examples:
  tickler schedule add nightly-backup '30 2 * * *' --tz Europe/Berlin shell '{\"argv\": [\"backup.sh\"]}'
  tickler schedule next '*/15 * * * *' -n 5 --tz America/New_York
  tickler schedule pause nightly-backup";

/// `init` options.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Use a queue file that other users can read (they can read every
    /// job's payload), with a warning instead of refusing.
    #[arg(long)]
    pub allow_shared_db: bool,
}

/// `enqueue` options.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The job's kind: the name of the handler that runs it (`shell` for
    /// `tickler work`). With --from, the kind of lines that name none.
    #[arg(required_unless_present = "from")]
    pub kind: Option<String>,

    /// The payload, as JSON (default null).
    #[arg(value_parser = parse_json, conflicts_with = "from")]
    pub payload: Option<serde_json::Value>,

    /// Enqueue one job per line of this NDJSON file (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,

    /// Lines per transaction with --from.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "from")]
    pub batch_size: u32,

    /// The queue.
    #[arg(long, short = 'q')]
    pub queue: Option<String>,

    /// Due time, RFC 3339 (2026-05-01T09:30:00+02:00).
    #[arg(long, value_parser = parse_time, conflicts_with = "delay")]
    pub at: Option<DateTime<Utc>>,

    /// Due after this long (10s, 5m, 2h, 1d).
    #[arg(long = "in", value_name = "DURATION", value_parser = parse_delay, allow_hyphen_values = true)]
    pub delay: Option<Duration>,

    /// Higher runs first (default 0).
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,

    /// Claims allowed before the job is dead (default 25).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,

    /// While a job with this key is unfinished, enqueueing another one with
    /// it only prints the existing job's id.
    #[arg(long, conflicts_with = "from")]
    pub unique_key: Option<String>,

    /// How long one run may take (30s, 5m).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Run under the concurrency limit NAME as one holder of KEY
    /// (`--limit sync:account-42`; see `tickler limit`).
    #[arg(long, value_name = "NAME:KEY", value_parser = parse_limit_slot)]
    pub limit: Option<(String, String)>,

    /// Slots of its limit the job takes while it runs (default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "limit")]
    pub limit_weight: Option<u32>,

    /// Create the queue file if it does not exist (otherwise a mistyped
    /// path is refused rather than made into a queue no worker watches).
    #[arg(long)]
    pub create: bool,
}

/// A job state, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Waiting for its due time.
    Scheduled,
    /// Due, waiting for a worker.
    Pending,
    /// Due, waiting for a slot of its concurrency limit.
    Blocked,
    /// Held by a worker.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Attempts used up, or failed for good.
    Dead,
    /// Cancelled.
    Cancelled,
}

impl From<StateArg> for JobState {
    fn from(s: StateArg) -> JobState {
        match s {
            StateArg::Scheduled => JobState::Scheduled,
            StateArg::Pending => JobState::Pending,
            StateArg::Blocked => JobState::Blocked,
            StateArg::Running => JobState::Running,
            StateArg::Succeeded => JobState::Succeeded,
            StateArg::Dead => JobState::Dead,
            StateArg::Cancelled => JobState::Cancelled,
        }
    }
}

/// A finished state, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FinishedArg {
    /// Finished successfully.
    Succeeded,
    /// Attempts used up, or failed for good.
    Dead,
    /// Cancelled.
    Cancelled,
}

impl From<FinishedArg> for JobState {
    fn from(s: FinishedArg) -> JobState {
        match s {
            FinishedArg::Succeeded => JobState::Succeeded,
            FinishedArg::Dead => JobState::Dead,
            FinishedArg::Cancelled => JobState::Cancelled,
        }
    }
}

/// `list` options.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only jobs in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only jobs of this queue.
    #[arg(long, short = 'q')]
    pub queue: Option<String>,
    /// Only jobs of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Only the unfinished job (scheduled, pending, blocked or running)
    /// that holds this unique key, found through its index.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["state", "queue", "kind"])]
    pub unique_key: Option<String>,
    /// At most this many jobs, oldest first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// One JSON object per line (times in RFC 3339, UTC).
    #[arg(long)]
    pub json: bool,
}

/// `show` options.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The job's id.
    pub id: i64,
    /// As one JSON object (times in RFC 3339, UTC).
    #[arg(long)]
    pub json: bool,
}

/// `batch` options.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// The batch's id.
    pub id: i64,
    /// As one JSON object (times in RFC 3339, UTC).
    #[arg(long)]
    pub json: bool,
}

/// `wait` options.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The job's id.
    pub id: i64,
    /// How long to wait at most (default 30s).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// As one JSON object: `outcome` and the job (times in RFC 3339, UTC).
    #[arg(long)]
    pub json: bool,
}

/// `stats` options.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// As one JSON object (`wal_bytes` is null on a database server).
    #[arg(long)]
    pub json: bool,
}

/// `retry` options.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The job to retry (dead or cancelled).
    #[arg(required_unless_present = "dead", conflicts_with = "dead")]
    pub id: Option<i64>,
    /// Retry every dead job (of --queue, if given).
    #[arg(long)]
    pub dead: bool,
    /// With --dead: only this queue.
    #[arg(long, short = 'q', requires = "dead")]
    pub queue: Option<String>,
}

/// `cancel` options.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The jobs to cancel.
    #[arg(required = true)]
    pub ids: Vec<i64>,
}

/// `prune` options.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Delete jobs that finished longer ago than this (7d, 12h).
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Duration,
    /// Only jobs in this finished state (default: all three).
    #[arg(long, value_enum)]
    pub state: Option<FinishedArg>,
}

/// `work` options.
#[derive(Debug, Args)]
pub struct WorkArgs {
    /// Serve this queue (repeat for several; default `default`).
    #[arg(long, short = 'q')]
    pub queue: Vec<String>,
    /// Commands run at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Lease per claim, renewed by heartbeats every third of it; a worker
    /// that dies loses its jobs this long after its last heartbeat.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// On the first SIGINT/SIGTERM, how long to wait for running commands.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Upper bound of the first retry delay after a failed attempt; it
    /// doubles with each attempt (with random jitter) up to --backoff-cap.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub backoff: Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub backoff_cap: Duration,
    /// How often to take back jobs whose lease ran out.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub reap_interval: Duration,
    /// Exit once the served queues hold no unfinished `shell` job.
    #[arg(long)]
    pub drain: bool,
    /// Print nothing per job.
    #[arg(long)]
    pub quiet: bool,
    /// Use a queue file that other users can read (they can read every
    /// job's payload) or write (they could run commands as you), with a
    /// warning instead of refusing.
    #[arg(long)]
    pub allow_shared_db: bool,
}

#[cfg(feature = "serve")]
const SERVE_HELP: &str = "Examples:
  tickler serve                       # http://127.0.0.1:9187/
  tickler serve --listen 0.0.0.0:9187 --allow-remote --token \"$(openssl rand -hex 16)\"

/metrics is the Prometheus text format: jobs per queue and state, the oldest due job's
lateness per queue, dead jobs, paused queues, schedules' next ticks. / is a dashboard
with counts, jobs per state with their errors, retry and cancel buttons, schedules and
pause/resume of queues, marks on what needs attention (dead jobs, a queue whose oldest
due job waited over --wait-threshold, a paused queue with due work, a schedule that
missed its tick by over --missed-grace), bulk actions with a confirm step (retry or
delete the dead jobs of a queue or kind, pause or resume a schedule) and an opt-in
live refresh (/?live=1). With --token, requests need `Authorization: Bearer TOKEN`
(or open /?token=TOKEN once in a browser). Without it, only requests that name the
server by an IP address or localhost are answered.";

/// `tickler serve`.
#[cfg(feature = "serve")]
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:9187", value_name = "IP:PORT")]
    pub listen: String,
    /// Allow a non-loopback --listen address (needs --token).
    #[arg(long)]
    pub allow_remote: bool,
    /// A secret every request must carry (visible ASCII without `"` `,`
    /// `;` `\`; at least 16 characters beyond loopback).
    #[arg(long, env = "TICKLER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Show no job's payload on the job pages (for queues whose payloads
    /// carry secrets).
    #[arg(long)]
    pub hide_payload: bool,
    /// Show the value of this JSON object key, at any depth of a payload
    /// or output and in any case of ASCII letters (`password` hides
    /// `Password` too), as "[hidden]" (repeat for more keys).
    #[arg(long, value_name = "KEY")]
    pub hide_payload_key: Vec<String>,
    /// A queue whose oldest due job has waited longer than this is marked
    /// as needing attention (30s, 5m).
    #[arg(long, value_parser = parse_duration, default_value = "5m", value_name = "DURATION")]
    pub wait_threshold: Duration,
    /// An enabled schedule whose next tick is this far in the past is
    /// marked as having missed it (30s, 5m).
    #[arg(long, value_parser = parse_duration, default_value = "1m", value_name = "DURATION")]
    pub missed_grace: Duration,
}

const QUEUE_HELP: &str = "Examples:
  tickler queue pause mail
  tickler queue list
  tickler queue resume mail

A pause is stored in the file and holds for every process: their claims skip the
queue until it is resumed. Jobs can still be enqueued into it; jobs already running
finish.";

/// `limit` subcommands.
#[derive(Debug, Subcommand)]
pub enum LimitCommand {
    /// Set a limit, or change it (a raise lets blocked jobs run at once; a
    /// lowering lets current holders finish).
    Set(LimitSetArgs),
    /// Delete a limit: its jobs run unlimited, the blocked ones at once.
    Delete(LimitNameArgs),
    /// List the limits and, per key with unfinished jobs, the weight held,
    /// the holders, the blocked, the deferred (over a rate) and the pending
    /// jobs.
    List(LimitListArgs),
}

/// `tickler limit set`.
#[derive(Debug, Args)]
pub struct LimitSetArgs {
    /// The limit's name.
    pub name: String,
    /// Most slots taken at once per key.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), required_unless_present = "rate")]
    pub per_key: Option<u32>,
    /// Most slots taken at once over all keys.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub total: Option<u32>,
    /// Most starts per period per key, as COUNT/PERIOD (100/1m, 10/1s).
    #[arg(long, value_name = "COUNT/PERIOD", value_parser = parse_rate)]
    pub rate: Option<(u32, Duration)>,
    /// Starts beyond the rate a quiet key may make at once.
    #[arg(long, requires = "rate")]
    pub burst: Option<u32>,
}

/// `--rate COUNT/PERIOD`.
fn parse_rate(s: &str) -> Result<(u32, Duration), String> {
    let (count, period) = s
        .split_once('/')
        .ok_or_else(|| format!("{s}: write a rate as COUNT/PERIOD, like 100/1m or 10/1s"))?;
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|e| format!("{s}: the count {count:?} is not a whole number ({e})"))?;
    if count == 0 {
        return Err(format!(
            "{s}: a rate's count is at least 1 (delete the limit to stop limiting)"
        ));
    }
    Ok((count, parse_duration(period.trim())?))
}

/// A limit's name.
#[derive(Debug, Args)]
pub struct LimitNameArgs {
    /// The limit's name.
    pub name: String,
}

/// `tickler limit list`.
#[derive(Debug, Args)]
pub struct LimitListArgs {
    /// Only this limit.
    pub name: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// `NAME:KEY` of `--limit` (the key may contain `:`).
fn parse_limit_slot(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((name, key)) if !name.is_empty() => Ok((name.to_owned(), key.to_owned())),
        _ => Err(format!(
            "expected NAME:KEY (as in sync:account-42), got {s:?}"
        )),
    }
}

const LIMIT_HELP: &str = "Examples:
  tickler limit set sync --per-key 1
  tickler limit set transcode --per-key 2 --total 4
  tickler enqueue shell '{\"argv\": [\"sync.sh\", \"42\"]}' --limit sync:account-42
  tickler limit list
  tickler limit delete sync

A limit is stored in the file and holds for every process: the jobs of a key that
hold a lease never take more than --per-key slots together (and all keys no more
than --total). A job that does not fit waits as `blocked`, using no attempt, until
a slot is free.";

/// `queue` subcommands.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Stop every process from claiming jobs of this queue until resumed.
    Pause(QueueNameArgs),
    /// Let the queue's jobs be claimed again (wakes waiting workers).
    Resume(QueueNameArgs),
    /// Print the paused queues, one per line.
    List,
}

/// A queue's name.
#[derive(Debug, Args)]
pub struct QueueNameArgs {
    /// The queue.
    pub name: String,
}

/// `schedule` subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create or replace a schedule.
    #[command(
        after_help = "Example:\n  tickler schedule add nightly-backup '30 2 * * *' --tz Europe/Berlin shell '{\"argv\": [\"backup.sh\"]}'"
    )]
    Add(Box<ScheduleAddArgs>),
    /// List schedules with their next tick.
    #[command(after_help = "Example:\n  tickler schedule list")]
    List(ScheduleListArgs),
    /// Delete a schedule (jobs it already enqueued stay).
    #[command(
        visible_alias = "delete",
        after_help = "Example:\n  tickler schedule rm nightly-backup"
    )]
    Rm(ScheduleNameArgs),
    /// Stop a schedule from firing until resumed.
    #[command(after_help = "Example:\n  tickler schedule pause nightly-backup")]
    Pause(ScheduleNameArgs),
    /// Let a paused schedule fire again, from its next tick on.
    #[command(after_help = "Example:\n  tickler schedule resume nightly-backup")]
    Resume(ScheduleNameArgs),
    /// Preview the next fire times of a schedule or of a cron expression
    /// (nothing is stored).
    #[command(
        after_help = "Examples:\n  tickler schedule next nightly-backup\n  tickler schedule next '0 9 * * mon-fri' -n 10 --tz Europe/Berlin"
    )]
    Next(ScheduleNextArgs),
}

/// `schedule add` options.
#[derive(Debug, Args)]
pub struct ScheduleAddArgs {
    /// The schedule's name (unique in the file).
    pub name: String,
    /// Cron expression: 5 fields (minute hour day month weekday), or 6 with seconds first.
    pub cron: String,
    /// The kind of the jobs it enqueues.
    pub kind: String,
    /// Their payload, as JSON (default null).
    #[arg(value_parser = parse_json)]
    pub payload: Option<serde_json::Value>,
    /// IANA time zone the expression is read in (default UTC).
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Queue of the jobs.
    #[arg(long, short = 'q')]
    pub queue: Option<String>,
    /// Their priority.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Their max_attempts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,
    /// Their per-run timeout.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// What to do with ticks missed while no scheduler ran (default
    /// fire-once: one catch-up job for the latest missed tick).
    #[arg(long, value_enum)]
    pub misfire: Option<MisfireArg>,
    /// With --misfire fire-all: at most this many catch-up ticks.
    #[arg(long)]
    pub misfire_limit: Option<u32>,
    /// How late a tick may be found and still count as on time rather than
    /// missed (default 60s, at most 1h).
    #[arg(long, value_parser = parse_duration)]
    pub misfire_grace: Option<Duration>,
    /// What a tick does while an earlier run of this schedule is not
    /// finished (default forbid: skip the tick, so a nightly backup never
    /// runs twice at once).
    #[arg(long, value_enum)]
    pub overlap: Option<OverlapArg>,
    /// Each job runs under the concurrency limit NAME as one holder of KEY
    /// (`--limit sync:account-42`; see `tickler limit`).
    #[arg(long, value_name = "NAME:KEY", value_parser = parse_limit_slot)]
    pub limit: Option<(String, String)>,
    /// Slots of its limit each job takes while it runs (default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "limit")]
    pub limit_weight: Option<u32>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
}

/// An overlap policy, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverlapArg {
    /// Skip the tick while an earlier run is pending, scheduled or running (counted, logged).
    Forbid,
    /// Cancel the earlier run (its outcome is refused) and start the new one.
    Replace,
    /// Fire every tick; runs may overlap.
    Allow,
}

/// A misfire policy, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MisfireArg {
    /// Fire nothing for missed ticks.
    Skip,
    /// One catch-up tick, then continue.
    FireOnce,
    /// Every missed tick, up to --misfire-limit.
    FireAll,
}

/// `schedule list` options.
#[derive(Debug, Args)]
pub struct ScheduleListArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// A schedule's name.
#[derive(Debug, Args)]
pub struct ScheduleNameArgs {
    /// The schedule's name.
    pub name: String,
}

/// `schedule next` options.
#[derive(Debug, Args)]
pub struct ScheduleNextArgs {
    /// A schedule's name, or a cron expression.
    pub name_or_cron: String,
    /// How many fire times (printed as they are computed, so any number
    /// is fine; stop early with Ctrl-C or a closed pipe).
    #[arg(short = 'n', long = "count", default_value_t = 10)]
    pub count: u64,
    /// Time zone for a cron expression (default UTC; a schedule uses its own).
    #[arg(long)]
    pub tz: Option<String>,
}

/// `--in`: a duration from now; a negative one is explained (clap would
/// take `-5s` for an unknown flag).
fn parse_delay(s: &str) -> Result<Duration, String> {
    if let Some(rest) = s.strip_prefix('-') {
        return Err(format!(
            "-{rest} is negative: --in takes a time from now (10s, 5m, 2h); use --in 0s to make the job due now, or --at for an exact time"
        ));
    }
    parse_duration(s)
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("{e}; give an RFC 3339 time such as 2026-05-01T09:30:00+02:00 or 2026-05-01T07:30:00Z")
        })
}

fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| {
        format!(
            "not valid JSON ({e}); quote it for the shell, e.g. '{{\"to\": \"ada@example.com\"}}'"
        )
    })
}
