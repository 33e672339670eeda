//! A running container's cgroup: resource updates, statistics in
//! containerd's format, freeze/thaw, member pids, OOM kills. Blocking file
//! I/O: the daemon reaches it through [`Cgroup::off_runtime`]. The forms of
//! `linux.cgroupsPath` and the driver rules are in [`path`], the metrics in
//! [`metrics`] (v1) and [`v2`], the runtime options that pick the driver
//! in [`options`]; priming the kernel's attach lock before a create in
//! [`prime`]; the daemon's open cgroups in [`Opened`]. May use only
//! `error`, `sync` and `container::runner::Target`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use libcgroups::common::{AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt, FreezerState};
use oci_spec::runtime::LinuxResources;

pub mod metrics;
pub mod options;
pub mod path;
pub mod prime;
pub mod threaded;
pub mod v2;

pub use metrics::Metrics;
use metrics::{ns_per_tick, oom_control, to_metrics};
pub use path::{SystemdPath, check_driver, check_unified, default_path, resolve, systemd_booted};

use crate::{
    container::runner::Target,
    error::{Result, ShimError},
    sync::lock,
};

/// Where the host's cgroup hierarchy is mounted (libcgroups' root): the
/// unified (v2) hierarchy itself, or the parent of the v1 controllers.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// How long [`Cgroup::remove`] waits for killed processes to leave.
pub const REMOVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// The cgroup of one container.
pub struct Cgroup {
    /// The cgroup's path in the hierarchy (a systemd scope's resolved).
    path: PathBuf,
    /// The cgroup's files (libcgroups' v1 or v2 file-system manager).
    manager: AnyCgroupManager,
    /// The spec's `slice:prefix:name`, for a container of the systemd
    /// driver: updates and removal then go through systemd too.
    systemd: Option<SystemdPath>,
}

/// The daemon's open cgroups, one per container, by `linux.cgroupsPath`.
///
/// Opening one builds libcgroups' manager: it resolves the path, reads
/// `/proc/self/cgroup` and, on a cgroup v1 host, finds each controller
/// among the mounts the process read once (libcgroups patch 5; before it,
/// a rendering of the node's whole mount table, about 1 ms of CPU with
/// pods running). A container's exit and delete used to open its cgroup
/// three times or more, and Stats, Pids and Update each once. The
/// manager's paths do not move while the container lives;
/// [`Opened::forget`] drops a container's once it is deleted, so a new
/// container of the same path is opened afresh.
#[derive(Default)]
pub struct Opened {
    by_path: std::sync::Mutex<HashMap<PathBuf, Arc<Cgroup>>>,
}

impl Opened {
    /// The cgroup at `cgroups_path` of container `id`, opened now if it is
    /// not open yet. Blocking (file I/O).
    ///
    /// # Errors
    /// [`Cgroup::open`]'s.
    pub fn get(&self, cgroups_path: &Path, id: &str) -> Result<Arc<Cgroup>> {
        if let Some(c) = lock(&self.by_path).get(cgroups_path) {
            return Ok(c.clone());
        }
        // Opened without the lock held: another container's calls need
        // not wait for this one's file I/O. Two first calls for one path
        // both open it; the first one kept serves every later call.
        let c = Arc::new(Cgroup::open(cgroups_path, id)?);
        Ok(lock(&self.by_path)
            .entry(cgroups_path.to_path_buf())
            .or_insert(c)
            .clone())
    }

    /// Drops the cgroup at `cgroups_path` (its container was deleted).
    pub fn forget(&self, cgroups_path: &Path) {
        lock(&self.by_path).remove(cgroups_path);
    }
}

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> ShimError {
    ShimError::Runtime(format!("cgroup {}: {what}: {e}", path.display()))
}

