use std::collections::HashSet;

use nri_proto::api;
use protobuf::MessageField;

use super::*;
use crate::resources::Shape;

fn adjusted(f: impl FnOnce(&mut api::ContainerAdjustment)) -> api::CreateContainerResponse {
    let mut rsp = api::CreateContainerResponse::new();
    f(rsp.adjust.mut_or_insert_default());
    rsp
}

fn linux(f: impl FnOnce(&mut api::LinuxContainerAdjustment)) -> api::CreateContainerResponse {
    adjusted(|a| f(a.linux.mut_or_insert_default()))
}

fn resources(f: impl FnOnce(&mut api::LinuxResources)) -> api::LinuxResources {
    let mut r = api::LinuxResources::new();
    f(&mut r);
    r
}

/// One value of each resource group, and the field an error names.
fn resource_cases() -> Vec<(FieldGroup, api::LinuxResources, &'static str)> {
    use FieldGroup as G;
    vec![
        (
            G::Memory,
            resources(|r| r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 20),
            "linux.resources.memory.limit",
        ),
        (
            G::Cpu,
            resources(|r| r.cpu.mut_or_insert_default().cpus = "0-1".into()),
            "linux.resources.cpu.cpus",
        ),
        (
            G::HugepageLimits,
            resources(|r| {
                r.hugepage_limits.push(api::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 1 << 21,
                    ..Default::default()
                })
            }),
            "linux.resources.hugepage_limits",
        ),
        (
            G::BlockioClass,
            resources(|r| r.blockio_class.mut_or_insert_default().value = "slow".into()),
            "linux.resources.blockio_class",
        ),
        (
            G::RdtClass,
            resources(|r| r.rdt_class.mut_or_insert_default().value = "gold".into()),
            "linux.resources.rdt_class",
        ),
        (
            G::Unified,
            resources(|r| {
                r.unified.insert("memory.high".into(), "max".into());
            }),
            "linux.resources.unified",
        ),
        (
            G::CgroupDevices,
            resources(|r| {
                r.devices.push(api::LinuxDeviceCgroup {
                    allow: true,
                    access: "rwm".into(),
                    ..Default::default()
                })
            }),
            "linux.resources.devices",
        ),
        (
            G::Pids,
            resources(|r| r.pids.mut_or_insert_default().limit = 100),
            "linux.resources.pids",
        ),
    ]
}

/// A CreateContainer answer touching exactly one group, for every group,
/// and the field the error names.
fn create_cases() -> Vec<(FieldGroup, api::CreateContainerResponse, String)> {
    use FieldGroup as G;
    let mut cases: Vec<(FieldGroup, api::CreateContainerResponse, String)> = vec![
        (
            G::Annotations,
            adjusted(|a| {
                a.annotations.insert("b.example.com/x".into(), "1".into());
                a.annotations.insert("a.example.com/x".into(), "2".into());
            }),
            "annotations a.example.com/x".into(),
        ),
        (
            G::Mounts,
            adjusted(|a| {
                a.mounts.push(api::Mount {
                    destination: "/data".into(),
                    source: "tmpfs".into(),
                    type_: "tmpfs".into(),
                    ..Default::default()
                })
            }),
            "mounts /data".into(),
        ),
        (
            G::Env,
            adjusted(|a| {
                a.env.push(api::KeyValue {
                    key: "FOO".into(),
                    value: "1".into(),
                    ..Default::default()
                })
            }),
            "env FOO".into(),
        ),
        (
            G::Hooks,
            adjusted(|a| {
                a.hooks.mut_or_insert_default().poststop.push(api::Hook {
                    path: "/bin/true".into(),
                    ..Default::default()
                })
            }),
            "hooks.poststop".into(),
        ),
        (
            G::Rlimits,
            adjusted(|a| {
                a.rlimits.push(api::POSIXRlimit {
                    type_: "RLIMIT_NOFILE".into(),
                    hard: 1024,
                    soft: 1024,
                    ..Default::default()
                })
            }),
            "rlimits RLIMIT_NOFILE".into(),
        ),
        (
            G::CdiDevices,
            adjusted(|a| {
                a.CDI_devices.push(api::CDIDevice {
                    name: "vendor.com/gpu=0".into(),
                    ..Default::default()
                })
            }),
            "CDI_devices vendor.com/gpu=0".into(),
        ),
        (
            G::Args,
            adjusted(|a| a.args = vec!["sleep".into(), "1".into()]),
            "args".into(),
        ),
        (
            G::Devices,
            linux(|l| {
                l.devices.push(api::LinuxDevice {
                    path: "/dev/fuse".into(),
                    type_: "c".into(),
                    major: 10,
                    minor: 229,
                    ..Default::default()
                })
            }),
            "linux.devices /dev/fuse".into(),
        ),
        (
            G::CgroupsPath,
            linux(|l| l.cgroups_path = "/elsewhere".into()),
            "linux.cgroups_path".into(),
        ),
        (
            G::OomScoreAdj,
            linux(|l| l.oom_score_adj.mut_or_insert_default().value = -999),
            "linux.oom_score_adj".into(),
        ),
        (
            G::IoPriority,
            linux(|l| l.io_priority.mut_or_insert_default().priority = 7),
            "linux.io_priority".into(),
        ),
        (
            G::Seccomp,
            linux(|l| l.seccomp_policy.mut_or_insert_default().default_action = "SCMP_ACT_ALLOW".into()),
            "linux.seccomp_policy".into(),
        ),
        (
            G::Namespaces,
            linux(|l| {
                l.namespaces.push(api::LinuxNamespace {
                    type_: "network".into(),
                    path: "/proc/1/ns/net".into(),
                    ..Default::default()
                })
            }),
            "linux.namespaces network".into(),
        ),
        (
            G::Sysctl,
            linux(|l| {
                l.sysctl.insert("net.ipv4.ip_forward".into(), "1".into());
            }),
            "linux.sysctl net.ipv4.ip_forward".into(),
        ),
        (
            G::NetDevices,
            linux(|l| {
                l.net_devices.insert(
                    "eth1".into(),
                    api::LinuxNetDevice {
                        name: "net1".into(),
                        ..Default::default()
                    },
                );
            }),
            "linux.net_devices eth1".into(),
        ),
        (
            G::Scheduler,
            linux(|l| l.scheduler.mut_or_insert_default().nice = 5),
            "linux.scheduler".into(),
        ),
        (
            G::Rdt,
            linux(|l| l.rdt.mut_or_insert_default().clos_id.mut_or_insert_default().value = "gold".into()),
            "linux.rdt".into(),
        ),
        (
            G::MemoryPolicy,
            linux(|l| l.memory_policy.mut_or_insert_default().nodes = "0".into()),
            "linux.memory_policy".into(),
        ),
        (
            G::Evict,
            {
                let mut rsp = api::CreateContainerResponse::new();
                rsp.evict.push(api::ContainerEviction {
                    container_id: "victim".into(),
                    reason: "room".into(),
                    ..Default::default()
                });
                rsp
            },
            String::new(),
        ),
    ];
    for (group, r, field) in resource_cases() {
        cases.push((group, linux(|l| l.resources = MessageField::some(r)), field.to_string()));
    }
    cases
}

