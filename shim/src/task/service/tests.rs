//! The task lifecycle against a fake runner and a recording NRI: events
//! and their order, error codes and rollback, without root, containerd,
//! libcontainer or plugin processes.

use std::{
    collections::HashMap,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI32, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use containerd_shim_protos::{api as task_api, cgroups::metrics::Metrics, protobuf::well_known_types::any::Any};
use nri_adaptation::{Error as NriError, api};
use oci_spec::runtime::LinuxResources;
use tokio::sync::watch;

use super::*;
use crate::{
    container::runner::{CreateRequest, Process, Runner, Target},
    error::ShimError,
    nri::{CONTAINER_NAME, CONTAINER_TYPE, SANDBOX_ID},
    task::events::{MemorySink, topics},
    task::monitor::ExitStatus,
};

/// A process that exits when told to, or on a killing signal.
struct FakeProcess {
    pid: i32,
    exit: watch::Sender<Option<ExitStatus>>,
}

impl FakeProcess {
    fn exit(&self, code: u32) {
        self.exit.send_if_modified(|v| {
            let first = v.is_none();
            if first {
                *v = Some(ExitStatus {
                    code,
                    at: SystemTime::now(),
                });
            }
            first
        });
    }
}

#[async_trait]
impl Process for FakeProcess {
    fn pid(&self) -> i32 {
        self.pid
    }
    fn signal(&self, signal: i32) -> io::Result<()> {
        if self.exit.borrow().is_some() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if matches!(signal, libc::SIGKILL | libc::SIGTERM | libc::SIGINT) {
            self.exit(128 + signal as u32);
        }
        Ok(())
    }
    async fn wait(&self) -> io::Result<ExitStatus> {
        let mut rx = self.exit.subscribe();
        let st = rx.wait_for(Option::is_some).await.map_err(io::Error::other)?;
        Ok(st.expect("waited for"))
    }
}

/// Records every call; processes are [`FakeProcess`]es keyed "id" (init)
/// or "id/exec".
#[derive(Default)]
struct FakeRunner {
    calls: Mutex<Vec<String>>,
    procs: Mutex<HashMap<String, Arc<FakeProcess>>>,
    fail_create: Mutex<Option<ShimError>>,
    fail_start: Mutex<Option<ShimError>>,
    oom_kills: AtomicU64,
    next_pid: AtomicI32,
    updates: Mutex<Vec<LinuxResources>>,
    exec_processes: Mutex<Vec<serde_json::Value>>,
    /// Wakes the OOM watch of the last created container.
    oom_tx: Mutex<Option<tokio::sync::mpsc::UnboundedSender<()>>>,
    /// The OOM watch signals before the kill is counted (cgroup v1).
    oom_signals_early: std::sync::atomic::AtomicBool,
    /// Run when a freeze is asked, before it is done (to race it).
    on_freeze: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl FakeRunner {
    fn call(&self, c: String) {
        self.calls.lock().unwrap().push(c);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn spawn(&self, key: String) -> Arc<dyn Process> {
        let p = Arc::new(FakeProcess {
            pid: 1000 + self.next_pid.fetch_add(1, Ordering::SeqCst),
            exit: watch::channel(None).0,
        });
        self.procs.lock().unwrap().insert(key, p.clone());
        p
    }
    fn proc(&self, key: &str) -> Arc<FakeProcess> {
        self.procs.lock().unwrap()[key].clone()
    }
}

#[async_trait]
impl Runner for FakeRunner {
    async fn create(&self, req: CreateRequest<'_>, _stdio: [OwnedFd; 3]) -> crate::error::Result<Arc<dyn Process>> {
        self.call(format!("create {}", req.id));
        if let Some(e) = self.fail_create.lock().unwrap().take() {
            return Err(e);
        }
        Ok(self.spawn(req.id.to_string()))
    }
    async fn start(&self, id: &str) -> crate::error::Result<()> {
        self.call(format!("start {id}"));
        match self.fail_start.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    async fn exec(
        &self,
        id: &str,
        process: &serde_json::Value,
        _console: Option<&Path>,
        _stdio: [OwnedFd; 3],
    ) -> crate::error::Result<Arc<dyn Process>> {
        self.call(format!("exec {id}"));
        self.exec_processes.lock().unwrap().push(process.clone());
        let n = self.procs.lock().unwrap().len();
        Ok(self.spawn(format!("{id}/exec{n}")))
    }
    async fn delete(&self, id: &str, _cgroups_path: Option<&Path>) -> crate::error::Result<()> {
        self.call(format!("delete {id}"));
        Ok(())
    }
    async fn kill_all(&self, target: Target<'_>, signal: i32) -> crate::error::Result<()> {
        self.call(format!("kill_all {} {signal}", target.id));
        let procs: Vec<_> = self
            .procs
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.split('/').next() == Some(target.id))
            .map(|(_, p)| p.clone())
            .collect();
        for p in procs {
            let _ = p.signal(signal);
        }
        Ok(())
    }
    async fn pids(&self, target: Target<'_>) -> crate::error::Result<Vec<i32>> {
        let procs = self.procs.lock().unwrap();
        Ok(procs
            .iter()
            .filter(|(k, p)| k.split('/').next() == Some(target.id) && p.exit.borrow().is_none())
            .map(|(_, p)| p.pid)
            .collect())
    }
    async fn freeze(&self, target: Target<'_>, frozen: bool) -> crate::error::Result<()> {
        self.call(format!("freeze {} {frozen}", target.id));
        if let Some(f) = self.on_freeze.lock().unwrap().take() {
            f();
        }
        Ok(())
    }
    async fn update(&self, target: Target<'_>, resources: &LinuxResources) -> crate::error::Result<()> {
        self.call(format!("update {}", target.id));
        self.updates.lock().unwrap().push(resources.clone());
        Ok(())
    }
    async fn stats(&self, _target: Target<'_>) -> crate::error::Result<crate::cgroups::Metrics> {
        Ok(crate::cgroups::Metrics::V1(Metrics::new()))
    }
    async fn oom_kills(&self, _target: Target<'_>) -> Option<u64> {
        Some(self.oom_kills.load(Ordering::SeqCst))
    }
    fn adopt(&self, pid: i32) -> crate::error::Result<Arc<dyn Process>> {
        self.call(format!("adopt {pid}"));
        let procs = self.procs.lock().unwrap();
        let p = procs.values().find(|p| p.pid == pid).cloned();
        p.map(|p| p as Arc<dyn Process>)
            .ok_or_else(|| ShimError::NotFound(format!("pid {pid}")))
    }
    fn watch_oom(&self, _target: Target<'_>) -> Option<Box<dyn crate::container::runner::OomEvents>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.oom_tx.lock().unwrap() = Some(tx);
        Some(Box::new(FakeOom(rx, self.oom_signals_early.load(Ordering::SeqCst))))
    }
}

struct FakeOom(tokio::sync::mpsc::UnboundedReceiver<()>, bool);

#[async_trait]
impl crate::container::runner::OomEvents for FakeOom {
    async fn changed(&mut self) -> bool {
        self.0.recv().await.is_some()
    }
    fn signals_before_the_kill(&self) -> bool {
        self.1
    }
}

/// Records the NRI events ("Event container-or-pod"); can refuse creates.
#[derive(Default)]
struct FakeNri {
    events: Mutex<Vec<String>>,
    refuse_create: Mutex<bool>,
    /// CDI devices CreateContainer asks for.
    cdi: Mutex<Vec<String>>,
}

impl FakeNri {
    fn log(&self, e: &str, name: &str) {
        self.events.lock().unwrap().push(format!("{e} {name}"));
    }
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
}

#[async_trait]
impl Nri for FakeNri {
    async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> std::result::Result<(), NriError> {
        self.log("RunPodSandbox", &pod.id);
        Ok(())
    }
    async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> std::result::Result<(), NriError> {
        self.log("StopPodSandbox", &pod.id);
        Ok(())
    }
    async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> std::result::Result<(), NriError> {
        self.log("RemovePodSandbox", &pod.id);
        Ok(())
    }
    async fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> std::result::Result<crate::nri::Created, NriError> {
        self.log("CreateContainer", &req.container.name);
        if *self.refuse_create.lock().unwrap() {
            return Err(NriError::NotRunning);
        }
        let mut rsp = api::CreateContainerResponse::new();
        rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
            key: "FROM_NRI".into(),
            value: "1".into(),
            ..Default::default()
        });
        for name in self.cdi.lock().unwrap().iter() {
            rsp.adjust.mut_or_insert_default().CDI_devices.push(api::CDIDevice {
                name: name.clone(),
                ..Default::default()
            });
        }
        // As the adaptation reports it: plugin 10-test set FROM_NRI.
        let mut owners = api::OwningPlugins::new();
        owners
            .owners
            .entry(req.container.id.clone())
            .or_default()
            .compound
            .entry(api::Field::Env as i32)
            .or_default()
            .owners
            .insert("FROM_NRI".into(), "10-test".into());
        let report = nri_adaptation::CreateReport {
            plugins: vec![nri_adaptation::PluginResponse {
                plugin: "10-test".into(),
                response: Some(rsp.clone()),
                error: None,
            }],
            owners: Some(owners),
        };
        Ok(crate::nri::Created { response: rsp, report })
    }
    async fn post_create_container(
        &self,
        _: &api::PodSandbox,
        c: &api::Container,
    ) -> std::result::Result<(), NriError> {
        self.log("PostCreateContainer", &c.name);
        Ok(())
    }
    async fn start_container(&self, _: &api::PodSandbox, c: &api::Container) -> std::result::Result<(), NriError> {
        self.log("StartContainer", &c.name);
        Ok(())
    }
    async fn post_start_container(&self, _: &api::PodSandbox, c: &api::Container) -> std::result::Result<(), NriError> {
        self.log("PostStartContainer", &c.name);
        Ok(())
    }
    async fn update_container(
        &self,
        req: api::UpdateContainerRequest,
    ) -> std::result::Result<Vec<api::ContainerUpdate>, NriError> {
        self.log("UpdateContainer", &req.container.name);
        NoNri.update_container(req).await
    }
    async fn post_update_container(
        &self,
        _: &api::PodSandbox,
        c: &api::Container,
    ) -> std::result::Result<(), NriError> {
        self.log("PostUpdateContainer", &c.name);
        Ok(())
    }
    async fn stop_container(
        &self,
        req: api::StopContainerRequest,
    ) -> std::result::Result<Vec<api::ContainerUpdate>, NriError> {
        self.log("StopContainer", &req.container.name);
        Ok(Vec::new())
    }
    async fn remove_container(&self, _: &api::PodSandbox, c: &api::Container) -> std::result::Result<(), NriError> {
        self.log("RemoveContainer", &c.name);
        Ok(())
    }
}

const NS: &str = "test-ns";

struct Fixture {
    dir: tempfile::TempDir,
    service: Service,
    runner: Arc<FakeRunner>,
    nri: Arc<FakeNri>,
    sink: Arc<MemorySink>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let runner = Arc::new(FakeRunner::default());
        let sink = Arc::new(MemorySink::default());
        let nri = Arc::new(FakeNri::default());
        let service = Service::new(runner.clone(), dir.path().join("state"), sink.clone());
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        service.set_nri(nri.clone());
        Fixture {
            dir,
            service,
            runner,
            nri,
            sink,
        }
    }

    /// A bundle for `id` with `annotations`, in a PID namespace of its
    /// own; returns its directory.
    fn bundle(&self, id: &str, annotations: &[(&str, &str)]) -> PathBuf {
        self.bundle_ns(id, annotations, &["pid", "mount"])
    }

    fn bundle_ns(&self, id: &str, annotations: &[(&str, &str)], namespaces: &[&str]) -> PathBuf {
        let b = self.dir.path().join("bundles").join(id);
        std::fs::create_dir_all(&b).unwrap();
        let ann: HashMap<&str, &str> = annotations.iter().copied().collect();
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"},
            "annotations": ann,
            "linux": {
                "cgroupsPath": format!("/test/{id}"),
                "namespaces": namespaces.iter().map(|n| serde_json::json!({"type": n})).collect::<Vec<_>>(),
            },
        });
        std::fs::write(b.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
        b
    }

    async fn create(&self, id: &str, annotations: &[(&str, &str)]) -> crate::error::Result<u32> {
        self.create_bundle(id, self.bundle(id, annotations)).await
    }

    async fn create_bundle(&self, id: &str, bundle: PathBuf) -> crate::error::Result<u32> {
        let req = task_api::CreateTaskRequest {
            id: id.to_string(),
            bundle: bundle.to_string_lossy().into_owned(),
            ..Default::default()
        };
        self.service.create(NS, req).await.map(|r| r.pid)
    }

    async fn exec(&self, id: &str, exec_id: &str) -> crate::error::Result<()> {
        let req = task_api::ExecProcessRequest {
            id: id.to_string(),
            exec_id: exec_id.to_string(),
            spec: protobuf::MessageField::some(Any {
                value: br#"{"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0}}"#.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.service.exec(NS, req).await
    }

    async fn status(&self, id: &str, exec_id: &str) -> task_api::Status {
        self.service
            .state(NS, id, exec_id)
            .await
            .unwrap()
            .status
            .enum_value()
            .unwrap()
    }

    /// Waits until `topic` has been published `n` times.
    async fn wait_topic_count(&self, topic: &str, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.sink.topics().iter().filter(|t| **t == topic).count() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {n}x {topic} in {:?}",
                self.sink.topics()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn code(e: ShimError) -> ttrpc::Code {
    e.code()
}

#[tokio::test]
async fn lifecycle_events_in_order_and_nri_events_once() {
    let f = Fixture::new();
    let pid = f.create("c1", &[]).await.unwrap();
    assert!(pid >= 1000);
    assert_eq!(f.status("c1", "").await, task_api::Status::CREATED);
    // The adjusted spec was written back to the bundle.
    let written = std::fs::read_to_string(f.dir.path().join("bundles/c1/config.json")).unwrap();
    assert!(written.contains("FROM_NRI=1"), "{written}");
    f.service.start(NS, "c1", "").await.unwrap();
    assert_eq!(f.status("c1", "").await, task_api::Status::RUNNING);
    f.service.kill(NS, "c1", "", libc::SIGTERM as u32, false).await.unwrap();
    assert_eq!(f.service.wait(NS, "c1", "").await.unwrap().exit_status, 143);
    f.wait_topic_count(topics::EXIT, 1).await;
    let rsp = f.service.delete(NS, "c1", "").await.unwrap();
    assert_eq!(rsp.exit_status, 143);
    assert_eq!(
        f.sink.topics(),
        [topics::CREATE, topics::START, topics::EXIT, topics::DELETE]
    );
    // A plain container is its own pod; StopContainer once although both
    // the kill and the exit announce it.
    assert_eq!(
        f.nri.events(),
        [
            "RunPodSandbox c1",
            "CreateContainer c1",
            "PostCreateContainer c1",
            "StartContainer c1",
            "PostStartContainer c1",
            "StopContainer c1",
            "RemoveContainer c1",
            "StopPodSandbox c1",
            "RemovePodSandbox c1",
        ]
    );
    assert_eq!(f.runner.calls(), ["create c1", "start c1", "delete c1"]);
    assert_eq!(f.service.task_count(), 0);
    assert_eq!(
        code(f.service.state(NS, "c1", "").await.unwrap_err()),
        ttrpc::Code::NOT_FOUND
    );
}

#[tokio::test]
async fn pod_events_come_from_the_sandbox_and_containers_join_it() {
    let f = Fixture::new();
    let sandbox = [(CONTAINER_TYPE, "sandbox"), (SANDBOX_ID, "sb")];
    let app = [
        (CONTAINER_TYPE, "container"),
        (SANDBOX_ID, "sb"),
        (CONTAINER_NAME, "app"),
    ];
    f.create("sb", &sandbox).await.unwrap();
    f.create("app", &app).await.unwrap();
    // A second sandbox of one pod is refused.
    assert_eq!(
        code(
            f.create("sb2", &[(CONTAINER_TYPE, "sandbox"), (SANDBOX_ID, "sb")])
                .await
                .unwrap_err()
        ),
        ttrpc::Code::ALREADY_EXISTS
    );
    assert_eq!(f.service.nri_state().pods.len(), 1);
    assert_eq!(f.service.nri_state().containers.len(), 1);
    f.service.delete(NS, "app", "").await.unwrap();
    f.service.delete(NS, "sb", "").await.unwrap();
    assert_eq!(
        f.nri.events(),
        [
            "RunPodSandbox sb",
            "CreateContainer app",
            "PostCreateContainer app",
            "StopContainer app",
            "RemoveContainer app",
            "StopPodSandbox sb",
            "RemovePodSandbox sb",
        ]
    );
}

#[tokio::test]
async fn illegal_transitions_and_lookups_have_containerd_codes() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    assert_eq!(
        code(f.create("c1", &[]).await.unwrap_err()),
        ttrpc::Code::ALREADY_EXISTS
    );
    assert_eq!(
        code(f.service.pause(NS, "c1", true).await.unwrap_err()),
        ttrpc::Code::FAILED_PRECONDITION
    );
    f.service.start(NS, "c1", "").await.unwrap();
    assert_eq!(
        code(f.service.start(NS, "c1", "").await.unwrap_err()),
        ttrpc::Code::FAILED_PRECONDITION
    );
    assert_eq!(
        code(f.service.delete(NS, "c1", "").await.unwrap_err()),
        ttrpc::Code::FAILED_PRECONDITION
    );
    assert_eq!(
        code(f.service.pause(NS, "c1", false).await.unwrap_err()),
        ttrpc::Code::FAILED_PRECONDITION
    );
    assert_eq!(
        code(f.service.start(NS, "c1", "nope").await.unwrap_err()),
        ttrpc::Code::NOT_FOUND
    );
    assert_eq!(
        code(f.service.kill(NS, "zz", "", 9, false).await.unwrap_err()),
        ttrpc::Code::NOT_FOUND
    );
    f.runner.proc("c1").exit(0);
    f.wait_topic_count(topics::EXIT, 1).await;
    // Kill after exit is NotFound: CRI's stop path goes on.
    assert_eq!(
        code(f.service.kill(NS, "c1", "", 9, false).await.unwrap_err()),
        ttrpc::Code::NOT_FOUND
    );
    assert_eq!(
        code(f.exec("c1", "e1").await.unwrap_err()),
        ttrpc::Code::FAILED_PRECONDITION
    );
    f.service.delete(NS, "c1", "").await.unwrap();
}

#[tokio::test]
async fn a_failed_start_is_stopped_with_128_and_deletable_without_an_exit_event() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    *f.runner.fail_start.lock().unwrap() = Some(ShimError::Runtime("boom".into()));
    let e = f.service.start(NS, "c1", "").await.unwrap_err();
    assert_eq!(code(e), ttrpc::Code::UNKNOWN);
    assert_eq!(f.status("c1", "").await, task_api::Status::STOPPED);
    let rsp = f.service.delete(NS, "c1", "").await.unwrap();
    assert_eq!(rsp.exit_status, 128);
    assert!(!f.sink.topics().contains(&topics::EXIT), "{:?}", f.sink.topics());
}

#[tokio::test]
async fn exec_exits_are_published_before_the_init_exit() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.exec("c1", "e1").await.unwrap();
    assert_eq!(code(f.exec("c1", "e1").await.unwrap_err()), ttrpc::Code::ALREADY_EXISTS);
    f.service.start(NS, "c1", "e1").await.unwrap();
    assert_eq!(f.status("c1", "e1").await, task_api::Status::RUNNING);
    // The init exits first; the exec dies a little later (as with a pid
    // namespace torn down), yet its exit event comes first.
    f.runner.proc("c1").exit(3);
    let exec = f.runner.proc("c1/exec1");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        exec.exit(137);
    });
    f.wait_topic_count(topics::EXIT, 2).await;
    assert_eq!(f.sink.exits(), [("e1".to_string(), 137), ("c1".to_string(), 3)]);
    let topics_seen = f.sink.topics();
    assert_eq!(
        topics_seen,
        [
            topics::CREATE,
            topics::START,
            topics::EXEC_ADDED,
            topics::EXEC_STARTED,
            topics::EXIT,
            topics::EXIT
        ]
    );
    assert_eq!(f.service.delete(NS, "c1", "e1").await.unwrap().exit_status, 137);
    f.service.delete(NS, "c1", "").await.unwrap();
}

