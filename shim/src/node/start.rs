//! `start`: prints the task address containerd dials, starting the node's
//! daemon ([`super::daemon`]) unless one answers, and leaves the bundle's
//! records. One daemon per containerd instance (keyed on containerd's
//! address, so a private test containerd gets its own).

use std::{
    io::Write as _,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    container::record::TaskRecord, node::args::Flags, node::bootstrap::BootstrapParams, task::service::short_hash,
};

/// Directory, under the state root, of the daemon serving containerd at
/// `address`.
pub fn daemon_dir(state_root: &Path, address: &str) -> PathBuf {
    state_root.join(short_hash(address))
}

pub(super) fn answers(sock: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

/// `start`: prints only the task address (containerd reads stdout and
/// stderr together as the address; for containerd 2.x the bootstrap
/// result naming task API v3, see [`crate::node::bootstrap`]), starting the
/// daemon unless it runs,
/// and leaves the bundle's records (see [`crate::container::record`]): containerd's
/// `address` file, read on its restart to reconnect, and the shim's own
/// record, read by `delete`.
///
/// A daemon it starts reports its startup result through a pipe before
/// it serves: a failure (NRI socket in the way, plugin directory not a
/// directory, ...) fails `start` at once with the daemon's reason.
///
/// Only `state_root` is needed here (see
/// [`crate::config::Config::state_root_lenient`]): a running daemon keeps taking
/// containers while its config file is invalid; a daemon that must be
/// started loads the file itself and reports when it cannot.
///
/// # Errors
/// When the daemon cannot be started, reports a failure, or does not come
/// up within 30 s; when the bundle records cannot be written.
pub fn start_action(flags: &Flags, state_root: &Path, params: Option<&BootstrapParams>) -> anyhow::Result<()> {
    let dir = daemon_dir(state_root, &flags.address);
    let sock = crate::layout::task_socket(&dir);
    // 0700 from the state root down (see crate::private): what the daemon
    // keeps there holds what plugins put into containers.
    crate::private::create_dir_all(&dir)?;
    // Before the daemon is spawned or probed: the first detection runs the
    // containerd binary, and a daemon that exists (or was just spawned)
    // counts its idle time from then on, so the reply must be ready when
    // containerd is told to dial.
    let reply = crate::node::bootstrap::reply(params, || {
        crate::node::bootstrap::containerd_major(&flags.publish_binary, &dir)
    });
    // One starter at a time, and never while the daemon decides to exit on
    // idle (it takes the same lock for its last check and the removal of
    // its socket): a daemon that answers the probe here has accepted it as
    // activity and stays for the client that follows.
    let starting = start_lock(&dir)?;
    if !answers(&sock) {
        let (child, ready) = spawn_daemon(flags, &dir, params.and_then(BootstrapParams::ttrpc_address))?;
        wait_ready(child, ready, &dir)?;
    }
    // The daemon stays for this task's Create however long containerd
    // takes to dial (see crate::node::claim).
    crate::node::claim::write(&dir, &flags.namespace, &flags.id).context("start claim")?;
    drop(starting);
    let address = format!("unix://{}", sock.display());
    let bundle = match &flags.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context("bundle (current directory)")?,
    };
    TaskRecord {
        version: crate::container::record::RECORD_VERSION,
        namespace: flags.namespace.clone(),
        id: flags.id.clone(),
        daemon_dir: dir.clone(),
    }
    .write(&bundle)?;
    crate::container::record::write_address(&bundle, &address)?;
    let mut out = std::io::stdout();
    out.write_all(&crate::node::bootstrap::render(&address, reply))?;
    out.flush()?;
    Ok(())
}

/// `<daemon dir>/start.lock`, taken by `start` around its probe (and the
/// daemon's launch) and by the daemon around its idle exit; released when
/// dropped.
pub(super) fn start_lock(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = crate::private::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("start.lock"))
        .context("start lock")?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("lock start.lock")
}

/// How long `start` waits for a new daemon's startup result. The daemon
/// reports once its pre-installed plugins have registered (each within
/// `plugin_registration_timeout`, 5 s by default) and its WebAssembly
/// plugins are compiled, which on a node busy starting pods takes longer
/// than on an idle one. containerd and kubelet give a shim's start minutes
/// (kubelet's runtime request timeout is 2 minutes); this bound only stops
/// a daemon that will never report. At 10 s the cgroup v2 lane's emulated
/// VM failed two runs in a row with a WebAssembly and a process plugin
/// pre-installed (2026-12-07).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The daemon's end of the startup pipe (an fd number) in its environment.
pub(super) const READY_FD_ENV: &str = "NRI_SHIM_READY_FD";
/// The fd number the startup pipe has in the daemon.
const READY_FD: i32 = 3;

