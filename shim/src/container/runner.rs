//! The seam between the task code and the container runtime: the task
//! service reaches libcontainer and the container's cgroup only through
//! [`Runner`], so its lifecycle, event order, error codes and rollback can
//! be tested with a fake runner, without root.
//!
//! [`HelperRunner`] is the real one: each libcontainer operation runs in a
//! single-threaded helper process (see `helper`), each started process is
//! watched through a pidfd (see `monitor`), and cgroup access runs off the
//! async runtime (see `cgroups`).

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::Arc,
};

use async_trait::async_trait;
use oci_spec::runtime::LinuxResources;

use crate::{
    cgroups::{Cgroup, Opened},
    container::helper,
    error::{Result, ShimError},
    task::monitor::{ExitStatus, PidFd},
};

/// The container a cgroup operation is for: its id and its
/// `linux.cgroupsPath` from the OCI spec.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Container (task) id.
    pub id: &'a str,
    /// The spec's cgroups path.
    pub cgroups_path: &'a Path,
}

/// A process the runner started (a container's init or an exec'd
/// process): signalled and waited for without a pid-reuse race.
#[async_trait]
pub trait Process: Send + Sync + 'static {
    /// Host pid.
    fn pid(&self) -> i32;
    /// Sends `signal`.
    ///
    /// # Errors
    /// `ESRCH` once the process has exited; other errno values as the
    /// kernel gives them.
    fn signal(&self, signal: i32) -> io::Result<()>;
    /// Waits for the exit and reaps the process; called once.
    ///
    /// # Errors
    /// When the process cannot be reaped.
    async fn wait(&self) -> io::Result<ExitStatus>;
}

/// OOM events of one container's cgroup (see `oom`).
#[async_trait]
pub trait OomEvents: Send + 'static {
    /// Waits for the next change of the cgroup's OOM state; `false` once
    /// the watch has ended (the cgroup is gone).
    async fn changed(&mut self) -> bool;

    /// Whether a change can come before the kill is counted (cgroup v1's
    /// OOM notification), so that the count must be read again for a
    /// while; `false` by default.
    fn signals_before_the_kill(&self) -> bool {
        false
    }
}

#[async_trait]
impl OomEvents for crate::task::oom::OomWatch {
    async fn changed(&mut self) -> bool {
        crate::task::oom::OomWatch::changed(self).await
    }
    fn signals_before_the_kill(&self) -> bool {
        crate::task::oom::OomWatch::signals_before_the_kill(self)
    }
}

/// What the container needs from its creator besides the bundle.
#[derive(Debug, Clone, Copy)]
pub struct CreateRequest<'a> {
    /// Container id.
    pub id: &'a str,
    /// OCI bundle directory (holds the final `config.json` and `rootfs`).
    pub bundle: &'a Path,
    /// Unix socket the pty master is sent to, for a terminal.
    pub console_socket: Option<&'a Path>,
    /// The systemd cgroup driver (runtime option `SystemdCgroup`): the
    /// spec's `slice:prefix:name` becomes a transient scope.
    pub systemd_cgroup: bool,
}

