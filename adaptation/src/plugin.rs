//! One plugin connection, runtime side: mux + ttrpc client/server, the
//! registration and Configure handshake, Synchronize with splitting, and one
//! relay per plugin request with timeout and error classification.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI32, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use nri_proto::{
    api::{self, Event},
    api_ttrpc,
    events::{EventMask, event_name},
    mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    naming, transport,
};
use protobuf::Message;
use tokio::{net::UnixStream, sync::oneshot};
use ttrpc::asynchronous::{Server, TtrpcContext};

use crate::{
    config::FailurePolicy,
    error::{BoxError, PluginError},
};

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

/// What the adaptation offers a plugin connection (implemented by the
/// adaptation; a trait so this module does not depend on it).
#[async_trait]
pub(crate) trait Host: Send + Sync + 'static {
    /// Reserves `IDX-NAME` for a registering plugin; false if a live or
    /// registering plugin already holds it.
    fn reserve(&self, idx: &str, base: &str) -> bool;
    /// Releases a name taken by [`Host::reserve`].
    fn release(&self, idx: &str, base: &str);
    /// Unsolicited UpdateContainers from plugin `plugin`.
    async fn update_containers(
        &self,
        plugin: &str,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError>;
}

/// Settings the handshake needs.
#[derive(Clone)]
pub(crate) struct HandshakeParams {
    pub runtime_name: String,
    pub runtime_version: String,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
}

/// A launched plugin's identity, taken from its file name.
pub(crate) struct LaunchedIdentity {
    pub idx: String,
    pub base: String,
    pub config: String,
    pub path: std::path::PathBuf,
    pub child: crate::launch::PluginProcess,
}

/// Why a connection never became a usable plugin.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// No RegisterPlugin within the registration timeout.
    #[error("plugin did not register within {0:?}")]
    RegistrationTimeout(Duration),
    /// RegisterPlugin was refused (bad name or index, duplicate).
    #[error("registration refused: {0}")]
    RegistrationRefused(String),
    /// The connection closed before the plugin was ready.
    #[error("connection closed during {during}{}", .reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed {
        /// The handshake step.
        during: &'static str,
        /// Why the connection closed, when the transport knows (garbage on
        /// the socket, an oversized frame, ...).
        reason: Option<String>,
    },
    /// Configure failed or returned an invalid event mask.
    #[error("configure failed: {0}")]
    Configure(String),
    /// The ttrpc server could not start.
    #[error("failed to start ttrpc server: {0}")]
    Server(String),
}

/// How requests reach a plugin.
enum Link {
    /// A plugin process: ttrpc over the multiplexed connection.
    Ttrpc {
        client: api_ttrpc::PluginClient,
        mux: Mux,
        server: tokio::sync::Mutex<Option<Server>>,
    },
    /// A plugin in the runtime's process, called directly.
    Builtin {
        plugin: Arc<dyn nri_stub::Plugin>,
        /// The subscription given by the runtime when the plugin's
        /// Configure returns an empty mask.
        events: EventMask,
        closed: tokio::sync::Notify,
    },
}

