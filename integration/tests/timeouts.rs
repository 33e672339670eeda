//! Slow, failing and crashing plugins during a runtime request (R4), with
//! the default failure policy (= upstream NRI) and with policy `fail`.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use integration::{
    Behaviour, EventLog, Store, TestRuntime, container, create_request, pod, spawn_plugin, test_plugin_bin,
};
use nri_adaptation::{AdaptationBuilder, FailurePolicy, api};

fn env_adjust(key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({ "env": [{ "key": key, "value": value }] })
}

fn behaviour(log: &EventLog, adjust: Option<serde_json::Value>) -> Behaviour {
    Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer,StartContainer".into()),
        adjust,
        ..Default::default()
    }
}

/// A plugin whose CreateContainer sleeps 2.5 s for c1 only.
fn slow_on_c1(log: &EventLog) -> Behaviour {
    Behaviour {
        sleep_ms: [("CreateContainer".to_string(), 2500)].into(),
        only_container: Some("c1".into()),
        ..behaviour(log, Some(env_adjust("A", "a")))
    }
}

async fn runtime(request_timeout: Duration, tune: impl FnOnce(AdaptationBuilder) -> AdaptationBuilder) -> TestRuntime {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Mutex::new(Store::default()));
    let nri = tune(TestRuntime::builder(dir.path(), &store).with_request_timeout(request_timeout))
        .build()
        .unwrap();
    nri.start().await.unwrap();
    TestRuntime { nri, store, dir }
}

fn env_keys(rsp: &api::CreateContainerResponse) -> Vec<String> {
    rsp.adjust
        .as_ref()
        .map(|a| a.env.iter().map(|e| e.key.clone()).collect())
        .unwrap_or_default()
}

fn create(id: &str) -> api::CreateContainerRequest {
    create_request(&pod("p1"), &container("p1", id))
}

/// R4, default policy: a CreateContainer that misses the deadline does not
/// fail the container; the plugin's adjustment is left out, the plugin is
/// closed and removed before the next request, and later plugins still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_timeout_drops_plugin_and_create_succeeds_without_it() {
    let rt = runtime(Duration::from_secs(2), |b| b).await;
    let (log_a, log_b) = (rt.log("a.jsonl"), rt.log("b.jsonl"));
    let _a = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &slow_on_c1(&log_a));
    let _b = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "20",
        "b",
        &behaviour(&log_b, Some(env_adjust("B", "b"))),
    );
    rt.wait_plugins(&["10-a", "20-b"]).await;

    let rsp = rt.nri.create_container(create("c1")).await.unwrap();
    assert_eq!(env_keys(&rsp), ["B"], "10-a's adjustment is left out");
    assert_eq!(
        rt.nri.plugin_names(),
        ["20-b"],
        "10-a is removed before the next request"
    );
    let exit = log_a.wait_event("10-a", "Exit").await;
    assert!(!exit.error.is_empty(), "10-a sees its connection closed");

    let rsp = rt.nri.create_container(create("c2")).await.unwrap();
    assert_eq!(env_keys(&rsp), ["B"]);
    assert!(
        log_a.lines().iter().all(|l| l.container != "c2"),
        "c2 never reaches 10-a"
    );
    assert_eq!(log_b.of("20-b", "CreateContainer").len(), 2);
    rt.nri.stop().await;
}

/// R4: a plugin's own error fails the request, names the plugin, and the
/// plugin stays registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_plugin_error_fails_create_and_plugin_stays() {
    let rt = runtime(Duration::from_secs(2), |b| b).await;
    let log = rt.log("b.jsonl");
    let _b = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "20",
        "b",
        &Behaviour {
            fail: [("CreateContainer".to_string(), "boom".to_string())].into(),
            only_container: Some("c3".into()),
            ..behaviour(&log, None)
        },
    );
    rt.wait_plugins(&["20-b"]).await;

    let err = rt.nri.create_container(create("c3")).await.expect_err("20-b fails c3");
    // The plugin's text is the error's source; `{:#}` prints the chain as an embedder's edge would.
    let text = format!("{:#}", anyhow::Error::new(err));
    assert!(text.contains("boom"), "error carries the plugin's text: {text}");
    assert!(text.contains("20-b"), "error names the plugin: {text}");
    assert_eq!(rt.nri.plugin_names(), ["20-b"], "20-b stays registered");

    rt.nri.create_container(create("c4")).await.unwrap();
    rt.nri
        .start_container(&pod("p1"), &container("p1", "c4"))
        .await
        .unwrap();
    let later: Vec<(String, String)> = log
        .lines()
        .into_iter()
        .filter(|l| l.container == "c4")
        .map(|l| (l.event, l.container))
        .collect();
    assert_eq!(
        later,
        [
            ("CreateContainer".to_string(), "c4".to_string()),
            ("StartContainer".to_string(), "c4".to_string())
        ]
    );
    rt.nri.stop().await;
}

