//! Human-readable output cannot carry terminal escape sequences: whoever
//! can enqueue (a kind, a queue name, a payload's error) or whatever a
//! command prints on stderr used to reach the operator's terminal raw
//! through `list`, `show` and `work`. Control characters are now shown
//! escaped (`\x1b`); JSON output keeps the exact text.

use crate::support::cli;

use cli::{wait_for, Env};
use std::time::Duration;
use tickler::JobState;

const EVIL_KIND: &str = "evil\x1b]0;owned\x07\x1b[2J\u{9b}31m\u{202e}";
const EVIL_QUEUE: &str = "q\x1b[31m";

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    for c in text.chars() {
        let control = c.is_control() && c != '\n';
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(!control && !bidi, "{what} has {c:?}: {text:?}");
    }
}

#[test]
fn list_and_show_escape_kinds_and_queue_names() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let id = env.enqueue(&[EVIL_KIND, "--queue", EVIL_QUEUE]);
    let list = env.run(&["list"]);
    assert_eq!(list.code, 0, "{list:#?}");
    assert_clean("list", &list.stdout);
    assert!(list.stdout.contains("evil\\x1b]0;owned\\x07"), "{list:#?}");
    let show = env.run(&["show", &id.0.to_string()]);
    assert_eq!(show.code, 0, "{show:#?}");
    assert_clean("show", &show.stdout);
    assert!(show.stdout.contains("q\\x1b[31m"), "{show:#?}");
    let stats = env.run(&["stats"]);
    assert_clean("stats", &stats.stdout);

    // JSON keeps the exact text (escaped by JSON itself).
    let json = env.run(&["list", "--json"]).ok();
    let job: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(job["kind"], EVIL_KIND);
    assert_eq!(job["queue"], EVIL_QUEUE);
}

#[test]
fn a_commands_stderr_is_escaped_in_work_list_and_show() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let id = env.enqueue_shell(
        &[
            "sh",
            "-c",
            "printf '\\033[2J\\033]0;pwned\\007boom\\r\\n' >&2; exit 3",
        ],
        &["--max-attempts", "1"],
    );
    let run = wait_for(
        env.spawn(&["work", "--drain", "--lease", "1s"]),
        Duration::from_secs(30),
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert_clean("work's stderr", &run.stderr);
    assert!(run.stderr.contains("\\x1b[2J"), "{run:#?}");
    assert!(run.stderr.contains("boom"), "{run:#?}");
    let job = env.job(id);
    assert_eq!(job.state, JobState::Dead);
    assert!(job.last_error.unwrap().contains('\x1b'), "stored as it was");

    let list = env.run(&["list"]).ok();
    assert_clean("list", &list);
    let show = env.run(&["show", &id.0.to_string()]).ok();
    assert_clean("show", &show);
    assert!(show.contains("pwned"), "{show}");
}
