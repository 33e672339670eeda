//! Latency on a large node: 250 pods and 1,000 containers known to the
//! runtime (each container with the env, mounts, labels and annotations a
//! Kubernetes container carries, so the Synchronize request exceeds the
//! 4 MiB ttrpc limit and is split).
//!
//! * `sync`: a newly connected `nri-bench-plugin` process, until it is
//!   synchronized. Per join it prints the Synchronize request as the
//!   adaptation's observer times it (from the first message sent to the
//!   last reply: splitting, encoding, the plugin decoding every message),
//!   and the whole join from the plugin's start to its being active (its
//!   process start, connect, RegisterPlugin, Configure, the sync callback
//!   and Synchronize).
//! * `create`: first one `nri-bench-plugin` process, creates one at a
//!   time (the plugin round trip); then 8 processes (each answering with
//!   its slot's adjustment, as in `merge`), under each plugin view
//!   (`adjusted`: each after the ones before it; `original`: side by
//!   side): creates one at a time, and rounds of 50 concurrent
//!   CreateContainer, the latency of each from its submission (p50, p99,
//!   max). For the creates one at a time it also prints the CPU time a
//!   create costs the runtime (this process) and the plugin processes
//!   together, and how many times they were put on a CPU: what bounds the
//!   latency when the plugins outnumber the cores.
//! * `floor`: the same shapes of calls to echo processes, with no NRI
//!   code (see [`floor`]).
//!
//! A current-thread runtime, as the shim daemon uses. Run with
//! `cargo build --release -p nri-benches && ./target/release/nri-large-node`
//! (`NRI_LARGE_ROUNDS` sets the number of sync joins and create rounds,
//! default 20; `NRI_LARGE_ONLY=create` skips the joins); it uses the `nri-bench-plugin` built next to it, which
//! `cargo run --bin nri-large-node` alone does not build.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nri_adaptation::{Adaptation, Observer, Outcome, PluginView, Rejection, RuntimeState, api};
use nri_benches::{Procs, bench_request, container_resources, spawn_plugins};
use protobuf::{Message, MessageField};

const PODS: usize = 250;
const CONTAINERS: usize = 1000;
const PLUGINS: usize = 8;
const CONCURRENT: usize = 50;

/// Records how long each plugin's Synchronize took.
#[derive(Default)]
struct SyncTimes(Mutex<Vec<(String, Duration)>>);

impl Observer for SyncTimes {
    fn request(&self, plugin: &str, request: &'static str, elapsed: Duration, outcome: Outcome) {
        if request == "Synchronize" && outcome == Outcome::Ok {
            self.0.lock().unwrap().push((plugin.to_string(), elapsed));
        }
    }
    fn rejected(&self, _plugin: &str, _rejection: Rejection) {}
}

fn pod(i: usize) -> api::PodSandbox {
    let mut p = api::PodSandbox {
        id: format!("{:064x}", 0xa000_0000u64 + i as u64),
        name: format!("workload-{i}-7d9c8b6f5d-x2k4p"),
        uid: format!("6f1e2d3c-4b5a-6978-8a9b-{i:012}"),
        namespace: format!("team-{}", i % 20),
        pid: 10_000 + i as u32,
        ..Default::default()
    };
    for (k, v) in [
        ("app.kubernetes.io/name", "workload"),
        ("app.kubernetes.io/instance", "workload-prod"),
        ("pod-template-hash", "7d9c8b6f5d"),
        ("tier", "backend"),
    ] {
        p.labels.insert(k.into(), v.into());
    }
    for (k, v) in [
        ("kubernetes.io/config.seen", "2026-12-02T10:00:00.000000000Z"),
        ("kubernetes.io/config.source", "api"),
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9090"),
    ] {
        p.annotations.insert(k.into(), v.into());
    }
    p.linux.mut_or_insert_default().cgroups_path = format!("/kubepods/burstable/pod6f1e2d3c-4b5a-6978-8a9b-{i:012}");
    p
}

