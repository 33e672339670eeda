//! Exit status of container processes, exact and never lost.
//!
//! The daemon is a child subreaper; a container's init (or exec'd process)
//! becomes its child when the helper that created it exits. Each process is
//! watched through a pidfd: readable when the process exits, then reaped
//! with `waitid(P_PIDFD)`. Only that pid is ever waited for, so statuses
//! cannot be stolen by another reaper, and a process that exited before it
//! was watched stays a zombie (with its status) until it is.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    time::SystemTime,
};

use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};

use tokio::io::unix::AsyncFd;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// Exit code, or 128 + signal number when killed by a signal (shell
    /// and containerd convention: SIGKILL = 137, SIGTERM = 143).
    pub code: u32,
    /// When the exit was observed.
    pub at: SystemTime,
}

impl ExitStatus {
    /// The status for a `waitid` result: the exit code, or 128 + the
    /// terminating signal.
    pub fn from_waitid(st: &rustix::process::WaitIdStatus) -> ExitStatus {
        let code = match (st.exit_status(), st.terminating_signal()) {
            (Some(code), _) => code as u32,
            (None, Some(sig)) => 128 + sig as u32,
            (None, None) => 255,
        };
        ExitStatus {
            code,
            at: SystemTime::now(),
        }
    }
}

/// Makes this process a child subreaper, so orphaned container processes
/// become its children.
///
/// # Errors
/// The prctl error.
pub fn set_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(io::Error::from)
}

/// Pids some other code waits for (watched container processes, helper
/// processes): the stray-child reaper leaves them alone.
static CLAIMED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Helper processes in flight: their re-parented processes are not claimed
/// yet, so stray reaping waits.
static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Set while an upgrade hands the daemon over: no process is reaped, so
/// an exit during the handover stays a zombie, with its status, for the
/// new image (see `crate::node::upgrade`).
static FROZEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static THAWED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Stops (`true`) or resumes reaping: [`PidFd::wait`] and [`reap_strays`]
/// leave exited processes alone while frozen.
pub fn freeze(frozen: bool) {
    FROZEN.store(frozen, std::sync::atomic::Ordering::SeqCst);
    if !frozen {
        THAWED.notify_waiters();
    }
}

fn frozen() -> bool {
    FROZEN.load(std::sync::atomic::Ordering::SeqCst)
}

/// Holds off stray reaping while a helper runs (see [`reap_strays`]).
pub struct InFlight(());

impl InFlight {
    /// Starts holding off.
    pub fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(())
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Marks `pid` as waited for elsewhere.
pub fn claim(pid: i32) {
    crate::sync::lock(&CLAIMED).push(pid);
}

/// Undoes [`claim`] once `pid` has been reaped.
pub fn release(pid: i32) {
    crate::sync::lock(&CLAIMED).retain(|p| *p != pid);
}

/// Reaps zombie children nobody waits for: processes re-parented to the
/// subreaper daemon, e.g. the intermediate and failed processes of an
/// exec, or orphans of containers sharing the host pid namespace. Left
/// alone, a zombie in a container's pid namespace keeps the container's
/// init from ever finishing its exit (`zap_pid_ns_processes`).
pub fn reap_strays() {
    if frozen() || IN_FLIGHT.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        return;
    }
    let claimed = crate::sync::lock(&CLAIMED).clone();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for t in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        for pid in children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // Plugin processes are reaped by the adaptation that launched them.
            if claimed.contains(&pid) || nri_adaptation::is_plugin_process(pid) {
                continue;
            }
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
                .unwrap_or(false);
            if zombie {
                let status = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
                // The status says how a failed create's processes ended.
                tracing::debug!(pid, status = ?status, "reaped stray child");
            }
        }
    }
}

/// Runs [`reap_strays`] on every SIGCHLD (and every few seconds, as
/// signals coalesce). Call once in the daemon.
pub fn spawn_stray_reaper() -> io::Result<()> {
    let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sig.recv() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            }
            reap_strays();
        }
    });
    Ok(())
}

/// A handle on a process for waiting on its exit.
pub struct PidFd {
    fd: AsyncFd<OwnedFd>,
    pid: i32,
}

