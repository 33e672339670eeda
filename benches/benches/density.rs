//! Pod density under containerd's CRI, runc against nri-shim on one
//! containerd (the CRI lane's harness, `integration::cri`): N pods (50 and
//! 100, or `NRI_DENSITY_N=a,b`) with one `sleep` container each, created
//! sequentially and 10 at a time (`NRI_DENSITY_CONCURRENCY`). For each
//! handler and mode it prints the wall time until all N containers are
//! RUNNING (from the first RunPodSandbox), the median and slowest
//! RunPodSandbox, CreateContainer and StartContainer, the process count
//! and the summed RSS and PSS of the handler's shim processes while the N pods run (runc: one
//! `containerd-shim-runc-v2` per pod; nri-shim: its daemon and helpers),
//! their container processes (pause and `sleep`) counted apart, and the
//! teardown time (StopPodSandbox and RemovePodSandbox of every pod, in the
//! same mode) with the median and slowest of each of those two calls.
//!
//! containerd's state, runc's root and the shim's state root are on a
//! tmpfs of the run's own, as `/run` is on a node (on this project's VMs
//! `/run` is on the disk, where every file a runtime creates costs an
//! inode allocation); `NRI_DENSITY_RUN_ON_DISK=1` keeps them in the temp
//! directory on the disk instead.
//!
//! The nri-shim binary is `$NRI_SHIM_BIN`, or the `dist` build (the node
//! artifact) in this target directory: `benches/density.sh` builds it and
//! runs this. Root only; containerd is the line `NRI_CONTAINERD` names
//! (1.6, the system's, when unset). Everything the run creates (pods,
//! cgroups, network namespaces, the bridge, the temp dir) is removed at
//! the end, also when it fails.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::{Duration, Instant},
};

use integration::{
    containerd::containerd_cmd,
    cri::{Client, Cri, CriSetup, HANDLERS, api, container},
};
use tokio::task::JoinSet;

/// Pods created (and removed) at the same time in the concurrent mode
/// (`NRI_DENSITY_CONCURRENCY`, default 10).
fn concurrency() -> usize {
    std::env::var("NRI_DENSITY_CONCURRENCY")
        .ok()
        .map(|s| s.parse().expect("NRI_DENSITY_CONCURRENCY: a number of pods"))
        .unwrap_or(10)
}
/// How long one pod may take to run its container.
const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// One process of `/proc`.
struct Proc {
    ppid: i32,
    cmdline: String,
    exe: String,
    rss_kib: u64,
    pss_kib: u64,
}

/// Every process now, by pid.
fn processes() -> HashMap<i32, Proc> {
    let mut all = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let dir = e.path();
        // The ppid is the second field after the command name, which may hold spaces.
        let Some(ppid) = std::fs::read_to_string(dir.join("stat")).ok().and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok())
        }) else {
            continue;
        };
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(dir.join("cmdline")).unwrap_or_default()).replace('\0', " ");
        let exe = std::fs::read_link(dir.join("exe"))
            .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
            .unwrap_or_default();
        let rollup = std::fs::read_to_string(dir.join("smaps_rollup")).unwrap_or_default();
        let kib = |key: &str| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
                .unwrap_or(0)
        };
        all.insert(
            pid,
            Proc {
                ppid,
                cmdline,
                exe,
                rss_kib: kib("Rss:"),
                pss_kib: kib("Pss:"),
            },
        );
    }
    all
}

/// The file name of a CRI handler's shim binary, as `/proc/PID/exe` gives
/// it: for nri-shim that of the binary under test, which `NRI_SHIM_BIN`
/// may name otherwise (containerd runs it through a link).
fn shim_name(handler: &str) -> String {
    match handler {
        "runc" => "containerd-shim-runc-v2".into(),
        _ => {
            let shim = nri_benches::shim_under_test("benches/density.sh");
            let real = std::fs::canonicalize(&shim).unwrap_or(shim);
            real.file_name().unwrap_or_default().to_string_lossy().into_owned()
        }
    }
}

/// What a handler's shims cost now.
#[derive(Default)]
struct Footprint {
    shims: usize,
    rss_kib: u64,
    pss_kib: u64,
    containers: usize,
}

