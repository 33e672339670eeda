use super::{shared::frame_header, *};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads one raw frame off a plain socket: (conn id, payload).
async fn read_frame(s: &mut UnixStream) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await?;
    let id = u32::from_be_bytes(h[..4].try_into().unwrap());
    let len = u32::from_be_bytes(h[4..].try_into().unwrap()) as usize;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).await?;
    Ok((id, p))
}

fn raw_frame(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = frame_header(id, payload.len()).to_vec();
    v.extend_from_slice(payload);
    v
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn r2_oversized_write_is_split_at_max_payload() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut conn = mux.open(PLUGIN_SERVICE_CONN).unwrap();
    let data = pattern(4_194_315);
    assert_eq!(MAX_PAYLOAD, 4_194_314);

    let reader = tokio::spawn(async move {
        let f1 = read_frame(&mut b).await.unwrap();
        let f2 = read_frame(&mut b).await.unwrap();
        (f1, f2)
    });
    let n = conn.write(&data).await.unwrap();
    assert_eq!(n, 4_194_315, "write reports every byte written");
    conn.flush().await.unwrap();
    let ((id1, p1), (id2, p2)) = reader.await.unwrap();
    assert_eq!((id1, p1.len()), (1, 4_194_314));
    assert_eq!((id2, p2.len()), (1, 1));
    assert_eq!(&p1[..], &data[..4_194_314]);
    assert_eq!(p2[0], data[4_194_314]);
}

#[tokio::test]
async fn r2_peer_reads_large_write_contiguously() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ma, mb) = (Mux::new(a), Mux::new(b));
    let mut wa = ma.open(1).unwrap();
    let mut rb = mb.open(1).unwrap();
    let data = pattern(4_194_315 * 2 + 17);
    let expect = data.clone();
    let writer = tokio::spawn(async move {
        wa.write_all(&data).await.unwrap();
        wa.flush().await.unwrap();
        wa
    });
    let mut got = vec![0u8; expect.len()];
    rb.read_exact(&mut got).await.unwrap();
    assert!(got == expect, "payload corrupted across frames");
    drop(writer.await.unwrap());
}

#[tokio::test]
async fn r2_frame_for_unknown_conn_is_dropped_and_trunk_survives() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    b.write_all(&raw_frame(7, b"for nobody")).await.unwrap();
    b.write_all(&raw_frame(1, b"hello")).await.unwrap();
    let mut buf = [0u8; 5];
    c1.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
    assert!(!mux.is_closed());
    // The trunk still carries traffic both ways.
    c1.write_all(b"back").await.unwrap();
    let (id, p) = read_frame(&mut b).await.unwrap();
    assert_eq!((id, &p[..]), (1, &b"back"[..]));
}

#[tokio::test]
async fn r2_short_header_read_closes_every_conn_with_eof() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    b.write_all(&[0, 0, 0]).await.unwrap();
    drop(b);
    let mut buf = Vec::new();
    assert_eq!(c1.read_to_end(&mut buf).await.unwrap(), 0);
    assert_eq!(c2.read_to_end(&mut buf).await.unwrap(), 0);
    assert!(mux.closed().await.is_none(), "short read is a clean EOF");
    assert!(c1.write_all(b"x").await.is_err());
}

#[tokio::test]
async fn r2_short_payload_read_closes_every_conn_with_eof() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    let mut f = frame_header(1, 100).to_vec();
    f.extend_from_slice(&[9; 40]);
    b.write_all(&f).await.unwrap();
    drop(b);
    let mut buf = Vec::new();
    assert_eq!(
        c1.read_to_end(&mut buf).await.unwrap(),
        0,
        "partial frame never delivered"
    );
    assert_eq!(c2.read_to_end(&mut buf).await.unwrap(), 0);
}

#[tokio::test]
async fn announced_length_above_cap_is_a_protocol_error() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    b.write_all(&frame_header(1, MAX_PAYLOAD + 1)).await.unwrap();
    let err = mux.closed().await.expect("closed with an error");
    assert!(
        matches!(
            *err,
            MuxError::OversizedFrame {
                conn_id: 1,
                len: 4_194_315,
                ..
            }
        ),
        "{err}"
    );
    let mut buf = [0u8; 1];
    let e = c1.read(&mut buf).await.unwrap_err();
    assert!(e.to_string().contains("4194315"), "{e}");
    // The peer sees the trunk go away.
    let mut rest = Vec::new();
    assert_eq!(b.read_to_end(&mut rest).await.unwrap(), 0);
}

