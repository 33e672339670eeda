//! containerd's cgroup v2 `Metrics` (`io.containerd.cgroups.v2.Metrics`),
//! read from a container's cgroup v2 directory as runc's shim reads them.
//!
//! On a cgroup v2 host runc's shim answers Task.Stats with this type, not
//! the v1 `Metrics`; CRI (and so kubelet's container and pod stats) reads
//! its fields by name: `cpu.usage_usec` (microseconds, as the kernel's
//! `cpu.stat` counts them), `memory.usage` minus `memory.inactive_file` for
//! the working set, `memory_events.oom_kill`, ... Each field is the kernel's
//! figure unconverted: `cpu.stat` and `memory.stat` keys by name, the
//! single-value files (`memory.current`, `pids.max`, ...) with `max` as
//! `u64::MAX`, `io.stat` per device, PSI (`*.pressure`) where the kernel
//! has it. A file the cgroup lacks (a controller not enabled for it) leaves
//! its fields 0, as with runc's shim.

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
};

use containerd_shim_protos::cgroups_v2::metrics as m;

/// Statistics of the cgroup v2 directory `dir` (e.g.
/// `/sys/fs/cgroup/k8s.io/<id>`).
///
/// # Errors
/// `dir` is not a directory, or a file it has cannot be read.
pub fn metrics(dir: &Path) -> io::Result<m::Metrics> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no cgroup directory {}", dir.display()),
        ));
    }
    let r = Reader(dir.to_path_buf());
    let mut out = m::Metrics::new();

    let pids = out.pids.mut_or_insert_default();
    pids.current = r.single("pids.current")?;
    pids.limit = r.single("pids.max")?;

    let cpu_stat = r.flat("cpu.stat")?;
    let c = |k: &str| cpu_stat.get(k).copied().unwrap_or(0);
    let cpu = out.cpu.mut_or_insert_default();
    cpu.usage_usec = c("usage_usec");
    cpu.user_usec = c("user_usec");
    cpu.system_usec = c("system_usec");
    cpu.nr_periods = c("nr_periods");
    cpu.nr_throttled = c("nr_throttled");
    cpu.throttled_usec = c("throttled_usec");
    cpu.nr_bursts = c("nr_bursts");
    cpu.burst_usec = c("burst_usec");
    cpu.psi = r.psi("cpu.pressure")?;

    let st = r.flat("memory.stat")?;
    let s = |k: &str| st.get(k).copied().unwrap_or(0);
    let mem = out.memory.mut_or_insert_default();
    // (field, memory.stat key): the same names, spelled by the proto.
    macro_rules! stat {
        ($($field:ident),* $(,)?) => {$( mem.$field = s(stringify!($field)); )*};
    }
    stat!(
        anon,
        file,
        kernel_stack,
        slab,
        sock,
        shmem,
        file_mapped,
        file_dirty,
        file_writeback,
        anon_thp,
        inactive_anon,
        active_anon,
        inactive_file,
        active_file,
        unevictable,
        slab_reclaimable,
        slab_unreclaimable,
        pgfault,
        pgmajfault,
        workingset_refault,
        workingset_activate,
        workingset_nodereclaim,
        pgrefill,
        pgscan,
        pgsteal,
        pgactivate,
        pgdeactivate,
        pglazyfree,
        pglazyfreed,
        thp_fault_alloc,
        thp_collapse_alloc,
    );
    // Kernels before 5.8 (and some since) spell the refault counters with
    // `_anon`/`_file` suffixes only: the proto's field is their sum then.
    for (field, key) in [
        (&mut mem.workingset_refault, "workingset_refault"),
        (&mut mem.workingset_activate, "workingset_activate"),
    ] {
        if !st.contains_key(key) {
            *field = s(&format!("{key}_anon")) + s(&format!("{key}_file"));
        }
    }
    mem.usage = r.single("memory.current")?;
    mem.usage_limit = r.single("memory.max")?;
    mem.swap_usage = r.single("memory.swap.current")?;
    mem.swap_limit = r.single("memory.swap.max")?;
    mem.max_usage = r.single("memory.peak")?;
    mem.swap_max_usage = r.single("memory.swap.peak")?;
    mem.psi = r.psi("memory.pressure")?;

    let events = r.flat("memory.events")?;
    if !events.is_empty() {
        let e = |k: &str| events.get(k).copied().unwrap_or(0);
        let ev = out.memory_events.mut_or_insert_default();
        ev.low = e("low");
        ev.high = e("high");
        ev.max = e("max");
        ev.oom = e("oom");
        ev.oom_kill = e("oom_kill");
        ev.oom_group_kill = e("oom_group_kill");
    }

    let io_stat = out.io.mut_or_insert_default();
    io_stat.usage = r.io()?;
    io_stat.psi = r.psi("io.pressure")?;

    out.hugetlb = r.hugetlb()?;
    let rdma = out.rdma.mut_or_insert_default();
    rdma.current = r.rdma("rdma.current")?;
    rdma.limit = r.rdma("rdma.max")?;
    Ok(out)
}