#[tokio::test]
async fn without_an_own_pid_namespace_the_init_exit_kills_everything_left() {
    let f = Fixture::new();
    f.create_bundle("shared", f.bundle_ns("shared", &[], &["mount"]))
        .await
        .unwrap();
    f.create("own", &[]).await.unwrap();
    for id in ["shared", "own"] {
        f.service.start(NS, id, "").await.unwrap();
    }
    f.exec("shared", "e1").await.unwrap();
    f.service.start(NS, "shared", "e1").await.unwrap();
    // The init exits; the exec would run on (the fake exec never exits by
    // itself) unless the shim kills it, and its exit comes first.
    f.runner.proc("shared").exit(3);
    f.wait_topic_count(topics::EXIT, 2).await;
    assert_eq!(f.sink.exits(), [("e1".to_string(), 137), ("shared".to_string(), 3)]);
    assert!(f.runner.calls().contains(&format!("kill_all shared {}", libc::SIGKILL)));
    f.runner.proc("own").exit(0);
    f.wait_topic_count(topics::EXIT, 3).await;
    assert!(
        !f.runner.calls().iter().any(|c| c.starts_with("kill_all own")),
        "{:?}",
        f.runner.calls()
    );
}

#[tokio::test]
async fn an_exec_gets_the_environment_plugins_gave_the_container() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.exec("c1", "e1").await.unwrap();
    f.service.start(NS, "c1", "e1").await.unwrap();
    let process = f.runner.exec_processes.lock().unwrap()[0].clone();
    assert_eq!(process["env"], serde_json::json!(["PATH=/bin", "FROM_NRI=1"]));
}

