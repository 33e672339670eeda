//! Pre-installed plugins: discovery in the plugin directory and launch with
//! a pre-connected socket (NRI `adaptation.go` discoverPlugins, `plugin.go`
//! newLaunchedPlugin).

use std::{
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::PermissionsExt,
    },
    path::{Path, PathBuf},
};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nri_proto::naming;

use crate::error::Error;

/// A plugin found in the plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// Two-digit index from the file name.
    pub idx: String,
    /// Name from the file name (after the first `-`).
    pub base: String,
    /// Full path of the executable.
    pub path: PathBuf,
    /// A WebAssembly module (starts with `\0asm` 1), loaded in process
    /// instead of executed (see [`crate::wasm`]).
    pub wasm: bool,
}

/// Lists the plugins to launch from `dir`, in lexical file-name order.
///
/// A missing directory means no plugins. Directories and files without any
/// execute bit are skipped, each with a warning (upstream skips them
/// silently, which hides a plugin installed without `chmod +x`). A file
/// whose name is not `IDX-NAME` (two-digit
/// index) is skipped with a warning: upstream NRI fails the whole start
/// instead, which takes every plugin down for one stray file. A file that
/// starts with the WebAssembly magic is a WebAssembly plugin (upstream's
/// test, after the same naming and execute-bit rules), skipped with a
/// warning when the crate is built without its `wasm` feature.
///
/// # Errors
/// [`Error::PluginDir`] when the directory exists but cannot be read.
pub fn discover(dir: &Path) -> Result<Vec<Discovered>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::PluginDir {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut names: Vec<(String, PathBuf)> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::PluginDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            tracing::warn!(path = %path.display(), "skipping unreadable entry in NRI plugin directory");
            continue;
        };
        if meta.is_dir() {
            tracing::warn!(path = %path.display(), "skipping directory in NRI plugin directory");
            continue;
        }
        if meta.permissions().mode() & 0o111 == 0 {
            tracing::warn!(path = %path.display(), "skipping non-executable file in NRI plugin directory");
            continue;
        }
        match entry.file_name().into_string() {
            Ok(name) => names.push((name, path)),
            Err(name) => tracing::warn!(file = ?name, "skipping NRI plugin with a non-UTF-8 name"),
        }
    }
    names.sort();
    let mut out = Vec::new();
    for (name, path) in names {
        match naming::parse_plugin_file_name(&name) {
            Ok((idx, base)) => {
                let wasm = crate::wasm::is_wasm(&path);
                if wasm && !cfg!(feature = "wasm") {
                    tracing::warn!(plugin = %name, "skipping WebAssembly NRI plugin: this runtime was built without WebAssembly support");
                    continue;
                }
                out.push(Discovered { idx, base, path, wasm });
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping NRI plugin"),
        }
    }
    Ok(out)
}

/// The drop-in configuration of plugin `idx-base`: `<dir>/IDX-NAME.conf`,
/// else `<dir>/NAME.conf`, else empty.
///
/// # Errors
/// A read error other than "not found", with the file named.
pub fn plugin_config(dir: &Path, idx: &str, base: &str) -> Result<String, (PathBuf, std::io::Error)> {
    for file in [dir.join(format!("{idx}-{base}.conf")), dir.join(format!("{base}.conf"))] {
        match std::fs::read_to_string(&file) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err((file, e)),
        }
    }
    Ok(String::new())
}