fn all_but(group: FieldGroup) -> Permissions {
    Permissions::allowing(FieldGroup::ALL.iter().copied().filter(|g| *g != group))
}

#[test]
fn the_cases_cover_every_group_once() {
    let groups: Vec<_> = create_cases().iter().map(|(g, _, _)| *g).collect();
    let unique: HashSet<_> = groups.iter().collect();
    assert_eq!(unique.len(), groups.len(), "{groups:?}");
    assert_eq!(unique.len(), FieldGroup::ALL.len(), "{groups:?}");
}

/// Every group, in a CreateContainer answer: allowed with only that group,
/// refused with every other group, naming the plugin, the field and the
/// group.
#[test]
fn each_group_is_allowed_alone_and_refused_without_it() {
    for (group, rsp, field) in create_cases() {
        Permissions::allowing([group])
            .check_create("10-p", &rsp)
            .unwrap_or_else(|e| panic!("{group} alone: {e}"));
        let e = all_but(group).check_create("10-p", &rsp).expect_err(group.as_str());
        assert_eq!(e.plugin(), "10-p");
        assert_eq!(e.group(), group, "{e}");
        match &e {
            PermissionError::Adjust { field: f, .. } => assert_eq!(f, &field, "{e}"),
            PermissionError::Evict { container, .. } => assert_eq!(container, "victim"),
            PermissionError::Update { .. } => panic!("{e}"),
        }
        let text = e.to_string();
        assert!(
            text.contains("10-p") && text.contains(&format!("field group {group}")),
            "{text}"
        );
    }
}

