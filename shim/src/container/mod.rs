//! Running one container: the [`runner::Runner`] seam the task code calls,
//! libcontainer's create and exec in a single-threaded helper process, the
//! start in the daemon, the OCI bundle, what a task records on disk, and
//! cleanup without the daemon. May use `stdio`,
//! `cgroups`, `cdi`, `nri` and the top-level modules; not `task` or `node`.

pub mod bundle;
pub mod cleanup;
pub mod helper;
pub mod idmap;
pub mod record;
pub mod runner;
pub mod start;