#[tokio::test]
async fn frame_at_cap_is_accepted() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    let data = pattern(MAX_PAYLOAD);
    let w = tokio::spawn(async move {
        b.write_all(&raw_frame(1, &data)).await.unwrap();
        b
    });
    let mut got = vec![0u8; MAX_PAYLOAD];
    c1.read_exact(&mut got).await.unwrap();
    assert_eq!(got, pattern(MAX_PAYLOAD));
    drop(w.await.unwrap());
}

#[tokio::test]
async fn unread_frame_overflow_closes_trunk() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let _c1 = mux.open(1).unwrap();
    let mut burst = Vec::new();
    for _ in 0..=READ_QUEUE_FRAMES {
        burst.extend(raw_frame(1, b"x"));
    }
    b.write_all(&burst).await.unwrap();
    let err = mux.closed().await.expect("overflow is an error");
    assert!(matches!(*err, MuxError::QueueOverflow(1)), "{err}");
}

/// Few frames but many bytes are an overflow too: 5 unread frames of
/// 4 MiB exceed the 16 MiB bound (frames alone would allow 256 of them,
/// a gigabyte).
#[tokio::test]
async fn unread_byte_overflow_closes_trunk() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let _c1 = mux.open(1).unwrap();
    let big = pattern(MAX_PAYLOAD);
    let n = READ_QUEUE_BYTES / MAX_PAYLOAD + 1;
    assert!(n < READ_QUEUE_FRAMES);
    let writer = tokio::spawn(async move {
        for _ in 0..n {
            if b.write_all(&raw_frame(1, &big)).await.is_err() {
                break;
            }
        }
        b
    });
    let err = tokio::time::timeout(std::time::Duration::from_secs(20), mux.closed())
        .await
        .expect("the trunk stayed open with 20 MiB unread")
        .expect("overflow is an error");
    assert!(matches!(*err, MuxError::QueueOverflow(1)), "{err}");
    drop(writer.await.unwrap());
}

/// Bytes read off the queue are counted out: a reader that keeps up never
/// overflows however much passes through.
#[tokio::test]
async fn read_bytes_leave_the_queue_bound() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c1 = mux.open(1).unwrap();
    let total = 32 << 20;
    assert!(total > READ_QUEUE_BYTES);
    let writer = tokio::spawn(async move {
        let chunk = pattern(1 << 20);
        for _ in 0..total / chunk.len() {
            b.write_all(&raw_frame(1, &chunk)).await.unwrap();
        }
        b
    });
    let mut got = vec![0u8; total];
    c1.read_exact(&mut got).await.unwrap();
    assert!(!mux.is_closed());
    drop(writer.await.unwrap());
}

#[tokio::test]
async fn reserved_and_duplicate_ids_are_refused() {
    let (a, _b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    assert!(matches!(mux.open(0), Err(MuxError::ReservedConnId)));
    let c = mux.open(2).unwrap();
    assert!(matches!(mux.open(2), Err(MuxError::AlreadyOpen(2))));
    drop(c);
    assert!(mux.open(2).is_ok(), "id is free again once its conn is dropped");
    mux.close();
    assert!(matches!(mux.open(3), Err(MuxError::Closed)));
}

#[tokio::test]
async fn zero_length_write_sends_an_empty_frame() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let mut c = mux.open(2).unwrap();
    assert_eq!(c.write(&[]).await.unwrap(), 0);
    let (id, p) = read_frame(&mut b).await.unwrap();
    assert_eq!((id, p.len()), (2, 0));
}

