//! `tickler serve` at the HTTP level: /metrics parses as Prometheus text
//! and matches the file, the loopback and token rules, and CSRF on every
//! action.

use crate::support::cli;

use cli::serve::{csrf_of, filled, http, serve};
use tickler::JobState;

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_file() {
    let env = filled();
    env.queue().pause_queue("mail").unwrap();
    let served = serve(&env, &[]);
    let (status, head, body) = http(&served.addr, "GET", "/metrics", &[], "");
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => panic!("{s:?}"),
            })
    };
    assert_eq!(
        value("tickler_jobs", &[("queue", "mail"), ("state", "pending")]),
        Some(3.0)
    );
    assert_eq!(
        value("tickler_jobs", &[("queue", "reports"), ("state", "dead")]),
        Some(1.0)
    );
    assert_eq!(value("tickler_dead_jobs", &[]), Some(1.0));
    assert!(value("tickler_oldest_due_lateness_seconds", &[("queue", "mail")]).is_some());
    // Paused and running queues both have a series, so an alert on a
    // paused queue resolves when it is resumed.
    assert_eq!(
        value("tickler_queue_paused", &[("queue", "mail")]),
        Some(1.0)
    );
    assert_eq!(
        value("tickler_queue_paused", &[("queue", "reports")]),
        Some(0.0)
    );
}

#[test]
fn a_non_loopback_address_needs_allow_remote_and_a_token() {
    let env = filled();
    env.run(&["serve", "--listen", "0.0.0.0:0"])
        .fails(2, &["not a loopback address", "--allow-remote", "--token"]);
    env.run(&["serve", "--listen", "0.0.0.0:0", "--allow-remote"])
        .fails(2, &["--allow-remote", "--token"]);
    env.run(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--token",
        "0123456789abcdef",
    ])
    .fails(2, &["not a loopback address"]);
    env.run(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--allow-remote",
        "--token",
        "short",
    ])
    .fails(2, &["at least 16"]);
}

#[test]
fn with_a_token_every_request_must_carry_it() {
    let env = filled();
    let token = "0123456789abcdef0123";
    let served = serve(&env, &["--token", token]);
    assert_eq!(http(&served.addr, "GET", "/metrics", &[], "").0, 401);
    assert_eq!(
        http(
            &served.addr,
            "GET",
            "/",
            &["Authorization: Bearer wrong"],
            ""
        )
        .0,
        401
    );
    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(http(&served.addr, "GET", "/metrics", &[&bearer], "").0, 200);
    let (status, head, _) = http(&served.addr, "GET", &format!("/?token={token}"), &[], "");
    // The cookie, and a redirect to a URL without the token.
    assert_eq!(status, 303);
    assert!(
        head.contains(&format!("tickler_token={token}; HttpOnly")),
        "{head}"
    );
    let cookie = format!("Cookie: tickler_token={token}");
    assert_eq!(http(&served.addr, "GET", "/", &[&cookie], "").0, 200);
}

#[test]
fn actions_need_the_csrf_token_of_the_page() {
    let env = filled();
    let served = serve(&env, &[]);
    let dead = env.in_state(JobState::Dead)[0].id;
    let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
    assert_eq!(status, 200);
    // Errors are shown escaped.
    assert!(page.contains("broken &lt;b&gt;html&lt;/b&gt;"));
    let csrf = csrf_of(&page);

    let (status, _, _) = http(&served.addr, "POST", "/retry", &[], &format!("id={dead}"));
    assert_eq!(status, 403);
    let (status, _, _) = http(
        &served.addr,
        "POST",
        "/retry",
        &[],
        &format!("id={dead}&csrf=guess"),
    );
    assert_eq!(status, 403);
    assert_eq!(env.job(dead).state, JobState::Dead);

    let (status, head, _) = http(
        &served.addr,
        "POST",
        "/retry",
        &[],
        &format!("id={dead}&csrf={csrf}"),
    );
    assert_eq!(status, 303, "{head}");
    assert_eq!(env.job(dead).state, JobState::Pending);

    http(
        &served.addr,
        "POST",
        "/pause",
        &[],
        &format!("queue=mail&csrf={csrf}"),
    );
    assert_eq!(
        env.queue().paused_queues().unwrap(),
        vec!["mail".to_owned()]
    );
    http(
        &served.addr,
        "POST",
        "/resume",
        &[],
        &format!("queue=mail&csrf={csrf}"),
    );
    assert!(env.queue().paused_queues().unwrap().is_empty());
}
