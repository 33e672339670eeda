//! `containerd-shim-nri-shim-v2 configure containerd` against real
//! containerd (issue 27 item 1), on the line `NRI_CONTAINERD` names
//! (`scripts/test.sh` runs it on each):
//!
//! - on the line's own default config (`containerd config default`):
//!   containerd reads the result (`containerd config dump` shows the
//!   handler), a second run changes no byte, `unconfigure` gives back the
//!   original byte for byte;
//! - on a running private containerd: the handler `configure` added runs
//!   a pod through CRI next to runc's; after `unconfigure` and a restart
//!   the handler is gone, runc's pods are untouched, the file is the
//!   original. Root only.

use std::{path::Path, process::Command, time::Duration};

use integration::{
    containerd::{containerd_cmd, containerd_major, workspace_bin},
    cri::{Cri, CriSetup, container},
};

fn shim(args: &[&str], config: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("containerd-shim-nri-shim-v2"))
        .args(args)
        .arg("containerd")
        .arg("--config")
        .arg(config)
        .args(extra)
        .output()
        .expect("run the shim")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `containerd config dump` of `config`: what containerd makes of it.
fn dump(config: &Path) -> String {
    let o = containerd_cmd("containerd")
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump");
    assert!(
        o.status.success(),
        "containerd config dump {}: {}",
        config.display(),
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_lines_default_config_is_configured_once_and_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let default = containerd_cmd("containerd")
        .args(["config", "default"])
        .output()
        .expect("containerd config default");
    assert!(default.status.success(), "{}", text(&default));
    std::fs::write(&config, &default.stdout).unwrap();
    // containerd 2.x runs its own NRI on the socket nri-shim's default
    // config uses: configure refuses, naming it, unless told to turn it off.
    let shim_config = dir.path().join("shim.toml");
    let extra = ["--shim-config", shim_config.to_str().unwrap()];
    let first = shim(&["configure"], &config, &extra);
    let extra: Vec<&str> = if containerd_major() >= 2 {
        assert!(
            !first.status.success() && text(&first).contains("--containerd-nri=disable"),
            "{}",
            text(&first)
        );
        assert_eq!(
            std::fs::read(&config).unwrap(),
            default.stdout,
            "a refusal writes nothing"
        );
        let mut e = extra.to_vec();
        e.extend(["--containerd-nri", "disable"]);
        let o = shim(&["configure"], &config, &e);
        assert!(o.status.success(), "{}", text(&o));
        e
    } else {
        assert!(first.status.success(), "{}", text(&first));
        extra.to_vec()
    };
    let configured = std::fs::read(&config).unwrap();
    let dumped = dump(&config);
    assert!(
        dumped.contains("runtimes.nri-shim]") && dumped.contains("io.containerd.nri-shim.v2"),
        "containerd's view lacks the handler:\n{dumped}"
    );
    let again = shim(&["configure"], &config, &extra);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "",
        "a second run reports no change"
    );
    assert_eq!(
        std::fs::read(&config).unwrap(),
        configured,
        "a second run changes no byte"
    );
    let undo = shim(&["unconfigure"], &config, &[]);
    assert!(undo.status.success(), "{}", text(&undo));
    assert_eq!(
        std::fs::read(&config).unwrap(),
        default.stdout,
        "unconfigure gives back the original"
    );
    assert!(!dump(&config).contains("runtimes.nri-shim]"));
}

#[test]
fn a_configured_containerd_runs_pods_with_the_handler_and_forgets_it_after_unconfigure() {
    let cri = Cri::start(CriSetup {
        configure: true,
        ..Default::default()
    });
    let config = cri.dir.join("config.toml");
    let original = std::fs::read(format!("{}.nri-shim.orig", config.display())).expect("configure kept the original");
    assert!(dump(&config).contains("runtimes.nri-shim]"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runc_pod = rt.block_on(async {
        let mut c = cri.client().await;
        let mut pods = Vec::new();
        for h in ["nri-shim", "runc"] {
            let cfg = cri.pod_config("configured", "default", h, |_| {});
            let pod = c.run_pod(&cfg, h).await;
            c.create_running(&pod, &cfg, container("c", &["sleep", "1000"]), Duration::from_secs(30))
                .await;
            pods.push((h, pod, cfg));
        }
        // The nri-shim pod goes; runc's stays across the unconfigure.
        let (_, pod, _) = pods.remove(0);
        c.remove_pod(&pod).await;
        pods.remove(0)
    });
    let undo = shim(&["unconfigure"], &config, &[]);
    assert!(undo.status.success(), "{}", text(&undo));
    assert_eq!(
        std::fs::read(&config).unwrap(),
        original,
        "unconfigure gives back the original"
    );
    cri.restart();
    rt.block_on(async {
        let mut c = cri.client().await;
        let cfg = cri.pod_config("unconfigured", "default", "nri-shim", |_| {});
        let r =
            c.rt.run_pod_sandbox(integration::cri::api::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: "nri-shim".into(),
            })
            .await;
        let e = r.expect_err("the nri-shim handler is gone after unconfigure and a restart");
        assert!(e.message().contains("nri-shim"), "{e}");
        // runc's pod ran on, untouched.
        let (_, pod, _) = &runc_pod;
        let st = c.pod_status(pod).await.expect("PodSandboxStatus of runc's pod");
        assert_eq!(st.state, integration::cri::api::PodSandboxState::SandboxReady as i32);
        c.remove_pod(pod).await;
    });
    cri.teardown();
}
