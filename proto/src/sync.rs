//! Locks that outlive a panic, for every crate of the workspace.
//!
//! The runtime and the plugins keep serving after one request panicked
//! (a ttrpc handler's panic becomes an error reply, a task's panic ends only
//! that task). A lock the panicking code held must stay usable, and the data
//! behind the workspace's locks is consistent at every point a panic can
//! happen (each critical section is a few field updates or one clone), so
//! poisoning is ignored: these take the guard of a poisoned lock as it is.
//!
//! `std` locks rather than `parking_lot`: the lock types appear in public
//! signatures (nri-replay's state) and in the shim, and the only thing
//! missing is this one line.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, taking the guard of a poisoned mutex as it is.
///
/// ```
/// let m = std::sync::Mutex::new(1);
/// let _ = std::panic::catch_unwind(|| {
///     let _g = m.lock().unwrap();
///     panic!("poisons the mutex");
/// });
/// assert_eq!(*nri_proto::sync::lock(&m), 1);
/// ```
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes `l` for reading, ignoring poisoning like [`lock`].
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Takes `l` for writing, ignoring poisoning like [`lock`].
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}
