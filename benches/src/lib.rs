//! Shared workload of the benchmarks: the CreateContainer request and the
//! per-slot plugin responses of the `merge` benchmark (chosen to compare
//! with the Go reference measured on the same machine kind), and a plugin
//! that returns them, usable in-process (builtin) and as a process.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use nri_adaptation::{Adaptation, RuntimeState, api};
use nri_stub::{BoxError, EventMask, Plugin};
use protobuf::MessageField;

/// A fresh CreateContainerRequest: a pod with labels and annotations; a
/// container with 2 env, 2 mounts, 5 namespaces, memory and cpu resources.
pub fn bench_request() -> api::CreateContainerRequest {
    let mut pod = api::PodSandbox {
        id: "pod-0123456789".into(),
        name: "bench-pod".into(),
        uid: "0f0e0d0c-0b0a-0908-0706-050403020100".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    pod.labels.insert("app".into(), "bench".into());
    pod.labels.insert("tier".into(), "backend".into());
    pod.annotations.insert("bench.nri.io/pod".into(), "yes".into());
    pod.annotations
        .insert("kubernetes.io/config.source".into(), "api".into());
    let mut c = api::Container {
        id: "ctr-0123456789".into(),
        pod_sandbox_id: pod.id.clone(),
        name: "app".into(),
        args: vec!["/bin/app".into(), "--serve".into()],
        env: vec!["PATH=/usr/bin:/bin".into(), "HOME=/root".into()],
        ..Default::default()
    };
    for (dst, src) in [("/etc/hosts", "/var/lib/pod/hosts"), ("/data", "/srv/data")] {
        c.mounts.push(api::Mount {
            destination: dst.into(),
            source: src.into(),
            type_: "bind".into(),
            options: vec!["rbind".into(), "rw".into()],
            ..Default::default()
        });
    }
    let linux = c.linux.mut_or_insert_default();
    for ns in ["pid", "ipc", "uts", "mount", "network"] {
        linux.namespaces.push(api::LinuxNamespace {
            type_: ns.into(),
            ..Default::default()
        });
    }
    container_resources(linux.resources.mut_or_insert_default(), 100_000, None);
    api::CreateContainerRequest {
        pod: MessageField::some(pod),
        container: MessageField::some(c),
        ..Default::default()
    }
}

/// A Kubernetes container's resources: 512 MiB memory limit, 512 CPU
/// shares, `quota` µs per `period` µs (the period left unset with `None`).
pub fn container_resources(res: &mut api::LinuxResources, quota: i64, period: Option<u64>) {
    res.memory.mut_or_insert_default().limit = MessageField::some(api::OptionalInt64 {
        value: 512 << 20,
        ..Default::default()
    });
    let cpu = res.cpu.mut_or_insert_default();
    cpu.shares = MessageField::some(api::OptionalUInt64 {
        value: 512,
        ..Default::default()
    });
    cpu.quota = MessageField::some(api::OptionalInt64 {
        value: quota,
        ..Default::default()
    });
    if let Some(period) = period {
        cpu.period = MessageField::some(api::OptionalUInt64 {
            value: period,
            ..Default::default()
        });
    }
}

fn i64v(value: i64) -> MessageField<api::OptionalInt64> {
    MessageField::some(api::OptionalInt64 {
        value,
        ..Default::default()
    })
}

fn u64v(value: u64) -> MessageField<api::OptionalUInt64> {
    MessageField::some(api::OptionalUInt64 {
        value,
        ..Default::default()
    })
}

fn boolv(value: bool) -> MessageField<api::OptionalBool> {
    MessageField::some(api::OptionalBool {
        value,
        ..Default::default()
    })
}

/// What plugin slot `i` (0..8) returns: env `BENCH_P<i>_A/B/C`, annotation
/// `bench.nri.io/plugin-<i>`, a read-only bind mount `/mnt/bench-<i>`, and
/// one cpu and one memory (or pids/hugepage) field per slot.
pub fn slot_response(i: usize) -> api::CreateContainerResponse {
    let mut a = api::ContainerAdjustment::new();
    for s in ["A", "B", "C"] {
        a.env.push(api::KeyValue {
            key: format!("BENCH_P{i}_{s}"),
            value: format!("value-{i}-{s}"),
            ..Default::default()
        });
    }
    a.annotations.insert(format!("bench.nri.io/plugin-{i}"), "set".into());
    a.mounts.push(api::Mount {
        destination: format!("/mnt/bench-{i}"),
        source: format!("/var/lib/bench/{i}"),
        type_: "bind".into(),
        options: vec!["rbind".into(), "ro".into()],
        ..Default::default()
    });
    let res = a.linux.mut_or_insert_default().resources.mut_or_insert_default();
    let cpu = res.cpu.mut_or_insert_default();
    match i % 8 {
        0 => cpu.shares = u64v(1024),
        1 => cpu.quota = i64v(50_000),
        2 => cpu.period = u64v(100_000),
        3 => cpu.cpus = "0-1".into(),
        4 => cpu.mems = "0".into(),
        5 => cpu.realtime_runtime = i64v(1000),
        6 => cpu.realtime_period = u64v(1_000_000),
        _ => {
            res.unified.insert("cpu.idle".into(), "0".into());
        }
    }
    let mem = res.memory.mut_or_insert_default();
    match i % 8 {
        0 => mem.limit = i64v(256 << 20),
        1 => mem.reservation = i64v(128 << 20),
        2 => mem.swap = i64v(512 << 20),
        3 => mem.swappiness = u64v(10),
        4 => mem.disable_oom_killer = boolv(true),
        5 => mem.use_hierarchy = boolv(true),
        6 => {
            res.pids = MessageField::some(api::LinuxPids {
                limit: 1024,
                ..Default::default()
            })
        }
        _ => res.hugepage_limits.push(api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 64 << 20,
            ..Default::default()
        }),
    }
    api::CreateContainerResponse {
        adjust: MessageField::some(a),
        ..Default::default()
    }
}