impl Cgroup {
    /// The cgroup at `cgroups_path` (as in the OCI spec): for a systemd
    /// `slice:prefix:name`, its unit's cgroup (see [`resolve`]), read and
    /// written as files like any other, updated and removed through
    /// systemd too.
    ///
    /// # Errors
    /// When the cgroup setup cannot be detected, or a systemd path has an
    /// invalid slice.
    pub fn open(cgroups_path: &Path, id: &str) -> Result<Cgroup> {
        let systemd = SystemdPath::parse(cgroups_path);
        let path = resolve(cgroups_path)?;
        let manager = libcgroups::common::create_cgroup_manager(CgroupConfig {
            cgroup_path: path.clone(),
            systemd_cgroup: false,
            container_name: id.to_string(),
        })
        .map_err(|e| err("open", &path, e))?;
        Ok(Cgroup { path, manager, systemd })
    }

    /// libcgroups' systemd manager of the unit (a D-Bus connection to
    /// systemd, its private socket when no bus daemon runs).
    fn systemd_manager(&self, s: &SystemdPath) -> Result<AnyCgroupManager> {
        let spec_path = format!("{}:{}:{}", s.slice, s.prefix, s.name);
        libcgroups::common::create_cgroup_manager(CgroupConfig {
            cgroup_path: PathBuf::from(&spec_path),
            systemd_cgroup: true,
            container_name: s.name.clone(),
        })
        .map_err(|e| err(&format!("systemd unit {}", s.unit()), &self.path, e))
    }

