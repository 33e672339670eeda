//! Test harness: a runtime around a real [`Adaptation`] with an in-memory
//! pod/container store, real plugin processes (`nri-test-plugin`) on real
//! unix sockets, and the JSON-lines log those plugins write.
//!
//! Waiting is always for an observable event (a log line, a registration),
//! bounded by a generous deadline that only fails a broken test.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nri_adaptation::{Adaptation, AdaptationBuilder, RuntimeState, api};

pub mod cgroup;
pub mod containerd;
// containerd with CRI and two runtime handlers, a CRI client (the CRI lane).
pub mod cri;
pub mod critest;
use serde::{Deserialize, Serialize};

pub mod parity;
// What an unprivileged local user can read of the shim's state.
pub mod probe;
pub mod raw;
pub mod task;

/// Path of the scriptable test plugin, valid in this package's tests.
#[macro_export]
macro_rules! test_plugin_bin {
    () => {
        env!("CARGO_BIN_EXE_nri-test-plugin")
    };
}

/// What `nri-test-plugin` does (its `--config` / Configure JSON).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Behaviour {
    /// Events to subscribe to (`EventMask::parse` syntax); default all.
    pub events: Option<String>,
    /// Append every request as a JSON line here.
    pub log: Option<PathBuf>,
    /// Event name -> milliseconds to sleep before answering; `Exit`: before
    /// the plugin logs its exit and exits, once its connection ended (a
    /// plugin cleaning up after Shutdown).
    pub sleep_ms: HashMap<String, u64>,
    /// Event name -> error text to answer with.
    pub fail: HashMap<String, String>,
    /// Exit the process (status 17) when this event arrives.
    pub exit_on: Option<String>,
    /// Apply sleep/fail/exit only to this container: its id, or its name (a
    /// CRI container's name is known before containerd picks its id).
    pub only_container: Option<String>,
    /// CreateContainer adjustment, NRI `ContainerAdjustment` in proto JSON.
    pub adjust: Option<serde_json::Value>,
    /// CreateContainer updates, `ContainerUpdate` proto JSON each.
    pub create_updates: Vec<serde_json::Value>,
    /// UpdateContainer updates.
    pub update_updates: Vec<serde_json::Value>,
    /// Synchronize updates.
    pub sync_updates: Vec<serde_json::Value>,
    /// Call UpdateContainers with this update from inside CreateContainer.
    pub update_containers_on_create: Option<serde_json::Value>,
    /// Ask, in that same UpdateContainers call (made even without an
    /// update), for the eviction of this container id.
    pub evict_on_create: Option<String>,
    /// Evict this container id in the CreateContainer reply itself.
    pub create_reply_evicts: Option<String>,
    /// Reject every validation with this reason.
    pub reject: Option<String>,
}

/// One request seen by a test plugin.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LogLine {
    /// `IDX-NAME` of the plugin.
    pub plugin: String,
    /// Request name (`CreateContainer`, `Synchronize`, `Configure`, ...).
    pub event: String,
    /// Pod id.
    pub pod: String,
    /// Container id.
    pub container: String,
    /// Container name.
    pub container_name: String,
    /// Container env as the plugin saw it.
    pub env: Vec<String>,
    /// Container annotations as the plugin saw them.
    pub annotations: BTreeMap<String, String>,
    /// Synchronize: pod ids.
    pub pods: Vec<String>,
    /// Synchronize: container ids.
    pub containers: Vec<String>,
    /// Configure: the config string.
    pub config: String,
    /// Configure: `runtime/version`.
    pub runtime: String,
    /// Configure: NRI version.
    pub nri_version: String,
    /// Configure: (registration, request) timeouts in ms.
    pub timeouts_ms: (i64, i64),
    /// Configure: facts at process start: `env` (map), `fds` (open fd
    /// numbers), `fd3_is_socket`, `socket_fds` (fds that are sockets),
    /// `pid`.
    pub startup: serde_json::Value,
    /// Exit/StartFailed: error text.
    pub error: String,
}

/// Appends `line` to the log at `path` (one write, so lines never mix).
pub fn append_log(path: &Path, line: &LogLine) {
    let mut text = serde_json::to_string(line).expect("log line");
    text.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open plugin log");
    f.write_all(text.as_bytes()).expect("write plugin log");
}

