//! Applying a merged NRI adjustment to an OCI runtime spec (NRI
//! `pkg/runtime-tools/generate`). Pure functions: no I/O.
//!
//! [`adjust`] applies a [`api::ContainerAdjustment`] in upstream's order
//! (annotations, env, args, hooks, CDI devices, devices, cgroups path, OOM
//! score, I/O priority, scheduler, seccomp, namespaces, sysctl, net devices,
//! memory policy, resources, block I/O class, RDT class, RDT, mounts,
//! rlimits). It is transactional: on error the spec is unchanged. An empty
//! adjustment (what zero plugins produce) leaves the spec identical.
//!
//! Deviations from upstream, all fixes:
//! * map removals (`-key`) are applied before sets (upstream walks a Go map
//!   in random order);
//! * every memory field is applied, not only a non-zero limit; when only
//!   the limit changes and the spec's swap was the old limit (no swap) or
//!   is now below the new limit, swap follows the limit, as upstream does to
//!   keep runc's `swap >= limit` rule;
//! * seccomp keeps `default_errno`;
//! * rlimits replace an existing limit of the same type instead of
//!   appending a duplicate; hugepage limits likewise per page size;
//! * environment entries without `=` are kept (upstream drops them), and
//!   removing a variable (`-NAME`) works for variables of the original spec;
//! * CDI devices, block I/O and RDT classes without a runtime-supplied
//!   injector or resolver are errors, not silently ignored;
//! * values the kernel would reject (see [`AdjustError`]) are errors naming
//!   the field and the value;
//! * mounts are re-sorted (depth, then destination) only when a plugin
//!   changed mounts.

use std::path::PathBuf;

use nri_proto::api;
use oci_spec::runtime::{
    Hook, Hooks, LinuxBlockIo, LinuxCpu, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxIOPriorityBuilder,
    LinuxIntelRdt, LinuxMemory, LinuxMemoryPolicy, LinuxNamespace, LinuxNamespaceType, LinuxNetDevice, LinuxResources,
    LinuxSchedulerFlag, LinuxSchedulerPolicy, LinuxSeccomp, LinuxSyscall, MemoryPolicyFlagType, MemoryPolicyModeType,
    Mount, PosixRlimit, PosixRlimitBuilder, Scheduler, Spec,
};

use crate::resources::{self, apply_map, removal_key};

/// Why an adjustment could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdjustError {
    /// A value the runtime or kernel would reject.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// Field, e.g. `linux.resources.cpu.shares`.
        field: String,
        /// The offending value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The adjustment needs something the runtime did not provide.
    #[error("cannot apply {field}: {reason}")]
    Unsupported {
        /// Field, e.g. `CDI_devices`.
        field: String,
        /// What is missing.
        reason: String,
    },
}

