//! How requests reach a plugin: one [`Link`] trait, implemented by
//! [`TtrpcLink`] for plugin processes and [`BuiltinLink`] for plugins in the
//! runtime's process. The plugin record ([`super::Plugin`]) calls every
//! request through the trait and never asks which kind it holds.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use nri_proto::{
    api::{self, Event},
    api_ttrpc,
    events::{EventMask, event_name},
    mux::Mux,
    plugin::{BoxError, PluginAdapter},
    sync::lock,
};
use protobuf::Message;
use ttrpc::asynchronous::Server;

use crate::error::PluginError;

/// One connection to a plugin. Each method sends one request with the
/// request timeout the link was built with and classifies its failure;
/// whether the plugin record is still open is checked by the caller.
#[async_trait]
pub(crate) trait Link: Send + Sync + 'static {
    /// Configure.
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<api::ConfigureResponse, PluginError>;
    /// Synchronize with the runtime's state, one request timeout for the
    /// whole exchange; the updates of the final reply.
    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError>;
    /// One of the notification events (`nri_proto::plugin::NOTIFICATIONS`).
    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError>;
    /// UpdatePodSandbox.
    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError>;
    /// CreateContainer.
    async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError>;
    /// UpdateContainer.
    async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError>;
    /// StopContainer.
    async fn stop_container(&self, req: &api::StopContainerRequest) -> Result<api::StopContainerResponse, PluginError>;
    /// ValidateContainerAdjustment.
    async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError>;
    /// Asks the plugin to shut down, waiting at most `wait` (best effort).
    async fn shutdown(&self, wait: Duration);
    /// Whether the other end went away on its own.
    fn is_closed(&self) -> bool;
    /// Waits until the other end goes away on its own (never, in process).
    async fn closed(&self);
    /// Drops the connection.
    async fn close(&self);
}

/// A plugin process: ttrpc over the multiplexed connection.
pub(crate) struct TtrpcLink {
    /// `IDX-NAME`, for logs.
    name: String,
    client: api_ttrpc::PluginClient,
    mux: Mux,
    /// Serves the Runtime service to the plugin; shut down on close.
    server: tokio::sync::Mutex<Option<Server>>,
    request_timeout: Duration,
    /// Sticky once the plugin answered a dedicated event RPC with Unimplemented.
    state_change_fallback: AtomicBool,
    deprecation_warned: Mutex<EventMask>,
}

impl TtrpcLink {
    pub(crate) fn new(
        name: String,
        client: api_ttrpc::PluginClient,
        mux: Mux,
        server: Server,
        request_timeout: Duration,
    ) -> Self {
        TtrpcLink {
            name,
            client,
            mux,
            server: tokio::sync::Mutex::new(Some(server)),
            request_timeout,
            state_change_fallback: AtomicBool::new(false),
            deprecation_warned: Mutex::new(EventMask::default()),
        }
    }

    /// One request with the request timeout; errors classified.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, PluginError>
    where
        F: FnOnce(api_ttrpc::PluginClient, ttrpc::context::Context) -> Fut,
        Fut: Future<Output = ttrpc::Result<T>>,
    {
        let timeout = self.request_timeout;
        // The deadline travels with the request (the plugin sees it) and
        // ttrpc enforces it locally: one timer per request.
        let ctx = ttrpc::context::with_timeout(timeout.as_nanos() as i64);
        let err = match f(self.client.clone(), ctx).await {
            Ok(v) => return Ok(v),
            Err(e) => PluginError::from_ttrpc_request(e, timeout),
        };
        if self.mux.is_closed() && err.is_fatal() {
            return Err(PluginError::Closed);
        }
        Err(err)
    }

    fn warn_deprecated(&self, event: Event) {
        let mut warned = lock(&self.deprecation_warned);
        if !warned.is_set(event) {
            warned.set(event);
            tracing::warn!(
                plugin = %self.name,
                event = event_name(event),
                "plugin uses the deprecated StateChange API for this event; rebuild it against NRI v0.12 or later"
            );
        }
    }

