//! Reconfiguring a running adaptation without stopping it: new options are
//! put in effect and the plugin directory is compared with the launched
//! plugins, so a runtime can reload its configuration (or notice a plugin
//! file that appeared or went away) while pods and containers run.
//!
//! Launched plugins are compared by `IDX-NAME` and path: a file that is
//! gone (or no longer executable) stops its plugin, a new one is launched,
//! registered, configured and synchronized like a plugin at start, then
//! gets events. A plugin whose settings changed (timeouts, failure policy,
//! configuration directory) is restarted so it runs with them: it was
//! configured with the old ones. Plugins that dialled the socket keep the
//! settings they registered with until they reconnect. The socket itself
//! (`socket_path`, `disable_connections`) cannot move under connected
//! plugins: those changes are reported and wait for the next start.

use std::collections::HashSet;

use crate::{Adaptation, config::Options, error::Error, plugin::PluginOrigin, registry::launch, registry::sync};

/// What [`Adaptation::reconfigure`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconfigured {
    /// `IDX-NAME` of the pre-installed plugins launched and active now.
    pub started: Vec<String>,
    /// `IDX-NAME` of the pre-installed plugins stopped (gone from the
    /// directory, or restarted with new settings: then also in `started`
    /// unless the new launch failed).
    pub stopped: Vec<String>,
    /// `IDX-NAME` of plugins found in the directory that failed to launch,
    /// register, configure or synchronize (logged).
    pub failed: Vec<String>,
    /// Names of the [`Options`] fields that changed but take effect only
    /// when the adaptation is started again; their old values stay.
    pub needs_restart: Vec<&'static str>,
}

impl Reconfigured {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.started.is_empty() && self.stopped.is_empty() && self.failed.is_empty() && self.needs_restart.is_empty()
    }
}

impl Adaptation {
    /// Puts `opts` in effect on a running (or stopped) adaptation and
    /// brings the pre-installed plugins in line with its plugin directory
    /// (see the [module](crate::reload) for what changes when).
    ///
    /// The default validator and failure policies apply from the next
    /// request; timeouts and policies of already connected external plugins
    /// stay those they registered with. Plugin permissions apply from the
    /// next answer to every plugin, connected external ones included (no
    /// plugin restarts for them).
    ///
    /// # Errors
    /// [`Error::PluginDir`] when the new plugin directory exists but cannot
    /// be read; then nothing changed.
    pub async fn reconfigure(&self, mut opts: Options) -> Result<Reconfigured, Error> {
        let _life = self.inner.lifecycle.lock().await;
        let old = self.inner.opts();
        let mut out = Reconfigured::default();
        if opts.socket_path != old.socket_path {
            out.needs_restart.push("socket_path");
            opts.socket_path = old.socket_path.clone();
        }
        if opts.disable_connections != old.disable_connections {
            out.needs_restart.push("disable_connections");
            opts.disable_connections = old.disable_connections;
        }
        let found = launch::discover(&opts.plugin_path)?;
        let relaunch_all = opts.registration_timeout != old.registration_timeout
            || opts.request_timeout != old.request_timeout
            || opts.plugin_config_path != old.plugin_config_path;
        // WebAssembly plugins run with the sandbox they were loaded with.
        let reload_wasm = opts.wasm != old.wasm;
        self.inner.set_opts(opts.clone());
        if !self.inner.is_running() {
            return Ok(out);
        }
        let wait = opts.request_timeout.min(std::time::Duration::from_secs(1));
        for p in self.inner.registry.snapshot() {
            let PluginOrigin::Launched { path, .. } = &p.origin else {
                continue;
            };
            let listed = found
                .iter()
                .any(|d| &d.path == path && d.idx == p.idx && d.base == p.base);
            let wasm = found.iter().any(|d| &d.path == path && d.wasm);
            if listed && !relaunch_all && !(wasm && reload_wasm) && p.policy == opts.failure_policy(&p.idx, &p.base) {
                continue;
            }
            tracing::info!(plugin = %p.name(), reason = if listed { "settings changed" } else { "file gone" }, "stopping pre-installed NRI plugin");
            self.inner.registry.remove_gracefully(&p, wait).await;
            out.stopped.push(p.name().to_string());
        }
        let active: HashSet<String> = self.inner.registry.names().into_iter().collect();
        let new: Vec<_> = found
            .into_iter()
            .filter(|d| !active.contains(&format!("{}-{}", d.idx, d.base)))
            .collect();
        let mut wanted: Vec<String> = new.iter().map(|d| format!("{}-{}", d.idx, d.base)).collect();
        for p in sync::launch_plugins(&self.inner, new).await {
            let name = p.name().to_string();
            if sync::join(&self.inner, p).await {
                wanted.retain(|n| n != &name);
                out.started.push(name);
            }
        }
        out.failed = wanted;
        Ok(out)
    }

    /// Compares the plugin directory with the launched plugins again
    /// under the options in effect: [`Adaptation::reconfigure`] with them.
    ///
    /// # Errors
    /// As [`Adaptation::reconfigure`].
    pub async fn rescan_plugins(&self) -> Result<Reconfigured, Error> {
        let opts = (*self.inner.opts()).clone();
        self.reconfigure(opts).await
    }
}