/// Updates of other containers carry resources: the same groups, named
/// with the container.
#[test]
fn each_resource_group_in_an_update_is_checked() {
    for (group, r, field) in resource_cases() {
        let u = api::ContainerUpdate {
            container_id: "other".into(),
            linux: MessageField::some(api::LinuxContainerUpdate {
                resources: MessageField::some(r),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut rsp = api::CreateContainerResponse::new();
        rsp.update.push(u.clone());
        Permissions::allowing([group]).check_create("10-p", &rsp).unwrap();
        Permissions::allowing([group])
            .check_updates("10-p", std::slice::from_ref(&u))
            .unwrap();
        for e in [
            all_but(group).check_create("10-p", &rsp).unwrap_err(),
            all_but(group).check_updates("10-p", &[u]).unwrap_err(),
        ] {
            assert_eq!(
                e,
                PermissionError::Update {
                    plugin: "10-p".into(),
                    container: "other".into(),
                    field: field.into(),
                    group,
                    allowed: all_but(group),
                }
            );
        }
    }
}

#[test]
fn messages_name_plugin_field_group_and_what_is_allowed() {
    let pinner = Permissions::allowing([FieldGroup::Cpu]);
    let rsp = linux(|l| {
        let r = l.resources.mut_or_insert_default();
        r.cpu.mut_or_insert_default().cpus = "2-3".into();
        r.memory.mut_or_insert_default().limit.mut_or_insert_default().value = 1 << 30;
    });
    assert_eq!(
        pinner.check_create("10-pinner", &rsp).unwrap_err().to_string(),
        "plugin 10-pinner may not adjust linux.resources.memory.limit (field group memory, allowed: cpu)"
    );
    let u = api::ContainerUpdate {
        container_id: "c2".into(),
        linux: MessageField::some(api::LinuxContainerUpdate {
            resources: rsp.adjust.linux.resources.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        pinner.check_updates("10-pinner", &[u]).unwrap_err().to_string(),
        "plugin 10-pinner may not update linux.resources.memory.limit of container c2 (field group memory, allowed: cpu)"
    );
    let evict = [api::ContainerEviction {
        container_id: "c3".into(),
        ..Default::default()
    }];
    assert_eq!(
        Permissions::allowing([])
            .check_evictions("10-x", &evict)
            .unwrap_err()
            .to_string(),
        "plugin 10-x may not evict container c3 (field group evict, allowed: nothing)"
    );
    let two = Permissions::allowing([FieldGroup::Mounts, FieldGroup::Env]);
    assert_eq!(two.to_string(), "mounts, env", "in the order of FieldGroup::ALL");
}

/// What plugins built with the Go stub send when they change nothing: the
/// sections present and empty. That touches no group.
#[test]
fn empty_sections_touch_nothing() {
    let mut rsp = api::CreateContainerResponse::new();
    let a = rsp.adjust.mut_or_insert_default();
    a.hooks.mut_or_insert_default();
    let l = a.linux.mut_or_insert_default();
    l.rdt.mut_or_insert_default();
    let r = l.resources.mut_or_insert_default();
    r.memory.mut_or_insert_default();
    r.cpu.mut_or_insert_default();
    rsp.update.push(api::ContainerUpdate {
        container_id: "other".into(),
        ..Default::default()
    });
    let mut with_empty_resources = rsp.update[0].clone();
    with_empty_resources
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default()
        .cpu
        .mut_or_insert_default();
    rsp.update.push(with_empty_resources);
    Permissions::allowing([]).check_create("10-p", &rsp).unwrap();
}

/// A removal (`-key`) changes the field as much as a set.
#[test]
fn removals_need_the_group_too() {
    let rsp = adjusted(|a| {
        a.env.push(api::KeyValue {
            key: "-PATH".into(),
            ..Default::default()
        })
    });
    let e = Permissions::allowing([FieldGroup::Mounts])
        .check_create("10-p", &rsp)
        .unwrap_err();
    assert_eq!(e.group(), FieldGroup::Env);
    let rdt = linux(|l| l.rdt.mut_or_insert_default().remove = true);
    assert_eq!(
        Permissions::allowing([])
            .check_create("10-p", &rdt)
            .unwrap_err()
            .group(),
        FieldGroup::Rdt
    );
}

#[test]
fn names_parse_and_unknown_ones_are_refused() {
    for g in FieldGroup::ALL {
        assert_eq!(g.as_str().parse::<FieldGroup>(), Ok(*g));
    }
    assert_eq!(Permissions::parse(["all"]).unwrap(), Permissions::all());
    assert_eq!(
        Permissions::parse(["env", "mounts", "env"]).unwrap(),
        Permissions::allowing([FieldGroup::Env, FieldGroup::Mounts])
    );
    assert_eq!(Permissions::parse::<&str>([]).unwrap(), Permissions::allowing([]));
    let e = Permissions::parse(["env", "hugepages"]).unwrap_err();
    assert_eq!(e.name, "hugepages");
    assert!(
        e.to_string()
            .starts_with(r#"unknown field group "hugepages" (known: annotations, mounts, env,"#)
            && e.to_string().ends_with("evict, or all)"),
        "{e}"
    );
}

/// Every resource field has a group: by its owner record, the device
/// cgroup rules (the one unclaimed field) as `cgroup_devices`.
#[test]
fn every_resource_field_has_its_group() {
    for f in FIELDS {
        let g = resource_group(f);
        match f.owner {
            Some(owner) => assert_eq!(field_group(owner), Some(g), "{f:?}"),
            None => {
                assert_eq!((f.name, f.shape), ("devices", Shape::Rules), "{f:?}");
                assert_eq!(g, FieldGroup::CgroupDevices);
            }
        }
        let prefix = f.proto.split('.').next().unwrap();
        let expected = match prefix {
            "memory" => FieldGroup::Memory,
            "cpu" => FieldGroup::Cpu,
            "devices" => FieldGroup::CgroupDevices,
            other => other.parse().unwrap(),
        };
        assert_eq!(g, expected, "{f:?}");
    }
}
