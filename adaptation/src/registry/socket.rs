//! The socket external plugins dial: binding it (taking over only a stale
//! socket), accepting connections, and removing it at stop if it is still
//! ours.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    net::{UnixListener, UnixStream},
    task::JoinHandle,
};

use crate::error::Error;

/// How long a live socket at the configured path may take to go away (a
/// predecessor handing over) before the path counts as in use.
const SOCKET_HANDOVER: Duration = Duration::from_secs(2);

/// Pause between two probes of a live socket during the handover.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long one probe may wait for the kernel to take its connection.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What a connect() to an existing socket file says about its owner.
enum Probe {
    /// Nobody listens (ECONNREFUSED) or the file is gone: safe to replace.
    Stale,
    /// A listener took the connection (accepted or queued it).
    Accepts,
    /// A listener exists but its backlog is full (EAGAIN) or the connect
    /// did not complete in time: it is not accepting. A blocking connect
    /// would wait here forever.
    NotAccepting,
    /// Any other error (permissions, ...): neither stale nor provably live.
    Failed(std::io::Error),
}

/// Connects to `path` without blocking the thread and without waiting
/// longer than [`PROBE_TIMEOUT`].
async fn probe(path: &Path) -> Probe {
    use std::io::ErrorKind;
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        Err(_elapsed) => Probe::NotAccepting,
        Ok(Ok(_stream)) => Probe::Accepts,
        Ok(Err(e)) => match e.kind() {
            ErrorKind::ConnectionRefused | ErrorKind::NotFound => Probe::Stale,
            ErrorKind::WouldBlock => Probe::NotAccepting,
            _ => Probe::Failed(e),
        },
    }
}

/// A bound socket and the task accepting on it.
pub(crate) struct Listener {
    task: JoinHandle<()>,
    path: PathBuf,
    /// The bound socket's (device, inode): the file is removed at close
    /// only if it is still ours, not a successor's that took the path over.
    inode: (u64, u64),
}

impl Listener {
    /// Binds `path` (see [`bind`]) and hands every accepted connection to
    /// `on_accept` until it returns false.
    pub async fn open<F>(path: &Path, on_accept: F) -> Result<Listener, Error>
    where
        F: Fn(UnixStream) -> bool + Send + 'static,
    {
        let (listener, inode) = bind(path).await?;
        let task = tokio::spawn(accept_loop(listener, on_accept));
        Ok(Listener {
            task,
            path: path.to_path_buf(),
            inode,
        })
    }

    /// Stops accepting and removes the socket file if it is still ours.
    pub async fn close(self) {
        self.task.abort();
        let _ = self.task.await;
        if inode(&self.path) == Some(self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn inode(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Creates the parent directory (0700) and listens on `path`, a socket of
/// mode 0600 (see [`bind_private`]). A stale
/// socket is replaced (NRI); unlike upstream, a socket somebody still
/// listens on (probed without blocking: also one whose backlog is full),
/// or a path that is not a socket, is an error rather than silently
/// unlinked.
async fn bind(path: &Path) -> Result<(UnixListener, (u64, u64)), Error> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    let err = |what, source| Error::Socket {
        path: path.to_path_buf(),
        what,
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err("cannot create parent directory", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(err(
                "the path exists and is not a socket",
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        Ok(_) => {
            let deadline = tokio::time::Instant::now() + SOCKET_HANDOVER;
            loop {
                let in_use = match probe(path).await {
                    Probe::Stale => break,
                    Probe::Accepts => {
                        "another process listens on it (another runtime? set a different socket path or disable external connections)"
                    }
                    Probe::NotAccepting => {
                        "another process listens on it but accepts no connections (a hung runtime? stop it or set a different socket path)"
                    }
                    Probe::Failed(e) => return Err(err("cannot probe the existing socket", e)),
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(err(in_use, std::io::ErrorKind::AddrInUse.into()));
                }
                // Each probe is a connection the other side logs as a
                // failed plugin: few of them.
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
            match std::fs::remove_file(path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed stale NRI socket"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err("cannot remove stale socket", e)),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("cannot inspect the path", e)),
    }
    let listener = bind_private(path).map_err(|e| err("cannot listen", e))?;
    let inode =
        inode(path).ok_or_else(|| err("cannot inspect the bound socket", std::io::ErrorKind::NotFound.into()))?;
    Ok((listener, inode))
}

/// Listens on `path`, a socket only root can connect to (mode 0600) from
/// its first moment, also where the parent directory is not ours and the
/// umask is loose: Linux creates a unix socket's file with the mode of the
/// socket's own inode (less the umask), so that inode is narrowed with
/// `fchmod` before `bind`. The process umask is left alone (it is shared
/// with every thread, and with the children they spawn).
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    nix::sys::stat::fchmod(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &UnixAddr::new(path)?)?;
    listen(&fd, Backlog::MAXCONN)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))
}

async fn accept_loop(listener: UnixListener, on_accept: impl Fn(UnixStream) -> bool) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "failed to accept NRI plugin connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !on_accept(stream) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn the_socket_is_0600_under_a_loose_umask_in_a_shared_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = d.path().join("nri.sock");
        // The loosest umask containerd could give the runtime; restored
        // before any other assertion (this is the crate's only umask test).
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let bound = bind(&path).await;
        nix::sys::stat::umask(old);
        let (listener, ino) = bound.unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(inode(&path), Some(ino));
        // Reached through the new name; the staging directory is gone.
        let _client = UnixStream::connect(&path).await.unwrap();
        let (_server, _) = listener.accept().await.unwrap();
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["nri.sock"]);
    }

    #[tokio::test]
    async fn a_path_taken_meanwhile_is_in_use() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("nri.sock");
        std::fs::write(&path, "").unwrap();
        let e = bind_private(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    }
}
