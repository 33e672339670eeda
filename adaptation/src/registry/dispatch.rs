//! Calling plugins for one runtime request: the request is admitted to the
//! plugins' order ([`crate::registry::turns`]), every subscribed plugin is
//! called at its turn, each call bounded by the request timeout (in the
//! plugin's link), a failure judged by the plugin's failure policy, and
//! the answers merged in invocation order.
//!
//! Notifications, UpdatePodSandbox, StopContainer and ValidateContainer-
//! Adjustment go to their subscribers side by side: no plugin's request
//! depends on another's answer. CreateContainer and UpdateContainer go to
//! a plugin with the [`PluginView::Adjusted`] view once every plugin before
//! it answered (its request holds their adjustments, as upstream), and to
//! one with the [`PluginView::Original`] view at once. Whatever the
//! timing, answers are merged in invocation order and the first failure in
//! that order is the request's, so the outcome is that of calling the
//! plugins one after another with the same answers.

use std::{future::Future, sync::Arc};

use futures::future::join_all;
use nri_proto::{
    api::{self, Event, Field},
    events::event_name,
};

use crate::{
    callbacks::Callbacks,
    config::{FailurePolicy, Options, PluginView},
    error::{Error, PluginError, ValidationError},
    observe::Rejection,
    permissions::{self, PermissionError, Permissions},
    plugin::{Joined, Plugin},
    registry::{
        Registry,
        turns::{Admission, Flight, Turn},
    },
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

/// One plugin of an admitted request, with its turn for each step of the
/// request (`None`: it does not take that step's event).
pub(crate) struct Entry {
    pub plugin: Arc<Plugin>,
    pub turns: Vec<Option<Turn>>,
}

impl Entry {
    /// Takes the turn for step `i`.
    fn take(&mut self, i: usize) -> Option<Turn> {
        self.turns.get_mut(i).and_then(Option::take)
    }
}

/// A request admitted to the plugins' order: finished when dropped.
pub(crate) struct Admitted {
    _flight: Flight,
    /// Every plugin of the order at admission, in invocation order.
    entries: Vec<Entry>,
}

/// Each plugin called side by side with its answer (`None`: passed by,
/// see [`at_turn`]), in invocation order.
type Answers<T> = Vec<(Arc<Plugin>, Option<Result<T, PluginError>>)>;

/// `p`'s answer, asked with `call` once `turn` came up; `None` when the
/// plugin's sync failed meanwhile (requests admitted behind its sync pass
/// it by, as if it had never joined). The turn is finished as soon as the
/// plugin answered, so it serves its next request while this one merges.
async fn at_turn<T, F>(p: &Plugin, turn: Turn, call: impl FnOnce() -> F) -> Option<Result<T, PluginError>>
where
    F: Future<Output = Result<T, PluginError>>,
{
    turn.ready().await;
    if p.joined() == Joined::Failed {
        return None;
    }
    let r = call().await;
    drop(turn);
    Some(r)
}

/// What dispatching one request needs of the adaptation.
pub(crate) struct Dispatch<'a> {
    pub registry: &'a Arc<Registry>,
    pub callbacks: &'a Callbacks,
    pub admission: &'a Arc<Admission>,
    pub opts: Arc<Options>,
}

