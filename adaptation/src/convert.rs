//! The NRI view of a container built from its OCI runtime spec: what
//! plugins see in CreateContainer when the runtime's only source of truth is
//! a bundle's `config.json` (a shim, or `nri-replay`).

use nri_proto::api;
use oci_spec::runtime::{LinuxDeviceType, LinuxResources, Spec};
use protobuf::MessageField;

use crate::resources;

fn opt_bool(v: Option<bool>) -> MessageField<api::OptionalBool> {
    MessageField::from_option(v.map(|value| api::OptionalBool {
        value,
        ..Default::default()
    }))
}

pub(crate) fn dev_type(t: LinuxDeviceType) -> String {
    match t {
        LinuxDeviceType::A => "a",
        LinuxDeviceType::B => "b",
        LinuxDeviceType::C => "c",
        LinuxDeviceType::U => "u",
        LinuxDeviceType::P => "p",
    }
    .to_string()
}

/// The name an enum has in `config.json`.
fn oci_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// NRI resources from OCI resources: every field of
/// [`resources::FIELDS`] with an OCI counterpart (all but the block I/O and
/// RDT classes). `memory` and `cpu` are present when the OCI spec has them.
pub fn resources_from_oci(r: &LinuxResources) -> api::LinuxResources {
    resources::read_oci(r)
}

