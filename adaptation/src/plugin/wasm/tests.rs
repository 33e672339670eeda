//! WebAssembly plugins through a real adaptation, with modules written in
//! WebAssembly text here (the `wat` crate): each export's behaviour is
//! one WAT expression, answers are protobuf messages encoded by
//! `nri-proto` and placed in the module's data. The Rust guests of
//! `plugins/wasm` (real request decoding, WASI from a real toolchain) are
//! tested in `integration/tests/wasm.rs`.

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nri_proto::api;
use protobuf::{Message, MessageField};

use super::guest::Compiled;
use crate::{
    Adaptation, Error, FailurePolicy, PluginError, RuntimeState,
    wasm::{WasmCallError, WasmGrants, WasmOptions},
};

/// Where answers are placed in a test module's memory.
const DATA: u32 = 1024;

/// A test module: a bump allocator, `_initialize` (which every request
/// checks was called), and one body per `plugin_*` export.
#[derive(Clone)]
struct Wat {
    version: i64,
    bodies: Vec<(&'static str, String)>,
    data: Vec<u8>,
    omit: Vec<&'static str>,
    /// Imports beyond the usual ones.
    imports: String,
    /// Definitions beyond the exports.
    extra: String,
}

/// The exports a test module has unless omitted.
const EXPORTS: [&str; 18] = [
    "plugin_configure",
    "plugin_synchronize",
    "plugin_shutdown",
    "plugin_run_pod_sandbox",
    "plugin_update_pod_sandbox",
    "plugin_post_update_pod_sandbox",
    "plugin_stop_pod_sandbox",
    "plugin_remove_pod_sandbox",
    "plugin_create_container",
    "plugin_post_create_container",
    "plugin_start_container",
    "plugin_post_start_container",
    "plugin_update_container",
    "plugin_post_update_container",
    "plugin_stop_container",
    "plugin_remove_container",
    "plugin_state_change",
    "plugin_validate_container_adjustment",
];

impl Wat {
    fn new() -> Wat {
        Wat {
            version: 1,
            bodies: Vec::new(),
            data: Vec::new(),
            omit: Vec::new(),
            imports: String::new(),
            extra: String::new(),
        }
    }

    /// Places `bytes` in the module's data; their packed answer.
    fn place(&mut self, bytes: &[u8]) -> i64 {
        let at = DATA + self.data.len() as u32;
        self.data.extend_from_slice(bytes);
        (i64::from(at) << 32) | bytes.len() as i64
    }

    /// `export` answers `msg`.
    fn answer(mut self, export: &'static str, msg: &impl Message) -> Wat {
        let packed = self.place(&msg.write_to_bytes().unwrap());
        self.bodies.push((export, format!("(i64.const {packed})")));
        self
    }

    /// `export` answers the error text `text`.
    fn error(mut self, export: &'static str, text: &str) -> Wat {
        let packed = self.place(text.as_bytes()) | (1 << 31);
        self.bodies.push((export, format!("(i64.const {packed})")));
        self
    }

    /// `export` runs `body` (a WAT expression of type i64).
    fn body(mut self, export: &'static str, body: &str) -> Wat {
        self.bodies.push((export, body.to_string()));
        self
    }

    fn without(mut self, export: &'static str) -> Wat {
        self.omit.push(export);
        self
    }

    fn module(&self) -> Vec<u8> {
        let mut w = self.clone();
        let not_initialized = w.place(b"_initialize was not called") | (1 << 31);
        let mut text = String::from(
            r#"(module
  (import "env" "log" (func $log (param i32 i32) (result i64)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $env_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
IMPORTS
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 32768))
  (global $init (mut i32) (i32.const 0))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (i32.and (i32.add (local.get $n) (i32.const 7)) (i32.const -8))))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then
        (if (i32.eq (memory.grow (i32.add (i32.div_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536))) (i32.const 65536)) (i32.const 1))) (i32.const -1))
          (then (return (i32.const 0))))))
    (local.get $p))
  (func (export "free") (param i32))
  (func (export "_initialize") (global.set $init (i32.const 1)))
