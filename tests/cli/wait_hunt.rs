//! `tickler wait` against failures other tools had when a script waited
//! for a result (see tests/contract/outputs_hunt.rs for the library's).

use crate::support::cli;

use cli::Env;

/// OpenWhisk's CLI answered a non-integer or out-of-range number with a
/// raw parse error (apache/openwhisk-cli#132), and a parseInt took "5abc"
/// for 5 (kurone-kito/idd-skill#1428). A job id that is not a number (or
/// past i64) is a usage error, exit 2, never a panic, never a prefix
/// taken for the id, nor a "not found" (exit 5) a script would take for a
/// pruned job.
#[test]
fn wait_refuses_an_id_that_is_not_a_number() {
    let env = Env::new();
    let _queue = env.queue();
    for id in ["abc", "12x", "99999999999999999999", "1.5", ""] {
        let run = env.run(&["wait", id, "--timeout", "1s"]);
        assert_eq!(run.code, 2, "{id:?}: {run:?}");
        assert!(!run.stderr.contains("panicked"), "{id:?}: {run:?}");
        assert!(run.stdout.is_empty(), "{id:?}: {run:?}");
    }
    // A number that names no job is "not found", at once.
    let run = env.run(&["wait", "0", "--timeout", "30s"]);
    assert_eq!(run.code, 5, "{run:?}");
}

/// Postico cut a string at its first U+0000 when it showed it
/// (jakob/Postico#523). `wait` prints the whole output on one line, a NUL
/// or escape character written visibly rather than cut or sent to the
/// terminal; `--json` gives it exactly.
#[test]
fn wait_prints_an_output_with_nul_and_escapes_whole() {
    let env = Env::new();
    let value = serde_json::json!({"name": "a\u{0}b\u{1b}[2Jc\nd", "city": "東京"});
    let id = env.succeeded_with(&value);
    let run = env.run(&["wait", &id.to_string()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.lines().count(), 1, "{run:?}");
    assert!(
        !run.stdout.contains('\u{1b}') && !run.stdout.contains('\0'),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("東京") && run.stdout.contains('d'),
        "{run:?}"
    );
    let run = env.run(&["wait", &id.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(json["job"]["output"], value, "{json}");
}
