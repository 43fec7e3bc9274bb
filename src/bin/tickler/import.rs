//! `tickler enqueue --from FILE.ndjson`: one job per line, in batched
//! transactions, saying after each what is committed.

use crate::cli::EnqueueArgs;
use crate::error::CliError;
use crate::ops;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use tickler::{NewJob, Queue};

/// One NDJSON line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    kind: Option<String>,
    #[serde(default)]
    payload: serde_json::Value,
    queue: Option<String>,
    priority: Option<i32>,
    run_at: Option<DateTime<Utc>>,
    #[serde(rename = "in")]
    delay: Option<String>,
    max_attempts: Option<u32>,
    unique_key: Option<String>,
    timeout: Option<String>,
}

/// Imports the file named by `args.from`.
pub fn import(db: &Path, args: &EnqueueArgs) -> Result<(), CliError> {
    let source = args.from.as_deref().expect("--from is set");
    let from_stdin = source == Path::new("-");
    let (reader, size): (Box<dyn Read>, Option<u64>) = if from_stdin {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let file = std::fs::File::open(source)
            .map_err(|e| CliError::failed(format!("cannot read {}: {e}", source.display())))?;
        let size = file.metadata().ok().map(|m| m.len());
        (Box::new(file), size)
    };
    let queue = ops::open_to_add(db, args.create)?;
    let mut progress = Progress { size, read: 0 };
    let result = run(&queue, db, args, BufReader::new(reader), &mut progress);
    let imported = result.map_err(|failure| {
        let rest = if from_stdin {
            format!("from line {} on", failure.batch_start)
        } else {
            format!(
                "from line {} on (tail -n +{} {})",
                failure.batch_start,
                failure.batch_start,
                source.display()
            )
        };
        if failure.batch_start == 1 {
            return CliError::failed(format!(
                "{}; nothing was enqueued: fix it and run again",
                failure.message
            ));
        }
        CliError::failed(format!(
            "{}; {} job(s) from lines 1-{} were enqueued, nothing from lines {}-{} was written: fix it and enqueue the rest {rest}",
            failure.message,
            failure.enqueued,
            failure.batch_start - 1,
            failure.batch_start,
            failure.line,
        ))
    })?;
    println!("enqueued {imported} job(s)");
    Ok(())
}

struct Failure {
    message: String,
    line: u64,
    batch_start: u64,
    enqueued: u64,
}

/// How far the import got: bytes read of the file's size (none for stdin).
struct Progress {
    size: Option<u64>,
    read: u64,
}

impl Progress {
    fn inc(&mut self, bytes: u64) {
        self.read += bytes;
    }
}

fn run(
    queue: &Queue,
    db: &Path,
    args: &EnqueueArgs,
    mut reader: impl BufRead,
    progress: &mut Progress,
) -> Result<u64, Failure> {
    let batch_size = args.batch_size as usize;
    let mut batch: Vec<NewJob> = Vec::with_capacity(batch_size);
    let mut batch_start = 1u64;
    let mut enqueued = 0u64;
    let mut line_no = 0u64;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let read = reader.read_until(b'\n', &mut buf).map_err(|e| Failure {
            message: format!("reading line {}: {e}", line_no + 1),
            line: line_no + 1,
            batch_start,
            enqueued,
        })?;
        if read == 0 {
            break;
        }
        line_no += 1;
        progress.inc(read as u64);
        let job = parse_line(&buf, queue, args).map_err(|message| Failure {
            message: format!("line {line_no}: {message}"),
            line: line_no,
            batch_start,
            enqueued,
        })?;
        if let Some(job) = job {
            batch.push(job);
        }
        if batch.len() >= batch_size {
            enqueued += write(queue, db, &mut batch, batch_start, line_no, enqueued)?;
            batch_start = line_no + 1;
            committed(progress, enqueued, line_no);
        }
    }
    if !batch.is_empty() {
        enqueued += write(queue, db, &mut batch, batch_start, line_no, enqueued)?;
        committed(progress, enqueued, line_no);
    }
    Ok(enqueued)
}

/// Says on stderr what is committed after each batch (a line each), so
/// that an import that was killed tells where to resume (`tail -n
/// +LINE+1`; unique keys make re-running an overlap safe).
fn committed(progress: &Progress, enqueued: u64, line: u64) {
    let share = progress
        .size
        .filter(|&size| size > 0)
        .map(|size| format!(" ({}% of the file)", progress.read * 100 / size))
        .unwrap_or_default();
    eprintln!("tickler: {enqueued} job(s) committed, through line {line}{share}");
}

fn write(
    queue: &Queue,
    db: &Path,
    batch: &mut Vec<NewJob>,
    batch_start: u64,
    line: u64,
    enqueued: u64,
) -> Result<u64, Failure> {
    let jobs = std::mem::take(batch);
    let n = jobs.len() as u64;
    queue.enqueue_batch(jobs).map_err(|e| Failure {
        message: format!(
            "writing lines {batch_start}-{line}: {}",
            crate::error::describe(&e, db)
        ),
        line,
        batch_start,
        enqueued,
    })?;
    Ok(n)
}

/// The job on one line; `None` for a blank line.
fn parse_line(raw: &[u8], queue: &Queue, args: &EnqueueArgs) -> Result<Option<NewJob>, String> {
    let text = std::str::from_utf8(raw).map_err(|e| format!("not UTF-8 ({e})"))?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let line: Line = serde_json::from_str(text).map_err(|e| format!("{e}"))?;
    let kind = line.kind.or_else(|| args.kind.clone()).ok_or_else(|| {
        "no \"kind\": give each line one, or pass KIND for lines without".to_owned()
    })?;
    let mut job = ops::apply_defaults(NewJob::new(kind), args).payload(line.payload);
    if let Some(queue) = line.queue {
        job = job.queue(queue);
    }
    if let Some(priority) = line.priority {
        job = job.priority(priority);
    }
    match (line.run_at, line.delay) {
        (Some(_), Some(_)) => return Err("give \"run_at\" or \"in\", not both".into()),
        (Some(at), None) => job = job.run_at(at),
        (None, Some(delay)) => job = job.delay(parse_duration("in", &delay)?),
        (None, None) => {}
    }
    if let Some(max) = line.max_attempts {
        job = job.max_attempts(max);
    }
    if let Some(key) = line.unique_key {
        job = job.unique_key(key);
    }
    if let Some(timeout) = line.timeout {
        job = job.timeout(parse_duration("timeout", &timeout)?);
    }
    queue.validate_job(&job).map_err(|e| e.to_string())?;
    Ok(Some(job))
}

fn parse_duration(field: &str, s: &str) -> Result<std::time::Duration, String> {
    crate::display::parse_duration(s).map_err(|e| format!("\"{field}\": {e}"))
}
