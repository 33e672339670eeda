//! Per-plugin permissions on every path a plugin's answer takes:
//! CreateContainer, UpdateContainer, StopContainer, Synchronize and
//! unsolicited UpdateContainers; refused whole, the failure policy deciding
//! whether the request fails; observed as a rejection.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use nri_adaptation::{
    Adaptation, AdaptationBuilder, Error, EventMask, FailurePolicy, FieldGroup, Observer, Outcome, Permissions,
    Rejection, RuntimeState, api,
};
use nri_proto::plugin::{BoxError, Plugin};
use protobuf::MessageField;

/// What the runtime's callbacks and the observer saw.
#[derive(Default)]
struct Seen {
    updates: Mutex<Vec<api::ContainerUpdate>>,
    evicted: Mutex<Vec<String>>,
    rejections: Mutex<Vec<(String, Rejection)>>,
}

impl Observer for Seen {
    fn request(&self, _plugin: &str, _request: &'static str, _elapsed: Duration, _outcome: Outcome) {}
    fn rejected(&self, plugin: &str, rejection: Rejection) {
        self.rejections.lock().unwrap().push((plugin.into(), rejection));
    }
}

impl Seen {
    fn rejections(&self) -> Vec<(String, Rejection)> {
        self.rejections.lock().unwrap().clone()
    }
    fn updated(&self) -> Vec<String> {
        self.updates
            .lock()
            .unwrap()
            .iter()
            .map(|u| u.container_id.clone())
            .collect()
    }
    fn evicted(&self) -> Vec<String> {
        self.evicted.lock().unwrap().clone()
    }
}

/// Answers every request with what it was given.
#[derive(Default, Clone)]
struct Scripted {
    create: api::CreateContainerResponse,
    update: api::UpdateContainerResponse,
    stop: Vec<api::ContainerUpdate>,
    sync: Vec<api::ContainerUpdate>,
}

#[async_trait::async_trait]
impl Plugin for Scripted {
    async fn synchronize(
        &self,
        _pods: &[api::PodSandbox],
        _containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        Ok(self.sync.clone())
    }
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        Ok(self.create.clone())
    }
    async fn update_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
        _resources: &api::LinuxResources,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        Ok(self.update.clone())
    }
    async fn stop_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        Ok(self.stop.clone())
    }
}

fn builder(seen: &Arc<Seen>, dir: &std::path::Path) -> AdaptationBuilder {
    let (u, e) = (seen.clone(), seen.clone());
    Adaptation::builder("test-runtime", "0.1")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(move |updates| {
            let u = u.clone();
            async move {
                u.updates.lock().unwrap().extend(updates);
                Ok(Vec::new())
            }
        })
        .with_evict_fn(move |ev| {
            let e = e.clone();
            async move {
                e.evicted.lock().unwrap().push(ev.container_id);
                Ok(())
            }
        })
        .with_plugin_path(dir.join("none"))
        .with_disabled_connections()
        .with_observer(seen.clone())
}

async fn start(b: AdaptationBuilder, plugins: Vec<(&str, &str, Scripted)>) -> Result<Adaptation, Error> {
    let mut b = b;
    for (idx, name, p) in plugins {
        b = b.with_builtin_plugin(idx, name, EventMask::CONTAINER, Arc::new(p));
    }
    let nri = b.build().unwrap();
    nri.start().await.map(|()| nri)
}

fn cpus_and_memory() -> api::LinuxResources {
    let mut r = api::LinuxResources::new();
    r.cpu.mut_or_insert_default().cpus = "2-3".into();
    r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 30;
    r
}

