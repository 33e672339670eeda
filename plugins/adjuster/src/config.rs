//! The adjuster's TOML configuration: types, parsing and validation. The
//! format is documented in the crate docs.

use std::{collections::BTreeMap, fmt, path::Path};

use nri_stub::api;
use serde::{Deserialize, Deserializer};

use crate::pattern::Pattern;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read adjuster config {path}: {source}")]
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

/// A byte count: a TOML integer (bytes; -1 means unlimited) or a string
/// with a Kubernetes-style unit: `k`, `M`, `G`, `T` (powers of 1000) or
/// `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024).
///
/// ```
/// use nri_adjuster::Bytes;
/// assert_eq!("128Mi".parse::<Bytes>().unwrap(), Bytes(128 << 20));
/// assert_eq!("2G".parse::<Bytes>().unwrap(), Bytes(2_000_000_000));
/// assert_eq!("4096".parse::<Bytes>().unwrap(), Bytes(4096));
/// assert!("12MB".parse::<Bytes>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub i64);

impl std::str::FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(digits);
        let bad = || {
            format!("invalid byte count {s:?}: expected a number with an optional unit k, M, G, T, Ki, Mi, Gi or Ti")
        };
        let n: i64 = num.parse().map_err(|_| bad())?;
        let mult: i64 = match unit {
            "" => 1,
            "k" => 1000,
            "M" => 1000_i64.pow(2),
            "G" => 1000_i64.pow(3),
            "T" => 1000_i64.pow(4),
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            _ => return Err(bad()),
        };
        n.checked_mul(mult)
            .map(Bytes)
            .ok_or_else(|| format!("byte count {s:?} is too large"))
    }
}

impl fmt::Display for Bytes {
    /// The count in bytes, and in the largest unit that divides it, for
    /// error messages: `134217728 (128Mi)`, `-1 (unlimited)`, `4095`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, i64); 8] = [
            ("Ti", 1 << 40),
            ("T", 1000_i64.pow(4)),
            ("Gi", 1 << 30),
            ("G", 1000_i64.pow(3)),
            ("Mi", 1 << 20),
            ("M", 1000_i64.pow(2)),
            ("Ki", 1 << 10),
            ("k", 1000),
        ];
        let n = self.0;
        if n == -1 {
            return f.write_str("-1 (unlimited)");
        }
        match UNITS.iter().find(|(_, m)| n > 0 && n % m == 0) {
            Some((unit, m)) => write!(f, "{n} ({}{unit})", n / m),
            None => write!(f, "{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Bytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: an integer, -1 (unlimited), or a string such as \"128Mi\"")
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Bytes, E> {
                if v < -1 {
                    return Err(E::custom(format!(
                        "invalid byte count {v}: must be -1 (unlimited) or a byte count"
                    )));
                }
                Ok(Bytes(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Bytes, E> {
                i64::try_from(v)
                    .map(Bytes)
                    .map_err(|_| E::custom(format!("byte count {v} is too large")))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bytes, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether `s` is a cpuset list: `N` or `N-M` (N <= M), comma-separated.
fn valid_cpuset(s: &str) -> bool {
    let num = |x: &str| -> Option<u32> {
        (!x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
            .then(|| x.parse().ok())
            .flatten()
    };
    !s.is_empty()
        && s.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((num(a), num(b)), (Some(a), Some(b)) if a <= b),
            None => num(part).is_some(),
        })
}

/// The rule the byte `offset` of `text` lies in: the number of
/// `[[rule]]` headers before it.
fn rule_at(text: &str, offset: usize) -> Option<usize> {
    let before = text.get(..offset)?;
    let n = before
        .lines()
        .filter(|l| l.trim_start().starts_with("[[rule]]"))
        .count();
    (n > 0).then_some(n)
}

impl Config {
    /// Parses and validates a configuration.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] (syntax, unknown key, wrong type, bad glob,
    /// bad unit) or [`ConfigError::Invalid`] (a value that cannot work).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let start = e.span().map(|s| s.start).filter(|s| text.is_char_boundary(*s));
            let line = start.map(|s| text[..s].matches('\n').count() + 1);
            ConfigError::Parse {
                rule: start.and_then(|s| rule_at(text, s)),
                line,
                text: line
                    .and_then(|l| text.lines().nth(l - 1))
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty()),
                message: e.message().trim().replace('\n', "; "),
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or what [`Config::parse`] returns.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text)
    }

    /// Checks what the types alone do not.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the rule and the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.validate().map_err(|(key, reason)| ConfigError::Invalid {
                rule: i + 1,
                name: rule.name.clone(),
                key,
                reason,
            })?;
        }
        Ok(())
    }

    /// The rules that apply to container `c` of `pod`, in file order, with
    /// their 1-based numbers.
    pub fn matching<'a>(&'a self, pod: &api::PodSandbox, c: &api::Container) -> Vec<(usize, &'a Rule)> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.matches(pod, c))
            .map(|(i, r)| (i + 1, r))
            .collect()
    }
}

