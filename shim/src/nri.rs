//! What NRI plugins see of the shim's containers, and the seam through
//! which the task service talks to NRI.
//!
//! Pods and containers come from the bundle's `config.json` and its CRI
//! annotations (`io.kubernetes.cri.*`, set by containerd's CRI plugin and
//! emulable with `ctr run --annotation`):
//!
//! | `container-type` | role | NRI events |
//! |---|---|---|
//! | `sandbox` | the pod's sandbox (pause) container | RunPodSandbox, StopPodSandbox, RemovePodSandbox |
//! | `container` | a container of pod `sandbox-id` | CreateContainer ... RemoveContainer |
//! | absent (plain `ctr run`) | a container that is its own pod (pod id = container id) | both |

use async_trait::async_trait;
use nri_adaptation::{Adaptation, Error, api};
use oci_spec::runtime::Spec;

/// CRI annotation: `sandbox` or `container`.
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// CRI annotation: the pod's sandbox id.
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// CRI annotation: pod name.
pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
/// CRI annotation: pod namespace.
pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// CRI annotation: pod uid.
pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
/// CRI annotation: container name.
pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
/// CRI annotation: image name.
pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

/// A task's part in its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The pod's sandbox container: drives the pod events, is no NRI container.
    Sandbox,
    /// A container of a pod whose sandbox is another task.
    Container,
    /// A container without CRI annotations: its own pod.
    OwnPod,
}

/// Who a task is, for NRI.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// Role in the pod.
    pub role: Role,
    /// The pod (as much as the spec tells).
    pub pod: api::PodSandbox,
    /// Container name.
    pub name: String,
}

fn ann<'a>(spec: &'a Spec, key: &str) -> Option<&'a str> {
    spec.annotations()
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Classifies task `id` of containerd namespace `namespace` by its spec.
pub fn identify(namespace: &str, id: &str, spec: &Spec) -> Identity {
    let kind = ann(spec, CONTAINER_TYPE);
    let cgroups_path = spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    match kind {
        Some("sandbox") | Some("container") => {
            let sandbox_id = ann(spec, SANDBOX_ID).unwrap_or(id).to_string();
            let mut pod = api::PodSandbox {
                id: sandbox_id.clone(),
                name: ann(spec, SANDBOX_NAME).unwrap_or(&sandbox_id).to_string(),
                namespace: ann(spec, SANDBOX_NAMESPACE).unwrap_or(namespace).to_string(),
                uid: ann(spec, SANDBOX_UID).unwrap_or_default().to_string(),
                ..Default::default()
            };
            let role = if kind == Some("sandbox") {
                // The sandbox's spec is the pod's: annotations and cgroup parent.
                if let Some(a) = spec.annotations() {
                    pod.annotations = a.clone();
                }
                let linux = pod.linux.mut_or_insert_default();
                linux.cgroups_path = cgroups_path.clone();
                linux.cgroup_parent = std::path::Path::new(&cgroups_path)
                    .parent()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Role::Sandbox
            } else {
                Role::Container
            };
            let name = ann(spec, CONTAINER_NAME).unwrap_or(id).to_string();
            Identity { role, pod, name }
        }
        _ => Identity {
            role: Role::OwnPod,
            pod: api::PodSandbox {
                id: id.to_string(),
                name: id.to_string(),
                namespace: namespace.to_string(),
                uid: format!("{namespace}/{id}"),
                annotations: spec.annotations().clone().unwrap_or_default(),
                ..Default::default()
            },
            name: id.to_string(),
        },
    }
}

/// What CreateContainer gave: the merged response and the plugins' part
/// in it.
#[derive(Debug, Clone, Default)]
pub struct Created {
    /// The merged adjustment and updates.
    pub response: api::CreateContainerResponse,
    /// Each plugin's answer and the field owners.
    pub report: nri_adaptation::CreateReport,
}

