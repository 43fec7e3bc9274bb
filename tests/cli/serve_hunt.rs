//! `tickler serve` against failures other job dashboards had: pages that
//! another site can frame (clickjacking) or a cache can keep (payloads,
//! CSRF tokens).

use crate::support::cli;

use cli::serve::{csrf_of, dead_jobs, filled, http, serve};

#[test]
fn no_page_can_be_framed_or_cached() {
    let env = filled();
    let dead = dead_jobs(&env, "hunt", "k", 1)[0];
    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    let csrf = csrf_of(&page);
    let confirm = format!("action=delete-dead&queue=hunt&csrf={csrf}");
    for (method, path, body) in [
        ("GET", "/".to_owned(), ""),
        ("GET", "/?live=1".to_owned(), ""),
        ("GET", "/jobs?state=dead".to_owned(), ""),
        ("GET", format!("/jobs/{dead}"), ""),
        ("POST", "/confirm".to_owned(), confirm.as_str()),
    ] {
        let (status, head, _) = http(&served.addr, method, &path, &[], body);
        assert_eq!(status, 200, "{method} {path}");
        let csp = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Security-Policy: "))
            .unwrap_or_else(|| panic!("no policy on {path}: {head}"));
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(head.contains("X-Frame-Options: DENY"), "{path}: {head}");
        assert!(head.contains("Cache-Control: no-store"), "{path}: {head}");
    }
}

/// Jobs that die while the confirm page is open are not deleted unseen:
/// the action does nothing and shows the count now, to confirm again.
#[test]
fn a_bulk_action_does_nothing_when_the_count_changed_since_the_confirm_page() {
    let env = filled();
    let first = dead_jobs(&env, "hunt", "k", 2);
    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    let csrf = csrf_of(&page);
    let ask = format!("action=delete-dead&queue=hunt&csrf={csrf}");
    let (_, _, confirm) = http(&served.addr, "POST", "/confirm", &[], &ask);
    assert!(
        confirm.contains("<input type=hidden name=count value=\"2\">"),
        "{confirm}"
    );

    let later = dead_jobs(&env, "hunt", "k", 1);
    let (status, _, again) = http(
        &served.addr,
        "POST",
        "/bulk",
        &[],
        &format!("{ask}&count=2"),
    );
    assert_eq!(status, 409, "{again}");
    assert!(again.contains("<p id=changed role=alert>"), "{again}");
    assert!(
        again.contains("<strong id=confirm-count>3</strong>"),
        "{again}"
    );
    assert!(
        again.contains("<input type=hidden name=count value=\"3\">"),
        "{again}"
    );
    let (status, _, _) = http(&served.addr, "POST", "/bulk", &[], &ask);
    assert_eq!(status, 409, "a form without the count does nothing");
    for &id in first.iter().chain(&later) {
        assert_eq!(env.job(id).state, tickler::JobState::Dead);
    }

    let (status, head, _) = http(
        &served.addr,
        "POST",
        "/bulk",
        &[],
        &format!("{ask}&count=3"),
    );
    assert_eq!(status, 303, "{head}");
    for &id in first.iter().chain(&later) {
        assert!(matches!(
            env.queue().get(id),
            Err(tickler::Error::NotFound(_))
        ));
    }
}

/// A key named to be hidden is hidden whatever the case of its letters:
/// `--hide-payload-key password` showed a payload's `Password`.
#[test]
fn a_hidden_payload_key_is_hidden_in_any_case() {
    let env = filled();
    let id = env
        .queue()
        .enqueue(
            tickler::NewJob::new("k")
                .queue("hunt")
                .payload(serde_json::json!({
                    "password": "lower-secret",
                    "Password": "upper-secret",
                    "nested": [{"PASSWORD": "nested-secret", "user": "ann"}],
                })),
        )
        .unwrap();
    let served = serve(&env, &["--hide-payload-key", "password"]);
    let (status, _, page) = http(&served.addr, "GET", &format!("/jobs/{id}"), &[], "");
    assert_eq!(status, 200);
    for secret in ["lower-secret", "upper-secret", "nested-secret"] {
        assert!(!page.contains(secret), "{secret} shown: {page}");
    }
    assert!(page.contains("ann"), "{page}");
}
