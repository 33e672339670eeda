//! Issue 32 item 2: user-namespaced pods (KEP-127, a pod with
//! `hostUsers: false`) through CRI. The kubelet sends the pod's
//! `userns_options` (mode POD, one uid and one gid range) and puts the same
//! mappings on each volume; containerd 2.x makes and pins the pod's user
//! namespace, gives every container its path and the mappings, hands the
//! rootfs with `uidmap=`/`gidmap=` options (its overlay snapshotter does not
//! chown the image) and asks the runtime's `-info` for idmapped mounts
//! before a container whose mounts have mappings.
//!
//! runc 1.1.5 (Debian 12) makes no idmapped mounts, so containerd refuses
//! such containers for it: nri-shim is held to what the kernel and the
//! CRI contract say, and runc's answer is printed next to it.

use super::{NS, log_with};
use integration::{
    cri::{AS_RUNC, Cri, api, container},
    parity::expect_lines,
};

/// Host id of the pod's container root, and the range size (the kubelet
/// gives each pod 65536 ids at a multiple of 65536).
const HOST_ID: u32 = 0x30000;
const SIZE: u32 = 65536;

fn mapping() -> Vec<api::IdMapping> {
    vec![api::IdMapping {
        host_id: HOST_ID,
        container_id: 0,
        length: SIZE,
    }]
}

/// What a container of a user-namespaced pod of `handler` sees: its id
/// maps, the owners of its root, of a volume (a root-only host directory,
/// 0700, with a root-only file) and of the file, whether it can read the
/// file and create one; then the host's owner of the created file and
/// whether anything of the pod stayed mounted. Or CRI's refusal.
async fn userns_pod(cri: &Cri, h: &'static str, uids: Vec<api::IdMapping>) -> Vec<String> {
    let vol = cri.dir.join(format!("userns-{h}-{}", uids[0].container_id));
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("f"), "secret\n").unwrap();
    for (p, mode) in [(&vol, 0o700), (&vol.join("f"), 0o600)] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut c = cri.client().await;
    let cfg = cri.pod_config("userns", NS, h, |cfg| {
        let ns = cfg
            .linux
            .as_mut()
            .and_then(|l| l.security_context.as_mut())
            .and_then(|s| s.namespace_options.as_mut())
            .unwrap();
        ns.userns_options = Some(api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids: uids.clone(),
            gids: mapping(),
        });
    });
    let pod = match c
        .rt
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: h.into(),
        })
        .await
    {
        Ok(r) => r.into_inner().pod_sandbox_id,
        Err(e) => {
            let mut out = vec![format!("RunPodSandbox refused: {}", e.message())];
            out.push(left_mounted(cri));
            return out;
        }
    };
    let mut cc = container(
        "c",
        &[
            "sh",
            "-c",
            "cat /proc/self/uid_map /proc/self/gid_map | tr -s ' ' | sed 's/^ //'; \
             stat -c '%u:%g %n' / /v /v/f; cat /v/f; touch /v/c && echo created /v/c; \
             echo ns $(readlink /proc/self/ns/user); echo END; sleep 1000",
        ],
    );
    cc.mounts = vec![api::Mount {
        container_path: "/v".into(),
        host_path: vol.display().to_string(),
        uid_mappings: uids.clone(),
        gid_mappings: mapping(),
        ..Default::default()
    }];
    // The kubelet gives each container the pod's user namespace options,
    // as try_create does.
    let mut out = match c.try_create(&pod, &cfg, cc).await {
        Err(e) => vec![format!("CreateContainer refused: {}", e.message())],
        Ok(id) => 'started: {
            // containerd 2.x asks the runtime's -info for idmapped mounts
            // here, when it creates the task.
            if let Err(e) =
                c.rt.start_container(api::StartContainerRequest {
                    container_id: id.clone(),
                })
                .await
            {
                break 'started vec![format!("StartContainer refused: {}", e.message())];
            }
            let lines = log_with(&cfg, "c", &["END"]).await;
            // The pod's user namespace is its sandbox's (containerd's
            // verbose PodSandboxStatus gives the sandbox's pid).
            let status =
                c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
                    pod_sandbox_id: pod.clone(),
                    verbose: true,
                })
                .await
                .expect("PodSandboxStatus")
                .into_inner();
            let pid = status
                .info
                .get("info")
                .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
                .and_then(|i| i["pid"].as_u64())
                .expect("the sandbox's pid in the verbose status");
            let ns = |p: &str| {
                std::fs::read_link(p)
                    .map(|l| l.display().to_string())
                    .unwrap_or_default()
            };
            let (sandbox_ns, host_ns) = (ns(&format!("/proc/{pid}/ns/user")), ns("/proc/self/ns/user"));
            let mut out: Vec<String> = lines
                .iter()
                .map(|l| l.split_once(" F ").map_or(l.as_str(), |(_, t)| t).to_string())
                .filter(|l| l != "END")
                .map(|l| match l.strip_prefix("ns ") {
                    Some(n) if n == sandbox_ns && n != host_ns => "user namespace: the pod's".to_string(),
                    Some(n) if n == host_ns => "user namespace: the host's".to_string(),
                    Some(n) => format!("user namespace: {n}, not the pod's {sandbox_ns}"),
                    None => l,
                })
                .collect();
            // An exec (a kubelet probe) joins the container's user namespace.
            let exec = c
                .exec(&id, &["sh", "-c", "tr -s ' ' < /proc/self/uid_map | sed 's/^ //'"], 10)
                .await;
            out.push(match exec {
                Ok(r) => format!("exec: {}", String::from_utf8_lossy(&r.stdout).trim()),
                Err(e) => format!("exec refused: {}", e.message()),
            });
            use std::os::unix::fs::MetadataExt;
            out.push(match std::fs::metadata(vol.join("c")) {
                Ok(m) => format!("host: /v/c owned {}:{}", m.uid(), m.gid()),
                Err(e) => format!("host: /v/c: {e}"),
            });
            out
        }
    };
    c.remove_pod(&pod).await;
    out.push(left_mounted(cri));
    // The lines of the log come in the order containerd copies them.
    out.sort();
    out
}

