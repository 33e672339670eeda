//! Reload without drain: on SIGHUP the daemon reads its config file again.
//!
//! An invalid file (an operator mid-edit) is logged, naming the file, line
//! and key, and the running configuration stays in effect. A valid one is
//! compared key by key with the running configuration ([`plan`]): what can
//! change under running containers is applied at once, what cannot is
//! logged as needing a restart of the daemon and keeps its old value.
//!
//! | key | on reload |
//! |---|---|
//! | `shim.log_level` | applied |
//! | `shim.idle_timeout` | applied |
//! | `shim.log_max_size` | applied from the next log line |
//! | `nri.plugin_path`, `nri.plugin_config_path` | applied: pre-installed plugins follow the directory |
//! | `nri.plugin_registration_timeout`, `nri.plugin_request_timeout`, `nri.failure_policy` | applied: pre-installed plugins are restarted with them; connected external plugins keep theirs until they reconnect |
//! | `nri.default_validator` | applied from the next request |
//! | `nri.plugin_permissions` | applied from the next request, to every plugin (connected external ones too; nothing restarts): permissions are pure policy, read at each answer |
//! | `nri.wasm` | applied: WebAssembly plugins are loaded again with the new sandbox (a fresh instance, configured and synchronized) |
//! | `nri.plugin_view` | applied from the next request, to every plugin (nothing restarts) |
//! | `shim.state_root` | needs restart: task sockets and libcontainer state of running containers live there |
//! | `nri.disable` | needs restart: running containers went through (or past) NRI |
//! | `nri.socket_path`, `nri.disable_connections` | needs restart: connected external plugins would lose their socket |
//! | `cdi.spec_dirs`, `metrics.address` | needs restart: the CDI registry and the metrics listener are set up at start |
//!
//! Every reload also compares the plugin directory with the launched
//! plugins, as the directory watch ([`crate::node::plugin_watch`]) does.

use std::path::PathBuf;

use nri_adaptation::Adaptation;

use super::daemon::SetLogLevel;
use crate::config::{CdiConfig, Config, MetricsConfig, NriConfig, ShimConfig};

/// How a new configuration differs from the running one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Changed keys (`table.key`) applied by the reload.
    pub live: Vec<&'static str>,
    /// Changed keys that keep their old value until the daemon restarts.
    pub needs_restart: Vec<&'static str>,
}

/// Compares `new` with `running`, key by key (see the module table).
pub fn plan(running: &Config, new: &Config) -> Plan {
    let mut p = Plan::default();
    // `new` taken apart whole: a key added to the config does not compile
    // (an unused binding) until it is sorted into live or needs-restart.
    let Config {
        shim:
            ShimConfig {
                state_root,
                idle_timeout,
                log_level,
                log_max_size,
            },
        nri:
            NriConfig {
                disable,
                socket_path,
                plugin_path,
                plugin_config_path,
                plugin_registration_timeout,
                plugin_request_timeout,
                disable_connections,
                default_validator,
                failure_policy,
                plugin_permissions,
                wasm,
                plugin_view,
            },
        cdi: CdiConfig { spec_dirs },
        metrics: MetricsConfig { address },
    } = new;
    macro_rules! key {
        ($table:ident . $key:ident, $live:expr) => {
            if running.$table.$key != *$key {
                if $live { &mut p.live } else { &mut p.needs_restart }.push(concat!(
                    stringify!($table),
                    ".",
                    stringify!($key)
                ));
            }
        };
    }
    const LIVE: bool = true;
    const RESTART: bool = false;
    key!(shim.state_root, RESTART);
    key!(shim.idle_timeout, LIVE);
    key!(shim.log_level, LIVE);
    key!(shim.log_max_size, LIVE);
    key!(nri.disable, RESTART);
    key!(nri.socket_path, RESTART);
    key!(nri.disable_connections, RESTART);
    key!(nri.plugin_path, LIVE);
    key!(nri.plugin_config_path, LIVE);
    key!(nri.plugin_registration_timeout, LIVE);
    key!(nri.plugin_request_timeout, LIVE);
    key!(nri.default_validator, LIVE);
    key!(nri.failure_policy, LIVE);
    key!(nri.plugin_permissions, LIVE);
    key!(nri.wasm, LIVE);
    key!(nri.plugin_view, LIVE);
    // The CDI registry and the metrics listener are set up once, at start.
    key!(cdi.spec_dirs, RESTART);
    key!(metrics.address, RESTART);
    p
}

/// `new` with the keys that need a restart set back to their running
/// values: the configuration in effect after a reload.
pub fn effective(running: &Config, new: &Config) -> Config {
    let mut c = new.clone();
    c.shim.state_root = running.shim.state_root.clone();
    c.nri.disable = running.nri.disable;
    c.nri.socket_path = running.nri.socket_path.clone();
    c.nri.disable_connections = running.nri.disable_connections;
    c.cdi = running.cdi.clone();
    c.metrics = running.metrics.clone();
    c
}

