//! The node as the installer reaches it: its files under the host root a
//! DaemonSet mounted, its processes through the node's PID namespace, and
//! commands run in the node's own mount namespace (`systemctl`, the shim's
//! `upgrade`).

use std::{
    fs::File,
    io::Write as _,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
};

/// The executable's file name, as containerd derives it from the runtime
/// type `io.containerd.nri-shim.v2`.
pub const SHIM_NAME: &str = "containerd-shim-nri-shim-v2";

/// The `PATH` commands run on the node get.
const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why something on the node failed; each names the file or process.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file, as the installer reaches it.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |source| NodeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where the installer runs relative to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostNamespace {
    /// In a container with the node's PID namespace (`hostPID: true`) and
    /// the node's root mounted at `--root`: node paths are reached under
    /// the root, and commands for the node run in the mount namespace of
    /// the node's PID 1.
    Pid1,
    /// In the node's own mount namespace (on the node itself, or a test):
    /// every path is used as given, commands run as they are; `--root`
    /// only goes to `configure containerd`.
    #[value(name = "self")]
    SelfNs,
}

/// The node: its root and how it is reached.
#[derive(Debug, Clone)]
pub struct Node {
    /// Where the node's `/` is (`/host` in the DaemonSet).
    pub root: PathBuf,
    /// How node paths and node commands are reached.
    pub ns: HostNamespace,
}

impl Node {
    /// How the installer reaches the node path `p`.
    pub fn local(&self, p: &Path) -> PathBuf {
        match self.ns {
            HostNamespace::Pid1 => self.root.join(p.strip_prefix("/").unwrap_or(p)),
            HostNamespace::SelfNs => p.to_path_buf(),
        }
    }

    /// A command running `program` (a node path) on the node: in PID 1's
    /// mount namespace (entered after the fork, before the exec) with a
    /// plain `PATH`, or as it is.
    ///
    /// # Errors
    /// `/proc/1/ns/mnt` cannot be opened (no `hostPID`, or not root).
    pub fn command(&self, program: &Path) -> Result<Command, NodeError> {
        let mut cmd = Command::new(program);
        cmd.env("PATH", NODE_PATH);
        if self.ns == HostNamespace::Pid1 {
            let ns_path = Path::new("/proc/1/ns/mnt");
            let ns = File::open(ns_path).map_err(io(ns_path))?;
            // SAFETY: between fork and exec only async-signal-safe calls
            // (setns, chdir) on the already opened descriptor.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)?;
                    nix::unistd::chdir("/")?;
                    Ok(())
                });
            }
        }
        Ok(cmd)
    }
}

/// Puts the bytes of `src` at `dest` (mode 0755), as a package manager
/// does: a temporary file beside it, synced, renamed over the old one (a
/// running daemon keeps its image). Returns whether `dest` changed.
///
/// # Errors
/// Reading `src` or writing beside `dest` failed.
pub fn install_file(src: &Path, dest: &Path) -> Result<bool, NodeError> {
    let new = std::fs::read(src).map_err(io(src))?;
    if std::fs::read(dest).is_ok_and(|old| old == new) {
        return Ok(false);
    }
    let dir = dest.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let name = dest.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.nri-shim-installer.tmp"));
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&new).map_err(io(&tmp))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, dest).map_err(io(dest))?;
    Ok(true)
}

/// An nri-shim daemon running on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// Its pid (in the node's PID namespace).
    pub pid: i32,
    /// containerd's address it serves (its `-address`).
    pub address: String,
    /// The binary it runs, as `/proc/<pid>/exe` names it.
    pub exe: String,
    /// Its binary was replaced or removed since it started (the link ends
    /// in ` (deleted)`): an `upgrade` makes it run the file there now.
    pub stale: bool,
}

