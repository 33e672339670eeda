//! Start of a created container in the daemon, without a helper process.
//!
//! Starting a created container (OCI `start`) only tells its init, which
//! waits on the notify socket in libcontainer's state directory, to exec
//! the user process, then records the `running` status. libcontainer's
//! own `Container::start` does this, but first changes the process's
//! working directory to keep the socket path short, and in the
//! multi-threaded daemon a `chdir` moves every thread. So the daemon does
//! the same steps itself and reaches the socket through an `O_PATH`
//! descriptor of the directory, which needs no `chdir` and no helper
//! process (one `exec` of this binary less per container).
//!
//! A container with OCI poststart hooks is left to the helper: libcontainer
//! runs them after the start, in the runtime's namespaces, with their
//! timeouts and errors, and that stays libcontainer's code.

use std::{
    io::Write as _,
    os::fd::AsRawFd as _,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
};

use libcontainer::{
    config::YoukiConfig,
    container::{Container, ContainerStatus},
    error::LibcontainerError,
    notify_socket::NOTIFY_FILE,
};

use crate::{container::helper::libcontainer_error, error::ShimError};

/// What [`start_in_daemon`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// The init was told to exec and the state says `running`.
    Done,
    /// Nothing was done: the container has OCI poststart hooks, which the
    /// helper runs through libcontainer's start.
    HasPoststartHooks,
}

/// Starts created container `id` kept under libcontainer root `root`, as
/// libcontainer's `Container::start` does: the status is refreshed from
/// the init process, a container that is not `created` is refused, the
/// init is sent `start container` on `<root>/<id>/notify.sock`, and the
/// state is saved as `running`. Blocking file and socket I/O: call it off
/// the async runtime.
///
/// # Errors
/// [`ShimError::FailedPrecondition`] when the container is not `created`
/// (its init exited, or it was started already), [`ShimError::Io`] naming
/// the socket when the init cannot be reached, and libcontainer's errors
/// otherwise, classed as the helper classes them (no such container:
/// [`ShimError::Runtime`] naming its `state.json`).
pub fn start_in_daemon(root: &Path, id: &str) -> Result<Started, ShimError> {
    let mut c = Container::load(root.join(id)).map_err(libcontainer_error)?;
    c.refresh_status().map_err(libcontainer_error)?;
    if !c.can_start() {
        return Err(libcontainer_error(LibcontainerError::IncorrectStatus(c.status())));
    }
    let config = YoukiConfig::load(&c.root).map_err(|e| libcontainer_error(e.into()))?;
    let hooks = config.hooks.as_ref().and_then(|h| h.poststart().as_ref());
    if hooks.is_some_and(|h| !h.is_empty()) {
        return Ok(Started::HasPoststartHooks);
    }
    notify_start(&c.root)?;
    c.set_status(ContainerStatus::Running)
        .save()
        .map_err(libcontainer_error)?;
    Ok(Started::Done)
}

/// Sends `start container` to the listener on `dir/notify.sock` and closes
/// the connection (the init reads to end of file). The socket is named
/// through `/proc/self/fd/<O_PATH fd of dir>`, so a `dir` longer than a
/// unix socket address allows (108 bytes) needs no `chdir`.
///
/// # Errors
/// [`ShimError::Io`] naming the socket path.
pub fn notify_start(dir: &Path) -> Result<(), ShimError> {
    let sock: PathBuf = dir.join(NOTIFY_FILE);
    let io = |what: &str, e: std::io::Error| ShimError::io(format!("{what} {}", sock.display()), e);
    let d = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io("open the directory of", e.into()))?;
    let short = format!("/proc/self/fd/{}/{NOTIFY_FILE}", d.as_raw_fd());
    let mut stream = UnixStream::connect(&short).map_err(|e| io("connect to the init's notify socket", e))?;
    stream
        .write_all(b"start container")
        .map_err(|e| io("write to the init's notify socket", e))
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// A directory whose notify socket path is longer than a unix socket
    /// address (108 bytes): the listener is bound through the same
    /// `/proc/self/fd` name, the message arrives whole and then end of file.
    #[test]
    fn notify_reaches_a_socket_whose_path_is_too_long_for_an_address() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(dir.join(NOTIFY_FILE).as_os_str().len() > 108);
        let d = std::fs::File::open(&dir).unwrap();
        let listener =
            std::os::unix::net::UnixListener::bind(format!("/proc/self/fd/{}/{NOTIFY_FILE}", d.as_raw_fd())).unwrap();
        assert!(dir.join(NOTIFY_FILE).exists());
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = String::new();
            s.read_to_string(&mut got).unwrap();
            got
        });
        notify_start(&dir).unwrap();
        assert_eq!(reader.join().unwrap(), "start container");
    }

    #[test]
    fn notify_without_a_listener_names_the_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let err = notify_start(tmp.path()).unwrap_err().to_string();
        assert!(
            err.contains(&tmp.path().join(NOTIFY_FILE).display().to_string()),
            "{err}"
        );
        assert!(err.contains("connect"), "{err}");
    }

    /// As the helper reports it: libcontainer's error naming the state file.
    #[test]
    fn a_missing_container_names_its_state_file() {
        let tmp = tempfile::tempdir().unwrap();
        let err = start_in_daemon(tmp.path(), "nope").unwrap_err();
        let ShimError::Runtime(msg) = &err else {
            panic!("{err:?}")
        };
        assert!(
            msg.contains(&tmp.path().join("nope/state.json").display().to_string()),
            "{msg}"
        );
    }
}
