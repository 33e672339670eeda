//! Options of an [`Adaptation`](crate::Adaptation).

use std::{collections::HashMap, path::PathBuf, time::Duration};

use crate::{permissions::Permissions, validate::DefaultValidatorConfig};

/// What happens to a runtime request when a plugin does not answer in time
/// or its connection breaks while the request is in flight.
///
/// A plugin's own error reply always fails the request (NRI semantics);
/// this policy only covers the cases where the plugin gave no verdict.
///
/// | policy | request | plugin |
/// |---|---|---|
/// | [`Ignore`](FailurePolicy::Ignore) (default, = upstream NRI) | continues without the plugin's reply | closed and removed, so later requests are not delayed by it |
/// | [`Fail`](FailurePolicy::Fail) | fails with an error naming the plugin | stays registered after a timeout (it is slow, not broken); removed if its connection broke |
///
/// `Fail` suits plugins whose adjustments a container must not run
/// without (e.g. CPU pinning by koordlet, whose per-plugin failure policy
/// this mirrors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Continue without the plugin; drop it.
    #[default]
    Ignore,
    /// Fail the request; keep a slow plugin.
    Fail,
}

/// What a plugin's CreateContainer and UpdateContainer requests hold, and
/// so when it can be called.
///
/// | view | the plugin gets | it is called |
/// |---|---|---|
/// | [`Adjusted`](PluginView::Adjusted) (default, = upstream NRI) | the container (or the update) with the answers of the plugins before it in invocation order merged in | once every plugin before it answered |
/// | [`Original`](PluginView::Original) | the container (or the update) as the runtime asked for it | at once, side by side with the others |
///
/// Either way the answers are merged in invocation order, so the merged
/// adjustment, field owners, conflicts, validation and errors are those
/// of calling the plugins one after another with the same answers. A
/// create whose plugins all have the `Original` view costs about one
/// plugin round trip, not one per plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginView {
    /// Sees the adjustments of the plugins before it.
    #[default]
    Adjusted,
    /// Sees the runtime's request only; called side by side.
    Original,
}

/// Settings of an adaptation. Defaults are NRI's.
#[derive(Debug, Clone)]
pub struct Options {
    /// Socket external plugins dial (default `/var/run/nri/nri.sock`).
    pub socket_path: PathBuf,
    /// Directory of pre-installed plugins to launch (default `/opt/nri/plugins`).
    pub plugin_path: PathBuf,
    /// Directory of drop-in configuration for them (default `/etc/nri/conf.d`).
    pub plugin_config_path: PathBuf,
    /// Time a plugin has to register after connecting (default 5 s).
    pub registration_timeout: Duration,
    /// Time a plugin has to answer one request (default 2 s).
    pub request_timeout: Duration,
    /// No listener; only pre-installed plugins.
    pub disable_connections: bool,
    /// Policy of plugins not listed in `failure_policies`.
    pub default_failure_policy: FailurePolicy,
    /// Per-plugin policy, keyed by `NAME` or `IDX-NAME` (the latter wins).
    pub failure_policies: HashMap<String, FailurePolicy>,
    /// The built-in default validator; runs when `enable` is set.
    pub default_validator: DefaultValidatorConfig,
    /// What plugins not listed in `plugin_permissions` may change; `None`
    /// (the default, = upstream NRI): anything.
    pub default_permissions: Option<Permissions>,
    /// What each plugin may change, keyed by `NAME` or `IDX-NAME` (the
    /// latter wins); see [`crate::permissions`]. Read at every request, so
    /// a change applies to connected plugins at once.
    pub plugin_permissions: HashMap<String, Permissions>,
    /// The sandbox of WebAssembly plugins: memory limit and grants (see
    /// [`crate::wasm`]; used with the `wasm` feature).
    pub wasm: crate::wasm::WasmOptions,
    /// View of plugins not listed in `plugin_views`.
    pub default_view: PluginView,
    /// Per-plugin view, keyed by `NAME` or `IDX-NAME` (the latter wins).
    /// Read at every request.
    pub plugin_views: HashMap<String, PluginView>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            socket_path: nri_proto::DEFAULT_SOCKET_PATH.into(),
            plugin_path: nri_proto::DEFAULT_PLUGIN_PATH.into(),
            plugin_config_path: nri_proto::DEFAULT_PLUGIN_CONFIG_PATH.into(),
            registration_timeout: nri_proto::DEFAULT_REGISTRATION_TIMEOUT,
            request_timeout: nri_proto::DEFAULT_REQUEST_TIMEOUT,
            disable_connections: false,
            default_failure_policy: FailurePolicy::Ignore,
            failure_policies: HashMap::new(),
            default_validator: DefaultValidatorConfig::default(),
            default_permissions: None,
            plugin_permissions: HashMap::new(),
            wasm: crate::wasm::WasmOptions::default(),
            default_view: PluginView::Adjusted,
            plugin_views: HashMap::new(),
        }
    }
}

