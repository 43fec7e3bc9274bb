//! `tickler serve`: Prometheus text at /metrics and a server-rendered
//! dashboard at /, on tiny_http (feature `serve`). Reads and writes go
//! through the public `Queue` API only.
//!
//! Safety rules: loopback addresses only, unless `--allow-remote` and a
//! `--token` are both given; with a token every request must carry it
//! (`Authorization: Bearer`, or the `tickler_token` cookie set by
//! `/?token=`, which then redirects to `/`). Without a token, only requests
//! naming this server by an IP address or `localhost` are answered (DNS
//! rebinding). Every POST carries the CSRF token of this server's run in
//! its form; a POST without it changes nothing.

mod find;

use crate::cli::ServeArgs;
use crate::error::CliError;
use std::fmt::Write as _;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use tickler::{JobId, JobState, LimitKeyUsage, Queue};
use tiny_http::{Header, Method, Request, Response, Server};

mod batch;
mod bulk;
mod glance;

/// What the page marks and keeps beyond the queue: the thresholds of its
/// marks and what the last bulk actions did.
pub(crate) struct Settings {
    /// A queue whose oldest due job waited longer needs attention.
    wait_threshold: std::time::Duration,
    /// A schedule whose next tick is further in the past missed it.
    missed_grace: std::time::Duration,
    done: bulk::Done,
}

/// The live refresh's script (`/static/live.js`), served by this server so
/// that the page's policy can allow its own scripts and no others.
const LIVE_JS: &str = include_str!("serve/live.js");

/// The page's Content-Security-Policy: its own script (the live refresh)
/// and reads of its own origin, nothing inline, nothing from elsewhere;
/// and no frame of another page around it (`default-src` does not cover
/// `frame-ancestors`): a page that framed the dashboard invisibly could
/// steer a click onto its retry and cancel buttons, which carry the
/// CSRF token.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'";

/// Jobs listed per state on the page.
const LISTED: usize = 20;

/// Finished jobs counted per minute of the plot ("20000+" above): bounds
/// the index range the plot reads on a busy file.
const PLOT_CAP: u64 = 20_000;

/// Counts on the page stop here ("100000+"), so that the page of a big
/// file reads a bounded part of each index.
const COUNT_CAP: u64 = 100_000;

/// Keys listed per limit, busiest first; the others are summed in one
/// row, so that a limit with a key per account keeps the page small.
const KEYS_LISTED: usize = 50;

/// Of a listed job's error history the page shows the newest entry cut to
/// this many bytes, and the [`EARLIER_SHOWN`] before it cut to
/// [`EARLIER_BYTES`]: every entry in full (up to 20 of 8 KiB each per job)
/// made a page of over 3 MB for 20 dead jobs (as long arguments did to
/// Sidekiq's, #1988). `tickler show ID` has them all.
const ERROR_SHOWN: usize = 1000;
/// Earlier attempts listed under a job's newest error.
const EARLIER_SHOWN: usize = 4;
/// Bytes of each earlier attempt's line.
const EARLIER_BYTES: usize = 160;

pub fn serve(db: &Path, args: &ServeArgs) -> Result<(), CliError> {
    let addr: SocketAddr = args
        .listen
        .parse()
        .map_err(|e| CliError::Usage(format!("--listen {}: {e} (want IP:PORT)", args.listen)))?;
    check_exposure(&addr, args.allow_remote, args.token.as_deref())?;
    if let Some(token) = args.token.as_deref() {
        check_token(token)?;
    }
    let queue = crate::ops::open(db, false)?;
    let server = Server::http(addr)
        .map_err(|e| CliError::failed(format!("cannot listen on {addr}: {e}")))?;
    let bound = server
        .server_addr()
        .to_ip()
        .map_or_else(|| addr.to_string(), |a| a.to_string());
    println!("listening on http://{bound}/");
    let csrf = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let settings = Settings {
        wait_threshold: args.wait_threshold,
        missed_grace: args.missed_grace,
        done: bulk::Done::default(),
    };
    let hide = find::Hide {
        all: args.hide_payload,
        keys: args.hide_payload_key.clone(),
    };
    for request in server.incoming_requests() {
        // One thread answers every request: a panic while answering one
        // (a bug) must cost that request, not the server.
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handle(
                &queue,
                &csrf,
                &settings,
                args.token.as_deref(),
                &hide,
                request,
            )
        }));
        let response =
            answered.unwrap_or_else(|_| Err(std::io::Error::other("answering a request panicked")));
        if let Err(e) = response {
            log::warn!("answering a request failed: {e}");
        }
    }
    Ok(())
}

