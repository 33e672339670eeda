//! Shim configuration: a TOML file at `$NRI_SHIM_CONFIG`, else
//! `/etc/nri-shim/config.toml` (missing file = defaults). The `[nri]` table
//! uses containerd's NRI key names, so an operator can copy containerd's
//! `[plugins."io.containerd.nri.v1.nri"]` settings over.
//!
//! ```toml
//! [nri]
//! disable = false
//! socket_path = "/var/run/nri/nri.sock"
//! plugin_path = "/opt/nri/plugins"
//! plugin_config_path = "/etc/nri/conf.d"
//! plugin_registration_timeout = "5s"
//! plugin_request_timeout = "2s"
//! disable_connections = false
//!
//! [nri.default_validator]
//! enable = true
//! required_plugins = ["image-policy"]
//!
//! [nri.failure_policy]        # per plugin (NAME or IDX-NAME): "ignore" or "fail"
//! default = "ignore"
//! "10-cpu-pinning" = "fail"
//!
//! [nri.plugin_permissions."10-cpu-pinning"]   # IDX-NAME, NAME or default
//! allow = ["cpu", "memory"]     # field groups (nri_adaptation::FieldGroup); none: unrestricted
//!
//! [nri.wasm]                    # WebAssembly plugins (nri_adaptation::wasm)
//! memory_limit = "64MiB"        # largest linear memory of each
//!
//! [nri.wasm.plugins."10-adjuster"]   # IDX-NAME or NAME: grants of one plugin
//! memory_limit = "128MiB"
//! env = { NODE_NAME = "node-1" }     # what it sees through WASI; none by default
//!
//! [nri.plugin_view]           # per plugin (NAME or IDX-NAME): "adjusted" or "original"
//! default = "adjusted"
//! "10-cpu-pinning" = "original"
//!
//! [shim]
//! state_root = "/run/nri-shim"  # daemon sockets and libcontainer state
//! idle_timeout = "30s"          # daemon exits after this long with no containers
//! log_level = "info"
//! log_max_size = "10MiB"        # shim.log rotates to shim.log.1 at this size; "0": never
//!
//! [cdi]
//! spec_dirs = ["/etc/cdi", "/var/run/cdi"]  # lowest priority first
//!
//! [metrics]
//! address = "127.0.0.1:9464"    # Prometheus scrape endpoint; off when unset
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    time::Duration,
};

use nri_adaptation::{
    DefaultValidatorConfig, FailurePolicy, Options, Permissions, PluginView,
    wasm::{WasmGrants, WasmOptions},
};
use serde::{Deserialize, Deserializer};

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nri-shim/config.toml";
/// Environment variable naming another configuration file.
pub const CONFIG_ENV: &str = "NRI_SHIM_CONFIG";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read shim config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid: the message names the key.
    #[error("invalid shim config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
}

/// A duration written as containerd writes them (Go's
/// `time.ParseDuration`): `"5s"`, `"500ms"`, `"1m30s"`, `"1.5h"`.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?} (Go form: a number and a unit ns, us, ms, s, m or h, repeated, e.g. \"2s\", \"500ms\", \"1m30s\")"
        ))
    })
}

/// A plugin timeout: a [`duration`] above zero (zero would mean no timeout
/// at all, so a hung plugin would block every create).
fn timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let t = duration(d)?;
    if t.is_zero() {
        return Err(serde::de::Error::custom(
            "a plugin timeout must be more than 0 (0 would mean waiting forever for a hung plugin)",
        ));
    }
    Ok(t)
}

/// Parses a duration in Go's `time.ParseDuration` form, which containerd's
/// NRI keys take: one or more `<decimal><unit>` with unit `ns`, `us` (`µs`),
/// `ms`, `s`, `m` or `h`, or `0` alone. No sign, no spaces. `None` for
/// anything else, including a value too large for a [`Duration`].
pub fn parse_duration(s: &str) -> Option<Duration> {
    // humantime computes the value (with fractions and overflow checks);
    // the grammar check keeps it to what Go accepts.
    humantime::parse_duration(&go_duration(s.trim())?).ok()
}