/// A connected, configured plugin.
pub(crate) struct Plugin {
    pub idx: String,
    pub base: String,
    /// `IDX-NAME`, computed once.
    qualified: String,
    pub origin: PluginOrigin,
    events: AtomicI32,
    link: Link,
    closed: AtomicBool,
    /// Sticky once the plugin answered a dedicated event RPC with Unimplemented.
    state_change_fallback: AtomicBool,
    deprecation_warned: Mutex<EventMask>,
    pub policy: FailurePolicy,
    request_timeout: Duration,
    /// Held across kill and reap, so every caller returns after the
    /// process is gone.
    /// A launched plugin's process, which leads its own process group.
    child: tokio::sync::Mutex<Option<crate::launch::PluginProcess>>,
    host: Arc<dyn Host>,
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

/// Delivers the registration verdict: `(index, name)` or the refusal text.
type RegistrationTx = oneshot::Sender<Result<(String, String), String>>;

/// The Runtime service a plugin calls on logical connection 2.
struct RuntimeService {
    /// Launched plugins keep their file-name identity; external ones are checked.
    launched: Option<(String, String)>,
    registration: Mutex<Option<RegistrationTx>>,
    registered: AtomicBool,
    /// `IDX-NAME` once registered (for logs and update attribution).
    name: Mutex<String>,
    host: Arc<dyn Host>,
}

fn status(code: ttrpc::Code, msg: impl Into<String>) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg.into()))
}

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(&self, _ctx: &TtrpcContext, req: api::RegisterPluginRequest) -> ttrpc::Result<api::Empty> {
        let version = if req.NRI_version.is_empty() {
            "unknown"
        } else {
            req.NRI_version.as_str()
        };
        if self.registered.swap(true, Ordering::SeqCst) {
            // Upstream accepts repeats and lets a plugin rename itself; we refuse.
            return Err(status(ttrpc::Code::FAILED_PRECONDITION, "plugin already registered"));
        }
        let verdict = match &self.launched {
            Some(identity) => Ok(identity.clone()),
            None => naming::check_index(&req.plugin_idx)
                .and_then(|_| naming::check_name(&req.plugin_name))
                .map_err(|e| e.to_string())
                .map(|_| (req.plugin_idx.clone(), req.plugin_name.clone())),
        };
        // One live plugin per IDX-NAME, reserved from registration on so a
        // second one cannot slip in while the first is still syncing.
        let verdict = verdict.and_then(|(idx, base)| {
            if self.host.reserve(&idx, &base) {
                *self.name.lock().unwrap_or_else(|p| p.into_inner()) = format!("{idx}-{base}");
                Ok((idx, base))
            } else {
                Err(format!("plugin {idx}-{base} is already registered"))
            }
        });
        tracing::info!(
            plugin = %format!("{}-{}", req.plugin_idx, req.plugin_name),
            nri_version = version,
            accepted = verdict.is_ok(),
            "plugin registration"
        );
        let result = match &verdict {
            Ok(_) => Ok(api::Empty::new()),
            Err(e) => Err(status(ttrpc::Code::INVALID_ARGUMENT, e.clone())),
        };
        if let Some(tx) = self.registration.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(verdict);
        }
        result
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        if !self.registered.load(Ordering::SeqCst) {
            return Err(status(ttrpc::Code::FAILED_PRECONDITION, "plugin is not registered"));
        }
        let name = self.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match self.host.update_containers(&name, req.update, req.evict).await {
            Ok(failed) => Ok(api::UpdateContainersResponse {
                failed,
                ..Default::default()
            }),
            Err(e) => Err(status(ttrpc::Code::UNKNOWN, e.to_string())),
        }
    }
}

/// Peer process id of a unix socket, for logs.
fn peer_pid(stream: &UnixStream) -> Option<i32> {
    stream.peer_cred().ok().and_then(|c| c.pid())
}

impl Plugin {
    /// Runs the runtime side of the NRI handshake on a fresh connection:
    /// multiplex, wait for RegisterPlugin (registration timeout), Configure
    /// (request timeout). The plugin is not synchronized yet.
    pub(crate) async fn handshake(
        stream: UnixStream,
        launched: Option<LaunchedIdentity>,
        params: &HandshakeParams,
        host: Arc<dyn Host>,
        policy_for: impl Fn(&str, &str) -> FailurePolicy,
    ) -> Result<Arc<Plugin>, HandshakeError> {
        let peer = peer_pid(&stream);
        let mux = Mux::blocked(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN).expect("fresh mux");
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).expect("fresh mux");
        let client = api_ttrpc::PluginClient::new(transport::client(plugin_conn));
        let (reg_tx, reg_rx) = oneshot::channel();
        let service = Arc::new(RuntimeService {
            launched: launched.as_ref().map(|l| (l.idx.clone(), l.base.clone())),
            registration: Mutex::new(Some(reg_tx)),
            registered: AtomicBool::new(false),
            name: Mutex::new(String::new()),
            host: host.clone(),
        });
        let mut server = Server::new()
            .add_listener(transport::listener(runtime_conn))
            .register_service(api_ttrpc::create_runtime(service.clone()));
        if let Err(e) = server.start().await {
            mux.close();
            return Err(HandshakeError::Server(e.to_string()));
        }
        // Reading starts only now that both logical connections exist (T-3).
        mux.unblock();

