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
