//! Per-plugin permissions: which fields of a container a plugin may change.
//!
//! Upstream NRI has no notion of this: any process that reaches the socket (or any
//! file in the plugin directory) may change anything the protocol can
//! express, from an environment variable to the seccomp profile or the
//! namespaces. With [`Options::plugin_permissions`](crate::Options::plugin_permissions)
//! a runtime lists, per plugin, the [`FieldGroup`]s it may touch; every
//! answer of a restricted plugin is checked before it is merged:
//!
//! | answer | checked |
//! |---|---|
//! | CreateContainer | the adjustment, the updates of other containers, the evictions |
//! | UpdateContainer | the updates, the evictions |
//! | StopContainer | the updates |
//! | Synchronize | the updates |
//! | unsolicited UpdateContainers | the updates, the evictions |
//!
//! A field counts as touched when the answer would change it, as the merge
//! reads it: a scalar or message that is present, a list or map that is not
//! empty, `-key` removals included. The empty `hooks`, `linux`,
//! `linux.resources`, `.memory` and `.cpu` messages plugins built with the
//! Go stub send touch nothing. An update's resources are checked with the
//! groups of an adjustment's: `cpu` allows a plugin to set CPU fields of
//! the container being created and of any other container.
//!
//! A violation refuses the plugin's whole answer (nothing of it is merged,
//! no eviction of it delivered); the plugin's
//! [`FailurePolicy`] decides whether the runtime's
//! request fails (`fail`) or goes on without that answer (`ignore`, logged
//! as a warning). A Synchronize answer refused under `fail` is a failed
//! synchronization (the plugin is closed); an unsolicited UpdateContainers
//! is refused to the plugin (PERMISSION_DENIED), there being no runtime
//! request to fail.

use std::{collections::BTreeSet, fmt, str::FromStr};

use nri_proto::api::{self, Field};

use crate::{
    callbacks::Callbacks,
    config::FailurePolicy,
    observe::Rejection,
    resources::{FIELDS, ResourceField},
};

macro_rules! groups {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )*) => {
        /// A group of fields a plugin may be allowed to change, named after
        /// the NRI field (or its OCI counterpart). See the
        /// [module](crate::permissions) for how answers are checked.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum FieldGroup {
            $( $(#[$doc])* $variant, )*
        }

        impl FieldGroup {
            /// Every group, in the order of this list.
            pub const ALL: &'static [FieldGroup] = &[$(FieldGroup::$variant),*];

            /// The name operators write (`env`, `cdi_devices`, `memory`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(FieldGroup::$variant => $name,)*
                }
            }
        }
    };
}

groups! {
    /// `annotations`.
    Annotations = "annotations",
    /// `mounts`.
    Mounts = "mounts",
    /// `env`.
    Env = "env",
    /// `hooks` (OCI hooks of every kind).
    Hooks = "hooks",
    /// `rlimits` (POSIX resource limits of the process).
    Rlimits = "rlimits",
    /// `CDI_devices` (CDI devices by name, resolved by the runtime).
    CdiDevices = "cdi_devices",
    /// `args` (the process's command line).
    Args = "args",
    /// `linux.devices`: device nodes, with the cgroup rule allowing them.
    Devices = "devices",
    /// `linux.cgroups_path`.
    CgroupsPath = "cgroups_path",
    /// `linux.oom_score_adj`.
    OomScoreAdj = "oom_score_adj",
    /// `linux.io_priority`.
    IoPriority = "io_priority",
    /// `linux.seccomp_policy` (OCI `linux.seccomp`).
    Seccomp = "seccomp",
    /// `linux.namespaces`.
    Namespaces = "namespaces",
    /// `linux.sysctl`.
    Sysctl = "sysctl",
    /// `linux.net_devices` (network interfaces moved into the container).
    NetDevices = "net_devices",
    /// `linux.scheduler` (OCI `process.scheduler`).
    Scheduler = "scheduler",
    /// `linux.rdt` (the full RDT configuration: CLOS id, schemata, monitoring).
    Rdt = "rdt",
    /// `linux.memory_policy` (NUMA memory policy).
    MemoryPolicy = "memory_policy",
    /// `linux.resources.memory` (limit, reservation, swap, kernel, ...).
    Memory = "memory",
    /// `linux.resources.cpu` (shares, quota, period, realtime, cpus, mems).
    Cpu = "cpu",
    /// `linux.resources.hugepage_limits`.
    HugepageLimits = "hugepage_limits",
    /// `linux.resources.blockio_class`.
    BlockioClass = "blockio_class",
    /// `linux.resources.rdt_class`.
    RdtClass = "rdt_class",
    /// `linux.resources.unified` (cgroup v2 files).
    Unified = "unified",
    /// `linux.resources.devices`: raw device cgroup rules.
    CgroupDevices = "cgroup_devices",
    /// `linux.resources.pids`.
    Pids = "pids",
    /// `evict`: asking the runtime to stop other containers.
    Evict = "evict",
}

