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
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::SystemTime,
};

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
    /// The status for a raw `waitid` result.
    pub fn from_wait(code: i32, status: i32) -> ExitStatus {
        let code = match code {
            libc::CLD_EXITED => status as u32,
            libc::CLD_KILLED | libc::CLD_DUMPED => 128 + status as u32,
            _ => 255,
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
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pids some other code waits for (watched container processes, helper
/// processes): the stray-child reaper leaves them alone.
static CLAIMED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Helper processes in flight: their re-parented processes are not claimed
/// yet, so stray reaping waits.
static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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
    CLAIMED.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
}

/// Undoes [`claim`] once `pid` has been reaped.
pub fn release(pid: i32) {
    CLAIMED.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| *p != pid);
}

/// Reaps zombie children nobody waits for: processes re-parented to the
/// subreaper daemon, e.g. the intermediate and failed processes of an
/// exec, or orphans of containers sharing the host pid namespace. Left
/// alone, a zombie in a container's pid namespace keeps the container's
/// init from ever finishing its exit (`zap_pid_ns_processes`).
pub fn reap_strays() {
    if IN_FLIGHT.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        return;
    }
    let claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for t in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        for pid in children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if claimed.contains(&pid) {
                continue;
            }
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
                .unwrap_or(false);
            if zombie {
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
                tracing::debug!(pid, "reaped stray child");
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
        // SAFETY: pidfd_open takes a pid and flags; returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a fresh fd we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the AsyncFd owns the pidfd; it is never closed elsewhere
        // while registered.
        let fd = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)? };
        Ok(PidFd { fd, pid })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends `signal` through the pidfd (no pid-reuse race).
    ///
    /// # Errors
    /// `ESRCH` once the process has exited.
    pub fn kill(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal with a null siginfo.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.get_ref().as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Waits for the process to exit and reaps it. The process must be a
    /// child of this process by then.
    ///
    /// # Errors
    /// The `waitid` error (`ECHILD` when it is not our child).
    pub async fn wait(&self) -> io::Result<ExitStatus> {
        loop {
            if let Some(st) = self.try_reap()? {
                return Ok(st);
            }
            let mut guard = self.fd.readable().await?;
            guard.clear_ready();
        }
    }

    fn try_reap(&self) -> io::Result<Option<ExitStatus>> {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our pidfd with a valid siginfo pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                self.fd.get_ref().as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(None);
            }
            return Err(e);
        }
        // SAFETY: reading the union fields waitid set for CLD_* codes.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None); // WNOHANG: still running
        }
        Ok(Some(ExitStatus::from_wait(info.si_code, status)))
    }
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
}