#[tokio::test]
async fn local_close_gives_peer_eof_and_local_conns_eof() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ma, mb) = (Mux::new(a), Mux::new(b));
    let mut ca = ma.open(1).unwrap();
    let mut cb = mb.open(1).unwrap();
    ma.close();
    let mut buf = Vec::new();
    assert_eq!(ca.read_to_end(&mut buf).await.unwrap(), 0);
    assert_eq!(cb.read_to_end(&mut buf).await.unwrap(), 0);
    assert!(mb.closed().await.is_none());
    assert!(ca.write_all(b"x").await.is_err());
}

#[tokio::test]
async fn dropping_every_handle_closes_the_trunk() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mux = Mux::new(a);
    let c = mux.open(1).unwrap();
    drop(c);
    drop(mux);
    let mut rest = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), b.read_to_end(&mut rest))
        .await
        .expect("peer sees EOF once the mux is gone")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_never_interleave_inside_a_write() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ma, mb) = (Mux::new(a), Mux::new(b));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for id in 1..=4u32 {
        let mut w = ma.open(id).unwrap();
        let mut r = mb.open(id).unwrap();
        // Mixed sizes: some writes exceed the socket buffer and go through
        // the flusher while other connections keep writing.
        let sizes: Vec<usize> = (0..40)
            .map(|i| [1, 100, 4096, 70_000, 1 << 20][(i + id as usize) % 5])
            .collect();
        let total: usize = sizes.iter().sum();
        writers.push(tokio::spawn(async move {
            for (i, size) in sizes.into_iter().enumerate() {
                let byte = (id as usize * 31 + i) as u8;
                w.write_all(&vec![byte; size]).await.unwrap();
                w.flush().await.unwrap();
            }
            w
        }));
        readers.push(tokio::spawn(async move {
            let mut got = vec![0u8; total];
            r.read_exact(&mut got).await.unwrap();
            (id, got)
        }));
    }
    for r in readers {
        let (id, got) = r.await.unwrap();
        let sizes: Vec<usize> = (0..40)
            .map(|i| [1, 100, 4096, 70_000, 1 << 20][(i + id as usize) % 5])
            .collect();
        let mut off = 0;
        for (i, size) in sizes.into_iter().enumerate() {
            let byte = (id as usize * 31 + i) as u8;
            assert!(
                got[off..off + size].iter().all(|b| *b == byte),
                "conn {id} write {i} corrupted"
            );
            off += size;
        }
    }
    for w in writers {
        drop(w.await.unwrap());
    }
}

