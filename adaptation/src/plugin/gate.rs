//! Backpressure on the Runtime service a plugin calls (RegisterPlugin,
//! UpdateContainers): a plugin has at most [`REQUESTS_IN_FLIGHT`] requests
//! being handled at once; its next request is not read until one of them
//! is answered.
//!
//! ttrpc-rust's server reads a request, spawns a task for it and reads the
//! next one at once, so a plugin that writes requests faster than the
//! runtime answers them (or never reads the answers, which then cannot be
//! written) grows the runtime's memory by one task and one request per
//! message, without limit. [`Gated`] sits between the ttrpc server and its
//! logical connection and tracks ttrpc message boundaries in both
//! directions (10-byte header: payload length u32 BE, stream id u32 BE,
//! type u8, flags u8): every request header read counts one in flight,
//! every response header written one less. While the count is at the
//! limit, reads return `Pending`, so further requests stay in the mux's
//! bounded read queue ([`nri_proto::mux::READ_QUEUE_FRAMES`] frames,
//! [`nri_proto::mux::READ_QUEUE_BYTES`] bytes); a plugin that overflows
//! it has its connection closed.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_TYPE_REQUEST, MESSAGE_TYPE_RESPONSE};

/// Requests of one plugin the runtime handles at once; more wait unread.
pub(crate) const REQUESTS_IN_FLIGHT: usize = 4;

/// Where a byte stream is within its ttrpc messages.
#[derive(Default)]
struct Cursor {
    header: [u8; MESSAGE_HEADER_LENGTH],
    /// Header bytes seen of the current message.
    have: usize,
    /// Payload bytes still to come of the current message.
    body_left: usize,
}

impl Cursor {
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.body_left == 0
    }

    /// Bytes up to the end of the current header or payload.
    fn span(&self) -> usize {
        if self.body_left > 0 {
            self.body_left
        } else {
            MESSAGE_HEADER_LENGTH - self.have
        }
    }

    /// Walks `bytes`; calls `on_header(type)` for every complete header.
    fn advance(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(u8)) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (MESSAGE_HEADER_LENGTH - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == MESSAGE_HEADER_LENGTH {
                self.have = 0;
                self.body_left = u32::from_be_bytes(self.header[..4].try_into().expect("4 bytes")) as usize;
                on_header(self.header[8]);
            }
        }
    }
}

/// A ttrpc server's connection with at most `limit` requests in flight.
pub(crate) struct Gated<S> {
    inner: S,
    limit: usize,
    in_flight: usize,
    read: Cursor,
    written: Cursor,
    /// The reader, waiting for an answer to open the gate.
    waiting: Option<Waker>,
    /// Writing failed: the connection is going away, stop holding reads.
    broken: bool,
}