/// The NRI calls the task service makes. Implemented by the real
/// [`Adaptation`] and by [`NoNri`]; tests may substitute their own.
#[async_trait]
pub trait Nri: Send + Sync + 'static {
    /// RunPodSandbox.
    async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error>;
    /// StopPodSandbox.
    async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error>;
    /// RemovePodSandbox.
    async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error>;
    /// CreateContainer: the merged adjustment and updates of other
    /// containers, and who changed what (for the audit trail).
    async fn create_container(&self, req: api::CreateContainerRequest) -> Result<Created, Error>;
    /// PostCreateContainer.
    async fn post_create_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error>;
    /// StartContainer.
    async fn start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error>;
    /// PostStartContainer.
    async fn post_start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error>;
    /// UpdateContainer: merged updates, the target's last.
    async fn update_container(&self, req: api::UpdateContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error>;
    /// PostUpdateContainer.
    async fn post_update_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error>;
    /// StopContainer: updates for other containers.
    async fn stop_container(&self, req: api::StopContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error>;
    /// RemoveContainer.
    async fn remove_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error>;
}

#[async_trait]
impl Nri for Adaptation {
    async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        Adaptation::run_pod_sandbox(self, pod).await
    }
    async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        Adaptation::stop_pod_sandbox(self, pod).await
    }
    async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        Adaptation::remove_pod_sandbox(self, pod).await
    }
    async fn create_container(&self, req: api::CreateContainerRequest) -> Result<Created, Error> {
        let (result, report) = Adaptation::create_container_with_report(self, req).await;
        result.map(|response| Created { response, report })
    }
    async fn post_create_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error> {
        Adaptation::post_create_container(self, pod, c).await
    }
    async fn start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error> {
        Adaptation::start_container(self, pod, c).await
    }
    async fn post_start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error> {
        Adaptation::post_start_container(self, pod, c).await
    }
    async fn update_container(&self, req: api::UpdateContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        Adaptation::update_container(self, req).await
    }
    async fn post_update_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error> {
        Adaptation::post_update_container(self, pod, c).await
    }
    async fn stop_container(&self, req: api::StopContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        Adaptation::stop_container(self, req).await
    }
    async fn remove_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), Error> {
        Adaptation::remove_container(self, pod, c).await
    }
}

/// NRI disabled (`[nri] disable = true`): every event is accepted,
/// nothing is adjusted.
pub struct NoNri;

#[async_trait]
impl Nri for NoNri {
    async fn run_pod_sandbox(&self, _: &api::PodSandbox) -> Result<(), Error> {
        Ok(())
    }
    async fn stop_pod_sandbox(&self, _: &api::PodSandbox) -> Result<(), Error> {
        Ok(())
    }
    async fn remove_pod_sandbox(&self, _: &api::PodSandbox) -> Result<(), Error> {
        Ok(())
    }
    async fn create_container(&self, _: api::CreateContainerRequest) -> Result<Created, Error> {
        Ok(Created::default())
    }
    async fn post_create_container(&self, _: &api::PodSandbox, _: &api::Container) -> Result<(), Error> {
        Ok(())
    }
    async fn start_container(&self, _: &api::PodSandbox, _: &api::Container) -> Result<(), Error> {
        Ok(())
    }
    async fn post_start_container(&self, _: &api::PodSandbox, _: &api::Container) -> Result<(), Error> {
        Ok(())
    }
    async fn update_container(&self, req: api::UpdateContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        let mut u = api::ContainerUpdate::new();
        u.container_id = req.container.id.clone();
        u.linux.mut_or_insert_default().resources = req.linux_resources;
        Ok(vec![u])
    }
    async fn post_update_container(&self, _: &api::PodSandbox, _: &api::Container) -> Result<(), Error> {
        Ok(())
    }
    async fn stop_container(&self, _: api::StopContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        Ok(Vec::new())
    }
    async fn remove_container(&self, _: &api::PodSandbox, _: &api::Container) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(annotations: &[(&str, &str)]) -> Spec {
        let mut s = Spec::default();
        s.set_annotations(Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        s
    }

    #[test]
    fn cri_sandbox_container_and_plain() {
        let sb = identify(
            "k8s.io",
            "sb1",
            &spec(&[
                (CONTAINER_TYPE, "sandbox"),
                (SANDBOX_ID, "sb1"),
                (SANDBOX_NAME, "mypod"),
                (SANDBOX_NAMESPACE, "myns"),
                (SANDBOX_UID, "uid-1"),
            ]),
        );
        assert_eq!(sb.role, Role::Sandbox);
        assert_eq!(
            (
                sb.pod.id.as_str(),
                sb.pod.name.as_str(),
                sb.pod.namespace.as_str(),
                sb.pod.uid.as_str()
            ),
            ("sb1", "mypod", "myns", "uid-1")
        );
        let c = identify(
            "k8s.io",
            "c1",
            &spec(&[
                (CONTAINER_TYPE, "container"),
                (SANDBOX_ID, "sb1"),
                (SANDBOX_NAME, "mypod"),
                (CONTAINER_NAME, "app"),
            ]),
        );
        assert_eq!(
            (c.role, c.pod.id.as_str(), c.name.as_str()),
            (Role::Container, "sb1", "app")
        );
        let p = identify("default", "t1", &spec(&[("x", "y")]));
        assert_eq!((p.role, p.pod.id.as_str(), p.name.as_str()), (Role::OwnPod, "t1", "t1"));
        assert_eq!(p.pod.namespace, "default");
    }
}