        let fail = |mux: &Mux| {
            mux.close();
            // A name reserved by a registration that raced with this
            // failure must not stay taken.
            let name = service.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some((idx, base)) = name.split_once('-') {
                host.release(idx, base);
            }
        };
        let mut reason = None;
        let registered = tokio::select! {
            r = reg_rx => r.ok(),
            why = mux.closed() => {
                reason = why.map(|e| e.to_string());
                None
            }
            _ = tokio::time::sleep(params.registration_timeout) => {
                fail(&mux);
                let _ = server.shutdown().await;
                return Err(HandshakeError::RegistrationTimeout(params.registration_timeout));
            }
        };
        let (idx, base) = match registered {
            Some(Ok(id)) => id,
            Some(Err(reason)) => {
                // Let the refusal reach the plugin, then drop the connection
                // (upstream leaves it open and relies on the plugin leaving).
                let _ = tokio::time::timeout(Duration::from_millis(500), mux.closed()).await;
                fail(&mux);
                let _ = server.shutdown().await;
                return Err(HandshakeError::RegistrationRefused(reason));
            }
            None => {
                fail(&mux);
                let _ = server.shutdown().await;
                return Err(HandshakeError::Closed {
                    during: "registration",
                    reason,
                });
            }
        };
        let (idx, base, config, origin, child) = match launched {
            Some(l) => {
                let pid = l.child.id();
                (
                    l.idx,
                    l.base,
                    l.config,
                    PluginOrigin::Launched { path: l.path, pid },
                    Some(l.child),
                )
            }
            None => (idx, base, String::new(), PluginOrigin::External { pid: peer }, None),
        };
        *service.name.lock().unwrap_or_else(|p| p.into_inner()) = format!("{idx}-{base}");
        let policy = policy_for(&idx, &base);

