//! Exit watching: each process's exit is reaped once and published in
//! the order containerd relies on: after the process's start event, an
//! init's after its execs' (containerd #9719), `/tasks/oom` before the
//! init's `/tasks/exit`; a process that never started has no exit event
//! (containerd #6429). Then NRI StopContainer, once. OOM kills are also
//! published as they happen, while the container runs on. A container without a
//! PID namespace of its own loses all its processes with its init, as
//! with runc.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use containerd_shim_protos::events::task as ev;
use nri_adaptation::api;
use protobuf::MessageField;

use super::{
    Service, Status,
    process::{Proc, Task},
    timestamp,
};
use crate::{
    container::runner::OomEvents, stdio::ProcessIo, sync::lock, task::events::topics, task::monitor::ExitStatus,
};

/// How long an exit waits for the terminal output to be copied.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an init's exit waits for each started exec's.
const EXEC_EXIT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a cgroup v1 OOM signal is followed by reads of the kill count
/// (the kill is counted after the signal; an OOM that kills nothing, with
/// the OOM killer disabled, ends the reads after this).
const OOM_COUNT_PATIENCE: Duration = Duration::from_secs(2);

/// How long an exit waits for the outcome of a start in progress.
const START_OUTCOME_TIMEOUT: Duration = Duration::from_secs(10);

impl Service {
    /// Publishes `/tasks/oom` while the container runs, as each OOM kill
    /// happens (a child killed in a container that goes on), until the
    /// init is reaped or the cgroup is gone.
    pub(super) async fn watch_oom(self, task: Arc<Task>, mut oom: Box<dyn OomEvents>) {
        let mut reaped = task.init.reaped.subscribe();
        loop {
            tokio::select! {
                alive = oom.changed() => {
                    if !alive {
                        return;
                    }
                    // v1 signals before the victim is counted: on a loaded
                    // node the first read can still see the old count, and
                    // no later signal comes for that kill.
                    let deadline = tokio::time::Instant::now() + OOM_COUNT_PATIENCE;
                    while !self.publish_ooms(&task).await
                        && oom.signals_before_the_kill()
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                _ = async { reaped.wait_for(|r| *r).await.map(drop) } => return,
            }
        }
    }

    /// One `/tasks/oom` when the cgroup counts more OOM kills than were
    /// published; serialised so the live watch and the exit never both
    /// publish one kill, nor the watch after the exit event. Returns
    /// whether it published.
    async fn publish_ooms(&self, task: &Task) -> bool {
        let mut published = task.oom_published.lock().await;
        let count = self.runner().oom_kills(task.target()).await.unwrap_or(0);
        if count > *published {
            *published = count;
            tracing::warn!(task = %task.id, oom_kills = count, "OOM kill in the container");
            self.publish(
                &task.ns,
                topics::OOM,
                Box::new(ev::TaskOOM {
                    container_id: task.id.clone(),
                    ..Default::default()
                }),
            );
            return true;
        }
        false
    }

    /// Waits for `proc`'s exit and publishes it (see the module docs).
    pub(super) async fn watch_exit(self, task: Arc<Task>, proc: Arc<Proc>) {
        let Some(process) = proc.process() else {
            return;
        };
        let waited = process.wait().await;
        // Synchronously after the reap: an upgrade sees this exit in progress.
        let _exiting = self.inner.tasks.exiting();
        let st = match waited {
            Ok(st) => st,
            Err(e) => {
                tracing::error!(task = %task.id, pid = process.pid(), error = %crate::error::chain(&e), "cannot reap process");
                ExitStatus {
                    code: 255,
                    at: SystemTime::now(),
                }
            }
        };
        let is_init = proc.exec_id.is_empty();
        if is_init && !task.own_pid_namespace {
            // runc's rule: without a PID namespace of its own, the
            // container's other processes (and execs) outlive the init,
            // keep its stdio open and CRI's stop waiting; kill them all.
            if let Err(e) = self.runner().kill_all(task.target(), libc::SIGKILL).await {
                tracing::warn!(task = %task.id, error = %crate::error::chain(&e), "killing the processes left after the init exited failed");
            }
        }
        let drained = lock(&proc.io).as_mut().and_then(ProcessIo::output_drained);
        if let Some(done) = drained {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, done).await;
        }
        // After the drain: a terminal's copier, still writing, would count
        // as the fifo's reader and end the hold at once.
        if let Some(io) = lock(&proc.io).as_mut() {
            io.hand_over_outputs();
        }
        if let Some(io) = lock(&proc.io).as_ref() {
            io.close_stdin();
        }
        tracing::info!(task = %task.id, exec = %proc.exec_id, pid = process.pid(), exit_status = st.code, "process exited");
        let was = proc.status.update(Status::exit);
        if is_init {
            let bundle = crate::container::bundle::Bundle::new(&task.bundle);
            crate::waits::blocking("write the exit status", move || bundle.write_exit_status(st.code)).await;
            lock(&task.container).state = api::ContainerState::CONTAINER_STOPPED.into();
            // Execs die with the init's pid namespace: publish their exits first.
            let execs: Vec<Arc<Proc>> = lock(&task.execs).values().cloned().collect();
            for e in execs {
                if *e.started.borrow() == Some(true) {
                    let _ = tokio::time::timeout(EXEC_EXIT_TIMEOUT, e.wait_exit()).await;
                }
            }
        }
        let publish = match was {
            Status::Created => false,
            _ => {
                let mut rx = proc.started.subscribe();
                tokio::time::timeout(START_OUTCOME_TIMEOUT, rx.wait_for(Option::is_some))
                    .await
                    .ok()
                    .and_then(|r| r.ok().map(|v| *v == Some(true)))
                    .unwrap_or(false)
            }
        };
        if publish {
            if is_init {
                self.publish_ooms(&task).await;
            }
            self.publish(
                &task.ns,
                topics::EXIT,
                Box::new(ev::TaskExit {
                    container_id: task.id.clone(),
                    id: if is_init { task.id.clone() } else { proc.exec_id.clone() },
                    pid: process.pid() as u32,
                    exit_status: st.code,
                    exited_at: MessageField::some(timestamp(st.at)),
                    ..Default::default()
                }),
            );
        }
        proc.record_exit(st);
        proc.reaped.send_replace(true);
        if is_init {
            lock(&task.container).exit_code = st.code as i32;
            self.nri_stopped(&task).await;
        }
    }
}
