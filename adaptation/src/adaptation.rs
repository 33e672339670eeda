//! [`Adaptation`]: the NRI runtime side a runtime embeds.

use std::{
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex, RwLock, Weak},
    time::Duration,
};

use async_trait::async_trait;
use futures::future::join_all;
use nri_proto::{
    api::{self, Event},
    events::event_name,
};
use tokio::{net::UnixListener, task::JoinHandle};

use crate::{
    config::{FailurePolicy, Options},
    error::{BoxError, Error, PluginError},
    launch,
    plugin::{HandshakeParams, Host, LaunchedIdentity, Plugin},
    result::{CreateResult, UpdateResult},
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What one plugin answered to CreateContainer.
#[derive(Debug, Clone)]
pub struct PluginResponse {
    /// `IDX-NAME`.
    pub plugin: String,
    /// Its response, if it answered.
    pub response: Option<api::CreateContainerResponse>,
    /// Why it did not, if it failed.
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

/// The runtime's current pods and containers, as sent to plugins in
/// Synchronize.
#[derive(Debug, Clone, Default)]
pub struct RuntimeState {
    /// Every pod sandbox the runtime knows.
    pub pods: Vec<api::PodSandbox>,
    /// Every container the runtime knows.
    pub containers: Vec<api::Container>,
}

type SyncFn = Arc<dyn Fn() -> BoxFuture<Result<RuntimeState, BoxError>> + Send + Sync>;
type UpdateFn =
    Arc<dyn Fn(Vec<api::ContainerUpdate>) -> BoxFuture<Result<Vec<api::ContainerUpdate>, BoxError>> + Send + Sync>;
type EvictFn = Arc<dyn Fn(api::ContainerEviction) -> BoxFuture<Result<(), BoxError>> + Send + Sync>;

/// Builds an [`Adaptation`]; see [`Adaptation::builder`].
pub struct AdaptationBuilder {
    name: String,
    version: String,
    sync_fn: Option<SyncFn>,
    update_fn: Option<UpdateFn>,
    evict_fn: Option<EvictFn>,
    opts: Options,
    builtins: Vec<Builtin>,
}

/// An in-process plugin registered with [`AdaptationBuilder::with_builtin_plugin`].
#[derive(Clone)]
struct Builtin {
    idx: String,
    base: String,
    events: nri_proto::events::EventMask,
    plugin: Arc<dyn nri_proto::plugin::Plugin>,
}

impl AdaptationBuilder {
    /// Adds a plugin that runs inside the runtime's process: the same
    /// [`Plugin`](nri_proto::plugin::Plugin) trait (`nri_stub::Plugin`) as out-of-process Rust plugins, called
    /// directly (no socket, no serialization). `events` is its
    /// subscription unless its `configure` returns a non-empty mask.
    /// Builtins start before pre-installed plugins; one that fails to
    /// configure or sync makes [`Adaptation::start`] fail (as upstream).
    pub fn with_builtin_plugin(
        mut self,
        idx: impl Into<String>,
        name: impl Into<String>,
        events: nri_proto::events::EventMask,
        plugin: Arc<dyn nri_proto::plugin::Plugin>,
    ) -> Self {
        self.builtins.push(Builtin {
            idx: idx.into(),
            base: name.into(),
            events,
            plugin,
        });
        self
    }

    /// The runtime's state provider, called before a plugin is synchronized
    /// (once for all pre-installed plugins at start, once per external
    /// plugin). Required.
    pub fn with_sync_fn<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RuntimeState, BoxError>> + Send + 'static,
    {
        self.sync_fn = Some(Arc::new(move || Box::pin(f())));
        self
    }

    /// Applies container updates that plugins asked for outside a runtime
    /// request (Synchronize replies, unsolicited UpdateContainers) and
    /// returns those that failed. Called without any adaptation lock held,
    /// possibly while a runtime request is in flight: the runtime serializes
    /// access to its own state. Required.
    pub fn with_update_fn<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Vec<api::ContainerUpdate>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<api::ContainerUpdate>, BoxError>> + Send + 'static,
    {
        self.update_fn = Some(Arc::new(move |u| Box::pin(f(u))));
        self
    }

    /// Evicts (stops) a container a plugin asked to evict, with its reason.
    /// Upstream NRI parses evictions and drops them; with this callback set
    /// they are acted on. Without it, evictions are logged and ignored.
    pub fn with_evict_fn<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(api::ContainerEviction) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.evict_fn = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }

    /// Replaces all options.
    pub fn with_options(mut self, opts: Options) -> Self {
        self.opts = opts;
        self
    }

    /// Socket for external plugins (default `/var/run/nri/nri.sock`).
    pub fn with_socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.opts.socket_path = path.into();
        self
    }

    /// Directory of pre-installed plugins (default `/opt/nri/plugins`).
    pub fn with_plugin_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.opts.plugin_path = path.into();
        self
    }

    /// Drop-in configuration directory (default `/etc/nri/conf.d`).
    pub fn with_plugin_config_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.opts.plugin_config_path = path.into();
        self
    }

    /// Registration timeout (default 5 s).
    pub fn with_registration_timeout(mut self, t: Duration) -> Self {
        self.opts.registration_timeout = t;
        self
    }

    /// Per-request timeout (default 2 s).
    pub fn with_request_timeout(mut self, t: Duration) -> Self {
        self.opts.request_timeout = t;
        self
    }

    /// No socket for external plugins; pre-installed plugins still run.
    pub fn with_disabled_connections(mut self) -> Self {
        self.opts.disable_connections = true;
        self
    }

    /// Failure policy of one plugin, by `NAME` or `IDX-NAME`.
    pub fn with_failure_policy(mut self, plugin: impl Into<String>, policy: FailurePolicy) -> Self {
        self.opts.failure_policies.insert(plugin.into(), policy);
        self
    }

    /// Enables the built-in default validator (`00-default-validator`)
    /// with `cfg` (its `enable` flag is set for you).
    pub fn with_default_validator(mut self, mut cfg: crate::validate::DefaultValidatorConfig) -> Self {
        cfg.enable = true;
        self.opts.default_validator = cfg;
        self
    }

    /// Failure policy of plugins without their own.
    pub fn with_default_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.opts.default_failure_policy = policy;
        self
    }

    /// Checks the callbacks and builds the (stopped) adaptation.
    ///
    /// # Errors
    /// [`Error::MissingCallback`] without a sync or update callback.
    pub fn build(self) -> Result<Adaptation, Error> {
        let sync_fn = self.sync_fn.ok_or(Error::MissingCallback("sync"))?;
        let update_fn = self.update_fn.ok_or(Error::MissingCallback("update"))?;
        Ok(Adaptation {
            inner: Arc::new(Inner {
                name: self.name,
                version: self.version,
                sync_fn,
                update_fn,
                evict_fn: self.evict_fn,
                opts: self.opts,
                builtins: self.builtins,
                plugins: RwLock::new(Vec::new()),
                request_lock: tokio::sync::Mutex::new(()),
                sync_lock: Arc::new(tokio::sync::RwLock::new(())),
                run: Mutex::new(RunState::default()),
                lifecycle: tokio::sync::Mutex::new(()),
                reserved: Mutex::new(Default::default()),
            }),
        })
    }
}

