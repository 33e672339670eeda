//! # nri-logger
//!
//! A sample NRI plugin that logs every request the runtime sends it:
//! Configure, Synchronize, every pod and container lifecycle event,
//! ValidateContainerAdjustment and Shutdown. It changes nothing.
//!
//! Each request becomes one [`Record`], written
//! * with `tracing` as one text line: the event name, the pod as
//!   `namespace/name (id)`, the container as `name (id)`, and for
//!   CreateContainer and UpdateContainer the number of annotations and
//!   environment variables and the resources, e.g.
//!   `CreateContainer pod=default/web (p1) container=app (c1) annotations=5 env=3 resources=[cpu.period=100000 cpu.quota=50000 cpu.shares=1024 memory.limit=268435456 memory.swap=268435456]`;
//! * optionally as one JSON object per line appended to a log file
//!   (`--log-file`), for tests and tools: see [`Record`] for the fields.
//!
//! ## Usage
//!
//! ```sh
//! nri-logger --socket-path /var/run/nri/nri.sock --idx 99 --events all --log-file /tmp/nri-events.jsonl
//! ```
//!
//! | flag | default | what |
//! |---|---|---|
//! | `--socket-path PATH` | `/var/run/nri/nri.sock` | the runtime's NRI socket (ignored when the runtime launched the plugin) |
//! | `--idx NN` | `NRI_PLUGIN_IDX`, an `IDX-NAME` executable name, else `99` | plugin index: with `99` the logger runs last and sees containers as the other plugins adjusted them |
//! | `--name NAME` | `NRI_PLUGIN_NAME`, an `IDX-NAME` executable name, else the executable's name | plugin name |
//! | `--events LIST` | `all` | events to subscribe to, in [`nri_stub::EventMask::parse`] syntax (`CreateContainer,stop_container`, `pod`, `container`, `all`) |
//! | `--log-file PATH` | none | also append JSON lines here |
//!
//! Installed as a pre-installed plugin (e.g. `/opt/nri/plugins/99-logger`),
//! the runtime passes no flags; a drop-in configuration
//! (`/etc/nri/conf.d/99-logger.conf`) may set the same two options in TOML
//! ([`LoggerConfig`]), and takes precedence over the flags:
//!
//! ```toml
//! events = "pod,CreateContainer"
//! log_file = "/var/log/nri-events.jsonl"
//! ```

#![warn(missing_docs)]

use std::{
    collections::BTreeMap,
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use nri_stub::{BoxError, EventMask, Plugin, api};
use serde::{Deserialize, Serialize};

/// Why the logger could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    /// The JSON-lines log file cannot be opened for appending.
    #[error("cannot open log file {path}: {source}")]
    LogFile {
        /// The path given.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The drop-in configuration is not valid TOML or has an unknown key.
    #[error("invalid nri-logger configuration: {0}")]
    Config(#[from] toml::de::Error),
    /// The `events` list names an unknown event.
    #[error("invalid nri-logger configuration: events: {0}")]
    Events(#[from] nri_proto::events::EventError),
}

/// The configuration a runtime may pass in Configure (from its drop-in
/// directory, for a pre-installed logger), in TOML.
///
/// ```
/// let c = nri_logger::LoggerConfig::parse("events = \"pod\"\nlog_file = \"/tmp/x.jsonl\"").unwrap();
/// assert_eq!(c.events.as_deref(), Some("pod"));
/// assert!(nri_logger::LoggerConfig::parse("colour = \"red\"").unwrap_err().to_string().contains("colour"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// Events to subscribe to ([`EventMask::parse`] syntax); replaces `--events`.
    pub events: Option<String>,
    /// JSON-lines log file; replaces `--log-file`.
    pub log_file: Option<PathBuf>,
}

impl LoggerConfig {
    /// Parses the TOML text; an empty text is the empty configuration.
    ///
    /// # Errors
    /// [`LoggerError::Config`] (naming the offending key) or
    /// [`LoggerError::Events`].
    pub fn parse(text: &str) -> Result<LoggerConfig, LoggerError> {
        let cfg: LoggerConfig = toml::from_str(text)?;
        if let Some(e) = &cfg.events {
            EventMask::parse(e)?;
        }
        Ok(cfg)
    }

    /// The subscription this configuration asks for, if any.
    ///
    /// # Errors
    /// [`LoggerError::Events`].
    pub fn event_mask(&self) -> Result<Option<EventMask>, LoggerError> {
        Ok(match &self.events {
            Some(e) => Some(EventMask::parse(e)?),
            None => None,
        })
    }
}

/// The pod an event concerns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// Pod sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
}

impl From<&api::PodSandbox> for PodRef {
    fn from(p: &api::PodSandbox) -> Self {
        PodRef {
            id: p.id.clone(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            uid: p.uid.clone(),
        }
    }
}

/// The container an event concerns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
}

impl From<&api::Container> for ContainerRef {
    fn from(c: &api::Container) -> Self {
        ContainerRef {
            id: c.id.clone(),
            name: c.name.clone(),
        }
    }
}

/// One logged request: one line of text, one JSON object in the log file.
///
/// `event`, `pod` and `container` are always present in the JSON (`null`
/// when the request has no pod or container); the other fields only when
/// the event carries them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Request name: `Configure`, `Synchronize`, `Shutdown`, or an NRI
    /// event name (`RunPodSandbox`, `CreateContainer`, ...).
    pub event: String,
    /// The pod.
    pub pod: Option<PodRef>,
    /// The container.
    pub container: Option<ContainerRef>,
    /// CreateContainer, UpdateContainer: number of container annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<usize>,
    /// CreateContainer, UpdateContainer: number of environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<usize>,
    /// CreateContainer: the container's resources; UpdateContainer and
    /// UpdatePodSandbox: the requested ones. See [`resources_summary`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, serde_json::Value>>,
    /// Configure: `runtime-name/runtime-version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Configure: the NRI version the runtime speaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nri_version: Option<String>,
    /// Synchronize: number of pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<usize>,
    /// Synchronize: number of containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<usize>,
}