/// Checks Go's duration grammar (unsigned) and spells it as humantime
/// reads it: `.5s` as `0.5s`, `5.s` as `5.0s`, the Greek mu as the micro sign.
fn go_duration(s: &str) -> Option<String> {
    if s == "0" {
        return Some("0s".into());
    }
    let mut rest = s;
    let mut out = String::with_capacity(s.len() + 2);
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        if num.starts_with('.') {
            out.push('0');
        }
        out.push_str(num);
        if num.ends_with('.') {
            out.push('0');
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        if !matches!(unit, "ns" | "us" | "µs" | "μs" | "ms" | "s" | "m" | "h") {
            return None;
        }
        out.push_str(if unit == "μs" { "µs" } else { unit });
        rest = &rest[unit_len..];
    }
    Some(out)
}

/// The `[nri]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NriConfig {
    /// Run without NRI at all.
    pub disable: bool,
    /// Socket for external plugins.
    pub socket_path: PathBuf,
    /// Directory of pre-installed plugins.
    pub plugin_path: PathBuf,
    /// Drop-in configuration of pre-installed plugins.
    pub plugin_config_path: PathBuf,
    /// Time a plugin has to register (more than zero).
    #[serde(deserialize_with = "timeout")]
    pub plugin_registration_timeout: Duration,
    /// Time a plugin has to answer one request (more than zero).
    #[serde(deserialize_with = "timeout")]
    pub plugin_request_timeout: Duration,
    /// No socket for external plugins.
    pub disable_connections: bool,
    /// The built-in default validator.
    pub default_validator: DefaultValidatorConfig,
    /// Failure policy per plugin; key `default` for all others.
    pub failure_policy: HashMap<String, FailurePolicy>,
    /// What each plugin may change (`[nri.plugin_permissions.KEY] allow =
    /// [...]`), keyed by `IDX-NAME` or `NAME`; key `default` for all
    /// others. No entry for a plugin and no `default`: unrestricted.
    #[serde(deserialize_with = "plugin_permissions")]
    pub plugin_permissions: HashMap<String, Permissions>,
    /// The sandbox of WebAssembly plugins (`[nri.wasm]`).
    pub wasm: WasmConfig,
    /// What each plugin's CreateContainer and UpdateContainer hold, and so
    /// whether it is called side by side (`original`) or after the plugins
    /// before it (`adjusted`, upstream NRI); key `default` for all others.
    pub plugin_view: HashMap<String, PluginView>,
}

/// The `[nri.wasm]` table: the sandbox of WebAssembly plugins (see
/// `nri_adaptation::wasm`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmConfig {
    /// Largest linear memory of a plugin in bytes, written as a byte size
    /// (`"64MiB"`, the default); from 64 KiB (one page) to 4 GiB.
    #[serde(deserialize_with = "wasm_memory")]
    pub memory_limit: u64,
    /// Grants of single plugins, keyed by `IDX-NAME` or `NAME`.
    pub plugins: HashMap<String, WasmPluginConfig>,
}

impl Default for WasmConfig {
    fn default() -> Self {
        WasmConfig {
            memory_limit: nri_adaptation::wasm::DEFAULT_MEMORY_LIMIT,
            plugins: HashMap::new(),
        }
    }
}

/// `[nri.wasm.plugins.KEY]`: what one WebAssembly plugin is granted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmPluginConfig {
    /// Its memory limit instead of `[nri.wasm] memory_limit`.
    #[serde(deserialize_with = "optional_wasm_memory")]
    pub memory_limit: Option<u64>,
    /// Environment variables it sees (name to value); none by default.
    pub env: BTreeMap<String, String>,
}

/// A WebAssembly memory limit: a byte size from one 64 KiB page to the
/// 4 GiB a 32-bit memory can address.
fn wasm_memory<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = byte_size(d)?;
    if !(64 << 10..=4 << 30).contains(&n) {
        return Err(serde::de::Error::custom(format!(
            "memory_limit of {n} bytes: must be from 64KiB (one WebAssembly page) to 4GiB"
        )));
    }
    Ok(n)
}

fn optional_wasm_memory<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    wasm_memory(d).map(Some)
}

