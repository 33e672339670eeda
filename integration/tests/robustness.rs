//! Misbehaving connections and plugins: garbage, oversized frames, silent
//! connections, bad or duplicate registrations, old plugins, and Shutdown.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use integration::{
    Behaviour, EventLog, Store, TestRuntime, container, create_request, pod,
    raw::{EventRpcs, RawBehaviour, RawConn, RawPlugin, RawService, Recorder, frame, read_until_closed},
    spawn_plugin, test_plugin_bin,
};
use nri_adaptation::{AdaptationBuilder, EventMask, api::Event};
use tokio::{io::AsyncWriteExt as _, net::UnixStream};

async fn runtime(tune: impl FnOnce(AdaptationBuilder) -> AdaptationBuilder) -> TestRuntime {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = tune(TestRuntime::builder(dir.path(), &store)).build().unwrap();
    nri.start().await.unwrap();
    TestRuntime { nri, store, dir }
}

fn logging(log: &EventLog) -> Behaviour {
    Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        ..Default::default()
    }
}

/// Creates container `id` and checks that `plugin` (logging to `log`) saw it.
async fn assert_gets_create(rt: &TestRuntime, log: &EventLog, plugin: &str, id: &str) {
    let (p, c) = (pod("p1"), container("p1", id));
    rt.nri.create_container(create_request(&p, &c)).await.unwrap();
    assert!(
        log.of(plugin, "CreateContainer").iter().any(|l| l.container == id),
        "{plugin} did not get CreateContainer({id})"
    );
}

/// Garbage on the socket costs the runtime that connection only: it is
/// closed, and a well-behaved plugin connecting meanwhile registers and
/// works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_drop_connection_and_others_still_work() {
    let rt = runtime(|b| b.with_registration_timeout(Duration::from_secs(1))).await;
    // Plain noise: read as a frame header it announces ~540 MB.
    let mut noise = UnixStream::connect(rt.sock()).await.unwrap();
    noise
        .write_all(b"this is not an NRI plugin, just noise\n")
        .await
        .unwrap();
    // Well-framed mux traffic carrying garbage ttrpc on the Runtime service
    // connection, plus frames for a connection id nobody uses.
    let mut ttrpc_garbage = UnixStream::connect(rt.sock()).await.unwrap();
    let mut bytes = frame(7, b"for nobody");
    let mut msg = Vec::new();
    msg.extend_from_slice(&16u32.to_be_bytes()); // ttrpc length
    msg.extend_from_slice(&1u32.to_be_bytes()); // stream id
    msg.extend_from_slice(&[1, 0]); // request, no flags
    msg.extend_from_slice(&[0xff; 16]); // not a protobuf Request
    bytes.extend(frame(2, &msg));
    ttrpc_garbage.write_all(&bytes).await.unwrap();

    let log = rt.log("events.jsonl");
    let _good = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log));
    rt.wait_plugins(&["10-a"]).await;
    assert_gets_create(&rt, &log, "10-a", "c1").await;

    // Both garbage connections are closed by the runtime (at the latest
    // when their registration time is up).
    read_until_closed(&mut noise, Duration::from_secs(10)).await;
    read_until_closed(&mut ttrpc_garbage, Duration::from_secs(10)).await;
    assert_eq!(rt.nri.plugin_names(), ["10-a"]);
    assert_gets_create(&rt, &log, "10-a", "c2").await;
    rt.nri.stop().await;
}

/// A frame header announcing more than 4 MiB + 10 bytes is a protocol error:
/// the connection is closed at once, not after the registration timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_header_closes_connection() {
    let rt = runtime(|b| b.with_registration_timeout(Duration::from_secs(30))).await;
    let mut s = UnixStream::connect(rt.sock()).await.unwrap();
    let too_big = nri_proto::mux::MAX_PAYLOAD as u32 + 1;
    let mut header = Vec::new();
    header.extend_from_slice(&1u32.to_be_bytes());
    header.extend_from_slice(&too_big.to_be_bytes());
    s.write_all(&header).await.unwrap();
    let t0 = Instant::now();
    read_until_closed(&mut s, Duration::from_secs(10)).await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(rt.nri.plugin_names().is_empty());

    // The listener is unaffected.
    let log = rt.log("events.jsonl");
    let _good = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log));
    rt.wait_plugins(&["10-a"]).await;
    rt.nri.stop().await;
}

