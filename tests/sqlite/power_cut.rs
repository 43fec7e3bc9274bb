//! Simulated power cuts (RELIABILITY.md section 7): `Durability::Full`
//! loses no acknowledged enqueue or `complete_with`, `Durability::Normal`
//! nothing acknowledged before the last sync of the WAL, and the file stays
//! intact, at random times and at chosen syncs. The harness is
//! `tests/support/powercut.rs` and its shim `tests/support/powercut.c`;
//! the processes of each round are this test binary run again for
//! [`role`].

use crate::powercut::{
    self, judge, Acks, Completed, Enqueued, Found, FoundJob, Known, Promise, Settings,
};

use std::collections::HashMap;
use std::path::PathBuf;
use tickler::Durability;

const ROLE: &str = "power_cut::role";

/// Runs `settings`, prints the figures, keeps the folder if a cut failed.
fn run(settings: &Settings, dir: tempfile::TempDir) -> powercut::Figures {
    let figures = powercut::run(settings);
    println!("{figures}");
    if !figures.failures.is_empty() {
        let _ = dir.keep();
    }
    figures
}

/// 16 cuts, 8 on a `Full` file and 8 on a `Normal` one, with a
/// checkpointer: CI's run.
#[test]
fn full_loses_no_acknowledgement_and_normal_only_its_last_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = Settings::new(dir.path().to_path_buf(), ROLE, 16);
    settings.cuts_per_file = 8;
    let figures = run(&settings, dir);
    assert!(figures.failures.is_empty(), "{figures}");
    assert_eq!(figures.cuts, 16);
    assert_eq!(figures.drains_ok, 2, "{figures}");
    assert!(
        figures.full.enqueues > 100 && figures.normal.enqueues > 100,
        "too little work: {figures}"
    );
    assert!(
        figures.full.completes > 0 && figures.full.pool_outcomes > 0,
        "no outcomes: {figures}"
    );
}

/// The long form: `TICKLER_POWER_CUTS=600 cargo test --release --test
/// sqlite power_cut::long -- --ignored --nocapture` (its other knobs in
/// RELIABILITY.md section 7).
#[test]
#[ignore = "long: run by hand"]
fn long() {
    let (dir, kept) = match std::env::var_os("TICKLER_POWER_CUT_DIR") {
        Some(dir) => (PathBuf::from(dir), None),
        None => {
            let t = tempfile::tempdir().expect("tempdir");
            (t.path().to_path_buf(), Some(t))
        }
    };
    let settings = Settings::from_env(dir.clone(), ROLE);
    println!(
        "power cuts, seed {} (TICKLER_POWER_CUT_SEED), folder {}",
        settings.seed,
        dir.display()
    );
    let figures = powercut::run(&settings);
    println!("{figures}");
    if !figures.failures.is_empty() {
        if let Some(t) = kept {
            let _ = t.keep();
        }
        panic!(
            "{} of {} cuts failed; their files are kept in {}",
            figures.failures.len(),
            figures.cuts,
            dir.display()
        );
    }
}

/// A handler that takes the machine down at once (a kernel panic, a
/// brown-out on a Raspberry Pi) must not run again uncounted after every
/// reboot: a claim and a start are committed without a sync of their own,
/// and a cut that came first left the job pending with no attempt used,
/// boot after boot (8 boots, attempts 0, with the pool's first claims not
/// synced). With them synced, each run is counted (the first one given
/// back at most) and the job is dead after its attempts.
#[test]
fn a_handler_that_takes_the_machine_down_is_counted_until_its_job_is_dead() {
    let dir = tempfile::tempdir().unwrap();
    let history = powercut::machine_down(dir.path(), 2, 8);
    let (state, attempts) = history.last().unwrap();
    assert!(
        state == "dead" && *attempts == 2,
        "after {} boots the job is {state} with {attempts} attempts: {history:?}",
        history.len()
    );
}

/// A producer, worker or checkpointer of a round; does nothing unless
/// started by the harness.
#[test]
fn role() {
    if std::env::var_os(powercut::ENV_ROLE).is_some() {
        std::process::exit(powercut::run_role());
    }
}

