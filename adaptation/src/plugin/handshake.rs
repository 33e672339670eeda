//! How a connection becomes a plugin: the runtime side of the NRI
//! handshake (multiplex, RegisterPlugin within the registration timeout,
//! Configure) for plugin processes, and the same steps minus the socket for
//! plugins in the runtime's process.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt as _;
use nri_proto::{
    api, api_ttrpc,
    events::EventMask,
    mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    naming,
    plugin::PluginAdapter,
    sync::lock,
};
use tokio::{net::UnixStream, sync::oneshot};
use ttrpc::asynchronous::{Server, TtrpcContext};

use super::{
    Parts, Plugin, PluginOrigin,
    gate::{Gated, REQUESTS_IN_FLIGHT},
    link::{BuiltinLink, ClientConn, TtrpcLink},
};
use crate::{config::FailurePolicy, error::BoxError};

/// What the adaptation offers a plugin connection (implemented by the
/// adaptation; a trait so this module does not depend on it).
#[async_trait]
pub(crate) trait Host: Send + Sync + 'static {
    /// Reserves `IDX-NAME` for a registering plugin; false if a live or
    /// registering plugin already holds it.
    fn reserve(&self, idx: &str, base: &str) -> bool;
    /// Releases a name taken by [`Host::reserve`].
    fn release(&self, idx: &str, base: &str);
    /// How one request of `plugin` ended (for the runtime's observer).
    fn observe(&self, plugin: &str, request: &'static str, elapsed: Duration, outcome: crate::observe::Outcome) {
        let _ = (plugin, request, elapsed, outcome);
    }
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

/// How long a launched plugin whose connection closed during its start may
/// take to exit before it is reported without an exit status.
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(1);

/// A launched plugin's identity, taken from its file name.
pub(crate) struct LaunchedIdentity {
    pub idx: String,
    pub base: String,
    pub config: String,
    pub path: std::path::PathBuf,
    pub child: crate::registry::launch::PluginProcess,
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
    /// A launched plugin's process died before it was ready (its
    /// connection closed and the process exited).
    #[error("plugin process exited during {during}: {status}")]
    Exited {
        /// The handshake step.
        during: &'static str,
        /// How it ended: `exit status N` or `killed by signal NAME`.
        status: String,
    },
    /// Configure failed or returned an invalid event mask.
    #[error("configure failed: {0}")]
    Configure(String),
    /// The ttrpc server could not start.
    #[error("failed to start ttrpc server: {0}")]
    Server(String),
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
                *lock(&self.name) = format!("{idx}-{base}");
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
        if let Some(tx) = lock(&self.registration).take() {
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
        let name = lock(&self.name).clone();
        match self.host.update_containers(&name, req.update, req.evict).await {
            Ok(failed) => Ok(api::UpdateContainersResponse {
                failed,
                ..Default::default()
            }),
            // Outside the plugin's permissions: nothing of the call applied.
            Err(e) if e.is::<crate::permissions::PermissionError>() => {
                Err(status(ttrpc::Code::PERMISSION_DENIED, e.to_string()))
            }
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
        mut launched: Option<LaunchedIdentity>,
        params: &HandshakeParams,
        host: Arc<dyn Host>,
        policy_for: impl Fn(&str, &str) -> FailurePolicy,
    ) -> Result<Arc<Plugin>, HandshakeError> {
        let peer = peer_pid(&stream);
        let mux = Mux::blocked(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN).expect("fresh mux");
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).expect("fresh mux");
        let client = api_ttrpc::PluginClient::new(ttrpc::asynchronous::Client::new(
            ttrpc::asynchronous::transport::Socket::new(ClientConn::new(plugin_conn)),
        ));
        let (reg_tx, reg_rx) = oneshot::channel();
        let service = Arc::new(RuntimeService {
            launched: launched.as_ref().map(|l| (l.idx.clone(), l.base.clone())),
            registration: Mutex::new(Some(reg_tx)),
            registered: AtomicBool::new(false),
            name: Mutex::new(String::new()),
            host: host.clone(),
        });
        // At most a few of the plugin's own requests handled at once (see
        // `gate`): a plugin flooding UpdateContainers cannot queue work
        // without bound.
        let gated = Gated::new(runtime_conn, REQUESTS_IN_FLIGHT);
        let listener = ttrpc::asynchronous::transport::Listener::new(
            futures::stream::once(async move { Ok(gated) }).chain(futures::stream::pending()),
        );
        let mut server = Server::new()
            .add_listener(listener)
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
            let name = lock(&service.name).clone();
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
                if let Some(l) = launched.as_mut() {
                    if let Some(status) = l.child.exit_status(EXIT_WAIT).await {
                        return Err(HandshakeError::Exited {
                            during: "registration",
                            status: crate::registry::launch::describe_exit(status),
                        });
                    }
                }
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
        *lock(&service.name) = format!("{idx}-{base}");
        let policy = policy_for(&idx, &base);

        let link = TtrpcLink::new(format!("{idx}-{base}"), client, mux, server, params.request_timeout);
        let parts = Parts {
            idx,
            base,
            origin,
            policy,
            link: Box::new(link),
            child,
            host,
        };
        Plugin::configured(parts, params, config).await
    }

