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
//! A runtime builds one, asks it at each container create what the plugins
//! change, and applies that to the OCI spec it is about to run. Here one
//! plugin, built into the runtime, adds an environment variable:
//!
//! ```
//! use std::sync::Arc;
//! use nri_adaptation::{Adaptation, EventMask, RuntimeState, adjust, api, convert};
//! use nri_adaptation::nri_proto::plugin::{BoxError, Plugin};
//!
//! struct AddEnv;
//!
//! #[async_trait::async_trait]
//! impl Plugin for AddEnv {
//!     async fn create_container(
//!         &self,
//!         _pod: &api::PodSandbox,
//!         _container: &api::Container,
//!     ) -> Result<api::CreateContainerResponse, BoxError> {
//!         let mut rsp = api::CreateContainerResponse::new();
//!         let env = api::KeyValue { key: "HELLO".into(), value: "from-nri".into(), ..Default::default() };
//!         rsp.adjust.mut_or_insert_default().env.push(env);
//!         Ok(rsp)
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! let nri = Adaptation::builder("my-runtime", "1.0")
//!     .with_sync_fn(|| async { Ok(RuntimeState::default()) }) // the pods and containers that run
//!     .with_update_fn(|_updates| async { Ok(Vec::new()) })    // plugins' changes to running ones
//!     .with_builtin_plugin("10", "add-env", EventMask::parse("CreateContainer")?, Arc::new(AddEnv))
//!     .with_disabled_connections() // no external plugins in this example
//!     .with_plugin_path(dir.path().join("plugins"))
//!     .build()?;
//! nri.start().await?;
//!
//! let mut spec = oci_spec::runtime::Spec::default(); // what the runtime would run
//! let pod = api::PodSandbox { id: "pod1".into(), name: "web".into(), ..Default::default() };
//! let container = convert::container_from_spec("c1", &pod.id, "app", &spec);
//! let rsp = nri
//!     .create_container(api::CreateContainerRequest {
//!         pod: Some(pod).into(),
//!         container: Some(container).into(),
//!         ..Default::default()
//!     })
//!     .await?;
//! adjust(&mut spec, rsp.adjust.get_or_default())?; // all or nothing
//! let env = spec.process().as_ref().and_then(|p| p.env().clone()).unwrap_or_default();
//! assert!(env.contains(&"HELLO=from-nri".to_string()));
//! nri.stop().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! | piece | what |
//! |---|---|
//! | [`Adaptation`] | start/stop, plugin registry, one async method per lifecycle event |
//! | [`Options`], [`FailurePolicy`], [`PluginView`] | socket and plugin paths, timeouts, per-plugin failure policy and view |
//! | [`permissions`] | per-plugin permissions: which field groups a plugin may change |
//! | [`adjust`], [`update`], [`spec::to_oci_resources`] | apply plugins' adjustments and updates to an OCI spec |
//! | [`convert`] | the plugins' view of a container from its OCI spec |
//! | [`resources`] | the table of NRI resource fields; [`resources::overlay`] keeps a runtime's NRI view current |
//! | [`Error`], [`PluginError`], [`ValidationError`], [`MergeError`], [`PermissionError`] | why a request failed, typed where a runtime branches |
//! | [`DefaultValidator`] | the built-in validator |
//! | [`Observer`] | per plugin request latency and outcome, refused answers (for metrics) |
//! | [`wasm`] | WebAssembly plugins in the plugin directory (feature `wasm`): calling convention, sandbox, [`wasm::WasmOptions`] |
//!
//! Pre-installed plugins are launched from the plugin directory
//! ([`Options::plugin_path`]); plugin responses are merged with ownership
//! and conflict detection. Both are internal.
//!
//! Wire compatibility: an unmodified Go plugin built with containerd/nri's
//! `pkg/stub`, or a Rust plugin built with `nri-stub`, registers and works
//! against it. Deviations from upstream NRI behaviour are listed on the
//! items they concern (search the docs for "upstream").
//!
//! # Runtime contract
//!
//! What a runtime embedding an [`Adaptation`] must do for plugins to see a
//! consistent world.
//!
//! **Creating a container.** Build the plugins' view of the container from
//! the OCI spec the runtime is about to run
//! ([`convert::container_from_spec`]), put it and its pod in a
//! `CreateContainerRequest` and call [`Adaptation::create_container`]. On
//! success apply `adjust` to the spec with [`adjust`] (all or nothing: on
//! error the spec is untouched), run the container from the adjusted spec,
//! and from then on describe the container to plugins as the adjusted spec
//! says. `update` lists changes to *other* containers that plugins made
//! room with: apply them like any resource update. On error, do not run the
//! container: the error names the plugin, the conflicting field, the
//! field outside a plugin's permissions ([`Error::Permission`]) or the
//! validator ([`Error::Validation`] tells a rejection from a validator
//! that gave no verdict).
//!
//! ```
//! use nri_adaptation::{Adaptation, RuntimeState, adjust, api, convert};
//! use protobuf::MessageField;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! let nri = Adaptation::builder("my-runtime", "1.0")
//!     .with_sync_fn(|| async { Ok(RuntimeState::default()) })
//!     .with_update_fn(|_updates| async { Ok(Vec::new()) })
//!     .with_disabled_connections()
//!     .with_plugin_path(dir.path().join("plugins"))
//!     .build()?;
//! nri.start().await?;
//!
//! let mut spec = oci_spec::runtime::Spec::default();
//! let original = spec.clone();
//! let pod = api::PodSandbox { id: "pod1".into(), name: "web".into(), ..Default::default() };
//! let container = convert::container_from_spec("c1", &pod.id, "app", &spec);
//! let rsp = nri
//!     .create_container(api::CreateContainerRequest {
//!         pod: MessageField::some(pod),
//!         container: MessageField::some(container),
//!         ..Default::default()
//!     })
//!     .await?;
//! adjust(&mut spec, rsp.adjust.get_or_default())?;
//! // No plugin, no change: the spec the runtime runs is the one it had.
//! assert_eq!(spec, original);
//! assert!(rsp.update.is_empty());
//! nri.stop().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! **Updates and evictions.** [`Adaptation::update_container`] returns the
//! updated container's complete new resources as the *last* element; the
//! elements before it target other containers and are applied first.
//! [`Adaptation::stop_container`] returns updates of other containers (a
//! stopped container's CPUs given to the rest). Updates plugins send on
//! their own, and those in their Synchronize replies, reach the runtime
//! through the update callback, which returns the ones it could not apply
//! (leaving out failed ones marked `ignore_failure`). Evictions, from
//! CreateContainer and UpdateContainer replies (delivered once that
//! request is over, also when it failed) and from unsolicited
//! UpdateContainers, reach the evict callback: stop the container as the runtime would any other, which
//! sends StopContainer. Both callbacks run without any adaptation lock held,
//! possibly while an event is in flight: the runtime serializes its own
//! state.
//!
//! **Event order.** Per pod: RunPodSandbox before any of its containers'
//! events; UpdatePodSandbox then PostUpdatePodSandbox; StopPodSandbox; and
//! RemovePodSandbox after its containers were removed. Per container:
//! CreateContainer → PostCreateContainer → StartContainer →
//! PostStartContainer → (UpdateContainer → PostUpdateContainer)* →
//! StopContainer → RemoveContainer. Each method relays its event to every
//! subscribed plugin before it returns; events the runtime sends one after
//! another reach every plugin in that order (see "Ordering").
//!
//! **StopContainer exactly once** per container that got CreateContainer,
//! whether the runtime stopped it, it was killed or evicted, or it exited
//! on its own; also when the create failed after CreateContainer was sent
//! (plugins answered before the failing one may hold resources for it),
//! followed by RemoveContainer.
//!
//! **Post\* only after success.** PostCreateContainer, PostStartContainer,
//! PostUpdateContainer and PostUpdatePodSandbox say the operation
//! happened: send them only after it succeeded. Their errors cannot undo
//! it; log them.
//!
//! **Creates against plugin sync.** Nothing to do: the adaptation makes
//! sure a plugin that joins sees every pod and container, in its
//! Synchronize or as an event. It completes the sync callback's answer
//! with what its own event methods saw (pods from RunPodSandbox until
//! RemovePodSandbox, containers from a successful CreateContainer until
//! RemoveContainer, with their state and updated resources), so a runtime
//! may record a new container after CreateContainer returned; and events
//! wait while the plugin synchronizes, then reach it. The runtime's answer
//! wins for what it reports, except for changes made by events after the
//! sync callback was called. A runtime that fails a create after
//! CreateContainer must send StopContainer and RemoveContainer (see above),
//! or joining plugins are told of the container.
//! [`Adaptation::block_plugin_sync`] (upstream's `BlockPluginSync`) still
//! holds off syncs, for a runtime's own reasons.
//!
//! # Ordering
//!
//! A runtime may call the event methods from many tasks at once; no lock
//! is held across a request's plugin chain. Each call is *admitted* when it
//! starts, and each plugin serves the requests it gets one at a time, in
//! admission order. While plugin 20 works on one create, plugin 10 already
//! works on the next.
//!
//! What a plugin can rely on:
//!
//! * It gets the next request only after it answered the previous one,
//!   and requests in the order they were admitted; two plugins never see
//!   two events in different orders. Events the runtime sends one after
//!   another (a container's lifecycle) reach every plugin in that order.
//! * With the default view ([`PluginView::Adjusted`], upstream's),
//!   CreateContainer and UpdateContainer hold the answers of every plugin
//!   before it in invocation order; with [`PluginView::Original`] they hold
//!   the runtime's request, and the plugin is called at once, side by side.
//! * The merged adjustment, field owners, conflicts, validation and the
//!   error of a request are those of calling its plugins one after another
//!   in invocation order with the same answers: answers are merged in that
//!   order, and the first failure in that order is the request's.
//! * A joining plugin's Synchronize holds what every request admitted
//!   before it did; every request admitted after it reaches the plugin.
//! * After a failed create, the StopContainer and RemoveContainer the
//!   runtime sends reach every plugin after that create.
//!
//! What it cannot rely on:
//!
//! * That the plugins before it answered a request when it gets it, except
//!   for CreateContainer and UpdateContainer with the adjusted view.
//!   Notifications, UpdatePodSandbox, StopContainer and
//!   ValidateContainerAdjustment go to their subscribers side by side.
//! * That no other request is in flight: while it handles one create,
//!   an earlier one may still be at a plugin after it.
//! * That it did not get a create that failed: with the original view it
//!   may have got it although a plugin before it refused it.
//! * The order of two calls the runtime makes concurrently: they are
//!   admitted in the order they reach the adaptation.
//!
//! Upstream's adaptation holds one mutex across each request: a request's
//! whole plugin chain runs before the next request starts, and every
//! event goes to its subscribers one after another.

