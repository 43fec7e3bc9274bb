//! Batches on PostgreSQL: opening and sealing one in a write transaction
//! (the rules are `crate::queue::batches`, the statements `deps.rs`'s
//! `BatchTx`), and reading them.

use super::rows::{job_from_row, JOB_COLUMNS};
use super::Store;
use crate::batch::{Batch, BatchId, Callback};
use crate::clock::ms_to_datetime;
use crate::engine::types::ValidJob;
use crate::engine::Batches;
use crate::error::{Error, Result};
use crate::job::{Job, JobId};

impl Batches for Store {
    fn open_batch(
        &self,
        description: Option<&str>,
        callbacks: Vec<(Callback, ValidJob)>,
    ) -> Result<BatchId> {
        if let Some(text) = description {
            super::enqueue::check_text("batch description", text)?;
        }
        // Marks the batch, so that a retry after a COMMIT whose answer was
        // lost finds it instead of opening a second one.
        let mark = fastrand::i64(..);
        let id = self.write(|tx, attempt| {
            if attempt.after_unknown_commit {
                if let Some(r) = tx.query_opt(
                    "SELECT id FROM tickler_batches WHERE open_mark = $1",
                    &[&mark],
                )? {
                    return Ok(BatchId(r.get(0)));
                }
            }
            let now = self.now_ms();
            let id = BatchId(
                tx.query_one(
                    "INSERT INTO tickler_batches (description, created_at, open_mark)
                     VALUES ($1, $2, $3) RETURNING id",
                    &[&description, &now, &mark],
                )?
                .get(0),
            );
            let rows = crate::engine::types::callback_rows(id, &callbacks);
            super::enqueue::insert_valid(tx, &rows, now, fastrand::i64(..))?;
            Ok(id)
        })?;
        Ok(id)
    }

    fn seal_batch(&self, id: BatchId) -> Result<()> {
        self.write(|tx, _| {
            let now = self.now_ms();
            crate::queue::batches::seal(&mut super::deps::Deps(tx), id, now)?;
            Ok(())
        })?;
        // A callback released by the seal is due now, in every process.
        self.notify_watchers();
        Ok(())
    }

    fn batch(&self, id: BatchId) -> Result<Batch> {
        self.read(|tx| {
            let Some(r) = tx.query_opt(
                "SELECT description, created_at, sealed_at, finished_at, members, remaining,
                        succeeded, dead, cancelled
                 FROM tickler_batches WHERE id = $1",
                &[&id.0],
            )?
            else {
                return Err(Error::BatchNotFound(id));
            };
            let callbacks: Vec<(JobId, Callback)> = tx
                .query(
                    "SELECT id, batch_end FROM tickler_jobs
                     WHERE batch_id = $1 AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
                    &[&id.0],
                )?
                .iter()
                .filter_map(|c| Some((JobId(c.get(0)), Callback::from_stored(c.get(1))?)))
                .collect();
            Ok(crate::engine::types::batch_from_parts(
                id,
                r.get(0),
                ms_to_datetime(r.get(1)),
                r.get::<_, Option<i64>>(2).map(ms_to_datetime),
                r.get::<_, Option<i64>>(3).map(ms_to_datetime),
                [r.get(4), r.get(5), r.get(6), r.get(7), r.get(8)],
                &callbacks,
            ))
        })
    }

    fn batch_members(&self, id: BatchId, after: Option<JobId>, limit: usize) -> Result<Vec<Job>> {
        self.batch(id)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs
             WHERE batch_id = $1 AND id > $2
               AND (batch_end IS NULL OR batch_end IN ('succeeded', 'dead', 'cancelled'))
             ORDER BY batch_id, id LIMIT $3"
        );
        self.read(|tx| {
            tx.query(&sql, &[&id.0, &after.map_or(0, |a| a.0), &limit])?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }
}
