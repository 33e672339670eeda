//! The NRI trunk multiplexer: several logical byte streams over one unix socket.
//!
//! NRI runs two independent ttrpc sessions over the single connection between a
//! runtime and a plugin. Every chunk of data travels in a *frame*:
//!
//! ```text
//! +----------------+----------------+---------------------+
//! | conn id (u32)  | length (u32)   | payload (length B)  |
//! | big endian     | big endian     |                     |
//! +----------------+----------------+---------------------+
//! ```
//!
//! Logical connection [`PLUGIN_SERVICE_CONN`] (1) carries the `Plugin` service
//! (the runtime is the ttrpc client), [`RUNTIME_SERVICE_CONN`] (2) the `Runtime`
//! service (the runtime serves). There is no handshake: both sides open the same
//! ids locally.
//!
//! Rules this implementation keeps (NRI `pkg/net/multiplex` and the Go readers
//! behind it):
//! * one logical write becomes frames of at most [`MAX_PAYLOAD`] bytes, written
//!   back to back without frames of other connections in between;
//! * a frame that announces more than [`MAX_PAYLOAD`] bytes is a protocol error
//!   that closes the trunk (upstream allocates whatever is announced);
//! * frames for ids nobody opened are read and dropped, the trunk stays up;
//! * a short read of a header or payload closes the trunk, and every logical
//!   connection then reads EOF;
//! * more than [`READ_QUEUE_FRAMES`] unread frames on one connection is an
//!   overflow that closes the trunk, as in the Go mux.
//!
//! Go peers read each frame into the buffer they are handed and fail with
//! ENOMEM when a frame is larger than that buffer; their ttrpc reads through a
//! 4096-byte buffer. ttrpc-rust 0.10 writes each message as
//! `[header + first 4086 payload bytes][rest]` and this mux turns each such
//! write into exactly one frame, which is the shape Go readers accept (a
//! message ≤ 4096 bytes in one frame, a larger one as `[first 4096][rest]`).
//! The test `ttrpc_messages_frame_like_go` pins that.

use std::{
    collections::{HashMap, VecDeque},
    io::{self, IoSlice},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, Weak},
    task::{Context, Poll, Waker},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader, ReadBuf},
    net::{
        UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::Notify,
};

/// Identifier of a logical connection on the trunk. Id 0 is reserved.
pub type ConnId = u32;

/// Logical connection carrying the NRI `Plugin` service (runtime = client).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// Logical connection carrying the NRI `Runtime` service (runtime = server).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;

/// Length of a frame header in bytes.
pub const HEADER_LEN: usize = 8;
/// Largest payload of one frame in bytes: a maximal ttrpc message
/// (4 MiB payload + 10-byte ttrpc header), 4,194,314 bytes.
pub const MAX_PAYLOAD: usize = (4 << 20) + 10;
/// Unread frames one logical connection may queue before the trunk is closed.
pub const READ_QUEUE_FRAMES: usize = 256;

/// Why a trunk or logical connection failed.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// Connection id 0 cannot be opened.
    #[error("connection id 0 is reserved")]
    ReservedConnId,
    /// The id is already open on this trunk.
    #[error("connection id {0} is already open")]
    AlreadyOpen(ConnId),
    /// The trunk was closed, locally or by the peer.
    #[error("trunk closed")]
    Closed,
    /// The peer announced a frame larger than [`MAX_PAYLOAD`].
    #[error("frame for connection {conn_id} announces {len} bytes, more than the {max} allowed")]
    OversizedFrame {
        /// Connection the frame was addressed to.
        conn_id: ConnId,
        /// Announced payload length.
        len: u32,
        /// The limit ([`MAX_PAYLOAD`]).
        max: usize,
    },
    /// A logical connection had more than [`READ_QUEUE_FRAMES`] unread frames.
    #[error("connection {0} has more than {READ_QUEUE_FRAMES} unread frames")]
    QueueOverflow(ConnId),
    /// Reading or writing the trunk failed.
    #[error("trunk i/o: {0}")]
    Io(#[from] io::Error),
}