    async fn notify_dedicated(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        let pod = protobuf::MessageField::some(pod.clone());
        let ctr = protobuf::MessageField::from_option(container.cloned());
        macro_rules! pod_event {
            ($ty:ident, $method:ident) => {{
                let req = api::$ty {
                    pod,
                    ..Default::default()
                };
                self.call(|c, ctx| async move { c.$method(ctx, &req).await })
                    .await
                    .map(|_| ())
            }};
        }
        macro_rules! ctr_event {
            ($ty:ident, $method:ident) => {{
                let req = api::$ty {
                    pod,
                    container: ctr,
                    ..Default::default()
                };
                self.call(|c, ctx| async move { c.$method(ctx, &req).await })
                    .await
                    .map(|_| ())
            }};
        }
        match event {
            Event::RUN_POD_SANDBOX => pod_event!(RunPodSandboxRequest, run_pod_sandbox),
            Event::POST_UPDATE_POD_SANDBOX => {
                pod_event!(PostUpdatePodSandboxRequest, post_update_pod_sandbox)
            }
            Event::STOP_POD_SANDBOX => pod_event!(StopPodSandboxRequest, stop_pod_sandbox),
            Event::REMOVE_POD_SANDBOX => pod_event!(RemovePodSandboxRequest, remove_pod_sandbox),
            Event::POST_CREATE_CONTAINER => {
                ctr_event!(PostCreateContainerRequest, post_create_container)
            }
            Event::START_CONTAINER => ctr_event!(StartContainerRequest, start_container),
            Event::POST_START_CONTAINER => {
                ctr_event!(PostStartContainerRequest, post_start_container)
            }
            Event::POST_UPDATE_CONTAINER => {
                ctr_event!(PostUpdateContainerRequest, post_update_container)
            }
            Event::REMOVE_CONTAINER => ctr_event!(RemoveContainerRequest, remove_container),
            other => Err(PluginError::Protocol(format!("{other:?} is not a notification event"))),
        }
    }

    async fn synchronize_chunks(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
        limit: usize,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let (mut pods_left, mut ctrs_left) = (pods, containers);
        let (mut pods_per, mut ctrs_per) = (pods.len(), containers.len());
        // Each object's encoded size, once: a chunk is measured from these
        // and cloned only when it is sent (measuring clones of the whole
        // set was most of a large node's sync time).
        let pod_sizes = ChunkSizes::of(pods);
        let ctr_sizes = ChunkSizes::of(containers);
        let (mut pods_at, mut ctrs_at) = (0, 0);
        loop {
            let more = pods_left.len() > pods_per || ctrs_left.len() > ctrs_per;
            let size = (pod_sizes.range(pods_at, pods_per)
                + ctr_sizes.range(ctrs_at, ctrs_per)
                + if more { 2 } else { 0 }) as usize;
            if size > limit {
                (pods_per, ctrs_per) = split_counts(pods_per, ctrs_per, size, limit)
                    .ok_or_else(|| PluginError::Protocol(format!(
                        "failed to synchronize plugin with split messages: {size} bytes for {} objects exceed the {limit}-byte limit",
                        pods_per + ctrs_per
                    )))?;
                // Make progress whatever the rounding did.
                pods_per = pods_per.min(pods_left.len());
                ctrs_per = ctrs_per.min(ctrs_left.len());
                if pods_per + ctrs_per == 0 {
                    if !pods_left.is_empty() {
                        pods_per = 1;
                    } else {
                        ctrs_per = 1;
                    }
                }
                continue;
            }
            let req = api::SynchronizeRequest {
                pods: pods_left[..pods_per].to_vec(),
                containers: ctrs_left[..ctrs_per].to_vec(),
                more,
                ..Default::default()
            };
            debug_assert_eq!(req.compute_size() as usize, size, "sync chunk size");
            tracing::debug!(
                plugin = %self.name,
                pods = req.pods.len(),
                containers = req.containers.len(),
                more = req.more,
                bytes = size,
                "sending sync message"
            );
            let rsp = self
                .call(|c, ctx| async move { c.synchronize(ctx, &req).await })
                .await?;
            if !more {
                return Ok(rsp.update);
            }
            if !rsp.update.is_empty() || rsp.more != more {
                return Err(PluginError::Protocol(
                    "plugin does not handle split sync requests".into(),
                ));
            }
            pods_left = &pods_left[pods_per..];
            ctrs_left = &ctrs_left[ctrs_per..];
            (pods_at, ctrs_at) = (pods_at + pods_per, ctrs_at + ctrs_per);
            pods_per = pods_per.min(pods_left.len());
            ctrs_per = ctrs_per.min(ctrs_left.len());
            if pods_per + ctrs_per == 0 {
                // Rounding left one kind at zero per message: send the rest.
                pods_per = pods_left.len().min(4.max(pods_per));
                ctrs_per = ctrs_left.len().min(4.max(ctrs_per));
            }
        }
    }
}

#[async_trait]
impl Link for TtrpcLink {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<api::ConfigureResponse, PluginError> {
        self.call(|c, ctx| async move { c.configure(ctx, req).await }).await
    }

