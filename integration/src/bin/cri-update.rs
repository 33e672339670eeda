//! `cri-update`: sends one CRI `UpdateContainerResources` to containerd, as
//! kubelet does for an in-place pod resize, so an operator or plugin author
//! can make the runtime send NRI's UpdateContainer by hand (`ctr` has no
//! command that reaches a runtime's Update).
//!
//! ```text
//! cri-update --address /run/containerd/containerd.sock --memory 268435456 --cpu-shares 512 CONTAINER_ID
//! ```
//!
//! Only the resources given are set; CRI sends 0 for the others, which
//! containerd and the runtime read as "leave as is". Exit status 0 when
//! containerd accepted the update, 1 with its error otherwise.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Parser;
use k8s_cri::v1::{
    LinuxContainerResources, UpdateContainerResourcesRequest, runtime_service_client::RuntimeServiceClient,
};

#[derive(Parser)]
#[command(about = "Send one CRI UpdateContainerResources to containerd (what kubelet sends on an in-place resize)")]
struct Args {
    /// containerd's socket (its CRI service is on the same socket).
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    address: PathBuf,
    /// Memory limit in bytes.
    #[arg(long, default_value_t = 0)]
    memory: i64,
    /// CPU shares (cgroup v1 `cpu.shares`; a weight on cgroup v2).
    #[arg(long, default_value_t = 0)]
    cpu_shares: i64,
    /// CPU CFS quota in microseconds per period.
    #[arg(long, default_value_t = 0)]
    cpu_quota: i64,
    /// CPU CFS period in microseconds.
    #[arg(long, default_value_t = 0)]
    cpu_period: i64,
    /// CPUs the container may run on, in the kernel's list form (`0-1,3`).
    #[arg(long, default_value = "")]
    cpuset_cpus: String,
    /// The CRI container id (`crictl ps`, or the task id containerd shows).
    container_id: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let channel = integration::cri::channel(args.address.clone(), Duration::from_secs(30))
        .await
        .with_context(|| format!("connect to {}", args.address.display()))?;
    RuntimeServiceClient::new(channel)
        .update_container_resources(UpdateContainerResourcesRequest {
            container_id: args.container_id.clone(),
            linux: Some(LinuxContainerResources {
                memory_limit_in_bytes: args.memory,
                cpu_shares: args.cpu_shares,
                cpu_quota: args.cpu_quota,
                cpu_period: args.cpu_period,
                cpuset_cpus: args.cpuset_cpus,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "UpdateContainerResources {}: {}: {}",
                args.container_id,
                s.code(),
                s.message()
            )
        })?;
    Ok(())
}
