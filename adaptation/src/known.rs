//! What the adaptation itself saw of the runtime's pods and containers,
//! to complete the state a joining plugin is synchronized with.
//!
//! A plugin that joins is synchronized with what the sync callback returns,
//! then added to the registry; events dispatched before that do not reach
//! it. Synchronize is serialized against event dispatch (both under the
//! request lock), so every event is either dispatched to the plugin or
//! happened before its state was completed. But the runtime's answer may
//! lag behind the events: a container whose CreateContainer returned is in
//! the runtime's state only once the runtime recorded it, which may be
//! after the sync callback answered. Without more, such a container reaches
//! the plugin in neither Synchronize nor CreateContainer. So the adaptation
//! keeps its own record, from its event methods:
//!
//! * pods from RunPodSandbox until RemovePodSandbox;
//! * containers from a successful CreateContainer (as the plugins adjusted
//!   them) until RemoveContainer, with the state StartContainer and
//!   StopContainer set and the resources UpdateContainer set;
//! * while a sync is running, what was removed meanwhile.
//!
//! [`Known::complete`] adds to the runtime's answer what it lacks, leaves
//! out what was removed during the sync, and takes state and resources
//! from the record where an event changed them since the sync began.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use nri_proto::{api, sync::lock};

use crate::callbacks::RuntimeState;

/// One recorded container, and when it last changed.
#[derive(Debug)]
struct Entry {
    container: api::Container,
    changed: u64,
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<String, api::PodSandbox>,
    containers: HashMap<String, Entry>,
    /// Removed while a sync ran: kept out of that sync's payload even if
    /// the runtime still reported them.
    removed_pods: Vec<String>,
    removed_containers: Vec<String>,
    /// Counts changes, so a sync knows which happened after it began.
    generation: u64,
    /// Syncs in progress (their tombstones are kept until none is).
    syncing: usize,
}

/// The adaptation's record of pods and containers (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Known(Mutex<State>);

/// A sync in progress, from before the sync callback is called until the
/// plugin is in the registry. Dropping it ends the sync.
pub(crate) struct SyncTicket<'a> {
    known: &'a Known,
    began: u64,
}

impl Drop for SyncTicket<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.known.0);
        s.syncing -= 1;
        if s.syncing == 0 {
            s.removed_pods.clear();
            s.removed_containers.clear();
        }
    }
}

impl SyncTicket<'_> {
    /// `state` (the runtime's answer) completed with the record: pods and
    /// containers it lacks are added, those removed since the sync began
    /// are left out, and containers an event changed since then take
    /// state and resources from the record.
    pub fn complete(&self, mut state: RuntimeState) -> RuntimeState {
        let s = lock(&self.known.0);
        state.pods.retain(|p| !s.removed_pods.contains(&p.id));
        state.containers.retain(|c| !s.removed_containers.contains(&c.id));
        // By id: a large node has a thousand containers in both lists.
        let pods: HashSet<String> = state.pods.iter().map(|p| p.id.clone()).collect();
        for pod in s.pods.values() {
            if !pods.contains(&pod.id) {
                state.pods.push(pod.clone());
            }
        }
        let at: HashMap<String, usize> = state
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        for e in s.containers.values() {
            match at.get(&e.container.id).map(|&i| &mut state.containers[i]) {
                Some(c) if e.changed > self.began => {
                    c.state = e.container.state;
                    c.linux.mut_or_insert_default().resources = e
                        .container
                        .linux
                        .as_ref()
                        .map(|l| l.resources.clone())
                        .unwrap_or_default();
                }
                Some(_) => {}
                None => state.containers.push(e.container.clone()),
            }
        }
        state
    }
}

