//! One log record per event: the pod and container references, the
//! request's details and the resources summary.

use std::collections::BTreeMap;

use nri_stub::api;
use serde::{Deserialize, Serialize};

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
    pub(crate) fn detailed(
        event: &str,
        pod: &api::PodSandbox,
        c: &api::Container,
        resources: &api::LinuxResources,
    ) -> Record {
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
