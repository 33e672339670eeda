//! CDI devices through Debian's containerd and the shim: a real NRI plugin
//! process asks for a CDI device, a `cdi.k8s.io/*` annotation asks for
//! another, and the container sees both (device node, env, bind mount);
//! an unknown device fails the run naming the device and the spec file,
//! leaving nothing behind. Root only.

use integration::{
    Behaviour, cgroup,
    containerd::{Containerd, Setup, workspace_bin},
};

const SPEC: &str = r#"
cdiVersion: "0.6.0"
kind: example.com/test
containerEdits:
  env: ["CDI_VENDOR=example"]
devices:
  - name: null
    containerEdits:
      env: ["CDI_NULL=yes"]
      deviceNodes:
        - path: /dev/example-null
          hostPath: /dev/null
      mounts:
        - hostPath: HOST_FILE
          containerPath: /etc/example-cdi
          type: bind
          options: [rbind, ro]
  - name: zero
    containerEdits:
      env: ["CDI_ZERO=yes"]
      deviceNodes:
        - path: /dev/example-zero
          type: c
          major: 1
          minor: 5
"#;

use integration::containerd::output_text as text;

#[test]
fn a_plugin_and_an_annotation_inject_cdi_devices_and_an_unknown_one_fails_by_name() {
    let spec_dir = tempfile::Builder::new().prefix("nri-cdi-").tempdir().unwrap();
    let host_file = spec_dir.path().join("host-file");
    std::fs::write(&host_file, "mounted by CDI\n").unwrap();
    let spec_file = spec_dir.path().join("run/example.yaml");
    std::fs::create_dir_all(spec_file.parent().unwrap()).unwrap();
    std::fs::write(&spec_file, SPEC.replace("HOST_FILE", &host_file.display().to_string())).unwrap();
    let plugin = serde_json::to_string(&Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({"CDIDevices": [{"name": "example.com/test=null"}]})),
        ..Default::default()
    })
    .unwrap();
    let shim_toml = format!(
        "[cdi]\nspec_dirs = [\"{}\", \"{}\"]\n",
        spec_dir.path().join("etc").display(),
        spec_dir.path().join("run").display()
    );
    let c = Containerd::start(Setup {
        plugins: vec![("10-cdi", workspace_bin("nri-test-plugin"), plugin)],
        shim_toml: &shim_toml,
        ..Default::default()
    });

    let out = c.run(
        "ctrd-cdi1",
        &["--rm", "--annotation", "cdi.k8s.io/test_dp=example.com/test=zero"],
        &[
            "/bin/sh",
            "-c",
            "stat -c '%n %t:%T %F' /dev/example-null /dev/example-zero; echo vendor=$CDI_VENDOR null=$CDI_NULL zero=$CDI_ZERO; cat /etc/example-cdi; echo x > /dev/example-null && echo wrote",
        ],
    );
    let seen = text(&out);
    assert!(out.status.success(), "{seen}\n{}", c.shim_log());
    assert!(seen.contains("/dev/example-null 1:3 character special file"), "{seen}");
    assert!(seen.contains("/dev/example-zero 1:5 character special file"), "{seen}");
    assert!(seen.contains("vendor=example null=yes zero=yes"), "{seen}");
    assert!(seen.contains("mounted by CDI"), "{seen}");
    // The cgroup allows the injected device.
    assert!(seen.contains("wrote"), "{seen}");

    // The spec file changes under the running daemon: read on every create.
    std::fs::write(
        &spec_file,
        SPEC.replace("HOST_FILE", &host_file.display().to_string())
            .replace("- name: null", "- name: renamed"),
    )
    .unwrap();
    for attempt in 0..2 {
        let out = c.run("ctrd-cdi2", &["--rm"], &["/bin/true"]);
        let msg = text(&out);
        assert!(!out.status.success(), "attempt {attempt}: {msg}");
        assert!(
            msg.contains("unknown CDI device example.com/test=null")
                && msg.contains(&format!(
                    "{} defines kind example.com/test with devices renamed, zero",
                    spec_file.display()
                )),
            "attempt {attempt}: {msg}"
        );
        assert!(!msg.contains("already exists"), "attempt {attempt}: {msg}");
        assert!(!text(&c.ctr(&["t", "ls"])).contains("ctrd-cdi2"));
        assert!(c.libcontainer_states().is_empty(), "{:?}", c.libcontainer_states());
        let cgroups = cgroup::dirs("/default/ctrd-cdi2");
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    }
}
