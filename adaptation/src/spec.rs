//! Applying a merged NRI adjustment to an OCI runtime spec (NRI
//! `pkg/runtime-tools/generate`). Pure functions: no I/O.
//!
//! [`adjust`] applies a [`api::ContainerAdjustment`] in upstream's order
//! (annotations, env, args, hooks, CDI devices, devices, cgroups path, OOM
//! score, I/O priority, scheduler, seccomp, namespaces, sysctl, net devices,
//! memory policy, resources, block I/O class, RDT class, RDT, mounts,
//! rlimits). It is transactional: on error the spec is unchanged. An empty
//! adjustment (what zero plugins produce) leaves the spec identical.
//!
//! Deviations from upstream, all fixes:
//! * map removals (`-key`) are applied before sets (upstream walks a Go map
//!   in random order);
//! * every memory field is applied, not only a non-zero limit; when only
//!   the limit changes, swap follows it (upstream always sets swap to the
//!   limit) when the spec has no swap, or its swap was the old limit (no
//!   swap), or is now below the new limit (runc's `swap >= limit` rule); an
//!   unlimited swap (`-1`) or one above the new limit is kept;
//! * seccomp keeps `default_errno`;
//! * rlimits replace an existing limit of the same type instead of
//!   appending a duplicate; hugepage limits likewise per page size;
//! * rlimit types are accepted as upstream's generator passes them on,
//!   any case, with or without the `RLIMIT_` prefix (`nofile`), and
//!   written in the OCI form (`RLIMIT_NOFILE`) that runtimes accept
//!   (upstream copies `nofile` into the spec, which runc then refuses);
//! * environment entries without `=` are kept (upstream drops them), and
//!   removing a variable (`-NAME`) works for variables of the original spec;
//! * CDI devices, block I/O and RDT classes without a runtime-supplied
//!   injector or resolver are errors, not silently ignored;
//! * values the kernel would reject (see [`AdjustError`]) are errors naming
//!   the field and the value;
//! * mounts are re-sorted (depth, then destination) only when a plugin
//!   changed mounts.

use std::path::PathBuf;

use nri_proto::api;
use oci_spec::runtime::{LinuxBlockIo, LinuxIntelRdt, LinuxNetDevice, Spec};

pub(crate) use self::linux::device_type;
pub(crate) use self::oci_resources::apply_resources;
pub use self::oci_resources::{to_oci_resources, update};
pub(crate) use self::process::canonical_rlimit_type;
use self::{
    linux::{apply_devices, apply_namespaces, apply_rdt, memory_policy, seccomp},
    mounts::apply_mounts,
    oci_resources::resources_touch,
    process::{apply_env, apply_hooks, apply_io_priority, apply_rlimits, apply_scheduler},
};
use crate::resources::apply_map;

mod linux;
mod mounts;
mod oci_resources;
mod process;

/// Why an adjustment could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdjustError {
    /// A value the runtime or kernel would reject.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// Field, e.g. `linux.resources.cpu.shares`.
        field: String,
        /// The offending value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The adjustment needs something the runtime did not provide.
    #[error("cannot apply {field}: {reason}")]
    Unsupported {
        /// Field, e.g. `CDI_devices`.
        field: String,
        /// What is missing.
        reason: String,
    },
}

