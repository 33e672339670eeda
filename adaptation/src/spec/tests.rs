//! adjust()/update() per field, the numbered spec cases (`rNN_` tests), and properties.

use oci_spec::runtime::{Hook, Hooks, LinuxNamespaceType, LinuxResources};
use proptest::prelude::*;

use super::*;
use crate::result::CreateResult;

fn json<M: protobuf::MessageFull>(s: &str) -> M {
    protobuf_json_mapping::parse_from_str(s).unwrap_or_else(|e| panic!("bad fixture {s}: {e}"))
}

fn adj(s: &str) -> api::ContainerAdjustment {
    json(s)
}

/// A CRI-like spec: process with env, a few mounts, namespaces, resources.
fn base_spec() -> Spec {
    serde_json::from_str(
        r#"{
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
            "env": ["PATH=/bin", "FOO=image", "BAR=1"]},
        "root": {"path": "rootfs"},
        "annotations": {"keep": "yes", "drop": "me"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/hosts", "type": "bind", "source": "/h", "options": ["rbind"]},
            {"destination": "/data", "type": "bind", "source": "/host/data", "options": ["rbind"]}
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}],
            "resources": {
                "devices": [{"allow": false, "access": "rwm"}],
                "cpu": {"shares": 1024, "quota": 50000, "period": 100000},
                "memory": {"limit": 1073741824, "swap": 1073741824}
            }
        }
    }"#,
    )
    .expect("fixture spec")
}

fn res(s: &Spec) -> &LinuxResources {
    s.linux().as_ref().unwrap().resources().as_ref().unwrap()
}

#[test]
fn empty_adjustment_leaves_the_spec_identical() {
    let mut s = base_spec();
    let before = serde_json::to_vec(&s).unwrap();
    // What zero plugins produce: the normalized, empty merged adjustment.
    let rsp = CreateResult::new(api::CreateContainerRequest::new()).into_response();
    adjust(&mut s, rsp.adjust.get_or_default()).unwrap();
    assert_eq!(serde_json::to_vec(&s).unwrap(), before);
}

