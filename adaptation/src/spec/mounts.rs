//! Mounts: removals, additions and the re-sort by depth.

use std::path::PathBuf;

use nri_proto::api;
use oci_spec::runtime::{Mount, Spec};

use super::{AdjustError, invalid, linux};
use crate::resources::{self, removal_key};

pub(super) fn depth(p: &std::path::Path) -> usize {
    p.components().count()
}

pub(super) fn apply_mounts(s: &mut Spec, mounts: &[api::Mount]) -> Result<(), AdjustError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let mut list = s.mounts().clone().unwrap_or_default();
    let mut propagation: Option<&str> = None;
    for m in mounts {
        if let Some(dest) = removal_key(&m.destination) {
            list.retain(|x| x.destination() != &PathBuf::from(dest));
            continue;
        }
        if !m.destination.starts_with('/') {
            return Err(invalid(
                "mounts.destination",
                &m.destination,
                "must be an absolute path",
            ));
        }
        let mut out = Mount::default();
        out.set_destination(PathBuf::from(&m.destination));
        out.set_typ((!m.type_.is_empty()).then(|| m.type_.clone()));
        out.set_source((!m.source.is_empty()).then(|| PathBuf::from(&m.source)));
        out.set_options((!m.options.is_empty()).then(|| m.options.clone()));
        for o in &m.options {
            match o.as_str() {
                "rshared" => propagation = Some("rshared"),
                "rslave" if propagation != Some("rshared") => propagation = Some("rslave"),
                _ => {}
            }
        }
        resources::upsert(&mut list, out, |a, b| a.destination() == b.destination());
    }
    if let Some(p) = propagation {
        // The rootfs must propagate for shared/slave bind mounts to work.
        let lin = linux(s);
        let cur = lin.rootfs_propagation().clone();
        let keep =
            matches!(cur.as_deref(), Some("rshared")) || (p == "rslave" && matches!(cur.as_deref(), Some("rslave")));
        if !keep {
            lin.set_rootfs_propagation(Some(p.to_string()));
        }
    }
    // Parents before children: by depth, then destination (stable).
    list.sort_by(|a, b| (depth(a.destination()), a.destination()).cmp(&(depth(b.destination()), b.destination())));
    s.set_mounts(Some(list));
    Ok(())
}
