//! `tickler serve` at the HTTP level: /metrics parses as Prometheus text
//! and matches the file, the loopback and token rules, and CSRF on every
//! action.

use crate::support::cli;

use crate::support::limits;
use cli::serve::{csrf_of, filled, http, row, serve, table};
use cli::Env;
use std::time::Duration;
use tickler::{JobState, Limit, NewJob};

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

/// The Limits section gives per key what `tickler limit list` gives, and
/// the rows of a blocked job and of a job deferred by a rate say why they
/// wait (`Queue::explain`): which job holds the slot, which place in line.
#[test]
fn limits_show_what_each_key_holds_and_why_its_jobs_wait() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let ids = queue
        .enqueue_batch(vec![limits::sync("42"), limits::sync("42")])
        .unwrap();
    let held = limits::claim(&queue, 2);
    assert_eq!(held.len(), 1, "one of two runs under a limit of 1");
    let holder = held[0].job_id;
    let blocked = ids.into_iter().find(|id| *id != holder).unwrap();
    assert_eq!(limits::state(&queue, blocked), JobState::Blocked);

    queue
        .set_limit(
            "api",
            Limit::rate(1, Duration::from_secs(3600)).burst(2).total(9),
        )
        .unwrap();
    let rated = |_| NewJob::new("call").queue("api").limit("api", "acct");
    queue.enqueue_batch((0..4).map(rated).collect()).unwrap();
    assert_eq!(
        limits::claim_in(&queue, "api", 4).len(),
        3,
        "1 + a burst of 2"
    );
    let deferred = env.in_state(JobState::Scheduled);
    assert_eq!(deferred.len(), 1, "{deferred:?}");

    let served = serve(&env, &[]);
    let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
    assert_eq!(status, 200);
    let shown = table(&page, "limits");
    let cells = |key_row: &str, want: [&str; 5]| {
        for (column, value) in ["held", "holders", "blocked", "deferred", "pending"]
            .iter()
            .zip(want)
        {
            let cell = format!("data-column={column}>{value}</td>");
            assert!(key_row.contains(&cell), "want {cell} in {key_row}");
        }
    };
    assert!(row(shown, "<tr data-limit=\"sync\">").contains("<td colspan=6>1 per key</td>"));
    let key = row(shown, "<tr data-limit=\"sync\" data-key=\"42\">");
    cells(key, ["1 of 1", "1", "1", "0", "0"]);
    assert!(
        row(shown, "<tr data-limit=\"api\">").contains("9 in all, 1 starts per 1h + 2 burst"),
        "{shown}"
    );
    let key = row(shown, "<tr data-limit=\"api\" data-key=\"acct\">");
    cells(key, ["3", "3", "0", "1", "0"]);

    let job = row(
        table(&page, "jobs-blocked"),
        &format!("<tr><td><a href=/jobs/{blocked}>{blocked}</a></td>"),
    );
    let why = format!("blocked by limit sync/42: 1 of 1 held by job {holder} (worker w,");
    assert!(job.contains(&why), "want {why:?} in {job}");
    let job = row(
        table(&page, "jobs-scheduled"),
        &format!(
            "<tr><td><a href=/jobs/{id}>{id}</a></td>",
            id = deferred[0].id
        ),
    );
    assert!(
        job.contains("deferred by rate limit api/acct until") && job.contains("(1st in line)"),
        "{job}"
    );
}

