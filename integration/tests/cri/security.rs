//! The CRI lane's security context and pod-level settings: what kubelet
//! sets from a pod's `securityContext`, `dnsConfig`, `hostIPC` and sysctls.
//! Each behaviour is observed from inside the container, in the init (its
//! CRI log) and in an ExecSync, for runc and nri-shim on the same input;
//! nri-shim's view must be what Kubernetes documents for the setting, and
//! runc's is reported next to it (`integration::parity`).

use std::collections::HashMap;

use super::{NS, both, log_with, pod, running};
use integration::{
    cri::{Cri, api, container},
    parity::{expect_lines, expect_value},
};

/// What `probe` prints in the init (CRI log lines, sorted) and in an exec,
/// for a container `cc` whose command is replaced by the probe; the pod is
/// edited by `pf`. The init ends its output with `END`.
async fn observe(
    cri: &Cri,
    h: &'static str,
    test: &str,
    pf: impl FnOnce(&mut api::PodSandboxConfig),
    mut cc: api::ContainerConfig,
    probe: &str,
) -> (Vec<String>, String) {
    let (mut c, pod, cfg) = pod(cri, test, NS, h, pf).await;
    cc.command = ["sh", "-c", &format!("{probe}; echo END; echo END >&2; sleep 1000")]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let id = running(&mut c, &pod, &cfg, cc).await;
    // stdout and stderr reach the log by separate copies (in runc's shim
    // too): each stream's marker says that stream is complete.
    let mut init = log_with(&cfg, "c", &["stdout F END", "stderr F END"]).await;
    init.retain(|l| l != "stderr F END");
    let exec = c.sh(&id, &format!("{{ {probe}; }} 2>&1")).await;
    c.remove_pod(&pod).await;
    (init, exec)
}

/// A container named `c` whose security context `f` edits.
fn secured(f: impl FnOnce(&mut api::LinuxContainerSecurityContext)) -> api::ContainerConfig {
    let mut cc = container("c", &[]);
    f(cc.linux.as_mut().unwrap().security_context.as_mut().unwrap());
    cc
}

/// Judges both handlers' (init, exec) views by the contract: `out` and
/// `err` are the probe's stdout and stderr lines (patterns, see
/// `integration::parity::line_matches`); the init's CRI log has them with
/// its stream's prefix, sorted, with the `END` marker; the exec has them
/// as the probe printed them (`exec`, stderr merged in its place).
fn expect_both(
    what: &str,
    out: &[&str],
    err: &[&str],
    exec: &[&str],
    runc: &(Vec<String>, String),
    nri: &(Vec<String>, String),
) {
    let mut init: Vec<String> = out.iter().map(|l| format!("stdout F {l}")).collect();
    init.extend(err.iter().map(|l| format!("stderr F {l}")));
    init.push("stdout F END".to_string());
    init.sort();
    expect_lines(&format!("{what}, init"), &init, &runc.0, &nri.0);
    let lines = |o: &String| o.lines().map(str::to_string).collect::<Vec<_>>();
    expect_lines(&format!("{what}, exec"), exec, &lines(&runc.1), &lines(&nri.1));
}

/// `runAsUser`, `runAsGroup` and `supplementalGroups`: the init and every
/// exec run with exactly these ids.
#[tokio::test]
async fn run_as_user_group_and_supplemental_groups() {
    let cri = super::shared();
    let cc = || {
        secured(|sc| {
            sc.run_as_user = Some(api::Int64Value { value: 1000 });
            sc.run_as_group = Some(api::Int64Value { value: 2000 });
            sc.supplemental_groups = vec![3000, 4000];
        })
    };
    let (runc, nri) = both(|h| observe(cri, h, "run-as", |_| {}, cc(), "id")).await;
    // The primary group is also in the list; the image adds none.
    let id = "uid=1000 gid=2000 groups=2000,3000,4000";
    expect_both(
        "runAsUser/runAsGroup/supplementalGroups",
        &[id],
        &[],
        &[id],
        &runc,
        &nri,
    );
}

/// `allowPrivilegeEscalation: false` is `noNewPrivs`; the default leaves it off.
#[tokio::test]
async fn no_new_privs_in_init_and_exec() {
    let cri = super::shared();
    for (nnp, want) in [(true, "1"), (false, "0")] {
        let probe = "grep NoNewPrivs /proc/self/status";
        let cc = || secured(|sc| sc.no_new_privs = nnp);
        let test = format!("nnp-{nnp}");
        let (runc, nri) = both(|h| observe(cri, h, &test, |_| {}, cc(), probe)).await;
        let line = format!("NoNewPrivs:\t{want}");
        expect_both(&format!("no_new_privs = {nnp}"), &[&line], &[], &[&line], &runc, &nri);
    }
}

