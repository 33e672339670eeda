//! # nri-stub
//!
//! Write NRI plugins in Rust. A plugin implements [`Plugin`] (one async method
//! per event; the defaults do nothing), picks the events it wants, and hands
//! itself to a [`Stub`], which connects to the runtime (containerd, CRI-O, or
//! any runtime embedding `nri-adaptation`), registers, answers Configure and
//! Synchronize, and routes every subscribed event to the plugin.
//!
//! ```
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
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # // A runtime for the plugin to register with (containerd, CRI-O, or as
//! # // here nri-adaptation in-process), listening on `socket`.
//! # let dir = tempfile::tempdir().unwrap();
//! # let socket = dir.path().join("nri.sock");
//! # let runtime = nri_adaptation::Adaptation::builder("runtime", "1.0")
//! #     .with_sync_fn(|| async { Ok(nri_adaptation::RuntimeState::default()) })
//! #     .with_update_fn(|_| async { Ok(Vec::new()) })
//! #     .with_socket_path(&socket)
//! #     .with_plugin_path(dir.path().join("plugins"))
//! #     .build()?;
//! # runtime.start().await?;
//! let stub = Stub::builder(AddEnv)
//!     .with_plugin_name("add-env")
//!     .with_plugin_idx("10")
//!     .with_events(EventMask::parse("CreateContainer")?)
//!     .with_socket_path(&socket) // default /var/run/nri/nri.sock
//!     .build()?;
//! // `stub.run().await` serves until the runtime goes away; `start`
//! // returns once the plugin is registered and configured, and serves
//! // events in the background.
//! let plugin = stub.start().await?;
//! # while runtime.plugin_names().is_empty() { // synchronized: in the runtime's list
//! #     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! # }
//! # let rsp = runtime
//! #     .create_container(api::CreateContainerRequest {
//! #         pod: Some(api::PodSandbox { id: "p".into(), ..Default::default() }).into(),
//! #         container: Some(api::Container { id: "c".into(), pod_sandbox_id: "p".into(), ..Default::default() }).into(),
//! #         ..Default::default()
//! #     })
//! #     .await?;
//! # assert_eq!(rsp.adjust.env[0].key, "HELLO");
//! # drop(plugin);
//! # runtime.stop().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
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

use std::path::PathBuf;

pub use async_trait::async_trait;
pub use nri_proto::{api, events::EventMask};
use nri_proto::{mux::MuxError, naming::NamingError};
/// The protobuf runtime of the [`api`] types, so a plugin needs no
/// dependency of its own: [`MessageField`] is how optional sub-messages
/// (`rsp.adjust`, `adjust.linux`, `resources.memory`, ...) are set.
pub use protobuf::{self, MessageField};

/// The plugin trait and its error type live in [`nri_proto::plugin`], shared
/// with runtimes that call in-process plugins through the same adapter.
pub use nri_proto::plugin::{BoxError, Plugin};

pub use self::{
    builder::StubBuilder,
    handle::StubHandle,
    stub::{RuntimeInfo, Stub},
};

pub mod adjustments;
mod builder;
#[cfg(feature = "cli")]
pub mod cli;
mod handle;
mod stub;

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
    #[error("failed to connect to the NRI socket {path}")]
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
    #[error("failed to start the plugin's ttrpc server")]
    Server(#[source] ttrpc::Error),
    /// The runtime refused or did not answer RegisterPlugin.
    #[error("failed to register plugin {plugin} with the runtime")]
    Register {
        /// `IDX-NAME` of this plugin.
        plugin: String,
        /// The ttrpc error.
        source: RpcError,
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
    #[error("UpdateContainers failed")]
    Update(#[source] RpcError),
}

/// A ttrpc error as a person reads it: a status the runtime answered is
/// `CODE: message` (`INVALID_ARGUMENT: plugin 10-a is already
/// registered`); ttrpc's own text for it is the status struct, protobuf
/// internals included. Other errors keep ttrpc's text.
#[derive(Debug)]
pub struct RpcError(pub ttrpc::Error);

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            ttrpc::Error::RpcStatus(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            e => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RpcError {}

#[cfg(test)]
mod rpc_error_tests {
    use super::*;

    #[test]
    fn a_status_reads_as_code_and_message() {
        let e = RpcError(ttrpc::Error::RpcStatus(ttrpc::get_status(
            ttrpc::Code::INVALID_ARGUMENT,
            "plugin 10-a is already registered",
        )));
        assert_eq!(e.to_string(), "INVALID_ARGUMENT: plugin 10-a is already registered");
        let e = StubError::Register {
            plugin: "10-a".into(),
            source: e,
        };
        let chain = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        assert!(!chain.contains("special_fields"), "{chain}");
        assert_eq!(
            RpcError(ttrpc::Error::LocalClosed).to_string(),
            ttrpc::Error::LocalClosed.to_string()
        );
    }
}
