//! Locks that outlive a panic.
//!
//! A panic while serving one request is turned into an error reply (see
//! `task`); the daemon keeps serving every other task, so a lock the
//! panicking request held must stay usable: its data is still consistent
//! at every await point and every early return of the code here.

/// Locks a mutex, taking the guard of a poisoned one as it is (the
/// workspace's one helper, [`nri_proto::sync::lock`]).
pub use nri_proto::sync::lock;
