//! The table of resource fields: where each lives in the generated
//! messages and in the OCI spec, and the values the kernel rejects.

use std::collections::{BTreeSet, HashMap};

use nri_proto::api::{self, Field};
use oci_spec::runtime as oci;
use protobuf::MessageField;

use super::{Entry, Oci, ResourceField, Rules, Shape, Value, upsert};
use crate::spec::{AdjustError, device_type, invalid};

/// A sub-message of `LinuxResources` that holds scalars.
pub(super) struct Section {
    /// Whether NRI resources have it.
    pub(super) present: fn(&api::LinuxResources) -> bool,
    /// Whether OCI resources have it.
    pub(super) in_oci: fn(&oci::LinuxResources) -> bool,
    /// Makes it present in NRI resources.
    pub(super) open: fn(&mut api::LinuxResources),
}

/// The sections of `LinuxResources`: present (perhaps empty) in a view as
/// soon as an update or the OCI spec has them.
pub(super) static SECTIONS: &[Section] = &[
    Section {
        present: |r| r.memory.is_some(),
        in_oci: |o| o.memory().is_some(),
        open: |r| {
            r.memory.mut_or_insert_default();
        },
    },
    Section {
        present: |r| r.cpu.is_some(),
        in_oci: |o| o.cpu().is_some(),
        open: |r| {
            r.cpu.mut_or_insert_default();
        },
    },
];

/// Storage of a scalar in the generated messages: an `Optional*` wrapper,
/// a string that is unset when empty, or the pids message.
trait Slot: Clone {
    type Raw;
    fn present(&self) -> bool;
    fn get(&self) -> Option<Self::Raw>;
    fn of(raw: Self::Raw) -> Self;
}

macro_rules! wrapper_slot {
    ($($wrapper:ident: $raw:ty),*) => {$(
        impl Slot for MessageField<api::$wrapper> {
            type Raw = $raw;
            fn present(&self) -> bool {
                self.is_some()
            }
            fn get(&self) -> Option<$raw> {
                self.as_ref().map(|v| v.value)
            }
            fn of(value: $raw) -> Self {
                MessageField::some(api::$wrapper { value, ..Default::default() })
            }
        }
    )*};
}

wrapper_slot!(OptionalInt64: i64, OptionalUInt64: u64, OptionalBool: bool);

impl Slot for MessageField<api::OptionalString> {
    type Raw = String;
    fn present(&self) -> bool {
        self.is_some()
    }
    fn get(&self) -> Option<String> {
        self.as_ref().map(|v| v.value.clone())
    }
    fn of(value: String) -> Self {
        MessageField::some(api::OptionalString {
            value,
            ..Default::default()
        })
    }
}

impl Slot for String {
    type Raw = String;
    fn present(&self) -> bool {
        !self.is_empty()
    }
    fn get(&self) -> Option<String> {
        self.present().then(|| self.clone())
    }
    fn of(raw: String) -> Self {
        raw
    }
}