impl Options {
    /// The failure policy of plugin `idx-base`.
    pub fn failure_policy(&self, idx: &str, base: &str) -> FailurePolicy {
        self.failure_policies
            .get(&format!("{idx}-{base}"))
            .or_else(|| self.failure_policies.get(base))
            .copied()
            .unwrap_or(self.default_failure_policy)
    }

    /// The view of plugin `idx-base`.
    pub fn view(&self, idx: &str, base: &str) -> PluginView {
        if self.plugin_views.is_empty() {
            return self.default_view;
        }
        self.plugin_views
            .get(&format!("{idx}-{base}"))
            .or_else(|| self.plugin_views.get(base))
            .copied()
            .unwrap_or(self.default_view)
    }

    /// The permissions of plugin `plugin` (`IDX-NAME`): its `IDX-NAME`
    /// entry, else its `NAME` entry, else the default; `None`: unrestricted.
    pub fn permissions(&self, plugin: &str) -> Option<&Permissions> {
        if self.plugin_permissions.is_empty() {
            // Unconfigured (the common case): no hashing on the request path.
            return self.default_permissions.as_ref();
        }
        self.plugin_permissions
            .get(plugin)
            .or_else(|| {
                // An index is digits only, so the name starts after the first '-'.
                let (_, base) = plugin.split_once('-')?;
                self.plugin_permissions.get(base)
            })
            .or(self.default_permissions.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_lookup_prefers_qualified_name() {
        let mut o = Options::default();
        assert_eq!(o.failure_policy("10", "a"), FailurePolicy::Ignore);
        o.failure_policies.insert("a".into(), FailurePolicy::Fail);
        assert_eq!(o.failure_policy("10", "a"), FailurePolicy::Fail);
        o.failure_policies.insert("10-a".into(), FailurePolicy::Ignore);
        assert_eq!(o.failure_policy("10", "a"), FailurePolicy::Ignore);
        assert_eq!(o.failure_policy("20", "a"), FailurePolicy::Fail);
        o.default_failure_policy = FailurePolicy::Fail;
        assert_eq!(o.failure_policy("30", "b"), FailurePolicy::Fail);
    }

    #[test]
    fn permissions_lookup_is_qualified_name_then_name_then_default() {
        use crate::permissions::FieldGroup;
        let only = |g| Permissions::allowing([g]);
        let mut o = Options::default();
        assert_eq!(o.permissions("10-a"), None, "no entries: unrestricted");
        o.plugin_permissions.insert("a".into(), only(FieldGroup::Env));
        assert_eq!(o.permissions("10-a"), Some(&only(FieldGroup::Env)));
        assert_eq!(o.permissions("20-a"), Some(&only(FieldGroup::Env)));
        assert_eq!(o.permissions("10-b"), None, "unlisted without default: unrestricted");
        o.plugin_permissions.insert("10-a".into(), only(FieldGroup::Cpu));
        assert_eq!(o.permissions("10-a"), Some(&only(FieldGroup::Cpu)));
        assert_eq!(o.permissions("20-a"), Some(&only(FieldGroup::Env)));
        o.default_permissions = Some(only(FieldGroup::Mounts));
        assert_eq!(o.permissions("10-b"), Some(&only(FieldGroup::Mounts)));
        assert_eq!(o.permissions("10-a"), Some(&only(FieldGroup::Cpu)));
        // A name with dashes: only the index is split off.
        o.plugin_permissions
            .insert("cpu-pinner".into(), only(FieldGroup::Memory));
        assert_eq!(o.permissions("10-cpu-pinner"), Some(&only(FieldGroup::Memory)));
        assert_eq!(o.permissions("10-pinner"), Some(&only(FieldGroup::Mounts)));
    }
}