#[tokio::test]
async fn oom_is_published_before_the_exit() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.runner.oom_kills.store(1, Ordering::SeqCst);
    f.runner.proc("c1").exit(137);
    f.wait_topic_count(topics::EXIT, 1).await;
    assert_eq!(
        f.sink.topics(),
        [topics::CREATE, topics::START, topics::OOM, topics::EXIT]
    );
}

#[tokio::test]
async fn an_oom_kill_in_a_running_container_is_published_at_once_and_once() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    // A child is OOM-killed; the container runs on.
    f.runner.oom_kills.store(1, Ordering::SeqCst);
    f.runner.oom_tx.lock().unwrap().as_ref().unwrap().send(()).unwrap();
    f.wait_topic_count(topics::OOM, 1).await;
    assert_eq!(f.status("c1", "").await, task_api::Status::RUNNING);
    // A wake without a new kill publishes nothing; the exit adds no second one.
    f.runner.oom_tx.lock().unwrap().as_ref().unwrap().send(()).unwrap();
    f.runner.proc("c1").exit(0);
    f.wait_topic_count(topics::EXIT, 1).await;
    assert_eq!(
        f.sink.topics(),
        [topics::CREATE, topics::START, topics::OOM, topics::EXIT]
    );
}

/// cgroup v1 signals an OOM before it kills and counts the victim: a
/// count read at once still says 0, and no second signal comes for that
/// kill. The kill counted 300 ms later is still published while the
/// container runs (the event was lost on a loaded host before).
#[tokio::test]
async fn an_oom_signalled_before_its_kill_is_counted_is_published() {
    let f = Fixture::new();
    f.runner.oom_signals_early.store(true, Ordering::SeqCst);
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.runner.oom_tx.lock().unwrap().as_ref().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.runner.oom_kills.store(1, Ordering::SeqCst);
    f.wait_topic_count(topics::OOM, 1).await;
    assert_eq!(f.status("c1", "").await, task_api::Status::RUNNING);
    f.runner.proc("c1").exit(0);
    f.wait_topic_count(topics::EXIT, 1).await;
    assert_eq!(
        f.sink.topics(),
        [topics::CREATE, topics::START, topics::OOM, topics::EXIT]
    );
}