impl Dispatch<'_> {
    /// Admits a request whose steps are `steps` (a plugin of the order gets
    /// a turn for each step whose event it subscribes to, in that order).
    pub fn admit(&self, steps: &[Event]) -> Admitted {
        let (flight, entries) = self.admission.admit(|| {
            self.registry
                .lineup()
                .into_iter()
                .map(|plugin| {
                    let mask = plugin.events();
                    let closed = plugin.is_closed();
                    let turns = steps
                        .iter()
                        .map(|&e| (!closed && mask.is_set(e)).then(|| plugin.turns.issue()))
                        .collect();
                    Entry { plugin, turns }
                })
                .collect()
        });
        Admitted {
            _flight: flight,
            entries,
        }
    }

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

    /// A plugin failure after the request already failed on an earlier
    /// plugin: only what it means for the plugin (a broken one is removed).
    async fn failed_too(&self, p: &Arc<Plugin>, event: Event, e: PluginError) {
        let _ = self.failed(p, event, e).await;
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

    /// Calls every plugin with a turn for step 0 of `entries` side by side
    /// (each at its turn); their answers in invocation order.
    async fn side_by_side<'p, T, F>(&self, entries: &'p mut [Entry], call: impl Fn(&'p Plugin) -> F) -> Answers<T>
    where
        F: Future<Output = Result<T, PluginError>> + 'p,
    {
        let calls: Vec<_> = entries
            .iter_mut()
            .filter_map(|e: &'p mut Entry| {
                let turn = e.take(0)?;
                let e: &'p Entry = e;
                Some((&e.plugin, turn))
            })
            .map(|(p, turn)| {
                let fut = call(p);
                async move { (p.clone(), at_turn(p, turn, || fut).await) }
            })
            .collect();
        join_all(calls).await
    }

    /// The first failure in invocation order among answers that carry
    /// nothing to merge; every failure still counts for its plugin.
    async fn first_failure(&self, event: Event, answers: Answers<()>) -> Result<(), Error> {
        let mut first = Ok(());
        for (p, r) in answers {
            if let Some(Err(e)) = r {
                if first.is_ok() {
                    first = self.failed(&p, event, e).await;
                } else {
                    self.failed_too(&p, event, e).await;
                }
            }
        }
        first
    }

    /// One of the notification events, to its subscribers side by side.
    pub async fn notify(
        &self,
        admitted: &mut Admitted,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), Error> {
        let answers = self
            .side_by_side(&mut admitted.entries, |p| p.notify(event, pod, container))
            .await;
        self.first_failure(event, answers).await
    }

    /// UpdatePodSandbox, to its subscribers side by side.
    pub async fn update_pod_sandbox(
        &self,
        admitted: &mut Admitted,
        req: &api::UpdatePodSandboxRequest,
    ) -> Result<(), Error> {
        let answers = self
            .side_by_side(&mut admitted.entries, |p| p.update_pod_sandbox(req))
            .await;
        self.first_failure(Event::UPDATE_POD_SANDBOX, answers).await
    }

    /// The view plugin `p` has in this request.
    fn view(&self, p: &Plugin) -> PluginView {
        self.opts.view(&p.idx, &p.base)
    }

    /// CreateContainer (steps: CreateContainer, then ValidateContainer-
    /// Adjustment): each subscriber's adjustment checked against its
    /// permissions and merged in invocation order, then the merged result
    /// validated; also the container as the plugins adjusted it. `report`
    /// records each answer (as sent, with the reason when it was refused)
    /// and the field owners; `evictions` collects the evictions of every
    /// merged reply, also when the request fails (they concern other
    /// containers). A refused answer is not merged, its evictions are not
    /// delivered and its plugin does not count as present for the required
    /// plugins. When it fails, the plugins called side by side have all
    /// answered before this returns, so StopContainer and RemoveContainer
    /// the runtime sends for the failed create reach every plugin after it.
    pub async fn create_container(
        &self,
        admitted: &mut Admitted,
        req: api::CreateContainerRequest,
        mut report: Option<&mut CreateReport>,
        evictions: &mut Evictions,
    ) -> Result<(api::CreateContainerResponse, api::Container), Error> {
        let plugins: Vec<Arc<Plugin>> = admitted.entries.iter().map(|e| e.plugin.clone()).collect();
        let mut validation = Validation::new(&self.opts.default_validator, &plugins);
        let mut result = CreateResult::with_pristine(req, validation.is_active());
        // Plugins with the original view get the request as it is now, at
        // once; the others in turn below.
        let early: Vec<Option<tokio::task::JoinHandle<_>>> = {
            let mut original: Option<Arc<api::CreateContainerRequest>> = None;
            admitted
                .entries
                .iter_mut()
                .map(|e| {
                    if self.view(&e.plugin) != PluginView::Original {
                        return None;
                    }
                    let turn = e.take(0)?;
                    let req = original
                        .get_or_insert_with(|| Arc::new(result.request().clone()))
                        .clone();
                    let p = e.plugin.clone();
                    Some(tokio::spawn(async move {
                        at_turn(&p, turn, || p.create_container(&req)).await
                    }))
                })
                .collect()
        };
        let mut early = early.into_iter();
        let mut outcome = Ok(());
        for e in admitted.entries.iter_mut() {
            // Given up when the request failed before this plugin's turn.
            let own_turn = e.take(0);
            let p = &e.plugin;
            let spawned = early.next().flatten();
            if outcome.is_err() {
                // Failed already: later plugins are not called; those called
                // side by side have their answers, which only count for them.
                if let Some(h) = spawned
                    && let Ok(Some(Err(err))) = h.await
                {
                    self.failed_too(p, Event::CREATE_CONTAINER, err).await;
                }
                continue;
            }
            let answer = match (spawned, own_turn) {
                (Some(h), _) => h
                    .await
                    .unwrap_or_else(|j| Some(Err(PluginError::Protocol(format!("CreateContainer call ended: {j}"))))),
                (None, Some(turn)) => at_turn(p, turn, || p.create_container(result.request())).await,
                (None, None) => {
                    // Not subscribed: present if connected and synchronized.
                    if !p.is_closed() && p.joined() == Joined::Active {
                        validation.present(p);
                    }
                    continue;
                }
            };
            let Some(answer) = answer else { continue };
            outcome = match answer {
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
                    if let Some(err) = refused {
                        self.refuse(p, Event::CREATE_CONTAINER, err)
                    } else {
                        validation.present(p);
                        evictions.add(p.name(), std::mem::take(&mut rsp.evict));
                        let applied = result.apply(p.name(), rsp);
                        if let Some(r) = report.as_deref_mut() {
                            r.owners = Some(result.owners().into_proto());
                        }
                        self.conflict(p, applied).map_err(Error::from)
                    }
                }
                Err(err) => {
                    if let Some(r) = report.as_deref_mut() {
                        r.plugins.push(PluginResponse {
                            plugin: p.name().to_string(),
                            response: None,
                            error: Some(err.to_string()),
                        });
                    }
                    self.failed(p, Event::CREATE_CONTAINER, err).await
                }
            };
        }
        outcome?;
        let done = result.finish();
        if let Some(r) = report {
            r.owners = Some(done.owners.to_owners().into_proto());
        }
        let validators: Vec<(Arc<Plugin>, Turn)> = admitted
            .entries
            .iter_mut()
            .filter_map(|e| e.take(1).map(|t| (e.plugin.clone(), t)))
            .collect();
        let verdict = validation
            .run(
                self.registry,
                validators,
                done.pod,
                done.pristine,
                &done.response,
                done.owners,
            )
            .await;
        if let Err(Error::Validation(e @ ValidationError::Rejected { .. })) = &verdict {
            self.callbacks.rejected(e.validator(), Rejection::Validation);
        }
        verdict?;
        Ok((done.response, done.container))
    }

    /// UpdateContainer: the subscribers' answers checked against their
    /// permissions, their evictions collected in `evictions`, their updates
    /// merged in invocation order (plugins with the original view called
    /// side by side, the others each once those before it answered).
    pub async fn update_container(
        &self,
        admitted: &mut Admitted,
        req: api::UpdateContainerRequest,
        evictions: &mut Evictions,
    ) -> Result<Vec<api::ContainerUpdate>, Error> {
        let mut result = UpdateResult::for_update(req);
        let early: Vec<Option<tokio::task::JoinHandle<_>>> = {
            let mut original: Option<Arc<api::UpdateContainerRequest>> = None;
            admitted
                .entries
                .iter_mut()
                .map(|e| {
                    if self.view(&e.plugin) != PluginView::Original {
                        return None;
                    }
                    let turn = e.take(0)?;
                    let req = original
                        .get_or_insert_with(|| Arc::new(result.update_request().clone()))
                        .clone();
                    let p = e.plugin.clone();
                    Some(tokio::spawn(async move {
                        at_turn(&p, turn, || p.update_container(&req)).await
                    }))
                })
                .collect()
        };
        let mut early = early.into_iter();
        let mut outcome = Ok(());
        for e in admitted.entries.iter_mut() {
            // Given up when the request failed before this plugin's turn.
            let own_turn = e.take(0);
            let p = &e.plugin;
            let spawned = early.next().flatten();
            if outcome.is_err() {
                if let Some(h) = spawned
                    && let Ok(Some(Err(err))) = h.await
                {
                    self.failed_too(p, Event::UPDATE_CONTAINER, err).await;
                }
                continue;
            }
            let answer = match (spawned, own_turn) {
                (Some(h), _) => h
                    .await
                    .unwrap_or_else(|j| Some(Err(PluginError::Protocol(format!("UpdateContainer call ended: {j}"))))),
                (None, Some(turn)) => at_turn(p, turn, || p.update_container(result.update_request())).await,
                (None, None) => continue,
            };
            outcome = match answer {
                None => Ok(()),
                Some(Ok(rsp)) => {
                    let refused = self.refused(p, |perms| {
                        perms.check_updates(p.name(), &rsp.update)?;
                        perms.check_evictions(p.name(), &rsp.evict)
                    });
                    if let Some(err) = refused {
                        self.refuse(p, Event::UPDATE_CONTAINER, err)
                    } else {
                        evictions.add(p.name(), rsp.evict);
                        self.conflict(p, result.apply(p.name(), rsp.update))
                            .map_err(Error::from)
                    }
                }
                Some(Err(err)) => self.failed(p, Event::UPDATE_CONTAINER, err).await,
            };
        }
        outcome.map(|()| result.into_updates())
    }

    /// StopContainer, to its subscribers side by side: their updates of
    /// other containers checked against their permissions and merged in
    /// invocation order.
    pub async fn stop_container(
        &self,
        admitted: &mut Admitted,
        req: &api::StopContainerRequest,
    ) -> Result<Vec<api::ContainerUpdate>, Error> {
        let answers = self
            .side_by_side(&mut admitted.entries, |p| p.stop_container(req))
            .await;
        let mut result = UpdateResult::for_stop();
        let mut outcome = Ok(());
        for (p, answer) in answers {
            if outcome.is_err() {
                if let Some(Err(err)) = answer {
                    self.failed_too(&p, Event::STOP_CONTAINER, err).await;
                }
                continue;
            }
            outcome = match answer {
                None => Ok(()),
                Some(Ok(rsp)) => match self.refused(&p, |perms| perms.check_updates(p.name(), &rsp.update)) {
                    Some(err) => self.refuse(&p, Event::STOP_CONTAINER, err),
                    None => self
                        .conflict(&p, result.apply(p.name(), rsp.update))
                        .map_err(Error::from),
                },
                Some(Err(err)) => self.failed(&p, Event::STOP_CONTAINER, err).await,
            };
        }
        outcome.map(|()| result.into_updates())
    }
}