pub(crate) fn invalid(
    field: impl Into<String>,
    value: impl std::fmt::Display,
    reason: impl Into<String>,
) -> AdjustError {
    AdjustError::Invalid {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

type CdiInjector<'a> = Box<dyn Fn(&mut Spec, &[String]) -> Result<(), String> + 'a>;
type BlockIoResolver<'a> = Box<dyn Fn(&str) -> Result<LinuxBlockIo, String> + 'a>;
type RdtResolver<'a> = Box<dyn Fn(&str) -> Result<LinuxIntelRdt, String> + 'a>;

/// [`adjust`] with runtime-supplied helpers for CDI devices and block I/O
/// and RDT classes.
#[derive(Default)]
pub struct Adjuster<'a> {
    cdi: Option<CdiInjector<'a>>,
    blockio: Option<BlockIoResolver<'a>>,
    rdt: Option<RdtResolver<'a>>,
}

impl<'a> Adjuster<'a> {
    /// An adjuster without helpers.
    pub fn new() -> Self {
        Adjuster::default()
    }

    /// Injects CDI devices (by fully qualified name) into the spec.
    pub fn with_cdi_injector(mut self, f: impl Fn(&mut Spec, &[String]) -> Result<(), String> + 'a) -> Self {
        self.cdi = Some(Box::new(f));
        self
    }

    /// Resolves a block I/O class name to OCI block I/O settings.
    pub fn with_blockio_resolver(mut self, f: impl Fn(&str) -> Result<LinuxBlockIo, String> + 'a) -> Self {
        self.blockio = Some(Box::new(f));
        self
    }

    /// Resolves an RDT class name to OCI Intel RDT settings.
    pub fn with_rdt_resolver(mut self, f: impl Fn(&str) -> Result<LinuxIntelRdt, String> + 'a) -> Self {
        self.rdt = Some(Box::new(f));
        self
    }

    /// Applies `adj` to `spec`; see the module docs.
    ///
    /// # Errors
    /// [`AdjustError`]; the spec is then unchanged.
    pub fn adjust(&self, spec: &mut Spec, adj: &api::ContainerAdjustment) -> Result<(), AdjustError> {
        let mut s = spec.clone();
        self.apply(&mut s, adj)?;
        *spec = s;
        Ok(())
    }

    fn apply(&self, s: &mut Spec, a: &api::ContainerAdjustment) -> Result<(), AdjustError> {
        apply_map(s.annotations_mut(), &a.annotations, |v| Some(v.clone()));
        apply_env(s, &a.env)?;
        if !a.args.is_empty() {
            process(s, "args")?.set_args(Some(a.args.clone()));
        }
        if let Some(h) = a.hooks.as_ref() {
            apply_hooks(s, h)?;
        }
        if !a.CDI_devices.is_empty() {
            let names: Vec<String> = a.CDI_devices.iter().map(|d| d.name.clone()).collect();
            let inject = self.cdi.as_ref().ok_or_else(|| AdjustError::Unsupported {
                field: "CDI_devices".into(),
                reason: format!("no CDI injector configured for {names:?}"),
            })?;
            inject(s, &names).map_err(|e| invalid("CDI_devices", names.join(","), e))?;
        }
        let empty = api::LinuxContainerAdjustment::new();
        let l = a.linux.as_ref().unwrap_or(&empty);
        apply_devices(s, &l.devices)?;
        if !l.cgroups_path.is_empty() {
            linux(s).set_cgroups_path(Some(PathBuf::from(&l.cgroups_path)));
        }
        if let Some(o) = l.oom_score_adj.as_ref() {
            if !(-1000..=1000).contains(&o.value) {
                return Err(invalid("linux.oom_score_adj", o.value, "must be within -1000..1000"));
            }
            process(s, "oom_score_adj")?.set_oom_score_adj(Some(o.value as i32));
        }
        if let Some(p) = l.io_priority.as_ref() {
            apply_io_priority(s, p)?;
        }
        if let Some(sch) = l.scheduler.as_ref() {
            apply_scheduler(s, sch)?;
        }
        if let Some(sc) = l.seccomp_policy.as_ref() {
            linux(s).set_seccomp(Some(seccomp(sc)?));
        }
        apply_namespaces(s, &l.namespaces)?;
        if !l.sysctl.is_empty() {
            apply_map(linux(s).sysctl_mut(), &l.sysctl, |v| Some(v.clone()));
        }
        if !l.net_devices.is_empty() {
            apply_map(linux(s).net_devices_mut(), &l.net_devices, |d| {
                let mut n = LinuxNetDevice::default();
                if !d.name.is_empty() {
                    n.set_name(Some(d.name.clone()));
                }
                Some(n)
            });
        }
        if let Some(mp) = l.memory_policy.as_ref() {
            linux(s).set_memory_policy(Some(memory_policy(mp)?));
        }
        if let Some(r) = l.resources.as_ref() {
            if resources_touch(r) {
                let lin = linux(s);
                let mut res = lin.resources().clone().unwrap_or_default();
                apply_resources(&mut res, r, true)?;
                lin.set_resources(Some(res));
            }
            if let Some(class) = r.blockio_class.as_ref() {
                let value = if class.value.is_empty() {
                    None
                } else {
                    let resolve = self.blockio.as_ref().ok_or_else(|| AdjustError::Unsupported {
                        field: "linux.resources.blockio_class".into(),
                        reason: format!("no block I/O class resolver configured for class {:?}", class.value),
                    })?;
                    Some(resolve(&class.value).map_err(|e| invalid("linux.resources.blockio_class", &class.value, e))?)
                };
                let lin = linux(s);
                let mut res = lin.resources().clone().unwrap_or_default();
                res.set_block_io(value);
                lin.set_resources(Some(res));
            }
            if let Some(class) = r.rdt_class.as_ref() {
                let value = if class.value.is_empty() {
                    None
                } else {
                    let resolve = self.rdt.as_ref().ok_or_else(|| AdjustError::Unsupported {
                        field: "linux.resources.rdt_class".into(),
                        reason: format!("no RDT class resolver configured for class {:?}", class.value),
                    })?;
                    Some(resolve(&class.value).map_err(|e| invalid("linux.resources.rdt_class", &class.value, e))?)
                };
                linux(s).set_intel_rdt(value);
            }
        }
        if let Some(rdt) = l.rdt.as_ref() {
            apply_rdt(s, rdt);
        }
        apply_mounts(s, &a.mounts)?;
        apply_rlimits(s, &a.rlimits)?;
        Ok(())
    }
}

/// Applies `adj` to `spec` without CDI injector or class resolvers; see
/// the module docs and [`Adjuster`].
///
/// # Errors
/// [`AdjustError`]; the spec is then unchanged.
///
/// ```
/// use nri_adaptation::{api, spec::adjust};
/// let mut spec = oci_spec::runtime::Spec::default();
/// let before = spec.clone();
/// adjust(&mut spec, &api::ContainerAdjustment::new()).unwrap();
/// assert_eq!(spec, before);
/// ```
pub fn adjust(spec: &mut Spec, adj: &api::ContainerAdjustment) -> Result<(), AdjustError> {
    Adjuster::new().adjust(spec, adj)
}

fn process<'s>(s: &'s mut Spec, what: &str) -> Result<&'s mut oci_spec::runtime::Process, AdjustError> {
    s.process_mut().as_mut().ok_or_else(|| AdjustError::Unsupported {
        field: format!("process.{what}"),
        reason: "the spec has no process".into(),
    })
}

