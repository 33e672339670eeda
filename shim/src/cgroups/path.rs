//! The forms of `linux.cgroupsPath` and runc's rules for the cgroup
//! driver: systemd's `slice:prefix:name`, the default a container without
//! a path gets, and what each driver accepts.

use std::path::{Path, PathBuf};

use oci_spec::runtime::LinuxResources;

use crate::error::{Result, ShimError};

/// A `linux.cgroupsPath` of the systemd driver, `slice:prefix:name`
/// (runc's form; CRI sends e.g.
/// `kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`): the
/// container is the transient unit `<prefix>-<name>.scope` (or `name`
/// itself when it is a `.slice`) in `slice` (`system.slice` when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemdPath {
    /// The parent slice, e.g. `kubepods-besteffort.slice`.
    pub slice: String,
    /// The unit's prefix, e.g. `cri-containerd`.
    pub prefix: String,
    /// The unit's name, e.g. the container id.
    pub name: String,
}

impl SystemdPath {
    /// `path` when it has the systemd form: relative, three `:`-separated
    /// parts, the first empty or a `.slice`. Any other path is a cgroupfs
    /// path (`None`).
    pub fn parse(path: &Path) -> Option<SystemdPath> {
        let text = path.to_str()?;
        if path.is_absolute() {
            return None;
        }
        let mut parts = text.split(':');
        let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !(slice.is_empty() || slice.ends_with(".slice")) || name.is_empty() {
            return None;
        }
        Some(SystemdPath {
            slice: slice.to_string(),
            prefix: prefix.to_string(),
            name: name.to_string(),
        })
    }

    /// The unit systemd runs the container in.
    pub fn unit(&self) -> String {
        if self.name.ends_with(".slice") {
            self.name.clone()
        } else {
            format!("{}-{}.scope", self.prefix, self.name)
        }
    }

    /// The unit's cgroup (under systemd's root, `/` for the system
    /// instance): the slice expanded by systemd's rule, each `-` a level
    /// (`a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`), then the unit.
    ///
    /// # Errors
    /// [`ShimError::InvalidArgument`] for a slice name systemd refuses
    /// (an empty component, a `/`).
    pub fn cgroup(&self) -> Result<PathBuf> {
        let slice = if self.slice.is_empty() {
            "system.slice"
        } else {
            &self.slice
        };
        let bad = || {
            ShimError::InvalidArgument(format!(
                "linux.cgroupsPath: {slice:?} is not a valid systemd slice name"
            ))
        };
        let stem = slice
            .strip_suffix(".slice")
            .filter(|s| !s.is_empty() && !s.contains('/'))
            .ok_or_else(bad)?;
        let mut path = PathBuf::from("/");
        if stem != "-" {
            let mut prefix = String::new();
            for part in stem.split('-') {
                if part.is_empty() {
                    return Err(bad());
                }
                prefix.push_str(part);
                path.push(format!("{prefix}.slice"));
                prefix.push('-');
            }
        }
        path.push(self.unit());
        Ok(path)
    }
}

/// Whether systemd runs this host (`/run/systemd/system`, as runc and
/// libcgroups test it).
pub fn systemd_booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The cgroup the container at `cgroups_path` (as in the OCI spec) has in
/// the hierarchy: a systemd path resolved to its unit's cgroup, any other
/// as it is.
///
/// # Errors
/// [`SystemdPath::cgroup`]'s.
pub fn resolve(cgroups_path: &Path) -> Result<PathBuf> {
    match SystemdPath::parse(cgroups_path) {
        Some(s) => s.cgroup(),
        None => Ok(cgroups_path.to_path_buf()),
    }
}

/// The cgroupsPath a container without one gets, written into its
/// `config.json` so that libcontainer creates the cgroup the shim then
/// reads, updates and removes (libcontainer's own default, `:youki:<id>`,
/// is a directory of that literal name for the cgroupfs driver). With the
/// systemd driver it is `system.slice:nri-shim:<id>`, the unit
/// `nri-shim-<id>.scope` in `system.slice`, as runc makes
/// `runc-<id>.scope` there for an empty path; otherwise the cgroupfs
/// path `/nri-shim/<namespace>/<id>`. containerd always sets a path
/// (`/<namespace>/<id>`, or CRI's); a bundle made by hand may not.
pub fn default_path(namespace: &str, id: &str, systemd: bool) -> PathBuf {
    if systemd {
        PathBuf::from(format!("system.slice:nri-shim:{id}"))
    } else {
        PathBuf::from(format!("/nri-shim/{namespace}/{id}"))
    }
}