/// Refuses to expose the queue beyond this machine without a token.
fn check_exposure(
    addr: &SocketAddr,
    allow_remote: bool,
    token: Option<&str>,
) -> Result<(), CliError> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    match (allow_remote, token) {
        (true, Some(t)) if t.len() >= 16 => Ok(()),
        (true, Some(_)) => Err(CliError::Usage(
            "--token must be at least 16 characters when serving beyond loopback".into(),
        )),
        _ => Err(CliError::Usage(format!(
            "{addr} is not a loopback address: anyone who reaches it could retry and cancel jobs; \
             pass --allow-remote and --token (or TICKLER_TOKEN) to serve it anyway"
        ))),
    }
}

/// The token goes back to the browser as a cookie value: a character a
/// header cannot hold (non-ASCII) made the answer to `/?token=` panic in
/// the server's only thread, ending it, and `;`, `,`, `"`, `\` or a space
/// make a cookie that never matches. Such a token is refused at start.
fn check_token(token: &str) -> Result<(), CliError> {
    // Also not what a query string would change or cut (`/?token=`).
    let cookie_safe = |b: u8| {
        b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\' | b'+' | b'%' | b'&' | b'#')
    };
    if !token.is_empty() && token.bytes().all(cookie_safe) {
        return Ok(());
    }
    Err(CliError::Usage(
        "--token may hold only visible ASCII characters other than \" , ; \\ + % & and # \
         (it is sent back to the browser as a cookie, and given as /?token=)"
            .into(),
    ))
}

