//! `delete` without the daemon: removes a task from what is on disk, for
//! when the daemon is gone, or died in the middle of the request.
//!
//! In order: the container's [`CreateLock`] is taken (a helper of a killed
//! daemon may still be inside libcontainer's create; the container would
//! appear after the cleanup otherwise), every process in the container's
//! cgroup is SIGKILLed until
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
    fs::File,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{cgroups::Cgroup, container::helper, container::record::TaskRecord, error::ShimError};

/// A part of the task that could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// The cgroup could not be opened.
    #[error("cgroup {path}")]
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
    #[error("libcontainer delete of {id} in {root}")]
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
/// How long the cleanup waits for a create in progress.
const CREATE_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Serialises libcontainer's create of a container with its cleanup: the
/// helper holds it while it creates, [`clean_up`] takes it before it
/// looks, so a helper orphaned by a killed daemon finishes (or dies)
/// first. A POSIX record lock: a forked container init does not inherit
/// it, and it goes away with the process that holds it. The holder removes
/// the file before releasing it, so none accumulate.
pub struct CreateLock {
    path: PathBuf,
    _file: File,
}

impl CreateLock {
    /// The lock file of container `id` whose libcontainer state root is `root`.
    pub fn path(root: &Path, id: &str) -> PathBuf {
        root.parent().unwrap_or(root).join("create-locks").join(id)
    }

    /// Takes the lock, waiting at most `timeout`; `None` when it cannot be
    /// taken (best effort: the caller proceeds without it).
    pub fn acquire(root: &Path, id: &str, timeout: Duration) -> Option<CreateLock> {
        let path = Self::path(root, id);
        crate::private::create_dir_all(path.parent()?).ok()?;
        let deadline = Instant::now() + timeout;
        loop {
            let file = crate::private::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .ok()?;
            if nix::fcntl::fcntl(
                file.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETLK(&whole_file_write_lock()),
            )
            .is_ok()
            {
                // The holder before us may have removed the file we locked.
                if std::fs::metadata(&path).is_ok() {
                    return Some(CreateLock { path, _file: file });
                }
                continue;
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A POSIX write lock on the whole file.
fn whole_file_write_lock() -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

impl Drop for CreateLock {
    fn drop(&mut self) {
        // Removed while held; closing the file then releases the lock.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What could not be cleaned up; empty when everything is gone.
pub fn clean_up(record: &TaskRecord, bundle: &Path) -> Vec<CleanupError> {
    let mut problems = Vec::new();
    let id = record.id.as_str();
    let _create = CreateLock::acquire(&record.libcontainer_root(), id, CREATE_LOCK_TIMEOUT);
    let cgroups_path = crate::container::record::cgroups_path(bundle).filter(|p| own_cgroup(p));
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
    // A user-namespaced container's idmapped volumes, staged in the bundle
    // (containerd removes the bundle next: nothing may stay mounted there).
    super::idmap::unstage_all(bundle);
    let _ = std::fs::remove_file(crate::layout::init_console(&record.daemon_dir, &record.namespace, id));
    crate::task::audit::AuditRecord::remove(&record.daemon_dir, &record.namespace, id);
    problems
}

/// A path the container owns: not the root cgroup; a systemd
/// `slice:prefix:name` is its scope (see `cgroups::SystemdPath`); any
/// other path only when absolute (the daemon makes a relative one
/// absolute before the create, see `cgroups::path::cgroupfs_relative`).
fn own_cgroup(p: &Path) -> bool {
    crate::cgroups::SystemdPath::parse(p).is_some() || (p.is_absolute() && p.components().count() > 1)
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
    Cgroup::open(path, id)
        .and_then(|c| c.remove())
        .map_err(|e| CleanupError::RemoveCgroup {
            path: path.to_path_buf(),
            message: crate::error::chain(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_create_lock_excludes_another_process_and_leaves_no_file() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("containers");
        let lock = CreateLock::acquire(&root, "c1", Duration::ZERO).expect("lock");
        let path = CreateLock::path(&root, "c1");
        assert!(path.exists());
        // POSIX locks are per process: another process sees it held.
        assert!(held_elsewhere(&path));
        drop(lock);
        assert!(!path.exists());
        let again = CreateLock::acquire(&root, "c1", Duration::ZERO).expect("free again");
        drop(again);
    }

    /// Whether a child process finds `path` write-locked (F_GETLK).
    fn held_elsewhere(path: &Path) -> bool {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        // SAFETY: the child only calls fcntl and _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let mut l = whole_file_write_lock();
                let r = nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut l));
                // SAFETY: _exit in the forked child, no destructors run.
                unsafe { libc::_exit(i32::from(r.is_ok() && l.l_type != libc::F_UNLCK as i16)) }
            }
            nix::unistd::ForkResult::Parent { child } => matches!(
                nix::sys::wait::waitpid(child, None).unwrap(),
                nix::sys::wait::WaitStatus::Exited(_, 1)
            ),
        }
    }

    #[test]
    fn only_a_containers_own_cgroup_is_emptied() {
        assert!(own_cgroup(Path::new("/default/c1")));
        assert!(!own_cgroup(Path::new("/")));
        // A systemd path is the container's scope (emptied and stopped
        // when libcontainer's state is unreadable); other `:` paths are
        // not the container's.
        assert!(own_cgroup(Path::new("system.slice:cri:c1")));
        assert!(!own_cgroup(Path::new("a:b")));
    }
}