/// A container of pod `pod`: 60 env entries (the service variables
/// Kubernetes injects for a namespace's services), 8 mounts, labels,
/// annotations, namespaces and resources; about 5 KB encoded.
fn container(i: usize, pod: &api::PodSandbox) -> api::Container {
    let mut c = api::Container {
        id: format!("{:064x}", 0xc000_0000u64 + i as u64),
        pod_sandbox_id: pod.id.clone(),
        name: format!("app-{}", i % 4),
        state: api::ContainerState::CONTAINER_RUNNING.into(),
        args: vec![
            "/usr/bin/app".into(),
            "--config=/etc/app/config.yaml".into(),
            "--port=8080".into(),
        ],
        pid: 20_000 + i as u32,
        ..Default::default()
    };
    c.env
        .push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    for s in 0..15 {
        let svc = format!("SERVICE_{s}_OF_THE_NAMESPACE");
        c.env.push(format!("{svc}_SERVICE_HOST=10.96.{s}.{}", i % 250));
        c.env.push(format!("{svc}_SERVICE_PORT=8080"));
        c.env.push(format!("{svc}_PORT=tcp://10.96.{s}.{}:8080", i % 250));
        c.env.push(format!("{svc}_PORT_8080_TCP_PROTO=tcp"));
    }
    for (dst, src) in [
        ("/etc/hosts", "/var/lib/kubelet/pods/{}/etc-hosts"),
        (
            "/dev/termination-log",
            "/var/lib/kubelet/pods/{}/containers/app/termination-log",
        ),
        ("/etc/hostname", "/var/lib/containerd/sandboxes/{}/hostname"),
        ("/etc/resolv.conf", "/var/lib/containerd/sandboxes/{}/resolv.conf"),
        ("/dev/shm", "/run/containerd/sandboxes/{}/shm"),
        (
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "/var/lib/kubelet/pods/{}/volumes/token",
        ),
        ("/etc/app", "/var/lib/kubelet/pods/{}/volumes/config"),
        ("/data", "/var/lib/kubelet/pods/{}/volumes/data"),
    ] {
        c.mounts.push(api::Mount {
            destination: dst.into(),
            source: src.replace("{}", &pod.uid),
            type_: "bind".into(),
            options: vec!["rbind".into(), "rprivate".into(), "rw".into()],
            ..Default::default()
        });
    }
    c.labels = pod.labels.clone();
    for (k, v) in [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.container-name", "app"),
        ("io.kubernetes.cri.image-name", "registry.example.com/team/app:v1.2.3"),
        ("io.kubernetes.cri.sandbox-id", pod.id.as_str()),
        ("io.kubernetes.cri.sandbox-name", pod.name.as_str()),
        ("io.kubernetes.cri.sandbox-namespace", pod.namespace.as_str()),
        ("io.kubernetes.cri.sandbox-uid", pod.uid.as_str()),
    ] {
        c.annotations.insert(k.into(), v.into());
    }
    let linux = c.linux.mut_or_insert_default();
    for ns in ["pid", "ipc", "uts", "mount", "network", "cgroup"] {
        linux.namespaces.push(api::LinuxNamespace {
            type_: ns.into(),
            path: if ns == "network" {
                format!("/var/run/netns/cni-{}", pod.uid)
            } else {
                String::new()
            },
            ..Default::default()
        });
    }
    linux.cgroups_path = format!("{}/{}", pod.linux.cgroups_path, c.id);
    container_resources(linux.resources.mut_or_insert_default(), 50_000, Some(100_000));
    c
}

fn state() -> RuntimeState {
    let pods: Vec<_> = (0..PODS).map(pod).collect();
    let containers = (0..CONTAINERS).map(|i| container(i, &pods[i % PODS])).collect();
    RuntimeState { pods, containers }
}

