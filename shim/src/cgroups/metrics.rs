//! Task.Stats' payload: containerd's metrics of the host's hierarchy, and
//! the cgroup v1 metrics from libcgroups' statistics (v2's are read by
//! [`super::v2`]).

use containerd_shim_protos::{cgroups::metrics as m, cgroups_v2::metrics as m2};
use libcgroups::stats::Stats;

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
            Metrics::V1(v) => crate::task::events::to_any(v),
            Metrics::V2(v) => crate::task::events::to_any(v),
        }
    }
}

/// Nanoseconds in one clock tick (`USER_HZ`): cgroup v1's `cpuacct.stat`
/// counts user and system time in ticks; containerd's metrics are in ns.
pub(super) fn ns_per_tick() -> u64 {
    1_000_000_000 / rustix::param::clock_ticks_per_second().max(1)
}

/// containerd's cgroups v1 `Metrics` from libcgroups' statistics of a v1
/// hierarchy, as runc's shim fills them: every `memory.stat` counter
/// (with the hierarchical `total_*` ones, whose `total_inactive_file` CRI
/// subtracts for the working set kubelet evicts on), CPU user and kernel
/// times in ns (`ns_per_cpu_unit`: what one unit of libcgroups' figure is).
pub(super) fn to_metrics(s: &Stats, ns_per_cpu_unit: u64) -> m::Metrics {
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

/// containerd's `MemoryOomControl` from a cgroup v1 `memory.oom_control`
/// (`oom_kill_disable 0`, `under_oom 0`, `oom_kill 3`: one `key value`
/// per line; `oom_kill` since Linux 4.13). Missing keys stay 0.
pub(super) fn oom_control(text: &str) -> m::MemoryOomControl {
    let mut out = m::MemoryOomControl::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse() else { continue };
        match key {
            "oom_kill_disable" => out.oom_kill_disable = value,
            "under_oom" => out.under_oom = value,
            "oom_kill" => out.oom_kill = value,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_control_reads_every_key_and_skips_what_it_does_not_know() {
        let o = oom_control("oom_kill_disable 1\nunder_oom 0\noom_kill 3\nnew_key 9\nbroken\n");
        assert_eq!((o.oom_kill_disable, o.under_oom, o.oom_kill), (1, 0, 3));
        let o = oom_control("oom_kill_disable 0\nunder_oom 1\n");
        assert_eq!((o.oom_kill_disable, o.under_oom, o.oom_kill), (0, 1, 0));
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