impl WasmConfig {
    /// The adaptation's sandbox options; an environment variable name that
    /// is empty or holds `=` or NUL, or a value with NUL, is an error
    /// naming the plugin.
    pub fn options(&self) -> Result<WasmOptions, String> {
        let mut plugins = HashMap::new();
        for (key, p) in &self.plugins {
            for (name, value) in &p.env {
                if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                    return Err(format!(
                        "nri.wasm.plugins.{key:?}.env: {name:?} is not a valid environment variable"
                    ));
                }
            }
            plugins.insert(
                key.clone(),
                WasmGrants {
                    env: p.env.clone(),
                    memory_limit: p.memory_limit,
                },
            );
        }
        Ok(WasmOptions {
            memory_limit: self.memory_limit,
            plugins,
        })
    }
}

/// The `[nri.plugin_permissions.*]` tables: `allow` lists field group
/// names; an unknown one is an error naming the table and the name.
fn plugin_permissions<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<String, Permissions>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        allow: Vec<String>,
    }
    let raw = HashMap::<String, Entry>::deserialize(d)?;
    raw.into_iter()
        .map(|(key, e)| match Permissions::parse(&e.allow) {
            Ok(p) => Ok((key, p)),
            Err(err) => Err(serde::de::Error::custom(format!(
                "nri.plugin_permissions.{key:?}.allow: {err}"
            ))),
        })
        .collect()
}

impl Default for NriConfig {
    fn default() -> Self {
        let o = Options::default();
        NriConfig {
            disable: false,
            socket_path: o.socket_path,
            plugin_path: o.plugin_path,
            plugin_config_path: o.plugin_config_path,
            plugin_registration_timeout: o.registration_timeout,
            plugin_request_timeout: o.request_timeout,
            disable_connections: false,
            default_validator: DefaultValidatorConfig::default(),
            failure_policy: HashMap::new(),
            plugin_permissions: HashMap::new(),
            wasm: WasmConfig::default(),
            plugin_view: HashMap::new(),
        }
    }
}

impl NriConfig {
    /// The adaptation options this table describes.
    pub fn options(&self) -> Options {
        let mut policies = self.failure_policy.clone();
        let default = policies.remove("default").unwrap_or_default();
        let mut permissions = self.plugin_permissions.clone();
        let default_permissions = permissions.remove("default");
        let mut views = self.plugin_view.clone();
        let default_view = views.remove("default").unwrap_or_default();
        Options {
            socket_path: self.socket_path.clone(),
            plugin_path: self.plugin_path.clone(),
            plugin_config_path: self.plugin_config_path.clone(),
            registration_timeout: self.plugin_registration_timeout,
            request_timeout: self.plugin_request_timeout,
            disable_connections: self.disable_connections,
            default_failure_policy: default,
            failure_policies: policies,
            default_validator: self.default_validator.clone(),
            default_permissions,
            plugin_permissions: permissions,
            // Checked when the file is parsed (Config::parse).
            wasm: self.wasm.options().unwrap_or_default(),
            default_view,
            plugin_views: views,
        }
    }
}

/// The `[shim]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShimConfig {
    /// Daemon sockets and libcontainer state live here.
    pub state_root: PathBuf,
    /// The daemon exits after this long with no containers and no
    /// external plugins connected.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// `tracing` filter for the shim's log: a level (`info`) or
    /// comma-separated `target=level` directives
    /// (`info,nri_adaptation=debug`), checked when the file is loaded.
    #[serde(deserialize_with = "log_filter")]
    pub log_level: String,
    /// `shim.log` is rotated when it reaches this many bytes: renamed to
    /// `shim.log.1` (replacing the previous one) and started anew, so the
    /// log of a daemon that runs for months holds at most twice this.
    /// Written as a byte size (`"10MiB"`, `"512KiB"`, `"1GiB"`, `"4096"`);
    /// `"0"` never rotates.
    #[serde(deserialize_with = "byte_size")]
    pub log_max_size: u64,
}

/// Accepts a byte size: a whole number with an optional binary unit `B`,
/// `KiB`, `MiB` or `GiB`.
fn byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    parse_byte_size(&s).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "invalid size {s:?} (a whole number of bytes, optionally with a unit B, KiB, MiB or GiB, e.g. \"10MiB\")"
        ))
    })
}