    /// Split into chunks when one message would exceed the ttrpc limit.
    ///
    /// Chunk sizing follows NRI (`recalcObjsPerSyncMsg`): when a message is
    /// too big, scale pods and containers per message by
    /// `min(0.9, limit / size)`; never fewer than 8 objects per message
    /// (4 pods + 4 containers); already at 8 and still too big fails. The
    /// size is measured before sending instead of waiting for ttrpc to
    /// refuse it. Intermediate replies must echo `more = true` and carry no
    /// updates.
    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let timeout = self.request_timeout;
        match tokio::time::timeout(timeout, self.synchronize_chunks(pods, containers, SYNC_MESSAGE_LIMIT)).await {
            Ok(r) => r,
            Err(_) => Err(PluginError::Timeout(timeout)),
        }
    }

    /// The dedicated request of the event, falling back to StateChange for
    /// plugins that do not implement it (sticky after the first
    /// Unimplemented, as upstream).
    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        if !self.state_change_fallback.load(Ordering::SeqCst) {
            match self.notify_dedicated(event, pod, container).await {
                Err(e) if e.is_unimplemented() => {
                    self.state_change_fallback.store(true, Ordering::SeqCst);
                }
                other => return other,
            }
        }
        self.warn_deprecated(event);
        let mut req = api::StateChangeEvent::new();
        req.event = event.into();
        req.pod = protobuf::MessageField::some(pod.clone());
        if let Some(c) = container {
            req.container = protobuf::MessageField::some(c.clone());
        }
        self.call(|c, ctx| async move { c.state_change(ctx, &req).await })
            .await
            .map(|_| ())
    }

    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError> {
        self.call(|c, ctx| async move { c.update_pod_sandbox(ctx, req).await })
            .await
            .map(|_| ())
    }

    async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        self.call(|c, ctx| async move { c.create_container(ctx, req).await })
            .await
    }

    async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        self.call(|c, ctx| async move { c.update_container(ctx, req).await })
            .await
    }

    async fn stop_container(&self, req: &api::StopContainerRequest) -> Result<api::StopContainerResponse, PluginError> {
        self.call(|c, ctx| async move { c.stop_container(ctx, req).await })
            .await
    }

    async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError> {
        self.call(|c, ctx| async move { c.validate_container_adjustment(ctx, req).await })
            .await
    }

    async fn shutdown(&self, wait: Duration) {
        let ctx = ttrpc::context::with_timeout(wait.as_nanos() as i64);
        let _ = tokio::time::timeout(wait, self.client.shutdown(ctx, &api::Empty::new())).await;
    }

    fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    async fn closed(&self) {
        self.mux.closed().await;
    }

    async fn close(&self) {
        self.mux.close();
        if let Some(mut server) = self.server.lock().await.take() {
            let _ = server.shutdown().await;
        }
    }
}

/// A plugin in the runtime's process, called directly (no socket, no
/// serialization) through the same adapter a plugin process serves over
/// ttrpc, so it sees the same calls and defaults.
pub(crate) struct BuiltinLink {
    adapter: PluginAdapter,
    request_timeout: Duration,
}

impl BuiltinLink {
    /// `adapter` carries the subscription given by the runtime, used when
    /// the plugin's configure returns an empty mask.
    pub(crate) fn new(adapter: PluginAdapter, request_timeout: Duration) -> Self {
        BuiltinLink {
            adapter,
            request_timeout,
        }
    }

    /// One call with the request timeout; a handler error is the plugin's
    /// own verdict, like an error status from a plugin process.
    async fn timed<T>(&self, fut: impl Future<Output = Result<T, BoxError>>) -> Result<T, PluginError> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(PluginError::Returned {
                code: ttrpc::Code::UNKNOWN,
                message: e.to_string(),
            }),
            Err(_) => Err(PluginError::Timeout(self.request_timeout)),
        }
    }
}