/// The shim processes of `handler` serving containerd at `sock` (started
/// with `-address <sock>`, and their descendants running the same binary)
/// and, apart, the other processes below them: the containers'.
fn footprint(handler: &str, sock: &Path) -> Footprint {
    let all = processes();
    let name = shim_name(handler);
    let needle = format!("-address {}", sock.display());
    let mut tree: HashSet<i32> = all
        .iter()
        .filter(|(_, p)| p.exe == name && p.cmdline.contains(&needle))
        .map(|(pid, _)| *pid)
        .collect();
    // Descendants, to a fixed point (a process tree is shallow).
    loop {
        let more: Vec<i32> = all
            .iter()
            .filter(|(pid, p)| !tree.contains(pid) && tree.contains(&p.ppid))
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            break;
        }
        tree.extend(more);
    }
    let mut f = Footprint::default();
    for pid in &tree {
        let p = &all[pid];
        if p.exe == name {
            f.shims += 1;
            f.rss_kib += p.rss_kib;
            f.pss_kib += p.pss_kib;
        } else {
            f.containers += 1;
        }
    }
    f
}

/// Runs `jobs` (each made by `job(i)`) one at a time or `CONCURRENCY` at a
/// time; returns the wall time until all are done.
async fn run_all<F, Fut>(n: usize, concurrent: bool, job: F) -> Duration
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let width = if concurrent { concurrency() } else { 1 };
    let t = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..n {
        if set.len() == width {
            set.join_next().await.unwrap().expect("job");
        }
        set.spawn(job(i));
    }
    while let Some(r) = set.join_next().await {
        r.expect("job");
    }
    t.elapsed()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// N pods of `handler`, created, measured and removed; prints the figures.
async fn density(cri: &Cri, handler: &'static str, n: usize, concurrent: bool) {
    let mode = if concurrent {
        format!("{} at a time", concurrency())
    } else {
        "sequential".to_string()
    };
    let tag = if concurrent {
        format!("c{}", concurrency())
    } else {
        "seq".to_string()
    };
    let label = format!("N={n:<3} {mode:<12} {handler:<8}");
    let client = cri.client().await;
    let cfgs: Vec<api::PodSandboxConfig> = (0..n)
        .map(|i| cri.pod_config(&format!("density-{tag}-{n}-{i}"), "density", handler, |_| {}))
        .collect();
    let ids = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // Each pod's RunPodSandbox, CreateContainer and StartContainer.
    let start_calls = std::sync::Arc::new(std::sync::Mutex::new([Vec::new(), Vec::new(), Vec::new()]));
    let took = run_all(n, concurrent, |i| {
        let (mut c, cfg, ids, calls) = (client.clone(), cfgs[i].clone(), ids.clone(), start_calls.clone());
        async move {
            let t = Instant::now();
            let pod = c.run_pod(&cfg, handler).await;
            let ran = t.elapsed();
            let t = Instant::now();
            let id = c.create(&pod, &cfg, container("c", &["sleep", "100000"])).await;
            let created = t.elapsed();
            let t = Instant::now();
            c.start(&id).await;
            let started = t.elapsed();
            c.wait_state(&id, api::ContainerState::ContainerRunning, POD_TIMEOUT)
                .await;
            let mut calls = calls.lock().unwrap();
            calls[0].push(ran);
            calls[1].push(created);
            calls[2].push(started);
            ids.lock().unwrap().push(pod);
        }
    })
    .await;
    println!(
        "{label} all {n} containers running  {:8.2} s  ({:.0} ms/pod)",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / n as f64
    );
    let start_calls = std::mem::take(&mut *start_calls.lock().unwrap());
    for (name, d) in ["RunPodSandbox", "CreateContainer", "StartContainer"]
        .into_iter()
        .zip(start_calls)
    {
        print_call(&label, name, d);
    }
    let f = footprint(handler, &cri.sock);
    println!(
        "{label} shim processes            {:8}    RSS {:7.1} MiB  PSS {:7.1} MiB  ({:.2} MiB RSS/pod)",
        f.shims,
        mib(f.rss_kib),
        mib(f.pss_kib),
        mib(f.rss_kib) / n as f64
    );
    println!("{label} container processes       {:8}", f.containers);
    let ids: Vec<String> = std::mem::take(&mut *ids.lock().unwrap());
    // Each pod's StopPodSandbox and RemovePodSandbox, timed apart.
    let calls = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    let took = run_all(ids.len(), concurrent, |i| {
        let (mut c, pod, calls) = (client.clone(), ids[i].clone(), calls.clone());
        async move {
            let (stop, remove) = c.remove_pod_timed(&pod).await;
            let mut calls = calls.lock().unwrap();
            calls.0.push(stop);
            calls.1.push(remove);
        }
    })
    .await;
    println!(
        "{label} teardown (stop+remove)    {:8.2} s  ({:.0} ms/pod)",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / n as f64
    );
    let (stop, remove) = std::mem::take(&mut *calls.lock().unwrap());
    print_call(&label, "StopPodSandbox", stop);
    print_call(&label, "RemovePodSandbox", remove);
    let left = client
        .clone()
        .rt
        .list_pod_sandbox(api::ListPodSandboxRequest::default())
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    assert!(left.is_empty(), "{label}: pods left after the teardown: {left:?}");
}

