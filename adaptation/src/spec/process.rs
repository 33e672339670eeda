//! The process part of an adjustment: environment, hooks, I/O priority,
//! scheduler and rlimits.

use std::path::PathBuf;

use nri_proto::api;
use oci_spec::runtime::{
    Hook, Hooks, LinuxIOPriorityBuilder, LinuxSchedulerFlag, LinuxSchedulerPolicy, PosixRlimit, PosixRlimitBuilder,
    Scheduler, Spec,
};

use super::{AdjustError, invalid, linux::from_name, process};
use crate::resources::{self, removal_key};

pub(super) fn apply_env(s: &mut Spec, env: &[api::KeyValue]) -> Result<(), AdjustError> {
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

pub(super) fn oci_hook(h: &api::Hook, list: &str) -> Result<Hook, AdjustError> {
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

pub(super) fn apply_hooks(s: &mut Spec, h: &api::Hooks) -> Result<(), AdjustError> {
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

pub(super) fn apply_io_priority(s: &mut Spec, p: &api::LinuxIOPriority) -> Result<(), AdjustError> {
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

pub(super) fn apply_scheduler(s: &mut Spec, sch: &api::LinuxScheduler) -> Result<(), AdjustError> {
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

/// The OCI name of an rlimit type as plugins write it: `RLIMIT_NOFILE`,
/// `rlimit_nofile`, `NOFILE` and `nofile` are one type. Upstream's spec
/// generator copies the string as given, so a plugin may send any of these
/// forms (upstream's ulimit-adjuster documents them all); runtimes only
/// know the upper-case `RLIMIT_` form.
pub(crate) fn canonical_rlimit_type(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    if upper.starts_with("RLIMIT_") {
        upper
    } else {
        format!("RLIMIT_{upper}")
    }
}

pub(super) fn apply_rlimits(s: &mut Spec, rlimits: &[api::POSIXRlimit]) -> Result<(), AdjustError> {
    if rlimits.is_empty() {
        return Ok(());
    }
    let mut converted = Vec::new();
    for r in rlimits {
        let typ = from_name::<oci_spec::runtime::PosixRlimitType>(
            "rlimits.type",
            &canonical_rlimit_type(&r.type_),
            "rlimit type",
        )
        .map_err(|_| invalid("rlimits.type", &r.type_, "unknown rlimit type"))?;
        if r.soft > r.hard {
            return Err(invalid(
                format!("rlimits[{}]", r.type_),
                format!("soft {} > hard {}", r.soft, r.hard),
                "soft limit above hard limit",
            ));
        }
        let l: PosixRlimit = PosixRlimitBuilder::default()
            .typ(typ)
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
