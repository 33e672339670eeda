//! `nri-shim-installer`: see the library's docs and `--help`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nri_shim_installer::{
    containerd::Restart,
    install::{self, Settings},
    kube::{self, DaemonSetState},
    node::{HostNamespace, Node},
};

#[derive(Parser)]
#[command(
    name = "nri-shim-installer",
    version,
    about = "Installs nri-shim on a Kubernetes node from a DaemonSet pod"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install, then wait for SIGTERM; uninstall then if the DaemonSet was deleted.
    Install(Box<InstallArgs>),
    /// Exit 0 once `install` has finished (the DaemonSet's readiness probe).
    Ready {
        /// The file `install` writes when it has finished.
        #[arg(long, default_value = "/tmp/nri-shim-installer.ready")]
        ready_file: PathBuf,
    },
}

/// What SIGTERM does.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnSigterm {
    /// Ask the API server: uninstall when the DaemonSet is gone, else keep
    /// (without Kubernetes: uninstall).
    Auto,
    /// Always uninstall.
    Uninstall,
    /// Never uninstall.
    Keep,
}

#[derive(Args)]
struct InstallArgs {
    /// Where the node's root is mounted.
    #[arg(long, default_value = "/host")]
    root: PathBuf,
    /// pid1: a container with hostPID, node paths under --root, node
    /// commands in PID 1's mount namespace; self: on the node itself,
    /// paths as given.
    #[arg(long, value_enum, default_value = "pid1")]
    host_namespace: HostNamespace,
    /// The shim binary to install.
    #[arg(long, default_value = "/opt/nri-shim/containerd-shim-nri-shim-v2")]
    source: PathBuf,
    /// Where it goes on the node (on containerd's PATH).
    #[arg(long, default_value = "/usr/local/bin/containerd-shim-nri-shim-v2")]
    binary: PathBuf,
    /// containerd's socket on the node.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    containerd_address: String,
    /// containerd's config on the node (default: configure's, <root>/etc/containerd/config.toml).
    #[arg(long)]
    containerd_config: Option<PathBuf>,
    /// nri-shim's config on the node, for its NRI socket (default: configure's).
    #[arg(long)]
    shim_config: Option<PathBuf>,
    /// The runtime handler's name (the RuntimeClass's `handler`).
    #[arg(long, default_value = "nri-shim")]
    runtime_name: String,
    /// Make it containerd's default runtime.
    #[arg(long)]
    default: bool,
    /// The handler's cgroup driver (configure's --systemd-cgroup).
    #[arg(long, default_value = "auto", value_parser = ["auto", "true", "false"])]
    systemd_cgroup: String,
    /// containerd's own NRI when it would serve nri-shim's socket (configure's --containerd-nri).
    #[arg(long, default_value = "keep", value_parser = ["keep", "disable"])]
    containerd_nri: String,
    /// Declare the handler with runc's type and runtime_path (configure's --as-runc).
    #[arg(long)]
    as_runc: bool,
    /// How containerd restarts when its config changed.
    #[arg(long, value_enum, default_value = "auto")]
    restart: Restart,
    /// The systemd unit running containerd (default: from its cgroup).
    #[arg(long)]
    systemd_unit: Option<String>,
    /// Seconds containerd may take to stop, and to answer again.
    #[arg(long, default_value_t = 120)]
    ready_timeout: u64,
    /// Seconds to wait for idle nri-shim daemons to exit before leaving the binary.
    #[arg(long, default_value_t = 60)]
    daemon_exit_timeout: u64,
    /// The node label the RuntimeClass selects, KEY=VALUE.
    #[arg(long, default_value = "nri-shim.io/runtime=installed")]
    node_label: String,
    /// This node's name (the pod's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The DaemonSet running this pod, asked about on SIGTERM.
    #[arg(long, env = "DAEMONSET_NAME")]
    daemonset: Option<String>,
    /// The pod's service account directory (token, ca.crt, namespace).
    #[arg(long, default_value = kube::SERVICE_ACCOUNT_DIR)]
    service_account_dir: PathBuf,
    /// The API server (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
    #[arg(long)]
    api_server: Option<String>,
    /// No Kubernetes API: no label, and SIGTERM (with --on-sigterm auto) uninstalls.
    #[arg(long)]
    no_kubernetes: bool,
    /// What SIGTERM does.
    #[arg(long, value_enum, default_value = "auto")]
    on_sigterm: OnSigterm,
    /// Written once installed (see `ready`).
    #[arg(long, default_value = "/tmp/nri-shim-installer.ready")]
    ready_file: PathBuf,
}