        let plugin = Arc::new(Plugin {
            qualified: format!("{idx}-{base}"),
            idx,
            base,
            origin,
            events: AtomicI32::new(0),
            link: Link::Ttrpc {
                client,
                mux: mux.clone(),
                server: tokio::sync::Mutex::new(Some(server)),
            },
            closed: AtomicBool::new(false),
            state_change_fallback: AtomicBool::new(false),
            deprecation_warned: Mutex::new(EventMask::default()),
            policy,
            request_timeout: params.request_timeout,
            child: tokio::sync::Mutex::new(child),
            host: host.clone(),
        });
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
        let events = match &self.link {
            Link::Builtin { plugin, events, .. } => {
                let mask = self
                    .builtin("Configure", plugin.configure(&req))
                    .await
                    .map_err(|e| HandshakeError::Configure(e.to_string()))?;
                // Builtins cannot be told apart by the handlers they have;
                // an empty mask means the one given when adding them.
                if mask.bits() == 0 { events.bits() } else { mask.bits() }
            }
            Link::Ttrpc { .. } => {
                self.call("Configure", |c, ctx| async move { c.configure(ctx, &req).await })
                    .await
                    .map_err(|e| HandshakeError::Configure(e.to_string()))?
                    .events
            }
        };
        let mask = EventMask::from_configure(events).map_err(|e| HandshakeError::Configure(e.to_string()))?;
        self.events.store(mask.bits(), Ordering::SeqCst);
        tracing::info!(plugin = %self.name(), events = %mask, "plugin configured");
        Ok(())
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

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
            || match &self.link {
                Link::Ttrpc { mux, .. } => mux.is_closed(),
                Link::Builtin { .. } => false,
            }
    }

    /// Waits until the connection is gone.
    pub async fn closed(&self) {
        match &self.link {
            Link::Ttrpc { mux, .. } => {
                mux.closed().await;
            }
            Link::Builtin { closed, .. } => loop {
                let notified = closed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.closed.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            },
        }
    }

    /// Closes the connection (idempotent). Launched processes are killed by
    /// [`Plugin::kill`].
    pub async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!(plugin = %self.name(), "closing plugin connection");
        self.host.release(&self.idx, &self.base);
        match &self.link {
            Link::Ttrpc { mux, server, .. } => {
                mux.close();
                if let Some(mut server) = server.lock().await.take() {
                    let _ = server.shutdown().await;
                }
            }
            Link::Builtin { closed, .. } => closed.notify_waiters(),
        }
    }

    /// Asks the plugin to shut down (best effort, bounded by `wait`), closes
    /// the connection and kills a launched process.
    pub async fn shutdown(&self, wait: Duration) {
        if !self.is_closed() {
            match &self.link {
                Link::Ttrpc { client, .. } => {
                    let c = client.clone();
                    let _ = tokio::time::timeout(
                        wait,
                        c.shutdown(ttrpc::context::with_timeout(wait.as_nanos() as i64), &api::Empty::new()),
                    )
                    .await;
                }
                Link::Builtin { plugin, .. } => {
                    let _ = tokio::time::timeout(wait, plugin.shutdown()).await;
                }
            }
        }
        self.close().await;
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

    /// One request with the request timeout; errors classified.
    async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, PluginError>
    where
        F: FnOnce(api_ttrpc::PluginClient, ttrpc::context::Context) -> Fut,
        Fut: Future<Output = ttrpc::Result<T>>,
    {
        if self.is_closed() {
            return Err(PluginError::Closed);
        }
        let Link::Ttrpc { client, mux, .. } = &self.link else {
            return Err(PluginError::Protocol(format!(
                "{what} is not a request for a builtin plugin"
            )));
        };
        let timeout = self.request_timeout;
        // The deadline travels with the request (the plugin sees it) and
        // ttrpc enforces it locally: one timer per request.
        let ctx = ttrpc::context::with_timeout(timeout.as_nanos() as i64);
        let err = match f(client.clone(), ctx).await {
            Ok(v) => return Ok(v),
            Err(e) => PluginError::from_ttrpc_request(e, timeout),
        };
        if mux.is_closed() && err.is_fatal() {
            return Err(PluginError::Closed);
        }
        tracing::debug!(plugin = %self.name(), request = what, error = %err, "plugin request failed");
        Err(err)
    }

    /// One call of a builtin plugin with the request timeout.
    async fn builtin<T>(
        &self,
        what: &'static str,
        fut: impl Future<Output = Result<T, nri_stub::BoxError>>,
    ) -> Result<T, PluginError> {
        if self.is_closed() {
            return Err(PluginError::Closed);
        }
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                tracing::debug!(plugin = %self.name(), request = what, error = %e, "builtin plugin failed");
                Err(PluginError::Returned {
                    code: ttrpc::Code::UNKNOWN,
                    message: e.to_string(),
                })
            }
            Err(_) => Err(PluginError::Timeout(self.request_timeout)),
        }
    }

    /// Adds an in-process plugin: reserves its name and configures it.
    pub(crate) async fn builtin_plugin(
        idx: String,
        base: String,
        events: EventMask,
        plugin: Arc<dyn nri_stub::Plugin>,
        params: &HandshakeParams,
        host: Arc<dyn Host>,
        policy: FailurePolicy,
    ) -> Result<Arc<Plugin>, HandshakeError> {
        if !host.reserve(&idx, &base) {
            return Err(HandshakeError::RegistrationRefused(format!(
                "plugin {idx}-{base} is already registered"
            )));
        }
        let p = Arc::new(Plugin {
            qualified: format!("{idx}-{base}"),
            idx,
            base,
            origin: PluginOrigin::Builtin,
            events: AtomicI32::new(0),
            link: Link::Builtin {
                plugin,
                events,
                closed: tokio::sync::Notify::new(),
            },
            closed: AtomicBool::new(false),
            state_change_fallback: AtomicBool::new(false),
            deprecation_warned: Mutex::new(EventMask::default()),
            policy,
            request_timeout: params.request_timeout,
            child: tokio::sync::Mutex::new(None),
            host,
        });
        if let Err(e) = p.configure(params, String::new()).await {
            p.close().await;
            return Err(e);
        }
        Ok(p)
    }

    /// Synchronize, split into chunks when one message would exceed the
    /// ttrpc limit. Returns the updates of the final reply.
    ///
    /// Chunk sizing follows NRI (`recalcObjsPerSyncMsg`): when a message is
    /// too big, scale pods and containers per message by
    /// `min(0.9, limit / size)`; never fewer than 8 objects per message
    /// (4 pods + 4 containers); already at 8 and still too big fails. The
    /// size is measured before sending instead of waiting for ttrpc to
    /// refuse it. Intermediate replies must echo `more = true` and carry no
    /// updates. One request timeout covers the whole sync.
    pub async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            return self.builtin("Synchronize", plugin.synchronize(pods, containers)).await;
        }
        let timeout = self.request_timeout;
        match tokio::time::timeout(timeout, self.synchronize_chunks(pods, containers, SYNC_MESSAGE_LIMIT)).await {
            Ok(r) => r,
            Err(_) => Err(PluginError::Timeout(timeout)),
        }
    }

    async fn synchronize_chunks(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
        limit: usize,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let (mut pods_left, mut ctrs_left) = (pods, containers);
        let (mut pods_per, mut ctrs_per) = (pods.len(), containers.len());
        loop {
            let req = api::SynchronizeRequest {
                pods: pods_left[..pods_per].to_vec(),
                containers: ctrs_left[..ctrs_per].to_vec(),
                more: pods_left.len() > pods_per || ctrs_left.len() > ctrs_per,
                ..Default::default()
            };
            let size = req.compute_size() as usize;
            if size > limit {
                (pods_per, ctrs_per) = split_counts(pods_per, ctrs_per, size, limit)
                    .ok_or_else(|| PluginError::Protocol(format!(
                        "failed to synchronize plugin with split messages: {size} bytes for {} objects exceed the {limit}-byte limit",
                        pods_per + ctrs_per
                    )))?;
                // Make progress whatever the rounding did.
                pods_per = pods_per.min(pods_left.len());
                ctrs_per = ctrs_per.min(ctrs_left.len());
                if pods_per + ctrs_per == 0 {
                    if !pods_left.is_empty() {
                        pods_per = 1;
                    } else {
                        ctrs_per = 1;
                    }
                }
                continue;
            }
            tracing::debug!(
                plugin = %self.name(),
                pods = req.pods.len(),
                containers = req.containers.len(),
                more = req.more,
                bytes = size,
                "sending sync message"
            );
            let more = req.more;
            let rsp = self
                .call("Synchronize", |c, ctx| async move { c.synchronize(ctx, &req).await })
                .await?;
            if !more {
                return Ok(rsp.update);
            }
            if !rsp.update.is_empty() || rsp.more != more {
                return Err(PluginError::Protocol(
                    "plugin does not handle split sync requests".into(),
                ));
            }
            pods_left = &pods_left[pods_per..];
            ctrs_left = &ctrs_left[ctrs_per..];
            pods_per = pods_per.min(pods_left.len());
            ctrs_per = ctrs_per.min(ctrs_left.len());
            if pods_per + ctrs_per == 0 {
                // Rounding left one kind at zero per message: send the rest.
                pods_per = pods_left.len().min(4.max(pods_per));
                ctrs_per = ctrs_left.len().min(4.max(ctrs_per));
            }
        }
    }

    fn warn_deprecated(&self, event: Event) {
        let mut warned = self.deprecation_warned.lock().unwrap_or_else(|p| p.into_inner());
        if !warned.is_set(event) {
            warned.set(event);
            tracing::warn!(
                plugin = %self.name(),
                event = event_name(event),
                "plugin uses the deprecated StateChange API for this event; rebuild it against NRI v0.12 or later"
            );
        }
    }

    /// Relays one of the nine notification events (no reply content),
    /// falling back to StateChange for plugins that do not implement the
    /// dedicated RPC (sticky after the first Unimplemented, as upstream).
    pub async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            let p = plugin.as_ref();
            let c = container.cloned().unwrap_or_default();
            let name = event_name(event);
            return match event {
                Event::RUN_POD_SANDBOX => self.builtin(name, p.run_pod_sandbox(pod)).await,
                Event::POST_UPDATE_POD_SANDBOX => self.builtin(name, p.post_update_pod_sandbox(pod)).await,
                Event::STOP_POD_SANDBOX => self.builtin(name, p.stop_pod_sandbox(pod)).await,
                Event::REMOVE_POD_SANDBOX => self.builtin(name, p.remove_pod_sandbox(pod)).await,
                Event::POST_CREATE_CONTAINER => self.builtin(name, p.post_create_container(pod, &c)).await,
                Event::START_CONTAINER => self.builtin(name, p.start_container(pod, &c)).await,
                Event::POST_START_CONTAINER => self.builtin(name, p.post_start_container(pod, &c)).await,
                Event::POST_UPDATE_CONTAINER => self.builtin(name, p.post_update_container(pod, &c)).await,
                Event::REMOVE_CONTAINER => self.builtin(name, p.remove_container(pod, &c)).await,
                other => Err(PluginError::Protocol(format!("{other:?} is not a notification event"))),
            };
        }
        if !self.state_change_fallback.load(Ordering::SeqCst) {
            let r = self.notify_dedicated(event, pod, container).await;
            match r {
                Err(e) if e.is_unimplemented() => {
                    self.state_change_fallback.store(true, Ordering::SeqCst);
                }
                other => return other,
            }
        }
        self.warn_deprecated(event);
        let mut req = api::StateChangeEvent::new();
        req.event = event.into();
        req.pod = protobuf::MessageField::some(pod.clone());
        if let Some(c) = container {
            req.container = protobuf::MessageField::some(c.clone());
        }
        self.call("StateChange", |c, ctx| async move { c.state_change(ctx, &req).await })
            .await
            .map(|_| ())
    }

    async fn notify_dedicated(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        let pod = protobuf::MessageField::some(pod.clone());
        let ctr = protobuf::MessageField::from_option(container.cloned());
        macro_rules! pod_event {
            ($ty:ident, $method:ident) => {{
                let req = api::$ty {
                    pod,
                    ..Default::default()
                };
                self.call(
                    event_name(event),
                    |c, ctx| async move { c.$method(ctx, &req).await },
                )
                .await
                .map(|_| ())
            }};
        }
        macro_rules! ctr_event {
            ($ty:ident, $method:ident) => {{
                let req = api::$ty {
                    pod,
                    container: ctr,
                    ..Default::default()
                };
                self.call(
                    event_name(event),
                    |c, ctx| async move { c.$method(ctx, &req).await },
                )
                .await
                .map(|_| ())
            }};
        }
        match event {
            Event::RUN_POD_SANDBOX => pod_event!(RunPodSandboxRequest, run_pod_sandbox),
            Event::POST_UPDATE_POD_SANDBOX => {
                pod_event!(PostUpdatePodSandboxRequest, post_update_pod_sandbox)
            }
            Event::STOP_POD_SANDBOX => pod_event!(StopPodSandboxRequest, stop_pod_sandbox),
            Event::REMOVE_POD_SANDBOX => pod_event!(RemovePodSandboxRequest, remove_pod_sandbox),
            Event::POST_CREATE_CONTAINER => {
                ctr_event!(PostCreateContainerRequest, post_create_container)
            }
            Event::START_CONTAINER => ctr_event!(StartContainerRequest, start_container),
            Event::POST_START_CONTAINER => {
                ctr_event!(PostStartContainerRequest, post_start_container)
            }
            Event::POST_UPDATE_CONTAINER => {
                ctr_event!(PostUpdateContainerRequest, post_update_container)
            }
            Event::REMOVE_CONTAINER => ctr_event!(RemoveContainerRequest, remove_container),
            other => Err(PluginError::Protocol(format!("{other:?} is not a notification event"))),
        }
    }

    pub async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            return self.builtin("UpdatePodSandbox", plugin.update_pod_sandbox(req)).await;
        }
        self.call("UpdatePodSandbox", |c, ctx| async move {
            c.update_pod_sandbox(ctx, req).await
        })
        .await
        .map(|_| ())
    }

    pub async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            let fut = plugin.create_container(req.pod.get_or_default(), req.container.get_or_default());
            return self.builtin("CreateContainer", fut).await;
        }
        self.call(
            "CreateContainer",
            |c, ctx| async move { c.create_container(ctx, req).await },
        )
        .await
    }

    pub async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            let fut = plugin.update_container(
                req.pod.get_or_default(),
                req.container.get_or_default(),
                req.linux_resources.get_or_default(),
            );
            return self.builtin("UpdateContainer", fut).await;
        }
        self.call(
            "UpdateContainer",
            |c, ctx| async move { c.update_container(ctx, req).await },
        )
        .await
    }

    pub async fn stop_container(
        &self,
        req: &api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            let fut = plugin.stop_container(req.pod.get_or_default(), req.container.get_or_default());
            let update = self.builtin("StopContainer", fut).await?;
            return Ok(api::StopContainerResponse {
                update,
                ..Default::default()
            });
        }
        self.call(
            "StopContainer",
            |c, ctx| async move { c.stop_container(ctx, req).await },
        )
        .await
    }

    pub async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError> {
        if let Link::Builtin { plugin, .. } = &self.link {
            if self.is_closed() {
                return Err(PluginError::Closed);
            }
            let verdict = tokio::time::timeout(self.request_timeout, plugin.validate_container_adjustment(req))
                .await
                .map_err(|_| PluginError::Timeout(self.request_timeout))?;
            return Ok(match verdict {
                Ok(()) => api::ValidateContainerAdjustmentResponse::new(),
                Err(e) => api::ValidateContainerAdjustmentResponse {
                    reject: true,
                    reason: e.to_string(),
                    ..Default::default()
                },
            });
        }
        self.call("ValidateContainerAdjustment", |c, ctx| async move {
            c.validate_container_adjustment(ctx, req).await
        })
        .await
    }
}