/// Spawns the daemon; `ttrpc_address` (from the bootstrap parameters)
/// overrides the `TTRPC_ADDRESS` it would inherit.
fn spawn_daemon(
    flags: &Flags,
    dir: &Path,
    ttrpc_address: Option<&str>,
) -> anyhow::Result<(std::process::Child, std::fs::File)> {
    let exe = std::env::current_exe().context("own executable")?;
    let log_path = dir.join("shim.log");
    let log = crate::private::append(&log_path)?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("startup pipe")?;
    let write_fd = std::os::fd::AsRawFd::as_raw_fd(&write);
    let mut cmd = std::process::Command::new(exe);
    // No `-id`: the daemon serves every task of this containerd, and the
    // first one's id in its argv (ps, top) would name a container that may
    // be long gone.
    cmd.args(["-namespace", &flags.namespace, "-address", &flags.address])
        .args(["-publish-binary", &flags.publish_binary])
        .arg("daemon")
        .env(READY_FD_ENV, READY_FD.to_string())
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(a) = ttrpc_address {
        cmd.env("TTRPC_ADDRESS", a);
    }
    // SAFETY: setsid, dup2 and fcntl are async-signal-safe. setsid
    // detaches the daemon from containerd's process group and session; the
    // pipe's write end becomes fd 3 without close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            if libc::dup2(write_fd, READY_FD) < 0 || libc::fcntl(READY_FD, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("spawn nri-shim daemon")?;
    drop(write);
    Ok((child, std::fs::File::from(read)))
}

/// Reads the daemon's startup result: `ok`, or `error: REASON`. End of
/// file without either means the daemon died before it could tell.
fn wait_ready(mut child: std::process::Child, mut ready: std::fs::File, dir: &Path) -> anyhow::Result<()> {
    use std::{io::Read as _, os::fd::AsRawFd as _};
    let deadline = Instant::now() + START_TIMEOUT;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let pid = child.id();
            let stopped = stop_unready(&mut child);
            bail!(
                "nri-shim daemon (pid {pid}) did not report its startup within {}s (its pre-installed plugins must \
                 register and load first); stopped it and {stopped} plugin process(es) it had started; see {}",
                START_TIMEOUT.as_secs(),
                dir.join("shim.log").display()
            );
        }
        let mut pfd = libc::pollfd {
            fd: ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll the startup pipe");
        }
        if n == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match ready.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read the startup pipe"),
        }
        if got.ends_with(b"\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    let text = text.trim();
    if text == "ok" {
        return Ok(());
    }
    if let Some(reason) = text.strip_prefix("error: ") {
        bail!("nri-shim daemon failed to start: {reason}");
    }
    let status = child
        .try_wait()
        .ok()
        .flatten()
        .map_or_else(|| "closed its startup pipe".to_string(), |s| format!("exited ({s})"));
    bail!(
        "nri-shim daemon {status} before it was ready; see {}",
        dir.join("shim.log").display()
    )
}

/// Stops a daemon that did not report its startup in time, and the
/// processes it had started (pre-installed plugins, each the leader of a
/// process group of its own), and reaps it. Returns how many such
/// processes were signalled.
///
/// Left running, it would bind the task socket whenever it got there:
/// after the daemon of the next `start` had, unlinking that one's socket,
/// or with a containerd that has already given up on it. The daemon is
/// frozen (SIGSTOP) first so that it starts nothing new while its children
/// are looked up.
fn stop_unready(child: &mut std::process::Child) -> usize {
    use nix::{
        sys::signal::{Signal, kill, killpg},
        unistd::Pid,
    };
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGSTOP);
    let children = children_of(pid.as_raw());
    for &c in &children {
        let c = Pid::from_raw(c);
        let _ = killpg(c, Signal::SIGKILL);
        let _ = kill(c, Signal::SIGKILL);
    }
    // The daemon leads its own session and group (setsid in spawn_daemon).
    let _ = killpg(pid, Signal::SIGKILL);
    let _ = child.wait();
    children.len()
}

/// The pids whose parent is `parent`, from `/proc/<pid>/stat` (its fourth
/// field, after the command name in parentheses, which may itself hold
/// spaces and parentheses).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
                == Some(parent)
        })
        .collect()
}

/// The parent pid in the text of a `/proc/<pid>/stat` file.
fn parent_in_stat(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_parent_is_read_after_the_command_name() {
        assert_eq!(super::parent_in_stat("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(super::parent_in_stat("42 (a) b (c) R 9 1 1 0"), Some(9));
        assert_eq!(super::parent_in_stat("42 (sh"), None);
    }

    #[test]
    fn children_are_found_and_a_stopped_daemon_takes_its_children_along() {
        // A stand-in daemon: a shell leading a process group of its own,
        // with a child in a session of its own (as a plugin is) that would
        // outlive it.
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 60 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let grandchild = loop {
            if let Some(&g) = super::children_of(pid).first() {
                break g;
            }
            assert!(std::time::Instant::now() < deadline, "no child of {pid} seen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(super::stop_unready(&mut child), 1);
        assert!(child.try_wait().unwrap().is_some(), "the daemon is reaped");
        // The grandchild, reparented and reaped by whoever adopts it, goes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::path::Path::new(&format!("/proc/{grandchild}")).exists()
            && !std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|s| s.contains(") Z "))
        {
            assert!(std::time::Instant::now() < deadline, "{grandchild} still runs");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