/// The runtime side of NRI.
///
/// A runtime builds one per node with [`Adaptation::builder`], calls
/// [`Adaptation::start`], then one method per pod or container lifecycle
/// event. Plugins are called one after another in index order (ties broken
/// by name); each gets the request timeout.
///
/// ```no_run
/// use nri_adaptation::{Adaptation, RuntimeState};
///
/// # async fn demo() -> Result<(), nri_adaptation::Error> {
/// let nri = Adaptation::builder("my-runtime", "1.0.0")
///     .with_sync_fn(|| async { Ok(RuntimeState::default()) })
///     .with_update_fn(|_updates| async { Ok(Vec::new()) })
///     .with_socket_path("/tmp/nri.sock")
///     .build()?;
/// nri.start().await?;
/// // nri.create_container(request).await? ...
/// nri.stop().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Adaptation {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    version: String,
    sync_fn: SyncFn,
    update_fn: UpdateFn,
    evict_fn: Option<EvictFn>,
    opts: Options,
    builtins: Vec<Builtin>,
    /// Active plugins, sorted by (index, name).
    plugins: RwLock<Vec<Arc<Plugin>>>,
    /// Serializes runtime requests (and start/stop), as upstream's mutex.
    request_lock: tokio::sync::Mutex<()>,
    /// Read side: runtime operations that must not interleave with an
    /// external plugin's sync; write side: that sync.
    sync_lock: Arc<tokio::sync::RwLock<()>>,
    run: Mutex<RunState>,
    /// Serializes start and stop (never held while dispatching events).
    lifecycle: tokio::sync::Mutex<()>,
    /// `IDX-NAME` of every registered (or registering) plugin.
    reserved: Mutex<std::collections::HashSet<String>>,
}

