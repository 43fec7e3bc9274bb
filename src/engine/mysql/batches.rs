//! Batches on MySQL/MariaDB: opening and sealing one in a write
//! transaction (the rules are `crate::queue::batches`, the statements
//! `deps.rs`'s `BatchTx`), and reading them.

use super::connection::args;
use super::rows::{get, job_from_row, JOB_COLUMNS};
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
        // Marks the batch, so that a retry after a COMMIT whose answer was
        // lost finds it instead of opening a second one.
        let mark = fastrand::i64(..);
        let id = self.write(|tx, attempt| {
            if attempt.after_unknown_commit {
                if let Some(r) = tx.first(
                    "SELECT id FROM tickler_batches WHERE open_mark = ?",
                    args![mark],
                )? {
                    return Ok(BatchId(get(&r, 0)?));
                }
            }
            let now = self.now_ms();
            let (_, id) = tx.insert(
                "INSERT INTO tickler_batches (description, created_at, open_mark)
                 VALUES (?, ?, ?)",
                args![description, now, mark],
            )?;
            let id = id
                .and_then(|id| i64::try_from(id).ok())
                .map(BatchId)
                .ok_or_else(|| Error::Config("the server did not tell a new batch's id".into()))?;
            let rows = crate::engine::types::callback_rows(id, &callbacks);
            super::enqueue::insert_valid(tx, &rows, now, fastrand::i64(..), self.max_packet)?;
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
            let Some(r) = tx.first(
                "SELECT description, created_at, sealed_at, finished_at, members, remaining,
                        succeeded, dead, cancelled
                 FROM tickler_batches WHERE id = ?",
                args![id.0],
            )?
            else {
                return Err(Error::BatchNotFound(id));
            };
            let mut callbacks: Vec<(JobId, Callback)> = Vec::new();
            for c in tx.rows(
                "SELECT id, batch_end FROM tickler_jobs
                 WHERE batch_id = ? AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
                args![id.0],
            )? {
                if let Some(role) = Callback::from_stored(&get::<String>(&c, 1)?) {
                    callbacks.push((JobId(get(&c, 0)?), role));
                }
            }
            Ok(crate::engine::types::batch_from_parts(
                id,
                get(&r, 0)?,
                ms_to_datetime(get(&r, 1)?),
                get::<Option<i64>>(&r, 2)?.map(ms_to_datetime),
                get::<Option<i64>>(&r, 3)?.map(ms_to_datetime),
                [
                    get(&r, 4)?,
                    get(&r, 5)?,
                    get(&r, 6)?,
                    get(&r, 7)?,
                    get(&r, 8)?,
                ],
                &callbacks,
            ))
        })
    }

    fn batch_members(&self, id: BatchId, after: Option<JobId>, limit: usize) -> Result<Vec<Job>> {
        self.batch(id)?;
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs
             WHERE batch_id = ? AND id > ?
               AND (batch_end IS NULL OR batch_end IN ('succeeded', 'dead', 'cancelled'))
             ORDER BY batch_id, id LIMIT ?"
        );
        self.read(|tx| {
            tx.rows(&sql, args![id.0, after.map_or(0, |a| a.0), limit])?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }
}
