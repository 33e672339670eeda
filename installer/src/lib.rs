//! `nri-shim-installer`: installs nri-shim on a Kubernetes node from a
//! DaemonSet pod, and takes it off again when the DaemonSet is deleted.
//!
//! On start ([`install::install`]) it copies the shim binary from its image
//! to the node (`/usr/local/bin/containerd-shim-nri-shim-v2`, renamed over
//! the old one), runs the shim's own `configure containerd --root <host
//! root>`, restarts containerd only when that changed its config (systemd
//! where a unit runs containerd, else SIGTERM to the containerd serving the
//! socket, which its supervisor starts again), waits until containerd
//! answers CRI `Status` with `RuntimeReady`, upgrades in place (`upgrade`)
//! any nri-shim daemon still running a binary replaced under it, and labels
//! its node, the label the RuntimeClass schedules on. Then it waits.
//!
//! On SIGTERM it asks the API server whether its DaemonSet still exists: if
//! so the pod is only being replaced (an image update rolls the new binary
//! in through the next pod's in-place upgrade, never a drain) and
//! everything stays. If the DaemonSet is gone ([`install::uninstall`]) it
//! removes the label, runs `unconfigure containerd`, restarts containerd
//! when that changed its config, and removes the binary once no nri-shim
//! daemon runs it; a daemon still serving containers keeps it, and the
//! installer says so.
//!
//! The installer is its own binary so that the shim, the node's artifact,
//! carries no HTTP or TLS code.

pub mod containerd;
pub mod install;
pub mod kube;
pub mod node;
