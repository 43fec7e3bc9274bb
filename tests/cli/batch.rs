//! `tickler batch ID` prints a batch's times, counters and callbacks,
//! escaped for the terminal, and `tickler show` names a job's batch.

use crate::support::cli;

use cli::batch::{batched, HOSTILE};
use cli::Env;

#[test]
fn batch_prints_its_counters_times_and_callbacks() {
    let env = Env::new();
    let b = batched(&env);
    let shown = env.run(&["batch", &b.batch.to_string()]).ok();
    for line in [
        format!("id:          {}", b.batch),
        "ended:       2 of 4 members".to_owned(),
        "remaining:   2".to_owned(),
        "succeeded:   1".to_owned(),
        "dead:        1".to_owned(),
        "cancelled:   0".to_owned(),
        "finished_at: -".to_owned(),
        format!("on_success:  job {} (waiting)", b.on_success),
        "on_failure:  -".to_owned(),
        format!("on_finish:   job {} (waiting)", b.on_finish),
    ] {
        assert!(shown.contains(&line), "lacks {line:?}:\n{shown}");
    }
    // Sealed, in the zone of the tests (UTC+05:30).
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("sealed_at:") && l.ends_with("+05:30")),
        "{shown}"
    );
    // The description's escape sequence reaches the terminal as text.
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
    assert!(
        shown.contains("<script>alert('x')</script> & \"mail\" \\x1b[2J"),
        "{shown}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["batch", &b.batch.to_string(), "--json"]).ok()).unwrap();
    assert_eq!(json["id"], b.batch.0, "{json}");
    assert_eq!(json["description"], HOSTILE, "{json}");
    assert_eq!(
        [
            &json["members"],
            &json["remaining"],
            &json["succeeded"],
            &json["dead"],
            &json["cancelled"]
        ],
        [4, 2, 1, 1, 0],
        "{json}"
    );
    assert!(json["sealed_at"].as_str().unwrap().ends_with('Z'), "{json}");
    assert!(json["finished_at"].is_null(), "{json}");
    assert_eq!(
        json["on_success"],
        serde_json::json!({"id": b.on_success.0, "state": "waiting"})
    );
    assert!(json["on_failure"].is_null(), "{json}");
    assert_eq!(json["on_finish"]["id"], b.on_finish.0, "{json}");
}

#[test]
fn batch_refuses_an_unknown_id_and_a_bad_one() {
    let env = Env::new();
    batched(&env);
    env.run(&["batch", "987654"])
        .fails(1, &["batch 987654 does not exist"]);
    let run = env.run(&["batch", "seven"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("'seven'"), "{run:#?}");
}

#[test]
fn show_names_the_batch_of_a_member_and_of_a_callback() {
    let env = Env::new();
    let b = batched(&env);
    let shown = env.run(&["show", &b.dead.to_string()]).ok();
    assert!(
        shown.contains(&format!("batch:            {} (member)", b.batch)),
        "{shown}"
    );
    let shown = env.run(&["show", &b.on_success.to_string()]).ok();
    assert!(
        shown.contains(&format!(
            "batch:            {} (on_success callback)",
            b.batch
        )) && shown.contains(&format!(
            "why:              on_success callback of batch {} (released if every member succeeds, else cancelled): 2 of 4 members remaining, 1 failed",
            b.batch
        )),
        "{shown}"
    );
    // A member that runs after another keeps its `after` line.
    let shown = env.run(&["show", &b.waiting.to_string()]).ok();
    assert!(
        shown.contains(&format!("after:            {} (if it fails", b.pending)),
        "{shown}"
    );
    assert!(shown.contains(&format!("{} (member)", b.batch)), "{shown}");

    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["show", &b.on_finish.to_string(), "--json"]).ok()).unwrap();
    assert_eq!(json["batch"], b.batch.0, "{json}");
    assert_eq!(json["batch_role"], "on_finish", "{json}");
    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["show", &b.pending.to_string(), "--json"]).ok()).unwrap();
    assert_eq!(json["batch_role"], "member", "{json}");

    // A job of no batch says nothing of one.
    let other = env.enqueue(&["k", "{}"]);
    let shown = env.run(&["show", &other.to_string()]).ok();
    assert!(!shown.contains("batch:"), "{shown}");
    let json: serde_json::Value =
        serde_json::from_str(&env.run(&["show", &other.to_string(), "--json"]).ok()).unwrap();
    assert!(
        json["batch"].is_null() && json["batch_role"].is_null(),
        "{json}"
    );
}