impl fmt::Display for FieldGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name that stands for every group in [`Permissions::parse`].
pub const ALL_GROUPS: &str = "all";

/// A field group name that is not one of [`FieldGroup::ALL`] (nor
/// [`ALL_GROUPS`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown field group {name:?} (known: {}, or {ALL_GROUPS})", known())]
pub struct UnknownFieldGroup {
    /// The name as written.
    pub name: String,
}

fn known() -> String {
    let names: Vec<_> = FieldGroup::ALL.iter().map(|g| g.as_str()).collect();
    names.join(", ")
}

impl FromStr for FieldGroup {
    type Err = UnknownFieldGroup;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldGroup::ALL
            .iter()
            .copied()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| UnknownFieldGroup { name: s.to_string() })
    }
}

/// The field groups one plugin may touch. Empty: the plugin may change
/// nothing (it can still observe events and validate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    allowed: BTreeSet<FieldGroup>,
}

impl Permissions {
    /// Allows exactly `groups`.
    pub fn allowing(groups: impl IntoIterator<Item = FieldGroup>) -> Self {
        Permissions {
            allowed: groups.into_iter().collect(),
        }
    }

    /// Allows every group.
    pub fn all() -> Self {
        Self::allowing(FieldGroup::ALL.iter().copied())
    }

    /// Reads group names as operators write them (`["env", "mounts"]`;
    /// `"all"` for every group).
    ///
    /// ```
    /// use nri_adaptation::permissions::{FieldGroup, Permissions};
    /// let p = Permissions::parse(["cpu", "memory"]).unwrap();
    /// assert!(p.allows(FieldGroup::Cpu) && !p.allows(FieldGroup::Env));
    /// assert!(Permissions::parse(["cpus"]).unwrap_err().to_string().contains(r#""cpus""#));
    /// ```
    ///
    /// # Errors
    /// [`UnknownFieldGroup`] naming the first unknown name.
    pub fn parse<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Self, UnknownFieldGroup> {
        let mut allowed = BTreeSet::new();
        for n in names {
            match n.as_ref() {
                ALL_GROUPS => allowed.extend(FieldGroup::ALL.iter().copied()),
                n => {
                    allowed.insert(n.parse()?);
                }
            }
        }
        Ok(Permissions { allowed })
    }

    /// Whether `group` may be touched.
    pub fn allows(&self, group: FieldGroup) -> bool {
        self.allowed.contains(&group)
    }

