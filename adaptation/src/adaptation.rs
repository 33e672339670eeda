//! [`Adaptation`]: the NRI runtime side a runtime embeds. Start and stop,
//! and one method per lifecycle event; the work is done by the registry,
//! sync, dispatch, validation and socket modules.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::join_all;
use nri_proto::api::{self, Event};
use nri_proto::sync::lock;

use crate::{
    builder::Builtin,
    callbacks::Callbacks,
    config::Options,
    error::Error,
    known::Known,
    registry::Registry,
    registry::dispatch::{CreateReport, Dispatch, Evictions},
    registry::socket::Listener,
    registry::sync::{self, PluginSyncBlock},
    registry::turns::Admission,
};

/// The runtime side of NRI.
///
/// A runtime builds one per node with [`Adaptation::builder`], calls
/// [`Adaptation::start`], then one method per pod or container lifecycle
/// event, from as many tasks at once as it likes. Plugins are ordered by
/// index (ties broken by name); each gets the requests in the order the
/// runtime's calls were admitted, one at a time, and each call gets the
/// request timeout. No lock is held across a request's plugin chain: see
/// the crate docs, "Ordering", for what a plugin can rely on.
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
    pub(crate) inner: Arc<Inner>,
}

/// State shared by the adaptation's handles and its background tasks.
pub(crate) struct Inner {
    pub name: String,
    pub version: String,
    pub callbacks: Callbacks,
    /// Swapped whole by [`Adaptation::reconfigure`]; a request works on
    /// the copy it took.
    opts: std::sync::RwLock<Arc<Options>>,
    pub builtins: Vec<Builtin>,
    pub registry: Arc<Registry>,
    /// The order of runtime requests and joining plugins' syncs (see
    /// [`crate::registry::turns`]).
    pub admission: Arc<Admission>,
    /// What the event methods saw of pods and containers, completing the
    /// runtime's answer to a sync.
    pub known: Known,
    /// Read side: runtime operations that must not interleave with an
    /// external plugin's sync; write side: that sync.
    pub sync_lock: Arc<tokio::sync::RwLock<()>>,
    run: Mutex<RunState>,
    /// Serializes start and stop (never held while dispatching events).
    pub lifecycle: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct RunState {
    running: bool,
    listener: Option<Listener>,
}

impl Inner {
    fn run(&self) -> std::sync::MutexGuard<'_, RunState> {
        lock(&self.run)
    }

    /// Whether [`Adaptation::start`] succeeded and [`Adaptation::stop`] was not called.
    pub fn is_running(&self) -> bool {
        self.run().running
    }

    pub(crate) fn dispatch(&self) -> Dispatch<'_> {
        Dispatch {
            registry: &self.registry,
            callbacks: &self.callbacks,
            admission: &self.admission,
            opts: self.opts(),
        }
    }

    /// The options in effect.
    pub fn opts(&self) -> Arc<Options> {
        nri_proto::sync::read(&self.opts).clone()
    }

    /// Puts `opts` in effect for what starts from now on.
    pub fn set_opts(&self, opts: Options) {
        *nri_proto::sync::write(&self.opts) = Arc::new(opts);
    }
}