fn update_of(id: &str, r: api::LinuxResources) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.into(),
        linux: MessageField::some(api::LinuxContainerUpdate {
            resources: MessageField::some(r),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn eviction(id: &str) -> api::ContainerEviction {
    api::ContainerEviction {
        container_id: id.into(),
        reason: "room".into(),
        ..Default::default()
    }
}

/// A pinner that sets CPUs and memory of the new container and evicts
/// another: allowed `allow`.
fn pinner() -> Scripted {
    let mut create = api::CreateContainerResponse::new();
    create
        .adjust
        .mut_or_insert_default()
        .linux
        .mut_or_insert_default()
        .resources = MessageField::some(cpus_and_memory());
    create.evict.push(eviction("victim"));
    Scripted {
        create,
        ..Default::default()
    }
}

fn env_setter() -> Scripted {
    let mut create = api::CreateContainerResponse::new();
    create.adjust.mut_or_insert_default().env.push(api::KeyValue {
        key: "FOO".into(),
        value: "1".into(),
        ..Default::default()
    });
    Scripted {
        create,
        ..Default::default()
    }
}

fn create_request() -> api::CreateContainerRequest {
    let mut req = api::CreateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    req.pod.mut_or_insert_default().id = "p1".into();
    req
}

fn allow(groups: &[FieldGroup]) -> Permissions {
    Permissions::allowing(groups.iter().copied())
}

const PINNER_MEMORY: &str =
    "plugin 10-pinner may not adjust linux.resources.memory.limit (field group memory, allowed: cpu, evict)";

#[tokio::test]
async fn a_create_answer_outside_the_permissions_fails_the_create_under_fail() {
    let (dir, seen) = (tempfile::tempdir().unwrap(), Arc::new(Seen::default()));
    let b = builder(&seen, dir.path())
        .with_plugin_permissions("pinner", allow(&[FieldGroup::Cpu, FieldGroup::Evict]))
        .with_failure_policy("10-pinner", FailurePolicy::Fail);
    let nri = start(b, vec![("10", "pinner", pinner()), ("20", "env", env_setter())])
        .await
        .unwrap();
    let (r, report) = nri.create_container_with_report(create_request()).await;
    let e = r.expect_err("the pinner may not set memory");
    assert!(matches!(e, Error::Permission(_)), "{e:?}");
    assert_eq!(e.to_string(), PINNER_MEMORY);
    assert_eq!(seen.rejections(), [("10-pinner".to_string(), Rejection::Permission)]);
    assert!(seen.evicted().is_empty(), "nothing of the refused answer applies");
    assert_eq!(report.plugins.len(), 1, "the create stopped at the pinner: {report:?}");
    assert!(report.plugins[0].response.is_some(), "reported as sent");
    nri.stop().await;
}

#[tokio::test]
async fn a_create_answer_outside_the_permissions_is_dropped_whole_under_ignore() {
    let (dir, seen) = (tempfile::tempdir().unwrap(), Arc::new(Seen::default()));
    let b =
        builder(&seen, dir.path()).with_plugin_permissions("10-pinner", allow(&[FieldGroup::Cpu, FieldGroup::Evict]));
    let nri = start(b, vec![("10", "pinner", pinner()), ("20", "env", env_setter())])
        .await
        .unwrap();
    let (r, report) = nri.create_container_with_report(create_request()).await;
    let rsp = r.expect("ignore: the create goes on without the pinner");
    // Not even the allowed CPUs: the answer is refused as a whole.
    let res = rsp.adjust.linux.resources.get_or_default();
    assert_eq!(res.cpu.cpus, "", "{rsp:?}");
    assert!(res.memory.limit.is_none(), "{rsp:?}");
    assert_eq!(rsp.adjust.env.len(), 1, "the other plugin is merged: {rsp:?}");
    assert!(
        seen.evicted().is_empty(),
        "the refused answer's eviction is not delivered"
    );
    assert_eq!(seen.rejections(), [("10-pinner".to_string(), Rejection::Permission)]);
    let pinned = &report.plugins[0];
    assert_eq!(pinned.plugin, "10-pinner");
    assert_eq!(
        pinned.error.as_deref(),
        Some(&*format!("answer refused: {PINNER_MEMORY}"))
    );
    assert!(pinned.response.is_some());
    let owners = format!("{:?}", report.owners);
    assert!(!owners.contains("10-pinner"), "owns nothing: {owners}");
    assert_eq!(
        report.changed_by("c1"),
        ["20-env"],
        "the audit trail names only what was applied"
    );
    assert_eq!(nri.plugin_names(), ["10-pinner", "20-env"], "the plugin stays");
    nri.stop().await;
}

/// The control: the same answer within the permissions is merged, its
/// eviction delivered.
#[tokio::test]
async fn a_create_answer_within_the_permissions_is_merged() {
    let (dir, seen) = (tempfile::tempdir().unwrap(), Arc::new(Seen::default()));
    let b = builder(&seen, dir.path())
        .with_plugin_permissions(
            "pinner",
            allow(&[FieldGroup::Cpu, FieldGroup::Memory, FieldGroup::Evict]),
        )
        .with_default_permissions(allow(&[]))
        .with_failure_policy("pinner", FailurePolicy::Fail);
    let nri = start(b, vec![("10", "pinner", pinner())]).await.unwrap();
    let rsp = nri.create_container(create_request()).await.unwrap();
    let res = rsp.adjust.linux.resources.get_or_default();
    assert_eq!((res.cpu.cpus.as_str(), res.memory.limit.value), ("2-3", 1 << 30));
    assert_eq!(seen.evicted(), ["victim"]);
    assert!(seen.rejections().is_empty());
    nri.stop().await;
}

/// The default entry covers plugins without their own.
#[tokio::test]
async fn the_default_entry_restricts_unlisted_plugins() {
    let (dir, seen) = (tempfile::tempdir().unwrap(), Arc::new(Seen::default()));
    let b = builder(&seen, dir.path())
        .with_plugin_permissions("20-env", allow(&[FieldGroup::Env]))
        .with_default_permissions(allow(&[FieldGroup::Annotations]))
        .with_default_failure_policy(FailurePolicy::Fail);
    let nri = start(b, vec![("10", "pinner", pinner()), ("20", "env", env_setter())])
        .await
        .unwrap();
    let e = nri.create_container(create_request()).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "plugin 10-pinner may not adjust linux.resources.memory.limit (field group memory, allowed: annotations)"
    );
    nri.stop().await;
    let seen = Arc::new(Seen::default());
    let b = builder(&seen, dir.path())
        .with_plugin_permissions("20-env", allow(&[FieldGroup::Env]))
        .with_default_permissions(allow(&[FieldGroup::Annotations]))
        .with_default_failure_policy(FailurePolicy::Fail);
    let nri = start(b, vec![("20", "env", env_setter())]).await.unwrap();
    assert_eq!(
        nri.create_container(create_request()).await.unwrap().adjust.env.len(),
        1
    );
    nri.stop().await;
}

fn update_request() -> api::UpdateContainerRequest {
    let mut req = api::UpdateContainerRequest::new();
    req.container.mut_or_insert_default().id = "c1".into();
    req.pod.mut_or_insert_default().id = "p1".into();
    req.linux_resources
        .mut_or_insert_default()
        .cpu
        .mut_or_insert_default()
        .shares
        .mut_or_insert_default()
        .value = 512;
    req
}

/// An UpdateContainer answer overriding the target's memory and evicting.
fn overrider() -> Scripted {
    let mut r = api::LinuxResources::new();
    r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 28;
    let mut update = api::UpdateContainerResponse::new();
    update.update.push(update_of("c1", r));
    update.evict.push(eviction("victim"));
    Scripted {
        update,
        ..Default::default()
    }
}

#[tokio::test]
async fn update_container_answers_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    for (groups, policy, outcome) in [
        (
            &[FieldGroup::Memory, FieldGroup::Evict][..],
            FailurePolicy::Fail,
            "merged",
        ),
        (&[FieldGroup::Evict][..], FailurePolicy::Fail, "fails"),
        (&[FieldGroup::Memory][..], FailurePolicy::Ignore, "dropped"),
    ] {
        let seen = Arc::new(Seen::default());
        let b = builder(&seen, dir.path())
            .with_plugin_permissions("10-mem", allow(groups))
            .with_failure_policy("10-mem", policy);
        let nri = start(b, vec![("10", "mem", overrider())]).await.unwrap();
        let r = nri.update_container(update_request()).await;
        match outcome {
            "merged" => {
                let updates = r.unwrap();
                let last = updates.last().unwrap().linux.resources.get_or_default();
                assert_eq!((last.memory.limit.value, last.cpu.shares.value), (1 << 28, 512));
                assert_eq!(seen.evicted(), ["victim"]);
            }
            "fails" => {
                let e = r.unwrap_err();
                assert_eq!(
                    e.to_string(),
                    "plugin 10-mem may not update linux.resources.memory.limit of container c1 (field group memory, allowed: evict)"
                );
                assert!(seen.evicted().is_empty());
            }
            _ => {
                let updates = r.unwrap();
                let last = updates.last().unwrap().linux.resources.get_or_default();
                assert!(last.memory.limit.is_none(), "{updates:?}");
                assert_eq!(last.cpu.shares.value, 512, "the request itself stands");
                assert!(seen.evicted().is_empty(), "evict is not allowed: the whole answer goes");
            }
        }
        let rejected = if outcome == "merged" { 0 } else { 1 };
        assert_eq!(seen.rejections().len(), rejected, "{outcome}");
        nri.stop().await;
    }
}

