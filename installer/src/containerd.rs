//! containerd on the node: restarting it (through systemd where a unit
//! runs it, else a SIGTERM its supervisor answers by starting it again),
//! and waiting until its CRI service answers as kubelet would ask it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_cri::v1::{StatusRequest, runtime_service_client::RuntimeServiceClient};
use nix::{sys::signal::Signal, unistd::Pid};
use tonic::transport::{Endpoint, Uri};

use crate::node::{self, Node, NodeError};

/// How containerd is restarted after its config changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// systemd where PID 1 is systemd and a unit's cgroup holds containerd;
    /// else SIGTERM when containerd's parent is a supervisor (not PID 1);
    /// else refused, naming the process.
    Auto,
    /// `systemctl restart <unit>` on the node.
    Systemd,
    /// SIGTERM to the containerd serving the address; its supervisor
    /// starts it again.
    Signal,
    /// Never: the operator restarts containerd.
    None,
}

/// Why containerd could not be restarted or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// No process serves the socket.
    #[error("no containerd process serves {address} (none named containerd holds that listening socket)")]
    NotFound {
        /// containerd's address.
        address: String,
    },
    /// `--restart auto` found neither systemd nor a supervisor.
    #[error(
        "containerd (pid {pid}) serving {address} runs under no systemd unit and its parent is PID 1: nothing would \
         start it again after a SIGTERM; restart it yourself, or pass --restart signal if something does"
    )]
    NoSupervisor {
        /// containerd's pid.
        pid: i32,
        /// Its address.
        address: String,
    },
    /// A command on the node failed.
    #[error("{command} on the node: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and output, or why it did not run.
        message: String,
    },
    /// containerd did not exit after SIGTERM.
    #[error("containerd (pid {pid}) serving {address} still runs {secs} s after SIGTERM")]
    DidNotExit {
        /// Its pid.
        pid: i32,
        /// Its address.
        address: String,
        /// How long was waited.
        secs: u64,
    },
    /// containerd did not answer in time.
    #[error("containerd at {socket} did not answer CRI Status with RuntimeReady within {secs} s: {last}")]
    NotReady {
        /// The socket, as the installer reaches it.
        socket: PathBuf,
        /// How long was waited.
        secs: u64,
        /// The last answer or error.
        last: String,
    },
    /// The node could not be reached.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// What a restart did, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restarted {
    /// `systemctl restart <unit>`.
    Systemd(String),
    /// SIGTERM to the old pid; the new one serves.
    Signal {
        /// The containerd that got SIGTERM.
        old: i32,
    },
    /// Nothing (`--restart none`).
    Skipped,
}

/// Restarts the containerd serving `address` (the path it bound, as the
/// node names it) with `how`; `socket` is that socket as the installer
/// reaches it. Returns once the old process is gone (or systemd's restart
/// returned); [`wait_ready`] waits for the new one.
///
/// # Errors
/// [`ContainerdError`] naming the process, unit or command.
pub fn restart(
    node: &Node,
    address: &str,
    how: Restart,
    unit: Option<&str>,
    timeout: Duration,
) -> Result<Restarted, ContainerdError> {
    if how == Restart::None {
        return Ok(Restarted::Skipped);
    }
    let pid = node::containerd_pid(address).ok_or_else(|| ContainerdError::NotFound {
        address: address.to_string(),
    })?;
    let how_now = match how {
        Restart::Auto => match node::systemd_unit(pid) {
            Some(u) if node::pid1_is_systemd() => Ok(unit.map(str::to_string).unwrap_or(u)),
            _ if node::parent_pid(pid).is_some_and(|pp| pp != 1) => Err(()),
            _ => {
                return Err(ContainerdError::NoSupervisor {
                    pid,
                    address: address.to_string(),
                });
            }
        },
        Restart::Systemd => Ok(unit
            .map(str::to_string)
            .or_else(|| node::systemd_unit(pid))
            .unwrap_or_else(|| "containerd.service".into())),
        Restart::Signal | Restart::None => Err(()),
    };
    match how_now {
        Ok(unit) => {
            let sh = Path::new("/bin/sh");
            let line = format!("systemctl restart {unit}");
            let out = node
                .command(sh)?
                .args(["-c", "exec systemctl restart \"$1\"", "sh", &unit])
                .output()
                .map_err(|e| ContainerdError::Command {
                    command: line.clone(),
                    message: e.to_string(),
                })?;
            if !out.status.success() {
                return Err(ContainerdError::Command {
                    command: line,
                    message: format!(
                        "{}: {}{}",
                        out.status,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    )
                    .trim_end()
                    .to_string(),
                });
            }
            Ok(Restarted::Systemd(unit))
        }
        Err(()) => {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
            let deadline = Instant::now() + timeout;
            // Gone, or a zombie its supervisor has not reaped yet.
            let alive = || {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.rfind(") ").is_some_and(|i| !s[i + 2..].starts_with('Z')))
            };
            while alive() {
                if Instant::now() > deadline {
                    return Err(ContainerdError::DidNotExit {
                        pid,
                        address: address.to_string(),
                        secs: timeout.as_secs(),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(Restarted::Signal { old: pid })
        }
    }
}

/// Waits until containerd at `socket` answers CRI `Status` with the
/// `RuntimeReady` condition true (what kubelet waits for), at most
/// `timeout`.
///
/// # Errors
/// [`ContainerdError::NotReady`] with the last answer or error.
pub fn wait_ready(socket: &Path, timeout: Duration) -> Result<(), ContainerdError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ContainerdError::NotReady {
            socket: socket.to_path_buf(),
            secs: 0,
            last: format!("no async runtime: {e}"),
        })?;
    let deadline = Instant::now() + timeout;
    loop {
        let last = match rt.block_on(status(socket.to_path_buf())) {
            Ok(true) => return Ok(()),
            Ok(false) => "RuntimeReady is false".to_string(),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Err(ContainerdError::NotReady {
                socket: socket.to_path_buf(),
                secs: timeout.as_secs(),
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One CRI `Status` call: whether `RuntimeReady` is true.
async fn status(socket: PathBuf) -> Result<bool, String> {
    let channel = Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let reply = RuntimeServiceClient::new(channel)
        .status(StatusRequest { verbose: false })
        .await
        .map_err(|e| format!("CRI Status: {}", e.message()))?;
    Ok(reply
        .get_ref()
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.r#type == "RuntimeReady" && c.status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nobody_serves_is_named_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("containerd.sock");
        let e = wait_ready(&sock, Duration::from_millis(300)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("containerd.sock") && text.contains("connect"), "{text}");
    }

    #[test]
    fn restarting_a_containerd_that_does_not_run_is_refused_by_name() {
        let node = Node {
            root: "/".into(),
            ns: node::HostNamespace::SelfNs,
        };
        let e = restart(
            &node,
            "/nonexistent/c.sock",
            Restart::Signal,
            None,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/c.sock"), "{e}");
        assert_eq!(
            restart(
                &node,
                "/nonexistent/c.sock",
                Restart::None,
                None,
                Duration::from_secs(1)
            )
            .unwrap(),
            Restarted::Skipped
        );
    }
}