/// Checks a sequence of frame payloads of one logical connection against the
/// shapes Go NRI readers accept (reference T-1): a ttrpc message of at most
/// 4096 bytes in one frame; a larger one as [first 4096][rest] or
/// [10-byte header][payload]; no frame spanning two messages.
fn assert_go_readable(frames: &[Vec<u8>]) {
    let mut remaining = 0usize; // bytes left of the current message
    let mut first_of_message = true;
    for f in frames {
        if remaining == 0 {
            assert!(f.len() >= 10, "frame of {} bytes starts a message", f.len());
            let payload = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
            remaining = 10 + payload;
            first_of_message = true;
        }
        assert!(f.len() <= remaining, "frame of {} bytes spans two messages", f.len());
        if first_of_message {
            assert!(
                f.len() <= 4096 || f.len() == 10,
                "first frame of a {remaining}-byte message is {} bytes",
                f.len()
            );
        } else {
            assert_eq!(f.len(), remaining, "message continued in more than one frame");
        }
        remaining -= f.len();
        first_of_message = false;
    }
    assert_eq!(remaining, 0, "message cut short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttrpc_messages_frame_like_go() {
    use crate::{api, api_ttrpc};
    use std::sync::Arc;
    use ttrpc::asynchronous::{
        Client, Server,
        transport::{Listener, Socket},
    };

    struct Echo;
    #[async_trait::async_trait]
    impl api_ttrpc::Runtime for Echo {
        async fn update_containers(
            &self,
            _ctx: &ttrpc::asynchronous::TtrpcContext,
            req: api::UpdateContainersRequest,
        ) -> ttrpc::Result<api::UpdateContainersResponse> {
            Ok(api::UpdateContainersResponse {
                failed: req.update,
                ..Default::default()
            })
        }
    }

    // client mux <-> [recording relay] <-> server mux
    let (client_trunk, relay_a) = UnixStream::pair().unwrap();
    let (relay_b, server_trunk) = UnixStream::pair().unwrap();
    type Recorded = Arc<Mutex<HashMap<(bool, u32), Vec<Vec<u8>>>>>;
    let recorded: Recorded = Arc::default();
    {
        let rec = recorded.clone();
        let (mut src, mut dst) = (relay_a, relay_b);
        tokio::spawn(async move {
            let (mut sr, mut sw) = src.split();
            let (mut dr, mut dw) = dst.split();
            // (true, id): client -> server; (false, id): server -> client
            let up = async {
                while let Ok((id, p)) = read_frame_half(&mut sr).await {
                    rec.lock().unwrap().entry((true, id)).or_default().push(p.clone());
                    dw.write_all(&raw_frame(id, &p)).await.unwrap();
                }
            };
            let down = async {
                while let Ok((id, p)) = read_frame_half(&mut dr).await {
                    rec.lock().unwrap().entry((false, id)).or_default().push(p.clone());
                    sw.write_all(&raw_frame(id, &p)).await.unwrap();
                }
            };
            tokio::join!(up, down);
        });
    }

    let smux = Mux::blocked(server_trunk);
    let sconn = smux.open(RUNTIME_SERVICE_CONN).unwrap();
    smux.unblock();
    let listener = Listener::new(futures::stream::once(async move { Ok(sconn) }).chain(futures::stream::pending()));
    let mut server = Server::new()
        .add_listener(listener)
        .register_service(api_ttrpc::create_runtime(Arc::new(Echo)));
    server.start().await.unwrap();

    let cmux = Mux::new(client_trunk);
    let client = api_ttrpc::RuntimeClient::new(Client::new(Socket::new(cmux.open(RUNTIME_SERVICE_CONN).unwrap())));
    for size in [0usize, 100, 4000, 4086, 4087, 5000, 100_000, 3 << 20] {
        let mut u = api::ContainerUpdate::new();
        u.container_id = "x".repeat(size);
        let req = api::UpdateContainersRequest {
            update: vec![u],
            ..Default::default()
        };
        let rsp = client
            .update_containers(ttrpc::context::with_timeout(10_000_000_000), &req)
            .await
            .unwrap();
        assert_eq!(rsp.failed.len(), 1);
        assert_eq!(rsp.failed[0].container_id.len(), size);
    }
    let (requests, responses) = {
        let rec = recorded.lock().unwrap();
        (
            rec[&(true, RUNTIME_SERVICE_CONN)].clone(),
            rec[&(false, RUNTIME_SERVICE_CONN)].clone(),
        )
    };
    assert!(requests.iter().any(|f| f.len() > 4096), "large messages were exercised");
    assert_go_readable(&requests);
    assert_go_readable(&responses);
    server.shutdown().await.unwrap();
}

use futures::StreamExt as _;

async fn read_frame_half<R: AsyncReadExt + Unpin>(s: &mut R) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await?;
    let id = u32::from_be_bytes(h[..4].try_into().unwrap());
    let len = u32::from_be_bytes(h[4..].try_into().unwrap()) as usize;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).await?;
    Ok((id, p))
}

#[test]
fn go_shape_checker_rejects_bad_framing() {
    let msg = |payload: usize| {
        let mut m = (payload as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&[0; 6]);
        m.extend(vec![1u8; payload]);
        m
    };
    let big = msg(10_000);
    // Whole large message in one frame: a Go reader gets ENOMEM.
    let r = std::panic::catch_unwind(|| assert_go_readable(std::slice::from_ref(&big)));
    assert!(r.is_err());
    // [4096][rest] is fine.
    assert_go_readable(&[big[..4096].to_vec(), big[4096..].to_vec()]);
    // [4096][a][b]: continuation split again.
    let r = std::panic::catch_unwind(|| {
        assert_go_readable(&[big[..4096].to_vec(), big[4096..5000].to_vec(), big[5000..].to_vec()])
    });
    assert!(r.is_err());
    // Two small messages in one frame span a boundary.
    let mut two = msg(10);
    two.extend(msg(10));
    let r = std::panic::catch_unwind(|| assert_go_readable(std::slice::from_ref(&two)));
    assert!(r.is_err());
}
