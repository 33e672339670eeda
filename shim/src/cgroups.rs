//! A running container's cgroup: resource updates, statistics in
//! containerd's format, freeze/thaw, member pids, OOM kills. Blocking file
//! I/O: the daemon reaches it through [`Cgroup::off_runtime`].

use std::path::{Path, PathBuf};

use containerd_shim_protos::{cgroups::metrics as m, cgroups_v2::metrics as m2};
use libcgroups::{
    common::{AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt, FreezerState},
    stats::Stats,
};
use oci_spec::runtime::LinuxResources;

use crate::{
    error::{Result, ShimError},
    runner::Target,
};

/// Where the host's cgroup hierarchy is mounted (libcgroups' root): the
/// unified (v2) hierarchy itself, or the parent of the v1 controllers.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Task.Stats' payload: containerd's metrics type of the host's hierarchy
/// (its type URL tells containerd and CRI which one it is).
#[derive(Debug, Clone, PartialEq)]
pub enum Metrics {
    /// `io.containerd.cgroups.v1.Metrics`.
    V1(m::Metrics),
    /// `io.containerd.cgroups.v2.Metrics`.
    V2(m2::Metrics),
}

impl Metrics {
    /// The `Any` of Task.Stats, with the type's full proto name.
    pub fn to_any(&self) -> protobuf::well_known_types::any::Any {
        match self {
            Metrics::V1(v) => crate::events::to_any(v),
            Metrics::V2(v) => crate::events::to_any(v),
        }
    }
}

/// How long [`Cgroup::remove`] waits for killed processes to leave.
pub const REMOVE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// The cgroup of one container.
pub struct Cgroup {
    path: PathBuf,
    manager: AnyCgroupManager,
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

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> ShimError {
    ShimError::Runtime(format!("cgroup {}: {what}: {e}", path.display()))
}

impl Cgroup {
    /// The cgroup at `cgroups_path` (as in the OCI spec).
    ///
    /// # Errors
    /// When the cgroup setup cannot be detected.
    pub fn open(cgroups_path: &Path, id: &str) -> Result<Cgroup> {
        let manager = libcgroups::common::create_cgroup_manager(CgroupConfig {
            cgroup_path: cgroups_path.to_path_buf(),
            systemd_cgroup: false,
            container_name: id.to_string(),
        })
        .map_err(|e| err("open", cgroups_path, e))?;
        Ok(Cgroup {
            path: cgroups_path.to_path_buf(),
            manager,
        })
    }

    /// Opens the cgroup of `target` and runs `f` on it on a blocking
    /// thread: cgroup access is file I/O and must not stall the daemon's
    /// single async thread.
    ///
    /// # Errors
    /// [`Cgroup::open`]'s error, `f`'s, or [`ShimError::Runtime`] if `f`
    /// panicked.
    pub async fn off_runtime<T: Send + 'static>(
        target: Target<'_>,
        f: impl FnOnce(&Cgroup) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (path, id) = (target.cgroups_path.to_path_buf(), target.id.to_string());
        tokio::task::spawn_blocking(move || Cgroup::open(&path, &id).and_then(|c| f(&c)))
            .await
            .map_err(|e| ShimError::Runtime(format!("cgroup {}: {e}", target.cgroups_path.display())))?
    }

    /// Applies `resources` (only what they set).
    ///
    /// # Errors
    /// A controller refused a value.
    pub fn update(&self, resources: &LinuxResources) -> Result<()> {
        check_unified(Some(resources))?;
        self.manager
            .apply(&ControllerOpt {
                resources,
                disable_oom_killer: resources
                    .memory()
                    .as_ref()
                    .and_then(|m| m.disable_oom_killer())
                    .unwrap_or(false),
                oom_score_adj: None,
                freezer_state: None,
            })
            .map_err(|e| err("update", &self.path, e))?;
        self.apply_runc_v2_rules(resources)
    }

