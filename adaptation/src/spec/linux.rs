//! The Linux part of an adjustment besides resources: devices, seccomp,
//! namespaces, memory policy and Intel RDT.

use std::path::PathBuf;

use nri_proto::api;
use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxMemoryPolicy, LinuxNamespace, LinuxNamespaceType,
    LinuxSeccomp, LinuxSyscall, MemoryPolicyFlagType, MemoryPolicyModeType, Spec,
};

use super::{AdjustError, invalid, linux};
use crate::resources::{self, removal_key};

pub(crate) fn device_type(t: &str, path: &str) -> Result<LinuxDeviceType, AdjustError> {
    match t {
        "c" => Ok(LinuxDeviceType::C),
        "b" => Ok(LinuxDeviceType::B),
        "u" => Ok(LinuxDeviceType::U),
        "p" => Ok(LinuxDeviceType::P),
        other => Err(invalid(
            format!("linux.devices[{path}].type"),
            other,
            "must be one of c, b, u, p",
        )),
    }
}

pub(super) fn apply_devices(s: &mut Spec, devices: &[api::LinuxDevice]) -> Result<(), AdjustError> {
    for d in devices {
        if let Some(path) = removal_key(&d.path) {
            let lin = linux(s);
            if let Some(list) = lin.devices_mut() {
                list.retain(|x| x.path() != &PathBuf::from(path));
            }
            continue;
        }
        if !d.path.starts_with('/') {
            return Err(invalid("linux.devices.path", &d.path, "must be an absolute path"));
        }
        let typ = device_type(&d.type_, &d.path)?;
        if matches!(typ, LinuxDeviceType::C | LinuxDeviceType::B | LinuxDeviceType::U) && (d.major < 0 || d.minor < 0) {
            return Err(invalid(
                format!("linux.devices[{}].major/minor", d.path),
                format!("{}:{}", d.major, d.minor),
                "must not be negative",
            ));
        }
        let mut dev = LinuxDevice::default();
        dev.set_path(PathBuf::from(&d.path));
        dev.set_typ(typ);
        dev.set_major(d.major);
        dev.set_minor(d.minor);
        dev.set_file_mode(d.file_mode.as_ref().map(|m| m.value));
        dev.set_uid(d.uid.as_ref().map(|v| v.value));
        dev.set_gid(d.gid.as_ref().map(|v| v.value));
        let lin = linux(s);
        resources::upsert(lin.devices_mut().get_or_insert_with(Vec::new), dev, |a, b| {
            a.path() == b.path()
        });
        // The matching cgroup allow rule: rw, plus m for block devices (upstream).
        let mut rule = LinuxDeviceCgroup::default();
        rule.set_allow(true);
        rule.set_typ(Some(typ));
        rule.set_major(Some(d.major));
        rule.set_minor(Some(d.minor));
        rule.set_access(Some(if typ == LinuxDeviceType::B { "rwm" } else { "rw" }.to_string()));
        let mut res = lin.resources().clone().unwrap_or_default();
        res.devices_mut().get_or_insert_with(Vec::new).push(rule);
        lin.set_resources(Some(res));
    }
    Ok(())
}

pub(super) fn from_name<T: serde::de::DeserializeOwned>(field: &str, name: &str, what: &str) -> Result<T, AdjustError> {
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| invalid(field, name, format!("unknown {what}")))
}

pub(super) fn seccomp(sc: &api::LinuxSeccomp) -> Result<LinuxSeccomp, AdjustError> {
    let mut out = LinuxSeccomp::default();
    out.set_default_action(from_name(
        "linux.seccomp_policy.default_action",
        &sc.default_action,
        "seccomp action",
    )?);
    out.set_default_errno_ret(sc.default_errno.as_ref().map(|e| e.value));
    if !sc.architectures.is_empty() {
        let archs = sc
            .architectures
            .iter()
            .map(|a| from_name("linux.seccomp_policy.architectures", a, "seccomp architecture"))
            .collect::<Result<Vec<_>, _>>()?;
        out.set_architectures(Some(archs));
    }
    if !sc.flags.is_empty() {
        let flags = sc
            .flags
            .iter()
            .map(|f| from_name("linux.seccomp_policy.flags", f, "seccomp filter flag"))
            .collect::<Result<Vec<_>, _>>()?;
        out.set_flags(Some(flags));
    }
    if !sc.listener_path.is_empty() {
        out.set_listener_path(Some(PathBuf::from(&sc.listener_path)));
    }
    if !sc.listener_metadata.is_empty() {
        out.set_listener_metadata(Some(sc.listener_metadata.clone()));
    }
    if !sc.syscalls.is_empty() {
        let mut calls = Vec::new();
        for c in &sc.syscalls {
            let mut call = LinuxSyscall::default();
            call.set_names(c.names.clone());
            call.set_action(from_name(
                "linux.seccomp_policy.syscalls.action",
                &c.action,
                "seccomp action",
            )?);
            call.set_errno_ret(c.errno_ret.as_ref().map(|e| e.value));
            if !c.args.is_empty() {
                let mut args = Vec::new();
                for a in &c.args {
                    let op: oci_spec::runtime::LinuxSeccompOperator =
                        from_name("linux.seccomp_policy.syscalls.args.op", &a.op, "seccomp operator")?;
                    let arg = oci_spec::runtime::LinuxSeccompArgBuilder::default()
                        .index(a.index as usize)
                        .value(a.value)
                        .value_two(a.value_two)
                        .op(op)
                        .build()
                        .map_err(|e| invalid("linux.seccomp_policy.syscalls.args", a.index, e.to_string()))?;
                    args.push(arg);
                }
                call.set_args(Some(args));
            }
            calls.push(call);
        }
        out.set_syscalls(Some(calls));
    }
    Ok(out)
}

