//! The database server's clock, read without a round trip per use, for
//! the server engines (PostgreSQL, MySQL/MariaDB).
//!
//! Machines' clocks differ; on a server engine every "now" that decides
//! whether a job is due or a lease ran out is the server's. Asking the server on
//! every transaction would cost a round trip each, so [`ServerClock`]
//! samples the server's `clock_timestamp()` (at open, then every
//! `RESAMPLE` in a background thread, and within `RECONNECTED` of a new
//! connection, which after a failover is to another server) and between samples adds the time
//! elapsed on this machine's monotonic clock, which a step of the local
//! wall clock does not move. The error is half a round trip plus the
//! monotonic clock's drift since the last sample (parts per million).

use crate::clock::{ms_to_datetime, Clock};
use crate::error::Result;
use chrono::{DateTime, Utc};
use crossbeam_channel::RecvTimeoutError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// How often the server's clock is sampled again.
const RESAMPLE: Duration = Duration::from_secs(30);

/// How soon after a new connection the server's clock is sampled again.
const RECONNECTED: Duration = Duration::from_secs(1);

/// The server's time at a local instant.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    server_ms: i64,
    at: Instant,
}

/// "Now" as the database server's clock tells it; see the module docs.
#[derive(Debug)]
pub(crate) struct ServerClock {
    anchor: Arc<Mutex<Anchor>>,
    /// Dropped with the clock: ends the sampling thread at once, and with
    /// it the thread's handle on the engine's pool, whose connections then close.
    _stop: crossbeam_channel::Sender<()>,
}

impl ServerClock {
    /// Samples the server's clock once and keeps sampling it in a thread
    /// that ends when the clock is dropped. `read_ms` asks the server for
    /// its time in milliseconds since the Unix epoch, in one round trip.
    /// `connected` is set by the engine at each new connection: the next
    /// sample comes within [`RECONNECTED`] instead of [`RESAMPLE`], since
    /// the connection may be to another server (a promoted standby, with
    /// its own clock).
    pub(crate) fn start(
        read_ms: impl Fn() -> Result<i64> + Send + 'static,
        connected: Arc<AtomicBool>,
    ) -> Result<ServerClock> {
        connected.store(false, Ordering::SeqCst);
        let anchor = Arc::new(Mutex::new(sample(&read_ms)?));
        let weak: Weak<Mutex<Anchor>> = Arc::downgrade(&anchor);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        std::thread::Builder::new()
            .name("tickler-server-clock".into())
            .spawn(move || {
                let mut sampled = Instant::now();
                let mut failing: Option<Instant> = None;
                loop {
                    if stopped.recv_timeout(RECONNECTED) != Err(RecvTimeoutError::Timeout) {
                        return;
                    }
                    if !connected.swap(false, Ordering::SeqCst)
                        && failing.is_none()
                        && sampled.elapsed() < RESAMPLE
                    {
                        continue;
                    }
                    sampled = Instant::now();
                    let Some(anchor) = weak.upgrade() else { return };
                    match sample(&read_ms) {
                        Ok(fresh) => {
                            *anchor.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                            failing = None;
                        }
                        // The last sample goes on counting (a few minutes
                        // of monotonic drift are milliseconds at most) and
                        // the next try is in a second: a pooled connection
                        // the server ended while idle fails one read, which
                        // is not worth a warning; a server not read for
                        // `RESAMPLE` is.
                        Err(e) => {
                            let since = *failing.get_or_insert(sampled);
                            if since.elapsed() >= RESAMPLE {
                                log::warn!("could not read the database server's clock: {e}");
                                failing = Some(Instant::now());
                            } else {
                                log::debug!("could not read the database server's clock: {e}");
                            }
                        }
                    }
                }
            })
            .map_err(|e| crate::Error::Config(format!("cannot start the clock thread: {e}")))?;
        Ok(ServerClock {
            anchor,
            _stop: stop,
        })
    }
}

/// The server's clock at the middle of one round trip.
fn sample(read_ms: &impl Fn() -> Result<i64>) -> Result<Anchor> {
    let sent = Instant::now();
    let server_ms = read_ms()?;
    let back = Instant::now();
    Ok(Anchor {
        server_ms,
        at: sent + (back - sent) / 2,
    })
}

impl Clock for ServerClock {
    fn now(&self) -> DateTime<Utc> {
        ms_to_datetime(self.now_ms())
    }

    fn now_ms(&self) -> i64 {
        let anchor = *self.anchor.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = Instant::now().saturating_duration_since(anchor.at);
        anchor
            .server_ms
            .saturating_add(i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
    }
}
