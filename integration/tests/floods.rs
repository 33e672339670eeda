//! Floods on the NRI socket, each bounded in time by its own deadlines:
//! many connections that never register; a registered plugin sending
//! garbage, oversized frames, or UpdateContainers by the thousand (reading
//! the answers or not); a plugin that stops reading its socket. The
//! adaptation runs in this process, so its file descriptors and memory are
//! this process's (`/proc/self/fd`, `VmRSS`); the tests take turns
//! ([`serial`]) so no other test's sockets or allocations are counted.
//!
//! No speed targets: a create "not starved" is one that completes within
//! the request timeout; the figures are printed, and the benchmarks
//! (`benches/large_node.rs`) measure latency.

use std::{
    io::Read as _,
    os::unix::net::UnixStream as StdStream,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use integration::{
    Behaviour, EventLog, PluginProc, Store, TestRuntime, container, cpu_update, create_request, pod,
    raw::{BarePlugin, RawBehaviour, RawPlugin, frame, ttrpc_message},
    spawn_plugin, test_plugin_bin,
};
use nri_adaptation::{AdaptationBuilder, EventMask, FailurePolicy, api};

/// One test at a time: they measure the whole process. (Async: it is held
/// across the test; a test that panics releases it.)
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Open file descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// Resident memory of this process in KiB (`VmRSS`), after asking the
/// allocator to return the free pages it keeps (glibc's `malloc_trim`), so
/// the figure is what is still allocated rather than what was once.
fn rss_kib() -> u64 {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// A started runtime whose update callback applies nothing and records
/// nothing (a flood of updates would otherwise grow the test's own store).
async fn runtime(tune: impl FnOnce(AdaptationBuilder) -> AdaptationBuilder) -> TestRuntime {
    counting_runtime(tune).await.0
}

/// [`runtime`] and the number of updates its update callback was given.
async fn counting_runtime(
    tune: impl FnOnce(AdaptationBuilder) -> AdaptationBuilder,
) -> (TestRuntime, Arc<AtomicUsize>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(Store::default()));
    let applied = Arc::new(AtomicUsize::new(0));
    let counted = applied.clone();
    let b = TestRuntime::builder(dir.path(), &store).with_update_fn(move |u| {
        counted.fetch_add(u.len(), Ordering::Relaxed);
        async { Ok(Vec::new()) }
    });
    let nri = tune(b).build().unwrap();
    nri.start().await.unwrap();
    (TestRuntime { nri, store, dir }, applied)
}

/// A real plugin process subscribed to CreateContainer, logging to `log`.
async fn good_plugin(rt: &TestRuntime, log: &EventLog) -> PluginProc {
    let b = Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        ..Default::default()
    };
    spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "good", &b)
}

/// Creates container `id` and checks that it took less than `bound` and
/// that 10-good saw it; returns the time it took.
async fn create_within(rt: &TestRuntime, log: &EventLog, id: &str, bound: Duration) -> Duration {
    let (p, c) = (pod("flood-p"), container("flood-p", id));
    let t0 = Instant::now();
    rt.nri.create_container(create_request(&p, &c)).await.unwrap();
    let took = t0.elapsed();
    assert!(took < bound, "CreateContainer({id}) took {took:?}, more than {bound:?}");
    assert!(
        log.of("10-good", "CreateContainer").iter().any(|l| l.container == id),
        "10-good did not get CreateContainer({id})"
    );
    took
}

/// Joins a bare plugin (on a blocking thread: its socket is blocking).
async fn bare(rt: &TestRuntime, name: &str, events: &str) -> BarePlugin {
    let (sock, name, events) = (rt.sock(), name.to_string(), EventMask::parse(events).unwrap());
    tokio::task::spawn_blocking(move || BarePlugin::join(&sock, "20", &name, events, Duration::from_secs(20)))
        .await
        .unwrap()
}

