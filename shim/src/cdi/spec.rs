//! CDI spec files: their serde shape (CDI spec versions 0.3.0 to 1.1.0,
//! JSON or YAML), names, and the checks made before any edit is applied.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::container::bundle::OCI_HOOKS;

/// The highest CDI spec version understood (`cdiVersion`).
pub const MAX_VERSION: (u64, u64) = (1, 1);
/// The lowest CDI spec version understood.
pub const MIN_VERSION: (u64, u64) = (0, 3);

/// One CDI spec file: a kind (`vendor.com/class`) and its devices.
///
/// Unknown keys are refused: an edit the shim would silently skip could
/// leave a device half-injected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpecFile {
    /// `cdiVersion`, e.g. `"0.6.0"`.
    pub cdi_version: String,
    /// `vendor.com/class`.
    pub kind: String,
    /// Free-form annotations (not applied).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The devices this file defines.
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// Edits applied once to a container that gets any of these devices.
    #[serde(default)]
    pub container_edits: Option<ContainerEdits>,
}

/// One device of a spec file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceSpec {
    /// The device's name within its kind (`gpu0`, `all`).
    pub name: String,
    /// Free-form annotations (not applied).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// What the device changes in a container.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// The OCI spec changes of a device or a spec file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries; a name replaces the container's own.
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes made in the container (and allowed by its cgroup).
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks, appended.
    #[serde(default)]
    pub hooks: Vec<Hook>,
    /// Mounts; a container path replaces the container's own mount there.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Supplementary groups of the container's processes.
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    /// Intel RDT: parsed only to refuse it by name (see [`ContainerEdits::check`]).
    #[serde(default)]
    pub intel_rdt: Option<serde_yaml_ng::Value>,
    /// Network devices: parsed only to refuse them by name.
    #[serde(default)]
    pub net_devices: Option<serde_yaml_ng::Value>,
}

/// A device node edit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (default: `path`); type, numbers and mode come
    /// from it when the spec leaves them out.
    #[serde(default)]
    pub host_path: Option<String>,
    /// `c`, `u`, `b` or `p`.
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
    /// Major number.
    #[serde(default)]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default)]
    pub minor: Option<i64>,
    /// Permission bits of the node (e.g. `0o666`).
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// cgroup access, a subset of `rwm` (default `rwm`).
    #[serde(default)]
    pub permissions: Option<String>,
    /// Owner (default: the container process's uid when not root).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Group (default: the container process's gid when not root).
    #[serde(default)]
    pub gid: Option<u32>,
}

/// A hook edit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart` or `poststop`.
    pub hook_name: String,
    /// Absolute path of the program.
    pub path: String,
    /// Its argv.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// Seconds before it is killed.
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// A mount edit.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container (absolute).
    pub container_path: String,
    /// Filesystem type (`bind`, `tmpfs`, ...).
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
    /// Mount options.
    #[serde(default)]
    pub options: Vec<String>,
}

