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
    /// The cgroup's path in the hierarchy (a systemd scope's resolved).
    path: PathBuf,
    /// The cgroup's files (libcgroups' v1 or v2 file-system manager).
    manager: AnyCgroupManager,
    /// The spec's `slice:prefix:name`, for a container of the systemd
    /// driver: updates and removal then go through systemd too.
    systemd: Option<SystemdPath>,
}

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

/// runc's rules for the cgroup driver of a container, checked before it
/// is created: with `SystemdCgroup = true` (`systemd`) systemd must run
/// the host, the hierarchy must be pure cgroup v2 (libcgroups' systemd
/// driver has no v1 mode; runc's has) and `cgroups_path` must be
/// `slice:prefix:name`; without it, a `slice:prefix:name` path is refused
/// (runc's cgroupfs driver makes a directory of that name at the root of
/// the hierarchy, outside any slice: never what a node wants).
///
/// # Errors
/// [`ShimError::InvalidArgument`] naming the path and the option.
pub fn check_driver(cgroups_path: Option<&Path>, systemd: bool) -> Result<()> {
    let shown = cgroups_path.map(|p| p.display().to_string()).unwrap_or_default();
    let form = cgroups_path.and_then(SystemdPath::parse);
    if !systemd {
        return match form {
            Some(_) => Err(ShimError::InvalidArgument(format!(
                "linux.cgroupsPath {shown:?} is systemd's slice:prefix:name form, but the runtime options do not set \
                 SystemdCgroup = true (the cgroupfs driver would make a directory of that name)"
            ))),
            None => Ok(()),
        };
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
        for (file, value) in runc_v2_writes(resources, self.systemd.is_some()) {
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
/// - For a systemd unit (`systemd`), `cpu.max` as the quota and period
///   are (`<quota|max>[ <period>]`): runc's systemd driver writes every
///   file itself after starting the unit, and the unit's
///   `CPUQuotaPerSecUSec`, which systemd writes to `cpu.max`, is rounded
///   up to whole percents of a CPU (12345/100000 µs becomes 13000);
///   libcontainer's systemd manager leaves the file as systemd wrote it.
///
/// A key the spec's `unified` map sets itself is left to it (runc writes
/// `unified` last, so it wins there too).
fn runc_v2_writes(resources: &LinuxResources, systemd: bool) -> Vec<(&'static str, String)> {
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
    if systemd
        && let Some(cpu) = resources.cpu()
        && (cpu.quota().unwrap_or(0) != 0 || cpu.period().unwrap_or(0) != 0)
        && !unified("cpu.max")
    {
        let mut max = match cpu.quota() {
            Some(q) if q > 0 => q.to_string(),
            _ => "max".to_string(),
        };
        if let Some(period) = cpu.period().filter(|p| *p != 0) {
            max = format!("{max} {period}");
        }
        out.push(("cpu.max", max));
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
        // No systemd option: a systemd-form path is refused, naming it
        // and the option; a cgroupfs path is fine.
        let e = check_driver(Some(Path::new("k.slice:cri-containerd:c1")), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("k.slice:cri-containerd:c1") && e.contains("SystemdCgroup"),
            "{e}"
        );
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

    #[test]
    fn swap_equal_to_the_limit_disables_swap_as_runc_does() {
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 27}}));
        assert_eq!(runc_v2_writes(&r, false), [("memory.swap.max", "0".to_string())]);
        // More swap than memory is libcgroups' own (swap - limit), and so
        // is no swap limit at all.
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 28}}));
        assert_eq!(runc_v2_writes(&r, false), []);
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27}}));
        assert_eq!(runc_v2_writes(&r, false), []);
        let r = resources(serde_json::json!({"memory": {"limit": 1 << 27, "swap": 1 << 27},
            "unified": {"memory.swap.max": "1000"}}));
        assert_eq!(runc_v2_writes(&r, false), []);
    }

    #[test]
    fn a_systemd_units_cpu_max_is_the_exact_quota_as_runc_writes_it() {
        let max = |cpu: serde_json::Value, systemd: bool| {
            let r = resources(serde_json::json!({ "cpu": cpu }));
            runc_v2_writes(&r, systemd)
                .into_iter()
                .find(|(f, _)| *f == "cpu.max")
                .map(|(_, v)| v)
        };
        let q = serde_json::json!({"quota": 12345, "period": 100_000});
        assert_eq!(max(q.clone(), true).as_deref(), Some("12345 100000"));
        // cgroupfs: libcgroups writes cpu.max itself.
        assert_eq!(max(q, false), None);
        assert_eq!(max(serde_json::json!({"quota": 12345}), true).as_deref(), Some("12345"));
        assert_eq!(
            max(serde_json::json!({"quota": -1, "period": 50_000}), true).as_deref(),
            Some("max 50000")
        );
        assert_eq!(max(serde_json::json!({"shares": 512}), true), None);
        let r = resources(serde_json::json!({"cpu": {"quota": 12345}, "unified": {"cpu.max": "max"}}));
        assert!(runc_v2_writes(&r, true).iter().all(|(f, _)| *f != "cpu.max"));
    }

    #[test]
    fn shares_become_runc_weights() {
        let weight = |shares: u64| {
            let r = resources(serde_json::json!({"cpu": {"shares": shares}}));
            runc_v2_writes(&r, false)
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