/// Whether the runtime closed `s` within `within` (reads EOF or an error;
/// whatever it sends before is drained).
fn closed_within(s: &mut StdStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// 1,000 connections that never register are each closed after the
/// registration timeout (not before), a plugin connecting during the flood
/// registers and gets creates, and afterwards the runtime's file
/// descriptors are back to where they were and its memory (after
/// `malloc_trim`) within 4 MiB of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_unregistered_connections_are_closed_and_freed() {
    let _serial = serial().await;
    const N: usize = 1000;
    let registration = Duration::from_secs(2);
    let rt = runtime(|b| b.with_registration_timeout(registration)).await;
    let log = rt.log("good.jsonl");
    let _good = good_plugin(&rt, &log).await;
    rt.wait_plugins(&["10-good"]).await;
    create_within(&rt, &log, "flood-c0", Duration::from_secs(2)).await;
    let (fds0, rss0) = (fds(), rss_kib());

    let sock = rt.sock();
    let t0 = Instant::now();
    // Blocking connects: one whose backlog is full waits for the accept.
    let clients = tokio::task::spawn_blocking(move || {
        (0..N)
            .map(|i| StdStream::connect(&sock).unwrap_or_else(|e| panic!("connection {i}: {e}")))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let connected = t0.elapsed();
    assert!(connected < registration, "1,000 connects took {connected:?}");
    // The runtime holds its end of each (ours are N of the count).
    integration::wait_until("the runtime to accept every connection", || fds() >= fds0 + 2 * N - 10).await;
    let (fds_peak, rss_peak) = (fds(), rss_kib());
    // Registration is not starved: a create goes through the good plugin
    // (and a second plugin could join) while all of them wait.
    create_within(&rt, &log, "flood-c1", Duration::from_secs(2)).await;
    let log2 = rt.log("late.jsonl");
    let late = Behaviour {
        log: Some(log2.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        ..Default::default()
    };
    let late_plugin = spawn_plugin(test_plugin_bin!(), &rt.sock(), "11", "late", &late);
    rt.wait_plugins(&["10-good", "11-late"]).await;
    assert!(
        t0.elapsed() < registration,
        "a plugin took until {:?} to join during the flood",
        t0.elapsed()
    );

    // Each one is closed by the runtime, none before its time is up.
    let (first_eof, clients) = tokio::task::spawn_blocking(move || {
        let mut clients = clients;
        let mut early = None;
        for (i, c) in clients.iter_mut().enumerate() {
            let mut probe = [0u8; 1];
            c.set_nonblocking(true).unwrap();
            if matches!(c.read(&mut probe), Ok(0)) && early.is_none() {
                early = Some((i, t0.elapsed()));
            }
            c.set_nonblocking(false).unwrap();
        }
        assert!(
            early.is_none(),
            "connections closed before the registration timeout: {early:?}"
        );
        let deadline = t0 + registration + Duration::from_secs(20);
        for (i, c) in clients.iter_mut().enumerate() {
            assert!(
                closed_within(c, deadline.saturating_duration_since(Instant::now())),
                "connection {i} still open {:?} after connecting",
                t0.elapsed()
            );
        }
        (t0.elapsed(), clients)
    })
    .await
    .unwrap();
    assert!(first_eof >= registration - Duration::from_millis(100));
    // Only our ends are left open.
    integration::wait_until("the runtime to close its ends", || fds() <= fds0 + N + 5).await;
    drop(clients);
    drop(late_plugin);
    rt.wait_plugins(&["10-good"]).await;
    integration::wait_until("fds back to where they were", || fds() <= fds0 + 2).await;
    create_within(&rt, &log, "flood-c2", Duration::from_secs(2)).await;
    // Freed memory is returned lazily: give the runtime's tasks a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (fds1, rss1) = (fds(), rss_kib());
    println!(
        "unregistered flood: {N} connections in {connected:?}, all closed by {first_eof:?}; \
         fds {fds0} -> {fds_peak} -> {fds1}; VmRSS {rss0} KiB -> {rss_peak} KiB -> {rss1} KiB"
    );
    assert!(fds1 <= fds0 + 2, "fds {fds0} before, {fds1} after");
    assert!(
        rss1 <= rss0 + 4 * 1024,
        "VmRSS {rss0} KiB before the flood, {rss1} KiB after"
    );
    rt.nri.stop().await;
}

/// What becomes of a plugin that sent garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The runtime closes its connection at once.
    Closed,
    /// It stays and keeps answering creates.
    Stays,
    /// The runtime notices at its next request to it: that request times
    /// out and the plugin is dropped.
    DroppedAtNextRequest,
}

/// A bare plugin that joined sends `bytes`; then creates go on (within
/// the request timeout, plus one second when the bad plugin is dropped at
/// the create) and memory stays within 32 MiB.
async fn after_registration(bytes: impl FnOnce() -> Vec<u8>, expect: Expect, what: &str) {
    let _serial = serial().await;
    let bytes = bytes();
    let timeout = Duration::from_secs(2);
    let rt = runtime(|b| b.with_request_timeout(timeout)).await;
    let log = rt.log("good.jsonl");
    let _good = good_plugin(&rt, &log).await;
    rt.wait_plugins(&["10-good"]).await;
    let p = bare(&rt, "bad", "CreateContainer").await;
    rt.wait_plugins(&["10-good", "20-bad"]).await;
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let mut p = tokio::task::spawn_blocking(move || {
        let mut p = p;
        // A peer that gave up on us may close while we still write.
        let _ = p.write(&bytes);
        p
    })
    .await
    .unwrap();
    match expect {
        Expect::Closed => {
            let mut s = p.stream.try_clone().unwrap();
            let closed = tokio::task::spawn_blocking(move || closed_within(&mut s, Duration::from_secs(10)))
                .await
                .unwrap();
            assert!(closed, "{what}: the runtime kept the connection open");
            rt.wait_plugins(&["10-good"]).await;
            println!("{what}: closed after {:?}", t0.elapsed());
            create_within(&rt, &log, "flood-g1", timeout).await;
        }
        Expect::Stays => {
            // It answers in a thread while the create runs.
            assert_eq!(rt.nri.plugin_names(), ["10-good", "20-bad"], "{what}");
            let serving = tokio::task::spawn_blocking(move || {
                let r = p.serve_until(Instant::now() + Duration::from_secs(20), |m, _| m == "CreateContainer");
                (p, r)
            });
            create_within(&rt, &log, "flood-g1", timeout).await;
            let (back, r) = serving.await.unwrap();
            r.unwrap_or_else(|e| panic!("{what}: the bad plugin got no create: {e}"));
            p = back;
            assert_eq!(rt.nri.plugin_names(), ["10-good", "20-bad"], "{what}");
        }
        Expect::DroppedAtNextRequest => {
            let took = create_within(&rt, &log, "flood-g1", timeout + Duration::from_secs(1)).await;
            assert_eq!(rt.nri.plugin_names(), ["10-good"], "{what}");
            println!("{what}: the next create took {took:?} and dropped the plugin");
            create_within(&rt, &log, "flood-g2", timeout).await;
        }
    }
    let rss1 = rss_kib();
    println!("{what}: VmRSS {rss0} KiB -> {rss1} KiB");
    assert!(rss1 <= rss0 + 32 * 1024, "{what}: VmRSS {rss0} KiB -> {rss1} KiB");
    rt.nri.stop().await;
    drop(p);
}

/// Noise after registration (read as a frame header: ~540 MB announced)
/// closes that plugin's connection at once; creates go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noise_after_registration_closes_that_plugin() {
    after_registration(|| b"this is not NRI, just noise\n".repeat(100), Expect::Closed, "noise").await;
}

/// A frame announcing more than 4 MiB + 10 bytes closes the connection at
/// once, before its payload is read or allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_after_registration_closes_that_plugin() {
    let header = || {
        let mut h = 2u32.to_be_bytes().to_vec();
        h.extend_from_slice(&(nri_proto::mux::MAX_PAYLOAD as u32 + 1).to_be_bytes());
        h
    };
    after_registration(header, Expect::Closed, "oversized frame").await;
}

