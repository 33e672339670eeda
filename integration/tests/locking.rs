//! Lock order between the adaptation and a runtime with a lock of its own:
//! registration vs StartContainer (R7), plugin-initiated UpdateContainers vs
//! CRI UpdateContainerResources (R8).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use integration::{
    Behaviour, LockedRuntime, container, cpu_update, create_request, pod, spawn_plugin, test_plugin_bin,
};
use nri_adaptation::api;
use nri_stub::{BoxError, EventMask, Plugin, Stub};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long R7 waits for each plugin to register.
const REGISTRATION_DEADLINE: Duration = Duration::from_secs(20);

/// R7: 100 times, an external plugin connects (its sync callback takes the
/// runtime lock) while 10 concurrent StartContainer calls take the runtime
/// lock and then call into NRI, the containerd order that deadlocked
/// upstream. Every call completes within the request timeout and every
/// plugin registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_registration_vs_start_container_never_deadlocks() {
    let rt = Arc::new(LockedRuntime::start(REQUEST_TIMEOUT).await);
    let mut ctrs = Vec::new();
    for i in 0..10 {
        ctrs.push(rt.add("p1", &format!("c{i}")));
    }
    let behaviour = Behaviour {
        events: Some("StartContainer".into()),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut calls_total = 0usize;
    for iteration in 0..100 {
        let plugin = spawn_plugin(test_plugin_bin!(), &rt.sock(), "10", "a", &behaviour);
        // A plugin that never registers (one refused, its process gone)
        // fails the test instead of leaving the tasks below looping.
        let registers_by = Instant::now() + REGISTRATION_DEADLINE;
        // Each task keeps starting its container until the plugin is active,
        // so the calls overlap registration, sync and activation.
        let tasks: Vec<_> = ctrs
            .iter()
            .cloned()
            .enumerate()
            .map(|(k, (p, c))| {
                let rt = rt.clone();
                tokio::spawn(async move {
                    let mut calls = 0usize;
                    loop {
                        let registered = !rt.nri.plugin_names().is_empty();
                        let call = async {
                            // Half the calls also hold off plugin sync the
                            // documented way: before the runtime lock.
                            let _block = if k % 2 == 0 {
                                Some(rt.nri.block_plugin_sync().await)
                            } else {
                                None
                            };
                            rt.start_container(&p, &c).await
                        };
                        tokio::time::timeout(REQUEST_TIMEOUT, call)
                            .await
                            .unwrap_or_else(|_| panic!("iteration {iteration}: StartContainer({}) hung", c.id))
                            .unwrap_or_else(|e| panic!("iteration {iteration}: StartContainer failed: {e}"));
                        calls += 1;
                        if registered {
                            return calls;
                        }
                        assert!(
                            Instant::now() < registers_by,
                            "iteration {iteration}: plugin 10-a not registered after {REGISTRATION_DEADLINE:?} \
                             (see its nri-test-plugin line on stderr)"
                        );
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            calls_total += t.await.expect("start task panicked");
        }
        rt.wait_plugins(&["10-a"]).await;
        drop(plugin); // kills the process
        rt.wait_plugins(&[]).await;
    }
    assert!(calls_total >= 1000);
    eprintln!(
        "r7: 100 registrations, {calls_total} StartContainer calls in {:?}",
        t0.elapsed()
    );
    rt.nri.stop().await;
}

/// An in-process plugin subscribed to UpdateContainer that changes nothing.
struct Reconciler;

#[nri_stub::async_trait]
impl Plugin for Reconciler {
    async fn update_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
        _resources: &api::LinuxResources,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        Ok(api::UpdateContainerResponse::new())
    }
}

fn shares(v: u64) -> api::LinuxResources {
    cpu_update("x", Some(v), None).linux.resources.clone().unwrap()
}

/// R8: 1,000 times, a plugin's UpdateContainers(c1 cpus 0-1) races the CRI
/// UpdateContainerResources(c1 shares 512), which holds the runtime lock
/// that the update callback also takes while NRI relays UpdateContainer to
/// that same plugin. No iteration hangs; c1 always ends as the last applied
/// update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_plugin_update_containers_vs_cri_update_never_deadlocks() {
    let rt = LockedRuntime::start(REQUEST_TIMEOUT).await;
    let (p1, c1) = rt.add("p1", "c1");
    let handle = Stub::builder(Reconciler)
        .with_plugin_name("reconciler")
        .with_plugin_idx("10")
        .with_socket_path(rt.sock())
        .with_events(EventMask::parse("UpdateContainer,PostUpdateContainer").unwrap())
        .build()
        .unwrap()
        .start()
        .await
        .unwrap();
    rt.wait_plugins(&["10-reconciler"]).await;

    let plugin_update = cpu_update("c1", None, Some("0-1"));
    let (mut plugin_last, mut cri_last) = (0, 0);
    for i in 0..1000 {
        let (from_plugin, from_cri) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(
                handle.update_containers(vec![plugin_update.clone()], Vec::new()),
                rt.update_container_resources(&p1, &c1, shares(512)),
            )
        })
        .await
        .unwrap_or_else(|_| panic!("iteration {i}: deadlock"));
        assert_eq!(from_plugin.expect("UpdateContainers"), Vec::new());
        from_cri.expect("UpdateContainerResources");
        let s = rt.store.lock().unwrap();
        let last = s.applied.last().unwrap().linux.resources.clone().unwrap();
        assert_eq!(
            s.resources("c1").unwrap(),
            last,
            "iteration {i}: c1 is not the last applied update"
        );
        if last.cpu.cpus == "0-1" {
            plugin_last += 1;
        } else {
            cri_last += 1;
        }
    }
    eprintln!("r8: plugin update applied last {plugin_last}x, CRI update last {cri_last}x");
    assert_eq!(rt.store.lock().unwrap().applied.len(), 2000);
    assert_eq!(rt.nri.plugin_names(), ["10-reconciler"]);
    handle.stop();
    rt.nri.stop().await;
}

