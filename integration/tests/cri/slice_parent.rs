//! Issue 32 item 1: a pod whose `cgroup_parent` is a systemd slice, on
//! handlers of the cgroupfs driver (no `SystemdCgroup`). containerd's CRI
//! makes every `.slice` parent a `slice:prefix:name` cgroupsPath, whatever
//! the handler's driver (a node whose kubelet uses the systemd driver and
//! containerd the cgroupfs one; a CRI client of containerd 1.x, which
//! cannot ask for the driver and assumes systemd). runc's cgroupfs driver
//! takes it for a directory of that literal name under its own cgroup, and
//! the pod runs; so must nri-shim's, with stats, updates, OOM kills and
//! the delete working on that cgroup, and one warning per pod naming the
//! likely driver mismatch.

use std::time::Duration;

use super::{NS, both, pod, running, sleeper};
use integration::{
    cri::{Cri, api, container},
    parity::expect_lines,
};

/// The memory cgroup of the container's init, from `/proc/<pid>/cgroup`
/// (v1: the memory controller's line; v2: the `0::` line).
fn memory_cgroup(cri: &Cri, id: &str) -> String {
    let tasks = cri.ctr(&["-n", "k8s.io", "t", "ls"]);
    let pid = String::from_utf8_lossy(&tasks.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| panic!("task {id} not in `ctr t ls`"));
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v2 = integration::cgroup::v2();
    text.lines()
        .find(|l| {
            if v2 {
                l.starts_with("0::")
            } else {
                l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory"))
            }
        })
        .and_then(|l| l.splitn(3, ':').nth(2))
        .unwrap_or_default()
        .to_string()
}

/// A file of the memory controller in the cgroup at `path`.
fn memory_file(path: &str, v1: &str, v2: &str) -> std::path::PathBuf {
    let rel = path.trim_start_matches('/');
    if integration::cgroup::v2() {
        std::path::Path::new("/sys/fs/cgroup").join(rel).join(v2)
    } else {
        std::path::Path::new("/sys/fs/cgroup/memory").join(rel).join(v1)
    }
}

async fn slice_parent(cri: &Cri, h: &'static str) -> Vec<String> {
    let slice = format!("nri-lane-{}-{h}.slice", std::process::id());
    let (mut c, pod, cfg) = pod(cri, "slice-parent", NS, h, |p| {
        p.linux.as_mut().unwrap().cgroup_parent = slice.clone();
    })
    .await;
    let mut obs = Vec::new();
    let mut cc = sleeper("c");
    cc.linux.as_mut().unwrap().resources = Some(api::LinuxContainerResources {
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    });
    let id = running(&mut c, &pod, &cfg, cc).await;
    let cgroup = memory_cgroup(cri, &id);
    obs.push(format!(
        "container cgroup: {}",
        cgroup.replace(&slice, "<slice>").replace(&id, "<id>")
    ));
    let limit = memory_file(&cgroup, "memory.limit_in_bytes", "memory.max");
    let read = || {
        std::fs::read_to_string(&limit)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    obs.push(format!("memory limit: {}", read()));
    let s =
        c.rt.container_stats(api::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .unwrap_or_default();
    obs.push(format!(
        "ContainerStats working set nonzero: {}",
        s.memory.and_then(|m| m.working_set_bytes).is_some_and(|v| v.value > 0)
    ));
    c.rt.update_container_resources(api::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(api::LinuxContainerResources {
            memory_limit_in_bytes: 128 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    obs.push(format!("memory limit after the update: {}", read()));
    // An OOM kill in such a cgroup is seen as one.
    let mut oom = container("oom", &["tail", "/dev/zero"]);
    oom.linux.as_mut().unwrap().resources = Some(api::LinuxContainerResources {
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    let oom_id = c.create_start(&pod, &cfg, oom).await;
    let st = c
        .wait_state(&oom_id, api::ContainerState::ContainerExited, Duration::from_secs(60))
        .await;
    obs.push(format!("OOM: exit_code={} reason={}", st.exit_code, st.reason));
    let dir = limit.parent().unwrap().to_path_buf();
    c.remove_pod(&pod).await;
    obs.push(format!(
        "container cgroup left after the pod's removal: {}",
        dir.exists()
    ));
    obs
}

#[tokio::test]
async fn a_slice_cgroup_parent_on_the_cgroupfs_driver_runs_as_with_runc() {
    let cri = super::shared();
    let (runc, nri) = both(|h| slice_parent(cri, h)).await;
    let contract = [
        // A directory of the literal name, under the runtime's own cgroup.
        "container cgroup: {*}/<slice>:cri-containerd:<id>",
        "memory limit: 268435456",
        "ContainerStats working set nonzero: true",
        "memory limit after the update: 134217728",
        "OOM: exit_code=137 reason=OOMKilled",
        "container cgroup left after the pod's removal: false",
    ];
    expect_lines("a .slice cgroup parent without SystemdCgroup", &contract, &runc, &nri);
    // One warning per pod (the sandbox's), naming the likely mismatch.
    let log = cri.shim_log();
    let warned = log
        .lines()
        .filter(|l| {
            l.contains("kubelet and containerd likely disagree on the cgroup driver") && l.contains("slice-parent")
        })
        .count();
    assert_eq!(warned, 1, "warnings about the driver mismatch for the pod:\n{log}");
}