fn args_of(pid: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The nri-shim daemons (a `containerd-shim-nri-shim-v2 ... daemon`
/// process) running the binary `binary`, named as the node or as the
/// installer sees it. A daemon whose binary cannot be read is counted: the
/// file may not be removed under it.
pub fn daemons(binary: &[PathBuf]) -> Vec<Daemon> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        let Ok(pid_n) = pid.parse::<i32>() else { continue };
        let args = args_of(&pid);
        let is_daemon = args.first().is_some_and(|a| a.ends_with(SHIM_NAME)) && args.iter().any(|a| a == "daemon");
        if !is_daemon {
            continue;
        }
        let exe = std::fs::read_link(e.path().join("exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let path = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
        if !exe.is_empty() && !binary.iter().any(|b| Path::new(path) == b) {
            continue;
        }
        let address = args
            .iter()
            .position(|a| a == "-address" || a == "--address")
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_default();
        found.push(Daemon {
            pid: pid_n,
            address,
            stale: exe.ends_with(" (deleted)"),
            exe,
        });
    }
    found.sort_by_key(|d| d.pid);
    found
}

/// The process serving containerd's socket `address` (the path it was
/// bound to): a process named `containerd` holding the listening unix
/// socket of that path, as its network namespace's `/proc/<pid>/net/unix`
/// lists it. Never another containerd of the node.
pub fn containerd_pid(address: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != "containerd" {
            continue;
        }
        // Num RefCount Protocol Flags Type St Inode Path
        let unix = std::fs::read_to_string(e.path().join("net/unix")).unwrap_or_default();
        let inodes: Vec<String> = unix
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 8 && f[7] == address).then(|| format!("socket:[{}]", f[6]))
            })
            .collect();
        if inodes.is_empty() {
            continue;
        }
        let holds = std::fs::read_dir(e.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()));
        if holds {
            return Some(pid);
        }
    }
    None
}

/// The systemd unit whose cgroup holds `pid` (a `*.service` component of
/// `/proc/<pid>/cgroup`), if any.
pub fn systemd_unit(pid: i32) -> Option<String> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup
        .lines()
        .filter(|l| l.starts_with("0::") || l.contains(":name=systemd:"))
        .flat_map(|l| l.rsplit(':').next().unwrap_or("").split('/'))
        .find(|c| c.ends_with(".service"))
        .map(str::to_string)
}

/// The parent pid of `pid`.
pub fn parent_pid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the node's PID 1 is systemd.
pub fn pid1_is_systemd() -> bool {
    std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim_end() == "systemd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_file_changes_once_and_keeps_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, b"one").unwrap();
        let dest = dir.path().join("usr/local/bin/x");
        assert!(install_file(&src, &dest).unwrap());
        assert!(!install_file(&src, &dest).unwrap(), "the same bytes change nothing");
        assert_eq!(std::fs::read(&dest).unwrap(), b"one");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        std::fs::write(&src, b"two").unwrap();
        assert!(install_file(&src, &dest).unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"two");
        let left: Vec<_> = std::fs::read_dir(dest.parent().unwrap()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
    }

    #[test]
    fn a_missing_source_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = install_file(&dir.path().join("nope"), &dir.path().join("x")).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn node_paths_under_the_root_or_as_given() {
        let n = Node {
            root: "/host".into(),
            ns: HostNamespace::Pid1,
        };
        assert_eq!(
            n.local(Path::new("/run/containerd/containerd.sock")),
            Path::new("/host/run/containerd/containerd.sock")
        );
        let n = Node {
            root: "/host".into(),
            ns: HostNamespace::SelfNs,
        };
        assert_eq!(n.local(Path::new("/run/x.sock")), Path::new("/run/x.sock"));
    }

    #[test]
    fn this_process_has_a_parent_and_no_containerd_serves_a_made_up_socket() {
        assert_eq!(
            parent_pid(std::process::id() as i32),
            Some(nix::unistd::getppid().as_raw())
        );
        assert_eq!(containerd_pid("/nonexistent/containerd.sock"), None);
    }
}