    /// On cgroup v2, the files runc writes for `resources` that libcgroups
    /// leaves out or writes otherwise (see [`runc_v2_writes`]); after
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
    pub fn remove(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + REMOVE_PATIENCE;
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
    /// [`crate::cgroupv2`]'s v2 `Metrics` on a pure cgroup v2 host.
    ///
    /// # Errors
    /// The cgroup cannot be read.
    pub fn metrics(&self) -> Result<Metrics> {
        match &self.manager {
            AnyCgroupManager::V1(_) => {
                let s = self.manager.stats().map_err(|e| err("stats", &self.path, e))?;
                Ok(Metrics::V1(to_metrics(&s, ns_per_tick())))
            }
            AnyCgroupManager::V2(_) | AnyCgroupManager::Systemd(_) => crate::cgroupv2::metrics(&self.v2_dir())
                .map(Metrics::V2)
                .map_err(|e| err("stats", &self.path, e)),
        }
    }

    /// The cgroup's directory in a pure cgroup v2 hierarchy.
    fn v2_dir(&self) -> PathBuf {
        Path::new(CGROUP_ROOT).join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }

    /// Number of OOM kills recorded by the memory controller (v1
    /// `memory.oom_control`, v2 `memory.events`), when readable.
    pub fn oom_kills(&self) -> Option<u64> {
        let rel = self.path.strip_prefix("/").unwrap_or(&self.path);
        let candidates = [
            Path::new(CGROUP_ROOT)
                .join("memory")
                .join(rel)
                .join("memory.oom_control"),
            self.v2_dir().join("memory.events"),
        ];
        candidates.iter().find_map(|file| {
            let text = std::fs::read_to_string(file).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        })
    }
}

/// The cgroup v2 files runc 1.1 (this node's runc) writes for `resources`
/// that libcgroups 0.7 does not write, or writes another value to:
///
/// - `memory.swap.max = 0` when the swap limit equals the memory limit
///   (OCI's swap is memory plus swap, so no swap at all; CRI sets it so
///   for every container with a memory limit): libcgroups computes the v2
///   value 0 and then skips writing it, leaving `max`.
/// - `cpu.weight` from `cpu.shares` by runc's linear map of the v1 range
///   [2, 262144] onto [1, 10000]: `1 + (shares - 2) * 9999 / 262142`
///   (512 → 20, 1024 → 39). libcgroups uses a later, logarithmic formula
///   (512 → 59); containers must get the weights kubelet's shares give
///   them under runc on the same node.
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
    if let Some(shares) = resources.cpu().as_ref().and_then(|c| c.shares())
        && shares != 0
        && !unified("cpu.weight")
    {
        let shares = shares.clamp(2, 262_144);
        out.push(("cpu.weight", (1 + (shares - 2) * 9999 / 262_142).to_string()));
    }
    out
}

/// Nanoseconds in one clock tick (`USER_HZ`): cgroup v1's `cpuacct.stat`
/// counts user and system time in ticks; containerd's metrics are in ns.
fn ns_per_tick() -> u64 {
    1_000_000_000 / rustix::param::clock_ticks_per_second().max(1)
}

