//! libcontainer off the async runtime.
//!
//! libcontainer's create and exec clone the calling process (the
//! container's intermediate and init processes run Rust code in that copy)
//! and change the caller's dumpable flag and `oom_score_adj`; forking from
//! a multi-threaded tokio process can deadlock (youki #3027, runwasi #357).
//! So those run in a fresh, single-threaded process: the shim binary
//! re-executed as `containerd-shim-nri-shim-v2 __nri-shim-helper`, which
//! reads one [`Request`] as JSON on stdin, writes one [`Response`] on
//! stdout and exits. The container's stdio is passed as fds 3, 4 and 5.
//! The daemon starts a container itself (see `container::start`; the
//! helper only when OCI poststart hooks need libcontainer's start) and
//! deletes one itself ([`delete_here`]): neither clones a process, and an
//! `exec` of the 18 MB binary per container is saved.
//!
//! The container's init (and an exec'd process) is a child of the helper;
//! when the helper exits it is re-parented to the daemon, which is a child
//! subreaper and waits for it (see `monitor`).

use std::{
    io::{Read, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::error::{ShimError, chain};

/// argv\[1\] that makes the shim binary act as a helper.
pub const HELPER_ARG: &str = "__nri-shim-helper";

/// One libcontainer operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Create the container from `bundle/config.json` (init waits for start).
    Create {
        /// Container id.
        id: String,
        /// Bundle directory.
        bundle: PathBuf,
        /// libcontainer state root.
        root: PathBuf,
        /// Unix socket to send the pty master to, for a terminal.
        console_socket: Option<PathBuf>,
        /// libcontainer's systemd cgroup manager (a transient scope).
        #[serde(default)]
        systemd_cgroup: bool,
    },
    /// Let a created container's init exec its process.
    Start {
        /// Container id.
        id: String,
        /// libcontainer state root.
        root: PathBuf,
    },
    /// Start an additional process in the container.
    Exec {
        /// Container id.
        id: String,
        /// libcontainer state root.
        root: PathBuf,
        /// OCI `process.json` of the new process.
        process: PathBuf,
        /// Unix socket to send the pty master to, for a terminal.
        console_socket: Option<PathBuf>,
    },
    /// Remove the container's state and cgroups.
    Delete {
        /// Container id.
        id: String,
        /// libcontainer state root.
        root: PathBuf,
        /// Kill what still runs.
        force: bool,
        /// The container's cgroup, removed directly when libcontainer's
        /// state is unreadable.
        #[serde(default)]
        cgroups_path: Option<PathBuf>,
    },
}

/// Class of a helper failure, mapped to a ttrpc code by the daemon.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The container (state) does not exist.
    NotFound,
    /// A container with the id exists.
    AlreadyExists,
    /// The spec or request is invalid.
    InvalidArgument,
    /// Not possible in the container's state.
    FailedPrecondition,
    /// Anything else.
    Other,
}

/// Result of one operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Done; `pid` of the init or exec'd process when one was started.
    Ok {
        /// Host pid.
        pid: Option<i32>,
    },
    /// Failed.
    Err {
        /// Class.
        kind: FailureKind,
        /// libcontainer's error chain.
        message: String,
    },
}

impl Response {
    /// The daemon-side result.
    pub fn into_result(self) -> Result<Option<i32>, ShimError> {
        match self {
            Response::Ok { pid } => Ok(pid),
            Response::Err { kind, message } => Err(kind.error(message)),
        }
    }
}

impl FailureKind {
    /// The daemon-side error of this class.
    fn error(self, message: String) -> ShimError {
        match self {
            FailureKind::NotFound => ShimError::NotFound(message),
            FailureKind::AlreadyExists => ShimError::AlreadyExists(message),
            FailureKind::InvalidArgument => ShimError::InvalidArgument(message),
            FailureKind::FailedPrecondition => ShimError::FailedPrecondition(message),
            FailureKind::Other => ShimError::Runtime(message),
        }
    }
}

/// A libcontainer error as the daemon reports it, classed as a helper's
/// [`Response::Err`] is (see [`Response::into_result`]): the same error
/// reads the same whichever process met it.
pub fn libcontainer_error(e: libcontainer::error::LibcontainerError) -> ShimError {
    let (kind, message) = classify(e);
    kind.error(message)
}

fn failure(e: libcontainer::error::LibcontainerError) -> Response {
    let (kind, message) = classify(e);
    Response::Err { kind, message }
}