impl Record {
    /// A record of `event` without pod or container.
    pub fn new(event: impl Into<String>) -> Record {
        Record {
            event: event.into(),
            ..Default::default()
        }
    }

    /// A record of a pod event.
    pub fn pod(event: impl Into<String>, pod: &api::PodSandbox) -> Record {
        Record {
            pod: Some(pod.into()),
            ..Record::new(event)
        }
    }

    /// A record of a container event.
    pub fn container(event: impl Into<String>, pod: &api::PodSandbox, c: &api::Container) -> Record {
        Record {
            container: Some(c.into()),
            ..Record::pod(event, pod)
        }
    }

    /// A container event with the container's annotation and environment
    /// counts and `resources`.
    fn detailed(event: &str, pod: &api::PodSandbox, c: &api::Container, resources: &api::LinuxResources) -> Record {
        Record {
            annotations: Some(c.annotations.len()),
            env: Some(c.env.len()),
            resources: Some(resources_summary(resources)),
            ..Record::container(event, pod, c)
        }
    }

    /// The record as one line of text (what goes to `tracing`).
    ///
    /// ```
    /// use nri_logger::{ContainerRef, PodRef, Record};
    /// let r = Record {
    ///     pod: Some(PodRef { id: "p1".into(), name: "web".into(), namespace: "default".into(), uid: "u".into() }),
    ///     container: Some(ContainerRef { id: "c1".into(), name: "app".into() }),
    ///     env: Some(3),
    ///     ..Record::new("StartContainer")
    /// };
    /// assert_eq!(r.text(), "StartContainer pod=default/web (p1) container=app (c1) env=3");
    /// ```
    pub fn text(&self) -> String {
        let mut s = self.event.clone();
        if let Some(p) = &self.pod {
            s.push_str(&format!(" pod={}/{} ({})", p.namespace, p.name, p.id));
        }
        if let Some(c) = &self.container {
            s.push_str(&format!(" container={} ({})", c.name, c.id));
        }
        if let Some(v) = &self.runtime {
            s.push_str(&format!(" runtime={v}"));
        }
        if let Some(v) = &self.nri_version {
            s.push_str(&format!(" nri_version={v}"));
        }
        if let Some(n) = self.pods {
            s.push_str(&format!(" pods={n}"));
        }
        if let Some(n) = self.containers {
            s.push_str(&format!(" containers={n}"));
        }
        if let Some(n) = self.annotations {
            s.push_str(&format!(" annotations={n}"));
        }
        if let Some(n) = self.env {
            s.push_str(&format!(" env={n}"));
        }
        if let Some(r) = &self.resources {
            let parts: Vec<String> = r.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
            s.push_str(&format!(" resources=[{}]", parts.join(" ")));
        }
        s
    }
}

