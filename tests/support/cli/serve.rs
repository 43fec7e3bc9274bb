//! `tickler serve` in a child process, plain HTTP requests to it, and a
//! queue file worth showing (tests/cli/serve.rs, tests/dashboard_browser.rs).

use super::Env;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::Duration;
use tickler::{JobId, JobState, NewJob, NewSchedule};

/// A child process killed when this is dropped, so that a failing test
/// leaves no server or worker behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `tickler serve`.
pub struct Served {
    pub child: KillOnDrop,
    /// `IP:PORT` it listens on.
    pub addr: String,
}

impl Served {
    /// `http://IP:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Starts `tickler serve` on a free loopback port, with `extra` arguments,
/// and waits until it listens.
pub fn serve(env: &Env, extra: &[&str]) -> Served {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = KillOnDrop(env.command(&args).stdout(Stdio::piped()).spawn().unwrap());
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .trim_end_matches('/')
        .to_owned();
    Served { child, addr }
}

/// (status, headers, body) of one HTTP/1.1 request to `addr` (`Host` is
/// `addr` unless `headers` has one).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    if method == "POST" {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(out.len());
    let head = String::from_utf8(out[..split].to_vec()).unwrap();
    let mut body = out.get(split + 4..).unwrap_or_default().to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, String::from_utf8(body).unwrap())
}

/// The body of a chunked answer (the server chunks big pages, and a chunk
/// may end inside a character).
fn unchunk(mut chunked: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = std::str::from_utf8(&chunked[..line_end]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        let start = line_end + 2;
        body.extend_from_slice(&chunked[start..start + size]);
        chunked = &chunked[start + size + 2..];
    }
}

/// The CSRF token in the forms of a dashboard page.
pub fn csrf_of(page: &str) -> String {
    page.split("name=csrf value=")
        .nth(1)
        .and_then(|rest| rest.split('>').next())
        .expect("a form with a CSRF token")
        .to_owned()
}

/// The table `id` of a dashboard page, from `<table id=ID>` to its
/// `</table>`.
pub fn table<'a>(page: &'a str, id: &str) -> &'a str {
    let start = format!("<table id={id}>");
    let from = page
        .find(&start)
        .unwrap_or_else(|| panic!("no {start} in the page: {page}"));
    let rest = &page[from..];
    &rest[..rest
        .find("</table>")
        .map_or(rest.len(), |end| end + "</table>".len())]
}

/// The row of `html` that begins with `start` (`<tr …>`), to its `</tr>`.
pub fn row<'a>(html: &'a str, start: &str) -> &'a str {
    let from = html
        .find(start)
        .unwrap_or_else(|| panic!("no row {start} in {html}"));
    let rest = &html[from..];
    &rest[..rest
        .find("</tr>")
        .map_or(rest.len(), |end| end + "</tr>".len())]
}

/// A queue file with jobs in every state over two queues, and a schedule:
///
/// - mail: 3 pending, 1 scheduled (due in an hour), 1 running (leased
///   for an hour), 1 succeeded;
/// - reports: 1 dead (its error holds HTML), 1 cancelled;
/// - sync: 1 running (leased for an hour) and 1 blocked behind it (limit
///   `sync`, 1 per key);
/// - schedule `yearly` (kind `k`, queue reports): it ticks on 1 January
///   only, so no tick adds a job during a test.
///
/// Every job is of kind `k`, which `tickler work` (shell jobs only) leaves
/// alone.
pub fn filled() -> Env {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let hour = Duration::from_secs(3600);
    let claim_one = |name: &str| {
        let mut leases = queue.manual().claim(name, "t", 1, hour).unwrap();
        assert_eq!(leases.len(), 1, "one job to claim in {name}");
        leases.remove(0)
    };

    let dead = queue
        .enqueue(NewJob::new("k").queue("reports").max_attempts(1))
        .unwrap();
    let lease = claim_one("reports");
    assert_eq!(lease.job_id, dead);
    queue.manual().fail(&lease, "broken <b>html</b>").unwrap();
    let cancelled = queue.enqueue(NewJob::new("k").queue("reports")).unwrap();
    queue.cancel(cancelled).unwrap();

    queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    queue.manual().complete(&claim_one("mail")).unwrap();
    let running = queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    assert_eq!(claim_one("mail").job_id, running);
    queue
        .enqueue_batch((0..3).map(|_| NewJob::new("k").queue("mail")).collect())
        .unwrap();
    let later = queue
        .enqueue(NewJob::new("k").queue("mail").delay(hour))
        .unwrap();
    queue
        .enqueue(NewJob::new("k").queue("mail").after(&[later]))
        .unwrap();

    queue.set_limit("sync", tickler::Limit::per_key(1)).unwrap();
    queue
        .enqueue_batch(
            (0..2)
                .map(|_| NewJob::new("k").queue("sync").limit("sync", "a"))
                .collect(),
        )
        .unwrap();
    let held = queue.manual().claim("sync", "t", 2, hour).unwrap();
    assert_eq!(held.len(), 1, "one of two runs under a limit of 1");

    queue
        .upsert_schedule(NewSchedule::new("yearly", "0 0 1 1 *", "k").queue("reports"))
        .unwrap();

    let stats = queue.stats().unwrap();
    for state in JobState::ALL {
        assert!(stats.total(state) > 0, "no {state:?} job: {stats:?}");
    }
    env
}

/// `n` dead jobs of `kind` in `queue`, each claimed and failed for good
/// (the queue must hold no other pending job: the claim takes each).
pub fn dead_jobs(env: &Env, queue: &str, kind: &str, n: usize) -> Vec<JobId> {
    let q = env.queue();
    (0..n)
        .map(|_| {
            let id = q.enqueue(NewJob::new(kind).queue(queue)).unwrap();
            let lease = q
                .manual()
                .claim(queue, "t", 1, Duration::from_secs(60))
                .unwrap()
                .remove(0);
            assert_eq!(lease.job_id, id);
            q.manual().fail_permanently(&lease, "gave up").unwrap();
            id
        })
        .collect()
}