/// The NRI container `id` of pod `pod_id`, named `name`, as described by
/// `spec`: args, env, annotations, mounts, hooks, rlimits, user, and the
/// Linux part (namespaces, devices, resources, cgroups path, OOM score,
/// sysctl, net devices, RDT). State is CREATED.
pub fn container_from_spec(id: &str, pod_id: &str, name: &str, spec: &Spec) -> api::Container {
    let mut c = api::Container {
        id: id.to_string(),
        pod_sandbox_id: pod_id.to_string(),
        name: name.to_string(),
        state: api::ContainerState::CONTAINER_CREATED.into(),
        ..Default::default()
    };
    if let Some(a) = spec.annotations() {
        c.annotations = a.clone();
    }
    if let Some(p) = spec.process() {
        c.args = p.args().clone().unwrap_or_default();
        c.env = p.env().clone().unwrap_or_default();
        for r in p.rlimits().iter().flatten() {
            let typ = oci_name(&r.typ());
            c.rlimits.push(api::POSIXRlimit {
                type_: typ,
                hard: r.hard(),
                soft: r.soft(),
                ..Default::default()
            });
        }
        let u = p.user();
        c.user = MessageField::some(api::User {
            uid: u.uid(),
            gid: u.gid(),
            additional_gids: u.additional_gids().clone().unwrap_or_default(),
            ..Default::default()
        });
        if let Some(o) = p.oom_score_adj() {
            c.linux.mut_or_insert_default().oom_score_adj = MessageField::some(api::OptionalInt {
                value: i64::from(o),
                ..Default::default()
            });
        }
    }
    for m in spec.mounts().iter().flatten() {
        c.mounts.push(api::Mount {
            destination: m.destination().to_string_lossy().into_owned(),
            type_: m.typ().clone().unwrap_or_default(),
            source: m
                .source()
                .as_ref()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            options: m.options().clone().unwrap_or_default(),
            ..Default::default()
        });
    }
    if let Some(h) = spec.hooks() {
        let conv = |list: &Option<Vec<oci_spec::runtime::Hook>>| -> Vec<api::Hook> {
            list.iter()
                .flatten()
                .map(|x| api::Hook {
                    path: x.path().to_string_lossy().into_owned(),
                    args: x.args().clone().unwrap_or_default(),
                    env: x.env().clone().unwrap_or_default(),
                    timeout: MessageField::from_option(x.timeout().map(|value| api::OptionalInt {
                        value,
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect()
        };
        #[allow(deprecated)]
        let prestart = conv(h.prestart());
        c.hooks = MessageField::some(api::Hooks {
            prestart,
            create_runtime: conv(h.create_runtime()),
            create_container: conv(h.create_container()),
            start_container: conv(h.start_container()),
            poststart: conv(h.poststart()),
            poststop: conv(h.poststop()),
            ..Default::default()
        });
    }
    if let Some(l) = spec.linux() {
        let lin = c.linux.mut_or_insert_default();
        for n in l.namespaces().iter().flatten() {
            lin.namespaces.push(api::LinuxNamespace {
                // The OCI spelling ("network"), not oci-spec's Display ("net").
                type_: oci_name(&n.typ()),
                path: n
                    .path()
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                ..Default::default()
            });
        }
        for d in l.devices().iter().flatten() {
            lin.devices.push(api::LinuxDevice {
                path: d.path().to_string_lossy().into_owned(),
                type_: dev_type(d.typ()),
                major: d.major(),
                minor: d.minor(),
                file_mode: MessageField::from_option(d.file_mode().map(|value| api::OptionalFileMode {
                    value,
                    ..Default::default()
                })),
                uid: MessageField::from_option(d.uid().map(|value| api::OptionalUInt32 {
                    value,
                    ..Default::default()
                })),
                gid: MessageField::from_option(d.gid().map(|value| api::OptionalUInt32 {
                    value,
                    ..Default::default()
                })),
                ..Default::default()
            });
        }
        if let Some(r) = l.resources() {
            lin.resources = MessageField::some(resources_from_oci(r));
        }
        lin.cgroups_path = l
            .cgroups_path()
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(s) = l.sysctl() {
            lin.sysctl = s.clone();
        }
        for (k, v) in l.net_devices().iter().flatten() {
            lin.net_devices.insert(
                k.clone(),
                api::LinuxNetDevice {
                    name: v.name().clone().unwrap_or_default(),
                    ..Default::default()
                },
            );
        }
        if let Some(r) = l.intel_rdt() {
            let rdt = lin.rdt.mut_or_insert_default();
            rdt.clos_id = MessageField::from_option(r.clos_id().clone().map(|value| api::OptionalString {
                value,
                ..Default::default()
            }));
            rdt.schemata = MessageField::from_option(r.schemata().clone().map(|value| api::OptionalRepeatedString {
                value,
                ..Default::default()
            }));
            rdt.enable_monitoring = opt_bool(*r.enable_monitoring());
        }
    }
    c
}

/// A message in proto JSON (protobuf's JSON mapping) as a
/// `serde_json::Value`, for people to read: present but empty messages
/// (`"hooks": {}`, `"cpu": {}`, which the merge leaves in a reply) are
/// dropped, except NRI's `Optional*` wrappers, where `{}` means "set to
/// zero". `null` when the message cannot be printed.
pub fn to_json<M: protobuf::MessageFull>(m: &M) -> serde_json::Value {
    let mut m = m.clone();
    prune_empty(&mut m);
    let text = protobuf_json_mapping::print_to_string(&m).unwrap_or_else(|_| "null".into());
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

fn prune_empty(m: &mut dyn protobuf::MessageDyn) {
    use protobuf::reflect::{RuntimeFieldType, RuntimeType};
    let d = m.descriptor_dyn();
    for f in d.fields() {
        let RuntimeFieldType::Singular(RuntimeType::Message(ty)) = f.runtime_field_type() else {
            continue;
        };
        if !f.has_field(m) {
            continue;
        }
        let empty = {
            let sub = f.mut_message(m);
            prune_empty(sub);
            sub.compute_size_dyn() == 0 && !ty.name().starts_with("Optional")
        };
        if empty {
            f.clear_field(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_for_people_drops_empty_messages_but_not_zero_wrappers_or_map_values() {
        let mut a = api::ContainerAdjustment::new();
        a.hooks.mut_or_insert_default();
        let linux = a.linux.mut_or_insert_default();
        let res = linux.resources.mut_or_insert_default();
        res.cpu.mut_or_insert_default();
        res.memory.mut_or_insert_default().limit = MessageField::some(api::OptionalInt64::new());
        linux.net_devices.insert("eth0".into(), api::LinuxNetDevice::new());
        let v = to_json(&a);
        assert_eq!(
            v,
            serde_json::json!({"linux": {
                "resources": {"memory": {"limit": {}}},
                "netDevices": {"eth0": {}}
            }}),
        );
        assert_eq!(to_json(&api::ContainerAdjustment::new()), serde_json::json!({}));
    }

    #[test]
    fn container_reflects_the_spec() {
        let spec: Spec = serde_json::from_str(
            r#"{"ociVersion": "1.0.2",
            "process": {"user": {"uid": 1, "gid": 2}, "args": ["sh", "-c", "x"], "cwd": "/", "env": ["A=1"],
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 10, "soft": 5}], "oomScoreAdj": 100},
            "annotations": {"k": "v"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "network", "path": "/proc/1/ns/net"}],
                "cgroupsPath": "/default/c1",
                "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
                "resources": {"memory": {"limit": 100}, "cpu": {"shares": 2, "cpus": "0"}, "pids": {"limit": 5},
                    "devices": [{"allow": false, "access": "rwm"}]}}}"#,
        )
        .unwrap();
        let c = container_from_spec("c1", "p1", "app", &spec);
        assert_eq!(
            (c.id.as_str(), c.pod_sandbox_id.as_str(), c.name.as_str()),
            ("c1", "p1", "app")
        );
        assert_eq!(c.args, ["sh", "-c", "x"]);
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(c.annotations["k"], "v");
        assert_eq!(c.mounts[0].destination, "/proc");
        assert_eq!(c.rlimits[0].type_, "RLIMIT_NOFILE");
        assert_eq!(c.user.uid, 1);
        let l = c.linux.get_or_default();
        assert_eq!(l.namespaces[0].type_, "network");
        assert_eq!(l.namespaces[0].path, "/proc/1/ns/net");
        assert_eq!(l.cgroups_path, "/default/c1");
        assert_eq!(l.devices[0].path, "/dev/fuse");
        assert_eq!(l.oom_score_adj.value, 100);
        let r = l.resources.get_or_default();
        assert_eq!(r.memory.limit.value, 100);
        assert_eq!(r.cpu.shares.value, 2);
        assert_eq!(r.pids.limit, 5);
        assert!(!r.devices[0].allow);
    }
}