#[test]
fn r13_env_override_replaces_in_place_and_removes() {
    let mut r = CreateResult::new(json(
        r#"{"container": {"id": "c1", "env": ["PATH=/bin", "FOO=image", "BAR=1"]}}"#,
    ));
    r.apply("10-a", json(r#"{"adjust": {"env": [{"key": "FOO", "value": "nri"}]}}"#))
        .unwrap();
    r.apply("20-b", json(r#"{"adjust": {"env": [{"key": "-BAR"}]}}"#))
        .unwrap();
    let mut s = base_spec();
    adjust(&mut s, r.adjustment()).unwrap();
    assert_eq!(
        s.process().as_ref().unwrap().env().as_ref().unwrap(),
        &["PATH=/bin", "FOO=nri"]
    );
}

#[test]
fn env_duplicates_collapse_and_entries_without_equals_survive() {
    let mut s = base_spec();
    s.process_mut()
        .as_mut()
        .unwrap()
        .set_env(Some(vec!["FOO=1".into(), "WEIRD".into(), "FOO=2".into()]));
    adjust(
        &mut s,
        &adj(r#"{"env": [{"key": "FOO", "value": "3"}, {"key": "NEW", "value": "x"}]}"#),
    )
    .unwrap();
    assert_eq!(
        s.process().as_ref().unwrap().env().as_ref().unwrap(),
        &["FOO=3", "WEIRD", "NEW=x"]
    );
    let e = adjust(&mut s, &adj(r#"{"env": [{"key": "A=B", "value": "x"}]}"#)).unwrap_err();
    assert!(e.to_string().contains("A=B"), "{e}");
}

#[test]
fn r14_mounts_removed_added_and_depth_sorted() {
    let mut r = CreateResult::new(json(
        r#"{"container": {"id": "c1", "mounts": [
            {"destination": "/etc/hosts", "type": "bind", "source": "/h"},
            {"destination": "/data", "type": "bind", "source": "/host/data"}]}}"#,
    ));
    r.apply(
        "10-a",
        json(
            r#"{"adjust": {"mounts": [{"destination": "/opt/x/y", "source": "/host/y", "type": "bind"},
            {"destination": "/opt/x", "type": "tmpfs", "source": "tmpfs"}]}}"#,
        ),
    )
    .unwrap();
    r.apply("20-b", json(r#"{"adjust": {"mounts": [{"destination": "-/data"}]}}"#))
        .unwrap();
    let mut s = base_spec();
    s.set_mounts(Some(
        s.mounts()
            .clone()
            .unwrap()
            .into_iter()
            .filter(|m| m.destination() != &PathBuf::from("/proc"))
            .collect(),
    ));
    adjust(&mut s, r.adjustment()).unwrap();
    let mounts = s.mounts().as_ref().unwrap();
    let dests: Vec<_> = mounts.iter().map(|m| m.destination().to_str().unwrap()).collect();
    assert_eq!(dests, ["/etc/hosts", "/opt/x", "/opt/x/y"]);
    let y = mounts
        .iter()
        .find(|m| m.destination() == &PathBuf::from("/opt/x/y"))
        .unwrap();
    assert_eq!(y.options(), &None, "options absent, not []");
    let json = serde_json::to_value(y).unwrap();
    assert!(json.get("options").is_none());
}

#[test]
fn mount_propagation_sets_rootfs_propagation() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"mounts": [{"destination": "/m", "type": "bind", "source": "/s", "options": ["rbind", "rslave"]}]}"#),
    )
    .unwrap();
    assert_eq!(
        s.linux().as_ref().unwrap().rootfs_propagation().as_deref(),
        Some("rslave")
    );
    adjust(
        &mut s,
        &adj(r#"{"mounts": [{"destination": "/n", "type": "bind", "source": "/s", "options": ["rshared"]}]}"#),
    )
    .unwrap();
    assert_eq!(
        s.linux().as_ref().unwrap().rootfs_propagation().as_deref(),
        Some("rshared")
    );
    let e = adjust(&mut s, &adj(r#"{"mounts": [{"destination": "relative"}]}"#)).unwrap_err();
    assert!(e.to_string().contains("relative"));
}

#[test]
fn r16_only_set_cpu_fields_change() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"linux": {"resources": {"cpu": {"cpus": "0-1"}, "memory": {}}}}"#),
    )
    .unwrap();
    let cpu = res(&s).cpu().as_ref().unwrap();
    assert_eq!(
        (cpu.shares(), cpu.quota(), cpu.period()),
        (Some(1024), Some(50000), Some(100000))
    );
    assert_eq!(cpu.cpus().as_deref(), Some("0-1"));
    assert_eq!(res(&s).memory().as_ref().unwrap().limit(), Some(1073741824));
}

#[test]
fn r16_update_leaves_unset_fields_and_keeps_memory_object() {
    let mut r = res(&base_spec()).clone();
    update(&mut r, &json(r#"{"cpu": {"cpus": "2"}}"#)).unwrap();
    assert_eq!(r.memory().as_ref().unwrap().limit(), Some(1073741824));
    assert_eq!(r.cpu().as_ref().unwrap().cpus().as_deref(), Some("2"));
    let oci = to_oci_resources(&json(r#"{"cpu": {"cpus": "2"}}"#)).unwrap();
    let v = serde_json::to_value(&oci).unwrap();
    assert_eq!(
        v["memory"],
        serde_json::json!({}),
        "memory object present, fields absent"
    );
}

#[test]
fn every_memory_field_is_applied() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(
            r#"{"linux": {"resources": {"memory": {"limit": {"value": 2147483648}, "reservation": {"value": 1},
            "kernelTcp": {"value": 7}, "swappiness": {"value": 10}, "disableOomKiller": {"value": true},
            "useHierarchy": {"value": true}}}}}"#,
        ),
    )
    .unwrap();
    let m = res(&s).memory().as_ref().unwrap();
    assert_eq!(m.limit(), Some(2147483648));
    assert_eq!(m.swap(), Some(2147483648), "swap followed the limit (was = old limit)");
    assert_eq!(
        (m.reservation(), m.kernel_tcp(), m.swappiness()),
        (Some(1), Some(7), Some(10))
    );
    assert_eq!((m.disable_oom_killer(), m.use_hierarchy()), (Some(true), Some(true)));
    adjust(
        &mut s,
        &adj(r#"{"linux": {"resources": {"memory": {"swap": {"value": -1}}}}}"#),
    )
    .unwrap();
    assert_eq!(res(&s).memory().as_ref().unwrap().swap(), Some(-1));
}