/// Capabilities added and dropped: the five capability sets of the init
/// and of an exec.
#[tokio::test]
async fn capabilities_add_and_drop() {
    let cri = super::shared();
    let cc = || {
        secured(|sc| {
            sc.capabilities = Some(api::Capability {
                add_capabilities: vec!["NET_ADMIN".into(), "SYS_TIME".into()],
                drop_capabilities: vec!["CHOWN".into(), "KILL".into()],
                ..Default::default()
            })
        })
    };
    let probe = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status";
    let (runc, nri) = both(|h| observe(cri, h, "caps", |_| {}, cc(), probe)).await;
    // containerd's default set for CRI containers (CHOWN 0, DAC_OVERRIDE
    // 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7, SETPCAP 8,
    // NET_BIND_SERVICE 10, NET_RAW 13, SYS_CHROOT 18, MKNOD 27,
    // AUDIT_WRITE 29, SETFCAP 31), less the dropped, plus the added
    // (NET_ADMIN 12, SYS_TIME 25): bounding, permitted and effective.
    let mut set = [0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31]
        .iter()
        .fold(0u64, |m, b| m | 1 << b);
    set &= !(1 | 1 << 5);
    set |= 1 << 12 | 1 << 25;
    let (bnd, eff, prm) = (
        format!("CapBnd:\t{set:016x}"),
        format!("CapEff:\t{set:016x}"),
        format!("CapPrm:\t{set:016x}"),
    );
    let (amb, inh) = ("CapAmb:\t0000000000000000", "CapInh:\t0000000000000000");
    expect_both(
        "capabilities add NET_ADMIN,SYS_TIME drop CHOWN,KILL",
        &[amb, &bnd, &eff, inh, &prm],
        &[],
        &[inh, &prm, &eff, &bnd, amb],
        &runc,
        &nri,
    );
}

/// `readOnlyRootFilesystem`: writes to `/` fail; the root mount is `ro`.
#[tokio::test]
async fn read_only_rootfs() {
    let cri = super::shared();
    let probe = "touch /probe; echo write=$?; awk '$5 == \"/\" {print $6}' /proc/self/mountinfo";
    let cc = || secured(|sc| sc.readonly_rootfs = true);
    let (runc, nri) = both(|h| observe(cri, h, "ro-rootfs", |_| {}, cc(), probe)).await;
    let denied = "touch: /probe: Read-only file system";
    expect_both(
        "readonly_rootfs",
        &["write=1", "ro,{*}"],
        &[denied],
        &[denied, "write=1", "ro,{*}"],
        &runc,
        &nri,
    );
}