#[tokio::test]
async fn stop_container_updates_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    for (groups, policy) in [
        (&[FieldGroup::Cpu, FieldGroup::Memory][..], FailurePolicy::Fail),
        (&[FieldGroup::Cpu][..], FailurePolicy::Fail),
        (&[FieldGroup::Cpu][..], FailurePolicy::Ignore),
    ] {
        let seen = Arc::new(Seen::default());
        let b = builder(&seen, dir.path())
            .with_plugin_permissions("10-giver", allow(groups))
            .with_failure_policy("10-giver", policy);
        let giver = Scripted {
            stop: vec![update_of("c2", cpus_and_memory())],
            ..Default::default()
        };
        let nri = start(b, vec![("10", "giver", giver)]).await.unwrap();
        let mut req = api::StopContainerRequest::new();
        req.container.mut_or_insert_default().id = "c1".into();
        let r = nri.stop_container(req).await;
        match (groups.len(), policy) {
            (2, _) => assert_eq!(r.unwrap().len(), 1),
            (_, FailurePolicy::Fail) => assert_eq!(
                r.unwrap_err().to_string(),
                "plugin 10-giver may not update linux.resources.memory.limit of container c2 (field group memory, allowed: cpu)"
            ),
            (_, FailurePolicy::Ignore) => assert!(r.unwrap().is_empty()),
        }
        nri.stop().await;
    }
}