#[tokio::test]
async fn a_process_that_never_started_has_no_exit_event() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    // containerd deletes a created task it gave up on: killed and reaped.
    let rsp = f.service.delete(NS, "c1", "").await.unwrap();
    assert_eq!(rsp.exit_status, 137);
    assert_eq!(f.sink.topics(), [topics::CREATE, topics::DELETE]);
}

#[tokio::test]
async fn a_refused_create_leaves_nothing_and_the_id_is_free_again() {
    let f = Fixture::new();
    *f.nri.refuse_create.lock().unwrap() = true;
    let e = f.create("c1", &[]).await.unwrap_err();
    assert_eq!(code(e), ttrpc::Code::FAILED_PRECONDITION);
    let bundle = f.dir.path().join("bundles/c1/config.json");
    assert!(!std::fs::read_to_string(&bundle).unwrap().contains("FROM_NRI"));
    // Plugins that saw the create hear it is gone; the pod is taken back.
    assert_eq!(
        f.nri.events(),
        [
            "RunPodSandbox c1",
            "CreateContainer c1",
            "StopContainer c1",
            "RemoveContainer c1",
            "StopPodSandbox c1",
            "RemovePodSandbox c1",
        ]
    );
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
    assert_eq!(f.service.task_count(), 0);
    assert!(f.service.nri_state().pods.is_empty());
    assert!(f.sink.topics().is_empty());
    *f.nri.refuse_create.lock().unwrap() = false;
    f.create("c1", &[]).await.unwrap();
}

