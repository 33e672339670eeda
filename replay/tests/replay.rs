//! nri-replay end to end: the real binary, real plugin processes
//! (`nri-test-plugin` of the integration package), real sockets.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

const REPLAY: &str = env!("CARGO_BIN_EXE_nri-replay");

/// The test plugin, built into the same target directory by `cargo test --workspace`.
fn test_plugin() -> PathBuf {
    let p = Path::new(REPLAY).with_file_name("nri-test-plugin");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p integration` (cargo test --workspace does)",
        p.display()
    );
    p
}

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata").join(rel)
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// A temp dir with empty `plugins` and `conf.d` directories: (dir,
/// plugins, conf.d).
fn plugin_dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (plugins, conf) = (dir.path().join("plugins"), dir.path().join("conf.d"));
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    (dir, plugins, conf)
}

/// nri-replay of `scenarios/basic.json` with the pre-installed plugins of
/// [`plugin_dirs`]'s `dir` and `extra` arguments.
fn replay_basic(dir: &Path, extra: &[&str]) -> Output {
    Command::new(REPLAY)
        .arg("--socket-path")
        .arg(dir.join("nri.sock"))
        .arg("--plugin-path")
        .arg(dir.join("plugins"))
        .arg("--plugin-config-path")
        .arg(dir.join("conf.d"))
        .args(extra)
        .arg(testdata("scenarios/basic.json"))
        .output()
        .unwrap()
}

/// Whether a unix socket bound at `path` listens (`/proc/net/unix`: flags
/// `00010000`, the kernel's accepting-connections flag). The file appears
/// at bind(2), before listen(2): a plugin started on the file alone was
/// refused once ("Connection refused") in a whole test run beside a busy
/// loop on each core, and the replay waited for it in vain.
fn listening(path: &Path) -> bool {
    let path = path.display().to_string();
    std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[7] == path && f[3] == "00010000"
        })
    })
}

/// Runs nri-replay on `scenario` and starts `plugins` (idx, name, config)
/// once its socket listens.
fn replay_with_external(scenario: &Path, plugins: &[(&str, &str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let child = Command::new(REPLAY)
        .arg("--socket-path")
        .arg(&sock)
        .args(["--wait-plugins", &plugins.len().to_string()])
        .arg(scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening(&sock) {
        assert!(Instant::now() < deadline, "nri-replay never opened its socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut procs = Vec::new();
    for (idx, name, cfg) in plugins {
        procs.push(
            Command::new(test_plugin())
                .arg("--socket")
                .arg(&sock)
                .args(["--idx", idx, "--name", name, "--config", cfg])
                .spawn()
                .unwrap(),
        );
    }
    let out = child.wait_with_output().unwrap();
    for mut p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    out
}

#[test]
fn conflict_is_a_failed_step_naming_both_plugins_and_the_field() {
    let out = replay_with_external(
        &testdata("scenarios/conflict.json"),
        &[
            (
                "10",
                "a",
                r#"{"events": "CreateContainer", "adjust": {"env": [{"key": "FOO", "value": "a"}]}}"#,
            ),
            (
                "20",
                "b",
                r#"{"events": "CreateContainer", "adjust": {"env": [{"key": "FOO", "value": "b"}]}}"#,
            ),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = lines(&out);
    assert_eq!(l.len(), 3);
    assert_eq!(l[0]["ok"], true);
    let create = &l[1];
    assert_eq!(create["action"], "create_container");
    assert_eq!(create["ok"], false);
    assert_eq!(
        create["error"],
        r#"plugins "20-b" and "10-a" both tried to set Env FOO"#
    );
    let plugins: Vec<&str> = create["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["plugin"].as_str().unwrap())
        .collect();
    assert_eq!(plugins, ["10-a", "20-b"]);
    assert_eq!(create["plugins"][1]["adjust"]["env"][0]["value"], "b");
}

#[test]
fn preinstalled_plugin_adjusts_the_spec_and_every_step_succeeds() {
    let (dir, plugins, conf) = plugin_dirs();
    std::fs::copy(test_plugin(), plugins.join("10-adjuster")).unwrap();
    std::fs::write(
        conf.join("adjuster.conf"),
        r#"{"events": "CreateContainer,StartContainer",
            "adjust": {"env": [{"key": "FOO", "value": "nri"}, {"key": "-BAR"}],
                       "annotations": {"adjusted-by": "10-adjuster"},
                       "mounts": [{"destination": "/opt/nri", "type": "tmpfs", "source": "tmpfs"}],
                       "linux": {"resources": {"memory": {"limit": {"value": "134217728"}}}}}}"#,
    )
    .unwrap();
    let out = replay_basic(dir.path(), &["--wait-plugins", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {stderr}\nstdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let l = lines(&out);
    assert!(l.iter().all(|x| x["ok"] == true), "{l:#?}");
    let create = l
        .iter()
        .find(|x| x["action"] == "create_container" && x["target"] == "c1")
        .unwrap();
    let spec = &create["spec"];
    let env: Vec<&str> = spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        env,
        ["PATH=/bin:/usr/bin", "FOO=nri"],
        "FOO replaced in place, BAR removed"
    );
    assert_eq!(spec["annotations"]["adjusted-by"], "10-adjuster");
    assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 134217728);
    assert!(
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/opt/nri")
    );
    assert_eq!(create["plugins"][0]["plugin"], "10-adjuster");
    // Who set what, by NRI field name (not the owners message's numbers).
    let changes = create["changes"].as_array().unwrap();
    assert!(
        changes
            .iter()
            .any(|c| c["field"] == "Annotations" && c["key"] == "adjusted-by" && c["plugin"] == "10-adjuster"),
        "{changes:?}"
    );
    assert!(
        changes.iter().any(|c| c["field"] == "MemLimit" && c["key"].is_null()),
        "{changes:?}"
    );
    // The NRI-object container has no spec to print but is adjusted too.
    let c2 = l
        .iter()
        .find(|x| x["action"] == "create_container" && x["target"] == "c2")
        .unwrap();
    assert!(c2.get("spec").is_none());
    assert_eq!(c2["adjust"]["env"][0]["key"], "FOO");
}

#[test]
fn bad_scenario_fails_with_the_object_named() {
    let out =
        replay_scenario(r#"{"pods": [], "containers": [{"id": "c1", "pod": "nope", "container": {}}], "steps": []}"#);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"containers[0] "c1": unknown pod "nope""#), "{err}");
}

/// Runs nri-replay, no plugins, on a scenario file holding `json`.
fn replay_scenario(json: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("scenario.json");
    std::fs::write(&f, json).unwrap();
    Command::new(REPLAY)
        .arg("--socket-path")
        .arg(dir.path().join("nri.sock"))
        .arg(&f)
        .output()
        .unwrap()
}

/// Runs nri-replay with `args` on `testdata/scenarios/basic.json`, no plugins.
fn replay_args(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(REPLAY)
        .arg("--socket-path")
        .arg(dir.path().join("nri.sock"))
        .args(args)
        .arg(testdata("scenarios/basic.json"))
        .output()
        .unwrap()
}

#[test]
fn out_of_range_timeouts_are_usage_errors_naming_flag_and_value() {
    for (flag, value) in [
        ("--wait-timeout", "1e300"),
        ("--wait-timeout", "inf"),
        ("--wait-timeout", "-inf"),
        ("--wait-timeout", "nan"),
        ("--wait-timeout", "-1"),
        ("--wait-timeout", "-0.5"),
        ("--wait-timeout", "soon"),
        ("--request-timeout", "0"),
        ("--request-timeout", "86400001"),
        ("--request-timeout", "18446744073709551615"),
    ] {
        let out = replay_args(&[&format!("{flag}={value}")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}={value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value) && !err.contains("panicked"),
            "{flag}={value}: {err}"
        );
        assert!(out.stdout.is_empty(), "{flag}={value}: nothing is replayed");
    }
}

#[test]
fn timeouts_in_range_are_taken() {
    let out = replay_args(&["--wait-timeout", "0.05", "--request-timeout", "86400000"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // A wait too long to have a deadline is no deadline: nothing to wait for here.
    let out = replay_args(&["--wait-timeout", "1e19"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = replay_args(&["--wait-plugins", "1", "--wait-timeout", "0.05"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("only 0 of 1 plugins registered within 50ms"), "{err}");
}

#[test]
fn plugin_directories_given_must_be_directories() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    for flag in ["--plugin-path", "--plugin-config-path"] {
        for (path, reason) in [(&missing, "No such file or directory"), (&file, "not a directory")] {
            let out = replay_args(&[flag, path.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{flag} {}: {err}", path.display());
            assert!(
                err.contains(&format!("{flag} {}", path.display())) && err.contains(reason),
                "{flag} {}: {err}",
                path.display()
            );
            assert!(out.stdout.is_empty(), "{flag} {}: nothing is replayed", path.display());
        }
    }
    // Empty directories are fine: no plugins.
    let out = replay_args(&[
        "--plugin-path",
        dir.path().to_str().unwrap(),
        "--plugin-config-path",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_invalid_later_step_fails_before_the_first_step_is_replayed() {
    let out = replay_scenario(
        r#"{"pods": [{"id": "p1"}], "containers": [{"id": "c1", "pod": "p1", "container": {}}],
            "steps": [{"run_pod_sandbox": "p1"}, {"create_container": "c1"},
                      {"update_container": {"container": "c1", "resources": {"cpu": {"shares": "lots"}}}}]}"#,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("steps[2] (update_container)"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "no step was replayed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A regular file at the socket path is left alone and named once in the
/// error, each cause said once.
#[test]
fn a_file_at_the_socket_path_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, "precious").unwrap();
    let out = Command::new(REPLAY)
        .arg("--socket-path")
        .arg(&f)
        .arg(testdata("scenarios/basic.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}: the path exists and is not a socket", f.display())),
        "{err}"
    );
    assert_eq!(err.matches("already exists").count(), 1, "a cause repeated: {err}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "precious");
}

/// The template plugin a new author copies (plugins/template) runs as a
/// pre-installed plugin under nri-replay, as docs/plugin-authors.md's
/// "Test it with nri-replay" shows: its drop-in configuration names the env
/// var it adds.
#[test]
fn the_template_plugin_adjusts_under_nri_replay() {
    let template = Path::new(REPLAY).with_file_name("nri-plugin-template");
    assert!(
        template.exists(),
        "{} is missing: cargo build --workspace --bins builds it",
        template.display()
    );
    let (dir, plugins, conf) = plugin_dirs();
    std::fs::copy(&template, plugins.join("50-template")).unwrap();
    std::fs::write(conf.join("50-template.conf"), "GREETING=hello\n").unwrap();
    let out = replay_basic(dir.path(), &["--wait-plugins", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let l = lines(&out);
    let create = l
        .iter()
        .find(|x| x["action"] == "create_container" && x["target"] == "c1")
        .unwrap();
    assert_eq!(create["adjust"]["env"][0]["key"], "GREETING", "{create:#}");
    assert_eq!(create["adjust"]["env"][0]["value"], "hello");
    assert_eq!(
        create["adjust"]["annotations"]["example.com/seen-by"],
        "nri-plugin-template"
    );
    assert_eq!(create["changes"][0]["plugin"], "50-template", "{create:#}");
}

/// nri-replay's log lines on stderr carry no terminal colour codes when
/// stderr is not a terminal (a file, a pipe, a CI log): here the warning for
/// a file in the plugin directory that is not an executable.
#[test]
fn log_lines_off_a_terminal_have_no_colour_codes() {
    let (dir, plugins, _conf) = plugin_dirs();
    std::fs::write(plugins.join("README"), "not a plugin\n").unwrap();
    let out = replay_basic(dir.path(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("WARN") && err.contains("README"),
        "no warning for the file: {err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in: {err:?}");
}

/// A WebAssembly plugin in `--plugin-path` (the adjuster of
/// `plugins/wasm`, configured by `testdata/plugins/wasm-adjuster.conf`)
/// replays `testdata/scenarios/wasm.json`: it adjusts the container its
/// configuration names, every step succeeds, the changes name it.
#[test]
fn a_wasm_plugin_adjusts_the_scenario() {
    let (dir, plugins, conf) = plugin_dirs();
    nri_wasm_plugins::install(nri_wasm_plugins::ADJUSTER, &plugins, "10-wasm").unwrap();
    std::fs::copy(testdata("plugins/wasm-adjuster.conf"), conf.join("wasm.conf")).unwrap();
    let out = Command::new(REPLAY)
        .arg("--socket-path")
        .arg(dir.path().join("nri.sock"))
        .arg("--plugin-path")
        .arg(&plugins)
        .arg("--plugin-config-path")
        .arg(&conf)
        .args(["--wait-plugins", "1"])
        .arg(testdata("scenarios/wasm.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.contains("10-wasm"), "{stderr}");
    let l = lines(&out);
    assert!(l.iter().all(|x| x["ok"] == true), "{l:#?}");
    let create = l
        .iter()
        .find(|x| x["action"] == "create_container" && x["target"] == "c1")
        .unwrap();
    let spec = &create["spec"];
    assert!(
        spec["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "FROM_WASM=yes"),
        "{spec}"
    );
    assert_eq!(spec["annotations"]["wasm.nri.io/adjusted"], "true");
    assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 134217728);
    assert!(
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"] == "/opt/wasm")
    );
    let changes = create["changes"].as_array().unwrap();
    assert!(
        changes
            .iter()
            .any(|c| c["field"] == "MemLimit" && c["plugin"] == "10-wasm"),
        "{changes:?}"
    );
    // `container app`: the sidecar is left alone.
    let c2 = l
        .iter()
        .find(|x| x["action"] == "create_container" && x["target"] == "c2")
        .unwrap();
    assert!(c2["adjust"]["env"].as_array().is_none_or(|e| e.is_empty()), "{c2}");
}
