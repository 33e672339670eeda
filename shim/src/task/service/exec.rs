//! Task.Exec: adds a process to a task, started later by Task.Start.

use containerd_shim_protos::{api as task_api, events::task as ev};

use super::{Service, process::Proc};
use crate::{
    container::bundle,
    error::{Result, ShimError},
    stdio::StdioSpec,
    sync::lock,
    task::events::topics,
};

impl Service {
    /// Adds an exec'd process (started by [`Service::start`]). Its
    /// environment is the container's as NRI plugins adjusted it, with the
    /// request's own variables winning by name.
    ///
    /// # Errors
    /// [`ShimError::AlreadyExists`], [`ShimError::InvalidArgument`] for a
    /// bad process spec, [`ShimError::FailedPrecondition`] on a stopped or
    /// paused task (runc: "cannot exec in a paused state").
    pub async fn exec(&self, ns: &str, req: task_api::ExecProcessRequest) -> Result<()> {
        let task = self.task(ns, &req.id)?;
        task.init
            .status
            .get()
            .exec_into()
            .map_err(|e| task.refused(&task.init, e))?;
        // The process joins the container's cgroup at its Start (see
        // crate::cgroups::prime).
        crate::cgroups::prime::prime();
        let mut spec: serde_json::Value = serde_json::from_slice(&req.spec.value)
            .map_err(|e| ShimError::InvalidArgument(format!("exec {} process spec: {e}", req.exec_id)))?;
        bundle::merge_exec_env(&task.env, &mut spec);
        bundle::default_exec_path_env(&mut spec);
        let stdio = StdioSpec {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        {
            let mut execs = lock(&task.execs);
            if execs.contains_key(&req.exec_id) {
                return Err(ShimError::AlreadyExists(format!("exec {} already exists", req.exec_id)));
            }
            execs.insert(req.exec_id.clone(), Proc::new(&req.exec_id, stdio, Some(spec)));
        }
        self.publish(
            ns,
            topics::EXEC_ADDED,
            Box::new(ev::TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }
}