type Invalid = (String, String);

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Invalid {
    (key.into(), reason.into())
}

impl Rule {
    /// `name`, else `#N` for rule number `n` (1-based).
    pub fn label(&self, n: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("#{n}"))
    }

    /// Whether the rule applies to container `c` of `pod`.
    ///
    /// Every condition given must hold. An annotation condition holds when
    /// the pod's annotation has that value, or else the container's.
    pub fn matches(&self, pod: &api::PodSandbox, c: &api::Container) -> bool {
        let m = &self.matcher;
        let name_ok = |p: &Option<Pattern>, s: &str| p.as_ref().is_none_or(|p| p.matches(s));
        name_ok(&m.pod_name, &pod.name)
            && name_ok(&m.pod_namespace, &pod.namespace)
            && name_ok(&m.container_name, &c.name)
            && m.annotations
                .iter()
                .all(|(k, v)| pod.annotations.get(k) == Some(v) || c.annotations.get(k) == Some(v))
    }

    fn validate(&self) -> Result<(), Invalid> {
        if self.name.as_deref().is_some_and(str::is_empty) {
            return Err(invalid("name", "must not be empty"));
        }
        for k in self.matcher.annotations.keys() {
            if k.is_empty() {
                return Err(invalid("match.annotations", "empty annotation name"));
            }
        }
        let a = &self.adjust;
        if *a == Adjust::default() {
            return Err(invalid("adjust", "nothing to adjust"));
        }
        for k in a.env.keys() {
            let key = format!("adjust.env.{k}");
            if k.is_empty() {
                return Err(invalid("adjust.env", "empty variable name"));
            }
            if k.contains('=') {
                return Err(invalid(key, "variable name must not contain '='"));
            }
            if k.starts_with('-') {
                return Err(invalid(
                    key,
                    "variable name must not start with '-' (use the value \"-\" to remove)",
                ));
            }
        }
        for k in a.annotations.keys() {
            if k.is_empty() {
                return Err(invalid("adjust.annotations", "empty annotation name"));
            }
            if k.starts_with('-') {
                return Err(invalid(
                    format!("adjust.annotations.{k}"),
                    "annotation name must not start with '-' (use the value \"-\" to remove)",
                ));
            }
        }
        for (i, m) in a.mounts.iter().enumerate() {
            let key = format!("adjust.mounts[{i}].destination");
            if !m.destination.starts_with('/') {
                return Err(invalid(key, format!("{:?} is not an absolute path", m.destination)));
            }
            if a.mounts[..i].iter().any(|x| x.destination == m.destination) {
                return Err(invalid(key, format!("{:?} is given twice", m.destination)));
            }
        }
        for (i, d) in a.devices.iter().enumerate() {
            let key = |f: &str| format!("adjust.devices[{i}].{f}");
            if !d.path.starts_with('/') {
                return Err(invalid(key("path"), format!("{:?} is not an absolute path", d.path)));
            }
            if a.devices[..i].iter().any(|x| x.path == d.path) {
                return Err(invalid(key("path"), format!("{:?} is given twice", d.path)));
            }
            if d.typ != DeviceType::Fifo {
                if d.major.is_none() {
                    return Err(invalid(key("major"), "required for a b, c or u device"));
                }
                if d.minor.is_none() {
                    return Err(invalid(key("minor"), "required for a b, c or u device"));
                }
            }
            for (f, v) in [("major", d.major), ("minor", d.minor)] {
                if v.is_some_and(|v| v < 0) {
                    return Err(invalid(key(f), "must not be negative"));
                }
            }
            if d.file_mode.is_some_and(|m| m > 0o7777) {
                return Err(invalid(key("file_mode"), "must be permission bits, at most 0o7777"));
            }
        }
        if let Some(c) = &a.cpu {
            if c.quota.is_some_and(|q| q < -1 || q == 0) {
                return Err(invalid(
                    "adjust.cpu.quota",
                    "must be -1 (unlimited) or positive microseconds",
                ));
            }
            if c.period.is_some_and(|p| !(1000..=1_000_000).contains(&p)) {
                return Err(invalid(
                    "adjust.cpu.period",
                    "must be within 1000..=1000000 microseconds",
                ));
            }
            for (f, v) in [("cpus", &c.cpus), ("mems", &c.mems)] {
                if let Some(v) = v
                    && !valid_cpuset(v)
                {
                    return Err(invalid(
                        format!("adjust.cpu.{f}"),
                        format!("{v:?} is not a cpuset list such as \"0-3,6\""),
                    ));
                }
            }
        }
        if let Some(m) = &a.memory {
            // The runtimes take 0 for "not set": the container would run
            // without the limit the rule asks for.
            for (f, v) in [("limit", m.limit), ("swap", m.swap)] {
                if v == Some(Bytes(0)) {
                    return Err(invalid(
                        format!("adjust.memory.{f}"),
                        "0 would mean no limit: must be -1 (unlimited) or a positive byte count",
                    ));
                }
            }
            // swap is memory plus swap (cgroup v1 memory.memsw.limit_in_bytes),
            // which the kernel refuses below the memory limit.
            if let (Some(limit), Some(swap)) = (m.limit, m.swap)
                && swap.0 != -1
                && (limit.0 == -1 || swap.0 < limit.0)
            {
                return Err(invalid(
                    "adjust.memory.swap",
                    format!(
                        "swap {swap} is below limit {limit}: swap is the memory plus swap limit and must be at least \
                         the memory limit (or -1, unlimited)"
                    ),
                ));
            }
            if m.swappiness.is_some_and(|s| s > 100) {
                return Err(invalid("adjust.memory.swappiness", "must be within 0..=100"));
            }
        }
        if let Some(p) = &a.pids
            && p.limit < -1
        {
            return Err(invalid("adjust.pids.limit", "must be -1 (unlimited) or a count"));
        }
        for (i, r) in a.rlimits.iter().enumerate() {
            if !RLIMIT_TYPES.contains(&r.typ.as_str()) {
                return Err(invalid(
                    format!("adjust.rlimits[{i}].type"),
                    format!(
                        "unknown rlimit type {:?} (expected RLIMIT_NOFILE, RLIMIT_NPROC, ...)",
                        r.typ
                    ),
                ));
            }
            if a.rlimits[..i].iter().any(|x| x.typ == r.typ) {
                return Err(invalid(
                    format!("adjust.rlimits[{i}].type"),
                    format!("{} is given twice", r.typ),
                ));
            }
            if r.soft > r.hard {
                return Err(invalid(
                    format!("adjust.rlimits[{i}].soft"),
                    format!("soft limit {} is above the hard limit {}", r.soft, r.hard),
                ));
            }
        }
        if let Some(o) = a.oom_score_adj
            && !(-1000..=1000).contains(&o)
        {
            return Err(invalid("adjust.oom_score_adj", "must be within -1000..=1000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    const HEAD: &str = "[[rule]]\nname = \"r\"\n[rule.adjust]\n";

    #[test]
    fn full_rule_parses() {
        let cfg = Config::parse(
            r#"
            [[rule]]
            name = "everything"
            [rule.match]
            pod_name = "web-*"
            pod_namespace = "prod"
            container_name = "app"
            annotations = { "example.com/tier" = "gold" }
            [rule.adjust]
            env = { FOO = "1", OLD = "-" }
            annotations = { "a" = "b", "gone" = "-" }
            mounts = [{ destination = "/cache", source = "/var/cache/app", type = "bind", options = ["rbind", "ro"] }]
            devices = [{ path = "/dev/fuse", type = "c", major = 10, minor = 229, file_mode = 0o666, uid = 0, gid = 0 }]
            cpu = { shares = 512, quota = 20000, period = 100000, cpus = "0-1", mems = "0" }
            memory = { limit = "256Mi", reservation = 1048576, swap = -1, swappiness = 10, disable_oom_killer = false }
            pids = { limit = 100 }
            rlimits = [{ type = "RLIMIT_NOFILE", hard = 4096, soft = 1024 }]
            oom_score_adj = 500
            "#,
        )
        .unwrap();
        let r = &cfg.rules[0];
        assert_eq!(r.matcher.pod_name.as_ref().unwrap().as_str(), "web-*");
        assert_eq!(r.adjust.env["OLD"], "-");
        assert_eq!(r.adjust.devices[0].typ, DeviceType::Char);
        assert_eq!(r.adjust.devices[0].file_mode, Some(0o666));
        let m = r.adjust.memory.as_ref().unwrap();
        assert_eq!(m.limit, Some(Bytes(256 << 20)));
        assert_eq!(m.swap, Some(Bytes(-1)));
        assert_eq!(r.adjust.rlimits[0].soft, 1024);
        assert_eq!(r.adjust.oom_score_adj, Some(500));
    }

    #[test]
    fn empty_config_has_no_rules() {
        assert!(Config::parse("").unwrap().rules.is_empty());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err(&format!("{HEAD}colour = \"red\"\n"));
        assert!(e.contains("colour") && e.contains("rule 1"), "{e}");
        let e = err("[[rule]]\n[rule.match]\ncontainer = \"app\"\n[rule.adjust]\nenv = { A = \"1\" }\n");
        assert!(e.contains("unknown field `container`"), "{e}");
        let e = err(&format!("{HEAD}memory = {{ limt = 1 }}\n"));
        assert!(e.contains("limt"), "{e}");
        let e = err("rules = []\n");
        assert!(e.contains("rules"), "{e}");
        // The rule number is found for errors in later rules too.
        let e = err(&format!("{HEAD}env = {{ A = \"1\" }}\n{HEAD}pids = {{ max = 3 }}\n"));
        assert!(e.contains("rule 2") && e.contains("max"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        for (text, needle) in [
            (
                "[[rule]]\n[rule.match]\npod_name = \"web-?\"\n[rule.adjust]\noom_score_adj = 1\n",
                "web-?",
            ),
            (
                "[[rule]]\n[rule.match]\npod_name = \"\"\n[rule.adjust]\noom_score_adj = 1\n",
                "empty pattern",
            ),
            (&format!("{HEAD}memory = {{ limit = \"12MB\" }}\n"), "12MB"),
            (&format!("{HEAD}memory = {{ limit = -5 }}\n"), "-5"),
            (&format!("{HEAD}cpu = {{ shares = -1 }}\n"), "shares"),
            (
                &format!("{HEAD}devices = [{{ path = \"/dev/x\", type = \"x\", major = 1, minor = 1 }}]\n"),
                "`x`",
            ),
            (&format!("{HEAD}env = {{ A = 1 }}\n"), "expected a string"),
        ] {
            let e = err(text);
            assert!(e.contains(needle), "{needle:?} not in {e}");
        }
    }

    #[test]
    fn semantic_errors_name_rule_and_key() {
        for (adjust, key) in [
            ("", "adjust: nothing to adjust"),
            ("env = { \"A=B\" = \"1\" }", "adjust.env.A=B"),
            ("env = { \"-A\" = \"1\" }", "adjust.env.-A"),
            ("annotations = { \"-a\" = \"1\" }", "adjust.annotations.-a"),
            ("mounts = [{ destination = \"rel\" }]", "adjust.mounts[0].destination"),
            (
                "mounts = [{ destination = \"/a\" }, { destination = \"/a\" }]",
                "adjust.mounts[1].destination",
            ),
            (
                "devices = [{ path = \"/dev/x\", type = \"c\", major = 1 }]",
                "adjust.devices[0].minor",
            ),
            (
                "devices = [{ path = \"/dev/x\", type = \"p\", file_mode = 0o17777 }]",
                "adjust.devices[0].file_mode",
            ),
            ("cpu = { period = 10 }", "adjust.cpu.period"),
            ("cpu = { quota = -2 }", "adjust.cpu.quota"),
            ("cpu = { cpus = \"3-1\" }", "adjust.cpu.cpus"),
            ("cpu = { mems = \"0,,1\" }", "adjust.cpu.mems"),
            ("memory = { swappiness = 101 }", "adjust.memory.swappiness"),
            ("pids = { limit = -2 }", "adjust.pids.limit"),
            (
                "rlimits = [{ type = \"NOFILE\", hard = 1, soft = 1 }]",
                "adjust.rlimits[0].type",
            ),
            (
                "rlimits = [{ type = \"RLIMIT_NOFILE\", hard = 1, soft = 2 }]",
                "adjust.rlimits[0].soft",
            ),
            ("oom_score_adj = 1001", "adjust.oom_score_adj"),
        ] {
            let e = err(&format!("{HEAD}{adjust}\n"));
            assert!(e.contains("rule 1 (\"r\")") && e.contains(key), "{key:?} not in {e}");
        }
    }

    #[test]
    fn zero_memory_limit_is_refused_naming_rule_and_key() {
        for limit in ["0", "\"0\"", "\"0Mi\""] {
            let e = err(&format!("{HEAD}memory = {{ limit = {limit} }}\n"));
            assert!(
                e.contains("rule 1 (\"r\")") && e.contains("adjust.memory.limit") && e.contains("-1 (unlimited)"),
                "{limit}: {e}"
            );
        }
        // Zero swap is "no limit" to the runtime as well.
        let e = err(&format!("{HEAD}memory = {{ swap = 0 }}\n"));
        assert!(e.contains("rule 1 (\"r\")") && e.contains("adjust.memory.swap"), "{e}");
        // Unlimited and positive limits stay valid.
        for limit in ["-1", "1", "\"128Mi\""] {
            Config::parse(&format!("{HEAD}memory = {{ limit = {limit} }}\n")).unwrap();
        }
    }

    #[test]
    fn swap_below_the_limit_is_refused_naming_both_values() {
        let e = err(&format!("{HEAD}memory = {{ limit = \"128Mi\", swap = \"64Mi\" }}\n"));
        assert!(
            e.contains("rule 1 (\"r\")")
                && e.contains("adjust.memory.swap")
                && e.contains("67108864 (64Mi)")
                && e.contains("134217728 (128Mi)"),
            "{e}"
        );
        // A finite memory+swap limit under an unlimited memory limit.
        let e = err(&format!("{HEAD}memory = {{ limit = -1, swap = 1000 }}\n"));
        assert!(
            e.contains("adjust.memory.swap") && e.contains("1000 (1k)") && e.contains("-1 (unlimited)"),
            "{e}"
        );
        for ok in [
            "limit = \"128Mi\", swap = \"128Mi\"",
            "limit = \"128Mi\", swap = \"256Mi\"",
            "limit = \"128Mi\", swap = -1",
            "limit = -1, swap = -1",
            "swap = \"64Mi\"",
        ] {
            Config::parse(&format!("{HEAD}memory = {{ {ok} }}\n")).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn cpusets() {
        for ok in ["0", "0-3", "0-3,6", "1,2,3", "5-5"] {
            assert!(valid_cpuset(ok), "{ok}");
        }
        for bad in ["", "a", "3-1", "0,", "-1", "0-", "1 ,2"] {
            assert!(!valid_cpuset(bad), "{bad}");
        }
    }

    fn pod(name: &str, ns: &str, ann: &[(&str, &str)]) -> api::PodSandbox {
        let mut p = api::PodSandbox {
            id: "p1".into(),
            name: name.into(),
            namespace: ns.into(),
            ..Default::default()
        };
        for (k, v) in ann {
            p.annotations.insert(k.to_string(), v.to_string());
        }
        p
    }

    fn ctr(name: &str, ann: &[(&str, &str)]) -> api::Container {
        let mut c = api::Container {
            id: "c1".into(),
            name: name.into(),
            ..Default::default()
        };
        for (k, v) in ann {
            c.annotations.insert(k.to_string(), v.to_string());
        }
        c
    }

    #[test]
    fn matching_requires_every_condition() {
        let cfg = Config::parse(
            r#"
            [[rule]]
            [rule.match]
            pod_name = "web-*"
            pod_namespace = "prod"
            container_name = "app"
            annotations = { "tier" = "gold", "team" = "a" }
            [rule.adjust]
            oom_score_adj = 1
            "#,
        )
        .unwrap();
        let r = &cfg.rules[0];
        let ann_pod = [("tier", "gold")];
        let ann_ctr = [("team", "a")];
        assert!(r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app", &ann_ctr)));
        // Both annotations on the container also match.
        assert!(r.matches(
            &pod("web-1", "prod", &[]),
            &ctr("app", &[("tier", "gold"), ("team", "a")])
        ));
        // A pod value that differs does not hide a matching container value.
        assert!(r.matches(
            &pod("web-1", "prod", &[("tier", "silver")]),
            &ctr("app", &[("tier", "gold"), ("team", "a")])
        ));
        assert!(!r.matches(&pod("api-1", "prod", &ann_pod), &ctr("app", &ann_ctr)));
        assert!(!r.matches(&pod("web-1", "dev", &ann_pod), &ctr("app", &ann_ctr)));
        assert!(!r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app2", &ann_ctr)));
        assert!(!r.matches(&pod("web-1", "prod", &ann_pod), &ctr("app", &[])));
        assert!(!r.matches(&pod("web-1", "prod", &[("tier", "silver")]), &ctr("app", &ann_ctr)));
    }

    #[test]
    fn empty_match_matches_everything() {
        let cfg = Config::parse(&format!("{HEAD}oom_score_adj = 1\n")).unwrap();
        assert_eq!(cfg.matching(&pod("x", "y", &[]), &ctr("z", &[])).len(), 1);
    }
}