fn classify(e: libcontainer::error::LibcontainerError) -> (FailureKind, String) {
    use libcontainer::error::LibcontainerError as E;
    let kind = match &e {
        E::Exist => FailureKind::AlreadyExists,
        E::NoDirectory => FailureKind::NotFound,
        E::IncorrectStatus(_) => FailureKind::FailedPrecondition,
        E::InvalidInput(_) | E::InvalidID(_) | E::MissingSpec(_) | E::InvalidSpec(_) | E::Spec(_) => {
            FailureKind::InvalidArgument
        }
        _ => FailureKind::Other,
    };
    (kind, chain(&e))
}

/// Takes ownership of an inherited fd number.
fn inherited(fd: i32) -> OwnedFd {
    // SAFETY: fds 3..=5 are set up by the daemon for this process alone
    // (see `spawn`); each is wrapped exactly once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn run(req: Request) -> Response {
    use libcontainer::{
        container::{Container, builder::ContainerBuilder},
        syscall::syscall::SyscallType,
    };
    let builder = |id: &str, root: &Path, console: &Option<PathBuf>| {
        ContainerBuilder::new(id.to_string(), SyscallType::default())
            .with_root_path(root)
            .map(|b| {
                b.with_stdin(inherited(3))
                    .with_stdout(inherited(4))
                    .with_stderr(inherited(5))
                    .with_console_socket(console.as_ref())
            })
    };
    let result = match req {
        Request::Create {
            id,
            bundle,
            root,
            console_socket,
            systemd_cgroup,
        } => {
            // Held until the container exists: `delete` without a daemon
            // waits for it (see cleanup::CreateLock).
            let _lock = crate::container::cleanup::CreateLock::acquire(&root, &id, std::time::Duration::from_secs(10));
            // A spec that does not load is libcontainer's to report.
            if let Ok(spec) = oci_spec::runtime::Spec::load(bundle.join("config.json"))
                && let Err(e) = crate::container::bundle::check_rootfs(&bundle, &spec)
            {
                return Response::Err {
                    kind: FailureKind::InvalidArgument,
                    message: e.to_string(),
                };
            }
            let created = builder(&id, &root, &console_socket)
                .and_then(|b| b.validate_id())
                .and_then(|b| {
                    b.as_init(&bundle)
                        .with_systemd(systemd_cgroup)
                        .with_detach(true)
                        .build()
                })
                .map(|c| c.pid().map(|p| p.as_raw()));
            // Before start, so the process never runs with libcgroups'
            // values; a failure fails the create (the daemon deletes it).
            if created.is_ok()
                && let Err(e) = apply_runc_v2_rules(&id, &bundle)
            {
                return Response::Err {
                    kind: FailureKind::Other,
                    message: chain(&e),
                };
            }
            created
        }
        Request::Start { id, root } => Container::load(root.join(&id)).and_then(|mut c| c.start().map(|_| None)),
        Request::Exec {
            id,
            root,
            process,
            console_socket,
        } => builder(&id, &root, &console_socket)
            .and_then(|b| b.as_tenant().with_process(Some(&process)).with_detach(true).build())
            .map(|pid| Some(pid.as_raw())),
        Request::Delete {
            id,
            root,
            force,
            cgroups_path,
        } => {
            return delete(&id, &root, force, cgroups_path.as_deref(), &|p| {
                crate::cgroups::Cgroup::open(p, &id).map(Arc::new)
            });
        }
    };
    match result {
        Ok(pid) => Response::Ok { pid },
        Err(e) => failure(e),
    }
}

