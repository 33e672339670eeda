//! The task lifecycle: plain async methods over a task table, generic over
//! where events go ([`EventSink`]), reaching NRI through the [`Nri`] seam
//! and the container runtime through the [`Runner`] seam, so tests drive
//! it without containerd, plugins or root. The ttrpc `Task` service
//! (`super::ttrpc`) only translates requests into these calls. May use
//! `container`, `stdio`, `cgroups`, `cdi`, `nri` and `task`'s other modules.
//!
//! | file | what |
//! |---|---|
//! | `status` | a process's states and legal transitions |
//! | `process` | a task and its processes |
//! | `table` | the task table, idle accounting |
//! | `pods` | pod records; RunPodSandbox once, StopContainer once |
//! | `create` | Create, with rollback |
//! | `start` | Start of the init and of execs |
//! | `exit` | exit and OOM watching, events in order |
//! | `handover` | the task table across an upgrade |
//! | `kill` | Kill, evictions |
//! | `delete` | Delete |
//! | `exec` | Exec |
//! | `update` | Update, NRI container updates, Stats |
//! | `pause` | Pause, Resume, the SIGKILL thaw |
//! | `query` | Wait, State, Pids, Connect, ResizePty, CloseIO |

mod create;
mod delete;
mod exec;
mod exit;
mod handover;
mod kill;
mod pause;
mod pods;
mod process;
mod query;
mod start;
mod status;
mod table;
mod update;

use std::{
    path::PathBuf,
    sync::{Arc, OnceLock, Weak},
    time::{Duration, SystemTime},
};

use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;

pub use self::{
    handover::{PodState, ProcState, TableState, TaskState},
    status::{Illegal, Status},
};
use self::{pods::Pods, process::Task, table::TaskTable};
pub use crate::container::bundle::{DEFAULT_PATH_ENV, EXIT_STATUS_FILE};
use crate::{
    container::runner::Runner,
    error::Result,
    nri::{NoNri, Nri},
    task::events::EventSink,
};

/// A protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

struct Inner {
    runner: Arc<dyn Runner>,
    state_root: PathBuf,
    events: Arc<dyn EventSink>,
    nri: OnceLock<Arc<dyn Nri>>,
    cdi: OnceLock<crate::cdi::Registry>,
    tasks: TaskTable,
    pods: Pods,
}

/// The task service's lifecycle logic.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// A task request in flight (see [`Service::begin_request`]).
pub struct RequestGuard(Service);

/// A Wait in flight (see [`Service::begin_wait`]).
pub struct WaitGuard(Service);

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.0.inner.tasks.end_wait();
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.inner.tasks.end_request();
    }
}

impl Service {
    /// A service running containers with `runner`, keeping console sockets
    /// under `state_root`, publishing to `events`. NRI is attached with
    /// [`Service::set_nri`].
    pub fn new(runner: Arc<dyn Runner>, state_root: PathBuf, events: Arc<dyn EventSink>) -> Service {
        Service {
            inner: Arc::new(Inner {
                runner,
                state_root,
                events,
                nri: OnceLock::new(),
                cdi: OnceLock::new(),
                tasks: TaskTable::default(),
                pods: Pods::default(),
            }),
        }
    }

    /// Attaches NRI (once).
    pub fn set_nri(&self, nri: Arc<dyn Nri>) {
        let _ = self.inner.nri.set(nri);
    }

    /// Sets the CDI spec directories (once; default
    /// [`crate::cdi::DEFAULT_SPEC_DIRS`]).
    pub fn set_cdi(&self, registry: crate::cdi::Registry) {
        let _ = self.inner.cdi.set(registry);
    }

    fn cdi(&self) -> crate::cdi::Registry {
        self.inner.cdi.get().cloned().unwrap_or_default()
    }

    fn nri(&self) -> Arc<dyn Nri> {
        self.inner.nri.get().cloned().unwrap_or_else(|| Arc::new(NoNri))
    }

    fn runner(&self) -> &dyn Runner {
        self.inner.runner.as_ref()
    }

    /// A weak handle for NRI callbacks (no reference cycle with the adaptation).
    pub fn downgrade(&self) -> WeakService {
        WeakService(Arc::downgrade(&self.inner))
    }

    /// The init status of every live task (one entry per task, in no order).
    pub fn task_states(&self) -> Vec<Status> {
        self.inner.tasks.all().iter().map(|t| t.init.status.get()).collect()
    }

    /// Number of live tasks.
    pub fn task_count(&self) -> usize {
        self.inner.tasks.len()
    }

    /// Counts a task request as in flight until the guard drops: a create
    /// that is still in NRI has no task yet but keeps the daemon busy.
    pub fn begin_request(&self) -> RequestGuard {
        self.inner.tasks.begin_request();
        RequestGuard(self.clone())
    }

    /// Marks a request in flight as only waiting for an exit (Wait) until
    /// the guard drops: an upgrade does not wait for it (see
    /// `crate::node::upgrade::replayable`).
    pub fn begin_wait(&self) -> WaitGuard {
        self.inner.tasks.begin_wait();
        WaitGuard(self.clone())
    }

    /// Records activity: an accepted connection (`start` probes the daemon
    /// before it prints the address containerd connects to next).
    pub fn touch(&self) {
        self.inner.tasks.touch();
    }

    /// How long the daemon has had nothing to do: no task, no request in
    /// flight, no connection or request for that long. `None` while busy.
    pub fn idle_for(&self) -> Option<Duration> {
        self.inner.tasks.idle_for()
    }

    /// Waits for the next change of the task table.
    pub async fn changed(&self) {
        self.inner.tasks.changed().await;
    }

    fn task(&self, ns: &str, id: &str) -> Result<Arc<Task>> {
        self.inner.tasks.get(ns, id)
    }

    fn publish(&self, ns: &str, topic: &'static str, event: Box<dyn protobuf::MessageDyn>) {
        self.inner.events.publish(ns, topic, event);
    }

    /// Pods and containers for NRI Synchronize.
    pub fn nri_state(&self) -> nri_adaptation::RuntimeState {
        let containers = self
            .inner
            .tasks
            .all()
            .iter()
            .filter(|t| t.role != crate::nri::Role::Sandbox)
            .map(|t| t.nri_container())
            .collect();
        nri_adaptation::RuntimeState {
            pods: self.inner.pods.all(),
            containers,
        }
    }
}

/// A non-owning handle on the service (for NRI callbacks).
#[derive(Clone)]
pub struct WeakService(Weak<Inner>);

impl WeakService {
    /// The service, if it still exists.
    pub fn upgrade(&self) -> Option<Service> {
        self.0.upgrade().map(|inner| Service { inner })
    }
}

/// A short stable name for socket and state files.
pub fn short_hash(s: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