"#,
        )
        .replace("IMPORTS", &w.imports);
        text.push_str(&format!(
            "  (func (export \"plugin_api_version\") (result i64) (i64.const {}))\n",
            w.version
        ));
        for export in EXPORTS {
            if w.omit.contains(&export) {
                continue;
            }
            let body = w
                .bodies
                .iter()
                .rev()
                .find(|(e, _)| *e == export)
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| "(i64.const 0)".to_string());
            text.push_str(&format!(
                "  (func (export \"{export}\") (param $ptr i32) (param $len i32) (result i64)\n    (if (i32.eqz (global.get $init)) (then (return (i64.const {not_initialized}))))\n    {body})\n"
            ));
        }
        text.push_str(&w.extra);
        let escaped: String = w.data.iter().map(|b| format!("\\{b:02x}")).collect();
        text.push_str(&format!("  (data (i32.const {DATA}) \"{escaped}\"))\n"));
        wat::parse_str(&text).unwrap_or_else(|e| panic!("bad test module: {e}\n{text}"))
    }
}

fn configure(events: &[api::Event]) -> api::ConfigureResponse {
    api::ConfigureResponse {
        events: nri_proto::events::EventMask::from_events(events).bits(),
        ..Default::default()
    }
}

fn env_adjustment(key: &str, value: &str) -> api::CreateContainerResponse {
    let mut rsp = api::CreateContainerResponse::new();
    rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    });
    rsp
}

/// A plugin that adds `KEY=value` at CreateContainer.
fn adjuster(key: &str) -> Wat {
    Wat::new()
        .answer("plugin_configure", &configure(&[api::Event::CREATE_CONTAINER]))
        .answer("plugin_create_container", &env_adjustment(key, "from-wasm"))
}