/// R8: UpdateContainers with an unknown container applies the known one and
/// reports exactly the unknown one as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_update_containers_reports_unknown_container_as_failed() {
    let rt = LockedRuntime::start(REQUEST_TIMEOUT).await;
    rt.add("p1", "c1");
    let handle = Stub::builder(Reconciler)
        .with_plugin_name("reconciler")
        .with_plugin_idx("10")
        .with_socket_path(rt.sock())
        .with_events(EventMask::parse("UpdateContainer").unwrap())
        .build()
        .unwrap()
        .start()
        .await
        .unwrap();
    rt.wait_plugins(&["10-reconciler"]).await;
    let good = cpu_update("c1", None, Some("0-1"));
    let nope = cpu_update("nope", Some(2), None);
    let failed = handle
        .update_containers(vec![good.clone(), nope.clone()], Vec::new())
        .await
        .unwrap();
    assert_eq!(failed, vec![nope]);
    {
        let s = rt.store.lock().unwrap();
        assert_eq!(s.applied, vec![good.clone()]);
        assert_eq!(s.resources("c1").unwrap(), good.linux.resources.clone().unwrap());
    }
    handle.stop();
    rt.nri.stop().await;
}

/// R8: a plugin calling UpdateContainers from inside its CreateContainer
/// handler does not deadlock the create: the update is applied while the
/// create is in flight and the create returns well within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_update_containers_from_create_handler_does_not_deadlock() {
    let rt = LockedRuntime::start(REQUEST_TIMEOUT).await;
    rt.add("p0", "c0");
    let update = serde_json::json!({
        "containerId": "c0",
        "linux": { "resources": { "cpu": { "cpus": "2-3" } } }
    });
    let log = integration::EventLog::new(rt.dir.path().join("events.jsonl"));
    let _p = spawn_plugin(
        test_plugin_bin!(),
        &rt.sock(),
        "10",
        "a",
        &Behaviour {
            log: Some(log.path().to_path_buf()),
            events: Some("CreateContainer".into()),
            update_containers_on_create: Some(update.clone()),
            ..Default::default()
        },
    );
    rt.wait_plugins(&["10-a"]).await;

    let (p1, c1) = (pod("p1"), container("p1", "c1"));
    let t0 = Instant::now();
    let created = tokio::time::timeout(REQUEST_TIMEOUT, async {
        // containerd's create path: hold off plugin sync, not the runtime
        // lock (the new container is not in the runtime's state yet).
        let _block = rt.nri.block_plugin_sync().await;
        rt.nri.create_container(create_request(&p1, &c1)).await
    })
    .await
    .expect("CreateContainer deadlocked");
    created.unwrap();
    assert!(t0.elapsed() < REQUEST_TIMEOUT / 2, "create took {:?}", t0.elapsed());
    assert_eq!(log.of("10-a", "CreateContainer").len(), 1);
    assert_eq!(rt.nri.plugin_names(), ["10-a"], "the plugin was not dropped");
    {
        let s = rt.store.lock().unwrap();
        assert_eq!(s.applied, vec![integration::update_from_json(&update)]);
        assert_eq!(s.resources("c0").unwrap().cpu.cpus, "2-3");
    }
    rt.nri.stop().await;
}