/// Answers CreateContainer with nothing or a slot's response (built once,
/// so the benchmark measures the runtime side, not response construction).
pub struct BenchPlugin {
    response: api::CreateContainerResponse,
}

impl BenchPlugin {
    /// A plugin answering with `slot`'s response, or an empty one.
    pub fn new(slot: Option<usize>) -> Self {
        BenchPlugin {
            response: slot.map(slot_response).unwrap_or_default(),
        }
    }
}

#[nri_stub::async_trait]
impl Plugin for BenchPlugin {
    async fn create_container(
        &self,
        _pod: &api::PodSandbox,
        _container: &api::Container,
    ) -> Result<api::CreateContainerResponse, BoxError> {
        Ok(self.response.clone())
    }
}

/// An adaptation with no state, on a socket in `dir`.
pub fn adaptation(dir: &Path, builtins: &[Option<usize>]) -> Adaptation {
    let mut b = Adaptation::builder("nri-bench", "0")
        .with_sync_fn(|| async { Ok(RuntimeState::default()) })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_socket_path(dir.join("nri.sock"))
        .with_plugin_path(dir.join("no-plugins"));
    for (i, slot) in builtins.iter().enumerate() {
        b = b.with_builtin_plugin(
            format!("{:02}", 10 + i),
            format!("bench{i}"),
            EventMask::parse("CreateContainer").expect("mask"),
            Arc::new(BenchPlugin::new(*slot)),
        );
    }
    b.build().expect("adaptation")
}

/// Plugin processes, killed on drop.
pub struct Procs(pub Vec<Child>);

impl Procs {
    /// Their process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `nri-bench-plugin` (at `bin`) once per slot and waits until all
/// registered with `nri`.
pub async fn spawn_plugins(bin: &Path, nri: &Adaptation, sock: &Path, slots: &[Option<usize>]) -> Procs {
    let mut procs = Procs(Vec::new());
    for (i, slot) in slots.iter().enumerate() {
        let mut cmd = Command::new(bin);
        cmd.arg("--socket")
            .arg(sock)
            .args(["--idx", &format!("{:02}", 10 + i), "--name", &format!("bench{i}")])
            .stdin(Stdio::null());
        if let Some(s) = slot {
            cmd.args(["--slot", &s.to_string()]);
        }
        procs.0.push(cmd.spawn().expect("spawn nri-bench-plugin"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while nri.plugin_names().len() < slots.len() {
        assert!(
            Instant::now() < deadline,
            "bench plugins did not register: {:?}",
            nri.plugin_names()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    procs
}

/// The echo side of the `dispatch/floor` benchmark: reads 4-byte big-endian
/// length-prefixed messages from the unix socket at `path` and answers each
/// with an empty message (length 0).
///
/// # Errors
/// Connecting, reading or writing failed (EOF ends it with `Ok`).
pub async fn echo(path: &str) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(path).await?;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        match s.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        buf.resize(u32::from_be_bytes(len) as usize, 0);
        s.read_exact(&mut buf).await?;
        s.write_all(&0u32.to_be_bytes()).await?;
    }
}

/// What both socket benchmarks need: a current-thread runtime (as the shim
/// daemon uses: on these 2-core machines it halves the round trip of a
/// multi-thread runtime) and the path of `nri-bench-plugin`.
///
/// # Panics
/// When the plugin binary was not built.
pub fn bench_setup() -> (tokio::runtime::Runtime, PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let bin = sibling_bin("nri-bench-plugin");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p nri-benches",
        bin.display()
    );
    (rt, bin)
}

/// The nri-shim binary an end-to-end bench measures: `$NRI_SHIM_BIN`, or
/// the `dist` build (the node artifact) of this target directory.
///
/// # Panics
/// When neither exists, naming the command that builds it.
pub fn shim_under_test(script: &str) -> PathBuf {
    if let Some(p) = std::env::var_os("NRI_SHIM_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<bench> -> target/dist/
    let target = exe.ancestors().nth(3).expect("target dir");
    let p = target.join("dist/containerd-shim-nri-shim-v2");
    assert!(
        p.exists(),
        "{} is missing: run {script}, or `cargo build --profile dist -p nri-shim` first \
         (or set NRI_SHIM_BIN)",
        p.display()
    );
    p
}

/// Path of a binary of this package next to the running bench executable.
pub fn sibling_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nri_adaptation::CreateResult;

    #[test]
    fn eight_slots_merge_without_conflict() {
        let mut r = CreateResult::new(bench_request());
        for i in 0..8 {
            r.apply(&format!("{:02}-p", 10 + i), slot_response(i)).unwrap();
        }
        let rsp = r.into_response();
        let a = rsp.adjust.get_or_default();
        assert_eq!(a.env.len(), 24);
        assert_eq!(a.mounts.len(), 8);
        assert_eq!(a.annotations.len(), 8);
        let res = a.linux.resources.get_or_default();
        assert_eq!(res.cpu.cpus, "0-1");
        assert_eq!(res.memory.limit.value, 256 << 20);
        assert_eq!(res.pids.limit, 1024);
        assert_eq!(res.hugepage_limits.len(), 1);
    }
}