/// Without a token, a loopback server's only guard is that other machines
/// cannot reach it, but a web page can, by DNS rebinding: a page of
/// attacker.example whose name the attacker then points at 127.0.0.1 is
/// same-origin with this server in the victim's browser, so it could read
/// the dashboard (and its CSRF token) and post actions. The browser still
/// names attacker.example in `Host`; IP literals and `localhost` are
/// names no one else can point elsewhere. (No `Host` at all is no browser.)
fn unrebindable_host(host: Option<&str>) -> bool {
    let Some(host) = host else {
        return true;
    };
    let name = match host.strip_prefix('[') {
        // [IPv6]:port
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
}

/// The HTTP status for a failed read or action: the operator's mistakes
/// (a job that is gone, one in a state that refuses the action, a unique
/// key another job holds) are not server errors (riverui #622 answered a
/// retry refused by a unique key with a 500, and its UI fell over).
fn status_of(e: &tickler::Error) -> u16 {
    match e {
        tickler::Error::NotFound(_)
        | tickler::Error::UnknownSchedule { .. }
        | tickler::Error::BatchNotFound(_) => 404,
        tickler::Error::InvalidState { .. } | tickler::Error::UniqueKeyHeld { .. } => 409,
        tickler::Error::InvalidArgument(_) | tickler::Error::EmptyQueue => 400,
        _ => 500,
    }
}

/// Compares a given token with ours in time that does not depend on where
/// they differ, so that timing the answers does not reveal the token a
/// byte at a time (only its length can be learnt).
fn same_secret(given: &str, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.as_bytes().ct_eq(token.as_bytes()).into()
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid header")
}

fn handle(
    queue: &Queue,
    csrf: &str,
    settings: &Settings,
    token: Option<&str>,
    hide: &find::Hide,
    mut request: Request,
) -> std::io::Result<()> {
    let url = request.url().to_owned();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    if token.is_none() {
        let host = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Host"))
            .map(|h| h.value.as_str().to_owned());
        if !unrebindable_host(host.as_deref()) {
            return request.respond(
                Response::from_string(
                    "without --token, open this server by its IP address or as localhost\n",
                )
                .with_status_code(403),
            );
        }
    }
    if let Some(token) = token {
        let given_query = form_value(query, "token");
        let given = |v: Option<&str>| v.is_some_and(|v| same_secret(v, token));
        let authorized = request.headers().iter().any(|h| {
            (h.field.equiv("Authorization") && given(h.value.as_str().strip_prefix("Bearer ")))
                || (h.field.equiv("Cookie")
                    && h.value
                        .as_str()
                        .split(';')
                        .any(|c| given(c.trim().strip_prefix("tickler_token="))))
        }) || given(given_query.as_deref());
        if !authorized {
            return request
                .respond(Response::from_string("a token is needed\n").with_status_code(401));
        }
        if given_query.is_some() && *request.method() == Method::Get && path == "/" {
            // The token is swapped for the cookie at once, so that it stays
            // in neither the address bar nor the history.
            // Lax, not Strict: the redirect that follows a link to
            // /?token= from another page must carry it. Actions are POSTs,
            // which a Lax cookie does not follow across sites, and carry
            // the CSRF token besides.
            let cookie = format!("tickler_token={token}; HttpOnly; SameSite=Lax; Path=/");
            return request.respond(
                Response::from_string("")
                    .with_status_code(303)
                    .with_header(header("Location", "/"))
                    .with_header(header("Set-Cookie", &cookie))
                    .with_header(header("Referrer-Policy", "no-referrer")),
            );
        }
    }
    let method = request.method().clone();
    let result = match (method, path) {
        (Method::Get, "/metrics") => metrics(queue).map(|text| {
            Response::from_string(text).with_header(header(
                "Content-Type",
                "text/plain; version=0.0.4; charset=utf-8",
            ))
        }),
        (Method::Get, "/") => dashboard(queue, csrf, settings, query).map(html_page),
        (Method::Get, "/static/live.js") => Ok(Response::from_string(LIVE_JS)
            .with_header(header("Content-Type", "text/javascript; charset=utf-8"))
            .with_header(header("X-Content-Type-Options", "nosniff"))),
        (Method::Get, "/api/summary") => summary(queue, settings).map(|json| {
            Response::from_string(json)
                .with_header(header("Content-Type", "application/json"))
                .with_header(header("Cache-Control", "no-store"))
        }),
        (Method::Get, "/jobs") => find::list(queue, query).map(html_page),
        (Method::Get, p) if p.starts_with("/jobs/") => {
            find::job(queue, &p["/jobs/".len()..], hide, csrf).map(html_page)
        }
        (Method::Get, p) if p.starts_with("/batches/") => {
            batch::page(queue, &p["/batches/".len()..], query, hide).map(html_page)
        }
        (Method::Post, "/retry" | "/cancel" | "/pause" | "/resume" | "/confirm" | "/bulk") => {
            let mut body = String::new();
            request
                .as_reader()
                .take(64 * 1024)
                .read_to_string(&mut body)?;
            if !form_value(&body, "csrf").is_some_and(|given| same_secret(&given, csrf)) {
                return request.respond(
                    Response::from_string("missing or wrong CSRF token: reload the page\n")
                        .with_status_code(403),
                );
            }
            match path {
                "/confirm" => bulk::confirm_page(queue, csrf, &body).map(html_page),
                "/bulk" => bulk::run(queue, csrf, &body).map(|ran| match ran {
                    bulk::Ran::Done(done) => {
                        let id = settings.done.keep(done);
                        Response::from_string("")
                            .with_status_code(303)
                            .with_header(header("Location", &format!("/?done={id}")))
                    }
                    bulk::Ran::Changed(page) => html_page(page).with_status_code(409),
                }),
                _ => act(queue, path, &body).map(|()| {
                    Response::from_string("")
                        .with_status_code(303)
                        .with_header(header("Location", "/"))
                }),
            }
        }
        _ => return request.respond(Response::from_string("not found\n").with_status_code(404)),
    };
    match result {
        Ok(response) => request.respond(response),
        Err(e) => {
            request.respond(Response::from_string(format!("{e}\n")).with_status_code(status_of(&e)))
        }
    }
}

/// An HTML page with the dashboard's headers: framed by no other page
/// (`X-Frame-Options` for browsers without `frame-ancestors`), and kept
/// in no cache, since a job's page shows its payload and every page its
/// CSRF token.
fn html_page(html: String) -> Response<std::io::Cursor<Vec<u8>>> {
    Response::from_string(html)
        .with_header(header("Content-Type", "text/html; charset=utf-8"))
        .with_header(header("Content-Security-Policy", CSP))
        .with_header(header("X-Frame-Options", "DENY"))
        .with_header(header("Cache-Control", "no-store"))
        .with_header(header("Referrer-Policy", "no-referrer"))
}

/// `/api/summary`, for the live refresh: what the page shows at a glance
/// and the plot.
fn summary(queue: &Queue, settings: &Settings) -> tickler::Result<String> {
    let glance = glance::read(queue, settings)?;
    let minutes = queue
        .ops()
        .activity(60, std::time::Duration::from_secs(60), PLOT_CAP)?;
    Ok(glance::summary_json(&glance, &plot(&minutes)))
}

fn act(queue: &Queue, path: &str, body: &str) -> tickler::Result<()> {
    let job = || {
        form_value(body, "id")
            .and_then(|v| v.parse().ok())
            .map(JobId)
            .ok_or_else(|| tickler::Error::InvalidArgument("a job id is needed".into()))
    };
    let name = || form_value(body, "queue").unwrap_or_default();
    match path {
        "/retry" => queue.retry(job()?),
        "/cancel" => queue.cancel(job()?),
        "/pause" => queue.pause_queue(&name()),
        _ => queue.resume_queue(&name()),
    }
}

/// A field of an `application/x-www-form-urlencoded` body or query.
fn form_value(form: &str, name: &str) -> Option<String> {
    form.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| url_decode(v))
    })
}

fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A label value in the Prometheus text format.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn metrics(queue: &Queue) -> tickler::Result<String> {
    let stats = queue.stats()?;
    // The queue's own clock: on PostgreSQL the server's, which due times use.
    let now = queue.clock().now();
    let mut out = String::new();
    out.push_str("# HELP tickler_jobs Jobs in the queue file per queue and state.\n# TYPE tickler_jobs gauge\n");
    let queues: std::collections::BTreeSet<&String> = stats.counts.keys().map(|(q, _)| q).collect();
    for q in &queues {
        for state in JobState::ALL {
            let n = stats
                .counts
                .get(&((*q).clone(), state))
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "tickler_jobs{{queue=\"{}\",state=\"{}\"}} {n}",
                label(q),
                state.as_str()
            );
        }
    }
    out.push_str(
        "# HELP tickler_dead_jobs Dead jobs, all queues.\n# TYPE tickler_dead_jobs gauge\n",
    );
    let _ = writeln!(out, "tickler_dead_jobs {}", stats.total(JobState::Dead));
    out.push_str("# HELP tickler_oldest_due_lateness_seconds How long the oldest due job has waited, per queue.\n# TYPE tickler_oldest_due_lateness_seconds gauge\n");
    let mut oldest: std::collections::BTreeMap<&String, chrono::DateTime<chrono::Utc>> =
        Default::default();
    for ((q, _), at) in &stats.oldest_due_by_priority {
        let e = oldest.entry(q).or_insert(*at);
        *e = (*e).min(*at);
    }
    for (q, at) in oldest {
        let late = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "tickler_oldest_due_lateness_seconds{{queue=\"{}\"}} {late}",
            label(q)
        );
    }
    out.push_str(
        "# HELP tickler_queue_paused 1 for a paused queue, 0 for one that runs.\n# TYPE tickler_queue_paused gauge\n",
    );
    // 0 as well as 1, so that an alert on a queue left paused resolves
    // when it is resumed rather than when its series goes stale.
    let paused: std::collections::BTreeSet<String> = queue.paused_queues()?.into_iter().collect();
    let every: std::collections::BTreeSet<&String> =
        queues.iter().copied().chain(&paused).collect();
    for q in every {
        let _ = writeln!(
            out,
            "tickler_queue_paused{{queue=\"{}\"}} {}",
            label(q),
            u8::from(paused.contains(q))
        );
    }
    out.push_str("# HELP tickler_schedule_next_tick_seconds Next tick of each schedule, Unix time.\n# TYPE tickler_schedule_next_tick_seconds gauge\n");
    for s in queue.list_schedules()? {
        if let Some(at) = s.next_tick_at.filter(|_| !s.paused) {
            let _ = writeln!(
                out,
                "tickler_schedule_next_tick_seconds{{schedule=\"{}\"}} {}",
                label(&s.name),
                at.timestamp_millis() as f64 / 1000.0
            );
        }
    }
    Ok(out)
}

