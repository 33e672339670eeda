//! The control thread: containerd's task connections are read, and the
//! task calls that need no plugin and no libcontainer work (State, Pids,
//! Stats, ResizePty, Wait, Connect, Shutdown) are answered, on a thread
//! of its own, with a runtime of its own.
//!
//! Everything else (Create, Start, Exec, Update, Kill, Delete, ... with
//! their NRI requests, helper processes and exits) runs on the daemon's
//! main runtime. A burst of creates keeps that thread busy, and a busy
//! thread waits for the CPU behind an idle one; the control thread is
//! mostly idle, so the kernel runs it as soon as a call arrives, as it
//! would runc's per-container shim, and the answer does not queue behind
//! the burst's work.

use std::io;

use tokio::{runtime::Handle, sync::oneshot};

/// The control thread's nice value. A burst of creates keeps every CPU
/// busy (containerd, CNI plugins, libcontainer's processes, the main
/// runtime); at nice 0 a call that arrives then waits its turn behind
/// them. The thread's work per call is small and bounded (a lookup and
/// an answer), so a higher priority cannot starve anyone, and the call
/// is answered as the kernel wakes the thread.
pub const CONTROL_NICE: i32 = -10;

/// Gives the calling thread [`CONTROL_NICE`] (see [`crate::priority`]); a
/// daemon that may not (no `CAP_SYS_NICE`) runs the thread at its own
/// priority and says so.
fn raise_priority() {
    if let Err(e) = crate::priority::raise_calling_thread(CONTROL_NICE) {
        tracing::warn!(nice = CONTROL_NICE, error = %e, "cannot raise the control thread's priority");
    }
}

/// The control thread and its runtime; stopped when dropped.
pub struct ControlThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlThread {
    /// Starts the thread.
    ///
    /// # Errors
    /// When the thread or its runtime cannot be created.
    pub fn start() -> io::Result<ControlThread> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("control".into()).spawn(move || {
            raise_priority();
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(rt.handle().clone()));
            rt.block_on(async {
                let _ = stopped.await;
            });
        })?;
        let handle = handle_rx
            .recv()
            .map_err(|_| io::Error::other("the control thread ended before its runtime was built"))??;
        Ok(ControlThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Its runtime: what is spawned there runs on the control thread.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for ControlThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_spawned_there_runs_on_the_control_thread() {
        let c = ControlThread::start().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (name, nice) = rt
            .block_on(c.handle().spawn(async {
                (
                    std::thread::current().name().map(str::to_string),
                    crate::priority::thread_nice(),
                )
            }))
            .unwrap();
        assert_eq!(name.as_deref(), Some("control"));
        // Tests run as root: the priority was raised.
        assert_eq!(nice, Some(CONTROL_NICE));
        drop(c);
    }
}
