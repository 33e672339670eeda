use std::{collections::HashMap, path::Path};

use oci_spec::runtime::{LinuxDeviceType, Spec};

use super::*;

const NULL_SPEC: &str = r#"
cdiVersion: "0.6.0"
kind: example.com/null
containerEdits:
  env: ["NULL_VENDOR=example"]
devices:
  - name: dev0
    containerEdits:
      env: ["NULL_DEVICE=dev0"]
      deviceNodes:
        - path: /dev/example-null
          hostPath: /dev/null
      mounts:
        - hostPath: /etc/hostname
          containerPath: /etc/example-null
          type: bind
          options: [rbind, ro]
      hooks:
        - hookName: createContainer
          path: /bin/true
          args: [true, example]
  - name: dev1
    containerEdits:
      env: ["NULL_DEVICE=dev1"]
  - name: dev2
    containerEdits:
      deviceNodes:
        - path: /dev/example-zero
          type: c
          major: 1
          minor: 5
          permissions: rw
"#;

fn registry(files: &[(&str, &str, &str)]) -> (tempfile::TempDir, Registry) {
    let t = tempfile::tempdir().unwrap();
    let dirs = vec![t.path().join("etc"), t.path().join("run")];
    for (dir, name, text) in files {
        let d = t.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), text).unwrap();
    }
    (t, Registry::new(dirs))
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn env(s: &Spec) -> Vec<String> {
    s.process().as_ref().and_then(|p| p.env().clone()).unwrap_or_default()
}

#[test]
fn a_device_node_env_mount_and_hook_are_injected() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let mut s = Spec::default();
    r.inject(&mut s, &names(&["example.com/null=dev0"])).unwrap();
    let e = env(&s);
    assert!(
        e.contains(&"NULL_VENDOR=example".into()) && e.contains(&"NULL_DEVICE=dev0".into()),
        "{e:?}"
    );
    let linux = s.linux().as_ref().unwrap();
    let dev = &linux.devices().as_ref().unwrap()[0];
    assert_eq!(dev.path(), Path::new("/dev/example-null"));
    // Filled in from the host's /dev/null: c 1:3, its mode.
    assert_eq!((dev.typ(), dev.major(), dev.minor()), (LinuxDeviceType::C, 1, 3));
    assert_eq!(dev.file_mode(), Some(0o666));
    let rules = linux.resources().as_ref().unwrap().devices().as_ref().unwrap();
    let rule = rules.last().unwrap();
    assert!(rule.allow() && rule.major() == Some(1) && rule.minor() == Some(3));
    assert_eq!(rule.access().as_deref(), Some("rwm"));
    let m = s
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.destination() == Path::new("/etc/example-null"))
        .unwrap();
    assert_eq!(m.source().as_deref(), Some(Path::new("/etc/hostname")));
    assert_eq!(m.options().as_ref().unwrap(), &names(&["rbind", "ro"]));
    let hooks = s.hooks().as_ref().unwrap().create_container().clone().unwrap();
    assert_eq!(hooks[0].path(), Path::new("/bin/true"));
}

#[test]
fn injecting_twice_changes_nothing_more() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let mut s = Spec::default();
    r.inject(&mut s, &names(&["example.com/null=dev0", "example.com/null=dev2"]))
        .unwrap();
    let once = serde_json::to_string(&s).unwrap();
    r.inject(&mut s, &names(&["example.com/null=dev0", "example.com/null=dev2"]))
        .unwrap();
    assert_eq!(serde_json::to_string(&s).unwrap(), once);
    // Written as given: no host lookup for a complete node.
    let devs = s.linux().as_ref().unwrap().devices().clone().unwrap();
    let zero = devs
        .iter()
        .find(|d| d.path() == Path::new("/dev/example-zero"))
        .unwrap();
    assert_eq!((zero.major(), zero.minor()), (1, 5));
}

#[test]
fn env_replaces_the_containers_own_by_name() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let mut s = Spec::default();
    s.process_mut()
        .as_mut()
        .unwrap()
        .set_env(Some(names(&["PATH=/bin", "NULL_DEVICE=old"])));
    r.inject(&mut s, &names(&["example.com/null=dev1"])).unwrap();
    assert_eq!(
        env(&s),
        names(&["PATH=/bin", "NULL_DEVICE=dev1", "NULL_VENDOR=example"])
    );
}

#[test]
fn a_non_root_process_owns_its_device_nodes() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let mut s = Spec::default();
    let user = s.process_mut().as_mut().unwrap().user_mut();
    user.set_uid(1000);
    user.set_gid(1001);
    r.inject(&mut s, &names(&["example.com/null=dev0"])).unwrap();
    let dev = &s.linux().as_ref().unwrap().devices().as_ref().unwrap()[0];
    assert_eq!((dev.uid(), dev.gid()), (Some(1000), Some(1001)));
}

#[test]
fn an_unknown_device_names_what_there_is() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let mut s = Spec::default();
    let before = serde_json::to_string(&s).unwrap();
    let e = r
        .inject(&mut s, &names(&["example.com/null=dev0", "example.com/null=gpu9"]))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("unknown CDI device example.com/null=gpu9"), "{e}");
    assert!(
        e.contains("null.yaml defines kind example.com/null with devices dev0, dev1, dev2"),
        "{e}"
    );
    // The device that did resolve was not applied either.
    assert_eq!(serde_json::to_string(&s).unwrap(), before);
    let e = r.inject(&mut s, &names(&["other.com/x=y"])).unwrap_err();
    assert!(matches!(e, CdiError::Unknown { .. }), "{e}");
}

