//! Queue files stay private: what tickler creates is 0600 (and so are the
//! `-wal` and `-shm` files SQLite makes next to it), and `tickler init` /
//! `tickler work` refuse a file that group or others can read (a shell
//! job's `env` may hold secrets) unless `--allow-shared-db`. Before, a file
//! made by `touch` (0644) was used silently.

use crate::support::cli;

use cli::{mode, Env};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tickler::{JobState, Queue};

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn side(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[test]
fn files_tickler_creates_are_owner_only_with_their_wal_and_shm() {
    let env = Env::new();
    env.run(&["init"]).ok();
    // While a connection is open the -wal and -shm files exist.
    let queue = env.queue();
    for path in [env.db.clone(), side(&env.db, "-wal"), side(&env.db, "-shm")] {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert!(tickler::Ops::file_is_private(&env.db).unwrap());
    drop(queue);

    // Through the library too.
    let db = env.dir.path().join("lib.db");
    let _queue = Queue::open(&db).unwrap();
    for path in [db.clone(), side(&db, "-wal"), side(&db, "-shm")] {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

#[test]
fn init_refuses_a_file_others_can_read_and_says_how_to_fix_it() {
    let env = Env::new();
    std::fs::File::create(&env.db).unwrap(); // like `touch`
    chmod(&env.db, 0o644);
    env.run(&["init"]).fails(
        1,
        &[
            "readable by other users (mode 644)",
            "chmod 600",
            "--allow-shared-db",
        ],
    );
    assert!(!tickler::Ops::file_is_private(&env.db).unwrap());
    assert_eq!(
        std::fs::metadata(&env.db).unwrap().len(),
        0,
        "left untouched"
    );

    let run = env.run(&["init", "--allow-shared-db"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stderr.contains("warning: "), "{run:#?}");

    chmod(&env.db, 0o600);
    assert!(tickler::Ops::file_is_private(&env.db).unwrap());
    env.run(&["init"]).ok();
}

#[test]
fn work_refuses_a_file_others_can_read() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let id = env.enqueue_shell(&["true"], &[]);
    chmod(&env.db, 0o640);
    env.run(&["work", "--drain", "--quiet"]).fails(
        1,
        &[
            "readable by other users (mode 640)",
            "chmod 600",
            "--allow-shared-db",
        ],
    );
    assert_eq!(env.job(id).state, JobState::Pending);
    let run = env.run(&["work", "--drain", "--quiet", "--allow-shared-db"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(env.job(id).state, JobState::Succeeded);
}

#[test]
fn the_library_check_looks_at_the_wal_and_shm_too() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    assert!(queue.ops().is_private().unwrap());
    chmod(&side(&env.db, "-wal"), 0o644);
    assert!(!tickler::Ops::file_is_private(&env.db).unwrap());
    assert!(!queue.ops().is_private().unwrap());
    chmod(&side(&env.db, "-wal"), 0o600);
    assert!(queue.ops().is_private().unwrap());
    // A missing file is an error, not "private".
    assert!(tickler::Ops::file_is_private(env.dir.path().join("nope.db")).is_err());
}
