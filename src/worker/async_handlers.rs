//! The async face of the pool (feature `tokio`): async handlers, which run
//! as tasks on the application's runtime, and [`WorkerPool::shutdown_async`].
//! The builder's runtime fields, their check in `start` and the drop of a
//! pool on a runtime thread stay with their types.

use super::context::JobContext;
use super::handler::{Handler, JobError};
use super::{ShutdownReport, WorkerPool, WorkerPoolBuilder};
use crate::typed::JobArgs;
use std::sync::Arc;
use std::time::Duration;

// Named by doc links only.
#[cfg(doc)]
use crate::error::Error;

/// Async handlers and shutdown (feature `tokio`).
impl WorkerPoolBuilder {
    /// The tokio runtime that async handlers registered after this call
    /// run on (default: the runtime [`WorkerPoolBuilder::async_handler`]
    /// is called in).
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Runs jobs of `kind` with an async handler: for each job, `handler`
    /// is called with an owned [`JobContext`] and the future it returns is
    /// spawned as a task on the application's runtime (see
    /// [`WorkerPoolBuilder::runtime`]). Everything else is the pool's, as
    /// for sync handlers: claims, heartbeats, fencing by run_token, group
    /// commit, timeouts, the hand-back rules of shutdown.
    ///
    /// Concurrency: one of the pool's [`WorkerPoolBuilder::threads`] waits
    /// (parked, off the runtime) for each running task, so a pool runs at
    /// most `threads` async handlers at a time: that is the per-pool
    /// limit, and it keeps a slow handler from taking more jobs than the
    /// pool can renew and record. Raise `threads` for more concurrency.
    ///
    /// Results: the future's `Ok` and [`JobError`] mean what they mean for
    /// sync handlers; a panic in the task fails the job with the panic
    /// message; a task dropped because the runtime shut down fails the
    /// attempt (retried per the retry policy). Cancellation (timeout, a
    /// lost lease, the end of the shutdown grace) reaches the handler as
    /// [`JobContext::cancelled`]. A handler that ignores it past its
    /// timeout plus [`WorkerPoolBuilder::timeout_grace`] is written off as
    /// a sync one is (the task is not aborted: it may be inside a write).
    ///
    /// The handler must not block its runtime thread: call
    /// [`JobContext::complete_with`] (a write transaction) through
    /// `tokio::task::spawn_blocking`, and use [`crate::AsyncQueue`] for
    /// other `Queue` calls.
    ///
    /// With no runtime named and none current, [`WorkerPoolBuilder::start`]
    /// returns [`Error::InvalidArgument`].
    pub fn async_handler<F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let kind = kind.into();
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(runtime) => self.handler(kind, AsyncHandler { runtime, handler }),
            None => {
                self.missing_runtime = Some(kind);
                self
            }
        }
    }

    /// [`WorkerPoolBuilder::handler_for`] for an async handler: runs typed
    /// jobs of kind `A::KIND` as tasks, as
    /// [`WorkerPoolBuilder::async_handler`] does. A payload that does not
    /// fit `A` fails permanently without calling `handler`.
    pub fn async_handler_for<A, F, Fut>(mut self, handler: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
    {
        if let Some(policy) = A::retry_policy() {
            self.retry_policies.insert(A::KIND.to_owned(), policy);
        }
        let handler = Arc::new(handler);
        self.async_handler(A::KIND, move |ctx: JobContext| {
            let handler = Arc::clone(&handler);
            async move {
                let args = ctx.args::<A>()?;
                handler(ctx, args).await
            }
        })
    }
}

/// An async handler as the pool's threads see it: the task runs on the
/// application's runtime while this thread waits for it, off the runtime.
struct AsyncHandler<F> {
    runtime: tokio::runtime::Handle,
    handler: F,
}

impl<F, Fut> Handler for AsyncHandler<F>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        let task = self.runtime.spawn((self.handler)(ctx.clone()));
        // Waiting for a JoinHandle needs no driver of the runtime, so this
        // works for a `current_thread` runtime driven by another thread.
        match self.runtime.block_on(task) {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(JobError::retry(format!(
                "the async handler's task did not finish: {e} (the tokio runtime shut down?)"
            ))),
        }
    }
}

impl WorkerPool {
    /// [`WorkerPool::shutdown`] for async code: the same steps and
    /// hand-back rules, on a blocking thread of the runtime
    /// (`spawn_blocking`), so the runtime's threads go on running (also
    /// the async handlers the shutdown waits for). Consumes the pool.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn shutdown_async(mut self, grace: Duration) -> ShutdownReport {
        match tokio::task::spawn_blocking(move || self.shutdown(grace)).await {
            Ok(report) => report,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down; the pool, dropped with the
            // closure, stopped (or stops) by itself.
            Err(_) => ShutdownReport::default(),
        }
    }
}
