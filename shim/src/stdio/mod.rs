//! A process's stdio as containerd hands it over: fifo paths (`ctr`, CRI),
//! `file://` paths, or a terminal.
//!
//! Output fifos are given to the container directly (opened read-write so
//! opening never blocks and the container never gets SIGPIPE while the
//! client reconnects). Stdin goes through a pipe fed from the fifo by a
//! task on the daemon's runtime (no thread per container); it ends when the
//! fifo's last writer closes (the fifo is opened read-only, as by runc's
//! shim) or on CloseIO. With a terminal, libcontainer sends the pty master over a
//! console socket; two threads copy between it and the fifos
//! (`terminal`). May use only `error` and `sync`.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{
        fd::{AsFd, AsRawFd, OwnedFd, RawFd},
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod fifo;
mod stdin;
mod terminal;
#[cfg(test)]
mod tests;

use stdin::copy_stdin;
pub use stdin::{StdinPark, park_stdin, unpark_stdin};
use terminal::{Terminal, recv_fd};

use crate::{
    error::{Result, ShimError},
    sync::lock,
};

/// The stdio a client asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioSpec {
    /// Stdin path ("" = none).
    pub stdin: String,
    /// Stdout path ("" = none).
    pub stdout: String,
    /// Stderr path ("" = none).
    pub stderr: String,
    /// Allocate a terminal.
    pub terminal: bool,
}

fn dev_null(write: bool) -> Result<OwnedFd> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| ShimError::io("open /dev/null", e))
}

fn clear_nonblock(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK))?;
    Ok(())
}

fn path_of(uri: &str) -> Result<PathBuf> {
    if let Some(p) = uri.strip_prefix("file://") {
        return Ok(PathBuf::from(p));
    }
    if uri.starts_with("binary://") {
        return Err(ShimError::InvalidArgument(format!(
            "stdio {uri:?}: binary logging is not supported by nri-shim"
        )));
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(ShimError::InvalidArgument(format!(
            "stdio {uri:?}: unsupported scheme {scheme:?}"
        )));
    }
    Ok(PathBuf::from(uri))
}

/// Opens an output path for the container: a fifo read-write (never
/// blocks), anything else appended to (created if missing).
fn open_output(uri: &str) -> Result<OwnedFd> {
    if uri.is_empty() {
        return dev_null(true);
    }
    let path = path_of(uri)?;
    let is_fifo = std::fs::metadata(&path)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false);
    let file = if is_fifo {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
    } else {
        OpenOptions::new().append(true).create(true).open(&path)
    }
    .map_err(|e| ShimError::io(format!("open stdio {}", path.display()), e))?;
    let fd = OwnedFd::from(file);
    clear_nonblock(&fd).map_err(|e| ShimError::io("stdio flags", e))?;
    Ok(fd)
}

/// Opens a stdin path for a thread copier (terminal processes).
fn open_input(uri: &str) -> Result<File> {
    let path = path_of(uri)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true) // a fifo opened read-write never blocks nor reads EOF early
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| ShimError::io(format!("open stdin {}", path.display()), e))?;
    let fd = OwnedFd::from(file);
    clear_nonblock(&fd).map_err(|e| ShimError::io("stdin flags", e))?;
    Ok(File::from(fd))
}

/// Opens a stdin fifo for the async copier: read-only and non-blocking, as
/// containerd's runc shim opens it. Opening does not wait for a writer;
/// the copier sees nothing until one connects, and end of file once the
/// last writer closes (`printf x | ctr t exec ... cat` ends without waiting
/// for CloseIO).
fn open_input_async(uri: &str) -> Result<tokio::net::unix::pipe::Receiver> {
    let path = path_of(uri)?;
    tokio::net::unix::pipe::OpenOptions::new()
        .open_receiver(&path)
        .map_err(|e| ShimError::io(format!("open stdin {}", path.display()), e))
}