/// Well-framed garbage on the Runtime service, 200 requests in one burst
/// (fewer than the 256 frames a connection may have waiting): requests
/// that are not protobuf, for unknown services and methods, with an even
/// stream id: each is answered with an error; the plugin stays and keeps
/// answering creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_answered_and_the_plugin_stays() {
    after_registration(malformed_requests, Expect::Stays, "malformed requests").await;
}

fn malformed_requests() -> Vec<u8> {
    let mut bytes = Vec::new();
    let unknown = |service: &str, method: &str| {
        let r = ttrpc::Request {
            service: service.into(),
            method: method.into(),
            ..Default::default()
        };
        protobuf::Message::write_to_bytes(&r).unwrap()
    };
    for i in 0..50u32 {
        let id = 1001 + 2 * i;
        bytes.extend(frame(2, &ttrpc_message(id, 1, &[0xff; 32])));
        bytes.extend(frame(
            2,
            &ttrpc_message(id, 1, &unknown("nri.pkg.api.v1alpha1.Runtime", "Nope")),
        ));
        bytes.extend(frame(2, &ttrpc_message(id, 1, &unknown("no.such.Service", "Nope"))));
        bytes.extend(frame(2, &ttrpc_message(2 * i + 2, 1, &[0u8; 8])));
    }
    bytes
}

