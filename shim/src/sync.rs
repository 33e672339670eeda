//! Locks that outlive a panic.
//!
//! A panic while serving one request is turned into an error reply (see
//! `task`); the daemon keeps serving every other task, so a lock the
//! panicking request held must stay usable: its data is still consistent
//! at every await point and every early return of the code here.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the guard of a poisoned mutex as it is.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
