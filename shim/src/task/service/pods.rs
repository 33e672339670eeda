//! Pods as NRI sees them, and the events that must come exactly once.
//!
//! - RunPodSandbox once per pod, before its first container: from the
//!   sandbox container's create, or for a container whose sandbox this
//!   shim does not run (or a plain `ctr run` container, its own pod), from
//!   that container's create.
//! - StopContainer (StopPodSandbox for a sandbox) once per task, whichever
//!   comes first: a stopping kill, the exit, or the delete.
//! - RemovePodSandbox when the sandbox (or the own-pod container) is deleted.

use std::{collections::HashMap, sync::Arc, sync::Mutex};

use nri_adaptation::api;
use protobuf::MessageField;

use super::{Service, process::Task};
use crate::{
    error::{Result, ShimError},
    nri::{Nri, Role},
    sync::lock,
};

#[derive(Debug, Clone)]
struct PodRecord {
    pod: api::PodSandbox,
    stopped: bool,
}

/// The pods the plugins were told about, by pod id.
#[derive(Default)]
pub struct Pods(Mutex<HashMap<String, PodRecord>>);

impl Pods {
    /// The pod `id` (empty when unknown).
    pub fn get(&self, id: &str) -> api::PodSandbox {
        lock(&self.0).get(id).map(|p| p.pod.clone()).unwrap_or_default()
    }

    /// Every known pod.
    pub fn all(&self) -> Vec<api::PodSandbox> {
        lock(&self.0).values().map(|p| p.pod.clone()).collect()
    }

    fn known(&self, id: &str) -> Option<api::PodSandbox> {
        lock(&self.0).get(id).map(|p| p.pod.clone())
    }

    fn insert(&self, pod: &api::PodSandbox) {
        lock(&self.0).insert(
            pod.id.clone(),
            PodRecord {
                pod: pod.clone(),
                stopped: false,
            },
        );
    }

    /// Every pod with whether it was stopped (an upgrade's snapshot).
    pub fn snapshot(&self) -> Vec<(api::PodSandbox, bool)> {
        lock(&self.0).values().map(|p| (p.pod.clone(), p.stopped)).collect()
    }

    /// Puts back a pod of [`Pods::snapshot`].
    pub fn restore(&self, pod: api::PodSandbox, stopped: bool) {
        lock(&self.0).insert(pod.id.clone(), PodRecord { pod, stopped });
    }

    /// Forgets pod `id`.
    pub fn remove(&self, id: &str) {
        lock(&self.0).remove(id);
    }

    /// Marks pod `id` stopped; true the first time.
    fn stop(&self, id: &str) -> bool {
        lock(&self.0)
            .get_mut(id)
            .is_some_and(|p| !std::mem::replace(&mut p.stopped, true))
    }
}

impl Service {
    /// The pod `id` as announced (empty when unknown).
    pub(super) fn pod(&self, id: &str) -> api::PodSandbox {
        self.inner.pods.get(id)
    }

    /// The pod for a task being created, announcing it with RunPodSandbox
    /// the first time. Returns the pod and whether this call announced it
    /// (so a failed create takes it back).
    ///
    /// # Errors
    /// [`ShimError::AlreadyExists`] for a second sandbox of one pod; the
    /// plugins' error when they refuse the pod.
    pub(super) async fn ensure_pod(
        &self,
        nri: &Arc<dyn Nri>,
        role: Role,
        pod: api::PodSandbox,
    ) -> Result<(api::PodSandbox, bool)> {
        match (role, self.inner.pods.known(&pod.id)) {
            (Role::Container, Some(p)) => Ok((p, false)),
            (Role::Sandbox, Some(_)) => Err(ShimError::AlreadyExists(format!(
                "pod sandbox {} already exists",
                pod.id
            ))),
            (_, _) => {
                crate::waits::timed("NRI RunPodSandbox", nri.run_pod_sandbox(&pod)).await?;
                self.inner.pods.insert(&pod);
                Ok((pod, true))
            }
        }
    }

    /// Takes back a pod announced by a create that failed.
    pub(super) async fn forget_pod(&self, nri: &Arc<dyn Nri>, pod: &api::PodSandbox) {
        let _ = nri.stop_pod_sandbox(pod).await;
        let _ = nri.remove_pod_sandbox(pod).await;
        self.inner.pods.remove(&pod.id);
    }

    /// Sends NRI StopContainer (or StopPodSandbox for a sandbox) once.
    pub(super) async fn nri_stopped(&self, task: &Arc<Task>) {
        let mut sent = task.stopped_nri.lock().await;
        if *sent {
            return;
        }
        *sent = true;
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        match task.role {
            Role::Sandbox => {
                if self.inner.pods.stop(&task.pod_id)
                    && let Err(e) = crate::waits::timed("NRI StopPodSandbox", nri.stop_pod_sandbox(&pod)).await
                {
                    tracing::warn!(pod = %pod.id, error = %crate::error::chain(&e), "NRI StopPodSandbox failed");
                }
            }
            Role::Container | Role::OwnPod => {
                let stop = nri.stop_container(api::StopContainerRequest {
                    pod: MessageField::some(pod),
                    container: MessageField::some(task.nri_container()),
                    ..Default::default()
                });
                match crate::waits::timed("NRI StopContainer", stop).await {
                    Ok(updates) if !updates.is_empty() => {
                        self.apply_updates(updates).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "NRI StopContainer failed")
                    }
                }
            }
        }
    }

    /// RemoveContainer for a deleted container (not a sandbox), after its
    /// StopContainer; the pod's end is [`Service::nri_pod_removed`].
    pub(super) async fn nri_removed(&self, task: &Arc<Task>) {
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        if task.role != Role::Sandbox
            && let Err(e) =
                crate::waits::timed("NRI RemoveContainer", nri.remove_container(&pod, &task.nri_container())).await
        {
            tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "NRI RemoveContainer failed");
        }
    }

    /// The pod's end when its sandbox (or own-pod container) is deleted.
    pub(super) async fn nri_pod_removed(&self, task: &Arc<Task>) {
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        match task.role {
            Role::Sandbox => {
                if let Err(e) = crate::waits::timed("NRI RemovePodSandbox", nri.remove_pod_sandbox(&pod)).await {
                    tracing::warn!(pod = %pod.id, error = %crate::error::chain(&e), "NRI RemovePodSandbox failed");
                }
                self.inner.pods.remove(&task.pod_id);
            }
            Role::OwnPod => self.forget_pod(&nri, &pod).await,
            Role::Container => {}
        }
    }
}
