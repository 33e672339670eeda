//! Pausing containerd's ttrpc connections at a frame boundary, so an
//! upgrade can hand them to a new image of the daemon without containerd
//! noticing (a closed shim connection makes containerd clean up the task).
//!
//! Each accepted connection is a [`GatedStream`]: reads never go past the
//! end of the ttrpc frame being received (10-byte header: length u32 BE,
//! stream id u32 BE, type u8, flags u8, then `length` bytes), and while
//! the [`Gate`] is closed a read at a frame boundary waits instead of
//! reading. Bytes containerd sends meanwhile stay in the kernel's socket
//! buffer for whoever reads the fd next. Writes are parsed the same way,
//! so the gate knows when every request read has had its response
//! written ([`Gate::quiet`]).

use std::{
    io,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sync::lock;

/// Length of a ttrpc frame header.
const HEADER_LEN: usize = 10;
/// ttrpc message type of a request.
const TYPE_REQUEST: u8 = 1;
/// ttrpc message type of a response.
const TYPE_RESPONSE: u8 = 2;

/// Where a byte stream is in its sequence of ttrpc frames.
#[derive(Debug, Default, Clone)]
struct Framing {
    header: [u8; HEADER_LEN],
    have: usize,
    body_left: u64,
}

impl Framing {
    /// Between two frames.
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.body_left == 0
    }

    /// How many bytes may be read without crossing the current frame's end.
    fn limit(&self) -> usize {
        if self.have < HEADER_LEN && self.body_left == 0 {
            HEADER_LEN - self.have
        } else {
            usize::try_from(self.body_left).unwrap_or(usize::MAX)
        }
    }

    /// Accounts for `bytes`; returns the types of the frames completed.
    fn feed(&mut self, mut bytes: &[u8], done: &mut Vec<u8>) {
        while !bytes.is_empty() {
            if self.body_left == 0 {
                let n = (HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                bytes = &bytes[n..];
                if self.have == HEADER_LEN {
                    let len = u32::from_be_bytes([self.header[0], self.header[1], self.header[2], self.header[3]]);
                    self.body_left = u64::from(len);
                    if len == 0 {
                        self.have = 0;
                        done.push(self.header[8]);
                    }
                }
            } else {
                let n = usize::try_from(self.body_left).unwrap_or(usize::MAX).min(bytes.len());
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                if self.body_left == 0 {
                    self.have = 0;
                    done.push(self.header[8]);
                }
            }
        }
    }
}

/// What the gate knows of one connection.
struct Conn {
    fd: RawFd,
    read: Mutex<Framing>,
    write: Mutex<Framing>,
    requests: AtomicU64,
    responses: AtomicU64,
    waker: Mutex<Option<Waker>>,
}

impl Conn {
    fn quiet(&self) -> bool {
        lock(&self.read).at_boundary()
            && lock(&self.write).at_boundary()
            && self.requests.load(Ordering::SeqCst) == self.responses.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct GateInner {
    closed: AtomicBool,
    conns: Mutex<Vec<Weak<Conn>>>,
    changed: tokio::sync::Notify,
}

/// Opens and closes every [`GatedStream`] made from it; cheap to clone.
#[derive(Clone, Default)]
pub struct Gate(Arc<GateInner>);

impl Gate {
    /// An open gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Wraps an accepted connection (or one handed over by the previous
    /// image, which is at a frame boundary).
    pub fn wrap(&self, io: tokio::net::UnixStream) -> GatedStream {
        let conn = Arc::new(Conn {
            fd: io.as_raw_fd(),
            read: Mutex::default(),
            write: Mutex::default(),
            requests: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            waker: Mutex::new(None),
        });
        let mut conns = lock(&self.0.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(&conn));
        GatedStream {
            io,
            conn,
            gate: self.0.clone(),
        }
    }

    /// Stops reading at the next frame boundary of every connection (and,
    /// for the accept loop, accepting).
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// Lets reads go on (an upgrade that did not happen).
    pub fn open(&self) {
        self.0.closed.store(false, Ordering::SeqCst);
        for c in self.live() {
            if let Some(w) = lock(&c.waker).take() {
                w.wake();
            }
        }
        self.0.changed.notify_waiters();
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::SeqCst)
    }

    /// Waits until the gate is open.
    pub async fn opened(&self) {
        loop {
            let changed = self.0.changed.notified();
            if !self.is_closed() {
                return;
            }
            changed.await;
        }
    }

    /// Waits until the gate is closed.
    pub async fn closed(&self) {
        loop {
            let changed = self.0.changed.notified();
            if self.is_closed() {
                return;
            }
            changed.await;
        }
    }

    fn live(&self) -> Vec<Arc<Conn>> {
        lock(&self.0.conns).iter().filter_map(Weak::upgrade).collect()
    }

    /// Every live connection is between frames in both directions and has
    /// answered every request it read.
    pub fn quiet(&self) -> bool {
        self.live().iter().all(|c| c.quiet())
    }

    /// The fds of the live connections (valid while they live).
    pub fn fds(&self) -> Vec<RawFd> {
        self.live().iter().map(|c| c.fd).collect()
    }
}

/// A connection read and written through a [`Gate`].
pub struct GatedStream {
    io: tokio::net::UnixStream,
    conn: Arc<Conn>,
    gate: Arc<GateInner>,
}

impl AsyncRead for GatedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let limit = {
            let framing = lock(&this.conn.read);
            if framing.at_boundary() && this.gate.closed.load(Ordering::SeqCst) {
                *lock(&this.conn.waker) = Some(cx.waker().clone());
                // Opened meanwhile: its wake-up may have missed the waker.
                if !this.gate.closed.load(Ordering::SeqCst) {
                    cx.waker().wake_by_ref();
                }
                return Poll::Pending;
            }
            framing.limit()
        };
        let before = buf.filled().len();
        let mut part = buf.take(limit.min(buf.remaining()));
        let start = part.filled().as_ptr();
        match Pin::new(&mut this.io).poll_read(cx, &mut part) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        debug_assert_eq!(start, part.filled().as_ptr());
        let n = part.filled().len();
        // SAFETY: `part` is a view of `buf`'s unfilled part and the read
        // initialised and filled its first `n` bytes.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        let mut done = Vec::new();
        lock(&this.conn.read).feed(&buf.filled()[before..], &mut done);
        let requests = done.iter().filter(|t| **t == TYPE_REQUEST).count() as u64;
        this.conn.requests.fetch_add(requests, Ordering::SeqCst);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for GatedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let mut done = Vec::new();
        lock(&this.conn.write).feed(&data[..n], &mut done);
        let responses = done.iter().filter(|t| **t == TYPE_RESPONSE).count() as u64;
        if responses > 0 {
            this.conn.responses.fetch_add(responses, Ordering::SeqCst);
            this.gate.changed.notify_waiters();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::os::fd::FromRawFd as _;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&1u32.to_be_bytes());
        f.push(kind);
        f.push(0);
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn framing_counts_frames_split_anywhere() {
        let mut bytes = frame(TYPE_REQUEST, b"hello");
        bytes.extend(frame(TYPE_RESPONSE, b""));
        bytes.extend(frame(TYPE_REQUEST, &[7u8; 300]));
        for split in 1..bytes.len() {
            let (mut f, mut done) = (Framing::default(), Vec::new());
            for chunk in bytes.chunks(split) {
                f.feed(chunk, &mut done);
            }
            assert_eq!(
                done,
                vec![TYPE_REQUEST, TYPE_RESPONSE, TYPE_REQUEST],
                "chunks of {split}"
            );
            assert!(f.at_boundary());
        }
        let mut f = Framing::default();
        f.feed(&bytes[..12], &mut Vec::new());
        assert!(!f.at_boundary());
        assert_eq!(f.limit(), 3);
    }

    /// A closed gate stops a reader at the end of the frame it is in; the
    /// next frame stays in the socket, readable from a dup of the fd.
    #[tokio::test]
    async fn a_closed_gate_leaves_the_next_frame_in_the_socket() {
        let (a, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let gate = Gate::new();
        let mut s = gate.wrap(a);
        let first = frame(TYPE_REQUEST, b"first");
        let second = frame(TYPE_REQUEST, b"second");
        // The peer sends the first frame's header, then the gate closes.
        peer.write_all(&first[..4]).await.unwrap();
        let mut got = vec![0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        gate.close();
        assert!(!gate.quiet(), "mid-frame");
        let mut rest = first[4..].to_vec();
        rest.extend(&second);
        peer.write_all(&rest).await.unwrap();
        // The reader finishes the first frame (a large buffer notwithstanding)...
        let mut buf = vec![0u8; 4096];
        let mut total = 4;
        while total < first.len() {
            let n = s.read(&mut buf).await.unwrap();
            total += n;
        }
        assert_eq!(total, first.len());
        // ...and reads no further while closed.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf))
                .await
                .is_err()
        );
        // One request read, none answered yet.
        assert!(!gate.quiet());
        s.write_all(&frame(TYPE_RESPONSE, b"ok")).await.unwrap();
        assert!(gate.quiet());
        // The second frame is intact in the socket for the next image.
        assert_eq!(gate.fds(), vec![s.io.as_raw_fd()]);
        // SAFETY: a dup of a live socket fd, owned here.
        let dup = unsafe { std::os::fd::OwnedFd::from_raw_fd(libc::dup(s.io.as_raw_fd())) };
        let std_stream = std::os::unix::net::UnixStream::from(dup);
        std_stream.set_nonblocking(true).unwrap();
        let mut next = Gate::new().wrap(tokio::net::UnixStream::from_std(std_stream).unwrap());
        let mut got = vec![0u8; second.len()];
        next.read_exact(&mut got).await.unwrap();
        assert_eq!(got, second);
    }

    #[tokio::test]
    async fn opening_the_gate_wakes_a_waiting_reader() {
        let (a, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let gate = Gate::new();
        let mut s = gate.wrap(a);
        gate.close();
        let msg = frame(TYPE_REQUEST, b"x");
        peer.write_all(&msg).await.unwrap();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; msg.len()];
            s.read_exact(&mut got).await.map(|_| got)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reader.is_finished());
        gate.open();
        let got = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(got, frame(TYPE_REQUEST, b"x"));
    }
}
