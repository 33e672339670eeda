//! Priming the kernel's cgroup attach lock ahead of a container's cgroup
//! migration.
//!
//! Every new container (and exec'd process) is moved into its cgroup by a
//! write of its pid to `cgroup.procs` (libcontainer's intermediate process
//! does it). That write takes the kernel's one system-wide threadgroup
//! rwsem for writing, and when no such write happened lately, taking it
//! first waits for an RCU grace period (`rcu_sync_enter` on
//! `cgroup_threadgroup_rwsem`): 5 to 15 ms on this project's 2-core VMs,
//! in the middle of every create, for runc as for us. A writer that comes
//! while another writer's grace period is under way waits only for its
//! rest, and one that comes within about one grace period after the last
//! writer left does not wait at all. (A hierarchy mounted with the
//! `favordynmods` option avoids the wait for every writer; that is the
//! node's choice, not the runtime's.)
//!
//! So when a create or an exec arrives, the daemon starts such a write
//! itself, on a blocking thread, without waiting for it: that thread
//! writes its own thread id to the thread list (`cgroup.threads` on v2,
//! `tasks` on v1) of the cgroup it is in already, which the kernel carries
//! out as a move of that one thread to the same cgroup, changing nothing.
//! (A thread id takes the lock; `0`, meaning the writer, would not.) The
//! grace period then passes while the bundle is written and the helper
//! process starts, instead of after. At most one such write is in flight
//! at a time.

use std::{
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

/// A cgroup hierarchy the priming thread's own cgroup is found in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The cgroup mounted there (mountinfo's root field; `/` normally).
    pub root: PathBuf,
    /// Its line in `/proc/<tid>/cgroup`: `None` for the unified (v2)
    /// hierarchy (`0::<path>`), else the v1 controller named there.
    pub controller: Option<String>,
}

impl Hierarchy {
    /// The thread list (`cgroup.threads` on v2, `tasks` on v1) of the
    /// cgroup that `thread_cgroup` (the text of `/proc/thread-self/cgroup`)
    /// places the thread in, within this hierarchy; `None` when the
    /// thread's line is missing or its cgroup lies outside what is mounted.
    pub fn own_threads(&self, thread_cgroup: &str) -> Option<PathBuf> {
        let path = thread_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let hit = match &self.controller {
                None => id == "0" && controllers.is_empty(),
                Some(c) => controllers.split(',').any(|x| x == c),
            };
            hit.then_some(path)
        })?;
        let rel = Path::new(path).strip_prefix(&self.root).ok()?;
        let list = if self.controller.is_none() {
            "cgroup.threads"
        } else {
            "tasks"
        };
        Some(self.mount_point.join(rel).join(list))
    }
}

/// The hierarchy to write to, from the text of `/proc/self/mountinfo`:
/// the unified (v2) one when mounted, else the v1 `pids` or, lacking it,
/// the first v1 hierarchy with a controller.
pub fn pick_hierarchy(mountinfo: &str) -> Option<Hierarchy> {
    let mut v1: Vec<Hierarchy> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype), Some(opts)) = (l.get(3), l.get(4), r.first(), r.get(2))
        else {
            continue;
        };
        let (root, mount_point) = (PathBuf::from(unescape(root)), PathBuf::from(unescape(mount_point)));
        match *fstype {
            "cgroup2" => {
                return Some(Hierarchy {
                    mount_point,
                    root,
                    controller: None,
                });
            }
            "cgroup" => {
                // Super options: rw, the controllers, name=..., ...
                let controller = opts.split(',').find(|o| KNOWN_V1.contains(o)).map(str::to_string);
                if let Some(controller) = controller {
                    v1.push(Hierarchy {
                        mount_point,
                        root,
                        controller: Some(controller),
                    });
                }
            }
            _ => {}
        }
    }
    let pids = v1.iter().position(|h| h.controller.as_deref() == Some("pids"));
    match pids {
        Some(i) => Some(v1.swap_remove(i)),
        None => v1.into_iter().next(),
    }
}

/// cgroup v1 controllers, as named in mount options and `/proc/self/cgroup`.
const KNOWN_V1: &[&str] = &[
    "pids",
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "net_cls",
    "net_prio",
    "perf_event",
    "hugetlb",
    "rdma",
    "misc",
];

/// mountinfo's octal escapes (`\040` for a space, ...) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        match octal {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The hierarchy of this process, found once (one read of mountinfo).
fn hierarchy() -> Option<&'static Hierarchy> {
    static H: OnceLock<Option<Hierarchy>> = OnceLock::new();
    H.get_or_init(|| {
        let h = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|m| pick_hierarchy(&m));
        if h.is_none() {
            tracing::debug!("no cgroup hierarchy found: creates are not primed");
        }
        h
    })
    .as_ref()
}

