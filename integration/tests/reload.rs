//! Reconfiguring a running adaptation (`Adaptation::reconfigure`,
//! `rescan_plugins`) with real plugin processes: plugins added to the
//! plugin directory join synchronized, removed ones stop, changed settings
//! restart launched plugins, socket changes wait for a restart, and a bad
//! plugin directory changes nothing.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use integration::{
    Behaviour, EventLog, Store, TestRuntime, container, create_request, install_plugin, pod, test_plugin_bin,
};

fn logging(log: &EventLog) -> Behaviour {
    Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        ..Default::default()
    }
}

fn install(rt: &TestRuntime, file_name: &str, b: &Behaviour) {
    install_plugin(
        test_plugin_bin!(),
        &rt.dir.path().join("plugins"),
        &rt.dir.path().join("conf.d"),
        file_name,
        b,
    );
}

fn events_of(log: &EventLog, plugin: &str) -> Vec<String> {
    log.lines()
        .into_iter()
        .filter(|l| l.plugin == plugin)
        .map(|l| match l.event.as_str() {
            "Synchronize" => format!("Synchronize {:?} {:?}", l.pods, l.containers),
            "CreateContainer" => format!("CreateContainer {}", l.container),
            e => e.to_string(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconfigure_adds_removes_and_restarts_preinstalled_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = TestRuntime::builder(dir.path(), &store).build().unwrap();
    let rt = TestRuntime { nri, store, dir };
    let log = rt.log("events.jsonl");
    install(&rt, "10-a", &logging(&log));
    let (p0, c0) = (pod("p0"), container("p0", "c0"));
    rt.store.lock().unwrap().pods.insert("p0".into(), p0.clone());
    rt.store.lock().unwrap().containers.insert("c0".into(), c0.clone());
    rt.nri.start().await.unwrap();
    assert_eq!(rt.nri.plugin_names(), ["10-a"]);

    // Nothing changed: nothing happens.
    let r = rt.nri.rescan_plugins().await.unwrap();
    assert!(r.is_empty(), "{r:?}");

    // A new file joins, synchronized with the existing pod and container
    // before its first event.
    install(&rt, "20-b", &logging(&log));
    let r = rt.nri.rescan_plugins().await.unwrap();
    assert_eq!(
        (r.started.as_slice(), r.stopped.as_slice()),
        (&["20-b".to_string()][..], &[][..])
    );
    assert_eq!(rt.nri.plugin_names(), ["10-a", "20-b"]);
    rt.nri
        .create_container(create_request(&p0, &container("p0", "c1")))
        .await
        .unwrap();
    assert_eq!(
        events_of(&log, "20-b"),
        ["Configure", r#"Synchronize ["p0"] ["c0"]"#, "CreateContainer c1"]
    );
    assert_eq!(log.of("10-a", "Configure").len(), 1, "10-a untouched");

    // Its file removed: the plugin is shut down and its process ends.
    std::fs::remove_file(rt.dir.path().join("plugins/10-a")).unwrap();
    let r = rt.nri.rescan_plugins().await.unwrap();
    assert_eq!(
        (r.started.as_slice(), r.stopped.as_slice()),
        (&[][..], &["10-a".to_string()][..])
    );
    assert_eq!(rt.nri.plugin_names(), ["20-b"]);
    log.wait_for("10-a exits", |l| {
        l.iter().any(|x| x.plugin == "10-a" && x.event == "Exit")
    })
    .await;

    // New timeouts: the launched plugin is restarted and configured with them.
    let mut opts = (*rt.nri.options()).clone();
    opts.request_timeout = Duration::from_millis(1500);
    let r = rt.nri.reconfigure(opts.clone()).await.unwrap();
    assert_eq!(
        (r.started.as_slice(), r.stopped.as_slice()),
        (&["20-b".to_string()][..], &["20-b".to_string()][..])
    );
    let configures = log.of("20-b", "Configure");
    assert_eq!(configures.len(), 2);
    assert_eq!(configures[1].timeouts_ms, (5000, 1500));
    assert_eq!(rt.nri.options().request_timeout, Duration::from_millis(1500));

    // The socket cannot move under connected plugins: reported, kept.
    let old_socket = rt.nri.options().socket_path.clone();
    let mut moved = opts.clone();
    moved.socket_path = rt.dir.path().join("elsewhere.sock");
    let r = rt.nri.reconfigure(moved).await.unwrap();
    assert_eq!(r.needs_restart, ["socket_path"]);
    assert_eq!(rt.nri.options().socket_path, old_socket);
    assert!(old_socket.exists() && !rt.dir.path().join("elsewhere.sock").exists());

    // An unreadable plugin directory: an error naming it, nothing changed.
    let mut bad = opts.clone();
    bad.plugin_path = rt.dir.path().join("events.jsonl");
    bad.request_timeout = Duration::from_secs(9);
    let e = rt.nri.reconfigure(bad).await.unwrap_err();
    assert!(e.to_string().contains("events.jsonl"), "{e}");
    assert_eq!(rt.nri.options().request_timeout, Duration::from_millis(1500));
    assert_eq!(rt.nri.plugin_names(), ["20-b"]);
    rt.nri.stop().await;
}
