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
    os::{
        fd::{AsRawFd, RawFd},
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::Mutex,
};

/// Name of containerd's log fifo in a bundle.
pub const LOG_FIFO: &str = "log";

/// The open `log` fifos, oldest first, keyed by `namespace/id`.
#[derive(Default)]
pub struct ShimLog {
    fifos: Mutex<Vec<(String, File)>>,
    /// The daemon's instance: once the log thread runs, fifos are attached
    /// and detached in the order of the lines around them (a task's last
    /// line reaches its fifo before the fifo is closed).
    queued: bool,
}

/// The daemon's instance, used by [`writer`].
pub static SHIM_LOG: ShimLog = ShimLog {
    fifos: Mutex::new(Vec::new()),
    queued: true,
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
        self.change(FifoChange::Attach(key.to_string(), file));
        true
    }

    /// Stops forwarding to the fifo of task `key` (closing it, which ends
    /// containerd's copy), after the lines logged before.
    pub fn detach(&self, key: &str) {
        self.change(FifoChange::Detach(key.to_string()));
    }

    /// The open fifos, oldest first: (task key, fd), once every change
    /// queued before is made. The fds stay valid while attached (an
    /// upgrade duplicates them for the next image).
    pub fn fds(&self) -> Vec<(String, std::os::fd::RawFd)> {
        use std::os::fd::AsRawFd as _;
        if self.queued {
            flush_log(std::time::Duration::from_secs(1));
        }
        self.lock().iter().map(|(k, f)| (k.clone(), f.as_raw_fd())).collect()
    }

    /// Forwards to a fifo the previous image of the daemon had open (see
    /// [`ShimLog::fds`]), as the newest: containerd's copy never saw the
    /// fifo's writer go.
    pub fn adopt(&self, key: &str, fd: std::os::fd::OwnedFd) {
        self.change(FifoChange::Attach(key.to_string(), File::from(fd)));
    }

    /// Makes `change` now, or for the daemon's instance once the log
    /// thread runs, in its turn among the lines.
    fn change(&self, change: FifoChange) {
        let change = match (self.queued, QUEUE.get()) {
            (true, Some(q)) => match q.send(Queued::Fifo(change)) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(Queued::Fifo(c))) => c,
                Err(_) => return,
            },
            _ => change,
        };
        self.apply(change);
    }

    fn apply(&self, change: FifoChange) {
        let mut fifos = self.lock();
        match change {
            FifoChange::Attach(key, file) => {
                fifos.retain(|(k, _)| *k != key);
                fifos.push((key, file));
            }
            FifoChange::Detach(key) => fifos.retain(|(k, _)| *k != key),
        }
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

/// Size-based rotation of `shim.log`, which is the daemon's stdout and
/// stderr (the `start` action opens it for the daemon, so panics and what
/// libraries print land there too): once `max` bytes were written, the
/// file is renamed to `shim.log.1` (replacing the previous one), a new one
/// is opened at the path and put in place of `fds` with `dup2`, so every
/// writer of the process follows. Helper processes started before keep
/// writing to the old file until they exit.
#[derive(Debug)]
pub struct Rotation {
    path: PathBuf,
    max: u64,
    written: u64,
    fds: Vec<RawFd>,
}

impl Rotation {
    /// Rotation of the file at `path`, open as each of `fds`, at `max`
    /// bytes (0: never); what the file already holds counts.
    pub fn new(path: &Path, max: u64, fds: Vec<RawFd>) -> Rotation {
        let written = std::fs::metadata(path).map_or(0, |m| m.len());
        Rotation {
            path: path.to_path_buf(),
            max,
            written,
            fds,
        }
    }

    /// Counts `n` more bytes written; rotates when the size is reached.
    ///
    /// # Errors
    /// The rename, open or `dup2` that failed; the count restarts, so the
    /// next attempt comes `max` bytes later rather than at every line.
    pub fn wrote(&mut self, n: usize) -> io::Result<bool> {
        self.written = self.written.saturating_add(n as u64);
        if self.max == 0 || self.written < self.max {
            return Ok(false);
        }
        self.written = 0;
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        let new = crate::private::append(&self.path)?;
        for fd in &self.fds {
            // SAFETY: both fds are open; dup2 atomically replaces `fd`,
            // which stays owned by whoever owned it (stdout, stderr).
            if unsafe { libc::dup2(new.as_raw_fd(), *fd) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(true)
    }

    /// A new size limit (a config reload); 0 stops rotating.
    pub fn set_max(&mut self, max: u64) {
        self.max = max;
    }
}

/// The daemon's `shim.log` rotation, when its stderr is that file.
static ROTATION: Mutex<Option<Rotation>> = Mutex::new(None);

/// Rotates the daemon's stdout and stderr at `max` bytes when stderr is
/// the file at `path` (the daemon `start` spawned); anything else (a
/// daemon run by hand, a test) is left alone.
pub fn rotate_stderr(path: &Path, max: u64) {
    let mut r = crate::sync::lock(&ROTATION);
    let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    };
    let stderr = std::fs::metadata("/proc/self/fd/2");
    if let (Ok(e), Ok(f)) = (stderr, std::fs::metadata(path)) {
        if same(&e, &f) {
            *r = Some(Rotation::new(path, max, vec![libc::STDOUT_FILENO, libc::STDERR_FILENO]));
        }
    }
}

/// A new size for [`rotate_stderr`]'s rotation (a config reload), if it
/// rotates.
pub fn set_log_max_size(max: u64) {
    if let Some(r) = crate::sync::lock(&ROTATION).as_mut() {
        r.set_max(max);
    }
}

/// A `tracing_subscriber` writer: each formatted event goes to stderr (the
/// daemon's `shim.log`) and to containerd through [`SHIM_LOG`]; once
/// [`start_log_thread`] ran, by way of that thread.
pub fn writer() -> QueuedWriter {
    QueuedWriter
}

/// How many log lines may wait for the log thread; more are dropped (and
/// counted in a line of their own) rather than block the daemon.
const QUEUE_LINES: usize = 16 * 1024;

/// A change of the fifos lines are forwarded to.
enum FifoChange {
    Attach(String, File),
    Detach(String),
}

enum Queued {
    Line(Vec<u8>),
    Fifo(FifoChange),
    /// Everything queued before it has been written: acknowledge.
    Flush(std::sync::mpsc::Sender<()>),
}

/// The log thread's queue, once started. Unbounded: lines are counted in
/// [`QUEUED`] and dropped beyond [`QUEUE_LINES`]; fifo changes and flushes
/// are never dropped.
static QUEUE: std::sync::OnceLock<std::sync::mpsc::Sender<Queued>> = std::sync::OnceLock::new();
/// Lines in the queue.
static QUEUED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Lines dropped because the queue was full, not yet reported.
static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Starts the thread that writes the daemon's log lines: a write to
/// `shim.log` can block (dirty-page writeback throttling on a busy node,
/// a rotation's rename), and the runtime thread that serves every pod
/// must not wait for it. Lines keep their order; when the queue is full
/// (the disk far behind) lines are dropped and counted. Idempotent.
///
/// # Errors
/// When the thread cannot be started (lines are then written directly).
pub fn start_log_thread() -> io::Result<()> {
    if QUEUE.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = std::sync::mpsc::channel::<Queued>();
    std::thread::Builder::new().name("nri-shim-log".into()).spawn(move || {
        let mut out = LogWriter { log: &SHIM_LOG };
        for msg in rx {
            match msg {
                Queued::Line(line) => {
                    QUEUED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    let dropped = DROPPED.swap(0, std::sync::atomic::Ordering::Relaxed);
                    if dropped > 0 {
                        let note = format!(
                            "{} WARN nri-shim: {dropped} log lines dropped: the log could not keep up\n",
                            humantime::format_rfc3339_micros(std::time::SystemTime::now())
                        );
                        let _ = out.write(note.as_bytes());
                    }
                    let _ = out.write(&line);
                }
                Queued::Fifo(change) => SHIM_LOG.apply(change),
                Queued::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    })?;
    let _ = QUEUE.set(tx);
    Ok(())
}

/// Waits (at most `patience`) until every line logged so far is written:
/// before the daemon replaces its image (an upgrade) or exits.
pub fn flush_log(patience: std::time::Duration) {
    if let Some(q) = QUEUE.get() {
        let (tx, rx) = std::sync::mpsc::channel();
        if q.send(Queued::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(patience);
        }
    }
}

/// Writer returned by [`writer`]: to the log thread's queue once started,
/// else straight through (`start`, `delete`, tests).
pub struct QueuedWriter;

impl Write for QueuedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        match QUEUE.get() {
            Some(_) if QUEUED.load(Relaxed) >= QUEUE_LINES => {
                DROPPED.fetch_add(1, Relaxed);
            }
            Some(q) => {
                QUEUED.fetch_add(1, Relaxed);
                if q.send(Queued::Line(buf.to_vec())).is_err() {
                    QUEUED.fetch_sub(1, Relaxed);
                    LogWriter { log: &SHIM_LOG }.write_all(buf)?;
                }
            }
            None => LogWriter { log: &SHIM_LOG }.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes one whole event (the fmt layer writes one per `write` call) to
/// stderr and containerd's log; what the log thread runs.
pub struct LogWriter<'a> {
    log: &'a ShimLog,
}

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        if let Some(r) = crate::sync::lock(&ROTATION).as_mut() {
            if let Err(e) = r.wrote(buf.len()) {
                // Not through tracing: this is the log's own writer.
                let _ = writeln!(io::stderr(), "cannot rotate {}: {e}", r.path.display());
            }
        }
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

    #[test]
    fn the_log_rotates_at_its_size_and_writers_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim.log");
        std::fs::write(&path, "old line\n").unwrap();
        // A descriptor standing for stderr: opened once, written by number.
        let mut log = OpenOptions::new().append(true).open(&path).unwrap();
        let mut r = Rotation::new(&path, 32, vec![log.as_raw_fd()]);
        log.write_all(b"0123456789\n").unwrap();
        assert!(!r.wrote(11).unwrap(), "20 of 32 bytes");
        log.write_all(b"0123456789ab\n").unwrap();
        assert!(r.wrote(13).unwrap(), "33 of 32 bytes");
        log.write_all(b"after\n").unwrap();
        let rotated = std::fs::read_to_string(dir.path().join("shim.log.1")).unwrap();
        assert_eq!(rotated, "old line\n0123456789\n0123456789ab\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        // The count restarted: a second rotation replaces shim.log.1.
        assert!(!r.wrote(6).unwrap());
        log.write_all(&[b'x'; 30]).unwrap();
        assert!(r.wrote(30).unwrap());
        assert!(
            std::fs::read_to_string(dir.path().join("shim.log.1"))
                .unwrap()
                .starts_with("after\n")
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        // 0 never rotates.
        r.set_max(0);
        assert!(!r.wrote(1 << 30).unwrap());
    }

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

    /// The log thread writes every queued line, in order, and a flush
    /// returns once they are written.
    #[test]
    fn queued_lines_are_written_in_order_by_the_log_thread() {
        let dir = tempfile::tempdir().unwrap();
        let mut reader = fifo_with_reader(dir.path());
        assert!(SHIM_LOG.attach("test/queued", dir.path()));
        start_log_thread().unwrap();
        start_log_thread().unwrap();
        let mut w = writer();
        let lines: Vec<String> = (0..200).map(|i| format!("line {i}\n")).collect();
        for l in &lines {
            w.write_all(l.as_bytes()).unwrap();
        }
        flush_log(std::time::Duration::from_secs(10));
        let got = read_all(&mut reader);
        SHIM_LOG.detach("test/queued");
        assert_eq!(got, lines.concat());
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