pub(crate) fn invalid(
    field: impl Into<String>,
    value: impl std::fmt::Display,
    reason: impl Into<String>,
) -> AdjustError {
    AdjustError::Invalid {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

type CdiInjector<'a> = Box<dyn Fn(&mut Spec, &[String]) -> Result<(), String> + 'a>;
type BlockIoResolver<'a> = Box<dyn Fn(&str) -> Result<LinuxBlockIo, String> + 'a>;
type RdtResolver<'a> = Box<dyn Fn(&str) -> Result<LinuxIntelRdt, String> + 'a>;

/// [`adjust`] with runtime-supplied helpers for CDI devices and block I/O
/// and RDT classes.
#[derive(Default)]
pub struct Adjuster<'a> {
    cdi: Option<CdiInjector<'a>>,
    blockio: Option<BlockIoResolver<'a>>,
    rdt: Option<RdtResolver<'a>>,
}

impl<'a> Adjuster<'a> {
    /// An adjuster without helpers.
    pub fn new() -> Self {
        Adjuster::default()
    }

    /// Injects CDI devices (by fully qualified name) into the spec.
    pub fn with_cdi_injector(mut self, f: impl Fn(&mut Spec, &[String]) -> Result<(), String> + 'a) -> Self {
        self.cdi = Some(Box::new(f));
        self
    }

    /// Resolves a block I/O class name to OCI block I/O settings.
    pub fn with_blockio_resolver(mut self, f: impl Fn(&str) -> Result<LinuxBlockIo, String> + 'a) -> Self {
        self.blockio = Some(Box::new(f));
        self
    }

    /// Resolves an RDT class name to OCI Intel RDT settings.
    pub fn with_rdt_resolver(mut self, f: impl Fn(&str) -> Result<LinuxIntelRdt, String> + 'a) -> Self {
        self.rdt = Some(Box::new(f));
        self
    }

    /// Applies `adj` to `spec`; see the module docs.
    ///
    /// # Errors
    /// [`AdjustError`]; the spec is then unchanged.
    pub fn adjust(&self, spec: &mut Spec, adj: &api::ContainerAdjustment) -> Result<(), AdjustError> {
        let mut s = spec.clone();
        self.apply(&mut s, adj)?;
        *spec = s;
        Ok(())
    }

    fn apply(&self, s: &mut Spec, a: &api::ContainerAdjustment) -> Result<(), AdjustError> {
        apply_map(s.annotations_mut(), &a.annotations, |v| Some(v.clone()));
        apply_env(s, &a.env)?;
        if !a.args.is_empty() {
            process(s, "args")?.set_args(Some(a.args.clone()));
        }
        if let Some(h) = a.hooks.as_ref() {
            apply_hooks(s, h)?;
        }
        if !a.CDI_devices.is_empty() {
            let names: Vec<String> = a.CDI_devices.iter().map(|d| d.name.clone()).collect();
            let inject = self.cdi.as_ref().ok_or_else(|| AdjustError::Unsupported {
                field: "CDI_devices".into(),
                reason: format!("no CDI injector configured for {names:?}"),
            })?;
            inject(s, &names).map_err(|e| invalid("CDI_devices", names.join(","), e))?;
        }
        let empty = api::LinuxContainerAdjustment::new();
        let l = a.linux.as_ref().unwrap_or(&empty);
        apply_devices(s, &l.devices)?;
        if !l.cgroups_path.is_empty() {
            linux(s).set_cgroups_path(Some(PathBuf::from(&l.cgroups_path)));
        }
        if let Some(o) = l.oom_score_adj.as_ref() {
            if !(-1000..=1000).contains(&o.value) {
                return Err(invalid("linux.oom_score_adj", o.value, "must be within -1000..1000"));
            }
            process(s, "oom_score_adj")?.set_oom_score_adj(Some(o.value as i32));
        }
        if let Some(p) = l.io_priority.as_ref() {
            apply_io_priority(s, p)?;
        }
        if let Some(sch) = l.scheduler.as_ref() {
            apply_scheduler(s, sch)?;
        }
        if let Some(sc) = l.seccomp_policy.as_ref() {
            linux(s).set_seccomp(Some(seccomp(sc)?));
        }
        apply_namespaces(s, &l.namespaces)?;
        if !l.sysctl.is_empty() {
            apply_map(linux(s).sysctl_mut(), &l.sysctl, |v| Some(v.clone()));
        }
        if !l.net_devices.is_empty() {
            apply_map(linux(s).net_devices_mut(), &l.net_devices, |d| {
                let mut n = LinuxNetDevice::default();
                if !d.name.is_empty() {
                    n.set_name(Some(d.name.clone()));
                }
                Some(n)
            });
        }
        if let Some(mp) = l.memory_policy.as_ref() {
            linux(s).set_memory_policy(Some(memory_policy(mp)?));
        }
        if let Some(r) = l.resources.as_ref() {
            if resources_touch(r) {
                let lin = linux(s);
                let mut res = lin.resources().clone().unwrap_or_default();
                let had_swap = res.memory().as_ref().is_some_and(|m| m.swap().is_some());
                apply_resources(&mut res, r, true)?;
                swap_follows_new_limit(&mut res, r, had_swap);
                lin.set_resources(Some(res));
            }
            if let Some(class) = r.blockio_class.as_ref() {
                let value = if class.value.is_empty() {
                    None
                } else {
                    let resolve = self.blockio.as_ref().ok_or_else(|| AdjustError::Unsupported {
                        field: "linux.resources.blockio_class".into(),
                        reason: format!("no block I/O class resolver configured for class {:?}", class.value),
                    })?;
                    Some(resolve(&class.value).map_err(|e| invalid("linux.resources.blockio_class", &class.value, e))?)
                };
                let lin = linux(s);
                let mut res = lin.resources().clone().unwrap_or_default();
                res.set_block_io(value);
                lin.set_resources(Some(res));
            }
            if let Some(class) = r.rdt_class.as_ref() {
                let value = if class.value.is_empty() {
                    None
                } else {
                    let resolve = self.rdt.as_ref().ok_or_else(|| AdjustError::Unsupported {
                        field: "linux.resources.rdt_class".into(),
                        reason: format!("no RDT class resolver configured for class {:?}", class.value),
                    })?;
                    Some(resolve(&class.value).map_err(|e| invalid("linux.resources.rdt_class", &class.value, e))?)
                };
                linux(s).set_intel_rdt(value);
            }
        }
        if let Some(rdt) = l.rdt.as_ref() {
            apply_rdt(s, rdt);
        }
        apply_mounts(s, &a.mounts)?;
        apply_rlimits(s, &a.rlimits)?;
        Ok(())
    }
}

/// Applies `adj` to `spec` without CDI injector or class resolvers; see
/// the module docs and [`Adjuster`].
///
/// # Errors
/// [`AdjustError`]; the spec is then unchanged.
///
/// ```
/// use nri_adaptation::{api, spec::adjust};
/// let mut spec = oci_spec::runtime::Spec::default();
/// let before = spec.clone();
/// adjust(&mut spec, &api::ContainerAdjustment::new()).unwrap();
/// assert_eq!(spec, before);
/// ```
pub fn adjust(spec: &mut Spec, adj: &api::ContainerAdjustment) -> Result<(), AdjustError> {
    Adjuster::new().adjust(spec, adj)
}

fn process<'s>(s: &'s mut Spec, what: &str) -> Result<&'s mut oci_spec::runtime::Process, AdjustError> {
    s.process_mut().as_mut().ok_or_else(|| AdjustError::Unsupported {
        field: format!("process.{what}"),
        reason: "the spec has no process".into(),
    })
}

fn linux(s: &mut Spec) -> &mut oci_spec::runtime::Linux {
    s.linux_mut().get_or_insert_with(Default::default)
}

/// A memory limit set at creation on a spec without swap also sets swap to
/// the limit, as upstream's generator does (it always does; containerd's
/// CRI spec has swap = limit for the same reason: no swap unless asked).
/// Updates leave a missing swap missing.
fn swap_follows_new_limit(res: &mut oci_spec::runtime::LinuxResources, r: &api::LinuxResources, had_swap: bool) {
    let Some(limit) = r
        .memory
        .as_ref()
        .filter(|m| m.swap.is_none())
        .and_then(|m| m.limit.as_ref())
    else {
        return;
    };
    if !had_swap
        && limit.value != 0
        && let Some(mem) = res.memory_mut()
    {
        mem.set_swap(Some(limit.value));
    }
}

#[cfg(test)]
mod tests;
