//! A scriptable NRI plugin for the integration tests, built on `nri-stub`.
//!
//! Usage: `nri-test-plugin [--socket PATH] [--idx NN] [--name NAME] [--config JSON]`.
//! Launched by a runtime, it takes name, index and socket from the
//! environment and its behaviour from the Configure config (the same JSON).
//! Behaviour ([`integration::Behaviour`]): which events to subscribe to,
//! where to log every request as a JSON line, per-event sleeps, errors and
//! crashes, and the adjustment to return from CreateContainer.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use integration::{Behaviour, LogLine};
use nri_stub::{BoxError, EventMask, Plugin, Stub, StubHandle, api};

struct TestPlugin {
    behaviour: Mutex<Behaviour>,
    name: Mutex<String>,
    /// Environment and fds at process start (before the stub touches them).
    startup: serde_json::Value,
    handle: Mutex<Option<StubHandle>>,
}

impl TestPlugin {
    fn b(&self) -> Behaviour {
        self.behaviour.lock().unwrap().clone()
    }

    fn log(&self, mut line: LogLine) {
        let b = self.b();
        line.plugin = self.name.lock().unwrap().clone();
        if let Some(path) = &b.log {
            integration::append_log(path, &line);
        }
    }

    /// Applies the scripted sleep, crash and error of `event`.
    async fn script(&self, event: &str, container: Option<&api::Container>) -> Result<(), BoxError> {
        let b = self.b();
        if let (Some(only), Some(c)) = (&b.only_container, container) {
            if &c.id != only && &c.name != only {
                return Ok(());
            }
        }
        if b.exit_on.as_deref() == Some(event) {
            std::process::exit(17);
        }
        if let Some(ms) = b.sleep_ms.get(event) {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
        if let Some(msg) = b.fail.get(event) {
            return Err(msg.clone().into());
        }
        Ok(())
    }

    fn ctr_line(event: &str, pod: &api::PodSandbox, c: &api::Container) -> LogLine {
        LogLine {
            event: event.into(),
            pod: pod.id.clone(),
            container: c.id.clone(),
            container_name: c.name.clone(),
            env: c.env.clone(),
            annotations: c.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ..Default::default()
        }
    }

    async fn container_event(&self, event: &str, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.log(Self::ctr_line(event, pod, c));
        self.script(event, Some(c)).await
    }

    async fn pod_event(&self, event: &str, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.log(LogLine {
            event: event.into(),
            pod: pod.id.clone(),
            ..Default::default()
        });
        self.script(event, None).await
    }
}

#[nri_stub::async_trait]
impl Plugin for TestPlugin {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        if !req.config.is_empty() {
            let b: Behaviour = serde_json::from_str(&req.config).map_err(|e| format!("bad config: {e}"))?;
            *self.behaviour.lock().unwrap() = b;
        }
        self.log(LogLine {
            event: "Configure".into(),
            config: req.config.clone(),
            runtime: format!("{}/{}", req.runtime_name, req.runtime_version),
            nri_version: req.NRI_version.clone(),
            timeouts_ms: (req.registration_timeout, req.request_timeout),
            startup: self.startup.clone(),
            ..Default::default()
        });
        self.script("Configure", None).await?;
        let b = self.b();
        Ok(match &b.events {
            Some(e) => EventMask::parse(e)?,
            None => EventMask::default(),
        })
    }

    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.log(LogLine {
            event: "Synchronize".into(),
            pods: pods.iter().map(|p| p.id.clone()).collect(),
            containers: containers.iter().map(|c| c.id.clone()).collect(),
            ..Default::default()
        });
        self.script("Synchronize", None).await?;
        let b = self.b();
        Ok(b.sync_updates.iter().map(integration::update_from_json).collect())
    }

    async fn shutdown(&self) {
        self.log(LogLine {
            event: "Shutdown".into(),
            ..Default::default()
        });
    }

    async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.pod_event("RunPodSandbox", pod).await
    }

    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), BoxError> {
        self.pod_event("UpdatePodSandbox", req.pod.get_or_default()).await
    }

    async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.pod_event("PostUpdatePodSandbox", pod).await
    }

    async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.pod_event("StopPodSandbox", pod).await
    }

    async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.pod_event("RemovePodSandbox", pod).await
    }

    async fn create_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        self.container_event("CreateContainer", pod, c).await?;
        let b = self.b();
        let mut rsp = api::CreateContainerResponse::new();
        if let Some(adj) = &b.adjust {
            rsp.adjust = protobuf::MessageField::some(integration::adjustment_from_json(adj));
        }
        rsp.update = b.create_updates.iter().map(integration::update_from_json).collect();
        rsp.evict = b
            .create_reply_evicts
            .iter()
            .map(|id| api::ContainerEviction {
                container_id: id.clone(),
                reason: format!("evicted in the reply of {}", self.name.lock().unwrap()),
                ..Default::default()
            })
            .collect();
        if b.update_containers_on_create.is_some() || b.evict_on_create.is_some() {
            // Unsolicited update from inside an event handler (R8 shape).
            let h = self.handle.lock().unwrap().clone();
            if let Some(h) = h {
                let update = b
                    .update_containers_on_create
                    .iter()
                    .map(integration::update_from_json)
                    .collect();
                let evict = b
                    .evict_on_create
                    .iter()
                    .map(|id| api::ContainerEviction {
                        container_id: id.clone(),
                        reason: format!("evicted by {}", self.name.lock().unwrap()),
                        ..Default::default()
                    })
                    .collect();
                let _ = h.update_containers(update, evict).await;
            }
        }
        Ok(rsp)
    }

    async fn post_create_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.container_event("PostCreateContainer", pod, c).await
    }

    async fn start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.container_event("StartContainer", pod, c).await
    }

    async fn post_start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.container_event("PostStartContainer", pod, c).await
    }

    async fn update_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
        _resources: &api::LinuxResources,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        self.container_event("UpdateContainer", pod, c).await?;
        let b = self.b();
        Ok(api::UpdateContainerResponse {
            update: b.update_updates.iter().map(integration::update_from_json).collect(),
            ..Default::default()
        })
    }

    async fn post_update_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.container_event("PostUpdateContainer", pod, c).await
    }

    async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.container_event("StopContainer", pod, c).await?;
        Ok(Vec::new())
    }

    async fn remove_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.container_event("RemoveContainer", pod, c).await
    }

    async fn validate_container_adjustment(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        let c = req.container.get_or_default();
        self.container_event("ValidateContainerAdjustment", req.pod.get_or_default(), c)
            .await?;
        match self.b().reject {
            Some(reason) => Err(reason.into()),
            None => Ok(()),
        }
    }
}

