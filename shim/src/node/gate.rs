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
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
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
    /// Keep each frame's bytes (the read side: requests may be replayed).
    capture: bool,
    frame: Vec<u8>,
}

/// A frame completed by [`Framing::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: u8,
    stream: u32,
    /// Header and body, when captured.
    bytes: Vec<u8>,
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

    fn complete(&mut self, done: &mut Vec<Frame>) {
        self.have = 0;
        done.push(Frame {
            kind: self.header[8],
            stream: u32::from_be_bytes([self.header[4], self.header[5], self.header[6], self.header[7]]),
            bytes: std::mem::take(&mut self.frame),
        });
    }

    /// Accounts for `bytes`; appends the frames completed to `done`.
    fn feed(&mut self, mut bytes: &[u8], done: &mut Vec<Frame>) {
        while !bytes.is_empty() {
            if self.body_left == 0 {
                let n = (HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                if self.capture {
                    self.frame.extend_from_slice(&bytes[..n]);
                }
                self.have += n;
                bytes = &bytes[n..];
                if self.have == HEADER_LEN {
                    let len = u32::from_be_bytes([self.header[0], self.header[1], self.header[2], self.header[3]]);
                    self.body_left = u64::from(len);
                    if len == 0 {
                        self.complete(done);
                    }
                }
            } else {
                let n = usize::try_from(self.body_left).unwrap_or(usize::MAX).min(bytes.len());
                if self.capture {
                    self.frame.extend_from_slice(&bytes[..n]);
                }
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                if self.body_left == 0 {
                    self.complete(done);
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
    /// Requests read and not yet answered, by stream id: (method, frame).
    pending: Mutex<BTreeMap<u32, (String, Vec<u8>)>>,
    waker: Mutex<Option<Waker>>,
}

impl Conn {
    fn quiet(&self, replayable: &dyn Fn(&str) -> bool) -> bool {
        lock(&self.read).at_boundary()
            && lock(&self.write).at_boundary()
            && lock(&self.pending).values().all(|(m, _)| replayable(m))
    }
}

/// The `method` of a ttrpc `Request` message (field 2, a string), read
/// from its protobuf encoding; empty when it cannot be read.
fn method_of(body: &[u8]) -> String {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut b = body;
    while !b.is_empty() {
        let Some(tag) = varint(&mut b) else { break };
        let len = match tag & 7 {
            0 => {
                if varint(&mut b).is_none() {
                    break;
                }
                continue;
            }
            2 => match varint(&mut b).and_then(|l| usize::try_from(l).ok()) {
                Some(l) if l <= b.len() => l,
                _ => break,
            },
            _ => break,
        };
        let (field, rest) = b.split_at(len);
        b = rest;
        if tag >> 3 == 2 {
            return String::from_utf8_lossy(field).into_owned();
        }
    }
    String::new()
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
        self.wrap_with_replay(io, Vec::new())
    }

    /// Wraps a connection handed over by the previous image with the
    /// requests it had read and not answered (whole frames), which are
    /// read again before the socket.
    pub fn wrap_with_replay(&self, io: tokio::net::UnixStream, replay: Vec<u8>) -> GatedStream {
        let conn = Arc::new(Conn {
            fd: io.as_raw_fd(),
            read: Mutex::new(Framing {
                capture: true,
                ..Framing::default()
            }),
            write: Mutex::default(),
            pending: Mutex::default(),
            waker: Mutex::new(None),
        });
        let mut conns = lock(&self.0.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(&conn));
        GatedStream {
            io,
            conn,
            gate: self.0.clone(),
            replay,
            replayed: 0,
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
    /// answered every request it read whose method is not `replayable`
    /// (a request that only waits, which the next image can answer).
    pub fn quiet(&self, replayable: &dyn Fn(&str) -> bool) -> bool {
        self.live().iter().all(|c| c.quiet(replayable))
    }

    /// The live connections: their fds (valid while they live) and the
    /// frames of the requests they have not answered, in stream order.
    pub fn handover(&self) -> Vec<(RawFd, Vec<u8>)> {
        self.live()
            .iter()
            .map(|c| (c.fd, lock(&c.pending).values().flat_map(|(_, f)| f.clone()).collect()))
            .collect()
    }
}

/// A connection read and written through a [`Gate`].
pub struct GatedStream {
    io: tokio::net::UnixStream,
    conn: Arc<Conn>,
    gate: Arc<GateInner>,
    replay: Vec<u8>,
    replayed: usize,
}

impl GatedStream {
    fn account_read(&self, bytes: &[u8]) {
        let mut done = Vec::new();
        lock(&self.conn.read).feed(bytes, &mut done);
        let mut pending = lock(&self.conn.pending);
        for f in done.into_iter().filter(|f| f.kind == TYPE_REQUEST) {
            let method = method_of(&f.bytes[HEADER_LEN.min(f.bytes.len())..]);
            pending.insert(f.stream, (method, f.bytes));
        }
    }
}

impl AsyncRead for GatedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.replay.len() {
            let n = (this.replay.len() - this.replayed).min(buf.remaining());
            let chunk = this.replay[this.replayed..this.replayed + n].to_vec();
            buf.put_slice(&chunk);
            this.replayed += n;
            this.account_read(&chunk);
            if this.replayed == this.replay.len() {
                this.replay = Vec::new();
                this.replayed = 0;
            }
            return Poll::Ready(Ok(()));
        }
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
        this.account_read(&buf.filled()[before..]);
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
        let mut pending = lock(&this.conn.pending);
        for f in done.iter().filter(|f| f.kind == TYPE_RESPONSE) {
            pending.remove(&f.stream);
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
    use std::{os::fd::FromRawFd as _, time::Duration};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn frame_on(stream: u32, kind: u8, body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&stream.to_be_bytes());
        f.push(kind);
        f.push(0);
        f.extend_from_slice(body);
        f
    }

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        frame_on(1, kind, body)
    }

    /// A ttrpc `Request` body: service (1), method (2), payload (3).
    fn request(method: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for (tag, v) in [(0x0a, "containerd.task.v2.Task"), (0x12, method), (0x1a, "xyz")] {
            b.push(tag);
            b.push(v.len() as u8);
            b.extend_from_slice(v.as_bytes());
        }
        b
    }

    #[test]
    fn framing_counts_frames_split_anywhere() {
        let mut bytes = frame(TYPE_REQUEST, b"hello");
        bytes.extend(frame_on(3, TYPE_RESPONSE, b""));
        bytes.extend(frame(TYPE_REQUEST, &[7u8; 300]));
        for split in 1..bytes.len() {
            let (mut f, mut done) = (Framing::default(), Vec::new());
            for chunk in bytes.chunks(split) {
                f.feed(chunk, &mut done);
            }
            let kinds: Vec<(u8, u32)> = done.iter().map(|f| (f.kind, f.stream)).collect();
            assert_eq!(
                kinds,
                vec![(TYPE_REQUEST, 1), (TYPE_RESPONSE, 3), (TYPE_REQUEST, 1)],
                "chunks of {split}"
            );
            assert!(f.at_boundary());
        }
        let mut f = Framing::default();
        f.feed(&bytes[..12], &mut Vec::new());
        assert!(!f.at_boundary());
        assert_eq!(f.limit(), 3);
    }

    #[test]
    fn the_method_of_a_request_is_read_from_its_protobuf() {
        assert_eq!(method_of(&request("Wait")), "Wait");
        assert_eq!(method_of(b"\x0a\x03abc"), "");
        assert_eq!(method_of(b"\x12\xff"), "", "a length beyond the body");
    }

    /// A closed gate stops a reader at the end of the frame it is in; the
    /// next frame stays in the socket, readable from a dup of the fd.
    #[tokio::test]
    async fn a_closed_gate_leaves_the_next_frame_in_the_socket() {
        let (a, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let gate = Gate::new();
        let mut s = gate.wrap(a);
        let first = frame(TYPE_REQUEST, &request("State"));
        let second = frame_on(3, TYPE_REQUEST, &request("Kill"));
        // The peer sends the first frame's header, then the gate closes.
        peer.write_all(&first[..4]).await.unwrap();
        let mut got = vec![0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        gate.close();
        assert!(!gate.quiet(&|_| true), "mid-frame");
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
        // One request read, not answered yet, and not one that may be replayed.
        assert!(!gate.quiet(&|m| m == "Wait"));
        s.write_all(&frame(TYPE_RESPONSE, b"ok")).await.unwrap();
        assert!(gate.quiet(&|_| false));
        // The second frame is intact in the socket for the next image.
        let handed = gate.handover();
        assert_eq!(handed, vec![(s.io.as_raw_fd(), Vec::new())]);
        // SAFETY: a dup of a live socket fd, owned here.
        let dup = unsafe { std::os::fd::OwnedFd::from_raw_fd(libc::dup(s.io.as_raw_fd())) };
        let std_stream = std::os::unix::net::UnixStream::from(dup);
        std_stream.set_nonblocking(true).unwrap();
        let mut next = Gate::new().wrap(tokio::net::UnixStream::from_std(std_stream).unwrap());
        let mut got = vec![0u8; second.len()];
        next.read_exact(&mut got).await.unwrap();
        assert_eq!(got, second);
    }

    /// A request that only waits (Wait) does not hold an upgrade up: it is
    /// handed over and read again, first, by the next image, which answers
    /// it on the same stream.
    #[tokio::test]
    async fn an_unanswered_wait_is_replayed_to_the_next_image() {
        let (a, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let gate = Gate::new();
        let mut s = gate.wrap(a);
        let wait = frame_on(5, TYPE_REQUEST, &request("Wait"));
        let state = frame_on(7, TYPE_REQUEST, &request("State"));
        peer.write_all(&wait).await.unwrap();
        peer.write_all(&state).await.unwrap();
        let mut got = vec![0u8; wait.len() + state.len()];
        s.read_exact(&mut got).await.unwrap();
        gate.close();
        assert!(!gate.quiet(&|m| m == "Wait"), "State is unanswered");
        s.write_all(&frame_on(7, TYPE_RESPONSE, b"state")).await.unwrap();
        assert!(gate.quiet(&|m| m == "Wait"));
        let later = frame_on(9, TYPE_REQUEST, &request("Kill"));
        peer.write_all(&later).await.unwrap();
        let handed = gate.handover();
        assert_eq!(handed, vec![(s.io.as_raw_fd(), wait.clone())]);
        // The next image reads the Wait, then what waited in the socket.
        // SAFETY: a dup of a live socket fd, owned here.
        let dup = unsafe { std::os::fd::OwnedFd::from_raw_fd(libc::dup(s.io.as_raw_fd())) };
        let std_stream = std::os::unix::net::UnixStream::from(dup);
        std_stream.set_nonblocking(true).unwrap();
        let next_gate = Gate::new();
        let mut next = next_gate.wrap_with_replay(
            tokio::net::UnixStream::from_std(std_stream).unwrap(),
            handed[0].1.clone(),
        );
        let mut got = vec![0u8; wait.len() + later.len()];
        next.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [wait, later].concat());
        assert!(!next_gate.quiet(&|_| false), "both are pending in the next image");
        assert!(!next_gate.quiet(&|m| m == "Wait"), "the Kill is pending");
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