/// The cgroupfs driver's reading of a relative `linux.cgroupsPath`, as
/// runc's: a directory of that name under the runtime's own cgroup. It
/// matters for systemd's `slice:prefix:name` form without
/// `SystemdCgroup = true`, which reaches a node whose kubelet and
/// containerd disagree on the cgroup driver (or a CRI client of
/// containerd 1.x, which cannot ask containerd for its driver and assumes
/// systemd): runc runs the pod in a cgroup literally named so, and so do
/// we. Returns the absolute path the container gets (the daemon's own
/// cgroup, `own`, joined with `path` as one name), or `None` for an
/// absolute path or when `systemd` is set.
pub fn cgroupfs_relative(path: &Path, systemd: bool, own: &Path) -> Option<PathBuf> {
    if systemd || path.is_absolute() || path.as_os_str().is_empty() {
        return None;
    }
    Some(own.join(path))
}

/// The calling process's own cgroup: its path in the unified hierarchy
/// (`0::`) on a pure cgroup v2 host, else in the memory controller's (v1,
/// where the controllers' paths are the same for a runtime).
pub fn own_cgroup() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let field = |l: &str| l.splitn(3, ':').nth(2).map(PathBuf::from);
    text.lines()
        .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))
        .and_then(field)
        .or_else(|| text.lines().find(|l| l.starts_with("0::")).and_then(field))
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// runc's rules for the cgroup driver of a container, checked before it
/// is created: with `SystemdCgroup = true` (`systemd`) systemd must run
/// the host, the hierarchy must be pure cgroup v2 (libcgroups' systemd
/// driver has no v1 mode; runc's has) and `cgroups_path` must be
/// `slice:prefix:name`. Without it any path is the cgroupfs driver's (a
/// relative one made absolute first, see [`cgroupfs_relative`]).
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the path and the option.
pub fn check_driver(cgroups_path: Option<&Path>, systemd: bool) -> Result<()> {
    let shown = cgroups_path.map(|p| p.display().to_string()).unwrap_or_default();
    let form = cgroups_path.and_then(SystemdPath::parse);
    if !systemd {
        return Ok(());
    }
    if !systemd_booted() {
        return Err(ShimError::InvalidArgument(format!(
            "SystemdCgroup = true in the runtime options, but systemd does not run this host (no /run/systemd/system); \
             cgroupsPath {shown:?}"
        )));
    }
    let setup = libcgroups::common::get_cgroup_setup()
        .map_err(|e| ShimError::Runtime(format!("cannot tell the host's cgroup setup: {e}")))?;
    if !matches!(setup, libcgroups::common::CgroupSetup::Unified) {
        return Err(ShimError::InvalidArgument(format!(
            "SystemdCgroup = true in the runtime options needs a pure cgroup v2 host; this one runs cgroup v1 ({setup})"
        )));
    }
    match form {
        Some(f) => f.cgroup().map(drop),
        None => Err(ShimError::InvalidArgument(format!(
            "SystemdCgroup = true in the runtime options needs linux.cgroupsPath of the form slice:prefix:name, \
             got {shown:?}"
        ))),
    }
}

/// Whether this host runs a pure cgroup v2 hierarchy (`false` when it
/// cannot be told).
pub fn unified_host() -> bool {
    matches!(
        libcgroups::common::get_cgroup_setup(),
        Ok(libcgroups::common::CgroupSetup::Unified)
    )
}

