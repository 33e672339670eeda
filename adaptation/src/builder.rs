//! [`AdaptationBuilder`]: the runtime's identity, callbacks, options and
//! builtin plugins, checked into a stopped [`Adaptation`].

use std::{path::PathBuf, sync::Arc, time::Duration};

use nri_proto::{api, events::EventMask};

use crate::{
    adaptation::Adaptation,
    callbacks::{Callbacks, EvictFn, RuntimeState, SyncFn, UpdateFn},
    config::{FailurePolicy, Options},
    error::{BoxError, Error},
    observe::Observer,
    permissions::Permissions,
};

/// Builds an [`Adaptation`]; see [`Adaptation::builder`].
pub struct AdaptationBuilder {
    name: String,
    version: String,
    sync_fn: Option<SyncFn>,
    update_fn: Option<UpdateFn>,
    evict_fn: Option<EvictFn>,
    observer: Option<Arc<dyn Observer>>,
    opts: Options,
    builtins: Vec<Builtin>,
}

/// An in-process plugin registered with [`AdaptationBuilder::with_builtin_plugin`].
#[derive(Clone)]
pub(crate) struct Builtin {
    pub idx: String,
    pub base: String,
    pub events: EventMask,
    pub plugin: Arc<dyn nri_proto::plugin::Plugin>,
}

impl AdaptationBuilder {
    /// Adds a plugin that runs inside the runtime's process: the same
    /// [`Plugin`](nri_proto::plugin::Plugin) trait as out-of-process Rust
    /// plugins (nri-stub re-exports it), called directly through the same
    /// request adapter (no socket, no serialization). `events` is its
    /// subscription unless its `configure` returns a non-empty mask.
    /// Builtins start before pre-installed plugins; one that fails to
    /// configure or sync makes [`Adaptation::start`] fail (as upstream).
    pub fn with_builtin_plugin(
        mut self,
        idx: impl Into<String>,
        name: impl Into<String>,
        events: EventMask,
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
    /// they are acted on: those in CreateContainer and UpdateContainer
    /// replies (once the request is over, whether it succeeded or not) and
    /// those of unsolicited UpdateContainers. Without it, evictions are
    /// logged and ignored.
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

    /// Tells `observer` about every plugin request (its latency and
    /// outcome) and every plugin answer refused for a conflict, by a
    /// validator or for a field outside the plugin's permissions, e.g. for
    /// metrics. Default: nobody is told.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
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

    /// What one plugin, by `NAME` or `IDX-NAME`, may change (see
    /// [`crate::permissions`]).
    ///
    /// ```
    /// use nri_adaptation::{Adaptation, FieldGroup, Permissions};
    /// let b = Adaptation::builder("rt", "1")
    ///     .with_plugin_permissions("10-pinner", Permissions::allowing([FieldGroup::Cpu, FieldGroup::Memory]))
    ///     .with_default_permissions(Permissions::allowing([]));
    /// # let _ = b;
    /// ```
    pub fn with_plugin_permissions(mut self, plugin: impl Into<String>, permissions: Permissions) -> Self {
        self.opts.plugin_permissions.insert(plugin.into(), permissions);
        self
    }

    /// What plugins without permissions of their own may change (default:
    /// anything).
    pub fn with_default_permissions(mut self, permissions: Permissions) -> Self {
        self.opts.default_permissions = Some(permissions);
        self
    }

    /// The sandbox of WebAssembly plugins: memory limit and grants (see
    /// [`crate::wasm`]; default: 64 MiB, nothing granted).
    ///
    /// ```
    /// use nri_adaptation::{Adaptation, wasm::{WasmGrants, WasmOptions}};
    /// let mut wasm = WasmOptions { memory_limit: 32 << 20, ..Default::default() };
    /// let mut grants = WasmGrants::default();
    /// grants.env.insert("NODE_NAME".into(), "node-1".into());
    /// wasm.plugins.insert("10-adjuster".into(), grants);
    /// let b = Adaptation::builder("my-runtime", "1.0").with_wasm_options(wasm);
    /// # let _ = b;
    /// ```
    pub fn with_wasm_options(mut self, wasm: crate::wasm::WasmOptions) -> Self {
        self.opts.wasm = wasm;
        self
    }

    /// The view one plugin, by `NAME` or `IDX-NAME`, has of CreateContainer
    /// and UpdateContainer (see [`PluginView`](crate::PluginView)).
    pub fn with_plugin_view(mut self, plugin: impl Into<String>, view: crate::PluginView) -> Self {
        self.opts.plugin_views.insert(plugin.into(), view);
        self
    }

    /// The view of plugins without one of their own (default
    /// [`PluginView::Adjusted`](crate::PluginView::Adjusted), as upstream).
    pub fn with_default_view(mut self, view: crate::PluginView) -> Self {
        self.opts.default_view = view;
        self
    }

    /// Checks the callbacks and builds the (stopped) adaptation.
    ///
    /// # Errors
    /// [`Error::MissingCallback`] without a sync or update callback.
    pub fn build(self) -> Result<Adaptation, Error> {
        let sync = self.sync_fn.ok_or(Error::MissingCallback("sync"))?;
        let update = self.update_fn.ok_or(Error::MissingCallback("update"))?;
        let callbacks = Callbacks {
            sync,
            update,
            evict: self.evict_fn,
            observer: self.observer,
        };
        Ok(Adaptation::from_parts(
            self.name,
            self.version,
            callbacks,
            self.opts,
            self.builtins,
        ))
    }
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
            observer: None,
            opts: Options::default(),
            builtins: Vec::new(),
        }
    }
}
