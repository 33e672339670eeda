//! A process's stdio as containerd hands it over: fifo paths (`ctr`, CRI),
//! `file://` paths, or a terminal.
//!
//! Output fifos are given to the container directly (opened read-write so
//! opening never blocks and the container never gets SIGPIPE while the
//! client reconnects). Stdin goes through a pipe fed from the fifo by a
//! task on the daemon's runtime (no thread per container); it ends when the
//! fifo's last writer closes (the fifo is opened read-only, as by runc's
//! shim) or on CloseIO. With a terminal, libcontainer sends the pty master over a
//! console socket; two threads copy between it and the fifos.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

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
}

/// What the next image of the daemon needs to carry on a process's stdio
/// (see `crate::upgrade`): fd numbers it inherits.
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
        io.container_fds = Some([stdin, open_output(&spec.stdout)?, open_output(&spec.stderr)?]);
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

/// Copies the stdin fifo into the process's stdin pipe until CloseIO, the
/// process closing its end (EPIPE), or the ProcessIo being dropped. The
/// buffer is allocated on the first input, so idle containers cost none.
async fn copy_stdin(
    source: tokio::net::unix::pipe::Receiver,
    mut sink: tokio::net::unix::pipe::Sender,
    close: Arc<tokio::sync::Notify>,
    mut park: (tokio::sync::watch::Receiver<bool>, tokio::sync::watch::Sender<bool>),
    fds: Arc<Mutex<Option<(RawFd, RawFd)>>>,
) {
    copy_stdin_until_end(&source, &mut sink, &close, &mut park).await;
    // Before the fds close: their numbers may be reused at once.
    lock(&fds).take();
}

async fn copy_stdin_until_end(
    source: &tokio::net::unix::pipe::Receiver,
    sink: &mut tokio::net::unix::pipe::Sender,
    close: &tokio::sync::Notify,
    (park, parked): &mut (tokio::sync::watch::Receiver<bool>, tokio::sync::watch::Sender<bool>),
) {
    use tokio::io::AsyncWriteExt;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if *park.borrow_and_update() {
            // Parked between a write and the next read: no byte is held
            // here when the upgrade's exec ends this task.
            parked.send_replace(true);
            tokio::select! {
                _ = close.notified() => return,
                r = park.wait_for(|p| !*p) => if r.is_err() { return },
            }
            parked.send_replace(false);
            continue;
        }
        tokio::select! {
            _ = close.notified() => return,
            r = park.changed() => if r.is_err() { return } else { continue },
            r = source.readable() => if r.is_err() { return },
        }
        if buf.is_empty() {
            buf = vec![0u8; 16 << 10];
        }
        let n = match source.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        tokio::select! {
            _ = close.notified() => return,
            r = sink.write_all(&buf[..n]) => if r.is_err() { return },
        }
    }
}

/// A stdin copier's parking handles: the flag that parks it, and the flag
/// it sets once parked.
pub type StdinPark = (
    Arc<tokio::sync::watch::Sender<bool>>,
    tokio::sync::watch::Receiver<bool>,
);

/// Parks the stdin copiers of `parks` (an upgrade is about to exec): each
/// finishes the write it is in and reads nothing more; the fifo holds what
/// the client writes meanwhile. Waits at most `patience` in all; returns
/// how many did not park in time (blocked writing to a full pipe: their
/// bytes are lost if the exec goes ahead). A copier that ended counts as
/// parked.
pub async fn park_stdin(parks: &mut [StdinPark], patience: Duration) -> usize {
    for (park, _) in parks.iter() {
        park.send_replace(true);
    }
    let deadline = tokio::time::Instant::now() + patience;
    let mut late = 0;
    for (_, parked) in parks.iter_mut() {
        // An error: the copier is gone, which is as good as parked.
        if tokio::time::timeout_at(deadline, parked.wait_for(|p| *p))
            .await
            .is_err()
        {
            late += 1;
        }
    }
    late
}

/// Lets parked stdin copiers go on (the upgrade did not happen).
pub fn unpark_stdin(parks: &[StdinPark]) {
    for (park, _) in parks {
        park.send_replace(false);
    }
}

/// A terminal's stdout fifo and the sender whose drop says the output is
/// drained.
type TermOutput = (Arc<File>, tokio::sync::oneshot::Sender<()>);

/// A terminal's copier threads and the files they copy between. The
/// files live here, not in the threads, so an upgrade can stop the
/// threads at a clean point and hand the fds to the next image.
struct Terminal {
    master: Arc<File>,
    /// The stdin fifo, read-write (never end of file, never SIGPIPE for
    /// containerd's writer).
    input: Option<Arc<File>>,
    /// The stdout fifo and the sender whose drop tells the exit publisher
    /// the output is drained; the output thread takes both when its copy
    /// ends (the slave side gone), which closes the fifo for its reader.
    output: Arc<Mutex<Option<TermOutput>>>,
    /// While threads run: the stop pipe's write end (closing it stops
    /// them) and a receiver that disconnects when every thread ended.
    running: Option<(OwnedFd, std::sync::mpsc::Receiver<()>)>,
}