/// Parses a byte size such as `10MiB` (see [`ShimConfig::log_max_size`]);
/// `None` for anything else, including a size beyond `u64`.
pub fn parse_byte_size(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Accepts `LEVEL` and `target=LEVEL` directives, comma-separated (the
/// syntax of [`tracing_subscriber::filter::Targets`], minus bare target
/// names, which would silently mean "trace").
fn log_filter<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use tracing::level_filters::LevelFilter;
    let s = String::deserialize(d)?;
    for directive in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        level.parse::<LevelFilter>().map_err(|_| {
            serde::de::Error::custom(format!(
                "invalid log filter {s:?}: {level:?} in {directive:?} is not one of off, error, warn, info, debug, trace"
            ))
        })?;
    }
    s.parse::<tracing_subscriber::filter::Targets>()
        .map_err(|e| serde::de::Error::custom(format!("invalid log filter {s:?}: {e}")))?;
    Ok(s)
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            state_root: PathBuf::from("/run/nri-shim"),
            idle_timeout: Duration::from_secs(30),
            log_level: "info".into(),
            log_max_size: 10 << 20,
        }
    }
}

/// The `[cdi]` table: where CDI spec files are (see [`crate::cdi`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CdiConfig {
    /// Spec directories, lowest priority first (absolute paths).
    pub spec_dirs: Vec<PathBuf>,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            spec_dirs: crate::cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect(),
        }
    }
}

/// The `[metrics]` table (see [`crate::node::metrics`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve `GET /metrics` on, e.g. `"127.0.0.1:9464"`;
    /// none (the default) serves nothing.
    pub address: Option<std::net::SocketAddr>,
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// NRI settings.
    pub nri: NriConfig,
    /// Shim settings.
    pub shim: ShimConfig,
    /// CDI settings.
    pub cdi: CdiConfig,
    /// The metrics endpoint.
    pub metrics: MetricsConfig,
}