/// The audit trail: a created container's record names the plugin that
/// set each field; a failed create leaves none; delete removes it.
#[tokio::test]
async fn the_audit_record_lives_as_long_as_the_task() {
    let f = Fixture::new();
    let record = f.dir.path().join("state/audit").join(NS).join("c1.json");
    *f.runner.fail_create.lock().unwrap() = Some(ShimError::InvalidArgument("bad spec".into()));
    f.create("c1", &[]).await.unwrap_err();
    assert!(!record.exists(), "a failed create keeps no record");
    *f.runner.fail_create.lock().unwrap() = None;
    f.create("c1", &[]).await.unwrap();
    // The test's daemon directory is `state`, under the state root f.dir.
    let found = crate::task::audit::AuditRecord::find(f.dir.path(), Some(NS), "c1").unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let (path, r) = &found[0];
    assert_eq!(path, &record);
    assert_eq!(r.changed_by(), ["10-test"]);
    assert_eq!(
        (r.changes[0].field.as_str(), r.changes[0].key.as_deref()),
        ("Env", Some("FROM_NRI"))
    );
    f.service.start(NS, "c1", "").await.unwrap();
    f.service.kill(NS, "c1", "", libc::SIGKILL as u32, false).await.unwrap();
    f.service.wait(NS, "c1", "").await.unwrap();
    f.service.delete(NS, "c1", "").await.unwrap();
    assert!(!record.exists(), "deleted with the task");
}

