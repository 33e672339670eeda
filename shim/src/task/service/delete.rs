//! Task.Delete of an exec or of the whole task.

use std::time::{Duration, SystemTime};

use containerd_shim_protos::{api as task_api, events::task as ev};
use protobuf::MessageField;

use super::{Service, Status, timestamp};
use crate::{container::bundle, error::Result, sync::lock, task::events::topics, task::monitor::ExitStatus, waits};

/// How long a delete waits for a killed, never started process's reaping.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

impl Service {
    /// Deletes a finished (or never started) process; for the init, the
    /// whole task: NRI StopContainer (if not sent yet) and RemoveContainer,
    /// the runner's delete (container state, cgroups), rootfs mounts, and
    /// for a sandbox or own-pod container RemovePodSandbox.
    ///
    /// # Errors
    /// [`crate::error::ShimError::NotFound`],
    /// [`crate::error::ShimError::FailedPrecondition`] while running.
    pub async fn delete(&self, ns: &str, id: &str, exec_id: &str) -> Result<task_api::DeleteResponse> {
        let task = self.task(ns, id)?;
        let proc = task.proc(exec_id)?;
        proc.status.get().delete().map_err(|e| task.refused(&proc, e))?;
        // A never started (or failed to start) process may still sit
        // waiting for its start: kill it and reap it.
        match proc.process() {
            Some(p) => {
                if !*proc.reaped.borrow() {
                    let _ = p.signal(libc::SIGKILL);
                    let mut rx = proc.reaped.subscribe();
                    let _ = tokio::time::timeout(REAP_TIMEOUT, rx.wait_for(|r| *r)).await;
                }
            }
            None => {
                proc.status.update(Status::exit);
            }
        }
        let st = proc.exit_status().unwrap_or(ExitStatus {
            code: 137,
            at: SystemTime::now(),
        });
        let rsp = task_api::DeleteResponse {
            pid: proc.pid(),
            exit_status: st.code,
            exited_at: MessageField::some(timestamp(st.at)),
            ..Default::default()
        };
        if !exec_id.is_empty() {
            lock(&task.execs).remove(exec_id);
            return Ok(rsp);
        }
        self.nri_stopped(&task).await;
        self.nri_removed(&task).await;
        waits::timed(
            "libcontainer delete",
            self.runner().delete(id, Some(&task.cgroups_path)),
        )
        .await?;
        let (state_root, ns_, id_, mounts, bundle_dir) = (
            self.inner.state_root.clone(),
            ns.to_string(),
            id.to_string(),
            task.rootfs_mounts.clone(),
            task.bundle.clone(),
        );
        // The mount point is free when Delete returns (containerd removes
        // the bundle next); the filesystem's release, which syncs it, is
        // left to a thread nobody waits for.
        let detached = waits::blocking("unmount rootfs", move || {
            crate::task::audit::AuditRecord::remove(&state_root, &ns_, &id_);
            let detached = bundle::detach_all(&mounts);
            crate::container::idmap::unstage_all(&bundle_dir);
            // Last: nothing of the task is left for `delete` to clean up.
            if let Err(e) = crate::container::record::TaskRecord::remove(&bundle_dir) {
                tracing::warn!(task = %id_, error = %crate::error::chain(&e), "task record kept");
            }
            detached
        })
        .await;
        tokio::task::spawn_blocking(move || {
            drop(detached);
            // Hand the freed task's memory back to the kernel: the daemon
            // stays resident on every node.
            // SAFETY: malloc_trim only releases free heap pages.
            unsafe { libc::malloc_trim(0) };
        });
        self.inner.tasks.remove(ns, id);
        self.nri_pod_removed(&task).await;
        self.publish(
            ns,
            topics::DELETE,
            Box::new(ev::TaskDelete {
                container_id: id.to_string(),
                pid: rsp.pid,
                exit_status: rsp.exit_status,
                exited_at: rsp.exited_at.clone(),
                id: id.to_string(),
                ..Default::default()
            }),
        );
        tracing::info!(task = id, namespace = ns, exit_status = rsp.exit_status, "task deleted");
        crate::node::shimlog::SHIM_LOG.detach(&format!("{ns}/{id}"));
        Ok(rsp)
    }
}
