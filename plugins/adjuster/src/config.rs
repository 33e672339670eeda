//! The adjuster's TOML configuration: types, parsing and validation. The
//! format is documented in the crate docs.

use std::collections::BTreeMap;

use serde::Deserialize;

pub use self::bytes::Bytes;
use crate::pattern::Pattern;

mod bytes;
mod parse;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read adjuster config {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a value of the wrong type or out
    /// of its set. One line, for the runtime's log: the TOML parser's
    /// message with the rule, line and text of the line it is about.
    #[error("invalid adjuster config: {}{message}", where_(*.rule, *.line, .text.as_deref()))]
    Parse {
        /// The rule (1-based) the error is in, when known.
        rule: Option<usize>,
        /// The line (1-based), when known.
        line: Option<usize>,
        /// That line, trimmed.
        text: Option<String>,
        /// What the TOML parser says, e.g. ``unknown field `colour`, expected one of ...``.
        message: String,
    },
    /// A value that parses but cannot work (see the crate docs for the rules).
    #[error("invalid adjuster config: rule {}: {key}: {reason}", rule_label(*.rule, .name.as_deref()))]
    Invalid {
        /// The rule, 1-based.
        rule: usize,
        /// Its name, if it has one.
        name: Option<String>,
        /// The key, e.g. `adjust.memory.swappiness` or `adjust.env.FOO`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

fn where_(rule: Option<usize>, line: Option<usize>, text: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(r) = rule {
        parts.push(format!("rule {r}"));
    }
    if let Some(l) = line {
        parts.push(format!("line {l}"));
    }
    if let Some(t) = text {
        parts.push(format!("`{t}`"));
    }
    parts.iter().map(|p| format!("{p}: ")).collect()
}

fn rule_label(rule: usize, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("{rule} ({n:?})"),
        None => rule.to_string(),
    }
}

/// The configuration: rules, applied in file order (`[[rule]]` tables).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The rules.
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
}

/// One rule: which containers, and what to change in them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A name for logs and errors.
    pub name: Option<String>,
    /// Which containers the rule applies to (all, when empty).
    #[serde(default, rename = "match")]
    pub matcher: Match,
    /// What to change.
    #[serde(default)]
    pub adjust: Adjust,
}

/// `[rule.match]`: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// Pod name.
    pub pod_name: Option<Pattern>,
    /// Pod namespace.
    pub pod_namespace: Option<Pattern>,
    /// Container name.
    pub container_name: Option<Pattern>,
    /// Annotations (exact values) the pod or the container must carry.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `[rule.adjust]`: what a matching rule changes.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adjust {
    /// Environment variables to set; the value `"-"` removes the variable.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Annotations to set; the value `"-"` removes the annotation.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Mounts to add (or replace, by destination).
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    /// Device nodes to add (or replace, by path).
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// CPU settings.
    pub cpu: Option<CpuSpec>,
    /// Memory settings.
    pub memory: Option<MemorySpec>,
    /// Pids limit.
    pub pids: Option<PidsSpec>,
    /// POSIX rlimits to set (by type).
    #[serde(default)]
    pub rlimits: Vec<RlimitSpec>,
    /// OOM score adjustment, -1000..=1000.
    pub oom_score_adj: Option<i64>,
}

/// A mount (`adjust.mounts`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Absolute path in the container.
    pub destination: String,
    /// Source (a host path, or e.g. `tmpfs`).
    #[serde(default)]
    pub source: String,
    /// File system type (`bind`, `tmpfs`, ...).
    #[serde(default, rename = "type")]
    pub typ: String,
    /// Mount options.
    #[serde(default)]
    pub options: Vec<String>,
}

/// A device node type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum DeviceType {
    /// Block device.
    #[serde(rename = "b")]
    Block,
    /// Character device.
    #[serde(rename = "c")]
    Char,
    /// Unbuffered character device.
    #[serde(rename = "u")]
    Unbuffered,
    /// FIFO.
    #[serde(rename = "p")]
    Fifo,
}

impl DeviceType {
    /// The OCI letter.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Block => "b",
            DeviceType::Char => "c",
            DeviceType::Unbuffered => "u",
            DeviceType::Fifo => "p",
        }
    }
}

/// A device node (`adjust.devices`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Absolute path in the container.
    pub path: String,
    /// `b`, `c`, `u` or `p`.
    #[serde(rename = "type")]
    pub typ: DeviceType,
    /// Major number (required except for `p`).
    pub major: Option<i64>,
    /// Minor number (required except for `p`).
    pub minor: Option<i64>,
    /// Permission bits, e.g. `0o666`.
    pub file_mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
}

/// `adjust.cpu`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSpec {
    /// Relative weight (cgroup v1 shares).
    pub shares: Option<u64>,
    /// Microseconds per period; -1 is unlimited.
    pub quota: Option<i64>,
    /// Period in microseconds, 1000..=1000000.
    pub period: Option<u64>,
    /// CPUs, cpuset syntax (`0-3,6`).
    pub cpus: Option<String>,
    /// Memory nodes, cpuset syntax.
    pub mems: Option<String>,
}

/// `adjust.memory`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    /// Limit.
    pub limit: Option<Bytes>,
    /// Soft limit.
    pub reservation: Option<Bytes>,
    /// Memory plus swap limit.
    pub swap: Option<Bytes>,
    /// 0..=100.
    pub swappiness: Option<u64>,
    /// Disables the OOM killer for the container.
    pub disable_oom_killer: Option<bool>,
}

/// `adjust.pids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PidsSpec {
    /// Maximum number of tasks; -1 is unlimited.
    pub limit: i64,
}

/// A POSIX rlimit (`adjust.rlimits`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlimitSpec {
    /// `RLIMIT_NOFILE`, `RLIMIT_NPROC`, ...
    #[serde(rename = "type")]
    pub typ: String,
    /// Hard limit.
    pub hard: u64,
    /// Soft limit, at most `hard`.
    pub soft: u64,
}

/// The rlimit types the OCI runtime spec knows.
pub const RLIMIT_TYPES: [&str; 16] = [
    "RLIMIT_AS",
    "RLIMIT_CORE",
    "RLIMIT_CPU",
    "RLIMIT_DATA",
    "RLIMIT_FSIZE",
    "RLIMIT_LOCKS",
    "RLIMIT_MEMLOCK",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_NOFILE",
    "RLIMIT_NPROC",
    "RLIMIT_RSS",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
    "RLIMIT_SIGPENDING",
    "RLIMIT_STACK",
];

#[cfg(test)]
mod tests;