/// A ttrpc message announcing more than 4 MiB, sent in legal frames: the
/// runtime discards it (answering an error) instead of holding it, and the
/// plugin stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_ttrpc_message_is_discarded() {
    after_registration(oversized_ttrpc_message, Expect::Stays, "oversized ttrpc message").await;
}

fn oversized_ttrpc_message() -> Vec<u8> {
    let len = (5 << 20) as u32;
    let mut msg = len.to_be_bytes().to_vec();
    msg.extend_from_slice(&7u32.to_be_bytes());
    msg.extend_from_slice(&[1, 0]);
    let mut bytes = frame(2, &msg);
    let chunk = vec![0x5a; 1 << 20];
    for _ in 0..5 {
        bytes.extend(frame(2, &chunk));
    }
    bytes
}

/// 64 MiB of maximal frames for a connection id nobody opened are read and
/// dropped one at a time: memory stays bounded and the plugin stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximal_frames_for_unknown_connection_are_dropped() {
    let frames = || frame(9, &vec![0xa5; nri_proto::mux::MAX_PAYLOAD]).repeat(16);
    after_registration(frames, Expect::Stays, "maximal frames for conn 9").await;
}

/// The runtime's own connection (the Plugin service, conn 1) fed a
/// response no request asked for and then a ttrpc header announcing
/// 4 GiB: the runtime's ttrpc client discards what follows, so the next
/// request to that plugin gets no answer; it fails after the request
/// timeout and the plugin is dropped. The create still finishes (the
/// good plugin's answer) within the request timeout plus slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_runtime_client_connection_closes_that_plugin() {
    let bytes = || {
        let mut b = frame(1, &ttrpc_message(999, 2, b"unasked"));
        b.extend(frame(1, b"\xff\xff\xff\xff not a ttrpc header"));
        b
    };
    after_registration(bytes, Expect::DroppedAtNextRequest, "garbage on conn 1").await;
}

