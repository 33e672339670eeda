//! # nri-shim
//!
//! A containerd shim v2 (`runtime_type = "io.containerd.nri-shim.v2"`,
//! binary `containerd-shim-nri-shim-v2`) that passes every container
//! through the node's NRI plugins and runs it with youki's libcontainer.
//!
//! The crate is laid out by concept; each folder's `mod.rs` says what
//! lives there and what it may use.
//!
//! | module | what |
//! |---|---|
//! | [`node`] | the binary's actions (`start`, `delete`, `upgrade`, ...) and the per-node daemon: its lifecycle, config reload, plugin directory watch, metrics, log, upgrade, containerd's connection gate |
//! | [`task`] | the containerd Task ttrpc service and the task lifecycle behind it: NRI event mapping, exits and OOM kills, events to containerd, the audit trail |
//! | [`container`] | running a container: the runner seam, libcontainer's create and exec in a helper process, the start in the daemon, the bundle, what a task records on disk, cleanup without the daemon |
//! | [`stdio`] | a process's stdio: fifos, files and terminals |
//! | [`cgroups`] | a container's cgroup (v1, v2, systemd driver): updates, stats, freeze, pids, the runtime options that pick the driver |
//! | [`cdi`] | CDI devices from spec files, by annotation or NRI adjustment |
//! | [`nri`] | pods and containers from bundle annotations; the NRI seam |
//! | [`info`] | `-info`: the runtime features containerd 2.x asks for |
//! | [`config`] | `/etc/nri-shim/config.toml` |
//! | [`error`] | shim errors and their ttrpc codes |
//! | [`layout`] | where the daemon keeps its files |
//! | [`priority`] | the control thread's raised priority, never passed on to a container |
//! | [`private`] | the modes of everything the shim keeps on a node (`0700`, `0600`), and tightening a state root an older version left readable |

#![warn(missing_docs)]

pub mod cdi;
pub mod cgroups;
pub mod config;
pub mod container;
pub mod error;
pub mod info;
pub mod layout;
pub mod node;
pub mod nri;
pub mod priority;
pub mod private;
pub mod stdio;
pub mod sync;
pub mod task;
pub mod waits;

pub use node::main;
