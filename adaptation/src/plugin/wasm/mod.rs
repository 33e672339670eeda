//! WebAssembly plugins, runtime side: [`WasmLink`], the [`Link`] of a
//! plugin loaded from a module in the plugin directory, and
//! [`Plugin::wasm`], which loads and configures one. The calling
//! convention and the sandbox are described in [`crate::wasm`].
//!
//! Each plugin's instance lives on a thread of its own; requests reach it
//! in order through a channel, so the plugin's code never runs on the
//! runtime's async threads and a plugin busy until its deadline holds up
//! nobody else.

mod guest;
mod wasi;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use nri_proto::{
    api::{self, Event},
    events::{EventMask, event_name},
    sync::lock,
};
use protobuf::Message;

use super::{HandshakeError, HandshakeParams, Host, Parts, Plugin, PluginOrigin, link::Link};
use crate::{
    config::FailurePolicy,
    error::PluginError,
    wasm::{WasmCallError, WasmError},
};
use guest::{CallFailure, Compiled, Guest};

/// A job for the plugin's thread.
type Job = Box<dyn FnOnce(&mut Guest) + Send>;

/// How long the async side waits beyond a call's deadline, counted from
/// when the plugin's thread took the call up, before it gives the plugin
/// up (its thread is then stuck outside the plugin's code: the epoch
/// interrupts the plugin's own code, and no host function blocks).
const BACKSTOP: Duration = Duration::from_secs(2);

/// A loaded WebAssembly plugin.
pub(crate) struct WasmLink {
    /// `IDX-NAME`, for logs.
    name: String,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    request_timeout: Duration,
    /// Exports of the module (`plugin_*` names).
    exports: Vec<&'static str>,
    closed: AtomicBool,
    close_notify: tokio::sync::Notify,
    fallback_warned: Mutex<EventMask>,
}

/// The export of each notification event.
fn notification_export(event: Event) -> Option<&'static str> {
    Some(match event {
        Event::RUN_POD_SANDBOX => "plugin_run_pod_sandbox",
        Event::STOP_POD_SANDBOX => "plugin_stop_pod_sandbox",
        Event::REMOVE_POD_SANDBOX => "plugin_remove_pod_sandbox",
        Event::POST_UPDATE_POD_SANDBOX => "plugin_post_update_pod_sandbox",
        Event::POST_CREATE_CONTAINER => "plugin_post_create_container",
        Event::START_CONTAINER => "plugin_start_container",
        Event::POST_START_CONTAINER => "plugin_post_start_container",
        Event::POST_UPDATE_CONTAINER => "plugin_post_update_container",
        Event::REMOVE_CONTAINER => "plugin_remove_container",
        _ => return None,
    })
}

impl WasmLink {
    fn has(&self, export: &str) -> bool {
        self.exports.contains(&export)
    }

    fn mark_closed(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            lock(&self.jobs).take();
            self.close_notify.notify_waiters();
        }
    }

    /// Runs `f` on the plugin's thread, after the calls queued before it;
    /// `wait` is `f`'s own deadline.
    async fn on_thread<T: Send + 'static>(
        &self,
        wait: Duration,
        f: impl FnOnce(&mut Guest) -> T + Send + 'static,
    ) -> Result<T, PluginError> {
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |g| {
            let _ = started_tx.send(());
            let _ = tx.send(f(g));
        });
        let sent = match lock(&self.jobs).as_ref() {
            Some(jobs) => jobs.send(job).is_ok(),
            None => false,
        };
        if !sent {
            return Err(PluginError::Closed);
        }
        // Each call queued before this one ends within its own deadline.
        if started.await.is_err() {
            self.mark_closed();
            return Err(PluginError::Closed);
        }
        match tokio::time::timeout(wait + BACKSTOP, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => {
                self.mark_closed();
                Err(PluginError::Closed)
            }
            Err(_) => {
                tracing::error!(plugin = %self.name, "WebAssembly plugin's thread did not come back from its call; dropping the plugin");
                self.mark_closed();
                Err(PluginError::Timeout(wait))
            }
        }
    }

    /// Sends `req` to export `export` under the request timeout and decodes
    /// the answer as `R`.
    async fn request<R: protobuf::MessageFull>(
        &self,
        export: &'static str,
        req: &impl Message,
    ) -> Result<R, PluginError> {
        let bytes = req
            .write_to_bytes()
            .map_err(|e| PluginError::Protocol(format!("cannot encode the request: {e}")))?;
        let timeout = self.request_timeout;
        let answer = self
            .on_thread(timeout, move |g| g.call(export, &bytes, timeout))
            .await?;
        let bytes = answer.map_err(|f| self.failure(f))?;
        R::parse_from_bytes(&bytes).map_err(|e| {
            PluginError::Wasm(WasmCallError::Garbage(format!(
                "{} bytes from {export} do not decode as {}: {e}",
                bytes.len(),
                R::descriptor().name()
            )))
        })
    }

    /// The plugin error of a failed call; a failure that stopped the
    /// instance closes the link.
    fn failure(&self, f: CallFailure) -> PluginError {
        match f {
            CallFailure::Timeout => {
                self.mark_closed();
                PluginError::Timeout(self.request_timeout)
            }
            CallFailure::Returned(message) => PluginError::Returned {
                code: ttrpc::Code::UNKNOWN,
                message,
            },
            CallFailure::Wasm(e) => {
                if e.kills_instance() {
                    self.mark_closed();
                }
                PluginError::Wasm(e)
            }
        }
    }

    /// The events a Configure answer of `requested` amounts to: every
    /// event for an empty mask (as upstream), without those the module has
    /// no export for; an explicit subscription to one of those is an error.
    fn subscription(&self, requested: i32) -> Result<i32, PluginError> {
        let mask = EventMask::from_configure(requested).map_err(|e| PluginError::Protocol(e.to_string()))?;
        let mut out = EventMask::default();
        for event in mask.events() {
            let export = match event {
                Event::UPDATE_POD_SANDBOX => "plugin_update_pod_sandbox",
                Event::VALIDATE_CONTAINER_ADJUSTMENT => "plugin_validate_container_adjustment",
                _ => {
                    out.set(event);
                    continue;
                }
            };
            if self.has(export) {
                out.set(event);
            } else if requested != 0 {
                return Err(PluginError::Protocol(format!(
                    "subscribes to {} but does not export {export}",
                    event_name(event)
                )));
            }
        }
        Ok(out.bits())
    }
}