/// Largest encoded SynchronizeRequest sent in one message: the 4 MiB ttrpc
/// limit minus room for the ttrpc request envelope (service and method
/// names, timeout, metadata).
pub(crate) const SYNC_MESSAGE_LIMIT: usize = nri_proto::TTRPC_MAX_MESSAGE - 4096;

/// NRI's `recalcObjsPerSyncMsg`: new per-message counts after a message of
/// `size` bytes exceeded `limit`. `None` when already at the minimum.
pub(crate) fn split_counts(pods: usize, ctrs: usize, size: usize, limit: usize) -> Option<(usize, usize)> {
    const MIN_OBJS_PER_MSG: usize = 8;
    if pods + ctrs <= MIN_OBJS_PER_MSG || size <= limit || limit == 0 {
        return None;
    }
    let factor = (limit as f64 / size as f64).min(0.9);
    let (p, c) = ((pods as f64 * factor) as usize, (ctrs as f64 * factor) as usize);
    if p + c < MIN_OBJS_PER_MSG {
        Some((MIN_OBJS_PER_MSG / 2, MIN_OBJS_PER_MSG / 2))
    } else {
        Some((p, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoHost;

    #[async_trait]
    impl Host for NoHost {
        fn reserve(&self, _idx: &str, _base: &str) -> bool {
            true
        }
        fn release(&self, _idx: &str, _base: &str) {}
        async fn update_containers(
            &self,
            _plugin: &str,
            _update: Vec<api::ContainerUpdate>,
            _evict: Vec<api::ContainerEviction>,
        ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
            Ok(Vec::new())
        }
    }

    /// Garbage instead of a registration: the handshake error says what
    /// the transport saw, so the log line naming the plugin says why.
    #[tokio::test(flavor = "current_thread")]
    async fn garbage_during_registration_is_reported_with_its_reason() {
        use tokio::io::AsyncWriteExt as _;
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"garbage garbage garbage\n").await.unwrap();
        let params = HandshakeParams {
            runtime_name: "test".into(),
            runtime_version: "0".into(),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
        };
        let e = match Plugin::handshake(ours, None, &params, Arc::new(NoHost), |_, _| FailurePolicy::Ignore).await {
            Err(e) => e,
            Ok(_) => panic!("garbage registered"),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("connection closed during registration: ") && text.contains("bytes"),
            "{text}"
        );
    }

    #[test]
    fn split_counts_follows_reference() {
        // 10 MiB for 50 objects under a 4 MiB limit: factor 0.4.
        assert_eq!(split_counts(10, 40, 10 << 20, 4 << 20), Some((4, 16)));
        // Factor never above 0.9.
        assert_eq!(split_counts(100, 100, 101, 100), Some((90, 90)));
        // Below the minimum: 4 + 4.
        assert_eq!(split_counts(10, 10, 100 << 20, 1 << 20), Some((4, 4)));
        // Already at the minimum: give up.
        assert_eq!(split_counts(4, 4, 10 << 20, 4 << 20), None);
        assert_eq!(split_counts(2, 3, 10 << 20, 4 << 20), None);
        // Not oversized at all.
        assert_eq!(split_counts(10, 10, 100, 100), None);
    }
}