/// p-th percentile (0..=100) of sorted `v`, nearest rank.
fn pct(v: &[Duration], p: usize) -> Duration {
    let rank = (p * v.len()).div_ceil(100).max(1);
    v[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn adaptation(dir: &Path, observer: Arc<SyncTimes>) -> Adaptation {
    let known = Arc::new(state());
    Adaptation::builder("nri-bench", "0")
        .with_sync_fn(move || {
            let s = known.clone();
            async move {
                Ok(RuntimeState {
                    pods: s.pods.clone(),
                    containers: s.containers.clone(),
                })
            }
        })
        .with_update_fn(|_| async { Ok(Vec::new()) })
        .with_socket_path(dir.join("nri.sock"))
        .with_plugin_path(dir.join("no-plugins"))
        .with_observer(observer)
        .build()
        .expect("adaptation")
}

fn rounds() -> usize {
    std::env::var("NRI_LARGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// What a process has used so far, all its threads summed from each
/// thread's `/proc/PID/task/TID/schedstat`: its first field (nanoseconds
/// on a CPU) and its third (how many times the thread was put on a CPU,
/// so about one per wake-up).
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu: Duration,
    runs: u64,
}

fn usage(pid: u32) -> Usage {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Usage::default();
    };
    let mut u = Usage::default();
    for t in tasks.flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        let f: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if let [ns, _, runs] = f[..] {
            u.cpu += Duration::from_nanos(ns);
            u.runs += runs;
        }
    }
    u
}

/// What the runtime (this process) and the processes `pids` have used so
/// far: (runtime, the others).
fn usage_split(pids: &[u32]) -> (Usage, Usage) {
    let others = pids.iter().map(|p| usage(*p)).fold(Usage::default(), |a, b| Usage {
        cpu: a.cpu + b.cpu,
        runs: a.runs + b.runs,
    });
    (usage(std::process::id()), others)
}

/// "cpu per create: NAME1 X us (R runs), NAME2 ..." between two
/// [`usage_split`]s `creates` creates apart.
fn per_create(names: [&str; 2], before: (Usage, Usage), after: (Usage, Usage), creates: usize) -> String {
    let one = |b: Usage, a: Usage| {
        format!(
            "{:.0} us ({:.1} runs)",
            a.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e6 / creates as f64,
            a.runs.saturating_sub(b.runs) as f64 / creates as f64
        )
    };
    format!(
        "cpu per create: {} {}, {} {}",
        names[0],
        one(before.0, after.0),
        names[1],
        one(before.1, after.1)
    )
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe.with_file_name("nri-bench-plugin");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release -p nri-benches",
        bin.display()
    );
    let s = state();
    let whole = api::SynchronizeRequest {
        pods: s.pods.clone(),
        containers: s.containers.clone(),
        ..Default::default()
    };
    let size = whole.compute_size();
    println!(
        "large_node: {PODS} pods, {CONTAINERS} containers; one Synchronize would be {:.2} MiB \
         ({:.1} KB per container), the limit per message is 4 MiB; load average {}",
        size as f64 / (1 << 20) as f64,
        s.containers[0].compute_size() as f64 / 1e3,
        load()
    );
    drop(whole);
    let n = rounds();
    let dir = tempfile::tempdir().unwrap();
    let times = Arc::new(SyncTimes::default());
    let nri = adaptation(dir.path(), times.clone());
    let sock = dir.path().join("nri.sock");
    rt.block_on(nri.start()).unwrap();

    // Sync: one plugin joining at a time (`NRI_LARGE_ONLY=create` skips
    // it, to profile the creates alone).
    let only_creates = std::env::var("NRI_LARGE_ONLY").is_ok_and(|v| v == "create");
    let mut syncs = Vec::new();
    let mut joins = Vec::new();
    for i in 0..if only_creates { 0 } else { n } {
        let name = format!("sync{i}");
        let t0 = Instant::now();
        let mut child = Command::new(&bin)
            .arg("--socket")
            .arg(&sock)
            .args(["--idx", "30", "--name", &name])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn nri-bench-plugin");
        let want = format!("30-{name}");
        rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !nri.plugin_names().contains(&want) {
                assert!(Instant::now() < deadline, "{want} did not join");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        });
        joins.push(t0.elapsed());
        let _ = child.kill();
        let _ = child.wait();
        rt.block_on(async {
            while nri.plugin_names().contains(&want) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let synced = times
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|(p, _)| *p == want)
            .map(|(_, d)| *d);
        syncs.push(synced.expect("Synchronize observed"));
    }
    syncs.sort();
    joins.sort();
    if !only_creates {
        println!(
            "large_node/sync      Synchronize p50 {}  max {}   join (process start to active) p50 {}  max {}   ({n} joins)",
            ms(pct(&syncs, 50)),
            ms(*syncs.last().unwrap()),
            ms(pct(&joins, 50)),
            ms(*joins.last().unwrap()),
        );
    }

    // Creates. The request of create k.
    let request = |k: usize| {
        let mut r = bench_request();
        let p = &s.pods[k % PODS];
        r.pod = MessageField::some(p.clone());
        let c = r.container.mut_or_insert_default();
        c.id = format!("{:064x}", 0xe000_0000u64 + k as u64);
        c.pod_sandbox_id = p.id.clone();
        r
    };
    let mut k = 0;
    // One create at a time: its latency, and the CPU time it costs the
    // runtime and the plugin processes `pids`.
    let single = |k: &mut usize, pids: &[u32]| {
        let mut lat = Vec::new();
        let creates = (5 * n).max(20);
        let before = usage_split(pids);
        for _ in 0..creates {
            *k += 1;
            let r = request(*k);
            let t0 = Instant::now();
            rt.block_on(nri.create_container(r)).unwrap();
            lat.push(t0.elapsed());
        }
        let cpu = per_create(["runtime", "plugins"], before, usage_split(pids), creates);
        lat.sort();
        (lat, cpu)
    };
    // One plugin process: the round trip a create costs at least.
    let one = rt.block_on(spawn_plugins(&bin, &nri, &sock, &[Some(0)]));
    let (rtt, rtt_cpu) = single(&mut k, &one.pids());
    drop(one);
    rt.block_on(async {
        while !nri.plugin_names().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    println!(
        "large_node/create    1 plugin, one at a time: p50 {}  p99 {}   {rtt_cpu}",
        ms(pct(&rtt, 50)),
        ms(pct(&rtt, 99)),
    );
    // 8 plugins, under each view.
    let slots: Vec<Option<usize>> = (0..PLUGINS).map(Some).collect();
    let procs: Procs = rt.block_on(spawn_plugins(&bin, &nri, &sock, &slots));
    for view in [PluginView::Adjusted, PluginView::Original] {
        let mut opts = (*nri.options()).clone();
        opts.default_view = view;
        rt.block_on(nri.reconfigure(opts)).expect("reconfigure");
        let (one_at_a_time, one_cpu) = single(&mut k, &procs.pids());
        let t_all = Instant::now();
        let lat = concurrent_rounds(&rt, n, || {
            k += 1;
            let (nri, r) = (nri.clone(), request(k));
            async move {
                nri.create_container(r).await.unwrap();
            }
        });
        let wall = t_all.elapsed();
        let view_name = format!("{view:?}").to_lowercase();
        println!(
            "large_node/create    {PLUGINS} plugins, view {view_name}: {}   ({} creates, {:.0}/s)",
            shape(&one_at_a_time, &rtt, "plugin", &one_cpu, &lat),
            lat.len(),
            lat.len() as f64 / wall.as_secs_f64(),
        );
    }
    println!("large_node: load average {}", load());
    rt.block_on(nri.stop());
    drop(procs);
    floor(&rt, &bin, n);
}

/// `n` rounds of [`CONCURRENT`] futures made by `call`, each round's run
/// at once: the latency of each from its submission, sorted.
fn concurrent_rounds<F>(rt: &tokio::runtime::Runtime, n: usize, mut call: impl FnMut() -> F) -> Vec<Duration>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut lat = Vec::new();
    for _ in 0..n {
        let calls: Vec<F> = (0..CONCURRENT).map(|_| call()).collect();
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for c in calls {
                set.spawn(async move {
                    let t0 = Instant::now();
                    c.await;
                    t0.elapsed()
                });
            }
            while let Some(d) = set.join_next().await {
                lat.push(d.unwrap());
            }
        });
    }
    lat.sort();
    lat
}