#[test]
fn invalid_resource_values_are_named() {
    for (json, field) in [
        (
            r#"{"cpu": {"shares": {"value": "18446744073709551615"}}}"#,
            "linux.resources.cpu.shares",
        ),
        (r#"{"cpu": {"period": {"value": "5"}}}"#, "linux.resources.cpu.period"),
        (
            r#"{"memory": {"limit": {"value": "-5"}}}"#,
            "linux.resources.memory.limit",
        ),
        (
            r#"{"memory": {"swappiness": {"value": "101"}}}"#,
            "linux.resources.memory.swappiness",
        ),
        (r#"{"pids": {"limit": "-2"}}"#, "linux.resources.pids.limit"),
    ] {
        let mut s = base_spec();
        let before = s.clone();
        let e = adjust(&mut s, &adj(&format!(r#"{{"linux": {{"resources": {json}}}}}"#))).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(s, before, "spec unchanged on error");
    }
}

#[test]
fn r17_devices_get_nodes_and_cgroup_rules_after_default_deny() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"linux": {"devices": [{"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200, "fileMode": {"value": 438}}],
            "resources": {"devices": [{"allow": true, "type": "c", "major": {"value": 10}, "minor": {"value": 200}, "access": "rwm"}]}}}"#),
    )
    .unwrap();
    let lin = s.linux().as_ref().unwrap();
    let dev = &lin.devices().as_ref().unwrap()[0];
    assert_eq!(
        (dev.path().to_str().unwrap(), dev.major(), dev.minor(), dev.file_mode()),
        ("/dev/net/tun", 10, 200, Some(438))
    );
    let rules = res(&s).devices().as_ref().unwrap();
    assert!(!rules[0].allow(), "default deny first");
    assert!(rules.last().unwrap().allow());
    assert!(rules.iter().skip(1).all(|r| r.allow() && r.major() == Some(10)));
    // Removal of an original device.
    adjust(&mut s, &adj(r#"{"linux": {"devices": [{"path": "-/dev/net/tun"}]}}"#)).unwrap();
    assert!(s.linux().as_ref().unwrap().devices().as_ref().unwrap().is_empty());
    let e = adjust(
        &mut s,
        &adj(r#"{"linux": {"devices": [{"path": "/dev/x", "type": "z"}]}}"#),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("/dev/x") && e.to_string().contains("\"z\""),
        "{e}"
    );
}

#[test]
fn r18_hooks_appended_in_plugin_order() {
    let mut s = base_spec();
    let mut hooks = Hooks::default();
    let mut h0 = Hook::default();
    h0.set_path("/h0".into());
    hooks.set_create_runtime(Some(vec![h0]));
    s.set_hooks(Some(hooks));
    adjust(
        &mut s,
        &adj(
            r#"{"hooks": {"createRuntime": [{"path": "/h10"}, {"path": "/h20", "args": ["a"], "timeout": {"value": 5}}],
            "poststop": [{"path": "/p"}]}}"#,
        ),
    )
    .unwrap();
    let h = s.hooks().as_ref().unwrap();
    let paths: Vec<_> = h
        .create_runtime()
        .as_ref()
        .unwrap()
        .iter()
        .map(|x| x.path().to_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["/h0", "/h10", "/h20"]);
    assert_eq!(h.create_runtime().as_ref().unwrap()[2].timeout(), Some(5));
    assert_eq!(h.poststop().as_ref().unwrap().len(), 1);
}

#[test]
fn annotations_sysctl_net_devices_removals_before_sets() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"annotations": {"-drop": "", "new": "1", "-new": ""},
            "linux": {"sysctl": {"net.x": "1"}, "netDevices": {"eth1": {"name": "in0"}}}}"#),
    )
    .unwrap();
    let a = s.annotations().as_ref().unwrap();
    assert_eq!(
        a.get("new").map(String::as_str),
        Some("1"),
        "set wins over removal of the same key"
    );
    assert!(!a.contains_key("drop") && a.contains_key("keep"));
    let lin = s.linux().as_ref().unwrap();
    assert_eq!(lin.sysctl().as_ref().unwrap()["net.x"], "1");
    assert_eq!(
        lin.net_devices().as_ref().unwrap()["eth1"].name().as_deref(),
        Some("in0")
    );
}

#[test]
fn args_oom_cgroups_io_priority_scheduler() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(
            r#"{"args": ["/bin/x", "-v"], "linux": {"cgroupsPath": "/kubepods/x", "oomScoreAdj": {"value": 500},
            "ioPriority": {"class": "IOPRIO_CLASS_BE", "priority": 4},
            "scheduler": {"policy": "SCHED_BATCH", "nice": 5, "flags": ["SCHED_FLAG_RESET_ON_FORK"]}}}"#,
        ),
    )
    .unwrap();
    let p = s.process().as_ref().unwrap();
    assert_eq!(p.args().as_ref().unwrap(), &["/bin/x", "-v"]);
    assert_eq!(p.oom_score_adj(), Some(500));
    assert_eq!(p.io_priority().as_ref().unwrap().priority(), 4);
    assert_eq!(p.scheduler().as_ref().unwrap().nice(), &Some(5));
    assert_eq!(
        s.linux().as_ref().unwrap().cgroups_path().as_ref().unwrap(),
        &PathBuf::from("/kubepods/x")
    );
    // Class NONE / SCHED_NONE clear (upstream).
    adjust(
        &mut s,
        &adj(r#"{"linux": {"ioPriority": {"class": "IOPRIO_CLASS_NONE"}, "scheduler": {"policy": "SCHED_NONE"}}}"#),
    )
    .unwrap();
    assert!(s.process().as_ref().unwrap().io_priority().is_none());
    assert!(s.process().as_ref().unwrap().scheduler().is_none());
    let e = adjust(&mut s, &adj(r#"{"linux": {"oomScoreAdj": {"value": 5000}}}"#)).unwrap_err();
    assert!(e.to_string().contains("oom_score_adj"));
}

#[test]
fn seccomp_replaced_wholesale_keeping_errno() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(
            r#"{"linux": {"seccompPolicy": {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrno": {"value": 1},
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": {"value": 13},
               "args": [{"index": 1, "value": 2, "op": "SCMP_CMP_EQ"}]}]}}}"#,
        ),
    )
    .unwrap();
    let sc = s.linux().as_ref().unwrap().seccomp().as_ref().unwrap();
    assert_eq!(
        sc.default_errno_ret(),
        Some(1),
        "default errno kept (upstream drops it)"
    );
    assert_eq!(sc.syscalls().as_ref().unwrap()[0].errno_ret(), Some(13));
    let e = adjust(
        &mut s,
        &adj(r#"{"linux": {"seccompPolicy": {"defaultAction": "SCMP_ACT_BOGUS"}}}"#),
    )
    .unwrap_err();
    assert!(e.to_string().contains("SCMP_ACT_BOGUS"));
}

