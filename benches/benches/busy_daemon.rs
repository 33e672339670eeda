//! Is the shim responsive while it is busy? On one private containerd
//! (the containerd tests' harness, `integration::containerd`), runc's shim
//! against nri-shim with 8 pre-installed `nri-bench-plugin` processes: a
//! canary task with a terminal runs, then N containers (50, or
//! `NRI_BUSY_CREATES`) are created and started at once with `ctr run -d`;
//! meanwhile the canary's shim is asked Task.State and Task.ResizePty
//! every 5 ms on its own socket. Prints, per runtime, the latency of those
//! calls (p50, p99, max) while idle and during the burst, and how long the
//! burst took.
//!
//! For nri-shim every task shares the one daemon, so the canary's calls
//! queue behind whatever that daemon does for the burst; for runc each
//! task has its own shim process, so they queue only behind the machine.
//!
//! The nri-shim binary is `$NRI_SHIM_BIN`, or the `dist` build in this
//! target directory: `benches/busy-daemon.sh` builds it and runs this.
//! Root only; containerd is the line `NRI_CONTAINERD` names (1.6, the
//! system's, when unset). Everything it creates is removed at the end.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use integration::{
    containerd::{Containerd, Setup, containerd_cmd, containerd_major},
    task::{TaskClient, shim_address},
};

const PLUGINS: usize = 8;
/// The probe thread's nice value (see `probe`).
const PROBE_NICE: libc::c_int = -10;

/// Latencies of one kind of call.
#[derive(Default)]
struct Lat(Vec<Duration>);

impl Lat {
    fn line(&mut self) -> String {
        self.0.sort();
        let pct = |q: f64| {
            let v = &self.0;
            v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        format!(
            "p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({} calls)",
            ms(pct(0.5)),
            ms(pct(0.99)),
            ms(self.0.last().copied().unwrap_or_default()),
            self.0.len()
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Asks the canary's shim State and ResizePty every 5 ms until `stop`.
fn probe(addr: &str, id: &str, stop: &AtomicBool) -> (Lat, Lat) {
    // The probe's own wake-ups out of the figures (the same for both
    // runtimes): nice -10, so that what it measures is the shim's answer,
    // not its own wait for a CPU while the burst keeps both busy.
    // SAFETY: setpriority and gettid have no memory-safety preconditions.
    let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, PROBE_NICE) };
    assert_eq!(
        niced,
        0,
        "setpriority {PROBE_NICE}: {}",
        std::io::Error::last_os_error()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let client = TaskClient::connect(addr, "default", containerd_major()).await;
        let (mut state, mut resize) = (Lat::default(), Lat::default());
        let mut width = 80;
        while !stop.load(Ordering::SeqCst) {
            let t0 = Instant::now();
            client.state(id).await.expect("Task.State of the canary");
            state.0.push(t0.elapsed());
            width = if width == 80 { 100 } else { 80 };
            let t0 = Instant::now();
            client
                .resize_pty(id, width, 25)
                .await
                .expect("Task.ResizePty of the canary");
            resize.0.push(t0.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (state, resize)
    })
}

/// Runs `f` while the canary is probed; the probe's latencies.
fn probed<T>(addr: &str, id: &str, f: impl FnOnce() -> T) -> (T, Lat, Lat) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let probe = s.spawn(|| probe(addr, id, &stop));
        let out = f();
        stop.store(true, Ordering::SeqCst);
        let (state, resize) = probe.join().expect("probe thread");
        (out, state, resize)
    })
}

/// `ctr run -d -t` of a `sleep` canary: ctr wants a terminal on its stdin
/// for `-t`, so it runs under `script` (util-linux), which gives it one.
fn run_with_terminal(c: &Containerd, runtime: &str, id: &str) -> std::process::Output {
    let ctr = containerd_cmd("ctr");
    let cmd = format!(
        "{} -a {} run -d -t --runtime {runtime} --rootfs {} {id} /bin/sleep 3600",
        ctr.get_program().to_string_lossy(),
        c.sock.display(),
        c.rootfs.display()
    );
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &cmd, "/dev/null"]);
    // ctr's environment (containerd's line picks its binaries).
    for (k, v) in ctr.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    script.stdin(std::process::Stdio::null()).output().expect("run script")
}

fn measure(runtime: &str, label: &str, shim: &Path, plugin: &Path, n: usize) {
    let names: Vec<String> = (0..PLUGINS).map(|i| format!("{}-bench{i}", 10 + i)).collect();
    let c = Containerd::start(Setup {
        plugins: names
            .iter()
            .map(|n| (n.as_str(), plugin.to_path_buf(), String::new()))
            .collect(),
        idle_timeout: "60s",
        shim_bin: Some(shim.to_path_buf()),
        ..Default::default()
    });
    let canary = format!("busy-canary-{label}");
    let out = run_with_terminal(&c, runtime, &canary);
    assert!(
        out.status.success(),
        "ctr run the canary: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait_status(&canary, "RUNNING");
    let addr = shim_address(&c.dir.path().join("state"), "default", &canary);
    let ((), mut idle_state, mut idle_resize) = probed(&addr, &canary, || std::thread::sleep(Duration::from_secs(1)));
    let c = Arc::new(c);
    let (wall, mut state, mut resize) = probed(&addr, &canary, || {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for i in 0..n {
                let c = c.clone();
                s.spawn(move || {
                    let id = format!("busy-{label}-{i}");
                    let out = c.run_with(runtime, &id, &["-d"], &["/bin/sleep", "3600"]);
                    assert!(
                        out.status.success(),
                        "ctr run {id}: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                });
            }
        });
        t0.elapsed()
    });
    println!(
        "busy_daemon/{label}  idle:  State {}   ResizePty {}",
        idle_state.line(),
        idle_resize.line()
    );
    println!(
        "busy_daemon/{label}  {n} containers created and started at once in {:.2} s:  State {}   ResizePty {}",
        wall.as_secs_f64(),
        state.line(),
        resize.line()
    );
}

fn main() {
    let n: usize = std::env::var("NRI_BUSY_CREATES")
        .map(|v| v.parse().expect("NRI_BUSY_CREATES: a number of containers"))
        .unwrap_or(50);
    let shim = nri_benches::shim_under_test("benches/busy-daemon.sh");
    let plugin = PathBuf::from(env!("CARGO_BIN_EXE_nri-bench-plugin"));
    let version = containerd_cmd("containerd")
        .arg("--version")
        .output()
        .expect("containerd --version");
    println!(
        "busy_daemon: {} ; nri-shim {} with {PLUGINS} plugin processes; load average {}",
        String::from_utf8_lossy(&version.stdout).trim(),
        shim.display(),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    measure("io.containerd.runc.v2", "runc", &shim, &plugin, n);
    measure("io.containerd.nri-shim.v2", "nri-shim", &shim, &plugin, n);
}
