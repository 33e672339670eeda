//! In-place upgrade: a new shim binary takes over from the running daemon
//! without stopping a container or closing containerd's connections.
//!
//! The operator installs the new file at the path the daemon was started
//! from and runs the `upgrade` action, which sends SIGUSR2 to the daemon
//! (its pid is in `daemon.pid` in the daemon's directory) and waits for
//! `upgrade.result`. The daemon then:
//!
//! 1. runs `<new binary> upgrade-check`, which must print
//!    [`check_line`] (same handover format) after loading the config: a
//!    missing, broken or incompatible binary, or a config the new image
//!    would refuse, fails here with the old image serving on;
//! 2. closes the [`crate::node::gate::Gate`] (no accept; each containerd
//!    connection stops reading at its next ttrpc frame boundary) and
//!    stops reaping ([`crate::task::monitor::freeze`]), then waits (bounded) until
//!    every request read has been answered, no create or exit is in
//!    progress and every event reached containerd;
//! 3. stops NRI (pre-installed plugins get Shutdown, external ones lose
//!    their connection; the new image starts them again and synchronizes
//!    them with the running containers);
//! 4. stops the terminals' copier threads and parks the stdin copiers,
//!    each between a write and the next read (the pty or fifo holds what
//!    comes meanwhile, so no byte is in flight at the exec), duplicates without close-on-exec
//!    what the new image needs (the task socket's listener, containerd's
//!    connections, containerd's `log` fifos, each process's stdin pipe and
//!    fifo, or pty master and both fifos: a fifo with no writer left would
//!    read as end of file to containerd), writes
//!    [`Handover`] to `handover.json`, and `execve`s the new binary with
//!    the same argv and [`RESUME_ENV`] naming the file. The pid stays, so
//!    the containers stay its children, and exits that happened meanwhile
//!    wait as zombies.
//!
//! A failure before the exec (or of the exec itself) undoes steps 2 to 4
//! and answers the operator with the reason; the old image serves on.