#[test]
fn an_unreadable_file_is_named_when_a_device_is_missing() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC), ("run", "broken.json", "{ not: [yaml")]);
    let e = r
        .inject(&mut Spec::default(), &names(&["example.com/gpu=0"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unreadable spec file") && e.contains("broken.json"), "{e}");
    // A broken file of another vendor does not stop the others.
    r.inject(&mut Spec::default(), &names(&["example.com/null=dev1"]))
        .unwrap();
}

#[test]
fn a_later_directory_wins_and_the_same_directory_conflicts() {
    let shadow = NULL_SPEC.replace("NULL_DEVICE=dev1", "NULL_DEVICE=from-run");
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC), ("run", "null.yaml", &shadow)]);
    let mut s = Spec::default();
    r.inject(&mut s, &names(&["example.com/null=dev1"])).unwrap();
    assert!(env(&s).contains(&"NULL_DEVICE=from-run".into()));
    let (_t, r) = registry(&[("etc", "a.yaml", NULL_SPEC), ("etc", "b.json", NULL_SPEC)]);
    let e = r
        .inject(&mut Spec::default(), &names(&["example.com/null=dev1"]))
        .unwrap_err();
    assert!(matches!(e, CdiError::Duplicate { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("example.com/null=dev1") && e.contains("a.yaml") && e.contains("b.json"),
        "{e}"
    );
}

#[test]
fn devices_that_disagree_are_refused_naming_both() {
    let (_t, r) = registry(&[("etc", "null.yaml", NULL_SPEC)]);
    let e = r
        .inject(
            &mut Spec::default(),
            &names(&["example.com/null=dev0", "example.com/null=dev1"]),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("env NULL_DEVICE")
            && e.contains("example.com/null=dev0 (")
            && e.contains("example.com/null=dev1 (")
            && e.contains("null.yaml"),
        "{e}"
    );
}

#[test]
fn invalid_specs_are_named_with_file_and_device() {
    for (edit, reason) in [
        ("env: [NOEQUALS]", "not NAME=value"),
        ("deviceNodes: [{path: relative}]", "not absolute"),
        ("deviceNodes: [{path: /dev/x, type: z, major: 1}]", "type \"z\""),
        ("hooks: [{hookName: later, path: /bin/true}]", "hookName \"later\""),
        ("mounts: [{hostPath: /x, containerPath: y}]", "not absolute"),
        ("intelRdt: {closID: a}", "intelRdt"),
        ("unknownEdit: 1", "unknown field `unknownEdit`"),
    ] {
        let text = format!(
            "cdiVersion: 0.6.0\nkind: example.com/bad\ndevices:\n  - name: d\n    containerEdits:\n      {edit}\n"
        );
        let (_t, r) = registry(&[("etc", "bad.yaml", &text)]);
        let e = r
            .inject(&mut Spec::default(), &names(&["example.com/bad=d"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bad.yaml") && e.contains("example.com/bad=d") && e.contains(reason),
            "{edit}: {e}"
        );
    }
    let (_t, r) = registry(&[(
        "etc",
        "old.yaml",
        "cdiVersion: 9.0.0\nkind: example.com/old\ndevices: [{name: d, containerEdits: {}}]\n",
    )]);
    let e = r
        .inject(&mut Spec::default(), &names(&["example.com/old=d"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("invalid CDI spec") && e.contains("old.yaml") && e.contains("9.0.0"),
        "{e}"
    );
}

#[test]
fn a_missing_host_device_is_named() {
    let text = "cdiVersion: 0.6.0\nkind: example.com/gone\ndevices:\n  - name: d\n    containerEdits:\n      deviceNodes: [{path: /dev/nri-shim-no-such-device}]\n";
    let (_t, r) = registry(&[("etc", "gone.yaml", text)]);
    let e = r
        .inject(&mut Spec::default(), &names(&["example.com/gone=d"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("example.com/gone=d") && e.contains("gone.yaml") && e.contains("/dev/nri-shim-no-such-device"),
        "{e}"
    );
}

#[test]
fn names_are_checked() {
    let r = Registry::new(vec![]);
    for bad in [
        "gpu0",
        "example.com/gpu",
        "example.com=gpu0",
        "/gpu=0",
        "example.com/gpu=",
        "example.com/gpu=-x",
    ] {
        let e = r.inject(&mut Spec::default(), &names(&[bad])).unwrap_err();
        assert!(matches!(e, CdiError::InvalidName { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn annotations_list_devices_in_key_order_once() {
    let a: HashMap<String, String> = [
        ("cdi.k8s.io/vendor_b", "example.com/null=dev1, example.com/null=dev0"),
        ("cdi.k8s.io/vendor_a", "example.com/null=dev2"),
        ("other.io/x", "not-a-device"),
        ("cdi.k8s.io/vendor_c", "example.com/null=dev0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(
        annotation_devices(Some(&a)).unwrap(),
        names(&[
            "example.com/null=dev2",
            "example.com/null=dev1",
            "example.com/null=dev0"
        ])
    );
    assert!(annotation_devices(None).unwrap().is_empty());
    let bad: HashMap<String, String> = [("cdi.k8s.io/x".to_string(), "gpu0".to_string())].into();
    let e = annotation_devices(Some(&bad)).unwrap_err().to_string();
    assert!(e.contains("cdi.k8s.io/x") && e.contains("\"gpu0\""), "{e}");
}