/// A `ContainerAdjustment` from proto JSON (`{"env":[{"key":"A","value":"1"}]}`).
pub fn adjustment_from_json(v: &serde_json::Value) -> api::ContainerAdjustment {
    protobuf_json_mapping::parse_from_str(&v.to_string()).expect("ContainerAdjustment JSON")
}

/// A `ContainerUpdate` from proto JSON.
pub fn update_from_json(v: &serde_json::Value) -> api::ContainerUpdate {
    protobuf_json_mapping::parse_from_str(&v.to_string()).expect("ContainerUpdate JSON")
}

/// Reads a plugin log written by test plugins.
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
}

impl EventLog {
    /// The log at `path` (may not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        EventLog { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every complete line so far. A last line without its newline is
    /// one the plugin is still writing (a large one, such as a Synchronize
    /// with thousands of containers, takes several writes): it is left for
    /// the next read instead of failing to parse.
    pub fn lines(&self) -> Vec<LogLine> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("log line JSON"))
            .collect()
    }

    /// Lines of one plugin, one event.
    pub fn of(&self, plugin: &str, event: &str) -> Vec<LogLine> {
        self.lines()
            .into_iter()
            .filter(|l| l.plugin == plugin && l.event == event)
            .collect()
    }

    /// Waits until `pred` holds for the lines (polling; 20 s deadline).
    ///
    /// # Panics
    /// When the deadline passes, with the log's content.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[LogLine]) -> bool) -> Vec<LogLine> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let lines = self.lines();
            if pred(&lines) {
                return lines;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; log:\n{lines:#?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for a line of `plugin` with `event`.
    pub async fn wait_event(&self, plugin: &str, event: &str) -> LogLine {
        let lines = self
            .wait_for(&format!("{plugin} {event}"), |l| {
                l.iter().any(|x| x.plugin == plugin && x.event == event)
            })
            .await;
        lines
            .into_iter()
            .find(|x| x.plugin == plugin && x.event == event)
            .expect("found")
    }
}

/// A plugin process; killed when dropped.
pub struct PluginProc {
    /// The child process.
    pub child: Child,
}

impl PluginProc {
    /// Waits for the process to exit (20 s deadline) and returns its status code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st.code();
            }
            assert!(Instant::now() < deadline, "plugin process did not exit");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for PluginProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `nri-test-plugin` (path `bin`) as an external plugin dialling `socket`.
pub fn spawn_plugin(bin: &str, socket: &Path, idx: &str, name: &str, behaviour: &Behaviour) -> PluginProc {
    let child = Command::new(bin)
        .arg("--socket")
        .arg(socket)
        .args(["--idx", idx, "--name", name, "--config"])
        .arg(serde_json::to_string(behaviour).expect("behaviour JSON"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn nri-test-plugin");
    PluginProc { child }
}

/// Puts `nri-test-plugin` into `plugin_dir` as `file_name` (a copy, so the
/// exec bit and name are ours) with `behaviour` as its drop-in config.
pub fn install_plugin(bin: &str, plugin_dir: &Path, conf_dir: &Path, file_name: &str, behaviour: &Behaviour) {
    std::fs::create_dir_all(plugin_dir).expect("plugin dir");
    std::fs::create_dir_all(conf_dir).expect("conf dir");
    let dst = plugin_dir.join(file_name);
    if !dst.exists() {
        std::fs::hard_link(bin, &dst)
            .or_else(|_| std::fs::copy(bin, &dst).map(|_| ()))
            .expect("install plugin");
    }
    std::fs::write(
        conf_dir.join(format!("{file_name}.conf")),
        serde_json::to_string(behaviour).expect("behaviour JSON"),
    )
    .expect("plugin conf");
}

/// Pods, containers and applied updates of the test runtime.
#[derive(Debug, Default)]
pub struct Store {
    /// Pods by id.
    pub pods: BTreeMap<String, api::PodSandbox>,
    /// Containers by id.
    pub containers: BTreeMap<String, api::Container>,
    /// Every update applied through the update callback, in order.
    pub applied: Vec<api::ContainerUpdate>,
    /// Every eviction received.
    pub evicted: Vec<api::ContainerEviction>,
    /// Number of sync callback calls.
    pub syncs: usize,
}

impl Store {
    /// Applies one update to its container (its resources replace the
    /// container's) and records it in `applied`; gives it back when the
    /// container is unknown.
    pub fn apply(&mut self, u: api::ContainerUpdate) -> Result<(), api::ContainerUpdate> {
        match self.containers.get_mut(&u.container_id) {
            Some(c) => {
                let res = u.linux.resources.clone().unwrap_or_default();
                c.linux.mut_or_insert_default().resources = protobuf::MessageField::some(res);
                self.applied.push(u);
                Ok(())
            }
            None => Err(u),
        }
    }

    /// Applies `updates` in order; returns those that failed.
    pub fn apply_all(&mut self, updates: Vec<api::ContainerUpdate>) -> Vec<api::ContainerUpdate> {
        updates.into_iter().filter_map(|u| self.apply(u).err()).collect()
    }

    /// The current resources of container `id`.
    pub fn resources(&self, id: &str) -> Option<api::LinuxResources> {
        let c = self.containers.get(id)?;
        c.linux.as_ref()?.resources.as_ref().cloned()
    }
}

/// A runtime under test: an [`Adaptation`] over a [`Store`], in a temp dir.
pub struct TestRuntime {
    /// The adaptation.
    pub nri: Adaptation,
    /// The runtime's state.
    pub store: Arc<Mutex<Store>>,
    /// Temp dir holding socket, plugin dirs and logs.
    pub dir: tempfile::TempDir,
}

impl TestRuntime {
    /// Socket path for external plugins.
    pub fn socket(dir: &Path) -> PathBuf {
        dir.join("run/nri.sock")
    }

    /// An adaptation builder wired to `store`, socket and plugin dirs
    /// inside `dir`; callers add options and build.
    pub fn builder(dir: &Path, store: &Arc<Mutex<Store>>) -> AdaptationBuilder {
        let sync_store = store.clone();
        let update_store = store.clone();
        let evict_store = store.clone();
        Adaptation::builder("nri-test-runtime", "1.2.3")
            .with_socket_path(Self::socket(dir))
            .with_plugin_path(dir.join("plugins"))
            .with_plugin_config_path(dir.join("conf.d"))
            .with_sync_fn(move || {
                let store = sync_store.clone();
                async move {
                    let mut s = store.lock().unwrap();
                    s.syncs += 1;
                    Ok(RuntimeState {
                        pods: s.pods.values().cloned().collect(),
                        containers: s.containers.values().cloned().collect(),
                    })
                }
            })
            .with_update_fn(move |updates| {
                let store = update_store.clone();
                async move { Ok(store.lock().unwrap().apply_all(updates)) }
            })
            .with_evict_fn(move |ev| {
                let store = evict_store.clone();
                async move {
                    store.lock().unwrap().evicted.push(ev);
                    Ok(())
                }
            })
    }

    /// A started runtime with default options but `request_timeout`.
    pub async fn start(request_timeout: Duration) -> TestRuntime {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Mutex::new(Store::default()));
        let nri = Self::builder(dir.path(), &store)
            .with_request_timeout(request_timeout)
            .build()
            .expect("build adaptation");
        nri.start().await.expect("start adaptation");
        TestRuntime { nri, store, dir }
    }

    /// The external socket.
    pub fn sock(&self) -> PathBuf {
        Self::socket(self.dir.path())
    }

    /// A log file in the temp dir.
    pub fn log(&self, name: &str) -> EventLog {
        EventLog::new(self.dir.path().join(name))
    }

    /// Waits until the active plugins are exactly `names` (in order).
    pub async fn wait_plugins(&self, names: &[&str]) {
        wait_plugins(&self.nri, names).await;
    }

    /// Adds a pod and a container to the runtime's store (as if the runtime
    /// had created them) and returns them.
    pub fn add(&self, pod_id: &str, ctr_id: &str) -> (api::PodSandbox, api::Container) {
        let pod = pod(pod_id);
        let ctr = container(pod_id, ctr_id);
        let mut s = self.store.lock().unwrap();
        s.pods.insert(pod_id.into(), pod.clone());
        s.containers.insert(ctr_id.into(), ctr.clone());
        (pod, ctr)
    }
}

/// Waits until `nri`'s active plugins are exactly `names` (20 s deadline).
pub async fn wait_plugins(nri: &Adaptation, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = nri.plugin_names();
        if now == names {
            return;
        }
        assert!(Instant::now() < deadline, "plugins are {now:?}, expected {names:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A pod sandbox with an id, a name and a namespace.
pub fn pod(id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: id.into(),
        name: format!("{id}-name"),
        namespace: "default".into(),
        uid: format!("{id}-uid"),
        ..Default::default()
    }
}

/// A container of pod `pod_id` named after its id.
pub fn container(pod_id: &str, id: &str) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod_id.into(),
        name: id.into(),
        ..Default::default()
    }
}

/// A CreateContainerRequest for `pod`/`ctr`.
pub fn create_request(pod: &api::PodSandbox, ctr: &api::Container) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: protobuf::MessageField::some(pod.clone()),
        container: protobuf::MessageField::some(ctr.clone()),
        ..Default::default()
    }
}

