//! The installer's two halves: [`install`] (the binary, containerd's
//! handler, a restart when the config changed, an in-place upgrade of a
//! daemon running a replaced binary, the node label) and [`uninstall`]
//! (the label, the handler, a restart, the binary once no daemon runs it).
//! Each step prints one line saying what it did.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::{
    containerd::{self, ContainerdError, Restart, Restarted},
    kube::{self, KubeError},
    node::{self, Node, NodeError},
};

/// Why installing or uninstalling stopped.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file or process of the node.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// containerd's restart or readiness.
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    /// The Kubernetes API.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The shim's `configure`, `unconfigure` or `upgrade` failed.
    #[error("{command}: {message}")]
    Shim {
        /// The command line.
        command: String,
        /// Its exit status and output.
        message: String,
    },
}

/// Everything the installer is told (see `nri-shim-installer install -h`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The node and how it is reached.
    pub node: Node,
    /// The shim binary to install (in the image).
    pub source: PathBuf,
    /// Where it goes, as the node names it.
    pub binary: PathBuf,
    /// containerd's socket, as the node names it.
    pub containerd_address: String,
    /// `configure --config` (a node path), else configure's default.
    pub containerd_config: Option<PathBuf>,
    /// `configure --shim-config` (a node path).
    pub shim_config: Option<PathBuf>,
    /// Further `configure containerd` flags (`--runtime-name`, `--default`,
    /// `--systemd-cgroup`, `--containerd-nri`, `--as-runc`).
    pub configure_flags: Vec<String>,
    /// The handler's name (for `unconfigure`).
    pub runtime_name: String,
    /// How containerd restarts.
    pub restart: Restart,
    /// The systemd unit, else the one running containerd.
    pub systemd_unit: Option<String>,
    /// How long containerd may take to stop and to answer again.
    pub ready_timeout: Duration,
    /// How long to wait for the shim's daemons to exit before leaving the
    /// binary in place.
    pub daemon_exit_timeout: Duration,
    /// The node label (key, value), when the Kubernetes API is used.
    pub label: Option<(String, String)>,
    /// The node's name.
    pub node_name: String,
}

/// What [`install`] left on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The binary was written (new or changed).
    pub binary_changed: bool,
    /// containerd's config changed (and containerd was restarted).
    pub config_changed: bool,
    /// Daemons upgraded in place (their pids).
    pub upgraded: Vec<i32>,
}

fn say(line: &str) {
    println!("nri-shim-installer: {line}");
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim_end()
    .to_string()
}

fn run(cmd: &mut Command) -> Result<std::process::Output, InstallError> {
    let line = format!("{cmd:?}").replace('"', "");
    cmd.output().map_err(|e| InstallError::Shim {
        command: line,
        message: e.to_string(),
    })
}

impl Settings {
    /// The binary as the installer reaches it.
    fn binary_local(&self) -> PathBuf {
        self.node.local(&self.binary)
    }

    /// `configure containerd` / `unconfigure containerd` with the image's
    /// shim, on the node's files under the root.
    fn shim_config_command(&self, action: &str) -> Command {
        let mut cmd = Command::new(&self.source);
        cmd.args([action, "containerd", "--root"]).arg(&self.node.root);
        if let Some(c) = &self.containerd_config {
            cmd.arg("--config").arg(self.node.local(c));
        }
        if action == "configure" {
            if let Some(c) = &self.shim_config {
                cmd.arg("--shim-config").arg(self.node.local(c));
            }
            cmd.arg("--binary").arg(&self.binary);
            cmd.args(&self.configure_flags);
        } else {
            cmd.args(["--runtime-name", &self.runtime_name]);
        }
        cmd
    }

    fn socket(&self) -> PathBuf {
        self.node.local(Path::new(&self.containerd_address))
    }

    fn restart_containerd(&self) -> Result<(), InstallError> {
        match containerd::restart(
            &self.node,
            &self.containerd_address,
            self.restart,
            self.systemd_unit.as_deref(),
            self.ready_timeout,
        )? {
            Restarted::Systemd(unit) => say(&format!("restarted containerd: systemctl restart {unit}")),
            Restarted::Signal { old } => say(&format!(
                "restarted containerd: SIGTERM to pid {old}, waiting for its supervisor to start it again"
            )),
            Restarted::Skipped => say("containerd's config changed: restart containerd yourself (--restart none)"),
        }
        Ok(())
    }

    /// The binary's names a daemon's `/proc/<pid>/exe` may show.
    fn binary_names(&self) -> Vec<PathBuf> {
        let mut v = vec![self.binary.clone()];
        if self.binary_local() != self.binary {
            v.push(self.binary_local());
        }
        v
    }
}