impl Config {
    /// Parses TOML text; `path` is only used in errors.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key at fault.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = Self::parse_toml(text, path)?;
        // The daemon runs in `/`: a relative path would silently mean
        // something else than where the operator looks.
        for (key, value) in [
            ("shim.state_root", &config.shim.state_root),
            ("nri.socket_path", &config.nri.socket_path),
            ("nri.plugin_path", &config.nri.plugin_path),
            ("nri.plugin_config_path", &config.nri.plugin_config_path),
        ] {
            if !value.is_absolute() {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("{key} = {:?}: must be an absolute path", value.display().to_string()),
                });
            }
        }
        if let Err(message) = config.nri.wasm.options() {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            });
        }
        if let Some(dir) = config.cdi.spec_dirs.iter().find(|d| !d.is_absolute()) {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!(
                    "cdi.spec_dirs entry {:?}: must be an absolute path",
                    dir.display().to_string()
                ),
            });
        }
        Ok(config)
    }

    fn parse_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            // One line: "line L, column C: message" (toml's own Display
            // draws the source line over several lines).
            let at = e.span().map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before.len() - line_start + 1;
                // The line itself names the key when the message does not
                // (a bad value).
                let source: String = text[line_start..]
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .chars()
                    .take(80)
                    .collect();
                format!("line {line}, column {column} `{source}`: ")
            });
            ConfigError::Invalid {
                path: path.to_path_buf(),
                message: format!("{}{}", at.unwrap_or_default(), e.message().trim()),
            }
        })
    }

    /// Loads `$NRI_SHIM_CONFIG`, else `/etc/nri-shim/config.toml`; a missing
    /// default file means defaults, a missing file named by the variable is
    /// an error.
    ///
    /// # Errors
    /// [`ConfigError`].
    pub fn load() -> Result<Config, ConfigError> {
        match std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()) {
            Some(p) => Self::load_file(Path::new(&p), true),
            None => Self::load_file(Path::new(DEFAULT_CONFIG_PATH), false),
        }
    }

    /// The file [`Config::load`] reads: `$NRI_SHIM_CONFIG`, else the default.
    pub fn path() -> PathBuf {
        std::env::var_os(CONFIG_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH), PathBuf::from)
    }

    /// `[shim] state_root` as far as it can be read, for `delete` of a task
    /// without a bundle record: the configured value when the file parses
    /// (or only that key does: the rest may be mid-edit), else the
    /// default. Never fails: cleaning up must not depend on the file.
    pub fn state_root_lenient() -> PathBuf {
        let default = ShimConfig::default().state_root;
        let Ok(text) = std::fs::read_to_string(Self::path()) else {
            return default;
        };
        if let Ok(c) = Self::parse(&text, &Self::path()) {
            return c.shim.state_root;
        }
        text.parse::<toml::Table>()
            .ok()
            .and_then(|t| t.get("shim")?.get("state_root")?.as_str().map(PathBuf::from))
            .filter(|p| p.is_absolute())
            .unwrap_or(default)
    }

    /// Loads one file.
    ///
    /// # Errors
    /// [`ConfigError`]; a missing file is one only when `required`.
    pub fn load_file(path: &Path, required: bool) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_refused_naming_the_key() {
        for (toml, key) in [
            ("[shim]\nstate_root = \"relative/dir\"", "shim.state_root"),
            ("[nri]\nsocket_path = \"nri.sock\"", "nri.socket_path"),
            ("[nri]\nplugin_path = \"plugins\"", "nri.plugin_path"),
            ("[nri]\nplugin_config_path = \"conf.d\"", "nri.plugin_config_path"),
            ("[cdi]\nspec_dirs = [\"/etc/cdi\", \"cdi\"]", "cdi.spec_dirs"),
        ] {
            let e = Config::parse(toml, Path::new("/etc/nri-shim/config.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains("absolute") && e.contains("config.toml"),
                "{e}"
            );
        }
    }

    #[test]
    fn full_file_parses() {
        let c = Config::parse(
            r#"
            [nri]
            socket_path = "/tmp/nri.sock"
            plugin_registration_timeout = "500ms"
            plugin_request_timeout = "3s"
            disable_connections = true
            [nri.default_validator]
            enable = true
            required_plugins = ["a"]
            [nri.failure_policy]
            default = "fail"
            "10-b" = "ignore"
            [shim]
            idle_timeout = "2m"
            state_root = "/tmp/s"
            "#,
            Path::new("x.toml"),
        )
        .unwrap();
        let o = c.nri.options();
        assert_eq!(o.socket_path, PathBuf::from("/tmp/nri.sock"));
        assert_eq!(o.registration_timeout, Duration::from_millis(500));
        assert_eq!(o.request_timeout, Duration::from_secs(3));
        assert!(o.disable_connections && o.default_validator.enable);
        assert_eq!(o.failure_policy("20", "x"), FailurePolicy::Fail);
        assert_eq!(o.failure_policy("10", "b"), FailurePolicy::Ignore);
        assert_eq!(c.shim.idle_timeout, Duration::from_secs(120));
    }

    /// `[nri.wasm]`: the memory limit with its default, per-plugin grants,
    /// and the errors of bad sizes and variable names.
    #[test]
    fn wasm_sandbox_settings() {
        let o = Config::parse("", Path::new("c.toml")).unwrap().nri.options();
        assert_eq!(o.wasm.memory_limit, 64 << 20);
        assert!(o.wasm.plugins.is_empty());
        let text = r#"
            [nri.wasm]
            memory_limit = "16MiB"
            [nri.wasm.plugins."10-adjuster"]
            memory_limit = "128MiB"
            env = { NODE_NAME = "node-1" }
            [nri.wasm.plugins.logger]
        "#;
        let o = Config::parse(text, Path::new("c.toml")).unwrap().nri.options();
        assert_eq!(o.wasm.memory_limit, 16 << 20);
        assert_eq!(o.wasm.memory_limit("10", "adjuster"), 128 << 20);
        assert_eq!(o.wasm.memory_limit("20", "logger"), 16 << 20);
        let g = o.wasm.grants("10", "adjuster").unwrap();
        assert_eq!(g.env.get("NODE_NAME").map(String::as_str), Some("node-1"));
        for (bad, says) in [
            (
                "[nri.wasm]\nmemory_limit = \"8GiB\"\n",
                "must be from 64KiB (one WebAssembly page) to 4GiB",
            ),
            ("[nri.wasm]\nmemory_limit = \"1KiB\"\n", "must be from 64KiB"),
            (
                "[nri.wasm.plugins.a]\nenv = { \"A=B\" = \"x\" }\n",
                r#"nri.wasm.plugins."a".env: "A=B" is not a valid environment variable"#,
            ),
            ("[nri.wasm.plugins.a]\nfiles = [\"/etc\"]\n", "unknown field `files`"),
        ] {
            let e = Config::parse(bad, Path::new("c.toml")).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn plugin_permissions_parse_with_default_and_lookup() {
        use nri_adaptation::FieldGroup;
        let c = Config::parse(
            r#"
            [nri.plugin_permissions."10-pinner"]
            allow = ["cpu", "memory"]
            [nri.plugin_permissions.injector]
            allow = ["devices", "cdi_devices", "mounts", "env"]
            [nri.plugin_permissions.default]
            allow = []
            "#,
            Path::new("x.toml"),
        )
        .unwrap();
        let o = c.nri.options();
        let groups = |p: Option<&Permissions>| p.map(|p| p.groups().collect::<Vec<_>>());
        assert_eq!(
            groups(o.permissions("10-pinner")),
            Some(vec![FieldGroup::Memory, FieldGroup::Cpu])
        );
        assert_eq!(
            groups(o.permissions("30-injector")),
            Some(vec![
                FieldGroup::Mounts,
                FieldGroup::Env,
                FieldGroup::CdiDevices,
                FieldGroup::Devices
            ])
        );
        assert_eq!(groups(o.permissions("20-pinner")), Some(vec![]), "the default");
        assert!(!o.plugin_permissions.contains_key("default"));
        // No table: every plugin unrestricted, as upstream.
        assert_eq!(Config::default().nri.options().permissions("10-pinner"), None);
    }

    #[test]
    fn unknown_field_group_names_the_table_and_the_value() {
        let e = Config::parse(
            "[nri.plugin_permissions.\"10-pinner\"]\nallow = [\"cpu\", \"cpuset\"]\n",
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(r#"nri.plugin_permissions."10-pinner".allow: unknown field group "cpuset" (known: "#),
            "{e}"
        );
        assert!(e.starts_with("invalid shim config c.toml: line "), "{e}");
        let e = Config::parse("[nri.plugin_permissions.default]\nalow = []\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("alow"), "{e}");
        let e = Config::parse("[nri.plugin_permissions.default]\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `allow`"), "{e}");
    }

    #[test]
    fn defaults_without_file() {
        let c = Config::load_file(Path::new("/nonexistent/nri-shim.toml"), false).unwrap();
        assert_eq!(c.nri.socket_path, PathBuf::from("/var/run/nri/nri.sock"));
        assert!(Config::load_file(Path::new("/nonexistent/nri-shim.toml"), true).is_err());
    }

    #[test]
    fn invalid_file_names_the_key() {
        let e = Config::parse("[nri]\nsocket_pth = \"/x\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("socket_pth"), "{e}");
        assert!(
            e.to_string()
                .contains("c.toml: line 2, column 1 `socket_pth = \"/x\"`: unknown field"),
            "{e}"
        );
        assert!(!e.to_string().contains('\n'), "{e}");
        let e = Config::parse("[nri]\nplugin_request_timeout = \"soon\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("plugin_request_timeout"), "{e}");
        for key in ["plugin_request_timeout", "plugin_registration_timeout"] {
            let e = Config::parse(&format!("[nri]\n{key} = \"0s\"\n"), Path::new("c.toml")).unwrap_err();
            assert!(
                e.to_string().contains(key) && e.to_string().contains("more than 0"),
                "{e}"
            );
        }
        let e = Config::parse("[nri.failure_policy]\n\"10-a\" = \"maybe\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
        let e = Config::parse("[shim]\nlog_level = \"loud\"\n", Path::new("c.toml")).unwrap_err();
        assert!(
            e.to_string().contains("log_level") && e.to_string().contains("loud"),
            "{e}"
        );
        Config::parse(
            "[shim]\nlog_level = \"info,nri_adaptation=debug\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
    }

    /// The operator guide's configuration reference is what a missing
    /// file means.
    #[test]
    fn documented_defaults_are_valid_and_the_defaults() {
        let guide = include_str!("../../docs/operator-guide.md");
        let section = &guide[guide
            .find("\n## Configuration\n")
            .expect("the operator guide has a Configuration section")..];
        let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let block = &section[start..start + section[start..].find("```").unwrap()];
        let c = Config::parse(block, Path::new("docs/operator-guide.md")).unwrap();
        let d = Config::default();
        assert_eq!(format!("{:?}", c.nri.options()), format!("{:?}", d.nri.options()));
        assert_eq!(c.shim.state_root, d.shim.state_root);
        assert_eq!(c.shim.idle_timeout, d.shim.idle_timeout);
        assert_eq!(c.shim.log_level, d.shim.log_level);
        assert!(!c.nri.disable);
    }

    /// The README's short example is a valid config that means what its
    /// comments say.
    #[test]
    fn readme_example_is_valid() {
        let readme = include_str!("../../README.md");
        let section = &readme[readme
            .find("### Configuration")
            .expect("README has a Configuration section")..];
        let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let block = &section[start..start + section[start..].find("```").unwrap()];
        let c = Config::parse(block, Path::new("README.md")).unwrap();
        let o = c.nri.options();
        assert!(
            o.permissions("10-cpu-pinning")
                .unwrap()
                .allows(nri_adaptation::FieldGroup::Cpu)
        );
        assert!(
            !o.permissions("10-cpu-pinning")
                .unwrap()
                .allows(nri_adaptation::FieldGroup::Env)
        );
        assert_eq!(c.shim.state_root, Config::default().shim.state_root);
    }

    /// The operator guide's permission examples parse and mean what they
    /// say, and its table lists every field group.
    #[test]
    fn documented_permissions_are_valid_and_complete() {
        use nri_adaptation::FieldGroup;
        let guide = include_str!("../../docs/operator-guide.md");
        let section = &guide[guide
            .find("\n## Per-plugin permissions\n")
            .expect("the operator guide has a Per-plugin permissions section")..];
        let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let block = &section[start..start + section[start..].find("```").unwrap()];
        let o = Config::parse(block, Path::new("docs/operator-guide.md"))
            .unwrap()
            .nri
            .options();
        let allows = |plugin: &str, g: FieldGroup| o.permissions(plugin).unwrap().allows(g);
        assert!(allows("10-cpu-pinning", FieldGroup::Cpu) && allows("10-cpu-pinning", FieldGroup::Memory));
        assert!(!allows("10-cpu-pinning", FieldGroup::Env));
        for g in [
            FieldGroup::Devices,
            FieldGroup::CdiDevices,
            FieldGroup::Mounts,
            FieldGroup::Env,
        ] {
            assert!(allows("40-device-injector", g), "{g}");
        }
        assert!(!allows("40-device-injector", FieldGroup::Memory));
        assert!(allows("20-other", FieldGroup::Annotations) && !allows("20-other", FieldGroup::Env));
        assert_eq!(o.failure_policy("10", "cpu-pinning"), FailurePolicy::Fail);
        let table: Vec<&str> = section[start..]
            .lines()
            .skip_while(|l| !l.starts_with("| group |"))
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| l.split('`').nth(1).unwrap())
            .collect();
        let all: Vec<&str> = FieldGroup::ALL.iter().map(|g| g.as_str()).collect();
        assert_eq!(table, all);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("4096"), Some(4096));
        assert_eq!(parse_byte_size("4096B"), Some(4096));
        assert_eq!(parse_byte_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_byte_size("10MiB"), Some(10 << 20));
        assert_eq!(parse_byte_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_byte_size("0"), Some(0));
        for bad in ["", "MiB", "10MB", "10 MiB", "-1", "1.5MiB", "99999999999999999999GiB"] {
            assert_eq!(parse_byte_size(bad), None, "{bad:?}");
        }
        let c = Config::parse("[shim]\nlog_max_size = \"64KiB\"\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.shim.log_max_size, 64 << 10);
        let e = Config::parse("[shim]\nlog_max_size = \"10MB\"\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("invalid size \"10MB\""), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("5d"), None);
    }

    #[test]
    fn durations_in_go_form() {
        let ms = Duration::from_millis;
        for (s, d) in [
            ("1m30s", ms(90_000)),
            ("2h45m", ms(9_900_000)),
            ("1.5h", ms(5_400_000)),
            ("300us", Duration::from_micros(300)),
            ("5µs", Duration::from_micros(5)),
            ("10ns", Duration::from_nanos(10)),
            ("0", Duration::ZERO),
            (".5s", ms(500)),
            ("5.s", ms(5000)),
            ("3μs", Duration::from_micros(3)),
        ] {
            assert_eq!(parse_duration(s), Some(d), "{s}");
        }
        for s in [
            "",
            "-1s",
            "1m 30s",
            "1x",
            "s",
            ".s",
            "1..5s",
            "1sµ",
            "µ5s",
            "99999999999999999999h",
        ] {
            assert_eq!(parse_duration(s), None, "{s:?}");
        }
    }
}