impl Terminal {
    fn start(&mut self) -> Result<()> {
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| ShimError::io("terminal copier stop pipe", e.into()))?;
        let stop_r = Arc::new(stop_r);
        let (ended_tx, ended_rx) = std::sync::mpsc::channel::<()>();
        if let Some(input) = self.input.clone() {
            let (m, stop, ended) = (self.master.clone(), stop_r.clone(), ended_tx.clone());
            std::thread::spawn(move || {
                let _ended = ended;
                let mut buf = [0u8; 32 << 10];
                while readable_or_stopped(&input, &stop) {
                    match (&*input).read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if (&*m).write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
        let out = lock(&self.output).as_ref().map(|o| o.0.clone());
        if let Some(out) = out {
            let (m, stop, slot) = (self.master.clone(), stop_r, self.output.clone());
            std::thread::spawn(move || {
                let _ended = ended_tx;
                let mut buf = [0u8; 32 << 10];
                loop {
                    if !readable_or_stopped(&m, &stop) {
                        return; // stopped: the fifo and the drained signal stay
                    }
                    match (&*m).read(&mut buf) {
                        // EIO: the slave side is gone (the process exited).
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if (&*out).write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                // The copy ended: the fifo closes (with `out`) and the
                // drained signal fires.
                lock(&slot).take();
            });
        }
        self.running = Some((stop_w, ended_rx));
        Ok(())
    }

    fn stop(&mut self, patience: Duration) -> bool {
        let Some((stop_w, ended)) = self.running.take() else {
            return true;
        };
        drop(stop_w);
        !matches!(
            ended.recv_timeout(patience),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // The threads end (their files close when they are gone).
        self.running.take();
    }
}

/// Waits until `fd` can be read (or has hung up: the read says which);
/// false once `stop`'s write end is closed, which wins when both are ready.
fn readable_or_stopped(fd: &File, stop: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [PollFd::new(stop, PollFlags::IN), PollFd::new(fd, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) if !fds[0].revents().is_empty() => return false,
            Ok(_) if !fds[1].revents().is_empty() => return true,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

fn recv_fd(stream: &std::os::unix::net::UnixStream) -> Result<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut data = [0u8; 4096];
    let mut iov = [io::IoSliceMut::new(&mut data)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| ShimError::io("receive pty master", e.into()))?;
    for c in msg.cmsgs().map_err(|e| ShimError::io("receive pty master", e.into()))? {
        if let ControlMessageOwned::ScmRights(fds) = c
            && let Some(fd) = fds.first()
        {
            // SAFETY: SCM_RIGHTS delivered a new fd to this process.
            return Ok(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
    }
    Err(ShimError::Runtime("console socket: no pty master received".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(path_of("/a/b").unwrap(), PathBuf::from("/a/b"));
        assert_eq!(path_of("file:///a/b").unwrap(), PathBuf::from("/a/b"));
        assert!(matches!(path_of("binary:///x"), Err(ShimError::InvalidArgument(_))));
        assert!(matches!(path_of("tcp://x"), Err(ShimError::InvalidArgument(_))));
    }

    #[tokio::test]
    async fn fifo_output_and_piped_stdin() {
        let d = tempfile::tempdir().unwrap();
        let (o, i) = (d.path().join("out"), d.path().join("in"));
        nix::unistd::mkfifo(&o, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let spec = StdioSpec {
            stdin: i.to_string_lossy().into(),
            stdout: o.to_string_lossy().into(),
            stderr: String::new(),
            terminal: false,
        };
        let mut io = ProcessIo::prepare(&spec, &d.path().join("console.sock")).unwrap();
        let [stdin, stdout, _stderr] = io.take_fds().unwrap();
        // Every fd the daemon keeps is close-on-exec: a copy in a process
        // it spawns (or in the next image) would keep the pipe open.
        let live = io.live_fds();
        for fd in [stdin.as_raw_fd(), live.stdin_source.unwrap(), live.stdin_sink.unwrap()] {
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(flags & libc::FD_CLOEXEC, 0, "fd {fd} is inherited by children");
        }
        // Something written into the stdin fifo reaches the container's stdin.
        let mut client_in = OpenOptions::new().write(true).open(&i).unwrap();
        client_in.write_all(b"hello").unwrap();
        let mut stdin = File::from(stdin);
        let got = tokio::task::spawn_blocking(move || {
            let mut got = [0u8; 5];
            stdin.read_exact(&mut got).unwrap();
            (got, stdin)
        });
        let (got, mut stdin) = got.await.unwrap();
        assert_eq!(&got, b"hello");
        // The container's stdout reaches the fifo's reader.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&o)
            .unwrap();
        File::from(stdout).write_all(b"out").unwrap();
        let mut got = [0u8; 3];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"out");
        // CloseIO: the container's stdin reads EOF.
        io.close_stdin();
        let rest = tokio::task::spawn_blocking(move || {
            let mut rest = Vec::new();
            stdin.read_to_end(&mut rest).map(|_| rest)
        });
        assert_eq!(rest.await.unwrap().unwrap(), b"");
    }

    /// A process's stdio with only a stdin fifo, prepared: (its temp dir,
    /// the fifo, the ProcessIo, the process's end of the stdin pipe).
    fn stdin_fifo_io() -> (tempfile::TempDir, PathBuf, ProcessIo, OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        let i = d.path().join("in");
        nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let spec = StdioSpec {
            stdin: i.to_string_lossy().into(),
            ..Default::default()
        };
        let mut io = ProcessIo::prepare(&spec, &d.path().join("console.sock")).unwrap();
        let [stdin, _, _] = io.take_fds().unwrap();
        (d, i, io, stdin)
    }

    /// A writer that closes the stdin fifo gives the process end of file,
    /// without CloseIO; one that connects only later still gets through.
    #[tokio::test]
    async fn the_last_writer_closing_stdin_is_end_of_file() {
        let (_d, i, io, stdin) = stdin_fifo_io();
        let reader = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            File::from(stdin).read_to_end(&mut all).map(|_| all)
        });
        // No writer yet: not an end of file.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reader.is_finished());
        let path = i.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all(b"hello").unwrap();
        })
        .await
        .unwrap();
        let all = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("end of file once the writer closed")
            .unwrap()
            .unwrap();
        assert_eq!(all, b"hello");
        drop(io);
    }

    #[tokio::test]
    async fn dropping_process_io_ends_the_stdin_copier() {
        let (_d, _i, io, stdin) = stdin_fifo_io();
        drop(io);
        // The copier dropped the pipe's write end: the reader sees EOF
        // instead of blocking forever.
        let rest = tokio::task::spawn_blocking(move || {
            let mut rest = Vec::new();
            File::from(stdin).read_to_end(&mut rest).map(|_| rest)
        });
        assert_eq!(rest.await.unwrap().unwrap(), b"");
    }

    /// An upgrade parks the stdin copier between a write and the next
    /// read: input written meanwhile stays in the fifo (no byte is held by
    /// the task the exec ends), and unparked, the copy goes on.
    #[tokio::test]
    async fn a_parked_stdin_copier_leaves_input_in_the_fifo() {
        let (_d, i, io, stdin) = stdin_fifo_io();
        let stdin = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin).unwrap();
        let mut client = OpenOptions::new().write(true).open(&i).unwrap();
        let read_some = |n: usize| {
            let stdin = &stdin;
            async move {
                let mut got = vec![0u8; n];
                let mut at = 0;
                while at < n {
                    stdin.readable().await.unwrap();
                    match stdin.try_read(&mut got[at..]) {
                        Ok(k) => at += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                got
            }
        };
        client.write_all(b"one").unwrap();
        assert_eq!(read_some(3).await, b"one");
        let mut parks: Vec<StdinPark> = io.stdin_park().into_iter().collect();
        assert_eq!(
            park_stdin(&mut parks, Duration::from_secs(1)).await,
            0,
            "parked at once"
        );
        client.write_all(b"two").unwrap();
        let early = tokio::time::timeout(Duration::from_millis(200), read_some(1)).await;
        assert!(early.is_err(), "copied while parked: {early:?}");
        unpark_stdin(&parks);
        assert_eq!(read_some(3).await, b"two");
    }

    /// A pty pair: (master, slave), both close-on-exec.
    fn pty() -> (File, File) {
        // SAFETY: plain libc calls on an fd this function owns.
        unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(m >= 0, "posix_openpt");
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            let mut name = [0 as libc::c_char; 64];
            assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
            let path = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string();
            let slave = OpenOptions::new().read(true).write(true).open(path).unwrap();
            (File::from_raw_fd(m), slave)
        }
    }

    fn wait_for(path: &Path, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = std::fs::read_to_string(path).unwrap_or_default();
            if got.contains(want) || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// An upgrade stops a terminal's copiers between reads: what the
    /// process writes meanwhile stays in the pty (nothing is held by a
    /// thread that the exec would end), and the copy picks it up again.
    #[tokio::test]
    async fn a_stopped_terminal_copier_leaves_output_in_the_pty() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let spec = StdioSpec {
            stdout: out.display().to_string(),
            terminal: true,
            ..Default::default()
        };
        let (master, mut slave) = pty();
        let mut io = ProcessIo::unconnected(&spec);
        io.copy_terminal(master, None, None).unwrap();
        slave.write_all(b"one\n").unwrap();
        assert!(wait_for(&out, "one").contains("one"));
        assert!(io.stop_terminal(Duration::from_secs(1)), "the copier stops at once");
        assert!(
            io.live_fds().term_output.is_some(),
            "the stdout fifo stays open to be handed over"
        );
        slave.write_all(b"two\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !std::fs::read_to_string(&out).unwrap().contains("two"),
            "copied while stopped"
        );
        io.restart_terminal().unwrap();
        assert!(wait_for(&out, "two").contains("two"), "the output after a restart");
        // The slave gone: the copy ends and says the output is drained.
        let drained = io.output_drained().unwrap();
        drop(slave);
        tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .unwrap()
            .ok();
        assert_eq!(io.live_fds().term_output, None, "the copy ended: the fifo is closed");
    }
}
