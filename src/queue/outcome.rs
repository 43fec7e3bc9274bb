//! The outcome rules, written once for every engine and run by each inside
//! its own transaction through its `OutcomeTx` (see
//! `Claims::record_and_claim`): outcomes in id order, each fenced by its
//! run_token; a snooze past the storable range refused for that outcome
//! alone; an error text the server refuses stored as a short note instead,
//! so that the job does not stay running until its lease runs out; and a
//! holder that reports after its lease was lost told so.

use crate::engine::types::{Attempt, Outcome, MAX_TIMESTAMP_MS};
use crate::engine::OutcomeTx;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::retry::RetryPolicy;

/// One outcome, fenced by run_token. The outer error is the transaction's
/// (it failed as a whole); the inner one is this outcome's alone:
/// `LeaseLost` when the lease is no longer held, or a time out of range.
pub(crate) fn record_one(
    tx: &mut dyn OutcomeTx,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    attempt: Attempt,
) -> Result<Result<()>> {
    if let Outcome::Snooze(until) = outcome {
        // A time before 1970 is past, so due now, like a run_at; one past
        // 9999 cannot be stored.
        if until.timestamp_millis() > MAX_TIMESTAMP_MS {
            return Ok(Err(Error::TimeOutOfRange {
                what: "snooze time",
            }));
        }
    }
    if tx.apply_outcome(lease, outcome, now, policy, None)? == 1 {
        Ok(Ok(()))
    } else {
        tx.after_refused(lease, attempt)
    }
}

/// [`record_one`] in a savepoint of its own, so that a statement the
/// server refuses costs this outcome alone. A failure whose error text was
/// refused (over a length limit, by a trigger's condition on it) is
/// recorded again with a short note in its place; anything else refused,
/// or the note refused too, is this outcome's error.
pub(crate) fn record_isolated(
    tx: &mut dyn OutcomeTx,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    attempt: Attempt,
) -> Result<Result<()>> {
    let refused =
        match tx.isolated(&mut |tx| record_one(tx, lease, outcome, now, policy, attempt))? {
            Ok(recorded) => return Ok(recorded),
            Err(refused) => refused,
        };
    let (Outcome::Fail(error)
    | Outcome::FailRetryAfter(error, _)
    | Outcome::FailPermanently(error)
    | Outcome::TimedOut(error)) = outcome
    else {
        return Ok(Err(refused));
    };
    let note = format!(
        "the handler's error ({} bytes) could not be stored: {refused}",
        error.len()
    );
    // The lost-lease step too, in the savepoint: a refusal of it must cost
    // this outcome alone.
    let noted =
        tx.isolated(
            &mut |tx| match tx.apply_outcome(lease, outcome, now, policy, Some(&note))? {
                1 => Ok(Ok(())),
                _ => tx.after_refused(lease, attempt),
            },
        )?;
    match noted {
        Ok(recorded) => Ok(recorded),
        Err(_) => Ok(Err(refused)),
    }
}

/// An engine's statement completing many leases at once (at `now`, after
/// `attempt`), with each lease's result as [`record_one`] gives it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) type CompleteMany<T> = fn(&mut T, &[&Lease], i64, Attempt) -> Result<Vec<Result<()>>>;

/// Records every outcome of a server engine's transaction, in id order
/// (two transactions locking the same rows take them in the same order),
/// the successes among them with `complete_many` (one statement for
/// all) unless `isolate`d. With `isolate`, each in a savepoint of its own
/// ([`record_isolated`]): the engine asks for it after a statement the
/// server refused rolled back the whole transaction.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn record_all<T: OutcomeTx>(
    tx: &mut T,
    outcomes: &[(&Lease, Outcome)],
    now: i64,
    policy: &RetryPolicy,
    attempt: Attempt,
    isolate: bool,
    complete_many: CompleteMany<T>,
) -> Result<Vec<Result<()>>> {
    let mut results: Vec<Option<Result<()>>> = (0..outcomes.len()).map(|_| None).collect();
    let mut order: Vec<usize> = (0..outcomes.len()).collect();
    order.sort_by_key(|&i| outcomes[i].0.job_id.0);
    if !isolate {
        let completes: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| outcomes[i].1 == Outcome::Complete)
            .collect();
        if completes.len() > 1 {
            let leases: Vec<&Lease> = completes.iter().map(|&i| outcomes[i].0).collect();
            for (i, r) in completes
                .iter()
                .zip(complete_many(tx, &leases, now, attempt)?)
            {
                results[*i] = Some(r);
            }
        }
    }
    for i in order {
        if results[i].is_some() {
            continue;
        }
        let (lease, outcome) = &outcomes[i];
        results[i] = Some(if isolate {
            record_isolated(tx, lease, outcome, now, policy, attempt)?
        } else {
            record_one(tx, lease, outcome, now, policy, attempt)?
        });
    }
    Ok(results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect())
}
