//! The logger plugin: every event becomes a record in `tracing` and,
//! optionally, a JSON-lines file.

use std::{
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use nri_proto::sync::lock;
use nri_stub::{BoxError, EventMask, Plugin, api};

use crate::{
    LoggerConfig, LoggerError,
    record::{Record, resources_summary},
};

/// An open JSON-lines log.
struct Sink {
    path: PathBuf,
    file: File,
}

/// The logger plugin: implements every [`Plugin`] method by logging a
/// [`Record`] and accepting the request unchanged.
pub struct Logger {
    sink: Mutex<Option<Sink>>,
}

impl Default for Logger {
    fn default() -> Self {
        Logger::new()
    }
}

impl Logger {
    /// A logger that writes to `tracing` only.
    pub fn new() -> Logger {
        Logger { sink: Mutex::new(None) }
    }

    /// A logger that also appends JSON lines to `path` (created if missing).
    ///
    /// # Errors
    /// [`LoggerError::LogFile`].
    pub fn with_log_file(path: impl AsRef<Path>) -> Result<Logger, LoggerError> {
        let l = Logger::new();
        l.set_log_file(path.as_ref())?;
        Ok(l)
    }

    /// Appends JSON lines to `path` from now on (instead of any earlier file).
    ///
    /// # Errors
    /// [`LoggerError::LogFile`]; the earlier file stays in use.
    pub fn set_log_file(&self, path: &Path) -> Result<(), LoggerError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| LoggerError::LogFile {
                path: path.to_path_buf(),
                source,
            })?;
        *lock(&self.sink) = Some(Sink {
            path: path.to_path_buf(),
            file,
        });
        Ok(())
    }

    /// Logs `rec`: one `tracing` line, and one JSON line in the log file if
    /// there is one. A failed write is reported with `tracing` and does not
    /// fail the request: logging must never break the runtime.
    pub fn record(&self, rec: &Record) {
        tracing::info!("{}", rec.text());
        let mut sink = lock(&self.sink);
        if let Some(s) = sink.as_mut() {
            let mut line = match serde_json::to_string(rec) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot encode log record");
                    return;
                }
            };
            line.push('\n');
            // One write per line, so lines of concurrent writers never mix.
            if let Err(e) = s.file.write_all(line.as_bytes()) {
                tracing::warn!(path = %s.path.display(), error = %e, "cannot write log file");
            }
        }
    }
}

#[nri_stub::async_trait]
impl Plugin for Logger {
    async fn configure(&self, req: &api::ConfigureRequest) -> Result<EventMask, BoxError> {
        let cfg = LoggerConfig::parse(&req.config)?;
        if let Some(path) = &cfg.log_file {
            self.set_log_file(path)?;
        }
        self.record(&Record {
            runtime: Some(format!("{}/{}", req.runtime_name, req.runtime_version)),
            nri_version: Some(req.NRI_version.clone()),
            ..Record::new("Configure")
        });
        // An empty mask keeps the subscription given on the command line.
        Ok(cfg.event_mask()?.unwrap_or_default())
    }

    async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.record(&Record {
            pods: Some(pods.len()),
            containers: Some(containers.len()),
            ..Record::new("Synchronize")
        });
        Ok(Vec::new())
    }

    async fn shutdown(&self) {
        self.record(&Record::new("Shutdown"));
    }

    async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.record(&Record::pod("RunPodSandbox", pod));
        Ok(())
    }

    async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), BoxError> {
        self.record(&Record {
            resources: Some(resources_summary(req.linux_resources.get_or_default())),
            ..Record::pod("UpdatePodSandbox", req.pod.get_or_default())
        });
        Ok(())
    }

    async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.record(&Record::pod("PostUpdatePodSandbox", pod));
        Ok(())
    }

    async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.record(&Record::pod("StopPodSandbox", pod));
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), BoxError> {
        self.record(&Record::pod("RemovePodSandbox", pod));
        Ok(())
    }

    async fn create_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        let resources = c
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .cloned()
            .unwrap_or_default();
        self.record(&Record::detailed("CreateContainer", pod, c, &resources));
        Ok(api::CreateContainerResponse::new())
    }

    async fn post_create_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.record(&Record::container("PostCreateContainer", pod, c));
        Ok(())
    }

    async fn start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.record(&Record::container("StartContainer", pod, c));
        Ok(())
    }

    async fn post_start_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.record(&Record::container("PostStartContainer", pod, c));
        Ok(())
    }

    async fn update_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
        resources: &api::LinuxResources,
    ) -> Result<api::UpdateContainerResponse, BoxError> {
        self.record(&Record::detailed("UpdateContainer", pod, c, resources));
        Ok(api::UpdateContainerResponse::new())
    }

    async fn post_update_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.record(&Record::container("PostUpdateContainer", pod, c));
        Ok(())
    }

    async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        self.record(&Record::container("StopContainer", pod, c));
        Ok(Vec::new())
    }

    async fn remove_container(&self, pod: &api::PodSandbox, c: &api::Container) -> Result<(), BoxError> {
        self.record(&Record::container("RemoveContainer", pod, c));
        Ok(())
    }

    async fn validate_container_adjustment(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), BoxError> {
        self.record(&Record::container(
            "ValidateContainerAdjustment",
            req.pod.get_or_default(),
            req.container.get_or_default(),
        ));
        Ok(())
    }

    async fn on_close(&self) {
        tracing::info!("connection to the runtime closed");
    }
}
