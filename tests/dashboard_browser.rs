//! `tickler serve`'s dashboard in a real browser: headless Chromium driven
//! over the DevTools protocol (feature `browser-tests`). Each test has its
//! own queue file, server process and browser.
//!
//! Chromium is `TICKLER_CHROMIUM` if set, else Debian's `/usr/bin/chromium`
//! (`apt-get install chromium`, as .ci/run does); a missing browser fails
//! the tests rather than skipping them.

#[path = "support/mod.rs"]
mod support;

use support::cli;

use cli::serve::{dead_jobs, filled, serve, KillOnDrop};
use cli::Env;
use headless_chrome::protocol::cdp::{Emulation, Page};
use headless_chrome::{Browser, LaunchOptions, Tab};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{JobId, JobState, NewJob};

/// Longest wait for anything the browser or a worker does.
const WAIT: Duration = Duration::from_secs(30);

/// Flags beyond headless_chrome's defaults (which already disable
/// background networking, sync and the first-run UI): on a machine with no
/// network, without these Chromium keeps trying to reach its services.
const CHROMIUM_FLAGS: &[&str] = &[
    "--disable-quic",
    "--disable-component-update",
    "--disable-background-networking",
    "--disable-sync",
    "--no-first-run",
];

/// A headless Chromium with a fresh profile, killed on drop.
struct Chromium {
    // Declared before the profile: dropped (the process killed) before
    // the profile folder is removed.
    browser: Browser,
    _profile: tempfile::TempDir,
}

fn chromium() -> Chromium {
    let path = std::env::var_os("TICKLER_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "no Chromium at {}: install it (on Debian: apt-get install chromium chromium-driver) \
         or set TICKLER_CHROMIUM to its path",
        path.display()
    );
    let profile = tempfile::tempdir().unwrap();
    let options = LaunchOptions {
        path: Some(path.clone()),
        headless: true,
        // Root in CI and in containers, where Chromium's sandbox cannot
        // start.
        sandbox: false,
        enable_gpu: false,
        user_data_dir: Some(profile.path().to_owned()),
        // Chromium picks a free port and prints it: no race with other
        // tests for a port chosen here.
        port: Some(0),
        window_size: Some((1280, 900)),
        // The pause test waits on a worker without talking to the browser.
        idle_browser_timeout: Duration::from_secs(300),
        args: CHROMIUM_FLAGS.iter().map(OsStr::new).collect(),
        ..LaunchOptions::default()
    };
    let browser = Browser::new(options)
        .unwrap_or_else(|e| panic!("starting Chromium at {}: {e:#}", path.display()));
    Chromium {
        browser,
        _profile: profile,
    }
}

impl Chromium {
    /// A new tab showing `url`, loaded.
    fn open(&self, url: &str) -> Arc<Tab> {
        open_page(self, url, "document.querySelector('table#counts') !== null")
    }
}

/// `expression`'s value, as JSON (the page's own script is not involved:
/// the dashboard's CSP allows none but its own, which only `?live=1` loads).
fn eval(tab: &Tab, expression: &str) -> serde_json::Value {
    let object = tab
        .evaluate(&format!("JSON.stringify({expression})"), false)
        .unwrap_or_else(|e| panic!("evaluating {expression}: {e:#}"));
    let text = object
        .value
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("{expression} gave no value: {:?}", object.description));
    serde_json::from_str(&text).unwrap()
}

fn exists(tab: &Tab, selector: &str) -> bool {
    eval(
        tab,
        &format!("document.querySelector({selector:?}) !== null"),
    ) == true
}

/// Clicks the element `selector` (a real mouse click at its middle) and
/// waits for the dashboard page the click's form leads to.
fn click_and_wait(tab: &Tab, selector: &str, condition: &str) {
    click_then(
        tab,
        selector,
        &format!("document.querySelector('table#counts') !== null && ({condition})"),
    );
}