fn linux(s: &mut Spec) -> &mut oci_spec::runtime::Linux {
    s.linux_mut().get_or_insert_with(Default::default)
}

fn apply_env(s: &mut Spec, env: &[api::KeyValue]) -> Result<(), AdjustError> {
    if env.is_empty() {
        return Ok(());
    }
    let mut wanted: Vec<(&str, Option<&str>)> = Vec::new();
    for kv in env {
        let (key, value) = match removal_key(&kv.key) {
            Some(k) => (k, None),
            None => (kv.key.as_str(), Some(kv.value.as_str())),
        };
        if key.is_empty() || key.contains('=') {
            return Err(invalid(
                "env",
                &kv.key,
                "variable name must be non-empty and contain no '='",
            ));
        }
        // Later entries for the same key win.
        wanted.retain(|(k, _)| *k != key);
        wanted.push((key, value));
    }
    let p = process(s, "env")?;
    let old = p.env().clone().unwrap_or_default();
    let mut out = Vec::with_capacity(old.len() + wanted.len());
    let mut done: Vec<&str> = Vec::new();
    for e in &old {
        let key = e.split_once('=').map_or(e.as_str(), |(k, _)| k);
        match wanted.iter().find(|(k, _)| *k == key) {
            None => out.push(e.clone()),
            Some((k, v)) => {
                if done.contains(k) {
                    continue; // drop duplicates of an adjusted variable
                }
                done.push(k);
                if let Some(v) = v {
                    out.push(format!("{k}={v}"));
                }
            }
        }
    }
    for (k, v) in &wanted {
        if let (false, Some(v)) = (done.contains(k), v) {
            out.push(format!("{k}={v}"));
        }
    }
    p.set_env(Some(out));
    Ok(())
}

fn oci_hook(h: &api::Hook, list: &str) -> Result<Hook, AdjustError> {
    if !h.path.starts_with('/') {
        return Err(invalid(
            format!("hooks.{list}.path"),
            &h.path,
            "must be an absolute path",
        ));
    }
    let mut hook = Hook::default();
    hook.set_path(PathBuf::from(&h.path));
    if !h.args.is_empty() {
        hook.set_args(Some(h.args.clone()));
    }
    if !h.env.is_empty() {
        hook.set_env(Some(h.env.clone()));
    }
    if let Some(t) = h.timeout.as_ref() {
        if t.value <= 0 {
            return Err(invalid(
                format!("hooks.{list}.timeout"),
                t.value,
                "must be positive seconds",
            ));
        }
        hook.set_timeout(Some(t.value));
    }
    Ok(hook)
}