/// Prints the median and slowest of one CRI call's durations.
fn print_call(label: &str, name: &str, mut d: Vec<Duration>) {
    d.sort();
    println!(
        "{label} {name:<25} median {:.3} s, slowest {:.3} s",
        d[d.len() / 2].as_secs_f64(),
        d.last().unwrap().as_secs_f64()
    );
}

/// A warm-up pod (page cache, the nri-shim daemon up), removed.
///
/// Its container runs until the pod is stopped, as the measured pods'
/// do. One that exits at once races containerd 1.6's own exit handling:
/// the CRI plugin deletes the exited task (closing its shim connection)
/// before it marks the container exited, and a StopPodSandbox between
/// the two still sends that task a Kill, which fails with `ttrpc:
/// closed` (seen once in about 16 runs).
async fn warm_up(cri: &Cri, mut c: Client, handler: &'static str) {
    let cfg = cri.pod_config("density-warm-up", "density", handler, |_| {});
    let pod = c.run_pod(&cfg, handler).await;
    c.create_running(&pod, &cfg, container("c", &["sleep", "100000"]), POD_TIMEOUT)
        .await;
    c.remove_pod(&pod).await;
}

fn main() {
    let sizes: Vec<usize> = std::env::var("NRI_DENSITY_N")
        .unwrap_or_else(|_| "50,100".into())
        .split(',')
        .map(|s| s.trim().parse().expect("NRI_DENSITY_N: comma-separated pod counts"))
        .collect();
    let shim = nri_benches::shim_under_test("benches/density.sh");
    let version = containerd_cmd("containerd")
        .arg("--version")
        .output()
        .expect("containerd --version");
    println!(
        "density: {} ; nri-shim {}",
        String::from_utf8_lossy(&version.stdout).trim(),
        shim.display()
    );
    let started = Instant::now();
    let cri = Cri::start(CriSetup {
        shim_bin: Some(shim),
        run_on_tmpfs: std::env::var_os("NRI_DENSITY_RUN_ON_DISK").is_none(),
        ..Default::default()
    });
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(async {
            let c = cri.client().await;
            for h in HANDLERS {
                warm_up(&cri, c.clone(), h).await;
            }
            for &n in &sizes {
                for concurrent in [false, true] {
                    for h in HANDLERS {
                        density(&cri, h, n, concurrent).await;
                    }
                }
            }
        });
    cri.teardown();
    left_behind(&cri);
    println!("density: whole run {:.0} s", started.elapsed().as_secs_f64());
}

/// Fails if the teardown left the run's bridge, cgroups or temp dir.
fn left_behind(cri: &Cri) {
    let bridge = std::process::Command::new("ip")
        .args(["link", "show", &cri.bridge])
        .output()
        .expect("ip link show");
    assert!(!bridge.status.success(), "bridge {} left after the run", cri.bridge);
    for ctl in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let dir = ctl.path().join(cri.cgroup_root.trim_start_matches('/'));
        assert!(!dir.exists(), "cgroup {} left after the run", dir.display());
    }
    assert!(!cri.dir.exists(), "{} left after the run", cri.dir.display());
}