#[test]
fn the_counts_on_the_page_match_the_file() {
    let env = filled();
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));

    let cells: Vec<(String, String, String)> = serde_json::from_value(eval(
        &tab,
        "[...document.querySelectorAll('table#counts td[data-queue][data-state]')]\
         .map(td => [td.dataset.queue, td.dataset.state, td.innerText.trim()])",
    ))
    .unwrap();
    let stats = env.queue().stats().unwrap();
    let mut shown = BTreeSet::new();
    for (queue, state, text) in &cells {
        let state: JobState = state.parse().unwrap();
        let in_file = stats
            .counts
            .get(&(queue.clone(), state))
            .copied()
            .unwrap_or(0);
        assert_eq!(
            text,
            &in_file.to_string(),
            "the page's ({queue}, {state:?}) against the file's"
        );
        assert!(
            shown.insert((queue.clone(), state)),
            "({queue}, {state:?}) shown twice"
        );
    }
    for ((queue, state), n) in &stats.counts {
        assert!(
            *n == 0 || shown.contains(&(queue.clone(), *state)),
            "{n} {state:?} job(s) of {queue} in the file, not on the page: {cells:?}"
        );
    }
}

#[test]
fn retrying_a_dead_job_from_the_page_makes_it_pending() {
    let env = filled();
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));
    let dead = env.in_state(JobState::Dead)[0].id;
    let button = format!("table#jobs-dead #retry-{}", dead.0);
    assert!(exists(&tab, &button), "no {button}");

    click_and_wait(&tab, &button, "true");
    assert_eq!(env.job(dead).state, JobState::Pending);
    assert!(
        !exists(&tab, &button),
        "the retried job is still in the dead table"
    );
    let cancel = format!("table#jobs-pending #cancel-{}", dead.0);
    assert!(
        exists(&tab, &cancel),
        "the retried job is not in the pending table"
    );
}

/// `tickler work` on the env's file and queues, in its own process; its
/// output goes to files in the env's folder (see [`worker_output`]).
fn start_worker(env: &Env, queues: &[&str]) -> KillOnDrop {
    let mut args = vec!["work", "--threads", "2"];
    for q in queues {
        args.extend(["--queue", q]);
    }
    let file = |name: &str| File::create(env.dir.path().join(name)).unwrap();
    KillOnDrop(
        env.command(&args)
            .stdout(Stdio::from(file("work.stdout")))
            .stderr(Stdio::from(file("work.stderr")))
            .spawn()
            .expect("spawn tickler work"),
    )
}

fn worker_output(env: &Env) -> String {
    let read = |f: &str| std::fs::read_to_string(env.dir.path().join(f)).unwrap_or_default();
    format!("{}{}", read("work.stdout"), read("work.stderr"))
}

fn enqueue_true(env: &Env, queue: &str) -> JobId {
    env.queue()
        .enqueue(
            NewJob::new("shell")
                .queue(queue)
                .payload(serde_json::json!({ "argv": ["true"] })),
        )
        .unwrap()
}

