//! The merge of container updates (CreateContainer's updates of other
//! containers, UpdateContainer and StopContainer).

use nri_proto::api;
use protobuf::MessageField;

use super::MergeError;
use crate::{
    resources::{self, Rules},
    result::owners::Owners,
};

/// Merged container updates, in first-touch order.
#[derive(Debug, Clone, Default)]
pub(super) struct Updates {
    pub(super) list: Vec<api::ContainerUpdate>,
}

impl Updates {
    fn position(&self, id: &str) -> Option<usize> {
        self.list.iter().position(|u| u.container_id == id)
    }

    /// Merges `updates` from `plugin`. `target` is the UpdateContainer
    /// request whose container's resources start from the request.
    pub(super) fn merge(
        &mut self,
        owners: &mut Owners,
        plugin: &str,
        updates: Vec<api::ContainerUpdate>,
        mut target: Option<&mut api::UpdateContainerRequest>,
    ) -> Result<(), MergeError> {
        for u in updates {
            let Some(res) = u.linux.resources.as_ref() else {
                // Nothing to merge, but the container is touched (upstream
                // creates the entry before looking at resources).
                self.entry(&u);
                continue;
            };
            let id = u.container_id.clone();
            let is_target = target.as_ref().is_some_and(|t| t.container.id == id);
            let previous_flag = self.position(&id).map(|i| self.list[i].ignore_failure);
            let idx = self.entry(&u);
            let base = if is_target {
                target
                    .as_ref()
                    .expect("target")
                    .linux_resources
                    .get_or_default()
                    .clone()
            } else {
                self.list[idx].linux.resources.get_or_default().clone()
            };
            // Transactional per update: claims and entry survive only on success.
            let saved = owners.clone();
            match merge_update_resources(owners, &id, plugin, res, base) {
                Ok(merged) => {
                    if let (true, Some(t)) = (is_target, target.as_mut()) {
                        t.linux_resources = MessageField::some(merged.clone());
                    }
                    self.list[idx].linux.mut_or_insert_default().resources = MessageField::some(merged);
                }
                Err(e) if u.ignore_failure => {
                    // Leave no trace of the failed update (upstream keeps its
                    // claims and its entry).
                    tracing::info!(plugin, container = %id, error = %e, "ignoring failed container update");
                    *owners = saved;
                    match previous_flag {
                        Some(flag) => self.list[idx].ignore_failure = flag,
                        None => {
                            self.list.remove(idx);
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The merged entry for `u`'s container, created on first touch.
    fn entry(&mut self, u: &api::ContainerUpdate) -> usize {
        if let Some(i) = self.position(&u.container_id) {
            let e = &mut self.list[i];
            e.ignore_failure = e.ignore_failure && u.ignore_failure;
            return i;
        }
        let mut e = api::ContainerUpdate::new();
        e.container_id = u.container_id.clone();
        e.ignore_failure = u.ignore_failure;
        let res = e.linux.mut_or_insert_default().resources.mut_or_insert_default();
        res.memory.mut_or_insert_default();
        res.cpu.mut_or_insert_default();
        self.list.push(e);
        self.list.len() - 1
    }
}

/// `u` merged over `base`: updates carry no device rules into the merge
/// (upstream). Fix of upstream: the pids limit applied is the plugin's
/// (upstream tests the existing value instead).
pub(super) fn merge_update_resources(
    owners: &mut Owners,
    id: &str,
    plugin: &str,
    u: &api::LinuxResources,
    mut base: api::LinuxResources,
) -> Result<api::LinuxResources, MergeError> {
    resources::merge(owners.field_owners_mut(id), plugin, u, &mut [&mut base], Rules::Keep)?;
    Ok(base)
}

/// Accumulates UpdateContainer or StopContainer replies.
#[derive(Debug, Clone)]
pub struct UpdateResult {
    /// For UpdateContainer: the request, whose resources track the target's
    /// merged resources. `None` for StopContainer.
    request: Option<api::UpdateContainerRequest>,
    updates: Updates,
    owners: Owners,
}

impl UpdateResult {
    /// For UpdateContainer: the target's entry starts from the requested
    /// resources (normalized: `memory` and `cpu` present).
    pub fn for_update(mut request: api::UpdateContainerRequest) -> Self {
        let res = request.linux_resources.mut_or_insert_default();
        res.memory.mut_or_insert_default();
        res.cpu.mut_or_insert_default();
        request.pod.mut_or_insert_default();
        request.container.mut_or_insert_default();
        UpdateResult {
            request: Some(request),
            updates: Updates::default(),
            owners: Owners::new(),
        }
    }

    /// For StopContainer.
    pub fn for_stop() -> Self {
        UpdateResult {
            request: None,
            updates: Updates::default(),
            owners: Owners::new(),
        }
    }

    /// The UpdateContainer request as the next plugin sees it (its
    /// resources include earlier plugins' overrides).
    ///
    /// # Panics
    /// On a StopContainer result.
    pub fn update_request(&self) -> &api::UpdateContainerRequest {
        self.request.as_ref().expect("UpdateContainer result")
    }

    /// Merges one plugin's updates.
    ///
    /// # Errors
    /// [`MergeError::Conflict`] when two plugins set the same resource of
    /// the same container (unless every contributor allowed failure).
    pub fn apply(&mut self, plugin: &str, updates: Vec<api::ContainerUpdate>) -> Result<(), MergeError> {
        self.updates
            .merge(&mut self.owners, plugin, updates, self.request.as_mut())
    }

    /// The merged updates. For UpdateContainer the last element is the
    /// target container: its complete new resources.
    pub fn into_updates(self) -> Vec<api::ContainerUpdate> {
        let mut list = self.updates.list;
        if let Some(req) = self.request {
            let id = req.container.id.clone();
            let pos = list.iter().position(|u| u.container_id == id);
            let mut target = match pos {
                Some(i) => list.remove(i),
                None => {
                    let mut e = api::ContainerUpdate::new();
                    e.container_id = id;
                    e
                }
            };
            target.linux.mut_or_insert_default().resources = req.linux_resources;
            list.push(target);
        }
        list
    }
}
