//! Merge rules per field (how each adjustment field is merged), conflicts,
//! take-overs, update merging, and the numbered merge cases (`rNN_` tests).

use protobuf::MessageField;

use super::*;

fn json<M: protobuf::MessageFull>(s: &str) -> M {
    protobuf_json_mapping::parse_from_str(s).unwrap_or_else(|e| panic!("bad fixture {s}: {e}"))
}

fn rsp(s: &str) -> api::CreateContainerResponse {
    json(s)
}

fn adj(s: &str) -> api::CreateContainerResponse {
    rsp(&format!(r#"{{"adjust": {s}}}"#))
}

fn create(container: &str) -> CreateResult {
    CreateResult::new(json(&format!(r#"{{"pod": {{"id": "p1"}}, "container": {container}}}"#)))
}

fn c1() -> CreateResult {
    create(r#"{"id": "c1"}"#)
}

fn conflict(e: MergeError) -> String {
    e.to_string()
}

fn ctr(r: &CreateResult) -> &api::Container {
    r.request().container.get_or_default()
}

#[test]
fn request_is_normalized_before_the_first_plugin() {
    let r = c1();
    let c = ctr(&r);
    assert!(c.hooks.is_some() && c.linux.is_some());
    let res = c.linux.resources.get_or_default();
    assert!(c.linux.resources.is_some() && res.memory.is_some() && res.cpu.is_some());
    assert_eq!(r.pristine(), c);
}

#[test]
fn annotations_set_conflict_takeover_and_removal() {
    let mut r = create(r#"{"id": "c1", "annotations": {"orig": "1", "gone": "x"}}"#);
    r.apply("10-a", adj(r#"{"annotations": {"a": "1", "-gone": ""}}"#))
        .unwrap();
    assert_eq!(ctr(&r).annotations.get("a").unwrap(), "1");
    // Removal-only: reaches the runtime as a marker; the request keeps it (upstream).
    assert!(r.adjustment().annotations.contains_key("-gone"));
    assert!(ctr(&r).annotations.contains_key("gone"));
    let e = r
        .clone()
        .apply("20-b", adj(r#"{"annotations": {"a": "2"}}"#))
        .unwrap_err();
    assert_eq!(
        conflict(e),
        r#"plugins "20-b" and "10-a" both tried to set Annotations a"#
    );
    // Remove + set in one response takes over; the reply holds both.
    r.apply("20-b", adj(r#"{"annotations": {"-a": "", "a": "2"}}"#))
        .unwrap();
    assert_eq!(r.adjustment().annotations.get("a").unwrap(), "2");
    assert!(r.adjustment().annotations.contains_key("-a"));
    assert_eq!(ctr(&r).annotations.get("a").unwrap(), "2");
    assert_eq!(r.owners().compound_owner("c1", Field::Annotations, "a"), Some("20-b"));
}

#[test]
fn r14_mount_merging_view_removal_and_conflict() {
    let mut r = create(
        r#"{"id": "c1", "mounts": [
            {"destination": "/etc/hosts", "source": "/h", "type": "bind"},
            {"destination": "/data", "source": "/host/data", "type": "bind"}]}"#,
    );
    r.apply(
        "10-a",
        adj(r#"{"mounts": [
            {"destination": "/opt/x/y", "source": "/host/y", "type": "bind"},
            {"destination": "/opt/x", "type": "tmpfs", "source": "tmpfs"}]}"#),
    )
    .unwrap();
    // 20-b's request lists the original mounts and 10-a's.
    let seen: Vec<_> = ctr(&r).mounts.iter().map(|m| m.destination.as_str()).collect();
    assert_eq!(seen, ["/etc/hosts", "/data", "/opt/x/y", "/opt/x"]);
    r.apply("20-b", adj(r#"{"mounts": [{"destination": "-/data"}]}"#))
        .unwrap();
    let reply: Vec<_> = r.adjustment().mounts.iter().map(|m| m.destination.as_str()).collect();
    assert_eq!(reply, ["/opt/x/y", "/opt/x", "-/data"]);
    assert!(ctr(&r).mounts.iter().all(|m| m.destination != "/data"));
    // /opt/x/y keeps options absent.
    assert!(r.adjustment().mounts[0].options.is_empty());
    let e = r
        .apply(
            "30-c",
            adj(r#"{"mounts": [{"destination": "/opt/x", "type": "tmpfs"}]}"#),
        )
        .unwrap_err();
    assert_eq!(
        conflict(e),
        r#"plugins "30-c" and "10-a" both tried to set Mounts /opt/x"#
    );
}

#[test]
fn mount_removed_by_later_plugin_can_only_be_readded_by_it() {
    let mut r = c1();
    r.apply("10-a", adj(r#"{"mounts": [{"destination": "/m", "source": "/a"}]}"#))
        .unwrap();
    r.apply("20-b", adj(r#"{"mounts": [{"destination": "-/m"}]}"#)).unwrap();
    assert!(r.adjustment().mounts.iter().all(|m| m.destination != "/m"));
    assert_eq!(r.owners().compound_owner("c1", Field::Mounts, "/m"), Some("-20-b"));
    let e = r
        .clone()
        .apply("30-c", adj(r#"{"mounts": [{"destination": "/m", "source": "/c"}]}"#))
        .unwrap_err();
    assert!(conflict(e).contains(r#""30-c" and "20-b""#));
}

#[test]
fn r13_env_override_replaces_in_place() {
    let mut r = create(r#"{"id": "c1", "env": ["PATH=/bin", "FOO=image", "BAR=1"]}"#);
    r.apply("10-a", adj(r#"{"env": [{"key": "FOO", "value": "nri"}]}"#))
        .unwrap();
    // 20-b already sees FOO=nri, exactly once.
    let foo: Vec<_> = ctr(&r).env.iter().filter(|e| e.starts_with("FOO=")).collect();
    assert_eq!(foo, ["FOO=nri"]);
    r.apply("20-b", adj(r#"{"env": [{"key": "-BAR"}]}"#)).unwrap();
    assert!(!ctr(&r).env.iter().any(|e| e.starts_with("BAR=")));
    // Fix of upstream: the removal of an original variable reaches the runtime.
    let keys: Vec<_> = r.adjustment().env.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["FOO", "-BAR"]);
}

#[test]
fn r13_env_conflict_names_both_plugins_and_variable() {
    let mut r = c1();
    r.apply("10-a", adj(r#"{"env": [{"key": "FOO", "value": "a"}]}"#))
        .unwrap();
    let e = r
        .apply("20-b", adj(r#"{"env": [{"key": "FOO", "value": "b"}]}"#))
        .unwrap_err();
    assert_eq!(conflict(e), r#"plugins "20-b" and "10-a" both tried to set Env FOO"#);
}

#[test]
fn env_takeover_by_remove_then_set() {
    let mut r = c1();
    r.apply("10-a", adj(r#"{"env": [{"key": "FOO", "value": "a"}]}"#))
        .unwrap();
    r.apply(
        "20-b",
        adj(r#"{"env": [{"key": "-FOO"}, {"key": "FOO", "value": "b"}]}"#),
    )
    .unwrap();
    let env: Vec<_> = r
        .adjustment()
        .env
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    assert_eq!(env, ["FOO=b"]);
    assert_eq!(ctr(&r).env, ["FOO=b"]);
}

#[test]
fn same_key_twice_in_one_response_conflicts_with_itself() {
    // M-1: claims are not idempotent (upstream).
    let e = c1()
        .apply(
            "10-a",
            adj(r#"{"env": [{"key": "X", "value": "1"}, {"key": "X", "value": "2"}]}"#),
        )
        .unwrap_err();
    assert_eq!(conflict(e), r#"plugins "10-a" and "10-a" both tried to set Env X"#);
}

#[test]
fn args_set_conflict_and_override() {
    let mut r = create(r#"{"id": "c1", "args": ["sh"]}"#);
    r.apply("10-a", adj(r#"{"args": ["a", "b"]}"#)).unwrap();
    assert_eq!(ctr(&r).args, ["a", "b"]);
    let e = r.clone().apply("20-b", adj(r#"{"args": ["c"]}"#)).unwrap_err();
    assert_eq!(conflict(e), r#"plugins "20-b" and "10-a" both tried to set Args"#);
    // A leading "" overrides (UpdateArgs); later plugins see earlier args.
    let mut appended = ctr(&r).args.clone();
    appended.insert(0, String::new());
    appended.push("c".into());
    let a = api::ContainerAdjustment {
        args: appended,
        ..Default::default()
    };
    r.apply(
        "20-b",
        api::CreateContainerResponse {
            adjust: MessageField::some(a),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.adjustment().args, ["a", "b", "c"]);
}

#[test]
fn r18_hooks_accumulate_across_plugins() {
    let mut r = create(r#"{"id": "c1", "hooks": {"createRuntime": [{"path": "/h0"}]}}"#);
    for (p, h) in [("10-a", "/h10"), ("20-b", "/h20"), ("30-c", "/h30")] {
        r.apply(
            p,
            adj(&format!(r#"{{"hooks": {{"createRuntime": [{{"path": "{h}"}}]}}}}"#)),
        )
        .unwrap();
    }
    let seen: Vec<_> = ctr(&r).hooks.create_runtime.iter().map(|h| h.path.as_str()).collect();
    assert_eq!(seen, ["/h0", "/h10", "/h20", "/h30"]);
    let reply: Vec<_> = r
        .adjustment()
        .hooks
        .create_runtime
        .iter()
        .map(|h| h.path.as_str())
        .collect();
    assert_eq!(reply, ["/h10", "/h20", "/h30"]);
    assert_eq!(r.owners().simple_owner("c1", Field::OciHooks), Some("10-a,20-b,30-c"));
}

#[test]
fn rlimits_claimed_per_type_and_appended() {
    let mut r = c1();
    r.apply(
        "10-a",
        adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 10, "soft": 5}]}"#),
    )
    .unwrap();
    r.apply(
        "20-b",
        adj(r#"{"rlimits": [{"type": "RLIMIT_NPROC", "hard": 9, "soft": 9}]}"#),
    )
    .unwrap();
    assert_eq!(ctr(&r).rlimits.len(), 2);
    assert_eq!(r.adjustment().rlimits.len(), 2);
    let e = r
        .apply(
            "30-c",
            adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1, "soft": 1}]}"#),
        )
        .unwrap_err();
    assert_eq!(
        conflict(e),
        r#"plugins "30-c" and "10-a" both tried to set Rlimits RLIMIT_NOFILE"#
    );
    // `nofile` is the same limit as `RLIMIT_NOFILE` (see adjust).
    let mut r = c1();
    r.apply(
        "10-a",
        adj(r#"{"rlimits": [{"type": "nofile", "hard": 10, "soft": 5}]}"#),
    )
    .unwrap();
    let e = r
        .apply(
            "30-c",
            adj(r#"{"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1, "soft": 1}]}"#),
        )
        .unwrap_err();
    assert_eq!(
        conflict(e),
        r#"plugins "30-c" and "10-a" both tried to set Rlimits RLIMIT_NOFILE"#
    );
}

#[test]
fn cdi_devices_claimed_per_name_not_written_back() {
    let mut r = c1();
    r.apply("10-a", adj(r#"{"CDIDevices": [{"name": "vendor.com/gpu=0"}]}"#))
        .unwrap();
    assert_eq!(r.adjustment().CDI_devices.len(), 1);
    assert!(ctr(&r).CDI_devices.is_empty());
    let e = r
        .apply("20-b", adj(r#"{"CDIDevices": [{"name": "vendor.com/gpu=0"}]}"#))
        .unwrap_err();
    assert!(conflict(e).ends_with("CdiDevices vendor.com/gpu=0"));
}

#[test]
fn r17_devices_and_cgroup_rules() {
    let mut r = create(
        r#"{"id": "c1", "linux": {"devices": [{"path": "/dev/old", "type": "c", "major": 1, "minor": 3}],
            "resources": {"devices": [{"allow": false, "access": "rwm"}]}}}"#,
    );
    r.apply(
        "10-a",
        adj(r#"{"linux": {"devices": [{"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200}],
            "resources": {"devices": [{"allow": true, "type": "c", "major": {"value": 10}, "minor": {"value": 200}, "access": "rwm"}]}}}"#),
    )
    .unwrap();
    // 20-b sees the device and the rule after the default deny.
    let c = ctr(&r);
    assert!(c.linux.devices.iter().any(|d| d.path == "/dev/net/tun"));
    let rules = &c.linux.resources.devices;
    assert_eq!(rules.len(), 2);
    assert!(!rules[0].allow && rules[1].allow);
    // Cgroup rules are never conflict-checked.
    r.apply(
        "20-b",
        adj(r#"{"linux": {"devices": [{"path": "-/dev/old"}], "resources": {"devices": [{"allow": true, "access": "r"}]}}}"#),
    )
    .unwrap();
    let l = r.adjustment().linux.get_or_default();
    let paths: Vec<_> = l.devices.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/dev/net/tun", "-/dev/old"],
        "removal of an original device is forwarded"
    );
    assert_eq!(l.resources.devices.len(), 2);
    let e = r
        .apply(
            "30-c",
            adj(r#"{"linux": {"devices": [{"path": "/dev/net/tun", "type": "c"}]}}"#),
        )
        .unwrap_err();
    assert!(conflict(e).ends_with("Devices /dev/net/tun"));
}

#[test]
fn memory_subfields_are_owned_separately() {
    let fields = [
        ("limit", "{\"value\": 1}", "MemLimit"),
        ("reservation", "{\"value\": 1}", "MemReservation"),
        ("swap", "{\"value\": 1}", "MemSwapLimit"),
        ("kernel", "{\"value\": 1}", "MemKernelLimit"),
        ("kernelTcp", "{\"value\": 1}", "MemTCPLimit"),
        ("swappiness", "{\"value\": 1}", "MemSwappiness"),
        ("disableOomKiller", "{\"value\": true}", "MemDisableOomKiller"),
        ("useHierarchy", "{\"value\": true}", "MemUseHierarchy"),
    ];
    let mut r = c1();
    for (i, (f, v, _)) in fields.iter().enumerate() {
        r.apply(
            &format!("{i:02}-p"),
            adj(&format!(
                r#"{{"linux": {{"resources": {{"memory": {{"{f}": {v}}}}}}}}}"#
            )),
        )
        .unwrap();
    }
    let mem = ctr(&r).linux.resources.memory.get_or_default().clone();
    assert_eq!(mem, r.adjustment().linux.resources.memory.get_or_default().clone());
    assert!(mem.limit.is_some() && mem.use_hierarchy.is_some() && mem.kernel_tcp.is_some());
    for (i, (f, v, field)) in fields.iter().enumerate() {
        let e = r
            .clone()
            .apply(
                "99-z",
                adj(&format!(
                    r#"{{"linux": {{"resources": {{"memory": {{"{f}": {v}}}}}}}}}"#
                )),
            )
            .unwrap_err();
        assert_eq!(
            conflict(e),
            format!(r#"plugins "99-z" and "{i:02}-p" both tried to set {field}"#)
        );
    }
}

#[test]
fn cpu_subfields_are_owned_separately() {
    let fields = [
        ("shares", "{\"value\": 1}", "CPUShares"),
        ("quota", "{\"value\": 1}", "CPUQuota"),
        ("period", "{\"value\": 1}", "CPUPeriod"),
        ("realtimeRuntime", "{\"value\": 1}", "CPURealtimeRuntime"),
        ("realtimePeriod", "{\"value\": 1}", "CPURealtimePeriod"),
        ("cpus", "\"0-1\"", "CPUSetCPUs"),
        ("mems", "\"0\"", "CPUSetMems"),
    ];
    let mut r = c1();
    for (i, (f, v, _)) in fields.iter().enumerate() {
        r.apply(
            &format!("{i:02}-p"),
            adj(&format!(r#"{{"linux": {{"resources": {{"cpu": {{"{f}": {v}}}}}}}}}"#)),
        )
        .unwrap();
    }
    for (i, (f, v, field)) in fields.iter().enumerate() {
        let e = r
            .clone()
            .apply(
                "99-z",
                adj(&format!(r#"{{"linux": {{"resources": {{"cpu": {{"{f}": {v}}}}}}}}}"#)),
            )
            .unwrap_err();
        assert_eq!(
            conflict(e),
            format!(r#"plugins "99-z" and "{i:02}-p" both tried to set {field}"#)
        );
    }
    // Empty cpus/mems do not count as set.
    r.apply("98-y", adj(r#"{"linux": {"resources": {"cpu": {"cpus": ""}}}}"#))
        .unwrap();
}

#[test]
fn r16_unset_resource_fields_survive() {
    let mut r = create(
        r#"{"id": "c1", "linux": {"resources": {"cpu": {"shares": {"value": 1024}, "quota": {"value": 50000}, "period": {"value": 100000}},
            "memory": {"limit": {"value": 1073741824}}}}}"#,
    );
    r.apply("10-a", adj(r#"{"linux": {"resources": {"cpu": {"cpus": "0-1"}}}}"#))
        .unwrap();
    let cpu = ctr(&r).linux.resources.cpu.get_or_default();
    assert_eq!(cpu.shares.value, 1024);
    assert_eq!(cpu.quota.value, 50000);
    assert_eq!(cpu.period.value, 100000);
    assert_eq!(cpu.cpus, "0-1");
    assert_eq!(ctr(&r).linux.resources.memory.limit.value, 1073741824);
    // The reply carries only what the plugin set.
    let reply_cpu = r.adjustment().linux.resources.cpu.get_or_default();
    assert!(reply_cpu.shares.is_none() && reply_cpu.quota.is_none());
    assert_eq!(reply_cpu.cpus, "0-1");
}

/// Fix of a drift between the merge and `adjust`: the merge appended a
/// plugin's hugepage limit next to the original one of the same page size,
/// so later plugins saw two limits where the spec gets one.
#[test]
fn hugepage_limit_replaces_the_original_of_its_page_size() {
    let mut r = create(
        r#"{"id": "c1", "linux": {"resources": {"hugepageLimits": [{"pageSize": "2MB", "limit": 1},
            {"pageSize": "1GB", "limit": 3}]}}}"#,
    );
    r.apply(
        "10-a",
        adj(r#"{"linux": {"resources": {"hugepageLimits": [{"pageSize": "2MB", "limit": 5}]}}}"#),
    )
    .unwrap();
    let limits: Vec<(&str, u64)> = ctr(&r)
        .linux
        .resources
        .hugepage_limits
        .iter()
        .map(|h| (h.page_size.as_str(), h.limit))
        .collect();
    assert_eq!(limits, [("1GB", 3), ("2MB", 5)]);
}

#[test]
fn hugepages_unified_classes_and_pids() {
    let mut r = c1();
    r.apply(
        "10-a",
        adj(
            r#"{"linux": {"resources": {"hugepageLimits": [{"pageSize": "2MB", "limit": 1}],
            "unified": {"memory.high": "1"}, "blockioClass": {"value": "slow"},
            "rdtClass": {"value": "gold"}, "pids": {"limit": 10}}}}"#,
        ),
    )
    .unwrap();
    r.apply(
        "20-b",
        adj(r#"{"linux": {"resources": {"hugepageLimits": [{"pageSize": "1GB", "limit": 1}], "unified": {"cpu.idle": "1"}}}}"#),
    )
    .unwrap();
    let res = ctr(&r).linux.resources.get_or_default();
    assert_eq!(res.hugepage_limits.len(), 2);
    assert_eq!(res.unified.len(), 2);
    assert_eq!(res.pids.limit, 10);
    for (json, field) in [
        (
            r#"{"hugepageLimits": [{"pageSize": "2MB", "limit": 2}]}"#,
            "HugepageLimits 2MB",
        ),
        (r#"{"unified": {"memory.high": "2"}}"#, "CgroupsUnified memory.high"),
        (r#"{"blockioClass": {"value": "x"}}"#, "BlockioClass"),
        (r#"{"rdtClass": {"value": "x"}}"#, "RdtClass"),
        (r#"{"pids": {"limit": 1}}"#, "PidsLimit"),
    ] {
        let e = r
            .clone()
            .apply("30-c", adj(&format!(r#"{{"linux": {{"resources": {json}}}}}"#)))
            .unwrap_err();
        assert_eq!(
            conflict(e),
            format!(r#"plugins "30-c" and "10-a" both tried to set {field}"#)
        );
    }
}

#[test]
fn simple_linux_fields_conflict() {
    for (json, field) in [
        (r#"{"cgroupsPath": "/x"}"#, "CgroupsPath"),
        (r#"{"oomScoreAdj": {"value": 5}}"#, "OomScoreAdj"),
        (
            r#"{"ioPriority": {"class": "IOPRIO_CLASS_BE", "priority": 1}}"#,
            "IoPriority",
        ),
        (
            r#"{"seccompPolicy": {"defaultAction": "SCMP_ACT_ALLOW"}}"#,
            "SeccompPolicy",
        ),
        (r#"{"scheduler": {"policy": "SCHED_BATCH"}}"#, "LinuxSched"),
        (
            r#"{"memoryPolicy": {"mode": "MPOL_BIND", "nodes": "0"}}"#,
            "MemoryPolicy",
        ),
    ] {
        let mut r = c1();
        r.apply("10-a", adj(&format!(r#"{{"linux": {json}}}"#))).unwrap();
        let e = r.apply("20-b", adj(&format!(r#"{{"linux": {json}}}"#))).unwrap_err();
        assert_eq!(
            conflict(e),
            format!(r#"plugins "20-b" and "10-a" both tried to set {field}"#)
        );
    }
    let mut r = c1();
    r.apply(
        "10-a",
        adj(r#"{"linux": {"cgroupsPath": "/x", "oomScoreAdj": {"value": 5}}}"#),
    )
    .unwrap();
    assert_eq!(ctr(&r).linux.cgroups_path, "/x");
    assert_eq!(ctr(&r).linux.oom_score_adj.value, 5);
}

#[test]
fn namespaces_claim_even_on_removal_and_keep_order() {
    let mut r = create(
        r#"{"id": "c1", "linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/a"}, {"type": "ipc"}]}}"#,
    );
    r.apply(
        "10-a",
        adj(r#"{"linux": {"namespaces": [{"type": "network", "path": "/b"}, {"type": "-ipc"}, {"type": "uts"}]}}"#),
    )
    .unwrap();
    let ns: Vec<_> = ctr(&r)
        .linux
        .namespaces
        .iter()
        .map(|n| format!("{}:{}", n.type_, n.path))
        .collect();
    assert_eq!(ns, ["pid:", "network:/b", "uts:"]);
    let e = r
        .apply("20-b", adj(r#"{"linux": {"namespaces": [{"type": "-ipc"}]}}"#))
        .unwrap_err();
    assert_eq!(
        conflict(e),
        r#"plugins "20-b" and "10-a" both tried to set Namespace ipc"#
    );
}

#[test]
fn sysctl_and_net_devices_behave_like_annotations() {
    let mut r = create(r#"{"id": "c1", "linux": {"sysctl": {"net.a": "1"}, "netDevices": {"eth9": {"name": "x"}}}}"#);
    r.apply(
        "10-a",
        adj(r#"{"linux": {"sysctl": {"net.b": "2", "-net.a": ""}, "netDevices": {"eth1": {"name": "n1"}, "-eth9": {}}}}"#),
    )
    .unwrap();
    let l = r.adjustment().linux.get_or_default();
    assert!(l.sysctl.contains_key("-net.a") && l.sysctl.contains_key("net.b"));
    assert!(l.net_devices.contains_key("-eth9") && l.net_devices.contains_key("eth1"));
    let e = r
        .clone()
        .apply("20-b", adj(r#"{"linux": {"sysctl": {"net.b": "3"}}}"#))
        .unwrap_err();
    assert!(conflict(e).ends_with("Sysctl net.b"));
    let e = r
        .clone()
        .apply("20-b", adj(r#"{"linux": {"netDevices": {"eth1": {"name": "n2"}}}}"#))
        .unwrap_err();
    assert!(conflict(e).ends_with("LinuxNetDevices eth1"));
    r.apply("20-b", adj(r#"{"linux": {"sysctl": {"-net.b": "", "net.b": "3"}}}"#))
        .unwrap();
    assert_eq!(ctr(&r).linux.sysctl.get("net.b").unwrap(), "3");
}

#[test]
fn rdt_remove_then_set_and_no_empty_rdt() {
    let mut r = c1();
    r.apply("10-a", adj(r#"{"linux": {"cgroupsPath": "/x"}}"#)).unwrap();
    assert!(r.adjustment().linux.rdt.is_none(), "M-5 fix: no empty rdt");
    r.apply(
        "20-b",
        adj(r#"{"linux": {"rdt": {"closId": {"value": "gold"}, "enableMonitoring": {"value": true}}}}"#),
    )
    .unwrap();
    let e = r
        .clone()
        .apply("30-c", adj(r#"{"linux": {"rdt": {"closId": {"value": "silver"}}}}"#))
        .unwrap_err();
    assert!(conflict(e).ends_with("RdtClosID"));
    r.apply(
        "30-c",
        adj(r#"{"linux": {"rdt": {"remove": true, "closId": {"value": "silver"}}}}"#),
    )
    .unwrap();
    let rdt = r.adjustment().linux.rdt.get_or_default();
    assert_eq!(rdt.clos_id.value, "silver");
    assert!(!rdt.remove);
    assert!(rdt.enable_monitoring.is_none(), "remove dropped 20-b's monitoring");
}

#[test]
fn updates_to_other_containers_merge_per_field() {
    let mut r = c1();
    r.apply(
        "10-a",
        rsp(r#"{"update": [{"containerId": "c2", "linux": {"resources": {"cpu": {"cpus": "1"}}}, "ignoreFailure": true}]}"#),
    )
    .unwrap();
    r.apply(
        "20-b",
        rsp(
            r#"{"update": [{"containerId": "c2", "linux": {"resources": {"memory": {"limit": {"value": 5}}}}},
            {"containerId": "c3", "linux": {"resources": {"cpu": {"mems": "0"}}}}]}"#,
        ),
    )
    .unwrap();
    let u = r.updates();
    assert_eq!(u.len(), 2);
    assert_eq!(u[0].container_id, "c2");
    assert!(!u[0].ignore_failure, "ignore_failure only if every contributor asked");
    let res = u[0].linux.resources.get_or_default();
    assert_eq!((res.cpu.cpus.as_str(), res.memory.limit.value), ("1", 5));
    let e = r
        .apply(
            "30-c",
            rsp(r#"{"update": [{"containerId": "c2", "linux": {"resources": {"cpu": {"cpus": "2"}}}}]}"#),
        )
        .unwrap_err();
    assert_eq!(conflict(e), r#"plugins "30-c" and "10-a" both tried to set CPUSetCPUs"#);
}

#[test]
fn update_of_the_created_container_is_refused() {
    let e = c1()
        .apply(
            "10-a",
            rsp(r#"{"update": [{"containerId": "c1", "linux": {"resources": {"cpu": {"cpus": "1"}}}}]}"#),
        )
        .unwrap_err();
    assert_eq!(e.to_string(), r#"plugin "10-a" asked update of "c1" during creation"#);
}

#[test]
fn ignored_failed_update_leaves_no_trace() {
    let mut r = c1();
    r.apply(
        "10-a",
        rsp(r#"{"update": [{"containerId": "c2", "linux": {"resources": {"cpu": {"cpus": "1"}}}}]}"#),
    )
    .unwrap();
    let before = r.owners().clone();
    // c9 is new and merges; the c2 update conflicts with 10-a and is dropped.
    r.apply(
        "20-b",
        rsp(r#"{"update": [{"containerId": "c9", "ignoreFailure": true, "linux": {"resources": {"memory": {"limit": {"value": 1}}, "cpu": {"cpus": "9"}}}},
            {"containerId": "c2", "ignoreFailure": true, "linux": {"resources": {"memory": {"swap": {"value": 1}}, "cpu": {"cpus": "2"}}}}]}"#),
    )
    .unwrap();
    assert_eq!(r.updates().len(), 2);
    let c2 = &r.updates()[0];
    assert_eq!(c2.linux.resources.cpu.cpus, "1");
    assert!(
        c2.linux.resources.memory.swap.is_none(),
        "claims of the failed update were rolled back"
    );
    assert!(!c2.ignore_failure, "flag of the dropped update did not count");
    assert_eq!(
        r.owners().simple_owner("c2", Field::MemSwapLimit),
        before.simple_owner("c2", Field::MemSwapLimit)
    );
}

fn update_req(resources: &str) -> api::UpdateContainerRequest {
    json(&format!(
        r#"{{"pod": {{"id": "p1"}}, "container": {{"id": "c1"}}, "linuxResources": {resources}}}"#
    ))
}

#[test]
fn update_container_target_is_last_with_full_resources() {
    let mut r = UpdateResult::for_update(update_req(
        r#"{"cpu": {"shares": {"value": 512}}, "memory": {"limit": {"value": 100}}}"#,
    ));
    r.apply(
        "10-a",
        vec![
            json(r#"{"containerId": "c1", "linux": {"resources": {"cpu": {"cpus": "0-1"}}}}"#),
            json(r#"{"containerId": "c2", "linux": {"resources": {"cpu": {"cpus": "2"}}}}"#),
        ],
    )
    .unwrap();
    // The next plugin sees 10-a's override in the request.
    assert_eq!(r.update_request().linux_resources.cpu.cpus, "0-1");
    r.apply(
        "20-b",
        vec![json(
            r#"{"containerId": "c1", "linux": {"resources": {"pids": {"limit": 64}}}}"#,
        )],
    )
    .unwrap();
    let u = r.into_updates();
    assert_eq!(u.len(), 2);
    assert_eq!(u[0].container_id, "c2");
    let last = &u[1];
    assert_eq!(last.container_id, "c1");
    let res = last.linux.resources.get_or_default();
    assert_eq!(res.cpu.shares.value, 512);
    assert_eq!(res.cpu.cpus, "0-1");
    assert_eq!(res.memory.limit.value, 100);
    assert_eq!(res.pids.limit, 64, "pids in updates are applied (upstream bug fixed)");
}

#[test]
fn update_container_untouched_target_is_the_request() {
    let r = UpdateResult::for_update(update_req(r#"{"cpu": {"cpus": "2"}}"#));
    let u = r.into_updates();
    assert_eq!(u.len(), 1);
    let res = u[0].linux.resources.get_or_default();
    assert_eq!(res.cpu.cpus, "2");
    assert!(res.memory.is_some(), "memory object present, fields absent (R16)");
    assert!(res.memory.limit.is_none());
}

#[test]
fn update_conflicts_between_plugins() {
    let mut r = UpdateResult::for_update(update_req("{}"));
    r.apply(
        "10-a",
        vec![json(
            r#"{"containerId": "c1", "linux": {"resources": {"cpu": {"cpus": "1"}}}}"#,
        )],
    )
    .unwrap();
    let e = r
        .apply(
            "20-b",
            vec![json(
                r#"{"containerId": "c1", "linux": {"resources": {"cpu": {"cpus": "2"}}}}"#,
            )],
        )
        .unwrap_err();
    assert_eq!(conflict(e), r#"plugins "20-b" and "10-a" both tried to set CPUSetCPUs"#);
}

#[test]
fn stop_container_updates_merge() {
    let mut r = UpdateResult::for_stop();
    r.apply(
        "10-a",
        vec![json(
            r#"{"containerId": "c2", "linux": {"resources": {"cpu": {"cpus": "0-3"}}}}"#,
        )],
    )
    .unwrap();
    let u = r.into_updates();
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].linux.resources.cpu.cpus, "0-3");
}

proptest::proptest! {
    /// `env_has` names an entry exactly as its text up to the first `=`
    /// does (entries and keys from a small alphabet, so `=`, prefixes and
    /// equal lengths come up often).
    #[test]
    fn env_has_matches_the_name_before_the_first_equals(entry in "[AB=]{0,5}", key in "[AB=]{0,4}") {
        let name = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
        proptest::prop_assert_eq!(env_has(&entry, &key), name == key);
    }
}