/// Deletes container `id`: libcontainer's state, its processes and, given
/// its path, its cgroup.
///
/// libcontainer gives processes it SIGKILLs about 100 ms to leave their
/// cgroup; past that its delete fails before removing its state, and a
/// failed create removes its state but leaves the cgroup. So the cgroup is
/// removed here with [`crate::cgroups::Cgroup::remove`]'s patience: after
/// a failed libcontainer delete (which is then run again), and after
/// libcontainer is done or had nothing (a cgroup left by a failed create).
///
/// `open` gives the cgroup at a path (the daemon's already open one).
fn delete(id: &str, root: &Path, force: bool, cgroups_path: Option<&Path>, open: &OpenCgroup) -> Response {
    use libcontainer::container::Container;
    let remove_cgroup = || match cgroups_path {
        Some(path) => open(path).and_then(|c| c.remove()),
        None => Ok(()),
    };
    let other = |e: ShimError| Response::Err {
        kind: FailureKind::Other,
        message: chain(&e),
    };
    let dir = root.join(id);
    if dir.exists() {
        match Container::load(dir.clone()) {
            Ok(mut c) => {
                // libcontainer cannot remove a threaded cgroup (made so
                // as runc makes it, see crate::cgroups::threaded): it goes
                // first.
                if cgroups_path
                    .is_some_and(|p| crate::cgroups::threaded::is_threaded(Path::new(crate::cgroups::CGROUP_ROOT), p))
                    && let Err(e) = remove_cgroup()
                {
                    return other(e);
                }
                if let Err(e) = c.delete(force) {
                    if cgroups_path.is_none() {
                        return failure(e);
                    }
                    tracing::warn!(container = %id, error = %chain(&e), "libcontainer delete failed; removing the cgroup, then again");
                    if let Err(e) = remove_cgroup() {
                        return other(e);
                    }
                    if let Err(e) = c.delete(force) {
                        return failure(e);
                    }
                }
            }
            Err(e) => {
                // Unreadable state must not make the task undeletable:
                // remove what we know of by hand.
                tracing::warn!(container = %id, error = %chain(&e), "libcontainer state unreadable, removing it");
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    match remove_cgroup() {
        Ok(()) => Response::Ok { pid: None },
        Err(e) => other(e),
    }
}

/// What runc writes on cgroup v2 and libcgroups did not, for the
/// container just created from `bundle` (see
/// [`crate::cgroups::Cgroup::apply_runc_v2_rules`]).
fn apply_runc_v2_rules(id: &str, bundle: &Path) -> Result<(), ShimError> {
    // Nothing to write on a v1 or hybrid host: neither the spec nor the
    // cgroup (a libcgroups manager, a mount table read) is needed there.
    if !crate::cgroups::path::unified_host() {
        return Ok(());
    }
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .map_err(|e| ShimError::InvalidArgument(format!("{}: {e}", bundle.join("config.json").display())))?;
    let Some(linux) = spec.linux() else { return Ok(()) };
    let (Some(path), Some(resources)) = (linux.cgroups_path(), linux.resources()) else {
        return Ok(());
    };
    crate::cgroups::Cgroup::open(path, id)?.apply_runc_v2_rules(resources)
}

/// Deletes container `id` as [`Request::Delete`] does, in the calling
/// process, which may have other threads: libcontainer's delete clones
/// no process and never changes directory (its only children are OCI
/// poststop hooks, spawned with std's `Command`, which is safe there).
/// Blocking (the cgroup removal waits up to
/// [`crate::cgroups::REMOVE_PATIENCE`]): call it off the async runtime,
/// with stray reaping held off ([`crate::task::monitor::InFlight`]) so a
/// hook's exit status stays for libcontainer's wait. The cgroup comes
/// from `opened` (opened there if it was not).
///
/// # Errors
/// As the helper's delete reports them (see [`Response::into_result`]).
pub fn delete_here(
    id: &str,
    root: &Path,
    force: bool,
    cgroups_path: Option<&Path>,
    opened: &crate::cgroups::Opened,
) -> Result<(), ShimError> {
    delete(id, root, force, cgroups_path, &|p| opened.get(p, id))
        .into_result()
        .map(drop)
}

/// How [`delete`] gets the container's cgroup at a path.
type OpenCgroup<'a> = dyn Fn(&Path) -> Result<Arc<crate::cgroups::Cgroup>, ShimError> + 'a;

/// Runs `req` in this process. Only for a process that has no other
/// threads (the `delete` action); the daemon uses [`call`].
pub fn run_inline(req: Request) -> Response {
    run(req)
}

/// Entry point of the helper process (argv\[1\] == [`HELPER_ARG`]): never
/// returns. Must run before any thread is started.
pub fn helper_main() -> ! {
    // libcontainer logs through tracing; its warnings go to our stderr,
    // which the daemon forwards to the shim log. Only this process's:
    // libcontainer's forked intermediate and init processes inherit the
    // subscriber, and there fd 2 becomes the container's own stderr
    // (a user's `ctr run` printed libcontainer's log lines of a missing
    // executable), while keeping our pipe open in them would hold the
    // daemon's read until the container execs. Their errors reach us
    // through libcontainer's channel, in the operation's result.
    let helper = std::process::id();
    let _ = tracing_subscriber::fmt()
        .with_writer(move || HelperLog(std::process::id() == helper))
        .with_ansi(false)
        // libcgroups warns once per cgroup v1 controller the host lacks
        // (hugetlb, perf_event, ...) and per cgroup v2 controller it does
        // not manage (rdma, misc), for every container: not news.
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,libcgroups::v1::manager=error,libcgroups::v2::util=error",
        ))
        .try_init();
    let mut input = String::new();
    let response = match std::io::stdin().read_to_string(&mut input) {
        Err(e) => Response::Err {
            kind: FailureKind::Other,
            message: format!("helper: cannot read request: {e}"),
        },
        Ok(_) => match serde_json::from_str::<Request>(&input) {
            Ok(req) => run(req),
            Err(e) => Response::Err {
                kind: FailureKind::InvalidArgument,
                message: format!("helper: bad request: {e}"),
            },
        },
    };
    let text = serde_json::to_string(&response).unwrap_or_default();
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
    std::process::exit(0);
}

/// The helper's log writer: stderr in the helper itself (`true`), nothing
/// in the processes libcontainer forks from it (see [`helper_main`]).
struct HelperLog(bool);

impl Write for HelperLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0 {
            std::io::stderr().write(buf)
        } else {
            Ok(buf.len())
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.0 { std::io::stderr().flush() } else { Ok(()) }
    }
}