/// A plugin sending UpdateContainers from 16 concurrent callers as fast as
/// the runtime answers them (thousands per second) while another plugin
/// gets creates: every create completes within the request timeout (2 s),
/// the flood is answered throughout, and memory stays within 32 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_containers_flood_does_not_starve_creates() {
    let _serial = serial().await;
    let timeout = Duration::from_secs(2);
    let rt = runtime(|b| b.with_request_timeout(timeout)).await;
    rt.add("flood-p", "flood-target");
    let log = rt.log("good.jsonl");
    let _good = good_plugin(&rt, &log).await;
    rt.wait_plugins(&["10-good"]).await;
    let flooder = RawPlugin::start(
        &rt.sock(),
        "20",
        "flooder",
        RawBehaviour {
            events: EventMask::parse("RemovePodSandbox").unwrap(),
            ..Default::default()
        },
    )
    .await;
    rt.wait_plugins(&["10-good", "20-flooder"]).await;
    let rss0 = rss_kib();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..16u64 {
        let (client, stop, sent) = (flooder.conn.runtime.clone(), stop.clone(), sent.clone());
        callers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = api::UpdateContainersRequest {
                    update: vec![cpu_update("flood-target", Some(2 + i), None)],
                    ..Default::default()
                };
                let ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
                client
                    .update_containers(ctx, &req)
                    .await
                    .expect("UpdateContainers answered");
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let t0 = Instant::now();
    let mut latencies = Vec::new();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(4) {
        n += 1;
        latencies.push(create_within(&rt, &log, &format!("flood-u{n}"), timeout).await);
    }
    let during = sent.load(Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    let rss1 = rss_kib();
    latencies.sort();
    let rate = during as f64 / elapsed.as_secs_f64();
    println!(
        "UpdateContainers flood: {during} answered in {elapsed:?} ({rate:.0}/s); {} creates, p50 {:?}, max {:?}; VmRSS {rss0} KiB -> {rss1} KiB",
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies.last().unwrap()
    );
    assert!(during >= 1000, "only {during} UpdateContainers answered in {elapsed:?}");
    assert!(rss1 <= rss0 + 32 * 1024, "VmRSS {rss0} KiB -> {rss1} KiB");
    assert_eq!(rt.nri.plugin_names(), ["10-good", "20-flooder"]);
    rt.nri.stop().await;
}

/// A plugin writing UpdateContainers requests without ever reading the
/// answers, paced so the runtime could read every request as it comes:
/// the runtime handles a few at a time and stops reading while its
/// answers cannot be written, the unread requests overflow the
/// connection's bounded queue and the connection is closed, with at most
/// 10,000 requests handled. Memory stays within 64 MiB; another plugin's
/// creates go on.
///
/// Before the gate (`adaptation/src/plugin/gate.rs`) the runtime read and
/// handled every request and kept a task per answer it could not write:
/// all 30,000 were taken, memory grew with each, and the connection stayed
/// open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_containers_flood_without_reading_answers_is_bounded() {
    let _serial = serial().await;
    let timeout = Duration::from_secs(2);
    let (rt, handled) = counting_runtime(|b| b.with_request_timeout(timeout)).await;
    rt.add("flood-p", "flood-target");
    let log = rt.log("good.jsonl");
    let _good = good_plugin(&rt, &log).await;
    rt.wait_plugins(&["10-good"]).await;
    let mut p = bare(&rt, "deaf", "RemovePodSandbox").await;
    rt.wait_plugins(&["10-good", "20-deaf"]).await;
    let rss0 = rss_kib();
    let peak = Arc::new(AtomicUsize::new(rss0 as usize));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib() as usize, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // Up to 30,000 requests, 100 per write; before the next write, wait
    // (up to 100 ms) for the runtime to have handled the last ones.
    const CAP: usize = 30_000;
    let counter = handled.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let update = api::UpdateContainersRequest {
            update: vec![cpu_update("flood-target", Some(7), None)],
            ..Default::default()
        };
        let mut written = 0;
        let deadline = Instant::now() + Duration::from_secs(40);
        while written < CAP && Instant::now() < deadline {
            let batch: Vec<u8> = (0..100).flat_map(|_| p.request("UpdateContainers", &update)).collect();
            if p.write(&batch).is_err() {
                return (written, true);
            }
            written += 100;
            let caught_up = Instant::now() + Duration::from_millis(100);
            while counter.load(Ordering::Relaxed) < written && Instant::now() < caught_up {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        (written, false)
    });
    // Meanwhile (and after), creates through the good plugin go on.
    let mut n = 0;
    while !writer.is_finished() {
        n += 1;
        create_within(&rt, &log, &format!("flood-d{n}"), timeout).await;
    }
    let (written, closed) = writer.await.unwrap();
    create_within(&rt, &log, "flood-d-after", timeout).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed) as u64;
    let handled = handled.load(Ordering::Relaxed);
    println!(
        "deaf flood: {written} requests written, {handled} handled, closed: {closed}; VmRSS {rss0} KiB, peak {peak} KiB"
    );
    assert!(
        closed,
        "the runtime took all {written} requests and kept the connection open"
    );
    assert!(handled <= 10_000, "{handled} requests handled");
    assert!(peak <= rss0 + 64 * 1024, "VmRSS {rss0} KiB before, peak {peak} KiB");
    rt.wait_plugins(&["10-good"]).await;
    rt.nri.stop().await;
}

/// A plugin that stops reading its socket while the runtime sends it a
/// large CreateContainer (512 KiB of annotations, more than the socket
/// buffers hold): the create returns within the request timeout (2 s)
/// plus 2 s (for the other plugin's answer to that large request),
/// the plugin is dropped (failure policy `ignore`), and later
/// creates and stop() are not held up by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_that_stops_reading_cannot_block_beyond_request_timeout() {
    non_reading(FailurePolicy::Ignore).await;
}