    /// Adds an in-process plugin: reserves its name and configures it.
    /// `events` is its subscription unless its configure returns a
    /// non-empty mask.
    pub(crate) async fn builtin(
        idx: String,
        base: String,
        events: EventMask,
        plugin: Arc<dyn nri_proto::plugin::Plugin>,
        params: &HandshakeParams,
        host: Arc<dyn Host>,
        policy: FailurePolicy,
    ) -> Result<Arc<Plugin>, HandshakeError> {
        if !host.reserve(&idx, &base) {
            return Err(HandshakeError::RegistrationRefused(format!(
                "plugin {idx}-{base} is already registered"
            )));
        }
        let link = BuiltinLink::new(PluginAdapter::new(plugin, events), params.request_timeout);
        let parts = Parts {
            idx,
            base,
            origin: PluginOrigin::Builtin,
            policy,
            link: Box::new(link),
            child: None,
            host,
        };
        Plugin::configured(parts, params, String::new()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host that keeps the names as the registry does.
    #[derive(Default)]
    struct Names(Mutex<std::collections::HashSet<String>>);

    #[async_trait]
    impl Host for Names {
        fn reserve(&self, idx: &str, base: &str) -> bool {
            lock(&self.0).insert(format!("{idx}-{base}"))
        }
        fn release(&self, idx: &str, base: &str) {
            lock(&self.0).remove(&format!("{idx}-{base}"));
        }
        async fn update_containers(
            &self,
            _plugin: &str,
            _update: Vec<api::ContainerUpdate>,
            _evict: Vec<api::ContainerEviction>,
        ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
            Ok(Vec::new())
        }
    }

    struct Quiet;
    impl nri_proto::plugin::Plugin for Quiet {}

    /// The registry gives a gone plugin's name back as it takes it out of
    /// the table, before its close: the close must not free the name again
    /// once a new plugin of that name reserved it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_plugins_name_is_given_back_once() {
        let params = HandshakeParams {
            runtime_name: "test".into(),
            runtime_version: "0".into(),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
        };
        let names = Arc::new(Names::default());
        let old = Plugin::builtin(
            "10".into(),
            "a".into(),
            EventMask::default(),
            Arc::new(Quiet),
            &params,
            names.clone(),
            FailurePolicy::Ignore,
        )
        .await
        .expect("builtin plugin");
        assert!(!names.reserve("10", "a"), "the name is held while the plugin lives");
        old.release_name();
        assert!(names.reserve("10", "a"), "a new plugin takes the name given back");
        old.close().await;
        assert!(
            !names.reserve("10", "a"),
            "the old plugin's close freed the new one's name"
        );
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
        let e = match Plugin::handshake(ours, None, &params, Arc::new(Names::default()), |_, _| {
            FailurePolicy::Ignore
        })
        .await
        {
            Err(e) => e,
            Ok(_) => panic!("garbage registered"),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("connection closed during registration: ") && text.contains("bytes"),
            "{text}"
        );
    }
}
