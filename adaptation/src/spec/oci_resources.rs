//! NRI resources onto OCI resources, at create time and for updates.

use nri_proto::api;
use oci_spec::runtime::{LinuxCpu, LinuxMemory, LinuxResources};

use super::AdjustError;
use crate::resources;

/// Whether `r` changes anything in `linux.resources` itself (classes are
/// handled separately).
pub(super) fn resources_touch(r: &api::LinuxResources) -> bool {
    resources::FIELDS.iter().any(|f| f.in_oci_resources() && f.is_set(r))
}

/// Applies the present fields of NRI resources `r` to OCI resources
/// `target` (used at create time and for container updates), field by
/// field in [`resources::FIELDS`] order; hugepage limits replace the one
/// of their page size. With `devices`, cgroup device rules are appended
/// (create time only).
///
/// # Errors
/// [`AdjustError::Invalid`] for values the kernel would reject; `target`
/// then holds the fields before the offending one.
pub(crate) fn apply_resources(
    target: &mut LinuxResources,
    r: &api::LinuxResources,
    devices: bool,
) -> Result<(), AdjustError> {
    let old_limit = target.memory().as_ref().and_then(|m| m.limit());
    for f in resources::FIELDS {
        if devices || f.shape != resources::Shape::Rules {
            f.write_oci(r, target)?;
        }
    }
    if let Some(m) = r.memory.as_ref()
        && let Some(limit) = m.limit.as_ref()
        && m.swap.is_none()
        && let Some(mem) = target.memory_mut()
    {
        // Keep runc's swap >= limit rule and a "no swap" setting.
        let follow = match (mem.swap(), old_limit) {
            (Some(swap), Some(old)) if swap == old => true,
            (Some(swap), _) => swap != -1 && limit.value != -1 && swap < limit.value,
            _ => false,
        };
        if follow {
            mem.set_swap(Some(limit.value));
        }
    }
    Ok(())
}

/// Applies an NRI resource update to OCI resources (UpdateContainer): only
/// the fields present in `update` change.
///
/// # Errors
/// [`AdjustError::Invalid`] for a value the kernel would reject; `target`
/// is then unchanged.
pub fn update(target: &mut LinuxResources, update: &api::LinuxResources) -> Result<(), AdjustError> {
    let mut out = target.clone();
    apply_resources(&mut out, update, false)?;
    *target = out;
    Ok(())
}

/// The OCI form of NRI resources, as passed to a runtime's update path:
/// `memory` and `cpu` objects are always present (possibly empty), so code
/// that dereferences them unconditionally cannot crash (NRI #37).
///
/// # Errors
/// [`AdjustError::Invalid`] for a value the kernel would reject.
pub fn to_oci_resources(r: &api::LinuxResources) -> Result<LinuxResources, AdjustError> {
    let mut out = LinuxResources::default();
    apply_resources(&mut out, r, true)?;
    out.memory_mut().get_or_insert_with(LinuxMemory::default);
    out.cpu_mut().get_or_insert_with(LinuxCpu::default);
    Ok(out)
}