/// containerd's cgroups v1 `Metrics` from libcgroups' statistics of a v1
/// hierarchy, as runc's shim fills them: every `memory.stat` counter
/// (with the hierarchical `total_*` ones, whose `total_inactive_file` CRI
/// subtracts for the working set kubelet evicts on), CPU user and kernel
/// times in ns (`ns_per_cpu_unit`: what one unit of libcgroups' figure is).
fn to_metrics(s: &Stats, ns_per_cpu_unit: u64) -> m::Metrics {
    let mut out = m::Metrics::new();
    let cpu = out.cpu.mut_or_insert_default();
    let usage = cpu.usage.mut_or_insert_default();
    usage.total = s.cpu.usage.usage_total;
    usage.kernel = s.cpu.usage.usage_kernel.saturating_mul(ns_per_cpu_unit);
    usage.user = s.cpu.usage.usage_user.saturating_mul(ns_per_cpu_unit);
    usage.per_cpu = s.cpu.usage.per_core_usage_total.clone();
    let t = cpu.throttling.mut_or_insert_default();
    t.periods = s.cpu.throttling.periods;
    t.throttled_periods = s.cpu.throttling.throttled_periods;
    t.throttled_time = s.cpu.throttling.throttled_time;
    let pids = out.pids.mut_or_insert_default();
    pids.current = s.pids.current;
    pids.limit = s.pids.limit;
    let mem = out.memory.mut_or_insert_default();
    let entry = |d: &libcgroups::stats::MemoryData| m::MemoryEntry {
        limit: d.limit,
        usage: d.usage,
        max: d.max_usage,
        failcnt: d.fail_count,
        ..Default::default()
    };
    mem.usage = protobuf::MessageField::some(entry(&s.memory.memory));
    mem.swap = protobuf::MessageField::some(entry(&s.memory.memswap));
    mem.kernel = protobuf::MessageField::some(entry(&s.memory.kernel));
    mem.kernel_tcp = protobuf::MessageField::some(entry(&s.memory.kernel_tcp));
    let st = |k: &str| s.memory.stats.get(k).copied().unwrap_or(0);
    // (field, memory.stat key): the key without and with the `total_` prefix.
    macro_rules! stat {
        ($($field:ident, $total:ident <= $key:literal;)*) => {$(
            mem.$field = st($key);
            mem.$total = st(concat!("total_", $key));
        )*};
    }
    stat! {
        cache, total_cache <= "cache";
        rss, total_rss <= "rss";
        rss_huge, total_rss_huge <= "rss_huge";
        mapped_file, total_mapped_file <= "mapped_file";
        dirty, total_dirty <= "dirty";
        writeback, total_writeback <= "writeback";
        pg_pg_in, total_pg_pg_in <= "pgpgin";
        pg_pg_out, total_pg_pg_out <= "pgpgout";
        pg_fault, total_pg_fault <= "pgfault";
        pg_maj_fault, total_pg_maj_fault <= "pgmajfault";
        inactive_anon, total_inactive_anon <= "inactive_anon";
        active_anon, total_active_anon <= "active_anon";
        inactive_file, total_inactive_file <= "inactive_file";
        active_file, total_active_file <= "active_file";
        unevictable, total_unevictable <= "unevictable";
    }
    mem.hierarchical_memory_limit = st("hierarchical_memory_limit");
    mem.hierarchical_swap_limit = st("hierarchical_memsw_limit");
    for (size, h) in &s.hugetlb {
        out.hugetlb.push(m::HugetlbStat {
            usage: h.usage,
            max: h.max_usage,
            failcnt: h.fail_count,
            pagesize: size.clone(),
            ..Default::default()
        });
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

    #[test]
    fn shares_become_runc_weights() {
        let weight = |shares: u64| {
            let r = resources(serde_json::json!({"cpu": {"shares": shares}}));
            runc_v2_writes(&r)
                .into_iter()
                .find(|(f, _)| *f == "cpu.weight")
                .map(|(_, v)| v)
        };
        // runc 1.1.5 in the cgroup v2 VM: 512 → 20 (libcgroups gave 59).
        assert_eq!(weight(512).as_deref(), Some("20"));
        assert_eq!(weight(1024).as_deref(), Some("39"));
        assert_eq!(weight(2).as_deref(), Some("1"));
        assert_eq!(weight(262_144).as_deref(), Some("10000"));
        assert_eq!(weight(1).as_deref(), Some("1"));
        assert_eq!(weight(0), None);
    }

    #[test]
    fn stats_map_to_containerd_metrics() {
        let mut s = Stats::default();
        s.cpu.usage.usage_total = 10;
        s.pids.current = 3;
        s.memory.memory.usage = 4096;
        s.memory.memory.limit = 8192;
        s.memory.stats.insert("rss".into(), 77);
        s.memory.stats.insert("total_inactive_file".into(), 4000);
        s.memory.stats.insert("pgmajfault".into(), 5);
        s.memory.stats.insert("hierarchical_memsw_limit".into(), 9);
        s.cpu.usage.usage_user = 3;
        s.cpu.usage.usage_kernel = 2;
        let mm = to_metrics(&s, ns_per_tick());
        // cpuacct.stat ticks (USER_HZ, 100 on Linux) are nanoseconds here.
        assert_eq!(
            mm.cpu.usage.user,
            3 * 1_000_000_000 / rustix::param::clock_ticks_per_second()
        );
        assert_eq!(
            mm.cpu.usage.kernel,
            2 * 1_000_000_000 / rustix::param::clock_ticks_per_second()
        );
        // What CRI subtracts from the usage for the working set.
        assert_eq!(mm.memory.total_inactive_file, 4000);
        assert_eq!(mm.memory.pg_maj_fault, 5);
        assert_eq!(mm.memory.hierarchical_swap_limit, 9);
        assert_eq!(mm.cpu.usage.total, 10);
        assert_eq!(mm.pids.current, 3);
        assert_eq!(mm.memory.usage.usage, 4096);
        assert_eq!(mm.memory.usage.limit, 8192);
        assert_eq!(mm.memory.rss, 77);
    }
}
