//! # nri-stub
//!
//! Write NRI plugins in Rust. A plugin implements [`Plugin`] (one async method
//! per event; the defaults do nothing), picks the events it wants, and hands
//! itself to a [`Stub`], which connects to the runtime (containerd, CRI-O, or
//! any runtime embedding `nri-adaptation`), registers, answers Configure and
//! Synchronize, and routes every subscribed event to the plugin.
//!
//! ```no_run
//! use nri_stub::{api, BoxError, EventMask, Plugin, Stub};
//!
//! struct AddEnv;
//!
//! #[nri_stub::async_trait]
//! impl Plugin for AddEnv {
//!     async fn create_container(
//!         &self,
//!         _pod: &api::PodSandbox,
//!         _container: &api::Container,
//!     ) -> Result<api::CreateContainerResponse, BoxError> {
//!         let mut rsp = api::CreateContainerResponse::new();
//!         rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
//!             key: "HELLO".into(),
//!             value: "from-nri".into(),
//!             ..Default::default()
//!         });
//!         Ok(rsp)
//!     }
//! }
//!
//! # async fn run() -> Result<(), nri_stub::StubError> {
//! let stub = Stub::builder(AddEnv)
//!     .with_plugin_name("add-env")
//!     .with_plugin_idx("10")
//!     .with_events(EventMask::parse("CreateContainer").unwrap())
//!     .build()?;
//! stub.run().await
//! # }
//! ```
//!
//! Behaviour shared with containerd/nri's Go `pkg/stub`, so a plugin runs the
//! same way whether it was started by hand or launched by the runtime:
//!
//! | setting | builder | environment | fallback |
//! |---|---|---|---|
//! | name | [`StubBuilder::with_plugin_name`] | `NRI_PLUGIN_NAME` | `argv[0]` of the form `IDX-NAME`, else `argv[0]`'s file name |
//! | index | [`StubBuilder::with_plugin_idx`] | `NRI_PLUGIN_IDX` | `argv[0]` of the form `IDX-NAME`, else [`StubBuilder::with_default_plugin_idx`] |
//! | connection | [`StubBuilder::with_socket_path`] | `NRI_PLUGIN_SOCKET` (an inherited, connected fd) | `/var/run/nri/nri.sock` |
//!
//! A split initial sync (several Synchronize requests with `more = true`) is
//! collected and delivered to [`Plugin::synchronize`] once.

#![warn(missing_docs)]

