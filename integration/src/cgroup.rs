//! The cgroup files the end-to-end tests read, on the hierarchy the host
//! has: cgroup v1 (hybrid) on our machines, a pure cgroup v2 hierarchy in
//! the VM lane (`scripts/vm/lane.sh`).

use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

/// Whether `/sys/fs/cgroup` is a pure cgroup v2 hierarchy.
pub fn v2() -> bool {
    Path::new(ROOT).join("cgroup.controllers").exists()
}

/// File `file` of cgroup `path` (e.g. `/default/ctrd-f1`): under the v1
/// controller `controller`'s hierarchy, or in the one v2 hierarchy
/// (`controller` unused there).
pub fn file(path: &str, controller: &str, file: &str) -> PathBuf {
    let root = Path::new(ROOT);
    let root = if v2() {
        root.to_path_buf()
    } else {
        root.join(controller)
    };
    root.join(path.trim_start_matches('/')).join(file)
}

/// The memory limit file of cgroup `path` (e.g. `/default/ctrd-f1`):
/// `memory.limit_in_bytes` of the v1 memory controller, or `memory.max`.
pub fn memory_limit_file(path: &str) -> PathBuf {
    file(
        path,
        "memory",
        if v2() { "memory.max" } else { "memory.limit_in_bytes" },
    )
}

/// The memory limit of cgroup `path`, as the kernel shows it.
///
/// # Panics
/// If the cgroup has no such file.
pub fn memory_limit(path: &str) -> String {
    let f = memory_limit_file(path);
    std::fs::read_to_string(&f)
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        .trim()
        .to_string()
}

/// The directories of cgroup `path` that exist: in the v2 hierarchy, or in
/// any v1 controller's (and a hybrid host's `unified`). For leak checks.
pub fn dirs(path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/');
    let mut out: Vec<PathBuf> = std::fs::read_dir(ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| c.path().join(rel))
        .chain([Path::new(ROOT).join(rel)])
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}
