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
//! | `shim.state_root` | needs restart: task sockets and libcontainer state of running containers live there |
//! | `nri.disable` | needs restart: running containers went through (or past) NRI |
//! | `nri.socket_path`, `nri.disable_connections` | needs restart: connected external plugins would lose their socket |
//! | `cdi.spec_dirs`, `metrics.address` | needs restart: the CDI registry and the metrics listener are set up at start |
//!
//! Every reload also compares the plugin directory with the launched
//! plugins, as the directory watch ([`crate::plugin_watch`]) does.

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
