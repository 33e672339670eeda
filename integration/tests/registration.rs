//! Registration, configuration, ordering and subscriptions with real plugin processes.

use std::time::Duration;

use integration::{Behaviour, TestRuntime, create_request, spawn_plugin, test_plugin_bin};

fn logging(log: &integration::EventLog, events: Option<&str>) -> Behaviour {
    Behaviour {
        log: Some(log.path().to_path_buf()),
        events: events.map(str::to_string),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_plugin_registers_is_configured_synced_and_gets_events() {
    let rt = TestRuntime::start(Duration::from_secs(2)).await;
    let (pod, ctr) = rt.add("p0", "c0");
    let log = rt.log("events.jsonl");
    let _p = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &logging(&log, None));
    rt.wait_plugins(&["10-a"]).await;

    let cfg = log.wait_event("10-a", "Configure").await;
    assert_eq!(cfg.runtime, "nri-test-runtime/1.2.3");
    assert_eq!(cfg.timeouts_ms, (5000, 2000));
    assert_eq!(cfg.nri_version, nri_proto::NRI_VERSION);
    assert_eq!(cfg.config, "", "external plugins get no config");
    let sync = log.wait_event("10-a", "Synchronize").await;
    assert_eq!(
        (sync.pods, sync.containers),
        (vec!["p0".to_string()], vec!["c0".to_string()])
    );

    let (pod1, ctr1) = (integration::pod("p1"), integration::container("p1", "c1"));
    rt.nri.run_pod_sandbox(&pod1).await.unwrap();
    rt.nri.create_container(create_request(&pod1, &ctr1)).await.unwrap();
    rt.nri.post_create_container(&pod1, &ctr1).await.unwrap();
    rt.nri.start_container(&pod1, &ctr1).await.unwrap();
    rt.nri
        .stop_container(nri_proto::api::StopContainerRequest {
            pod: protobuf::MessageField::some(pod.clone()),
            container: protobuf::MessageField::some(ctr.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    rt.nri.remove_container(&pod, &ctr).await.unwrap();
    rt.nri.stop_pod_sandbox(&pod).await.unwrap();
    rt.nri.remove_pod_sandbox(&pod).await.unwrap();
    let events: Vec<String> = log
        .wait_for("all events", |l| l.iter().any(|x| x.event == "RemovePodSandbox"))
        .await
        .into_iter()
        .map(|l| {
            format!(
                "{} {}{}",
                l.event,
                l.pod,
                if l.container.is_empty() {
                    String::new()
                } else {
                    format!("/{}", l.container)
                }
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            "Configure ",
            "Synchronize ",
            "RunPodSandbox p1",
            "CreateContainer p1/c1",
            // Subscribed to every event, the plugin is also a validator.
            "ValidateContainerAdjustment p1/c1",
            "PostCreateContainer p1/c1",
            "StartContainer p1/c1",
            "StopContainer p0/c0",
            "RemoveContainer p0/c0",
            "StopPodSandbox p0",
            "RemovePodSandbox p0",
        ]
    );
    rt.nri.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_run_in_index_order_then_name_order() {
    let rt = TestRuntime::start(Duration::from_secs(2)).await;
    let log = rt.log("events.jsonl");
    let b = logging(&log, Some("CreateContainer"));
    let mut procs = Vec::new();
    for (idx, name) in [("20", "b"), ("10", "z"), ("10", "a"), ("05", "x")] {
        procs.push(spawn_plugin(test_plugin_bin!(), &rt.sock(), idx, name, &b));
    }
    rt.wait_plugins(&["05-x", "10-a", "10-z", "20-b"]).await;
    let (pod, ctr) = (integration::pod("p1"), integration::container("p1", "c1"));
    rt.nri.create_container(create_request(&pod, &ctr)).await.unwrap();
    let order: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.event == "CreateContainer")
        .map(|l| l.plugin)
        .collect();
    assert_eq!(order, ["05-x", "10-a", "10-z", "20-b"]);
    rt.nri.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_subscribed_events_are_delivered() {
    let rt = TestRuntime::start(Duration::from_secs(2)).await;
    let log = rt.log("events.jsonl");
    let _a = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "10",
        "pods",
        &logging(&log, Some("pod")),
    );
    let _b = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "20",
        "starts",
        &logging(&log, Some("StartContainer")),
    );
    rt.wait_plugins(&["10-pods", "20-starts"]).await;
    let (pod, ctr) = (integration::pod("p1"), integration::container("p1", "c1"));
    rt.nri.run_pod_sandbox(&pod).await.unwrap();
    rt.nri.create_container(create_request(&pod, &ctr)).await.unwrap();
    rt.nri.start_container(&pod, &ctr).await.unwrap();
    rt.nri.remove_pod_sandbox(&pod).await.unwrap();
    let seen: Vec<(String, String)> = log
        .lines()
        .into_iter()
        .filter(|l| l.event != "Configure" && l.event != "Synchronize")
        .map(|l| (l.plugin, l.event))
        .collect();
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        seen,
        [
            s("10-pods", "RunPodSandbox"),
            s("20-starts", "StartContainer"),
            s("10-pods", "RemovePodSandbox")
        ]
    );
    rt.nri.stop().await;
}