/// Frames for a connection id nobody opened are dropped without tearing
/// down the trunk: a plugin sending them first still registers and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_for_unknown_connection_are_dropped() {
    let rt = runtime(|b| b).await;
    let recorder = Arc::new(Recorder::default());
    let mut preamble = frame(7, b"hello?");
    preamble.extend(frame(7, &[0u8; 1000]));
    preamble.extend(frame(3, b""));
    let conn = RawConn::connect_with_preamble(
        &rt.sock(),
        &preamble,
        RawService::new(
            RawBehaviour {
                events: EventMask::parse("CreateContainer").unwrap(),
                ..Default::default()
            },
            recorder.clone(),
        ),
    )
    .await;
    conn.register("10", "a").await.unwrap();
    rt.wait_plugins(&["10-a"]).await;
    let (p, c) = (pod("p1"), container("p1", "c1"));
    rt.nri.create_container(create_request(&p, &c)).await.unwrap();
    assert_eq!(recorder.of("CreateContainer").len(), 1);
    assert!(!conn.is_closed());
    rt.nri.stop().await;
}

/// A connection that never registers is closed after the registration
/// timeout and never configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_connection_closed_after_registration_timeout() {
    let timeout = Duration::from_millis(300);
    let rt = runtime(|b| b.with_registration_timeout(timeout)).await;
    let recorder = Arc::new(Recorder::default());
    let t0 = Instant::now();
    let conn = RawConn::connect(&rt.sock(), RawService::new(RawBehaviour::default(), recorder.clone())).await;
    conn.wait_closed().await;
    let waited = t0.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(50),
        "closed after {waited:?}, before the registration timeout"
    );
    assert!(waited < Duration::from_secs(10), "closed only after {waited:?}");
    assert!(recorder.seen().is_empty(), "never configured: {recorder:?}");
    assert!(rt.nri.plugin_names().is_empty());
    rt.nri.stop().await;
}

/// A second plugin registering the same index and name is refused (its stub
/// fails to start); the first keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_index_and_name_is_refused() {
    let rt = runtime(|b| b).await;
    let (log1, log2) = (rt.log("first.jsonl"), rt.log("second.jsonl"));
    let _first = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log1));
    rt.wait_plugins(&["10-a"]).await;
    let mut second = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log2));
    let failed = log2.wait_event("10-a", "StartFailed").await;
    assert!(
        failed.error.contains("already registered"),
        "refusal reason: {}",
        failed.error
    );
    assert_eq!(second.wait_exit().await, Some(1));
    assert!(log2.of("10-a", "Configure").is_empty());
    assert_eq!(rt.nri.plugin_names(), ["10-a"]);
    assert_gets_create(&rt, &log1, "10-a", "c1").await;
    rt.nri.stop().await;
}

/// The duplicate check also covers a plugin that registered but is still
/// being configured and synchronized: a second `10-a` registering while the
/// first sits in Synchronize is refused, and only one `10-a` becomes active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_registration_during_first_handshake_is_refused() {
    let rt = runtime(|b| b.with_request_timeout(Duration::from_secs(10))).await;
    let first = RawPlugin::start(
        &rt.sock(),
        "10",
        "a",
        RawBehaviour {
            events: EventMask::parse("CreateContainer").unwrap(),
            // Scripted slowness: keeps 10-a in its handshake while the
            // second one registers.
            sync_delay: Some(Duration::from_millis(1500)),
            ..Default::default()
        },
    )
    .await;
    first
        .recorder
        .wait_for("10-a in Synchronize", |s| s.iter().any(|x| x.method == "Synchronize"))
        .await;
    assert!(rt.nri.plugin_names().is_empty(), "10-a is not active yet");
    let second_seen = Arc::new(Recorder::default());
    let second = RawConn::connect(
        &rt.sock(),
        RawService::new(
            RawBehaviour {
                events: EventMask::parse("CreateContainer").unwrap(),
                ..Default::default()
            },
            second_seen.clone(),
        ),
    )
    .await;
    let verdict = second.register("10", "a").await;
    integration::wait_until("10-a active", || rt.nri.plugin_names().iter().any(|n| n == "10-a")).await;
    // Give a wrongly accepted second 10-a the time to finish its own
    // (immediate) sync and show up, after the first one became active.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        verdict.is_err(),
        "second 10-a accepted while the first was synchronizing; active: {:?}, second saw {:?}",
        rt.nri.plugin_names(),
        second_seen.seen().iter().map(|s| s.method.clone()).collect::<Vec<_>>()
    );
    assert_eq!(rt.nri.plugin_names(), ["10-a"]);
    rt.nri.stop().await;
}

