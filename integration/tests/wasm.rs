//! WebAssembly plugins through the adaptation, with the Rust guests of
//! `plugins/wasm` (built by its build script with Debian's rustc for
//! wasm32-wasi: real protobuf decoding, real WASI imports of a
//! toolchain's standard library), next to plugin processes
//! (`nri-test-plugin`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use integration::{Behaviour, Store, TestRuntime, create_request, install_plugin, test_plugin_bin};
use nri_adaptation::{
    Error, FailurePolicy, FieldGroup, Observer, Outcome, Permissions, PluginError, Rejection, adjust, api,
    wasm::{WasmCallError, WasmGrants, WasmOptions},
};
use nri_wasm_plugins as guests;

struct Wasm {
    rt: TestRuntime,
}

/// A runtime whose plugin directory holds `plugins` (module path, file
/// name, drop-in config), with `configure` applied to its builder.
async fn runtime(
    plugins: &[(&str, &str, &str)],
    timeout: Duration,
    configure: impl FnOnce(nri_adaptation::AdaptationBuilder) -> nri_adaptation::AdaptationBuilder,
) -> Wasm {
    let dir = tempfile::tempdir().unwrap();
    let (plugin_dir, conf_dir) = (dir.path().join("plugins"), dir.path().join("conf.d"));
    std::fs::create_dir_all(&plugin_dir).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    for (module, file, conf) in plugins {
        guests::install(module, &plugin_dir, file).unwrap();
        std::fs::write(conf_dir.join(format!("{file}.conf")), conf).unwrap();
    }
    let store = Arc::new(Mutex::new(Store::default()));
    let builder = TestRuntime::builder(dir.path(), &store)
        .with_request_timeout(timeout)
        .with_disabled_connections();
    let nri = configure(builder).build().unwrap();
    nri.start().await.unwrap();
    Wasm {
        rt: TestRuntime { nri, store, dir },
    }
}

const ADJUSTER_CONF: &str = "\
env WASM_ADJUSTED=yes
mount /mnt/wasm /var/lib/wasm bind rbind,ro
annotation wasm.nri.io/adjusted=true
memory-limit 134217728
cpu-shares 256
host-env NODE_NAME
host-env NOT_GRANTED
host-file /etc/hostname HOSTNAME_FILE
container app
log
";

fn busybox_spec() -> oci_spec::runtime::Spec {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/oci/busybox.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn request(ctr: &str) -> api::CreateContainerRequest {
    let pod = integration::pod("pod1");
    let mut c = integration::container("pod1", ctr);
    c.name = ctr.into();
    create_request(&pod, &c)
}

/// The adjuster, configured from its drop-in file, adjusts env, mounts,
/// annotations and resources; the granted variable reaches it, the
/// ungranted one and the file system do not; the adjustment applies to
/// an OCI spec like a plugin process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adjuster_adjusts_env_mounts_and_resources() {
    let mut wasm = WasmOptions::default();
    let mut grants = WasmGrants::default();
    grants.env.insert("NODE_NAME".into(), "node-7".into());
    wasm.plugins.insert("adjuster".into(), grants);
    let w = runtime(
        &[(guests::ADJUSTER, "10-adjuster", ADJUSTER_CONF)],
        Duration::from_secs(2),
        |b| b.with_wasm_options(wasm),
    )
    .await;
    assert_eq!(w.rt.nri.plugin_names(), ["10-adjuster"]);
    let rsp = w.rt.nri.create_container(request("app")).await.unwrap();
    let env: Vec<String> = rsp
        .adjust
        .env
        .iter()
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    assert_eq!(
        env,
        [
            "WASM_ADJUSTED=yes",
            "NODE_NAME=node-7",
            "NOT_GRANTED=unset",
            "HOSTNAME_FILE=unreadable"
        ]
    );
    assert_eq!(rsp.adjust.mounts.len(), 1);
    assert_eq!(rsp.adjust.mounts[0].destination, "/mnt/wasm");
    assert_eq!(rsp.adjust.mounts[0].options, ["rbind", "ro"]);
    assert_eq!(
        rsp.adjust.annotations.get("wasm.nri.io/adjusted").map(String::as_str),
        Some("true")
    );
    let res = rsp.adjust.linux.resources.get_or_default();
    assert_eq!(res.memory.limit.value, 128 << 20);
    assert_eq!(res.cpu.shares.value, 256);

    let mut spec = busybox_spec();
    adjust(&mut spec, &rsp.adjust).unwrap();
    let process_env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(
        process_env.contains(&"WASM_ADJUSTED=yes".to_string()),
        "{process_env:?}"
    );
    assert!(
        spec.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.destination().to_str() == Some("/mnt/wasm"))
    );
    let limit = spec
        .linux()
        .as_ref()
        .unwrap()
        .resources()
        .as_ref()
        .unwrap()
        .memory()
        .as_ref()
        .unwrap()
        .limit();
    assert_eq!(limit, Some(128 << 20));

    // `container app`: another container is left alone.
    let rsp = w.rt.nri.create_container(request("sidecar")).await.unwrap();
    assert!(rsp.adjust.env.is_empty());
    w.rt.nri.stop().await;
}

