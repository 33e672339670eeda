//! Output fifos outliving a process that exits before its reader opened
//! them.
//!
//! containerd's CRI can open an exec's output fifos for reading after
//! Task.Start returned, with an open that blocks until the fifo has a
//! writer (seen on containerd 2.1 under load: containerd held only an
//! `O_PATH` handle on the stdout fifo, no read fd, while the exec had
//! exited). A process that writes and exits before then (`sh -c "echo
//! out; exit 5"`) leaves a fifo with no writer: the reader's open waits
//! forever, the bytes are gone with the last fd, and ExecSync never
//! answers (containerd: "exits but the io is still held by other
//! processes"). runc's shim cannot hit this: its copier opens the fifo
//! write-only, which waits for the reader, and closes it after the copy.
//!
//! So the daemon keeps its own read-write handle on each output fifo
//! while the process runs ([`keeper`]), and at the exit hands it over
//! ([`hold_until_read`]): a write-only handle replaces it, which keeps the
//! fifo's buffered bytes and counts as a writer without counting as a
//! reader, and is closed once a reader has the fifo open (the reader
//! then reads what was buffered and end of file). A fifo whose reader
//! never comes is let go when the process is deleted.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
    time::Duration,
};

use rustix::{
    event::{PollFd, PollFlags, poll},
    fs::{FileType, OFlags, fstat},
};

/// A second handle on `fd` when it is a fifo (the first goes to the
/// process, or to a terminal's output copier); `None` for anything else
/// (a file, `/dev/null`).
pub(super) fn keeper(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    let st = fstat(fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Fifo {
        return None;
    }
    fd.try_clone_to_owned().ok()
}

/// Replaces a read-write handle on a fifo with a write-only one. The new
/// handle is opened while the old one still counts as a reader (a
/// non-blocking write-only open of a fifo fails with ENXIO without one),
/// and the fifo's buffer is never without an open fd.
fn write_only(rw: OwnedFd) -> io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", rw.as_raw_fd());
    let wo = rustix::fs::open(
        path.as_str(),
        OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    drop(rw);
    Ok(wo)
}

/// Whether the fifo behind write-only handle `fd` has a reader: Linux
/// reports POLLERR on a pipe's write side that has none.
fn has_reader(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::OUT)];
    match poll(&mut fds, Some(&rustix::event::Timespec::default())) {
        Ok(_) => !fds[0].revents().contains(PollFlags::ERR),
        // Cannot tell: do not hold the fifo on a guess.
        Err(_) => true,
    }
}

/// First and longest pause between checks for a reader.
const FIRST_CHECK: Duration = Duration::from_millis(1);
const LONGEST_CHECK: Duration = Duration::from_millis(100);

/// Hands the `keepers` of an exited process's fifos over (see the module
/// docs): returns once every fifo has a reader, or when `gone` resolves
/// (the process was deleted; its fifos are let go).
pub(super) async fn hold_until_read(keepers: Vec<OwnedFd>, gone: tokio::sync::oneshot::Receiver<()>) {
    let mut held: Vec<OwnedFd> = keepers
        .into_iter()
        .filter_map(|k| {
            write_only(k)
                .inspect_err(|e| tracing::debug!(error = %e, "output fifo handed over as it is"))
                .ok()
        })
        .collect();
    let mut pause = FIRST_CHECK;
    tokio::pin!(gone);
    loop {
        held.retain(|fd| !has_reader(fd));
        if held.is_empty() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = &mut gone => return,
        }
        pause = (pause * 2).min(LONGEST_CHECK);
    }
}
