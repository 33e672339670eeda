//! Replaying a loaded scenario against an adaptation, one JSON line per step.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use nri_adaptation::{Adaptation, CreateReport, RuntimeState, api, convert, spec};
use nri_proto::sync::lock;
use protobuf::MessageField;
use serde_json::{Value, json};

use crate::scenario::{Loaded, Step};

pub use nri_adaptation::convert::to_json;

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
                let st = lock(&st);
                Ok(RuntimeState {
                    pods: st.pods.values().cloned().collect(),
                    containers: st.containers.values().cloned().collect(),
                })
            }
        })
        .with_update_fn(move |updates| {
            let st = s2.clone();
            async move {
                let mut st = lock(&st);
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
                let mut st = lock(&st);
                st.pending_output
                    .push(json!({"event": "evict", "eviction": to_json(&ev)}));
                Ok(())
            }
        })
}

/// Each plugin's answer, and who set or removed which field of container
/// `id` by NRI field name (the raw owners message keys fields by number).
fn report_json(r: &CreateReport, id: &str) -> (Value, Value) {
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
    let changes = serde_json::to_value(r.changes(id)).unwrap_or(Value::Null);
    (Value::Array(plugins), changes)
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
        let pending = std::mem::take(&mut lock(state).pending_output);
        out.extend(pending);
    }
    (out, all_ok)
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
    let e = |e: nri_adaptation::Error| format!("{:#}", anyhow::Error::new(e));
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
            let (plugins, changes) = report_json(&report, &ctr.id);
            line["plugins"] = plugins;
            line["changes"] = changes;
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