/// R7 invariant for pre-installed plugins: `start()` calls the runtime's
/// sync callback (which takes the runtime lock) for launched plugins. A
/// runtime that restarts NRI while CRI requests run (each holding the
/// runtime lock while calling into NRI) must not deadlock: start must not
/// hold the adaptation's request lock while it calls the sync callback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_restart_with_preinstalled_plugin_vs_start_container_never_deadlocks() {
    let dir = tempfile::tempdir().unwrap();
    integration::install_plugin(
        test_plugin_bin!(),
        &dir.path().join("plugins"),
        &dir.path().join("conf.d"),
        "10-logger",
        &Behaviour {
            events: Some("StartContainer".into()),
            ..Default::default()
        },
    );
    let store = Arc::new(std::sync::Mutex::new(integration::Store::default()));
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    let nri = LockedRuntime::builder(dir.path(), &store, &lock)
        .with_request_timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let rt = Arc::new(LockedRuntime { nri, store, lock, dir });
    rt.nri.start().await.unwrap();
    let ctrs: Vec<_> = (0..10).map(|i| rt.add("p1", &format!("c{i}"))).collect();

    for iteration in 0..20 {
        let restarting = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let restart = {
            let (rt, restarting) = (rt.clone(), restarting.clone());
            tokio::spawn(async move {
                rt.nri.stop().await;
                let started = rt.nri.start().await;
                restarting.store(false, std::sync::atomic::Ordering::SeqCst);
                started
            })
        };
        let tasks: Vec<_> = ctrs
            .iter()
            .cloned()
            .map(|(p, c)| {
                let (rt, restarting) = (rt.clone(), restarting.clone());
                tokio::spawn(async move {
                    while restarting.load(std::sync::atomic::Ordering::SeqCst) {
                        match tokio::time::timeout(REQUEST_TIMEOUT, rt.start_container(&p, &c)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return Err(format!("StartContainer({}) failed: {e}", c.id)),
                            Err(_) => return Err(format!("StartContainer({}) hung during restart", c.id)),
                        }
                        tokio::task::yield_now().await;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut errors = Vec::new();
        for t in tasks {
            if let Err(e) = t.await.expect("start task") {
                errors.push(e);
            }
        }
        tokio::time::timeout(REQUEST_TIMEOUT * 2, restart)
            .await
            .unwrap_or_else(|_| panic!("iteration {iteration}: restart hung; {errors:?}"))
            .unwrap()
            .unwrap();
        assert!(errors.is_empty(), "iteration {iteration}: {errors:#?}");
        assert_eq!(rt.nri.plugin_names(), ["10-logger"]);
    }
    rt.nri.stop().await;
}