/// The container runtime as the task code sees it.
///
/// Errors are [`ShimError`]s already classified for containerd (a
/// container that exists is `AlreadyExists`, a bad spec `InvalidArgument`,
/// anything else `Runtime`).
#[async_trait]
pub trait Runner: Send + Sync + 'static {
    /// Creates the container from `bundle/config.json`; its init waits for
    /// [`Runner::start`]. `stdio` becomes the init's fds 0, 1, 2.
    async fn create(&self, req: CreateRequest<'_>, stdio: [OwnedFd; 3]) -> Result<Arc<dyn Process>>;
    /// Lets a created container's init exec its process.
    async fn start(&self, id: &str) -> Result<()>;
    /// Starts `process` (an OCI `process` object) in container `id`.
    async fn exec(
        &self,
        id: &str,
        process: &serde_json::Value,
        console_socket: Option<&Path>,
        stdio: [OwnedFd; 3],
    ) -> Result<Arc<dyn Process>>;
    /// Removes the container, killing what still runs: state, cgroups.
    /// `cgroups_path` lets a container whose state is unreadable be
    /// removed anyway. Succeeds when the container is already gone.
    async fn delete(&self, id: &str, cgroups_path: Option<&Path>) -> Result<()>;
    /// Sends `signal` to every process in the container's cgroup.
    async fn kill_all(&self, target: Target<'_>, signal: i32) -> Result<()>;
    /// Every pid in the container's cgroup.
    async fn pids(&self, target: Target<'_>) -> Result<Vec<i32>>;
    /// Freezes (`true`) or thaws the container's cgroup.
    async fn freeze(&self, target: Target<'_>, frozen: bool) -> Result<()>;
    /// Applies `resources` (only what they set) to the container's cgroup.
    async fn update(&self, target: Target<'_>, resources: &LinuxResources) -> Result<()>;
    /// The cgroup's statistics in containerd's metrics format.
    async fn stats(&self, target: Target<'_>) -> Result<crate::cgroups::Metrics>;
    /// OOM kills recorded for the cgroup, when readable.
    async fn oom_kills(&self, target: Target<'_>) -> Option<u64>;
    /// A watch of the cgroup's OOM events, when the memory controller
    /// offers one.
    fn watch_oom(&self, target: Target<'_>) -> Option<Box<dyn OomEvents>>;
    /// Takes over process `pid`, a child of this process that the
    /// previous image of the daemon started (an upgrade).
    ///
    /// # Errors
    /// When the process cannot be watched (not this runner's to adopt, by
    /// default).
    fn adopt(&self, pid: i32) -> Result<Arc<dyn Process>> {
        Err(ShimError::Runtime(format!("this runner cannot adopt pid {pid}")))
    }
}

/// The runner of the daemon: libcontainer in helper processes.
pub struct HelperRunner {
    exe: PathBuf,
    state_root: PathBuf,
    /// The containers' cgroups, opened once each (see [`Opened`]).
    cgroups: Arc<Opened>,
}

impl HelperRunner {
    /// Runs helpers from `exe` (this binary) and keeps libcontainer's
    /// state under `state_root/containers`.
    pub fn new(exe: impl Into<PathBuf>, state_root: impl Into<PathBuf>) -> HelperRunner {
        HelperRunner {
            exe: exe.into(),
            state_root: state_root.into(),
            cgroups: Arc::default(),
        }
    }

    /// libcontainer's state root.
    pub fn libcontainer_root(&self) -> PathBuf {
        crate::layout::libcontainer_root(&self.state_root)
    }

    fn watch(pid: Option<i32>, what: &str) -> Result<Arc<dyn Process>> {
        let pid = pid.ok_or_else(|| ShimError::Runtime(format!("libcontainer reported no {what} pid")))?;
        let fd = PidFd::open(pid).map_err(|e| ShimError::io(format!("watch pid {pid}"), e))?;
        Ok(Arc::new(Watched(fd)))
    }
}

/// A process watched through its pidfd.
struct Watched(PidFd);

#[async_trait]
impl Process for Watched {
    fn pid(&self) -> i32 {
        self.0.pid()
    }
    fn signal(&self, signal: i32) -> io::Result<()> {
        self.0.kill(signal)
    }
    async fn wait(&self) -> io::Result<ExitStatus> {
        let st = self.0.wait().await;
        crate::task::monitor::release(self.0.pid());
        st
    }
}

#[async_trait]
impl Runner for HelperRunner {
    async fn create(&self, req: CreateRequest<'_>, stdio: [OwnedFd; 3]) -> Result<Arc<dyn Process>> {
        crate::private::create_dir_all(&self.libcontainer_root())
            .map_err(|e| ShimError::io("create libcontainer root", e))?;
        let pid = helper::call(
            &self.exe,
            &helper::Request::Create {
                id: req.id.to_string(),
                bundle: req.bundle.to_path_buf(),
                root: self.libcontainer_root(),
                console_socket: req.console_socket.map(Path::to_path_buf),
                systemd_cgroup: req.systemd_cgroup,
            },
            stdio,
        )
        .await?;
        Self::watch(pid, "init")
    }

    async fn start(&self, id: &str) -> Result<()> {
        // In the daemon unless OCI poststart hooks need libcontainer's
        // start (see crate::container::start).
        let (root, owned) = (self.libcontainer_root(), id.to_string());
        let started = tokio::task::spawn_blocking(move || crate::container::start::start_in_daemon(&root, &owned))
            .await
            .map_err(|e| ShimError::Runtime(format!("start {id}: {e}")))??;
        if started == crate::container::start::Started::Done {
            return Ok(());
        }
        helper::call_without_stdio(
            &self.exe,
            &helper::Request::Start {
                id: id.to_string(),
                root: self.libcontainer_root(),
            },
        )
        .await
        .map(drop)
    }

    async fn exec(
        &self,
        id: &str,
        process: &serde_json::Value,
        console_socket: Option<&Path>,
        stdio: [OwnedFd; 3],
    ) -> Result<Arc<dyn Process>> {
        let dir = self.state_root.join("exec");
        crate::private::create_dir_all(&dir).map_err(|e| ShimError::io("exec state dir", e))?;
        let file = exec_file(&dir);
        // The exec's env and args: private like everything else here.
        crate::private::write(&file, serde_json::to_vec(process).unwrap_or_default())
            .map_err(|e| ShimError::io("write process.json", e))?;
        let result = helper::call(
            &self.exe,
            &helper::Request::Exec {
                id: id.to_string(),
                root: self.libcontainer_root(),
                process: file.clone(),
                console_socket: console_socket.map(Path::to_path_buf),
            },
            stdio,
        )
        .await;
        let _ = std::fs::remove_file(&file);
        Self::watch(result?, "exec")
    }

    async fn delete(&self, id: &str, cgroups_path: Option<&Path>) -> Result<()> {
        // In the daemon, without a helper process (see helper::delete_here).
        let (root, owned, cgroups_path, cgroups) = (
            self.libcontainer_root(),
            id.to_string(),
            cgroups_path.map(Path::to_path_buf),
            self.cgroups.clone(),
        );
        let in_flight = crate::task::monitor::InFlight::new();
        let r = tokio::task::spawn_blocking(move || {
            let r = helper::delete_here(&owned, &root, true, cgroups_path.as_deref(), &cgroups);
            // Once deleted its cgroup is gone; a failed delete is tried
            // again with the same handle.
            if r.is_ok()
                && let Some(p) = &cgroups_path
            {
                cgroups.forget(p);
            }
            r
        })
        .await;
        drop(in_flight);
        // What a poststop hook left is a stray now.
        crate::task::monitor::reap_strays();
        r.map_err(|e| ShimError::Runtime(format!("delete {id}: {e}")))?
    }

    async fn kill_all(&self, target: Target<'_>, signal: i32) -> Result<()> {
        // Signal 0 only probes, as kill(2) does.
        let signal = match signal {
            0 => None,
            n => Some(
                nix::sys::signal::Signal::try_from(n)
                    .map_err(|_| ShimError::InvalidArgument(format!("{n} is not a signal")))?,
            ),
        };
        for pid in self.pids(target).await.unwrap_or_default() {
            // Each pid comes from the container's own cgroup; one that
            // exited since is no error.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
        Ok(())
    }

    async fn pids(&self, target: Target<'_>) -> Result<Vec<i32>> {
        Cgroup::off_runtime(&self.cgroups, target, Cgroup::pids).await
    }

    async fn freeze(&self, target: Target<'_>, frozen: bool) -> Result<()> {
        Cgroup::off_runtime(&self.cgroups, target, move |c| c.freeze(frozen)).await
    }

    async fn update(&self, target: Target<'_>, resources: &LinuxResources) -> Result<()> {
        let resources = resources.clone();
        Cgroup::off_runtime(&self.cgroups, target, move |c| c.update(&resources)).await
    }

    async fn stats(&self, target: Target<'_>) -> Result<crate::cgroups::Metrics> {
        Cgroup::off_runtime(&self.cgroups, target, Cgroup::metrics).await
    }

    async fn oom_kills(&self, target: Target<'_>) -> Option<u64> {
        Cgroup::off_runtime(&self.cgroups, target, |c| Ok(c.oom_kills()))
            .await
            .ok()
            .flatten()
    }

    fn adopt(&self, pid: i32) -> Result<Arc<dyn Process>> {
        let fd = PidFd::adopt(pid).map_err(|e| ShimError::io(format!("adopt pid {pid}"), e))?;
        Ok(Arc::new(Watched(fd)))
    }

    fn watch_oom(&self, target: Target<'_>) -> Option<Box<dyn OomEvents>> {
        let watch = crate::cgroups::resolve(target.cgroups_path)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
            .and_then(|path| crate::task::oom::OomWatch::open(Path::new(crate::cgroups::CGROUP_ROOT), &path));
        match watch {
            Ok(w) => Some(Box::new(w)),
            Err(e) => {
                // The exit still reports an OOM kill; only the early event is lost.
                tracing::warn!(task = target.id, error = %crate::error::chain(&e), "cannot watch OOM events");
                None
            }
        }
    }
}

/// A file name in `dir` for an exec's `process.json`, unique in this
/// daemon (two execs of one task may start at once).
fn exec_file(dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{}-{n}.json", std::process::id()))
}
