//! # nri-replay
//!
//! Hosts an NRI [`Adaptation`] on a socket, lets real plugins connect (or
//! launches pre-installed ones), then replays a scenario of pod and
//! container lifecycle steps against them and prints, per step, one JSON
//! line: what each plugin answered, the merged adjustment and updates, who
//! owns which field, and for containers given as an OCI `config.json` the
//! adjusted spec. It is how a plugin author tests a plugin without a
//! cluster and how an operator sees which plugin changed what.
//!
//! A scenario (JSON):
//!
//! ```json
//! {
//!   "pods": [{"id": "p1", "name": "web", "namespace": "default", "uid": "u1"}],
//!   "containers": [
//!     {"id": "c1", "pod": "p1", "name": "app", "config": "../oci/busybox.json"},
//!     {"id": "c2", "pod": "p1", "container": {"name": "side", "env": ["A=1"]}}
//!   ],
//!   "steps": [
//!     {"run_pod_sandbox": "p1"},
//!     {"create_container": "c1"},
//!     {"start_container": "c1"},
//!     {"update_container": {"container": "c1", "resources": {"cpu": {"cpus": "0"}}}},
//!     {"stop_container": "c1"},
//!     {"remove_container": "c1"},
//!     {"update_pod_sandbox": {"pod": "p1", "resources": {"cpu": {"shares": {"value": "512"}}}}},
//!     {"stop_pod_sandbox": "p1"},
//!     {"remove_pod_sandbox": "p1"}
//!   ]
//! }
//! ```
//!
//! Pods and containers are NRI objects in protobuf JSON; a container may
//! instead name an OCI `config.json` (relative to the scenario file). Like a
//! runtime, a successful create, start or update step is followed by its
//! Post event.
//!
//! The whole scenario is checked before the first step is sent: pod and
//! container ids are non-empty and unique, each step is an object with
//! exactly one key (the action), names a known pod or container and
//! carries valid NRI JSON. Errors name the entry, e.g. `containers[2]:
//! empty id` or `steps[3] (start_container): unknown container "x"`
//! (indexes from 0). The order of the steps is not checked: a plugin can be
//! sent a lifecycle no runtime would send.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use nri_adaptation::{Adaptation, CreateReport, RuntimeState, api, convert, spec};
use protobuf::{MessageField, MessageFull};
use serde::{Deserialize, Deserializer, de};
use serde_json::{Value, json};

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
    fn action(&self) -> (&'static str, &str) {
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

/// A message as JSON (protobuf JSON mapping).
pub fn to_json<M: MessageFull>(m: &M) -> Value {
    let text = protobuf_json_mapping::print_to_string(m).unwrap_or_else(|_| "null".into());
    serde_json::from_str(&text).unwrap_or(Value::Null)
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
                let spec: oci_spec::runtime::Spec = serde_json::from_str(&text)
                    .map_err(|e| object_err(what.clone(), format!("{}: {e}", file.display())))?;
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

/// What a runtime hosting the replay knows: pods run and containers
/// created so far, and the updates plugins asked for.
#[derive(Debug, Default)]
pub struct ReplayState {
    /// Running pods.
    pub pods: BTreeMap<String, api::PodSandbox>,
    /// Created containers.
    pub containers: BTreeMap<String, api::Container>,
    /// Unsolicited updates and evictions as output lines, not yet printed.
    pub pending_output: Vec<Value>,
}

/// Callbacks that make `adaptation` a runtime over `state`.
pub fn runtime_builder(
    builder: nri_adaptation::AdaptationBuilder,
    state: Arc<Mutex<ReplayState>>,
) -> nri_adaptation::AdaptationBuilder {
    let (s1, s2, s3) = (state.clone(), state.clone(), state);
    builder
        .with_sync_fn(move || {
            let st = s1.clone();
            async move {
                let st = st.lock().unwrap_or_else(|p| p.into_inner());
                Ok(RuntimeState {
                    pods: st.pods.values().cloned().collect(),
                    containers: st.containers.values().cloned().collect(),
                })
            }
        })
        .with_update_fn(move |updates| {
            let st = s2.clone();
            async move {
                let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
                let mut failed = Vec::new();
                for u in updates {
                    match st.containers.get_mut(&u.container_id) {
                        Some(c) => {
                            c.linux.mut_or_insert_default().resources = u.linux.resources.clone();
                            st.pending_output
                                .push(json!({"event": "update_containers", "update": to_json(&u)}));
                        }
                        None => failed.push(u),
                    }
                }
                Ok(failed)
            }
        })
        .with_evict_fn(move |ev| {
            let st = s3.clone();
            async move {
                let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
                st.pending_output
                    .push(json!({"event": "evict", "eviction": to_json(&ev)}));
                Ok(())
            }
        })
}

fn report_json(r: &CreateReport) -> (Value, Value) {
    let plugins = r
        .plugins
        .iter()
        .map(|p| {
            let mut v = json!({"plugin": p.plugin});
            if let Some(rsp) = &p.response {
                v["adjust"] = to_json(rsp.adjust.get_or_default());
                v["update"] = Value::Array(rsp.update.iter().map(to_json).collect());
            }
            if let Some(e) = &p.error {
                v["error"] = json!(e);
            }
            v
        })
        .collect();
    let owners = r.owners.as_ref().map(to_json).unwrap_or(Value::Null);
    (Value::Array(plugins), owners)
}

/// Replays every step; returns one output line per step (plus lines for
/// unsolicited updates) and whether every step succeeded.
pub async fn replay(nri: &Adaptation, state: &Arc<Mutex<ReplayState>>, loaded: &Loaded) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut all_ok = true;
    let mut specs: BTreeMap<String, oci_spec::runtime::Spec> = BTreeMap::new();
    for (i, step) in loaded.steps.iter().enumerate() {
        let (action, target) = step.action();
        let mut line = json!({"step": i + 1, "action": action, "target": target});
        let result = run_step(nri, state, loaded, step, &mut line, &mut specs).await;
        match result {
            Ok(()) => line["ok"] = json!(true),
            Err(e) => {
                all_ok = false;
                line["ok"] = json!(false);
                line["error"] = json!(e);
            }
        }
        out.push(line);
        let pending = std::mem::take(&mut state.lock().unwrap_or_else(|p| p.into_inner()).pending_output);
        out.extend(pending);
    }
    (out, all_ok)
}

fn lock(state: &Arc<Mutex<ReplayState>>) -> std::sync::MutexGuard<'_, ReplayState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

async fn run_step(
    nri: &Adaptation,
    state: &Arc<Mutex<ReplayState>>,
    loaded: &Loaded,
    step: &Step,
    line: &mut Value,
    specs: &mut BTreeMap<String, oci_spec::runtime::Spec>,
) -> Result<(), String> {
    let pod_of = |id: &str| -> api::PodSandbox { loaded.pods[id].clone() };
    let ctr_state = |id: &str| -> (api::PodSandbox, api::Container) {
        let c = lock(state)
            .containers
            .get(id)
            .cloned()
            .unwrap_or_else(|| loaded.containers[id].0.clone());
        (pod_of(&c.pod_sandbox_id), c)
    };
    let set_state = |id: &str, st: api::ContainerState| {
        if let Some(c) = lock(state).containers.get_mut(id) {
            c.state = st.into();
        }
    };
    let e = |e: nri_adaptation::Error| e.to_string();
    match step {
        Step::RunPodSandbox(p) => {
            let pod = pod_of(p);
            nri.run_pod_sandbox(&pod).await.map_err(e)?;
            lock(state).pods.insert(p.clone(), pod);
        }
        Step::UpdatePodSandbox {
            pod,
            resources,
            overhead,
        } => {
            let mut req = api::UpdatePodSandboxRequest {
                pod: MessageField::some(pod_of(pod)),
                ..Default::default()
            };
            req.linux_resources = resources.clone().into();
            req.overhead_linux_resources = overhead.clone().into();
            nri.update_pod_sandbox(&req).await.map_err(e)?;
            nri.post_update_pod_sandbox(&pod_of(pod)).await.map_err(e)?;
        }
        Step::StopPodSandbox(p) => nri.stop_pod_sandbox(&pod_of(p)).await.map_err(e)?,
        Step::RemovePodSandbox(p) => {
            nri.remove_pod_sandbox(&pod_of(p)).await.map_err(e)?;
            lock(state).pods.remove(p);
        }
        Step::CreateContainer(c) => {
            let (ctr, spec) = &loaded.containers[c];
            let pod = pod_of(&ctr.pod_sandbox_id);
            let req = api::CreateContainerRequest {
                pod: MessageField::some(pod.clone()),
                container: MessageField::some(ctr.clone()),
                ..Default::default()
            };
            let (result, report) = nri.create_container_with_report(req).await;
            let (plugins, owners) = report_json(&report);
            line["plugins"] = plugins;
            line["owners"] = owners;
            let rsp = result.map_err(e)?;
            line["adjust"] = to_json(rsp.adjust.get_or_default());
            line["update"] = Value::Array(rsp.update.iter().map(to_json).collect());
            if let Some(spec) = spec {
                let mut adjusted = spec.clone();
                spec::adjust(&mut adjusted, rsp.adjust.get_or_default()).map_err(|x| x.to_string())?;
                line["spec"] = serde_json::to_value(&adjusted).unwrap_or(Value::Null);
                specs.insert(c.clone(), adjusted);
            }
            // The runtime now knows the container as adjusted.
            let mut created = ctr.clone();
            if let Some(s) = specs.get(c) {
                created = convert::container_from_spec(&created.id, &created.pod_sandbox_id, &created.name, s);
            }
            lock(state).containers.insert(c.clone(), created.clone());
            nri.post_create_container(&pod, &created).await.map_err(e)?;
        }
        Step::StartContainer(c) => {
            let (pod, ctr) = ctr_state(c);
            nri.start_container(&pod, &ctr).await.map_err(e)?;
            set_state(c, api::ContainerState::CONTAINER_RUNNING);
            let (pod, ctr) = ctr_state(c);
            nri.post_start_container(&pod, &ctr).await.map_err(e)?;
        }
        Step::UpdateContainer { container, resources } => {
            let (pod, ctr) = ctr_state(container);
            let req = api::UpdateContainerRequest {
                pod: MessageField::some(pod.clone()),
                container: MessageField::some(ctr.clone()),
                linux_resources: MessageField::some(resources.clone()),
                ..Default::default()
            };
            let updates = nri.update_container(req).await.map_err(e)?;
            line["update"] = Value::Array(updates.iter().map(to_json).collect());
            if let Some(target) = updates.last()
                && let Some(c) = lock(state).containers.get_mut(container)
            {
                c.linux.mut_or_insert_default().resources = target.linux.resources.clone();
            }
            let (pod, ctr) = ctr_state(container);
            nri.post_update_container(&pod, &ctr).await.map_err(e)?;
        }
        Step::StopContainer(c) => {
            let (pod, ctr) = ctr_state(c);
            let req = api::StopContainerRequest {
                pod: MessageField::some(pod),
                container: MessageField::some(ctr),
                ..Default::default()
            };
            let updates = nri.stop_container(req).await.map_err(e)?;
            line["update"] = Value::Array(updates.iter().map(to_json).collect());
            set_state(c, api::ContainerState::CONTAINER_STOPPED);
        }
        Step::RemoveContainer(c) => {
            let (pod, ctr) = ctr_state(c);
            nri.remove_container(&pod, &ctr).await.map_err(e)?;
            lock(state).containers.remove(c);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = r#""pods": [{"id": "p1", "name": "web"}]"#;
    const CONTAINERS: &str = r#""containers": [{"id": "c1", "pod": "p1", "container": {}}]"#;

    fn load_str(json: &str) -> Result<Loaded, ScenarioError> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.json");
        std::fs::write(&f, json).unwrap();
        load(&f)
    }

    fn load_err(json: &str) -> String {
        match load_str(json) {
            Ok(_) => panic!("accepted: {json}"),
            Err(e) => e.to_string(),
        }
    }

    /// A scenario with the pod p1 and container c1 and these steps.
    fn with_steps(steps: &str) -> String {
        format!("{{{PODS}, {CONTAINERS}, \"steps\": [{steps}]}}")
    }

    #[test]
    fn example_scenarios_load_with_their_payloads_parsed() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/scenarios");
        for f in ["basic.json", "conflict.json"] {
            load(&dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
        let l = load(&dir.join("basic.json")).unwrap();
        let shares = l.steps.iter().find_map(|s| match s {
            Step::UpdateContainer { resources, .. } => Some(resources.cpu.shares.value),
            _ => None,
        });
        assert_eq!(shares, Some(512));
    }

    #[test]
    fn duplicate_ids_are_refused_naming_the_id_and_the_list() {
        let e = load_err(r#"{"pods": [{"id": "p1"}, {"id": "p2"}, {"id": "p1"}], "containers": [], "steps": []}"#);
        assert!(
            e.contains("pods[2]") && e.contains("duplicate pod id \"p1\"") && e.contains("pods[0]"),
            "{e}"
        );
        let e = load_err(&format!(
            r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "p1", "container": {{}}}},
                                        {{"id": "c1", "pod": "p1", "container": {{}}}}], "steps": []}}"#
        ));
        assert!(
            e.contains("containers[1]") && e.contains("duplicate container id \"c1\"") && e.contains("containers[0]"),
            "{e}"
        );
    }

    #[test]
    fn empty_ids_are_refused_naming_the_entry() {
        let e = load_err(r#"{"pods": [{"id": "p1"}, {"name": "web"}], "steps": []}"#);
        assert!(e.ends_with("pods[1]: empty id"), "{e}");
        let e = load_err(&format!(
            r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "p1", "container": {{}}}},
                                        {{"id": "c2", "pod": "p1", "container": {{}}}},
                                        {{"id": "", "pod": "p1", "container": {{}}}}], "steps": []}}"#
        ));
        assert!(e.ends_with("containers[2]: empty id"), "{e}");
        let e = load_err(&format!(
            r#"{{{PODS}, "containers": [{{"id": "c1", "pod": "", "container": {{}}}}], "steps": []}}"#
        ));
        assert!(e.contains("containers[0]") && e.contains("unknown pod \"\""), "{e}");
    }

    #[test]
    fn step_payloads_are_parsed_when_the_scenario_is_loaded() {
        let e = load_err(&with_steps(
            r#"{"run_pod_sandbox": "p1"}, {"create_container": "c1"},
               {"update_container": {"container": "c1", "resources": {"cpu": {"shares": "lots"}}}}"#,
        ));
        assert!(
            e.contains("steps[2] (update_container): resources") && e.contains("lots"),
            "{e}"
        );
        let e = load_err(&with_steps(
            r#"{"run_pod_sandbox": "p1"},
               {"update_pod_sandbox": {"pod": "p1", "overhead": {"memory": {"colour": 1}}}}"#,
        ));
        assert!(
            e.contains("steps[1] (update_pod_sandbox)") && e.contains("overhead") && e.contains("colour"),
            "{e}"
        );
        let e = load_err(&with_steps(r#"{"update_container": {"container": "c1"}}"#));
        assert!(
            e.contains("steps[0] (update_container)") && e.contains("resources"),
            "{e}"
        );
        let e = load_err(&with_steps(
            r#"{"update_container": {"container": "c1", "resources": {}, "extra": 1}}"#,
        ));
        assert!(e.contains("steps[0] (update_container)") && e.contains("extra"), "{e}");
    }

    #[test]
    fn unknown_step_targets_name_the_step() {
        let e = load_err(&with_steps(
            r#"{"run_pod_sandbox": "p1"}, {"create_container": "c1"}, {"start_container": "c1"},
               {"start_container": "x"}"#,
        ));
        assert!(
            e.ends_with(r#"steps[3] (start_container): unknown container "x""#),
            "{e}"
        );
        let e = load_err(&with_steps(r#"{"update_pod_sandbox": {"pod": "q"}}"#));
        assert!(e.ends_with(r#"steps[0] (update_pod_sandbox): unknown pod "q""#), "{e}");
        // A pod id is not a container id.
        let e = load_err(&with_steps(r#"{"stop_container": "p1"}"#));
        assert!(
            e.ends_with(r#"steps[0] (stop_container): unknown container "p1""#),
            "{e}"
        );
    }

    #[test]
    fn a_step_has_exactly_one_key() {
        let e = load_err(&with_steps(
            r#"{"run_pod_sandbox": "p1"}, {"start_container": "c1", "stop_container": "c1"}"#,
        ));
        assert!(
            e.contains("steps[1]")
                && e.contains("exactly one key")
                && e.contains("start_container")
                && e.contains("stop_container"),
            "{e}"
        );
        for (step, needle) in [
            ("{}", "exactly one key"),
            (r#""run_pod_sandbox""#, "exactly one key"),
            (r#"{"launch_container": "c1"}"#, "launch_container"),
        ] {
            let e = load_err(&with_steps(step));
            assert!(e.contains("steps[0]") && e.contains(needle), "{step}: {e}");
        }
    }

    #[test]
    fn steps_in_any_lifecycle_order_are_accepted() {
        // Plugin authors replay orders a runtime would not send.
        let l = load_str(&with_steps(
            r#"{"remove_container": "c1"}, {"start_container": "c1"}, {"create_container": "c1"},
               {"create_container": "c1"}, {"stop_pod_sandbox": "p1"}, {"run_pod_sandbox": "p1"}"#,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.steps.len(), 6);
    }
}
