//! `containerd-shim-nri-shim-v2 -info` as containerd 2.x runs it (issue 9
//! item 5): runtime options on stdin, a `RuntimeInfo` protobuf on stdout,
//! the features compared with `runc features` (runc 1.5, the reference,
//! from the Go peers) on this machine.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use containerd_shim_protos::{
    protobuf::{Message as _, well_known_types::any::Any},
    types::introspection::RuntimeInfo,
};
use serde_json::Value;

#[allow(dead_code)] // only its runc()
mod common;

const SHIM: &str = env!("CARGO_BIN_EXE_containerd-shim-nri-shim-v2");

/// Runs `-info` with `stdin`; returns (exit ok, stdout, stderr).
fn run_info(stdin: &[u8]) -> (bool, Vec<u8>, String) {
    let mut child = Command::new(SHIM)
        .arg("-info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn runc_features() -> Value {
    let out = Command::new(common::runc()).arg("features").output().unwrap();
    assert!(
        out.status.success(),
        "runc features: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Items of runc's list missing from ours.
fn missing(runc: &Value, ours: &Value) -> Vec<String> {
    let ours = strings(ours);
    strings(runc).into_iter().filter(|r| !ours.contains(r)).collect()
}

#[test]
fn info_prints_runtime_info_with_runcs_features_where_libcontainer_has_them() {
    let (ok, stdout, stderr) = run_info(&[]);
    assert!(ok, "-info failed: {stderr}");
    let info = RuntimeInfo::parse_from_bytes(&stdout).expect("stdout is a RuntimeInfo protobuf");
    assert_eq!(info.name, "io.containerd.nri-shim.v2");
    assert_eq!(info.version.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info.features.type_url,
        "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
    );
    let ours: Value = serde_json::from_slice(&info.features.value).expect("features are JSON");
    let runc = runc_features();
    println!("nri-shim: {ours:#}");
    // Every namespace runc lists, `user` included (user-namespaced pods,
    // integration/tests/cri/userns.rs).
    assert_eq!(
        missing(runc.pointer("/linux/namespaces").unwrap(), &ours["linux"]["namespaces"]),
        Vec::<String>::new(),
        "namespaces"
    );
    for (what, path) in [
        ("hooks", "/hooks"),
        ("capabilities", "/linux/capabilities"),
        ("seccomp actions", "/linux/seccomp/actions"),
        ("seccomp operators", "/linux/seccomp/operators"),
        ("seccomp archs", "/linux/seccomp/archs"),
    ] {
        let (r, o) = (runc.pointer(path).unwrap(), ours.pointer(path).unwrap());
        assert!(
            missing(r, o).is_empty(),
            "{what}: runc has {:?} that nri-shim lacks",
            missing(r, o)
        );
    }
    // CRI's recursive read-only mounts: runc offers them on this kernel, so must we.
    for f in [&runc, &ours] {
        assert!(strings(&f["mountOptions"]).contains(&"rro".to_string()), "{f}");
    }
    for key in ["v1", "v2", "systemd"] {
        assert_eq!(
            ours["linux"]["cgroup"][key], runc["linux"]["cgroup"][key],
            "cgroup {key}"
        );
    }
    // runc has the systemd driver of a user manager (rootless); we do not.
    assert_eq!(ours["linux"]["cgroup"]["systemdUser"], false);
    assert_eq!(ours["linux"]["seccomp"]["enabled"], true);
    // Idmapped mounts, which the shim makes itself (this kernel has
    // mount_setattr): with the user namespace, CRI offers user-namespaced
    // pods for the handler. Debian 12's runc 1.1 has none.
    assert_eq!(ours["linux"]["mountExtensions"]["idmap"]["enabled"], true);
    for o in ["idmap", "ridmap"] {
        assert!(strings(&ours["mountOptions"]).contains(&o.to_string()), "{o}");
    }
}

#[test]
fn info_echoes_the_runtime_options_and_refuses_garbage() {
    let opts = Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: b"\x0a\x04runc".to_vec(),
        ..Default::default()
    };
    let (ok, stdout, stderr) = run_info(&opts.write_to_bytes().unwrap());
    assert!(ok, "-info failed: {stderr}");
    let info = RuntimeInfo::parse_from_bytes(&stdout).unwrap();
    assert_eq!(info.options.as_ref(), Some(&opts));

    let (ok, stdout, stderr) = run_info(b"\xff\xff\xff");
    assert!(!ok && stdout.is_empty(), "garbage options accepted");
    assert!(
        stderr.contains("runtime options on stdin are not a protobuf Any (3 bytes)"),
        "{stderr}"
    );
}