fn install(dir: &Path, name: &str, module: &[u8]) {
    let p = dir.join(name);
    std::fs::write(&p, module).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Setup {
    nri: Adaptation,
    _dir: tempfile::TempDir,
}

async fn start(plugins: &[(&str, Vec<u8>)], timeout: Duration, policy: FailurePolicy, wasm: WasmOptions) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    for (name, module) in plugins {
        install(&plugin_dir, name, module);
    }
    let nri = Adaptation::builder("wasm-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(&plugin_dir)
        .with_plugin_config_path(dir.path().join("conf.d"))
        .with_request_timeout(timeout)
        .with_default_failure_policy(policy)
        .with_wasm_options(wasm)
        .build()
        .unwrap();
    nri.start().await.unwrap();
    Setup { nri, _dir: dir }
}

fn request(name: &str) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: MessageField::some(api::PodSandbox {
            id: "pod".into(),
            name: "pod".into(),
            ..Default::default()
        }),
        container: MessageField::some(api::Container {
            id: name.into(),
            pod_sandbox_id: "pod".into(),
            name: name.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_of(rsp: &api::CreateContainerResponse) -> Vec<String> {
    rsp.adjust
        .env
        .iter()
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect()
}

/// Loaded from the plugin directory by its magic, initialized, configured,
/// sent CreateContainer; its adjustment is merged, in index order next to
/// another WebAssembly plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_plugins_adjust_in_index_order() {
    let s = start(
        &[
            ("20-second", adjuster("SECOND").module()),
            ("10-first", adjuster("FIRST").module()),
        ],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    assert_eq!(s.nri.plugin_names(), ["10-first", "20-second"]);
    let rsp = s.nri.create_container(request("c1")).await.unwrap();
    assert_eq!(env_of(&rsp), ["FIRST=from-wasm", "SECOND=from-wasm"]);
    s.nri.stop().await;
}

/// Two plugins set the same variable: the conflict is the one between two
/// plugin processes, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_between_wasm_plugins_names_both() {
    let s = start(
        &[("10-a", adjuster("SAME").module()), ("20-b", adjuster("SAME").module())],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    let e = s.nri.create_container(request("c1")).await.unwrap_err();
    let Error::Merge(m) = &e else { panic!("{e:?}") };
    let text = m.to_string();
    assert!(
        text.contains("10-a") && text.contains("20-b") && text.contains("SAME"),
        "{text}"
    );
    s.nri.stop().await;
}

/// The same module twice is compiled once; the cache entry goes with the
/// last plugin using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_is_compiled_once() {
    let module = adjuster("CACHED").module();
    assert!(!Compiled::cached(&module));
    let s = start(
        &[("10-a", module.clone()), ("20-b", module.clone())],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    assert_eq!(s.nri.plugin_names().len(), 2);
    assert!(Compiled::cached(&module));
    s.nri.stop().await;
    // The plugins' threads drop their instances once their channel closes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Compiled::cached(&module) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!Compiled::cached(&module));
}

/// What a plugin's misbehaviour at CreateContainer does to the request
/// (policy `fail`): the error, and whether the plugin is gone.
async fn misbehave(body: Wat, limit: u64) -> (Error, Vec<String>, Duration, Adaptation, tempfile::TempDir) {
    let module = body
        .answer("plugin_configure", &configure(&[api::Event::CREATE_CONTAINER]))
        .module();
    let s = start(
        &[("10-bad", module), ("20-good", adjuster("GOOD").module())],
        Duration::from_millis(500),
        FailurePolicy::Fail,
        WasmOptions {
            memory_limit: limit,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(s.nri.plugin_names(), ["10-bad", "20-good"]);
    let started = Instant::now();
    let e = s.nri.create_container(request("c1")).await.unwrap_err();
    let took = started.elapsed();
    // The registry drops a closed plugin on its own task.
    tokio::time::sleep(Duration::from_millis(50)).await;
    (e, s.nri.plugin_names(), took, s.nri, s._dir)
}

fn plugin_error(e: &Error) -> &PluginError {
    match e {
        Error::Plugin { plugin, source, .. } => {
            assert_eq!(plugin, "10-bad");
            source
        }
        other => panic!("not a plugin error: {other:?}"),
    }
}

/// A plugin looping forever is interrupted at the request timeout: the
/// request fails (policy `fail`) within it, the plugin is dropped, the
/// next request goes on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_fails_that_request_at_its_deadline() {
    let wat = Wat::new().body("plugin_create_container", "(loop $l (br $l)) (i64.const 0)");
    let (e, left, took, nri, _d) = misbehave(wat, 64 << 20).await;
    assert!(
        matches!(plugin_error(&e), PluginError::Timeout(d) if *d == Duration::from_millis(500)),
        "{e:?}"
    );
    assert!(
        took >= Duration::from_millis(490) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    assert_eq!(left, ["20-good"]);
    let rsp = nri.create_container(request("c2")).await.unwrap();
    assert_eq!(env_of(&rsp), ["GOOD=from-wasm"]);
    nri.stop().await;
}

/// The same loop under `ignore`: the request goes on without the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_under_ignore_is_left_out() {
    let module = Wat::new()
        .answer("plugin_configure", &configure(&[api::Event::CREATE_CONTAINER]))
        .body("plugin_create_container", "(loop $l (br $l)) (i64.const 0)")
        .module();
    let s = start(
        &[("10-bad", module), ("20-good", adjuster("GOOD").module())],
        Duration::from_millis(300),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    let rsp = s.nri.create_container(request("c1")).await.unwrap();
    assert_eq!(env_of(&rsp), ["GOOD=from-wasm"]);
    assert_eq!(s.nri.plugin_names(), ["20-good"]);
    s.nri.stop().await;
}

/// Allocating without end stops at the memory limit; the error says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_allocation_stops_at_the_memory_limit() {
    // Grows by 16 pages until refused, then aborts as an allocator does.
    let wat = Wat::new().body(
        "plugin_create_container",
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) unreachable",
    );
    let (e, left, _, nri, _d) = misbehave(wat, 4 << 20).await;
    match plugin_error(&e) {
        PluginError::Wasm(WasmCallError::OutOfMemory { limit, .. }) => assert_eq!(*limit, 4 << 20),
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string().contains("10-bad")
            && std::error::Error::source(&e)
                .unwrap()
                .to_string()
                .contains("ran out of memory: its limit is 4194304 bytes"),
        "{e}"
    );
    assert_eq!(left, ["20-good"]);
    nri.stop().await;
}

/// A trap names the plugin and the trap, with the last stderr line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_is_reported_with_its_stderr() {
    let mut wat = Wat::new();
    let msg = wat.place(b"panicked at 'boom'\n");
    let (at, len) = ((msg >> 32) as i32, msg as u32 as i32);
    let iov = wat.place(&[&at.to_le_bytes()[..], &len.to_le_bytes()[..]].concat());
    let iov_at = (iov >> 32) as i32;
    let body =
        format!("(drop (call $fd_write (i32.const 2) (i32.const {iov_at}) (i32.const 1) (i32.const 8))) unreachable");
    let (e, left, _, nri, _d) = misbehave(wat.body("plugin_create_container", &body), 64 << 20).await;
    let source = plugin_error(&e).to_string();
    assert!(
        source.contains("trapped")
            && source.contains("unreachable")
            && source.contains("its last stderr lines: panicked at 'boom'"),
        "{source}"
    );
    assert_eq!(left, ["20-good"]);
    nri.stop().await;
}

/// An answer that does not decode, or lies outside the plugin's memory,
/// is garbage: the plugin is dropped, the error says what was wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_are_named() {
    let mut wat = Wat::new();
    let packed = wat.place(&[0xff, 0xff, 0xff, 0xff]);
    let (e, left, _, nri, _d) = misbehave(
        wat.body("plugin_create_container", &format!("(i64.const {packed})")),
        64 << 20,
    )
    .await;
    let text = plugin_error(&e).to_string();
    assert!(
        text.contains(
            "answered garbage: 4 bytes from plugin_create_container do not decode as CreateContainerResponse"
        ),
        "{text}"
    );
    assert_eq!(left, ["20-good"]);
    nri.stop().await;

    let outside = (0x7fff_0000_i64 << 32) | 100;
    let wat = Wat::new().body("plugin_create_container", &format!("(i64.const {outside})"));
    let (e, left, _, nri, _d) = misbehave(wat, 64 << 20).await;
    let text = plugin_error(&e).to_string();
    assert!(text.contains("lies outside its memory of 65536 bytes"), "{text}");
    assert_eq!(left, ["20-good"]);
    nri.stop().await;
}

/// `proc_exit` ends the plugin with its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_exit_ends_the_plugin() {
    let wat = Wat::new().body("plugin_create_container", "(call $exit (i32.const 3)) (i64.const 0)");
    let (e, left, _, nri, _d) = misbehave(wat, 64 << 20).await;
    assert!(
        matches!(plugin_error(&e), PluginError::Wasm(WasmCallError::Exited(3))),
        "{e:?}"
    );
    assert_eq!(left, ["20-good"]);
    nri.stop().await;
}