/// Next to a plugin process: both adjustments merge; the same variable set
/// by both is a conflict naming both, as between two processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_to_a_process_and_in_conflict_with_it() {
    let dir_conf = "env FROM_WASM=1\n";
    let w = runtime(
        &[(guests::ADJUSTER, "10-adjuster", dir_conf)],
        Duration::from_secs(2),
        |b| b,
    )
    .await;
    let behaviour = |key: &str| Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({"env": [{"key": key, "value": "1"}]})),
        ..Default::default()
    };
    let plugins = w.rt.dir.path().join("plugins");
    let conf = w.rt.dir.path().join("conf.d");
    install_plugin(
        test_plugin_bin!(),
        &plugins,
        &conf,
        "20-process",
        &behaviour("FROM_PROCESS"),
    );
    let r = w.rt.nri.rescan_plugins().await.unwrap();
    assert_eq!(r.started, ["20-process"]);
    let rsp = w.rt.nri.create_container(request("c1")).await.unwrap();
    let keys: Vec<&str> = rsp.adjust.env.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["FROM_WASM", "FROM_PROCESS"]);

    install_plugin(test_plugin_bin!(), &plugins, &conf, "30-clash", &behaviour("FROM_WASM"));
    let r = w.rt.nri.rescan_plugins().await.unwrap();
    assert_eq!(r.started, ["30-clash"]);
    let e = w.rt.nri.create_container(request("c2")).await.unwrap_err();
    let Error::Merge(m) = &e else { panic!("{e:?}") };
    let text = m.to_string();
    assert!(
        text.contains("10-adjuster") && text.contains("30-clash") && text.contains("FROM_WASM"),
        "{text}"
    );
    w.rt.nri.stop().await;
}

/// Records what the adaptation reports to a runtime's observer (the
/// shim's metrics).
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, &'static str, Outcome)>>,
    rejected: Mutex<Vec<(String, Rejection)>>,
}

impl Observer for Seen {
    fn request(&self, plugin: &str, request: &'static str, _elapsed: Duration, outcome: Outcome) {
        self.requests
            .lock()
            .unwrap()
            .push((plugin.to_string(), request, outcome));
    }

    fn rejected(&self, plugin: &str, rejection: Rejection) {
        self.rejected.lock().unwrap().push((plugin.to_string(), rejection));
    }
}

/// A WebAssembly plugin's requests and refusals reach the observer (the
/// shim's metrics) as a process's do, with its name and request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_refusals_are_observed() {
    let seen = Arc::new(Seen::default());
    let observer = seen.clone();
    let w = runtime(
        &[(guests::ADJUSTER, "10-adjuster", ADJUSTER_CONF)],
        Duration::from_secs(2),
        |b| {
            b.with_observer(observer)
                .with_plugin_permissions("adjuster", Permissions::allowing([FieldGroup::Env]))
        },
    )
    .await;
    // Ignored (policy ignore): the answer is left out, the refusal observed.
    let rsp = w.rt.nri.create_container(request("app")).await.unwrap();
    assert!(rsp.adjust.env.is_empty());
    w.rt.nri.stop().await;
    let requests = seen.requests.lock().unwrap().clone();
    for r in ["Configure", "Synchronize", "CreateContainer"] {
        assert!(
            requests
                .iter()
                .any(|(p, q, o)| p == "10-adjuster" && *q == r && *o == Outcome::Ok),
            "{r}: {requests:?}"
        );
    }
    let rejected = seen.rejected.lock().unwrap().clone();
    assert_eq!(rejected, [("10-adjuster".to_string(), Rejection::Permission)]);
}

/// Per-plugin permissions hold for a WebAssembly plugin: mounts outside
/// them refuse its answer (policy `fail`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_hold() {
    let w = runtime(
        &[(guests::ADJUSTER, "10-adjuster", ADJUSTER_CONF)],
        Duration::from_secs(2),
        |b| {
            b.with_plugin_permissions("adjuster", Permissions::allowing([FieldGroup::Env]))
                .with_failure_policy("adjuster", FailurePolicy::Fail)
        },
    )
    .await;
    let e = w.rt.nri.create_container(request("app")).await.unwrap_err();
    assert!(matches!(e, Error::Permission(_)), "{e:?}");
    assert!(e.to_string().contains("10-adjuster"), "{e}");
    w.rt.nri.stop().await;
}

