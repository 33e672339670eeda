//! A running plugin's handle: container updates, waiting and stopping.

use std::{sync::Arc, time::Duration};

use nri_proto::{api, api_ttrpc, mux::Mux};
use tokio::sync::watch;

use crate::{StubError, stub::RuntimeInfo};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Shutdown,
    Stopped,
    Closed,
}

/// A running plugin: ask for container updates, wait for the end, stop.
#[derive(Clone)]
pub struct StubHandle {
    pub(crate) inner: Arc<HandleInner>,
}

pub(crate) struct HandleInner {
    pub(crate) name: String,
    pub(crate) runtime: api_ttrpc::RuntimeClient,
    pub(crate) mux: Mux,
    pub(crate) info: RuntimeInfo,
    pub(crate) state: watch::Sender<State>,
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
            .map_err(|e| StubError::Update(crate::RpcError(e)))?;
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
