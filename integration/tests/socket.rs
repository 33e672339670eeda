//! The external plugin socket: directory creation, stale sockets, errors
//! naming the path, and disabled connections (R21).

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::Path,
    sync::{Arc, Mutex},
};

use integration::{
    Behaviour, EventLog, Store, TestRuntime, container, create_request, install_plugin, pod, spawn_plugin,
    test_plugin_bin,
};
use nri_adaptation::Adaptation;

fn build(dir: &Path, socket: &Path, disabled: bool) -> Adaptation {
    let store = Arc::new(Mutex::new(Store::default()));
    let mut b = TestRuntime::builder(dir, &store).with_socket_path(socket);
    if disabled {
        b = b.with_disabled_connections();
    }
    b.build().unwrap()
}

fn logging(log: &EventLog) -> Behaviour {
    Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("RunPodSandbox,CreateContainer".into()),
        ..Default::default()
    }
}

/// Spawns an external plugin on `socket`, waits for it to register and
/// checks it gets CreateContainer.
async fn assert_external_plugin_works(nri: &Adaptation, socket: &Path, log: &EventLog) {
    let _p = spawn_plugin(test_plugin_bin!(), socket, "10", "a", &logging(log));
    integration::wait_plugins(nri, &["10-a"]).await;
    let (p, c) = (pod("p1"), container("p1", "c1"));
    nri.create_container(create_request(&p, &c)).await.unwrap();
    assert_eq!(log.of("10-a", "CreateContainer").len(), 1);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// R21 A: missing parent directories are created with mode 0700 and the
/// listener accepts plugins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_socket_parent_created_0700_and_listener_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a/b/run/nri.sock");
    let nri = build(dir.path(), &socket, false);
    nri.start().await.unwrap();
    for d in ["a", "a/b", "a/b/run"] {
        assert_eq!(mode(&dir.path().join(d)), 0o700, "mode of {d}");
    }
    assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket());
    assert_external_plugin_works(&nri, &socket, &EventLog::new(dir.path().join("l.jsonl"))).await;
    nri.stop().await;
}

/// R21 B: a stale socket file left at the path (a previous run that died)
/// is replaced; start succeeds and plugins register.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/nri.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "the stale socket file stays behind");
    // Nobody listens on it any more.
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());

    let nri = build(dir.path(), &socket, false);
    nri.start().await.expect("a stale socket does not fail the start");
    assert_external_plugin_works(&nri, &socket, &EventLog::new(dir.path().join("l.jsonl"))).await;
    nri.stop().await;
}

/// R21 D: the path is only ever replaced when it is a stale socket: a
/// regular file there, or a socket another process still listens on (a
/// second runtime on the default path), fails the start naming the path
/// and is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_live_socket_or_non_socket_at_the_path_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "precious").unwrap();
    let nri = build(dir.path(), &file, false);
    let text = nri
        .start()
        .await
        .expect_err("a regular file is not a socket")
        .to_string();
    assert!(
        text.contains(&file.display().to_string()) && text.contains("not a socket"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");

    let socket = dir.path().join("live.sock");
    let first = build(dir.path(), &socket, false);
    first.start().await.unwrap();
    let second = build(dir.path(), &socket, false);
    let text = second.start().await.expect_err("the socket is in use").to_string();
    assert!(
        text.contains(&socket.display().to_string()) && text.contains("listens"),
        "{text}"
    );
    assert!(!second.is_running());
    assert_external_plugin_works(&first, &socket, &EventLog::new(dir.path().join("l.jsonl"))).await;
    first.stop().await;
    assert!(!socket.exists(), "stop removes its own socket");
}

/// A listener that never accepts (a hung runtime: its backlog is full)
/// does not hang the start in connect(): the start fails within the
/// handover time, naming the path and saying the listener accepts nothing,
/// and the socket stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_that_never_accepts_fails_the_start_in_bounded_time() {
    use std::os::fd::AsRawFd as _;

    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, listen, socket};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hung.sock");
    let hung = socket(AddressFamily::Unix, SockType::Stream, SockFlag::empty(), None).unwrap();
    let addr = UnixAddr::new(&path).unwrap();
    bind(hung.as_raw_fd(), &addr).unwrap();
    listen(&hung, Backlog::new(0).unwrap()).unwrap();
    // Fill the backlog: the next connect would block (or fail with EAGAIN).
    let mut queued = Vec::new();
    loop {
        let c = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).unwrap();
        match connect(c.as_raw_fd(), &addr) {
            Ok(()) => queued.push(c),
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
    }

    let nri = build(dir.path(), &path, false);
    let started = std::time::Instant::now();
    let start = tokio::spawn(async move { nri.start().await.map_err(|e| e.to_string()) });
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), start)
        .await
        .expect("start hangs on a listener that never accepts")
        .unwrap()
        .expect_err("the socket is in use");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        text.contains(&path.display().to_string()) && text.contains("accepts no connections"),
        "{text}"
    );
    assert!(path.exists(), "the live socket was removed");
    drop((queued, hung));
}