#[derive(Default)]
struct RunState {
    running: bool,
    listener: Option<JoinHandle<()>>,
    /// The bound socket and its (device, inode): removed at stop only if
    /// it is still ours, not a successor's that took the path over.
    socket_path: Option<(PathBuf, (u64, u64))>,
}

/// Held by a runtime around an operation that must not interleave with the
/// synchronization of a newly connected plugin (NRI `BlockPluginSync`).
pub struct PluginSyncBlock {
    _guard: tokio::sync::OwnedRwLockReadGuard<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Adaptation {
    /// Starts building an adaptation for runtime `name` at `version`; both
    /// are reported to plugins in Configure.
    pub fn builder(name: impl Into<String>, version: impl Into<String>) -> AdaptationBuilder {
        AdaptationBuilder {
            name: name.into(),
            version: version.into(),
            sync_fn: None,
            update_fn: None,
            evict_fn: None,
            opts: Options::default(),
            builtins: Vec::new(),
        }
    }

    /// The options in effect.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Launches, configures and synchronizes the pre-installed plugins, then
    /// opens the socket for external plugins. Idempotent.
    ///
    /// Pre-installed plugins are synchronized with one call of the sync
    /// callback before this returns, so they see the runtime's existing
    /// pods and containers before any event (also after a restart). A
    /// plugin that fails to start, register, configure or sync is logged
    /// and left out.
    ///
    /// # Errors
    /// [`Error::PluginDir`], [`Error::SyncCallback`], or [`Error::Socket`]
    /// naming the socket path when the listener cannot be set up; on error
    /// nothing is left running.
    pub async fn start(&self) -> Result<(), Error> {
        // Not the request lock: the sync and update callbacks run below, and
        // a runtime may hold its own lock while calling an event method (R7).
        let _life = self.inner.lifecycle.lock().await;
        if lock(&self.inner.run).running {
            return Ok(());
        }
        let mut builtins = Vec::new();
        for b in &self.inner.builtins {
            let host: Arc<dyn Host> = Arc::new(HostRef(Arc::downgrade(&self.inner)));
            let policy = self.inner.opts.failure_policy(&b.idx, &b.base);
            match Plugin::builtin(
                b.idx.clone(),
                b.base.clone(),
                b.events,
                b.plugin.clone(),
                &self.params(),
                host,
                policy,
            )
            .await
            {
                Ok(p) => builtins.push(p),
                Err(e) => {
                    for p in &builtins {
                        p.close().await;
                    }
                    return Err(Error::Builtin {
                        plugin: format!("{}-{}", b.idx, b.base),
                        reason: e.to_string(),
                    });
                }
            }
        }
        let n_builtins = builtins.len();
        let mut launched = builtins;
        launched.extend(self.launch_plugins().await?);
        let mut ready = Vec::new();
        if !launched.is_empty() {
            let state = match (self.inner.sync_fn)().await {
                Ok(s) => s,
                Err(e) => {
                    for p in &launched {
                        p.shutdown(Duration::ZERO).await;
                    }
                    return Err(Error::SyncCallback(e));
                }
            };
            let mut updates = Vec::new();
            for (i, p) in launched.into_iter().enumerate() {
                match p.synchronize(&state.pods, &state.containers).await {
                    Ok(u) => {
                        updates.extend(u);
                        ready.push(p);
                    }
                    Err(e) if i < n_builtins => {
                        for p in &ready {
                            p.shutdown(Duration::ZERO).await;
                        }
                        p.close().await;
                        return Err(Error::Builtin {
                            plugin: p.name().to_string(),
                            reason: format!("synchronize failed: {e}"),
                        });
                    }
                    Err(e) => {
                        tracing::error!(plugin = %p.name(), error = %e, "failed to synchronize pre-installed NRI plugin, dropping it");
                        p.close().await;
                        p.kill().await;
                    }
                }
            }
            self.apply_updates(updates).await;
        }
        for p in ready {
            self.add_plugin(p);
        }
        // Running before the listener opens, so an early connection is kept.
        lock(&self.inner.run).running = true;
        if let Err(e) = self.start_listener().await {
            lock(&self.inner.run).running = false;
            for p in self.take_plugins() {
                p.shutdown(Duration::ZERO).await;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Stops the adaptation: closes the socket (and removes its file),
    /// sends Shutdown to every plugin (bounded by the request timeout),
    /// closes every connection, external ones included, and kills launched
    /// plugins. [`Adaptation::start`] may be called again afterwards.
    pub async fn stop(&self) {
        let _life = self.inner.lifecycle.lock().await;
        let (listener, socket) = {
            let mut run = lock(&self.inner.run);
            run.running = false;
            (run.listener.take(), run.socket_path.take())
        };
        if let Some(task) = listener {
            task.abort();
            let _ = task.await;
        }
        if let Some((path, inode)) = socket
            && socket_inode(&path) == Some(inode)
        {
            let _ = std::fs::remove_file(path);
        }
        let wait = self.inner.opts.request_timeout.min(Duration::from_secs(1));
        join_all(
            self.take_plugins()
                .into_iter()
                .map(|p| async move { p.shutdown(wait).await }),
        )
        .await;
    }

    /// Whether [`Adaptation::start`] succeeded and [`Adaptation::stop`] was not called.
    pub fn is_running(&self) -> bool {
        lock(&self.inner.run).running
    }

    /// Whether a plugin that dialled the socket is connected (a runtime
    /// may stay up for it).
    pub fn has_external_plugins(&self) -> bool {
        self.snapshot()
            .iter()
            .any(|p| matches!(p.origin, crate::plugin::PluginOrigin::External { .. }))
    }

    /// `IDX-NAME` of the active plugins, in invocation order.
    pub fn plugin_names(&self) -> Vec<String> {
        self.snapshot().iter().map(|p| p.name().to_string()).collect()
    }

    /// Holds off the synchronization of newly connected plugins until the
    /// returned guard is dropped (NRI `BlockPluginSync`). Take it before
    /// any runtime lock the sync callback also takes.
    pub async fn block_plugin_sync(&self) -> PluginSyncBlock {
        PluginSyncBlock {
            _guard: self.inner.sync_lock.clone().read_owned().await,
        }
    }

    async fn launch_plugins(&self) -> Result<Vec<Arc<Plugin>>, Error> {
        let found = launch::discover(&self.inner.opts.plugin_path)?;
        let params = self.params();
        let tasks = found.into_iter().map(|d| {
            let params = params.clone();
            let host: Arc<dyn Host> = Arc::new(HostRef(Arc::downgrade(&self.inner)));
            let inner = self.inner.clone();
            async move {
                let config = match launch::plugin_config(&inner.opts.plugin_config_path, &d.idx, &d.base) {
                    Ok(c) => c,
                    Err((file, e)) => {
                        tracing::error!(plugin = %format!("{}-{}", d.idx, d.base), file = %file.display(), error = %e, "cannot read NRI plugin configuration, not starting the plugin");
                        return None;
                    }
                };
                let (stream, child) = match launch::spawn(&d) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(path = %d.path.display(), error = %e, "failed to launch NRI plugin");
                        return None;
                    }
                };
                let identity = LaunchedIdentity {
                    idx: d.idx.clone(),
                    base: d.base.clone(),
                    config,
                    path: d.path.clone(),
                    child,
                };
                match Plugin::handshake(stream, Some(identity), &params, host, |i, b| inner.opts.failure_policy(i, b)).await {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::warn!(path = %d.path.display(), error = %e, "NRI plugin failed to start");
                        None
                    }
                }
            }
        });
        Ok(join_all(tasks).await.into_iter().flatten().collect())
    }

    fn params(&self) -> HandshakeParams {
        HandshakeParams {
            runtime_name: self.inner.name.clone(),
            runtime_version: self.inner.version.clone(),
            registration_timeout: self.inner.opts.registration_timeout,
            request_timeout: self.inner.opts.request_timeout,
        }
    }

    async fn start_listener(&self) -> Result<(), Error> {
        if self.inner.opts.disable_connections {
            tracing::info!("NRI external plugin connections disabled");
            return Ok(());
        }
        let path = self.inner.opts.socket_path.clone();
        let (listener, inode) = bind_socket(&path).await?;
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(accept_loop(weak, listener));
        let mut run = lock(&self.inner.run);
        run.listener = Some(task);
        run.socket_path = Some((path, inode));
        Ok(())
    }

    fn snapshot(&self) -> Vec<Arc<Plugin>> {
        self.inner.snapshot()
    }

    fn add_plugin(&self, p: Arc<Plugin>) {
        self.inner.add_plugin(p);
    }

    fn take_plugins(&self) -> Vec<Arc<Plugin>> {
        std::mem::take(&mut *self.inner.plugins.write().unwrap_or_else(|p| p.into_inner()))
    }

    async fn apply_updates(&self, updates: Vec<api::ContainerUpdate>) {
        self.inner.apply_updates(updates).await;
    }

    /// Decides what a plugin failure means for the request in flight.
    async fn plugin_failed(&self, p: &Arc<Plugin>, event: Event, e: PluginError) -> Result<(), Error> {
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
                self.inner.remove_plugin(p).await;
                match policy {
                    FailurePolicy::Fail => Err(err(e)),
                    FailurePolicy::Ignore => Ok(()),
                }
            }
        }
    }

    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), Error> {
        let _req = self.inner.request_lock.lock().await;
        for p in self.snapshot() {
            if !p.subscribed(event) {
                continue;
            }
            if let Err(e) = p.notify(event, pod, container).await {
                self.plugin_failed(&p, event, e).await?;
            }
        }
        Ok(())
    }

    /// Relays RunPodSandbox.
    ///
    /// # Errors
    /// [`Error::Plugin`] when a plugin returns an error (or fails with
    /// failure policy `fail`).
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        self.notify(Event::RUN_POD_SANDBOX, pod, None).await
    }

    /// Relays UpdatePodSandbox (overhead and new resources of the pod).
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn update_pod_sandbox(&self, req: &api::UpdatePodSandboxRequest) -> Result<(), Error> {
        let _req = self.inner.request_lock.lock().await;
        for p in self.snapshot() {
            if !p.subscribed(Event::UPDATE_POD_SANDBOX) {
                continue;
            }
            if let Err(e) = p.update_pod_sandbox(req).await {
                self.plugin_failed(&p, Event::UPDATE_POD_SANDBOX, e).await?;
            }
        }
        Ok(())
    }

    /// Relays PostUpdatePodSandbox.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        self.notify(Event::POST_UPDATE_POD_SANDBOX, pod, None).await
    }

    /// Relays StopPodSandbox.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        self.notify(Event::STOP_POD_SANDBOX, pod, None).await
    }

    /// Relays RemovePodSandbox.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        self.notify(Event::REMOVE_POD_SANDBOX, pod, None).await
    }

    /// Relays CreateContainer to every subscribed plugin in order, merges
    /// their adjustments, and returns the merged adjustment (apply it with
    /// [`crate::adjust`]) and updates for other containers.
    ///
    /// # Errors
    /// [`Error::Merge`] naming both plugins and the field on a conflict,
    /// [`Error::Plugin`] when a plugin fails the request, and
    /// [`Error::Validation`] when a validator rejects the result. Nothing
    /// partial is returned.
    pub async fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, Error> {
        self.create_container_inner(req, None).await
    }

    /// [`Adaptation::create_container`], also reporting what each plugin
    /// answered and who owns which field: how an operator or a plugin
    /// author sees which plugin changed what (`nri-replay` prints it).
    pub async fn create_container_with_report(
        &self,
        req: api::CreateContainerRequest,
    ) -> (Result<api::CreateContainerResponse, Error>, CreateReport) {
        let mut report = CreateReport::default();
        let r = self.create_container_inner(req, Some(&mut report)).await;
        (r, report)
    }

    async fn create_container_inner(
        &self,
        req: api::CreateContainerRequest,
        mut report: Option<&mut CreateReport>,
    ) -> Result<api::CreateContainerResponse, Error> {
        let _req = self.inner.request_lock.lock().await;
        let plugins = self.snapshot();
        let validating = self.inner.opts.default_validator.enable
            || plugins
                .iter()
                .any(|p| p.subscribed(Event::VALIDATE_CONTAINER_ADJUSTMENT));
        let mut result = CreateResult::with_pristine(req, validating);
        // Plugins present for validation: builtins, plugins that do not
        // handle CreateContainer, and those that answered it. A plugin that
        // failed or timed out does not count (fix of NRI #316, case R5).
        // Only validators read it: no list without them.
        let mut present = Vec::new();
        if self.inner.opts.default_validator.enable {
            present.push(instance("00", "default-validator"));
        }
        for p in &plugins {
            if !p.subscribed(Event::CREATE_CONTAINER) {
                if validating && !p.is_closed() {
                    present.push(instance(&p.idx, &p.base));
                }
                continue;
            }
            match p.create_container(result.request()).await {
                Ok(rsp) => {
                    if validating {
                        present.push(instance(&p.idx, &p.base));
                    }
                    if let Some(r) = report.as_deref_mut() {
                        r.plugins.push(PluginResponse {
                            plugin: p.name().to_string(),
                            response: Some(rsp.clone()),
                            error: None,
                        });
                    }
                    let applied = result.apply(p.name(), rsp);
                    if let Some(r) = report.as_deref_mut() {
                        r.owners = Some(result.owners().into_proto());
                    }
                    applied?;
                }
                Err(e) => {
                    if let Some(r) = report.as_deref_mut() {
                        r.plugins.push(PluginResponse {
                            plugin: p.name().to_string(),
                            response: None,
                            error: Some(e.to_string()),
                        });
                    }
                    self.plugin_failed(p, Event::CREATE_CONTAINER, e).await?
                }
            }
        }
        let done = result.finish();
        if let Some(r) = report {
            r.owners = Some(done.owners.to_owners().into_proto());
        }
        self.validate(&plugins, done.pod, done.pristine, &done.response, done.owners, present)
            .await?;
        Ok(done.response)
    }

    /// Runs every validator concurrently; the first rejection or failure in
    /// plugin order (the built-in validator first) fails the create.
    async fn validate(
        &self,
        plugins: &[Arc<Plugin>],
        pod: api::PodSandbox,
        pristine: api::Container,
        rsp: &api::CreateContainerResponse,
        owners: crate::result::PendingOwners,
        present: Vec<api::PluginInstance>,
    ) -> Result<(), Error> {
        let validators: Vec<&Arc<Plugin>> = plugins
            .iter()
            .filter(|p| p.subscribed(Event::VALIDATE_CONTAINER_ADJUSTMENT))
            .collect();
        let builtin = self.inner.opts.default_validator.enable;
        if validators.is_empty() && !builtin {
            return Ok(());
        }
        let req = api::ValidateContainerAdjustmentRequest {
            pod: protobuf::MessageField::some(pod),
            container: protobuf::MessageField::some(pristine),
            adjust: rsp.adjust.clone(),
            update: rsp.update.clone(),
            owners: protobuf::MessageField::some(owners.into_owners().into_proto()),
            plugins: present,
            ..Default::default()
        };
        if builtin {
            let v = crate::validate::DefaultValidator::new(self.inner.opts.default_validator.clone());
            if let Err(reason) = v.validate(&req) {
                return Err(Error::Validation(format!(
                    "validator {:?} rejected container adjustment, reason: {reason}",
                    crate::validate::DEFAULT_VALIDATOR_NAME
                )));
            }
        }
        let results = join_all(validators.iter().map(|p| p.validate(&req))).await;
        let mut first = None;
        for (p, r) in validators.iter().zip(results) {
            let err = match r {
                Ok(v) if !v.reject => continue,
                Ok(v) => {
                    let reason = if v.reason.is_empty() {
                        "unknown rejection reason".to_string()
                    } else {
                        v.reason
                    };
                    format!(
                        "validator {:?} rejected container adjustment, reason: {reason}",
                        p.name()
                    )
                }
                Err(e) => {
                    if e.is_fatal() {
                        self.inner.remove_plugin(p).await;
                    }
                    format!("validator plugin {} failed: {e}", p.name())
                }
            };
            first.get_or_insert(err);
        }
        match first {
            Some(e) => Err(Error::Validation(e)),
            None => Ok(()),
        }
    }

    /// Relays PostCreateContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn post_create_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::POST_CREATE_CONTAINER, pod, Some(container)).await
    }

    /// Relays StartContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn start_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::START_CONTAINER, pod, Some(container)).await
    }

    /// Relays PostStartContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn post_start_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::POST_START_CONTAINER, pod, Some(container)).await
    }

    /// Relays UpdateContainer and merges the plugins' updates. The last
    /// element is the updated container's complete new resources (the
    /// requested ones plus plugin overrides); the others target other
    /// containers and are applied first.
    ///
    /// # Errors
    /// [`Error::Merge`] on conflicting updates, [`Error::Plugin`].
    pub async fn update_container(&self, req: api::UpdateContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        let _req = self.inner.request_lock.lock().await;
        let mut result = UpdateResult::for_update(req);
        for p in self.snapshot() {
            if !p.subscribed(Event::UPDATE_CONTAINER) {
                continue;
            }
            match p.update_container(result.update_request()).await {
                Ok(rsp) => {
                    self.evict(p.name(), rsp.evict).await;
                    result.apply(p.name(), rsp.update)?;
                }
                Err(e) => self.plugin_failed(&p, Event::UPDATE_CONTAINER, e).await?,
            }
        }
        Ok(result.into_updates())
    }

    /// Relays PostUpdateContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn post_update_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::POST_UPDATE_CONTAINER, pod, Some(container)).await
    }

    /// Relays StopContainer and merges the updates plugins ask for in
    /// reaction (e.g. giving the stopped container's CPUs to others).
    ///
    /// # Errors
    /// [`Error::Merge`], [`Error::Plugin`].
    pub async fn stop_container(&self, req: api::StopContainerRequest) -> Result<Vec<api::ContainerUpdate>, Error> {
        let _req = self.inner.request_lock.lock().await;
        let mut result = UpdateResult::for_stop();
        for p in self.snapshot() {
            if !p.subscribed(Event::STOP_CONTAINER) {
                continue;
            }
            match p.stop_container(&req).await {
                Ok(rsp) => result.apply(p.name(), rsp.update)?,
                Err(e) => self.plugin_failed(&p, Event::STOP_CONTAINER, e).await?,
            }
        }
        Ok(result.into_updates())
    }

    /// Relays RemoveContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::REMOVE_CONTAINER, pod, Some(container)).await
    }

    async fn evict(&self, plugin: &str, evictions: Vec<api::ContainerEviction>) {
        self.inner.evict(plugin, evictions).await;
    }
}