#[tokio::test]
async fn synchronize_updates_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let syncer = || Scripted {
        sync: vec![update_of("c0", cpus_and_memory())],
        ..Default::default()
    };
    // Allowed: the runtime applies them.
    let seen = Arc::new(Seen::default());
    let b =
        builder(&seen, dir.path()).with_plugin_permissions("10-sync", allow(&[FieldGroup::Cpu, FieldGroup::Memory]));
    let nri = start(b, vec![("10", "sync", syncer())]).await.unwrap();
    assert_eq!(seen.updated(), ["c0"]);
    nri.stop().await;
    // Ignore: the plugin joins, its updates are dropped.
    let seen = Arc::new(Seen::default());
    let b = builder(&seen, dir.path()).with_plugin_permissions("10-sync", allow(&[FieldGroup::Cpu]));
    let nri = start(b, vec![("10", "sync", syncer())]).await.unwrap();
    assert_eq!(nri.plugin_names(), ["10-sync"]);
    assert!(seen.updated().is_empty(), "{:?}", seen.updated());
    assert_eq!(seen.rejections(), [("10-sync".to_string(), Rejection::Permission)]);
    nri.stop().await;
    // Fail: a failed synchronization (a builtin's fails the start).
    let seen = Arc::new(Seen::default());
    let b = builder(&seen, dir.path())
        .with_plugin_permissions("10-sync", allow(&[FieldGroup::Cpu]))
        .with_failure_policy("10-sync", FailurePolicy::Fail);
    let Err(e) = start(b, vec![("10", "sync", syncer())]).await else {
        panic!("a builtin whose sync is refused under fail must fail the start");
    };
    assert_eq!(
        e.to_string(),
        "builtin NRI plugin 10-sync failed to start: synchronize failed: plugin 10-sync may not update linux.resources.memory.limit of container c0 (field group memory, allowed: cpu)"
    );
    assert!(seen.updated().is_empty());
}

