//! The trunk's shared state: opening and closing logical connections,
//! routing frames to their queues, and writing frames (queued bytes first).

use std::{
    io::{self, IoSlice},
    sync::Arc,
    task::{Context, Poll, Waker},
};

use tokio::net::unix::OwnedWriteHalf;

use super::{ConnId, HEADER_LEN, MAX_PAYLOAD, MuxError, Shared, lock};

impl Drop for Shared {
    fn drop(&mut self) {
        // Last handle gone: stop the tasks; dropping the halves closes the socket.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for task in [st.reader.take(), st.flusher.take()].into_iter().flatten() {
            task.abort();
        }
    }
}

impl Shared {
    pub(super) fn close(&self, error: Option<MuxError>) {
        let (reader, flusher) = {
            let mut st = lock(&self.state);
            if st.closed.is_some() {
                return;
            }
            let error = error.map(Arc::new);
            st.closed = Some(error.clone());
            (st.reader.take(), st.flusher.take())
        };
        let conn_err = lock(&self.state).closed.clone().flatten().map(|e| e.to_io());
        for queue in lock(&self.conns).drain().map(|(_, q)| q) {
            let mut q = lock(&queue.inner);
            if q.closed.is_none() {
                q.closed = Some(conn_err.as_ref().map(|e| io::Error::new(e.kind(), e.to_string())));
            }
            if let Some(w) = q.waker.take() {
                w.wake();
            }
        }
        {
            let mut w = lock(&self.writer);
            // Dropping the write half shuts down our sending side: the peer
            // reads EOF even before the read half is gone.
            w.half = None;
            w.error.get_or_insert(io::ErrorKind::BrokenPipe);
            for waker in w.waiters.drain(..) {
                waker.wake();
            }
        }
        *lock(&self.read_half) = None;
        if let Some(task) = reader {
            task.abort();
        }
        if let Some(task) = flusher {
            task.abort();
        }
        self.closed_notify.notify_waiters();
    }

    /// Encodes one logical write as frames and sends or queues them.
    pub(super) fn write_frames(&self, cx: &mut Context<'_>, id: ConnId, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut w = lock(&self.writer);
        if let Some(kind) = w.error {
            return Poll::Ready(Err(io::Error::new(kind, "mux trunk closed")));
        }
        if w.pos < w.pending.len() {
            // Earlier frames are still queued; keep frame order and atomicity.
            register(&mut w.waiters, cx.waker());
            return Poll::Pending;
        }
        let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(buf.len() / MAX_PAYLOAD + 1);
        let chunks: Vec<&[u8]> = if buf.is_empty() {
            vec![&[][..]]
        } else {
            buf.chunks(MAX_PAYLOAD).collect()
        };
        for chunk in &chunks {
            headers.push(frame_header(id, chunk.len()));
        }
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(chunks.len() * 2);
        for (h, c) in headers.iter().zip(&chunks) {
            iov.push(IoSlice::new(h));
            if !c.is_empty() {
                iov.push(IoSlice::new(c));
            }
        }
        let total: usize = iov.iter().map(|s| s.len()).sum();
        let half = w.half.as_ref().expect("writer half present while no error");
        let mut written = 0usize;
        // Fast path: write straight to the socket; whatever it does not take
        // goes to `pending` for the flusher.
        loop {
            match write_vectored_from(half, &iov, written) {
                Ok(0) => {
                    drop(w);
                    self.close(Some(MuxError::Io(io::ErrorKind::WriteZero.into())));
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Ok(n) => {
                    written += n;
                    if written == total {
                        return Poll::Ready(Ok(buf.len()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    drop(w);
                    let kind = e.kind();
                    self.close(Some(MuxError::Io(e)));
                    return Poll::Ready(Err(io::Error::new(kind, "mux trunk write failed")));
                }
            }
        }
        let mut rest = Vec::with_capacity(total - written);
        let mut skip = written;
        for s in &iov {
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            rest.extend_from_slice(&s[skip..]);
            skip = 0;
        }
        w.pending = rest;
        w.pos = 0;
        drop(w);
        self.flush_needed.notify_one();
        Poll::Ready(Ok(buf.len()))
    }

    pub(super) fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut w = lock(&self.writer);
        if let Some(kind) = w.error {
            return Poll::Ready(Err(io::Error::new(kind, "mux trunk closed")));
        }
        if w.pos < w.pending.len() {
            register(&mut w.waiters, cx.waker());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

pub(super) fn register(waiters: &mut Vec<Waker>, waker: &Waker) {
    if !waiters.iter().any(|w| w.will_wake(waker)) {
        waiters.push(waker.clone());
    }
}

pub(super) fn frame_header(id: ConnId, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&id.to_be_bytes());
    h[4..].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

pub(super) fn write_vectored_from(half: &OwnedWriteHalf, iov: &[IoSlice<'_>], mut skip: usize) -> io::Result<usize> {
    let mut rest: Vec<IoSlice<'_>> = Vec::with_capacity(iov.len());
    for s in iov {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        rest.push(IoSlice::new(&s[skip..]));
        skip = 0;
    }
    half.try_write_vectored(&rest)
}
