//! The trunk multiplexer's frame reader ([`nri_proto::mux`]): the input is
//! what a peer writes on the NRI socket.
//!
//! The runtime's side opens logical connections 1 and 2, as the handshake
//! does, and reads both to the end while the peer writes the input and
//! shuts down. Properties, against a model of the frame format in the
//! module docs of `nri_proto::mux`:
//! * each connection reads exactly the payloads of its frames, in order,
//!   up to the first frame announcing more than `MAX_PAYLOAD` bytes or a
//!   truncated frame; frames for other ids are dropped;
//! * the trunk closes with `OversizedFrame` naming that frame, or cleanly
//!   when the input ends; only a queue overflow (more than
//!   `READ_QUEUE_FRAMES` unread frames, which depends on scheduling) may
//!   stop delivery earlier, and then each connection read a prefix;
//! * no single allocation exceeds `MAX_PAYLOAD` (plus the reader's buffer)
//!   whatever the frames announce, and the peak stays within one frame
//!   limit plus a few copies of the input.

use std::sync::OnceLock;

use nri_proto::mux::{HEADER_LEN, MAX_PAYLOAD, Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    runtime::Runtime,
};

use crate::alloc::Mark;

/// Slack for the reader's 64 KiB buffer, the tasks and the queues.
const SLACK: usize = 1 << 20;

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// What the frame format says the connections must read.
struct Expected {
    plugin: Vec<u8>,
    runtime: Vec<u8>,
    /// `(conn id, announced length)` of the first oversized frame.
    oversized: Option<(u32, u32)>,
}

fn model(data: &[u8]) -> Expected {
    let mut e = Expected {
        plugin: Vec::new(),
        runtime: Vec::new(),
        oversized: None,
    };
    let mut rest = data;
    while rest.len() >= HEADER_LEN {
        let id = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len as usize > MAX_PAYLOAD {
            e.oversized = Some((id, len));
            break;
        }
        let body = &rest[HEADER_LEN..];
        if body.len() < len as usize {
            break;
        }
        let (payload, next) = body.split_at(len as usize);
        match id {
            PLUGIN_SERVICE_CONN => e.plugin.extend_from_slice(payload),
            RUNTIME_SERVICE_CONN => e.runtime.extend_from_slice(payload),
            _ => {}
        }
        rest = next;
    }
    e
}

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let rt = runtime();
    let mark = Mark::now();
    let (plugin, runtime_conn, reason) = rt.block_on(async {
        let (ours, mut theirs) = UnixStream::pair().expect("socketpair");
        let mux = Mux::new(ours);
        let mut c1 = mux.open(PLUGIN_SERVICE_CONN).expect("fresh mux");
        let mut c2 = mux.open(RUNTIME_SERVICE_CONN).expect("fresh mux");
        let input = data.to_vec();
        let writer = tokio::spawn(async move {
            // Fails once the mux closed the trunk on an error: fine.
            let _ = theirs.write_all(&input).await;
            let _ = theirs.shutdown().await;
            theirs
        });
        let (mut got1, mut got2) = (Vec::new(), Vec::new());
        let _ = tokio::join!(c1.read_to_end(&mut got1), c2.read_to_end(&mut got2));
        let reason = mux.closed().await;
        drop((c1, c2, mux));
        drop(writer.await.expect("writer task"));
        (got1, got2, reason)
    });
    let usage = mark.usage();
    let want = model(data);
    match reason.as_deref() {
        Some(MuxError::QueueOverflow(_)) => {
            assert!(want.plugin.starts_with(&plugin), "conn 1 read bytes no frame carried");
            assert!(
                want.runtime.starts_with(&runtime_conn),
                "conn 2 read bytes no frame carried"
            );
        }
        other => {
            let got = match other {
                None => None,
                Some(MuxError::OversizedFrame { conn_id, len, max }) => {
                    assert_eq!(*max, MAX_PAYLOAD);
                    Some((*conn_id, *len))
                }
                Some(e) => panic!("trunk closed by an unexpected error: {e}"),
            };
            assert_eq!(got, want.oversized, "close reason");
            assert!(plugin == want.plugin, "conn 1 read other bytes than its frames carried");
            assert!(
                runtime_conn == want.runtime,
                "conn 2 read other bytes than its frames carried"
            );
        }
    }
    assert!(
        usage.largest <= MAX_PAYLOAD.max(4 * data.len()) + SLACK,
        "one allocation of {} bytes for a {}-byte input",
        usage.largest,
        data.len()
    );
    assert!(
        usage.peak <= MAX_PAYLOAD + 8 * data.len() + SLACK,
        "{} bytes allocated at the peak for a {}-byte input",
        usage.peak,
        data.len()
    );
}
