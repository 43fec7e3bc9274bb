//! The dashboard's batch page (`/batches/ID`): counters and a progress
//! bar, callbacks and members with their states and outputs, all stored
//! text escaped; members paged by id; 404 for an unknown batch; and the
//! job page's link to a job's batch.

use crate::support::cli;

use cli::batch::batched;
use cli::serve::{http, row, serve, table};
use cli::Env;
use tickler::{JobId, NewBatch, NewJob};

#[test]
fn the_batch_page_shows_counters_callbacks_and_members_with_outputs() {
    let env = Env::new();
    let b = batched(&env);
    let served = serve(&env, &["--hide-payload-key", "token"]);
    let (status, head, page) = http(
        &served.addr,
        "GET",
        &format!("/batches/{}", b.batch),
        &[],
        "",
    );
    assert_eq!(status, 200, "{head}\n{page}");
    // The headers of every page: no script of another origin, no frame,
    // no cache.
    for needed in [
        "Content-Security-Policy: default-src 'none'",
        "X-Frame-Options: DENY",
        "Cache-Control: no-store",
    ] {
        assert!(head.contains(needed), "lacks {needed}: {head}");
    }
    assert!(
        page.contains(&format!("<h1>batch {}</h1>", b.batch)),
        "{page}"
    );

    // The hostile description is text.
    let fields = table(&page, "fields");
    assert!(
        fields.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;mail&quot;"),
        "{fields}"
    );
    assert!(!page.contains("<script>"), "{page}");
    assert!(
        row(fields, "<tr data-field=sealed>").contains("<time"),
        "{fields}"
    );
    assert!(
        row(fields, "<tr data-field=finished>").contains("<td>-</td>"),
        "{fields}"
    );

    let counters = table(&page, "counters");
    for (name, n) in [
        ("members", 4),
        ("remaining", 2),
        ("succeeded", 1),
        ("dead", 1),
        ("cancelled", 0),
    ] {
        assert!(
            counters.contains(&format!("data-counter={name}>{n}</td>")),
            "{name}: {counters}"
        );
    }
    assert!(
        page.contains("<progress value=2 max=4></progress> 2 of 4 members ended"),
        "{page}"
    );

    let callbacks = table(&page, "callbacks");
    let on_success = row(callbacks, "<tr data-role=on_success>");
    assert!(
        on_success.contains(&format!("<a href=/jobs/{id}>{id}</a>", id = b.on_success))
            && on_success.contains("<td>notify</td>")
            && on_success.contains("data-column=state>waiting<"),
        "{on_success}"
    );
    let on_finish = row(callbacks, "<tr data-role=on_finish>");
    assert!(
        on_finish.contains(&format!("/jobs/{}", b.on_finish)),
        "{on_finish}"
    );
    assert!(!callbacks.contains("on_failure"), "{callbacks}");

    let members = table(&page, "members");
    let member = |id: JobId| row(members, &format!("<tr data-id={id}>"));
    let done = member(b.succeeded);
    assert!(
        done.contains(&format!("<a href=/jobs/{id}>{id}</a>", id = b.succeeded))
            && done.contains("data-column=state>succeeded<"),
        "{done}"
    );
    // The output, escaped, its hidden key's value left out.
    assert!(
        done.contains("&quot;path&quot;:&quot;&lt;b&gt;exports/a.mp4&lt;/b&gt;&quot;"),
        "{done}"
    );
    assert!(
        done.contains("[hidden]") && !page.contains("s3cret"),
        "{done}"
    );
    let dead = member(b.dead);
    assert!(
        dead.contains("data-column=state>dead<") && dead.contains("broken &lt;i&gt;pipe&lt;/i&gt;"),
        "{dead}"
    );
    assert!(member(b.pending).contains("data-column=state>pending<"));
    assert!(member(b.waiting).contains("data-column=state>waiting<"));
    assert!(!page.contains("<b>") && !page.contains("<i>"), "{page}");
    // In id order, callbacks not among them.
    let ids: Vec<&str> = members.split("<tr data-id=").skip(1).collect();
    assert_eq!(ids.len(), 4, "{members}");
    assert!(!members.contains(&format!("data-id={}>", b.on_success)));
    // All on one page: no link to another.
    assert!(
        !page.contains("id=next") && !page.contains("id=first"),
        "{page}"
    );
}