/// Text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn button(csrf: &str, action: &str, field: &str, value: &str, label: &str) -> String {
    format!(
        "<form method=post action=/{action} style=display:inline><input type=hidden name=csrf value={csrf}>\
         <input type=hidden name={field} value=\"{}\"><button type=submit id=\"{action}-{}\">{label}</button></form>",
        esc(value),
        esc(value)
    )
}

/// Seconds with up to three significant digits, for the plot's labels.
fn seconds(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

/// The last hour, one column per minute, as inline SVG (drawn by the
/// server: the page needs no script, and the live refresh swaps it whole): jobs
/// finished per minute (the counted dead share in red), and below it the
/// lateness of the jobs that ran (due → start), median as a line, the
/// worst as dots; the x axis in UTC, as every time on the page. Each
/// column's `<title>` gives its figures.
fn plot(minutes: &[tickler::ActivityBucket]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 110.0;
    let n = minutes.len().max(1) as f64;
    let col = W / n;
    let top_count = minutes.iter().map(|m| m.finished).max().unwrap_or(0).max(1);
    let top_late = minutes
        .iter()
        .filter_map(|m| m.lateness_max)
        .max()
        .unwrap_or_default()
        .max(std::time::Duration::from_millis(1));
    let total: u64 = minutes.iter().map(|m| m.finished).sum();
    let total_dead: u64 = minutes.iter().map(|m| m.dead).sum();
    let capped = if minutes.iter().any(|m| m.capped) {
        "+"
    } else {
        ""
    };
    let dead_capped = if minutes.iter().any(|m| m.dead_capped) {
        "+"
    } else {
        ""
    };
    let mut svg = format!(
        "<h2>Last hour</h2><p>{total}{capped} jobs finished, {total_dead}{dead_capped} of them dead; lateness is due time → start of the attempt that finished.</p>\
         <svg id=plot width={w} height={h} viewBox=\"0 0 {w} {h}\" role=img aria-label=\"jobs finished per minute and their lateness over the last hour\" \
         style=\"font:11px sans-serif;background:#fafafa;border:1px solid #ccc\">\
         <text x=4 y=12>finished per minute (max {top_count}{capped})</text>\
         <text x=4 y={ly}>lateness: median line, worst dots (max {late})</text>",
        w = W + 60.0,
        h = 2.0 * H + 50.0,
        ly = H + 32.0,
        late = seconds(top_late),
    );
    let late_y =
        |d: std::time::Duration| 2.0 * H + 40.0 - H * d.as_secs_f64() / top_late.as_secs_f64();
    let mut median_line = Vec::new();
    for (i, m) in minutes.iter().enumerate() {
        let x = i as f64 * col;
        let bar = H * m.finished as f64 / top_count as f64;
        // Counted, not the sample's share: the last jobs to finish, which
        // the sample holds, are where failures that retried end up.
        let dead = if m.finished > 0 {
            bar * m.dead.min(m.finished) as f64 / m.finished as f64
        } else {
            0.0
        };
        let plus = |capped: bool| if capped { "+" } else { "" };
        let _ = write!(
            svg,
            "<g><title>{} – {} UTC: {}{} finished, {}{} dead, lateness median {} worst {}, run time median {}</title>\
             <rect x={x:.1} y={y:.1} width={bw:.1} height={bar:.1} fill=\"#4a7\"/>\
             <rect x={x:.1} y={dy:.1} width={bw:.1} height={dead:.1} fill=\"#c33\"/>",
            m.start.format("%H:%M:%S"),
            m.end.format("%H:%M:%S"),
            m.finished,
            plus(m.capped),
            m.dead,
            plus(m.dead_capped),
            m.lateness_p50.map_or("-".into(), seconds),
            m.lateness_max.map_or("-".into(), seconds),
            m.run_time_p50.map_or("-".into(), seconds),
            y = H + 18.0 - bar,
            dy = H + 18.0 - dead,
            bw = (col - 1.0).max(1.0),
        );
        if let Some(worst) = m.lateness_max {
            let _ = write!(
                svg,
                "<circle cx={:.1} cy={:.1} r=2 fill=\"#a50\"/>",
                x + col / 2.0,
                late_y(worst)
            );
        }
        if let Some(p50) = m.lateness_p50 {
            median_line.push(format!("{:.1},{:.1}", x + col / 2.0, late_y(p50)));
        }
        svg.push_str("</g>");
    }
    if !median_line.is_empty() {
        let _ = write!(
            svg,
            "<polyline points=\"{}\" fill=none stroke=\"#36c\" stroke-width=1.5/>",
            median_line.join(" ")
        );
    }
    svg.push_str(&time_axis(minutes, W, 2.0 * H + 48.0));
    svg.push_str("</svg>");
    svg
}

/// The plot's x axis: a tick and an `HH:MM` label at each whole ten
/// minutes (UTC) between the first slice's start and the last one's end,
/// placed by time, since the slices end at the moment of the request and
/// not on whole minutes; then the zone.
fn time_axis(minutes: &[tickler::ActivityBucket], width: f64, baseline: f64) -> String {
    const STEP_MS: i64 = 10 * 60 * 1000;
    let mut axis = String::from("<g id=time-axis>");
    if let (Some(first), Some(last)) = (minutes.first(), minutes.last()) {
        let from = first.start.timestamp_millis();
        let to = last.end.timestamp_millis();
        let span = (to - from).max(1) as f64;
        let mut at = from.div_euclid(STEP_MS) * STEP_MS;
        if at < from {
            at += STEP_MS;
        }
        while at <= to {
            let x = width * (at - from) as f64 / span;
            let label = chrono::DateTime::from_timestamp_millis(at)
                .map(|t| t.format("%H:%M").to_string())
                .unwrap_or_default();
            let _ = write!(
                axis,
                "<line x1={x:.1} x2={x:.1} y1={t:.1} y2={b:.1} stroke=\"#999\"/>\
                 <text x={x:.1} y={baseline:.1} text-anchor=middle>{}</text>",
                esc(&label),
                t = baseline - 14.0,
                b = baseline - 10.0,
            );
            at += STEP_MS;
        }
    }
    let _ = write!(
        axis,
        "<text x={x:.1} y={baseline:.1}>UTC</text></g>",
        x = width + 8.0
    );
    axis
}

/// `text` cut to at most `max` bytes at a character boundary, with `…`
/// and the bytes left out counted in `left` when it was cut.
fn cut(text: &str, max: usize, left: &mut usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    *left += text.len() - end;
    format!("{}…", &text[..end])
}

/// A listed job's attempt history, newest first: the newest error cut to
/// [`ERROR_SHOWN`] bytes, up to [`EARLIER_SHOWN`] earlier ones a line each,
/// and how much more there is.
fn error_cell(job: &tickler::Job) -> String {
    let line =
        |e: &tickler::AttemptError| format!("#{} {}: {}", e.attempt, e.at.to_rfc3339(), e.error);
    let mut newest_first = job.errors.iter().rev();
    let Some(last) = newest_first.next() else {
        return String::new();
    };
    let mut left = 0;
    let mut text = cut(&line(last), ERROR_SHOWN, &mut left);
    let mut hidden = 0;
    for (i, e) in newest_first.enumerate() {
        if i < EARLIER_SHOWN {
            text.push('\n');
            let one_line = line(e).replace('\n', " ");
            text.push_str(&cut(&one_line, EARLIER_BYTES, &mut left));
        } else {
            hidden += 1;
        }
    }
    let mut more = Vec::new();
    if left > 0 {
        more.push(format!("{left} more bytes"));
    }
    match hidden {
        0 => {}
        1 => more.push("1 earlier error".to_owned()),
        n => more.push(format!("{n} earlier errors")),
    }
    if !more.is_empty() {
        let _ = write!(text, "\n({}: tickler show {})", more.join(", "), job.id);
    }
    text
}

fn dashboard(
    queue: &Queue,
    csrf: &str,
    settings: &Settings,
    query: &str,
) -> tickler::Result<String> {
    let glance = glance::read(queue, settings)?;
    let live = form_value(query, "live").is_some_and(|v| v == "1");
    let mut html = format!(
        "<!doctype html><html><head><meta charset=utf-8><title>tickler</title>\
         <style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin-bottom:1.5em}}\
         td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}td.n{{text-align:right}}\
         .err{{color:#a00;font-family:monospace;white-space:pre-wrap}}{}</style>{}</head><body><h1>tickler</h1><p><a href=/jobs id=find>find jobs</a></p>",
        glance::STYLE,
        if live { "<script src=/static/live.js defer></script>" } else { "" }
    );
    let _ = write!(
        html,
        "<p>{}</p><p id=live>{}</p>{}{}",
        esc(&queue.location()),
        if live {
            "<span id=live-status>live: on</span> <a href=/ id=live-toggle>turn live refresh off</a>"
        } else {
            "live refresh: off <a href=\"/?live=1\" id=live-toggle>turn it on</a> (needs script; the page works without)"
        },
        settings.done.html(query),
        glance::attention_html(&glance)
    );
    html.push_str(&glance::queues_html(&glance, csrf));
    let minutes = queue
        .ops()
        .activity(60, std::time::Duration::from_secs(60), PLOT_CAP)?;
    let _ = write!(html, "<div id=activity>{}</div>", plot(&minutes));
    html.push_str(&glance::schedules_html(&glance, csrf));
    html.push_str(&limits(queue)?);
    for state in [
        JobState::Dead,
        JobState::Running,
        JobState::Blocked,
        JobState::Pending,
        JobState::Scheduled,
        JobState::Waiting,
        JobState::Cancelled,
        JobState::Succeeded,
    ] {
        let jobs = queue.ops().list_state(state, LISTED)?;
        let _ = write!(html, "<h2>{} ({} {LISTED})</h2><table id=jobs-{}><tr><th>id</th><th>queue</th><th>kind</th><th>attempts</th><th>when (UTC)</th><th>errors</th><th></th></tr>", state.as_str(), if matches!(state, JobState::Pending | JobState::Blocked | JobState::Scheduled | JobState::Waiting | JobState::Running) { "first" } else { "newest" }, state.as_str());
        for job in jobs {
            let errors = error_cell(&job);
            let actions = match state {
                JobState::Dead | JobState::Cancelled => {
                    button(csrf, "retry", "id", &job.id.0.to_string(), "retry")
                }
                JobState::Waiting
                | JobState::Scheduled
                | JobState::Pending
                | JobState::Blocked
                | JobState::Running => {
                    button(csrf, "cancel", "id", &job.id.0.to_string(), "cancel")
                }
                JobState::Succeeded => String::new(),
            };
            let at = |t: Option<chrono::DateTime<chrono::Utc>>| {
                t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339())
            };
            let when = match state {
                JobState::Pending => format!("due {}", at(Some(job.run_at))),
                // A limited job waits for its limit: the page says for
                // what, as `tickler show` does (a job that left the state
                // since it was listed is explained as it is now).
                JobState::Waiting | JobState::Scheduled | JobState::Blocked => {
                    let due = format!("due {}", at(Some(job.run_at)));
                    match why(queue, &job)? {
                        Some(why) => format!("{due}; {why}"),
                        None => due,
                    }
                }
                JobState::Running => format!(
                    "started {} by {}, lease until {}",
                    at(job.claimed_at),
                    job.claimed_by.as_deref().unwrap_or("-"),
                    at(job.lease_expires_at)
                ),
                JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                    format!("finished {}", at(job.finished_at))
                }
            };
            let _ = write!(
                html,
                "<tr><td><a href=/jobs/{id}>{id}</a></td><td>{}</td><td>{}</td><td class=n>{}/{}</td><td>{}{}</td><td class=err>{}</td><td>{actions}</td></tr>",
                esc(&job.queue),
                esc(&job.kind),
                job.attempts,
                job.max_attempts,
                esc(&when),
                find::progress_bar(&job),
                esc(&errors),
                id = job.id,
            );
        }
        let _ = write!(
            html,
            "</table><p><a href=/jobs?state={s} id=all-{s}>all {s} jobs</a></p>",
            s = state.as_str()
        );
    }
    html.push_str("</body></html>");
    Ok(html)
}