#[async_trait]
impl Link for BuiltinLink {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<api::ConfigureResponse, PluginError> {
        self.timed(self.adapter.configure(req)).await
    }

    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let req = api::SynchronizeRequest {
            pods: pods.to_vec(),
            containers: containers.to_vec(),
            ..Default::default()
        };
        self.timed(self.adapter.synchronize(req)).await.map(|r| r.update)
    }

    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), PluginError> {
        let container = container.unwrap_or(api::Container::default_instance());
        self.timed(self.adapter.notify(event, pod, container)).await
    }

    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), PluginError> {
        self.timed(self.adapter.update_pod_sandbox(req)).await.map(|_| ())
    }

    async fn create_container(
        &self,
        req: &api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        self.timed(self.adapter.create_container(req)).await
    }

    async fn update_container(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, PluginError> {
        self.timed(self.adapter.update_container(req)).await
    }

    async fn stop_container(&self, req: &api::StopContainerRequest) -> Result<api::StopContainerResponse, PluginError> {
        self.timed(self.adapter.stop_container(req)).await
    }

    async fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<api::ValidateContainerAdjustmentResponse, PluginError> {
        self.timed(async { Ok(self.adapter.validate_container_adjustment(req).await) })
            .await
    }

    async fn shutdown(&self, wait: Duration) {
        let _ = tokio::time::timeout(wait, self.adapter.shutdown()).await;
    }

    fn is_closed(&self) -> bool {
        false
    }

    async fn closed(&self) {
        std::future::pending::<()>().await;
    }

    async fn close(&self) {}
}

/// The runtime's end of the Plugin service connection (conn 1), the only
/// way to reach the plugin. ttrpc drops it when it gives the connection up,
/// as after a request's deadline elapsed in the middle of its write (a
/// plugin that stopped reading): part of a message is then on the stream,
/// so nothing more can be sent. Dropping it closes the whole trunk, and the
/// plugin is dropped at once rather than failing one more request, whether
/// that request's error said timeout or transport (which of the two ttrpc
/// reports is a race).
pub(crate) struct ClientConn {
    conn: nri_proto::mux::MuxConn,
}

impl ClientConn {
    pub(crate) fn new(conn: nri_proto::mux::MuxConn) -> Self {
        ClientConn { conn }
    }
}

impl Drop for ClientConn {
    fn drop(&mut self) {
        self.conn.mux().close();
    }
}

impl tokio::io::AsyncRead for ClientConn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.conn).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ClientConn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.conn).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.conn).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

/// Largest encoded SynchronizeRequest sent in one message: the 4 MiB ttrpc
/// limit minus room for the ttrpc request envelope (service and method
/// names, timeout, metadata).
pub(crate) const SYNC_MESSAGE_LIMIT: usize = nri_proto::TTRPC_MAX_MESSAGE - 4096;

/// NRI's `recalcObjsPerSyncMsg`: new per-message counts after a message of
/// `size` bytes exceeded `limit`. `None` when already at the minimum.
/// Prefix sums of the bytes objects take as elements of a repeated
/// message field (tag, length varint, body), for sizing sync chunks.
struct ChunkSizes(Vec<u64>);

impl ChunkSizes {
    fn of<M: protobuf::Message>(objs: &[M]) -> ChunkSizes {
        let mut sums = Vec::with_capacity(objs.len() + 1);
        let mut total = 0u64;
        sums.push(0);
        for o in objs {
            let body = o.compute_size();
            // Field numbers 1 and 2: a one-byte tag.
            total += 1 + protobuf::rt::compute_raw_varint64_size(body) + body;
            sums.push(total);
        }
        ChunkSizes(sums)
    }

    /// Bytes of the `n` objects from index `at`.
    fn range(&self, at: usize, n: usize) -> u64 {
        self.0[at + n] - self.0[at]
    }
}

pub(crate) fn split_counts(pods: usize, ctrs: usize, size: usize, limit: usize) -> Option<(usize, usize)> {
    const MIN_OBJS_PER_MSG: usize = 8;
    if pods + ctrs <= MIN_OBJS_PER_MSG || size <= limit || limit == 0 {
        return None;
    }
    let factor = (limit as f64 / size as f64).min(0.9);
    let (p, c) = ((pods as f64 * factor) as usize, (ctrs as f64 * factor) as usize);
    if p + c < MIN_OBJS_PER_MSG {
        Some((MIN_OBJS_PER_MSG / 2, MIN_OBJS_PER_MSG / 2))
    } else {
        Some((p, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_counts_follows_reference() {
        // 10 MiB for 50 objects under a 4 MiB limit: factor 0.4.
        assert_eq!(split_counts(10, 40, 10 << 20, 4 << 20), Some((4, 16)));
        // Factor never above 0.9.
        assert_eq!(split_counts(100, 100, 101, 100), Some((90, 90)));
        // Below the minimum: 4 + 4.
        assert_eq!(split_counts(10, 10, 100 << 20, 1 << 20), Some((4, 4)));
        // Already at the minimum: give up.
        assert_eq!(split_counts(4, 4, 10 << 20, 4 << 20), None);
        assert_eq!(split_counts(2, 3, 10 << 20, 4 << 20), None);
        // Not oversized at all.
        assert_eq!(split_counts(10, 10, 100, 100), None);
    }
}
