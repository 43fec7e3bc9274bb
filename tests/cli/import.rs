//! `tickler enqueue --from FILE.ndjson`: batched transactions, a bad line
//! reported with its line number, nothing from its batch written, earlier
//! batches kept.

use crate::support::cli;

use cli::Env;
use std::fmt::Write as _;
use tickler::JobState;

fn line(i: usize) -> String {
    serde_json::json!({
        "kind": "shell",
        "payload": {"argv": ["echo", i.to_string()]},
        "unique_key": format!("import-{i}"),
    })
    .to_string()
}

#[test]
fn ten_thousand_lines_with_one_bad_line() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let bad = 7_500;
    let mut text = String::new();
    for i in 1..=10_000 {
        if i == bad {
            text.push_str("{\"kind\": \"shell\", \"max_attempts\": 0}\n");
        } else {
            writeln!(text, "{}", line(i)).unwrap();
        }
    }
    let file = env.dir.path().join("jobs.ndjson");
    std::fs::write(&file, &text).unwrap();
    let file_arg = file.to_str().unwrap();

    let run = env.run(&["enqueue", "--from", file_arg]);
    run.without_progress().fails(
        1,
        &[
            "line 7500: max_attempts must be at least 1",
            "7000 job(s) from lines 1-7000 were enqueued",
            "nothing from lines 7001-7500 was written",
            &format!("tail -n +7001 {file_arg}"),
        ],
    );
    let pending = env.in_state(JobState::Pending);
    assert_eq!(pending.len(), 7_000);
    assert_eq!(
        pending.last().unwrap().unique_key.as_deref(),
        Some("import-7000")
    );

    // Following the advice: fix the line, enqueue the rest.
    let rest: String = text
        .lines()
        .enumerate()
        .skip(7_000)
        .map(|(i, l)| if i + 1 == bad { line(bad) } else { l.to_owned() } + "\n")
        .collect();
    let rest_file = env.dir.path().join("rest.ndjson");
    std::fs::write(&rest_file, rest).unwrap();
    let out = env
        .run(&["enqueue", "--from", rest_file.to_str().unwrap()])
        .ok();
    assert_eq!(out.trim(), "enqueued 3000 job(s)");
    assert_eq!(env.in_state(JobState::Pending).len(), 10_000);

    // Importing the whole (fixed) file again adds nothing: unique keys.
    let whole: String = (1..=10_000).map(|i| line(i) + "\n").collect();
    let out = env.run_with_stdin(&["enqueue", "--from", "-"], whole.as_bytes());
    assert_eq!(out.ok().trim(), "enqueued 10000 job(s)");
    assert_eq!(env.in_state(JobState::Pending).len(), 10_000);
}

#[test]
fn stdin_lines_with_defaults_from_the_command_line() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let input = concat!(
        "{\"kind\": \"a\"}\n",
        "\n",
        "{\"payload\": {\"n\": 2}, \"in\": \"1h\", \"priority\": 7}\n",
        "{\"kind\": \"c\", \"queue\": \"other\", \"run_at\": \"2030-01-01T00:00:00+02:00\", \"timeout\": \"5s\"}",
    );
    let out = env
        .run_with_stdin(
            &[
                "enqueue",
                "default-kind",
                "--from",
                "-",
                "--queue",
                "bulk",
                "--max-attempts",
                "3",
            ],
            input.as_bytes(),
        )
        .ok();
    assert_eq!(out.trim(), "enqueued 3 job(s)");
    let jobs = env.queue().list(&Default::default()).unwrap();
    assert_eq!(jobs.len(), 3);
    assert_eq!(
        (jobs[0].kind.as_str(), jobs[0].queue.as_str()),
        ("a", "bulk")
    );
    assert_eq!(jobs[1].kind, "default-kind");
    assert_eq!(jobs[1].priority, 7);
    assert_eq!(jobs[1].state, JobState::Scheduled);
    assert_eq!(jobs[1].payload, serde_json::json!({"n": 2}));
    assert_eq!(jobs[2].queue, "other");
    assert_eq!(jobs[2].run_at.to_rfc3339(), "2029-12-31T22:00:00+00:00");
    assert_eq!(jobs[2].timeout, Some(std::time::Duration::from_secs(5)));
    assert!(jobs.iter().all(|j| j.max_attempts == 3));
}

#[test]
fn bad_lines_are_named_by_number() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let cases: &[(&str, &[&str])] = &[
        (
            "{\"kind\": \"a\"}\n{\"kind\": \"a\", \"colour\": 1}\n",
            &["line 2:", "unknown field `colour`"],
        ),
        ("{\"kind\": \"a\"}\n{\"kind\": \"a\"\n", &["line 2:"]),
        ("{\"payload\": 1}\n", &["line 1:", "no \"kind\""]),
        (
            "{\"kind\": \"a\", \"in\": \"soon\"}\n",
            &["line 1:", "\"in\""],
        ),
        (
            "{\"kind\": \"a\", \"in\": \"1h\", \"run_at\": \"2030-01-01T00:00:00Z\"}\n",
            &["line 1:", "not both"],
        ),
        ("{\"kind\": \"\"}\n", &["line 1:", "kind is empty"]),
    ];
    for (input, needles) in cases {
        let run = env.run_with_stdin(
            &["enqueue", "--from", "-", "--batch-size", "10"],
            input.as_bytes(),
        );
        let run = run.without_progress().fails(1, needles);
        assert!(run.stderr.contains("nothing was enqueued"), "{run:#?}");
    }
    assert_eq!(env.queue().list(&Default::default()).unwrap().len(), 0);

    let missing = env.run(&["enqueue", "--from", "/nonexistent/jobs.ndjson"]);
    missing.fails(1, &["cannot read /nonexistent/jobs.ndjson"]);
    // KIND-less single enqueue and PAYLOAD with --from are usage errors.
    assert_eq!(env.run(&["enqueue", "a", "{}", "--from", "-"]).code, 2);
    assert_eq!(
        env.run(&["enqueue", "--from", "-", "--unique-key", "k"])
            .code,
        2
    );
}