use std::{
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

pub use async_trait::async_trait;
pub use nri_proto::{api, events::EventMask};
use nri_proto::{
    api_ttrpc,
    mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    naming::{self, NamingError},
    plugin::PluginAdapter,
    transport,
};
use tokio::{net::UnixStream, sync::watch};
use ttrpc::asynchronous::Server;

/// The plugin trait and its error type live in [`nri_proto::plugin`], shared
/// with runtimes that call in-process plugins through the same adapter.
pub use nri_proto::plugin::{BoxError, Plugin};

/// An error and its causes on one line (see [`nri_proto::error_chain`]).
/// For a plugin binary's exit message:
/// `eprintln!("my-plugin: error: {}", nri_stub::error_chain(e.as_ref()))`.
pub use nri_proto::error_chain;

#[cfg(feature = "cli")]
pub mod cli;

/// Why a stub could not be built, connect, register or keep running.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// No plugin name in the builder, `NRI_PLUGIN_NAME` or `argv[0]`.
    #[error("plugin name not set: use with_plugin_name or NRI_PLUGIN_NAME (no executable name to fall back to)")]
    MissingName,
    /// No plugin index in the builder, `NRI_PLUGIN_IDX` or `argv[0]`.
    #[error(
        "plugin index not set: use with_plugin_idx, NRI_PLUGIN_IDX, an IDX-NAME executable name or with_default_plugin_idx"
    )]
    MissingIndex,
    /// The name or index breaks the NRI naming rules.
    #[error(transparent)]
    Naming(#[from] NamingError),
    /// An empty event mask: the runtime would read it as "every event".
    #[error("no events to subscribe to: an empty mask means every event to the runtime; use EventMask::VALID for that")]
    NoEvents,
    /// Connecting to the runtime's socket failed.
    #[error("failed to connect to the NRI socket {path}: {source}")]
    Connect {
        /// The socket path dialled.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `NRI_PLUGIN_SOCKET` does not name a usable connected socket.
    #[error("invalid NRI_PLUGIN_SOCKET {value:?}: {reason}")]
    InheritedSocket {
        /// The variable's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The trunk multiplexer failed.
    #[error(transparent)]
    Mux(#[from] MuxError),
    /// Starting the ttrpc server for the Plugin service failed.
    #[error("failed to start the plugin's ttrpc server: {0}")]
    Server(ttrpc::Error),
    /// The runtime refused or did not answer RegisterPlugin.
    #[error("failed to register plugin {plugin} with the runtime: {source}")]
    Register {
        /// `IDX-NAME` of this plugin.
        plugin: String,
        /// The ttrpc error.
        source: ttrpc::Error,
    },
    /// The runtime did not configure the plugin, or the configure handler failed.
    #[error("plugin {plugin} was not configured: {reason}")]
    Configure {
        /// `IDX-NAME` of this plugin.
        plugin: String,
        /// What happened.
        reason: String,
    },
    /// The runtime closed the connection.
    #[error("connection to the runtime closed")]
    ConnectionClosed,
    /// An UpdateContainers request failed.
    #[error("UpdateContainers failed: {0}")]
    Update(ttrpc::Error),
}

/// Name and index from, in order: the builder, the environment, an
/// `IDX-NAME` executable name; then the executable's name for the name (as
/// Go's `pkg/stub` does) and the builder's default for the index.
fn resolve_identity(
    builder: (Option<String>, Option<String>),
    env: (Option<String>, Option<String>),
    exe: Option<String>,
    default_idx: Option<String>,
) -> Result<(String, String), StubError> {
    let from_exe = exe
        .as_deref()
        .and_then(|e| naming::parse_plugin_file_name(e).ok())
        .map(|(i, n)| (Some(i), Some(n)))
        .unwrap_or((None, None));
    let name = builder
        .0
        .or(env.0)
        .or(from_exe.1)
        .or(exe)
        .ok_or(StubError::MissingName)?;
    let idx = builder
        .1
        .or(env.1)
        .or(from_exe.0)
        .or(default_idx)
        .ok_or(StubError::MissingIndex)?;
    Ok((name, idx))
}

/// Builds a [`Stub`]; see the crate docs for the settings and their sources.
pub struct StubBuilder {
    plugin: Arc<dyn Plugin>,
    name: Option<String>,
    idx: Option<String>,
    default_idx: Option<String>,
    socket_path: Option<PathBuf>,
    events: EventMask,
    registration_timeout: Duration,
}

impl StubBuilder {
    /// Sets the plugin name (overrides `NRI_PLUGIN_NAME`).
    pub fn with_plugin_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the two-digit plugin index (overrides `NRI_PLUGIN_IDX`).
    pub fn with_plugin_idx(mut self, idx: impl Into<String>) -> Self {
        self.idx = Some(idx.into());
        self
    }

    /// The index to use when neither [`with_plugin_idx`](Self::with_plugin_idx),
    /// `NRI_PLUGIN_IDX` nor an `IDX-NAME` executable name gives one: lets a
    /// plugin binary run by hand without flags yet still take the index the
    /// runtime launched it with.
    pub fn with_default_plugin_idx(mut self, idx: impl Into<String>) -> Self {
        self.default_idx = Some(idx.into());
        self
    }

    /// Dials this socket instead of `/var/run/nri/nri.sock`. Ignored when the
    /// runtime launched the plugin with a pre-connected `NRI_PLUGIN_SOCKET`.
    pub fn with_socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket_path = Some(path.into());
        self
    }

    /// The events to subscribe to (see [`EventMask::parse`]).
    pub fn with_events(mut self, events: EventMask) -> Self {
        self.events = events;
        self
    }

    /// How long RegisterPlugin may take before the stub gives up (default 5 s).
    pub fn with_registration_timeout(mut self, timeout: Duration) -> Self {
        self.registration_timeout = timeout;
        self
    }

    /// Resolves name and index (see the crate docs) and checks them.
    ///
    /// # Errors
    /// [`StubError::MissingName`], [`StubError::MissingIndex`],
    /// [`StubError::Naming`] or [`StubError::NoEvents`].
    pub fn build(self) -> Result<Stub, StubError> {
        let exe = std::env::args()
            .next()
            .and_then(|a| Some(std::path::Path::new(&a).file_name()?.to_str()?.to_string()))
            .filter(|b| !b.is_empty());
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (name, idx) = resolve_identity(
            (self.name, self.idx),
            (env(nri_proto::PLUGIN_NAME_ENV), env(nri_proto::PLUGIN_IDX_ENV)),
            exe,
            self.default_idx,
        )?;
        naming::check_index(&idx)?;
        naming::check_name(&name)?;
        if self.events.bits() == 0 {
            return Err(StubError::NoEvents);
        }
        Ok(Stub {
            plugin: self.plugin,
            name,
            idx,
            socket_path: self
                .socket_path
                .unwrap_or_else(|| PathBuf::from(nri_proto::DEFAULT_SOCKET_PATH)),
            events: self.events,
            registration_timeout: self.registration_timeout,
        })
    }
}

/// A configured plugin, ready to connect to the runtime.
pub struct Stub {
    plugin: Arc<dyn Plugin>,
    name: String,
    idx: String,
    socket_path: PathBuf,
    events: EventMask,
    registration_timeout: Duration,
}

/// What the runtime told the plugin in Configure.
#[derive(Debug, Clone, Default)]
pub struct RuntimeInfo {
    /// Runtime name, e.g. `containerd`.
    pub name: String,
    /// Runtime version.
    pub version: String,
    /// NRI version the runtime speaks.
    pub nri_version: String,
    /// The runtime's registration timeout.
    pub registration_timeout: Duration,
    /// The runtime's per-request timeout.
    pub request_timeout: Duration,
    /// The event mask the plugin subscribed with.
    pub events: EventMask,
}

impl Stub {
    /// Starts building a stub around `plugin`.
    pub fn builder(plugin: impl Plugin) -> StubBuilder {
        Self::builder_arc(Arc::new(plugin))
    }

    /// Like [`Stub::builder`] for a plugin the caller keeps a handle to.
    pub fn builder_arc(plugin: Arc<dyn Plugin>) -> StubBuilder {
        StubBuilder {
            plugin,
            name: None,
            idx: None,
            default_idx: None,
            socket_path: None,
            events: EventMask::default(),
            registration_timeout: nri_proto::DEFAULT_REGISTRATION_TIMEOUT,
        }
    }

    /// `IDX-NAME`.
    pub fn qualified_name(&self) -> String {
        format!("{}-{}", self.idx, self.name)
    }

    /// Connects, registers, waits for Configure, and returns a handle to the
    /// running plugin. Events are served in the background.
    ///
    /// # Errors
    /// Any [`StubError`] about connecting, registering or configuring.
    pub async fn start(self) -> Result<StubHandle, StubError> {
        let trunk = self.connect().await?;
        let mux = Mux::blocked(trunk);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;
        mux.unblock();
        let qualified = self.qualified_name();

        let (configured_tx, mut configured_rx) = watch::channel(None);
        let (state_tx, _) = watch::channel(State::Running);
        let shutdown_state = state_tx.clone();
        let service = PluginAdapter::new(self.plugin.clone(), self.events)
            .with_configure_hook(move |req, result| {
                let outcome = match result {
                    Ok(events) => Ok(RuntimeInfo {
                        name: req.runtime_name.clone(),
                        version: req.runtime_version.clone(),
                        nri_version: req.NRI_version.clone(),
                        registration_timeout: ms(req.registration_timeout),
                        request_timeout: ms(req.request_timeout),
                        events,
                    }),
                    Err(e) => Err(format!("configure handler failed: {e}")),
                };
                configured_tx.send_replace(Some(outcome));
            })
            .with_shutdown_hook(move || {
                shutdown_state.send_replace(State::Shutdown);
            });
        let mut server = Server::new()
            .add_listener(transport::listener(plugin_conn))
            .register_service(api_ttrpc::create_plugin(Arc::new(service)));
        server.start().await.map_err(StubError::Server)?;

        let runtime = api_ttrpc::RuntimeClient::new(transport::client(runtime_conn));
        let req = api::RegisterPluginRequest {
            plugin_name: self.name.clone(),
            plugin_idx: self.idx.clone(),
            NRI_version: nri_proto::NRI_VERSION.to_string(),
            ..Default::default()
        };
        let ctx = ttrpc::context::with_timeout(self.registration_timeout.as_nanos() as i64);
        if let Err(source) = runtime.register_plugin(ctx, &req).await {
            mux.close();
            let _ = server.shutdown().await;
            return Err(StubError::Register {
                plugin: qualified,
                source,
            });
        }
        tracing::info!(plugin = %qualified, "registered with the runtime");

        let configured = tokio::select! {
            r = configured_rx.wait_for(Option::is_some) => r.ok().and_then(|v| v.clone()),
            _ = mux.closed() => None,
        };
        let info = match configured {
            Some(Ok(info)) => info,
            Some(Err(reason)) => {
                mux.close();
                let _ = server.shutdown().await;
                return Err(StubError::Configure {
                    plugin: qualified,
                    reason,
                });
            }
            None => {
                let _ = server.shutdown().await;
                return Err(StubError::Configure {
                    plugin: qualified,
                    reason: "the runtime closed the connection before Configure".into(),
                });
            }
        };

        let handle = StubHandle {
            inner: Arc::new(HandleInner {
                name: qualified,
                runtime,
                mux: mux.clone(),
                info,
                state: state_tx.clone(),
            }),
        };
        let plugin = self.plugin.clone();
        tokio::spawn(async move {
            let reason = mux.closed().await;
            let _ = server.shutdown().await;
            tracing::info!(reason = ?reason, "connection to the runtime closed");
            plugin.on_close().await;
            state_tx.send_if_modified(|s| {
                if *s == State::Running {
                    *s = State::Closed;
                    true
                } else {
                    false
                }
            });
        });
        Ok(handle)
    }

    /// [`Stub::start`], then serves until the connection ends.
    ///
    /// Returns `Ok(())` after the runtime sent Shutdown or the plugin called
    /// [`StubHandle::stop`].
    ///
    /// # Errors
    /// What [`Stub::start`] returns, or [`StubError::ConnectionClosed`] when
    /// the runtime went away.
    pub async fn run(self) -> Result<(), StubError> {
        self.start().await?.wait().await
    }

    async fn connect(&self) -> Result<UnixStream, StubError> {
        if let Some(value) = std::env::var(nri_proto::PLUGIN_SOCKET_ENV)
            .ok()
            .filter(|v| !v.is_empty())
        {
            return inherited_socket(&value);
        }
        UnixStream::connect(&self.socket_path)
            .await
            .map_err(|source| StubError::Connect {
                path: self.socket_path.clone(),
                source,
            })
    }
}

fn inherited_socket(value: &str) -> Result<UnixStream, StubError> {
    let bad = |reason: String| StubError::InheritedSocket {
        value: value.to_string(),
        reason,
    };
    let fd: i32 = value.parse().map_err(|_| bad("not a file descriptor number".into()))?;
    let st = nix::sys::stat::fstat(fd).map_err(|e| bad(format!("fd {fd}: {e}")))?;
    if st.st_mode & libc_s_ifmt() != libc_s_ifsock() {
        return Err(bad(format!("fd {fd} is not a socket")));
    }
    // SAFETY: fd is open (fstat succeeded) and handed to this process for
    // its exclusive use by the runtime that launched it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std_stream = std::os::unix::net::UnixStream::from(owned);
    std_stream.set_nonblocking(true).map_err(|e| bad(e.to_string()))?;
    // The variable must not leak into processes this plugin starts.
    // SAFETY: called before the plugin spawns threads of its own that read
    // the environment; tokio's workers do not.
    unsafe { std::env::remove_var(nri_proto::PLUGIN_SOCKET_ENV) };
    UnixStream::from_std(std_stream).map_err(|e| bad(e.to_string()))
}

const fn libc_s_ifmt() -> u32 {
    0o170000
}
const fn libc_s_ifsock() -> u32 {
    0o140000
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Shutdown,
    Stopped,
    Closed,
}

/// A running plugin: ask for container updates, wait for the end, stop.
#[derive(Clone)]
pub struct StubHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    name: String,
    runtime: api_ttrpc::RuntimeClient,
    mux: Mux,
    info: RuntimeInfo,
    state: watch::Sender<State>,
}

impl StubHandle {
    /// `IDX-NAME` of this plugin.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What the runtime sent in Configure.
    pub fn runtime(&self) -> &RuntimeInfo {
        &self.inner.info
    }

    /// Asks the runtime to update existing containers and evict others
    /// (unsolicited, outside any event). Returns the updates that failed.
    ///
    /// # Errors
    /// [`StubError::Update`] if the request failed as a whole.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, StubError> {
        let req = api::UpdateContainersRequest {
            update,
            evict,
            ..Default::default()
        };
        let timeout = self.inner.info.request_timeout.max(Duration::from_secs(2));
        let ctx = ttrpc::context::with_timeout(timeout.as_nanos() as i64);
        let rsp = self
            .inner
            .runtime
            .update_containers(ctx, &req)
            .await
            .map_err(StubError::Update)?;
        Ok(rsp.failed)
    }

    /// Closes the connection; [`StubHandle::wait`] then returns `Ok(())`.
    pub fn stop(&self) {
        // Recorded before closing so wait() reports a deliberate stop.
        self.inner.state.send_if_modified(|s| {
            let running = *s == State::Running;
            if running {
                *s = State::Stopped;
            }
            running
        });
        self.inner.mux.close();
    }

    /// Waits until the connection ends.
    ///
    /// # Errors
    /// [`StubError::ConnectionClosed`] if the runtime closed it without
    /// asking the plugin to shut down first.
    pub async fn wait(&self) -> Result<(), StubError> {
        let mut rx = self.inner.state.subscribe();
        let state = *rx
            .wait_for(|s| *s != State::Running)
            .await
            .map_err(|_| StubError::ConnectionClosed)?;
        match state {
            State::Shutdown | State::Stopped => Ok(()),
            State::Running | State::Closed => Err(StubError::ConnectionClosed),
        }
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    fn resolve(
        builder: (Option<String>, Option<String>),
        env: (Option<String>, Option<String>),
        exe: Option<String>,
        default_idx: Option<String>,
    ) -> (String, String) {
        resolve_identity(builder, env, exe, default_idx).unwrap()
    }

    #[test]
    fn builder_then_environment_then_executable_then_defaults() {
        let none = (None, None);
        assert_eq!(
            resolve((s("b"), s("05")), (s("e"), s("06")), s("07-x"), s("99")),
            ("b".into(), "05".into())
        );
        assert_eq!(
            resolve(none.clone(), (s("e"), s("06")), s("07-x"), s("99")),
            ("e".into(), "06".into())
        );
        // Launched by the runtime as plugins/07-x: the file name gives both.
        assert_eq!(
            resolve(none.clone(), none.clone(), s("07-x"), s("99")),
            ("x".into(), "07".into())
        );
        // Run by hand: the executable's name and the default index.
        assert_eq!(
            resolve(none.clone(), none.clone(), s("nri-adjuster"), s("10")),
            ("nri-adjuster".into(), "10".into())
        );
    }

    #[test]
    fn error_chain_skips_causes_already_in_the_message() {
        let e = StubError::Connect {
            path: "/x.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let text = error_chain(&e);
        assert_eq!(text.matches("entity not found").count(), 1, "{text}");
        assert!(
            text.starts_with("failed to connect to the NRI socket /x.sock"),
            "{text}"
        );
    }

    #[test]
    fn missing_index_without_default_is_an_error() {
        let e = resolve_identity((None, None), (None, None), s("nri-adjuster"), None).unwrap_err();
        assert!(matches!(e, StubError::MissingIndex), "{e}");
        let e = resolve_identity((None, s("10")), (None, None), None, None).unwrap_err();
        assert!(matches!(e, StubError::MissingName), "{e}");
    }
}