/// The harness broken on purpose must be caught.
#[test]
fn broken_harnesses_are_caught() {
    let broken = |what: &str, set: &dyn Fn(&mut Settings)| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Settings::new(dir.path().to_path_buf(), ROLE, 1);
        s.durability = Some(Durability::Full);
        s.timed_only = true;
        s.timed_ms = (800, 1_200);
        s.torn_every = 0;
        s.checkpoint_ms = None;
        s.autocheckpoints = vec![1_000];
        s.stop_at_first_failure = true;
        set(&mut s);
        let figures = powercut::run(&s);
        println!("{what}:\n{figures}");
        assert!(
            !figures.failures.is_empty(),
            "{what} was not caught: {figures}"
        );
        figures
    };

    // A disk that acknowledges syncs and keeps nothing.
    let lying = broken("a disk that lies", &|s| s.lying_disk = true);
    let failure = &lying.failures[0];
    assert!(failure.contains("acknowledged the enqueue"), "{failure}");
    assert!(
        failure.contains("before the last image of the WAL"),
        "{failure}"
    );
    assert_eq!(lying.full.lost_enqueues, lying.full.enqueues, "{lying}");

    // Normal's commits judged by Full's promise.
    let normal = broken("Normal judged as Full", &|s| {
        s.cuts = 5;
        s.durability = Some(Durability::Normal);
        s.promise = Some(Promise::Full);
    });
    assert!(
        normal.failures[0].contains("lost, which Full promises to keep"),
        "{}",
        normal.failures[0]
    );

    // The main file damaged after the cut.
    let zeroed = broken("the main file's second half zeroed", &|s| {
        s.zero_main_half = true
    });
    let failure = &zeroed.failures[0];
    assert!(
        failure.contains("integrity_check")
            || failure.contains("cannot be read")
            || failure.contains("probe"),
        "{failure}"
    );
}

/// A file and the acknowledgements that agree with it, for the oracle's
/// test: a batch of two (an `effect` job succeeded with its effect row,
/// a `plain` job succeeded by the pool) and a single pending job.
fn agreeing() -> (Found, Acks) {
    let job =
        |kind: &str, tag: &str, batch: &str, size, status: &str, token: Option<&str>| FoundJob {
            kind: kind.into(),
            tag: Some(tag.into()),
            batch: Some(batch.into()),
            size,
            status: status.into(),
            token: token.map(Into::into),
        };
    let found = Found {
        integrity: vec!["ok".into()],
        error: None,
        jobs: HashMap::from([
            (1, job("effect", "b1/0", "b1", 2, "succeeded", Some("A"))),
            (2, job("plain", "b1/1", "b1", 2, "succeeded", Some("B"))),
            (3, job("plain", "b2/0", "b2", 1, "pending", None)),
        ]),
        effects: vec![(1, "A".into())],
    };
    let acks = Acks {
        enqueued: vec![
            Enqueued {
                t0: 10,
                t1: 20,
                jobs: vec![(1, "b1/0".into()), (2, "b1/1".into())],
            },
            Enqueued {
                t0: 30,
                t1: 40,
                jobs: vec![(3, "b2/0".into())],
            },
        ],
        completed: vec![
            Completed {
                t0: 50,
                t1: 60,
                id: 1,
                token: "A".into(),
                by_pool: false,
            },
            Completed {
                t0: 70,
                t1: 80,
                id: 2,
                token: "B".into(),
                by_pool: true,
            },
        ],
        notes: vec![],
    };
    (found, acks)
}