/// Installs nri-shim on the node as [`Settings`] say; idempotent (a second
/// run on an installed node changes nothing and restarts nothing).
///
/// # Errors
/// [`InstallError`] naming the file, command, process or API object.
pub fn install(s: &Settings, kube: Option<&kube::Client>) -> Result<Installed, InstallError> {
    let binary_changed = node::install_file(&s.source, &s.binary_local())?;
    say(&format!(
        "{} {}",
        if binary_changed { "installed" } else { "unchanged:" },
        s.binary.display()
    ));
    let out = run(&mut s.shim_config_command("configure"))?;
    if !out.status.success() {
        return Err(InstallError::Shim {
            command: "containerd-shim-nri-shim-v2 configure containerd".into(),
            message: text(&out),
        });
    }
    let diff = String::from_utf8_lossy(&out.stdout).into_owned();
    let config_changed = !diff.trim().is_empty();
    if config_changed {
        say("containerd's config changed:");
        print!("{diff}");
        s.restart_containerd()?;
    } else {
        say("containerd's config already has the handler: no restart");
    }
    if !(config_changed && s.restart == Restart::None) {
        containerd::wait_ready(&s.socket(), s.ready_timeout)?;
        say(&format!(
            "containerd at {} answers (CRI RuntimeReady)",
            s.containerd_address
        ));
    }
    // A daemon still running a binary replaced under it (this run's, or
    // an earlier one's that did not get to upgrade it) takes the new one
    // in place: its containers keep running.
    let mut upgraded = Vec::new();
    for d in node::daemons(&s.binary_names()).into_iter().filter(|d| d.stale) {
        let mut cmd = s.node.command(&s.binary)?;
        cmd.args(["upgrade", "-address", &d.address]);
        let out = run(&mut cmd)?;
        let report = text(&out);
        if !out.status.success() {
            return Err(InstallError::Shim {
                command: format!("{} upgrade -address {}", s.binary.display(), d.address),
                message: report,
            });
        }
        say(&format!("upgraded the daemon (pid {}) in place: {report}", d.pid));
        upgraded.push(d.pid);
    }
    if let (Some(k), Some((key, value))) = (kube, &s.label) {
        retry(|| k.label_node(&s.node_name, key, Some(value)))?;
        say(&format!("labelled node {} {key}={value}", s.node_name));
    }
    Ok(Installed {
        binary_changed,
        config_changed,
        upgraded,
    })
}

/// Retries a request that failed for want of an answer (the API server
/// restarting) for up to a minute; an error status is final.
fn retry<T>(mut f: impl FnMut() -> Result<T, KubeError>) -> Result<T, KubeError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Err(KubeError::Transport { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

/// What [`uninstall`] left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// containerd's config changed (and containerd was restarted).
    pub config_changed: bool,
    /// The binary was removed; else the daemons (pids) still running it.
    pub binary_left_for: Vec<i32>,
}

/// Takes nri-shim off the node: the label, the handler (restarting
/// containerd when its config changed), then the binary once no daemon
/// runs it (waiting [`Settings::daemon_exit_timeout`] for idle daemons to
/// exit); a daemon still serving containers keeps it, and says so.
///
/// # Errors
/// [`InstallError`]; a label that cannot be removed is reported and the
/// rest goes on.
pub fn uninstall(s: &Settings, kube: Option<&kube::Client>) -> Result<Uninstalled, InstallError> {
    if let (Some(k), Some((key, _))) = (kube, &s.label) {
        match retry(|| k.label_node(&s.node_name, key, None)) {
            Ok(()) => say(&format!("removed label {key} from node {}", s.node_name)),
            Err(e) => say(&format!(
                "could not remove label {key} from node {}: {e}; remove it with `kubectl label node {} {key}-`",
                s.node_name, s.node_name
            )),
        }
    }
    let out = run(&mut s.shim_config_command("unconfigure"))?;
    let report = text(&out);
    // Exit 1 after taking the handler out of a file edited since: the
    // original is kept beside it for the operator; containerd still needs
    // the restart.
    if !out.status.success() && !report.contains("changed since `configure` wrote it") {
        return Err(InstallError::Shim {
            command: "containerd-shim-nri-shim-v2 unconfigure containerd".into(),
            message: report,
        });
    }
    let config_changed = !report.is_empty();
    if config_changed {
        say("containerd's config changed back:");
        println!("{report}");
        s.restart_containerd()?;
        if s.restart != Restart::None {
            containerd::wait_ready(&s.socket(), s.ready_timeout)?;
            say(&format!(
                "containerd at {} answers (CRI RuntimeReady)",
                s.containerd_address
            ));
        }
    } else {
        say("containerd's config has no nri-shim handler: no restart");
    }
    let deadline = Instant::now() + s.daemon_exit_timeout;
    let mut running = node::daemons(&s.binary_names());
    while !running.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        running = node::daemons(&s.binary_names());
    }
    let local = s.binary_local();
    if running.is_empty() {
        match std::fs::remove_file(&local) {
            Ok(()) => say(&format!("removed {}", s.binary.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(NodeError::Io { path: local, source }.into()),
        }
    } else {
        let pids: Vec<String> = running.iter().map(|d| d.pid.to_string()).collect();
        say(&format!(
            "left {}: nri-shim daemon(s) {} still run containers; remove it once they are gone",
            s.binary.display(),
            pids.join(", ")
        ));
    }
    Ok(Uninstalled {
        config_changed,
        binary_left_for: running.iter().map(|d| d.pid).collect(),
    })
}