/// SIGHUP: reads the config file again and applies what can change under
/// running containers (see [`crate::node::reload`]); an invalid file is logged
/// and the running configuration kept.
pub(super) async fn reload_config(running: &mut Config, nri: Option<&Adaptation>, set_log_level: SetLogLevel<'_>) {
    let path = Config::path();
    let new = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %crate::error::chain(&e), "config reload failed; the running configuration stays in effect");
            return;
        }
    };
    let plan = crate::node::reload::plan(running, &new);
    let mut effective = crate::node::reload::effective(running, &new);
    if !plan.needs_restart.is_empty() {
        tracing::warn!(config = %path.display(), keys = ?plan.needs_restart, "config reload: these keys need a restart of the daemon (SIGTERM once no container runs, or an upgrade); their running values stay");
    }
    if plan.live.contains(&"shim.log_level") {
        if let Err(e) = set_log_level(&effective.shim.log_level) {
            tracing::error!(error = %format!("{e:#}"), "config reload: cannot set the log level");
            effective.shim.log_level = running.shim.log_level.clone();
        }
    }
    if plan.live.contains(&"shim.log_max_size") {
        crate::node::shimlog::set_log_max_size(effective.shim.log_max_size);
    }
    if let Some(nri) = nri {
        match nri.reconfigure(effective.nri.options()).await {
            Ok(r) => log_plugin_changes("config reload", &r),
            Err(e) => {
                tracing::error!(error = %crate::error::chain(&e), "config reload: the running NRI configuration stays in effect");
                effective.nri = running.nri.clone();
            }
        }
    }
    *running = effective;
    tracing::info!(config = %path.display(), changed = ?plan.live, "config reloaded");
}

/// Logs what a reconfiguration or rescan of the NRI plugins did.
pub(crate) fn log_plugin_changes(why: &str, r: &nri_adaptation::Reconfigured) {
    if !r.stopped.is_empty() {
        tracing::info!(plugins = ?r.stopped, "{why}: pre-installed NRI plugins stopped");
    }
    if !r.started.is_empty() {
        tracing::info!(plugins = ?r.started, "{why}: pre-installed NRI plugins started");
    }
    if !r.failed.is_empty() {
        tracing::error!(plugins = ?r.failed, "{why}: pre-installed NRI plugins failed to start");
    }
}

/// Notices a config file edited while the daemon runs: it is applied only
/// on SIGHUP (an operator edits in several steps), which the operator must
/// be told.
pub(super) struct ConfigWatch {
    path: PathBuf,
    loaded: Option<Vec<u8>>,
    mtime: Option<std::time::SystemTime>,
    warned: Option<Vec<u8>>,
}

impl ConfigWatch {
    pub(super) fn new(path: PathBuf) -> ConfigWatch {
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        ConfigWatch {
            loaded: std::fs::read(&path).ok(),
            path,
            mtime,
            warned: None,
        }
    }

    /// Warns once per new content; a stat per call otherwise.
    pub(super) fn check(&mut self) {
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if mtime == self.mtime {
            return;
        }
        self.mtime = mtime;
        let now = std::fs::read(&self.path).ok();
        if now != self.loaded && now != self.warned {
            tracing::warn!(
                config = %self.path.display(),
                pid = std::process::id(),
                "the shim config changed since this daemon loaded it; SIGHUP to the daemon applies it"
            );
            self.warned = now;
        }
    }

    /// The file was read again: its content is the one loaded now.
    pub(super) fn reloaded(&mut self) {
        self.mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        self.loaded = std::fs::read(&self.path).ok();
        self.warned = None;
    }
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use super::*;

    #[test]
    fn same_config_changes_nothing() {
        let c = Config::default();
        assert_eq!(plan(&c, &c.clone()), Plan::default());
    }

    #[test]
    fn live_and_restart_keys_are_told_apart() {
        let old = Config::default();
        let mut new = old.clone();
        new.shim.log_level = "debug".into();
        new.shim.state_root = PathBuf::from("/run/elsewhere");
        new.nri.plugin_request_timeout = Duration::from_secs(7);
        new.nri.socket_path = PathBuf::from("/run/other.sock");
        new.cdi.spec_dirs = vec![PathBuf::from("/run/my-cdi")];
        new.metrics.address = Some("127.0.0.1:9464".parse().unwrap());
        new.nri
            .failure_policy
            .insert("10-a".into(), nri_adaptation::FailurePolicy::Fail);
        new.nri
            .plugin_permissions
            .insert("default".into(), nri_adaptation::Permissions::allowing([]));
        let p = plan(&old, &new);
        assert_eq!(
            p.live,
            [
                "shim.log_level",
                "nri.plugin_request_timeout",
                "nri.failure_policy",
                "nri.plugin_permissions"
            ]
        );
        assert_eq!(
            p.needs_restart,
            ["shim.state_root", "nri.socket_path", "cdi.spec_dirs", "metrics.address"]
        );
        let e = effective(&old, &new);
        assert_eq!(
            (e.shim.state_root.clone(), e.nri.socket_path.clone()),
            (old.shim.state_root.clone(), old.nri.socket_path.clone())
        );
        assert_eq!(
            (e.shim.log_level.as_str(), e.nri.plugin_request_timeout),
            ("debug", Duration::from_secs(7))
        );
        assert_eq!(plan(&old, &e).needs_restart, Vec::<&str>::new());
        assert_eq!(e.nri.plugin_permissions, new.nri.plugin_permissions, "applied");
    }
}
