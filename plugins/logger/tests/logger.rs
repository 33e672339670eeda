//! The real `nri-logger` binary against a real `Adaptation` on a temp
//! socket: every event it receives becomes one JSON line (and one text line
//! on stderr), as an external plugin and as a pre-installed one.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use integration::{PluginProc, Store, TestRuntime, create_request};
use nri_adaptation::{api, convert::container_from_spec};
use nri_logger::Record;
use oci_spec::runtime::Spec;

const BIN: &str = env!("CARGO_BIN_EXE_nri-logger");

fn busybox() -> Spec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/oci/busybox.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A temp dir on the file system of the built binary (see the adjuster's
/// tests: installing is then a hard link, never a copy racing an exec).
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn runtime(dir: tempfile::TempDir) -> TestRuntime {
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = TestRuntime::builder(dir.path(), &store)
        .with_request_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    TestRuntime { nri, store, dir }
}

fn web_pod() -> api::PodSandbox {
    api::PodSandbox {
        id: "p1".into(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "p1-uid".into(),
        ..Default::default()
    }
}

fn records(path: &Path) -> Vec<Record> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// Waits (20 s deadline) until the log's last record is `event`.
async fn wait_last(path: &Path, event: &str) -> Vec<Record> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let recs = records(path);
        if recs.last().is_some_and(|r| r.event == event) {
            return recs;
        }
        assert!(Instant::now() < deadline, "no {event} line in time; log: {recs:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn events(recs: &[Record]) -> Vec<&str> {
    recs.iter().map(|r| r.event.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_logger_writes_one_line_per_event() {
    let rt = runtime(tempdir());
    rt.nri.start().await.unwrap();
    let log: PathBuf = rt.dir.path().join("events.jsonl");
    let mut child = Command::new(BIN)
        .arg("--socket-path")
        .arg(rt.sock())
        .args(["--idx", "99", "--name", "logger", "--log-file"])
        .arg(&log)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut plugin = PluginProc { child };
    rt.wait_plugins(&["99-logger"]).await;

    let pod = web_pod();
    let ctr = container_from_spec("c1", "p1", "app", &busybox());
    let nri = &rt.nri;
    nri.run_pod_sandbox(&pod).await.unwrap();
    nri.create_container(create_request(&pod, &ctr)).await.unwrap();
    nri.post_create_container(&pod, &ctr).await.unwrap();
    nri.start_container(&pod, &ctr).await.unwrap();
    let mut resources = api::LinuxResources::new();
    resources
        .memory
        .mut_or_insert_default()
        .limit
        .mut_or_insert_default()
        .value = 512 << 20;
    resources.cpu.mut_or_insert_default().cpus = "0-1".into();
    nri.update_container(api::UpdateContainerRequest {
        pod: protobuf::MessageField::some(pod.clone()),
        container: protobuf::MessageField::some(ctr.clone()),
        linux_resources: protobuf::MessageField::some(resources),
        ..Default::default()
    })
    .await
    .unwrap();
    nri.stop_container(api::StopContainerRequest {
        pod: protobuf::MessageField::some(pod.clone()),
        container: protobuf::MessageField::some(ctr.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    nri.remove_container(&pod, &ctr).await.unwrap();
    nri.stop_pod_sandbox(&pod).await.unwrap();
    nri.remove_pod_sandbox(&pod).await.unwrap();
    nri.stop().await;

    let recs = wait_last(&log, "Shutdown").await;
    assert_eq!(
        events(&recs),
        [
            "Configure",
            "Synchronize",
            "RunPodSandbox",
            "CreateContainer",
            "ValidateContainerAdjustment",
            "PostCreateContainer",
            "StartContainer",
            "UpdateContainer",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox",
            "Shutdown",
        ]
    );
    assert_eq!(recs[0].runtime.as_deref(), Some("nri-test-runtime/1.2.3"));
    assert_eq!((recs[1].pods, recs[1].containers), (Some(0), Some(0)));

    let run = &recs[2];
    let p = run.pod.as_ref().unwrap();
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str(), p.id.as_str()),
        ("default", "web", "p1")
    );
    assert!(run.container.is_none());

    let create = &recs[3];
    let c = create.container.as_ref().unwrap();
    assert_eq!((c.name.as_str(), c.id.as_str()), ("app", "c1"));
    assert_eq!(create.pod.as_ref().unwrap().id, "p1");
    assert_eq!((create.annotations, create.env), (Some(5), Some(3)));
    let res = create.resources.as_ref().unwrap();
    assert_eq!(res["memory.limit"], 268_435_456);
    assert_eq!(res["cpu.shares"], 1024);
    assert_eq!(res["cpu.quota"], 50_000);

    let update = &recs[7];
    let res = update.resources.as_ref().unwrap();
    assert_eq!(res["memory.limit"], 512 << 20);
    assert_eq!(res["cpu.cpus"], "0-1");
    assert_eq!(update.container.as_ref().unwrap().id, "c1");

    let shutdown = recs.last().unwrap();
    assert!(shutdown.pod.is_none() && shutdown.container.is_none());

    // The same events as text lines on stderr; the process ends cleanly.
    assert_eq!(plugin.wait_exit().await, Some(0));
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    assert!(
        text.contains("CreateContainer pod=default/web (p1) container=app (c1) annotations=5 env=3 resources=["),
        "{text}"
    );
    for e in events(&recs) {
        assert!(
            text.lines().any(|l| l.contains(&format!(" {e}"))),
            "no {e} line in {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preinstalled_logger_takes_events_and_log_file_from_its_dropin_config() {
    let rt = runtime(tempdir());
    let log = rt.dir.path().join("pod-events.jsonl");
    let plugins = rt.dir.path().join("plugins");
    let conf = rt.dir.path().join("conf.d");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::hard_link(BIN, plugins.join("99-logger"))
        .or_else(|_| std::fs::copy(BIN, plugins.join("99-logger")).map(drop))
        .unwrap();
    std::fs::write(
        conf.join("99-logger.conf"),
        format!("events = \"pod\"\nlog_file = {:?}\n", log.display().to_string()),
    )
    .unwrap();
    rt.nri.start().await.unwrap();
    assert_eq!(rt.nri.plugin_names(), ["99-logger"]);

    let pod = web_pod();
    let ctr = container_from_spec("c1", "p1", "app", &busybox());
    rt.nri.run_pod_sandbox(&pod).await.unwrap();
    rt.nri.create_container(create_request(&pod, &ctr)).await.unwrap();
    rt.nri.start_container(&pod, &ctr).await.unwrap();
    rt.nri.stop_pod_sandbox(&pod).await.unwrap();
    rt.nri.stop().await;

    let recs = wait_last(&log, "Shutdown").await;
    assert_eq!(
        events(&recs),
        [
            "Configure",
            "Synchronize",
            "RunPodSandbox",
            "StopPodSandbox",
            "Shutdown"
        ],
        "container events are not subscribed"
    );
}

#[test]
fn exits_non_zero_when_it_cannot_connect() {
    let dir = tempdir();
    let sock = dir.path().join("none.sock");
    let out = Command::new(BIN)
        .arg("--socket-path")
        .arg(&sock)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("failed to connect to the NRI socket") && stderr.contains(&*sock.to_string_lossy()),
        "{stderr}"
    );
}

#[test]
fn bad_events_are_refused() {
    let out = Command::new(BIN)
        .args([
            "--events",
            "CreateContainer,Bogus",
            "--socket-path",
            "/nonexistent/nri.sock",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown event name \"Bogus\""), "{stderr}");
}
