//! [`PluginAdapter`]: requests of the `Plugin` service as calls of a
//! [`Plugin`], directly (request methods) or as a ttrpc service.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use protobuf::Message as _;
use ttrpc::asynchronous::TtrpcContext;

use super::{BoxError, NOTIFICATIONS, Plugin};
use crate::{
    api::{self, Event},
    api_ttrpc,
    events::EventMask,
};

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
            let mut collected = crate::sync::lock(&self.sync);
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
                reason: wire_text(&*e),
                ..Default::default()
            },
        }
    }
}

fn status(code: ttrpc::Code, message: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

fn handler_error(e: BoxError) -> ttrpc::Error {
    status(ttrpc::Code::UNKNOWN, wire_text(&*e))
}

/// The text a handler's error travels as: its message, then each cause,
/// `: `-separated. `to_string` alone would drop an `anyhow` context's cause
/// or a typed error's source, and the runtime only ever sees this text.
fn wire_text(e: &(dyn std::error::Error + 'static)) -> String {
    let causes = std::iter::successors(Some(e), |e| e.source());
    causes.map(|e| e.to_string()).collect::<Vec<_>>().join(": ")
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
