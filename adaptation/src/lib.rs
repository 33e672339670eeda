//! # nri-adaptation
//!
//! The runtime side of NRI, the Node Resource Interface of containerd and
//! CRI-O, for any Rust container runtime.
//!
//! An [`Adaptation`] accepts external plugins on a unix socket (default
//! `/var/run/nri/nri.sock`), launches pre-installed plugins from a plugin
//! directory, orders plugins by index, relays every pod and container
//! lifecycle event to the plugins subscribed to it, and merges the
//! adjustments they return.
//!
//! | piece | what |
//! |---|---|
//! | [`Adaptation`] | start/stop, plugin registry, one async method per lifecycle event |
//! | [`Options`], [`FailurePolicy`] | socket and plugin paths, timeouts, per-plugin failure policy |
//! | [`launch`] | discovery and launch of pre-installed plugins |
//! | [`result`] | merging plugin responses |
//!
//! Wire compatibility: an unmodified Go plugin built with containerd/nri's
//! `pkg/stub`, or a Rust plugin built with `nri-stub`, registers and works
//! against it. Deviations from upstream NRI behaviour are listed on the
//! items they concern (search the docs for "upstream").

#![warn(missing_docs)]

mod adaptation;
mod builder;
mod callbacks;
pub mod config;
pub mod convert;
mod dispatch;
pub mod error;
pub mod launch;
pub mod owners;
mod plugin;
mod registry;
pub mod resources;
pub mod result;
mod socket;
pub mod spec;
mod sync;
pub mod validate;

pub use adaptation::Adaptation;
pub use builder::AdaptationBuilder;
pub use callbacks::RuntimeState;
pub use config::{FailurePolicy, Options};
pub use dispatch::{CreateReport, PluginResponse};
pub use error::{BoxError, Error, PluginError, ValidationError};
pub use nri_proto::{self, api, events::EventMask};
pub use plugin::{HandshakeError, PluginOrigin};
pub use spec::{AdjustError, Adjuster, adjust, update};
pub use sync::PluginSyncBlock;
pub use validate::{DefaultValidator, DefaultValidatorConfig};
