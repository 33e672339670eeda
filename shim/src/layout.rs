//! What lives in a daemon's directory (`<state_root>/<hash of containerd's
//! address>`): written by the daemon, read by `start`, by `delete` without
//! a daemon and by the task code. One place, so they cannot drift apart.

use std::path::{Path, PathBuf};

/// The daemon's task socket (ttrpc; containerd connects here).
pub fn task_socket(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("task.sock")
}

/// libcontainer's state root (one directory per container).
pub fn libcontainer_root(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("containers")
}

/// The console socket of task `ns/id`'s init (a terminal's pty master is
/// received there).
pub fn init_console(daemon_dir: &Path, ns: &str, id: &str) -> PathBuf {
    daemon_dir.join(format!(
        "{}.console",
        crate::task::service::short_hash(&format!("{ns}/{id}"))
    ))
}

/// The NRI audit records of the daemon's tasks (see [`crate::task::audit`]).
pub fn audit_dir(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("audit")
}

/// The audit record of task `ns/id`: `audit/<namespace>/<id>.json`
/// (containerd's namespaces and ids are single path components).
pub fn audit_record(daemon_dir: &Path, ns: &str, id: &str) -> PathBuf {
    audit_dir(daemon_dir).join(ns).join(format!("{id}.json"))
}