fn apply_hooks(s: &mut Spec, h: &api::Hooks) -> Result<(), AdjustError> {
    let lists: [(&str, &Vec<api::Hook>); 6] = [
        ("prestart", &h.prestart),
        ("create_runtime", &h.create_runtime),
        ("create_container", &h.create_container),
        ("start_container", &h.start_container),
        ("poststart", &h.poststart),
        ("poststop", &h.poststop),
    ];
    if lists.iter().all(|(_, l)| l.is_empty()) {
        return Ok(());
    }
    let mut converted: Vec<Vec<Hook>> = Vec::new();
    for (name, list) in &lists {
        converted.push(list.iter().map(|x| oci_hook(x, name)).collect::<Result<_, _>>()?);
    }
    let hooks = s.hooks_mut().get_or_insert_with(Hooks::default);
    let extend = |cur: &Option<Vec<Hook>>, add: &Vec<Hook>| -> Option<Vec<Hook>> {
        if add.is_empty() {
            return cur.clone();
        }
        let mut v = cur.clone().unwrap_or_default();
        v.extend(add.iter().cloned());
        Some(v)
    };
    #[allow(deprecated)]
    {
        let v = extend(hooks.prestart(), &converted[0]);
        hooks.set_prestart(v);
    }
    let v = extend(hooks.create_runtime(), &converted[1]);
    hooks.set_create_runtime(v);
    let v = extend(hooks.create_container(), &converted[2]);
    hooks.set_create_container(v);
    let v = extend(hooks.start_container(), &converted[3]);
    hooks.set_start_container(v);
    let v = extend(hooks.poststart(), &converted[4]);
    hooks.set_poststart(v);
    let v = extend(hooks.poststop(), &converted[5]);
    hooks.set_poststop(v);
    Ok(())
}

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

fn apply_devices(s: &mut Spec, devices: &[api::LinuxDevice]) -> Result<(), AdjustError> {
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

fn apply_io_priority(s: &mut Spec, p: &api::LinuxIOPriority) -> Result<(), AdjustError> {
    use oci_spec::runtime::IOPriorityClass as C;
    let class = match p.class.enum_value() {
        Ok(api::IOPrioClass::IOPRIO_CLASS_NONE) => {
            // Class NONE clears the setting (upstream).
            process(s, "io_priority")?.set_io_priority(None);
            return Ok(());
        }
        Ok(api::IOPrioClass::IOPRIO_CLASS_RT) => C::IoprioClassRt,
        Ok(api::IOPrioClass::IOPRIO_CLASS_BE) => C::IoprioClassBe,
        Ok(api::IOPrioClass::IOPRIO_CLASS_IDLE) => C::IoprioClassIdle,
        Err(v) => {
            return Err(invalid("linux.io_priority.class", v, "unknown I/O priority class"));
        }
    };
    if !(0..=7).contains(&p.priority) {
        return Err(invalid("linux.io_priority.priority", p.priority, "must be within 0..7"));
    }
    let io = LinuxIOPriorityBuilder::default()
        .class(class)
        .priority(i64::from(p.priority))
        .build()
        .map_err(|e| invalid("linux.io_priority", p.priority, e.to_string()))?;
    process(s, "io_priority")?.set_io_priority(Some(io));
    Ok(())
}

fn apply_scheduler(s: &mut Spec, sch: &api::LinuxScheduler) -> Result<(), AdjustError> {
    use api::LinuxSchedulerPolicy as P;
    let policy = match sch.policy.enum_value() {
        Ok(P::SCHED_NONE) => {
            // SCHED_NONE clears the setting (upstream).
            process(s, "scheduler")?.set_scheduler(None);
            return Ok(());
        }
        Ok(P::SCHED_OTHER) => LinuxSchedulerPolicy::SchedOther,
        Ok(P::SCHED_FIFO) => LinuxSchedulerPolicy::SchedFifo,
        Ok(P::SCHED_RR) => LinuxSchedulerPolicy::SchedRr,
        Ok(P::SCHED_BATCH) => LinuxSchedulerPolicy::SchedBatch,
        Ok(P::SCHED_ISO) => LinuxSchedulerPolicy::SchedIso,
        Ok(P::SCHED_IDLE) => LinuxSchedulerPolicy::SchedIdle,
        Ok(P::SCHED_DEADLINE) => LinuxSchedulerPolicy::SchedDeadline,
        Err(v) => {
            return Err(invalid("linux.scheduler.policy", v, "unknown scheduling policy"));
        }
    };
    let mut flags = Vec::new();
    for f in &sch.flags {
        use api::LinuxSchedulerFlag as F;
        flags.push(match f.enum_value() {
            Ok(F::SCHED_FLAG_RESET_ON_FORK) => LinuxSchedulerFlag::SchedResetOnFork,
            Ok(F::SCHED_FLAG_RECLAIM) => LinuxSchedulerFlag::SchedFlagReclaim,
            Ok(F::SCHED_FLAG_DL_OVERRUN) => LinuxSchedulerFlag::SchedFlagDLOverrun,
            Ok(F::SCHED_FLAG_KEEP_POLICY) => LinuxSchedulerFlag::SchedFlagKeepPolicy,
            Ok(F::SCHED_FLAG_KEEP_PARAMS) => LinuxSchedulerFlag::SchedFlagKeepParams,
            Ok(F::SCHED_FLAG_UTIL_CLAMP_MIN) => LinuxSchedulerFlag::SchedFlagUtilClampMin,
            Ok(F::SCHED_FLAG_UTIL_CLAMP_MAX) => LinuxSchedulerFlag::SchedFlagUtilClampMax,
            Err(v) => {
                return Err(invalid("linux.scheduler.flags", v, "unknown scheduler flag"));
            }
        });
    }
    if !(-20..=19).contains(&sch.nice) {
        return Err(invalid("linux.scheduler.nice", sch.nice, "must be within -20..19"));
    }
    let mut out = Scheduler::default();
    out.set_policy(policy);
    out.set_nice(Some(sch.nice));
    out.set_priority(Some(sch.priority));
    if !flags.is_empty() {
        out.set_flags(Some(flags));
    }
    for (v, set) in [
        (
            sch.runtime,
            Scheduler::set_runtime as fn(&mut Scheduler, Option<u64>) -> &mut Scheduler,
        ),
        (sch.deadline, Scheduler::set_deadline),
        (sch.period, Scheduler::set_period),
    ] {
        if v != 0 {
            set(&mut out, Some(v));
        }
    }
    process(s, "scheduler")?.set_scheduler(Some(out));
    Ok(())
}

fn from_name<T: serde::de::DeserializeOwned>(field: &str, name: &str, what: &str) -> Result<T, AdjustError> {
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| invalid(field, name, format!("unknown {what}")))
}

