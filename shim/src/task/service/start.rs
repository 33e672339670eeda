//! Task.Start of the init (StartContainer, the runner's start, the
//! `/tasks/start` event, PostStartContainer) and of an exec'd process
//! (the runner's exec, `/tasks/exec-started`).

use std::{sync::Arc, time::SystemTime};

use containerd_shim_protos::{api as task_api, events::task as ev};

use super::{
    Service, Status,
    process::{Proc, Task},
    short_hash,
};
use crate::{error::Result, nri::Role, stdio::ProcessIo, sync::lock, task::events::topics, task::monitor::ExitStatus};

impl Service {
    /// Starts the init (`exec_id` empty) or an exec'd process.
    ///
    /// # Errors
    /// [`crate::error::ShimError::NotFound`],
    /// [`crate::error::ShimError::FailedPrecondition`] unless the process
    /// is created, NRI or runtime failures.
    pub async fn start(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::StartResponse> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        proc.status.apply(Status::start).map_err(|e| task.refused(&proc, e))?;
        let result = if exec_id.is_empty() {
            self.start_init(&task).await
        } else {
            self.start_exec(&task, &proc).await
        };
        match result {
            Ok(pid) => {
                tracing::info!(task = id, namespace = ns, exec = exec_id, pid, "process started");
                Ok(task_api::StartResponse {
                    pid,
                    ..Default::default()
                })
            }
            Err(e) => {
                // runc convention: a process that could not start is
                // stopped with a non-zero status and can be deleted.
                proc.status.update(Status::start_failed);
                // Recorded before the outcome, so the exit watcher keeps it.
                proc.record_exit(ExitStatus {
                    code: if exec_id.is_empty() { 128 } else { 127 },
                    at: SystemTime::now(),
                });
                proc.started.send_replace(Some(false));
                Err(e)
            }
        }
    }

    async fn start_init(&self, task: &Arc<Task>) -> Result<u32> {
        let nri = self.nri();
        let pod = self.pod(&task.pod_id);
        if task.role != Role::Sandbox {
            crate::waits::timed("NRI StartContainer", nri.start_container(&pod, &task.nri_container())).await?;
        }
        crate::waits::timed("libcontainer start", self.runner().start(&task.id)).await?;
        let pid = task.init.pid();
        task.init.status.update(Status::started);
        lock(&task.container).state = nri_adaptation::api::ContainerState::CONTAINER_RUNNING.into();
        self.publish(
            &task.ns,
            topics::START,
            Box::new(ev::TaskStart {
                container_id: task.id.clone(),
                pid,
                ..Default::default()
            }),
        );
        task.init.started.send_replace(Some(true));
        if task.role != Role::Sandbox
            && let Err(e) = nri.post_start_container(&pod, &task.nri_container()).await
        {
            tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "NRI PostStartContainer failed");
        }
        Ok(pid)
    }

    async fn start_exec(&self, task: &Arc<Task>, proc: &Arc<Proc>) -> Result<u32> {
        task.init
            .status
            .get()
            .exec_into()
            .map_err(|e| task.refused(&task.init, e))?;
        let dir = self.inner.state_root.join("exec");
        crate::private::create_dir_all(&dir).map_err(|e| crate::error::ShimError::io("exec state dir", e))?;
        let tag = short_hash(&format!("{}/{}/{}", task.ns, task.id, proc.exec_id));
        let mut io = ProcessIo::prepare(&proc.stdio, &dir.join(format!("{tag}.console")))?;
        let spec = proc.spec.clone().unwrap_or(serde_json::Value::Null);
        let fds = io.take_fds()?;
        let process = crate::waits::timed(
            "libcontainer exec",
            self.runner().exec(&task.id, &spec, io.console_socket.as_deref(), fds),
        )
        .await?;
        if io.console_socket.is_some() {
            // Accepting the console connection waits for libcontainer.
            io = crate::waits::blocking("receive the terminal", move || io.attach_console().map(|()| io)).await?;
        }
        let pid = process.pid() as u32;
        *lock(&proc.process) = Some(process);
        *lock(&proc.io) = Some(io);
        proc.status.update(Status::started);
        tokio::spawn(self.clone().watch_exit(task.clone(), proc.clone()));
        self.publish(
            &task.ns,
            topics::EXEC_STARTED,
            Box::new(ev::TaskExecStarted {
                container_id: task.id.clone(),
                exec_id: proc.exec_id.clone(),
                pid,
                ..Default::default()
            }),
        );
        proc.started.send_replace(Some(true));
        Ok(pid)
    }
}
