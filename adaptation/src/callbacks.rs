//! The runtime's callbacks: what the adaptation asks of the runtime (its
//! pods and containers for Synchronize, applying updates, evicting) and
//! what a failed callback means (logged; plugins are not told).

use std::{pin::Pin, sync::Arc};

use nri_proto::api;

use crate::{
    error::BoxError,
    observe::{Observer, Outcome, Rejection},
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The runtime's current pods and containers, as sent to plugins in
/// Synchronize.
#[derive(Debug, Clone, Default)]
pub struct RuntimeState {
    /// Every pod sandbox the runtime knows.
    pub pods: Vec<api::PodSandbox>,
    /// Every container the runtime knows.
    pub containers: Vec<api::Container>,
}

pub(crate) type SyncFn = Arc<dyn Fn() -> BoxFuture<Result<RuntimeState, BoxError>> + Send + Sync>;
pub(crate) type UpdateFn =
    Arc<dyn Fn(Vec<api::ContainerUpdate>) -> BoxFuture<Result<Vec<api::ContainerUpdate>, BoxError>> + Send + Sync>;
pub(crate) type EvictFn = Arc<dyn Fn(api::ContainerEviction) -> BoxFuture<Result<(), BoxError>> + Send + Sync>;

/// The callbacks an adaptation was built with.
pub(crate) struct Callbacks {
    pub sync: SyncFn,
    pub update: UpdateFn,
    pub evict: Option<EvictFn>,
    /// Told about plugin requests and refused answers, if the runtime asked.
    pub observer: Option<Arc<dyn Observer>>,
}

impl Callbacks {
    /// Tells the observer how `plugin`'s `request` ended.
    pub fn observe(&self, plugin: &str, request: &'static str, elapsed: std::time::Duration, outcome: Outcome) {
        if let Some(o) = &self.observer {
            o.request(plugin, request, elapsed, outcome);
        }
    }

    /// Tells the observer that `plugin`'s answer was refused.
    pub fn rejected(&self, plugin: &str, rejection: Rejection) {
        if let Some(o) = &self.observer {
            o.rejected(plugin, rejection);
        }
    }

    /// The runtime's pods and containers.
    pub async fn state(&self) -> Result<RuntimeState, BoxError> {
        (self.sync)().await
    }

    /// Applies updates plugins asked for in Synchronize; failures are
    /// logged, as there is no request to fail.
    pub async fn apply_updates(&self, updates: Vec<api::ContainerUpdate>) {
        if updates.is_empty() {
            return;
        }
        match (self.update)(updates).await {
            Ok(failed) if !failed.is_empty() => {
                let ids: Vec<_> = failed.iter().map(|u| u.container_id.as_str()).collect();
                tracing::warn!(containers = ?ids, "runtime failed to apply NRI container updates");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(
                error = &*e as &dyn std::error::Error,
                "runtime failed to apply NRI container updates"
            ),
        }
    }

    /// Unsolicited UpdateContainers from `plugin`: evictions first, then
    /// the updates; returns the updates that failed.
    pub async fn update_containers(
        &self,
        plugin: &str,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.evict(plugin, evict).await;
        if update.is_empty() {
            return Ok(Vec::new());
        }
        (self.update)(update).await
    }

    /// Passes `plugin`'s evictions to the runtime, or logs that it cannot
    /// evict.
    pub async fn evict(&self, plugin: &str, evictions: Vec<api::ContainerEviction>) {
        for ev in evictions {
            match &self.evict {
                Some(f) => {
                    tracing::info!(plugin, container = %ev.container_id, reason = %ev.reason, "NRI plugin evicts container");
                    let id = ev.container_id.clone();
                    if let Err(e) = f(ev).await {
                        tracing::error!(plugin, container = %id, error = &*e as &dyn std::error::Error, "failed to evict container");
                    }
                }
                None => {
                    tracing::warn!(plugin, container = %ev.container_id, "runtime cannot evict containers; eviction ignored")
                }
            }
        }
    }
}
