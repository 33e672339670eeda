//! Calling plugins for one runtime request: every subscribed plugin of the
//! registry's snapshot in invocation order, each bounded by the request
//! timeout (in the plugin's link), a failure judged by the plugin's
//! failure policy, and the answers merged.

use std::sync::Arc;

use nri_proto::{
    api::{self, Event, Field},
    events::event_name,
};

use crate::{
    callbacks::Callbacks,
    config::{FailurePolicy, Options},
    error::{Error, PluginError, ValidationError},
    observe::Rejection,
    permissions::{self, PermissionError, Permissions},
    plugin::Plugin,
    registry::Registry,
    result::{CreateResult, UpdateResult},
    validate::Validation,
};

/// What one plugin answered to CreateContainer.
#[derive(Debug, Clone)]
pub struct PluginResponse {
    /// `IDX-NAME`.
    pub plugin: String,
    /// Its response, if it answered (as sent, also when refused).
    pub response: Option<api::CreateContainerResponse>,
    /// Why it did not answer, if it failed; or why its answer was refused
    /// (`answer refused: plugin ... may not adjust ...`, see
    /// [`crate::permissions`]) and so not merged.
    pub error: Option<String>,
}

/// The plugins' part in one CreateContainer.
#[derive(Debug, Clone, Default)]
pub struct CreateReport {
    /// Each called plugin's answer, in call order.
    pub plugins: Vec<PluginResponse>,
    /// Field owners after the last merged response.
    pub owners: Option<api::OwningPlugins>,
}

/// One field, or one key of a keyed field, a plugin set or removed in a
/// CreateContainer: a line of the container's audit trail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldChange {
    /// NRI's name of the field (its `Field` enum: `Env`, `Mounts`,
    /// `MemLimit`, `CPUSetCPUs`, ...).
    pub field: String,
    /// The key within a keyed field: environment variable name, mount
    /// destination, annotation key, device path, rlimit type, sysctl.
    /// `None` for a simple field.
    pub key: Option<String>,
    /// `IDX-NAME` of the plugin.
    pub plugin: String,
    /// The plugin removed the field or key instead of setting it.
    pub removed: bool,
}

impl CreateReport {
    /// Who set or removed what in container `id`: the final field owners,
    /// plus the keys a plugin's answer only removed (annotations, mounts,
    /// env, devices, sysctls), which own nothing. Ordered by NRI field
    /// number, then key. OCI hooks, which accumulate, give one change per
    /// contributing plugin.
    pub fn changes(&self, id: &str) -> Vec<FieldChange> {
        let Some(owners) = self.owners.as_ref().and_then(|o| o.owners.get(id)) else {
            return Vec::new();
        };
        let name = |n: i32| match <api::Field as protobuf::Enum>::from_i32(n) {
            Some(f) => format!("{f:?}"),
            None => format!("field {n}"),
        };
        let change = |field: i32, key: Option<&str>, owner: &str| -> Vec<FieldChange> {
            let (plugins, removed) = match owner.strip_prefix('-') {
                Some(p) => (p, true),
                None => (owner, false),
            };
            plugins
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| FieldChange {
                    field: name(field),
                    key: key.map(str::to_string),
                    plugin: p.to_string(),
                    removed,
                })
                .collect()
        };
        let mut out: Vec<(i32, FieldChange)> = Vec::new();
        for (field, owner) in &owners.simple {
            out.extend(change(*field, None, owner).into_iter().map(|c| (*field, c)));
        }
        for (field, keyed) in &owners.compound {
            for (key, owner) in &keyed.owners {
                out.extend(change(*field, Some(key), owner).into_iter().map(|c| (*field, c)));
            }
        }
        // A key only removed has no owner (the merge leaves ownership
        // alone, as upstream): the plugin's own answer says who removed it.
        // An answer refused (permissions) is kept as sent but merged nothing.
        for p in self.plugins.iter().filter(|p| p.error.is_none()) {
            let Some(adjust) = p.response.as_ref().and_then(|r| r.adjust.as_ref()) else {
                continue;
            };
            let linux = adjust.linux.as_ref();
            let removals = [
                (
                    Field::Annotations,
                    adjust.annotations.keys().map(String::as_str).collect::<Vec<_>>(),
                ),
                (
                    Field::Mounts,
                    adjust.mounts.iter().map(|m| m.destination.as_str()).collect(),
                ),
                (Field::Env, adjust.env.iter().map(|e| e.key.as_str()).collect()),
                (
                    Field::Devices,
                    linux
                        .map(|l| l.devices.iter().map(|d| d.path.as_str()).collect())
                        .unwrap_or_default(),
                ),
                (
                    Field::Sysctl,
                    linux
                        .map(|l| l.sysctl.keys().map(String::as_str).collect())
                        .unwrap_or_default(),
                ),
            ];
            for (field, keys) in removals {
                for key in keys.iter().filter_map(|k| k.strip_prefix('-')) {
                    let known = out
                        .iter()
                        .any(|(f, c)| *f == field as i32 && c.key.as_deref() == Some(key) && c.plugin == p.plugin);
                    if !known {
                        out.push((
                            field as i32,
                            FieldChange {
                                field: name(field as i32),
                                key: Some(key.to_string()),
                                plugin: p.plugin.clone(),
                                removed: true,
                            },
                        ));
                    }
                }
            }
        }
        out.sort_by(|(fa, a), (fb, b)| (fa, &a.key, &a.plugin).cmp(&(fb, &b.key, &b.plugin)));
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// The plugins that changed container `id`, in call order.
    pub fn changed_by(&self, id: &str) -> Vec<String> {
        let changes = self.changes(id);
        self.plugins
            .iter()
            .map(|p| p.plugin.clone())
            .filter(|p| changes.iter().any(|c| &c.plugin == p))
            .collect()
    }
}