/// Each kind of damage, made up, is flagged; the file that agrees is not.
#[test]
fn the_oracle_flags_each_kind_of_damage() {
    let later_enqueue = Enqueued {
        t0: 200,
        t1: 210,
        jobs: vec![(4, "b3/0".into())],
    };
    type Damage = Box<dyn Fn(&mut Found, &mut Acks, &mut Known)>;
    // (what, promise, last WAL image, damage, what the oracle must say)
    let cases: Vec<(&str, Promise, Option<u64>, Damage, &str)> = vec![
        (
            "nothing",
            Promise::Full,
            Some(100),
            Box::new(|_, _, _| {}),
            "",
        ),
        (
            "a loss under Normal after the last WAL image",
            Promise::Normal,
            Some(100),
            Box::new({
                let e = later_enqueue.clone();
                move |_, a, _| a.enqueued.push(e.clone())
            }),
            "",
        ),
        (
            "an enqueue lost under Full",
            Promise::Full,
            None,
            Box::new({
                let e = later_enqueue.clone();
                move |_, a, _| a.enqueued.push(e.clone())
            }),
            "acknowledged the enqueue",
        ),
        (
            "a complete_with lost under Full",
            Promise::Full,
            None,
            Box::new(|f, _, _| {
                f.jobs.get_mut(&1).unwrap().status = "running".into();
                f.effects.clear();
            }),
            "acknowledged complete_with of job 1",
        ),
        (
            "a pool outcome lost in a crash",
            Promise::Crash,
            None,
            Box::new(|f, _, _| {
                f.jobs.get_mut(&2).unwrap().status = "running".into();
            }),
            "acknowledged the pool's outcome of job 2",
        ),
        (
            "a loss before the last WAL image",
            Promise::Normal,
            Some(300),
            Box::new({
                let e = later_enqueue.clone();
                move |_, a, _| a.enqueued.push(e.clone())
            }),
            "before the last image of the WAL",
        ),
        (
            "a survivor after a loss",
            Promise::Normal,
            None,
            Box::new({
                let e = later_enqueue.clone();
                move |_, a, _| {
                    a.enqueued.push(e.clone());
                    a.completed.push(Completed {
                        t0: 220,
                        t1: 230,
                        id: 2,
                        token: "B".into(),
                        by_pool: true,
                    });
                }
            }),
            "survived, though it began after",
        ),
        (
            "a batch in part",
            Promise::Normal,
            None,
            Box::new(|f, a, _| {
                f.jobs.remove(&2);
                a.completed.retain(|c| c.id != 2);
            }),
            "in part",
        ),
        (
            "an effect without its success",
            Promise::Normal,
            None,
            Box::new(|f, a, _| {
                f.jobs.get_mut(&1).unwrap().status = "running".into();
                a.completed.retain(|c| c.id != 1);
            }),
            "has effect rows",
        ),
        (
            "a success without its effect",
            Promise::Normal,
            None,
            Box::new(|f, _, _| f.effects.clear()),
            "without its effect row",
        ),
        (
            "two effects of one job",
            Promise::Normal,
            None,
            Box::new(|f, _, _| f.effects.push((1, "A".into()))),
            "has effect rows",
        ),
        (
            "one tag twice",
            Promise::Normal,
            None,
            Box::new(|f, _, _| {
                let twin = f.jobs[&3].clone();
                f.jobs.insert(5, twin);
            }),
            "carry the tag",
        ),
        (
            "a job an earlier cut had found",
            Promise::Normal,
            None,
            Box::new(|_, _, k| {
                k.tags.insert("b0/0".into(), 9);
            }),
            "found by an earlier cut, is gone",
        ),
        (
            "a success an earlier cut had found",
            Promise::Normal,
            None,
            Box::new(|f, a, k| {
                k.succeeded.insert(3, "C".into());
                a.completed.clear();
                f.jobs.get_mut(&3).unwrap().status = "pending".into();
            }),
            "found succeeded",
        ),
        (
            "integrity_check",
            Promise::Normal,
            None,
            Box::new(|f, _, _| {
                f.integrity = vec!["row 3 missing from index tickler_jobs_pending".into()];
            }),
            "integrity_check is not ok",
        ),
        (
            "an unreadable file",
            Promise::Normal,
            None,
            Box::new(|f, _, _| {
                f.error = Some("database disk image is malformed".into());
            }),
            "cannot be read",
        ),
    ];
    for (what, promise, last_wal, damage, expected) in cases {
        let (mut found, mut acks) = agreeing();
        let mut known = Known::default();
        damage(&mut found, &mut acks, &mut known);
        let verdict = judge(promise, &acks, last_wal, 1_000, &found, &known);
        if expected.is_empty() {
            assert!(
                verdict.violations.is_empty(),
                "{what}: flagged {:?}",
                verdict.violations
            );
        } else {
            assert!(
                verdict.violations.iter().any(|v| v.contains(expected)),
                "{what}: not flagged as {expected:?}: {:?}",
                verdict.violations
            );
        }
    }
}

/// A torn restore keeps the image where nothing differs, and only whole
/// sectors of what was written.
#[test]
fn a_torn_file_is_the_image_plus_whole_written_sectors() {
    let mut rng = fastrand::Rng::with_seed(7);
    let image = vec![1u8; 4 * 512];
    assert_eq!(powercut::tear(&image, &image, &mut rng), (image.clone(), 0));
    let written = vec![2u8; 8 * 512];
    for _ in 0..20 {
        let (torn, kept) = powercut::tear(&image, &written, &mut rng);
        assert!(torn.len() == image.len() || torn.len() == written.len());
        let mut from_written = 0;
        for sector in torn.chunks(512) {
            assert!(
                sector.iter().all(|b| *b == sector[0]),
                "a sector torn within itself"
            );
            from_written += u64::from(sector[0] == 2);
        }
        assert_eq!(from_written, kept);
    }
}
