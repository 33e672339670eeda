//! The task lifecycle: plain async methods over a task table, generic over
//! where events go ([`EventSink`]) and reaching NRI through the [`Nri`]
//! seam, so tests drive it without containerd. The ttrpc `Task` service
//! (`task.rs`) only translates requests into these calls.
//!
//! State machine of a process (init or exec):
//!
//! ```text
//! Created --start--> Starting --> Running <--pause/resume--> Paused
//!    |                               |
//!    +--------------exit-------------+--> Stopped --delete--> (gone)
//! ```
//!
//! Illegal transitions are `FailedPrecondition`; a signal to a finished
//! process is `NotFound` (what CRI's stop path expects).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, OnceLock, Weak,
        atomic::{AtomicI32, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use containerd_shim_protos::{
    api as task_api,
    events::task as ev,
    protobuf::{MessageField, well_known_types::timestamp::Timestamp},
    types::mount::Mount,
};
use nri_adaptation::{api, convert, spec};
use oci_spec::runtime::Spec;
use tokio::sync::watch;

use crate::{
    cgroups::Cgroup,
    error::{Result, ShimError},
    events::{EventSink, topics},
    helper,
    io::{ProcessIo, StdioSpec},
    monitor::{ExitStatus, PidFd},
    nri::{Identity, Nri, Role, identify},
};

/// File in the bundle holding the init's exit status (for `delete` after
/// the daemon is gone).
pub const EXIT_STATUS_FILE: &str = "nri-shim-exit-status";

/// A protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lifecycle state of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Created, not started.
    Created,
    /// Start in progress.
    Starting,
    /// Running.
    Running,
    /// Frozen.
    Paused,
    /// Exited.
    Stopped,
}

impl Status {
    fn to_proto(self) -> task_api::Status {
        match self {
            Status::Created => task_api::Status::CREATED,
            Status::Starting | Status::Running => task_api::Status::RUNNING,
            Status::Paused => task_api::Status::PAUSED,
            Status::Stopped => task_api::Status::STOPPED,
        }
    }
}

/// One process of a task: the init (empty `exec_id`) or an exec.
pub struct Proc {
    exec_id: String,
    pid: AtomicI32,
    status: Mutex<Status>,
    exit: watch::Sender<Option<ExitStatus>>,
    /// Outcome of Start: `Some(true)` once the start (or exec-started)
    /// event is queued, `Some(false)` if the start failed.
    started: watch::Sender<Option<bool>>,
    /// Set once the process has been reaped.
    reaped: watch::Sender<bool>,
    pidfd: Mutex<Option<Arc<PidFd>>>,
    io: Mutex<Option<ProcessIo>>,
    stdio: StdioSpec,
    /// OCI process of an exec.
    spec: Option<serde_json::Value>,
}

impl Proc {
    fn new(exec_id: &str, stdio: StdioSpec, spec: Option<serde_json::Value>) -> Arc<Proc> {
        Arc::new(Proc {
            exec_id: exec_id.to_string(),
            pid: AtomicI32::new(0),
            status: Mutex::new(Status::Created),
            exit: watch::channel(None).0,
            started: watch::channel(None).0,
            reaped: watch::channel(false).0,
            pidfd: Mutex::new(None),
            io: Mutex::new(None),
            stdio,
            spec,
        })
    }

    fn status(&self) -> Status {
        *lock(&self.status)
    }

    fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst).max(0) as u32
    }

    fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    async fn wait_exit(&self) -> ExitStatus {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(st) = *rx.borrow_and_update() {
                return st;
            }
            if rx.changed().await.is_err() {
                return ExitStatus {
                    code: 255,
                    at: SystemTime::now(),
                };
            }
        }
    }
}

/// One container task.
pub struct Task {
    ns: String,
    id: String,
    bundle: PathBuf,
    role: Role,
    pod_id: String,
    cgroups_path: PathBuf,
    /// The NRI view of the container (adjusted spec, state, pid).
    container: Mutex<api::Container>,
    init: Arc<Proc>,
    execs: Mutex<HashMap<String, Arc<Proc>>>,
    /// NRI StopContainer / StopPodSandbox sent.
    stopped_nri: tokio::sync::Mutex<bool>,
    /// The init was sent SIGKILL: a pause racing the kill must not freeze
    /// it with the signal pending.
    sigkilled: std::sync::atomic::AtomicBool,
    rootfs_mounts: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
struct PodRecord {
    pod: api::PodSandbox,
    stopped: bool,
}

type Key = (String, String);

struct Inner {
    exe: PathBuf,
    state_root: PathBuf,
    events: Arc<dyn EventSink>,
    nri: OnceLock<Arc<dyn Nri>>,
    tasks: Mutex<HashMap<Key, Arc<Task>>>,
    creating: Mutex<std::collections::HashSet<Key>>,
    pods: Mutex<HashMap<String, PodRecord>>,
    changed: tokio::sync::Notify,
    /// Task requests being served.
    requests: std::sync::atomic::AtomicUsize,
    /// Last accepted connection or finished request.
    activity: Mutex<Instant>,
}

/// A task request in flight (see [`Service::begin_request`]).
pub struct RequestGuard(Service);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.inner.requests.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.touch();
        self.0.inner.changed.notify_waiters();
    }
}

/// The task service's lifecycle logic.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// Undo actions for a create that fails half-way.
#[derive(Default)]
struct Undo {
    nri_container: Option<(api::PodSandbox, api::Container)>,
    nri_pod: Option<api::PodSandbox>,
    config: Option<(PathBuf, Vec<u8>)>,
    mounts: Vec<PathBuf>,
    helper_created: bool,
}

impl Service {
    /// A service running helpers from `exe` and keeping state under
    /// `state_root`, publishing to `events`. NRI is attached with
    /// [`Service::set_nri`].
    pub fn new(exe: PathBuf, state_root: PathBuf, events: Arc<dyn EventSink>) -> Service {
        Service {
            inner: Arc::new(Inner {
                exe,
                state_root,
                events,
                nri: OnceLock::new(),
                tasks: Mutex::new(HashMap::new()),
                creating: Mutex::new(Default::default()),
                pods: Mutex::new(HashMap::new()),
                changed: tokio::sync::Notify::new(),
                requests: std::sync::atomic::AtomicUsize::new(0),
                activity: Mutex::new(Instant::now()),
            }),
        }
    }