impl Known {
    /// Starts a sync: call before the sync callback.
    pub fn begin_sync(&self) -> SyncTicket<'_> {
        let mut s = lock(&self.0);
        s.syncing += 1;
        SyncTicket {
            known: self,
            began: s.generation,
        }
    }

    fn change(s: &mut State) -> u64 {
        s.generation += 1;
        s.generation
    }

    /// RunPodSandbox succeeded.
    pub fn pod_started(&self, pod: &api::PodSandbox) {
        let mut s = lock(&self.0);
        Self::change(&mut s);
        s.removed_pods.retain(|id| *id != pod.id);
        s.pods.insert(pod.id.clone(), pod.clone());
    }

    /// RemovePodSandbox was sent.
    pub fn pod_removed(&self, id: &str) {
        let mut s = lock(&self.0);
        Self::change(&mut s);
        s.pods.remove(id);
        if s.syncing > 0 {
            s.removed_pods.push(id.to_string());
        }
    }

    /// CreateContainer succeeded; `container` is as the plugins adjusted it.
    pub fn created(&self, mut container: api::Container) {
        let mut s = lock(&self.0);
        let changed = Self::change(&mut s);
        container.state = api::ContainerState::CONTAINER_CREATED.into();
        s.removed_containers.retain(|id| *id != container.id);
        s.containers.insert(container.id.clone(), Entry { container, changed });
    }

    /// StartContainer succeeded or StopContainer was sent: `state`.
    pub fn set_state(&self, id: &str, state: api::ContainerState) {
        let mut s = lock(&self.0);
        let changed = Self::change(&mut s);
        if let Some(e) = s.containers.get_mut(id) {
            e.container.state = state.into();
            e.changed = changed;
        }
    }

    /// UpdateContainer succeeded: `container` (as the runtime described it)
    /// now has `resources`.
    pub fn updated(&self, container: &api::Container, resources: &api::LinuxResources) {
        let mut s = lock(&self.0);
        let changed = Self::change(&mut s);
        let e = s.containers.entry(container.id.clone()).or_insert_with(|| Entry {
            container: container.clone(),
            changed,
        });
        e.container.linux.mut_or_insert_default().resources = protobuf::MessageField::some(resources.clone());
        e.changed = changed;
    }

    /// RemoveContainer was sent.
    pub fn container_removed(&self, id: &str) {
        let mut s = lock(&self.0);
        Self::change(&mut s);
        s.containers.remove(id);
        if s.syncing > 0 {
            s.removed_containers.push(id.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(id: &str) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: "p".into(),
            ..Default::default()
        }
    }

    fn ids(s: &RuntimeState) -> (Vec<&str>, Vec<&str>) {
        let mut p: Vec<_> = s.pods.iter().map(|p| p.id.as_str()).collect();
        let mut c: Vec<_> = s.containers.iter().map(|c| c.id.as_str()).collect();
        p.sort();
        c.sort();
        (p, c)
    }

    #[test]
    fn created_but_not_yet_reported_is_added_removed_is_left_out() {
        let k = Known::default();
        k.pod_started(&api::PodSandbox {
            id: "p".into(),
            ..Default::default()
        });
        k.created(ctr("a"));
        let t = k.begin_sync();
        k.created(ctr("b"));
        k.container_removed("gone");
        // The runtime has not recorded a or b yet and still lists "gone".
        let runtime = RuntimeState {
            pods: vec![],
            containers: vec![ctr("gone"), ctr("old")],
        };
        let s = t.complete(runtime);
        assert_eq!(ids(&s), (vec!["p"], vec!["a", "b", "old"]));
        assert_eq!(
            s.containers.iter().find(|c| c.id == "a").unwrap().state,
            api::ContainerState::CONTAINER_CREATED.into()
        );
        drop(t);
        assert!(lock(&k.0).removed_containers.is_empty(), "tombstones end with the sync");
    }

    #[test]
    fn changes_after_the_sync_began_win_over_the_runtime_answer() {
        let k = Known::default();
        k.created(ctr("a"));
        k.created(ctr("b"));
        let t = k.begin_sync();
        k.set_state("a", api::ContainerState::CONTAINER_RUNNING);
        let mut res = api::LinuxResources::new();
        res.cpu.mut_or_insert_default().cpus = "0-1".into();
        k.updated(&ctr("a"), &res);
        let mut reported_b = ctr("b");
        reported_b.state = api::ContainerState::CONTAINER_RUNNING.into();
        let s = t.complete(RuntimeState {
            pods: vec![],
            containers: vec![ctr("a"), reported_b],
        });
        let a = s.containers.iter().find(|c| c.id == "a").unwrap();
        assert_eq!(a.state, api::ContainerState::CONTAINER_RUNNING.into());
        assert_eq!(a.linux.resources.cpu.cpus, "0-1");
        // b changed before the sync began: the runtime's answer stands.
        let b = s.containers.iter().find(|c| c.id == "b").unwrap();
        assert_eq!(b.state, api::ContainerState::CONTAINER_RUNNING.into());
    }
}