/// Starts a discovered plugin with one end of a socketpair as fd 3.
///
/// The child's environment is exactly `NRI_PLUGIN_NAME=<NAME>`,
/// `NRI_PLUGIN_IDX=<IDX>`, `NRI_PLUGIN_SOCKET=3` (nothing inherited, as
/// upstream), argv\[0\] is the full path. Both socket ends are created
/// CLOEXEC so no other child inherits them; the child's copy at fd 3 is
/// the only one without it. Each end is owned by exactly one [`OwnedFd`],
/// so each is closed exactly once (NRI #66 closed a raw fd twice and hit an
/// unrelated listener of the runtime).
///
/// Returns the runtime's end and the child.
///
/// # Errors
/// The socketpair or spawn error.
pub fn spawn(plugin: &Discovered) -> std::io::Result<(tokio::net::UnixStream, PluginProcess)> {
    let (ours, theirs): (OwnedFd, OwnedFd) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
    .map_err(std::io::Error::from)?;
    // The child's end must be blocking for ordinary readers (Go sets its own).
    nix::fcntl::fcntl(
        theirs.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    )
    .map_err(std::io::Error::from)?;
    let child_fd = theirs.as_raw_fd();
    let mut cmd = tokio::process::Command::new(&plugin.path);
    cmd.env_clear()
        .env(nri_proto::PLUGIN_NAME_ENV, &plugin.base)
        .env(nri_proto::PLUGIN_IDX_ENV, &plugin.idx)
        .env(nri_proto::PLUGIN_SOCKET_ENV, "3")
        .stdin(std::process::Stdio::null())
        // Its own process group: stopping the plugin also stops whatever
        // it started (see `Plugin::kill`).
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure only calls async-signal-safe dup2/fcntl on fds
    // that stay open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            use nix::fcntl::{FcntlArg, FdFlag, fcntl};
            if child_fd == 3 {
                // dup2 onto itself would keep CLOEXEC: clear it instead.
                fcntl(3, FcntlArg::F_SETFD(FdFlag::empty()))?;
            } else {
                // dup2 leaves the new descriptor without CLOEXEC.
                nix::unistd::dup2(child_fd, 3)?;
            }
            Ok(())
        });
    }
    let child = spawn_retrying_busy(&mut cmd)?;
    // Our copy of the child's end closes here, once.
    drop(theirs);
    let std_stream = std::os::unix::net::UnixStream::from(ours);
    let stream = tokio::net::UnixStream::from_std(std_stream)?;
    if let Some(pid) = child.id() {
        lock_live().push(pid as i32);
    }
    Ok((stream, PluginProcess(child)))
}

/// Pids of launched plugin processes not reaped yet (see
/// [`is_plugin_process`]).
static LIVE: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn lock_live() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `pid` is a plugin process this library launched and will reap
/// itself. An embedding runtime that reaps children it does not know (a
/// child subreaper reaping re-parented zombies, as the shim's daemon
/// does) must leave these alone: a plugin's status taken from under its
/// `wait` is lost, and the pid, still believed alive, would be signalled
/// after it may have been reused.
pub fn is_plugin_process(pid: i32) -> bool {
    lock_live().contains(&pid)
}

/// Spawns `cmd`, retrying briefly while its executable is busy (ETXTBSY):
/// a plugin just copied into the plugin directory is busy while any
/// process forked meanwhile (by this runtime, or the copier) still holds
/// the copy's write descriptor until it execs.
fn spawn_retrying_busy(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) && tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// How a plugin process ended, for messages: `exit status 17` or `killed
/// by signal SIGSEGV`.
pub fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("killed by signal {name}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        (None, None) => status.to_string(),
    }
}

/// A launched plugin's process, leader of its own process group. Dropping
/// it SIGKILLs the group: the plugin and whatever it started, which would
/// otherwise outlive a plugin that failed or was dropped.
#[derive(Debug)]
pub struct PluginProcess(pub tokio::process::Child);

impl PluginProcess {
    /// The plugin's pid while it has not been reaped.
    pub fn id(&self) -> Option<u32> {
        self.0.id()
    }

    /// The plugin's exit status if it exits within `within`: a plugin
    /// whose connection closed while it started has usually died, and its
    /// status (or signal) is what tells an operator why.
    pub async fn exit_status(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let pid = self.0.id();
        let status = tokio::time::timeout(within, self.0.wait()).await.ok()?.ok();
        if status.is_some() {
            forget(pid);
        }
        status
    }

