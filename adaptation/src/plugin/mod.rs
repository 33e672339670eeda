//! One plugin, runtime side: the record of a registered and configured
//! plugin and one method per request, each sent through the plugin's
//! [`Link`] (ttrpc to a plugin process, or a direct call in process).
//! How a connection becomes a plugin is in [`handshake`].

mod gate;
mod handshake;
mod link;
#[cfg(feature = "wasm")]
mod wasm;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering},
    },
    time::Duration,
};

use nri_proto::{
    api::{self, Event},
    events::EventMask,
    plugin::NOTIFICATIONS,
};

pub use handshake::HandshakeError;
pub(crate) use handshake::{HandshakeParams, Host, LaunchedIdentity};
use link::Link;
#[cfg(feature = "wasm")]
pub(crate) use wasm::WasmPlugin;

use crate::{
    config::FailurePolicy,
    error::PluginError,
    observe::Outcome,
    registry::{launch::PluginProcess, turns::Turnstile},
};

/// Where a plugin is in joining the runtime's order of requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joined {
    /// Admitted to the order, its Synchronize not yet answered: requests
    /// admitted since wait behind it.
    Syncing = 0,
    /// Synchronized: in the registry's active list.
    Active = 1,
    /// Its sync failed: requests that wait for it pass it by.
    Failed = 2,
}

/// How a plugin came to be connected.
#[derive(Debug, Clone)]
pub enum PluginOrigin {
    /// It dialled the runtime's socket. `pid` from SO_PEERCRED, if known.
    External {
        /// Peer process id.
        pid: Option<i32>,
    },
    /// It runs inside the runtime's process.
    Builtin,
    /// The runtime launched it from the plugin directory.
    Launched {
        /// Path of the executable.
        path: std::path::PathBuf,
        /// Process id of the launched plugin.
        pid: Option<u32>,
    },
}

/// For log lines: `external (pid 42)`, `built-in`, `pre-installed
/// /opt/nri/plugins/10-a (pid 43)`; the pid is left out when unknown.
impl std::fmt::Display for PluginOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginOrigin::External { pid } => {
                f.write_str("external")?;
                pid.map_or(Ok(()), |p| write!(f, " (pid {p})"))
            }
            PluginOrigin::Builtin => f.write_str("built-in"),
            PluginOrigin::Launched { path, pid } => {
                write!(f, "pre-installed {}", path.display())?;
                pid.map_or(Ok(()), |p| write!(f, " (pid {p})"))
            }
        }
    }
}

/// A connected, configured plugin.
pub(crate) struct Plugin {
    pub idx: String,
    pub base: String,
    /// `IDX-NAME`, computed once.
    qualified: String,
    pub origin: PluginOrigin,
    pub policy: FailurePolicy,
    events: AtomicI32,
    link: Box<dyn Link>,
    /// Set by [`Plugin::close`]; `close_notify` wakes [`Plugin::closed`].
    closed: AtomicBool,
    /// Set once its `IDX-NAME` was given back (see [`Plugin::release_name`]).
    name_released: AtomicBool,
    close_notify: tokio::sync::Notify,
    /// A launched plugin's process, which leads its own process group.
    /// Held across kill and reap, so every caller returns after the
    /// process is gone.
    child: tokio::sync::Mutex<Option<PluginProcess>>,
    host: Arc<dyn Host>,
    /// Its turns: the runtime's requests it gets, one at a time, in the
    /// order they were admitted (see [`crate::registry::turns`]).
    pub turns: Arc<Turnstile>,
    /// A [`Joined`].
    joined: AtomicU8,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name())
            .field("origin", &self.origin)
            .field("events", &self.events())
            .finish()
    }
}

/// What a plugin record is made of, whatever its link.
pub(crate) struct Parts {
    pub idx: String,
    pub base: String,
    pub origin: PluginOrigin,
    pub policy: FailurePolicy,
    pub link: Box<dyn Link>,
    pub child: Option<PluginProcess>,
    pub host: Arc<dyn Host>,
}