impl SpecFile {
    /// Checks version, kind and device names.
    ///
    /// # Errors
    /// What is wrong, and where in the file.
    pub fn check(&self) -> Result<(), String> {
        let version = parse_version(&self.cdi_version)
            .ok_or_else(|| format!("cdiVersion {:?} is not a version like \"0.6.0\"", self.cdi_version))?;
        if version < MIN_VERSION || version > MAX_VERSION {
            return Err(format!(
                "cdiVersion {:?} is not supported (supported: {}.{}.0 to {}.{}.x)",
                self.cdi_version, MIN_VERSION.0, MIN_VERSION.1, MAX_VERSION.0, MAX_VERSION.1
            ));
        }
        check_kind(&self.kind)?;
        if self.devices.is_empty() {
            return Err("no devices".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.devices {
            check_device_name(&d.name)?;
            if !seen.insert(&d.name) {
                return Err(format!("device {:?} is defined twice", d.name));
            }
        }
        Ok(())
    }
}

impl ContainerEdits {
    /// Checks what `super::edits` relies on: `NAME=value` env, absolute
    /// paths, known hook names and device types.
    ///
    /// # Errors
    /// The offending entry.
    pub fn check(&self) -> Result<(), String> {
        if self.intel_rdt.is_some() {
            return Err("intelRdt edits are not supported by nri-shim".into());
        }
        if self.net_devices.is_some() {
            return Err("netDevices edits are not supported by nri-shim".into());
        }
        for e in &self.env {
            if e.split_once('=').is_none_or(|(name, _)| name.is_empty()) {
                return Err(format!("env entry {e:?} is not NAME=value"));
            }
        }
        for d in &self.device_nodes {
            if !d.path.starts_with('/') {
                return Err(format!("deviceNodes path {:?} is not absolute", d.path));
            }
            if let Some(h) = &d.host_path
                && !h.starts_with('/')
            {
                return Err(format!("deviceNodes hostPath {h:?} is not absolute"));
            }
            if let Some(t) = &d.typ
                && !matches!(t.as_str(), "c" | "u" | "b" | "p")
            {
                return Err(format!("deviceNodes {:?}: type {t:?} is not one of c, u, b, p", d.path));
            }
            if let Some(p) = &d.permissions
                && (p.is_empty() || !p.chars().all(|c| "rwm".contains(c)))
            {
                return Err(format!(
                    "deviceNodes {:?}: permissions {p:?} is not a subset of \"rwm\"",
                    d.path
                ));
            }
            if d.major.is_some_and(|m| m < 0) || d.minor.is_some_and(|m| m < 0) {
                return Err(format!("deviceNodes {:?}: negative major or minor", d.path));
            }
        }
        for h in &self.hooks {
            if !OCI_HOOKS.contains(&h.hook_name.as_str()) {
                return Err(format!(
                    "hookName {:?} is not one of {}",
                    h.hook_name,
                    OCI_HOOKS.join(", ")
                ));
            }
            if !h.path.starts_with('/') {
                return Err(format!("hook path {:?} is not absolute", h.path));
            }
        }
        for m in &self.mounts {
            if !m.container_path.starts_with('/') {
                return Err(format!("mount containerPath {:?} is not absolute", m.container_path));
            }
            if m.host_path.is_empty() {
                return Err(format!("mount {:?} has no hostPath", m.container_path));
            }
        }
        Ok(())
    }
}

/// `"1.0.0"` as `(1, 0)`; the patch level is not checked.
fn parse_version(v: &str) -> Option<(u64, u64)> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut parts = v.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?;
    patch.parse::<u64>().ok()?;
    Some((major, minor))
}

/// `vendor.com/class`: a vendor of letters, digits, `-` and `.` that
/// starts with a letter and ends with a letter or digit; a class of
/// letters, digits, `-`, `_` and `.` with the same ends.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("kind {kind:?} is not vendor/class"))?;
    check_part(kind, "vendor", vendor, "-.")?;
    check_part(kind, "class", class, "-_.")
}

fn check_part(whole: &str, what: &str, s: &str, extra: &str) -> Result<(), String> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {s:?} of {whole:?} must start with a letter, end with a letter or digit and hold only letters, digits and {extra:?}"
        ))
    }
}

/// A device name: letters, digits, `-`, `_`, `.` and `:`, starting and
/// ending with a letter or digit.
pub fn check_device_name(name: &str) -> Result<(), String> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "device name {name:?} must start and end with a letter or digit and hold only letters, digits, '-', '_', '.' and ':'"
        ))
    }
}

/// Splits a fully qualified device name `vendor.com/class=name` into kind
/// and name, checking both.
///
/// # Errors
/// Why the name is not fully qualified.
pub fn parse_qualified(qualified: &str) -> Result<(&str, &str), String> {
    let (kind, name) = qualified
        .split_once('=')
        .ok_or_else(|| "not of the form vendor.com/class=name".to_string())?;
    check_kind(kind)?;
    check_device_name(name)?;
    Ok((kind, name))
}
