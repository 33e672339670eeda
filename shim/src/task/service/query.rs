//! Requests that read or adjust a process without changing its state:
//! Wait, State, Pids, Connect, ResizePty, CloseIO.

use containerd_shim_protos::api as task_api;
use protobuf::MessageField;

use super::{Service, timestamp};
use crate::{
    error::{Result, ShimError},
    sync::lock,
};

impl Service {
    /// Waits for a process to exit.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn wait(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::WaitResponse> {
        let task = self.task(ns, id)?;
        let st = task.proc(exec_id)?.wait_exit().await;
        Ok(task_api::WaitResponse {
            exit_status: st.code,
            exited_at: MessageField::some(timestamp(st.at)),
            ..Default::default()
        })
    }

    /// The state of a process.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn state(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::StateResponse> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        let exit = proc.exit_status();
        Ok(task_api::StateResponse {
            id: id.to_string(),
            bundle: task.bundle.to_string_lossy().into_owned(),
            pid: proc.pid(),
            status: proc.status.get().to_proto().into(),
            stdin: proc.stdio.stdin.clone(),
            stdout: proc.stdio.stdout.clone(),
            stderr: proc.stdio.stderr.clone(),
            terminal: proc.stdio.terminal,
            exit_status: exit.map(|e| e.code).unwrap_or(0),
            exited_at: MessageField::from_option(exit.map(|e| timestamp(e.at))),
            exec_id: exec_id.to_string(),
            ..Default::default()
        })
    }

    /// Member pids of the task.
    ///
    /// # Errors
    /// [`ShimError::NotFound`], cgroup errors.
    pub async fn pids(&self, ns: &str, id: &str) -> Result<Vec<u32>> {
        let task = self.task(ns, id)?;
        let pids = self.runner().pids(task.target()).await?;
        Ok(pids.into_iter().map(|p| p as u32).collect())
    }

    /// The daemon's and the task's pids.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn connect(&self, ns: &str, id: &str) -> Result<task_api::ConnectResponse> {
        let task = self.task(ns, id)?;
        Ok(task_api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: task.init.pid(),
            version: concat!("nri-shim ", env!("CARGO_PKG_VERSION")).to_string(),
            ..Default::default()
        })
    }

    /// Resizes a process's terminal.
    ///
    /// # Errors
    /// [`ShimError::NotFound`] without a terminal.
    pub async fn resize_pty(&self, ns: &str, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        let guard = lock(&proc.io);
        match guard.as_ref() {
            Some(io) => io.resize(width, height),
            None => Err(ShimError::NotFound(format!("{} has no terminal", task.describe(&proc)))),
        }
    }

    /// Closes a process's stdin.
    ///
    /// # Errors
    /// [`ShimError::NotFound`].
    pub async fn close_io(&self, ns: &str, id: &str, exec_id: &str) -> Result<()> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        if let Some(io) = lock(&proc.io).as_ref() {
            io.close_stdin();
        }
        Ok(())
    }
}