fn startup_facts() -> serde_json::Value {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    // Every open fd except the one read_dir itself holds on /proc/self/fd.
    let mut fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                if target.starts_with("/proc") {
                    return None;
                }
                e.file_name().to_str()?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    fds.sort();
    let is_socket = |fd: i32| {
        nix::sys::stat::fstat(fd)
            .map(|st| st.st_mode & 0o170000 == 0o140000)
            .unwrap_or(false)
    };
    let socket_fds: Vec<i32> = fds.iter().copied().filter(|fd| is_socket(*fd)).collect();
    serde_json::json!({
        "env": env,
        "fds": fds,
        "fd3_is_socket": is_socket(3),
        "socket_fds": socket_fds,
        "pid": std::process::id(),
    })
}

fn main() {
    // Facts first, before the tokio runtime opens its own fds (epoll,
    // eventfd, signal sockets); reading /proc/self/fd opens one more fd of
    // its own, which startup_facts leaves out.
    let startup = startup_facts();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(startup));
}

async fn run(startup: serde_json::Value) {
    let mut args = std::env::args().skip(1);
    let (mut socket, mut idx, mut name, mut config) = (None, None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next(),
            "--idx" => idx = args.next(),
            "--name" => name = args.next(),
            "--config" => config = args.next(),
            other => {
                eprintln!("nri-test-plugin: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let behaviour: Behaviour = config
        .map(|c| serde_json::from_str(&c).expect("--config is not valid JSON"))
        .unwrap_or_default();
    let events = match &behaviour.events {
        Some(e) => EventMask::parse(e).expect("bad events"),
        None => EventMask::VALID,
    };
    let plugin = Arc::new(TestPlugin {
        behaviour: Mutex::new(behaviour),
        name: Mutex::new(String::new()),
        startup,
        handle: Mutex::new(None),
    });
    let mut builder = Stub::builder_arc(plugin.clone()).with_events(events);
    if let Some(s) = socket {
        builder = builder.with_socket_path(s);
    }
    if let Some(i) = idx {
        builder = builder.with_plugin_idx(i);
    }
    if let Some(n) = name {
        builder = builder.with_plugin_name(n);
    }
    let stub = builder.build().expect("stub");
    *plugin.name.lock().unwrap() = stub.qualified_name();
    let handle = match stub.start().await {
        Ok(h) => h,
        Err(e) => {
            // A binary edge: the log line carries the whole cause chain.
            let text = format!("{:#}", anyhow::Error::new(e));
            eprintln!("nri-test-plugin: {text}");
            plugin.log(LogLine {
                event: "StartFailed".into(),
                error: text,
                ..Default::default()
            });
            std::process::exit(1);
        }
    };
    *plugin.handle.lock().unwrap() = Some(handle.clone());
    let result = handle.wait().await;
    let failed = result.is_err();
    let cleanup = plugin.b().sleep_ms.get("Exit").copied();
    if let Some(ms) = cleanup {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    plugin.log(LogLine {
        event: "Exit".into(),
        error: result
            .err()
            .map(|e| format!("{:#}", anyhow::Error::new(e)))
            .unwrap_or_default(),
        ..Default::default()
    });
    std::process::exit(if failed { 1 } else { 0 });
}
