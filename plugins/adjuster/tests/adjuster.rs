//! The real `nri-adjuster` binary against a real `Adaptation` on a temp
//! socket: as an external plugin (`--config`) and as a pre-installed plugin
//! launched by the runtime with a drop-in configuration.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use integration::{PluginProc, Store, TestRuntime, create_request};
use nri_adaptation::{Adaptation, adjust, api, convert::container_from_spec};
use oci_spec::runtime::Spec;

const BIN: &str = env!("CARGO_BIN_EXE_nri-adjuster");

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(rel)
}

fn busybox() -> Spec {
    serde_json::from_str(&std::fs::read_to_string(testdata("oci/busybox.json")).unwrap()).unwrap()
}

/// A temp dir on the file system of the built binary, so that installing
/// it is a hard link: a copy being written while another test forks could
/// make its exec fail with ETXTBSY.
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn pod(annotations: &[(&str, &str)]) -> api::PodSandbox {
    let mut p = api::PodSandbox {
        id: "p1".into(),
        name: "web".into(),
        namespace: "default".into(),
        uid: "p1-uid".into(),
        ..Default::default()
    };
    for (k, v) in annotations {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

/// Creates container `id` named `name` from `busybox.json` and returns the
/// spec before and after applying the merged adjustment.
async fn create(nri: &Adaptation, pod: &api::PodSandbox, id: &str, name: &str) -> (Spec, Spec) {
    let before = busybox();
    let ctr = container_from_spec(id, &pod.id, name, &before);
    let rsp = nri.create_container(create_request(pod, &ctr)).await.unwrap();
    let mut after = before.clone();
    adjust(&mut after, rsp.adjust.get_or_default()).unwrap();
    (before, after)
}

/// What `testdata/plugins/adjuster.toml` does to a matching container.
fn assert_adjusted(spec: &Spec) {
    let env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"FOO=from-nri-adjuster".to_string()), "{env:?}");
    assert!(!env.contains(&"FOO=image".to_string()), "{env:?}");
    assert!(env.contains(&"BAR=1".to_string()), "{env:?}");
    let ann = spec.annotations().as_ref().unwrap();
    assert_eq!(ann["nri.example.com/adjusted-by"], "nri-adjuster");
    assert_eq!(ann["io.kubernetes.cri.container-name"], "app");
    let mounts = spec.mounts().as_ref().unwrap();
    let m = mounts
        .iter()
        .find(|m| m.destination() == Path::new("/opt/nri"))
        .unwrap_or_else(|| panic!("no /opt/nri mount in {mounts:?}"));
    assert_eq!(m.typ().as_deref(), Some("tmpfs"));
    assert_eq!(m.source().as_deref(), Some(Path::new("tmpfs")));
    assert!(m.options().as_ref().unwrap().contains(&"size=16m".to_string()));
    let mem = spec
        .linux()
        .as_ref()
        .unwrap()
        .resources()
        .as_ref()
        .unwrap()
        .memory()
        .as_ref()
        .unwrap();
    assert_eq!(mem.limit(), Some(128 << 20));
}

fn assert_unchanged(before: &Spec, after: &Spec) {
    assert_eq!(
        serde_json::to_value(before).unwrap(),
        serde_json::to_value(after).unwrap(),
        "a container no rule matches is left unchanged"
    );
}