/// Names outside `[a-zA-Z0-9_.+-]` and indices that are not two digits are
/// refused and the connection is closed; the reference's valid example
/// name is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_name_or_index_is_refused() {
    let rt = runtime(|b| b).await;
    for (idx, name) in [("10", "foo,bar"), ("1", "ok"), ("100", "ok"), ("10", "")] {
        let conn = RawConn::connect(&rt.sock(), RawService::new(RawBehaviour::default(), Arc::default())).await;
        let err = conn
            .register(idx, name)
            .await
            .expect_err("registration must be refused");
        let text = format!("{err:?}");
        if name == "foo,bar" {
            assert!(text.contains("foo,bar"), "names the bad name: {text}");
        }
        conn.wait_closed().await;
        assert!(rt.nri.plugin_names().is_empty());
    }
    let ok = RawPlugin::start(
        &rt.sock(),
        "10",
        "abcd-0123+EFGH_4567.ijkl",
        RawBehaviour {
            events: EventMask::parse("CreateContainer").unwrap(),
            ..Default::default()
        },
    )
    .await;
    rt.wait_plugins(&["10-abcd-0123+EFGH_4567.ijkl"]).await;
    assert!(!ok.conn.is_closed());
    rt.nri.stop().await;
}

/// RegisterPlugin twice on one connection: the second call fails (no
/// renaming), the plugin stays registered under its first identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_twice_on_one_connection_fails() {
    let rt = runtime(|b| b).await;
    let plugin = RawPlugin::start(
        &rt.sock(),
        "10",
        "a",
        RawBehaviour {
            events: EventMask::parse("CreateContainer").unwrap(),
            ..Default::default()
        },
    )
    .await;
    rt.wait_plugins(&["10-a"]).await;
    plugin
        .conn
        .register("20", "b")
        .await
        .expect_err("second RegisterPlugin");
    plugin
        .conn
        .register("10", "a")
        .await
        .expect_err("repeating the same identity");
    assert_eq!(rt.nri.plugin_names(), ["10-a"]);
    let (p, c) = (pod("p1"), container("p1", "c1"));
    rt.nri.create_container(create_request(&p, &c)).await.unwrap();
    assert_eq!(plugin.recorder.of("CreateContainer").len(), 1);
    rt.nri.stop().await;
}

