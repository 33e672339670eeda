//! Stdin through the daemon: the async copier from the stdin fifo into the
//! process's pipe, and its parking for an in-place upgrade.

use std::{
    io,
    os::fd::RawFd,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::sync::lock;

/// Copies the stdin fifo into the process's stdin pipe until CloseIO, the
/// process closing its end (EPIPE), or the ProcessIo being dropped. The
/// buffer is allocated on the first input, so idle containers cost none.
pub(super) async fn copy_stdin(
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
