//! `tickler serve`'s bulk actions, marks and live refresh at the HTTP
//! level: a bulk action needs a POST with the page's CSRF token twice (the
//! confirm page, then the action), GET changes nothing, the page says what
//! was done without echoing the request; the summary the live refresh
//! reads and its script are served under the page's strict policy; the
//! wait threshold is an option.

use crate::support::cli;

use cli::serve::{csrf_of, dead_jobs, filled, http, row, serve, table};
use cli::Env;
use std::time::Duration;
use tickler::{JobId, JobState, NewJob};

fn gone(env: &Env, id: JobId) -> bool {
    matches!(env.queue().get(id), Err(tickler::Error::NotFound(_)))
}

/// The dashboard page a 303 of an action leads to.
fn follow(addr: &str, head: &str) -> String {
    let location = head
        .lines()
        .find_map(|l| l.strip_prefix("Location: "))
        .unwrap_or_else(|| panic!("no Location in {head}"))
        .trim();
    assert!(location.starts_with("/?done="), "{location}");
    let (status, _, page) = http(addr, "GET", location, &[], "");
    assert_eq!(status, 200);
    page
}

#[test]
fn a_bulk_delete_needs_the_token_twice_and_says_what_it_did() {
    let env = filled();
    let send = dead_jobs(&env, "outbox", "send", 3);
    let other = dead_jobs(&env, "outbox", "other", 1);
    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    let csrf = csrf_of(&page);
    let ask = "action=delete-dead&kind=send";

    for path in ["/confirm", "/bulk"] {
        let (status, _, _) = http(&served.addr, "GET", &format!("{path}?{ask}"), &[], "");
        assert_eq!(status, 404, "GET {path}");
        for body in [ask.to_owned(), format!("{ask}&csrf=guess")] {
            let (status, _, _) = http(&served.addr, "POST", path, &[], &body);
            assert_eq!(status, 403, "POST {path} {body}");
        }
    }
    assert!(
        !send.iter().any(|&id| gone(&env, id)),
        "nothing changed yet"
    );

    let (status, _, confirm) = http(
        &served.addr,
        "POST",
        "/confirm",
        &[],
        &format!("{ask}&csrf={csrf}"),
    );
    assert_eq!(status, 200, "{confirm}");
    assert!(
        confirm.contains("Delete 3 dead jobs of kind send?"),
        "{confirm}"
    );
    assert!(
        confirm.contains("<strong id=confirm-count>3</strong>"),
        "{confirm}"
    );
    assert!(
        confirm.contains("<form method=post action=/bulk>"),
        "{confirm}"
    );
    assert!(
        !send.iter().any(|&id| gone(&env, id)),
        "the confirm page deleted"
    );

    let (status, head, _) = http(
        &served.addr,
        "POST",
        "/bulk",
        &[],
        &format!("{ask}&csrf={csrf}&count=3"),
    );
    assert_eq!(status, 303, "{head}");
    let page = follow(&served.addr, &head);
    assert!(
        page.contains("<p id=done role=status>Done: deleted 3 dead jobs of kind send.</p>"),
        "{page}"
    );
    assert!(send.iter().all(|&id| gone(&env, id)));
    assert_eq!(env.job(other[0]).state, JobState::Dead, "another kind's");

    // A confirm page of nothing offers no action.
    let (_, _, confirm) = http(
        &served.addr,
        "POST",
        "/confirm",
        &[],
        &format!("{ask}&csrf={csrf}"),
    );
    assert!(confirm.contains("Nothing to do."), "{confirm}");
    assert!(!confirm.contains("action=/bulk"), "{confirm}");

    let (status, _, body) = http(
        &served.addr,
        "POST",
        "/confirm",
        &[],
        &format!("action=drop-tables&csrf={csrf}"),
    );
    assert_eq!(status, 400, "{body}");
    // A schedule that is not there is the operator's mistake, not the
    // server's.
    let (status, _, body) = http(
        &served.addr,
        "POST",
        "/confirm",
        &[],
        &format!("action=pause-schedule&schedule=nope&csrf={csrf}"),
    );
    assert_eq!(status, 404, "{body}");
}

#[test]
fn the_sentence_after_an_action_is_escaped_and_cannot_be_forged() {
    let env = filled();
    let queue = "q\"><script>alert(1)</script>";
    let dead = dead_jobs(&env, queue, "k2", 2);
    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    let csrf = csrf_of(&page);
    let form = format!(
        "action=retry-dead&queue={}&csrf={csrf}",
        "q%22%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E"
    );
    let (_, _, confirm) = http(&served.addr, "POST", "/confirm", &[], &form);
    assert!(!confirm.contains("<script>"), "{confirm}");
    assert!(
        confirm.contains("Retry 2 dead jobs of queue q&quot;&gt;&lt;script&gt;"),
        "{confirm}"
    );
    let (status, head, _) = http(
        &served.addr,
        "POST",
        "/bulk",
        &[],
        &format!("{form}&count=2"),
    );
    assert_eq!(status, 303, "{head}");
    let page = follow(&served.addr, &head);
    assert!(
        page.contains(
            "Done: retried 2 dead jobs of queue q&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;."
        ),
        "{page}"
    );
    assert!(!page.contains("<script>alert"), "{page}");
    for id in dead {
        assert_eq!(env.job(id).state, JobState::Pending);
    }
    // A made-up id, or text in its place, shows nothing.
    for forged in [
        "/?done=0123456789abcdef",
        "/?done=%3Cb%3Eretried%20all%3C%2Fb%3E",
    ] {
        let (status, _, page) = http(&served.addr, "GET", forged, &[], "");
        assert_eq!(status, 200);
        assert!(!page.contains("id=done"), "{forged}: {page}");
    }
}

