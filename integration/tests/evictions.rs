//! Evictions in CreateContainer replies reach the runtime's evict callback,
//! as those of UpdateContainer replies and unsolicited UpdateContainers do.

use std::time::Duration;

use integration::{Behaviour, TestRuntime, create_request, spawn_plugin, test_plugin_bin, wait_until};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn evicted(rt: &TestRuntime) -> Vec<(String, String)> {
    let s = rt.store.lock().unwrap();
    s.evicted
        .iter()
        .map(|e| (e.container_id.clone(), e.reason.clone()))
        .collect()
}

/// A plugin that makes room for a new container by evicting another in its
/// CreateContainer reply: the runtime's evict callback gets the eviction
/// with the plugin's reason, once, and the create succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_in_create_reply_reaches_evict_callback() {
    let rt = TestRuntime::start(REQUEST_TIMEOUT).await;
    let (_, _victim) = rt.add("p1", "victim");
    let behaviour = Behaviour {
        events: Some("CreateContainer".into()),
        create_reply_evicts: Some("victim".into()),
        ..Default::default()
    };
    let _plugin = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "evictor", &behaviour);
    rt.wait_plugins(&["10-evictor"]).await;
    let (pod, ctr) = (integration::pod("p1"), integration::container("p1", "new"));
    rt.nri
        .create_container(create_request(&pod, &ctr))
        .await
        .expect("create succeeds");
    // Delivered before create_container returned.
    assert_eq!(
        evicted(&rt),
        vec![("victim".to_string(), "evicted in the reply of 10-evictor".to_string())]
    );
    rt.nri.stop().await;
}

/// The eviction is delivered even when a later plugin fails the create:
/// it concerns another container, and the evicting plugin acted on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_in_create_reply_is_delivered_when_the_create_fails() {
    let rt = TestRuntime::start(REQUEST_TIMEOUT).await;
    rt.add("p1", "victim");
    let evictor = Behaviour {
        events: Some("CreateContainer".into()),
        create_reply_evicts: Some("victim".into()),
        ..Default::default()
    };
    let failer = Behaviour {
        events: Some("CreateContainer".into()),
        fail: [("CreateContainer".to_string(), "no room".to_string())].into(),
        ..Default::default()
    };
    let _a = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "evictor", &evictor);
    let _b = spawn_plugin(test_plugin_bin!(), &rt.sock(), "20", "failer", &failer);
    wait_until("both plugins", || rt.nri.plugin_names().len() == 2).await;
    let (pod, ctr) = (integration::pod("p1"), integration::container("p1", "new"));
    let e = rt
        .nri
        .create_container(create_request(&pod, &ctr))
        .await
        .expect_err("20-failer fails the create");
    let source = std::error::Error::source(&e)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(
        e.to_string().contains("20-failer") && source.contains("no room"),
        "{e}: {source}"
    );
    assert_eq!(evicted(&rt).len(), 1, "{:?}", evicted(&rt));
    assert_eq!(evicted(&rt)[0].0, "victim");
    rt.nri.stop().await;
}

/// What nri-replay prints: the report of a create keeps each plugin's
/// answer as sent, its evictions included, while the evict callback still
/// gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_report_keeps_the_evictions_a_plugin_answered() {
    let rt = TestRuntime::start(REQUEST_TIMEOUT).await;
    rt.add("p1", "victim");
    let behaviour = Behaviour {
        events: Some("CreateContainer".into()),
        create_reply_evicts: Some("victim".into()),
        ..Default::default()
    };
    let _plugin = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "evictor", &behaviour);
    rt.wait_plugins(&["10-evictor"]).await;
    let (pod, ctr) = (integration::pod("p1"), integration::container("p1", "new"));
    let (r, report) = rt.nri.create_container_with_report(create_request(&pod, &ctr)).await;
    r.expect("create succeeds");
    let answered: Vec<String> = report
        .plugins
        .iter()
        .filter_map(|p| p.response.as_ref())
        .flat_map(|rsp| rsp.evict.iter().map(|e| e.container_id.clone()))
        .collect();
    assert_eq!(answered, ["victim"], "{report:?}");
    assert_eq!(evicted(&rt).len(), 1, "{:?}", evicted(&rt));
    rt.nri.stop().await;
}
