//! Errors say what is really wrong: a folder given as `--db`, a file the
//! user cannot read, `init` into a folder that does not exist, `enqueue`
//! on a missing file (which used to create a file no worker watches), a
//! negative `--in`, and the progress of an import that may be killed.

use crate::support::cli;

use cli::Env;
use std::path::Path;

#[test]
fn a_folder_as_db_is_named_as_such() {
    let env = Env::new();
    let dir = env.dir.path().to_str().unwrap();
    for args in [
        vec!["--db", dir, "init"],
        vec!["--db", dir, "list"],
        vec!["--db", dir, "enqueue", "k"],
        vec!["--db", dir, "work", "--drain"],
    ] {
        let run = env.run(&args).fails(1, &["is a folder", "--db"]);
        assert!(!run.stderr.contains("disk I/O"), "{run:#?}");
        assert!(!run.stderr.contains("read-only"), "{run:#?}");
    }
}

#[test]
fn init_into_a_missing_folder_says_so() {
    let env = Env::new();
    let db = env.dir.path().join("no/such/folder/jobs.db");
    let run = env
        .run(&["--db", db.to_str().unwrap(), "init"])
        .fails(1, &["folder", "does not exist", "mkdir -p"]);
    assert!(!run.stderr.contains("os error"), "{run:#?}");
}

#[test]
fn enqueue_refuses_a_missing_file_unless_create() {
    let env = Env::new();
    env.run(&["enqueue", "k"])
        .fails(1, &["does not exist", "tickler init", "--create"]);
    assert!(!env.db.exists());
    assert!(!Path::new(&format!("{}-wal", env.db.display())).exists());
    let lines = env.dir.path().join("jobs.ndjson");
    std::fs::write(&lines, "{\"kind\": \"k\"}\n").unwrap();
    env.run(&["enqueue", "--from", lines.to_str().unwrap()])
        .fails(1, &["does not exist", "--create"]);
    assert!(!env.db.exists());

    let out = env.run(&["enqueue", "k", "--create"]).ok();
    assert_eq!(out.trim(), "1");
    let out = env.run(&["enqueue", "k"]).ok();
    assert_eq!(out.trim(), "2");
}

#[test]
fn a_negative_in_is_explained() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let run = env.run(&["enqueue", "k", "--in", "-5s"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(!run.stderr.contains("unexpected argument"), "{run:#?}");
    assert!(run.stderr.contains("negative"), "{run:#?}");
    assert!(run.stderr.contains("--at"), "{run:#?}");
}

/// Runs as user `nobody` when the tests run as root (root reads
/// everything); otherwise the file is made unreadable to its owner.
#[test]
fn an_unreadable_file_says_permission_denied_not_read_only() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    env.run(&["init"]).ok();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = env.command(&["list"]);
    if root {
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // `nobody` may not be able to reach the build folder (a clone in a
        // private temporary folder): run a copy from the test's folder.
        let copy = env.dir.path().join("tickler");
        std::fs::copy(cli::BIN, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        cmd = env.command_of(&copy, &["list"]);
        cmd.uid(65534).gid(65534);
    } else {
        std::fs::set_permissions(&env.db, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("permission"), "{stderr}");
    assert!(stderr.contains("owner"), "{stderr}");
    assert!(!stderr.contains("read-only"), "{stderr}");
}

#[test]
fn an_import_prints_what_it_committed_as_it_goes() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let lines = env.dir.path().join("jobs.ndjson");
    let text: String = (0..2500)
        .map(|i| format!("{{\"kind\": \"k\", \"unique_key\": \"k{i}\"}}\n"))
        .collect();
    std::fs::write(&lines, text).unwrap();
    let run = env.run(&["enqueue", "--from", lines.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{run:#?}");
    for n in ["1000", "2000", "2500"] {
        assert!(
            run.stderr.contains(&format!("{n} job(s) committed")),
            "{run:#?}"
        );
    }
    assert!(run.stderr.contains("through line 2000"), "{run:#?}");
}