impl Plugin {
    /// The one place a plugin record is written. The record is not
    /// configured yet (no events).
    fn new(parts: Parts) -> Arc<Plugin> {
        Arc::new(Plugin {
            qualified: format!("{}-{}", parts.idx, parts.base),
            idx: parts.idx,
            base: parts.base,
            origin: parts.origin,
            policy: parts.policy,
            events: AtomicI32::new(0),
            link: parts.link,
            closed: AtomicBool::new(false),
            name_released: AtomicBool::new(false),
            close_notify: tokio::sync::Notify::new(),
            child: tokio::sync::Mutex::new(parts.child),
            host: parts.host,
            turns: Arc::default(),
            joined: AtomicU8::new(Joined::Syncing as u8),
        })
    }

    /// Where the plugin is in joining.
    pub fn joined(&self) -> Joined {
        match self.joined.load(Ordering::SeqCst) {
            0 => Joined::Syncing,
            1 => Joined::Active,
            _ => Joined::Failed,
        }
    }

    /// Records the outcome of its join.
    pub fn set_joined(&self, j: Joined) {
        self.joined.store(j as u8, Ordering::SeqCst);
    }

    /// Builds the record from `parts` and configures it; a plugin that
    /// fails to configure is closed.
    async fn configured(parts: Parts, params: &HandshakeParams, config: String) -> Result<Arc<Plugin>, HandshakeError> {
        let plugin = Plugin::new(parts);
        if let Err(e) = plugin.configure(params, config).await {
            plugin.close().await;
            return Err(e);
        }
        Ok(plugin)
    }

    async fn configure(&self, params: &HandshakeParams, config: String) -> Result<(), HandshakeError> {
        let req = api::ConfigureRequest {
            config,
            runtime_name: params.runtime_name.clone(),
            runtime_version: params.runtime_version.clone(),
            registration_timeout: params.registration_timeout.as_millis() as i64,
            request_timeout: params.request_timeout.as_millis() as i64,
            NRI_version: nri_proto::NRI_VERSION.to_string(),
            ..Default::default()
        };
        let rsp = match self.request("Configure", self.link.configure(&req)).await {
            Ok(rsp) => rsp,
            Err(PluginError::Closed) => return Err(self.closed_during("configuration").await),
            Err(e) => return Err(HandshakeError::Configure(e.to_string())),
        };
        let mask = EventMask::from_configure(rsp.events).map_err(|e| HandshakeError::Configure(e.to_string()))?;
        self.events.store(mask.bits(), Ordering::SeqCst);
        tracing::info!(plugin = %self.name(), events = %mask, "plugin configured");
        Ok(())
    }

    /// Why the connection closed during `during`: a launched plugin's exit
    /// status or signal when its process exited, else just the closure.
    async fn closed_during(&self, during: &'static str) -> HandshakeError {
        if let Some(child) = self.child.lock().await.as_mut() {
            if let Some(status) = child.exit_status(handshake::EXIT_WAIT).await {
                return HandshakeError::Exited {
                    during,
                    status: crate::registry::launch::describe_exit(status),
                };
            }
        }
        HandshakeError::Closed { during, reason: None }
    }

    /// `IDX-NAME`.
    pub fn name(&self) -> &str {
        &self.qualified
    }

    /// The subscription mask (0 before Configure).
    pub fn events(&self) -> EventMask {
        EventMask::from_bits(self.events.load(Ordering::SeqCst))
    }

    /// Whether the plugin wants `event`.
    pub fn subscribed(&self, event: Event) -> bool {
        !self.is_closed() && self.events().is_set(event)
    }

