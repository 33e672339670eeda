//! The plugin directory watch: a plugin executable that appears in
//! `[nri] plugin_path` is started, one that goes away is stopped, without
//! a signal (NRI reads the directory only at start; a node agent that
//! installs a plugin should not have to know about the daemon).
//!
//! inotify on the directory (rustix, as the OOM watch); when the directory
//! does not exist yet, on its parent until it does. Events are settled for
//! [`SETTLE`] before the directory is compared with the launched plugins
//! ([`nri_adaptation::Adaptation::rescan_plugins`]): a copy in progress
//! makes several events, and a plugin that failed to launch from a
//! half-written file is tried again on the next event (its last write).

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use rustix::fs::inotify;
use tokio::io::unix::AsyncFd;

/// Quiet time after the last event before the directory is compared.
pub const SETTLE: Duration = Duration::from_millis(200);

/// An inotify watch of one plugin directory (or of its parent while it
/// does not exist).
pub struct PluginWatch {
    fd: AsyncFd<OwnedFd>,
    dir: PathBuf,
}

impl PluginWatch {
    /// Watches `dir`.
    ///
    /// # Errors
    /// When inotify cannot be set up.
    pub fn new(dir: &Path) -> io::Result<PluginWatch> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let w = PluginWatch {
            fd: crate::task::monitor::async_readable(fd)?,
            dir: dir.to_path_buf(),
        };
        w.arm();
        Ok(w)
    }

    /// (Re)adds the watch: on the directory, else on its parent (for the
    /// directory's creation). Adding a watch twice only updates it.
    fn arm(&self) {
        use inotify::WatchFlags as F;
        let entries = F::CREATE | F::DELETE | F::MOVED_FROM | F::MOVED_TO | F::CLOSE_WRITE | F::ATTRIB;
        let itself = F::DELETE_SELF | F::MOVE_SELF;
        let fd = self.fd.get_ref();
        if inotify::add_watch(fd, &self.dir, entries | itself).is_err() {
            if let Some(parent) = self.dir.parent() {
                let _ = inotify::add_watch(fd, parent, F::CREATE | F::MOVED_TO);
            }
        }
    }

    /// Waits for the next change in the directory, then until none came for
    /// [`SETTLE`]. `false` when the watch broke (the caller stops watching).
    pub async fn changed(&mut self) -> bool {
        if !self.next().await {
            return false;
        }
        while let Ok(more) = tokio::time::timeout(SETTLE, self.next()).await {
            if !more {
                return false;
            }
        }
        // The directory may have been created, removed or replaced.
        self.arm();
        true
    }

    /// One batch of inotify records, drained.
    async fn next(&mut self) -> bool {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return false;
            };
            let mut buf = [0u8; 4096];
            match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(io::Error::from)) {
                Ok(Ok(_)) => return true,
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(Err(_)) => return false,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Keeps the pre-installed plugins of `nri` in line with its plugin
/// directory until the daemon exits; `dirs` carries the directory (a
/// reload may change it).
pub async fn run(nri: nri_adaptation::Adaptation, mut dirs: tokio::sync::watch::Receiver<PathBuf>) {
    loop {
        let dir = dirs.borrow_and_update().clone();
        let mut watch = match PluginWatch::new(&dir) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot watch the NRI plugin directory; plugins added or removed are picked up on SIGHUP only");
                return;
            }
        };
        loop {
            tokio::select! {
                alive = watch.changed() => {
                    if !alive {
                        tracing::error!(dir = %dir.display(), "the NRI plugin directory watch broke; plugins added or removed are picked up on SIGHUP only");
                        return;
                    }
                    match nri.rescan_plugins().await {
                        Ok(r) => crate::node::reload::log_plugin_changes("plugin directory changed", &r),
                        Err(e) => tracing::error!(error = %crate::error::chain(&e), "plugin directory changed but cannot be read"),
                    }
                }
                changed = dirs.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sees_files_and_the_directory_appearing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("plugins");
        let mut w = PluginWatch::new(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), w.changed()).await.unwrap());
        std::fs::write(dir.join("10-a"), "x").unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), w.changed()).await.unwrap());
        std::fs::remove_file(dir.join("10-a")).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), w.changed()).await.unwrap());
        // Quiet directory: nothing to report.
        assert!(tokio::time::timeout(SETTLE * 3, w.changed()).await.is_err());
    }
}