fn spawn_external(socket: &Path, config: &Path) -> PluginProc {
    let child = Command::new(BIN)
        .arg("--socket-path")
        .arg(socket)
        .args(["--idx", "10", "--name", "adjuster", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    PluginProc { child }
}

/// A stopped runtime over an empty store in `dir`.
fn runtime(dir: tempfile::TempDir) -> TestRuntime {
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = TestRuntime::builder(dir.path(), &store)
        .with_request_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    TestRuntime { nri, store, dir }
}

/// Installs the binary as pre-installed plugin `file_name` with `config`
/// as its drop-in configuration.
fn install(rt: &TestRuntime, file_name: &str, config: &str) {
    let plugins = rt.dir.path().join("plugins");
    let conf = rt.dir.path().join("conf.d");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let dst = plugins.join(file_name);
    std::fs::hard_link(BIN, &dst)
        .or_else(|_| std::fs::copy(BIN, &dst).map(drop))
        .unwrap();
    std::fs::write(conf.join(format!("{file_name}.conf")), config).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_plugin_adjusts_matching_containers_only() {
    let rt = runtime(tempdir());
    rt.nri.start().await.unwrap();
    let mut plugin = spawn_external(&rt.sock(), &testdata("plugins/adjuster.toml"));
    rt.wait_plugins(&["10-adjuster"]).await;

    let (_, app) = create(&rt.nri, &pod(&[]), "c1", "app").await;
    assert_adjusted(&app);

    let (before, sidecar) = create(&rt.nri, &pod(&[]), "c2", "sidecar").await;
    assert_unchanged(&before, &sidecar);

    // The second rule: any container of a pod that opts in.
    let opted_in = pod(&[("nri.example.com/adjust", "true")]);
    let (_, sidecar) = create(&rt.nri, &opted_in, "c3", "sidecar").await;
    assert_adjusted(&sidecar);
    // Matched by both rules: each key once, so no conflict.
    let (_, app) = create(&rt.nri, &opted_in, "c4", "app").await;
    assert_adjusted(&app);

    rt.nri.stop().await;
    assert_eq!(plugin.wait_exit().await, Some(0), "exits cleanly after Shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preinstalled_plugin_takes_its_rules_from_the_dropin_config() {
    let rt = runtime(tempdir());
    let config = std::fs::read_to_string(testdata("plugins/adjuster.toml")).unwrap();
    install(&rt, "10-adjuster", &config);
    // start() returns once pre-installed plugins are configured and synced.
    rt.nri.start().await.unwrap();
    assert_eq!(rt.nri.plugin_names(), ["10-adjuster"]);

    let (_, app) = create(&rt.nri, &pod(&[]), "c1", "app").await;
    assert_adjusted(&app);
    let (before, other) = create(&rt.nri, &pod(&[]), "c2", "sidecar").await;
    assert_unchanged(&before, &other);
    rt.nri.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropin_config_takes_precedence_over_config_flag() {
    // The runtime launches pre-installed plugins without arguments; a
    // wrapper script passes --config (the example: FOO=from-nri-adjuster
    // and more), the drop-in says FOO=dropin and nothing else. Name and
    // index come from the runtime's environment, not the executable name.
    let rt = runtime(tempdir());
    install(
        &rt,
        "10-adjuster",
        "[[rule]]\n[rule.match]\ncontainer_name = \"app\"\n[rule.adjust]\nenv = { FOO = \"dropin\" }\n",
    );
    let wrapper = rt.dir.path().join("plugins/10-adjuster");
    std::fs::remove_file(&wrapper).unwrap();
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} --config {} \"$@\"\n",
            BIN,
            testdata("plugins/adjuster.toml").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    rt.nri.start().await.unwrap();
    assert_eq!(rt.nri.plugin_names(), ["10-adjuster"]);

    let (_, app) = create(&rt.nri, &pod(&[]), "c1", "app").await;
    let env = app.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"FOO=dropin".to_string()), "{env:?}");
    let mounts = app.mounts().as_ref().unwrap();
    assert!(
        !mounts.iter().any(|m| m.destination() == Path::new("/opt/nri")),
        "the --config rules are replaced, not merged: {mounts:?}"
    );
    rt.nri.stop().await;
}

#[test]
fn bad_config_file_is_refused_with_the_key_named() {
    let dir = tempdir();
    for (text, needle) in [
        (
            "[[rule]]\nname = \"app\"\n[rule.adjust]\nenv = { FOO = \"1\" }\nmemroy = { limit = \"1Gi\" }\n",
            "unknown field `memroy`",
        ),
        (
            "[[rule]]\n[rule.match]\ncontainer_name = \"app?\"\n[rule.adjust]\nenv = { FOO = \"1\" }\n",
            "invalid glob \"app?\"",
        ),
        (
            "[[rule]]\nname = \"mem\"\n[rule.adjust]\nmemory = { swappiness = 150 }\n",
            "rule 1 (\"mem\"): adjust.memory.swappiness",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        // No runtime is listening: the config is checked before connecting.
        let out = Command::new(BIN)
            .arg("--socket-path")
            .arg(dir.path().join("none.sock"))
            .arg("--config")
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
        assert!(!stderr.contains("connect"), "refused before connecting: {stderr}");
    }
}

#[test]
fn exits_non_zero_when_it_cannot_connect() {
    let dir = tempdir();
    let sock = dir.path().join("none.sock");
    let out = Command::new(BIN)
        .arg("--socket-path")
        .arg(&sock)
        .arg("--config")
        .arg(testdata("plugins/adjuster.toml"))
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

/// Collects what `tracing` writes, to read the runtime's log.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

// Single-threaded, so the runtime's log lines, written from its tasks, all
// go through this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn bad_dropin_config_fails_configure_with_the_key_named() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let rt = runtime(tempdir());
    install(
        &rt,
        "10-adjuster",
        "[[rule]]\n[rule.adjust]\nenv = { FOO = \"1\" }\nmemroy = { limit = \"1Gi\" }\n",
    );
    rt.nri.start().await.unwrap();
    assert!(rt.nri.plugin_names().is_empty(), "{:?}", rt.nri.plugin_names());
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("10-adjuster") && l.contains("failed to start"))
        .unwrap_or_else(|| panic!("no start failure of 10-adjuster in the runtime log:\n{text}"));
    assert!(
        line.contains("configuration from the runtime") && line.contains("memroy"),
        "{line}"
    );

    // The container is created without it.
    let (before, app) = create(&rt.nri, &pod(&[]), "c1", "app").await;
    assert_unchanged(&before, &app);
    rt.nri.stop().await;
}
