//! Merging the adjustments of every matching rule into one response.
//!
//! Later rules override earlier ones key by key (an environment variable,
//! an annotation, a mount destination, a device path, an rlimit type, each
//! resource field), so the response names every key at most once: the
//! runtime would take a key sent twice by one plugin for a conflict.

use nri_stub::api;
use protobuf::MessageField;

use crate::config::{Adjust, CpuSpec, DeviceSpec, MemorySpec, MountSpec, RlimitSpec};

/// Value that removes an environment variable or annotation.
pub const REMOVE: &str = "-";

/// The combined adjustment of several rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Merged {
    /// Name -> value, `None` to remove; in first-seen order.
    env: Vec<(String, Option<String>)>,
    annotations: Vec<(String, Option<String>)>,
    mounts: Vec<MountSpec>,
    devices: Vec<DeviceSpec>,
    cpu: CpuSpec,
    memory: MemorySpec,
    pids: Option<i64>,
    rlimits: Vec<RlimitSpec>,
    oom_score_adj: Option<i64>,
}

/// Replaces the element with the same key, or appends.
fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T, &T) -> bool) {
    match list.iter_mut().find(|x| same(x, &item)) {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

fn set_or_remove(v: &str) -> Option<String> {
    (v != REMOVE).then(|| v.to_string())
}

fn over<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
    if v.is_some() {
        slot.clone_from(v);
    }
}

impl Merged {
    /// Nothing to change.
    pub fn new() -> Merged {
        Merged::default()
    }

    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        *self == Merged::default()
    }

    /// Adds one rule's adjustment on top of what is there.
    pub fn add(&mut self, a: &Adjust) {
        for (k, v) in &a.env {
            upsert(&mut self.env, (k.clone(), set_or_remove(v)), |x, y| x.0 == y.0);
        }
        for (k, v) in &a.annotations {
            upsert(&mut self.annotations, (k.clone(), set_or_remove(v)), |x, y| x.0 == y.0);
        }
        for m in &a.mounts {
            upsert(&mut self.mounts, m.clone(), |x, y| x.destination == y.destination);
        }
        for d in &a.devices {
            upsert(&mut self.devices, d.clone(), |x, y| x.path == y.path);
        }
        if let Some(c) = &a.cpu {
            over(&mut self.cpu.shares, &c.shares);
            over(&mut self.cpu.quota, &c.quota);
            over(&mut self.cpu.period, &c.period);
            over(&mut self.cpu.cpus, &c.cpus);
            over(&mut self.cpu.mems, &c.mems);
        }
        if let Some(m) = &a.memory {
            over(&mut self.memory.limit, &m.limit);
            over(&mut self.memory.reservation, &m.reservation);
            over(&mut self.memory.swap, &m.swap);
            over(&mut self.memory.swappiness, &m.swappiness);
            over(&mut self.memory.disable_oom_killer, &m.disable_oom_killer);
        }
        if let Some(p) = &a.pids {
            self.pids = Some(p.limit);
        }
        for r in &a.rlimits {
            upsert(&mut self.rlimits, r.clone(), |x, y| x.typ == y.typ);
        }
        over(&mut self.oom_score_adj, &a.oom_score_adj);
    }

    /// The NRI adjustment: removals as `-NAME` entries, every key once.
    pub fn to_adjustment(&self) -> api::ContainerAdjustment {
        let mut a = api::ContainerAdjustment::new();
        for (k, v) in &self.env {
            a.env.push(match v {
                Some(v) => api::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                    ..Default::default()
                },
                None => api::KeyValue {
                    key: format!("-{k}"),
                    ..Default::default()
                },
            });
        }
        for (k, v) in &self.annotations {
            match v {
                Some(v) => a.annotations.insert(k.clone(), v.clone()),
                None => a.annotations.insert(format!("-{k}"), String::new()),
            };
        }
        for m in &self.mounts {
            a.mounts.push(api::Mount {
                destination: m.destination.clone(),
                type_: m.typ.clone(),
                source: m.source.clone(),
                options: m.options.clone(),
                ..Default::default()
            });
        }
        for r in &self.rlimits {
            a.rlimits.push(api::POSIXRlimit {
                type_: r.typ.clone(),
                hard: r.hard,
                soft: r.soft,
                ..Default::default()
            });
        }
        for d in &self.devices {
            a.linux.mut_or_insert_default().devices.push(api::LinuxDevice {
                path: d.path.clone(),
                type_: d.typ.as_str().to_string(),
                major: d.major.unwrap_or(0),
                minor: d.minor.unwrap_or(0),
                file_mode: MessageField::from_option(d.file_mode.map(|value| api::OptionalFileMode {
                    value,
                    ..Default::default()
                })),
                uid: MessageField::from_option(d.uid.map(|value| api::OptionalUInt32 {
                    value,
                    ..Default::default()
                })),
                gid: MessageField::from_option(d.gid.map(|value| api::OptionalUInt32 {
                    value,
                    ..Default::default()
                })),
                ..Default::default()
            });
        }
        if let Some(value) = self.oom_score_adj {
            a.linux.mut_or_insert_default().oom_score_adj = MessageField::some(api::OptionalInt {
                value,
                ..Default::default()
            });
        }
        if let Some(r) = self.resources() {
            a.linux.mut_or_insert_default().resources = MessageField::some(r);
        }
        a
    }

    /// The resources part, if any field is set.
    fn resources(&self) -> Option<api::LinuxResources> {
        let i64v = |v: Option<i64>| {
            MessageField::from_option(v.map(|value| api::OptionalInt64 {
                value,
                ..Default::default()
            }))
        };
        let u64v = |v: Option<u64>| {
            MessageField::from_option(v.map(|value| api::OptionalUInt64 {
                value,
                ..Default::default()
            }))
        };
        let mut r = api::LinuxResources::new();
        if self.cpu != CpuSpec::default() {
            let c = &self.cpu;
            r.cpu = MessageField::some(api::LinuxCPU {
                shares: u64v(c.shares),
                quota: i64v(c.quota),
                period: u64v(c.period),
                cpus: c.cpus.clone().unwrap_or_default(),
                mems: c.mems.clone().unwrap_or_default(),
                ..Default::default()
            });
        }
        if self.memory != MemorySpec::default() {
            let m = &self.memory;
            r.memory = MessageField::some(api::LinuxMemory {
                limit: i64v(m.limit.map(|b| b.0)),
                reservation: i64v(m.reservation.map(|b| b.0)),
                swap: i64v(m.swap.map(|b| b.0)),
                swappiness: u64v(m.swappiness),
                disable_oom_killer: MessageField::from_option(m.disable_oom_killer.map(|value| api::OptionalBool {
                    value,
                    ..Default::default()
                })),
                ..Default::default()
            });
        }
        if let Some(limit) = self.pids {
            r.pids = MessageField::some(api::LinuxPids {
                limit,
                ..Default::default()
            });
        }
        (r != api::LinuxResources::new()).then_some(r)
    }

    /// The CreateContainer response: the adjustment, no updates; an empty
    /// response when nothing changes.
    pub fn to_response(&self) -> api::CreateContainerResponse {
        let mut rsp = api::CreateContainerResponse::new();
        if !self.is_empty() {
            rsp.adjust = MessageField::some(self.to_adjustment());
        }
        rsp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn merged(text: &str) -> Merged {
        let cfg = Config::parse(text).unwrap();
        let mut m = Merged::new();
        for r in &cfg.rules {
            m.add(&r.adjust);
        }
        m
    }

    #[test]
    fn later_rules_override_earlier_ones_key_by_key() {
        let m = merged(
            r#"
            [[rule]]
            [rule.adjust]
            env = { A = "1", B = "1", C = "1" }
            annotations = { x = "1", y = "1" }
            mounts = [{ destination = "/m", source = "/one", type = "bind" }, { destination = "/n", type = "tmpfs" }]
            devices = [{ path = "/dev/a", type = "c", major = 1, minor = 1 }]
            cpu = { shares = 100, quota = 1000 }
            memory = { limit = 100, swap = 200 }
            pids = { limit = 5 }
            rlimits = [{ type = "RLIMIT_NOFILE", hard = 10, soft = 5 }]
            oom_score_adj = 1

            [[rule]]
            [rule.adjust]
            env = { A = "2", C = "-" }
            annotations = { y = "-", z = "2" }
            mounts = [{ destination = "/m", source = "/two", type = "bind" }]
            devices = [{ path = "/dev/a", type = "c", major = 2, minor = 2 }]
            cpu = { shares = 200 }
            memory = { limit = 300 }
            pids = { limit = 6 }
            rlimits = [{ type = "RLIMIT_NOFILE", hard = 20, soft = 10 }]
            oom_score_adj = 2
            "#,
        );
        let a = m.to_adjustment();
        let env: Vec<(&str, &str)> = a.env.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        assert_eq!(env, [("A", "2"), ("B", "1"), ("-C", "")]);
        let mut ann: Vec<(&String, &String)> = a.annotations.iter().collect();
        ann.sort();
        assert_eq!(
            ann.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>(),
            [("-y", ""), ("x", "1"), ("z", "2")]
        );
        assert_eq!(a.mounts.len(), 2);
        assert_eq!(
            (a.mounts[0].destination.as_str(), a.mounts[0].source.as_str()),
            ("/m", "/two")
        );
        let l = a.linux.as_ref().unwrap();
        assert_eq!(l.devices.len(), 1);
        assert_eq!((l.devices[0].major, l.devices[0].minor), (2, 2));
        assert_eq!(l.oom_score_adj.value, 2);
        let r = l.resources.as_ref().unwrap();
        assert_eq!(r.cpu.shares.value, 200);
        assert_eq!(r.cpu.quota.value, 1000, "untouched fields of earlier rules stay");
        assert_eq!(r.memory.limit.value, 300);
        assert_eq!(r.memory.swap.value, 200);
        assert!(r.memory.reservation.is_none());
        assert_eq!(r.pids.limit, 6);
        assert_eq!(a.rlimits.len(), 1);
        assert_eq!((a.rlimits[0].hard, a.rlimits[0].soft), (20, 10));
    }

    #[test]
    fn no_key_is_sent_twice() {
        let m = merged(
            r#"
            [[rule]]
            [rule.adjust]
            env = { A = "-" }
            [[rule]]
            [rule.adjust]
            env = { A = "back" }
            [[rule]]
            [rule.adjust]
            env = { A = "again" }
            "#,
        );
        let a = m.to_adjustment();
        assert_eq!(a.env.len(), 1);
        assert_eq!((a.env[0].key.as_str(), a.env[0].value.as_str()), ("A", "again"));
    }

    #[test]
    fn only_what_is_set_is_sent() {
        let m = merged("[[rule]]\n[rule.adjust]\nenv = { A = \"1\" }\n");
        let a = m.to_adjustment();
        assert!(
            a.linux.is_none(),
            "no linux part without devices, resources or OOM score"
        );
        assert!(a.annotations.is_empty() && a.mounts.is_empty() && a.rlimits.is_empty());
        let m = merged("[[rule]]\n[rule.adjust]\nmemory = { swappiness = 0 }\n");
        let r = m.to_adjustment().linux.unwrap().resources.unwrap();
        assert!(r.cpu.is_none() && r.pids.is_none());
        assert_eq!(r.memory.swappiness.value, 0);
        assert!(r.memory.limit.is_none());
        assert_eq!(Merged::new().to_response(), api::CreateContainerResponse::new());
    }

    #[test]
    fn devices_carry_optional_fields() {
        let m = merged(
            "[[rule]]\n[rule.adjust]\ndevices = [{ path = \"/dev/fuse\", type = \"c\", major = 10, minor = 229, file_mode = 0o666, gid = 5 }]\n",
        );
        let d = &m.to_adjustment().linux.unwrap().devices[0];
        assert_eq!((d.path.as_str(), d.type_.as_str()), ("/dev/fuse", "c"));
        assert_eq!(d.file_mode.value, 0o666);
        assert!(d.uid.is_none());
        assert_eq!(d.gid.value, 5);
    }
}