impl PidFd {
    /// Opens a pidfd for `pid` (Linux ≥ 5.3).
    ///
    /// # Errors
    /// `ESRCH` if no such process (already reaped), or the syscall error.
    pub fn open(pid: i32) -> io::Result<PidFd> {
        let raw = Pid::from_raw(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        let owned = rustix::process::pidfd_open(raw, PidfdFlags::empty())?;
        Ok(PidFd {
            fd: async_readable(owned)?,
            pid,
        })
    }

    /// Adopts `pid`, a child of this process (a container process the
    /// previous image of the daemon started, see `crate::node::upgrade`): claims
    /// it from the stray reaper and opens its pidfd. An exited child that
    /// was not reaped is still there, as a zombie with its status.
    ///
    /// # Errors
    /// As [`PidFd::open`].
    pub fn adopt(pid: i32) -> io::Result<PidFd> {
        claim(pid);
        PidFd::open(pid).inspect_err(|_| release(pid))
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends `signal` through the pidfd (no pid-reuse race). Signal 0
    /// only checks that the process exists.
    ///
    /// # Errors
    /// `ESRCH` once the process has exited, `EINVAL` for a number that is
    /// no signal.
    pub fn kill(&self, signal: i32) -> io::Result<()> {
        if signal == 0 {
            // A zombie still exists for kill(2); for the caller it finished.
            return match self.exited_status()? {
                Some(_) => Err(io::Error::from_raw_os_error(libc::ESRCH)),
                None => Ok(()),
            };
        }
        rustix::process::pidfd_send_signal(self.fd.get_ref(), to_signal(signal)?).map_err(io::Error::from)
    }

    /// Waits for the process to exit and reaps it. The process must be a
    /// child of this process by then.
    ///
    /// # Errors
    /// The `waitid` error (`ECHILD` when it is not our child).
    pub async fn wait(&self) -> io::Result<ExitStatus> {
        loop {
            while frozen() {
                let thawed = THAWED.notified();
                if !frozen() {
                    break;
                }
                thawed.await;
            }
            // No await from here to the reap: a freeze cannot come between.
            if let Some(st) = self.reap(WaitIdOptions::EXITED | WaitIdOptions::NOHANG)? {
                return Ok(st);
            }
            let mut guard = self.fd.readable().await?;
            guard.clear_ready();
        }
    }

    /// The exit status if the process has exited, without reaping it.
    fn exited_status(&self) -> io::Result<Option<ExitStatus>> {
        self.reap(WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT)
    }

    fn reap(&self, options: WaitIdOptions) -> io::Result<Option<ExitStatus>> {
        loop {
            match rustix::process::waitid(WaitId::PidFd(self.fd.get_ref().as_fd()), options) {
                Ok(None) => return Ok(None), // NOHANG: still running
                Ok(Some(st)) => return Ok(Some(ExitStatus::from_waitid(&st))),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Registers an fd this process owns (a pidfd, an eventfd, an inotify
/// instance) with the async runtime for readability.
///
/// # Errors
/// The registration error.
pub(crate) fn async_readable(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes the fd by value and owns it; nothing else
    // closes it while it is registered.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.map_err(io::Error::from)
}

/// A signal number as containerd sends it: a named signal or a real-time
/// one (systemd images stop on SIGRTMIN+3).
fn to_signal(n: i32) -> io::Result<Signal> {
    if let Some(s) = Signal::from_named_raw(n) {
        return Ok(s);
    }
    if (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&n) {
        // SAFETY: a real-time signal the libc leaves to applications (the
        // libc's own reserved ones are below SIGRTMIN); it is only sent to
        // another process, never handled or blocked here.
        return Ok(unsafe { Signal::from_raw_unchecked(n) });
    }
    Err(io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(cmd: &str) -> ExitStatus {
        let child = std::process::Command::new("/bin/sh").args(["-c", cmd]).spawn().unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        let st = fd.wait().await.unwrap();
        // Reaped through the pidfd: the std handle must not wait again.
        std::mem::forget(child);
        st
    }

    #[tokio::test]
    async fn r26_exit_codes_are_exact() {
        assert_eq!(run("exit 42").await.code, 42);
        assert_eq!(run("true").await.code, 0);
        assert_eq!(run("kill -TERM $$").await.code, 143);
        assert_eq!(run("kill -KILL $$").await.code, 137);
    }

    #[tokio::test]
    async fn exit_before_watch_is_not_lost() {
        let child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = child.id() as i32;
        std::mem::forget(child);
        // Let it exit first: it stays a zombie until reaped through the fd.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let fd = PidFd::open(pid).unwrap();
        assert_eq!(fd.wait().await.unwrap().code, 0);
        assert_eq!(fd.kill(libc::SIGKILL).unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }

    #[tokio::test]
    async fn any_signal_containerd_may_send_is_delivered() {
        // A real-time signal (systemd's stop signal) kills a shell with 128+n.
        let rt = libc::SIGRTMIN() + 3;
        let child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        std::mem::forget(child);
        fd.kill(0).unwrap();
        assert_eq!(fd.kill(1000).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        fd.kill(rt).unwrap();
        assert_eq!(fd.wait().await.unwrap().code, 128 + rt as u32);
    }

    #[tokio::test]
    async fn a_probe_of_an_exited_process_is_esrch_and_keeps_its_status() {
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        std::mem::forget(child);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(fd.kill(0).unwrap_err().raw_os_error(), Some(libc::ESRCH));
        assert_eq!(fd.wait().await.unwrap().code, 7);
    }
}
