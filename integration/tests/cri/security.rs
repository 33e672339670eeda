//! The CRI lane's security context and pod-level settings: what kubelet
//! sets from a pod's `securityContext`, `dnsConfig`, `hostIPC` and sysctls.
//! Each behaviour is observed from inside the container, in the init (its
//! CRI log) and in an ExecSync, for runc and nri-shim on the same input;
//! nri-shim's view must equal runc's, and runc's must be what Kubernetes
//! documents for the setting.

use std::collections::HashMap;

use super::{NS, both, log_with, pod, running, same};
use integration::cri::{Cri, api, container};

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

/// Asserts nri-shim's (init, exec) view equals runc's; returns runc's.
fn both_same(what: &str, runc: (Vec<String>, String), nri: (Vec<String>, String)) -> (Vec<String>, String) {
    same(&format!("{what}, init"), &runc.0, &nri.0);
    same(&format!("{what}, exec"), &runc.1, &nri.1);
    runc
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
    let runc = both_same("runAsUser/runAsGroup/supplementalGroups", runc, nri);
    let id = runc.1.trim();
    assert!(
        id.starts_with("uid=1000 gid=2000 groups=") && id.contains("3000") && id.contains("4000"),
        "runc: {id:?}"
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
        let runc = both_same(&format!("no_new_privs = {nnp}"), runc, nri);
        assert_eq!(runc.1, format!("NoNewPrivs:\t{want}\n"));
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
    let runc = both_same("capabilities add NET_ADMIN,SYS_TIME drop CHOWN,KILL", runc, nri);
    let eff = runc
        .1
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:\t"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .expect("CapEff");
    // Bits: CHOWN 0, KILL 5, NET_ADMIN 12, SYS_TIME 25.
    assert_eq!(eff & 1, 0, "CHOWN dropped");
    assert_eq!(eff & (1 << 5), 0, "KILL dropped");
    assert_ne!(eff & (1 << 12), 0, "NET_ADMIN added");
    assert_ne!(eff & (1 << 25), 0, "SYS_TIME added");
}

/// `readOnlyRootFilesystem`: writes to `/` fail; the root mount is `ro`.
#[tokio::test]
async fn read_only_rootfs() {
    let cri = super::shared();
    let probe = "touch /probe; echo write=$?; awk '$5 == \"/\" {print $6}' /proc/self/mountinfo";
    let cc = || secured(|sc| sc.readonly_rootfs = true);
    let (runc, nri) = both(|h| observe(cri, h, "ro-rootfs", |_| {}, cc(), probe)).await;
    let runc = both_same("readonly_rootfs", runc, nri);
    assert!(runc.1.contains("write=1"), "{:?}", runc.1);
    assert!(runc.1.lines().last().unwrap().starts_with("ro"), "{:?}", runc.1);
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
    let runc = both_same("kubelet's masked and read-only paths", runc, nri);
    for want in [
        "/proc/keys ",
        "/proc/timer_list ",
        "/proc/acpi ",
        "/sys/firmware ",
        "/proc/sys ro,",
        "/proc/bus ro,",
    ] {
        assert!(runc.1.contains(want), "{want:?} in {:?}", runc.1);
    }
    assert!(runc.1.contains("keys=empty"), "/proc/keys masked: {:?}", runc.1);
    assert!(runc.1.contains("sysctl-write=1"), "/proc/sys read-only: {:?}", runc.1);

    let (runc, nri) = both(|h| observe(cri, h, "masked-none", |_| {}, secured(|_| {}), probe)).await;
    let runc = both_same("no masked or read-only paths", runc, nri);
    assert!(!runc.1.contains("/proc/keys "), "{:?}", runc.1);
    assert!(runc.1.contains("keys=listed"), "{:?}", runc.1);
    assert!(runc.1.contains("sysctl-write=0"), "{:?}", runc.1);
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
    let runc = both_same("pod sysctls", runc, nri);
    assert_eq!(runc.1, "1\n1001\n");
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
    let runc = both_same("dns_config", runc, nri);
    for want in [
        "nameserver 10.96.0.10",
        "search default.svc.cluster.local svc.cluster.local",
        "options ndots:5",
    ] {
        assert!(runc.1.lines().any(|l| l == want), "{want:?} in {:?}", runc.1);
    }
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
        let runc = both_same(&format!("namespace_options.ipc = {mode:?}"), runc, nri);
        assert_eq!(runc.1.trim(), if want { "host-ipc" } else { "own-ipc" });
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
    let runc = both_same("seccomp Localhost profile", runc, nri);
    assert!(runc.1.contains("Seccomp:\t2"), "{:?}", runc.1);
    assert!(
        runc.1.contains("Permission denied") && runc.1.contains("mkdir=1"),
        "{:?}",
        runc.1
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
    let seen_in = c
        .sh(&id, "grep -c ' /mnt/vol/from-host ' /proc/self/mountinfo")
        .await
        .trim()
        != "0";
    c.sh(
        &id,
        "mkdir -p /mnt/vol/from-container && mount -t tmpfs from-container /mnt/vol/from-container",
    )
    .await;
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
        same(
            &format!("{mode:?}: (host mount seen in the container, container mount seen on the host)"),
            &runc,
            &nri,
        );
        assert_eq!(runc, want, "runc with {mode:?}");
    }
}
