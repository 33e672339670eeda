//! OOM kills as they happen, not only when the container exits.
//!
//! When the kernel OOM-kills a process of a container that keeps running,
//! containerd's runc shim publishes `/tasks/oom` at once (CRI then reports
//! the kill); we must too. The kernel tells through the memory controller:
//!
//! - cgroup v1: an eventfd registered in `cgroup.event_control` against
//!   `memory.oom_control` is signalled on each OOM (and when the cgroup is
//!   removed);
//! - cgroup v2: `memory.events` is modified (its `oom_kill` counter grows).
//!
//! [`OomWatch::changed`] wakes on either; the caller then reads the
//! `oom_kill` counter to tell an OOM kill from other changes.

use std::{
    fs::OpenOptions,
    io::{self, Write},
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use rustix::{event::EventfdFlags, fs::inotify};
use tokio::io::unix::AsyncFd;

/// A subscription to the OOM events of one cgroup.
pub struct OomWatch {
    fd: AsyncFd<OwnedFd>,
    /// The watched cgroup directory: the watch ends when it is gone.
    dir: PathBuf,
    // v1: the `memory.oom_control` fd must stay open while registered.
    _control: Option<std::fs::File>,
}

impl OomWatch {
    /// Watches the memory controller of the cgroup at `cgroups_path` (as
    /// in the OCI spec) under `root` (`/sys/fs/cgroup`): v1 when
    /// `root/memory/<path>` exists, else v2.
    ///
    /// # Errors
    /// When neither hierarchy has the cgroup, or registering fails.
    pub fn open(root: &Path, cgroups_path: &Path) -> io::Result<OomWatch> {
        let rel = cgroups_path.strip_prefix("/").unwrap_or(cgroups_path);
        let v1 = root.join("memory").join(rel);
        if v1.join("memory.oom_control").exists() {
            return Self::open_v1(&v1);
        }
        let v2 = root.join(rel);
        if v2.join("memory.events").exists() {
            return Self::open_v2(&v2);
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no memory cgroup for {} under {}",
                cgroups_path.display(),
                root.display()
            ),
        ))
    }

    fn open_v1(dir: &Path) -> io::Result<OomWatch> {
        let efd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let control = std::fs::File::open(dir.join("memory.oom_control"))?;
        let mut reg = OpenOptions::new().write(true).open(dir.join("cgroup.event_control"))?;
        reg.write_all(format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()).as_bytes())?;
        Ok(OomWatch {
            fd: crate::task::monitor::async_readable(efd)?,
            dir: dir.to_path_buf(),
            _control: Some(control),
        })
    }

    fn open_v2(dir: &Path) -> io::Result<OomWatch> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        inotify::add_watch(&fd, dir.join("memory.events"), inotify::WatchFlags::MODIFY)?;
        Ok(OomWatch {
            fd: crate::task::monitor::async_readable(fd)?,
            dir: dir.to_path_buf(),
            _control: None,
        })
    }

    /// Whether the watch is cgroup v1's: the kernel signals the OOM when
    /// it starts handling it, before it kills and counts the victim in
    /// `oom_kill` (v2's `memory.events` changes again when it counts).
    pub fn signals_before_the_kill(&self) -> bool {
        self._control.is_some()
    }

    /// Waits for the next change; `false` once the cgroup is gone (the
    /// watch has ended).
    pub async fn changed(&mut self) -> bool {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return false;
            };
            // Drain what is pending (an eventfd counter or inotify records).
            let mut buf = [0u8; 1024];
            let drained = guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(io::Error::from));
            match drained {
                Ok(Ok(_)) => return self.dir.exists(),
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(Err(_)) => return false,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v2's mechanism on a plain file: a write to `memory.events` wakes the
    /// watch; removing the directory ends it.
    #[tokio::test]
    async fn a_modified_memory_events_file_wakes_the_v2_watch() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("pod/c1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        let mut w = OomWatch::open(root.path(), Path::new("/pod/c1")).unwrap();
        std::fs::write(dir.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        let woke = tokio::time::timeout(std::time::Duration::from_secs(5), w.changed()).await;
        assert_eq!(woke, Ok(true));
        std::fs::remove_dir_all(&dir).unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), w.changed()).await;
        assert_eq!(ended, Ok(false));
    }

    #[test]
    fn no_memory_cgroup_is_an_error_naming_the_path() {
        let root = tempfile::tempdir().unwrap();
        let e = OomWatch::open(root.path(), Path::new("/nope")).err().unwrap();
        assert!(e.to_string().contains("/nope"), "{e}");
    }
}