fn instance(idx: &str, base: &str) -> api::PluginInstance {
    api::PluginInstance {
        name: base.to_string(),
        index: idx.to_string(),
        ..Default::default()
    }
}

impl Inner {
    fn snapshot(&self) -> Vec<Arc<Plugin>> {
        self.plugins.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn add_plugin(self: &Arc<Self>, p: Arc<Plugin>) {
        {
            let mut list = self.plugins.write().unwrap_or_else(|e| e.into_inner());
            list.push(p.clone());
            // Stable order: index, then name (upstream leaves ties unordered).
            list.sort_by(|a, b| (a.idx.as_str(), a.base.as_str()).cmp(&(b.idx.as_str(), b.base.as_str())));
        }
        tracing::info!(plugin = %p.name(), origin = ?p.origin, "NRI plugin active");
        // Drop the plugin as soon as its connection goes away.
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            p.closed().await;
            if let Some(inner) = weak.upgrade() {
                inner.remove_plugin(&p).await;
            }
        });
    }

    async fn remove_plugin(&self, p: &Arc<Plugin>) {
        let removed = {
            let mut list = self.plugins.write().unwrap_or_else(|e| e.into_inner());
            let before = list.len();
            list.retain(|q| !Arc::ptr_eq(q, p));
            before != list.len()
        };
        if removed {
            tracing::info!(plugin = %p.name(), "NRI plugin removed");
        }
        p.close().await;
        p.kill().await;
    }

    async fn apply_updates(&self, updates: Vec<api::ContainerUpdate>) {
        if updates.is_empty() {
            return;
        }
        match (self.update_fn)(updates).await {
            Ok(failed) if !failed.is_empty() => {
                let ids: Vec<_> = failed.iter().map(|u| u.container_id.as_str()).collect();
                tracing::warn!(containers = ?ids, "runtime failed to apply NRI container updates");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "runtime failed to apply NRI container updates"),
        }
    }

    async fn evict(&self, plugin: &str, evictions: Vec<api::ContainerEviction>) {
        for ev in evictions {
            match &self.evict_fn {
                Some(f) => {
                    tracing::info!(plugin, container = %ev.container_id, reason = %ev.reason, "NRI plugin evicts container");
                    let id = ev.container_id.clone();
                    if let Err(e) = f(ev).await {
                        tracing::error!(plugin, container = %id, error = %e, "failed to evict container");
                    }
                }
                None => {
                    tracing::warn!(plugin, container = %ev.container_id, "runtime cannot evict containers; eviction ignored")
                }
            }
        }
    }

    /// Registers, configures and synchronizes an external plugin.
    async fn connect_external(self: Arc<Self>, stream: tokio::net::UnixStream) {
        let host: Arc<dyn Host> = Arc::new(HostRef(Arc::downgrade(&self)));
        let params = HandshakeParams {
            runtime_name: self.name.clone(),
            runtime_version: self.version.clone(),
            registration_timeout: self.opts.registration_timeout,
            request_timeout: self.opts.request_timeout,
        };
        let plugin = match Plugin::handshake(stream, None, &params, host, |i, b| self.opts.failure_policy(i, b)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "external NRI plugin failed to connect");
                return;
            }
        };
        let _sync = self.sync_lock.write().await;
        let state = match (self.sync_fn)().await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(plugin = %plugin.name(), error = %e, "runtime failed to list pods and containers, closing NRI plugin");
                plugin.close().await;
                return;
            }
        };
        match plugin.synchronize(&state.pods, &state.containers).await {
            Ok(updates) => {
                self.apply_updates(updates).await;
                if lock(&self.run).running && !plugin.is_closed() {
                    self.add_plugin(plugin);
                } else {
                    plugin.close().await;
                }
            }
            Err(e) => {
                tracing::error!(plugin = %plugin.name(), error = %e, "failed to synchronize NRI plugin, closing it");
                plugin.close().await;
            }
        }
    }
}