fn seccomp(sc: &api::LinuxSeccomp) -> Result<LinuxSeccomp, AdjustError> {
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

fn apply_namespaces(s: &mut Spec, nss: &[api::LinuxNamespace]) -> Result<(), AdjustError> {
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

fn memory_policy(mp: &api::LinuxMemoryPolicy) -> Result<LinuxMemoryPolicy, AdjustError> {
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

/// Whether `r` changes anything in `linux.resources` itself (classes are
/// handled separately).
fn resources_touch(r: &api::LinuxResources) -> bool {
    resources::FIELDS.iter().any(|f| f.in_oci_resources() && f.is_set(r))
}

/// Applies the present fields of NRI resources `r` to OCI resources
/// `target` (used at create time and for container updates), field by
/// field in [`resources::FIELDS`] order; hugepage limits replace the one
/// of their page size. With `devices`, cgroup device rules are appended
/// (create time only).
///
/// # Errors
/// [`AdjustError::Invalid`] for values the kernel would reject; `target`
/// then holds the fields before the offending one.
pub fn apply_resources(target: &mut LinuxResources, r: &api::LinuxResources, devices: bool) -> Result<(), AdjustError> {
    let old_limit = target.memory().as_ref().and_then(|m| m.limit());
    for f in resources::FIELDS {
        if devices || f.shape != resources::Shape::Rules {
            f.write_oci(r, target)?;
        }
    }
    if let Some(m) = r.memory.as_ref()
        && let Some(limit) = m.limit.as_ref()
        && m.swap.is_none()
        && let Some(mem) = target.memory_mut()
    {
        // Keep runc's swap >= limit rule and a "no swap" setting.
        let follow = match (mem.swap(), old_limit) {
            (Some(swap), Some(old)) if swap == old => true,
            (Some(swap), _) => swap != -1 && limit.value != -1 && swap < limit.value,
            _ => false,
        };
        if follow {
            mem.set_swap(Some(limit.value));
        }
    }
    Ok(())
}

/// Applies an NRI resource update to OCI resources (UpdateContainer): only
/// the fields present in `update` change.
///
/// # Errors
/// As [`apply_resources`].
pub fn update(target: &mut LinuxResources, update: &api::LinuxResources) -> Result<(), AdjustError> {
    let mut out = target.clone();
    apply_resources(&mut out, update, false)?;
    *target = out;
    Ok(())
}

/// The OCI form of NRI resources, as passed to a runtime's update path:
/// `memory` and `cpu` objects are always present (possibly empty), so code
/// that dereferences them unconditionally cannot crash (NRI #37).
///
/// # Errors
/// As [`apply_resources`].
pub fn to_oci_resources(r: &api::LinuxResources) -> Result<LinuxResources, AdjustError> {
    let mut out = LinuxResources::default();
    apply_resources(&mut out, r, true)?;
    out.memory_mut().get_or_insert_with(LinuxMemory::default);
    out.cpu_mut().get_or_insert_with(LinuxCpu::default);
    Ok(out)
}

fn apply_rdt(s: &mut Spec, rdt: &api::LinuxRdt) {
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
        cur.set_schemata(Some(v.value.clone()));
    }
    if let Some(v) = rdt.enable_monitoring.as_ref() {
        cur.set_enable_monitoring(Some(v.value));
    }
    lin.set_intel_rdt(Some(cur));
}

fn depth(p: &std::path::Path) -> usize {
    p.components().count()
}

fn apply_mounts(s: &mut Spec, mounts: &[api::Mount]) -> Result<(), AdjustError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let mut list = s.mounts().clone().unwrap_or_default();
    let mut propagation: Option<&str> = None;
    for m in mounts {
        if let Some(dest) = removal_key(&m.destination) {
            list.retain(|x| x.destination() != &PathBuf::from(dest));
            continue;
        }
        if !m.destination.starts_with('/') {
            return Err(invalid(
                "mounts.destination",
                &m.destination,
                "must be an absolute path",
            ));
        }
        let mut out = Mount::default();
        out.set_destination(PathBuf::from(&m.destination));
        out.set_typ((!m.type_.is_empty()).then(|| m.type_.clone()));
        out.set_source((!m.source.is_empty()).then(|| PathBuf::from(&m.source)));
        out.set_options((!m.options.is_empty()).then(|| m.options.clone()));
        for o in &m.options {
            match o.as_str() {
                "rshared" => propagation = Some("rshared"),
                "rslave" if propagation != Some("rshared") => propagation = Some("rslave"),
                _ => {}
            }
        }
        resources::upsert(&mut list, out, |a, b| a.destination() == b.destination());
    }
    if let Some(p) = propagation {
        // The rootfs must propagate for shared/slave bind mounts to work.
        let lin = linux(s);
        let cur = lin.rootfs_propagation().clone();
        let keep =
            matches!(cur.as_deref(), Some("rshared")) || (p == "rslave" && matches!(cur.as_deref(), Some("rslave")));
        if !keep {
            lin.set_rootfs_propagation(Some(p.to_string()));
        }
    }
    // Parents before children: by depth, then destination (stable).
    list.sort_by(|a, b| (depth(a.destination()), a.destination()).cmp(&(depth(b.destination()), b.destination())));
    s.set_mounts(Some(list));
    Ok(())
}

fn apply_rlimits(s: &mut Spec, rlimits: &[api::POSIXRlimit]) -> Result<(), AdjustError> {
    if rlimits.is_empty() {
        return Ok(());
    }
    let mut converted = Vec::new();
    for r in rlimits {
        let typ = from_name("rlimits.type", &r.type_, "rlimit type")?;
        if r.soft > r.hard {
            return Err(invalid(
                format!("rlimits[{}]", r.type_),
                format!("soft {} > hard {}", r.soft, r.hard),
                "soft limit above hard limit",
            ));
        }
        let l: PosixRlimit = PosixRlimitBuilder::default()
            .typ::<oci_spec::runtime::PosixRlimitType>(typ)
            .hard(r.hard)
            .soft(r.soft)
            .build()
            .map_err(|e| invalid(format!("rlimits[{}]", r.type_), r.hard, e.to_string()))?;
        converted.push(l);
    }
    let p = process(s, "rlimits")?;
    let mut list = p.rlimits().clone().unwrap_or_default();
    for l in converted {
        resources::upsert(&mut list, l, |a, b| a.typ() == b.typ());
    }
    p.set_rlimits(Some(list));
    Ok(())
}

#[cfg(test)]
mod tests;
