//! One logical connection: `AsyncRead`/`AsyncWrite` over its frames.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{ConnId, Mux, MuxConn, lock};

impl MuxConn {
    /// The logical connection id.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// A handle to the trunk this connection belongs to.
    pub fn mux(&self) -> Mux {
        Mux {
            shared: self.shared.clone(),
        }
    }

    fn detach(&mut self) {
        let mut conns = lock(&self.shared.conns);
        if conns.get(&self.id).is_some_and(|q| Arc::ptr_eq(q, &self.queue)) {
            conns.remove(&self.id);
        }
        drop(conns);
        let mut q = lock(&self.queue.inner);
        q.closed.get_or_insert(None);
        q.frames.clear();
        q.bytes = 0;
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    }
}

impl Drop for MuxConn {
    fn drop(&mut self) {
        self.detach();
    }
}

impl AsyncRead for MuxConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut q = lock(&self.queue.inner);
        let mut progressed = false;
        while buf.remaining() > 0 {
            let offset = q.offset;
            let Some(front) = q.frames.front() else { break };
            let n = (front.len() - offset).min(buf.remaining());
            buf.put_slice(&front[offset..offset + n]);
            let whole = offset + n == front.len();
            progressed = true;
            q.bytes -= n;
            if whole {
                q.frames.pop_front();
                q.offset = 0;
            } else {
                q.offset += n;
            }
        }
        if progressed {
            return Poll::Ready(Ok(()));
        }
        match &q.closed {
            Some(None) => Poll::Ready(Ok(())),
            Some(Some(e)) => Poll::Ready(Err(io::Error::new(e.kind(), e.to_string()))),
            None => {
                q.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.shut_down {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "mux connection shut down",
            )));
        }
        self.shared.write_frames(cx, self.id, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // One frame per call; use the first non-empty slice like the default impl.
        let buf = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &**b);
        self.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shared.poll_flushed(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = self.shared.poll_flushed(cx);
        if flushed.is_pending() {
            return Poll::Pending;
        }
        self.shut_down = true;
        self.detach();
        Poll::Ready(Ok(()))
    }
}
