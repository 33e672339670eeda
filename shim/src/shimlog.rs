//! Where the daemon's log lines go: its own `shim.log` (stderr) and
//! containerd's log.
//!
//! containerd creates a fifo named `log` in each task's bundle, reads it and
//! copies what arrives into its own output (containerd 1.6
//! `runtime/v2/binary.go`); a Go shim writes its logs there. One nri-shim
//! daemon serves many tasks, so it keeps the `log` fifo of every live task
//! open and writes each line once, to the newest one: containerd's log gets
//! every line exactly once while any task exists. Writes never block the
//! daemon: a line is dropped for containerd when the fifo is full, and a
//! fifo whose reader is gone (EPIPE) is forgotten.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::Path,
    sync::Mutex,
};

/// Name of containerd's log fifo in a bundle.
pub const LOG_FIFO: &str = "log";

/// The open `log` fifos, oldest first, keyed by `namespace/id`.
#[derive(Default)]
pub struct ShimLog {
    fifos: Mutex<Vec<(String, File)>>,
}

/// The daemon's instance, used by [`writer`].
pub static SHIM_LOG: ShimLog = ShimLog {
    fifos: Mutex::new(Vec::new()),
};

impl ShimLog {
    /// Starts forwarding to `bundle/log` for task `key`. Returns whether the
    /// fifo was opened: false when there is none or nobody reads it (no
    /// containerd behind the bundle), which is not an error.
    pub fn attach(&self, key: &str, bundle: &Path) -> bool {
        let path = bundle.join(LOG_FIFO);
        // Never create it: containerd makes the fifo; a plain file here is
        // not containerd's.
        if !std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_fifo()) {
            return false;
        }
        // O_NONBLOCK: opening fails with ENXIO instead of waiting when no
        // reader exists, and later writes never stall the daemon.
        let Ok(file) = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        else {
            return false;
        };
        let mut fifos = self.lock();
        fifos.retain(|(k, _)| k != key);
        fifos.push((key.to_string(), file));
        true
    }

    /// Stops forwarding to the fifo of task `key` (closing it, which ends
    /// containerd's copy).
    pub fn detach(&self, key: &str) {
        self.lock().retain(|(k, _)| k != key);
    }

    /// The open fifos, oldest first: (task key, fd). The fds stay valid
    /// while attached (an upgrade duplicates them for the next image).
    pub fn fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        use std::os::fd::AsRawFd as _;
        self.lock().iter().map(|(k, f)| (k.clone(), f.as_raw_fd())).collect()
    }

    /// Forwards to a fifo the previous image of the daemon had open (see
    /// [`ShimLog::fds`]), as the newest: containerd's copy never saw the
    /// fifo's writer go.
    pub fn adopt(&self, key: &str, fd: std::os::fd::OwnedFd) {
        let mut fifos = self.lock();
        fifos.retain(|(k, _)| k != key);
        fifos.push((key.to_string(), File::from(fd)));
    }

    /// Number of fifos written to.
    pub fn attached(&self) -> usize {
        self.lock().len()
    }

    /// Writes one formatted line to the newest fifo that takes it.
    fn forward(&self, line: &[u8]) {
        let mut fifos = self.lock();
        while let Some((_, f)) = fifos.last_mut() {
            match f.write(line) {
                Ok(_) => return,
                // Full: containerd is behind; drop the line rather than block.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    fifos.pop();
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, File)>> {
        crate::sync::lock(&self.fifos)
    }
}

/// A `tracing_subscriber` writer: each formatted event goes to stderr (the
/// daemon's `shim.log`) and to containerd through [`SHIM_LOG`].
pub fn writer() -> LogWriter<'static> {
    LogWriter { log: &SHIM_LOG }
}

/// Writer returned by [`writer`]; the fmt layer writes one whole event per
/// `write` call.
pub struct LogWriter<'a> {
    log: &'a ShimLog,
}

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        self.log.forward(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn fifo_with_reader(dir: &Path) -> File {
        nix::unistd::mkfifo(&dir.join(LOG_FIFO), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dir.join(LOG_FIFO))
            .unwrap()
    }

    fn read_all(r: &mut File) -> String {
        let mut s = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            s.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
        s
    }

    #[test]
    fn lines_reach_the_newest_live_fifo_once() {
        let log = ShimLog::default();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut ra, mut rb) = (fifo_with_reader(a.path()), fifo_with_reader(b.path()));
        assert!(log.attach("default/a", a.path()));
        assert!(log.attach("default/b", b.path()));
        log.forward(b"one\n");
        assert_eq!(read_all(&mut rb), "one\n");
        assert_eq!(read_all(&mut ra), "");
        // b's reader goes away (containerd deleted the task): lines fall
        // back to a and b is forgotten.
        drop(rb);
        log.forward(b"two\n");
        assert_eq!(read_all(&mut ra), "two\n");
        assert_eq!(log.attached(), 1);
        log.detach("default/a");
        assert_eq!(log.attached(), 0);
        // No fifo left: nothing to forward to, nothing fails.
        log.forward(b"three\n");
    }

    #[test]
    fn no_fifo_or_no_reader_is_not_attached() {
        let log = ShimLog::default();
        let d = tempfile::tempdir().unwrap();
        assert!(!log.attach("default/x", d.path()), "no fifo");
        std::fs::write(d.path().join(LOG_FIFO), "").unwrap();
        assert!(
            !log.attach("default/x", d.path()),
            "a plain file is not containerd's fifo"
        );
        std::fs::remove_file(d.path().join(LOG_FIFO)).unwrap();
        nix::unistd::mkfifo(
            &d.path().join(LOG_FIFO),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(!log.attach("default/x", d.path()), "nobody reads it");
        assert_eq!(log.attached(), 0);
    }

    #[test]
    fn a_full_fifo_drops_lines_instead_of_blocking() {
        let log = ShimLog::default();
        let d = tempfile::tempdir().unwrap();
        let mut r = fifo_with_reader(d.path());
        assert!(log.attach("default/full", d.path()));
        let line = vec![b'x'; 4096];
        // Far more than a pipe holds (64 KiB by default); must return.
        for _ in 0..64 {
            log.forward(&line);
        }
        assert_eq!(log.attached(), 1, "a full fifo is kept");
        assert!(!read_all(&mut r).is_empty());
    }
}
