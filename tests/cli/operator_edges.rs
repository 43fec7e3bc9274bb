//! Rough edges an operator met: what `queue pause`/`resume` say they did,
//! whether a pause of a queue with no jobs names the queues there are,
//! and which commands show `--allow-shared-db`.

use crate::support::cli;

use cli::Env;

#[test]
fn pausing_a_queue_without_jobs_pauses_it_and_names_the_known_queues() {
    let env = Env::new();
    env.enqueue(&["a", "--queue", "emails"]);
    env.enqueue(&["a", "--queue", "reports"]);

    // A typo and a queue before its first job look alike: it is paused
    // either way, and the note lets the operator tell which it was.
    let run = env.run(&["queue", "pause", "emials"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        run.stderr.trim(),
        "tickler: note: queue emials has no jobs yet; known queues: emails, reports",
        "{run:#?}"
    );
    assert!(
        run.stdout.starts_with("paused queue emials: 0 pending"),
        "{run:#?}"
    );
    assert_eq!(env.queue().paused_queues().unwrap(), ["emials"]);
}

#[test]
fn pause_and_resume_say_what_they_did() {
    let env = Env::new();
    for _ in 0..3 {
        env.enqueue(&["a", "--queue", "emails"]);
    }
    let run = env.run(&["queue", "pause", "emails"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.stderr, "", "no note for a queue with jobs: {run:#?}");
    assert_eq!(
        run.stdout.trim(),
        "paused queue emails: 3 pending job(s) wait until `tickler queue resume emails`; 0 running job(s) finish"
    );
    let out = env.run(&["queue", "pause", "emails"]).ok();
    assert!(
        out.starts_with("queue emails was already paused: 3 pending"),
        "{out}"
    );

    let out = env.run(&["queue", "resume", "emails"]).ok();
    assert_eq!(
        out.trim(),
        "resumed queue emails: 3 pending job(s) can be claimed again"
    );
    assert!(env.queue().paused_queues().unwrap().is_empty());
    let out = env.run(&["queue", "resume", "emails"]).ok();
    assert_eq!(
        out.trim(),
        "queue emails was not paused; nothing changed (paused queues: none)"
    );
}

/// `--allow-shared-db` changes only what `init` and `work` refuse; a flag
/// shown in every command's help reads as if `list` or `stats` checked
/// something.
#[test]
fn allow_shared_db_is_in_the_help_of_init_and_work_only() {
    let env = Env::new();
    for sub in [&["init"][..], &["work"]] {
        let out = env.run(&[sub, &["--help"]].concat()).ok();
        assert!(out.contains("--allow-shared-db"), "{sub:?}:\n{out}");
    }
    for sub in [
        &[][..],
        &["enqueue"],
        &["list"],
        &["stats"],
        &["queue", "pause"],
        &["schedule", "add"],
    ] {
        let out = env.run(&[sub, &["--help"]].concat()).ok();
        assert!(!out.contains("allow-shared-db"), "{sub:?}:\n{out}");
    }
    // Nor is it taken where it would do nothing.
    env.run(&["init"]).ok();
    let run = env.run(&["stats", "--allow-shared-db"]);
    assert_eq!(run.code, 2, "{run:#?}");
}