/// A JSON value without the quotes of a string.
fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The fields of `r` that are set, keyed by their name in
/// [`nri_adaptation::resources::FIELDS`]: `memory.limit`, `memory.swap`,
/// ..., `cpu.shares`, `cpu.cpus`, ..., `blockio_class`, `rdt_class`,
/// `pids.limit`; keyed fields per key (`hugepages.<size>`,
/// `unified.<key>`); and `devices`, the number of device cgroup rules.
///
/// ```
/// use nri_stub::api;
/// let mut r = api::LinuxResources::new();
/// r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 128;
/// r.cpu.mut_or_insert_default().cpus = "0-1".into();
/// let s = nri_logger::resources_summary(&r);
/// assert_eq!(s["memory.limit"], 128);
/// assert_eq!(s["cpu.cpus"], "0-1");
/// assert_eq!(s.len(), 2);
/// ```
pub fn resources_summary(r: &api::LinuxResources) -> BTreeMap<String, serde_json::Value> {
    use nri_adaptation::resources::{self, Entry, Value};
    let json = |v: Value| match v {
        Value::Int(n) => n.into(),
        Value::Uint(n) => n.into(),
        Value::Bool(b) => b.into(),
        Value::Str(s) => s.into(),
    };
    let mut out = BTreeMap::new();
    resources::visit(r, |f, e| {
        let (key, value) = match e {
            Entry::Scalar(v) => (f.name.to_string(), json(v)),
            Entry::Keyed(k, v) => (format!("{}.{k}", f.name), json(v)),
            Entry::Rules(rules) => (f.name.to_string(), rules.len().into()),
        };
        out.insert(key, value);
    });
    out
}

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
        *self.sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(Sink {
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
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> api::PodSandbox {
        api::PodSandbox {
            id: "p1".into(),
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            ..Default::default()
        }
    }

    fn ctr() -> api::Container {
        let mut c = api::Container {
            id: "c1".into(),
            name: "app".into(),
            env: vec!["A=1".into(), "B=2".into()],
            ..Default::default()
        };
        c.annotations.insert("k".into(), "v".into());
        let r = c.linux.mut_or_insert_default().resources.mut_or_insert_default();
        r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 20;
        r.pids.mut_or_insert_default().limit = 7;
        c
    }

    #[test]
    fn json_always_has_event_pod_and_container() {
        let v: serde_json::Value = serde_json::to_value(Record::new("Shutdown")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"event": "Shutdown", "pod": null, "container": null})
        );
        let v = serde_json::to_value(Record::pod("RunPodSandbox", &pod())).unwrap();
        assert_eq!(v["pod"]["namespace"], "default");
        assert!(v["container"].is_null());
    }

    #[test]
    fn create_container_record_has_counts_and_resources() {
        let c = ctr();
        let r = Record::detailed("CreateContainer", &pod(), &c, c.linux.resources.as_ref().unwrap());
        assert_eq!((r.annotations, r.env), (Some(1), Some(2)));
        let res = r.resources.as_ref().unwrap();
        assert_eq!(res["memory.limit"], 1 << 20);
        assert_eq!(res["pids.limit"], 7);
        assert_eq!(
            r.text(),
            "CreateContainer pod=default/web (p1) container=app (c1) annotations=1 env=2 resources=[memory.limit=1048576 pids.limit=7]"
        );
        let back: Record = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn resources_summary_keys_every_shape() {
        let mut r = api::LinuxResources::new();
        let m = r.memory.mut_or_insert_default();
        m.limit.mut_or_insert_default().value = 1;
        m.swappiness.mut_or_insert_default().value = 10;
        m.disable_oom_killer.mut_or_insert_default().value = true;
        let c = r.cpu.mut_or_insert_default();
        c.quota.mut_or_insert_default().value = -1;
        c.period.mut_or_insert_default().value = 1000;
        c.cpus = "0".into();
        r.hugepage_limits.push(api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 4,
            ..Default::default()
        });
        r.unified.insert("io.max".into(), "x".into());
        r.blockio_class.mut_or_insert_default().value = "b".into();
        r.rdt_class.mut_or_insert_default().value = "r".into();
        r.pids.mut_or_insert_default().limit = 3;
        r.devices = vec![api::LinuxDeviceCgroup::new(), api::LinuxDeviceCgroup::new()];
        assert_eq!(
            serde_json::to_value(resources_summary(&r)).unwrap(),
            serde_json::json!({
                "memory.limit": 1, "memory.swappiness": 10, "memory.disable_oom_killer": true,
                "cpu.quota": -1, "cpu.period": 1000, "cpu.cpus": "0", "hugepages.2MB": 4,
                "unified.io.max": "x", "blockio_class": "b", "rdt_class": "r", "pids.limit": 3, "devices": 2,
            })
        );
    }

    #[test]
    fn config_rejects_unknown_keys_and_events() {
        assert_eq!(LoggerConfig::parse("").unwrap(), LoggerConfig::default());
        let e = LoggerConfig::parse("log-file = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("log-file"), "{e}");
        let e = LoggerConfig::parse("events = \"CreateContainer,bogus\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let m = LoggerConfig::parse("events = \"pod\"").unwrap().event_mask().unwrap();
        assert_eq!(m, Some(EventMask::POD));
    }

    #[tokio::test]
    async fn configure_applies_the_runtime_config_and_writes_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let logger = Logger::new();
        let req = api::ConfigureRequest {
            config: format!("events = \"container\"\nlog_file = {:?}\n", path.display().to_string()),
            runtime_name: "rt".into(),
            runtime_version: "1".into(),
            ..Default::default()
        };
        let mask = logger.configure(&req).await.unwrap();
        assert_eq!(mask, EventMask::CONTAINER);
        logger.start_container(&pod(), &ctr()).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Record> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].event, "Configure");
        assert_eq!(lines[0].runtime.as_deref(), Some("rt/1"));
        assert_eq!(lines[1].container.as_ref().unwrap().id, "c1");

        let bad = api::ConfigureRequest {
            config: "colour = 1".into(),
            ..Default::default()
        };
        let e = logger.configure(&bad).await.unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
    }
}
