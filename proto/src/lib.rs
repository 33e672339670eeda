//! # nri-proto
//!
//! The wire protocol of NRI, the Node Resource Interface of containerd and
//! CRI-O, for Rust runtimes and plugins.
//!
//! | module | what |
//! |---|---|
//! | [`api`] | protobuf messages of package `nri.pkg.api.v1alpha1` (rust-protobuf 3.7) |
//! | [`api_ttrpc`] | async ttrpc clients and server traits for the `Runtime` and `Plugin` services |
//! | [`mux`] | the trunk multiplexer that carries both ttrpc sessions over one unix socket |
//! | [`events`] | event subscription masks (`Event e` is bit `e - 1`) |
//! | [`naming`] | plugin index and name rules (`IDX-NAME`) |
//! | [`plugin`] | the [`Plugin`](plugin::Plugin) trait (one async method per event) and the adapter that serves it as the `Plugin` service |
//!
//! Messages, services and field numbers are those of upstream NRI v0.12, so
//! an unmodified Go plugin built with containerd/nri's `pkg/stub` talks to a
//! runtime built on this crate, and a Rust plugin to containerd or CRI-O.
//!
//! ```
//! use nri_proto::{api, events::EventMask};
//! use protobuf::Message;
//!
//! let req = api::RegisterPluginRequest {
//!     plugin_name: "logger".into(),
//!     plugin_idx: "10".into(),
//!     ..Default::default()
//! };
//! let bytes = req.write_to_bytes().unwrap();
//! assert_eq!(api::RegisterPluginRequest::parse_from_bytes(&bytes).unwrap(), req);
//!
//! let mask = EventMask::from_events(&[api::Event::CREATE_CONTAINER]);
//! assert_eq!(mask.bits(), 0x8);
//! ```

#![warn(missing_docs)]

/// Protobuf messages and enums of `nri.pkg.api.v1alpha1` (generated).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    unused_imports,
    unused_mut,
    unused_variables,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri/api.rs"));
}

/// ttrpc services `Runtime`, `Plugin` and `HostFunctions` (generated).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    unused_imports,
    unused_mut,
    unused_variables,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
pub mod api_ttrpc {
    include!(concat!(env!("OUT_DIR"), "/nri/api_ttrpc.rs"));
}

pub mod events;
pub mod mux;
pub mod naming;
mod packed_enum;
pub mod plugin;
pub mod sync;

pub use protobuf;
pub use ttrpc;

/// Default path of the runtime's socket for external plugins.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// Default directory of pre-installed plugins the runtime launches.
pub const DEFAULT_PLUGIN_PATH: &str = "/opt/nri/plugins";
/// Default directory of drop-in configuration for pre-installed plugins.
pub const DEFAULT_PLUGIN_CONFIG_PATH: &str = "/etc/nri/conf.d";

/// Environment variable carrying a launched plugin's name (without index).
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
/// Environment variable carrying a launched plugin's two-digit index.
pub const PLUGIN_IDX_ENV: &str = "NRI_PLUGIN_IDX";
/// Environment variable carrying the fd number of a launched plugin's
/// pre-connected socket.
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";

/// Default time a plugin has to register after connecting (NRI: 5 s).
pub const DEFAULT_REGISTRATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Default time a plugin has to answer one request (NRI: 2 s).
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The NRI protocol version this crate speaks, as sent in
/// `ConfigureRequest.NRI_version` and `RegisterPluginRequest.NRI_version`.
pub const NRI_VERSION: &str = "v0.12.2";

/// Largest ttrpc message payload in bytes (4 MiB); larger ones are refused
/// by ttrpc senders and receivers with ResourceExhausted.
pub const TTRPC_MAX_MESSAGE: usize = 4 << 20;

#[cfg(test)]
mod codec_tests;

pub mod transport {
    //! Glue between the [`mux`](crate::mux) and ttrpc-rust: a ttrpc client on
    //! one logical connection, a ttrpc listener that yields exactly one.

    use futures::StreamExt as _;
    use ttrpc::asynchronous::{
        Client,
        transport::{Listener, Socket},
    };

    use crate::mux::MuxConn;

    /// A ttrpc client speaking over one logical connection.
    pub fn client(conn: MuxConn) -> Client {
        Client::new(Socket::new(conn))
    }

    /// A ttrpc listener that accepts `conn` once and then never again (but
    /// stays open, so the server keeps serving it).
    pub fn listener(conn: MuxConn) -> Listener {
        Listener::new(futures::stream::once(async move { Ok(conn) }).chain(futures::stream::pending()))
    }
}