/// Waits until every job of `ids` has succeeded, the worker running all
/// along.
fn wait_done(env: &Env, worker: &mut KillOnDrop, ids: &[JobId], what: &str) {
    let deadline = Instant::now() + WAIT;
    while !ids
        .iter()
        .all(|&id| env.job(id).state == JobState::Succeeded)
    {
        if let Some(status) = worker.0.try_wait().unwrap() {
            panic!("the worker exited ({status}): {}", worker_output(env));
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}; worker: {}",
            ids.iter().map(|&id| env.job(id).state).collect::<Vec<_>>(),
            worker_output(env)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pausing_a_queue_on_the_page_stops_a_worker_pool_in_another_process() {
    let env = filled();
    let served = serve(&env, &[]);
    let mut worker = start_worker(&env, &["mail", "reports"]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));

    // The pool runs and claims from both queues before the pause.
    let before = [enqueue_true(&env, "mail"), enqueue_true(&env, "reports")];
    wait_done(&env, &mut worker, &before, "jobs before the pause");

    click_and_wait(
        &tab,
        "#pause-mail",
        "document.querySelector('#resume-mail') !== null",
    );
    assert_eq!(
        env.queue().paused_queues().unwrap(),
        vec!["mail".to_owned()]
    );

    let held: Vec<JobId> = (0..3).map(|_| enqueue_true(&env, "mail")).collect();
    // Each job of reports done proves a claim over both queues after the
    // held jobs were committed; a few rounds give the pool more chances
    // to take one, and the short sleep a pool that would claim late.
    for round in 0..3 {
        let probe = enqueue_true(&env, "reports");
        wait_done(
            &env,
            &mut worker,
            &[probe],
            &format!("reports round {round}"),
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    for &id in &held {
        assert_eq!(
            env.job(id).state,
            JobState::Pending,
            "the pool in the other process took a job of the paused queue; worker: {}",
            worker_output(&env)
        );
    }

    click_and_wait(
        &tab,
        "#resume-mail",
        "document.querySelector('#pause-mail') !== null",
    );
    assert!(env.queue().paused_queues().unwrap().is_empty());
    wait_done(&env, &mut worker, &held, "the resumed queue's jobs");
}

/// Where screenshots go: `TICKLER_SCREENSHOTS` if set, else
/// `browser-artifacts` in the target folder (which `.ci/run` keeps).
fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("TICKLER_SCREENSHOTS").map_or_else(
        || {
            PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .parent()
                .expect("CARGO_TARGET_TMPDIR is inside the target folder")
                .join("browser-artifacts")
        },
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `png` as `name` in [`screenshot_dir`] and returns its path.
fn save_screenshot(name: &str, png: &[u8]) -> PathBuf {
    let path = screenshot_dir().join(name);
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
    path
}

/// The tab's whole page as one PNG (the viewport made as tall as the
/// page), saved as `name`.
fn screenshot_page(tab: &Tab, name: &str) -> (PathBuf, u32, u32) {
    let width = 1280;
    let height: u32 = serde_json::from_value(eval(
        tab,
        "Math.ceil(document.documentElement.scrollHeight)",
    ))
    .unwrap();
    tab.call_method(Emulation::SetDeviceMetricsOverride {
        width,
        height,
        device_scale_factor: 1.0,
        mobile: false,
        scale: None,
        screen_width: None,
        screen_height: None,
        position_x: None,
        position_y: None,
        dont_set_visible_size: None,
        screen_orientation: None,
        viewport: None,
        display_feature: None,
        device_posture: None,
    })
    .unwrap();
    let png = tab
        .capture_screenshot(Page::CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    (save_screenshot(name, &png), width, height)
}

#[test]
fn a_screenshot_of_the_whole_dashboard_is_saved() {
    let env = filled();
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));

    // The viewport made as tall as the page: one PNG of all of it.
    let (path, width, height) = screenshot_page(&tab, "dashboard.png");

    let saved = std::fs::read(&path).unwrap();
    assert_eq!(&saved[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&saved[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(saved[at..at + 4].try_into().unwrap());
    assert_eq!(
        (be(16), be(20)),
        (width, height),
        "the PNG's size is not the page's"
    );
    // The page is tables of text: far from a blank image's few hundred
    // bytes.
    assert!(saved.len() > 20_000, "{} bytes", saved.len());
}

/// Opens `url` in a new tab and waits until it is loaded and `condition`
/// (JS) holds: for the pages other than the dashboard's front page.
fn open_page(chromium: &Chromium, url: &str, condition: &str) -> Arc<Tab> {
    let tab = chromium.browser.new_tab().unwrap();
    tab.set_default_timeout(WAIT);
    tab.navigate_to(url).unwrap();
    tab.wait_until_navigated().unwrap();
    wait_for(&tab, url, condition);
    tab
}

/// Waits until the tab's page is loaded, is not the one marked by
/// [`click_then`], and `condition` (JS) holds.
fn wait_for(tab: &Tab, what: &str, condition: &str) {
    let check = format!(
        "document.readyState === 'complete' && window.ticklerOldPage !== true && ({condition})"
    );
    let deadline = Instant::now() + WAIT;
    loop {
        // Evaluating while the page is replaced can fail: try again.
        let ready = tab
            .evaluate(&check, false)
            .ok()
            .and_then(|o| o.value)
            .and_then(|v| v.as_bool());
        if ready == Some(true) {
            return;
        }
        if Instant::now() >= deadline {
            let text = tab
                .evaluate("document.body ? document.body.innerText : ''", false)
                .ok()
                .and_then(|o| o.value);
            panic!(
                "timed out waiting for {what}: at {}, the page says {text:?}",
                tab.get_url()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The text of the element `selector` (JS), trimmed.
fn text(tab: &Tab, selector: &str) -> String {
    let v = eval(
        tab,
        &format!("(document.querySelector({selector:?}) || {{innerText: ''}}).innerText.trim()"),
    );
    v.as_str().unwrap_or_default().to_owned()
}

/// Waits until `condition` (JS) holds on whatever page the tab shows.
fn wait_until(tab: &Tab, what: &str, condition: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = tab
            .evaluate(
                &format!("document.readyState === 'complete' && ({condition})"),
                false,
            )
            .ok()
            .and_then(|o| o.value)
            .and_then(|v| v.as_bool());
        if ready == Some(true) {
            return;
        }
        if Instant::now() >= deadline {
            let body = tab
                .evaluate("document.body ? document.body.innerText : ''", false)
                .ok()
                .and_then(|o| o.value);
            panic!(
                "timed out waiting for {what}: at {}, the page says {body:?}",
                tab.get_url()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Clicks the element `selector` (a real mouse click at its middle) and
/// waits for the page its form or link leads to.
fn click_then(tab: &Tab, selector: &str, condition: &str) {
    eval(tab, "window.ticklerOldPage = true");
    tab.find_element(selector)
        .unwrap_or_else(|e| panic!("no {selector} on the page: {e:#}"))
        .click()
        .unwrap();
    wait_for(
        tab,
        &format!("the page after clicking {selector}"),
        condition,
    );
}

/// The ids of the rows of the page's jobs table, in order.
fn listed_ids(tab: &Tab) -> Vec<i64> {
    serde_json::from_value(eval(
        tab,
        "[...document.querySelectorAll('table#jobs tr[data-id]')].map(tr => Number(tr.dataset.id))",
    ))
    .unwrap()
}

#[test]
fn a_filtered_list_pages_by_link_and_a_search_finds_by_unique_key() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    // 60 pending jobs of mail (two kinds), 5 of reports between them.
    let mut mail = Vec::new();
    for i in 0..65 {
        let name = if i % 13 == 0 { "reports" } else { "mail" };
        let kind = if i % 2 == 0 { "send" } else { "bounce" };
        let id = queue
            .enqueue(NewJob::new(kind).queue(name).unique_key(format!("key-{i}")))
            .unwrap();
        if name == "mail" {
            mail.push(id.0);
        }
    }
    assert_eq!(mail.len(), 60);
    let served = serve(&env, &[]);
    let chromium = chromium();

    // From the front page to the list, then the filter form.
    let tab = chromium.open(&served.url("/"));
    click_then(
        &tab,
        "#all-pending",
        "document.querySelector('form.filters') !== null",
    );
    eval(
        &tab,
        "(document.querySelector('select[name=state]').value = 'pending', \
          document.querySelector('input[name=queue]').value = 'mail', true)",
    );
    click_then(
        &tab,
        "#filter",
        "document.querySelector('table#jobs') !== null",
    );
    let first = listed_ids(&tab);
    assert_eq!(first.len(), 50, "a page holds 50 jobs");
    click_then(&tab, "#next", "document.querySelector('#first') !== null");
    let second = listed_ids(&tab);
    assert!(!exists(&tab, "#next"), "a last page links to no next one");
    // Claim order: one priority and due time, so by id; all of mail,
    // each once, none of reports.
    let walked: Vec<i64> = first.into_iter().chain(second).collect();
    assert_eq!(walked, mail);
    let queues: Vec<String> = serde_json::from_value(eval(
        &tab,
        "[...document.querySelectorAll('table#jobs tr[data-id] td:nth-child(3)')].map(td => td.innerText)",
    ))
    .unwrap();
    assert!(queues.iter().all(|q| q == "mail"), "{queues:?}");

    // A kind filter, by its form field.
    eval(
        &tab,
        "(document.querySelector('input[name=kind]').value = 'bounce', true)",
    );
    click_then(
        &tab,
        "#filter",
        "document.querySelector('table#jobs') !== null",
    );
    let bounces: Vec<i64> = mail
        .iter()
        .copied()
        .filter(|id| env.job(JobId(*id)).kind == "bounce")
        .collect();
    assert_eq!(listed_ids(&tab), bounces);

    // Search by unique key, then by id.
    eval(
        &tab,
        "(document.querySelector('#q').value = 'key-13', true)",
    );
    click_then(
        &tab,
        "#search",
        "document.querySelector('table#jobs') !== null",
    );
    let holder = queue.ops().holding_unique_key("key-13").unwrap().unwrap();
    assert_eq!(listed_ids(&tab), vec![holder.id.0]);
    eval(
        &tab,
        &format!("(document.querySelector('#q').value = '{}', true)", mail[7]),
    );
    click_then(
        &tab,
        "#search",
        "document.querySelector('table#jobs') !== null",
    );
    assert_eq!(listed_ids(&tab), vec![mail[7]]);
    eval(
        &tab,
        "(document.querySelector('#q').value = 'no-such-key', true)",
    );
    click_then(&tab, "#search", "document.querySelector('#none') !== null");
    assert!(listed_ids(&tab).is_empty());
}

#[test]
fn a_job_page_shows_its_history_and_hides_what_it_is_told_to() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let hour = Duration::from_secs(3600);
    let secret = "hunter2-do-not-show";
    let id = queue
        .enqueue(
            NewJob::new("charge")
                .queue("billing")
                .max_attempts(5)
                .payload(serde_json::json!({
                    "account": "ada",
                    "card": {"number": secret, "expires": "12/30"},
                })),
        )
        .unwrap();
    // Two failed attempts: the second after a cancel and a retry by hand.
    let fail = |error: &str| {
        let lease = queue
            .manual()
            .claim("billing", "w1", 1, hour)
            .unwrap()
            .remove(0);
        queue.manual().fail(&lease, error).unwrap();
    };
    fail("card declined <script>");
    queue.cancel(id).unwrap();
    queue.retry(id).unwrap();
    fail("gateway timeout");
    let job = env.job(id);
    assert_eq!(job.errors.len(), 2, "{:?}", job.errors);
    assert_eq!(job.state, JobState::Scheduled);
    let delayed = queue
        .enqueue(NewJob::new("charge").queue("billing").delay(hour))
        .unwrap();

    let served = serve(&env, &["--hide-payload-key", "number"]);
    let chromium = chromium();
    let tab = open_page(
        &chromium,
        &served.url(&format!("/jobs/{}", id.0)),
        "document.querySelector('table#errors') !== null",
    );
    let errors: Vec<String> = serde_json::from_value(eval(
        &tab,
        "[...document.querySelectorAll('table#errors td.err')].map(td => td.innerText)",
    ))
    .unwrap();
    assert_eq!(errors, vec!["gateway timeout", "card declined <script>"]);
    let payload: String =
        serde_json::from_value(eval(&tab, "document.querySelector('#payload').innerText")).unwrap();
    assert!(
        payload.contains("\"ada\"") && payload.contains("12/30"),
        "{payload}"
    );
    assert!(
        payload.contains("[hidden]") && !payload.contains(secret),
        "{payload}"
    );
    // Relative times, the exact one on hover.
    let due: String = serde_json::from_value(eval(
        &tab,
        "document.querySelector('tr[data-field=due] time').title",
    ))
    .unwrap();
    assert_eq!(
        due,
        job.run_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    let holder: String = serde_json::from_value(eval(
        &tab,
        "document.querySelector('tr[data-field=holder] td').innerText",
    ))
    .unwrap();
    assert_eq!(holder, "w1");
    // The hidden value is nowhere in what the server sent.
    let (status, _, body) =
        cli::serve::http(&served.addr, "GET", &format!("/jobs/{}", id.0), &[], "");
    assert_eq!(status, 200);
    assert!(!body.contains(secret) && body.contains("[hidden]"));

    // Retrying jobs apart from jobs delayed on purpose.
    let tab = open_page(
        &chromium,
        &served.url("/jobs?state=scheduled&retrying=yes"),
        "document.querySelector('table#jobs') !== null",
    );
    assert_eq!(listed_ids(&tab), vec![id.0]);
    let tab = open_page(
        &chromium,
        &served.url("/jobs?state=scheduled&retrying=no"),
        "document.querySelector('table#jobs') !== null",
    );
    assert_eq!(listed_ids(&tab), vec![delayed.0]);

    // --hide-payload: no payload at all.
    let all_hidden = serve(&env, &["--hide-payload"]);
    let (status, _, body) =
        cli::serve::http(&all_hidden.addr, "GET", &format!("/jobs/{}", id.0), &[], "");
    assert_eq!(status, 200);
    assert!(
        !body.contains(secret) && !body.contains("12/30") && !body.contains("\"ada\""),
        "{body}"
    );
    assert!(body.contains("gateway timeout"));
}

/// From a member's page to its batch by the link, where the hostile
/// description is text, the bar and counters say 2 of 4 ended, each
/// member shows its state and output, and a member's link leads back.
#[test]
fn a_batch_page_shows_its_members_and_links_both_ways() {
    let env = Env::new();
    let b = cli::batch::batched(&env);
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = open_page(
        &chromium,
        &served.url(&format!("/jobs/{}", b.dead.0)),
        "document.querySelector('a#batch') !== null",
    );
    click_then(
        &tab,
        "a#batch",
        "document.querySelector('table#members') !== null",
    );
    assert!(
        tab.get_url().ends_with(&format!("/batches/{}", b.batch.0)),
        "{}",
        tab.get_url()
    );
    let description = text(&tab, "tr[data-field=description] td");
    assert!(
        description.starts_with("<script>alert('x')</script> & \"mail\""),
        "{description:?}"
    );
    // Shown as text, so no element was made of it.
    assert_eq!(eval(&tab, "document.scripts.length"), 0);
    assert_eq!(
        eval(
            &tab,
            "[document.querySelector('#progress progress').value, document.querySelector('#progress progress').max]"
        ),
        serde_json::json!([2, 4])
    );
    let states: Vec<(i64, String)> = serde_json::from_value(eval(
        &tab,
        "[...document.querySelectorAll('table#members tr[data-id]')].map(tr => [Number(tr.dataset.id), tr.querySelector('[data-column=state]').innerText])",
    ))
    .unwrap();
    assert_eq!(
        states,
        vec![
            (b.succeeded.0, "succeeded".to_owned()),
            (b.dead.0, "dead".to_owned()),
            (b.pending.0, "pending".to_owned()),
            (b.waiting.0, "waiting".to_owned()),
        ]
    );
    let output = text(&tab, &format!("tr[data-id='{}'] td.output", b.succeeded.0));
    assert!(
        output.contains("\"path\":\"<b>exports/a.mp4</b>\""),
        "{output:?}"
    );
    screenshot_page(&tab, "batch.png");
    click_then(
        &tab,
        &format!("tr[data-id='{}'] a", b.pending.0),
        "document.querySelector('table#fields') !== null",
    );
    assert!(
        tab.get_url().ends_with(&format!("/jobs/{}", b.pending.0)),
        "{}",
        tab.get_url()
    );
}

#[test]
fn a_bulk_retry_asks_with_the_count_then_retries_them_all_in_the_file() {
    let env = filled();
    let dead = dead_jobs(&env, "outbox", "send", 5);
    let other = dead_jobs(&env, "returns", "send", 1);
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));
    assert!(
        text(&tab, "td[data-status=outbox]").starts_with("needs attention:"),
        "a queue with dead jobs is marked: {:?}",
        text(&tab, "td[data-status=outbox]")
    );

    eval(&tab, "window.ticklerOldPage = true");
    tab.find_element("#retry-dead-outbox")
        .unwrap()
        .click()
        .unwrap();
    wait_until(
        &tab,
        "the confirm page",
        "document.querySelector('#confirm-count') !== null",
    );
    assert_eq!(text(&tab, "#confirm-count"), dead.len().to_string());
    assert!(
        text(&tab, "#confirm-what")
            .contains(&format!("Retry {} dead jobs of queue outbox", dead.len())),
        "{}",
        text(&tab, "#confirm-what")
    );
    // The confirm page changed nothing yet.
    for &id in &dead {
        assert_eq!(env.job(id).state, JobState::Dead);
    }
    screenshot_page(&tab, "confirm.png");

    tab.find_element("#confirm").unwrap().click().unwrap();
    wait_for(
        &tab,
        "the dashboard after the retry",
        "document.querySelector('table#counts') !== null && document.querySelector('#done') !== null",
    );
    assert_eq!(
        text(&tab, "#done"),
        format!("Done: retried {} dead jobs of queue outbox.", dead.len())
    );
    for &id in &dead {
        let job = env.job(id);
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Pending, 0),
            "job {id}"
        );
    }
    assert_eq!(
        env.job(other[0]).state,
        JobState::Dead,
        "another queue's dead job"
    );
    assert!(
        !text(&tab, "td[data-status=outbox]").contains("dead"),
        "{:?}",
        text(&tab, "td[data-status=outbox]")
    );
    // The sentence is the server's own: a made-up id shows nothing.
    let forged = chromium.open(&served.url("/?done=%3Cb%3Eretried%201000000%3C/b%3E"));
    assert!(!exists(&forged, "#done"));
}

#[test]
fn a_paused_queue_with_due_work_and_a_missed_schedule_are_marked() {
    let env = filled();
    let q = env.queue();
    q.enqueue(NewJob::new("k").queue("held")).unwrap();
    q.pause_queue("held").unwrap();
    // A schedule set an hour ago whose ticks no pool has fired since.
    let hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    let past = tickler::Queue::builder(&env.db)
        .clock(Arc::new(tickler::ManualClock::new(hour_ago)))
        .open()
        .unwrap();
    past.upsert_schedule(tickler::NewSchedule::new("every-minute", "* * * * *", "k"))
        .unwrap();
    drop(past);
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));

    let held = text(&tab, "td[data-status=held]");
    assert!(
        held.starts_with("needs attention:") && held.contains("paused with due work"),
        "{held:?}"
    );
    assert_eq!(
        eval(
            &tab,
            "document.querySelector('td[data-status=held]').className"
        ),
        "mark attention"
    );
    let schedule = text(&tab, "tr[data-schedule=every-minute] td.mark");
    assert!(
        schedule.starts_with("needs attention: missed its tick by"),
        "{schedule:?}"
    );
    // A schedule ticking in the future is not.
    assert_eq!(text(&tab, "tr[data-schedule=yearly] td.mark"), "ok");
    let list = text(&tab, "#attention");
    assert!(
        list.contains("ATTENTION: queue held: paused with due work"),
        "{list:?}"
    );
    assert!(
        list.contains("ATTENTION: schedule every-minute: missed its tick by"),
        "{list:?}"
    );
    screenshot_page(&tab, "attention.png");

    // Pausing the schedule (with its confirm step) takes its mark away.
    eval(&tab, "window.ticklerOldPage = true");
    tab.find_element("#pause-schedule-every-minute")
        .unwrap()
        .click()
        .unwrap();
    wait_until(
        &tab,
        "the confirm page",
        "document.querySelector('#confirm') !== null",
    );
    assert_eq!(text(&tab, "#confirm-count"), "1");
    tab.find_element("#confirm").unwrap().click().unwrap();
    wait_for(
        &tab,
        "the dashboard after the pause",
        "document.querySelector('table#counts') !== null && document.querySelector('#done') !== null",
    );
    assert_eq!(text(&tab, "#done"), "Done: paused schedule every-minute.");
    assert!(env.queue().get_schedule("every-minute").unwrap().paused);
    assert_eq!(
        text(&tab, "tr[data-schedule=every-minute] td.mark"),
        "paused"
    );
}

#[test]
fn the_live_refresh_changes_a_count_while_a_pool_in_another_process_works() {
    let env = filled();
    // The queue's row exists before the pool runs: a job due in an hour.
    env.queue()
        .enqueue(
            NewJob::new("shell")
                .queue("jobs")
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let served = serve(&env, &[]);
    let chromium = chromium();
    let tab = chromium.open(&served.url("/"));
    assert!(!exists(&tab, "script"), "no script unless asked for");
    let tab = chromium.open(&served.url("/?live=1"));
    assert!(exists(&tab, "script[src='/static/live.js']"));
    let cell = "td[data-queue=jobs][data-state=succeeded]";
    // Its text before the pool, in a page not reloaded afterwards.
    eval(&tab, "window.ticklerSamePage = true");
    let before = text(&tab, cell);
    assert_eq!(before, "0");

    let mut worker = start_worker(&env, &["jobs"]);
    let ids: Vec<JobId> = (0..3).map(|_| enqueue_true(&env, "jobs")).collect();
    wait_done(&env, &mut worker, &ids, "the pool's jobs");
    wait_until(
        &tab,
        "the live count",
        &format!(
            "window.ticklerSamePage === true && document.querySelector({cell:?}) !== null \
             && document.querySelector({cell:?}).innerText.trim() === '3'"
        ),
    );
    assert!(text(&tab, "#live-status").starts_with("live: updated"));
    screenshot_page(&tab, "live.png");
}