/// A successor that took the path over keeps its socket when the
/// predecessor stops (the daemon handover of the shim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_leaves_a_successors_socket_alone() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let old = build(dir.path(), &socket, false);
    old.start().await.unwrap();
    std::fs::remove_file(&socket).unwrap();
    let _successor = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    old.stop().await;
    assert!(socket.exists(), "the successor's socket was removed");
}

/// R21 C: when the socket's directory cannot be created, start fails with
/// an error naming the socket path, never a silently missing socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_uncreatable_socket_dir_fails_start_naming_path() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "a regular file").unwrap();
    let socket = blocker.join("run/nri.sock");
    let nri = build(dir.path(), &socket, false);
    let err = nri.start().await.expect_err("the socket cannot be created");
    let text = err.to_string();
    assert!(
        text.contains(&socket.display().to_string()),
        "error names the socket path: {text}"
    );
    assert!(!nri.is_running());
    assert!(nri.plugin_names().is_empty());
}

/// R21 C with a pre-installed plugin: the failed start leaves nothing
/// running; the launched plugin is killed and reaped before start returns
/// (10 rounds, as a race between two killers is what would break it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_failed_start_leaves_no_plugin_process() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::new(dir.path().join("events.jsonl"));
    install_plugin(
        test_plugin_bin!(),
        &dir.path().join("plugins"),
        &dir.path().join("conf.d"),
        "05-logger",
        &logging(&log),
    );
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "a regular file").unwrap();
    let socket = blocker.join("nri.sock");
    let nri = build(dir.path(), &socket, false);
    let mut left = Vec::new();
    for round in 0..10 {
        let err = nri.start().await.expect_err("the socket cannot be created");
        assert!(err.to_string().contains(&socket.display().to_string()));
        assert!(!nri.is_running());
        assert!(nri.plugin_names().is_empty());
        // The plugin was launched (it logged Configure before start
        // returned); look at its process right away.
        let cfgs = log.of("05-logger", "Configure");
        assert_eq!(cfgs.len(), round + 1, "launched once per start");
        let pid = cfgs[round].startup["pid"].as_u64().unwrap();
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let state = status
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or("")
                .to_string();
            left.push(format!("round {round}: pid {pid} {state}"));
        }
    }
    assert!(
        left.is_empty(),
        "launched plugin still there after the failed start returned: {left:#?}"
    );
}

/// R21 D: with external connections disabled no socket appears, and
/// pre-installed plugins still get events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r21_disabled_connections_no_socket_preinstalled_works() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::new(dir.path().join("events.jsonl"));
    install_plugin(
        test_plugin_bin!(),
        &dir.path().join("plugins"),
        &dir.path().join("conf.d"),
        "05-logger",
        &logging(&log),
    );
    let socket = dir.path().join("run/nri.sock");
    let nri = build(dir.path(), &socket, true);
    nri.start().await.unwrap();
    assert!(!socket.exists(), "no socket with connections disabled");
    assert_eq!(nri.plugin_names(), ["05-logger"]);
    let p = pod("p1");
    nri.run_pod_sandbox(&p).await.unwrap();
    nri.create_container(create_request(&p, &container("p1", "c1")))
        .await
        .unwrap();
    let seen: Vec<String> = log
        .lines()
        .into_iter()
        .map(|l| l.event)
        .filter(|e| e != "Configure" && e != "Synchronize")
        .collect();
    assert_eq!(seen, ["RunPodSandbox", "CreateContainer"]);
    nri.stop().await;
    assert!(!socket.exists());
}