/// The masked and read-only paths kubelet sends for `procMount: Default`.
const KUBELET_MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
const KUBELET_READONLY: &[&str] = &[
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Masked and read-only paths: kubelet's lists for `procMount: Default`
/// (paths this kernel lacks are skipped) and empty lists (containerd's
/// CRI then masks nothing): which paths under /proc and /sys are mounts,
/// with which options and filesystem, and whether a masked file reads
/// empty and /proc/sys takes a write.
#[tokio::test]
async fn masked_and_read_only_paths() {
    let cri = super::shared();
    // Mount point, per-mount options and filesystem type of every mount
    // under /proc and /sys, in mount order.
    let probe = "awk '$5 ~ \"^/(proc|sys)\" { for (i = 7; i <= NF; i++) if ($i == \"-\") { print $5, $6, $(i+1); break } }' /proc/self/mountinfo; [ -z \"$(cat /proc/keys)\" ] && echo keys=empty || echo keys=listed; echo 1 > /proc/sys/kernel/domainname; echo sysctl-write=$?";
    let cc = || {
        secured(|sc| {
            sc.masked_paths = KUBELET_MASKED.iter().map(|s| s.to_string()).collect();
            sc.readonly_paths = KUBELET_READONLY.iter().map(|s| s.to_string()).collect();
        })
    };
    let (runc, nri) = both(|h| observe(cri, h, "masked-kubelet", |_| {}, cc(), probe)).await;
    // The mounts under /proc and /sys in mount order: proc and sysfs, the
    // read-only paths bound read-only onto themselves, then the masked
    // ones (a directory under an empty read-only tmpfs, a file under the
    // container's /dev/null); paths this kernel lacks are skipped. (The
    // cgroup mounts, which depend on the host's hierarchy, are left out
    // here: shim/tests/runc_parity.rs checks them.)
    let exists = |p: &&&str| std::path::Path::new(p).exists();
    let mut mounts = vec![
        "/proc rw,nosuid,nodev,noexec,relatime proc".to_string(),
        "/sys ro,nosuid,nodev,noexec,relatime sysfs".to_string(),
    ];
    mounts.extend(
        KUBELET_READONLY
            .iter()
            .filter(exists)
            .map(|p| format!("{p} ro,{{*}} proc")),
    );
    mounts.extend(KUBELET_MASKED.iter().filter(exists).map(|p| {
        if std::path::Path::new(p).is_dir() {
            format!("{p} ro,{{*}} tmpfs")
        } else {
            format!("{p} {{*}}")
        }
    }));
    let denied = "sh: can't create /proc/sys/kernel/domainname: Read-only file system";
    let mut out: Vec<String> = mounts.clone();
    out.extend(["keys=empty".to_string(), "sysctl-write=1".to_string()]);
    let mut exec = mounts;
    exec.extend([
        "keys=empty".to_string(),
        denied.to_string(),
        "sysctl-write=1".to_string(),
    ]);
    expect_both(
        "kubelet's masked and read-only paths",
        &out.iter().map(String::as_str).collect::<Vec<_>>(),
        &[denied],
        &exec.iter().map(String::as_str).collect::<Vec<_>>(),
        &without_cgroups(runc),
        &without_cgroups(nri),
    );

    let (runc, nri) = both(|h| observe(cri, h, "masked-none", |_| {}, secured(|_| {}), probe)).await;
    let plain = [
        "/proc rw,nosuid,nodev,noexec,relatime proc",
        "/sys ro,nosuid,nodev,noexec,relatime sysfs",
        "keys=listed",
        "sysctl-write=0",
    ];
    expect_both(
        "no masked or read-only paths",
        &plain,
        &[],
        &plain,
        &without_cgroups(runc),
        &without_cgroups(nri),
    );
}

/// An (init, exec) view without the lines of the cgroup mounts.
fn without_cgroups((init, exec): (Vec<String>, String)) -> (Vec<String>, String) {
    let cgroup = |l: &str| l.trim_start_matches("stdout F ").starts_with("/sys/fs/cgroup");
    (
        init.into_iter().filter(|l| !cgroup(l)).collect(),
        exec.lines().filter(|l| !cgroup(l)).map(|l| format!("{l}\n")).collect(),
    )
}

/// Namespaced sysctls of the pod are set in every container.
#[tokio::test]
async fn pod_sysctls() {
    let cri = super::shared();
    let set = |p: &mut api::PodSandboxConfig| {
        p.linux.as_mut().unwrap().sysctls = HashMap::from([
            ("kernel.shm_rmid_forced".to_string(), "1".to_string()),
            ("net.ipv4.ip_unprivileged_port_start".to_string(), "1001".to_string()),
        ]);
    };
    let probe = "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/net/ipv4/ip_unprivileged_port_start";
    let (runc, nri) = both(|h| observe(cri, h, "sysctls", set, secured(|_| {}), probe)).await;
    expect_both("pod sysctls", &["1", "1001"], &[], &["1", "1001"], &runc, &nri);
}

/// The pod's DNS config becomes the container's /etc/resolv.conf.
#[tokio::test]
async fn dns_config_is_the_containers_resolv_conf() {
    let cri = super::shared();
    let set = |p: &mut api::PodSandboxConfig| {
        p.dns_config = Some(api::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        });
    };
    let (runc, nri) = both(|h| observe(cri, h, "dns", set, secured(|_| {}), "cat /etc/resolv.conf")).await;
    let resolv = [
        "search default.svc.cluster.local svc.cluster.local",
        "nameserver 10.96.0.10",
        "options ndots:5",
    ];
    expect_both("dns_config", &resolv, &[], &resolv, &runc, &nri);
}

/// `hostIPC`: the container is in the host's IPC namespace; without it, in
/// the pod's own.
#[tokio::test]
async fn host_ipc_and_pod_ipc() {
    let cri = super::shared();
    let host = std::fs::read_link("/proc/self/ns/ipc").unwrap();
    let host = host.to_string_lossy().into_owned();
    for (mode, want) in [(api::NamespaceMode::Node, true), (api::NamespaceMode::Pod, false)] {
        let set = move |p: &mut api::PodSandboxConfig| {
            let sc = p.linux.as_mut().unwrap().security_context.as_mut().unwrap();
            sc.namespace_options.as_mut().unwrap().ipc = mode as i32;
        };
        let probe = format!("[ \"$(readlink /proc/self/ns/ipc)\" = '{host}' ] && echo host-ipc || echo own-ipc");
        let test = format!("ipc-{}", format!("{mode:?}").to_lowercase());
        let (runc, nri) = both(|h| observe(cri, h, &test, set, secured(|_| {}), &probe)).await;
        let ipc = if want { "host-ipc" } else { "own-ipc" };
        expect_both(
            &format!("namespace_options.ipc = {mode:?}"),
            &[ipc],
            &[],
            &[ipc],
            &runc,
            &nri,
        );
    }
}