#[test]
fn namespaces_add_replace_remove_and_unknown_type() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"linux": {"namespaces": [{"type": "network", "path": "/proc/1/ns/net"}, {"type": "-mount"}, {"type": "uts"}]}}"#),
    )
    .unwrap();
    let ns = s.linux().as_ref().unwrap().namespaces().as_ref().unwrap();
    let got: Vec<_> = ns.iter().map(|n| format!("{:?}:{:?}", n.typ(), n.path())).collect();
    assert_eq!(got.len(), 3);
    assert!(
        ns.iter()
            .any(|n| n.typ() == LinuxNamespaceType::Network && n.path().is_some())
    );
    assert!(!ns.iter().any(|n| n.typ() == LinuxNamespaceType::Mount));
    let e = adjust(&mut s, &adj(r#"{"linux": {"namespaces": [{"type": "bogus"}]}}"#)).unwrap_err();
    assert!(e.to_string().contains("bogus"));
}

#[test]
fn rlimits_deduplicated_by_type() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 100, "soft": 50}]}"#),
    )
    .unwrap();
    adjust(
        &mut s,
        &adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 200, "soft": 100}]}"#),
    )
    .unwrap();
    let rl = s.process().as_ref().unwrap().rlimits().as_ref().unwrap();
    assert_eq!(rl.len(), 1);
    assert_eq!(rl[0].hard(), 200);
    let e = adjust(
        &mut s,
        &adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1, "soft": 2}]}"#),
    )
    .unwrap_err();
    assert!(e.to_string().contains("RLIMIT_NOFILE"));
    let e = adjust(
        &mut s,
        &adj(r#"{"rlimits": [{"type": "nofiles", "hard": 1, "soft": 1}]}"#),
    )
    .unwrap_err();
    assert!(e.to_string().contains("nofiles"), "{e}");
}

