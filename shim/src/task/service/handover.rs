//! The task table across an upgrade (see `crate::node::upgrade`): a snapshot
//! the old image writes once nothing is in progress, and the table the new
//! image rebuilds from it, re-arming exit and OOM watchers and stdio
//! copiers. Processes are adopted by pid: they are the daemon's children
//! (the pid survives `execve`), and one that exited during the handover
//! is a zombie with its status until the new image reaps it.

use std::{
    collections::HashMap,
    os::fd::{OwnedFd, RawFd},
    path::PathBuf,
    sync::{Arc, Mutex, atomic::AtomicBool, atomic::Ordering},
    time::{Duration, SystemTime},
};

use nri_adaptation::api;
use protobuf::Message as _;
use serde::{Deserialize, Serialize};

use super::{
    Service, Status,
    process::{Proc, Task},
};
use crate::{
    error::{Result, ShimError},
    nri::Role,
    stdio::{IoFds, ProcessIo, StdinPark, StdioSpec},
    sync::lock,
    task::monitor::ExitStatus,
};

/// The task table and pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableState {
    /// Every task.
    pub tasks: Vec<TaskState>,
    /// Every pod the plugins were told about.
    pub pods: Vec<PodState>,
}

/// A pod: its NRI record (protobuf bytes) and whether it was stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodState {
    /// `api::PodSandbox`, protobuf-encoded.
    pub pod: Vec<u8>,
    /// StopPodSandbox was sent.
    pub stopped: bool,
}

/// One task (see `process::Task` for the fields' meaning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct TaskState {
    pub ns: String,
    pub id: String,
    pub bundle: PathBuf,
    /// `sandbox`, `container` or `own-pod`.
    pub role: String,
    pub pod_id: String,
    pub cgroups_path: PathBuf,
    /// `api::Container`, protobuf-encoded.
    pub container: Vec<u8>,
    pub init: ProcState,
    pub execs: Vec<ProcState>,
    pub stopped_nri: bool,
    pub sigkilled: bool,
    pub rootfs_mounts: Vec<PathBuf>,
    pub own_pid_namespace: bool,
    pub oom_published: u64,
    pub env: Vec<String>,
}

/// One process of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcState {
    /// Empty for the init.
    pub exec_id: String,
    /// [`Status::name`].
    pub status: String,
    /// Host pid, 0 before the process exists.
    pub pid: i32,
    /// Exit code and time (ns since the epoch), once recorded.
    pub exit: Option<(u32, u64)>,
    /// Outcome of Start.
    pub started: Option<bool>,
    /// Reaped by the old image (its exit is in `exit`).
    pub reaped: bool,
    /// stdin, stdout, stderr paths as containerd named them.
    pub stdio: [String; 3],
    /// A terminal.
    pub terminal: bool,
    /// An exec's OCI process.
    pub spec: Option<serde_json::Value>,
    /// Stdio fds the new image inherits.
    pub fds: IoFds,
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Sandbox => "sandbox",
        Role::Container => "container",
        Role::OwnPod => "own-pod",
    }
}

fn role_of(s: &str) -> Result<Role> {
    Ok(match s {
        "sandbox" => Role::Sandbox,
        "container" => Role::Container,
        "own-pod" => Role::OwnPod,
        other => return Err(ShimError::Runtime(format!("handover: unknown role {other:?}"))),
    })
}