impl Adaptation {
    /// A stopped adaptation (see [`crate::AdaptationBuilder::build`]).
    pub(crate) fn from_parts(
        name: String,
        version: String,
        callbacks: Callbacks,
        opts: Options,
        builtins: Vec<Builtin>,
    ) -> Adaptation {
        Adaptation {
            inner: Arc::new(Inner {
                name,
                version,
                callbacks,
                opts: std::sync::RwLock::new(Arc::new(opts)),
                builtins,
                registry: Arc::new(Registry::default()),
                admission: Arc::default(),
                known: Known::default(),
                sync_lock: Arc::new(tokio::sync::RwLock::new(())),
                run: Mutex::new(RunState::default()),
                lifecycle: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The options in effect (see [`Adaptation::reconfigure`]).
    pub fn options(&self) -> Arc<Options> {
        self.inner.opts()
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
        if self.inner.is_running() {
            return Ok(());
        }
        sync::start_plugins(&self.inner).await?;
        // Running before the listener opens, so an early connection is kept.
        self.inner.run().running = true;
        if let Err(e) = self.start_listener().await {
            self.inner.run().running = false;
            for p in self.inner.registry.take_all() {
                p.shutdown(Duration::ZERO).await;
            }
            return Err(e);
        }
        Ok(())
    }

    async fn start_listener(&self) -> Result<(), Error> {
        let opts = self.inner.opts();
        if opts.disable_connections {
            tracing::info!("NRI external plugin connections disabled");
            return Ok(());
        }
        let weak = Arc::downgrade(&self.inner);
        let listener = Listener::open(&opts.socket_path, move |stream| match weak.upgrade() {
            Some(inner) => {
                tokio::spawn(sync::connect_external(inner, stream));
                true
            }
            None => false,
        })
        .await?;
        self.inner.run().listener = Some(listener);
        Ok(())
    }

    /// Stops the adaptation: closes the socket (and removes its file),
    /// sends Shutdown to every plugin (bounded by the request timeout),
    /// closes every connection, external ones included, and kills launched
    /// plugins. [`Adaptation::start`] may be called again afterwards.
    pub async fn stop(&self) {
        let _life = self.inner.lifecycle.lock().await;
        let listener = {
            let mut run = self.inner.run();
            run.running = false;
            run.listener.take()
        };
        if let Some(listener) = listener {
            listener.close().await;
        }
        let wait = self.inner.opts().request_timeout.min(Duration::from_secs(1));
        join_all(
            self.inner
                .registry
                .take_all()
                .into_iter()
                .map(|p| async move { p.shutdown(wait).await }),
        )
        .await;
    }

    /// Whether [`Adaptation::start`] succeeded and [`Adaptation::stop`] was not called.
    pub fn is_running(&self) -> bool {
        self.inner.is_running()
    }

    /// Whether a plugin that dialled the socket is connected (a runtime
    /// may stay up for it).
    pub fn has_external_plugins(&self) -> bool {
        self.inner.registry.has_external()
    }

    /// `IDX-NAME` of the active plugins, in invocation order.
    pub fn plugin_names(&self) -> Vec<String> {
        self.inner.registry.names()
    }

    /// Holds off the synchronization of newly connected plugins until the
    /// returned guard is dropped (NRI `BlockPluginSync`). Take it before
    /// any runtime lock the sync callback also takes. Not needed around a
    /// create: a container created while a plugin joins reaches it anyway
    /// (see the crate docs, "Creates against plugin sync").
    pub async fn block_plugin_sync(&self) -> PluginSyncBlock {
        PluginSyncBlock {
            _guard: self.inner.sync_lock.clone().read_owned().await,
        }
    }

    async fn notify(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), Error> {
        let d = self.inner.dispatch();
        let mut admitted = d.admit(&[event]);
        let r = d.notify(&mut admitted, event, pod, container).await;
        // Recorded before the request counts as finished, so a sync that
        // waits for it sees it (see `crate::known`).
        let known = &self.inner.known;
        match (event, container) {
            (Event::RUN_POD_SANDBOX, _) if r.is_ok() => known.pod_started(pod),
            (Event::REMOVE_POD_SANDBOX, _) => known.pod_removed(&pod.id),
            (Event::START_CONTAINER, Some(c)) if r.is_ok() => {
                known.set_state(&c.id, api::ContainerState::CONTAINER_RUNNING)
            }
            (Event::REMOVE_CONTAINER, Some(c)) => known.container_removed(&c.id),
            _ => {}
        }
        drop(admitted);
        r
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
        let d = self.inner.dispatch();
        let mut admitted = d.admit(&[Event::UPDATE_POD_SANDBOX]);
        d.update_pod_sandbox(&mut admitted, req).await
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
        self.create(req, None).await
    }

    /// [`Adaptation::create_container`], also reporting what each plugin
    /// answered and who owns which field: how an operator or a plugin
    /// author sees which plugin changed what (`nri-replay` prints it).
    pub async fn create_container_with_report(
        &self,
        req: api::CreateContainerRequest,
    ) -> (Result<api::CreateContainerResponse, Error>, CreateReport) {
        let mut report = CreateReport::default();
        let r = self.create(req, Some(&mut report)).await;
        (r, report)
    }

    /// CreateContainer admitted to the plugins' order, the created
    /// container recorded for later syncs; evictions delivered once the
    /// request is finished.
    async fn create(
        &self,
        req: api::CreateContainerRequest,
        report: Option<&mut CreateReport>,
    ) -> Result<api::CreateContainerResponse, Error> {
        let mut evictions = Evictions::default();
        let r = {
            let d = self.inner.dispatch();
            let mut admitted = d.admit(&[Event::CREATE_CONTAINER, Event::VALIDATE_CONTAINER_ADJUSTMENT]);
            let r = d.create_container(&mut admitted, req, report, &mut evictions).await;
            // Not `?`: the evictions of a failed create are delivered too.
            r.map(|(rsp, container)| {
                self.inner.known.created(container);
                rsp
            })
        };
        evictions.deliver(&self.inner.callbacks).await;
        r
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
        let mut evictions = Evictions::default();
        let r = {
            let d = self.inner.dispatch();
            let mut admitted = d.admit(&[Event::UPDATE_CONTAINER]);
            let target = req.container.clone().unwrap_or_default();
            let r = d.update_container(&mut admitted, req, &mut evictions).await;
            if let Ok(Some(last)) = r.as_ref().map(|u| u.last()) {
                self.inner.known.updated(&target, last.linux.resources.get_or_default());
            }
            drop(admitted);
            r
        };
        evictions.deliver(&self.inner.callbacks).await;
        r
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
        let d = self.inner.dispatch();
        let mut admitted = d.admit(&[Event::STOP_CONTAINER]);
        let r = d.stop_container(&mut admitted, &req).await;
        // Stopped whatever the plugins answered: StopContainer reports it.
        self.inner
            .known
            .set_state(&req.container.id, api::ContainerState::CONTAINER_STOPPED);
        drop(admitted);
        r
    }

    /// Relays RemoveContainer.
    ///
    /// # Errors
    /// As [`Adaptation::run_pod_sandbox`].
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) -> Result<(), Error> {
        self.notify(Event::REMOVE_CONTAINER, pod, Some(container)).await
    }
}