/// Evictions plugins asked for in their replies to one request, in reply
/// order. The caller delivers them to the evict callback once it released
/// the request lock: the runtime stops an evicted container with
/// StopContainer, another request.
#[derive(Debug, Default)]
pub(crate) struct Evictions(Vec<(String, Vec<api::ContainerEviction>)>);

impl Evictions {
    fn add(&mut self, plugin: &str, evict: Vec<api::ContainerEviction>) {
        if !evict.is_empty() {
            self.0.push((plugin.to_string(), evict));
        }
    }

    /// Passes every eviction to the runtime's evict callback.
    pub async fn deliver(self, callbacks: &Callbacks) {
        for (plugin, evict) in self.0 {
            callbacks.evict(&plugin, evict).await;
        }
    }
}

/// What dispatching one request needs of the adaptation. The caller holds
/// the request lock.
pub(crate) struct Dispatch<'a> {
    pub registry: &'a Arc<Registry>,
    pub callbacks: &'a Callbacks,
    pub opts: Arc<Options>,
}

impl Dispatch<'_> {
    /// Decides what a plugin failure means for the request in flight: a
    /// plugin's own error fails it; a timeout or broken connection drops
    /// the plugin and continues (`ignore`) or fails it (`fail`, keeping a
    /// plugin that only timed out).
    async fn failed(&self, p: &Arc<Plugin>, event: Event, e: PluginError) -> Result<(), Error> {
        let err = |source| Error::Plugin {
            plugin: p.name().to_string(),
            event: event_name(event),
            source,
        };
        if !e.is_fatal() {
            return Err(err(e));
        }
        match (p.policy, &e) {
            (FailurePolicy::Fail, PluginError::Timeout(_)) => {
                tracing::error!(plugin = %p.name(), event = event_name(event), error = %e, "NRI plugin timed out; failing the request (failure policy: fail)");
                Err(err(e))
            }
            (policy, _) => {
                tracing::error!(plugin = %p.name(), event = event_name(event), error = %e, "NRI plugin failed, removing it");
                self.registry.remove(p).await;
                match policy {
                    FailurePolicy::Fail => Err(err(e)),
                    FailurePolicy::Ignore => Ok(()),
                }
            }
        }
    }

    /// Passes on a merge result, telling the observer of a conflict.
    fn conflict<T, E>(&self, p: &Plugin, r: Result<T, E>) -> Result<T, E> {
        if r.is_err() {
            self.callbacks.rejected(p.name(), Rejection::Conflict);
        }
        r
    }

    /// Checks `p`'s answer with `check` against its permissions (those of
    /// the options this request took); `None` when it may be merged.
    fn refused(
        &self,
        p: &Plugin,
        check: impl FnOnce(&Permissions) -> Result<(), PermissionError>,
    ) -> Option<PermissionError> {
        self.opts.permissions(p.name()).and_then(|perms| check(perms).err())
    }

    /// A refused answer of `p` to `event`: the request fails (policy
    /// `fail`) or goes on without it (`ignore`); see [`permissions::refuse`].
    fn refuse(&self, p: &Plugin, event: Event, e: PermissionError) -> Result<(), Error> {
        Ok(permissions::refuse(self.callbacks, p.policy, event_name(event), e)?)
    }

    /// The subscribers of `event`, in invocation order.
    fn subscribers(&self, event: Event) -> impl Iterator<Item = Arc<Plugin>> {
        self.registry
            .snapshot()
            .into_iter()
            .filter(move |p| p.subscribed(event))
    }

    /// One of the notification events.
    pub async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), Error> {
        for p in self.subscribers(event) {
            if let Err(e) = p.notify(event, pod, container).await {
                self.failed(&p, event, e).await?;
            }
        }
        Ok(())
    }

    /// UpdatePodSandbox.
    pub async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), Error> {
        for p in self.subscribers(Event::UPDATE_POD_SANDBOX) {
            if let Err(e) = p.update_pod_sandbox(req).await {
                self.failed(&p, Event::UPDATE_POD_SANDBOX, e).await?;
            }
        }
        Ok(())
    }

    /// CreateContainer: each subscriber's adjustment checked against its
    /// permissions and merged in order, then the merged result validated;
    /// also the container as the plugins adjusted it. `report` records each
    /// answer (as sent, with the reason when it was refused) and the field
    /// owners; `evictions` collects the evictions of every merged reply,
    /// also when the request fails (they concern other containers). A
    /// refused answer is not merged, its evictions are not delivered and
    /// its plugin does not count as present for the required plugins.
    pub async fn create_container(
        &self,
        req: api::CreateContainerRequest,
        mut report: Option<&mut CreateReport>,
        evictions: &mut Evictions,
    ) -> Result<(api::CreateContainerResponse, api::Container), Error> {
        let plugins = self.registry.snapshot();
        let mut validation = Validation::new(&self.opts.default_validator, &plugins);
        let mut result = CreateResult::with_pristine(req, validation.is_active());
        for p in &plugins {
            if !p.subscribed(Event::CREATE_CONTAINER) {
                if !p.is_closed() {
                    validation.present(p);
                }
                continue;
            }
            match p.create_container(result.request()).await {
                Ok(mut rsp) => {
                    let refused = self.refused(p, |perms| perms.check_create(p.name(), &rsp));
                    // Reported as the plugin answered, evictions included.
                    if let Some(r) = report.as_deref_mut() {
                        r.plugins.push(PluginResponse {
                            plugin: p.name().to_string(),
                            response: Some(rsp.clone()),
                            error: refused.as_ref().map(|e| format!("answer refused: {e}")),
                        });
                    }
                    if let Some(e) = refused {
                        self.refuse(p, Event::CREATE_CONTAINER, e)?;
                        continue;
                    }
                    validation.present(p);
                    evictions.add(p.name(), std::mem::take(&mut rsp.evict));
                    let applied = result.apply(p.name(), rsp);
                    if let Some(r) = report.as_deref_mut() {
                        r.owners = Some(result.owners().into_proto());
                    }
                    self.conflict(p, applied)?;
                }
                Err(e) => {
                    if let Some(r) = report.as_deref_mut() {
                        r.plugins.push(PluginResponse {
                            plugin: p.name().to_string(),
                            response: None,
                            error: Some(e.to_string()),
                        });
                    }
                    self.failed(p, Event::CREATE_CONTAINER, e).await?
                }
            }
        }
        let done = result.finish();
        if let Some(r) = report {
            r.owners = Some(done.owners.to_owners().into_proto());
        }
        let verdict = validation
            .run(self.registry, done.pod, done.pristine, &done.response, done.owners)
            .await;
        if let Err(Error::Validation(e @ ValidationError::Rejected { .. })) = &verdict {
            self.callbacks.rejected(e.validator(), Rejection::Validation);
        }
        verdict?;
        Ok((done.response, done.container))
    }

    /// UpdateContainer: the subscribers' answers checked against their
    /// permissions, their evictions collected in `evictions`, their updates
    /// merged.
    pub async fn update_container(
        &self,
        req: api::UpdateContainerRequest,
        evictions: &mut Evictions,
    ) -> Result<Vec<api::ContainerUpdate>, Error> {
        let mut result = UpdateResult::for_update(req);
        for p in self.subscribers(Event::UPDATE_CONTAINER) {
            match p.update_container(result.update_request()).await {
                Ok(rsp) => {
                    let refused = self.refused(&p, |perms| {
                        perms.check_updates(p.name(), &rsp.update)?;
                        perms.check_evictions(p.name(), &rsp.evict)
                    });
                    if let Some(e) = refused {
                        self.refuse(&p, Event::UPDATE_CONTAINER, e)?;
                        continue;
                    }
                    evictions.add(p.name(), rsp.evict);
                    self.conflict(&p, result.apply(p.name(), rsp.update))?;
                }
                Err(e) => self.failed(&p, Event::UPDATE_CONTAINER, e).await?,
            }
        }
        Ok(result.into_updates())
    }

    /// StopContainer: the subscribers' updates of other containers checked
    /// against their permissions and merged.
    pub async fn stop_container(&self, req: &api::StopContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        let mut result = UpdateResult::for_stop();
        for p in self.subscribers(Event::STOP_CONTAINER) {
            match p.stop_container(req).await {
                Ok(rsp) => match self.refused(&p, |perms| perms.check_updates(p.name(), &rsp.update)) {
                    Some(e) => self.refuse(&p, Event::STOP_CONTAINER, e)?,
                    None => self.conflict(&p, result.apply(p.name(), rsp.update))?,
                },
                Err(e) => self.failed(&p, Event::STOP_CONTAINER, e).await?,
            }
        }
        Ok(result.into_updates())
    }
}
