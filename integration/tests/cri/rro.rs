//! Issue 32 item 2: recursive read-only volumes (KEP-3857,
//! `recursiveReadOnly: Enabled`) through CRI. containerd 2.x turns one into
//! a bind mount with the `rro` option for a handler whose features say so,
//! and refuses it (before the runtime sees it) for one whose features do
//! not, or with a propagation other than private. On containerd 2.1 only a
//! handler of runtime type `io.containerd.runc.v2` is asked for its
//! features, so nri-shim is declared so here (`nri-shim-as-runc`, with
//! `runtime_path`; see docs/operator-guide.md); containerd 2.4 asks every
//! handler, and nri-shim runs these under its own runtime type as well.

use super::{NS, both, log_with, pod};
use integration::{
    cri::{AS_RUNC, Cri, api, container},
    parity::expect_value,
};

/// A pod of `handler` with a volume `mode` mounts read-only: `/mnt/h` (a
/// host directory with a tmpfs mounted in it) recursively read-only or
/// not; what the container can write, or CRI's refusal.
async fn rro(cri: &Cri, h: &'static str, recursive: bool, propagation: api::MountPropagation) -> String {
    let vol = cri.dir.join(format!("rro-{h}-{recursive}-{propagation:?}"));
    std::fs::create_dir_all(vol.join("sub")).unwrap();
    let v = vol.display().to_string();
    let mount = |args: &[&str]| {
        let ok = std::process::Command::new("mount")
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount {args:?}");
    };
    // A mount of its own, shared (CRI refuses HostToContainer on a private
    // one), with a tmpfs submount.
    mount(&["--bind", &v, &v]);
    mount(&["--make-rshared", &v]);
    mount(&["-t", "tmpfs", "sub", &vol.join("sub").display().to_string()]);
    let (mut c, pod, cfg) = pod(cri, &format!("rro-{recursive}-{propagation:?}"), NS, h, |_| {}).await;
    let mut cc = container(
        "c",
        &[
            "sh",
            "-c",
            "for d in /mnt/h /mnt/h/sub; do if touch $d/w 2>/dev/null; then echo \"$d writable\"; else echo \"$d read-only\"; fi; done; echo END; sleep 1000",
        ],
    );
    cc.mounts = vec![api::Mount {
        container_path: "/mnt/h".into(),
        host_path: v.clone(),
        readonly: true,
        recursive_read_only: recursive,
        propagation: propagation as i32,
        ..Default::default()
    }];
    let out = match c.try_create(&pod, &cfg, cc).await {
        Err(e) => format!("refused: {}", e.message().split(": ").next().unwrap_or_default()),
        Ok(id) => {
            c.start(&id).await;
            let lines = log_with(&cfg, "c", &["END"]).await;
            lines
                .iter()
                .filter(|l| l.contains("/mnt/h"))
                .map(|l| l.trim_start_matches("stdout F ").to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    c.remove_pod(&pod).await;
    let _ = std::process::Command::new("umount").args(["-R", &v]).status();
    out
}

#[tokio::test]
async fn recursive_read_only_volumes_as_with_runc() {
    use api::MountPropagation::{PropagationHostToContainer, PropagationPrivate};
    let cri = super::shared();
    if integration::containerd::containerd_major() < 2 {
        // containerd 1.x knows no recursiveReadOnly: a plain read-only bind,
        // for both handlers.
        let (runc, nri) = both(|h| rro(cri, h, true, PropagationPrivate)).await;
        expect_value(
            "recursiveReadOnly on containerd 1.x (not known: a plain ro bind)",
            &"/mnt/h read-only, /mnt/h/sub writable".to_string(),
            &runc,
            &nri,
        );
        return;
    }
    // containerd 2.4 asks every handler for its features: nri-shim under
    // its own runtime type too.
    let handlers: &[&'static str] = if integration::containerd::introspects_every_handler() {
        &[AS_RUNC, "nri-shim"]
    } else {
        &[AS_RUNC]
    };
    for (recursive, propagation, contract) in [
        (true, PropagationPrivate, "/mnt/h read-only, /mnt/h/sub read-only"),
        (false, PropagationPrivate, "/mnt/h read-only, /mnt/h/sub writable"),
        // CRI: "recursive read-only mount needs private propagation".
        (true, PropagationHostToContainer, "refused"),
    ] {
        // runc once, beside nri-shim's handlers one after the other.
        let (runc, ours) = tokio::join!(rro(cri, "runc", recursive, propagation), async {
            let mut ours = Vec::new();
            for &h in handlers {
                ours.push((h, rro(cri, h, recursive, propagation).await));
            }
            ours
        });
        let refused = |s: &str| {
            if s.starts_with("refused") {
                "refused".to_string()
            } else {
                s.to_string()
            }
        };
        for (h, nri) in ours {
            expect_value(
                &format!("recursiveReadOnly {recursive}, {propagation:?} ({h})"),
                &contract.to_string(),
                &refused(&runc),
                &refused(&nri),
            );
        }
    }
    // Not sent to the plain `nri-shim` handler where containerd does not
    // ask it for features (2.1): its CRI then dereferences the handler's
    // missing features and exits (v2.1.9 internal/cri/opts/spec_linux_opts.go,
    // withMounts: `handler.Features.RecursiveReadOnlyMounts` with
    // `Features` nil). kubelet refuses such a pod itself, from the
    // handler's features in CRI Status.
}