/// Stdio prepared for one process.
pub struct ProcessIo {
    /// stdin, stdout, stderr for the helper to hand to the process.
    pub container_fds: Option<[OwnedFd; 3]>,
    /// The console socket libcontainer sends the pty master to.
    pub console_socket: Option<PathBuf>,
    console_listener: Option<std::os::unix::net::UnixListener>,
    spec: StdioSpec,
    /// Write end of the stdin pipe of a terminal process (closed by CloseIO).
    stdin_writer: Arc<Mutex<Option<File>>>,
    /// Tells the stdin copy task to drop the pipe's write end (CloseIO, or
    /// the process is gone).
    stdin_close: Option<Arc<tokio::sync::Notify>>,
    /// Parks the stdin copier for an upgrade: (set true to park, true once
    /// parked).
    stdin_park: Option<StdinPark>,
    terminal: Option<Terminal>,
    /// Fires when the terminal's output copier has copied everything.
    output_done: Option<tokio::sync::oneshot::Receiver<()>>,
    /// The stdin copier's (fifo, pipe) fds while it runs: an upgrade hands
    /// them to the next image.
    stdin_fds: Arc<Mutex<Option<(RawFd, RawFd)>>>,
    /// The daemon's own handles on the output fifos given to the process,
    /// handed over at its exit (see `fifo`).
    keepers: Vec<OwnedFd>,
    /// Dropped with this: a handover still waiting for a reader lets go.
    keepers_gone: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What the next image of the daemon needs to carry on a process's stdio
/// (see `crate::node::upgrade`): fd numbers it inherits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoFds {
    /// The stdin fifo the copier reads.
    pub stdin_source: Option<RawFd>,
    /// The write end of the process's stdin pipe.
    pub stdin_sink: Option<RawFd>,
    /// A terminal's pty master.
    pub master: Option<RawFd>,
    /// A terminal's stdin fifo (open read-write) its input copier reads;
    /// absent in a handover from an image that reopened it.
    #[serde(default)]
    pub term_input: Option<RawFd>,
    /// A terminal's stdout fifo its output copier writes (absent once that
    /// copy ended); holding it across the exec means the fifo's reader
    /// never sees end of file in between.
    #[serde(default)]
    pub term_output: Option<RawFd>,
}

impl ProcessIo {
    /// The stdio of `spec` before anything is opened or inherited.
    fn unconnected(spec: &StdioSpec) -> ProcessIo {
        ProcessIo {
            container_fds: None,
            console_socket: None,
            console_listener: None,
            spec: spec.clone(),
            stdin_writer: Arc::new(Mutex::new(None)),
            stdin_close: None,
            stdin_park: None,
            terminal: None,
            output_done: None,
            stdin_fds: Arc::new(Mutex::new(None)),
            keepers: Vec::new(),
            keepers_gone: None,
        }
    }