/// A limit with a key per account must not make the page as long as the
/// accounts: the busiest keys are listed, the others summed in one row.
#[test]
fn a_limit_with_many_keys_lists_the_busiest_and_sums_the_others() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let mut jobs: Vec<NewJob> = (0..52).map(|i| limits::sync(&format!("k{i:02}"))).collect();
    jobs.extend((0..3).map(|_| limits::sync("z-busy")));
    queue.enqueue_batch(jobs).unwrap();

    let served = serve(&env, &[]);
    let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
    let shown = table(&page, "limits");
    let keys: Vec<&str> = shown
        .split("data-key=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(keys.len(), 50, "{shown}");
    // Sorted by name it would be last, and left out.
    assert_eq!(keys[0], "z-busy");
    assert_eq!(keys[49], "k48");
    let more = row(shown, "<tr data-limit=\"sync\" data-more>");
    assert!(more.contains("and 3 more keys"), "{more}");
    let waiting: u64 = ["blocked", "pending"]
        .iter()
        .map(|column| {
            let cell = format!("data-column={column}>");
            more.split(&cell)
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(waiting, 3, "{more}");
}

/// Limit names and keys are chosen by whoever enqueues; like every other
/// text on the page they are escaped, in the Limits section, in its
/// attributes and in a waiting job's explanation.
#[test]
fn limit_names_keys_and_workers_are_escaped() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let name = "<script>alert(1)</script>";
    let key = "\"><img src=x onerror=alert(2)>";
    let unset = "u<svg onload=alert(3)>";
    queue.set_limit(name, Limit::per_key(1)).unwrap();
    let job = || NewJob::new("k").limit(name, key);
    queue
        .enqueue_batch(vec![job(), job(), NewJob::new("k").limit(unset, "'x'")])
        .unwrap();
    let held = queue
        .manual()
        .claim("default", "<b>w</b>", 3, Duration::from_secs(30))
        .unwrap();
    assert_eq!(held.len(), 2, "one of the limit, one unlimited");
    assert_eq!(env.in_state(JobState::Blocked).len(), 1);

    let served = serve(&env, &[]);
    let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
    assert_eq!(status, 200);
    for raw in ["<script", "<img", "<svg onload", "<b>w"] {
        assert!(!page.contains(raw), "{raw:?} unescaped in the page");
    }
    let name_shown = "&lt;script&gt;alert(1)&lt;/script&gt;";
    let key_shown = "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;";
    row(
        table(&page, "limits"),
        &format!("<tr data-limit=\"{name_shown}\" data-key=\"{key_shown}\">"),
    );
    let unset_row = row(
        table(&page, "limits"),
        "<tr data-limit=\"u&lt;svg onload=alert(3)&gt;\">",
    );
    assert!(unset_row.contains("not set: unlimited"), "{unset_row}");
    assert!(page.contains(&format!(
        "blocked by limit {name_shown}/{key_shown}: 1 of 1 held by job"
    )));
    assert!(page.contains("(worker &lt;b&gt;w&lt;/b&gt;,"), "{page}");
}

/// Failures reported against other job queues' dashboards, metrics
/// endpoints, job events and queue pauses, tried on tickler: they pass and
/// stay as regression tests, each naming the report it follows.
mod other_queues_dashboard_reports {
    use crate::support::cli;
    use crate::support::pool;
    use cli::serve::{csrf_of, http, serve};
    use cli::{wait_for, Env};
    use pool::{ms, secs, wait_until, Recorder};
    use tickler::{JobId, JobState, NewJob, NewSchedule, Queue, WorkerPool};

    /// A fresh queue file made by `tickler init`, for the tests of the binary
    /// (SQLite only: the binary runs on a file here).
    fn binary_env() -> Env {
        let env = Env::new();
        env.run(&["init"]).ok();
        env
    }

    /// A queue on the CLI test's file whose failed jobs are due again at once.
    fn no_backoff(env: &Env) -> Queue {
        Queue::builder(&env.db)
            .retry_policy(pool::no_backoff())
            .open()
            .unwrap()
    }

    /// Claims the next job of `queue` and fails it with `error`.
    fn claim_and_fail(queue: &Queue, name: &str, error: &str) -> JobId {
        let lease = queue
            .manual()
            .claim(name, "hunt", 1, secs(30))
            .unwrap()
            .pop()
            .expect("a due job");
        queue.manual().fail(&lease, error).unwrap();
        lease.job_id
    }

    /// The port of a served address.
    fn port(addr: &str) -> &str {
        addr.rsplit(':').next().unwrap()
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// DNS rebinding, against a dashboard that has no auth of its own and
    /// relies on loopback (Flower #1217, CVE-2022-30034: Flower unauthenticated
    /// by default and without CSRF protection; rebinding reports against
    /// loopback dashboards generally): a page of attacker.example,
    /// whose name the attacker then points at 127.0.0.1, is same-origin with
    /// the dashboard in the victim's browser. The browser still sends `Host:
    /// attacker.example:PORT`; without a token, that must get neither the page
    /// (which holds the CSRF token) nor an action.
    #[test]
    fn dns_rebinding_another_host_name_gets_no_page_and_no_action() {
        let env = binary_env();
        let queue = env.queue();
        queue
            .enqueue(NewJob::new("k").queue("mail").max_attempts(1))
            .unwrap();
        let dead = claim_and_fail(&queue, "mail", "boom");
        let served = serve(&env, &[]);
        let served_port = port(&served.addr);

        // The real page, for its CSRF token.
        let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
        assert_eq!(status, 200);
        let csrf = csrf_of(&page);

        let evil = format!("Host: attacker.example:{served_port}");
        let (status, _, body) = http(&served.addr, "GET", "/", &[&evil], "");
        assert_eq!(status, 403);
        assert!(!body.contains("csrf"));
        let (status, _, _) = http(&served.addr, "GET", "/metrics", &[&evil], "");
        assert_eq!(status, 403);
        let (status, _, _) = http(
            &served.addr,
            "POST",
            "/retry",
            &[&evil],
            &format!("id={dead}&csrf={csrf}"),
        );
        assert_eq!(status, 403);
        assert_eq!(env.job(dead).state, JobState::Dead);
        let (status, _, _) = http(
            &served.addr,
            "POST",
            "/pause",
            &[&evil],
            &format!("queue=mail&csrf={csrf}"),
        );
        assert_eq!(status, 403);
        assert!(env.queue().paused_queues().unwrap().is_empty());

        // Names no one else can point elsewhere still work.
        for host in [
            format!("127.0.0.1:{served_port}"),
            format!("localhost:{served_port}"),
            format!("LocalHost:{served_port}"),
            format!("[::1]:{served_port}"),
            "127.0.0.1".to_owned(),
        ] {
            let header = format!("Host: {host}");
            let (status, _, _) = http(&served.addr, "GET", "/", &[&header], "");
            assert_eq!(status, 200, "{host}");
        }

        // With a token the token is what protects (the rebinding page has
        // neither it nor the cookie of the real origin): any name may be used,
        // as through a reverse proxy.
        let token = "0123456789abcdef0123";
        let with_token = serve(&env, &["--token", token]);
        let evil = format!("Host: jobs.example.com:{}", port(&with_token.addr));
        let bearer = format!("Authorization: Bearer {token}");
        let (status, _, _) = http(&with_token.addr, "GET", "/", &[&evil, &bearer], "");
        assert_eq!(status, 200);
        let (status, _, _) = http(&with_token.addr, "GET", "/", &[&evil], "");
        assert_eq!(status, 401);
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Hangfire #1441 (a `<script>` in an exception message ran in the
    /// dashboard), Sidekiq #1297 (HTML in a retry's error message), Sidekiq
    /// #2309 and #2824 (script in job arguments), Sidekiq #2330 and #4852
    /// (script in a queue name, also through the URL): every text a job or an
    /// operator chose is escaped, in element content and in attribute values,
    /// and nothing of the request is echoed back.
    #[test]
    fn xss_through_errors_queue_names_kinds_schedules_and_urls_is_escaped() {
        let env = binary_env();
        let queue = env.queue();
        let nasty_queue = "q\"><img src=x onerror=alert(1)>' onmouseover='alert(2)";
        let nasty_kind = "<script>alert(3)</script>";
        queue
            .enqueue(
                NewJob::new(nasty_kind)
                    .queue(nasty_queue)
                    .max_attempts(1)
                    .payload(serde_json::json!({"html": "<svg onload=alert(4)>"})),
            )
            .unwrap();
        claim_and_fail(&queue, nasty_queue, "</td><script>alert(5)</script>");
        queue
            .enqueue(NewJob::new(nasty_kind).queue(nasty_queue))
            .unwrap();
        queue.pause_queue("p\"><script>alert(6)</script>").unwrap();
        queue
            .upsert_schedule(
                NewSchedule::new("s\"><script>alert(7)</script>", "0 * * * *", "k")
                    .time_zone("UTC"),
            )
            .unwrap();
        let served = serve(&env, &[]);
        let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
        assert_eq!(status, 200);

        for raw in ["<script", "<img", "<svg onload", "' onmouseover='"] {
            assert!(!page.contains(raw), "{raw:?} unescaped in the page");
        }
        // What was escaped is there, so the test looked at the right page.
        assert!(page.contains("&lt;script&gt;alert(3)&lt;/script&gt;"));
        assert!(page.contains("&lt;/td&gt;&lt;script&gt;alert(5)"));
        assert!(page.contains("s&quot;&gt;&lt;script&gt;alert(7)"));
        assert!(
            page.contains("q&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&#39; onmouseover=&#39;")
        );

        // A path or query with markup is not reflected.
        for path in ["/%3Cscript%3Ealert(8)%3C/script%3E", "/?x=<script>alert(9)"] {
            let (_, _, body) = http(&served.addr, "GET", path, &[], "");
            assert!(
                !body.contains("alert(8)") && !body.contains("alert(9)"),
                "{body}"
            );
        }
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// riverui #622: retrying a discarded unique job while another live job
    /// holds its unique key answered HTTP 500 (the UI fell over); the retry must
    /// be refused without a duplicate, with an answer that says why. The same
    /// for a second press of a retry button (the job is pending by then) and a
    /// job that no longer exists.
    #[test]
    fn retry_refused_by_a_held_unique_key_is_a_conflict_not_a_server_error() {
        let env = binary_env();
        let queue = env.queue();
        queue
            .enqueue(NewJob::new("k").unique_key("report-42").max_attempts(1))
            .unwrap();
        let dead = claim_and_fail(&queue, "default", "boom");
        let holder = queue
            .enqueue(NewJob::new("k").unique_key("report-42"))
            .unwrap();
        assert_ne!(holder, dead);
        let served = serve(&env, &[]);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        let csrf = csrf_of(&page);

        let (status, _, body) = http(
            &served.addr,
            "POST",
            "/retry",
            &[],
            &format!("id={dead}&csrf={csrf}"),
        );
        assert_eq!(status, 409, "{body}");
        assert!(body.contains("report-42"), "{body}");
        assert_eq!(env.job(dead).state, JobState::Dead);
        assert_eq!(env.in_state(JobState::Pending).len(), 1);

        // The holder finishes; the retry goes through; a second press is
        // refused as a conflict too.
        env.queue().cancel(holder).unwrap();
        let retry = format!("id={dead}&csrf={csrf}");
        assert_eq!(http(&served.addr, "POST", "/retry", &[], &retry).0, 303);
        let (status, _, body) = http(&served.addr, "POST", "/retry", &[], &retry);
        assert_eq!(status, 409, "{body}");
        assert_eq!(env.in_state(JobState::Pending).len(), 1);
        // No such job: 404; no id: 400.
        let (status, _, _) = http(
            &served.addr,
            "POST",
            "/retry",
            &[],
            &format!("id=999999&csrf={csrf}"),
        );
        assert_eq!(status, 404);
        let (status, _, _) = http(
            &served.addr,
            "POST",
            "/cancel",
            &[],
            &format!("csrf={csrf}"),
        );
        assert_eq!(status, 400);
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Hangfire.Mongo #380 and Hangfire #2380: requeueing a job from the
    /// dashboard while it was still processing started a second run of it
    /// beside the first. A running job offers no retry button and a forged
    /// retry is refused; cancelled from the dashboard and then retried, it does
    /// not start again while its first run's lease lasts.
    #[test]
    fn retry_from_the_dashboard_never_runs_a_job_beside_its_running_self() {
        let env = binary_env();
        let queue = env.queue();
        let rec = Recorder::new();
        let mut pool = WorkerPool::builder(&queue)
            .threads(2)
            .lease(secs(3))
            .handler("script", rec.script())
            .start()
            .unwrap();
        let id = queue
            .enqueue(NewJob::new("script").payload(serde_json::json!({"block": true})))
            .unwrap();
        wait_until("the handler started", secs(10), || rec.started() == 1);
        let served = serve(&env, &[]);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        assert!(page.contains(&format!("id=\"cancel-{id}\"")), "{page}");
        assert!(!page.contains(&format!("id=\"retry-{id}\"")), "{page}");
        let csrf = csrf_of(&page);

        let retry = format!("id={id}&csrf={csrf}");
        assert_eq!(http(&served.addr, "POST", "/retry", &[], &retry).0, 409);
        assert_eq!(env.job(id).state, JobState::Running);

        let cancel = format!("id={id}&csrf={csrf}");
        assert_eq!(http(&served.addr, "POST", "/cancel", &[], &cancel).0, 303);
        assert_eq!(http(&served.addr, "POST", "/retry", &[], &retry).0, 303);
        // The first run goes on (it ignores its cancellation) for a while; the
        // other thread is free, yet the job does not start again.
        std::thread::sleep(ms(700));
        assert_eq!(rec.started(), 1);
        rec.gate.open();
        wait_until("the retried job ran", secs(15), || rec.started() == 2);
        let runs = rec.runs_of(id);
        let first_end = rec.ends_of(id)[0].ended;
        assert!(
            runs[1].started >= first_end,
            "the second run started before the first ended"
        );
        pool.shutdown(secs(5));
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Sidekiq #1988 and #6832, mission_control-jobs #265, verk_web #35: long
    /// job arguments or backtraces made the list pages enormous (or not load).
    /// tickler shows no arguments, but each job's error history: 20 dead jobs
    /// of 20 attempts, each error at the 8 KiB limit, made a page of over 3 MB.
    /// A list shows each job's last error shortened and the few before it a
    /// short line each; the rest is one `tickler show` away.
    #[test]
    fn long_error_histories_keep_the_page_small() {
        let env = binary_env();
        let queue = no_backoff(&env);
        let ids = queue
            .enqueue_batch(
                (0..20)
                    .map(|_| NewJob::new("k").queue("big").max_attempts(20))
                    .collect(),
            )
            .unwrap();
        for _ in 0..20 * ids.len() {
            let lease = queue
                .manual()
                .claim("big", "hunt", 1, secs(30))
                .unwrap()
                .remove(0);
            let error = format!("attempt {} failed: {}", lease.attempt, "x".repeat(9000));
            queue.manual().fail(&lease, &error).unwrap();
        }
        assert_eq!(env.in_state(JobState::Dead).len(), 20);
        let served = serve(&env, &[]);
        let (status, _, page) = http(&served.addr, "GET", "/", &[], "");
        assert_eq!(status, 200);
        assert!(
            page.len() < 200 * 1024,
            "the page is {} bytes for 20 dead jobs",
            page.len()
        );
        // The newest error's start, the four before it, and where to find
        // the rest.
        assert!(page.contains("attempt 20 failed: xxx"));
        assert!(page.contains("attempt 16 failed: xxx"));
        assert!(!page.contains("attempt 15 failed"));
        assert!(page.contains("15 earlier errors"), "{page}");
        assert!(page.contains(&format!("tickler show {}", ids[0])), "{page}");
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// A dashboard token accepted as `?token=` stays in the address bar, the
    /// history and `Referer` headers (reported against dashboards in general,
    /// e.g. ThinkOffApp/CarWatch #12, librefang #3838; no job queue's report
    /// found): `/?token=` sets the cookie and redirects to a URL without the
    /// token, and pages send no referrer.
    #[test]
    fn a_token_in_the_url_is_swapped_for_the_cookie_and_a_clean_url() {
        let env = binary_env();
        let token = "0123456789abcdef0123";
        let served = serve(&env, &["--token", token]);
        let (status, head, body) = http(&served.addr, "GET", &format!("/?token={token}"), &[], "");
        assert_eq!(status, 303, "{head}");
        assert!(head.contains("Location: /\r\n"), "{head}");
        assert!(
            head.contains(&format!("tickler_token={token}; HttpOnly")),
            "{head}"
        );
        assert!(!body.contains(token));
        let cookie = format!("Cookie: tickler_token={token}");
        let (status, head, _) = http(&served.addr, "GET", "/", &[&cookie], "");
        assert_eq!(status, 200);
        assert!(head.contains("Referrer-Policy: no-referrer"), "{head}");
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Found on the way (no upstream report): a token with a character a
    /// header value cannot hold (`é`) made the answer to `/?token=` panic in
    /// the server's only thread, ending `tickler serve`; one with `;` or a
    /// space makes a cookie that never matches, and one with `+`, `%`, `&` or
    /// `#` is changed or cut in `/?token=`. Such a token is refused at start.
    #[test]
    fn a_token_that_cannot_be_a_cookie_is_refused_at_start() {
        let env = binary_env();
        for token in [
            "très-secret-très-long",
            "0123456789;abcdef",
            "0123 4567 89ab cdef",
            "0123456789+abcdef",
            "0123456789&abcdef",
            "0123456789%2Fabcdef",
            "0123456789#abcdef",
        ] {
            let child = env.spawn(&["serve", "--listen", "127.0.0.1:0", "--token", token]);
            wait_for(child, secs(10)).fails(2, &["--token"]);
        }
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Hangfire #702 and #1313 (dashboard times in a mix of GMT and local time,
    /// none saying which): the plot's minutes say their zone.
    #[test]
    fn the_plot_says_its_times_are_utc() {
        let env = binary_env();
        let queue = env.queue();
        queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "t", 1, secs(30))
            .unwrap()
            .remove(0);
        queue.manual().complete(&lease).unwrap();
        let served = serve(&env, &[]);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        let titles: Vec<&str> = page
            .split("<title>")
            .skip(2) // the page's own title
            .map(|t| t.split("</title>").next().unwrap())
            .collect();
        assert_eq!(titles.len(), 60, "{page}");
        assert!(titles.iter().all(|t| t.contains("UTC")), "{titles:?}");
    }

    /// The bug it guards: the red part of a minute's bar was the dead
    /// share of the sample of the last 200 jobs to finish, and jobs that
    /// fail finish last, so a minute with 11 % dead showed 80 %; its
    /// tooltip gave no dead count and the x axis no times. Here 250 jobs
    /// succeed and then 30 go dead: the sample's share would be 30/200,
    /// the real one is 30/280.
    #[test]
    fn the_plot_shows_counted_dead_with_times_in_tooltips_and_on_the_axis() {
        let env = binary_env();
        let queue = env.queue();
        let (ok, dead) = (250usize, 30usize);
        queue
            .enqueue_batch(
                (0..ok + dead)
                    .map(|_| NewJob::new("k").max_attempts(1))
                    .collect(),
            )
            .unwrap();
        let leases = queue
            .manual()
            .claim("default", "t", ok + dead, secs(60))
            .unwrap();
        assert_eq!(leases.len(), ok + dead);
        for lease in &leases[..ok] {
            queue.manual().complete(lease).unwrap();
        }
        std::thread::sleep(ms(20));
        for lease in &leases[ok..] {
            queue.manual().fail(lease, "boom").unwrap();
        }
        let served = serve(&env, &[]);
        let asked = chrono::Utc::now();
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        let svg = page
            .split("<svg id=plot")
            .nth(1)
            .and_then(|s| s.split("</svg>").next())
            .expect("the plot");
        let columns: Vec<&str> = svg.split("<g><title>").skip(1).collect();
        assert_eq!(columns.len(), 60, "{svg}");
        let last = columns[59];
        let title = last.split("</title>").next().unwrap();
        assert!(
            title.contains("280 finished, 30 dead,"),
            "the counts, counted: {title}"
        );
        // Start – end of the slice, the end a moment before the request.
        let (start, end) = title
            .split(" UTC")
            .next()
            .unwrap()
            .split_once(" – ")
            .unwrap_or_else(|| panic!("{title}"));
        let hms = |t: &str| chrono::NaiveTime::parse_from_str(t, "%H:%M:%S").unwrap();
        let (start, end) = (hms(start), hms(end));
        assert_eq!(
            (end - start).num_seconds().rem_euclid(86_400),
            60,
            "{title}"
        );
        let off = (hms(&asked.format("%H:%M:%S").to_string()) - end)
            .num_seconds()
            .rem_euclid(86_400);
        assert!(off <= 5, "{title} at {asked}");
        // Every other column finished nothing and says so.
        assert!(
            columns[..59]
                .iter()
                .all(|c| c.contains(": 0 finished, 0 dead,")),
            "{columns:?}"
        );

        // The red part of the bar is the counted share.
        let height = |fill: &str| -> f64 {
            let rect = last
                .split("<rect ")
                .find(|r| r.contains(&format!("fill=\"{fill}\"")))
                .unwrap_or_else(|| panic!("{fill} in {last}"));
            rect.split("height=")
                .nth(1)
                .unwrap()
                .split([' ', '/'])
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (bar, red) = (height("#4a7"), height("#c33"));
        let share = dead as f64 / (ok + dead) as f64;
        assert!(
            (red - bar * share).abs() < 0.11,
            "red {red} of {bar}, want {}",
            bar * share
        );

        // The x axis: times every 10 minutes, in UTC as the rest of the
        // page, and the zone said once.
        let axis = svg
            .split("<g id=time-axis>")
            .nth(1)
            .and_then(|s| s.split("</g>").next())
            .expect("the time axis");
        let labels: Vec<&str> = axis
            .split("<text")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        let (zone, times) = labels.split_last().unwrap();
        assert_eq!(*zone, "UTC", "{labels:?}");
        assert!((6..=7).contains(&times.len()), "{labels:?}");
        let times: Vec<chrono::NaiveTime> = times
            .iter()
            .map(|t| chrono::NaiveTime::parse_from_str(t, "%H:%M").unwrap())
            .collect();
        for pair in times.windows(2) {
            assert_eq!(
                (pair[1] - pair[0]).num_minutes().rem_euclid(1440),
                10,
                "{labels:?}"
            );
        }
        assert!(
            times.iter().all(|t| chrono::Timelike::minute(t) % 10 == 0),
            "{labels:?}"
        );
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// rq-exporter #28, prometheus-prefect-exporter #84 (labels per worker or
    /// run id: a new series per job, unbounded): /metrics has as many series
    /// for 1,000 jobs with distinct unique keys, errors and payloads as for
    /// one, and a queue name with `"`, `\` and a line feed is escaped as the
    /// text format wants.
    #[test]
    fn metrics_series_do_not_grow_with_jobs_and_labels_are_escaped() {
        let env = binary_env();
        let queue = no_backoff(&env);
        let odd = "we\"ird\\queue\nname";
        let served = serve(&env, &[]);
        let scrape = || {
            let (status, _, body) = http(&served.addr, "GET", "/metrics", &[], "");
            assert_eq!(status, 200);
            let parsed =
                prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
            (parsed.samples.len(), body)
        };
        let fill = |n: usize, tag: &str| {
            queue
                .enqueue_batch(
                    (0..n)
                        .map(|i| {
                            NewJob::new("k")
                                .queue(odd)
                                .unique_key(format!("{tag}-{i}"))
                                .payload(serde_json::json!({ "i": i }))
                                .max_attempts(1)
                        })
                        .collect(),
                )
                .unwrap();
            for i in 0..n / 2 {
                claim_and_fail(&queue, odd, &format!("error {tag} {i}"));
            }
        };
        fill(2, "a");
        let (small, _) = scrape();
        fill(1000, "b");
        let (big, body) = scrape();
        assert_eq!(big, small, "{body}");
        // The text format's escapes: backslash, double quote, line feed.
        let line = "tickler_jobs{queue=\"we\\\"ird\\\\queue\\nname\",state=\"dead\"} 501\n";
        assert!(body.contains(line), "{body}");
    }

    /// The bug it guards (from a hunt through other queues' reports):
    /// Sidekiq #4852 and #2330 (queue names in URLs and attributes): a queue
    /// whose name has the characters a form encodes (`&`, `=`, `+`, `%`, space,
    /// quotes, non-ASCII) is paused and resumed by its buttons, as a browser
    /// sends them, and no other queue is.
    #[test]
    fn pause_and_resume_buttons_work_for_any_queue_name() {
        let env = binary_env();
        let name = "a&b=c+d %20 \"é\"";
        env.queue().enqueue(NewJob::new("k").queue(name)).unwrap();
        env.queue().enqueue(NewJob::new("k").queue("a")).unwrap();
        let served = serve(&env, &[]);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        let csrf = csrf_of(&page);
        assert!(
            page.contains("id=\"pause-a&amp;b=c+d %20 &quot;é&quot;\""),
            "{page}"
        );
        // application/x-www-form-urlencoded, as a browser encodes the field.
        let encoded = "a%26b%3Dc%2Bd+%2520+%22%C3%A9%22";
        let (status, _, _) = http(
            &served.addr,
            "POST",
            "/pause",
            &[],
            &format!("csrf={csrf}&queue={encoded}"),
        );
        assert_eq!(status, 303);
        assert_eq!(env.queue().paused_queues().unwrap(), vec![name.to_owned()]);
        let (_, _, page) = http(&served.addr, "GET", "/", &[], "");
        assert!(page.contains("id=\"resume-a&amp;b=c+d %20 &quot;é&quot;\""));
        http(
            &served.addr,
            "POST",
            "/resume",
            &[],
            &format!("csrf={csrf}&queue={encoded}"),
        );
        assert!(env.queue().paused_queues().unwrap().is_empty());
    }
}

#[test]
fn running_jobs_show_a_progress_bar_and_waiting_jobs_what_they_run_after() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let parent = queue.enqueue(NewJob::new("export")).unwrap();
    let child = queue
        .enqueue(NewJob::new("upload").after(&[parent]))
        .unwrap();
    let leases = limits::claim(&queue, 10);
    assert_eq!(limits::ids(&leases), vec![parent]);
    queue
        .manual()
        .record_progress(&[(&leases[0], 0.45, "<b>encoding</b>")])
        .unwrap();

    let served = serve(&env, &[]);
    let bar =
        "<progress class=bar value=\"0.450\" max=1></progress> 45 % &lt;b&gt;encoding&lt;/b&gt;";
    for path in ["/", "/jobs?state=running", &format!("/jobs/{parent}")] {
        let (status, _, page) = http(&served.addr, "GET", path, &[], "");
        assert_eq!(status, 200, "{path}");
        assert!(page.contains(bar), "{path}: {page}");
        assert!(!page.contains("<b>encoding"), "{path}: unescaped");
    }
    let (status, _, page) = http(&served.addr, "GET", &format!("/jobs/{child}"), &[], "");
    assert_eq!(status, 200);
    assert!(
        page.contains(&format!(
            "<a href=/jobs/{parent}>{parent}</a> (if it fails: cancel)"
        )),
        "{page}"
    );
    assert!(
        page.contains(&format!("waiting for {parent} (running on ")),
        "{page}"
    );
    let (_, _, page) = http(&served.addr, "GET", "/jobs?state=waiting", &[], "");
    assert!(page.contains(&format!("<tr data-id={child}")), "{page}");
}