    /// Attaches NRI (once).
    pub fn set_nri(&self, nri: Arc<dyn Nri>) {
        let _ = self.inner.nri.set(nri);
    }

    fn nri(&self) -> Arc<dyn Nri> {
        self.inner
            .nri
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::new(crate::nri::NoNri))
    }

    /// A weak handle for NRI callbacks (no reference cycle with the adaptation).
    pub fn downgrade(&self) -> WeakService {
        WeakService(Arc::downgrade(&self.inner))
    }

    /// Number of live tasks.
    pub fn task_count(&self) -> usize {
        lock(&self.inner.tasks).len()
    }

    /// Counts a task request as in flight until the guard drops: a create
    /// that is still in NRI has no task yet but keeps the daemon busy.
    pub fn begin_request(&self) -> RequestGuard {
        self.inner.requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.touch();
        RequestGuard(self.clone())
    }

    /// Records activity: an accepted connection (`start` probes the daemon
    /// before it prints the address containerd connects to next).
    pub fn touch(&self) {
        *lock(&self.inner.activity) = Instant::now();
    }

    /// How long the daemon has had nothing to do: no task, no request in
    /// flight, no connection or request for that long. `None` while busy.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.task_count() > 0 || self.inner.requests.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return None;
        }
        Some(lock(&self.inner.activity).elapsed())
    }

    /// Waits for the next change of the task table.
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }

    fn libcontainer_root(&self) -> PathBuf {
        self.inner.state_root.join("containers")
    }

    fn task(&self, ns: &str, id: &str) -> Result<Arc<Task>> {
        lock(&self.inner.tasks)
            .get(&(ns.to_string(), id.to_string()))
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("task {id} not found in namespace {ns}")))
    }

    fn proc(&self, task: &Task, exec_id: &str) -> Result<Arc<Proc>> {
        if exec_id.is_empty() {
            return Ok(task.init.clone());
        }
        lock(&task.execs)
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in task {}", task.id)))
    }

    fn publish(&self, ns: &str, topic: &'static str, event: Box<dyn protobuf::MessageDyn>) {
        self.inner.events.publish(ns, topic, event);
    }

    fn pod(&self, id: &str) -> api::PodSandbox {
        lock(&self.inner.pods)
            .get(id)
            .map(|p| p.pod.clone())
            .unwrap_or_default()
    }

    /// Creates a task: NRI adjusts the spec, libcontainer creates the
    /// container. On any failure nothing is left behind (no libcontainer
    /// state, cgroup, mount or socket; the id can be used again at once).
    ///
    /// # Errors
    /// [`ShimError::AlreadyExists`], [`ShimError::Nri`] when plugins refuse
    /// the container, [`ShimError::InvalidArgument`] for a bad spec or
    /// stdio, [`ShimError::Runtime`] when libcontainer fails.
    pub async fn create(&self, ns: &str, req: task_api::CreateTaskRequest) -> Result<task_api::CreateTaskResponse> {
        let key = (ns.to_string(), req.id.clone());
        if lock(&self.inner.tasks).contains_key(&key) || !lock(&self.inner.creating).insert(key.clone()) {
            return Err(ShimError::AlreadyExists(format!(
                "task {} already exists in namespace {ns}",
                req.id
            )));
        }
        let log_key = format!("{ns}/{}", req.id);
        crate::shimlog::SHIM_LOG.attach(&log_key, Path::new(&req.bundle));
        let mut undo = Undo::default();
        let result = self.create_inner(ns, &req, &mut undo).await;
        lock(&self.inner.creating).remove(&key);
        match result {
            Ok(pid) => {
                tracing::info!(task = %req.id, namespace = ns, pid, "task created");
                Ok(task_api::CreateTaskResponse {
                    pid,
                    ..Default::default()
                })
            }
            Err(e) => {
                tracing::warn!(task = %req.id, namespace = ns, error = %e, "create failed, cleaning up");
                self.undo_create(ns, &req, undo).await;
                crate::shimlog::SHIM_LOG.detach(&log_key);
                Err(e)
            }
        }
    }

    async fn create_inner(&self, ns: &str, req: &task_api::CreateTaskRequest, undo: &mut Undo) -> Result<u32> {
        let id = req.id.as_str();
        let bundle = PathBuf::from(&req.bundle);
        let config_path = bundle.join("config.json");
        let original =
            std::fs::read(&config_path).map_err(|e| ShimError::io(format!("read {}", config_path.display()), e))?;
        let mut spec: Spec = serde_json::from_slice(&original)
            .map_err(|e| ShimError::InvalidArgument(format!("{}: {e}", config_path.display())))?;
        if spec
            .process()
            .as_ref()
            .is_none_or(|p| p.args().as_ref().is_none_or(|a| a.is_empty()))
        {
            return Err(ShimError::InvalidArgument(format!(
                "{}: process.args is empty: nothing to run",
                config_path.display()
            )));
        }
        tracing::debug!(task = id, root = ?spec.root(), args = ?spec.process().as_ref().and_then(|p| p.args().clone()), "creating");
        let defaulted_path = default_path_env(&mut spec);
        undo.mounts = mount_rootfs(&req.rootfs, &bundle.join("rootfs"))?;
        let Identity { role, pod, name } = identify(ns, id, &spec);
        let nri = self.nri();
        let pod = self.ensure_pod(&nri, role, pod, undo).await?;
        let mut container = convert::container_from_spec(id, &pod.id, &name, &spec);
        if let Some(image) = spec.annotations().as_ref().and_then(|a| a.get(crate::nri::IMAGE_NAME)) {
            container.image.mut_or_insert_default().name = image.clone();
        }
        let mut updates = Vec::new();
        if role != Role::Sandbox {
            // Undone even when a plugin refuses: plugins called before it
            // may hold resources for this container.
            undo.nri_container = Some((pod.clone(), container.clone()));
            let rsp = nri
                .create_container(api::CreateContainerRequest {
                    pod: MessageField::some(pod.clone()),
                    container: MessageField::some(container.clone()),
                    ..Default::default()
                })
                .await?;
            check_nri_mounts(rsp.adjust.get_or_default())?;
            spec::adjust(&mut spec, rsp.adjust.get_or_default())?;
            updates = rsp.update;
        }
        if role != Role::Sandbox || defaulted_path {
            write_spec(&config_path, &spec, &original, undo)?;
        }
        if role != Role::Sandbox {
            container = convert::container_from_spec(id, &pod.id, &name, &spec);
            if !updates.is_empty() {
                let failed = self.apply_updates(updates).await;
                if !failed.is_empty() {
                    tracing::warn!(task = id, failed = failed.len(), "some NRI container updates failed");
                }
            }
        }
        let cgroups_path = spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().clone())
            .unwrap_or_else(|| PathBuf::from(format!("/nri-shim/{ns}/{id}")));
        let stdio = StdioSpec {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        std::fs::create_dir_all(self.libcontainer_root()).map_err(|e| ShimError::io("create libcontainer root", e))?;
        let console = self
            .inner
            .state_root
            .join(format!("{}.console", short_hash(&format!("{ns}/{id}"))));
        let mut io = ProcessIo::prepare(&stdio, &console)?;
        undo.helper_created = true;
        let pid = helper::call(
            &self.inner.exe,
            &helper::Request::Create {
                id: id.to_string(),
                bundle: bundle.clone(),
                root: self.libcontainer_root(),
                console_socket: io.console_socket.clone(),
            },
            io.take_fds()?,
        )
        .await?
        .ok_or_else(|| ShimError::Runtime("libcontainer reported no pid".into()))?;
        io.attach_console()?;
        let pidfd = Arc::new(PidFd::open(pid).map_err(|e| ShimError::io(format!("watch pid {pid}"), e))?);
        container.pid = pid as u32;
        let init = Proc::new("", stdio, None);
        init.pid.store(pid, Ordering::SeqCst);
        *lock(&init.pidfd) = Some(pidfd.clone());
        *lock(&init.io) = Some(io);
        let task = Arc::new(Task {
            ns: ns.to_string(),
            id: id.to_string(),
            bundle: bundle.clone(),
            role,
            pod_id: pod.id.clone(),
            cgroups_path,
            container: Mutex::new(container.clone()),
            init: init.clone(),
            execs: Mutex::new(HashMap::new()),
            stopped_nri: tokio::sync::Mutex::new(false),
            sigkilled: std::sync::atomic::AtomicBool::new(false),
            rootfs_mounts: std::mem::take(&mut undo.mounts),
        });
        let _ = std::fs::remove_file(bundle.join(EXIT_STATUS_FILE));
        lock(&self.inner.tasks).insert((ns.to_string(), id.to_string()), task.clone());
        self.inner.changed.notify_waiters();
        *undo = Undo::default();
        tokio::spawn(self.clone().watch_exit(task.clone(), init, pidfd));
        let mut ev = ev::TaskCreate {
            container_id: id.to_string(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            pid: pid as u32,
            ..Default::default()
        };
        let io_ev = ev.io.mut_or_insert_default();
        io_ev.stdin = req.stdin.clone();
        io_ev.stdout = req.stdout.clone();
        io_ev.stderr = req.stderr.clone();
        io_ev.terminal = req.terminal;
        self.publish(ns, topics::CREATE, Box::new(ev));
        if role != Role::Sandbox
            && let Err(e) = nri.post_create_container(&pod, &container).await
        {
            tracing::warn!(task = id, error = %e, "NRI PostCreateContainer failed");
        }
        Ok(pid as u32)
    }

    async fn ensure_pod(
        &self,
        nri: &Arc<dyn Nri>,
        role: Role,
        pod: api::PodSandbox,
        undo: &mut Undo,
    ) -> Result<api::PodSandbox> {
        let known = lock(&self.inner.pods).get(&pod.id).map(|p| p.pod.clone());
        match (role, known) {
            (Role::Container, Some(p)) => Ok(p),
            (Role::Sandbox, Some(_)) => Err(ShimError::AlreadyExists(format!(
                "pod sandbox {} already exists",
                pod.id
            ))),
            (_, _) => {
                // A container whose sandbox this shim does not run still gets
                // its pod announced, once, before its first container.
                nri.run_pod_sandbox(&pod).await?;
                undo.nri_pod = Some(pod.clone());
                lock(&self.inner.pods).insert(
                    pod.id.clone(),
                    PodRecord {
                        pod: pod.clone(),
                        stopped: false,
                    },
                );
                Ok(pod)
            }
        }
    }

    async fn undo_create(&self, ns: &str, req: &task_api::CreateTaskRequest, undo: Undo) {
        let nri = self.nri();
        if undo.helper_created {
            let _ = helper::call_without_stdio(
                &self.inner.exe,
                &helper::Request::Delete {
                    id: req.id.clone(),
                    root: self.libcontainer_root(),
                    force: true,
                    cgroups_path: None,
                },
            )
            .await;
        }
        // As containerd does for a failed create: tell plugins it is gone.
        if let Some((pod, c)) = &undo.nri_container {
            let _ = nri
                .stop_container(api::StopContainerRequest {
                    pod: MessageField::some(pod.clone()),
                    container: MessageField::some(c.clone()),
                    ..Default::default()
                })
                .await;
            let _ = nri.remove_container(pod, c).await;
        }
        if let Some(pod) = &undo.nri_pod {
            let _ = nri.stop_pod_sandbox(pod).await;
            let _ = nri.remove_pod_sandbox(pod).await;
            lock(&self.inner.pods).remove(&pod.id);
        }
        if let Some((path, original)) = undo.config {
            let _ = std::fs::write(path, original);
        }
        unmount_all(&undo.mounts);
        let console = self
            .inner
            .state_root
            .join(format!("{}.console", short_hash(&format!("{ns}/{}", req.id))));
        let _ = std::fs::remove_file(console);
    }

    /// Starts the init (`exec_id` empty) or an exec'd process.
    ///
    /// # Errors
    /// [`ShimError::NotFound`], [`ShimError::FailedPrecondition`] unless
    /// the process is created, NRI or runtime failures.
    pub async fn start(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::StartResponse> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        {
            let mut st = lock(&proc.status);
            if *st != Status::Created {
                return Err(ShimError::FailedPrecondition(format!(
                    "{} is {:?}, not created",
                    describe(&task, &proc),
                    *st
                )));
            }
            *st = Status::Starting;
        }
        let result = if exec_id.is_empty() {
            self.start_init(&task).await
        } else {
            self.start_exec(&task, &proc).await
        };
        match result {
            Ok(pid) => {
                tracing::info!(task = id, namespace = ns, exec = exec_id, pid, "process started");
                Ok(task_api::StartResponse {
                    pid,
                    ..Default::default()
                })
            }
            Err(e) => {
                // runc convention: a process that could not start is
                // stopped with a non-zero status and can be deleted.
                let mut st = lock(&proc.status);
                if *st == Status::Starting {
                    *st = Status::Stopped;
                }
                drop(st);
                // Recorded before the outcome, so the exit watcher keeps it.
                let code = if exec_id.is_empty() { 128 } else { 127 };
                proc.exit.send_if_modified(|v| {
                    let first = v.is_none();
                    if first {
                        *v = Some(ExitStatus {
                            code,
                            at: SystemTime::now(),
                        });
                    }
                    first
                });
                proc.started.send_replace(Some(false));
                Err(e)
            }
        }
    }

    async fn start_init(&self, task: &Arc<Task>) -> Result<u32> {
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        let container = lock(&task.container).clone();
        if task.role != Role::Sandbox {
            nri.start_container(&pod, &container).await?;
        }
        helper::call_without_stdio(
            &self.inner.exe,
            &helper::Request::Start {
                id: task.id.clone(),
                root: self.libcontainer_root(),
            },
        )
        .await?;
        let pid = task.init.pid();
        {
            let mut st = lock(&task.init.status);
            if *st == Status::Starting {
                *st = Status::Running;
            }
        }
        lock(&task.container).state = api::ContainerState::CONTAINER_RUNNING.into();
        self.publish(
            &task.ns,
            topics::START,
            Box::new(ev::TaskStart {
                container_id: task.id.clone(),
                pid,
                ..Default::default()
            }),
        );
        task.init.started.send_replace(Some(true));
        if task.role != Role::Sandbox {
            let c = lock(&task.container).clone();
            if let Err(e) = nri.post_start_container(&pod, &c).await {
                tracing::warn!(task = %task.id, error = %e, "NRI PostStartContainer failed");
            }
        }
        Ok(pid)
    }

    async fn start_exec(&self, task: &Arc<Task>, proc: &Arc<Proc>) -> Result<u32> {
        exec_allowed(task)?;
        let dir = self.inner.state_root.join("exec");
        std::fs::create_dir_all(&dir).map_err(|e| ShimError::io("exec state dir", e))?;
        let tag = short_hash(&format!("{}/{}/{}", task.ns, task.id, proc.exec_id));
        let process_json = dir.join(format!("{tag}.json"));
        let spec = proc.spec.clone().unwrap_or(serde_json::Value::Null);
        std::fs::write(&process_json, serde_json::to_vec(&spec).unwrap_or_default())
            .map_err(|e| ShimError::io("write process.json", e))?;
        let console = dir.join(format!("{tag}.console"));
        let mut io = ProcessIo::prepare(&proc.stdio, &console)?;
        let result = helper::call(
            &self.inner.exe,
            &helper::Request::Exec {
                id: task.id.clone(),
                root: self.libcontainer_root(),
                process: process_json.clone(),
                console_socket: io.console_socket.clone(),
            },
            io.take_fds()?,
        )
        .await;
        let _ = std::fs::remove_file(&process_json);
        let pid = result?.ok_or_else(|| ShimError::Runtime("libcontainer reported no exec pid".into()))?;
        io.attach_console()?;
        let pidfd = Arc::new(PidFd::open(pid).map_err(|e| ShimError::io(format!("watch pid {pid}"), e))?);
        proc.pid.store(pid, Ordering::SeqCst);
        *lock(&proc.pidfd) = Some(pidfd.clone());
        *lock(&proc.io) = Some(io);
        {
            let mut st = lock(&proc.status);
            if *st == Status::Starting {
                *st = Status::Running;
            }
        }
        tokio::spawn(self.clone().watch_exit(task.clone(), proc.clone(), pidfd));
        self.publish(
            &task.ns,
            topics::EXEC_STARTED,
            Box::new(ev::TaskExecStarted {
                container_id: task.id.clone(),
                exec_id: proc.exec_id.clone(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
        proc.started.send_replace(Some(true));
        Ok(pid as u32)
    }

    /// Waits for a process's exit and publishes it, in order: after its
    /// start event, an init's after its execs' (containerd #9719).
    async fn watch_exit(self, task: Arc<Task>, proc: Arc<Proc>, pidfd: Arc<PidFd>) {
        let st = match pidfd.wait().await {
            Ok(st) => st,
            Err(e) => {
                tracing::error!(task = %task.id, pid = pidfd.pid(), error = %e, "cannot reap process");
                ExitStatus {
                    code: 255,
                    at: SystemTime::now(),
                }
            }
        };
        crate::monitor::release(pidfd.pid());
        let drained = lock(&proc.io).as_mut().and_then(ProcessIo::output_drained);
        if let Some(done) = drained {
            let _ = tokio::time::timeout(Duration::from_secs(2), done).await;
        }
        if let Some(io) = lock(&proc.io).as_ref() {
            io.close_stdin();
        }
        tracing::info!(task = %task.id, exec = %proc.exec_id, pid = pidfd.pid(), exit_status = st.code, "process exited");
        let was = {
            let mut s = lock(&proc.status);
            let was = *s;
            *s = Status::Stopped;
            was
        };
        let is_init = proc.exec_id.is_empty();
        if is_init {
            let _ = std::fs::write(task.bundle.join(EXIT_STATUS_FILE), st.code.to_string());
            lock(&task.container).state = api::ContainerState::CONTAINER_STOPPED.into();
            // Execs die with the init's pid namespace: publish their exits first.
            let execs: Vec<Arc<Proc>> = lock(&task.execs).values().cloned().collect();
            for e in execs {
                if *e.started.borrow() == Some(true) {
                    let _ = tokio::time::timeout(Duration::from_secs(2), e.wait_exit()).await;
                }
            }
        }
        // A process that never started has no exit event (containerd
        // #6429); one being started gets its start event out first.
        let publish = match was {
            Status::Created => false,
            _ => {
                let mut rx = proc.started.subscribe();
                tokio::time::timeout(Duration::from_secs(10), rx.wait_for(Option::is_some))
                    .await
                    .ok()
                    .and_then(|r| r.ok().map(|v| *v == Some(true)))
                    .unwrap_or(false)
            }
        };
        if publish {
            if is_init {
                let cg = task.cgroups_path.clone();
                let id = task.id.clone();
                let oom = tokio::task::spawn_blocking(move || Cgroup::open(&cg, &id).ok().and_then(|c| c.oom_kills()))
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(0);
                if oom > 0 {
                    self.publish(
                        &task.ns,
                        topics::OOM,
                        Box::new(ev::TaskOOM {
                            container_id: task.id.clone(),
                            ..Default::default()
                        }),
                    );
                }
            }
            self.publish(
                &task.ns,
                topics::EXIT,
                Box::new(ev::TaskExit {
                    container_id: task.id.clone(),
                    id: if is_init { task.id.clone() } else { proc.exec_id.clone() },
                    pid: pidfd.pid() as u32,
                    exit_status: st.code,
                    exited_at: MessageField::some(timestamp(st.at)),
                    ..Default::default()
                }),
            );
        }
        // send_replace: stored even while nobody waits. A failed start's
        // status (set earlier) is kept.
        proc.exit.send_if_modified(|v| {
            let first = v.is_none();
            if first {
                *v = Some(st);
            }
            first
        });
        proc.reaped.send_replace(true);
        if is_init {
            lock(&task.container).exit_code = st.code as i32;
            self.nri_stopped(&task).await;
        }
    }

    /// Sends NRI StopContainer (or StopPodSandbox for a sandbox) once.
    async fn nri_stopped(&self, task: &Arc<Task>) {
        let mut sent = task.stopped_nri.lock().await;
        if *sent {
            return;
        }
        *sent = true;
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        match task.role {
            Role::Sandbox => {
                let first = lock(&self.inner.pods).get_mut(&task.pod_id).is_some_and(|p| {
                    let first = !p.stopped;
                    p.stopped = true;
                    first
                });
                if first && let Err(e) = nri.stop_pod_sandbox(&pod).await {
                    tracing::warn!(pod = %pod.id, error = %e, "NRI StopPodSandbox failed");
                }
            }
            _ => {
                let c = lock(&task.container).clone();
                match nri
                    .stop_container(api::StopContainerRequest {
                        pod: MessageField::some(pod),
                        container: MessageField::some(c),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(updates) if !updates.is_empty() => {
                        self.apply_updates(updates).await;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(task = %task.id, error = %e, "NRI StopContainer failed"),
                }
            }
        }
    }

    /// Signals a process; with `all`, every process in the task's cgroup.
    ///
    /// # Errors
    /// [`ShimError::NotFound`] for an unknown or finished process (kill
    /// after exit), the signal error otherwise.
    pub async fn kill(&self, ns: &str, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        if proc.status() == Status::Stopped {
            return Err(ShimError::NotFound(format!(
                "{} has already finished",
                describe(&task, &proc)
            )));
        }
        let signal = signal as i32;
        if exec_id.is_empty() && matches!(signal, libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGQUIT) {
            // CRI semantics: plugins learn a container is stopping before it dies.
            self.nri_stopped(&task).await;
        }
        if all && exec_id.is_empty() {
            let cg = task.cgroups_path.clone();
            let tid = task.id.clone();
            let pids = tokio::task::spawn_blocking(move || Cgroup::open(&cg, &tid).and_then(|c| c.pids()))
                .await
                .map_err(|e| ShimError::Runtime(e.to_string()))?
                .unwrap_or_default();
            for pid in pids {
                // SAFETY: kill(2) on pids from the container's own cgroup.
                unsafe { libc::kill(pid, signal) };
            }
        }
        let pidfd = lock(&proc.pidfd).clone();
        let Some(pidfd) = pidfd else {
            return Err(ShimError::NotFound(format!(
                "{} is not running",
                describe(&task, &proc)
            )));
        };
        if signal == libc::SIGKILL && (exec_id.is_empty() || all) {
            // Before the signal, with no await until the status check
            // below: `pause` looks at this flag right after freezing.
            task.sigkilled.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let sent = pidfd.kill(signal);
        if sent.is_ok() && signal == libc::SIGKILL && task.init.status() == Status::Paused {
            // As runc: a frozen task cannot die, so SIGKILL thaws it (and
            // `ctr task rm -f` of a paused task does not hang).
            self.thaw_for_kill(&task).await;
        }
        match sent {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(ShimError::NotFound(format!(
                "{} has already finished",
                describe(&task, &proc)
            ))),
            Err(e) => Err(ShimError::io(
                format!("signal {signal} to {}", describe(&task, &proc)),
                e,
            )),
        }
    }

    /// Deletes a finished (or never started) process; for the init, the
    /// whole task: NRI RemoveContainer, libcontainer state and cgroups,
    /// rootfs mounts.
    ///
    /// # Errors
    /// [`ShimError::NotFound`], [`ShimError::FailedPrecondition`] while running.
    pub async fn delete(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::DeleteResponse> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        match proc.status() {
            Status::Stopped | Status::Created => {
                // A never started (or failed to start) process may still
                // sit waiting for its start: kill it and reap it.
                let pidfd = lock(&proc.pidfd).clone();
                if let Some(fd) = pidfd {
                    if !*proc.reaped.borrow() {
                        let _ = fd.kill(libc::SIGKILL);
                        let mut rx = proc.reaped.subscribe();
                        let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| *r)).await;
                    }
                } else {
                    *lock(&proc.status) = Status::Stopped;
                }
            }
            other => {
                return Err(ShimError::FailedPrecondition(format!(
                    "cannot delete {}: it is {other:?}",
                    describe(&task, &proc)
                )));
            }
        }
        let st = proc.exit_status().unwrap_or(ExitStatus {
            code: 137,
            at: SystemTime::now(),
        });
        let rsp = task_api::DeleteResponse {
            pid: proc.pid(),
            exit_status: st.code,
            exited_at: MessageField::some(timestamp(st.at)),
            ..Default::default()
        };
        if !exec_id.is_empty() {
            lock(&task.execs).remove(exec_id);
            return Ok(rsp);
        }
        self.nri_stopped(&task).await;
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        if task.role != Role::Sandbox {
            let c = lock(&task.container).clone();
            if let Err(e) = nri.remove_container(&pod, &c).await {
                tracing::warn!(task = id, error = %e, "NRI RemoveContainer failed");
            }
        }
        helper::call_without_stdio(
            &self.inner.exe,
            &helper::Request::Delete {
                id: id.to_string(),
                root: self.libcontainer_root(),
                force: true,
                cgroups_path: Some(task.cgroups_path.clone()),
            },
        )
        .await?;
        unmount_all(&task.rootfs_mounts);
        lock(&self.inner.tasks).remove(&(ns.to_string(), id.to_string()));
        match task.role {
            Role::Sandbox => {
                if let Err(e) = nri.remove_pod_sandbox(&pod).await {
                    tracing::warn!(pod = %pod.id, error = %e, "NRI RemovePodSandbox failed");
                }
                lock(&self.inner.pods).remove(&task.pod_id);
            }
            Role::OwnPod => {
                let _ = nri.stop_pod_sandbox(&pod).await;
                let _ = nri.remove_pod_sandbox(&pod).await;
                lock(&self.inner.pods).remove(&task.pod_id);
            }
            Role::Container => {}
        }
        self.publish(
            ns,
            topics::DELETE,
            Box::new(ev::TaskDelete {
                container_id: id.to_string(),
                pid: rsp.pid,
                exit_status: rsp.exit_status,
                exited_at: rsp.exited_at.clone(),
                id: id.to_string(),
                ..Default::default()
            }),
        );
        self.inner.changed.notify_waiters();
        tracing::info!(task = id, namespace = ns, exit_status = rsp.exit_status, "task deleted");
        // Hand the freed task's memory back to the kernel: the daemon stays
        // resident on every node.
        // SAFETY: malloc_trim only releases free heap pages.
        unsafe { libc::malloc_trim(0) };
        crate::shimlog::SHIM_LOG.detach(&format!("{ns}/{id}"));
        Ok(rsp)
    }

    /// Waits for a process to exit.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn wait(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::WaitResponse> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        let st = proc.wait_exit().await;
        Ok(task_api::WaitResponse {
            exit_status: st.code,
            exited_at: MessageField::some(timestamp(st.at)),
            ..Default::default()
        })
    }

    /// The state of a process.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn state(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::StateResponse> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        let exit = proc.exit_status();
        Ok(task_api::StateResponse {
            id: id.to_string(),
            bundle: task.bundle.to_string_lossy().into_owned(),
            pid: proc.pid(),
            status: proc.status().to_proto().into(),
            stdin: proc.stdio.stdin.clone(),
            stdout: proc.stdio.stdout.clone(),
            stderr: proc.stdio.stderr.clone(),
            terminal: proc.stdio.terminal,
            exit_status: exit.map(|e| e.code).unwrap_or(0),
            exited_at: MessageField::from_option(exit.map(|e| timestamp(e.at))),
            exec_id: exec_id.to_string(),
            ..Default::default()
        })
    }

    /// Adds an exec'd process (started by [`Service::start`]).
    ///
    /// # Errors
    /// [`ShimError::AlreadyExists`], [`ShimError::InvalidArgument`] for a
    /// bad process spec, [`ShimError::FailedPrecondition`] on a stopped task.
    pub async fn exec(&self, ns: &str, req: task_api::ExecProcessRequest) -> Result<()> {
        let task = self.task(ns, &req.id)?;
        exec_allowed(&task)?;
        let mut spec: serde_json::Value = serde_json::from_slice(&req.spec.value)
            .map_err(|e| ShimError::InvalidArgument(format!("exec {} process spec: {e}", req.exec_id)))?;
        // As for the init: libcontainer will not exec without a PATH.
        if let Some(env) = spec.get_mut("env").and_then(|e| e.as_array_mut()) {
            if !env.iter().any(|e| e.as_str().is_some_and(|s| s.starts_with("PATH="))) {
                env.push(serde_json::Value::String(DEFAULT_PATH_ENV.to_string()));
            }
        } else if let Some(obj) = spec.as_object_mut() {
            obj.insert("env".into(), serde_json::json!([DEFAULT_PATH_ENV]));
        }
        let stdio = StdioSpec {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        {
            let mut execs = lock(&task.execs);
            if execs.contains_key(&req.exec_id) {
                return Err(ShimError::AlreadyExists(format!("exec {} already exists", req.exec_id)));
            }
            execs.insert(req.exec_id.clone(), Proc::new(&req.exec_id, stdio, Some(spec)));
        }
        self.publish(
            ns,
            topics::EXEC_ADDED,
            Box::new(ev::TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    /// Resizes a process's terminal.
    ///
    /// # Errors
    /// [`ShimError::NotFound`] without a terminal.
    pub async fn resize_pty(&self, ns: &str, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        let guard = lock(&proc.io);
        match guard.as_ref() {
            Some(io) => io.resize(width, height),
            None => Err(ShimError::NotFound(format!(
                "{} has no terminal",
                describe(&task, &proc)
            ))),
        }
    }

    /// Closes a process's stdin.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn close_io(&self, ns: &str, id: &str, exec_id: &str) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = self.proc(&task, exec_id)?;
        if let Some(io) = lock(&proc.io).as_ref() {
            io.close_stdin();
        }
        Ok(())
    }

    /// Member pids of the task.
    ///
    /// # Errors
    /// [`ShimError::NotFound`], cgroup errors.
    pub async fn pids(&self, ns: &str, id: &str) -> Result<Vec<u32>> {
        let task = self.task(ns, id)?;
        let cg = task.cgroups_path.clone();
        let tid = task.id.clone();
        let pids = tokio::task::spawn_blocking(move || Cgroup::open(&cg, &tid).and_then(|c| c.pids()))
            .await
            .map_err(|e| ShimError::Runtime(e.to_string()))??;
        Ok(pids.into_iter().map(|p| p as u32).collect())
    }

    /// Thaws a paused task that was just sent SIGKILL; it is running
    /// again until its exit is reaped.
    async fn thaw_for_kill(&self, task: &Arc<Task>) {
        match freeze(task, false).await {
            Ok(()) => {
                let mut st = lock(&task.init.status);
                if *st == Status::Paused {
                    *st = Status::Running;
                }
            }
            Err(e) => tracing::warn!(task = %task.id, error = %e, "thawing a paused task for SIGKILL failed"),
        }
    }

    /// Freezes (`pause`) or thaws the task.
    ///
    /// # Errors
    /// [`ShimError::FailedPrecondition`] unless running (or paused to resume).
    pub async fn pause(&self, ns: &str, id: &str, pause: bool) -> Result<()> {
        let task = self.task(ns, id)?;
        let (from, to) = if pause {
            (Status::Running, Status::Paused)
        } else {
            (Status::Paused, Status::Running)
        };
        if task.init.status() != from {
            return Err(ShimError::FailedPrecondition(format!(
                "task {id} is {:?}, cannot {}",
                task.init.status(),
                if pause { "pause" } else { "resume" }
            )));
        }
        freeze(&task, pause).await?;
        if pause && task.sigkilled.load(std::sync::atomic::Ordering::SeqCst) {
            // A SIGKILL raced this pause: frozen, the task could not die.
            self.thaw_for_kill(&task).await;
            return Err(ShimError::FailedPrecondition(format!("task {id} is being killed")));
        }
        {
            // The init may have exited (or been killed and thawed) while the
            // cgroup was being frozen or thawed: never overwrite that.
            let mut st = lock(&task.init.status);
            if *st != from {
                let now = *st;
                drop(st);
                if pause {
                    return Err(ShimError::FailedPrecondition(format!(
                        "task {id} became {now:?} while being paused"
                    )));
                }
                return Ok(());
            }
            *st = to;
        }
        let (topic, event): (&'static str, Box<dyn protobuf::MessageDyn>) = if pause {
            (
                topics::PAUSED,
                Box::new(ev::TaskPaused {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            )
        } else {
            (
                topics::RESUMED,
                Box::new(ev::TaskResumed {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            )
        };
        self.publish(ns, topic, event);
        Ok(())
    }

    /// Updates the task's resources: NRI UpdateContainer (plugins may
    /// override or add updates of other containers), then the cgroup.
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] for resources that are not OCI
    /// `LinuxResources` JSON, NRI and cgroup errors.
    pub async fn update(&self, ns: &str, req: task_api::UpdateTaskRequest) -> Result<()> {
        let task = self.task(ns, &req.id)?;
        let oci: oci_spec::runtime::LinuxResources = serde_json::from_slice(&req.resources.value)
            .map_err(|e| ShimError::InvalidArgument(format!("update {}: resources: {e}", req.id)))?;
        let requested = convert::resources_from_oci(&oci);
        let pod = self.pod(&task.pod_id);
        let container = lock(&task.container).clone();
        let nri = self.nri();
        let mut updates = if task.role == Role::Sandbox {
            let mut u = api::ContainerUpdate::new();
            u.container_id = task.id.clone();
            u.linux.mut_or_insert_default().resources = MessageField::some(requested);
            vec![u]
        } else {
            nri.update_container(api::UpdateContainerRequest {
                pod: MessageField::some(pod.clone()),
                container: MessageField::some(container),
                linux_resources: MessageField::some(requested),
                ..Default::default()
            })
            .await?
        };
        let target = updates
            .pop()
            .ok_or_else(|| ShimError::Runtime("NRI returned no update for the container".into()))?;
        if !updates.is_empty() {
            self.apply_updates(updates).await;
        }
        let resources = target.linux.resources.get_or_default().clone();
        self.apply_resources(&task, &resources).await?;
        if task.role != Role::Sandbox {
            let c = lock(&task.container).clone();
            if let Err(e) = nri.post_update_container(&pod, &c).await {
                tracing::warn!(task = %task.id, error = %e, "NRI PostUpdateContainer failed");
            }
        }
        Ok(())
    }

    async fn apply_resources(&self, task: &Arc<Task>, resources: &api::LinuxResources) -> Result<()> {
        let oci = spec::to_oci_resources(resources)?;
        let cg = task.cgroups_path.clone();
        let tid = task.id.clone();
        tokio::task::spawn_blocking(move || Cgroup::open(&cg, &tid).and_then(|c| c.update(&oci)))
            .await
            .map_err(|e| ShimError::Runtime(e.to_string()))??;
        let mut c = lock(&task.container);
        let current = c.linux.mut_or_insert_default().resources.mut_or_insert_default();
        merge_resources(current, resources);
        Ok(())
    }

    /// Applies container updates from NRI (create/stop replies, plugin
    /// requests); returns those that failed.
    pub async fn apply_updates(&self, updates: Vec<api::ContainerUpdate>) -> Vec<api::ContainerUpdate> {
        let mut failed = Vec::new();
        for u in updates {
            let task = lock(&self.inner.tasks)
                .values()
                .find(|t| t.id == u.container_id)
                .cloned();
            let ok = match task {
                Some(t) => match self.apply_resources(&t, u.linux.resources.get_or_default()).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(container = %u.container_id, error = %e, "NRI container update failed");
                        false
                    }
                },
                None => false,
            };
            if !ok && !u.ignore_failure {
                failed.push(u);
            }
        }
        failed
    }

    /// Cgroup statistics in containerd's v1 metrics format.
    ///
    /// # Errors
    /// [`ShimError::NotFound`], cgroup errors.
    pub async fn stats(&self, ns: &str, id: &str) -> Result<task_api::StatsResponse> {
        let task = self.task(ns, id)?;
        let cg = task.cgroups_path.clone();
        let tid = task.id.clone();
        let metrics = tokio::task::spawn_blocking(move || Cgroup::open(&cg, &tid).and_then(|c| c.metrics()))
            .await
            .map_err(|e| ShimError::Runtime(e.to_string()))??;
        Ok(task_api::StatsResponse {
            stats: MessageField::some(crate::events::to_any(&metrics)),
            ..Default::default()
        })
    }

    /// The daemon's and the task's pids.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn connect(&self, ns: &str, id: &str) -> Result<task_api::ConnectResponse> {
        let task = self.task(ns, id)?;
        Ok(task_api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: task.init.pid(),
            version: concat!("nri-shim ", env!("CARGO_PKG_VERSION")).to_string(),
            ..Default::default()
        })
    }

    /// Kills a task whose eviction a plugin asked for.
    pub async fn evict(&self, container_id: &str, reason: &str) {
        let task = lock(&self.inner.tasks).values().find(|t| t.id == container_id).cloned();
        match task {
            Some(t) => {
                tracing::warn!(task = container_id, reason, "NRI plugin evicts container");
                let _ = self.kill(&t.ns, &t.id, "", libc::SIGKILL as u32, true).await;
            }
            None => tracing::warn!(task = container_id, "NRI eviction of an unknown container"),
        }
    }

    /// Pods and containers for NRI Synchronize.
    pub fn nri_state(&self) -> nri_adaptation::RuntimeState {
        let pods = lock(&self.inner.pods).values().map(|p| p.pod.clone()).collect();
        let containers = lock(&self.inner.tasks)
            .values()
            .filter(|t| t.role != Role::Sandbox)
            .map(|t| lock(&t.container).clone())
            .collect();
        nri_adaptation::RuntimeState { pods, containers }
    }
}

/// A non-owning handle on the service (for NRI callbacks).
#[derive(Clone)]
pub struct WeakService(Weak<Inner>);

impl WeakService {
    /// The service, if it still exists.
    pub fn upgrade(&self) -> Option<Service> {
        self.0.upgrade().map(|inner| Service { inner })
    }
}

fn describe(task: &Task, proc: &Proc) -> String {
    if proc.exec_id.is_empty() {
        format!("task {}", task.id)
    } else {
        format!("exec {} of task {}", proc.exec_id, task.id)
    }
}

/// A short stable name for socket and state files.
pub fn short_hash(s: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Overlays the present fields of `update` on `current` (the NRI view).
fn merge_resources(current: &mut api::LinuxResources, update: &api::LinuxResources) {
    if let Some(m) = update.memory.as_ref() {
        let cur = current.memory.mut_or_insert_default();
        macro_rules! take {
            ($($f:ident),*) => { $( if m.$f.is_some() { cur.$f = m.$f.clone(); } )* };
        }
        take!(
            limit,
            reservation,
            swap,
            kernel,
            kernel_tcp,
            swappiness,
            disable_oom_killer,
            use_hierarchy
        );
    }
    if let Some(c) = update.cpu.as_ref() {
        let cur = current.cpu.mut_or_insert_default();
        macro_rules! take {
            ($($f:ident),*) => { $( if c.$f.is_some() { cur.$f = c.$f.clone(); } )* };
        }
        take!(shares, quota, period, realtime_runtime, realtime_period);
        if !c.cpus.is_empty() {
            cur.cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            cur.mems = c.mems.clone();
        }
    }
    if update.pids.is_some() {
        current.pids = update.pids.clone();
    }
    for (k, v) in &update.unified {
        current.unified.insert(k.clone(), v.clone());
    }
}

/// The `PATH` containerd and Docker give a process without one.
pub const DEFAULT_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Gives the process a `PATH` if it has none: libcontainer refuses to exec
/// without one (runc does not), and `ctr run --rootfs` specs have none.
fn default_path_env(spec: &mut Spec) -> bool {
    let Some(p) = spec.process_mut().as_mut() else {
        return false;
    };
    let mut env = p.env().clone().unwrap_or_default();
    if env.iter().any(|e| e.starts_with("PATH=")) {
        return false;
    }
    env.push(DEFAULT_PATH_ENV.to_string());
    p.set_env(Some(env));
    true
}

/// Writes the adjusted spec atomically (temp file + rename), remembering
/// the original for undo.
fn write_spec(path: &Path, spec: &Spec, original: &[u8], undo: &mut Undo) -> Result<()> {
    let text = serde_json::to_vec(spec).map_err(|e| ShimError::Runtime(format!("encode adjusted spec: {e}")))?;
    let tmp = path.with_extension("json.nri-shim.tmp");
    std::fs::write(&tmp, &text).map_err(|e| ShimError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| ShimError::io(format!("rename to {}", path.display()), e))?;
    undo.config = Some((path.to_path_buf(), original.to_vec()));
    Ok(())
}

/// Mounts the task's rootfs layers (snapshotter mounts) on `target`.
fn mount_rootfs(mounts: &[Mount], target: &Path) -> Result<Vec<PathBuf>> {
    use nix::mount::{MsFlags, mount};
    let mut done = Vec::new();
    for m in mounts {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for o in &m.options {
            match o.as_str() {
                "ro" => flags |= MsFlags::MS_RDONLY,
                "rw" => {}
                "bind" => flags |= MsFlags::MS_BIND,
                "rbind" => flags |= MsFlags::MS_BIND | MsFlags::MS_REC,
                "nosuid" => flags |= MsFlags::MS_NOSUID,
                "nodev" => flags |= MsFlags::MS_NODEV,
                "noexec" => flags |= MsFlags::MS_NOEXEC,
                other => data.push(other),
            }
        }
        let data = data.join(",");
        let fstype = if m.type_.is_empty() {
            None
        } else {
            Some(m.type_.as_str())
        };
        std::fs::create_dir_all(target).map_err(|e| ShimError::io("create rootfs dir", e))?;
        if let Err(e) = mount(
            Some(m.source.as_str()),
            target,
            fstype,
            flags,
            if data.is_empty() { None } else { Some(data.as_str()) },
        ) {
            unmount_all(&done);
            return Err(ShimError::io(
                format!("mount rootfs {} ({}) on {}", m.source, m.type_, target.display()),
                e.into(),
            ));
        }
        done.push(target.to_path_buf());
    }
    Ok(done)
}

fn unmount_all(mounts: &[PathBuf]) {
    for p in mounts.iter().rev() {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Freezes (or thaws) the task's cgroup, off the runtime thread.
async fn freeze(task: &Task, frozen: bool) -> Result<()> {
    let (cg, tid) = (task.cgroups_path.clone(), task.id.clone());
    tokio::task::spawn_blocking(move || Cgroup::open(&cg, &tid).and_then(|c| c.freeze(frozen)))
        .await
        .map_err(|e| ShimError::Runtime(e.to_string()))?
}

/// Exec needs a live, unfrozen init: joining a frozen cgroup would block
/// the helper until a resume (runc's "cannot exec in a paused state").
fn exec_allowed(task: &Task) -> Result<()> {
    match task.init.status() {
        Status::Paused => Err(ShimError::FailedPrecondition(format!(
            "cannot exec in a paused state: task {} is paused",
            task.id
        ))),
        Status::Stopped => Err(ShimError::FailedPrecondition(format!("task {} is stopped", task.id))),
        _ => Ok(()),
    }
}

/// Bind mounts that plugins added must have a source: libcontainer fails
/// such a container with a bare "failed to prepare rootfs" from inside the
/// container's init, naming neither the mount nor its source.
fn check_nri_mounts(adjust: &api::ContainerAdjustment) -> Result<()> {
    for m in &adjust.mounts {
        let bind = m.type_ == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
        if bind && !m.destination.starts_with('-') && !Path::new(&m.source).exists() {
            return Err(ShimError::InvalidArgument(format!(
                "NRI: mount of {} added by a plugin: bind source {:?} does not exist",
                m.destination, m.source
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
