//! The binary's errors: one line on stderr and an exit code.

use std::fmt;
use std::path::Path;
use tickler::{Error, JobState};

/// A failed command.
#[derive(Debug)]
pub enum CliError {
    /// The command line was wrong (exit code 2).
    Usage(String),
    /// The operation failed (exit code 1).
    Failed(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }

    /// A failed operation with this message.
    pub fn failed(message: impl Into<String>) -> Self {
        CliError::Failed(message.into())
    }

    /// A library error on the file `db`, worded for the command line.
    pub fn from_lib(e: Error, db: &Path) -> Self {
        CliError::Failed(describe(&e, db))
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (CliError::Usage(m) | CliError::Failed(m)) = self;
        // Always one line.
        let line: Vec<&str> = m.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        // Messages may quote stored text (kinds, errors): no escapes reach
        // the terminal.
        f.write_str(&crate::display::safe(&line.join(" / ")))
    }
}

/// Says what went wrong with `db` and what to do about it.
pub fn describe(e: &Error, db: &Path) -> String {
    let db = crate::files::shown(db);
    match e {
        Error::SchemaTooNew { found, supported } => format!(
            "database {db} was written by a newer tickler (schema {found}, this build knows {supported}); upgrade tickler"
        ),
        Error::NotFound(id) => format!(
            "no job with id {id} in {db} (it may have been pruned); `tickler list` shows the jobs there are"
        ),
        Error::InvalidState {
            job_id,
            state,
            action,
        } => {
            let hint = match *action {
                "cancel" => "only scheduled, pending or running jobs can be cancelled",
                "retry" if *state == JobState::Succeeded => {
                    "only dead or cancelled jobs can be retried; enqueue it again to run it again"
                }
                "retry" => "only dead or cancelled jobs can be retried",
                _ => "",
            };
            if hint.is_empty() {
                format!("job {job_id} is {state}; cannot {action} it")
            } else {
                format!("job {job_id} is {state}; cannot {action} it: {hint}")
            }
        }
        Error::Busy { .. } => format!("{db}: {e}; try again when that process is done"),
        Error::NotWal { .. } | Error::PragmaMismatch { .. } | Error::DiskFull => {
            format!("{db}: {e}")
        }
        Error::Sqlite(_) | Error::Pool(_) => format!("{db}: {e}"),
        other => other.to_string(),
    }
}
