//! `tickler wait ID`: waits in its own process for a job another process
//! ends, and its exit code follows the outcome (0 succeeded, 3 dead,
//! 4 cancelled, 5 not found, 124 timed out).

use crate::support::cli;

use cli::{wait_for, Env};
use std::time::Duration;
use tickler::{JobId, NewJob, Outcome};

#[test]
fn wait_exits_with_the_code_of_how_the_job_ended() {
    let env = Env::new();
    let queue = env.queue();
    let lease_of = |id: JobId| {
        let lease = queue
            .manual()
            .claim("default", "test", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(lease.job_id, id);
        lease
    };

    // Ended by this process while `tickler wait` waits in its own.
    let id = queue.enqueue(NewJob::new("export")).unwrap();
    let child = env.spawn(&["wait", &id.to_string(), "--timeout", "30s"]);
    std::thread::sleep(Duration::from_millis(300));
    queue.manual().complete(&lease_of(id)).unwrap();
    let run = wait_for(child, Duration::from_secs(30));
    assert_eq!(
        (run.code, run.stdout.trim()),
        (0, format!("job {id} succeeded").as_str())
    );

    let id = queue
        .enqueue(NewJob::new("export").max_attempts(1))
        .unwrap();
    let lease = lease_of(id);
    queue
        .manual()
        .record_outcomes(&[(&lease, Outcome::FailPermanently("disk full".into()))])
        .unwrap();
    let run = env.run(&["wait", &id.to_string()]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.contains("dead: disk full"), "{run:?}");

    let id = queue.enqueue(NewJob::new("export")).unwrap();
    queue.cancel(id).unwrap();
    assert_eq!(env.run(&["wait", &id.to_string()]).code, 4);

    let run = env.run(&["wait", "987654321"]);
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stdout.contains("not found"), "{run:?}");

    let id = queue.enqueue(NewJob::new("export")).unwrap();
    let run = env.run(&["wait", &id.to_string(), "--timeout", "200ms", "--json"]);
    assert_eq!(run.code, 124, "{run:?}");
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(json["outcome"], "timed_out");
    assert_eq!(json["job"]["state"], "pending", "{json}");
}

/// What the job's handler returned is what a script waits for: `wait`
/// prints it after "succeeded", `wait --json` and `show` carry it.
#[test]
fn wait_and_show_give_the_output_of_a_job_that_succeeded() {
    let env = Env::new();
    let id = env.succeeded_with(&serde_json::json!({"path": "exports/a.mp4", "bytes": 42}));
    let run = env.run(&["wait", &id.to_string()]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout.trim(),
        format!(r#"job {id} succeeded: {{"bytes":42,"path":"exports/a.mp4"}}"#)
    );
    let run = env.run(&["wait", &id.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(json["job"]["output"]["path"], "exports/a.mp4", "{json}");
    let run = env.run(&["show", &id.to_string()]);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("output:") && l.contains(r#""bytes":42"#)),
        "{run:?}"
    );
}
