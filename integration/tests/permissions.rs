//! Per-plugin permissions end to end: containerd runs busybox containers
//! through the shim with a pre-installed plugin allowed only `env` that also
//! adds a mount. Root only (these machines and CI run as root).

use std::time::{Duration, Instant};

use integration::{
    Behaviour, cgroup,
    containerd::{Containerd, Setup, output_text as text, workspace_bin},
    free_port, scrape,
};

/// Sets FOO=1 and mounts a tmpfs on /perm-mnt at CreateContainer.
fn injector() -> (&'static str, std::path::PathBuf, String) {
    let b = Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({
            "env": [{"key": "FOO", "value": "1"}],
            "mounts": [{"destination": "/perm-mnt", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}],
        })),
        ..Default::default()
    };
    (
        "10-injector",
        workspace_bin("nri-test-plugin"),
        serde_json::to_string(&b).unwrap(),
    )
}

const REFUSED: &str = "plugin 10-injector may not adjust mounts /perm-mnt (field group mounts, allowed: env)";

/// What the container sees: FOO and whether /perm-mnt is mounted.
const LOOK: &str = "echo FOO=$FOO; echo MOUNTS=$(grep -c ' /perm-mnt ' /proc/mounts)";

#[test]
fn a_plugin_outside_its_permissions_fails_the_create_under_fail() {
    let c = Containerd::start(Setup {
        plugins: vec![injector()],
        shim_toml: "[nri.plugin_permissions.\"10-injector\"]\nallow = [\"env\"]\n[nri.failure_policy]\n\"10-injector\" = \"fail\"\n",
        ..Default::default()
    });
    for attempt in 0..2 {
        let out = c.run("perm-f1", &["--rm"], &["/bin/sh", "-c", LOOK]);
        let msg = text(&out);
        assert!(!out.status.success(), "attempt {attempt}: {msg}");
        assert!(msg.contains(REFUSED), "attempt {attempt}: {msg}\n{}", c.shim_log());
        assert!(!msg.contains("already exists"), "attempt {attempt}: {msg}");
        // Nothing left behind: no task, no libcontainer state, no cgroup.
        assert!(!text(&c.ctr(&["t", "ls"])).contains("perm-f1"));
        assert!(c.libcontainer_states().is_empty(), "{:?}", c.libcontainer_states());
        let cgroups = cgroup::dirs("/default/perm-f1");
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
        let _ = c.ctr(&["c", "rm", "perm-f1"]);
    }
}

#[test]
fn a_plugin_outside_its_permissions_is_dropped_under_ignore_until_a_reload_allows_it() {
    // A port free now (the daemon binds it a moment later).
    let port = free_port();
    let shim_toml = format!(
        "[nri.plugin_permissions.\"10-injector\"]\nallow = [\"env\"]\n[metrics]\naddress = \"127.0.0.1:{port}\"\n"
    );
    let c = Containerd::start(Setup {
        plugins: vec![injector()],
        shim_toml: &shim_toml,
        ..Default::default()
    });
    // Keeps the daemon up for the reload.
    let keep = c.run("perm-keep", &["-d"], &["/bin/sleep", "300"]);
    assert!(keep.status.success(), "{}", text(&keep));
    let out = c.run("perm-i1", &["--rm"], &["/bin/sh", "-c", LOOK]);
    let seen = text(&out);
    assert!(out.status.success(), "{seen}\n{}", c.shim_log());
    // Neither change: the answer is refused whole, not only the mount.
    assert!(seen.lines().any(|l| l == "FOO="), "{seen}");
    assert!(seen.lines().any(|l| l == "MOUNTS=0"), "{seen}");
    let log = c.shim_log();
    assert!(
        log.lines().any(|l| l.contains(REFUSED) && l.contains("dropped")),
        "{log}"
    );
    // Counted per refused answer: perm-keep's and perm-i1's.
    let metrics = scrape(port);
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"nri_plugin_rejections_total{plugin="10-injector",reason="permission"} 2"#),
        "{metrics}"
    );
    // Widened by SIGHUP: the running plugin's next answer is merged.
    let cfg = std::fs::read_to_string(c.shim_config()).unwrap();
    std::fs::write(
        c.shim_config(),
        cfg.replace("allow = [\"env\"]", "allow = [\"env\", \"mounts\"]"),
    )
    .unwrap();
    let from = c.shim_log().len();
    let pid = c.shim_daemon_pid().expect("shim daemon runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.shim_log()[from..]
        .lines()
        .any(|l| l.contains("config reloaded") && l.contains("nri.plugin_permissions"))
    {
        assert!(Instant::now() < deadline, "no reload:\n{}", c.shim_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = c.run("perm-i2", &["--rm"], &["/bin/sh", "-c", LOOK]);
    let seen = text(&out);
    assert!(out.status.success(), "{seen}\n{}", c.shim_log());
    assert!(seen.lines().any(|l| l == "FOO=1"), "{seen}");
    assert!(seen.lines().any(|l| l == "MOUNTS=1"), "{seen}");
    assert_eq!(c.shim_daemon_pid(), Some(pid), "the same daemon");
    let _ = c.ctr(&["t", "kill", "-s", "SIGKILL", "perm-keep"]);
    c.wait_status("perm-keep", "STOPPED");
    let _ = c.ctr(&["t", "rm", "perm-keep"]);
    let _ = c.ctr(&["c", "rm", "perm-keep"]);
}