    /// The allowed groups, in [`FieldGroup::ALL`] order.
    pub fn groups(&self) -> impl Iterator<Item = FieldGroup> + '_ {
        self.allowed.iter().copied()
    }

    /// Checks a CreateContainer answer of `plugin` (`IDX-NAME`): its
    /// adjustment, its updates of other containers and its evictions, in
    /// that order; the first field outside the permissions is the error.
    ///
    /// # Errors
    /// [`PermissionError`] naming the plugin, the field and its group.
    pub fn check_create(&self, plugin: &str, rsp: &api::CreateContainerResponse) -> Result<(), PermissionError> {
        if let Some(a) = rsp.adjust.as_ref() {
            self.check_adjustment(plugin, a)?;
        }
        self.check_updates(plugin, &rsp.update)?;
        self.check_evictions(plugin, &rsp.evict)
    }

    /// Checks the adjustment of a CreateContainer answer, field by field
    /// in the merge's order.
    ///
    /// # Errors
    /// [`PermissionError::Adjust`].
    pub fn check_adjustment(&self, plugin: &str, a: &api::ContainerAdjustment) -> Result<(), PermissionError> {
        let need = |group: FieldGroup, field: &dyn Fn() -> String| {
            if self.allows(group) {
                return Ok(());
            }
            Err(PermissionError::Adjust {
                plugin: plugin.to_string(),
                field: field(),
                group,
                allowed: self.clone(),
            })
        };
        let keyed = |field: &'static str, key: &str| format!("{field} {key}");
        if let Some(k) = first_key(a.annotations.keys()) {
            need(FieldGroup::Annotations, &|| keyed("annotations", k))?;
        }
        if let Some(m) = a.mounts.first() {
            need(FieldGroup::Mounts, &|| keyed("mounts", &m.destination))?;
        }
        if let Some(e) = a.env.first() {
            need(FieldGroup::Env, &|| keyed("env", &e.key))?;
        }
        if !a.args.is_empty() {
            need(FieldGroup::Args, &|| "args".into())?;
        }
        if let Some(h) = a.hooks.as_ref() {
            let lists = [
                ("prestart", &h.prestart),
                ("create_runtime", &h.create_runtime),
                ("create_container", &h.create_container),
                ("start_container", &h.start_container),
                ("poststart", &h.poststart),
                ("poststop", &h.poststop),
            ];
            if let Some((kind, _)) = lists.iter().find(|(_, l)| !l.is_empty()) {
                need(FieldGroup::Hooks, &|| format!("hooks.{kind}"))?;
            }
        }
        if let Some(l) = a.linux.as_ref() {
            if let Some(d) = l.devices.first() {
                need(FieldGroup::Devices, &|| keyed("linux.devices", &d.path))?;
            }
            if let Some(r) = l.resources.as_ref() {
                check_resources(r, &need)?;
            }
            if !l.cgroups_path.is_empty() {
                need(FieldGroup::CgroupsPath, &|| "linux.cgroups_path".into())?;
            }
            for (present, group, field) in [
                (
                    l.oom_score_adj.is_some(),
                    FieldGroup::OomScoreAdj,
                    "linux.oom_score_adj",
                ),
                (l.io_priority.is_some(), FieldGroup::IoPriority, "linux.io_priority"),
                (l.seccomp_policy.is_some(), FieldGroup::Seccomp, "linux.seccomp_policy"),
            ] {
                if present {
                    need(group, &|| field.into())?;
                }
            }
            if let Some(n) = l.namespaces.first() {
                need(FieldGroup::Namespaces, &|| keyed("linux.namespaces", &n.type_))?;
            }
            if let Some(k) = first_key(l.sysctl.keys()) {
                need(FieldGroup::Sysctl, &|| keyed("linux.sysctl", k))?;
            }
            if let Some(k) = first_key(l.net_devices.keys()) {
                need(FieldGroup::NetDevices, &|| keyed("linux.net_devices", k))?;
            }
            if l.scheduler.is_some() {
                need(FieldGroup::Scheduler, &|| "linux.scheduler".into())?;
            }
            if let Some(rdt) = l.rdt.as_ref() {
                // As the merge reads it: an rdt without any part changes nothing.
                if rdt.remove || rdt.clos_id.is_some() || rdt.schemata.is_some() || rdt.enable_monitoring.is_some() {
                    need(FieldGroup::Rdt, &|| "linux.rdt".into())?;
                }
            }
            if l.memory_policy.is_some() {
                need(FieldGroup::MemoryPolicy, &|| "linux.memory_policy".into())?;
            }
        }
        if let Some(rl) = a.rlimits.first() {
            need(FieldGroup::Rlimits, &|| keyed("rlimits", &rl.type_))?;
        }
        if let Some(d) = a.CDI_devices.first() {
            need(FieldGroup::CdiDevices, &|| keyed("CDI_devices", &d.name))?;
        }
        Ok(())
    }

    /// Checks container updates (of a CreateContainer, UpdateContainer,
    /// StopContainer or Synchronize answer, or an unsolicited
    /// UpdateContainers): the resources each one sets.
    ///
    /// # Errors
    /// [`PermissionError::Update`] naming the container too.
    pub fn check_updates(&self, plugin: &str, updates: &[api::ContainerUpdate]) -> Result<(), PermissionError> {
        for u in updates {
            let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
                continue;
            };
            check_resources(r, &|group, field: &dyn Fn() -> String| {
                if self.allows(group) {
                    return Ok(());
                }
                Err(PermissionError::Update {
                    plugin: plugin.to_string(),
                    container: u.container_id.clone(),
                    field: field(),
                    group,
                    allowed: self.clone(),
                })
            })?;
        }
        Ok(())
    }

    /// Checks evictions: allowed with [`FieldGroup::Evict`].
    ///
    /// # Errors
    /// [`PermissionError::Evict`] naming the first container.
    pub fn check_evictions(&self, plugin: &str, evict: &[api::ContainerEviction]) -> Result<(), PermissionError> {
        match evict.first() {
            Some(e) if !self.allows(FieldGroup::Evict) => Err(PermissionError::Evict {
                plugin: plugin.to_string(),
                container: e.container_id.clone(),
                allowed: self.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// The smallest key of a map: which key an error names does not depend on
/// hash order.
fn first_key<'a>(keys: impl Iterator<Item = &'a String>) -> Option<&'a str> {
    keys.min().map(String::as_str)
}

type Need<'a> = dyn Fn(FieldGroup, &dyn Fn() -> String) -> Result<(), PermissionError> + 'a;

/// Checks every resource field `r` sets, in the table's order.
fn check_resources(r: &api::LinuxResources, need: &Need<'_>) -> Result<(), PermissionError> {
    for f in FIELDS.iter().filter(|f| f.is_set(r)) {
        need(resource_group(f), &|| format!("linux.resources.{}", f.proto))?;
    }
    Ok(())
}

/// The group of a resource field, by the ownership record it claims.
pub(crate) fn resource_group(f: &ResourceField) -> FieldGroup {
    // The one unclaimed resource field is the device cgroup rules (a test
    // pins that every other field has an owner with a group).
    f.owner.and_then(field_group).unwrap_or(FieldGroup::CgroupDevices)
}

/// The group of an ownership record (exhaustive: a field the protocol adds
/// does not compile until it has a group); `None` for `Field::None`.
fn field_group(f: Field) -> Option<FieldGroup> {
    use FieldGroup as G;
    Some(match f {
        Field::Annotations => G::Annotations,
        Field::Mounts => G::Mounts,
        Field::OciHooks => G::Hooks,
        Field::Devices => G::Devices,
        Field::CdiDevices => G::CdiDevices,
        Field::Env => G::Env,
        Field::Args => G::Args,
        Field::MemLimit
        | Field::MemReservation
        | Field::MemSwapLimit
        | Field::MemKernelLimit
        | Field::MemTCPLimit
        | Field::MemSwappiness
        | Field::MemDisableOomKiller
        | Field::MemUseHierarchy => G::Memory,
        Field::CPUShares
        | Field::CPUQuota
        | Field::CPUPeriod
        | Field::CPURealtimeRuntime
        | Field::CPURealtimePeriod
        | Field::CPUSetCPUs
        | Field::CPUSetMems => G::Cpu,
        Field::PidsLimit => G::Pids,
        Field::HugepageLimits => G::HugepageLimits,
        Field::BlockioClass => G::BlockioClass,
        Field::RdtClass => G::RdtClass,
        Field::CgroupsUnified => G::Unified,
        Field::CgroupsPath => G::CgroupsPath,
        Field::OomScoreAdj => G::OomScoreAdj,
        Field::Rlimits => G::Rlimits,
        Field::IoPriority => G::IoPriority,
        Field::SeccompPolicy => G::Seccomp,
        Field::Namespace => G::Namespaces,
        Field::Sysctl => G::Sysctl,
        Field::LinuxNetDevices => G::NetDevices,
        Field::LinuxSched => G::Scheduler,
        Field::RdtClosID | Field::RdtSchemata | Field::RdtEnableMonitoring => G::Rdt,
        Field::MemoryPolicy => G::MemoryPolicy,
        Field::None => return None,
    })
}

impl fmt::Display for Permissions {
    /// `cpu, memory`, or `nothing`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed.is_empty() {
            return f.write_str("nothing");
        }
        for (i, g) in self.allowed.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(g.as_str())?;
        }
        Ok(())
    }
}