/// The mounts of the lane's containerd root that nri-shim staged for a
/// user-namespaced container and did not take down.
fn left_mounted(cri: &Cri) -> String {
    let root = cri.dir.display().to_string();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = info
        .lines()
        .filter(|l| l.contains(&root) && (l.contains("nri-shim-mounts") || l.contains(".nri-shim-idmap")))
        .collect();
    format!("staged mounts left: {left:?}")
}

#[tokio::test]
async fn user_namespaced_pods() {
    let cri = super::shared();
    let map = format!("0 {HOST_ID} {SIZE}");
    let exec = format!("exec: {map}");
    let line = integration::containerd::containerd_line();
    // What containerd does with the pod decides the contract: 2.x runs it
    // in its own user namespace with idmapped layers and volumes; 1.7
    // refuses a volume with mappings itself; 1.6 does not know the pod's
    // user namespace options and runs it in the host's.
    let contract: Vec<String> = match line.as_str() {
        "1.6" => vec![
            "0 0 4294967295",
            "0 0 4294967295",
            "0:0 /",
            "0:0 /v",
            "0:0 /v/f",
            "created /v/c",
            "exec: 0 0 4294967295",
            "host: /v/c owned 0:0",
            "secret",
            "staged mounts left: []",
            "user namespace: the host's",
        ],
        "1.7" => vec![
            "CreateContainer refused: {*}idmap mounts not yet supported, but they were requested for{*}",
            "staged mounts left: []",
        ],
        _ => vec![
            map.as_str(),
            map.as_str(),
            "0:0 /",
            "0:0 /v",
            "0:0 /v/f",
            "created /v/c",
            exec.as_str(),
            "host: /v/c owned 0:0",
            "secret",
            "staged mounts left: []",
            "user namespace: the pod's",
        ],
    }
    .into_iter()
    .map(String::from)
    .collect();
    let handlers: &[&'static str] = if integration::containerd::containerd_major() >= 2 {
        &["nri-shim", AS_RUNC]
    } else {
        &["nri-shim"]
    };
    // One pod at a time: containerd 1.7 makes the pods' remapped snapshot
    // of the image once, and two pods at once race for it ("already
    // exists").
    for &h in handlers {
        let runc = userns_pod(cri, "runc", mapping()).await;
        let nri = userns_pod(cri, h, mapping()).await;
        expect_lines(
            &format!("a user-namespaced pod with an idmapped volume ({h}, containerd {line})"),
            &contract,
            &runc,
            &nri,
        );
    }
    if integration::containerd::containerd_major() < 2 {
        return;
    }
    // critest's "container id 0 not mapped" (uids 1:H:S): containerd makes
    // the pod's user namespace with that mapping and leaves the refusal to
    // the runtime, whose container root (id 0) has no host id there.
    let unmapped = vec![api::IdMapping {
        host_id: HOST_ID,
        container_id: 1,
        length: SIZE,
    }];
    let runc = userns_pod(cri, "runc", unmapped.clone()).await;
    let nri = userns_pod(cri, handlers[0], unmapped).await;
    expect_lines(
        "a user-namespaced pod whose container root is not mapped",
        &[
            "RunPodSandbox refused: {*}process.user.uid 0 has no host id in the container's user namespace{*}",
            "staged mounts left: []",
        ],
        &runc,
        &nri,
    );
}
