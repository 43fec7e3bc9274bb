//! What both server engines (PostgreSQL, MySQL) do the same way around
//! their write transactions when they record outcomes and claim: a large
//! batch of outcomes recorded beside the claim on a second connection, and
//! the outcomes recorded again one savepoint each after the server refused
//! one of them and rolled the whole transaction back.

use crate::engine::types::Outcome;
use crate::engine::Recorded;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::queue::limits::Settled;

/// Outcomes from which a claim's outcomes are recorded in a transaction of
/// their own beside the claim's, rather than in one: a pool finishing a
/// large batch and taking the next touches different rows with each, and
/// the server works on both connections at once.
pub(crate) const PARALLEL_OUTCOMES: usize = 64;

/// `record` and `claim` at once, on two connections.
pub(crate) fn record_beside_claim(
    record: impl FnOnce() -> Result<Recorded> + Send,
    claim: impl FnOnce() -> Result<Recorded>,
) -> Result<Recorded> {
    std::thread::scope(|scope| {
        let recording = scope.spawn(record);
        let claimed = claim();
        let recorded = recording
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let (mut recorded, claimed) = (recorded?, claimed?);
        recorded.leases = claimed.leases;
        recorded.limit_changes.extend(claimed.limit_changes);
        Ok(recorded)
    })
}

/// What one write transaction of [`record_then_claim`] gives: each
/// outcome's result, the leases claimed, or `None` when a backlog of due
/// jobs was promoted and the claim must come in the next transaction, and
/// what its limit rules did.
pub(crate) type Step = (Vec<Result<()>>, Option<Vec<Lease>>, Settled);

/// The transactions of a server engine's `record_and_claim`: `step(outcomes,
/// isolate)` runs one write transaction (retried as the engine retries its
/// writes) that records `outcomes` and claims. The outcomes go in the first
/// transaction only; later ones claim after a backlog was promoted. When the
/// server refused a statement for one outcome (`statement_level`), which
/// rolled the whole transaction back, the same step runs again with each
/// outcome in a savepoint of its own (`isolate`), so that the refusal stays
/// with its own job.
pub(crate) fn record_then_claim(
    outcomes: &[(&Lease, Outcome)],
    statement_level: fn(&Error) -> bool,
    mut step: impl FnMut(&[(&Lease, Outcome)], bool) -> Result<Step>,
) -> Result<Recorded> {
    let mut isolate = false;
    let mut pending = outcomes;
    let mut results = Vec::with_capacity(outcomes.len());
    let mut limit_changes = Vec::new();
    loop {
        let (recorded, claimed, settled) = match step(pending, isolate) {
            Err(e) if !isolate && statement_level(&e) && !pending.is_empty() => {
                isolate = true;
                continue;
            }
            other => other?,
        };
        results.extend(recorded);
        limit_changes.extend(settled.changes);
        pending = &[];
        if let Some(leases) = claimed {
            return Ok(Recorded {
                results,
                leases,
                limit_changes,
            });
        }
    }
}