    /// Whether the plugin was closed or its connection went away.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.link.is_closed()
    }

    /// Waits until the plugin is closed or its connection goes away.
    pub async fn closed(&self) {
        let closed_here = async {
            loop {
                let notified = self.close_notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.closed.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        tokio::select! {
            () = closed_here => {}
            () = self.link.closed() => {}
        }
    }

    /// Gives the plugin's `IDX-NAME` back to the host, once: a later call
    /// (its [`Plugin::close`] after the registry gave it back) must not
    /// free the name a new plugin has reserved since.
    pub(crate) fn release_name(&self) {
        if !self.name_released.swap(true, Ordering::SeqCst) {
            self.host.release(&self.idx, &self.base);
        }
    }

    /// Closes the connection (idempotent) and frees the plugin's name.
    /// Launched processes are killed by [`Plugin::kill`].
    pub async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!(plugin = %self.name(), "closing plugin connection");
        self.release_name();
        self.link.close().await;
        self.close_notify.notify_waiters();
    }

    /// Asks the plugin to shut down, closes the connection and kills a
    /// launched process. `wait` bounds the whole: the Shutdown request and
    /// then the process's own exit (a plugin that answered Shutdown is
    /// given the rest of `wait` to finish, so its cleanup is not cut off by
    /// SIGKILL); `Duration::ZERO` kills at once.
    pub async fn shutdown(&self, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        if !self.is_closed() {
            self.link.shutdown(wait).await;
        }
        self.close().await;
        {
            let guard = self.child.lock().await;
            if let Some(child) = guard.as_ref() {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let exited = child.exited_within(left).await;
                tracing::debug!(plugin = %self.name(), exited, "plugin process after shutdown");
            }
        }
        self.kill().await;
    }

    /// SIGKILLs a launched plugin's process group (the plugin and what it
    /// started, which would otherwise be orphaned) and reaps the plugin.
    pub async fn kill(&self) {
        let mut guard = self.child.lock().await;
        if let Some(child) = guard.as_mut() {
            child.kill().await;
        }
        *guard = None;
    }

    /// Every request goes through here: refused once closed, failures
    /// logged with the plugin and the request.
    async fn request<T>(
        &self,
        what: &'static str,
        fut: impl Future<Output = Result<T, PluginError>>,
    ) -> Result<T, PluginError> {
        if self.is_closed() {
            return Err(PluginError::Closed);
        }
        let started = std::time::Instant::now();
        let r = fut.await;
        let outcome = match &r {
            Ok(_) => Outcome::Ok,
            Err(PluginError::Timeout(_)) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        };
        self.host.observe(self.name(), what, started.elapsed(), outcome);
        if let Err(e) = &r {
            tracing::debug!(plugin = %self.name(), request = what, error = %e, "plugin request failed");
        }
        r
    }

    /// Synchronize with the runtime's pods and containers; the updates the
    /// plugin asks for. One request timeout covers the whole sync (split
    /// into several messages when it exceeds the ttrpc limit).
    pub async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        self.request("Synchronize", self.link.synchronize(pods, containers))
            .await
    }

    /// Relays one of the nine notification events (no reply content).
    pub async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        if !NOTIFICATIONS.is_set(event) {
            return Err(PluginError::Protocol(format!("{event:?} is not a notification event")));
        }
        let what = nri_proto::events::event_name(event);
        self.request(what, self.link.notify(event, pod, container)).await
    }

    pub async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError> {
        self.request("UpdatePodSandbox", self.link.update_pod_sandbox(req))
            .await
    }

    pub async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        self.request("CreateContainer", self.link.create_container(req)).await
    }

    pub async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        self.request("UpdateContainer", self.link.update_container(req)).await
    }

    pub async fn stop_container(
        &self,
        req: &api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, PluginError> {
        self.request("StopContainer", self.link.stop_container(req)).await
    }

    pub async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError> {
        self.request("ValidateContainerAdjustment", self.link.validate(req))
            .await
    }
}

#[cfg(test)]
mod origin_tests {
    use super::PluginOrigin;

    #[test]
    fn origins_read_as_words_in_log_lines() {
        let launched = PluginOrigin::Launched {
            path: "/opt/nri/plugins/10-a".into(),
            pid: Some(43),
        };
        assert_eq!(launched.to_string(), "pre-installed /opt/nri/plugins/10-a (pid 43)");
        assert_eq!(
            PluginOrigin::External { pid: Some(42) }.to_string(),
            "external (pid 42)"
        );
        assert_eq!(PluginOrigin::External { pid: None }.to_string(), "external");
        assert_eq!(PluginOrigin::Builtin.to_string(), "built-in");
    }
}