#[tokio::test]
async fn a_runner_failure_rolls_back_the_container_and_keeps_its_code() {
    let f = Fixture::new();
    let original = {
        f.bundle("c1", &[]);
        std::fs::read(f.dir.path().join("bundles/c1/config.json")).unwrap()
    };
    *f.runner.fail_create.lock().unwrap() = Some(ShimError::InvalidArgument("bad spec".into()));
    let e = f.create("c1", &[]).await.unwrap_err();
    assert_eq!(code(e), ttrpc::Code::INVALID_ARGUMENT);
    assert_eq!(f.runner.calls(), ["create c1", "delete c1"]);
    assert_eq!(
        std::fs::read(f.dir.path().join("bundles/c1/config.json")).unwrap(),
        original
    );
    assert_eq!(f.service.task_count(), 0);
    f.create("c1", &[]).await.unwrap();
}

#[tokio::test]
async fn pause_resume_and_sigkill_of_a_paused_task() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.service.pause(NS, "c1", true).await.unwrap();
    assert_eq!(f.status("c1", "").await, task_api::Status::PAUSED);
    let e = f.exec("c1", "e1").await.unwrap_err();
    assert!(e.to_string().contains("paused"), "{e}");
    assert_eq!(code(e), ttrpc::Code::FAILED_PRECONDITION);
    f.service.pause(NS, "c1", false).await.unwrap();
    f.service.pause(NS, "c1", true).await.unwrap();
    // SIGKILL thaws a paused task so it can die.
    f.service.kill(NS, "c1", "", libc::SIGKILL as u32, false).await.unwrap();
    f.wait_topic_count(topics::EXIT, 1).await;
    assert_eq!(
        f.runner.calls(),
        [
            "create c1",
            "start c1",
            "freeze c1 true",
            "freeze c1 false",
            "freeze c1 true",
            "freeze c1 false"
        ]
    );
    assert_eq!(
        f.sink.topics(),
        [
            topics::CREATE,
            topics::START,
            topics::PAUSED,
            topics::RESUMED,
            topics::PAUSED,
            topics::EXIT
        ]
    );
}

#[tokio::test]
async fn a_pause_racing_an_exit_does_not_resurrect_the_task() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    let init = f.runner.proc("c1");
    let sink = f.sink.clone();
    *f.runner.on_freeze.lock().unwrap() = Some(Box::new(move || init.exit(0)));
    // The exit lands while the cgroup is being frozen; the watcher may or
    // may not have recorded it before the pause looks again.
    let r = f.service.pause(NS, "c1", true).await;
    f.wait_topic_count(topics::EXIT, 1).await;
    assert_eq!(f.status("c1", "").await, task_api::Status::STOPPED);
    if r.is_ok() {
        // Only when the watcher was later than the pause's check.
        assert!(sink.topics().contains(&topics::PAUSED));
    }
}

