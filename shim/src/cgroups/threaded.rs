//! A container's cgroupfs directory on a pure cgroup v2 host, made as
//! runc's cgroupfs driver makes it, before libcontainer moves the
//! container's first process in.
//!
//! Why: a relative `linux.cgroupsPath` (see
//! [`super::path::cgroupfs_relative`]) puts the container under the
//! runtime's own cgroup, which holds processes (containerd, the shim).
//! Enabling controllers in a populated cgroup's `cgroup.subtree_control`
//! succeeds for the threaded ones (cpu, cpuset, pids) and makes that
//! cgroup a thread root; a plain child of a thread root is then of type
//! `domain invalid`, and moving a process into it fails with EOPNOTSUPP.
//! runc, level by level from the root: creates the directory, and when it
//! is `domain invalid` makes it `threaded` if the container asks no domain
//! controller (memory, block I/O, hugetlb limits), else refuses naming the
//! directory; `threaded` and `domain threaded` directories are refused
//! likewise with domain controllers; then enables every available
//! controller in each directory above the container's. libcontainer (its
//! libcgroups) enables controllers too but never looks at `cgroup.type`,
//! so the container failed where runc's runs.

use std::{
    io,
    path::{Path, PathBuf},
};

use oci_spec::runtime::LinuxResources;

use crate::error::{Result, ShimError};