/// Why a listed limited job is not running ([`Queue::explain`]); `None`
/// for a job under no limit (its due time says it all) or one gone since
/// it was listed, and for a scheduled job that is merely waiting for its
/// time.
fn why(queue: &Queue, job: &tickler::Job) -> tickler::Result<Option<String>> {
    if job.limit.is_none() && job.state != tickler::JobState::Waiting {
        return Ok(None);
    }
    match queue.explain(job.id) {
        Ok(e) if matches!(e.reason, tickler::Reason::Waiting { .. }) => Ok(None),
        Ok(e) => Ok(Some(e.to_string())),
        Err(tickler::Error::NotFound(_)) => Ok(None),
        // One job that cannot be explained costs its reason, not the page.
        Err(e) => Ok(Some(format!("(its reason could not be read: {e})"))),
    }
}

/// The "Limits" section: each limit's settings and, per key with
/// unfinished jobs, what `tickler limit list` gives (weight held, holders,
/// blocked, deferred, pending), the busiest [`KEYS_LISTED`] keys first and
/// the others summed. Nothing when no limit is set and no job names one.
fn limits(queue: &Queue) -> tickler::Result<String> {
    let set = queue.limits()?;
    let usage = queue.limit_usage(None)?;
    if set.is_empty() && usage.is_empty() {
        return Ok(String::new());
    }
    // Set limits, and the names jobs give that no one set (they run
    // unlimited), each with its keys.
    let mut by_name: std::collections::BTreeMap<
        &str,
        (Option<tickler::Limit>, Vec<&LimitKeyUsage>),
    > = set
        .iter()
        .map(|l| (l.name.as_str(), (Some(l.limit), Vec::new())))
        .collect();
    for u in &usage {
        by_name.entry(&u.name).or_default().1.push(u);
    }
    let mut html = String::from(
        "<h2>Limits</h2><table id=limits><tr><th>limit</th><th>key</th><th>held</th>\
         <th>holders</th><th>blocked</th><th>deferred</th><th>pending</th></tr>",
    );
    for (name, (limit, mut keys)) in by_name {
        let settings = limit.as_ref().map_or_else(
            || crate::display::LIMIT_NOT_SET.to_owned(),
            crate::display::limit_settings,
        );
        let _ = write!(
            html,
            "<tr data-limit=\"{n}\"><td>{n}</td><td colspan=6>{}</td></tr>",
            esc(&settings),
            n = esc(name),
        );
        // Busiest first: most weight held, then most jobs waiting.
        keys.sort_by(|a, b| {
            (b.held, b.blocked + b.deferred + b.pending)
                .cmp(&(a.held, a.blocked + a.deferred + a.pending))
                .then_with(|| a.key.cmp(&b.key))
        });
        let max_per_key = limit.and_then(|l| l.max_per_key);
        let cells = |held: String, u: &LimitKeyUsage| {
            format!(
                "<td class=n data-column=held>{}</td><td class=n data-column=holders>{}</td>\
                 <td class=n data-column=blocked>{}</td><td class=n data-column=deferred>{}</td>\
                 <td class=n data-column=pending>{}</td>",
                esc(&held),
                u.holders,
                u.blocked,
                u.deferred,
                u.pending
            )
        };
        for u in keys.iter().take(KEYS_LISTED) {
            let _ = write!(
                html,
                "<tr data-limit=\"{n}\" data-key=\"{k}\"><td></td><td>{k}</td>{}</tr>",
                cells(crate::display::held(u.held, max_per_key), u),
                n = esc(name),
                k = esc(&u.key),
            );
        }
        if keys.len() > KEYS_LISTED {
            let rest = &keys[KEYS_LISTED..];
            let mut sum = LimitKeyUsage {
                name: name.to_owned(),
                key: String::new(),
                held: 0,
                holders: 0,
                blocked: 0,
                deferred: 0,
                pending: 0,
            };
            for u in rest {
                sum.held += u.held;
                sum.holders += u.holders;
                sum.blocked += u.blocked;
                sum.deferred += u.deferred;
                sum.pending += u.pending;
            }
            let _ = write!(
                html,
                "<tr data-limit=\"{n}\" data-more><td></td><td>and {} more keys (tickler limit list has them all)</td>{}</tr>",
                rest.len(),
                cells(sum.held.to_string(), &sum),
                n = esc(name),
            );
        }
    }
    html.push_str("</table>");
    Ok(html)
}