/// The same under failure policy `fail`, which keeps a plugin that only
/// timed out: the first create fails after the request timeout, and the
/// plugin is dropped with it, because the runtime's write to it was
/// abandoned halfway and its connection can carry nothing more; the next
/// creates succeed.
///
/// Before the trunk was closed with the runtime's client connection
/// (`ClientConn`), whether the plugin went depended on which error ttrpc
/// reported for the abandoned write: on "timeout" it was kept, broken, and
/// the second create failed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_that_stops_reading_with_policy_fail_is_bounded_too() {
    non_reading(FailurePolicy::Fail).await;
}

/// stop() while a plugin that stopped reading is still registered (policy
/// `fail` kept it after a create timed out): the Shutdown it is sent goes
/// unanswered, and stop() still returns within the request timeout plus
/// 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_is_not_held_up_by_a_plugin_that_stopped_reading() {
    let _serial = serial().await;
    let timeout = Duration::from_secs(1);
    let bound = timeout + Duration::from_secs(2);
    let rt = runtime(|b| {
        b.with_request_timeout(timeout)
            .with_failure_policy("20-mute", FailurePolicy::Fail)
    })
    .await;
    let p = bare(&rt, "mute", "CreateContainer").await;
    rt.wait_plugins(&["20-mute"]).await;
    let (pd, c) = (pod("flood-p"), container("flood-p", "flood-s1"));
    let r = rt.nri.create_container(create_request(&pd, &c)).await;
    assert!(r.is_err(), "the create answered by nobody succeeded");
    assert_eq!(
        rt.nri.plugin_names(),
        ["20-mute"],
        "a plugin that only timed out is kept under `fail`"
    );
    let t0 = Instant::now();
    rt.nri.stop().await;
    let took = t0.elapsed();
    println!("stop() with a plugin that does not read: {took:?}");
    assert!(took < bound, "stop() took {took:?}");
    drop(p);
}

async fn non_reading(policy: FailurePolicy) {
    let _serial = serial().await;
    let timeout = Duration::from_secs(2);
    let bound = timeout + Duration::from_secs(2);
    let rt = runtime(|b| b.with_request_timeout(timeout).with_failure_policy("20-mute", policy)).await;
    let log = rt.log("good.jsonl");
    let _good = good_plugin(&rt, &log).await;
    rt.wait_plugins(&["10-good"]).await;
    // Joined, and from now on never read.
    let p = bare(&rt, "mute", "CreateContainer").await;
    rt.wait_plugins(&["10-good", "20-mute"]).await;
    let big = |id: &str| {
        let (pd, mut c) = (pod("flood-p"), container("flood-p", id));
        for i in 0..16 {
            c.annotations.insert(format!("flood.example/{i}"), "x".repeat(32 << 10));
        }
        create_request(&pd, &c)
    };
    let mut outcomes = Vec::new();
    for i in 0..4 {
        let t0 = Instant::now();
        let r = rt.nri.create_container(big(&format!("flood-m{i}"))).await;
        let took = t0.elapsed();
        outcomes.push((took, r.is_ok(), rt.nri.plugin_names()));
        assert!(
            took < bound,
            "create {i} took {took:?} with a plugin that does not read ({outcomes:?})"
        );
        match (policy, i) {
            (FailurePolicy::Fail, 0) => assert!(r.is_err(), "the create answered by nobody succeeded"),
            _ => {
                r.unwrap_or_else(|e| panic!("create {i}: {e} ({outcomes:?})"));
            }
        }
        // ttrpc gives the wedged connection up on its own task, so the
        // plugin may leave a moment after the create's answer.
        let gone_by = Instant::now() + Duration::from_secs(1);
        while rt.nri.plugin_names() != ["10-good"] && Instant::now() < gone_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rt.nri.plugin_names(), ["10-good"], "after create {i}: {outcomes:?}");
    }
    println!("{policy:?}: creates (time, ok, plugins after): {outcomes:#?}");
    // The plugin is gone by now, whatever the policy; creates are quick.
    assert_eq!(rt.nri.plugin_names(), ["10-good"], "{outcomes:?}");
    create_within(&rt, &log, "flood-m-after", timeout).await;
    let t0 = Instant::now();
    rt.nri.stop().await;
    assert!(t0.elapsed() < bound, "stop() took {:?}", t0.elapsed());
    drop(p);
}