    /// Waits up to `within` for the plugin to exit, without reaping it: a
    /// reaped leader's pid may be reused (a container's init is a group
    /// leader too), so the group is killed while the exited leader still
    /// holds its pid. Returns whether it exited.
    pub async fn exited_within(&self, within: std::time::Duration) -> bool {
        let Some(pid) = self.0.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) else {
            return true;
        };
        if within.is_zero() {
            return false;
        }
        // A pidfd is readable once the process has exited (Linux 5.3).
        let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
            return false;
        };
        // SAFETY: the AsyncFd owns the pidfd; nothing else closes it.
        let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        let Ok(fd) = registered else {
            return false;
        };
        tokio::time::timeout(within, fd.readable()).await.is_ok()
    }

    fn kill_group(&self) {
        if let Some(pid) = self.0.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// SIGKILLs the process group and reaps the plugin.
    pub async fn kill(&mut self) {
        self.kill_group();
        let _ = self.0.start_kill();
        let pid = self.0.id();
        let _ = self.0.wait().await;
        forget(pid);
    }
}

/// Takes a reaped (or abandoned) plugin pid out of [`LIVE`].
fn forget(pid: Option<u32>) {
    if let Some(pid) = pid {
        lock_live().retain(|p| *p != pid as i32);
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        self.kill_group();
        // Not reaped yet: tokio reaps it as an orphan, or a subreaper does.
        forget(self.0.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str, mode: u32) {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn r11_discovery_skips_non_executables_and_bad_names() {
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), "20-x", 0o644);
        touch(d.path(), "10-logger", 0o755);
        touch(d.path(), "logger", 0o755);
        touch(d.path(), "05-first", 0o700);
        std::fs::create_dir(d.path().join("07-dir")).unwrap();
        let found = discover(d.path()).unwrap();
        let names: Vec<_> = found.iter().map(|p| format!("{}-{}", p.idx, p.base)).collect();
        assert_eq!(names, ["05-first", "10-logger"]);
        assert_eq!(found[1].path, d.path().join("10-logger"));
    }

    /// The shim's stray reaper asks this before it reaps a zombie child:
    /// a launched plugin is listed until this library has reaped it.
    #[tokio::test]
    async fn a_plugin_process_is_listed_until_it_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-sleeper");
        std::fs::write(&path, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = Discovered {
            idx: "10".into(),
            base: "sleeper".into(),
            path,
            wasm: false,
        };
        let (_stream, mut child) = spawn(&found).unwrap();
        let pid = child.id().unwrap() as i32;
        assert!(is_plugin_process(pid));
        assert!(!is_plugin_process(std::process::id() as i32));
        assert!(!child.exited_within(std::time::Duration::from_millis(50)).await);
        child.kill().await;
        assert!(!is_plugin_process(pid), "reaped by kill");
    }

    #[test]
    fn missing_plugin_dir_is_empty() {
        assert!(discover(Path::new("/nonexistent/nri/plugins")).unwrap().is_empty());
    }

    /// A WebAssembly module is found like an executable (name, execute
    /// bit) and marked; without the `wasm` feature it is skipped.
    #[test]
    fn wasm_plugins_are_found_by_their_magic() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-wasm");
        std::fs::write(&p, [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 1, 2]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Version 2 of the binary format is not a module this runtime loads.
        touch(d.path(), "20-script", 0o755);
        let q = d.path().join("30-other");
        std::fs::write(&q, [0x00, 0x61, 0x73, 0x6d, 0x02, 0x00, 0x00, 0x00]).unwrap();
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = discover(d.path()).unwrap();
        let wasm: Vec<_> = found.iter().filter(|f| f.wasm).map(|f| f.base.as_str()).collect();
        if cfg!(feature = "wasm") {
            assert_eq!(wasm, ["wasm"]);
            assert_eq!(found.len(), 3);
        } else {
            assert!(wasm.is_empty());
            assert_eq!(found.len(), 2);
        }
    }

    #[test]
    fn config_lookup_order() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(plugin_config(d.path(), "10", "a").unwrap(), "");
        std::fs::write(d.path().join("a.conf"), "plain").unwrap();
        assert_eq!(plugin_config(d.path(), "10", "a").unwrap(), "plain");
        std::fs::write(d.path().join("10-a.conf"), "indexed").unwrap();
        assert_eq!(plugin_config(d.path(), "10", "a").unwrap(), "indexed");
        std::fs::create_dir(d.path().join("20-b.conf")).unwrap();
        let (file, _) = plugin_config(d.path(), "20", "b").unwrap_err();
        assert_eq!(file, d.path().join("20-b.conf"));
    }
}
