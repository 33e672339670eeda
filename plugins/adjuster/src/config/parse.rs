//! Parsing, validation and matching of a configuration.

use std::path::Path;

use nri_stub::api;

use super::{Adjust, Bytes, Config, ConfigError, DeviceType, RLIMIT_TYPES, Rule};
use crate::pattern::Pattern;

/// Whether `s` is a cpuset list: `N` or `N-M` (N <= M), comma-separated.
pub(super) fn valid_cpuset(s: &str) -> bool {
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