/// Waits until `pred` holds (polling; 20 s deadline).
///
/// # Panics
/// When the deadline passes.
pub async fn wait_until(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A `ContainerUpdate` of container `id` setting CPU shares and/or cpuset.
pub fn cpu_update(id: &str, shares: Option<u64>, cpus: Option<&str>) -> api::ContainerUpdate {
    let mut cpu = api::LinuxCPU::new();
    if let Some(v) = shares {
        cpu.shares = protobuf::MessageField::some(api::OptionalUInt64 {
            value: v,
            ..Default::default()
        });
    }
    if let Some(c) = cpus {
        cpu.cpus = c.into();
    }
    let mut u = api::ContainerUpdate {
        container_id: id.into(),
        ..Default::default()
    };
    u.linux.mut_or_insert_default().resources = protobuf::MessageField::some(api::LinuxResources {
        cpu: protobuf::MessageField::some(cpu),
        ..Default::default()
    });
    u
}

/// A runtime model with a lock of its own, as containerd's CRI plugin has:
/// its sync and update callbacks take that lock, and so do its CRI
/// operations around their call into NRI. This is the lock order that
/// deadlocked upstream (NRI #78, containerd #13733) when the adaptation held
/// a lock of its own while calling back into the runtime.
pub struct LockedRuntime {
    /// The adaptation.
    pub nri: Adaptation,
    /// The runtime's state.
    pub store: Arc<Mutex<Store>>,
    /// The runtime's own lock.
    pub lock: Arc<tokio::sync::Mutex<()>>,
    /// Temp dir holding socket, plugin dirs and logs.
    pub dir: tempfile::TempDir,
}

impl LockedRuntime {
    /// An adaptation builder like [`TestRuntime::builder`] whose sync and
    /// update callbacks take `lock` first.
    pub fn builder(dir: &Path, store: &Arc<Mutex<Store>>, lock: &Arc<tokio::sync::Mutex<()>>) -> AdaptationBuilder {
        let (sync_store, sync_lock) = (store.clone(), lock.clone());
        let (update_store, update_lock) = (store.clone(), lock.clone());
        TestRuntime::builder(dir, store)
            .with_sync_fn(move || {
                let (store, lock) = (sync_store.clone(), sync_lock.clone());
                async move {
                    let _runtime = lock.lock().await;
                    let mut s = store.lock().unwrap();
                    s.syncs += 1;
                    Ok(RuntimeState {
                        pods: s.pods.values().cloned().collect(),
                        containers: s.containers.values().cloned().collect(),
                    })
                }
            })
            .with_update_fn(move |updates| {
                let (store, lock) = (update_store.clone(), update_lock.clone());
                async move {
                    let _runtime = lock.lock().await;
                    Ok(store.lock().unwrap().apply_all(updates))
                }
            })
    }

    /// A started runtime with `request_timeout`.
    pub async fn start(request_timeout: Duration) -> LockedRuntime {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Mutex::new(Store::default()));
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let nri = Self::builder(dir.path(), &store, &lock)
            .with_request_timeout(request_timeout)
            .build()
            .expect("build adaptation");
        nri.start().await.expect("start adaptation");
        LockedRuntime { nri, store, lock, dir }
    }

    /// The external socket.
    pub fn sock(&self) -> PathBuf {
        TestRuntime::socket(self.dir.path())
    }

    /// Waits until the active plugins are exactly `names` (in order).
    pub async fn wait_plugins(&self, names: &[&str]) {
        wait_plugins(&self.nri, names).await;
    }

    /// Adds a pod and a container to the store.
    pub fn add(&self, pod_id: &str, ctr_id: &str) -> (api::PodSandbox, api::Container) {
        let (p, c) = (pod(pod_id), container(pod_id, ctr_id));
        let mut s = self.store.lock().unwrap();
        s.pods.insert(pod_id.into(), p.clone());
        s.containers.insert(ctr_id.into(), c.clone());
        (p, c)
    }

    /// CRI StartContainer: the runtime lock, then NRI.
    ///
    /// # Errors
    /// What NRI returns.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<(), nri_adaptation::Error> {
        let _runtime = self.lock.lock().await;
        self.nri.start_container(pod, ctr).await
    }

    /// CRI UpdateContainerResources: under the runtime lock, NRI
    /// UpdateContainer, then the plugins' updates and the requested
    /// resources are applied to the store.
    ///
    /// # Errors
    /// What NRI returns.
    pub async fn update_container_resources(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
        resources: api::LinuxResources,
    ) -> Result<(), nri_adaptation::Error> {
        let _runtime = self.lock.lock().await;
        let req = api::UpdateContainerRequest {
            pod: protobuf::MessageField::some(pod.clone()),
            container: protobuf::MessageField::some(ctr.clone()),
            linux_resources: protobuf::MessageField::some(resources.clone()),
            ..Default::default()
        };
        let updates = self.nri.update_container(req).await?;
        let mut s = self.store.lock().unwrap();
        // The adaptation returns the target's complete new resources as the
        // last element; should it not, apply the requested ones.
        if !updates.iter().any(|u| u.container_id == ctr.id) {
            let mut own = api::ContainerUpdate {
                container_id: ctr.id.clone(),
                ..Default::default()
            };
            own.linux.mut_or_insert_default().resources = protobuf::MessageField::some(resources);
            s.apply(own).expect("updated container exists");
        }
        let failed = s.apply_all(updates);
        assert!(failed.is_empty(), "updates failed: {failed:?}");
        Ok(())
    }
}