/// A plugin's answer touched a field outside its permissions; the whole
/// answer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermissionError {
    /// A field of the CreateContainer adjustment.
    #[error("plugin {plugin} may not adjust {field} (field group {group}, allowed: {allowed})")]
    Adjust {
        /// `IDX-NAME` of the plugin.
        plugin: String,
        /// The field, as NRI names it, with the key of a keyed field
        /// (`env FOO`, `mounts /data`, `linux.resources.memory.limit`).
        field: String,
        /// Its group.
        group: FieldGroup,
        /// What the plugin may touch.
        allowed: Permissions,
    },
    /// A resource field of a container update.
    #[error(
        "plugin {plugin} may not update {field} of container {container} (field group {group}, allowed: {allowed})"
    )]
    Update {
        /// `IDX-NAME` of the plugin.
        plugin: String,
        /// The updated container.
        container: String,
        /// The field (`linux.resources.cpu.cpus`).
        field: String,
        /// Its group.
        group: FieldGroup,
        /// What the plugin may touch.
        allowed: Permissions,
    },
    /// An eviction.
    #[error("plugin {plugin} may not evict container {container} (field group evict, allowed: {allowed})")]
    Evict {
        /// `IDX-NAME` of the plugin.
        plugin: String,
        /// The container it asked to evict.
        container: String,
        /// What the plugin may touch.
        allowed: Permissions,
    },
}