/// The adjuster as a validator: it rejects an adjustment setting a
/// variable it forbids (a process plugin's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adjuster_validates() {
    let w = runtime(
        &[(
            guests::ADJUSTER,
            "90-validator",
            "reject-env FORBIDDEN\ncontainer none\n",
        )],
        Duration::from_secs(2),
        |b| b,
    )
    .await;
    let behaviour = Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({"env": [{"key": "FORBIDDEN", "value": "1"}]})),
        ..Default::default()
    };
    install_plugin(
        test_plugin_bin!(),
        &w.rt.dir.path().join("plugins"),
        &w.rt.dir.path().join("conf.d"),
        "10-process",
        &behaviour,
    );
    w.rt.nri.rescan_plugins().await.unwrap();
    let e = w.rt.nri.create_container(request("c1")).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("90-validator") && text.contains("FORBIDDEN is not allowed by the WASM adjuster"),
        "{text}"
    );
    w.rt.nri.stop().await;
}

/// One misbehaviour of the misbehaving guest at CreateContainer (policy
/// `fail`, 500 ms timeout, 16 MiB): the error of the request, how long
/// it took, the plugins left; the next request goes on.
async fn misbehave(what: &str) -> (PluginError, Duration, Vec<String>) {
    let conf = format!("create_container {what}\n");
    let w = runtime(
        &[
            (guests::MISBEHAVE, "10-bad", conf.as_str()),
            (guests::ADJUSTER, "20-good", "env GOOD=1\n"),
        ],
        Duration::from_millis(500),
        |b| {
            b.with_default_failure_policy(FailurePolicy::Fail)
                .with_wasm_options(WasmOptions {
                    memory_limit: 16 << 20,
                    ..Default::default()
                })
        },
    )
    .await;
    assert_eq!(w.rt.nri.plugin_names(), ["10-bad", "20-good"]);
    let started = Instant::now();
    let e = w.rt.nri.create_container(request("c1")).await.unwrap_err();
    let took = started.elapsed();
    let Error::Plugin { plugin, source, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(plugin, "10-bad");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = w.rt.nri.plugin_names();
    if left == ["20-good"] {
        let rsp = w.rt.nri.create_container(request("c2")).await.unwrap();
        assert_eq!(rsp.adjust.env.len(), 1, "the runtime goes on");
    }
    w.rt.nri.stop().await;
    (source, took, left)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_guest_fails_its_request_at_the_deadline() {
    let (e, took, left) = misbehave("loop").await;
    assert!(matches!(e, PluginError::Timeout(_)), "{e:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(left, ["20-good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocating_guest_stops_at_its_memory_limit() {
    let (e, took, left) = misbehave("alloc").await;
    assert!(
        matches!(e, PluginError::Wasm(WasmCallError::OutOfMemory { limit, .. }) if limit == 16 << 20),
        "{e:?}"
    );
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(left, ["20-good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_guest_is_reported_with_its_message() {
    let (e, _, left) = misbehave("panic").await;
    let text = e.to_string();
    assert!(matches!(e, PluginError::Wasm(WasmCallError::Trap { .. })), "{e:?}");
    assert!(text.contains("misbehave: told to panic in create_container"), "{text}");
    assert_eq!(left, ["20-good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_answer_is_named() {
    let (e, _, left) = misbehave("garbage").await;
    assert!(
        e.to_string().contains("do not decode as CreateContainerResponse"),
        "{e}"
    );
    assert_eq!(left, ["20-good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exiting_guest_is_reported_with_its_status() {
    let (e, _, left) = misbehave("exit").await;
    assert!(matches!(e, PluginError::Wasm(WasmCallError::Exited(7))), "{e:?}");
    assert_eq!(left, ["20-good"]);
}

/// A module with no plugin exports is left out; the stand-in of
/// upstream's sample subscribes to everything and answers every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_answers_every_event() {
    let w = runtime(
        &[
            (guests::SAMPLE, "10-sample", ""),
            (guests::NO_EXPORTS, "20-nothing", ""),
        ],
        Duration::from_secs(2),
        |b| b,
    )
    .await;
    assert_eq!(w.rt.nri.plugin_names(), ["10-sample"]);
    let (pod, ctr) = w.rt.add("pod1", "c1");
    w.rt.nri.run_pod_sandbox(&pod).await.unwrap();
    w.rt.nri.create_container(create_request(&pod, &ctr)).await.unwrap();
    w.rt.nri.post_create_container(&pod, &ctr).await.unwrap();
    w.rt.nri.start_container(&pod, &ctr).await.unwrap();
    w.rt.nri
        .stop_container(api::StopContainerRequest {
            pod: Some(pod.clone()).into(),
            container: Some(ctr.clone()).into(),
            ..Default::default()
        })
        .await
        .unwrap();
    w.rt.nri.remove_container(&pod, &ctr).await.unwrap();
    w.rt.nri.stop_pod_sandbox(&pod).await.unwrap();
    w.rt.nri.remove_pod_sandbox(&pod).await.unwrap();
    assert_eq!(w.rt.nri.plugin_names(), ["10-sample"]);
    w.rt.nri.stop().await;
}
