//! A configured plugin: connecting to the runtime (or the socket it
//! inherited), registering and serving until the connection ends.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use nri_proto::{
    api, api_ttrpc,
    events::EventMask,
    mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    plugin::{Plugin, PluginAdapter},
    transport,
};
use tokio::{net::UnixStream, sync::watch};
use ttrpc::asynchronous::Server;

use crate::{
    StubError,
    builder::StubBuilder,
    handle::{HandleInner, State, StubHandle},
};

/// A configured plugin, ready to connect to the runtime.
pub struct Stub {
    pub(crate) plugin: Arc<dyn Plugin>,
    pub(crate) name: String,
    pub(crate) idx: String,
    pub(crate) socket_path: PathBuf,
    pub(crate) events: EventMask,
    pub(crate) registration_timeout: Duration,
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
                    Err(e) => {
                        // The handler's error and its causes: the reason `run` reports.
                        let causes = std::iter::successors(Some(&**e as &dyn std::error::Error), |e| e.source());
                        let text = causes.map(|e| e.to_string()).collect::<Vec<_>>().join(": ");
                        Err(format!("configure handler failed: {text}"))
                    }
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
                source: crate::RpcError(source),
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
                // The hook runs before the error reply is written: closing
                // now could reach the runtime first, which would then log
                // "connection closed" instead of the handler's message. The
                // runtime closes on a failed Configure; wait for that
                // (bounded), then close.
                let _ = tokio::time::timeout(Duration::from_secs(1), mux.closed()).await;
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