#![warn(missing_docs)]

mod adaptation;
mod builder;
mod callbacks;
mod config;
pub mod convert;
mod error;
mod known;
pub mod observe;
pub mod permissions;
mod plugin;
mod registry;
pub mod reload;
pub mod resources;
mod result;
pub mod spec;
mod validate;
pub mod wasm;

pub use adaptation::Adaptation;
pub use builder::AdaptationBuilder;
pub use callbacks::RuntimeState;
pub use config::{FailurePolicy, Options, PluginView};
pub use error::{BoxError, Error, PluginError, ValidationError};
pub use nri_proto::{self, api, events::EventMask};
pub use observe::{Observer, Outcome, Rejection};
pub use permissions::{FieldGroup, PermissionError, Permissions};
pub use plugin::{HandshakeError, PluginOrigin};
pub use registry::dispatch::{CreateReport, FieldChange, PluginResponse};
pub use registry::launch::is_plugin_process;
pub use registry::sync::PluginSyncBlock;
pub use reload::Reconfigured;
pub use result::MergeError;
pub use spec::{AdjustError, Adjuster, adjust, update};
pub use validate::{DEFAULT_VALIDATOR_NAME, DefaultValidator, DefaultValidatorConfig, REQUIRED_PLUGINS_ANNOTATION};

/// The merge without an [`Adaptation`], for nri-benches and the fuzz
/// targets (`fuzz/`) only: the benchmark's test checks that its plugin
/// responses merge without conflict before the benchmarks time them; the
/// fuzz targets merge arbitrary responses. Not part of the API: no runtime
/// merges responses itself, and the types may change without notice.
#[doc(hidden)]
pub use result::{CreateResult, UpdateResult};
