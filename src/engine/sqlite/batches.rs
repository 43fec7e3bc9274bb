//! Batches on SQLite: opening and sealing one in a write transaction (the
//! rules are `crate::queue::batches`, the statements `deps.rs`'s
//! `BatchTx`), and reading them.

use super::rows::{job_from_row, JOB_COLUMNS};
use super::Store;
use crate::batch::{Batch, BatchId, Callback};
use crate::clock::ms_to_datetime;
use crate::engine::types::ValidJob;
use crate::engine::Batches;
use crate::error::{Error, Result};
use crate::job::{Job, JobId};
use rusqlite::{params, OptionalExtension};

impl Batches for Store {
    fn open_batch(
        &self,
        description: Option<&str>,
        callbacks: Vec<(Callback, ValidJob)>,
    ) -> Result<BatchId> {
        let id = self.write(|tx| {
            let now = self.now_ms();
            tx.prepare_cached(
                "INSERT INTO tickler_batches (description, created_at) VALUES (?1, ?2)",
            )?
            .execute(params![description, now])?;
            let id = BatchId(tx.last_insert_rowid());
            let rows = crate::engine::types::callback_rows(id, &callbacks);
            super::enqueue::insert_valid(tx, &rows, now)?;
            Ok(id)
        })?;
        Ok(id)
    }

    fn seal_batch(&self, id: BatchId) -> Result<()> {
        self.write(|tx| {
            let now = self.now_ms();
            crate::queue::batches::seal(&mut super::deps::Deps(tx), id, now)?;
            Ok(())
        })?;
        // A callback released by the seal is due now.
        self.notify_watchers();
        Ok(())
    }

    fn batch(&self, id: BatchId) -> Result<Batch> {
        self.read(|conn| {
            type Row = (Option<String>, i64, Option<i64>, Option<i64>, [i64; 5]);
            let row: Option<Row> = conn
                .prepare_cached(
                    "SELECT description, created_at, sealed_at, finished_at, members, remaining,
                            succeeded, dead, cancelled
                     FROM tickler_batches WHERE id = ?1",
                )?
                .query_row([id.0], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        [r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?],
                    ))
                })
                .optional()?;
            let Some((description, created, sealed, finished, counts)) = row else {
                return Err(Error::BatchNotFound(id));
            };
            let callbacks: Vec<(i64, String)> = conn
                .prepare_cached(
                    "SELECT id, batch_end FROM tickler_jobs INDEXED BY tickler_jobs_batch
                     WHERE batch_id = ?1 AND batch_end IN ('on_success', 'on_failure', 'on_finish')",
                )?
                .query_map([id.0], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let callbacks = callbacks
                .into_iter()
                .filter_map(|(job, role)| Some((JobId(job), Callback::from_stored(&role)?)))
                .collect::<Vec<_>>();
            Ok(crate::engine::types::batch_from_parts(
                id,
                description,
                ms_to_datetime(created),
                sealed.map(ms_to_datetime),
                finished.map(ms_to_datetime),
                counts,
                &callbacks,
            ))
        })
    }

    fn batch_members(&self, id: BatchId, after: Option<JobId>, limit: usize) -> Result<Vec<Job>> {
        self.batch(id)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let jobs = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs INDEXED BY tickler_jobs_batch
                     WHERE batch_id = ?1 AND id > ?2
                       AND (batch_end IS NULL OR batch_end IN ('succeeded', 'dead', 'cancelled'))
                     ORDER BY batch_id, id LIMIT +?3"
                ))?
                .query_map(params![id.0, after.map_or(0, |a| a.0), limit], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(jobs)
        })
    }
}