/// File descriptors (≥ 3) this process has open without `FD_CLOEXEC`: what
/// any child inherits besides what its parent passes on purpose. A test
/// harness or CI runner may leak some into the test process; tests about fd
/// hygiene subtract them.
pub fn inheritable_fds() -> Vec<i32> {
    let mut fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= 3)
        .filter(|fd| {
            nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_GETFD).is_ok_and(|flags| flags & nix::libc::FD_CLOEXEC == 0)
        })
        .collect();
    fds.sort();
    fds
}

/// Every shim process (`containerd-shim-*`, any runtime) started with
/// `-address <sock>`, the socket of one private containerd: pid and
/// command line (NULs as spaces). `containerd-shim-` is looked for
/// anywhere in the command line: a re-executed daemon's argv\[0\] need not
/// be the shim's file name.
pub fn shims_of(sock: &Path) -> Vec<(i32, String)> {
    let needle = format!("-address {}", sock.display());
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("containerd-shim-")
            && (cmd.contains(&format!("{needle} ")) || cmd.trim_end().ends_with(&needle))
        {
            found.push((pid, cmd));
        }
    }
    found
}

/// SIGKILLs every shim of [`shims_of`]`(sock)`: what is left of one
/// containerd when its test ends. containerd 2.x starts a runtime's shim
/// before it refuses some creates (an idmapped mount the shim's `-info`
/// does not claim) and a refused create's runc shim then never gets a
/// task to shut down; without this it outlives the test's containerd.
/// Returns the pids signalled.
pub fn kill_shims_of(sock: &Path) -> Vec<i32> {
    shims_of(sock)
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL).is_ok()
        })
        .collect()
}

/// A loopback port free at the moment, for a daemon's `[metrics] address`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// One `GET /metrics` on the loopback `port`: the whole HTTP answer.
///
/// # Errors
/// Nothing listens there yet, or the connection failed.
pub fn try_scrape(port: u16) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// [`try_scrape`] until the daemon serves it (20 s deadline).
///
/// # Panics
/// At the deadline, naming the port and the last error.
pub fn scrape(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match try_scrape(port) {
            Ok(text) => return text,
            Err(e) => assert!(Instant::now() < deadline, "no metrics on port {port}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
