//! `tickler schedule …`: recurring jobs from cron expressions in a time
//! zone. `tickler work` fires them (its worker pool runs a scheduler).

use crate::cli::{
    MisfireArg, OverlapArg, ScheduleAddArgs, ScheduleCommand, ScheduleListArgs, ScheduleNameArgs,
    ScheduleNextArgs,
};
use crate::display::{self, Times};
use crate::error::CliError;
use crate::ops;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use tickler::{Error, MisfirePolicy, NewSchedule, OverlapPolicy, Queue, Schedule, UpcomingTicks};

/// Runs one `schedule` subcommand.
pub fn run(db: &Path, command: &ScheduleCommand, times: Times) -> Result<(), CliError> {
    match command {
        ScheduleCommand::Add(args) => add(db, args, times),
        ScheduleCommand::List(args) => list(db, args, times),
        ScheduleCommand::Rm(args) => rm(db, args),
        ScheduleCommand::Pause(args) => pause(db, args),
        ScheduleCommand::Resume(args) => resume(db, args, times),
        ScheduleCommand::Next(args) => next(db, args, times),
    }
}

/// Bad input from the command line (an expression, a zone, a template) is
/// a usage error; anything else failed.
fn input_error(e: Error, db: &Path) -> CliError {
    match e {
        Error::InvalidSchedule { .. }
        | Error::UnknownTimeZone { .. }
        | Error::InvalidArgument(_)
        | Error::EmptyKind
        | Error::EmptyQueue
        | Error::InvalidMaxAttempts
        | Error::PayloadTooLarge { .. } => CliError::Usage(e.to_string()),
        other => CliError::from_lib(other, db),
    }
}

fn add(db: &Path, args: &ScheduleAddArgs, times: Times) -> Result<(), CliError> {
    let misfire =
        match (args.misfire, args.misfire_limit) {
            (Some(MisfireArg::FireAll), Some(max)) => MisfirePolicy::FireAll { max },
            (Some(MisfireArg::FireAll), None) => return Err(CliError::Usage(
                "--misfire fire-all needs --misfire-limit N: at most how many missed ticks to fire"
                    .into(),
            )),
            (_, Some(_)) => {
                return Err(CliError::Usage(
                    "--misfire-limit goes with --misfire fire-all".into(),
                ))
            }
            (Some(MisfireArg::Skip), None) => MisfirePolicy::Skip,
            (Some(MisfireArg::FireOnce) | None, None) => MisfirePolicy::FireOnce,
        };
    let mut spec = NewSchedule::new(&args.name, &args.cron, &args.kind)
        .time_zone(&args.tz)
        .misfire(misfire);
    if let Some(payload) = &args.payload {
        spec = spec.payload(payload.clone());
    }
    if let Some(queue) = &args.queue {
        spec = spec.queue(queue.clone());
    }
    if let Some(priority) = args.priority {
        spec = spec.priority(priority);
    }
    if let Some(max) = args.max_attempts {
        spec = spec.max_attempts(max);
    }
    if let Some(timeout) = args.timeout {
        spec = spec.timeout(timeout);
    }
    if let Some(grace) = args.misfire_grace {
        spec = spec.misfire_grace(grace);
    }
    if let Some((name, key)) = &args.limit {
        spec = spec.limit(name.clone(), key.clone());
    }
    if let Some(weight) = args.limit_weight {
        spec = spec.limit_weight(weight);
    }
    if let Some(overlap) = args.overlap {
        spec = spec.overlap(match overlap {
            OverlapArg::Forbid => OverlapPolicy::Forbid,
            OverlapArg::Replace => OverlapPolicy::Replace,
            OverlapArg::Allow => OverlapPolicy::Allow,
        });
    }
    let queue = ops::open(db, true)?;
    let existed = match queue.get_schedule(&args.name) {
        Ok(_) => true,
        Err(Error::UnknownSchedule { .. }) => false,
        Err(e) => return Err(CliError::from_lib(e, db)),
    };
    let mut stored = queue
        .upsert_schedule(spec)
        .map_err(|e| input_error(e, db))?;
    if args.paused {
        queue
            .pause_schedule(&args.name)
            .map_err(|e| CliError::from_lib(e, db))?;
        stored.paused = true;
    }
    let verb = if existed { "replaced" } else { "added" };
    let next = match (stored.paused, stored.next_tick_at) {
        (true, _) => "paused".to_owned(),
        (false, Some(at)) => format!("next tick {}", times.show(at)),
        (false, None) => "it fires no more".to_owned(),
    };
    println!("{verb} schedule {}: {next}", stored.name);
    Ok(())
}

