//! The containerd Task service and the task lifecycle behind it: the ttrpc
//! adapter, the lifecycle and NRI event mapping ([`service`]), exits and
//! OOM kills, events to containerd, the audit trail. May use `container`,
//! `stdio`, `cgroups`, `cdi`, `nri` and the crate's top-level modules.

pub mod audit;
pub mod events;
pub mod monitor;
pub mod oom;
pub mod service;
pub mod ttrpc;
