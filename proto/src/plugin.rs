//! The `Plugin` service in Rust terms, for both ends of NRI.
//!
//! [`Plugin`] is what a plugin implements: one async method per request the
//! runtime can send, each with a default that accepts the event and changes
//! nothing. [`PluginAdapter`] turns requests of the NRI `Plugin` service into
//! calls of a [`Plugin`]: a plugin process serves it over ttrpc (it
//! implements [`api_ttrpc::Plugin`](crate::api_ttrpc::Plugin)), and a runtime calls its request methods
//! directly for plugins that run inside the runtime's process. One adapter on
//! both paths means an in-process plugin sees exactly the calls, defaults and
//! error conversions it would see behind a socket.
//!
//! ```
//! use std::sync::Arc;
//! use nri_proto::{api, events::EventMask, plugin::{BoxError, Plugin, PluginAdapter}};
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
//!         rsp.adjust.mut_or_insert_default().env.push(api::KeyValue {
//!             key: "HELLO".into(),
//!             value: "nri".into(),
//!             ..Default::default()
//!         });
//!         Ok(rsp)
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let adapter = PluginAdapter::new(Arc::new(AddEnv), EventMask::parse("CreateContainer").unwrap());
//! // An empty mask from the plugin's configure: the adapter's own one is sent.
//! let configured = adapter.configure(&api::ConfigureRequest::new()).await.unwrap();
//! assert_eq!(configured.events, 0x8);
//! let rsp = adapter.create_container(&api::CreateContainerRequest::new()).await.unwrap();
//! assert_eq!(rsp.adjust.env[0].key, "HELLO");
//! # });
//! ```

use async_trait::async_trait;

use crate::{
    api::{self, Event},
    events::EventMask,
};

/// Error type plugin handlers return; any error converts into it with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An NRI plugin: one method per request the runtime can send.
///
/// Every method has a default that accepts the event and changes nothing,
/// so a plugin implements only what it cares about. Which events the runtime
/// sends is decided by the subscription mask (the one the plugin was set up
/// with, or the mask [`Plugin::configure`] returns), not by which methods
/// exist.
///
/// A handler error fails the runtime's request (for CreateContainer, the
/// container is not created) and is reported with the error's text. A
/// [`Plugin::validate_container_adjustment`] error rejects the adjustment
/// with the error's text as the reason.
#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// Called once after registration with the runtime's identity, the
    /// plugin's configuration (non-empty only for plugins the runtime
    /// launched from its plugin directory) and the runtime's timeouts.
    /// Return the events to subscribe to; an empty mask keeps the one the
    /// plugin was set up with.
    async fn configure(&self, _req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        Ok(EventMask::default())
    }

    /// The runtime's existing pods and containers, once, after configure.
    /// Return updates for existing containers.
    async fn synchronize(
        &self,
        _pods: &[api::PodSandbox],
        _containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        Ok(Vec::new())
    }

    /// The runtime asks the plugin to shut down.
    async fn shutdown(&self) {}

    /// A pod sandbox is being created.
    async fn run_pod_sandbox(&self, _pod: &api::PodSandbox) -> Result<(), BoxError> {
        Ok(())
    }

    /// A pod sandbox's resources are being updated.
    async fn update_pod_sandbox(&self, _req: &api::UpdatePodSandboxRequest) -> Result<(), BoxError> {
        Ok(())
    }

    /// A pod sandbox's resources were updated.
    async fn post_update_pod_sandbox(&self, _pod: &api::PodSandbox) -> Result<(), BoxError> {
        Ok(())
    }

    /// A pod sandbox is being stopped.
    async fn stop_pod_sandbox(&self, _pod: &api::PodSandbox) -> Result<(), BoxError> {
        Ok(())
    }

    /// A pod sandbox is being removed.
    async fn remove_pod_sandbox(&self, _pod: &api::PodSandbox) -> Result<(), BoxError> {
        Ok(())
    }

    /// A container is being created: return adjustments to its spec and
    /// updates for other containers.
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        Ok(api::CreateContainerResponse::new())
    }

    /// A container was created.
    async fn post_create_container(&self, _pod: &api::PodSandbox, _container: &api::Container) -> Result<(), BoxError> {
        Ok(())
    }

    /// A container is being started.
    async fn start_container(&self, _pod: &api::PodSandbox, _container: &api::Container) -> Result<(), BoxError> {
        Ok(())
    }

    /// A container was started.
    async fn post_start_container(&self, _pod: &api::PodSandbox, _container: &api::Container) -> Result<(), BoxError> {
        Ok(())
    }

    /// A container's resources are being updated to `resources`; return
    /// updates (including for that container) and evictions.
    async fn update_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
        _resources: &api::LinuxResources,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        Ok(api::UpdateContainerResponse::new())
    }

    /// A container's resources were updated.
    async fn post_update_container(&self, _pod: &api::PodSandbox, _container: &api::Container) -> Result<(), BoxError> {
        Ok(())
    }

    /// A container is stopping (or stopped by itself); return updates for
    /// other containers.
    async fn stop_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        Ok(Vec::new())
    }

    /// A container is being removed.
    async fn remove_container(&self, _pod: &api::PodSandbox, _container: &api::Container) -> Result<(), BoxError> {
        Ok(())
    }

    /// Approve (Ok) or reject (Err, the text is the reason) the merged
    /// adjustment of a container before the runtime applies it.
    async fn validate_container_adjustment(
        &self,
        _req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        Ok(())
    }

    /// The connection to the runtime is gone.
    async fn on_close(&self) {}
}

/// The nine events that carry no reply content: a runtime relays them with
/// a dedicated request each, or with StateChange to older plugins.
pub const NOTIFICATIONS: EventMask = EventMask::from_bits(
    EventMask::bit(Event::RUN_POD_SANDBOX)
        | EventMask::bit(Event::POST_UPDATE_POD_SANDBOX)
        | EventMask::bit(Event::STOP_POD_SANDBOX)
        | EventMask::bit(Event::REMOVE_POD_SANDBOX)
        | EventMask::bit(Event::POST_CREATE_CONTAINER)
        | EventMask::bit(Event::START_CONTAINER)
        | EventMask::bit(Event::POST_START_CONTAINER)
        | EventMask::bit(Event::POST_UPDATE_CONTAINER)
        | EventMask::bit(Event::REMOVE_CONTAINER),
);

mod adapter;
pub use adapter::PluginAdapter;

#[cfg(test)]
mod tests;