/// The plugin's own error text fails the request, as an error status from
/// a plugin process does, and the plugin stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_text_is_the_plugins_verdict() {
    let wat = Wat::new().error("plugin_create_container", "no room for c1");
    let (e, left, _, nri, _d) = misbehave(wat, 64 << 20).await;
    match plugin_error(&e) {
        PluginError::Returned { message, .. } => assert_eq!(message, "no room for c1"),
        other => panic!("{other:?}"),
    }
    assert_eq!(left, ["10-bad", "20-good"]);
    nri.stop().await;
}

/// Modules that cannot be plugins are left out with the reason; the
/// adaptation starts with the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_modules_are_left_out() {
    let mut old_version = adjuster("X");
    old_version.version = 2;
    let mut foreign_import = adjuster("X");
    foreign_import.imports = "  (import \"env\" \"open_socket\" (func (param i32) (result i32)))\n".into();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("10-no-configure", adjuster("X").without("plugin_configure").module()),
        ("11-version", old_version.module()),
        ("12-not-wasm-valid", b"\0asm\x01\0\0\0garbage".to_vec()),
        ("13-import", foreign_import.module()),
        (
            "14-configure-error",
            Wat::new().error("plugin_configure", "bad config").module(),
        ),
        ("15-init-loops", {
            let mut w = adjuster("X");
            w.extra = "  (func $spin (loop $l (br $l)))\n  (start $spin)\n".into();
            w.module()
        }),
        ("20-good", adjuster("GOOD").module()),
    ];
    // 15-init-loops: the registration timeout bounds its start.
    let opts = WasmOptions {
        memory_limit: 1 << 20,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    for (name, module) in &cases {
        install(&plugin_dir, name, module);
    }
    let nri = Adaptation::builder("wasm-test", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_disabled_connections()
        .with_plugin_path(&plugin_dir)
        .with_registration_timeout(Duration::from_millis(300))
        .with_wasm_options(opts)
        .build()
        .unwrap();
    let started = Instant::now();
    nri.start().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(nri.plugin_names(), ["20-good"]);
    nri.stop().await;
}

/// A module whose first memory is larger than its limit does not load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_above_the_limit_does_not_load() {
    let big = adjuster("BIG").module();
    let s = start(
        &[("10-big", big)],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions {
            memory_limit: 32 << 10,
            ..Default::default()
        },
    )
    .await;
    assert!(s.nri.plugin_names().is_empty());
    s.nri.stop().await;
}