    /// Runs `f` on the cgroup of `target` (from `opened`, opened there
    /// if it is not yet) on a blocking thread: cgroup access is file I/O
    /// and must not stall the daemon's single async thread.
    ///
    /// # Errors
    /// [`Cgroup::open`]'s error, `f`'s, or [`ShimError::Runtime`] if `f`
    /// panicked.
    pub async fn off_runtime<T: Send + 'static>(
        opened: &Arc<Opened>,
        target: Target<'_>,
        f: impl FnOnce(&Cgroup) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (opened, path, id) = (opened.clone(), target.cgroups_path.to_path_buf(), target.id.to_string());
        tokio::task::spawn_blocking(move || opened.get(&path, &id).and_then(|c| f(&c)))
            .await
            .map_err(|e| ShimError::Runtime(format!("cgroup {}: {e}", target.cgroups_path.display())))?
    }

    /// Applies `resources` (only what they set).
    ///
    /// # Errors
    /// A controller refused a value.
    ///
    /// A systemd unit's cgroup is updated as runc's systemd driver does
    /// it: the unit's properties first (`MemoryMax`, `CPUWeight`, ...:
    /// systemd writes them and keeps them across a daemon reload), then
    /// the files themselves.
    pub fn update(&self, resources: &LinuxResources) -> Result<()> {
        check_unified(Some(resources))?;
        let opt = ControllerOpt {
            resources,
            disable_oom_killer: resources
                .memory()
                .as_ref()
                .and_then(|m| m.disable_oom_killer())
                .unwrap_or(false),
            oom_score_adj: None,
            freezer_state: None,
        };
        if let Some(s) = &self.systemd {
            self.systemd_manager(s)?
                .apply(&opt)
                .map_err(|e| err(&format!("update systemd unit {}", s.unit()), &self.path, e))?;
        }
        self.manager.apply(&opt).map_err(|e| err("update", &self.path, e))?;
        self.apply_runc_v2_rules(resources)
    }

    /// On cgroup v2, the files runc writes for `resources` that libcgroups
    /// leaves out or writes otherwise (see `runc_v2_writes`); after
    /// libcgroups' own writes, at create and at every update. Nothing on
    /// v1.
    ///
    /// # Errors
    /// A file could not be written (naming it and the value); a
    /// `memory.swap.max` the kernel does not have (no swap accounting) is
    /// skipped, as runc does.
    pub fn apply_runc_v2_rules(&self, resources: &LinuxResources) -> Result<()> {
        if !matches!(self.manager, AnyCgroupManager::V2(_)) {
            return Ok(());
        }
        let dir = self.v2_dir();
        for (file, value) in runc_v2_writes(resources) {
            match std::fs::write(dir.join(file), &value) {
                Ok(()) => {}
                Err(e) if file == "memory.swap.max" && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ShimError::io(
                        format!("cgroup {}: write {file} = {value}", dir.display()),
                        e,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Removes the cgroup's directories, killing what still runs in them.
    ///
    /// libcgroups SIGKILLs the processes and gives them about 100 ms to
    /// leave before its `rmdir` fails with EBUSY; a process killed on a
    /// loaded node can take longer to exit (freeing its memory), and the
    /// cgroup was then left behind. So a failed attempt is repeated (each
    /// one kills again) until the cgroup is gone or [`REMOVE_PATIENCE`]
    /// has passed, as runc's shim too retries the removal.
    ///
    /// # Errors
    /// A directory still could not be removed after [`REMOVE_PATIENCE`].
    ///
    /// A systemd unit is stopped first (systemd kills what is left and
    /// removes its cgroup; a scope whose processes all exited is gone
    /// already); then its cgroup is waited for, and removed here if
    /// systemd left it.
    pub fn remove(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + REMOVE_PATIENCE;
        if let Some(s) = &self.systemd
            && systemd_booted()
        {
            let dir = self.v2_dir();
            if dir.exists() {
                self.systemd_manager(s)?
                    .remove()
                    .map_err(|e| err(&format!("stop systemd unit {}", s.unit()), &self.path, e))?;
            }
            while dir.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let dir = self.v2_dir();
        if self.systemd.is_none() && threaded::is_threaded(Path::new(CGROUP_ROOT), &self.path) {
            // libcgroups' cgroup.kill is refused there (see threaded::remove).
            threaded::remove(&dir, deadline)?;
        }
        loop {
            match self.manager.remove() {
                Ok(()) => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(err("remove", &self.path, e)),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }

    /// Freezes or thaws every process.
    ///
    /// # Errors
    /// The freezer failed.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        let state = if frozen {
            FreezerState::Frozen
        } else {
            FreezerState::Thawed
        };
        self.manager.freeze(state).map_err(|e| err("freeze", &self.path, e))
    }

    /// Every pid in the cgroup.
    ///
    /// # Errors
    /// The cgroup cannot be read.
    pub fn pids(&self) -> Result<Vec<i32>> {
        self.manager
            .get_all_pids()
            .map(|v| v.into_iter().map(|p| p.as_raw()).collect())
            .map_err(|e| err("pids", &self.path, e))
    }

    /// Statistics in the containerd metrics type of the hierarchy, as
    /// runc's shim sends them: cgroup v1 `Metrics` on v1 (and hybrid),
    /// [`crate::cgroups::v2`]'s v2 `Metrics` on a pure cgroup v2 host.
    ///
    /// # Errors
    /// The cgroup cannot be read.
    pub fn metrics(&self) -> Result<Metrics> {
        match &self.manager {
            AnyCgroupManager::V1(_) => {
                let s = self.manager.stats().map_err(|e| err("stats", &self.path, e))?;
                let mut m = to_metrics(&s, ns_per_tick());
                // libcgroups' statistics leave out `memory.oom_control`;
                // CRI's pod sandbox metrics take container_oom_events_total
                // from it, and runc's shim sends it. Absent when the memory
                // controller is not mounted.
                if let Ok(text) = std::fs::read_to_string(self.v1_memory_dir().join("memory.oom_control")) {
                    m.memory_oom_control = protobuf::MessageField::some(oom_control(&text));
                }
                Ok(Metrics::V1(m))
            }
            AnyCgroupManager::V2(_) | AnyCgroupManager::Systemd(_) => crate::cgroups::v2::metrics(&self.v2_dir())
                .map(Metrics::V2)
                .map_err(|e| err("stats", &self.path, e)),
        }
    }

    /// The cgroup's directory in a pure cgroup v2 hierarchy.
    fn v2_dir(&self) -> PathBuf {
        Path::new(CGROUP_ROOT).join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }

    /// The cgroup's directory in a cgroup v1 memory controller.
    fn v1_memory_dir(&self) -> PathBuf {
        Path::new(CGROUP_ROOT)
            .join("memory")
            .join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }

    /// Number of OOM kills recorded by the memory controller (v1
    /// `memory.oom_control`, v2 `memory.events`), when readable.
    pub fn oom_kills(&self) -> Option<u64> {
        let candidates = [
            self.v1_memory_dir().join("memory.oom_control"),
            self.v2_dir().join("memory.events"),
        ];
        candidates.iter().find_map(|file| {
            let text = std::fs::read_to_string(file).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        })
    }
}

/// The cgroup v2 files runc 1.5 writes for `resources` that libcgroups
/// 0.7 does not write, or writes another value to:
///
/// - `memory.swap.max = 0` when the swap limit equals the memory limit
///   (OCI's swap is memory plus swap, so no swap at all; CRI sets it so
///   for every container with a memory limit): libcgroups computes the v2
///   value 0 and then skips writing it, leaving `max`.
///
/// What runc 1.1 wrote otherwise is runc 1.5's and libcgroups' now: the
/// quadratic map of `cpu.shares` onto `cpu.weight` (512 → 59, 1024 → 100;
/// runc 1.1's linear one gave 20 and 39), and a systemd unit's `cpu.max`
/// as systemd writes it from the quota rounded up to whole percents of a
/// CPU (runc 1.1 wrote the exact quota after starting the unit).
///
/// A key the spec's `unified` map sets itself is left to it (runc writes
/// `unified` last, so it wins there too).
fn runc_v2_writes(resources: &LinuxResources) -> Vec<(&'static str, String)> {
    let unified = |k: &str| resources.unified().as_ref().is_some_and(|u| u.contains_key(k));
    let mut out = Vec::new();
    if let Some(mem) = resources.memory()
        && let (Some(limit), Some(swap)) = (mem.limit(), mem.swap())
        && limit > 0
        && swap == limit
        && !unified("memory.swap.max")
    {
        out.push(("memory.swap.max", "0".to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(json: serde_json::Value) -> LinuxResources {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_cgroup_is_opened_once_until_its_container_is_forgotten() {
        // Opening builds a manager of this host's hierarchy; the cgroup
        // need not exist for that.
        let opened = Opened::default();
        let (a, b) = (
            Path::new("/nri-shim-test/opened-a"),
            Path::new("/nri-shim-test/opened-b"),
        );
        let first = opened.get(a, "a").unwrap();
        assert!(Arc::ptr_eq(&first, &opened.get(a, "a").unwrap()));
        let other = opened.get(b, "b").unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(lock(&opened.by_path).len(), 2);
        opened.forget(a);
        assert_eq!(lock(&opened.by_path).len(), 1);
        // A new container of the same path gets a handle of its own.
        assert!(!Arc::ptr_eq(&first, &opened.get(a, "a").unwrap()));
        assert!(Arc::ptr_eq(&other, &opened.get(b, "b").unwrap()));
    }

    #[test]
    fn swap_equal_to_the_limit_disables_swap_as_runc_does() {
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 27}}));
        assert_eq!(runc_v2_writes(&r), [("memory.swap.max", "0".to_string())]);
        // More swap than memory is libcgroups' own (swap - limit), and so
        // is no swap limit at all.
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 28}}));
        assert_eq!(runc_v2_writes(&r), []);
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27}}));
        assert_eq!(runc_v2_writes(&r), []);
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 27},
            "unified": {"memory.swap.max": "1000"}}));
        assert_eq!(runc_v2_writes(&r), []);
    }
}