/// Makes the cgroup v2 directory `path` (absolute in the hierarchy, e.g.
/// `/system.slice/containerd.service/pod.slice:cri-containerd:c1`) under
/// `root` (`/sys/fs/cgroup`) as runc does (see the module docs), for a
/// container with `resources`.
///
/// The directories made here stay for libcontainer, which moves the
/// process in; a create that fails after this removes the container's
/// with the container. On an error the directories this call made are
/// removed.
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the directory and its type when
/// the container asks for domain controllers in a threaded part of the
/// hierarchy (runc's refusal); [`ShimError::Runtime`] naming the directory
/// and errno when a directory cannot be made or typed.
pub fn prepare(root: &Path, path: &Path, resources: Option<&LinuxResources>) -> Result<()> {
    let names: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let controllers: Vec<String> = std::fs::read_to_string(root.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|c| format!("+{c}"))
        .collect();
    let domain = wants_domain_controllers(resources);
    let mut created = Vec::new();
    let mut current = root.to_path_buf();
    enable(&current, &controllers);
    for (i, name) in names.iter().enumerate() {
        current.push(name);
        match std::fs::create_dir(&current) {
            Ok(()) => created.push(current.clone()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(undo(created, failed("create", &current, &e))),
        }
        if let Err(e) = settle_type(&current, domain) {
            return Err(undo(created, e));
        }
        if i + 1 < names.len() {
            enable(&current, &controllers);
        }
    }
    Ok(())
}

/// Whether the cgroup v2 directory of `path` (absolute in the hierarchy
/// under `root`) is of type `threaded`: one [`prepare`] made so.
pub fn is_threaded(root: &Path, path: &Path) -> bool {
    let dir = root.join(path.strip_prefix("/").unwrap_or(path));
    std::fs::read_to_string(dir.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded")
}

/// Removes the threaded cgroup v2 directory `dir`: its processes are
/// SIGKILLed and it is removed once they are gone, retried until
/// `deadline`. libcgroups removes a cgroup by writing `cgroup.kill`, which
/// a threaded cgroup refuses (EOPNOTSUPP); runc signals the processes of
/// `cgroup.procs` instead, as here.
///
/// # Errors
/// [`ShimError::Runtime`] naming the directory and errno when it is still
/// there at `deadline`.
pub fn remove(dir: &Path, deadline: std::time::Instant) -> Result<()> {
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(failed("remove", dir, &e)),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Whether `resources` ask for a controller that cannot work inside a
/// threaded subtree (runc's list: memory, block I/O, hugetlb limits).
pub fn wants_domain_controllers(resources: Option<&LinuxResources>) -> bool {
    let Some(r) = resources else {
        return false;
    };
    let memory = r.memory().as_ref().is_some_and(|m| {
        [m.limit(), m.reservation(), m.swap(), m.kernel(), m.kernel_tcp()]
            .iter()
            .any(|v| v.is_some_and(|v| v != 0))
    });
    let block_io = r.block_io().as_ref().is_some_and(|b| {
        b.weight().is_some_and(|w| w != 0)
            || b.leaf_weight().is_some_and(|w| w != 0)
            || b.weight_device().as_ref().is_some_and(|d| !d.is_empty())
            || b.throttle_read_bps_device().as_ref().is_some_and(|d| !d.is_empty())
            || b.throttle_write_bps_device().as_ref().is_some_and(|d| !d.is_empty())
            || b.throttle_read_iops_device().as_ref().is_some_and(|d| !d.is_empty())
            || b.throttle_write_iops_device().as_ref().is_some_and(|d| !d.is_empty())
    });
    let hugetlb = r.hugepage_limits().as_ref().is_some_and(|h| !h.is_empty());
    memory || block_io || hugetlb
}

/// runc's rule for one level: `domain invalid` becomes `threaded` unless
/// `domain` controllers are wanted; a threaded level refuses them.
fn settle_type(dir: &Path, domain: bool) -> Result<()> {
    let file = dir.join("cgroup.type");
    // A directory without the file (the root) is a domain.
    let Ok(kind) = std::fs::read_to_string(&file) else {
        return Ok(());
    };
    let kind = kind.trim();
    let refuse = |state: &str| {
        ShimError::InvalidArgument(format!(
            "linux.cgroupsPath: the cgroup {} is {state} (its parent holds processes and has threaded \
             controllers enabled), so memory, block I/O and hugetlb limits cannot apply there; runc refuses \
             the same",
            dir.display()
        ))
    };
    match kind {
        "domain invalid" if domain => Err(refuse("in an invalid state")),
        "domain invalid" => std::fs::write(&file, "threaded").map_err(|e| failed("make threaded", dir, &e)),
        "threaded" | "domain threaded" if domain => Err(refuse(&format!("of type {kind}"))),
        _ => Ok(()),
    }
}

/// Enables `controllers` in `dir`'s `cgroup.subtree_control`: all in one
/// write, else one by one (a controller the parent lacks, or a domain one
/// in a populated cgroup, fails alone), as runc does; failures are left to
/// the limits that need the controller.
fn enable(dir: &Path, controllers: &[String]) {
    let file = dir.join("cgroup.subtree_control");
    if controllers.is_empty() || std::fs::write(&file, controllers.join(" ")).is_ok() {
        return;
    }
    for c in controllers {
        let _ = std::fs::write(&file, c);
    }
}

fn failed(what: &str, dir: &Path, e: &io::Error) -> ShimError {
    ShimError::Runtime(format!("cgroup {}: {what}: {e}", dir.display()))
}

/// Removes the directories this call created, deepest first, and passes
/// `e` on.
fn undo(created: Vec<PathBuf>, e: ShimError) -> ShimError {
    for dir in created.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    e
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxMemoryBuilder, LinuxResourcesBuilder};

    use super::*;

    fn memory_limit() -> LinuxResources {
        LinuxResourcesBuilder::default()
            .memory(LinuxMemoryBuilder::default().limit(64 << 20).build().unwrap())
            .build()
            .unwrap()
    }

    /// The kernel's files stood in by a temp dir: an invalid level
    /// becomes threaded without domain limits, is refused (and the
    /// directory this call made removed) with them.
    #[test]
    fn an_invalid_level_becomes_threaded_unless_domain_limits_are_asked() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let parent = root.path().join("svc");
        std::fs::create_dir(&parent).unwrap();
        std::fs::write(parent.join("cgroup.type"), "domain\n").unwrap();
        // A leaf made earlier, invalid now (its parent became a thread root).
        let leaf = parent.join("pod.slice:cri:c1");
        std::fs::create_dir(&leaf).unwrap();
        std::fs::write(leaf.join("cgroup.type"), "domain invalid\n").unwrap();
        let e = prepare(root.path(), Path::new("/svc/pod.slice:cri:c1"), Some(&memory_limit()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pod.slice:cri:c1") && e.contains("invalid state"), "{e}");
        assert!(leaf.is_dir(), "not ours to remove");
        prepare(root.path(), Path::new("/svc/pod.slice:cri:c1"), None).unwrap();
        assert_eq!(std::fs::read_to_string(leaf.join("cgroup.type")).unwrap(), "threaded");
        // Controllers were enabled above the leaf, not in it.
        assert_eq!(
            std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(),
            "+cpu +memory +pids"
        );
        assert!(!leaf.join("cgroup.subtree_control").exists());
        // A threaded level refuses domain limits too.
        let e = prepare(root.path(), Path::new("/svc/pod.slice:cri:c1"), Some(&memory_limit()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("of type threaded"), "{e}");
    }

    /// New levels are made; one that was there before stays when refused.
    #[test]
    fn new_levels_are_made_and_one_there_before_stays() {
        let root = tempfile::tempdir().unwrap();
        prepare(root.path(), Path::new("/a/b"), None).unwrap();
        assert!(root.path().join("a/b").is_dir());
        std::fs::create_dir(root.path().join("t")).unwrap();
        std::fs::write(root.path().join("t/cgroup.type"), "threaded\n").unwrap();
        prepare(root.path(), Path::new("/t"), Some(&memory_limit())).unwrap_err();
        assert!(root.path().join("t").is_dir(), "there before");
    }

    /// A threaded directory is told apart; removing it (here an empty
    /// temp dir, no processes) succeeds, and again once it is gone.
    #[test]
    fn a_threaded_directory_is_found_and_removed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("svc/c1");
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!is_threaded(root.path(), Path::new("/svc/c1")));
        std::fs::write(dir.join("cgroup.type"), "threaded\n").unwrap();
        assert!(is_threaded(root.path(), Path::new("/svc/c1")));
        std::fs::remove_file(dir.join("cgroup.type")).unwrap();
        remove(&dir, std::time::Instant::now()).unwrap();
        assert!(!dir.exists());
        remove(&dir, std::time::Instant::now()).unwrap();
    }

    #[test]
    fn domain_controllers_are_memory_block_io_and_hugetlb_limits() {
        assert!(!wants_domain_controllers(None));
        assert!(wants_domain_controllers(Some(&memory_limit())));
        let cpu = LinuxResourcesBuilder::default()
            .cpu(
                oci_spec::runtime::LinuxCpuBuilder::default()
                    .shares(512u64)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        assert!(!wants_domain_controllers(Some(&cpu)));
    }
}