fn status_of(s: &str) -> Result<Status> {
    Status::ALL
        .into_iter()
        .find(|st| st.name() == s)
        .ok_or_else(|| ShimError::Runtime(format!("handover: unknown status {s:?}")))
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

fn decode<M: protobuf::Message>(what: &str, bytes: &[u8]) -> Result<M> {
    M::parse_from_bytes(bytes).map_err(|e| ShimError::Runtime(format!("handover: {what}: {e}")))
}

impl ProcState {
    fn of(p: &Proc, dup: &mut dyn FnMut(RawFd) -> std::io::Result<RawFd>) -> std::io::Result<ProcState> {
        let live = lock(&p.io).as_ref().map(ProcessIo::live_fds).unwrap_or_default();
        let mut d = |fd: Option<RawFd>| fd.map(&mut *dup).transpose();
        let fds = IoFds {
            stdin_source: d(live.stdin_source)?,
            stdin_sink: d(live.stdin_sink)?,
            master: d(live.master)?,
            term_input: d(live.term_input)?,
            term_output: d(live.term_output)?,
        };
        Ok(ProcState {
            exec_id: p.exec_id.clone(),
            status: p.status.get().name().to_string(),
            pid: p.process().map_or(0, |pr| pr.pid()),
            exit: p.exit_status().map(|st| (st.code, nanos(st.at))),
            started: *p.started.borrow(),
            reaped: *p.reaped.borrow(),
            stdio: [p.stdio.stdin.clone(), p.stdio.stdout.clone(), p.stdio.stderr.clone()],
            terminal: p.stdio.terminal,
            spec: p.spec.clone(),
            fds,
        })
    }
}

impl Service {
    /// Why an upgrade cannot cut in now (a request, create or exit in
    /// progress, events not yet delivered), or `None`.
    pub fn busy(&self) -> Option<String> {
        let (requests, creating, exiting) = self.inner.tasks.in_progress();
        let events = self.inner.events.pending();
        (requests + creating + exiting + events > 0).then(|| {
            format!(
                "{requests} requests in flight, {creating} creates, {exits} exits being published, {events} events not yet delivered to containerd",
                exits = exiting
            )
        })
    }

    /// Every process's stdio objects, for [`Service::stop_terminals`] and
    /// [`Service::restart_terminals`].
    fn each_io(&self, f: &mut dyn FnMut(&str, &mut ProcessIo)) {
        for t in self.inner.tasks.all() {
            let execs: Vec<Arc<Proc>> = lock(&t.execs).values().cloned().collect();
            for p in std::iter::once(&t.init).chain(execs.iter()) {
                if let Some(io) = lock(&p.io).as_mut() {
                    f(&t.describe(p), io);
                }
            }
        }
    }

    /// Before an upgrade's exec: stops every terminal's copier threads
    /// (each waited for at most `patience`), so no output read from a pty
    /// is lost between the images; the pty buffers what comes meanwhile.
    pub fn stop_terminals(&self, patience: Duration) {
        self.each_io(&mut |what, io| {
            if !io.stop_terminal(patience) {
                tracing::warn!(process = %what, "a terminal copier did not stop before the upgrade (writing to a full stdout fifo); bytes it holds are lost");
            }
        });
    }

    /// Every stdin copier's parking handles (see [`crate::stdio::park_stdin`]).
    pub fn stdin_parks(&self) -> Vec<StdinPark> {
        let mut parks = Vec::new();
        self.each_io(&mut |_, io| parks.extend(io.stdin_park()));
        parks
    }

    /// After an upgrade that did not happen: the terminals' copiers again.
    pub fn restart_terminals(&self) {
        self.each_io(&mut |what, io| {
            if let Err(e) = io.restart_terminal() {
                tracing::error!(process = %what, error = %e, "terminal output is not copied any more");
            }
        });
    }

    /// The snapshot for the next image; each stdio fd is passed through
    /// `dup` (which gives the number the next image will find).
    ///
    /// # Errors
    /// The first error of `dup`.
    pub fn handover_state(&self, dup: &mut dyn FnMut(RawFd) -> std::io::Result<RawFd>) -> std::io::Result<TableState> {
        let mut tasks = Vec::new();
        for t in self.inner.tasks.all() {
            let mut execs = Vec::new();
            for e in lock(&t.execs).values() {
                execs.push(ProcState::of(e, dup)?);
            }
            tasks.push(TaskState {
                ns: t.ns.clone(),
                id: t.id.clone(),
                bundle: t.bundle.clone(),
                role: role_name(t.role).to_string(),
                pod_id: t.pod_id.clone(),
                cgroups_path: t.cgroups_path.clone(),
                container: t.nri_container().write_to_bytes().unwrap_or_default(),
                init: ProcState::of(&t.init, dup)?,
                execs,
                // Nothing holds it: nothing is in progress.
                stopped_nri: t.stopped_nri.try_lock().map(|g| *g).unwrap_or(false),
                sigkilled: t.sigkilled.load(Ordering::SeqCst),
                rootfs_mounts: t.rootfs_mounts.clone(),
                own_pid_namespace: t.own_pid_namespace,
                oom_published: t.oom_published.try_lock().map(|g| *g).unwrap_or(0),
                env: t.env.clone(),
            });
        }
        let pods = self
            .inner
            .pods
            .snapshot()
            .into_iter()
            .map(|(pod, stopped)| PodState {
                pod: pod.write_to_bytes().unwrap_or_default(),
                stopped,
            })
            .collect();
        Ok(TableState { tasks, pods })
    }

    fn resume_proc(&self, s: &ProcState, take: &mut dyn FnMut(RawFd) -> Option<OwnedFd>) -> Result<Arc<Proc>> {
        let stdio = StdioSpec {
            stdin: s.stdio[0].clone(),
            stdout: s.stdio[1].clone(),
            stderr: s.stdio[2].clone(),
            terminal: s.terminal,
        };
        let proc = Proc::new(&s.exec_id, stdio.clone(), s.spec.clone());
        let status = status_of(&s.status)?;
        proc.status.update(|_| status);
        proc.started.send_replace(s.started);
        if let Some((code, at)) = s.exit {
            proc.record_exit(ExitStatus {
                code,
                at: SystemTime::UNIX_EPOCH + Duration::from_nanos(at),
            });
        }
        proc.reaped.send_replace(s.reaped);
        let stdin = match (
            s.fds.stdin_source.and_then(&mut *take),
            s.fds.stdin_sink.and_then(&mut *take),
        ) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        };
        let master = s.fds.master.and_then(&mut *take);
        let term = (
            s.fds.term_input.and_then(&mut *take),
            s.fds.term_output.and_then(&mut *take),
        );
        if stdin.is_some() || master.is_some() {
            *lock(&proc.io) = Some(ProcessIo::resume(&stdio, stdin, master, term)?);
        }
        if s.pid > 0 && !s.reaped {
            *lock(&proc.process) = Some(self.runner().adopt(s.pid)?);
        }
        Ok(proc)
    }

    /// Rebuilds the table from the previous image's snapshot: every task
    /// and pod, each process adopted and watched again, stdio copiers
    /// running again. Fds named in the snapshot are taken with `take`.
    /// A task that cannot be rebuilt is logged and left out (containerd
    /// then finds it gone; `delete` cleans it up from its bundle record).
    pub fn resume(&self, state: TableState, take: &mut dyn FnMut(RawFd) -> Option<OwnedFd>) {
        for p in &state.pods {
            match decode::<api::PodSandbox>("pod", &p.pod) {
                Ok(pod) => self.inner.pods.restore(pod, p.stopped),
                Err(e) => tracing::error!(error = %crate::error::chain(&e), "upgrade: pod not restored"),
            }
        }
        for t in state.tasks {
            let id = t.id.clone();
            match self.resume_task(t, take) {
                Ok(task) => {
                    crate::node::shimlog::SHIM_LOG.attach(&format!("{}/{}", task.ns, task.id), &task.bundle);
                    self.inner.tasks.restore(task.clone());
                    for p in std::iter::once(task.init.clone()).chain(lock(&task.execs).values().cloned()) {
                        if p.process().is_some() {
                            tokio::spawn(self.clone().watch_exit(task.clone(), p));
                        }
                    }
                    if !*task.init.reaped.borrow()
                        && let Some(oom) = self.runner().watch_oom(task.target())
                    {
                        tokio::spawn(self.clone().watch_oom(task.clone(), oom));
                    }
                    tracing::info!(task = %id, namespace = %task.ns, pid = task.init.pid(), "task taken over");
                }
                Err(e) => tracing::error!(task = %id, error = %crate::error::chain(&e), "upgrade: task not taken over"),
            }
        }
    }

    fn resume_task(&self, t: TaskState, take: &mut dyn FnMut(RawFd) -> Option<OwnedFd>) -> Result<Arc<Task>> {
        let init = self.resume_proc(&t.init, take)?;
        let mut execs = HashMap::new();
        for e in &t.execs {
            execs.insert(e.exec_id.clone(), self.resume_proc(e, take)?);
        }
        Ok(Arc::new(Task {
            role: role_of(&t.role)?,
            container: Mutex::new(decode("container", &t.container)?),
            ns: t.ns,
            id: t.id,
            bundle: t.bundle,
            pod_id: t.pod_id,
            cgroups_path: t.cgroups_path,
            init,
            execs: Mutex::new(execs),
            stopped_nri: tokio::sync::Mutex::new(t.stopped_nri),
            sigkilled: AtomicBool::new(t.sigkilled),
            rootfs_mounts: t.rootfs_mounts,
            own_pid_namespace: t.own_pid_namespace,
            oom_published: tokio::sync::Mutex::new(t.oom_published),
            env: t.env,
        }))
    }
}