use std::{
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use nri_adaptation::Adaptation;

use crate::task::service::{Service, TableState};

/// Version of [`Handover`]'s format: a new binary takes over only from an
/// image writing the version it reads.
pub const HANDOVER_VERSION: u32 = 1;
/// The action a new binary answers with [`check_line`].
pub const CHECK_ACTION: &str = "upgrade-check";
/// Environment variable naming the handover file for the new image.
pub const RESUME_ENV: &str = "NRI_SHIM_RESUME";
/// How long the `upgrade` action waits for the daemon's result.
pub const RESULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the daemon waits for requests, creates and exits in
/// progress (and undelivered events) before it gives the upgrade up.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

/// What `upgrade-check` prints.
pub fn check_line() -> String {
    format!("nri-shim handover {HANDOVER_VERSION}")
}

/// The daemon's pid (for `upgrade`), in its directory.
pub fn pid_file(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("daemon.pid")
}

/// The last upgrade's outcome: `ok ...` or `error: ...`.
pub fn result_file(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("upgrade.result")
}

/// The state the old image leaves for the new one.
pub fn handover_file(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("handover.json")
}

/// Why an upgrade did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The new binary did not pass `upgrade-check`.
    #[error("new binary {exe} refused: {reason}")]
    Check {
        /// The binary.
        exe: PathBuf,
        /// What it said (or why it could not run).
        reason: String,
    },
    /// Work in progress did not finish in time.
    #[error("daemon still busy after the quiesce timeout: {0}")]
    Busy(String),
    /// A handover step failed.
    #[error("{what}")]
    Io {
        /// The step.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `execve` failed.
    #[error("exec {exe}")]
    Exec {
        /// The binary.
        exe: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl UpgradeError {
    fn io(what: impl Into<String>, source: std::io::Error) -> UpgradeError {
        UpgradeError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Whether a task request may be answered by the next image instead:
/// `Wait` only waits for an exit the next image also knows (containerd's
/// CRI keeps one open per container), so the daemon does not wait for it
/// and the request is read again by the next image.
pub fn replayable(method: &str) -> bool {
    method == "Wait"
}

/// One of containerd's connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Connection {
    /// Its fd.
    pub fd: RawFd,
    /// Requests read and not answered (whole ttrpc frames, only
    /// [`replayable`] ones), read again before the socket.
    pub replay: Vec<u8>,
}

/// What the new image inherits (fd numbers valid in it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handover {
    /// [`HANDOVER_VERSION`].
    pub version: u32,
    /// The binary path the daemon runs from (re-executed on the next upgrade).
    pub exe: PathBuf,
    /// The version of the image that wrote this.
    pub from_version: String,
    /// The daemon's directory (kept even if the config's `state_root`
    /// changed: the running containers' state is there).
    pub dir: PathBuf,
    /// The task socket's listener.
    pub listener: RawFd,
    /// containerd's connections, each at a ttrpc frame boundary.
    pub connections: Vec<Connection>,
    /// containerd's `log` fifos: (task key, fd), oldest first.
    pub log_fifos: Vec<(String, RawFd)>,
    /// The task table.
    pub table: TableState,
}

impl Handover {
    /// The handover left by the previous image, if this image was started
    /// by an upgrade: read and removed, and the variable cleared so no
    /// child sees it.
    ///
    /// Must run before any thread exists.
    ///
    /// # Errors
    /// When the file named by [`RESUME_ENV`] cannot be read or parsed, or
    /// has another version.
    pub fn from_env() -> Result<Option<Handover>, UpgradeError> {
        let Some(path) = std::env::var_os(RESUME_ENV) else {
            return Ok(None);
        };
        // SAFETY: no other thread exists yet (the caller's contract).
        unsafe { std::env::remove_var(RESUME_ENV) };
        let path = PathBuf::from(path);
        let text = std::fs::read(&path).map_err(|e| UpgradeError::io(format!("read {}", path.display()), e))?;
        let _ = std::fs::remove_file(&path);
        let h: Handover = serde_json::from_slice(&text)
            .map_err(|e| UpgradeError::io(format!("parse {}", path.display()), std::io::Error::other(e)))?;
        if h.version != HANDOVER_VERSION {
            return Err(UpgradeError::io(
                format!("handover version {} (this binary reads {HANDOVER_VERSION})", h.version),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            ));
        }
        Ok(Some(h))
    }
}

/// Takes ownership of an fd inherited from the previous image, with
/// close-on-exec set again (helpers and plugins must not inherit it).
///
/// # Safety
/// `fd` must be an open fd nothing else in this process owns: one named
/// in the [`Handover`], taken once.
pub unsafe fn inherit(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: fcntl on any number is safe; it fails on a closed one.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return None;
    }
    // SAFETY: open and unowned (the caller's contract).
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A duplicate of `fd` without close-on-exec, kept in `keep` (closed
/// when the upgrade is given up).
///
/// # Errors
/// The `fcntl` error.
pub fn dup_for_exec(fd: RawFd, keep: &mut Vec<OwnedFd>) -> std::io::Result<RawFd> {
    // SAFETY: F_DUPFD makes a new fd (without FD_CLOEXEC) or fails.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD, 3) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, owned here.
    keep.push(unsafe { OwnedFd::from_raw_fd(new) });
    Ok(new)
}

/// Runs `<exe> upgrade-check` (10 s at most): the new binary must exist,
/// run, load the config and speak this handover format.
///
/// # Errors
/// [`UpgradeError::Check`] saying what went wrong.
pub async fn check_binary(exe: &Path) -> Result<(), UpgradeError> {
    let refused = |reason: String| UpgradeError::Check {
        exe: exe.to_path_buf(),
        reason,
    };
    // The stray reaper must leave this child to its waiter.
    let _held = crate::task::monitor::InFlight::new();
    let run = tokio::process::Command::new(exe)
        .arg(CHECK_ACTION)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(10), run).await {
        Err(_) => return Err(refused("upgrade-check did not answer within 10s".into())),
        Ok(Err(e)) => return Err(refused(format!("cannot run it: {e}"))),
        Ok(Ok(out)) => out,
    };
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && said == check_line() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(refused(format!(
        "upgrade-check ({}) said {said:?}{}{err}, expected {:?}",
        out.status,
        if err.is_empty() { "" } else { ": " },
        check_line()
    )))
}

/// Replaces this process's image with `exe` (same argv), which resumes
/// from `handover`. Returns only on failure.
pub fn exec(exe: &Path, handover: &Path) -> UpgradeError {
    use std::os::unix::process::CommandExt as _;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.as_os_str().to_owned());
    // The log thread's queue is lost with this image.
    crate::node::shimlog::flush_log(std::time::Duration::from_secs(1));
    // The new image's threads start with this one's nice value: the
    // daemon's own, whichever thread runs the upgrade.
    if let Err(e) = crate::priority::restore_base_nice() {
        tracing::warn!(error = %e, "cannot restore the daemon's priority before the upgrade");
    }
    let source = std::process::Command::new(exe)
        .arg0(arg0)
        .args(args)
        .env(RESUME_ENV, handover)
        .exec();
    UpgradeError::Exec {
        exe: exe.to_path_buf(),
        source,
    }
}

/// Writes the outcome for the `upgrade` action (atomically).
pub fn write_result(daemon_dir: &Path, text: &str) {
    let line = format!("{}\n", text.replace('\n', " "));
    let _ = crate::private::write_atomic(&result_file(daemon_dir), "tmp", line.as_bytes(), false);
}

/// The `upgrade` action: asks the daemon of containerd `address` (when
/// empty: every daemon under `state_root` and every other nri-shim daemon
/// running on the machine) to re-execute its binary, and waits for each
/// result. Returns one line per daemon.
///
/// # Errors
/// When no daemon runs, or a daemon reports a failure or none in time.
pub fn upgrade_action(state_root: &Path, address: &str) -> anyhow::Result<String> {
    upgrade_found(state_root, address, crate::node::running::running_daemons())
}

/// [`upgrade_action`] with the daemons found running given (the tests'
/// way to keep other daemons of the machine out).
fn upgrade_found(
    state_root: &Path,
    address: &str,
    running: Vec<crate::node::running::RunningDaemon>,
) -> anyhow::Result<String> {
    use anyhow::bail;
    let mut dirs: Vec<PathBuf> = if address.is_empty() {
        std::fs::read_dir(state_root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            // A daemon killed (or a containerd gone) leaves its pid file.
            .filter(|d| live_daemon(d).is_ok())
            .collect()
    } else {
        let configured = crate::node::start::daemon_dir(state_root, address);
        if live_daemon(&configured).is_ok() {
            vec![configured]
        } else {
            Vec::new()
        }
    };
    // Daemons started with another config (another state_root).
    for d in running {
        if (address.is_empty() || d.address == address) && !dirs.contains(&d.dir) {
            dirs.push(d.dir);
        }
    }
    let mut report = String::new();
    let mut failed = Vec::new();
    for dir in &dirs {
        match upgrade_one(dir) {
            Ok(line) => report.push_str(&format!("{}: {line}\n", dir.display())),
            Err(e) => {
                report.push_str(&format!("{}: error: {e:#}\n", dir.display()));
                failed.push(dir.display().to_string());
            }
        }
    }
    if dirs.is_empty() {
        let of = if address.is_empty() {
            String::new()
        } else {
            format!(" for containerd at {address}")
        };
        bail!(
            "no nri-shim daemon found{of}: {}",
            crate::node::running::not_found_hint(state_root)
        );
    }
    if !failed.is_empty() {
        bail!("{}", report.trim_end());
    }
    Ok(report)
}

/// The pid of the daemon running for `dir`.
fn live_daemon(dir: &Path) -> anyhow::Result<i32> {
    use anyhow::{Context as _, bail};
    let pid_text =
        std::fs::read_to_string(pid_file(dir)).with_context(|| format!("read {}", pid_file(dir).display()))?;
    let pid: i32 = pid_text.trim().parse().context("daemon.pid")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).split('\0').any(|a| a == "daemon") {
        bail!("pid {pid} of {} is no running nri-shim daemon", pid_file(dir).display());
    }
    Ok(pid)
}

fn upgrade_one(dir: &Path) -> anyhow::Result<String> {
    use anyhow::{Context as _, bail};
    let pid = live_daemon(dir)?;
    let _ = std::fs::remove_file(result_file(dir));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGUSR2)
        .with_context(|| format!("signal daemon {pid}"))?;
    let deadline = Instant::now() + RESULT_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(result_file(dir)) {
            let text = text.trim();
            if let Some(reason) = text.strip_prefix("error: ") {
                bail!("daemon {pid} kept running the old binary: {reason}");
            }
            return Ok(text.to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "no upgrade result from daemon {pid} within {}s; see {}",
                RESULT_TIMEOUT.as_secs(),
                dir.join("shim.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An upgrade in the daemon (see [`crate::node::upgrade`]).
pub(super) struct Upgrade<'a> {
    pub(super) exe: &'a Path,
    pub(super) dir: &'a Path,
    pub(super) gate: &'a crate::node::gate::Gate,
    pub(super) service: &'a Service,
    pub(super) nri: Option<&'a Adaptation>,
    pub(super) listener: std::os::fd::RawFd,
}

impl Upgrade<'_> {
    /// Checks the new binary, quiesces, hands over and re-executes it;
    /// returns only when the upgrade did not happen (everything undone).
    pub(super) async fn run(&self) -> UpgradeError {
        tracing::info!(exe = %self.exe.display(), "upgrade requested");
        if let Err(e) = crate::node::upgrade::check_binary(self.exe).await {
            return e;
        }
        self.gate.close();
        crate::task::monitor::freeze(true);
        let e = self.quiesced_exec().await;
        crate::task::monitor::freeze(false);
        self.gate.open();
        e
    }

    async fn quiesced_exec(&self) -> crate::node::upgrade::UpgradeError {
        use crate::node::upgrade::UpgradeError;
        let deadline = Instant::now() + crate::node::upgrade::QUIESCE_TIMEOUT;
        loop {
            let busy = self.service.busy();
            let conns = !self.gate.quiet(&crate::node::upgrade::replayable);
            if busy.is_none() && !conns {
                break;
            }
            if Instant::now() > deadline {
                let mut why = busy.unwrap_or_default();
                if conns {
                    why.push_str(if why.is_empty() { "" } else { "; " });
                    why.push_str("a containerd request still unanswered");
                }
                return UpgradeError::Busy(why);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(n) = self.nri {
            n.stop().await;
        }
        // Stopping NRI awaited: a response may have started meanwhile.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !(self.gate.quiet(&crate::node::upgrade::replayable) && self.service.busy().is_none())
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Last: stdio is copied until here.
        self.service.stop_terminals(Duration::from_secs(1));
        let mut parks = self.service.stdin_parks();
        let late = crate::stdio::park_stdin(&mut parks, Duration::from_secs(1)).await;
        if late > 0 {
            tracing::warn!(
                copiers = late,
                "stdin copiers did not park before the upgrade (writing to a full pipe); bytes they hold are lost"
            );
        }
        let e = self.exec().await;
        crate::stdio::unpark_stdin(&parks);
        self.service.restart_terminals();
        if let Some(n) = self.nri
            && let Err(e) = n.start().await
        {
            tracing::error!(error = %crate::error::chain(&e), "NRI did not start again after the failed upgrade");
        }
        let _ = std::fs::remove_file(crate::node::upgrade::handover_file(self.dir));
        e
    }

    /// Writes the handover and execs; returns only on failure (the
    /// duplicated fds are closed then).
    async fn exec(&self) -> crate::node::upgrade::UpgradeError {
        use crate::node::upgrade::{Handover, UpgradeError, dup_for_exec};
        let mut keep = Vec::new();
        let state = (|| -> std::io::Result<Handover> {
            let listener = dup_for_exec(self.listener, &mut keep)?;
            let connections = self
                .gate
                .handover()
                .into_iter()
                .map(|(fd, replay)| {
                    dup_for_exec(fd, &mut keep).map(|fd| crate::node::upgrade::Connection { fd, replay })
                })
                .collect::<std::io::Result<_>>()?;
            let log_fifos = crate::node::shimlog::SHIM_LOG
                .fds()
                .into_iter()
                .map(|(k, fd)| dup_for_exec(fd, &mut keep).map(|d| (k, d)))
                .collect::<std::io::Result<_>>()?;
            let table = self.service.handover_state(&mut |fd| dup_for_exec(fd, &mut keep))?;
            Ok(Handover {
                version: crate::node::upgrade::HANDOVER_VERSION,
                exe: self.exe.to_path_buf(),
                from_version: env!("CARGO_PKG_VERSION").to_string(),
                dir: self.dir.to_path_buf(),
                listener,
                connections,
                log_fifos,
                table,
            })
        })();
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                return UpgradeError::Io {
                    what: "duplicate the fds to hand over".into(),
                    source: e,
                };
            }
        };
        let path = crate::node::upgrade::handover_file(self.dir);
        let text = serde_json::to_vec(&state).unwrap_or_default();
        if let Err(e) = crate::private::write(&path, text) {
            return UpgradeError::Io {
                what: format!("write {}", path.display()),
                source: e,
            };
        }
        tracing::info!(exe = %self.exe.display(), tasks = state.table.tasks.len(), connections = state.connections.len(), "handing over to the new binary");
        let e = crate::node::upgrade::exec(self.exe, &path);
        drop(keep);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_round_trips_through_its_file_format() {
        let h = Handover {
            version: HANDOVER_VERSION,
            exe: "/usr/bin/containerd-shim-nri-shim-v2".into(),
            from_version: "0.1.0".into(),
            dir: "/run/nri-shim/0123456789abcdef".into(),
            listener: 5,
            connections: vec![
                Connection {
                    fd: 7,
                    replay: Vec::new(),
                },
                Connection {
                    fd: 8,
                    replay: vec![0, 0, 0, 0, 0, 0, 0, 1, 1, 0],
                },
            ],
            log_fifos: vec![("default/c1".into(), 9)],
            table: TableState::default(),
        };
        let text = serde_json::to_vec(&h).unwrap();
        assert_eq!(serde_json::from_slice::<Handover>(&text).unwrap(), h);
    }

    #[test]
    fn an_fd_duplicated_for_exec_has_no_close_on_exec_and_inherit_sets_it() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut keep = Vec::new();
        let fd = dup_for_exec(std::os::fd::AsRawFd::as_raw_fd(&f), &mut keep).unwrap();
        // SAFETY: F_GETFD on an fd owned by `keep`.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
        let owned = keep.pop().unwrap();
        std::mem::forget(owned);
        // SAFETY: `fd` is open and, forgotten above, owned by nobody else.
        let back = unsafe { inherit(fd) }.unwrap();
        // SAFETY: F_GETFD on an fd `back` owns.
        assert_ne!(unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
        drop(back);
    }

    /// Without `-address`, only directories whose pid file names a live
    /// daemon are upgraded: stale ones (a killed daemon) are no error.
    #[test]
    fn the_upgrade_of_every_daemon_skips_stale_pid_files() {
        let root = tempfile::tempdir().unwrap();
        let stale = root.path().join("0123456789abcdef");
        std::fs::create_dir_all(&stale).unwrap();
        // This test process: alive, but no daemon.
        std::fs::write(pid_file(&stale), format!("{}\n", std::process::id())).unwrap();
        // No daemon running elsewhere on the machine counts here.
        let e = upgrade_found(root.path(), "", Vec::new()).unwrap_err();
        assert!(format!("{e:#}").contains("no nri-shim daemon found"), "{e:#}");
        let e = live_daemon(&stale).unwrap_err();
        assert!(format!("{e:#}").contains("is no running nri-shim daemon"), "{e:#}");
    }

    #[tokio::test]
    async fn a_binary_that_does_not_answer_the_check_is_refused() {
        let e = check_binary(Path::new("/bin/true")).await.unwrap_err();
        assert!(e.to_string().contains("new binary /bin/true refused"), "{e}");
        let e = check_binary(Path::new("/nonexistent/shim")).await.unwrap_err();
        assert!(e.to_string().contains("cannot run it"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let fake = d.path().join("shim");
        std::fs::write(&fake, format!("#!/bin/sh\necho '{}'\n", check_line())).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        check_binary(&fake).await.unwrap();
    }
}