#[async_trait]
impl Link for WasmLink {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<api::ConfigureResponse, PluginError> {
        let mut rsp: api::ConfigureResponse = self.request("plugin_configure", req).await?;
        rsp.events = self.subscription(rsp.events)?;
        Ok(rsp)
    }

    /// One message, whatever its size: there is no ttrpc limit to split
    /// for (upstream sends WebAssembly plugins one message too).
    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let req = api::SynchronizeRequest {
            pods: pods.to_vec(),
            containers: containers.to_vec(),
            ..Default::default()
        };
        let rsp: api::SynchronizeResponse = self.request("plugin_synchronize", &req).await?;
        Ok(rsp.update)
    }

    /// The event's own export, else `plugin_state_change` (modules built
    /// against NRI before v0.12).
    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        let pod = protobuf::MessageField::some(pod.clone());
        let ctr = protobuf::MessageField::from_option(container.cloned());
        let export = notification_export(event)
            .ok_or_else(|| PluginError::Protocol(format!("{event:?} is not a notification event")))?;
        if self.has(export) {
            macro_rules! send {
                ($req:expr, $rsp:ty) => {
                    self.request::<$rsp>(export, &$req).await.map(|_| ())
                };
            }
            return match event {
                Event::RUN_POD_SANDBOX => send!(
                    api::RunPodSandboxRequest {
                        pod,
                        ..Default::default()
                    },
                    api::RunPodSandboxResponse
                ),
                Event::STOP_POD_SANDBOX => send!(
                    api::StopPodSandboxRequest {
                        pod,
                        ..Default::default()
                    },
                    api::StopPodSandboxResponse
                ),
                Event::REMOVE_POD_SANDBOX => send!(
                    api::RemovePodSandboxRequest {
                        pod,
                        ..Default::default()
                    },
                    api::RemovePodSandboxResponse
                ),
                Event::POST_UPDATE_POD_SANDBOX => send!(
                    api::PostUpdatePodSandboxRequest {
                        pod,
                        ..Default::default()
                    },
                    api::PostUpdatePodSandboxResponse
                ),
                Event::POST_CREATE_CONTAINER => send!(
                    api::PostCreateContainerRequest {
                        pod,
                        container: ctr,
                        ..Default::default()
                    },
                    api::PostCreateContainerResponse
                ),
                Event::START_CONTAINER => send!(
                    api::StartContainerRequest {
                        pod,
                        container: ctr,
                        ..Default::default()
                    },
                    api::StartContainerResponse
                ),
                Event::POST_START_CONTAINER => send!(
                    api::PostStartContainerRequest {
                        pod,
                        container: ctr,
                        ..Default::default()
                    },
                    api::PostStartContainerResponse
                ),
                Event::POST_UPDATE_CONTAINER => send!(
                    api::PostUpdateContainerRequest {
                        pod,
                        container: ctr,
                        ..Default::default()
                    },
                    api::PostUpdateContainerResponse
                ),
                _ => send!(
                    api::RemoveContainerRequest {
                        pod,
                        container: ctr,
                        ..Default::default()
                    },
                    api::RemoveContainerResponse
                ),
            };
        }
        {
            let mut warned = lock(&self.fallback_warned);
            if !warned.is_set(event) {
                warned.set(event);
                tracing::info!(plugin = %self.name, event = event_name(event), "WebAssembly plugin has no export of its own for this event (built against NRI before v0.12); sending StateChange");
            }
        }
        let req = api::StateChangeEvent {
            event: event.into(),
            pod,
            container: ctr,
            ..Default::default()
        };
        self.request::<api::Empty>("plugin_state_change", &req)
            .await
            .map(|_| ())
    }

    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError> {
        if !self.has("plugin_update_pod_sandbox") {
            // Not subscribed (see `subscription`); nothing to tell it.
            return Ok(());
        }
        self.request::<api::UpdatePodSandboxResponse>("plugin_update_pod_sandbox", req)
            .await
            .map(|_| ())
    }

    async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        self.request("plugin_create_container", req).await
    }

    async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        self.request("plugin_update_container", req).await
    }

    async fn stop_container(&self, req: &api::StopContainerRequest) -> Result<api::StopContainerResponse, PluginError> {
        self.request("plugin_stop_container", req).await
    }

    async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError> {
        if !self.has("plugin_validate_container_adjustment") {
            return Ok(api::ValidateContainerAdjustmentResponse::new());
        }
        self.request("plugin_validate_container_adjustment", req).await
    }

    async fn shutdown(&self, wait: Duration) {
        if self.is_closed() {
            return;
        }
        let req = api::Empty::new().write_to_bytes().unwrap_or_default();
        let wait = wait.min(self.request_timeout);
        let _ = self
            .on_thread(wait, move |g| g.call("plugin_shutdown", &req, wait))
            .await;
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    async fn closed(&self) {
        loop {
            let notified = self.close_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    async fn close(&self) {
        self.mark_closed();
    }
}

/// What loading a module needs besides the handshake parameters.
pub(crate) struct WasmPlugin {
    pub idx: String,
    pub base: String,
    pub path: std::path::PathBuf,
    /// Its drop-in configuration.
    pub config: String,
    /// Granted environment, `NAME=VALUE`.
    pub env: Vec<String>,
    /// Memory limit in bytes.
    pub memory_limit: u64,
}

/// Why a WebAssembly plugin did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WasmStartError {
    /// The module could not be loaded.
    #[error(transparent)]
    Load(#[from] WasmError),
    /// Its name is taken, or Configure failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
}

impl Plugin {
    /// Loads the WebAssembly plugin `w` (compiled once per content,
    /// instantiated on its own thread, `_initialize` under the
    /// registration timeout) and configures it.
    pub(crate) async fn wasm(
        w: WasmPlugin,
        params: &HandshakeParams,
        host: Arc<dyn Host>,
        policy: FailurePolicy,
    ) -> Result<Arc<Plugin>, WasmStartError> {
        let name = format!("{}-{}", w.idx, w.base);
        let bytes = tokio::fs::read(&w.path).await.map_err(WasmError::Read)?;
        let compiled = tokio::task::spawn_blocking(move || Compiled::get(&bytes))
            .await
            .map_err(|e| WasmError::Compile(format!("the compiler panicked: {e}")))??;
        let compiled = Arc::new(compiled);
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
        let init_timeout = params.registration_timeout;
        let thread_name = format!("nri-wasm-{}", w.idx);
        let plugin_name = name.clone();
        let (env, memory_limit) = (w.env, w.memory_limit);
        // The plugin's log lines go where the adaptation's go.
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        std::thread::Builder::new()
            .name(thread_name)
            // Above the engine's 512 KiB WebAssembly stack, with room for
            // the host functions it calls.
            .stack_size(4 << 20)
            .spawn(move || {
                let _log = tracing::dispatcher::set_default(&dispatch);
                let mut guest = match Guest::load(plugin_name, compiled, env, memory_limit, init_timeout) {
                    Ok(g) => {
                        let exports: Vec<&'static str> = guest::REQUIRED
                            .into_iter()
                            .chain(guest::OPTIONAL)
                            .filter(|e| g.has(e))
                            .collect();
                        let _ = loaded_tx.send(Ok(exports));
                        g
                    }
                    Err(e) => {
                        let _ = loaded_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut guest);
                }
            })
            .map_err(WasmError::Thread)?;
        let exports = loaded_rx
            .await
            .map_err(|_| WasmError::Instantiate("the plugin's thread ended while loading".into()))??;
        if !host.reserve(&w.idx, &w.base) {
            return Err(HandshakeError::RegistrationRefused(format!("plugin {name} is already registered")).into());
        }
        tracing::info!(plugin = %name, path = %w.path.display(), memory_limit = w.memory_limit, "WebAssembly NRI plugin loaded");
        let link = WasmLink {
            name,
            jobs: Mutex::new(Some(jobs)),
            request_timeout: params.request_timeout,
            exports,
            closed: AtomicBool::new(false),
            close_notify: tokio::sync::Notify::new(),
            fallback_warned: Mutex::new(EventMask::default()),
        };
        let parts = Parts {
            idx: w.idx,
            base: w.base,
            origin: PluginOrigin::Launched {
                path: w.path,
                pid: None,
            },
            policy,
            link: Box::new(link),
            child: None,
            host,
        };
        Ok(Plugin::configured(parts, params, w.config).await?)
    }
}

#[cfg(test)]
mod tests;
