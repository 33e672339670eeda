//! The `Plugin` service in Rust terms, for both ends of NRI.
//!
//! [`Plugin`] is what a plugin implements: one async method per request the
//! runtime can send, each with a default that accepts the event and changes
//! nothing. [`PluginAdapter`] turns requests of the NRI `Plugin` service into
//! calls of a [`Plugin`]: a plugin process serves it over ttrpc (it
//! implements [`api_ttrpc::Plugin`]), and a runtime calls its request methods
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

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use protobuf::Message as _;
use ttrpc::asynchronous::TtrpcContext;

use crate::{
    api::{self, Event},
    api_ttrpc,
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

type ConfigureHook = Box<dyn Fn(&api::ConfigureRequest, Result<EventMask, &BoxError>) + Send + Sync>;
type ShutdownHook = Box<dyn Fn() + Send + Sync>;

/// Turns requests of the NRI `Plugin` service into calls of a [`Plugin`].
///
/// The request methods (`configure`, `create_container`, ...) take and
/// return the service's messages; a handler error comes back as the
/// plugin's [`BoxError`]. As a ttrpc service (through
/// [`api_ttrpc::create_plugin`]) a handler error is the status `UNKNOWN`
/// with the error's text.
pub struct PluginAdapter {
    plugin: Arc<dyn Plugin>,
    /// Sent in Configure when the plugin's own configure returns no events.
    events: EventMask,
    /// Pods and containers of a split sync collected so far.
    sync: Mutex<Option<(Vec<api::PodSandbox>, Vec<api::Container>)>>,
    on_configure: Option<ConfigureHook>,
    on_shutdown: Option<ShutdownHook>,
}

impl PluginAdapter {
    /// An adapter for `plugin`, subscribed to `events` unless the plugin's
    /// [`Plugin::configure`] returns a non-empty mask.
    pub fn new(plugin: Arc<dyn Plugin>, events: EventMask) -> Self {
        PluginAdapter {
            plugin,
            events,
            sync: Mutex::new(None),
            on_configure: None,
            on_shutdown: None,
        }
    }

    /// Calls `f` after each Configure with the request and the subscribed
    /// mask, or the handler's error (a plugin's stub learns this way that
    /// the runtime configured it).
    pub fn with_configure_hook(
        mut self,
        f: impl Fn(&api::ConfigureRequest, Result<EventMask, &BoxError>) + Send + Sync + 'static,
    ) -> Self {
        self.on_configure = Some(Box::new(f));
        self
    }

    /// Calls `f` after the plugin handled Shutdown.
    pub fn with_shutdown_hook(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_shutdown = Some(Box::new(f));
        self
    }

    /// The adapted plugin.
    pub fn plugin(&self) -> &Arc<dyn Plugin> {
        &self.plugin
    }

    /// Configure: the plugin's mask, or the adapter's when it is empty.
    ///
    /// # Errors
    /// The plugin's configure error.
    pub async fn configure(&self, req: &api::ConfigureRequest) -> Result<api::ConfigureResponse, BoxError> {
        let result = self.plugin.configure(req).await;
        let events = match &result {
            Ok(m) if m.bits() != 0 => *m,
            _ => self.events,
        };
        if let Some(hook) = &self.on_configure {
            hook(req, result.as_ref().map(|_| events));
        }
        result.map(|_| api::ConfigureResponse {
            events: events.bits(),
            ..Default::default()
        })
    }

    /// Synchronize. The parts of a split sync (`more = true`) are collected
    /// and answered with `more = true`; the plugin sees everything at once
    /// with the last part.
    ///
    /// # Errors
    /// The plugin's synchronize error.
    pub async fn synchronize(&self, req: api::SynchronizeRequest) -> Result<api::SynchronizeResponse, BoxError> {
        let (pods, containers) = {
            let mut collected = self.sync.lock().unwrap_or_else(|p| p.into_inner());
            let acc = collected.get_or_insert_with(Default::default);
            acc.0.extend(req.pods);
            acc.1.extend(req.containers);
            if req.more {
                return Ok(api::SynchronizeResponse {
                    more: true,
                    ..Default::default()
                });
            }
            collected.take().unwrap_or_default()
        };
        let update = self.plugin.synchronize(&pods, &containers).await?;
        Ok(api::SynchronizeResponse {
            update,
            more: false,
            ..Default::default()
        })
    }

    /// Shutdown.
    pub async fn shutdown(&self) {
        self.plugin.shutdown().await;
        if let Some(hook) = &self.on_shutdown {
            hook();
        }
    }

    /// One of the [`NOTIFICATIONS`]; `container` is ignored for pod events.
    ///
    /// # Errors
    /// The handler's error, or an error naming `event` when it is not a
    /// notification.
    pub async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), BoxError> {
        let p = &self.plugin;
        match event {
            Event::RUN_POD_SANDBOX => p.run_pod_sandbox(pod).await,
            Event::POST_UPDATE_POD_SANDBOX => p.post_update_pod_sandbox(pod).await,
            Event::STOP_POD_SANDBOX => p.stop_pod_sandbox(pod).await,
            Event::REMOVE_POD_SANDBOX => p.remove_pod_sandbox(pod).await,
            Event::POST_CREATE_CONTAINER => p.post_create_container(pod, container).await,
            Event::START_CONTAINER => p.start_container(pod, container).await,
            Event::POST_START_CONTAINER => p.post_start_container(pod, container).await,
            Event::POST_UPDATE_CONTAINER => p.post_update_container(pod, container).await,
            Event::REMOVE_CONTAINER => p.remove_container(pod, container).await,
            other => Err(format!("{other:?} is not a notification event").into()),
        }
    }

    /// UpdatePodSandbox.
    ///
    /// # Errors
    /// The handler's error.
    pub async fn update_pod_sandbox(
        &self,
        req: &api::UpdatePodSandboxRequest,
    ) -> Result<api::UpdatePodSandboxResponse, BoxError> {
        self.plugin.update_pod_sandbox(req).await?;
        Ok(Default::default())
    }

    /// CreateContainer.
    ///
    /// # Errors
    /// The handler's error.
    pub async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        self.plugin
            .create_container(req.pod.get_or_default(), req.container.get_or_default())
            .await
    }

    /// UpdateContainer.
    ///
    /// # Errors
    /// The handler's error.
    pub async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        self.plugin
            .update_container(
                req.pod.get_or_default(),
                req.container.get_or_default(),
                req.linux_resources.get_or_default(),
            )
            .await
    }

    /// StopContainer.
    ///
    /// # Errors
    /// The handler's error.
    pub async fn stop_container(
        &self,
        req: &api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, BoxError> {
        let update = self
            .plugin
            .stop_container(req.pod.get_or_default(), req.container.get_or_default())
            .await?;
        Ok(api::StopContainerResponse {
            update,
            ..Default::default()
        })
    }

    /// ValidateContainerAdjustment. A handler error is a rejection with the
    /// error's text as the reason, not a failed request (as upstream's stub).
    pub async fn validate_container_adjustment(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> api::ValidateContainerAdjustmentResponse {
        match self.plugin.validate_container_adjustment(req).await {
            Ok(()) => api::ValidateContainerAdjustmentResponse::new(),
            Err(e) => api::ValidateContainerAdjustmentResponse {
                reject: true,
                reason: e.to_string(),
                ..Default::default()
            },
        }
    }
}

fn status(code: ttrpc::Code, message: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

fn handler_error(e: BoxError) -> ttrpc::Error {
    status(ttrpc::Code::UNKNOWN, e.to_string())
}

/// The ttrpc side: each method forwards to the request method, or to
/// [`PluginAdapter::notify`] for the notifications.
#[async_trait]
impl api_ttrpc::Plugin for PluginAdapter {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        PluginAdapter::configure(self, &req).await.map_err(handler_error)
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        PluginAdapter::synchronize(self, req).await.map_err(handler_error)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        PluginAdapter::shutdown(self).await;
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.notify(
            Event::RUN_POD_SANDBOX,
            req.pod.get_or_default(),
            api::Container::default_instance(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        PluginAdapter::update_pod_sandbox(self, &req)
            .await
            .map_err(handler_error)
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        let pod = req.pod.get_or_default();
        self.notify(Event::POST_UPDATE_POD_SANDBOX, pod, api::Container::default_instance())
            .await
            .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.notify(
            Event::STOP_POD_SANDBOX,
            req.pod.get_or_default(),
            api::Container::default_instance(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.notify(
            Event::REMOVE_POD_SANDBOX,
            req.pod.get_or_default(),
            api::Container::default_instance(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        PluginAdapter::create_container(self, &req).await.map_err(handler_error)
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        self.notify(
            Event::POST_CREATE_CONTAINER,
            req.pod.get_or_default(),
            req.container.get_or_default(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        self.notify(
            Event::START_CONTAINER,
            req.pod.get_or_default(),
            req.container.get_or_default(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        self.notify(
            Event::POST_START_CONTAINER,
            req.pod.get_or_default(),
            req.container.get_or_default(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        PluginAdapter::update_container(self, &req).await.map_err(handler_error)
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        self.notify(
            Event::POST_UPDATE_CONTAINER,
            req.pod.get_or_default(),
            req.container.get_or_default(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        PluginAdapter::stop_container(self, &req).await.map_err(handler_error)
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.notify(
            Event::REMOVE_CONTAINER,
            req.pod.get_or_default(),
            req.container.get_or_default(),
        )
        .await
        .map_err(handler_error)?;
        Ok(Default::default())
    }

    async fn state_change(&self, _ctx: &TtrpcContext, req: api::StateChangeEvent) -> ttrpc::Result<api::Empty> {
        let event = req.event.enum_value_or_default();
        if !NOTIFICATIONS.is_set(event) {
            return Err(status(
                ttrpc::Code::INVALID_ARGUMENT,
                format!("StateChange cannot carry event {event:?}"),
            ));
        }
        self.notify(event, req.pod.get_or_default(), req.container.get_or_default())
            .await
            .map_err(handler_error)?;
        Ok(api::Empty::new())
    }

    async fn validate_container_adjustment(
        &self,
        _ctx: &TtrpcContext,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        Ok(PluginAdapter::validate_container_adjustment(self, &req).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_are_the_events_without_reply_content() {
        let with_reply = [
            Event::UPDATE_POD_SANDBOX,
            Event::CREATE_CONTAINER,
            Event::UPDATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::VALIDATE_CONTAINER_ADJUSTMENT,
        ];
        for e in crate::events::ALL_EVENTS {
            assert_eq!(NOTIFICATIONS.is_set(e), !with_reply.contains(&e), "{e:?}");
        }
    }

    struct Refuses;

    #[async_trait]
    impl Plugin for Refuses {
        async fn configure(&self, _req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
            Err("no config".into())
        }
        async fn validate_container_adjustment(
            &self,
            _req: &api::ValidateContainerAdjustmentRequest,
        ) -> Result<(), BoxError> {
            Err("too much".into())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn hooks_see_configure_and_shutdown_and_a_validation_error_is_a_rejection() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let seen = Arc::new(Mutex::new(None));
        let down = Arc::new(AtomicBool::new(false));
        let (s, d) = (seen.clone(), down.clone());
        let adapter = PluginAdapter::new(Arc::new(Refuses), EventMask::VALID)
            .with_configure_hook(move |_, r| *s.lock().unwrap() = Some(r.map_err(|e| e.to_string())))
            .with_shutdown_hook(move || d.store(true, Ordering::SeqCst));
        assert!(adapter.configure(&api::ConfigureRequest::new()).await.is_err());
        assert_eq!(*seen.lock().unwrap(), Some(Err("no config".to_string())));
        let v = adapter
            .validate_container_adjustment(&api::ValidateContainerAdjustmentRequest::new())
            .await;
        assert!(v.reject);
        assert_eq!(v.reason, "too much");
        adapter.shutdown().await;
        assert!(down.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_split_sync_reaches_the_plugin_once() {
        struct Count(Mutex<Vec<usize>>);
        #[async_trait]
        impl Plugin for Count {
            async fn synchronize(
                &self,
                pods: &[api::PodSandbox],
                _containers: &[api::Container],
            ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
                self.0.lock().unwrap().push(pods.len());
                Ok(Vec::new())
            }
        }
        let plugin = Arc::new(Count(Mutex::new(Vec::new())));
        let adapter = PluginAdapter::new(plugin.clone(), EventMask::VALID);
        let part = |more| api::SynchronizeRequest {
            pods: vec![api::PodSandbox::new()],
            more,
            ..Default::default()
        };
        assert!(adapter.synchronize(part(true)).await.unwrap().more);
        assert!(!adapter.synchronize(part(false)).await.unwrap().more);
        assert_eq!(*plugin.0.lock().unwrap(), [2]);
    }
}