#[test]
fn an_unknown_batch_is_a_404_that_names_it() {
    let env = Env::new();
    batched(&env);
    let served = serve(&env, &[]);
    let (status, _, body) = http(&served.addr, "GET", "/batches/987654", &[], "");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("batch 987654 does not exist"), "{body}");
    for bad in ["/batches/seven", "/batches/1?after=x"] {
        let (status, _, body) = http(&served.addr, "GET", bad, &[], "");
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

#[test]
fn the_batch_page_pages_members_by_id() {
    let env = Env::new();
    env.run(&["init"]).ok();
    let queue = env.queue();
    let batch = queue.open_batch(NewBatch::new()).unwrap().id;
    let mut expected = queue
        .enqueue_batch((0..120).map(|_| NewJob::new("k").batch(batch)).collect())
        .unwrap();
    expected.sort();
    queue.seal_batch(batch).unwrap();
    let served = serve(&env, &[]);

    let mut seen = Vec::new();
    let mut path = format!("/batches/{batch}");
    let mut pages = 0;
    loop {
        let (status, _, page) = http(&served.addr, "GET", &path, &[], "");
        assert_eq!(status, 200, "{path}: {page}");
        pages += 1;
        let members = table(&page, "members");
        let ids: Vec<JobId> = members
            .split("<tr data-id=")
            .skip(1)
            .map(|r| JobId(r.split('>').next().unwrap().parse().unwrap()))
            .collect();
        assert!(ids.len() <= 50, "{path}: {} rows", ids.len());
        assert_eq!(page.contains("id=first"), pages > 1, "{path}");
        seen.extend(ids);
        match page.split("<a id=next href=\"").nth(1) {
            Some(rest) => path = rest.split('"').next().unwrap().to_owned(),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, expected, "each member once, in id order");
}

#[test]
fn the_job_page_links_its_batch_and_keeps_its_parents() {
    let env = Env::new();
    let b = batched(&env);
    let served = serve(&env, &[]);
    let page_of = |id: JobId| {
        let (status, _, page) = http(&served.addr, "GET", &format!("/jobs/{id}"), &[], "");
        assert_eq!(status, 200, "{page}");
        page
    };
    let link = format!("<a href=/batches/{b} id=batch>batch {b}</a>", b = b.batch);
    let page = page_of(b.dead);
    assert!(
        row(&page, "<tr data-field=batch>").contains(&format!("member of {link}")),
        "{page}"
    );
    let page = page_of(b.on_success);
    assert!(
        page.contains(&format!("on_success callback of {link}</td></tr>")),
        "{page}"
    );
    assert!(
        row(&page, "<tr data-field=why>").contains(&format!(
            "on_success callback of batch {} (released if every member succeeds, else cancelled): 2 of 4 members remaining, 1 failed",
            b.batch
        )),
        "{page}"
    );
    // A waiting member links the job it runs after as well as its batch.
    let page = page_of(b.waiting);
    assert!(page.contains(&format!("member of {link}")), "{page}");
    assert!(
        page.contains(&format!(
            "<a href=/jobs/{p}>{p}</a> (if it fails: cancel)",
            p = b.pending
        )),
        "{page}"
    );
    // Listed among the waiting jobs with a link to the batch, not as
    // waiting for parents it does not have.
    let (_, _, page) = http(&served.addr, "GET", "/jobs?state=waiting", &[], "");
    let listed = row(&page, &format!("<tr data-id={}>", b.on_success));
    assert!(
        listed.contains(&format!(
            "in <a href=/batches/{id}>batch {id}</a>",
            id = b.batch
        )) && !listed.contains("runs after"),
        "{listed}"
    );
    // A job of no batch has no batch row.
    let other = env.queue().enqueue(NewJob::new("k")).unwrap();
    assert!(!page_of(other).contains("data-field=batch"));
}

/// Once the last member ends, the page shows the batch finished and its
/// callbacks decided: `on_success` cancelled with the reason (a member
/// died), `on_finish` released; a callback of a batch still open says it
/// waits for the seal.
#[test]
fn a_finished_batch_shows_its_callbacks_decided() {
    let env = Env::new();
    let b = batched(&env);
    let queue = env.queue();
    // The member waiting after it is cancelled with it.
    queue.cancel(b.pending).unwrap();
    let open = queue
        .open_batch(NewBatch::new().on_failure(NewJob::new("alarm")))
        .unwrap();
    let served = serve(&env, &[]);

    let (status, _, page) = http(
        &served.addr,
        "GET",
        &format!("/batches/{}", b.batch),
        &[],
        "",
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        row(table(&page, "fields"), "<tr data-field=finished>").contains("<time"),
        "{page}"
    );
    assert!(
        table(&page, "counters").contains("data-counter=cancelled>2</td>"),
        "{page}"
    );
    assert!(
        page.contains("<progress value=4 max=4></progress> 4 of 4 members ended"),
        "{page}"
    );
    let callbacks = table(&page, "callbacks");
    let on_success = row(callbacks, "<tr data-role=on_success>");
    assert!(
        on_success.contains("data-column=state>cancelled<")
            && on_success.contains("ended with 1 dead and 2 cancelled of 4 members"),
        "{on_success}"
    );
    assert!(
        row(callbacks, "<tr data-role=on_finish>").contains("data-column=state>pending<"),
        "{callbacks}"
    );
    assert!(
        row(
            table(&page, "members"),
            &format!("<tr data-id={}>", b.waiting)
        )
        .contains("data-column=state>cancelled<"),
        "{page}"
    );

    let alarm = open.on_failure.unwrap();
    let (_, _, page) = http(&served.addr, "GET", &format!("/jobs/{alarm}"), &[], "");
    assert!(
        page.contains(&format!(
            "on_failure callback of <a href=/batches/{id} id=batch>batch {id}</a>",
            id = open.id
        )),
        "{page}"
    );
    assert!(
        row(&page, "<tr data-field=why>").contains(&format!(
            "on_failure callback of batch {} (released if any member ends dead or cancelled, else cancelled): 0 of 0 members remaining; the batch is not sealed",
            open.id
        )),
        "{page}"
    );
    let (_, _, page) = http(
        &served.addr,
        "GET",
        &format!("/batches/{}", open.id),
        &[],
        "",
    );
    assert!(page.contains("- (open: jobs can still join it)"), "{page}");
    assert!(
        page.contains("<progress value=0 max=1></progress> 0 of 0 members ended"),
        "{page}"
    );
    assert!(table(&page, "members").contains("no members"), "{page}");
}
