//! Task.Update (NRI UpdateContainer, then the cgroup), container updates
//! NRI sends on its own or in replies, and Task.Stats.

use std::sync::Arc;

use containerd_shim_protos::api as task_api;
use nri_adaptation::{api, convert, spec};
use protobuf::MessageField;

use super::{Service, process::Task};
use crate::{
    error::{Result, ShimError},
    nri::Role,
    sync::lock,
};

impl Service {
    /// Updates the task's resources: NRI UpdateContainer (plugins may
    /// override or add updates of other containers), then the cgroup,
    /// then PostUpdateContainer.
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] for resources that are not OCI
    /// `LinuxResources` JSON, NRI and cgroup errors.
    pub async fn update(&self, ns: &str, req: task_api::UpdateTaskRequest) -> Result<()> {
        let task = self.task(ns, &req.id)?;
        let oci: oci_spec::runtime::LinuxResources = serde_json::from_slice(&req.resources.value)
            .map_err(|e| ShimError::InvalidArgument(format!("update {}: resources: {e}", req.id)))?;
        let requested = convert::resources_from_oci(&oci);
        let pod = self.pod(&task.pod_id);
        let nri = self.nri();
        let mut updates = if task.role == Role::Sandbox {
            let mut u = api::ContainerUpdate::new();
            u.container_id = task.id.clone();
            u.linux.mut_or_insert_default().resources = MessageField::some(requested);
            vec![u]
        } else {
            nri.update_container(api::UpdateContainerRequest {
                pod: MessageField::some(pod.clone()),
                container: MessageField::some(task.nri_container()),
                linux_resources: MessageField::some(requested),
                ..Default::default()
            })
            .await?
        };
        let target = updates
            .pop()
            .ok_or_else(|| ShimError::Runtime("NRI returned no update for the container".into()))?;
        if !updates.is_empty() {
            self.apply_updates(updates).await;
        }
        self.apply_resources(&task, target.linux.resources.get_or_default())
            .await?;
        if task.role != Role::Sandbox
            && let Err(e) = nri.post_update_container(&pod, &task.nri_container()).await
        {
            tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "NRI PostUpdateContainer failed");
        }
        Ok(())
    }

    /// Writes `resources` to the task's cgroup and records them in the
    /// NRI view of the container (what plugins get at Synchronize).
    async fn apply_resources(&self, task: &Arc<Task>, resources: &api::LinuxResources) -> Result<()> {
        let oci = spec::to_oci_resources(resources)?;
        self.runner().update(task.target(), &oci).await?;
        let mut c = lock(&task.container);
        let current = c.linux.mut_or_insert_default().resources.mut_or_insert_default();
        nri_adaptation::resources::overlay(current, resources);
        Ok(())
    }

    /// Applies container updates from NRI (create/stop replies, plugin
    /// requests); returns those that failed.
    pub async fn apply_updates(&self, updates: Vec<api::ContainerUpdate>) -> Vec<api::ContainerUpdate> {
        let mut failed = Vec::new();
        for u in updates {
            let ok = match self.inner.tasks.find(&u.container_id) {
                Some(t) => match self.apply_resources(&t, u.linux.resources.get_or_default()).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(container = %u.container_id, error = %crate::error::chain(&e), "NRI container update failed");
                        false
                    }
                },
                None => false,
            };
            if !ok && !u.ignore_failure {
                failed.push(u);
            }
        }
        failed
    }

    /// Cgroup statistics in containerd's metrics type of the hierarchy
    /// (v1 or v2, see [`crate::cgroups::Metrics`]).
    ///
    /// # Errors
    /// [`ShimError::NotFound`], cgroup errors.
    pub async fn stats(&self, ns: &str, id: &str) -> Result<task_api::StatsResponse> {
        let task = self.task(ns, id)?;
        let metrics = self.runner().stats(task.target()).await?;
        Ok(task_api::StatsResponse {
            stats: MessageField::some(metrics.to_any()),
            ..Default::default()
        })
    }
}