/// The figures of 8 processes: creates one at a time (p50, p99, and the
/// p50 as a multiple of the one-`unit` round trip `rtt`, with `cpu`) and
/// the concurrent rounds `lat` (p50, p99, max). All sorted.
fn shape(one_at_a_time: &[Duration], rtt: &[Duration], unit: &str, cpu: &str, lat: &[Duration]) -> String {
    format!(
        "one at a time p50 {}  p99 {} ({:.1}x the 1-{unit} p50, {cpu})   {CONCURRENT} concurrent: p50 {}  p99 {}  max {}",
        ms(pct(one_at_a_time, 50)),
        ms(pct(one_at_a_time, 99)),
        pct(one_at_a_time, 50).as_secs_f64() / pct(rtt, 50).as_secs_f64(),
        ms(pct(lat, 50)),
        ms(pct(lat, 99)),
        ms(*lat.last().unwrap()),
    )
}

/// One echo process's connection, used by one request at a time (a FIFO
/// lock: requests reach it in the order they asked, as turns do).
type EchoConn = Arc<tokio::sync::Mutex<tokio::net::UnixStream>>;

/// Spawns `count` echo processes (`nri-bench-plugin --echo`) on a socket
/// in `dir`: their connections and the processes.
async fn echoes(bin: &Path, dir: &Path, count: usize) -> (Vec<EchoConn>, Procs) {
    let path = dir.join("echo.sock");
    let l = tokio::net::UnixListener::bind(&path).expect("bind echo socket");
    let mut procs = Procs(Vec::new());
    let mut conns = Vec::new();
    for _ in 0..count {
        let child = Command::new(bin).arg("--echo").arg(&path).stdin(Stdio::null()).spawn();
        procs.0.push(child.expect("spawn nri-bench-plugin --echo"));
        let (c, _) = l.accept().await.expect("echo connects");
        conns.push(Arc::new(tokio::sync::Mutex::new(c)));
    }
    (conns, procs)
}

