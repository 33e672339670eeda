//! Task.Pause and Task.Resume (the cgroup freezer), and the thaw of a
//! paused task that is being SIGKILLed.

use std::sync::{Arc, atomic::Ordering};

use containerd_shim_protos::events::task as ev;

use super::{Service, Status, process::Task};
use crate::{
    error::{Result, ShimError},
    task::events::topics,
};

impl Service {
    /// Thaws a paused task that was just sent SIGKILL; it is running
    /// again until its exit is reaped.
    pub(super) async fn thaw_for_kill(&self, task: &Arc<Task>) {
        match self.runner().freeze(task.target(), false).await {
            Ok(()) => {
                task.init.status.update(Status::thaw);
            }
            Err(e) => {
                tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "thawing a paused task for SIGKILL failed")
            }
        }
    }

    /// Freezes (`pause`) or thaws the task.
    ///
    /// # Errors
    /// [`ShimError::FailedPrecondition`] unless running (or paused to
    /// resume), or when the task exits or is SIGKILLed while being frozen.
    pub async fn pause(&self, ns: &str, id: &str, pause: bool) -> Result<()> {
        let task = self.task(ns, id)?;
        let transition = if pause { Status::pause } else { Status::resume };
        let from = task.init.status.get();
        transition(from).map_err(|e| task.refused(&task.init, e))?;
        self.runner().freeze(task.target(), pause).await?;
        if pause && task.sigkilled.load(Ordering::SeqCst) {
            // A SIGKILL raced this pause: frozen, the task could not die.
            self.thaw_for_kill(&task).await;
            return Err(ShimError::FailedPrecondition(format!("task {id} is being killed")));
        }
        // The init may have exited (or been killed and thawed) while the
        // cgroup was being frozen or thawed: never overwrite that.
        let now = task.init.status.update_if(from, transition);
        if now != from {
            if pause {
                return Err(ShimError::FailedPrecondition(format!(
                    "task {id} became {} while being paused",
                    now.name()
                )));
            }
            return Ok(());
        }
        let (topic, event): (&'static str, Box<dyn protobuf::MessageDyn>) = if pause {
            (
                topics::PAUSED,
                Box::new(ev::TaskPaused {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            )
        } else {
            (
                topics::RESUMED,
                Box::new(ev::TaskResumed {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            )
        };
        self.publish(ns, topic, event);
        Ok(())
    }
}
