//! Scenario files: their types, and loading with every check done before
//! the first step is sent.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use nri_adaptation::{api, convert};
use protobuf::MessageFull;
use serde::{Deserialize, Deserializer, de};
use serde_json::Value;

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Pod sandboxes (NRI `PodSandbox` JSON).
    #[serde(default)]
    pub pods: Vec<Value>,
    /// Containers.
    #[serde(default)]
    pub containers: Vec<ContainerDef>,
    /// Steps, replayed in order: each an object with one key, a [`Step`].
    pub steps: Vec<Value>,
}

/// A container of the scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerDef {
    /// Container id.
    pub id: String,
    /// Id of its pod.
    pub pod: String,
    /// Container name (default: the id).
    #[serde(default)]
    pub name: Option<String>,
    /// The container as an NRI `Container` JSON object.
    #[serde(default)]
    pub container: Option<Value>,
    /// Or an OCI `config.json`, relative to the scenario file.
    #[serde(default)]
    pub config: Option<PathBuf>,
}

/// One lifecycle step.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// RunPodSandbox(pod id).
    RunPodSandbox(String),
    /// UpdatePodSandbox and PostUpdatePodSandbox.
    UpdatePodSandbox {
        /// Pod id.
        pod: String,
        /// New pod resources (NRI `LinuxResources` JSON).
        #[serde(default, deserialize_with = "de_opt_resources")]
        resources: Option<api::LinuxResources>,
        /// Pod overhead (NRI `LinuxResources` JSON).
        #[serde(default, deserialize_with = "de_opt_overhead")]
        overhead: Option<api::LinuxResources>,
    },
    /// StopPodSandbox(pod id).
    StopPodSandbox(String),
    /// RemovePodSandbox(pod id).
    RemovePodSandbox(String),
    /// CreateContainer and PostCreateContainer.
    CreateContainer(String),
    /// StartContainer and PostStartContainer.
    StartContainer(String),
    /// UpdateContainer and PostUpdateContainer.
    UpdateContainer {
        /// Container id.
        container: String,
        /// Requested resources (NRI `LinuxResources` JSON).
        #[serde(deserialize_with = "de_resources")]
        resources: api::LinuxResources,
    },
    /// StopContainer.
    StopContainer(String),
    /// RemoveContainer.
    RemoveContainer(String),
}

impl Step {
    pub(crate) fn action(&self) -> (&'static str, &str) {
        match self {
            Step::RunPodSandbox(p) => ("run_pod_sandbox", p),
            Step::UpdatePodSandbox { pod, .. } => ("update_pod_sandbox", pod),
            Step::StopPodSandbox(p) => ("stop_pod_sandbox", p),
            Step::RemovePodSandbox(p) => ("remove_pod_sandbox", p),
            Step::CreateContainer(c) => ("create_container", c),
            Step::StartContainer(c) => ("start_container", c),
            Step::UpdateContainer { container, .. } => ("update_container", container),
            Step::StopContainer(c) => ("stop_container", c),
            Step::RemoveContainer(c) => ("remove_container", c),
        }
    }
}

/// Errors loading a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read or parsed.
    #[error("scenario {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// An object in it is not valid NRI/OCI JSON, or a reference is unknown.
    #[error("scenario {what}: {reason}")]
    Object {
        /// Which object.
        what: String,
        /// What is wrong.
        reason: String,
    },
}

/// Field `field` of a step, NRI JSON of message `M`. The error shows the
/// JSON its position refers to.
fn step_msg<M: MessageFull>(field: &str, v: &Value) -> Result<M, String> {
    let text = v.to_string();
    protobuf_json_mapping::parse_from_str(&text)
        .map_err(|e| format!("{field} {text} is not NRI {} JSON: {e}", M::descriptor().name()))
}

fn de_resources<'de, D: Deserializer<'de>>(d: D) -> Result<api::LinuxResources, D::Error> {
    step_msg("resources", &Value::deserialize(d)?).map_err(de::Error::custom)
}

fn de_opt_msg<'de, D: Deserializer<'de>>(field: &str, d: D) -> Result<Option<api::LinuxResources>, D::Error> {
    Option::<Value>::deserialize(d)?
        .map(|v| step_msg(field, &v))
        .transpose()
        .map_err(de::Error::custom)
}

fn de_opt_resources<'de, D: Deserializer<'de>>(d: D) -> Result<Option<api::LinuxResources>, D::Error> {
    de_opt_msg("resources", d)
}

fn de_opt_overhead<'de, D: Deserializer<'de>>(d: D) -> Result<Option<api::LinuxResources>, D::Error> {
    de_opt_msg("overhead", d)
}