#[test]
fn the_live_refresh_is_opt_in_and_its_script_and_summary_are_the_servers_own() {
    let env = filled();
    let served = serve(&env, &[]);
    let (status, head, page) = http(&served.addr, "GET", "/", &[], "");
    assert_eq!(status, 200);
    let csp = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Security-Policy: "))
        .expect("a CSP header");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(csp.contains("connect-src 'self';"), "{csp}");
    assert!(!csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(
        csp.matches("unsafe-inline").count(),
        1,
        "styles only: {csp}"
    );
    assert!(!page.contains("<script"), "no script unless asked for");
    assert!(
        page.contains("<a href=\"/?live=1\" id=live-toggle>"),
        "{page}"
    );

    let (_, _, live) = http(&served.addr, "GET", "/?live=1", &[], "");
    assert_eq!(live.matches("<script").count(), 1, "{live}");
    assert!(live.contains("<script src=/static/live.js defer></script>"));
    let (status, head, script) = http(&served.addr, "GET", "/static/live.js", &[], "");
    assert_eq!(status, 200);
    assert!(head.contains("Content-Type: text/javascript"), "{head}");
    assert!(script.contains("/api/summary"));

    let summary = |served: &cli::serve::Served| -> serde_json::Value {
        let (status, head, body) = http(&served.addr, "GET", "/api/summary", &[], "");
        assert_eq!(status, 200, "{body}");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        serde_json::from_str(&body).unwrap()
    };
    let count = |s: &serde_json::Value, queue: &str, state: &str| -> String {
        s["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == queue)
            .unwrap_or_else(|| panic!("no {queue} in {s}"))["counts"][state]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let s = summary(&served);
    assert_eq!(count(&s, "mail", "pending"), "3");
    let reports = s["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "reports")
        .unwrap();
    assert_eq!(reports["attention"], true, "a dead job: {reports}");
    assert_eq!(reports["status"], "needs attention: 1 dead job");
    assert!(s["activity_html"]
        .as_str()
        .unwrap()
        .contains("<svg id=plot"));
    env.queue().enqueue(NewJob::new("k").queue("mail")).unwrap();
    assert_eq!(count(&summary(&served), "mail", "pending"), "4");
}

#[test]
fn a_queue_waiting_over_the_threshold_is_marked() {
    let env = filled();
    let two_minutes_ago = chrono::Utc::now() - chrono::Duration::minutes(2);
    env.queue()
        .enqueue(NewJob::new("k").queue("late").run_at(two_minutes_ago))
        .unwrap();
    let status_of = |extra: &[&str]| {
        let served = serve(&env, extra);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        row(table(&page, "counts"), "<tr data-queue-row=\"late\">").to_owned()
    };
    let marked = status_of(&["--wait-threshold", "1m"]);
    assert!(
        marked.contains("<td class=\"mark attention\" data-status=\"late\">needs attention: oldest due job waited 2m"),
        "{marked}"
    );
    assert!(marked.contains("(over 1m)"), "{marked}");
    // The default, five minutes, is not reached.
    let unmarked = status_of(&[]);
    assert!(
        unmarked.contains("<td class=\"mark ok\" data-status=\"late\">ok</td>"),
        "{unmarked}"
    );
    let refused = env.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--wait-threshold",
        "soon",
    ]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("'soon' for '--wait-threshold"),
        "{refused:?}"
    );
}

#[test]
fn cancelling_all_pending_jobs_of_a_kind_leaves_other_kinds_and_later_jobs() {
    let env = filled();
    let q = env.queue();
    let send: Vec<JobId> = ["mail", "outbox"]
        .iter()
        .map(|queue| q.enqueue(NewJob::new("send").queue(*queue)).unwrap())
        .collect();
    let later = q
        .enqueue(
            NewJob::new("send")
                .queue("mail")
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    assert!(
        page.contains("value=cancel-pending id=bulk-kind-cancel>"),
        "{page}"
    );
    let csrf = csrf_of(&page);
    let form = format!("action=cancel-pending&kind=send&queue=&csrf={csrf}");
    let (status, _, confirm) = http(&served.addr, "POST", "/confirm", &[], &form);
    assert_eq!(status, 200, "{confirm}");
    assert!(
        confirm.contains("Cancel 2 pending jobs of kind send?"),
        "{confirm}"
    );
    assert!(send
        .iter()
        .all(|&id| env.job(id).state == JobState::Pending));
    let (status, head, _) = http(
        &served.addr,
        "POST",
        "/bulk",
        &[],
        &format!("{form}&count=2"),
    );
    assert_eq!(status, 303, "{head}");
    let page = follow(&served.addr, &head);
    assert!(
        page.contains("Done: cancelled 2 pending jobs of kind send."),
        "{page}"
    );
    for id in send {
        assert_eq!(env.job(id).state, JobState::Cancelled);
    }
    assert_eq!(env.job(later).state, JobState::Scheduled);
    // The jobs of kind k that filled() left pending in mail are not touched.
    assert_eq!(
        env.queue()
            .ops()
            .count_matching(JobState::Pending, Some("mail"), Some("k"), 100)
            .unwrap(),
        3
    );
}