/// Reads the files of one cgroup directory; a missing file reads as empty.
struct Reader(PathBuf);

impl Reader {
    fn text(&self, file: &str) -> io::Result<String> {
        match std::fs::read_to_string(self.0.join(file)) {
            Ok(t) => Ok(t),
            // ENODEV: a controller file of a cgroup being removed.
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound) || e.raw_os_error() == Some(libc::ENODEV) => {
                Ok(String::new())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("read {}: {e}", self.0.join(file).display()),
            )),
        }
    }

    /// A single-value file: a number, or `max` (no limit) as `u64::MAX`.
    fn single(&self, file: &str) -> io::Result<u64> {
        let t = self.text(file)?;
        Ok(match t.trim() {
            "max" => u64::MAX,
            v => v.parse().unwrap_or(0),
        })
    }

    /// A flat keyed file (`key value` lines: `cpu.stat`, `memory.stat`,
    /// `memory.events`).
    fn flat(&self, file: &str) -> io::Result<HashMap<String, u64>> {
        Ok(self
            .text(file)?
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// A pressure file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`
    /// and a `full` line); none when the kernel has no PSI for the cgroup.
    fn psi(&self, file: &str) -> io::Result<protobuf::MessageField<m::PSIStats>> {
        let t = self.text(file)?;
        let line = |kind: &str| -> Option<m::PSIData> {
            let rest = t.lines().find_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))?;
            let mut d = m::PSIData::new();
            for kv in rest.split_whitespace() {
                match kv.split_once('=')? {
                    ("avg10", v) => d.avg10 = v.parse().ok()?,
                    ("avg60", v) => d.avg60 = v.parse().ok()?,
                    ("avg300", v) => d.avg300 = v.parse().ok()?,
                    ("total", v) => d.total = v.parse().ok()?,
                    _ => {}
                }
            }
            Some(d)
        };
        let (some, full) = (line("some"), line("full"));
        if some.is_none() && full.is_none() {
            return Ok(protobuf::MessageField::none());
        }
        Ok(protobuf::MessageField::some(m::PSIStats {
            some: some.into(),
            full: full.into(),
            ..Default::default()
        }))
    }

    /// `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N wios=N ...` per device.
    fn io(&self) -> io::Result<Vec<m::IOEntry>> {
        Ok(self
            .text("io.stat")?
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let (major, minor) = words.next()?.split_once(':')?;
                let mut e = m::IOEntry {
                    major: major.parse().ok()?,
                    minor: minor.parse().ok()?,
                    ..Default::default()
                };
                for kv in words {
                    let Some((k, v)) = kv.split_once('=') else { continue };
                    let v = v.parse().unwrap_or(0);
                    match k {
                        "rbytes" => e.rbytes = v,
                        "wbytes" => e.wbytes = v,
                        "rios" => e.rios = v,
                        "wios" => e.wios = v,
                        _ => {}
                    }
                }
                Some(e)
            })
            .collect())
    }

    /// Per huge page size, smallest first (`hugetlb.<size>.current`,
    /// `.max`, and the `max` count of `.events`, the allocations refused by
    /// the limit); not the `<size>.rsvd` reservation files.
    fn hugetlb(&self) -> io::Result<Vec<m::HugeTlbStat>> {
        let mut sizes: Vec<(u64, String)> = std::fs::read_dir(&self.0)
            .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", self.0.display())))?
            .flatten()
            .filter_map(|f| {
                let name = f.file_name().into_string().ok()?;
                let size = name.strip_prefix("hugetlb.")?.strip_suffix(".current")?;
                Some((page_size_bytes(size)?, size.to_string()))
            })
            .collect();
        sizes.sort();
        sizes
            .into_iter()
            .map(|(_, size)| {
                Ok(m::HugeTlbStat {
                    current: self.single(&format!("hugetlb.{size}.current"))?,
                    max: self.single(&format!("hugetlb.{size}.max"))?,
                    failcnt: self
                        .flat(&format!("hugetlb.{size}.events"))?
                        .get("max")
                        .copied()
                        .unwrap_or(0),
                    pagesize: size,
                    ..Default::default()
                })
            })
            .collect()
    }

    /// `rdma.current` or `rdma.max`: `DEVICE hca_handle=N hca_object=N`
    /// per device, `max` as `u32::MAX`.
    fn rdma(&self, file: &str) -> io::Result<Vec<m::RdmaEntry>> {
        let n = |v: &str| if v == "max" { u32::MAX } else { v.parse().unwrap_or(0) };
        Ok(self
            .text(file)?
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let mut e = m::RdmaEntry {
                    device: words.next()?.to_string(),
                    ..Default::default()
                };
                for kv in words {
                    match kv.split_once('=') {
                        Some(("hca_handle", v)) => e.hca_handles = n(v),
                        Some(("hca_object", v)) => e.hca_objects = n(v),
                        _ => {}
                    }
                }
                Some(e)
            })
            .collect())
    }
}