pub(super) fn apply_namespaces(s: &mut Spec, nss: &[api::LinuxNamespace]) -> Result<(), AdjustError> {
    for n in nss {
        let (key, remove) = match removal_key(&n.type_) {
            Some(k) => (k, true),
            None => (n.type_.as_str(), false),
        };
        let typ = LinuxNamespaceType::try_from(key)
            .map_err(|_| invalid("linux.namespaces.type", key, "unknown namespace type"))?;
        let list = linux(s).namespaces_mut().get_or_insert_with(Vec::new);
        if remove {
            list.retain(|x| x.typ() != typ);
            continue;
        }
        let path = (!n.path.is_empty()).then(|| PathBuf::from(&n.path));
        if let Some(existing) = list.iter_mut().find(|x| x.typ() == typ) {
            existing.set_path(path);
        } else {
            let mut ns = LinuxNamespace::default();
            ns.set_typ(typ);
            ns.set_path(path);
            list.push(ns);
        }
    }
    Ok(())
}

pub(super) fn memory_policy(mp: &api::LinuxMemoryPolicy) -> Result<LinuxMemoryPolicy, AdjustError> {
    use api::{MpolFlag as F, MpolMode as M};
    let mode = match mp.mode.enum_value() {
        Ok(M::MPOL_DEFAULT) => MemoryPolicyModeType::MpolDefault,
        Ok(M::MPOL_PREFERRED) => MemoryPolicyModeType::MpolPreferred,
        Ok(M::MPOL_BIND) => MemoryPolicyModeType::MpolBind,
        Ok(M::MPOL_INTERLEAVE) => MemoryPolicyModeType::MpolInterleave,
        Ok(M::MPOL_PREFERRED_MANY) => MemoryPolicyModeType::MpolPreferredMany,
        Ok(M::MPOL_WEIGHTED_INTERLEAVE) => MemoryPolicyModeType::MpolWeightedInterleave,
        Ok(M::MPOL_LOCAL) => {
            return Err(invalid(
                "linux.memory_policy.mode",
                "MPOL_LOCAL",
                "not expressible in the OCI runtime spec",
            ));
        }
        Err(v) => {
            return Err(invalid("linux.memory_policy.mode", v, "unknown memory policy mode"));
        }
    };
    let mut flags = Vec::new();
    for f in &mp.flags {
        flags.push(match f.enum_value() {
            Ok(F::MPOL_F_STATIC_NODES) => MemoryPolicyFlagType::MpolFStaticNodes,
            Ok(F::MPOL_F_RELATIVE_NODES) => MemoryPolicyFlagType::MpolFRelativeNodes,
            Ok(F::MPOL_F_NUMA_BALANCING) => MemoryPolicyFlagType::MpolFNumaBalancing,
            Err(v) => {
                return Err(invalid("linux.memory_policy.flags", v, "unknown memory policy flag"));
            }
        });
    }
    let mut out = LinuxMemoryPolicy::default();
    out.set_mode(mode);
    if !mp.nodes.is_empty() {
        out.set_nodes(Some(mp.nodes.clone()));
    }
    if !flags.is_empty() {
        out.set_flags(Some(flags));
    }
    Ok(out)
}

pub(super) fn apply_rdt(s: &mut Spec, rdt: &api::LinuxRdt) {
    let lin = linux(s);
    if rdt.remove {
        lin.set_intel_rdt(None);
    }
    if rdt.clos_id.is_none() && rdt.schemata.is_none() && rdt.enable_monitoring.is_none() {
        return;
    }
    let mut cur = lin.intel_rdt().clone().unwrap_or_default();
    if let Some(v) = rdt.clos_id.as_ref() {
        cur.set_clos_id(Some(v.value.clone()));
    }
    if let Some(v) = rdt.schemata.as_ref() {
        // An empty list is no schemata: config.json leaves an empty
        // `schemata` out (as Go's `omitempty` does), so keeping `Some([])`
        // would make the spec the runtime adjusted differ from the one it
        // writes and runs (found by the `adjust` fuzz target).
        cur.set_schemata((!v.value.is_empty()).then(|| v.value.clone()));
    }
    if let Some(v) = rdt.enable_monitoring.as_ref() {
        cur.set_enable_monitoring(Some(v.value));
    }
    lin.set_intel_rdt(Some(cur));
}
