//! Finding the running daemons for the operator's actions (`inspect`,
//! `upgrade`) without being told their config: each daemon's stderr is
//! its `shim.log` in its directory (`<state_root>/<hash of containerd's
//! address>`), which `/proc/<pid>/fd/2` names, so a daemon started with
//! any `state_root` is found from its process.

use std::path::{Path, PathBuf};

/// A running daemon: its pid, its directory and containerd's address it
/// serves (its `-address`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningDaemon {
    /// The daemon's pid.
    pub pid: i32,
    /// Its directory (socket, log, records).
    pub dir: PathBuf,
    /// containerd's address (`-address` of its command line).
    pub address: String,
}

/// The nri-shim daemons running on this host, found through `/proc`: a
/// process whose command line is a `containerd-shim-nri-shim-v2 ...
/// daemon` and whose stderr is a `shim.log`.
pub fn running_daemons() -> Vec<RunningDaemon> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_daemon = args.first().is_some_and(|a| a.ends_with("containerd-shim-nri-shim-v2"))
            && args.iter().any(|a| a == "daemon");
        if !is_daemon {
            continue;
        }
        let Ok(log) = std::fs::read_link(e.path().join("fd/2")) else {
            continue;
        };
        if log.file_name().and_then(|n| n.to_str()) != Some("shim.log") {
            continue;
        }
        let Some(dir) = log.parent() else { continue };
        let address = args
            .iter()
            .position(|a| a == "-address" || a == "--address")
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_default();
        found.push(RunningDaemon {
            pid,
            dir: dir.to_path_buf(),
            address,
        });
    }
    found.sort_by_key(|d| d.pid);
    found
}

/// The state roots to search: `configured` (from the config file, or the
/// default), then those of the running daemons, each once.
pub fn state_roots(configured: &Path) -> Vec<PathBuf> {
    let mut roots = vec![configured.to_path_buf()];
    for d in running_daemons() {
        if let Some(root) = d.dir.parent()
            && !roots.iter().any(|r| r == root)
        {
            roots.push(root.to_path_buf());
        }
    }
    roots
}

/// What to tell an operator when no daemon was found under `state_root`.
pub fn not_found_hint(state_root: &Path) -> String {
    format!(
        "looked under {} (the state_root of {}) and for running daemon processes; if the shim runs with another \
         config file, set NRI_SHIM_CONFIG to it",
        state_root.display(),
        crate::config::Config::path().display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process is no daemon: nothing of it is reported, and the
    /// configured root comes first, once.
    #[test]
    fn only_daemon_processes_count_and_the_configured_root_leads() {
        let me = std::process::id() as i32;
        assert!(running_daemons().iter().all(|d| d.pid != me));
        let roots = state_roots(Path::new("/nonexistent/state"));
        assert_eq!(roots[0], Path::new("/nonexistent/state"));
        let mut unique = roots.clone();
        unique.dedup();
        assert_eq!(unique.len(), roots.len());
        assert!(not_found_hint(Path::new("/x")).contains("NRI_SHIM_CONFIG"));
    }
}
