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
//!   overflow that closes the trunk, as in the Go mux; so is more than
//!   [`READ_QUEUE_BYTES`] unread bytes (ours: 256 frames of 4 MiB would be
//!   a gigabyte held for a peer that sends faster than it is read).
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
    io,
    sync::{Arc, Mutex},
    task::Waker,
};

use tokio::{
    net::{
        UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::Notify,
};

use self::tasks::{flusher, reader};
use crate::sync::lock;

mod conn;
mod shared;
mod tasks;

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
/// Unread payload bytes one logical connection may queue before the trunk
/// is closed: four maximal frames (about 16 MiB), room for a reader that is
/// a few whole messages behind.
pub const READ_QUEUE_BYTES: usize = 4 * MAX_PAYLOAD;

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
    /// A logical connection had more than [`READ_QUEUE_FRAMES`] unread
    /// frames or [`READ_QUEUE_BYTES`] unread bytes.
    #[error("connection {0} has more than {READ_QUEUE_FRAMES} unread frames or {READ_QUEUE_BYTES} unread bytes")]
    QueueOverflow(ConnId),
    /// Reading or writing the trunk failed.
    #[error("trunk i/o")]
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
    /// Unread payload bytes in `frames`.
    bytes: usize,
    /// Read offset into the front frame.
    offset: usize,
    waker: Option<Waker>,
    /// Set when the connection or trunk is closed: `None` = EOF, `Some` = error.
    closed: Option<Option<io::Error>>,
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

#[cfg(test)]
mod tests;