/// Moves the calling thread to the cgroup it is in, in the picked
/// hierarchy (blocking: it waits out the grace period). Returns the file
/// written.
///
/// # Errors
/// When no hierarchy or own cgroup is found, or the write fails.
pub fn prime_now() -> std::io::Result<PathBuf> {
    let none = || std::io::Error::new(std::io::ErrorKind::NotFound, "no own cgroup found");
    let h = hierarchy().ok_or_else(none)?;
    let list = h
        .own_threads(&std::fs::read_to_string("/proc/thread-self/cgroup")?)
        .ok_or_else(none)?;
    std::fs::write(&list, rustix::thread::gettid().as_raw_nonzero().to_string())?;
    Ok(list)
}

/// Starts [`prime_now`] on a blocking thread of the current tokio runtime
/// and returns at once; does nothing while one is in flight. A failure
/// (a read-only cgroup file system, say) costs only the speed-up.
pub fn prime() {
    static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
    if IN_FLIGHT.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::task::spawn_blocking(|| {
        if let Err(e) = prime_now() {
            tracing::debug!(error = %e, "cgroup attach lock not primed");
        }
        IN_FLIGHT.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
30 27 0:25 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 30 0:29 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
32 30 0:27 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
";

    #[test]
    fn the_unified_hierarchy_is_preferred_and_maps_the_own_cgroup() {
        let h = pick_hierarchy(HYBRID).unwrap();
        assert_eq!(h.mount_point, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(h.controller, None);
        let own = "9:name=systemd:/a\n8:pids:/b\n0::/system.slice/containerd.service\n";
        assert_eq!(
            h.own_threads(own).unwrap(),
            Path::new("/sys/fs/cgroup/unified/system.slice/containerd.service/cgroup.threads")
        );
    }

    /// `mountinfo` without the lines containing `needle`.
    fn without(mountinfo: &str, needle: &str) -> String {
        mountinfo
            .lines()
            .filter(|l| !l.contains(needle))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    #[test]
    fn v1_only_picks_pids_and_skips_named_hierarchies() {
        let v1 = without(HYBRID, "cgroup2");
        let h = pick_hierarchy(&v1).unwrap();
        assert_eq!(h.mount_point, Path::new("/sys/fs/cgroup/pids"));
        assert_eq!(
            h.own_threads("8:pids:/kubepods/x\n1:cpu,cpuacct:/y\n").unwrap(),
            Path::new("/sys/fs/cgroup/pids/kubepods/x/tasks")
        );
        let no_pids = without(&v1, "pids");
        let h = pick_hierarchy(&no_pids).unwrap();
        assert_eq!(h.controller.as_deref(), Some("cpu"));
        // A v1 controller line lists several controllers.
        assert_eq!(
            h.own_threads("1:cpu,cpuacct:/y\n").unwrap(),
            Path::new("/sys/fs/cgroup/cpu,cpuacct/y/tasks")
        );
        assert_eq!(pick_hierarchy("22 27 0:21 / /proc rw - proc proc rw\n"), None);
    }

    /// A mount of a sub-cgroup (root field not `/`): the own cgroup maps
    /// below it, or nowhere when it lies outside, never to another cgroup.
    #[test]
    fn a_mounted_sub_cgroup_maps_only_what_lies_below_it() {
        let h = pick_hierarchy("40 30 0:26 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n").unwrap();
        assert_eq!(
            h.own_threads("0::/kubepods/pod1\n").unwrap(),
            Path::new("/sys/fs/cgroup/pod1/cgroup.threads")
        );
        assert_eq!(h.own_threads("0::/system.slice/x\n"), None);
        assert_eq!(h.own_threads("8:pids:/a\n"), None);
    }

    #[test]
    fn escaped_mount_points_are_unescaped() {
        let h = pick_hierarchy("40 30 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n").unwrap();
        assert_eq!(h.mount_point, Path::new("/mnt/cg two"));
        // Not an escape the kernel writes (over 255, or not octal): kept.
        assert_eq!(unescape("a\\777b\\08c\\04"), "a\\777b\\08c\\04");
    }

    /// On this host: the write lands in the thread list of the cgroup
    /// this thread is in, and leaves it there.
    #[test]
    fn priming_leaves_the_thread_in_its_cgroup() {
        let before = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
        let file = prime_now().expect("this host mounts a cgroup hierarchy");
        let tid = rustix::thread::gettid().as_raw_nonzero().to_string();
        let listed = std::fs::read_to_string(&file).unwrap();
        assert!(
            listed.lines().any(|p| p == tid),
            "{} does not list this thread {tid}",
            file.display()
        );
        assert_eq!(std::fs::read_to_string("/proc/thread-self/cgroup").unwrap(), before);
    }
}
