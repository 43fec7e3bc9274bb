//! The claim's rules, written once for every engine and run by each inside
//! its own transaction through its `ClaimTx` (see `Engine::record_and_claim`):
//! paused queues give nothing, due scheduled jobs are promoted first (a
//! backlog over several transactions), and the claim is spread over the
//! queues with a fair share each and the oldest due jobs first while
//! priority aging lasts.

use crate::engine::types::{cut_error, ClaimOrder, ClaimRequest, ClaimedRow, PROMOTE_BATCH};
use crate::engine::ClaimTx;
use crate::error::Result;
use crate::lease::Lease;

/// Claims per `request` in the engine's transaction `tx` at `now`, each
/// lease until `expires` (ms); `None` if a backlog of due scheduled jobs
/// was promoted and the claim must come in a later transaction.
pub(crate) fn claim_in(
    tx: &mut dyn ClaimTx,
    request: &ClaimRequest<'_>,
    now: i64,
    expires: i64,
) -> Result<Option<Vec<Lease>>> {
    let paused = tx.paused_queues()?;
    let open: Vec<&str> = request
        .queues
        .iter()
        .copied()
        .filter(|q| !paused.contains(*q))
        .collect();
    let request = &ClaimRequest {
        queues: &open,
        ..*request
    };
    // Claim order (priority first) only holds if every due job is pending.
    // A backlog larger than one promotion batch (a box that was off) is
    // promoted over several short transactions before anything is claimed.
    let mut backlog = false;
    for queue in request.queues {
        let promoted = tx.promote_due(queue, now, PROMOTE_BATCH)?;
        backlog |= promoted as i64 >= PROMOTE_BATCH;
    }
    if backlog {
        return Ok(None);
    }
    let mut leases = Vec::new();
    let mut unreadable = Vec::new();
    spread(request, |queue, want, order| {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let rows = tx.claim_batch(request, queue, want, order, now, expires)?;
        let n = rows.len();
        let mut claimed = Vec::with_capacity(n);
        for row in rows {
            match row {
                ClaimedRow::Readable(lease) => claimed.push(lease),
                ClaimedRow::Unreadable {
                    job_id,
                    run_token,
                    problems,
                } => unreadable.push((job_id, run_token, problems)),
            }
        }
        claimed.sort_by(|a, b| order.compare(a, b));
        leases.extend(claimed);
        Ok(n)
    })?;
    // One row that cannot be read costs that job, not the claim.
    for (job_id, run_token, problems) in unreadable {
        let error = format!(
            "this job's row could not be read ({problems}); it was not run: \
             fix or delete the row, then retry the job"
        );
        log::error!("job {job_id}: {error}");
        tx.bury(job_id, &run_token, &cut_error(&error), now)?;
    }
    Ok(Some(leases))
}

/// Spreads the claim over the queues, calling `claim_from(queue, want,
/// order)` (which claims up to `want` jobs and returns how many it
/// took): a fair share per queue first (`max / queues`, rounded up, so
/// one busy queue cannot starve the others a pool serves), the oldest
/// due jobs first within it while `oldest_first` lasts (priority
/// aging); then whatever is left, queue by queue, from the queues that
/// gave all they were asked for.
fn spread(
    request: &ClaimRequest<'_>,
    mut claim_from: impl FnMut(&str, usize, ClaimOrder) -> Result<usize>,
) -> Result<()> {
    let mut claim = |queue: &str, want: usize, order| {
        if want == 0 {
            Ok(0)
        } else {
            claim_from(queue, want, order)
        }
    };
    let share = request.max.div_ceil(request.queues.len().max(1));
    let mut aged_left = request.oldest_first.min(request.max);
    let mut taken = 0;
    let mut may_have_more = Vec::new();
    for queue in request.queues {
        let room = share.min(request.max - taken);
        let aged = claim(queue, aged_left.min(room), ClaimOrder::Oldest)?;
        aged_left -= aged;
        let rest = claim(queue, room - aged, ClaimOrder::Priority)?;
        taken += aged + rest;
        if aged + rest == room {
            may_have_more.push(*queue);
        }
    }
    for queue in may_have_more {
        taken += claim(queue, request.max - taken, ClaimOrder::Priority)?;
    }
    Ok(())
}