/// Runs one operation in a helper process (daemon side). `stdio` becomes
/// the container's fds 0, 1, 2 (pass `/dev/null` for unused ones). A
/// returned pid is claimed (see `monitor::claim`): its watcher reaps it.
///
/// # Errors
/// The operation's failure, classified; [`ShimError::Runtime`] when the
/// helper could not run or died.
pub async fn call(exe: &Path, req: &Request, stdio: [OwnedFd; 3]) -> Result<Option<i32>, ShimError> {
    let in_flight = crate::task::monitor::InFlight::new();
    let result = call_inner(exe, req, stdio).await;
    if let Ok(Some(pid)) = result {
        crate::task::monitor::claim(pid);
    }
    drop(in_flight);
    // Zombies the helper left (a failed exec's processes) are strays now.
    crate::task::monitor::reap_strays();
    result
}

/// [`call`] for requests whose process has no stdio (start, delete):
/// the helper gets `/dev/null` three times.
///
/// # Errors
/// As [`call`], or when `/dev/null` cannot be opened.
pub async fn call_without_stdio(exe: &Path, req: &Request) -> Result<Option<i32>, ShimError> {
    let devnull = || {
        std::fs::File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| ShimError::io("open /dev/null", e))
    };
    call(exe, req, [devnull()?, devnull()?, devnull()?]).await
}

async fn call_inner(exe: &Path, req: &Request, stdio: [OwnedFd; 3]) -> Result<Option<i32>, ShimError> {
    let input = serde_json::to_vec(req).map_err(|e| ShimError::Runtime(format!("helper request: {e}")))?;
    let raw: [i32; 3] = [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()];
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(HELPER_ARG)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe fcntl/dup2/close on fds that stay open
    // in the parent until spawn returns, and one setpriority.
    unsafe {
        cmd.pre_exec(move || {
            // The container must never run at the control thread's priority.
            crate::priority::restore_base_nice()?;
            // Move the sources out of 3..=5 first so no dup2 clobbers another.
            let mut high = [0i32; 3];
            for (i, fd) in raw.iter().enumerate() {
                high[i] = nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_DUPFD(64))?;
            }
            for (i, fd) in high.iter().enumerate() {
                nix::unistd::dup2(*fd, 3 + i as i32)?;
                nix::unistd::close(*fd)?;
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| ShimError::Runtime(format!("cannot run helper {}: {e}", exe.display())))?;
    // Claimed before any await: the stray reaper must not take its status.
    let helper_pid = child.id().map(|p| p as i32);
    if let Some(p) = helper_pid {
        crate::task::monitor::claim(p);
    }
    drop(stdio);
    let mut stdin = child.stdin.take().expect("piped");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &input)
        .await
        .map_err(|e| ShimError::Runtime(format!("helper stdin: {e}")))?;
    drop(stdin);
    let out = child.wait_with_output().await;
    if let Some(p) = helper_pid {
        crate::task::monitor::release(p);
    }
    let out = out.map_err(|e| ShimError::Runtime(format!("helper: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        tracing::warn!(target: "libcontainer", "{line}");
    }
    if !out.status.success() || out.stdout.is_empty() {
        return Err(ShimError::Runtime(format!(
            "helper for {req:?} died ({}): {}",
            out.status,
            stderr.lines().last().unwrap_or("")
        )));
    }
    serde_json::from_slice::<Response>(&out.stdout)
        .map_err(|e| ShimError::Runtime(format!("helper reply: {e}")))?
        .into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_roundtrip() {
        let r = Request::Create {
            id: "c1".into(),
            bundle: "/b".into(),
            root: "/r".into(),
            console_socket: None,
            systemd_cgroup: true,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""op":"create""#));
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        let err = Response::Err {
            kind: FailureKind::AlreadyExists,
            message: "exists".into(),
        };
        assert!(matches!(err.into_result(), Err(ShimError::AlreadyExists(_))));
        assert_eq!(Response::Ok { pid: Some(7) }.into_result().unwrap(), Some(7));
    }
}
