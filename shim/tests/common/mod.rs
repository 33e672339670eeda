//! Shared by the shim's integration test binaries.

use std::sync::{Mutex, Once};

static PARENTS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Removes cgroup `name` (a parent the binary's containers share, e.g.
/// `nri-shim-test`) from every controller when the test binary exits:
/// each container's own cgroup goes with its delete, but the parent is
/// shared by tests running in parallel. rmdir fails, harmlessly, while it
/// still has children.
pub fn remove_cgroup_at_exit(name: &'static str) {
    static REGISTER: Once = Once::new();
    let mut parents = PARENTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !parents.contains(&name) {
        parents.push(name);
    }
    // SAFETY: registers a plain `extern "C" fn` that runs at exit.
    REGISTER.call_once(|| unsafe {
        libc::atexit(remove_parents);
    });
}

extern "C" fn remove_parents() {
    let parents = PARENTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for name in parents.iter() {
        for ctl in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(ctl.path().join(name));
        }
        let _ = std::fs::remove_dir(std::path::Path::new("/sys/fs/cgroup").join(name));
    }
}