impl PermissionError {
    /// `IDX-NAME` of the plugin.
    pub fn plugin(&self) -> &str {
        match self {
            PermissionError::Adjust { plugin, .. }
            | PermissionError::Update { plugin, .. }
            | PermissionError::Evict { plugin, .. } => plugin,
        }
    }

    /// The group the plugin lacks.
    pub fn group(&self) -> FieldGroup {
        match self {
            PermissionError::Adjust { group, .. } | PermissionError::Update { group, .. } => *group,
            PermissionError::Evict { .. } => FieldGroup::Evict,
        }
    }
}

/// What a refused answer means for the request it answered: the observer
/// counts it, then under `fail` the error is returned (the request fails),
/// under `ignore` it is logged and the request goes on without the answer.
pub(crate) fn refuse(
    callbacks: &Callbacks,
    policy: FailurePolicy,
    request: &'static str,
    e: PermissionError,
) -> Result<(), PermissionError> {
    callbacks.rejected(e.plugin(), Rejection::Permission);
    match policy {
        FailurePolicy::Fail => {
            tracing::error!(plugin = %e.plugin(), request, error = %e, "NRI plugin's answer refused: outside its permissions (failure policy: fail)");
            Err(e)
        }
        FailurePolicy::Ignore => {
            tracing::warn!(plugin = %e.plugin(), request, error = %e, "NRI plugin's answer dropped: outside its permissions (failure policy: ignore)");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
