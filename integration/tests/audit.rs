//! The NRI audit trail (issue 11): real containerd runs a container through
//! the shim with two real plugin processes; `containerd-shim-nri-shim-v2
//! inspect <id>` then says which plugin set which field, without debug
//! logs, and the shim log has one info line naming them. Root only.

use integration::{
    Behaviour,
    containerd::{Containerd, Setup, output_text, workspace_bin},
    test_plugin_bin,
};

fn plugin(adjust: serde_json::Value) -> String {
    serde_json::to_string(&Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(adjust),
        ..Default::default()
    })
    .unwrap()
}

fn inspect(c: &Containerd, args: &[&str]) -> std::process::Output {
    std::process::Command::new(workspace_bin("containerd-shim-nri-shim-v2"))
        .env("NRI_SHIM_CONFIG", c.shim_config())
        .arg("inspect")
        .args(args)
        .output()
        .expect("run inspect")
}

#[test]
fn inspect_names_the_plugin_of_every_changed_field_until_the_task_is_deleted() {
    let c = Containerd::start(Setup {
        plugins: vec![
            (
                "10-env",
                test_plugin_bin!().into(),
                plugin(serde_json::json!({"env": [{"key": "AUDITED", "value": "yes"}]})),
            ),
            (
                "20-limits",
                test_plugin_bin!().into(),
                plugin(serde_json::json!({
                    "linux": {"resources": {"memory": {"limit": {"value": "134217728"}}}},
                    "annotations": {"audit.example.com/by": "20-limits"}
                })),
            ),
            ("30-idle", test_plugin_bin!().into(), plugin(serde_json::json!({}))),
        ],
        ..Setup::default()
    });
    let out = c.run("aud-c1", &["-d"], &["sleep", "1000"]);
    assert!(out.status.success(), "{}\n{}", output_text(&out), c.shim_log());

    let out = inspect(&c, &["aud-c1"]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    for row in [
        ["Env", "AUDITED", "10-env"],
        ["MemLimit", "-", "20-limits"],
        ["Annotations", "audit.example.com/by", "20-limits"],
    ] {
        assert!(rows.iter().any(|r| r[..] == row[..]), "no row {row:?} in:\n{text}");
    }
    assert!(text.contains("container default/aud-c1"), "{text}");
    assert!(text.contains("30-idle  no change"), "{text}");
    assert!(text.contains("\"AUDITED\""), "the merged adjustment is shown:\n{text}");

    // One info line per create, naming the plugins that changed it; the
    // harness's shim runs at debug, so look for the line itself.
    let log = c.shim_log();
    let line = log
        .lines()
        .find(|l| l.contains("NRI adjustments applied") && l.contains("aud-c1"))
        .unwrap_or_else(|| panic!("no adjustment line in:\n{log}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(r#"changed_by=["10-env", "20-limits"]"#), "{line}");

    // Without NRI_SHIM_CONFIG (the daemon's state_root is this test's, not
    // the default): found through the running daemon.
    let bare = std::process::Command::new(workspace_bin("containerd-shim-nri-shim-v2"))
        .env_remove("NRI_SHIM_CONFIG")
        .args(["inspect", "aud-c1"])
        .output()
        .expect("run inspect");
    assert!(bare.status.success(), "{}", output_text(&bare));
    assert!(
        output_text(&bare).contains("container default/aud-c1"),
        "{}",
        output_text(&bare)
    );

    // The namespace narrows; another namespace has nothing.
    assert!(inspect(&c, &["-namespace", "default", "aud-c1"]).status.success());
    let other = inspect(&c, &["-namespace", "k8s.io", "aud-c1"]);
    assert!(!other.status.success());
    assert!(output_text(&other).contains("no NRI audit record of container aud-c1 in namespace k8s.io"));

    for args in [
        &["t", "kill", "-s", "SIGKILL", "aud-c1"][..],
        &["t", "rm", "aud-c1"][..],
    ] {
        if args[1] == "rm" {
            c.wait_status("aud-c1", "STOPPED");
        }
        assert!(c.ctr(args).status.success(), "ctr {args:?}");
    }
    let gone = inspect(&c, &["aud-c1"]);
    assert!(!gone.status.success(), "{}", output_text(&gone));
    // The error says where it looked and what to set.
    assert!(
        output_text(&gone).contains("set NRI_SHIM_CONFIG"),
        "{}",
        output_text(&gone)
    );
}
