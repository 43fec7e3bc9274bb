//! Rough edges an operator met: what `queue pause`/`resume` say they did,
//! whether a pause of a queue with no jobs names the queues there are,
//! which commands show `--allow-shared-db`, what `stats` prints on a
//! database server (the `on_a_server_` tests: features `postgres`, `mysql`),
//! whether the README's sample output is today's, where the README's main
//! command writes, and duration errors.

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

/// `tickler stats` on a database server: the counts, and no WAL size (a
/// `-wal` file is SQLite's; on a server it read as a misleading `0 B`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn stats_on_a_server_print_no_wal_size(url: &str) {
    let env = Env::new();
    env.run(&["--db", url, "enqueue", "a", "--queue", "emails"])
        .ok();
    let out = env.run(&["--db", url, "stats"]).ok();
    assert!(out.contains("emails"), "{out}");
    assert!(out.contains("finished in the last minute: 0"), "{out}");
    assert!(!out.contains("WAL"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["--db", url, "stats", "--json"]).ok()).unwrap();
    assert_eq!(json["queues"]["emails"]["pending"], 1);
    assert!(json["wal_bytes"].is_null(), "{json}");
}

#[cfg(feature = "postgres")]
#[test]
fn on_a_server_stats_print_no_wal_size_postgres() {
    let Some(db) = crate::support::pg::test_database() else {
        return;
    };
    stats_on_a_server_print_no_wal_size(db.url());
}

#[cfg(feature = "mysql")]
#[test]
fn on_a_server_stats_print_no_wal_size_mysql() {
    let Some(db) = crate::support::my::test_database() else {
        return;
    };
    stats_on_a_server_print_no_wal_size(db.url());
}

/// The README's sample session, in the lines that go stale when the schema
/// or the states change: the schema version `init` prints and the header
/// of `stats`.
#[test]
fn the_readme_sample_shows_what_init_and_stats_print_today() {
    let readme = include_str!("../../README.md");
    let after = |prompt: &str| {
        let at = readme
            .find(prompt)
            .unwrap_or_else(|| panic!("the README's sample has no {prompt:?}"));
        readme[at + prompt.len()..].lines().nth(1).unwrap().trim()
    };

    let env = Env::new();
    let init = env.run(&["init"]).ok();
    let version = |line: &str| {
        line.rsplit_once("schema version ")
            .unwrap_or_else(|| panic!("no schema version in {line:?}"))
            .1
            .to_owned()
    };
    assert_eq!(
        version(after("$ tickler init")),
        version(init.trim()),
        "README vs `tickler init`"
    );

    env.enqueue(&["a"]);
    let stats = env.run(&["stats"]).ok();
    assert_eq!(
        after("$ tickler stats"),
        stats.lines().next().unwrap(),
        "README vs `tickler stats`"
    );
}

/// A duration the tool cannot read is answered with examples in the forms
/// the tool itself prints (humantime's text suggested `30sec` and listed
/// `min` and `hours`, which tickler never prints), wherever one is typed:
/// an option, an NDJSON line, a `shell` payload.
#[test]
fn duration_errors_give_examples_as_the_tool_prints_durations() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let run = env.run(&["enqueue", "a", "--in", "5x"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains(r#""5x" has an unknown unit "x""#),
        "{run:#?}"
    );
    let (_, examples) = run
        .stderr
        .split_once("as tickler prints durations: ")
        .unwrap_or_else(|| panic!("no examples: {run:#?}"));
    let examples: Vec<&str> = examples.lines().next().unwrap().split(", ").collect();
    assert!(examples.len() >= 3, "{examples:?}");
    for example in &examples {
        // Each is read, and printed back the same by a command that
        // echoes its duration.
        let out = env.run(&["prune", "--older-than", example]).ok();
        assert!(
            out.contains(&format!("more than {example} ago")),
            "{example:?} is not how tickler prints it: {out}"
        );
    }
    let forms = format!("as tickler prints durations: {}", examples.join(", "));

    let run = env.run(&["work", "--lease", "30"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains(r#""30" has no unit"#), "{run:#?}");
    assert!(run.stderr.contains(&forms), "{run:#?}");

    env.run_with_stdin(
        &["enqueue", "--from", "-"],
        br#"{"kind": "a", "in": "5 fortnights"}"#,
    )
    .without_progress()
    .fails(1, &["\"in\"", "unknown unit \"fortnights\"", &forms]);

    let id = env.enqueue(&["shell", r#"{"argv": ["true"], "timeout": "soon"}"#]);
    env.run(&["work", "--drain", "--quiet"]).ok();
    let error = env.job(id).last_error.unwrap_or_default();
    assert!(error.contains("payload timeout"), "{error}");
    assert!(error.contains(&forms), "{error}");
}

/// The README's main command (`cargo run --release --example reminders`),
/// which used to leave `reminders.db` and its ledgers in the working
/// folder: the checkout, when run as the README says.
#[allow(dead_code)]
#[path = "../../examples/reminders.rs"]
mod reminders;

#[test]
fn the_readme_main_command_writes_into_a_temporary_folder_not_the_checkout() {
    use std::path::Path;
    let temp = std::env::temp_dir();
    let outside = |path: &Path| {
        assert!(
            path.is_absolute() && path.starts_with(&temp),
            "{} is not in a temporary folder",
            path.display()
        );
    };

    let settings = reminders::parse_args(&[]).unwrap();
    outside(&settings.db);
    outside(&reminders::ledger_path(&settings.ledgers, "a"));
    let folder = settings.db.parent().unwrap().to_owned();
    assert!(folder.is_dir());
    drop(settings);
    assert!(!folder.exists(), "removed at the end of the run");

    // On a server, the ledgers are files too.
    let url = "postgres://app@db.example/reminders".to_owned();
    let settings = reminders::parse_args(&[url.clone(), "--processes".into(), "3".into()]).unwrap();
    assert_eq!(settings.db, Path::new(&url));
    outside(&reminders::ledger_path(&settings.ledgers, "c"));

    // A path given is where the files go, and they stay.
    let settings = reminders::parse_args(&["/srv/r.db".to_owned()]).unwrap();
    assert_eq!(settings.db, Path::new("/srv/r.db"));
    assert_eq!(
        reminders::ledger_path(&settings.ledgers, "a"),
        Path::new("/srv/r.db.ledger-a")
    );
}

/// A server URL given to a binary built without that engine: the error
/// gives the one command, as the README documents it, that builds a
/// binary with the server engines (it named only a feature).
#[cfg(not(all(feature = "postgres", feature = "mysql")))]
#[test]
fn a_server_url_without_its_engine_names_the_readme_build_command() {
    let env = Env::new();
    let mut urls = Vec::new();
    if cfg!(not(feature = "postgres")) {
        urls.push(("postgres://app:secret@127.0.0.1:9/jobs", "PostgreSQL"));
    }
    if cfg!(not(feature = "mysql")) {
        urls.push(("mysql://app:secret@127.0.0.1:9/jobs", "MySQL/MariaDB"));
    }
    let readme = include_str!("../../README.md");
    for (url, engine) in urls {
        for args in [&["stats"][..], &["init"], &["work", "--drain"]] {
            let run = env
                .run(&[&["--db", url][..], args].concat())
                .fails(1, &[engine, "built without", "app:***@"]);
            let (_, command) = run
                .stderr
                .trim()
                .split_once("in tickler's source folder: ")
                .unwrap_or_else(|| panic!("no command: {run:#?}"));
            assert!(command.starts_with("cargo "), "{run:#?}");
            assert!(
                readme.contains(&format!("`{command}`")),
                "the README does not give {command:?}"
            );
        }
    }
}