#[tokio::test]
async fn kill_all_signals_the_cgroup_and_evict_kills() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.service.evict("c1", "test").await;
    f.wait_topic_count(topics::EXIT, 1).await;
    assert!(f.runner.calls().contains(&format!("kill_all c1 {}", libc::SIGKILL)));
    assert_eq!(f.sink.exits(), [("c1".to_string(), 137)]);
}

#[tokio::test]
async fn update_reaches_the_cgroup_and_the_nri_view() {
    let f = Fixture::new();
    f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    let req = task_api::UpdateTaskRequest {
        id: "c1".into(),
        resources: protobuf::MessageField::some(Any {
            value: br#"{"memory":{"limit":134217728},"pids":{"limit":20}}"#.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.service.update(NS, req).await.unwrap();
    let written = f.runner.updates.lock().unwrap()[0].clone();
    assert_eq!(written.memory().as_ref().and_then(|m| m.limit()), Some(134217728));
    let c = &f.service.nri_state().containers[0];
    let r = c.linux.resources.get_or_default();
    assert_eq!(r.memory.limit.value, 134217728);
    assert_eq!(r.pids.limit, 20);
    assert!(
        f.nri
            .events()
            .ends_with(&["UpdateContainer c1".to_string(), "PostUpdateContainer c1".to_string()])
    );
}

#[tokio::test]
async fn idle_accounting_counts_tasks_and_requests() {
    let f = Fixture::new();
    assert!(f.service.idle_for().is_some());
    let guard = f.service.begin_request();
    assert!(f.service.idle_for().is_none());
    drop(guard);
    f.create("c1", &[]).await.unwrap();
    assert!(f.service.idle_for().is_none());
    f.service.delete(NS, "c1", "").await.unwrap();
    assert!(f.service.idle_for().is_some_and(|d| d < Duration::from_secs(5)));
}

/// Applies `resources` as an NRI container update of `c1`; true when the
/// runtime took it (the field table's OCI form exists for it).
async fn nri_update(f: &Fixture, resources: &api::LinuxResources) -> bool {
    let mut u = api::ContainerUpdate::new();
    u.container_id = "c1".into();
    u.linux.mut_or_insert_default().resources = protobuf::MessageField::some(resources.clone());
    f.service.apply_updates(vec![u]).await.is_empty()
}

fn view(f: &Fixture) -> api::LinuxResources {
    f.service.nri_state().containers[0]
        .linux
        .resources
        .get_or_default()
        .clone()
}

fn property_case(
    before: &api::LinuxResources,
    update: &api::LinuxResources,
) -> std::result::Result<(), proptest::test_runner::TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = Fixture::new();
        f.create("c1", &[]).await.unwrap();
        nri_update(&f, before).await;
        let prev = view(&f);
        let taken = nri_update(&f, update).await;
        let after = view(&f);
        proptest::prop_assert_eq!(taken, nri_adaptation::spec::to_oci_resources(update).is_ok());
        if taken {
            nri_adaptation::resources::testing::check_overlay(&prev, update, &after)
        } else {
            proptest::prop_assert_eq!(&after, &prev, "a refused update leaves the view");
            Ok(())
        }
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// What plugins get at Synchronize stays what the container runs
    /// with: an NRI update of any resource fields reaches the shim's view
    /// of the container (the old hand-written overlay dropped hugepage
    /// limits, classes and device rules), and a refused one changes nothing.
    #[test]
    fn an_update_of_any_resource_field_reaches_the_nri_view(
        before in nri_adaptation::resources::testing::arb_resources(),
        update in nri_adaptation::resources::testing::arb_resources(),
    ) {
        property_case(&before, &update)?;
    }

    /// Every field at once (block I/O and RDT classes need a class
    /// resolver this runtime does not have: they are refused, tested above).
    #[test]
    fn an_update_of_every_resource_field_reaches_the_nri_view(
        before in nri_adaptation::resources::testing::arb_resources(),
        mut update in nri_adaptation::resources::testing::arb_full_resources(),
    ) {
        update.blockio_class.clear();
        update.rdt_class.clear();
        property_case(&before, &update)?;
    }
}

const CDI_SPEC: &str = r#"
cdiVersion: "0.6.0"
kind: example.com/test
devices:
  - name: from-annotation
    containerEdits:
      env: ["ANNOTATED=1"]
  - name: from-nri
    containerEdits:
      env: ["FROM_CDI=1"]
      deviceNodes: [{path: /dev/example, type: c, major: 1, minor: 3}]
"#;

impl Fixture {
    fn with_cdi() -> Fixture {
        let f = Fixture::new();
        let dir = f.dir.path().join("cdi");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("test.yaml"), CDI_SPEC).unwrap();
        f.service.set_cdi(crate::cdi::Registry::new(vec![dir]));
        f
    }
    fn config(&self, id: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.path().join("bundles").join(id).join("config.json")).unwrap())
            .unwrap()
    }
}