/// Upstream's generator passes rlimit types on as written, and plugins
/// (upstream's ulimit-adjuster among them) write `nofile`, `NOFILE` or
/// `rlimit_nofile`: all are the OCI `RLIMIT_NOFILE`, one limit.
#[test]
fn rlimit_types_in_any_case_with_or_without_prefix() {
    for name in ["nofile", "NOFILE", "rlimit_nofile", "Rlimit_NoFile", "RLIMIT_NOFILE"] {
        let mut s = base_spec();
        adjust(
            &mut s,
            &adj(&format!(
                r#"{{"rlimits": [{{"type": "{name}", "hard": 100, "soft": 50}}]}}"#
            )),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        adjust(
            &mut s,
            &adj(r#"{"rlimits": [{"type": "memlock", "hard": 7, "soft": 7}]}"#),
        )
        .unwrap();
        let rl = s.process().as_ref().unwrap().rlimits().clone().unwrap();
        let v = serde_json::to_value(&rl).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"type": "RLIMIT_NOFILE", "hard": 100, "soft": 50},
                {"type": "RLIMIT_MEMLOCK", "hard": 7, "soft": 7}
            ]),
            "{name}"
        );
    }
}

/// A memory limit set at creation on a spec without swap sets swap to the
/// limit, as upstream's generator does; an update does not.
#[test]
fn memory_limit_on_spec_without_swap_sets_swap() {
    let mut s = base_spec();
    let linux = s.linux_mut().as_mut().unwrap();
    let mut r = linux.resources().clone().unwrap();
    r.set_memory(None);
    linux.set_resources(Some(r));
    adjust(
        &mut s,
        &adj(r#"{"linux": {"resources": {"memory": {"limit": {"value": 268435456}}}}}"#),
    )
    .unwrap();
    let m = res(&s).memory().as_ref().unwrap();
    assert_eq!((m.limit(), m.swap()), (Some(268435456), Some(268435456)));
    // A plugin's own swap wins.
    let mut s = base_spec();
    let mut r = res(&s).clone();
    r.set_memory(None);
    s.linux_mut().as_mut().unwrap().set_resources(Some(r.clone()));
    adjust(
        &mut s,
        &adj(r#"{"linux": {"resources": {"memory": {"limit": {"value": 268435456}, "swap": {"value": -1}}}}}"#),
    )
    .unwrap();
    assert_eq!(res(&s).memory().as_ref().unwrap().swap(), Some(-1));
    // Updates of a running container leave a missing swap missing.
    update(&mut r, &json(r#"{"memory": {"limit": {"value": 268435456}}}"#)).unwrap();
    assert_eq!(r.memory().as_ref().unwrap().swap(), None);
}

/// An empty RDT schemata list clears the schemata and the adjusted spec
/// is what its JSON (config.json) says: the `adjust` fuzz target found
/// `Some([])` kept in memory, which JSON leaves out.
#[test]
fn an_empty_rdt_schemata_list_is_no_schemata_and_survives_json() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(r#"{"linux": {"rdt": {"schemata": {"value": ["L3:0=f"]}}}}"#),
    )
    .unwrap();
    adjust(&mut s, &adj(r#"{"linux": {"rdt": {"schemata": {"value": []}}}}"#)).unwrap();
    let rdt = s.linux().as_ref().unwrap().intel_rdt().clone().unwrap();
    assert_eq!(rdt.schemata(), &None);
    let back: Spec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert!(back == s, "the adjusted spec does not survive JSON");
}

#[test]
fn hugepages_unified_pids_rdt_memory_policy() {
    let mut s = base_spec();
    adjust(
        &mut s,
        &adj(
            r#"{"linux": {"resources": {"hugepageLimits": [{"pageSize": "2MB", "limit": "67108864"}],
            "unified": {"cpu.idle": "0"}, "pids": {"limit": "1024"}},
            "rdt": {"closId": {"value": "gold"}, "schemata": {"value": ["L3:0=f"]}},
            "memoryPolicy": {"mode": "MPOL_INTERLEAVE", "nodes": "0-1", "flags": ["MPOL_F_STATIC_NODES"]}}}"#,
        ),
    )
    .unwrap();
    let r = res(&s);
    assert_eq!(r.hugepage_limits().as_ref().unwrap()[0].limit(), 67108864);
    assert_eq!(r.unified().as_ref().unwrap()["cpu.idle"], "0");
    assert_eq!(r.pids().as_ref().unwrap().limit(), 1024);
    let lin = s.linux().as_ref().unwrap();
    assert_eq!(lin.intel_rdt().as_ref().unwrap().clos_id().as_deref(), Some("gold"));
    assert_eq!(lin.memory_policy().as_ref().unwrap().nodes().as_deref(), Some("0-1"));
    adjust(&mut s, &adj(r#"{"linux": {"rdt": {"remove": true}}}"#)).unwrap();
    assert!(s.linux().as_ref().unwrap().intel_rdt().is_none());
    let e = adjust(&mut s, &adj(r#"{"linux": {"memoryPolicy": {"mode": "MPOL_LOCAL"}}}"#)).unwrap_err();
    assert!(e.to_string().contains("MPOL_LOCAL"));
}

#[test]
fn cdi_and_classes_need_runtime_helpers() {
    let mut s = base_spec();
    let e = adjust(&mut s, &adj(r#"{"CDIDevices": [{"name": "vendor.com/gpu=0"}]}"#)).unwrap_err();
    assert!(matches!(e, AdjustError::Unsupported { .. }) && e.to_string().contains("vendor.com/gpu=0"));
    let e = adjust(
        &mut s,
        &adj(r#"{"linux": {"resources": {"blockioClass": {"value": "slow"}}}}"#),
    )
    .unwrap_err();
    assert!(e.to_string().contains("slow"));
    let seen = std::cell::RefCell::new(Vec::new());
    Adjuster::new()
        .with_cdi_injector(|spec, names| {
            seen.borrow_mut().extend(names.iter().cloned());
            spec.annotations_mut().get_or_insert_with(Default::default).insert("cdi".into(), names.join(","));
            Ok(())
        })
        .with_rdt_resolver(|class| {
            let mut r = LinuxIntelRdt::default();
            r.set_clos_id(Some(class.to_string()));
            Ok(r)
        })
        .adjust(
            &mut s,
            &adj(r#"{"CDIDevices": [{"name": "vendor.com/gpu=0"}], "linux": {"resources": {"rdtClass": {"value": "gold"}}}}"#),
        )
        .unwrap();
    assert_eq!(seen.borrow().as_slice(), ["vendor.com/gpu=0"]);
    assert_eq!(
        s.linux()
            .as_ref()
            .unwrap()
            .intel_rdt()
            .as_ref()
            .unwrap()
            .clos_id()
            .as_deref(),
        Some("gold")
    );
}

fn arb_env() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(("[A-D]{1,2}", "[a-z0-9]{0,3}"), 0..8)
        .prop_map(|v| v.into_iter().map(|(k, val)| format!("{k}={val}")).collect())
}

fn arb_env_adjust() -> impl Strategy<Value = Vec<(String, Option<String>)>> {
    proptest::collection::vec(("[A-F]{1,2}", proptest::option::of("[a-z]{0,3}")), 0..6)
}

fn arb_annotations() -> impl Strategy<Value = std::collections::HashMap<String, String>> {
    proptest::collection::hash_map("[a-e]{1,2}", "[a-z]{0,2}", 0..6)
}

proptest! {
    #[test]
    fn prop_zero_plugins_is_identity(env in arb_env(), ann in arb_annotations()) {
        let mut s = base_spec();
        s.process_mut().as_mut().unwrap().set_env(Some(env));
        s.set_annotations(Some(ann));
        let before = serde_json::to_vec(&s).unwrap();
        let rsp = CreateResult::new(api::CreateContainerRequest::new()).into_response();
        adjust(&mut s, rsp.adjust.get_or_default()).unwrap();
        prop_assert_eq!(serde_json::to_vec(&s).unwrap(), before);
    }

    #[test]
    fn prop_env_result_matches_model(env in arb_env(), changes in arb_env_adjust()) {
        let mut s = base_spec();
        s.process_mut().as_mut().unwrap().set_env(Some(env.clone()));
        let a = api::ContainerAdjustment {
            env: changes.iter().map(|(k, v)| api::KeyValue {
                key: if v.is_some() { k.clone() } else { format!("-{k}") },
                value: v.clone().unwrap_or_default(),
                ..Default::default()
            }).collect(),
            ..Default::default()
        };
        adjust(&mut s, &a).unwrap();
        let out = s.process().as_ref().unwrap().env().clone().unwrap_or_default();
        // Model: last change per key wins; untouched variables survive in order.
        let mut last: std::collections::HashMap<&str, Option<&str>> = Default::default();
        for (k, v) in &changes { last.insert(k, v.as_deref()); }
        for e in &env {
            let k = e.split_once('=').unwrap().0;
            if !last.contains_key(k) {
                prop_assert!(out.contains(e), "untouched {} lost", e);
            }
        }
        for (k, v) in &last {
            let found: Vec<String> = out.iter().filter(|e| e.split_once('=').unwrap().0 == *k).cloned().collect();
            match v {
                Some(v) => prop_assert_eq!(found, vec![format!("{k}={v}")]),
                None => prop_assert!(found.is_empty(), "{} not removed", k),
            }
        }
    }

    #[test]
    fn prop_annotation_removals_before_sets(orig in arb_annotations(), sets in arb_annotations(), dels in proptest::collection::vec("[a-e]{1,2}", 0..4)) {
        let mut s = base_spec();
        s.set_annotations(Some(orig.clone()));
        let mut a = api::ContainerAdjustment::new();
        for d in &dels { a.annotations.insert(format!("-{d}"), String::new()); }
        for (k, v) in &sets { a.annotations.insert(k.clone(), v.clone()); }
        adjust(&mut s, &a).unwrap();
        let out = s.annotations().clone().unwrap();
        for (k, v) in &sets { prop_assert_eq!(out.get(k), Some(v)); }
        for d in &dels { if !sets.contains_key(d) { prop_assert!(!out.contains_key(d)); } }
        for (k, v) in &orig { if !sets.contains_key(k) && !dels.contains(k) { prop_assert_eq!(out.get(k), Some(v)); } }
    }

    #[test]
    fn prop_untouched_fields_survive(cpus in "[0-3](-[4-7])?", limit in 1i64..(1 << 40)) {
        let mut s = base_spec();
        let before = s.clone();
        let a: api::ContainerAdjustment = json(&format!(r#"{{"linux": {{"resources": {{"cpu": {{"cpus": "{cpus}"}}, "memory": {{"limit": {{"value": "{limit}"}}}}}}}}}}"#));
        adjust(&mut s, &a).unwrap();
        prop_assert_eq!(s.process(), before.process());
        prop_assert_eq!(s.mounts(), before.mounts());
        prop_assert_eq!(s.annotations(), before.annotations());
        let cpu = res(&s).cpu().clone().unwrap();
        prop_assert_eq!(cpu.shares(), Some(1024));
        prop_assert_eq!(cpu.cpus().as_deref(), Some(cpus.as_str()));
        prop_assert_eq!(res(&s).memory().as_ref().unwrap().limit(), Some(limit));
    }
}