/// A huge page size as the hugetlb files name it (`2MB`, `1GB`, `64KB`)
/// in bytes; none for other names (`2MB.rsvd`).
fn page_size_bytes(size: &str) -> Option<u64> {
    let (n, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
    let shift = match unit {
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        _ => return None,
    };
    n.parse::<u64>().ok().map(|n| n << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// The kernel's figures land in the proto's fields unconverted: CPU in
    /// microseconds, `max` as u64::MAX, the memory.stat keys by name.
    #[test]
    fn files_map_to_the_v2_metrics() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            &[
                (
                    "cpu.stat",
                    "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 4\nnr_throttled 1\nthrottled_usec 30\n",
                ),
                (
                    "cpu.pressure",
                    "some avg10=1.50 avg60=0.25 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
                ),
                (
                    "memory.stat",
                    "anon 4096\nfile 16777216\ninactive_file 8192\npgmajfault 3\nworkingset_refault_anon 2\nworkingset_refault_file 5\n",
                ),
                ("memory.current", "20000000\n"),
                ("memory.max", "max\n"),
                ("memory.swap.current", "0\n"),
                ("memory.swap.max", "0\n"),
                (
                    "memory.events",
                    "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n",
                ),
                ("pids.current", "3\n"),
                ("pids.max", "max\n"),
                ("io.stat", "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n"),
                ("hugetlb.2MB.current", "0\n"),
                ("hugetlb.2MB.max", "max\n"),
                ("hugetlb.2MB.events", "max 4\n"),
                ("hugetlb.2MB.rsvd.current", "0\n"),
                ("hugetlb.1GB.current", "0\n"),
                ("rdma.current", "mlx4_0 hca_handle=2 hca_object=2000\n"),
                ("rdma.max", "mlx4_0 hca_handle=max hca_object=10\n"),
            ],
        );
        let mm = metrics(d.path()).unwrap();
        assert_eq!(
            (mm.cpu.usage_usec, mm.cpu.user_usec, mm.cpu.system_usec),
            (1500, 1000, 500)
        );
        assert_eq!(
            (mm.cpu.nr_periods, mm.cpu.nr_throttled, mm.cpu.throttled_usec),
            (4, 1, 30)
        );
        assert_eq!(mm.cpu.psi.some.avg10, 1.5);
        assert_eq!(mm.cpu.psi.full.total, 7);
        assert_eq!(mm.memory.anon, 4096);
        assert_eq!(mm.memory.file, 16 << 20);
        assert_eq!(mm.memory.inactive_file, 8192);
        assert_eq!(mm.memory.pgmajfault, 3);
        assert_eq!(mm.memory.workingset_refault, 7);
        assert_eq!(mm.memory.usage, 20_000_000);
        assert_eq!(mm.memory.usage_limit, u64::MAX);
        assert_eq!(mm.memory.swap_limit, 0);
        assert!(mm.memory.psi.is_none());
        assert_eq!(
            (mm.memory_events.max, mm.memory_events.oom, mm.memory_events.oom_kill),
            (9, 2, 1)
        );
        assert_eq!((mm.pids.current, mm.pids.limit), (3, u64::MAX));
        assert_eq!(mm.io.usage.len(), 1);
        let io = &mm.io.usage[0];
        assert_eq!(
            (io.major, io.minor, io.rbytes, io.wbytes, io.rios, io.wios),
            (8, 0, 4096, 8192, 1, 2)
        );
        // Smallest page first, no reservation files.
        let sizes: Vec<&str> = mm.hugetlb.iter().map(|h| h.pagesize.as_str()).collect();
        assert_eq!(sizes, ["2MB", "1GB"]);
        assert_eq!((mm.hugetlb[0].max, mm.hugetlb[0].failcnt), (u64::MAX, 4));
        assert_eq!(mm.rdma.current[0].device, "mlx4_0");
        assert_eq!(
            (mm.rdma.current[0].hca_handles, mm.rdma.current[0].hca_objects),
            (2, 2000)
        );
        assert_eq!(
            (mm.rdma.limit[0].hca_handles, mm.rdma.limit[0].hca_objects),
            (u32::MAX, 10)
        );
    }

    #[test]
    fn a_missing_cgroup_is_an_error_naming_it() {
        let e = metrics(Path::new("/nonexistent/cgroup")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/cgroup"), "{e}");
    }
}