async fn old_plugin_events(event_rpcs: EventRpcs) {
    let rt = runtime(|b| b).await;
    let plugin = RawPlugin::start(
        &rt.sock(),
        "10",
        "old",
        RawBehaviour {
            events: EventMask::parse(
                "RunPodSandbox,CreateContainer,PostCreateContainer,StartContainer,\
                 PostStartContainer,RemoveContainer,StopPodSandbox,RemovePodSandbox",
            )
            .unwrap(),
            event_rpcs,
            ..Default::default()
        },
    )
    .await;
    rt.wait_plugins(&["10-old"]).await;
    let (p, c) = (pod("p1"), container("p1", "c1"));
    let nri = &rt.nri;
    nri.run_pod_sandbox(&p).await.unwrap();
    nri.create_container(create_request(&p, &c)).await.unwrap();
    nri.post_create_container(&p, &c).await.unwrap();
    nri.start_container(&p, &c).await.unwrap();
    nri.post_start_container(&p, &c).await.unwrap();
    nri.remove_container(&p, &c).await.unwrap();
    nri.stop_pod_sandbox(&p).await.unwrap();
    nri.remove_pod_sandbox(&p).await.unwrap();

    let seen: Vec<String> = plugin
        .recorder
        .seen()
        .into_iter()
        .filter(|s| s.method != "Configure" && s.method != "Synchronize")
        .map(|s| match s.state_event {
            Some(e) => format!("StateChange({}) {}/{}", e as i32, s.pod, s.container),
            None if s.refused => format!("refused {}", s.method),
            None => format!("{} {}/{}", s.method, s.pod, s.container),
        })
        .collect();
    let sc = |e: Event, ctr: &str| format!("StateChange({}) p1/{ctr}", e as i32);
    assert_eq!(
        seen,
        [
            // One refusal switches the plugin to StateChange for good.
            "refused RunPodSandbox".to_string(),
            sc(Event::RUN_POD_SANDBOX, ""),
            // CreateContainer has no fallback: it still comes directly.
            "CreateContainer p1/c1".to_string(),
            sc(Event::POST_CREATE_CONTAINER, "c1"),
            sc(Event::START_CONTAINER, "c1"),
            sc(Event::POST_START_CONTAINER, "c1"),
            sc(Event::REMOVE_CONTAINER, "c1"),
            sc(Event::STOP_POD_SANDBOX, ""),
            sc(Event::REMOVE_POD_SANDBOX, ""),
        ]
    );
    assert_eq!(rt.nri.plugin_names(), ["10-old"]);
    rt.nri.stop().await;
}

/// A pre-v0.12 Go plugin answers the dedicated event RPCs with Unimplemented
/// and gets those events through StateChange; CreateContainer stays direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_plugin_unimplemented_gets_events_via_state_change() {
    old_plugin_events(EventRpcs::Unimplemented).await;
}

/// The same for a ttrpc-rust plugin without the methods (NOT_FOUND "... is
/// not supported").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_plugin_not_supported_gets_events_via_state_change() {
    old_plugin_events(EventRpcs::NotSupported).await;
}

/// stop() asks plugins to shut down: the stub plugin logs Shutdown and
/// exits with status 0 (a deliberate shutdown, not a lost connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_shutdown_and_stub_exits_cleanly() {
    let rt = runtime(|b| b).await;
    let log = rt.log("events.jsonl");
    let mut proc = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log));
    rt.wait_plugins(&["10-a"]).await;
    rt.nri.stop().await;
    log.wait_event("10-a", "Shutdown").await;
    assert_eq!(proc.wait_exit().await, Some(0));
    let exit = log.wait_event("10-a", "Exit").await;
    assert_eq!(exit.error, "", "clean exit");
    assert!(rt.nri.plugin_names().is_empty());
    assert!(!rt.sock().exists(), "stop removes the socket file");
}

/// A raw plugin's UpdateContainers goes to the runtime's update callback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_update_containers_reaches_update_callback() {
    let rt = runtime(|b| b).await;
    rt.add("p1", "c1");
    let plugin = RawPlugin::start(
        &rt.sock(),
        "10",
        "a",
        RawBehaviour {
            events: EventMask::parse("CreateContainer").unwrap(),
            ..Default::default()
        },
    )
    .await;
    rt.wait_plugins(&["10-a"]).await;
    let u = integration::cpu_update("c1", Some(7), None);
    let nope = integration::cpu_update("nope", Some(7), None);
    let failed = plugin
        .conn
        .update_containers(vec![u.clone(), nope.clone()])
        .await
        .unwrap();
    assert_eq!(failed, vec![nope]);
    assert_eq!(rt.store.lock().unwrap().applied, vec![u.clone()]);
    assert_eq!(
        rt.store.lock().unwrap().resources("c1"),
        u.linux.resources.clone().into_option()
    );
    rt.nri.stop().await;
}