/// A `Localhost` seccomp profile (a file on the node) confines the init and
/// every exec, with its errno.
#[tokio::test]
async fn seccomp_localhost_profile_confines_init_and_exec() {
    let cri = super::shared();
    let dir = cri.dir.join("seccomp");
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("deny-mkdir.json");
    // EACCES (13) for mkdir/mkdirat, everything else allowed.
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO","errnoRet":13}]}"#,
    )
    .unwrap();
    let cc = || {
        secured(|sc| {
            sc.seccomp = Some(api::SecurityProfile {
                profile_type: api::security_profile::ProfileType::Localhost as i32,
                localhost_ref: profile.display().to_string(),
            })
        })
    };
    let probe = "grep Seccomp: /proc/self/status; mkdir /tmp/probe-dir; echo mkdir=$?";
    let (runc, nri) = both(|h| observe(cri, h, "seccomp-localhost", |_| {}, cc(), probe)).await;
    // The profile's errno, EACCES: "Permission denied".
    let denied = "mkdir: can't create directory '/tmp/probe-dir': Permission denied";
    expect_both(
        "seccomp Localhost profile",
        &["Seccomp:\t2", "mkdir=1"],
        &[denied],
        &["Seccomp:\t2", denied, "mkdir=1"],
        &runc,
        &nri,
    );
}

/// Runs `mount` with `args` on the host; panics with its stderr on failure.
fn host_mount(args: &[&str]) {
    let out = std::process::Command::new("mount")
        .args(args)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the host's mount table has a mount at `path`.
fn host_has_mount(path: &std::path::Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.display().to_string();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// A volume's mount propagation (CRI's `PROPAGATION_*`, Kubernetes'
/// `mountPropagation`) in a privileged container: (a mount made on the host
/// under the volume after the start is seen in the container, a mount made
/// in the container under the volume is seen on the host).
async fn propagation(cri: &Cri, h: &'static str, mode: api::MountPropagation) -> (bool, bool) {
    let vol = cri.dir.join(format!("propagation-{h}-{mode:?}"));
    std::fs::create_dir_all(&vol).unwrap();
    // A shared mount of its own, as kubelet's volume directories are (CRI
    // refuses HostToContainer and Bidirectional on a private mount).
    let v = vol.display().to_string();
    host_mount(&["--bind", &v, &v]);
    host_mount(&["--make-rshared", &v]);
    let test = format!("propagation-{}", format!("{mode:?}").to_lowercase());
    let (mut c, pod, cfg) = pod(cri, &test, NS, h, |p| {
        p.linux.as_mut().unwrap().security_context.as_mut().unwrap().privileged = true;
    })
    .await;
    let mut cc = secured(|sc| sc.privileged = true);
    cc.command = vec!["sleep".into(), "1000".into()];
    cc.mounts = vec![api::Mount {
        container_path: "/mnt/vol".into(),
        host_path: v.clone(),
        propagation: mode as i32,
        ..Default::default()
    }];
    let id = running(&mut c, &pod, &cfg, cc).await;
    std::fs::create_dir_all(vol.join("from-host")).unwrap();
    host_mount(&["-t", "tmpfs", "from-host", &vol.join("from-host").display().to_string()]);
    // An exec that does not answer (once in a whole test run beside a busy
    // loop on each core: no answer in 60 s) fails with both daemons' logs.
    let mut sh = async |script: &str| match c.exec(&id, &["sh", "-c", script], 10).await {
        Ok(r) => String::from_utf8_lossy(&r.stdout).into_owned(),
        Err(e) => panic!("{h}: ExecSync {script:?} in {id}: {e}\n{}", cri.logs_tail(80)),
    };
    let seen_in = sh("grep -c ' /mnt/vol/from-host ' /proc/self/mountinfo").await.trim() != "0";
    sh("mkdir -p /mnt/vol/from-container && mount -t tmpfs from-container /mnt/vol/from-container").await;
    let seen_on_host = host_has_mount(&vol.join("from-container"));
    c.remove_pod(&pod).await;
    let _ = std::process::Command::new("umount").args(["-R", &v]).status();
    (seen_in, seen_on_host)
}

#[tokio::test]
async fn volume_mount_propagation() {
    use api::MountPropagation::{PropagationBidirectional, PropagationHostToContainer, PropagationPrivate};
    let cri = super::shared();
    for (mode, want) in [
        (PropagationPrivate, (false, false)),
        (PropagationHostToContainer, (true, false)),
        (PropagationBidirectional, (true, true)),
    ] {
        let (runc, nri) = both(|h| propagation(cri, h, mode)).await;
        expect_value(
            &format!("{mode:?}: (host mount seen in the container, container mount seen on the host)"),
            &want,
            &runc,
            &nri,
        );
    }
}