impl MuxError {
    fn to_io(&self) -> io::Error {
        match self {
            MuxError::Closed => io::Error::new(io::ErrorKind::BrokenPipe, "mux trunk closed"),
            MuxError::Io(e) => io::Error::new(e.kind(), e.to_string()),
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// One end of a multiplexed trunk. Cheap to clone; all clones share the trunk.
///
/// Create it with [`Mux::new`] (reading starts at once) or [`Mux::blocked`]
/// (reading starts at [`Mux::unblock`], so connections opened before that
/// cannot miss early frames). Requires a tokio runtime.
#[derive(Clone)]
pub struct Mux {
    shared: Arc<Shared>,
}

struct Shared {
    conns: Mutex<HashMap<ConnId, Arc<ConnQueue>>>,
    writer: Mutex<WriterState>,
    /// Wakes the background flusher when `pending` holds unsent bytes.
    flush_needed: Arc<Notify>,
    /// The read half until the reader task takes it.
    read_half: Mutex<Option<OwnedReadHalf>>,
    state: Mutex<TrunkState>,
    closed_notify: Notify,
}

#[derive(Default)]
struct TrunkState {
    /// `Some` once the trunk is closed: `None` inside means a clean EOF.
    closed: Option<Option<Arc<MuxError>>>,
    reader: Option<tokio::task::JoinHandle<()>>,
    flusher: Option<tokio::task::JoinHandle<()>>,
}

struct WriterState {
    half: Option<Arc<OwnedWriteHalf>>,
    /// Encoded frames not yet accepted by the socket; they go out before anything else.
    pending: Vec<u8>,
    pos: usize,
    waiters: Vec<Waker>,
    error: Option<io::ErrorKind>,
}

#[derive(Default)]
struct ConnQueue {
    inner: Mutex<QueueInner>,
}

#[derive(Default)]
struct QueueInner {
    frames: VecDeque<Vec<u8>>,
    /// Read offset into the front frame.
    offset: usize,
    waker: Option<Waker>,
    /// Set when the connection or trunk is closed: `None` = EOF, `Some` = error.
    closed: Option<Option<io::Error>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (every
    // critical section is a few field updates), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mux {
    /// Multiplexes `trunk` and starts reading at once.
    pub fn new(trunk: UnixStream) -> Mux {
        let mux = Mux::blocked(trunk);
        mux.unblock();
        mux
    }

    /// Multiplexes `trunk` without reading from it until [`Mux::unblock`].
    pub fn blocked(trunk: UnixStream) -> Mux {
        let (read_half, write_half) = trunk.into_split();
        let shared = Arc::new(Shared {
            conns: Mutex::new(HashMap::new()),
            writer: Mutex::new(WriterState {
                half: Some(Arc::new(write_half)),
                pending: Vec::new(),
                pos: 0,
                waiters: Vec::new(),
                error: None,
            }),
            flush_needed: Arc::new(Notify::new()),
            read_half: Mutex::new(Some(read_half)),
            state: Mutex::new(TrunkState::default()),
            closed_notify: Notify::new(),
        });
        let flusher = tokio::spawn(flusher(Arc::downgrade(&shared), shared.flush_needed.clone()));
        lock(&shared.state).flusher = Some(flusher);
        Mux { shared }
    }

    /// Starts reading the trunk. Idempotent.
    pub fn unblock(&self) {
        let Some(read_half) = lock(&self.shared.read_half).take() else {
            return;
        };
        let task = tokio::spawn(reader(Arc::downgrade(&self.shared), read_half));
        let mut st = lock(&self.shared.state);
        if st.closed.is_some() {
            task.abort();
        } else {
            st.reader = Some(task);
        }
    }

    /// Opens logical connection `id`.
    ///
    /// # Errors
    /// [`MuxError::ReservedConnId`] for id 0, [`MuxError::AlreadyOpen`] if an
    /// open [`MuxConn`] already uses `id`, [`MuxError::Closed`] after close.
    pub fn open(&self, id: ConnId) -> Result<MuxConn, MuxError> {
        if id == 0 {
            return Err(MuxError::ReservedConnId);
        }
        if lock(&self.shared.state).closed.is_some() {
            return Err(MuxError::Closed);
        }
        let mut conns = lock(&self.shared.conns);
        if conns.contains_key(&id) {
            return Err(MuxError::AlreadyOpen(id));
        }
        let queue = Arc::new(ConnQueue::default());
        conns.insert(id, queue.clone());
        Ok(MuxConn {
            id,
            shared: self.shared.clone(),
            queue,
            shut_down: false,
        })
    }

    /// Closes the trunk: every logical connection reads EOF, writes fail.
    pub fn close(&self) {
        self.shared.close(None);
    }

    /// Whether the trunk is closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed.is_some()
    }

    /// Waits until the trunk is closed, locally or by the peer. Returns the
    /// error that closed it, `None` for a clean close or EOF.
    pub async fn closed(&self) -> Option<Arc<MuxError>> {
        loop {
            let notified = self.shared.closed_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = &lock(&self.shared.state).closed {
                return reason.clone();
            }
            notified.await;
        }
    }
}

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
    fn close(&self, error: Option<MuxError>) {
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
    fn write_frames(&self, cx: &mut Context<'_>, id: ConnId, buf: &[u8]) -> Poll<io::Result<usize>> {
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

    fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

fn register(waiters: &mut Vec<Waker>, waker: &Waker) {
    if !waiters.iter().any(|w| w.will_wake(waker)) {
        waiters.push(waker.clone());
    }
}

fn frame_header(id: ConnId, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&id.to_be_bytes());
    h[4..].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

fn write_vectored_from(half: &OwnedWriteHalf, iov: &[IoSlice<'_>], mut skip: usize) -> io::Result<usize> {
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

/// Drains `pending` whenever the fast path could not write everything.
async fn flusher(shared: Weak<Shared>, flush_needed: Arc<Notify>) {
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
async fn reader(shared: Weak<Shared>, read_half: OwnedReadHalf) {
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
        if q.frames.len() >= READ_QUEUE_FRAMES {
            drop(q);
            break Some(MuxError::QueueOverflow(id));
        }
        q.frames.push_back(payload);
        if let Some(w) = q.waker.take() {
            w.wake();
        }
    };
    if let Some(e) = &err {
        tracing::warn!(error = %e, "closing NRI mux trunk");
    }
    let Some(shared) = shared.upgrade() else {
        return;
    };
    // Detach ourselves so close() does not abort the task running it.
    lock(&shared.state).reader.take();
    shared.close(err);
}

fn eof_or(e: io::Error) -> Option<MuxError> {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => None,
        _ => Some(MuxError::Io(e)),
    }
}

/// One logical connection of a [`Mux`]: an ordered byte stream.
///
/// Reading yields the payloads of the frames addressed to this id, in order.
/// Each `poll_write` call becomes one frame (or several of at most
/// [`MAX_PAYLOAD`] bytes each, sent back to back). Dropping it, or
/// `poll_shutdown`, stops delivery to this id; the trunk stays open.
pub struct MuxConn {
    id: ConnId,
    shared: Arc<Shared>,
    queue: Arc<ConnQueue>,
    shut_down: bool,
}

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
            progressed = true;
            if offset + n == front.len() {
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

#[cfg(test)]
mod tests;