    /// Opens what `spec` names. With a terminal, a console socket is bound
    /// at `console_path`.
    ///
    /// Must run inside a tokio runtime: stdin is copied by a task.
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] for unsupported URIs, I/O errors
    /// naming the path.
    pub fn prepare(spec: &StdioSpec, console_path: &Path) -> Result<ProcessIo> {
        let mut io = ProcessIo::unconnected(spec);
        if spec.terminal {
            let _ = std::fs::remove_file(console_path);
            let l = std::os::unix::net::UnixListener::bind(console_path)
                .map_err(|e| ShimError::io(format!("bind console socket {}", console_path.display()), e))?;
            io.console_listener = Some(l);
            io.console_socket = Some(console_path.to_path_buf());
            io.container_fds = Some([dev_null(false)?, dev_null(true)?, dev_null(true)?]);
            return Ok(io);
        }
        let stdin = if spec.stdin.is_empty() {
            dev_null(false)?
        } else {
            let source = open_input_async(&spec.stdin)?;
            // Close-on-exec: a copy of the write end in another process (a
            // plugin or helper spawned later, the next image after an
            // upgrade) would keep the container from ever reading end of
            // file. The helper moves the read end into place itself.
            let (r, w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ShimError::io("stdin pipe", e.into()))?;
            let sink = tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(|e| ShimError::io("stdin pipe", e))?;
            io.spawn_stdin_copier(source, sink);
            r
        };
        let (stdout, stderr) = (open_output(&spec.stdout)?, open_output(&spec.stderr)?);
        io.keepers = [&stdout, &stderr]
            .into_iter()
            .filter_map(|fd| fifo::keeper(fd.as_fd()))
            .collect();
        io.container_fds = Some([stdin, stdout, stderr]);
        Ok(io)
    }

    /// Takes the fds for the helper.
    pub fn take_fds(&mut self) -> Result<[OwnedFd; 3]> {
        self.container_fds
            .take()
            .ok_or_else(|| ShimError::Runtime("process stdio already handed over".into()))
    }

    /// After create/exec: receives the pty master (terminal only) and
    /// starts copying between it and the fifos.
    ///
    /// # Errors
    /// When libcontainer did not send a master.
    pub fn attach_console(&mut self) -> Result<()> {
        let Some(listener) = self.console_listener.take() else {
            return Ok(());
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| ShimError::io("console socket", e))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(ShimError::io("accept console socket", e)),
            }
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| ShimError::io("console socket", e))?;
        let master = File::from(recv_fd(&stream)?);
        if let Some(p) = self.console_socket.take() {
            let _ = std::fs::remove_file(p);
        }
        self.copy_terminal(master, None, None)
    }

    fn spawn_stdin_copier(&mut self, source: tokio::net::unix::pipe::Receiver, sink: tokio::net::unix::pipe::Sender) {
        let close = Arc::new(tokio::sync::Notify::new());
        self.stdin_close = Some(close.clone());
        let (park_tx, park_rx) = tokio::sync::watch::channel(false);
        let (parked_tx, parked_rx) = tokio::sync::watch::channel(false);
        self.stdin_park = Some((Arc::new(park_tx), parked_rx));
        *lock(&self.stdin_fds) = Some((source.as_raw_fd(), sink.as_raw_fd()));
        let park = (park_rx, parked_tx);
        tokio::spawn(copy_stdin(source, sink, close, park, self.stdin_fds.clone()));
    }

    /// The fds the daemon holds for this process's stdio (valid while it
    /// is alive; see [`IoFds`]).
    pub fn live_fds(&self) -> IoFds {
        let stdin = *lock(&self.stdin_fds);
        let term = self.terminal.as_ref();
        IoFds {
            stdin_source: stdin.map(|s| s.0),
            stdin_sink: stdin.map(|s| s.1),
            master: term.map(|t| t.master.as_raw_fd()),
            term_input: term.and_then(|t| t.input.as_ref()).map(|f| f.as_raw_fd()),
            term_output: term.and_then(|t| lock(&t.output).as_ref().map(|o| o.0.as_raw_fd())),
        }
    }

    /// Carries on the stdio of a process the previous image of the daemon
    /// started, from the fds it handed over ([`ProcessIo::live_fds`] there,
    /// now owned here): the stdin copier or the terminal's copiers again.
    /// A terminal's fifos are opened again when `term` lacks them (an image
    /// that did not hand them over).
    ///
    /// Must run inside a tokio runtime.
    ///
    /// # Errors
    /// When an fd is not what it should be, or the terminal's fifos do not
    /// open.
    pub fn resume(
        spec: &StdioSpec,
        stdin: Option<(OwnedFd, OwnedFd)>,
        master: Option<OwnedFd>,
        term: (Option<OwnedFd>, Option<OwnedFd>),
    ) -> Result<ProcessIo> {
        let mut io = ProcessIo::unconnected(spec);
        if let Some((source, sink)) = stdin {
            let source = tokio::net::unix::pipe::Receiver::from_owned_fd(source)
                .map_err(|e| ShimError::io("inherited stdin fifo", e))?;
            let sink = tokio::net::unix::pipe::Sender::from_owned_fd(sink)
                .map_err(|e| ShimError::io("inherited stdin pipe", e))?;
            io.spawn_stdin_copier(source, sink);
        }
        if let Some(m) = master {
            io.copy_terminal(File::from(m), term.0.map(File::from), term.1.map(File::from))?;
        }
        Ok(io)
    }

    /// Copies between a terminal's pty master and the process's fifos;
    /// `input` and `output` are the fifos already open (else opened here).
    fn copy_terminal(&mut self, master: File, input: Option<File>, output: Option<File>) -> Result<()> {
        let input = match input {
            Some(f) => Some(f),
            None if !self.spec.stdin.is_empty() => Some(open_input(&self.spec.stdin)?),
            None => None,
        };
        let output = match output {
            Some(f) => f,
            None => File::from(open_output(&self.spec.stdout)?),
        };
        // The copier closes its handle when the slave side is gone, which
        // can be before containerd opened the fifo for reading (an `exec
        // -t` that prints and exits): kept and handed over as a plain
        // process's output is.
        self.keepers.extend(fifo::keeper(output.as_fd()));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        self.output_done = Some(done_rx);
        let mut term = Terminal {
            master: Arc::new(master),
            input: input.map(Arc::new),
            output: Arc::new(Mutex::new(Some((Arc::new(output), done_tx)))),
            running: None,
        };
        term.start()?;
        self.terminal = Some(term);
        Ok(())
    }

    /// Stops a terminal's copier threads (an upgrade is about to exec), so
    /// none holds bytes read but not yet written; waits for them at most
    /// `patience`. What the process writes meanwhile waits in the pty.
    /// Returns false when a thread did not stop in time (blocked writing
    /// to a full fifo: its bytes are lost if the exec goes ahead).
    pub fn stop_terminal(&mut self, patience: Duration) -> bool {
        match self.terminal.as_mut() {
            Some(t) => t.stop(patience),
            None => true,
        }
    }

    /// Starts a terminal's copiers again after [`ProcessIo::stop_terminal`]
    /// (the upgrade did not happen).
    ///
    /// # Errors
    /// The stop pipe cannot be made.
    pub fn restart_terminal(&mut self) -> Result<()> {
        match self.terminal.as_mut() {
            Some(t) if t.running.is_none() => t.start(),
            _ => Ok(()),
        }
    }

    /// The handles that park this process's stdin copier (see
    /// [`park_stdin`]); none without a stdin pipe.
    pub fn stdin_park(&self) -> Option<StdinPark> {
        self.stdin_park.clone()
    }

    /// Closes the process's stdin (CloseIO).
    pub fn close_stdin(&self) {
        lock(&self.stdin_writer).take();
        if let Some(close) = &self.stdin_close {
            // A stored permit: the task sees it even if it is not waiting yet.
            close.notify_one();
        }
    }

    /// Resizes the terminal.
    ///
    /// # Errors
    /// [`ShimError::NotFound`] without a terminal, the ioctl error.
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        let master = self
            .terminal
            .as_ref()
            .map(|t| &t.master)
            .ok_or_else(|| ShimError::NotFound("process has no terminal".into()))?;
        let ws = rustix::termios::Winsize {
            ws_row: height.min(u16::MAX.into()) as u16,
            ws_col: width.min(u16::MAX.into()) as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(master.as_ref(), ws).map_err(|e| ShimError::io("resize terminal", e.into()))
    }

    /// After the process exited: what to await (bounded) so the exit event
    /// does not overtake the terminal's last output. Only the terminal's
    /// output copier ends on its own (EIO); other stdio needs no draining.
    pub fn output_drained(&mut self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.output_done.take()
    }

    /// After the process exited (and a terminal's output is drained, see
    /// [`ProcessIo::output_drained`]): lets go of the daemon's handles on
    /// its output fifos once their reader has them open, so a reader that
    /// comes after the exit still gets the output and end of file (see
    /// `fifo`). Must run inside a tokio runtime.
    pub fn hand_over_outputs(&mut self) {
        if self.keepers.is_empty() {
            return;
        }
        let (gone_tx, gone) = tokio::sync::oneshot::channel();
        self.keepers_gone = Some(gone_tx);
        tokio::spawn(fifo::hold_until_read(std::mem::take(&mut self.keepers), gone));
    }
}

impl Drop for ProcessIo {
    fn drop(&mut self) {
        // Ends the stdin copier, which would otherwise wait on the fifo
        // (that we hold open read-write) forever.
        self.close_stdin();
        if let Some(p) = self.console_socket.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