fn settings(a: &InstallArgs) -> anyhow::Result<Settings> {
    let label = if a.no_kubernetes {
        None
    } else {
        let (k, v) = a
            .node_label
            .split_once('=')
            .with_context(|| format!("--node-label {:?}: KEY=VALUE", a.node_label))?;
        Some((k.to_string(), v.to_string()))
    };
    let mut configure_flags = vec![
        "--runtime-name".to_string(),
        a.runtime_name.clone(),
        "--systemd-cgroup".into(),
        a.systemd_cgroup.clone(),
        "--containerd-nri".into(),
        a.containerd_nri.clone(),
    ];
    if a.default {
        configure_flags.push("--default".into());
    }
    if a.as_runc {
        configure_flags.push("--as-runc".into());
    }
    Ok(Settings {
        node: Node {
            root: a.root.clone(),
            ns: a.host_namespace,
        },
        source: a.source.clone(),
        binary: a.binary.clone(),
        containerd_address: a.containerd_address.clone(),
        containerd_config: a.containerd_config.clone(),
        shim_config: a.shim_config.clone(),
        configure_flags,
        runtime_name: a.runtime_name.clone(),
        restart: a.restart,
        systemd_unit: a.systemd_unit.clone(),
        ready_timeout: Duration::from_secs(a.ready_timeout),
        daemon_exit_timeout: Duration::from_secs(a.daemon_exit_timeout),
        label,
        node_name: a.node_name.clone().unwrap_or_default(),
    })
}

fn run_install(a: &InstallArgs) -> anyhow::Result<()> {
    // SIGTERM and SIGINT wait, blocked, until the install is done; then
    // `wait` takes them (a SIGTERM during the install is answered after it).
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None).context("block SIGTERM")?;
    let s = settings(a)?;
    let client = if a.no_kubernetes {
        None
    } else {
        anyhow::ensure!(
            !s.node_name.is_empty(),
            "no node name: set NODE_NAME (the pod's spec.nodeName) or --node-name, or pass --no-kubernetes"
        );
        Some(kube::Client::in_cluster(
            &a.service_account_dir,
            a.api_server.as_deref(),
        )?)
    };
    install::install(&s, client.as_ref())?;
    std::fs::write(&a.ready_file, "installed\n").with_context(|| format!("write {}", a.ready_file.display()))?;
    println!("nri-shim-installer: ready; waiting for SIGTERM");
    let sig = signals.wait().context("wait for SIGTERM")?;
    println!("nri-shim-installer: {sig:?}");
    let _ = std::fs::remove_file(&a.ready_file);
    let uninstall = match (a.on_sigterm, &client) {
        (OnSigterm::Keep, _) => false,
        (OnSigterm::Uninstall, _) | (OnSigterm::Auto, None) => true,
        (OnSigterm::Auto, Some(k)) => {
            let Some(ds) = &a.daemonset else {
                anyhow::bail!(
                    "no DaemonSet name (DAEMONSET_NAME or --daemonset): cannot tell a deletion from a replacement; \
                     nri-shim stays installed"
                );
            };
            match k.daemonset(ds) {
                Ok(DaemonSetState::Present) => {
                    println!(
                        "nri-shim-installer: DaemonSet {}/{ds} still exists: this pod is being replaced, nri-shim stays installed",
                        k.namespace
                    );
                    false
                }
                Ok(DaemonSetState::Deleted) => {
                    println!(
                        "nri-shim-installer: DaemonSet {}/{ds} was deleted: uninstalling",
                        k.namespace
                    );
                    true
                }
                Ok(DaemonSetState::Forbidden) => {
                    println!(
                        "nri-shim-installer: the API refuses to show DaemonSet {}/{ds} (its RBAC is being deleted with it): uninstalling",
                        k.namespace
                    );
                    true
                }
                Err(e) => {
                    anyhow::bail!("cannot tell whether DaemonSet {ds} was deleted: {e}; nri-shim stays installed")
                }
            }
        }
    };
    if uninstall {
        install::uninstall(&s, client.as_ref())?;
        println!("nri-shim-installer: uninstalled");
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Cmd::Install(a) => run_install(a),
        Cmd::Ready { ready_file } => {
            if ready_file.exists() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "not installed yet ({} is missing)",
                    ready_file.display()
                ))
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nri-shim-installer: {e:#}");
            ExitCode::FAILURE
        }
    }
}