struct HostRef(Weak<Inner>);

#[async_trait]
impl Host for HostRef {
    fn reserve(&self, idx: &str, base: &str) -> bool {
        self.0
            .upgrade()
            .is_some_and(|i| lock(&i.reserved).insert(format!("{idx}-{base}")))
    }

    fn release(&self, idx: &str, base: &str) {
        if let Some(i) = self.0.upgrade() {
            lock(&i.reserved).remove(&format!("{idx}-{base}"));
        }
    }

    async fn update_containers(
        &self,
        plugin: &str,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, BoxError> {
        let inner = self.0.upgrade().ok_or("NRI adaptation is gone")?;
        // No adaptation lock here: a plugin may call this from inside an
        // event handler while the runtime waits for that event (NRI #301).
        inner.evict(plugin, evict).await;
        if update.is_empty() {
            return Ok(Vec::new());
        }
        (inner.update_fn)(update).await
    }
}

/// Prepares the socket path and listens: parent directory created 0700, a
/// stale socket (or other file) at the path removed.
/// How long a live socket at the configured path may take to go away (a
/// predecessor handing over) before the path counts as in use.
const SOCKET_HANDOVER: Duration = Duration::from_secs(2);

fn socket_inode(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Creates the parent directory (0700) and listens on `path`. A stale
/// socket is replaced (NRI); unlike upstream, a socket somebody still
/// listens on, or a path that is not a socket, is an error rather than
/// silently unlinked.
async fn bind_socket(path: &std::path::Path) -> Result<(UnixListener, (u64, u64)), Error> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    let err = |what, source| Error::Socket {
        path: path.to_path_buf(),
        what,
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err("cannot create parent directory", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(err(
                "the path exists and is not a socket",
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        Ok(_) => {
            let deadline = tokio::time::Instant::now() + SOCKET_HANDOVER;
            while std::os::unix::net::UnixStream::connect(path).is_ok() {
                if tokio::time::Instant::now() >= deadline {
                    return Err(err(
                        "another process listens on it (another runtime? set a different socket path or disable external connections)",
                        std::io::ErrorKind::AddrInUse.into(),
                    ));
                }
                // Each probe is a connection the other side logs as a
                // failed plugin: few of them.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            match std::fs::remove_file(path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed stale NRI socket"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err("cannot remove stale socket", e)),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("cannot inspect the path", e)),
    }
    let listener = UnixListener::bind(path).map_err(|e| err("cannot listen", e))?;
    let inode = socket_inode(path)
        .ok_or_else(|| err("cannot inspect the bound socket", std::io::ErrorKind::NotFound.into()))?;
    Ok((listener, inode))
}

async fn accept_loop(inner: Weak<Inner>, listener: UnixListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "failed to accept NRI plugin connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        tokio::spawn(inner.connect_external(stream));
    }
}
