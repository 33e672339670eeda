//! A container created while a plugin joins is either in the plugin's
//! Synchronize or gets its CreateContainer, never neither, whatever the
//! runtime does: it holds no sync block, and it records the container in
//! its own state only some time after CreateContainer returned.

use std::time::Duration;

use integration::{Behaviour, TestRuntime, container, create_request, spawn_plugin, test_plugin_bin, wait_until};

/// How long the runtime takes, after CreateContainer returned, to record
/// the container (the shim creates it with libcontainer first).
const RECORD_LAG: Duration = Duration::from_millis(5);

/// When, in the plugin's joining, the container is created.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Right after the plugin process was started (usually before it
    /// connects: then the container is simply in the runtime's state).
    Spawned,
    /// When the plugin got Configure: before or while the runtime is asked
    /// for its state, so the container is not recorded there yet.
    Configured,
    /// When the plugin got Synchronize, its payload already sent.
    Synchronizing,
    /// Late in the plugin's Synchronize.
    LateInSync,
}

const PHASES: [When; 4] = [When::Spawned, When::Configured, When::Synchronizing, When::LateInSync];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_created_while_a_plugin_joins_is_synced_or_created_100_of_100() {
    let rt = TestRuntime::start(Duration::from_secs(10)).await;
    let (pod, _) = rt.add("p", "existing");
    let log = rt.log("plugins.jsonl");
    let mut neither = Vec::new();
    for i in 0..100 {
        let when = PHASES[i % PHASES.len()];
        let name = format!("a{i}");
        let plugin = format!("10-{name}");
        let behaviour = Behaviour {
            events: Some("CreateContainer".into()),
            log: Some(log.path().to_path_buf()),
            sleep_ms: [("Synchronize".to_string(), 50)].into(),
            ..Default::default()
        };
        let proc = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", &name, &behaviour);
        match when {
            When::Spawned => {}
            When::Configured => {
                log.wait_event(&plugin, "Configure").await;
            }
            When::Synchronizing => {
                log.wait_event(&plugin, "Synchronize").await;
            }
            When::LateInSync => {
                log.wait_event(&plugin, "Synchronize").await;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
        let id = format!("c{i}");
        let ctr = container("p", &id);
        rt.nri
            .create_container(create_request(&pod, &ctr))
            .await
            .unwrap_or_else(|e| panic!("create {id}: {e}"));
        tokio::time::sleep(RECORD_LAG).await;
        rt.store.lock().unwrap().containers.insert(id.clone(), ctr);
        rt.wait_plugins(&[plugin.as_str()]).await;
        let synced = log
            .of(&plugin, "Synchronize")
            .iter()
            .any(|l| l.containers.contains(&id));
        let created = log.of(&plugin, "CreateContainer").iter().any(|l| l.container == id);
        if !synced && !created {
            neither.push((id, when));
        }
        drop(proc);
        wait_until("the plugin gone", || rt.nri.plugin_names().is_empty()).await;
    }
    assert!(
        neither.is_empty(),
        "containers in neither Synchronize nor CreateContainer: {neither:?}"
    );
    rt.nri.stop().await;
}