struct Quiet;

#[async_trait::async_trait]
impl Plugin for Quiet {}

/// Unsolicited UpdateContainers of an external plugin: refused whole with
/// PERMISSION_DENIED (evictions and updates alike), applied when allowed,
/// and a reload's new permissions apply to the connected plugin at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_update_containers_are_checked_and_follow_a_reload() {
    let (dir, seen) = (tempfile::tempdir().unwrap(), Arc::new(Seen::default()));
    let sock = dir.path().join("nri.sock");
    let nri = {
        let (u, e) = (seen.clone(), seen.clone());
        Adaptation::builder("test-runtime", "0.1")
            .with_sync_fn(|| async { Ok(RuntimeState::default()) })
            .with_update_fn(move |updates| {
                let u = u.clone();
                async move {
                    u.updates.lock().unwrap().extend(updates);
                    Ok(Vec::new())
                }
            })
            .with_evict_fn(move |ev| {
                let e = e.clone();
                async move {
                    e.evicted.lock().unwrap().push(ev.container_id);
                    Ok(())
                }
            })
            .with_socket_path(&sock)
            .with_plugin_path(dir.path().join("none"))
            .with_observer(seen.clone())
            .with_plugin_permissions("ext", allow(&[FieldGroup::Cpu]))
            .build()
            .unwrap()
    };
    nri.start().await.unwrap();
    let handle = nri_stub::Stub::builder(Quiet)
        .with_plugin_name("ext")
        .with_plugin_idx("30")
        .with_socket_path(&sock)
        .with_events(EventMask::parse("CreateContainer").unwrap())
        .build()
        .unwrap()
        .start()
        .await
        .unwrap();
    integration_wait(&nri, "30-ext").await;
    let mut cpu = api::LinuxResources::new();
    cpu.cpu.mut_or_insert_default().cpus = "1".into();
    // An allowed update with a disallowed eviction: nothing happens.
    let e = handle
        .update_containers(vec![update_of("c1", cpu.clone())], vec![eviction("victim")])
        .await
        .unwrap_err();
    let text = format!("{e:?}");
    assert!(
        text.contains("PERMISSION_DENIED")
            && text.contains("plugin 30-ext may not evict container victim (field group evict, allowed: cpu)"),
        "{text}"
    );
    assert!(seen.updated().is_empty() && seen.evicted().is_empty());
    let e = handle
        .update_containers(vec![update_of("c1", cpus_and_memory())], vec![])
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("linux.resources.memory.limit of container c1"),
        "{e:?}"
    );
    assert!(seen.updated().is_empty());
    assert_eq!(seen.rejections().len(), 2);
    // Within the permissions: applied.
    handle
        .update_containers(vec![update_of("c1", cpu)], vec![])
        .await
        .unwrap();
    assert_eq!(seen.updated(), ["c1"]);
    // A reload widens them: the connected plugin may now evict, no reconnect.
    let mut opts = (*nri.options()).clone();
    opts.plugin_permissions
        .insert("ext".into(), allow(&[FieldGroup::Cpu, FieldGroup::Evict]));
    nri.reconfigure(opts).await.unwrap();
    assert_eq!(nri.plugin_names(), ["30-ext"]);
    handle
        .update_containers(vec![], vec![eviction("victim")])
        .await
        .unwrap();
    assert_eq!(seen.evicted(), ["victim"]);
    nri.stop().await;
}

async fn integration_wait(nri: &Adaptation, name: &str) {
    for _ in 0..500 {
        if nri.plugin_names().iter().any(|n| n == name) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never registered: {:?}", nri.plugin_names());
}