impl Slot for MessageField<api::LinuxPids> {
    type Raw = i64;
    fn present(&self) -> bool {
        self.is_some()
    }
    fn get(&self) -> Option<i64> {
        self.as_ref().map(|p| p.limit)
    }
    fn of(limit: i64) -> Self {
        MessageField::some(api::LinuxPids {
            limit,
            ..Default::default()
        })
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Uint(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}

/// The slot of a scalar in `$r`, if its section (`memory`, `cpu`) is there.
macro_rules! slot {
    ($r:expr, [$sec:ident] $f:ident) => {
        $r.$sec.as_ref().map(|s| &s.$f)
    };
    ($r:expr, [] $f:ident) => {
        Some(&$r.$f)
    };
}

/// The slot of a scalar in `$r`, creating its section.
macro_rules! slot_mut {
    ($r:expr, [$sec:ident] $f:ident) => {
        &mut $r.$sec.mut_or_insert_default().$f
    };
    ($r:expr, [] $f:ident) => {
        &mut $r.$f
    };
}

/// A scalar table entry: name, protobuf path when it differs from the
/// name, owner, place in the generated message (`[section] field`), and
/// optionally its OCI getter, setter and value check.
macro_rules! scalar {
    (@oci $name:literal, [$($sec:ident)?] $f:ident) => {
        None
    };
    (@oci $name:literal, [$($sec:ident)?] $f:ident, $get:expr, $set:expr, $check:path) => {
        Some(Oci {
            write: |r, o| {
                if let Some(v) = slot!(r, [$($sec)?] $f).and_then(Slot::get) {
                    $check(concat!("linux.resources.", $name), &v)?;
                    ($set)(o, v);
                }
                Ok(())
            },
            read: |o, r| {
                if let Some(v) = ($get)(o) {
                    *slot_mut!(r, [$($sec)?] $f) = Slot::of(v);
                }
            },
        })
    };
    (@proto $name:literal) => {
        $name
    };
    (@proto $name:literal $proto:literal) => {
        $proto
    };
    (
        $name:literal $(($proto:literal))?, $owner:ident, [$($sec:ident)?] $f:ident
        $(, oci: $get:expr, $set:expr, $check:path)?
    ) => {
        ResourceField {
            name: $name,
            proto: scalar!(@proto $name $($proto)?),
            owner: Some(Field::$owner),
            shape: Shape::Scalar,
            is_set: |r| slot!(r, [$($sec)?] $f).is_some_and(Slot::present),
            visit: |r, out| {
                if let Some(v) = slot!(r, [$($sec)?] $f).and_then(Slot::get) {
                    out(Entry::Scalar(v.into()));
                }
            },
            claim: |r, own, field, plugin| {
                if slot!(r, [$($sec)?] $f).is_some_and(Slot::present) {
                    own.claim_simple(field, plugin)?;
                }
                Ok(())
            },
            overlay: |cur, upd, _| {
                if let Some(s) = slot!(upd, [$($sec)?] $f).filter(|s| s.present()) {
                    *slot_mut!(cur, [$($sec)?] $f) = s.clone();
                }
            },
            oci: scalar!(@oci $name, [$($sec)?] $f $(, $get, $set, $check)?),
        }
    };
}

fn memory(o: &oci::LinuxResources) -> Option<&oci::LinuxMemory> {
    o.memory().as_ref()
}

fn memory_mut(o: &mut oci::LinuxResources) -> &mut oci::LinuxMemory {
    o.memory_mut().get_or_insert_with(Default::default)
}

fn cpu(o: &oci::LinuxResources) -> Option<&oci::LinuxCpu> {
    o.cpu().as_ref()
}

fn cpu_mut(o: &mut oci::LinuxResources) -> &mut oci::LinuxCpu {
    o.cpu_mut().get_or_insert_with(Default::default)
}

fn pids(o: &oci::LinuxResources) -> Option<&oci::LinuxPids> {
    o.pids().as_ref()
}

fn set_pids(o: &mut oci::LinuxResources, limit: i64) {
    let mut p = oci::LinuxPids::default();
    p.set_limit(limit);
    o.set_pids(Some(p));
}

/// Value checks for the OCI spec: what the kernel or runc would reject.
mod check {
    use super::{AdjustError, invalid};

    pub(super) fn any<T>(_: &str, _: &T) -> Result<(), AdjustError> {
        Ok(())
    }

    pub(super) fn bytes(field: &str, v: &i64) -> Result<(), AdjustError> {
        if *v < -1 {
            return Err(invalid(field, v, "must be -1 (unlimited) or a byte count"));
        }
        Ok(())
    }

    pub(super) fn swappiness(field: &str, v: &u64) -> Result<(), AdjustError> {
        if *v > 100 {
            return Err(invalid(field, v, "must be within 0..100"));
        }
        Ok(())
    }

    pub(super) fn shares(field: &str, v: &u64) -> Result<(), AdjustError> {
        if *v > i64::MAX as u64 {
            // Shown as the negative number the plugin most likely meant.
            return Err(invalid(field, *v as i64, "must not be negative"));
        }
        Ok(())
    }

    pub(super) fn quota(field: &str, v: &i64) -> Result<(), AdjustError> {
        if *v < -1 {
            return Err(invalid(field, v, "must be -1 (unlimited) or positive microseconds"));
        }
        Ok(())
    }

    pub(super) fn period(field: &str, v: &u64) -> Result<(), AdjustError> {
        if *v != 0 && !(1000..=1_000_000).contains(v) {
            return Err(invalid(field, v, "must be within 1000..1000000 microseconds"));
        }
        Ok(())
    }

    pub(super) fn count(field: &str, v: &i64) -> Result<(), AdjustError> {
        if *v < -1 {
            return Err(invalid(field, v, "must be -1 (unlimited) or a count"));
        }
        Ok(())
    }
}

/// Every field of `LinuxResources`, in the merge's claim order.
pub static FIELDS: &[ResourceField] = &[
    scalar!("memory.limit", MemLimit, [memory] limit,
        oci: |o| memory(o)?.limit(), |o, v| memory_mut(o).set_limit(Some(v)), check::bytes),
    scalar!("memory.reservation", MemReservation, [memory] reservation,
        oci: |o| memory(o)?.reservation(), |o, v| memory_mut(o).set_reservation(Some(v)), check::bytes),
    scalar!("memory.swap", MemSwapLimit, [memory] swap,
        oci: |o| memory(o)?.swap(), |o, v| memory_mut(o).set_swap(Some(v)), check::bytes),
    scalar!("memory.kernel", MemKernelLimit, [memory] kernel,
        oci: |o| memory(o)?.kernel(), |o, v| memory_mut(o).set_kernel(Some(v)), check::bytes),
    scalar!("memory.kernel_tcp", MemTCPLimit, [memory] kernel_tcp,
        oci: |o| memory(o)?.kernel_tcp(), |o, v| memory_mut(o).set_kernel_tcp(Some(v)), check::bytes),
    scalar!("memory.swappiness", MemSwappiness, [memory] swappiness,
        oci: |o| memory(o)?.swappiness(), |o, v| memory_mut(o).set_swappiness(Some(v)), check::swappiness),
    scalar!("memory.disable_oom_killer", MemDisableOomKiller, [memory] disable_oom_killer,
        oci: |o| memory(o)?.disable_oom_killer(), |o, v| memory_mut(o).set_disable_oom_killer(Some(v)), check::any),
    scalar!("memory.use_hierarchy", MemUseHierarchy, [memory] use_hierarchy,
        oci: |o| memory(o)?.use_hierarchy(), |o, v| memory_mut(o).set_use_hierarchy(Some(v)), check::any),
    scalar!("cpu.shares", CPUShares, [cpu] shares,
        oci: |o| cpu(o)?.shares(), |o, v| cpu_mut(o).set_shares(Some(v)), check::shares),
    scalar!("cpu.quota", CPUQuota, [cpu] quota,
        oci: |o| cpu(o)?.quota(), |o, v| cpu_mut(o).set_quota(Some(v)), check::quota),
    scalar!("cpu.period", CPUPeriod, [cpu] period,
        oci: |o| cpu(o)?.period(), |o, v| cpu_mut(o).set_period(Some(v)), check::period),
    scalar!("cpu.realtime_runtime", CPURealtimeRuntime, [cpu] realtime_runtime,
        oci: |o| cpu(o)?.realtime_runtime(), |o, v| cpu_mut(o).set_realtime_runtime(Some(v)), check::any),
    scalar!("cpu.realtime_period", CPURealtimePeriod, [cpu] realtime_period,
        oci: |o| cpu(o)?.realtime_period(), |o, v| cpu_mut(o).set_realtime_period(Some(v)), check::any),
    scalar!("cpu.cpus", CPUSetCPUs, [cpu] cpus,
        oci: |o| cpu(o)?.cpus().clone(), |o, v| cpu_mut(o).set_cpus(Some(v)), check::any),
    scalar!("cpu.mems", CPUSetMems, [cpu] mems,
        oci: |o| cpu(o)?.mems().clone(), |o, v| cpu_mut(o).set_mems(Some(v)), check::any),
    ResourceField {
        name: "hugepages",
        proto: "hugepage_limits",
        owner: Some(Field::HugepageLimits),
        shape: Shape::KeyedList,
        is_set: |r| !r.hugepage_limits.is_empty(),
        visit: |r, out| {
            for h in &r.hugepage_limits {
                out(Entry::Keyed(&h.page_size, Value::Uint(h.limit)));
            }
        },
        claim: |r, own, field, plugin| {
            for h in &r.hugepage_limits {
                own.claim_compound(field, &h.page_size, plugin)?;
            }
            Ok(())
        },
        overlay: |cur, upd, _| {
            for h in &upd.hugepage_limits {
                upsert(&mut cur.hugepage_limits, h.clone(), |a, b| a.page_size == b.page_size);
            }
        },
        oci: Some(Oci {
            write: |r, o| {
                if r.hugepage_limits.is_empty() {
                    return Ok(());
                }
                let list = o.hugepage_limits_mut().get_or_insert_with(Vec::new);
                for h in &r.hugepage_limits {
                    let limit = i64::try_from(h.limit).map_err(|_| {
                        invalid(
                            format!("linux.resources.hugepage_limits[{}]", h.page_size),
                            h.limit,
                            "too large",
                        )
                    })?;
                    let mut l = oci::LinuxHugepageLimit::default();
                    l.set_page_size(h.page_size.clone());
                    l.set_limit(limit);
                    upsert(list, l, |a, b| a.page_size() == b.page_size());
                }
                Ok(())
            },
            read: |o, r| {
                for h in o.hugepage_limits().iter().flatten() {
                    r.hugepage_limits.push(api::HugepageLimit {
                        page_size: h.page_size().clone(),
                        limit: h.limit().max(0) as u64,
                        ..Default::default()
                    });
                }
            },
        }),
    },
    ResourceField {
        name: "unified",
        proto: "unified",
        owner: Some(Field::CgroupsUnified),
        shape: Shape::Map,
        is_set: |r| !r.unified.is_empty(),
        visit: |r, out| {
            for (k, v) in &r.unified {
                out(Entry::Keyed(k, Value::Str(v.clone())));
            }
        },
        claim: |r, own, field, plugin| {
            // Sorted, so which conflict is reported first is deterministic.
            for k in r.unified.keys().collect::<BTreeSet<_>>() {
                own.claim_compound(field, k, plugin)?;
            }
            Ok(())
        },
        overlay: |cur, upd, _| {
            for (k, v) in &upd.unified {
                cur.unified.insert(k.clone(), v.clone());
            }
        },
        oci: Some(Oci {
            write: |r, o| {
                if !r.unified.is_empty() {
                    let map = o.unified_mut().get_or_insert_with(HashMap::new);
                    for (k, v) in &r.unified {
                        map.insert(k.clone(), v.clone());
                    }
                }
                Ok(())
            },
            read: |o, r| {
                for (k, v) in o.unified().iter().flatten() {
                    r.unified.insert(k.clone(), v.clone());
                }
            },
        }),
    },
    scalar!("blockio_class", BlockioClass, [] blockio_class),
    scalar!("rdt_class", RdtClass, [] rdt_class),
    scalar!("pids.limit" ("pids"), PidsLimit, [] pids,
        oci: |o| pids(o).map(|p| p.limit()), set_pids, check::count),
    ResourceField {
        name: "devices",
        proto: "devices",
        owner: None,
        shape: Shape::Rules,
        is_set: |r| !r.devices.is_empty(),
        visit: |r, out| {
            if !r.devices.is_empty() {
                out(Entry::Rules(&r.devices));
            }
        },
        claim: |_, _, _, _| Ok(()),
        overlay: |cur, upd, rules| match rules {
            Rules::Append => cur.devices.extend(upd.devices.iter().cloned()),
            Rules::Replace if !upd.devices.is_empty() => cur.devices.clone_from(&upd.devices),
            Rules::Replace | Rules::Keep => {}
        },
        oci: Some(Oci {
            write: |r, o| {
                if r.devices.is_empty() {
                    return Ok(());
                }
                let list = o.devices_mut().get_or_insert_with(Vec::new);
                for d in &r.devices {
                    list.push(device_rule_to_oci(d)?);
                }
                Ok(())
            },
            read: |o, r| {
                for d in o.devices().iter().flatten() {
                    r.devices.push(api::LinuxDeviceCgroup {
                        allow: d.allow(),
                        type_: d.typ().map(crate::convert::dev_type).unwrap_or_default(),
                        major: MessageField::from_option(d.major().map(|value| api::OptionalInt64 {
                            value,
                            ..Default::default()
                        })),
                        minor: MessageField::from_option(d.minor().map(|value| api::OptionalInt64 {
                            value,
                            ..Default::default()
                        })),
                        access: d.access().clone().unwrap_or_default(),
                        ..Default::default()
                    });
                }
            },
        }),
    },
];

fn device_rule_to_oci(d: &api::LinuxDeviceCgroup) -> Result<oci::LinuxDeviceCgroup, AdjustError> {
    let mut rule = oci::LinuxDeviceCgroup::default();
    rule.set_allow(d.allow);
    rule.set_typ(match d.type_.as_str() {
        "" | "a" => Some(oci::LinuxDeviceType::A),
        t => Some(device_type(t, "resources.devices")?),
    });
    rule.set_major(d.major.as_ref().map(|v| v.value));
    rule.set_minor(d.minor.as_ref().map(|v| v.value));
    if !d.access.is_empty() {
        if !d.access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(invalid(
                "linux.resources.devices.access",
                &d.access,
                "must use only r, w, m",
            ));
        }
        rule.set_access(Some(d.access.clone()));
    }
    Ok(rule)
}
