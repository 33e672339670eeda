//! The trunk's two background tasks: the flusher, which writes queued
//! frames the socket did not take at once, and the reader, which routes
//! incoming frames to their logical connections.

use std::{
    io,
    sync::{Arc, Weak},
};

use tokio::{
    io::{AsyncReadExt, BufReader},
    net::unix::OwnedReadHalf,
    sync::Notify,
};

use super::{HEADER_LEN, MAX_PAYLOAD, MuxError, READ_QUEUE_BYTES, READ_QUEUE_FRAMES, Shared, lock};

/// Drains `pending` whenever the fast path could not write everything.
pub(super) async fn flusher(shared: Weak<Shared>, flush_needed: Arc<Notify>) {
    loop {
        let notified = flush_needed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(s) = shared.upgrade() else { return };
        loop {
            let result = {
                let mut w = lock(&s.writer);
                if w.pos >= w.pending.len() {
                    break;
                }
                let Some(half) = w.half.as_ref() else { return };
                match half.try_write(&w.pending[w.pos..]) {
                    Ok(0) => Err(io::Error::from(io::ErrorKind::WriteZero)),
                    Ok(n) => {
                        w.pos += n;
                        if w.pos >= w.pending.len() {
                            w.pending = Vec::new();
                            w.pos = 0;
                            for waker in w.waiters.drain(..) {
                                waker.wake();
                            }
                        }
                        Ok(true)
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
                    Err(e) => Err(e),
                }
            };
            match result {
                Ok(true) => {}
                Ok(false) => {
                    // Wait for writability without holding the lock.
                    let half = lock(&s.writer).half.clone();
                    let Some(half) = half else { return };
                    if half.writable().await.is_err() {
                        s.close(Some(MuxError::Closed));
                        return;
                    }
                }
                Err(e) => {
                    s.close(Some(MuxError::Io(e)));
                    return;
                }
            }
        }
        drop(s);
        notified.await;
    }
}

/// Reads frames off the trunk and hands them to their logical connections.
pub(super) async fn reader(shared: Weak<Shared>, read_half: OwnedReadHalf) {
    let mut rd = BufReader::with_capacity(64 << 10, read_half);
    let mut header = [0u8; HEADER_LEN];
    let err = loop {
        if let Err(e) = rd.read_exact(&mut header).await {
            break eof_or(e);
        }
        let id = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(header[4..].try_into().expect("4 bytes"));
        if len as usize > MAX_PAYLOAD {
            break Some(MuxError::OversizedFrame {
                conn_id: id,
                len,
                max: MAX_PAYLOAD,
            });
        }
        let mut payload = vec![0u8; len as usize];
        if let Err(e) = rd.read_exact(&mut payload).await {
            break eof_or(e);
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let queue = lock(&shared.conns).get(&id).cloned();
        let Some(queue) = queue else {
            tracing::debug!(conn_id = id, len, "dropping frame for unopened mux connection");
            continue;
        };
        if payload.is_empty() {
            continue;
        }
        let mut q = lock(&queue.inner);
        if q.closed.is_some() {
            continue;
        }
        if q.frames.len() >= READ_QUEUE_FRAMES || q.bytes + payload.len() > READ_QUEUE_BYTES {
            drop(q);
            break Some(MuxError::QueueOverflow(id));
        }
        q.bytes += payload.len();
        q.frames.push_back(payload);
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    };
    if let Some(e) = &err {
        tracing::warn!(error = e as &dyn std::error::Error, "closing NRI mux trunk");
    }
    let Some(shared) = shared.upgrade() else {
        return;
    };
    // Detach ourselves so close() does not abort the task running it.
    lock(&shared.state).reader.take();
    shared.close(err);
}

pub(super) fn eof_or(e: io::Error) -> Option<MuxError> {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => None,
        _ => Some(MuxError::Io(e)),
    }
}
