//! A task (one container) and its processes: the init and the execs.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::SystemTime,
};

use nri_adaptation::api;
use tokio::sync::watch;

use super::status::{Illegal, StatusCell};
use crate::{
    container::runner::{Process, Target},
    error::{Result, ShimError},
    nri::Role,
    stdio::{ProcessIo, StdioSpec},
    sync::lock,
    task::monitor::ExitStatus,
};

/// One process of a task: the init (empty `exec_id`) or an exec.
pub struct Proc {
    /// Empty for the init.
    pub exec_id: String,
    /// Lifecycle state.
    pub status: StatusCell,
    /// The exit status, once known (stored even while nobody waits).
    pub exit: watch::Sender<Option<ExitStatus>>,
    /// Outcome of Start: `Some(true)` once the start (or exec-started)
    /// event is queued, `Some(false)` if the start failed.
    pub started: watch::Sender<Option<bool>>,
    /// Set once the process has been reaped.
    pub reaped: watch::Sender<bool>,
    /// The running process, once created or started.
    pub process: Mutex<Option<Arc<dyn Process>>>,
    /// Its stdio copiers and terminal.
    pub io: Mutex<Option<ProcessIo>>,
    /// Its stdio as containerd named it.
    pub stdio: StdioSpec,
    /// OCI process of an exec.
    pub spec: Option<serde_json::Value>,
}

impl Proc {
    /// A created, not yet started process.
    pub fn new(exec_id: &str, stdio: StdioSpec, spec: Option<serde_json::Value>) -> Arc<Proc> {
        Arc::new(Proc {
            exec_id: exec_id.to_string(),
            status: StatusCell::default(),
            exit: watch::channel(None).0,
            started: watch::channel(None).0,
            reaped: watch::channel(false).0,
            process: Mutex::new(None),
            io: Mutex::new(None),
            stdio,
            spec,
        })
    }

    /// Host pid, 0 before the process exists.
    pub fn pid(&self) -> u32 {
        lock(&self.process).as_ref().map_or(0, |p| p.pid().max(0) as u32)
    }

    /// The running process, if any.
    pub fn process(&self) -> Option<Arc<dyn Process>> {
        lock(&self.process).clone()
    }

    /// The exit status, if the process exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Records the exit status unless one is recorded (a failed start's
    /// status is kept over the reaped one).
    pub fn record_exit(&self, st: ExitStatus) {
        self.exit.send_if_modified(|v| {
            let first = v.is_none();
            if first {
                *v = Some(st);
            }
            first
        });
    }

    /// Waits for the exit status.
    pub async fn wait_exit(&self) -> ExitStatus {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(st) = *rx.borrow_and_update() {
                return st;
            }
            if rx.changed().await.is_err() {
                return ExitStatus {
                    code: 255,
                    at: SystemTime::now(),
                };
            }
        }
    }
}

/// One container task.
pub struct Task {
    /// containerd namespace.
    pub ns: String,
    /// Container id.
    pub id: String,
    /// OCI bundle directory.
    pub bundle: PathBuf,
    /// Its part in its pod.
    pub role: Role,
    /// The pod's id.
    pub pod_id: String,
    /// The spec's cgroups path.
    pub cgroups_path: PathBuf,
    /// The NRI view of the container (adjusted spec, state, pid).
    pub container: Mutex<api::Container>,
    /// The init process.
    pub init: Arc<Proc>,
    /// Exec'd processes by exec id.
    pub execs: Mutex<HashMap<String, Arc<Proc>>>,
    /// NRI StopContainer / StopPodSandbox sent.
    pub stopped_nri: tokio::sync::Mutex<bool>,
    /// The init was sent SIGKILL: a pause racing the kill must not freeze
    /// it with the signal pending.
    pub sigkilled: AtomicBool,
    /// Rootfs mounts to undo at delete.
    pub rootfs_mounts: Vec<PathBuf>,
    /// The container has a PID namespace of its own. Without one (host
    /// PID, or a pod's shared PID namespace) its processes do not die
    /// with the init, and the shim kills them (see `exit`).
    pub own_pid_namespace: bool,
    /// OOM kills already published (`/tasks/oom` once per increase of the
    /// cgroup's counter, whether seen live or at the exit).
    pub oom_published: tokio::sync::Mutex<u64>,
    /// The init's environment after the NRI adjustment: the base of every
    /// exec's environment.
    pub env: Vec<String>,
}

impl Task {
    /// The cgroup target of runner operations.
    pub fn target(&self) -> Target<'_> {
        Target {
            id: &self.id,
            cgroups_path: &self.cgroups_path,
        }
    }

    /// The init (`exec_id` empty) or an exec.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub fn proc(&self, exec_id: &str) -> Result<Arc<Proc>> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        lock(&self.execs)
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in task {}", self.id)))
    }

    /// "task ID" or "exec E of task ID", for messages.
    pub fn describe(&self, proc: &Proc) -> String {
        if proc.exec_id.is_empty() {
            format!("task {}", self.id)
        } else {
            format!("exec {} of task {}", proc.exec_id, self.id)
        }
    }

    /// The shim error for a transition `proc`'s state refused.
    pub fn refused(&self, proc: &Proc, e: Illegal) -> ShimError {
        e.into_error(&self.describe(proc))
    }

    /// A copy of the NRI view of the container.
    pub fn nri_container(&self) -> api::Container {
        lock(&self.container).clone()
    }
}