/// One round trip of `msg` to an echo process, waiting for its turn on
/// the connection first.
async fn echo_once(conn: &EchoConn, msg: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = conn.lock().await;
    c.write_all(msg).await.expect("write to echo");
    let mut len = [0u8; 4];
    c.read_exact(&mut len).await.expect("read from echo");
}

/// A create's plugin calls with no NRI code: `msg` to every echo side by
/// side (the original view) or to each after the one before it answered
/// (the adjusted view).
async fn echo_create(conns: &[EchoConn], msg: &[u8], side_by_side: bool) {
    if side_by_side {
        futures::future::join_all(conns.iter().map(|c| echo_once(c, msg))).await;
    } else {
        for c in conns {
            echo_once(c, msg).await;
        }
    }
}

/// The floor of the `create` figures: the same shapes of calls (one
/// plugin, 8 in turn or side by side, one at a time and rounds of 50
/// concurrent requests, each process serving one request at a time in
/// the order they came) to echo processes that answer each
/// length-prefixed request with an empty message, no ttrpc, protobuf,
/// mux or merge in between. What this machine's process wake-ups and
/// socket calls cost before NRI adds anything; a goal below these
/// figures is below what the machine allows with plugin processes.
fn floor(rt: &tokio::runtime::Runtime, bin: &Path, n: usize) {
    let payload = bench_request().write_to_bytes().expect("encode");
    let mut msg = (payload.len() as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&payload);
    let msg = Arc::new(msg);
    let dir = tempfile::tempdir().unwrap();
    let (one, one_procs) = rt.block_on(echoes(bin, dir.path(), 1));
    let single = |conns: &[EchoConn], pids: &[u32], side_by_side: bool| {
        let creates = (5 * n).max(20);
        let before = usage_split(pids);
        let mut lat = Vec::new();
        for _ in 0..creates {
            let t0 = Instant::now();
            rt.block_on(echo_create(conns, &msg, side_by_side));
            lat.push(t0.elapsed());
        }
        let cpu = per_create(["caller", "echoes"], before, usage_split(pids), creates);
        lat.sort();
        (lat, cpu)
    };
    let (rtt, rtt_cpu) = single(&one, &one_procs.pids(), true);
    println!(
        "large_node/floor     1 echo, one at a time: p50 {}  p99 {}   {rtt_cpu}",
        ms(pct(&rtt, 50)),
        ms(pct(&rtt, 99)),
    );
    drop(one);
    drop(one_procs);
    let dir = tempfile::tempdir().unwrap();
    let (conns, procs) = rt.block_on(echoes(bin, dir.path(), PLUGINS));
    for (name, side_by_side) in [("in turn", false), ("side by side", true)] {
        let (one_at_a_time, cpu) = single(&conns, &procs.pids(), side_by_side);
        let lat = concurrent_rounds(rt, n, || {
            let (conns, msg) = (conns.clone(), msg.clone());
            async move { echo_create(&conns, &msg, side_by_side).await }
        });
        println!(
            "large_node/floor     {PLUGINS} echoes {name}: {}",
            shape(&one_at_a_time, &rtt, "echo", &cpu, &lat)
        );
    }
}
