//! `delete` without the daemon: removes a task from what is on disk, for
//! when the daemon is gone, or died in the middle of the request.
//!
//! In order: every process in the container's cgroup is SIGKILLed until
//! the cgroup is empty (the init was the daemon's child and is now
//! init's; a container may have forked), libcontainer's state is deleted
//! (which removes the cgroups it created), the cgroups are removed
//! directly when libcontainer had no state, the rootfs mounts are
//! detached, and the daemon's console socket for the task is removed.
//! Each step is idempotent, so a second `delete` (or one racing the
//! daemon's own delete) does no harm.
//!
//! Must run before any thread is started (it runs libcontainer here).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{cgroups::Cgroup, error::ShimError, helper, record::TaskRecord, service::short_hash};

/// A part of the task that could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// The cgroup could not be opened.
    #[error("cgroup {path}: {source}")]
    Cgroup {
        /// The container's cgroups path.
        path: PathBuf,
        /// Why.
        source: Box<ShimError>,
    },
    /// Processes survived SIGKILL.
    #[error("cgroup {path}: processes {pids:?} still there {timeout:?} after SIGKILL")]
    Survivors {
        /// The container's cgroups path.
        path: PathBuf,
        /// What still runs.
        pids: Vec<i32>,
        /// How long they were given.
        timeout: Duration,
    },
    /// libcontainer's delete failed (its state directory was removed anyway).
    #[error("libcontainer delete of {id} in {root}: {source}")]
    Libcontainer {
        /// Task id.
        id: String,
        /// libcontainer's state root.
        root: PathBuf,
        /// Why.
        source: Box<ShimError>,
    },
    /// The cgroup directories could not be removed.
    #[error("remove cgroup {path}: {message}")]
    RemoveCgroup {
        /// The container's cgroups path.
        path: PathBuf,
        /// libcgroups' error.
        message: String,
    },
}

/// How long the cleanup waits for the cgroup's processes to die.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// What could not be cleaned up; empty when everything is gone.
pub fn clean_up(record: &TaskRecord, bundle: &Path) -> Vec<CleanupError> {
    let mut problems = Vec::new();
    let id = record.id.as_str();
    let cgroups_path = crate::record::cgroups_path(bundle).filter(|p| own_cgroup(p));
    if let Some(path) = &cgroups_path
        && let Err(e) = kill_cgroup(path, id)
    {
        problems.push(e);
    }
    let root = record.libcontainer_root();
    let r = helper::run_inline(helper::Request::Delete {
        id: id.to_string(),
        root: root.clone(),
        force: true,
        cgroups_path: cgroups_path.clone(),
    });
    if let Err(source) = r.into_result() {
        problems.push(CleanupError::Libcontainer {
            id: id.to_string(),
            root: root.clone(),
            source: Box::new(source),
        });
        // The state is in the way of a new container with this id.
        let _ = std::fs::remove_dir_all(root.join(id));
    }
    if let Some(path) = &cgroups_path
        && let Err(e) = remove_cgroup(path, id)
    {
        problems.push(e);
    }
    let rootfs = bundle.join("rootfs");
    // Stacked mounts (a retried create): detach until nothing is left.
    for _ in 0..8 {
        if nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
    let console = record
        .daemon_dir
        .join(format!("{}.console", short_hash(&format!("{}/{id}", record.namespace))));
    let _ = std::fs::remove_file(console);
    problems
}

/// A path the container owns: not the root cgroup, not a systemd
/// `slice:prefix:name` (libcontainer's state covers those).
fn own_cgroup(p: &Path) -> bool {
    p.components().count() > 1 && !p.to_string_lossy().contains(':')
}

fn kill_cgroup(path: &Path, id: &str) -> Result<(), CleanupError> {
    let cg = Cgroup::open(path, id).map_err(|source| CleanupError::Cgroup {
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    let deadline = Instant::now() + KILL_TIMEOUT;
    loop {
        // No cgroup (already removed, never created): nothing runs in it.
        let pids = cg.pids().unwrap_or_default();
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(CleanupError::Survivors {
                path: path.to_path_buf(),
                pids,
                timeout: KILL_TIMEOUT,
            });
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn remove_cgroup(path: &Path, id: &str) -> Result<(), CleanupError> {
    let err = |e: &dyn std::fmt::Display| CleanupError::RemoveCgroup {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    use libcgroups::common::CgroupManager as _;
    let m = libcgroups::common::create_cgroup_manager(libcgroups::common::CgroupConfig {
        cgroup_path: path.to_path_buf(),
        systemd_cgroup: false,
        container_name: id.to_string(),
    })
    .map_err(|e| err(&e))?;
    m.remove().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_containers_own_cgroup_is_emptied() {
        assert!(own_cgroup(Path::new("/default/c1")));
        assert!(!own_cgroup(Path::new("/")));
        assert!(!own_cgroup(Path::new("system.slice:cri:c1")));
    }
}
