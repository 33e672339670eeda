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

/// The runc these tests compare with: runc 1.5, built from its Go module
/// with the other reference peers (`peers/go.mod`, `scripts/go-peers.sh`):
/// `$NRI_GO_PEERS_BIN/runc`, else the cache's newest build. Not Debian 12's
/// runc 1.1.5: a node of today runs a 1.3 to 1.5.
///
/// # Panics
/// When it is not built: a test without its reference must fail.
#[allow(dead_code)] // not every test binary compares with runc
pub fn runc() -> std::path::PathBuf {
    let dir = std::env::var_os("NRI_GO_PEERS_BIN").map_or_else(
        || {
            let cache = std::env::var("NRI_CONTAINERD_CACHE").unwrap_or_else(|_| "/var/cache/nri-shim".into());
            std::path::Path::new(&cache).join("go-peers/current/bin")
        },
        std::path::PathBuf::from,
    );
    let runc = dir.join("runc");
    assert!(
        runc.exists(),
        "{} missing: scripts/go-peers.sh builds runc 1.5, the reference these tests compare with",
        runc.display()
    );
    runc
}