/// R4, decided behaviour with failure policy `fail`: the timed-out create
/// fails naming the plugin, and the slow plugin is kept (it is slow, not
/// broken), so it receives c2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_fail_policy_timeout_fails_create_and_keeps_plugin() {
    let rt = runtime(Duration::from_secs(2), |b| {
        b.with_failure_policy("a", FailurePolicy::Fail)
    })
    .await;
    let log = rt.log("a.jsonl");
    let _a = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &slow_on_c1(&log));
    rt.wait_plugins(&["10-a"]).await;

    let err = rt
        .nri
        .create_container(create("c1"))
        .await
        .expect_err("policy fail: timeout fails the create");
    assert!(err.to_string().contains("10-a"), "names the plugin: {err}");
    assert_eq!(rt.nri.plugin_names(), ["10-a"], "10-a stays registered");

    let rsp = rt.nri.create_container(create("c2")).await.unwrap();
    assert_eq!(env_keys(&rsp), ["A"], "10-a's adjustment applies to c2");
    let created: Vec<String> = log
        .of("10-a", "CreateContainer")
        .into_iter()
        .map(|l| l.container)
        .collect();
    assert_eq!(created, ["c1", "c2"]);
    assert!(log.of("10-a", "Exit").is_empty(), "10-a was not disconnected");
    rt.nri.stop().await;
}

fn crashing(log: &EventLog) -> Behaviour {
    Behaviour {
        exit_on: Some("CreateContainer".into()),
        ..behaviour(log, Some(env_adjust("A", "a")))
    }
}

/// Generous, so that a create returning long before it proves the crash was
/// noticed as a broken connection, not waited out.
const CRASH_TIMEOUT: Duration = Duration::from_secs(15);

/// R4: a plugin that dies in the middle of CreateContainer: with the default
/// policy the create succeeds without it and it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_crash_mid_request_default_policy_removes_plugin() {
    let rt = runtime(CRASH_TIMEOUT, |b| b).await;
    let log = rt.log("a.jsonl");
    let mut a = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &crashing(&log));
    rt.wait_plugins(&["10-a"]).await;

    let t0 = Instant::now();
    let rsp = rt.nri.create_container(create("c1")).await.unwrap();
    assert!(
        t0.elapsed() < CRASH_TIMEOUT / 2,
        "the crash is noticed without waiting for the request timeout ({:?})",
        t0.elapsed()
    );
    assert!(env_keys(&rsp).is_empty());
    assert!(rt.nri.plugin_names().is_empty(), "the crashed plugin is removed");
    assert_eq!(a.wait_exit().await, Some(17));
    rt.nri.create_container(create("c2")).await.unwrap();
    rt.nri.stop().await;
}

/// R4: the same crash with policy `fail` fails the create, naming the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_crash_mid_request_fail_policy_fails_create() {
    let rt = runtime(CRASH_TIMEOUT, |b| b.with_failure_policy("10-a", FailurePolicy::Fail)).await;
    let log = rt.log("a.jsonl");
    let mut a = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &crashing(&log));
    rt.wait_plugins(&["10-a"]).await;

    let t0 = Instant::now();
    let err = rt
        .nri
        .create_container(create("c1"))
        .await
        .expect_err("policy fail: a crash fails the create");
    assert!(t0.elapsed() < CRASH_TIMEOUT / 2, "took {:?}", t0.elapsed());
    assert!(err.to_string().contains("10-a"), "names the plugin: {err}");
    assert_eq!(a.wait_exit().await, Some(17));
    // A broken connection is removed whatever the policy.
    rt.wait_plugins(&[]).await;
    rt.nri.create_container(create("c2")).await.unwrap();
    rt.nri.stop().await;
}

/// R5 (containerd/nri#316): a required plugin counts as present only after
/// it answered. One that times out is dropped and the default validator
/// fails the create naming it; later creates fail too (the plugin is
/// gone), unless the pod tolerates missing plugins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_required_plugin_that_times_out_fails_the_create() {
    let rt = runtime(Duration::from_millis(500), |b| {
        b.with_default_validator(nri_adaptation::DefaultValidatorConfig {
            enable: true,
            required_plugins: vec!["image-policy".into()],
            tolerate_missing_plugins_annotation: "tolerate-missing-plugins.example.com".into(),
            ..Default::default()
        })
    })
    .await;
    let log = rt.log("p.jsonl");
    let _p = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "10",
        "image-policy",
        &Behaviour {
            sleep_ms: [("CreateContainer".to_string(), 3000)].into(),
            ..behaviour(&log, None)
        },
    );
    rt.wait_plugins(&["10-image-policy"]).await;
    for id in ["c1", "c2"] {
        let e = rt.nri.create_container(create(id)).await.unwrap_err().to_string();
        assert!(
            e.contains("default-validator") && e.contains("image-policy"),
            "{id}: {e}"
        );
    }
    assert!(rt.nri.plugin_names().is_empty(), "{:?}", rt.nri.plugin_names());
    let mut tolerant = pod("p1");
    tolerant
        .annotations
        .insert("tolerate-missing-plugins.example.com".into(), "true".into());
    rt.nri
        .create_container(create_request(&tolerant, &container("p1", "c3")))
        .await
        .expect("a tolerant pod runs without the required plugin");
    rt.nri.stop().await;
}
