//! Task.Kill and NRI evictions.

use std::sync::atomic::Ordering;

use super::Service;
use crate::error::{Result, ShimError};

impl Service {
    /// Signals a process; with `all`, every process in the task's cgroup.
    ///
    /// A stopping signal to the init (KILL, TERM, INT, QUIT) sends NRI
    /// StopContainer first: plugins learn a container is stopping before
    /// it dies, as under CRI. SIGKILL thaws a paused task (as runc does:
    /// a frozen task cannot die).
    ///
    /// # Errors
    /// [`ShimError::NotFound`] for an unknown or finished process (kill
    /// after exit), the signal error otherwise.
    pub async fn kill(&self, ns: &str, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        proc.status.get().signal().map_err(|e| task.refused(&proc, e))?;
        let signal = signal as i32;
        if exec_id.is_empty() && matches!(signal, libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGQUIT) {
            self.nri_stopped(&task).await;
        }
        if all && exec_id.is_empty() {
            self.runner().kill_all(task.target(), signal).await?;
        }
        let Some(process) = proc.process() else {
            return Err(ShimError::NotFound(format!("{} is not running", task.describe(&proc))));
        };
        if signal == libc::SIGKILL && (exec_id.is_empty() || all) {
            // Before the signal, with no await until the status check
            // below: `pause` looks at this flag right after freezing.
            task.sigkilled.store(true, Ordering::SeqCst);
        }
        let sent = process.signal(signal);
        if sent.is_ok() && signal == libc::SIGKILL && task.init.status.get() == super::Status::Paused {
            self.thaw_for_kill(&task).await;
        }
        match sent {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(ShimError::NotFound(format!(
                "{} has already finished",
                task.describe(&proc)
            ))),
            Err(e) => Err(ShimError::io(format!("signal {signal} to {}", task.describe(&proc)), e)),
        }
    }

    /// Kills a task whose eviction a plugin asked for.
    pub async fn evict(&self, container_id: &str, reason: &str) {
        match self.inner.tasks.find(container_id) {
            Some(t) => {
                tracing::warn!(task = container_id, reason, "NRI plugin evicts container");
                let _ = self.kill(&t.ns, &t.id, "", libc::SIGKILL as u32, true).await;
            }
            None => tracing::warn!(task = container_id, "NRI eviction of an unknown container"),
        }
    }
}
