//! Wakes [`ChangeWatcher`](crate::ChangeWatcher)s when any process writes
//! to a queue file's `-wal` file, from the operating system's file-change
//! notification (inotify on Linux, FSEvents on macOS, kqueue on the BSDs,
//! through the `notify` crate), so that an idle watcher does not have to
//! poll `PRAGMA data_version` every few milliseconds to see other
//! processes' commits.
//!
//! Why the `-wal` file: in WAL mode every commit appends its pages to it
//! with `write(2)`, which the notification reports; readers of the file
//! and SQLite's shared-memory index (`-shm`, written through `mmap`, which
//! inotify does not report) make no event. A commit becomes visible in the
//! index just after its last write, so a watcher woken by an event polls
//! `data_version` briefly (see `ChangeWatcher::wait`).
//!
//! One OS watcher (one thread, one inotify instance) per process, shared by
//! every `Queue` in it. If it cannot be started, or a file cannot be
//! watched (an inotify watch limit, a file system without notifications),
//! the watchers of that file fall back to polling.

use crossbeam_channel::{Receiver, Sender};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The file-change notifications of one opened `Queue`.
#[derive(Debug, Default)]
pub(crate) struct FileEvents {
    /// Notifications are being delivered for this file.
    live: AtomicBool,
    /// One channel per watcher; bounded(1), so events coalesce.
    subscribers: Mutex<Vec<Sender<()>>>,
}

impl FileEvents {
    /// Whether writes to the file are being reported.
    pub(crate) fn live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// A channel that gets a message after writes to the file.
    pub(crate) fn subscribe(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        rx
    }

    fn fire(&self) {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|s| {
                !matches!(
                    s.try_send(()),
                    Err(crossbeam_channel::TrySendError::Disconnected(()))
                )
            });
    }
}

struct Registry {
    /// Held while watches are added or removed, so registrations do not
    /// race; `None` if the OS watcher could not be started.
    watcher: Mutex<Option<RecommendedWatcher>>,
    /// Watched `-wal` files (canonical paths) and whom to tell. The event
    /// handler takes only this lock, never `watcher`'s: `notify` waits for
    /// its event thread while adding a watch, so holding both would
    /// deadlock.
    paths: Mutex<HashMap<PathBuf, Vec<Weak<FileEvents>>>>,
}

/// The registry of this process, with the pid it was made in.
static REGISTRY: Mutex<Option<(u32, &'static Registry)>> = Mutex::new(None);

/// This process's registry. A child made by `fork()` gets a new one: the
/// parent's notification thread does not exist in it, and asking that
/// thread to add a watch would wait forever. The parent's registry is
/// leaked there, never dropped (dropping it would also talk to the thread).
fn registry() -> &'static Registry {
    let mut slot = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let me = std::process::id();
    if let Some((pid, registry)) = *slot {
        if pid == me {
            return registry;
        }
    }
    let registry: &'static Registry = Box::leak(Box::new(Registry {
        watcher: Mutex::new(None),
        paths: Mutex::new(HashMap::new()),
    }));
    let watcher = notify::recommended_watcher(move |event| on_event(registry, event))
        .map_err(|e| {
            log::warn!(
                "file-change notifications unavailable ({e}); idle workers poll the file instead"
            );
        })
        .ok();
    *registry
        .watcher
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = watcher;
    *slot = Some((me, registry));
    registry
}

fn on_event(registry: &Registry, event: notify::Result<notify::Event>) {
    let Ok(event) = event else { return };
    // Opening or reading the file is no commit.
    if matches!(event.kind, EventKind::Access(_)) {
        return;
    }
    let removed = matches!(event.kind, EventKind::Remove(_));
    let paths = registry
        .paths
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for path in &event.paths {
        for events in paths.get(path).into_iter().flatten() {
            if let Some(events) = events.upgrade() {
                if removed {
                    // A new -wal file would be a new inode, unwatched:
                    // its watchers poll from now on.
                    events.live.store(false, Ordering::SeqCst);
                }
                events.fire();
            }
        }
    }
}

/// Starts reporting writes to `wal` to `events`. Returns false (and the
/// caller polls) if that is not possible.
pub(crate) fn watch(wal: &Path, events: &Arc<FileEvents>) -> bool {
    let registry = registry();
    let Ok(path) = wal.canonicalize() else {
        return false;
    };
    let mut watcher = registry
        .watcher
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let Some(watcher) = watcher.as_mut() else {
        return false;
    };
    // Forget files whose queues are all closed, so a long-lived process
    // opening many files does not run out of inotify watches.
    let (watched, closed) = {
        let mut paths = registry
            .paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut closed = Vec::new();
        paths.retain(|p, list| {
            list.retain(|w| w.strong_count() > 0);
            if list.is_empty() && *p != path {
                closed.push(p.clone());
                false
            } else {
                true
            }
        });
        (paths.contains_key(&path), closed)
    };
    for p in closed {
        let _ = watcher.unwatch(&p);
    }
    if !watched {
        if let Err(e) = watcher.watch(&path, RecursiveMode::NonRecursive) {
            log::warn!(
                "cannot watch {} for changes ({e}); idle workers poll it instead",
                path.display()
            );
            return false;
        }
    }
    registry
        .paths
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(path)
        .or_default()
        .push(Arc::downgrade(events));
    events.live.store(true, Ordering::SeqCst);
    true
}