#[tokio::test]
async fn cdi_devices_of_annotations_and_plugins_reach_the_spec() {
    let f = Fixture::with_cdi();
    f.nri.cdi.lock().unwrap().push("example.com/test=from-nri".into());
    f.create("c1", &[("cdi.k8s.io/dp_x", "example.com/test=from-annotation")])
        .await
        .unwrap();
    let spec = f.config("c1");
    assert_eq!(
        spec["process"]["env"],
        serde_json::json!(["PATH=/bin", "ANNOTATED=1", "FROM_NRI=1", "FROM_CDI=1"])
    );
    assert_eq!(spec["linux"]["devices"][0]["path"], "/dev/example");
}

#[tokio::test]
async fn an_unknown_cdi_device_fails_the_create_naming_it_and_leaves_nothing() {
    let f = Fixture::with_cdi();
    f.nri.cdi.lock().unwrap().push("example.com/test=gpu7".into());
    f.bundle("c1", &[]);
    let original = std::fs::read(f.dir.path().join("bundles/c1/config.json")).unwrap();
    let e = f.create("c1", &[]).await.unwrap_err();
    let text = crate::error::chain(&e);
    assert_eq!(code(e), ttrpc::Code::INVALID_ARGUMENT);
    assert!(
        text.contains("unknown CDI device example.com/test=gpu7")
            && text.contains("test.yaml defines kind example.com/test"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(f.dir.path().join("bundles/c1/config.json")).unwrap(),
        original
    );
    assert!(f.runner.calls().is_empty(), "{:?}", f.runner.calls());
    assert_eq!(f.service.task_count(), 0);
    assert!(f.service.nri_state().pods.is_empty());
    // From an annotation: refused before any plugin hears of it.
    f.nri.cdi.lock().unwrap().clear();
    f.nri.events.lock().unwrap().clear();
    let e = f
        .create("c2", &[("cdi.k8s.io/x", "example.com/test=gpu8")])
        .await
        .unwrap_err();
    let text = crate::error::chain(&e);
    assert_eq!(code(e), ttrpc::Code::INVALID_ARGUMENT);
    assert!(text.contains("example.com/test=gpu8"), "{text}");
    assert!(f.nri.events().is_empty(), "{:?}", f.nri.events());
    f.create("c1", &[]).await.unwrap();
}

/// An upgrade's snapshot, through its file format, rebuilds the table in
/// a new service: states, pids, exit statuses and pods are kept, live
/// processes are adopted and their exits published by the new service.
#[tokio::test]
async fn the_task_table_survives_a_handover() {
    let f = Fixture::new();
    let pid1 = f.create("c1", &[]).await.unwrap();
    f.service.start(NS, "c1", "").await.unwrap();
    f.exec("c1", "e1").await.unwrap();
    f.service.start(NS, "c1", "e1").await.unwrap();
    f.create("c2", &[]).await.unwrap();
    f.service.start(NS, "c2", "").await.unwrap();
    f.runner.proc("c2").exit(3);
    f.wait_topic_count(topics::EXIT, 1).await;
    // The exit watcher finishes after publishing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while f.service.busy().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", f.service.busy());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let state = f.service.handover_state(&mut |fd| Ok(fd)).unwrap();
    let text = serde_json::to_vec(&state).unwrap();
    let state: TableState = serde_json::from_slice(&text).unwrap();

    let sink = Arc::new(MemorySink::default());
    let next = Service::new(f.runner.clone(), f.dir.path().join("state"), sink.clone());
    next.set_nri(f.nri.clone());
    next.resume(state.clone(), &mut |_| None);
    assert_eq!(next.task_count(), 2);
    let c1 = next.state(NS, "c1", "").await.unwrap();
    assert_eq!(
        (c1.pid, c1.status.enum_value().unwrap()),
        (pid1, task_api::Status::RUNNING)
    );
    let e1 = next.state(NS, "c1", "e1").await.unwrap();
    assert_eq!(e1.status.enum_value().unwrap(), task_api::Status::RUNNING);
    let c2 = next.state(NS, "c2", "").await.unwrap();
    assert_eq!(
        (c2.status.enum_value().unwrap(), c2.exit_status),
        (task_api::Status::STOPPED, 3)
    );
    // The reaped one is not adopted again; the live ones are.
    let adopted = f.runner.calls().iter().filter(|c| c.starts_with("adopt")).count();
    assert_eq!(adopted, 2);
    assert_eq!(next.nri_state().pods.len(), f.service.nri_state().pods.len());
    // A snapshot of the rebuilt table is the same snapshot.
    assert_eq!(
        next.handover_state(&mut |fd| Ok(fd)).unwrap().tasks.len(),
        state.tasks.len()
    );

    // Exits after the handover are the new service's to publish, the
    // exec's before the init's.
    f.runner.proc("c1/exec1").exit(0);
    f.runner.proc("c1").exit(9);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sink.topics().iter().filter(|t| **t == topics::EXIT).count() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sink.topics());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let c1 = next.state(NS, "c1", "").await.unwrap();
    assert_eq!(
        (c1.status.enum_value().unwrap(), c1.exit_status),
        (task_api::Status::STOPPED, 9)
    );
    next.delete(NS, "c1", "").await.unwrap();
    assert_eq!(next.task_count(), 1);
}
