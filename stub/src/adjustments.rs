//! The common adjustments, as a plugin writes them.
//!
//! A CreateContainer answer carries one [`api::ContainerAdjustment`]
//! (`rsp.adjust`), changes to other running containers
//! ([`api::ContainerUpdate`], `rsp.update`) and evictions
//! ([`api::ContainerEviction`], `rsp.evict`). Sub-messages are
//! [`MessageField`]s: `mut_or_insert_default()` creates one on first use.
//! Scalars that NRI must tell apart from "unset" are wrapped
//! (`api::OptionalInt64 { value, .. }` and kin). The runtime merges every
//! plugin's answer: two plugins setting the same field (the same env name,
//! mount destination, annotation key, memory limit, ...) fail the create,
//! naming both plugins and the field.
//!
//! This module holds no code; every example below is compiled and run by
//! `cargo test -p nri-stub --doc`.
//!
//! # Environment, annotations, arguments
//!
//! A key starting with `-` removes the variable or annotation (also one the
//! container's own spec set).
//!
//! ```
//! use nri_stub::api;
//!
//! let mut adjust = api::ContainerAdjustment::new();
//! adjust.env.push(api::KeyValue { key: "LOG_LEVEL".into(), value: "debug".into(), ..Default::default() });
//! adjust.env.push(api::KeyValue { key: "-HTTP_PROXY".into(), ..Default::default() }); // removes it
//! adjust.annotations.insert("example.com/pinned".into(), "true".into());
//! adjust.args = vec!["/bin/app".into(), "--workers=4".into()]; // replaces the whole argv
//! assert_eq!(adjust.env.len(), 2);
//! ```
//!
//! # Mounts
//!
//! A mount is keyed on its destination; `-/path` as the destination removes
//! the container's mount there.
//!
//! ```
//! use nri_stub::api;
//!
//! let mut adjust = api::ContainerAdjustment::new();
//! adjust.mounts.push(api::Mount {
//!     destination: "/etc/app".into(),
//!     source: "/var/lib/app/config".into(),
//!     type_: "bind".into(),
//!     options: vec!["rbind".into(), "ro".into()],
//!     ..Default::default()
//! });
//! adjust.mounts.push(api::Mount {
//!     destination: "/scratch".into(),
//!     source: "tmpfs".into(),
//!     type_: "tmpfs".into(),
//!     options: vec!["size=64m".into()],
//!     ..Default::default()
//! });
//! assert_eq!(adjust.mounts[1].type_, "tmpfs");
//! ```
//!
//! # Memory and CPU
//!
//! Limits in bytes; CPU sets in the kernel's list form; shares, quota (µs
//! per period) and period (µs) as in the OCI spec. A memory limit on a
//! container without a swap limit also limits swap to the same value.
//!
//! ```
//! use nri_stub::{MessageField, api};
//!
//! let mut adjust = api::ContainerAdjustment::new();
//! let resources = adjust.linux.mut_or_insert_default().resources.mut_or_insert_default();
//! resources.memory.mut_or_insert_default().limit =
//!     MessageField::some(api::OptionalInt64 { value: 256 << 20, ..Default::default() });
//! let cpu = resources.cpu.mut_or_insert_default();
//! cpu.cpus = "2-3".into();
//! cpu.mems = "0".into();
//! cpu.quota = MessageField::some(api::OptionalInt64 { value: 50_000, ..Default::default() });
//! cpu.period = MessageField::some(api::OptionalUInt64 { value: 100_000, ..Default::default() });
//! resources.pids.mut_or_insert_default().limit = 512;
//! assert_eq!(adjust.linux.resources.memory.limit.value, 256 << 20);
//! ```
//!
//! # Devices and CDI devices
//!
//! A device node is added with the cgroup rule that allows it; type `c` or
//! `b`. A CDI device is named `vendor.com/class=name` and resolved by the
//! runtime from its CDI spec files.
//!
//! ```
//! use nri_stub::{MessageField, api};
//!
//! let mut adjust = api::ContainerAdjustment::new();
//! adjust.linux.mut_or_insert_default().devices.push(api::LinuxDevice {
//!     path: "/dev/fuse".into(),
//!     type_: "c".into(),
//!     major: 10,
//!     minor: 229,
//!     file_mode: MessageField::some(api::OptionalFileMode { value: 0o666, ..Default::default() }),
//!     ..Default::default()
//! });
//! adjust.CDI_devices.push(api::CDIDevice { name: "example.com/gpu=0".into(), ..Default::default() });
//! assert_eq!(adjust.linux.devices[0].minor, 229);
//! ```
//!
//! # Rlimits, OOM score, sysctls, hooks
//!
//! ```
//! use nri_stub::{MessageField, api};
//!
//! let mut adjust = api::ContainerAdjustment::new();
//! adjust.rlimits.push(api::POSIXRlimit { type_: "RLIMIT_NOFILE".into(), hard: 65536, soft: 65536, ..Default::default() });
//! let linux = adjust.linux.mut_or_insert_default();
//! linux.oom_score_adj = MessageField::some(api::OptionalInt { value: 500, ..Default::default() });
//! linux.sysctl.insert("net.ipv4.ip_unprivileged_port_start".into(), "0".into());
//! adjust.hooks.mut_or_insert_default().prestart.push(api::Hook {
//!     path: "/usr/local/bin/setup-net".into(),
//!     args: vec!["setup-net".into(), "--quiet".into()],
//!     ..Default::default()
//! });
//! assert_eq!(adjust.hooks.prestart.len(), 1);
//! ```
//!
//! # Changing or evicting other containers
//!
//! Any answer that carries updates (CreateContainer, UpdateContainer,
//! StopContainer) may change the resources of running containers, by id; an
//! update with `ignore_failure` does not fail the request when the runtime
//! cannot apply it. An eviction asks the runtime to stop a container.
//!
//! ```
//! use nri_stub::api;
//!
//! let mut rsp = api::CreateContainerResponse::new();
//! let mut update = api::ContainerUpdate { container_id: "3f2a9c".into(), ignore_failure: true, ..Default::default() };
//! update.linux.mut_or_insert_default().resources.mut_or_insert_default().cpu.mut_or_insert_default().cpus = "0-1".into();
//! rsp.update.push(update);
//! rsp.evict.push(api::ContainerEviction {
//!     container_id: "b71e02".into(),
//!     reason: "CPU 2-3 reserved for a latency-critical pod".into(),
//!     ..Default::default()
//! });
//! assert_eq!(rsp.update[0].linux.resources.cpu.cpus, "0-1");
//! ```

#[allow(unused_imports)] // for the intra-doc links above
use crate::{MessageField, api};