/// No environment unless granted; a grant shows exactly the variables
/// granted to that plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_what_is_granted() {
    // Answers its whole environ buffer as an error text.
    let body = "(drop (call $env_sizes (i32.const 100) (i32.const 104))) (drop (call $env_get (i32.const 200) (i32.const 4096))) (i64.or (i64.or (i64.shl (i64.const 4096) (i64.const 32)) (i64.extend_i32_u (i32.load (i32.const 104)))) (i64.const 2147483648))";
    let module = Wat::new()
        .answer("plugin_configure", &configure(&[api::Event::CREATE_CONTAINER]))
        .body("plugin_create_container", body)
        .module();
    let s = start(
        &[("10-bad", module.clone())],
        Duration::from_secs(2),
        FailurePolicy::Fail,
        WasmOptions::default(),
    )
    .await;
    let e = s.nri.create_container(request("c1")).await.unwrap_err();
    match plugin_error(&e) {
        PluginError::Returned { message, .. } => assert_eq!(message, "", "no environment"),
        other => panic!("{other:?}"),
    }
    s.nri.stop().await;
    let mut opts = WasmOptions::default();
    let mut grants = WasmGrants::default();
    grants.env.insert("A".into(), "1".into());
    grants.env.insert("B".into(), "two".into());
    opts.plugins.insert("bad".into(), grants);
    let s = start(&[("10-bad", module)], Duration::from_secs(2), FailurePolicy::Fail, opts).await;
    let e = s.nri.create_container(request("c1")).await.unwrap_err();
    match plugin_error(&e) {
        PluginError::Returned { message, .. } => assert_eq!(message, "A=1\0B=two\0"),
        other => panic!("{other:?}"),
    }
    s.nri.stop().await;
}

/// A module built against NRI before v0.12 (no dedicated notification
/// exports, no UpdatePodSandbox or validation export) loads: its empty
/// subscription leaves out what it cannot take, and notifications reach
/// `plugin_state_change`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_module_gets_state_change() {
    let mut wat = Wat::new();
    for e in [
        "plugin_run_pod_sandbox",
        "plugin_update_pod_sandbox",
        "plugin_post_update_pod_sandbox",
        "plugin_stop_pod_sandbox",
        "plugin_remove_pod_sandbox",
        "plugin_post_create_container",
        "plugin_start_container",
        "plugin_post_start_container",
        "plugin_post_update_container",
        "plugin_remove_container",
        "plugin_validate_container_adjustment",
    ] {
        wat = wat.without(e);
    }
    // Configure answers 0: every event.
    let module = wat.error("plugin_state_change", "state change seen").module();
    let s = start(
        &[("10-old", module)],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    let pod = api::PodSandbox {
        id: "pod".into(),
        ..Default::default()
    };
    let e = s.nri.run_pod_sandbox(&pod).await.unwrap_err();
    assert!(format!("{e:?}").contains("state change seen"), "{e:?}");
    // Not subscribed to UpdatePodSandbox: nothing reaches it.
    s.nri
        .update_pod_sandbox(&api::UpdatePodSandboxRequest {
            pod: MessageField::some(pod),
            ..Default::default()
        })
        .await
        .unwrap();
    s.nri.stop().await;
}

/// An explicit subscription to an event the module has no export for is
/// refused at Configure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_without_its_export_is_refused() {
    let module = Wat::new()
        .without("plugin_validate_container_adjustment")
        .answer(
            "plugin_configure",
            &configure(&[api::Event::VALIDATE_CONTAINER_ADJUSTMENT]),
        )
        .module();
    let s = start(
        &[("10-v", module)],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    assert!(s.nri.plugin_names().is_empty());
    s.nri.stop().await;
}

/// env.log reaches the runtime's log with the plugin's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_the_plugin_name() {
    let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || Writer(sink.clone()))
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut wat = Wat::new();
    let log = api::LogRequest {
        msg: "WASM: Got create container request".into(),
        level: api::log_request::Level::LEVEL_INFO.into(),
        ..Default::default()
    };
    let packed = wat.place(&log.write_to_bytes().unwrap());
    let (at, len) = (packed >> 32, packed & 0xffff_ffff);
    let module = wat
        .answer("plugin_configure", &configure(&[api::Event::CREATE_CONTAINER]))
        .body(
            "plugin_create_container",
            &format!("(drop (call $log (i32.const {at}) (i32.const {len}))) (i64.const 0)"),
        )
        .module();
    let s = start(
        &[("10-logger", module)],
        Duration::from_secs(2),
        FailurePolicy::Ignore,
        WasmOptions::default(),
    )
    .await;
    s.nri.create_container(request("c1")).await.unwrap();
    s.nri.stop().await;
    let text = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("INFO")
            && l.contains("plugin=10-logger")
            && l.contains("WASM: Got create container request")),
        "{text}"
    );
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