impl<S> Gated<S> {
    pub(crate) fn new(inner: S, limit: usize) -> Self {
        Gated {
            inner,
            limit: limit.max(1),
            in_flight: 0,
            read: Cursor::default(),
            written: Cursor::default(),
            waiting: None,
            broken: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.at_boundary() && this.in_flight >= this.limit && !this.broken {
            this.waiting = Some(cx.waker().clone());
            return Poll::Pending;
        }
        // Never past the current header or payload, so the gate is
        // checked before every message.
        let want = this.read.span().min(buf.remaining());
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(want));
        let polled = Pin::new(&mut this.inner).poll_read(cx, &mut part);
        let n = part.filled().len();
        if let Poll::Ready(Ok(())) = &polled {
            let (in_flight, bytes) = (&mut this.in_flight, part.filled());
            this.read.advance(bytes, |kind| {
                if kind == MESSAGE_TYPE_REQUEST {
                    *in_flight += 1;
                }
            });
            buf.advance(n);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        match &polled {
            Poll::Ready(Ok(n)) => {
                let before = this.in_flight;
                let in_flight = &mut this.in_flight;
                this.written.advance(&buf[..*n], |kind| {
                    if kind == MESSAGE_TYPE_RESPONSE {
                        *in_flight = in_flight.saturating_sub(1);
                    }
                });
                if this.in_flight < before {
                    if let Some(w) = this.waiting.take() {
                        w.wake();
                    }
                }
            }
            Poll::Ready(Err(_)) => {
                this.broken = true;
                if let Some(w) = this.waiting.take() {
                    w.wake();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.broken = true;
        if let Some(w) = self.waiting.take() {
            w.wake();
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn message(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = (payload.len() as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&stream.to_be_bytes());
        m.extend_from_slice(&[kind, 0]);
        m.extend_from_slice(payload);
        m
    }

    /// Reads one whole message through the gate, if it lets one through
    /// within a short wait.
    async fn read_message<S: AsyncRead + Unpin>(g: &mut Gated<S>) -> Option<Vec<u8>> {
        let read = async {
            let mut header = [0u8; MESSAGE_HEADER_LENGTH];
            g.read_exact(&mut header).await.unwrap();
            let len = u32::from_be_bytes(header[..4].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len];
            g.read_exact(&mut body).await.unwrap();
            body
        };
        tokio::time::timeout(std::time::Duration::from_millis(200), read)
            .await
            .ok()
    }

    /// Requests beyond the limit are not read until a response is written;
    /// each response lets exactly one more through, also when the peer
    /// packs several requests into one write.
    #[tokio::test(flavor = "current_thread")]
    async fn holds_requests_beyond_the_limit_until_one_is_answered() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut g = Gated::new(ours, 2);
        let mut burst = Vec::new();
        for i in 0..5u32 {
            burst.extend(message(MESSAGE_TYPE_REQUEST, 2 * i + 1, format!("req{i}").as_bytes()));
        }
        theirs.write_all(&burst).await.unwrap();
        assert_eq!(read_message(&mut g).await.as_deref(), Some(&b"req0"[..]));
        assert_eq!(read_message(&mut g).await.as_deref(), Some(&b"req1"[..]));
        assert_eq!(read_message(&mut g).await, None, "a third request read past the limit");
        // A response written in two parts counts once its header is out.
        let rsp = message(MESSAGE_TYPE_RESPONSE, 1, b"ok");
        g.write_all(&rsp[..4]).await.unwrap();
        assert_eq!(read_message(&mut g).await, None, "half a header opened the gate");
        g.write_all(&rsp[4..]).await.unwrap();
        assert_eq!(read_message(&mut g).await.as_deref(), Some(&b"req2"[..]));
        assert_eq!(read_message(&mut g).await, None);
        // Two responses in one write: two more requests.
        let mut two = message(MESSAGE_TYPE_RESPONSE, 3, b"");
        two.extend(message(MESSAGE_TYPE_RESPONSE, 5, b"ok"));
        g.write_all(&two).await.unwrap();
        assert_eq!(read_message(&mut g).await.as_deref(), Some(&b"req3"[..]));
        assert_eq!(read_message(&mut g).await.as_deref(), Some(&b"req4"[..]));
        // What the server writes reaches the peer unchanged.
        let mut out = vec![0u8; rsp.len() + two.len()];
        theirs.read_exact(&mut out).await.unwrap();
        assert_eq!(out, [rsp, two].concat());
    }

    /// Only requests count: other message kinds pass the gate freely.
    #[tokio::test(flavor = "current_thread")]
    async fn other_message_kinds_do_not_count() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut g = Gated::new(ours, 1);
        let mut burst = message(ttrpc::proto::MESSAGE_TYPE_DATA, 1, b"d0");
        burst.extend(message(MESSAGE_TYPE_RESPONSE, 1, b"r0"));
        burst.extend(message(MESSAGE_TYPE_REQUEST, 1, b"q0"));
        burst.extend(message(MESSAGE_TYPE_REQUEST, 3, b"q1"));
        theirs.write_all(&burst).await.unwrap();
        for want in [&b"d0"[..], b"r0", b"q0"] {
            assert_eq!(read_message(&mut g).await.as_deref(), Some(want));
        }
        assert_eq!(read_message(&mut g).await, None);
    }
}
