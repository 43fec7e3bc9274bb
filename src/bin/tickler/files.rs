//! Checks of the queue file's path and permissions, made before the
//! library opens it, so that the error names the real problem (a folder,
//! a missing folder, a file the user cannot read) instead of what SQLite
//! makes of it ("disk I/O error", "read-only", "os error 2").

use crate::error::CliError;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Whether `--db` names a database server rather than a file: none of the
/// file checks here apply to it.
pub fn is_url(db: &Path) -> bool {
    db.to_str().is_some_and(|db| !tickler::is_file_location(db))
}

/// `db` for messages: a URL's password is replaced by `***`.
pub fn shown(db: &Path) -> String {
    tickler::redacted_location(&db.to_string_lossy())
}

/// The file and its `-wal` and `-shm` files.
fn with_side_files(db: &Path) -> [PathBuf; 3] {
    let side = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [db.to_path_buf(), side("-wal"), side("-shm")]
}

fn folder_of(db: &Path) -> PathBuf {
    match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The one command that builds a `tickler` with both server engines, as
/// the README gives it: an error for a server URL names it whole, so that
/// the operator need not work out feature names.
pub const SERVER_BUILD: &str = "cargo install --path . --features postgres,mysql";

/// Fails with a clear message if `db` cannot be a queue file: it is a
/// folder, its folder does not exist, or it exists and cannot be read; or,
/// for a server's URL, if this binary was built without that engine.
pub fn check_path(db: &Path) -> Result<(), CliError> {
    if is_url(db) {
        let (engine, built) = if db.to_string_lossy().starts_with("postgres") {
            ("PostgreSQL", cfg!(feature = "postgres"))
        } else {
            ("MySQL/MariaDB", cfg!(feature = "mysql"))
        };
        if built {
            return Ok(());
        }
        return Err(CliError::failed(format!(
            "{} is a {engine} URL, but this tickler was built without {engine}; build one with the server engines, in tickler's source folder: {SERVER_BUILD}",
            shown(db)
        )));
    }
    let shown = db.display();
    match std::fs::metadata(db) {
        Ok(meta) if meta.is_dir() => {
            return Err(CliError::failed(format!(
                "{shown} is a folder; --db (or TICKLER_DB) takes the queue file's path, e.g. {}",
                db.join("tickler.db").display()
            )))
        }
        Ok(meta) => {
            if let Err(e) = std::fs::File::open(db) {
                if e.kind() == ErrorKind::PermissionDenied {
                    return Err(CliError::failed(format!(
                        "cannot read {shown}: permission denied (its owner is uid {}, mode {:o}; you are uid {}); run tickler as its owner, or have them give you access",
                        meta.uid(),
                        meta.mode() & 0o7777,
                        // SAFETY: geteuid has no preconditions and cannot fail.
                        unsafe { libc::geteuid() }
                    )));
                }
                return Err(CliError::failed(format!("cannot read {shown}: {e}")));
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let folder = folder_of(db);
            if !folder.is_dir() {
                return Err(CliError::failed(format!(
                    "cannot create {shown}: its folder {} does not exist; create it first (mkdir -p {})",
                    folder.display(),
                    folder.display()
                )));
            }
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return Err(CliError::failed(format!(
                "cannot reach {shown}: permission denied on a folder on the way ({e}); run tickler as a user who may enter {}",
                folder_of(db).display()
            )))
        }
        Err(e) => return Err(CliError::failed(format!("cannot use {shown}: {e}"))),
    }
    Ok(())
}

/// Why other users could write the file, its `-wal`/`-shm` files or (if
/// `folder`) its folder, if they could.
pub fn shared_write_problem(db: &Path, folder: bool) -> Option<String> {
    if is_url(db) {
        return None;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    for path in &with_side_files(db) {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if meta.mode() & 0o022 != 0 {
            return Some(format!(
                "{} is writable by other users (mode {:o})",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Some(format!(
                "{} belongs to another user (uid {})",
                path.display(),
                meta.uid()
            ));
        }
    }
    if !folder {
        return None;
    }
    let folder = folder_of(db);
    let folder = folder.canonicalize().unwrap_or(folder);
    if let Ok(meta) = std::fs::metadata(&folder) {
        if meta.mode() & 0o022 != 0 {
            return Some(format!(
                "its folder {} is writable by other users (mode {:o})",
                folder.display(),
                meta.mode() & 0o7777
            ));
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Some(format!(
                "its folder {} belongs to another user (uid {})",
                folder.display(),
                meta.uid()
            ));
        }
    }
    None
}

/// Why other users could read the file or its `-wal`/`-shm` files, if
/// they could.
pub fn shared_read_problem(db: &Path) -> Option<String> {
    if is_url(db) {
        return None;
    }
    with_side_files(db).iter().find_map(|path| {
        let meta = std::fs::metadata(path).ok()?;
        (meta.mode() & 0o044 != 0).then(|| {
            format!(
                "{} is readable by other users (mode {:o})",
                path.display(),
                meta.mode() & 0o7777
            )
        })
    })
}

/// Refuses a queue file others can read (every payload, e.g. a shell
/// job's `env`, is readable from it and its `-wal`), unless `allow`; then
/// only warns.
pub fn check_private(db: &Path, allow: bool) -> Result<(), CliError> {
    let Some(problem) = shared_read_problem(db) else {
        return Ok(());
    };
    let fix = with_side_files(db)
        .iter()
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if allow {
        eprintln!(
            "tickler: warning: {problem}; they can read every job's payload (using it anyway: --allow-shared-db)"
        );
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "refusing to use {}: {problem}, so they can read every job's payload (a shell job's env may hold secrets); `chmod 600 {fix}`, or pass --allow-shared-db to use it anyway",
            shown(db)
        )))
    }
}
