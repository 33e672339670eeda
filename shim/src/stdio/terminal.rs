//! A terminal process's stdio: two copier threads between the pty master
//! (received over the console socket) and the fifos.

use std::{
    fs::File,
    io::{self, Read, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    error::{Result, ShimError},
    sync::lock,
};

/// A terminal's stdout fifo and the sender whose drop says the output is
/// drained.
pub(super) type TermOutput = (Arc<File>, tokio::sync::oneshot::Sender<()>);

/// A terminal's copier threads and the files they copy between. The
/// files live here, not in the threads, so an upgrade can stop the
/// threads at a clean point and hand the fds to the next image.
pub(super) struct Terminal {
    pub(super) master: Arc<File>,
    /// The stdin fifo, read-write (never end of file, never SIGPIPE for
    /// containerd's writer).
    pub(super) input: Option<Arc<File>>,
    /// The stdout fifo and the sender whose drop tells the exit publisher
    /// the output is drained; the output thread takes both when its copy
    /// ends (the slave side gone), which closes the fifo for its reader.
    pub(super) output: Arc<Mutex<Option<TermOutput>>>,
    /// While threads run: the stop pipe's write end (closing it stops
    /// them) and a receiver that disconnects when every thread ended.
    pub(super) running: Option<(OwnedFd, std::sync::mpsc::Receiver<()>)>,
}

impl Terminal {
    pub(super) fn start(&mut self) -> Result<()> {
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
                // The copy ended: the fifo closes and the drained signal
                // fires, in that order (the exit's handover of the fifo
                // must not see this thread's handle as a reader).
                drop(out);
                lock(&slot).take();
            });
        }
        self.running = Some((stop_w, ended_rx));
        Ok(())
    }

    pub(super) fn stop(&mut self, patience: Duration) -> bool {
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

pub(super) fn recv_fd(stream: &std::os::unix::net::UnixStream) -> Result<OwnedFd> {
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