fn parse_msg<M: MessageFull>(what: &str, v: &Value) -> Result<M, ScenarioError> {
    protobuf_json_mapping::parse_from_str(&v.to_string()).map_err(|e| ScenarioError::Object {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// The CRI annotations a `config.json` fixture carries, made to name the
/// scenario's container and pod: one fixture serves many scenarios, and a
/// plugin matching on `io.kubernetes.cri.sandbox-name` must see the pod the
/// scenario says, as containerd's CRI would write it. Only keys the fixture
/// has are rewritten (a spec without them is not a CRI container).
fn name_cri_annotations(spec: &mut oci_spec::runtime::Spec, name: &str, pod: &api::PodSandbox) {
    let Some(mut a) = spec.annotations().clone() else {
        return;
    };
    for (key, value) in [
        ("io.kubernetes.cri.container-name", name),
        ("io.kubernetes.cri.sandbox-id", pod.id.as_str()),
        ("io.kubernetes.cri.sandbox-name", pod.name.as_str()),
        ("io.kubernetes.cri.sandbox-namespace", pod.namespace.as_str()),
        ("io.kubernetes.cri.sandbox-uid", pod.uid.as_str()),
    ] {
        if let Some(v) = a.get_mut(key) {
            *v = value.to_string();
        }
    }
    spec.set_annotations(Some(a));
}

/// A loaded scenario: pods and containers resolved.
pub struct Loaded {
    /// Pods by id.
    pub pods: BTreeMap<String, api::PodSandbox>,
    /// Containers by id, with their OCI spec when given as `config.json`.
    pub containers: BTreeMap<String, (api::Container, Option<oci_spec::runtime::Spec>)>,
    /// The steps.
    pub steps: Vec<Step>,
}

/// Reads and resolves a scenario file.
///
/// # Errors
/// [`ScenarioError`] naming the file or object at fault.
pub fn load(path: &Path) -> Result<Loaded, ScenarioError> {
    let file_err = |reason: String| ScenarioError::File {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    let sc: Scenario = serde_json::from_str(&text).map_err(|e| file_err(e.to_string()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let object_err = |what: String, reason: String| ScenarioError::Object { what, reason };
    let mut pods = BTreeMap::new();
    let mut pod_at = BTreeMap::new();
    for (i, p) in sc.pods.iter().enumerate() {
        let what = format!("pods[{i}]");
        let pod: api::PodSandbox = parse_msg(&what, p)?;
        if pod.id.is_empty() {
            return Err(object_err(what, "empty id".into()));
        }
        if let Some(j) = pod_at.insert(pod.id.clone(), i) {
            return Err(object_err(
                what,
                format!("duplicate pod id {:?} (pods[{j}] has it too)", pod.id),
            ));
        }
        pods.insert(pod.id.clone(), pod);
    }
    let mut containers = BTreeMap::new();
    let mut container_at = BTreeMap::new();
    for (i, c) in sc.containers.iter().enumerate() {
        if c.id.is_empty() {
            return Err(object_err(format!("containers[{i}]"), "empty id".into()));
        }
        if let Some(j) = container_at.insert(c.id.clone(), i) {
            return Err(object_err(
                format!("containers[{i}]"),
                format!("duplicate container id {:?} (containers[{j}] has it too)", c.id),
            ));
        }
        let what = format!("containers[{i}] {:?}", c.id);
        if !pods.contains_key(&c.pod) {
            return Err(object_err(what, format!("unknown pod {:?}", c.pod)));
        }
        let name = c.name.clone().unwrap_or_else(|| c.id.clone());
        let (ctr, spec) = match (&c.container, &c.config) {
            (Some(v), None) => {
                let mut ctr: api::Container = parse_msg(&what, v)?;
                ctr.id = c.id.clone();
                ctr.pod_sandbox_id = c.pod.clone();
                if ctr.name.is_empty() {
                    ctr.name = name;
                }
                (ctr, None)
            }
            (None, Some(cfg)) => {
                let file = base.join(cfg);
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| object_err(what.clone(), format!("{}: {e}", file.display())))?;
                let mut spec: oci_spec::runtime::Spec = serde_json::from_str(&text)
                    .map_err(|e| object_err(what.clone(), format!("{}: {e}", file.display())))?;
                name_cri_annotations(&mut spec, &name, &pods[&c.pod]);
                (convert::container_from_spec(&c.id, &c.pod, &name, &spec), Some(spec))
            }
            _ => {
                return Err(object_err(
                    what,
                    "give exactly one of \"container\" or \"config\"".into(),
                ));
            }
        };
        containers.insert(c.id.clone(), (ctr, spec));
    }
    let mut steps = Vec::with_capacity(sc.steps.len());
    for (i, v) in sc.steps.iter().enumerate() {
        let keys: Vec<&str> = match v {
            Value::Object(m) => m.keys().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        let [action] = keys[..] else {
            let found = match v {
                Value::Object(_) => format!("{} keys: {}", keys.len(), keys.join(", ")),
                other => other.to_string(),
            };
            return Err(object_err(
                format!("steps[{i}]"),
                format!(
                    "a step must have exactly one key, the action, e.g. {{\"create_container\": \"c1\"}}; found {found}"
                ),
            ));
        };
        let what = format!("steps[{i}] ({action})");
        let step = Step::deserialize(v).map_err(|e| object_err(what.clone(), e.to_string()))?;
        let (action, target) = step.action();
        let (kind, known) = if action.ends_with("pod_sandbox") {
            ("pod", pods.contains_key(target))
        } else {
            ("container", containers.contains_key(target))
        };
        if !known {
            return Err(object_err(what, format!("unknown {kind} {target:?}")));
        }
        steps.push(step);
    }
    Ok(Loaded {
        pods,
        containers,
        steps,
    })
}

#[cfg(test)]
mod tests;