/// runc's rule: `linux.resources.unified` (cgroup v2 files written as they
/// are) needs a pure cgroup v2 host; on v1 or hybrid it is refused instead
/// of being silently ignored.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the keys, on a host that is not
/// pure cgroup v2.
pub fn check_unified(resources: Option<&LinuxResources>) -> Result<()> {
    let Some(unified) = resources.and_then(|r| r.unified().as_ref()).filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    let setup = libcgroups::common::get_cgroup_setup()
        .map_err(|e| ShimError::Runtime(format!("cannot tell the host's cgroup setup: {e}")))?;
    if matches!(setup, libcgroups::common::CgroupSetup::Unified) {
        return Ok(());
    }
    let mut keys: Vec<&str> = unified.keys().map(String::as_str).collect();
    keys.sort_unstable();
    Err(ShimError::InvalidArgument(format!(
        "linux.resources.unified ({}) needs cgroup v2, and this host runs cgroup v1 ({setup})",
        keys.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_paths_expand_as_systemd_does() {
        let cg = |p: &str| SystemdPath::parse(Path::new(p)).map(|s| s.cgroup());
        assert_eq!(
            cg("kubepods-besteffort-pod12.slice:cri-containerd:c1")
                .unwrap()
                .unwrap(),
            Path::new(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/cri-containerd-c1.scope"
            )
        );
        assert_eq!(
            cg("system.slice:nri:x").unwrap().unwrap(),
            Path::new("/system.slice/nri-x.scope")
        );
        // An empty slice is runc's default, system.slice; `-.slice` the root.
        assert_eq!(cg(":nri:x").unwrap().unwrap(), Path::new("/system.slice/nri-x.scope"));
        assert_eq!(cg("-.slice:nri:x").unwrap().unwrap(), Path::new("/nri-x.scope"));
        // A slice as the name is the unit itself.
        assert_eq!(
            cg("a.slice:p:a-b.slice").unwrap().unwrap(),
            Path::new("/a.slice/a-b.slice")
        );
        assert!(cg("a--b.slice:p:x").unwrap().is_err());
        // cgroupfs paths, absolute or relative, are not systemd's form.
        for p in [
            "/default/c1",
            "default/c1",
            "a:b",
            "a.slice:b:c:d",
            "notaslice:p:n",
            "a.slice:p:",
        ] {
            assert_eq!(SystemdPath::parse(Path::new(p)), None, "{p}");
        }
        assert_eq!(resolve(Path::new("/default/c1")).unwrap(), Path::new("/default/c1"));
    }

    #[test]
    fn driver_and_path_form_must_agree() {
        // No systemd option: any path is the cgroupfs driver's.
        check_driver(Some(Path::new("/own/k.slice:cri-containerd:c1")), false).unwrap();
        check_driver(Some(Path::new("/default/c1")), false).unwrap();
        check_driver(None, false).unwrap();
        // With it: refused here unless systemd runs this host with a
        // pure cgroup v2 hierarchy; a cgroupfs path is refused anyway.
        let e = check_driver(Some(Path::new("/default/c1")), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SystemdCgroup"), "{e}");
        let host_ok = systemd_booted()
            && matches!(
                libcgroups::common::get_cgroup_setup(),
                Ok(libcgroups::common::CgroupSetup::Unified)
            );
        let r = check_driver(Some(Path::new("k.slice:cri-containerd:c1")), true);
        assert_eq!(r.is_ok(), host_ok, "{r:?}");
    }

    /// runc's cgroupfs driver: a relative path (systemd's form too) is a
    /// directory of that name under the runtime's own cgroup.
    #[test]
    fn a_relative_path_is_under_the_runtimes_own_cgroup_without_systemd() {
        let own = Path::new("/system.slice/containerd.service");
        assert_eq!(
            cgroupfs_relative(Path::new("test.slice:cri-containerd:c1"), false, own),
            Some(PathBuf::from(
                "/system.slice/containerd.service/test.slice:cri-containerd:c1"
            ))
        );
        assert_eq!(
            cgroupfs_relative(Path::new("pods/c1"), false, own),
            Some(PathBuf::from("/system.slice/containerd.service/pods/c1"))
        );
        assert_eq!(cgroupfs_relative(Path::new("/default/c1"), false, own), None);
        assert_eq!(
            cgroupfs_relative(Path::new("test.slice:cri-containerd:c1"), true, own),
            None
        );
        // The result is no systemd path any more.
        let p = cgroupfs_relative(Path::new("test.slice:cri-containerd:c1"), false, own).unwrap();
        assert_eq!(SystemdPath::parse(&p), None);
        // This process's own cgroup is absolute.
        assert!(own_cgroup().is_absolute());
    }

    #[test]
    fn a_container_without_a_path_gets_runcs_systemd_default_or_ours() {
        // systemd: the unit nri-shim-<id>.scope in system.slice, as runc's
        // runc-<id>.scope for an empty path.
        let p = default_path("k8s.io", "c1", true);
        let s = SystemdPath::parse(&p).expect("systemd form");
        assert_eq!(
            (s.slice.as_str(), s.unit()),
            ("system.slice", "nri-shim-c1.scope".to_string())
        );
        assert_eq!(resolve(&p).unwrap(), Path::new("/system.slice/nri-shim-c1.scope"));
        // cgroupfs: per namespace under /nri-shim, never a systemd form.
        let p = default_path("k8s.io", "c1", false);
        assert_eq!(p, Path::new("/nri-shim/k8s.io/c1"));
        assert!(SystemdPath::parse(&p).is_none());
    }
}
