//! The task table and the daemon's idle accounting.
//!
//! Tasks are keyed by (containerd namespace, id): two namespaces may use
//! the same id. A create reserves its key before NRI is asked, so a second
//! create of the same id is `AlreadyExists` even while the first waits for
//! the plugins. The daemon exits after its idle time only when the table
//! is empty, no request is in flight and nothing happened for that long.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use super::process::Task;
use crate::{
    error::{Result, ShimError},
    sync::lock,
};

/// (containerd namespace, task id).
pub type Key = (String, String);

fn key(ns: &str, id: &str) -> Key {
    (ns.to_string(), id.to_string())
}

/// Live tasks and creates in progress.
pub struct TaskTable {
    tasks: Mutex<HashMap<Key, Arc<Task>>>,
    creating: Mutex<HashSet<Key>>,
    changed: tokio::sync::Notify,
    /// Task requests being served.
    requests: AtomicUsize,
    /// Last accepted connection or finished request.
    activity: Mutex<Instant>,
    /// Exits reaped and not yet fully published.
    exiting: AtomicUsize,
    /// Of the requests in flight, those only waiting for an exit.
    waits: AtomicUsize,
}

/// An exit being published (see [`TaskTable::exiting`]).
pub struct Exiting<'a>(&'a TaskTable);

impl Drop for Exiting<'_> {
    fn drop(&mut self) {
        self.0.exiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for TaskTable {
    /// An empty table, idle from now.
    fn default() -> Self {
        TaskTable {
            tasks: Mutex::default(),
            creating: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            requests: AtomicUsize::new(0),
            activity: Mutex::new(Instant::now()),
            exiting: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
        }
    }
}

/// A reserved task key: released when dropped (a failed create) unless
/// the task was inserted with [`Reservation::insert`].
pub struct Reservation<'a> {
    table: &'a TaskTable,
    key: Key,
}

impl Reservation<'_> {
    /// Puts the created task in the table under the reserved key.
    pub fn insert(self, task: Arc<Task>) {
        lock(&self.table.tasks).insert(self.key.clone(), task);
        self.table.changed.notify_waiters();
        // Drop releases the reservation.
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.table.creating).remove(&self.key);
    }
}

impl TaskTable {
    /// Reserves `ns/id` for a create.
    ///
    /// # Errors
    /// [`ShimError::AlreadyExists`] when the task exists or is being created.
    pub fn reserve(&self, ns: &str, id: &str) -> Result<Reservation<'_>> {
        let k = key(ns, id);
        if lock(&self.tasks).contains_key(&k) || !lock(&self.creating).insert(k.clone()) {
            return Err(ShimError::AlreadyExists(format!(
                "task {id} already exists in namespace {ns}"
            )));
        }
        Ok(Reservation { table: self, key: k })
    }

    /// The task `ns/id`.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub fn get(&self, ns: &str, id: &str) -> Result<Arc<Task>> {
        lock(&self.tasks)
            .get(&key(ns, id))
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("task {id} not found in namespace {ns}")))
    }

    /// The task with container id `id` in any namespace (NRI names
    /// containers by id alone).
    pub fn find(&self, id: &str) -> Option<Arc<Task>> {
        lock(&self.tasks).values().find(|t| t.id == id).cloned()
    }

    /// Removes `ns/id`.
    pub fn remove(&self, ns: &str, id: &str) {
        lock(&self.tasks).remove(&key(ns, id));
        self.changed.notify_waiters();
    }

    /// Every live task.
    pub fn all(&self) -> Vec<Arc<Task>> {
        lock(&self.tasks).values().cloned().collect()
    }

    /// Number of live tasks.
    pub fn len(&self) -> usize {
        lock(&self.tasks).len()
    }

    /// No live task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the next change of the table or of the requests in flight.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Counts a request as in flight until [`TaskTable::end_request`].
    pub fn begin_request(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.touch();
    }

    /// A request finished.
    pub fn end_request(&self) {
        self.requests.fetch_sub(1, Ordering::SeqCst);
        self.touch();
        self.changed.notify_waiters();
    }

    /// Counts an exit as being published until the guard drops: an
    /// upgrade waits for none (the reaped status lives only in memory
    /// until then).
    pub fn exiting(&self) -> Exiting<'_> {
        self.exiting.fetch_add(1, Ordering::SeqCst);
        Exiting(self)
    }

    /// Counts a request in flight as only waiting (Wait) until
    /// [`TaskTable::end_wait`]: an upgrade does not wait for it.
    pub fn begin_wait(&self) {
        self.waits.fetch_add(1, Ordering::SeqCst);
    }

    /// A Wait finished.
    pub fn end_wait(&self) {
        self.waits.fetch_sub(1, Ordering::SeqCst);
    }

    /// What is in progress that an upgrade must not cut: (requests in
    /// flight other than Wait, creates reserved, exits being published).
    pub fn in_progress(&self) -> (usize, usize, usize) {
        (
            self.requests
                .load(Ordering::SeqCst)
                .saturating_sub(self.waits.load(Ordering::SeqCst)),
            lock(&self.creating).len(),
            self.exiting.load(Ordering::SeqCst),
        )
    }

    /// Puts a task of the previous image back (an upgrade).
    pub fn restore(&self, task: Arc<Task>) {
        lock(&self.tasks).insert(key(&task.ns, &task.id), task);
        self.changed.notify_waiters();
    }

    /// Records activity (an accepted connection, a request).
    pub fn touch(&self) {
        *lock(&self.activity) = Instant::now();
    }

    /// How long nothing happened: no task, no request in flight, no
    /// activity for that long. `None` while busy.
    pub fn idle_for(&self) -> Option<Duration> {
        if !self.is_empty() || self.requests.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(lock(&self.activity).elapsed())
    }
}
