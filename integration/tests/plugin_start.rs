//! What an operator reads when pre-installed plugins do not start: a
//! warning for every entry of the plugin directory that is not launched, and a
//! crashed plugin's exit status or signal. The adaptation's log lines are
//! captured in this test binary's global subscriber.

use std::{
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::{Arc, Mutex, OnceLock},
};

use integration::{Behaviour, Store, TestRuntime, install_plugin, test_plugin_bin};

/// Everything the tests of this binary logged, as text.
fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Capture(sink.clone()))
            .init();
        buf
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines that mention `needle`.
fn lines_with(needle: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&captured().lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

fn runtime() -> TestRuntime {
    captured();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = TestRuntime::builder(dir.path(), &store).build().unwrap();
    TestRuntime { nri, store, dir }
}

fn script(dir: &Path, name: &str, body: &str, mode: u32) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "#!/bin/sh\n{body}").unwrap();
    drop(f);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// Each directory and each non-executable file of the plugin directory is
/// named in a warning (a plugin installed without `chmod +x` is not silently
/// missing); the executable plugin next to them still starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_skipped_plugin_dir_entry_is_warned() {
    let rt = runtime();
    let plugins = rt.dir.path().join("plugins");
    install_plugin(
        test_plugin_bin!(),
        &plugins,
        &rt.dir.path().join("conf.d"),
        "10-ok",
        &Behaviour::default(),
    );
    let no_x = script(&plugins, "20-not-executable", "exit 0", 0o644);
    let dir = plugins.join("30-a-directory");
    std::fs::create_dir(&dir).unwrap();
    rt.nri.start().await.unwrap();
    assert_eq!(rt.nri.plugin_names(), ["10-ok"]);
    rt.nri.stop().await;
    let no_x_lines = lines_with(&no_x.display().to_string());
    assert!(
        no_x_lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("non-executable")),
        "{no_x_lines:#?}"
    );
    let dir_lines = lines_with(&dir.display().to_string());
    assert!(
        dir_lines.iter().any(|l| l.contains("WARN") && l.contains("directory")),
        "{dir_lines:#?}"
    );
}

/// A pre-installed plugin that dies before registering is reported with
/// its exit status or the signal that killed it, and one that dies in
/// Configure likewise; the runtime starts without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_preinstalled_plugin_is_reported_with_exit_status_or_signal() {
    let rt = runtime();
    let plugins = rt.dir.path().join("plugins");
    let exits = script(&plugins, "10-exits", "exit 3", 0o755);
    let segv = script(&plugins, "20-segv", "kill -SEGV $$", 0o755);
    install_plugin(
        test_plugin_bin!(),
        &plugins,
        &rt.dir.path().join("conf.d"),
        "30-dies-in-configure",
        &Behaviour {
            exit_on: Some("Configure".into()),
            ..Default::default()
        },
    );
    rt.nri.start().await.unwrap();
    assert!(rt.nri.plugin_names().is_empty(), "{:?}", rt.nri.plugin_names());
    rt.nri.stop().await;
    let want = [
        (exits.display().to_string(), "exited during registration: exit status 3"),
        (
            segv.display().to_string(),
            "exited during registration: killed by signal SIGSEGV",
        ),
        (
            plugins.join("30-dies-in-configure").display().to_string(),
            "exited during configuration: exit status 17",
        ),
    ];
    for (path, text) in want {
        let lines = lines_with(&path);
        assert!(lines.iter().any(|l| l.contains(text)), "{text}: {lines:#?}");
    }
}

/// A pre-installed plugin whose Configure handler fails is reported with
/// the handler's own message, every time: the stub closed its connection
/// as soon as the handler failed, and the runtime sometimes read the
/// closure before the error reply ("configure failed: connection closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configure_error_reaches_the_runtime_log_20_of_20() {
    let mut lost = Vec::new();
    for i in 0..20 {
        let rt = runtime();
        let plugins = rt.dir.path().join("plugins");
        install_plugin(
            test_plugin_bin!(),
            &plugins,
            &rt.dir.path().join("conf.d"),
            "40-no-gpu",
            &Behaviour {
                fail: [("Configure".to_string(), "no GPU found on this node".to_string())].into(),
                ..Default::default()
            },
        );
        rt.nri.start().await.unwrap();
        assert!(rt.nri.plugin_names().is_empty(), "{:?}", rt.nri.plugin_names());
        rt.nri.stop().await;
        let lines = lines_with(&plugins.join("40-no-gpu").display().to_string());
        if !lines.iter().any(|l| l.contains("no GPU found on this node")) {
            lost.push((i, lines));
        }
    }
    assert!(
        lost.is_empty(),
        "the plugin's message was lost in {} of 20 runs: {lost:#?}",
        lost.len()
    );
}
