//! libcgroups patch 4 (`patches/libcgroups/PATCHES.md`): a cgroup v1
//! manager resolves every subsystem from one read of
//! `/proc/self/mountinfo`, to the same mount points as the per-subsystem
//! reads did. On a node the mount table grows with every container (its
//! overlay, shm and netns mounts), and each read the kernel renders whole;
//! the shim builds managers at every create and delete, and containerd runs
//! its `delete` action after each task delete, which built three.
//!
//!
//! Patch 5: the process keeps the cgroup mounts it read, so a second
//! manager, a process put into the cgroup and the list of v1 hierarchies
//! read no mount table at all.
//!
//! Root only (it mounts, in a mount namespace of its own).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use libcgroups::{
    common::CgroupManager,
    v1::{ControllerType, Manager, util},
};

const ALL: [ControllerType; 12] = [
    ControllerType::Cpu,
    ControllerType::CpuAcct,
    ControllerType::CpuSet,
    ControllerType::Devices,
    ControllerType::HugeTlb,
    ControllerType::Pids,
    ControllerType::PerfEvent,
    ControllerType::Memory,
    ControllerType::Blkio,
    ControllerType::NetworkPriority,
    ControllerType::NetworkClassifier,
    ControllerType::Freezer,
];

/// Set for the child test, which runs in a mount namespace of its own.
const CHILD: &str = "NRI_SHIM_TEST_PRIVATE_MOUNTS";

/// Bytes this process has read so far (`rchar` of `/proc/self/io`).
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar in /proc/self/io")
}

/// `f`'s result and the bytes this process read while it ran.
fn reading<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = bytes_read();
    let r = f();
    (r, bytes_read() - before)
}

/// This host's cgroup mounts as the test reads `/proc/self/mountinfo`
/// itself: (mount point, file system type, super options).
fn host_cgroup_mounts() -> Vec<(PathBuf, String, Vec<String>)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    table
        .lines()
        .filter_map(|l| {
            let (mount, fs) = l.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            let mut fs = fs.split(' ');
            let (kind, _source, options) = (fs.next()?, fs.next()?, fs.next()?);
            kind.starts_with("cgroup").then(|| {
                (
                    PathBuf::from(point),
                    kind.to_string(),
                    options.split(',').map(str::to_string).collect(),
                )
            })
        })
        .collect()
}

#[test]
fn each_subsystem_resolves_to_the_mount_that_carries_it() {
    let host = host_cgroup_mounts();
    let mounts = util::cgroup_mounts().expect("cgroup mounts");
    let mut resolved = 0;
    for c in ALL {
        // The v1 hierarchy whose super options name the controller.
        let carrier = host
            .iter()
            .find(|(_, kind, options)| kind == "cgroup" && options.contains(&c.to_string()))
            .map(|(point, _, _)| point.clone());
        assert_eq!(
            util::find_subsystem_mount_point(mounts, &c).ok(),
            carrier,
            "mount point of {c}"
        );
        resolved += usize::from(carrier.is_some());
    }
    assert!(resolved > 0, "no cgroup v1 controller mounted here: {host:?}");
    // Named v1 hierarchies with no controller, and cgroup v2 beside v1.
    let bare: Vec<PathBuf> = host
        .iter()
        .filter(|(_, kind, options)| {
            kind == "cgroup2"
                || (options.iter().any(|o| o.starts_with("name="))
                    && !options.iter().any(|o| ALL.iter().any(|c| c.to_string() == *o)))
        })
        .map(|(point, _, _)| point.clone())
        .collect();
    assert_eq!(util::hierarchies_without_controllers(mounts), bare);
    // Every cgroup v1 hierarchy, in the table's order.
    let v1: Vec<PathBuf> = host
        .iter()
        .filter(|(_, kind, _)| kind == "cgroup")
        .map(|(point, _, _)| point.clone())
        .collect();
    assert_eq!(util::list_subsystem_mount_points().expect("v1 mount points"), v1);
}

/// The child's part of the test below: run by it in a mount namespace of
/// its own (ignored when run directly).
#[test]
#[ignore = "run by a_manager_reads_the_mount_table_once, in a mount namespace of its own"]
fn manager_reads_in_a_large_mount_table() {
    // Its 400 mounts must not land in the host's mount namespace.
    assert_eq!(
        std::env::var(CHILD).as_deref(),
        Ok("1"),
        "run only by a_manager_reads_the_mount_table_once (it mounts)"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    // A node-sized mount table: 400 more entries.
    for _ in 0..400 {
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=4k,mode=0755"),
        )
        .expect("mount a tmpfs");
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .len() as u64;
    let (manager, read) = reading(|| Manager::new(Path::new("nri-shim-test/mountinfo")));
    assert!(manager.is_ok(), "{:?}", manager.err());
    println!("mount table {table} bytes; Manager::new read {read} bytes");
    // One read of the table, /proc/self/cgroup and the first rchar read;
    // per-subsystem reads cost a whole table for each subsystem mounted
    // nowhere and one for the hierarchies without controllers.
    assert!(
        read < 2 * table,
        "Manager::new read {read} bytes, more than one mount table ({table} bytes) and a little"
    );
    // Patch 5: the process keeps what it read. A second manager (the
    // daemon's at a container's exit and delete) reads /proc/self/cgroup,
    // not the table.
    let (again, read_again) = reading(|| Manager::new(Path::new("nri-shim-test/mountinfo-again")));
    assert!(again.is_ok(), "{:?}", again.err());
    println!("a second Manager::new read {read_again} bytes");
    assert!(
        read_again < table / 4,
        "a second Manager::new read {read_again} bytes of a {table}-byte mount table"
    );
    // Nor does putting a process into the cgroup (libcontainer's
    // intermediate process does it at every create): the cpuset
    // controller finds its mount among the kept mounts to fill in
    // cpuset.cpus and cpuset.mems, where it read the table for each.
    let path = format!("nri-shim-test/mountinfo-{}", std::process::id());
    let manager = Manager::new(Path::new(&path)).expect("manager");
    let mut child = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let (added, read_add) = reading(|| manager.add_task(nix::unistd::Pid::from_raw(child.id() as i32)));
    let removed = manager.remove();
    let _ = child.kill();
    let _ = child.wait();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").expect("/sys/fs/cgroup").flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join("nri-shim-test"));
    }
    assert!(added.is_ok(), "add_task: {:?}", added.err());
    assert!(removed.is_ok(), "remove: {:?}", removed.err());
    println!("add_task read {read_add} bytes");
    // The cpuset mount comes early in the table, so each of those reads
    // stopped after a page or two of it (8 KB); the files it fills are a
    // few hundred bytes.
    assert!(
        read_add < 4096,
        "add_task read {read_add} bytes of a {table}-byte mount table"
    );
    // Nor listing the v1 hierarchies (a container's init that mounts
    // them, a process forked after its parent's read).
    let (listed, read_list) = reading(util::list_subsystem_mount_points);
    assert!(listed.is_ok_and(|l| !l.is_empty()), "no v1 hierarchy listed");
    println!("list_subsystem_mount_points read {read_list} bytes");
    assert!(
        read_list < 4096,
        "list_subsystem_mount_points read {read_list} bytes of a {table}-byte mount table"
    );
}

#[test]
fn a_manager_reads_the_mount_table_once() {
    let me = std::env::current_exe().expect("test binary");
    let out = Command::new("unshare")
        .env(CHILD, "1")
        .args(["--mount", "--propagation", "private"])
        .arg(&me)
        .args([
            "--exact",
            "manager_reads_in_a_large_mount_table",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .expect("run unshare (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    println!("{text}");
}