fn schedule_json(s: &Schedule) -> serde_json::Value {
    let (misfire, misfire_limit) = match s.misfire {
        MisfirePolicy::Skip => ("skip", None),
        MisfirePolicy::FireAll { max } => ("fire_all", Some(max)),
        _ => ("fire_once", None),
    };
    json!({
        "name": s.name,
        "cron": s.cron,
        "time_zone": s.time_zone,
        "kind": s.kind,
        "payload": s.payload,
        "queue": s.queue,
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "timeout_ms": s.timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        "misfire": misfire,
        "misfire_limit": misfire_limit,
        "misfire_grace_ms": u64::try_from(s.misfire_grace.as_millis()).unwrap_or(u64::MAX),
        "overlap": s.overlap.to_string(),
        "skipped_ticks": s.skipped_ticks,
        "limit": s.limit,
        "paused": s.paused,
        "next_tick_at": s.next_tick_at.map(display::rfc3339),
        "last_tick_at": s.last_tick_at.map(display::rfc3339),
        "created_at": display::rfc3339(s.created_at),
        "updated_at": display::rfc3339(s.updated_at),
    })
}

fn list(db: &Path, args: &ScheduleListArgs, times: Times) -> Result<(), CliError> {
    let queue = ops::open(db, false)?;
    let schedules = queue
        .list_schedules()
        .map_err(|e| CliError::from_lib(e, db))?;
    if args.json {
        for s in &schedules {
            println!("{}", schedule_json(s));
        }
        return Ok(());
    }
    if schedules.is_empty() {
        eprintln!("no schedules; add one with `tickler schedule add`");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = schedules
        .iter()
        .map(|s| {
            vec![
                display::safe(&s.name).into_owned(),
                display::safe(&s.cron).into_owned(),
                display::safe(&s.time_zone).into_owned(),
                display::safe(&s.kind).into_owned(),
                display::safe(&s.queue).into_owned(),
                if s.paused { "paused" } else { "active" }.to_owned(),
                s.overlap.to_string(),
                s.skipped_ticks.to_string(),
                if s.paused {
                    "-".to_owned()
                } else {
                    times.show_opt(s.next_tick_at)
                },
                times.show_opt(s.last_tick_at),
            ]
        })
        .collect();
    let header = [
        "NAME",
        "CRON",
        "TZ",
        "KIND",
        "QUEUE",
        "STATE",
        "OVERLAP",
        "SKIPPED",
        "NEXT_TICK",
        "LAST_TICK",
    ];
    for line in display::table(&header, &rows, &[]) {
        println!("{line}");
    }
    Ok(())
}

fn unknown(name: &str, db: &Path) -> CliError {
    CliError::failed(format!(
        "no schedule named {name:?} in {}; `tickler schedule list` shows the stored ones",
        crate::files::shown(db)
    ))
}

fn map_unknown(e: Error, db: &Path) -> CliError {
    match e {
        Error::UnknownSchedule { name } => unknown(&name, db),
        other => CliError::from_lib(other, db),
    }
}

fn rm(db: &Path, args: &ScheduleNameArgs) -> Result<(), CliError> {
    let queue = ops::open(db, false)?;
    let deleted = queue
        .delete_schedule(&args.name)
        .map_err(|e| CliError::from_lib(e, db))?;
    if !deleted {
        return Err(unknown(&args.name, db));
    }
    println!(
        "deleted schedule {} (jobs it already enqueued stay)",
        args.name
    );
    Ok(())
}

fn pause(db: &Path, args: &ScheduleNameArgs) -> Result<(), CliError> {
    let queue = ops::open(db, false)?;
    queue
        .pause_schedule(&args.name)
        .map_err(|e| map_unknown(e, db))?;
    println!("paused schedule {}", args.name);
    Ok(())
}

fn resume(db: &Path, args: &ScheduleNameArgs, times: Times) -> Result<(), CliError> {
    let queue = ops::open(db, false)?;
    queue
        .resume_schedule(&args.name)
        .map_err(|e| map_unknown(e, db))?;
    let stored = queue
        .get_schedule(&args.name)
        .map_err(|e| map_unknown(e, db))?;
    match stored.next_tick_at {
        Some(at) => println!(
            "resumed schedule {}: next tick {}",
            args.name,
            times.show(at)
        ),
        None => println!("resumed schedule {}: it fires no more", args.name),
    }
    Ok(())
}

fn next(db: &Path, args: &ScheduleNextArgs, times: Times) -> Result<(), CliError> {
    let target = args.name_or_cron.as_str();
    let looks_like_cron = target.contains(char::is_whitespace) || target.starts_with('@');
    let (ticks, zone): (UpcomingTicks, String) = if looks_like_cron {
        let zone = args.tz.clone().unwrap_or_else(|| "UTC".to_owned());
        let spec = NewSchedule::new("preview", target, "preview").time_zone(&zone);
        let ticks = with_queue_for_preview(db, |queue| queue.upcoming_ticks(&spec))?
            .map_err(|e| input_error(e, db))?;
        (ticks, zone)
    } else {
        let queue = ops::open(db, false)?;
        let stored = queue.get_schedule(target).map_err(|e| match e {
            Error::UnknownSchedule { .. } => CliError::failed(format!(
                "no schedule named {target:?} in {}; to preview a cron expression, quote all its fields: '0 9 * * mon-fri'",
                crate::files::shown(db)
            )),
            other => CliError::from_lib(other, db),
        })?;
        if args.tz.is_some() {
            return Err(CliError::Usage(format!(
                "--tz is for a cron expression; schedule {target} is read in its own zone, {}",
                stored.time_zone
            )));
        }
        let ticks = queue
            .upcoming_ticks(target)
            .map_err(|e| map_unknown(e, db))?;
        (ticks, stored.time_zone)
    };
    // Each tick is printed as it is computed: `-n` may be any size without
    // holding more than one tick in memory.
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    for tick in ticks.take(usize::try_from(args.count).unwrap_or(usize::MAX)) {
        let line = writeln!(
            out,
            "{}  ({} {zone})",
            times.show(tick.at),
            tick.local.format("%a %Y-%m-%d %H:%M:%S %:z")
        );
        if let Err(e) = line {
            return closed_pipe_is_done(e);
        }
        printed += 1;
    }
    if printed == 0 && args.count > 0 {
        if let Err(e) = writeln!(out, "no more ticks (before year 5000)") {
            return closed_pipe_is_done(e);
        }
    }
    out.flush().or_else(closed_pipe_is_done)
}

/// A reader that stopped reading (`| head`) ends the preview; other write
/// errors fail it.
fn closed_pipe_is_done(e: std::io::Error) -> Result<(), CliError> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(CliError::failed(format!("cannot write to stdout: {e}")))
    }
}

/// Runs `f` on the queue file if it exists, else on a throwaway file in a
/// private temporary folder (a preview of a cron expression needs no queue
/// file, but the tick arithmetic is a `Queue` method).
fn with_queue_for_preview<T>(db: &Path, f: impl FnOnce(&Queue) -> T) -> Result<T, CliError> {
    if crate::files::is_url(db) || db.exists() {
        let queue = ops::open(db, false)?;
        return Ok(f(&queue));
    }
    let folder = private_temp_folder()?;
    let result = Queue::open(folder.join("preview.db"))
        .map(|queue| f(&queue))
        .map_err(|e| CliError::failed(format!("cannot make a scratch queue file: {e}")));
    let _ = std::fs::remove_dir_all(&folder);
    result
}

fn private_temp_folder() -> Result<PathBuf, CliError> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for attempt in 0..16u32 {
        let folder = base.join(format!(
            "tickler-preview-{}-{}-{attempt}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&folder) {
            Ok(()) => return Ok(folder),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(CliError::failed(format!(
                    "cannot make a scratch folder in {}: {e}",
                    base.display()
                )))
            }
        }
    }
    Err(CliError::failed(format!(
        "cannot make a scratch folder in {}",
        base.display()
    )))
}
