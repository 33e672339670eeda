//! A private containerd (Debian's package) with the shim on its PATH, in a
//! temp dir: config, root, state, sockets, and a busybox rootfs from
//! `busybox-static`. Needs root. A missing prerequisite fails loudly.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// The runtime name containerd maps to `containerd-shim-nri-shim-v2`.
pub const RUNTIME: &str = "io.containerd.nri-shim.v2";

/// The runtime type of runc's shim, the one tests compare with.
pub const RUNC_RUNTIME: &str = "io.containerd.runc.v2";

/// A binary of this workspace, from the target directory the running test
/// was built into.
///
/// # Panics
/// If it was not built: `cargo test --workspace` builds the binaries of
/// packages with integration tests only, so `scripts/test.sh` runs
/// `cargo build --workspace --bins` first (the installer has none).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (cargo test builds only the binaries of packages with integration tests)",
        p.display()
    );
    p
}

/// A command's stdout then stderr, as text: what a failed assertion on
/// `ctr` shows.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The containerd line the tests run against: `$NRI_CONTAINERD`, `1.6` (the
/// system's `/usr/bin/containerd`, Debian 12) when unset; `1.7` and `2.1`
/// are Debian's packages unpacked privately by
/// `scripts/lib/containerd-versions.sh` under `$NRI_CONTAINERD_CACHE`
/// (default `/var/cache/nri-shim`), never installed; `2.4` is built from
/// its Go module with the other reference peers ([`go_peers_bin`]).
pub fn containerd_line() -> String {
    std::env::var("NRI_CONTAINERD")
        .ok()
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "1.6".into())
}

/// The major version of [`containerd_line`] (1 or 2).
pub fn containerd_major() -> u32 {
    let line = containerd_line();
    line.split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("NRI_CONTAINERD={line}: not a containerd line like 1.7 or 2.1"))
}

/// The directory of the containerd binaries under test (`containerd`,
/// `ctr`, `containerd-shim-runc-v2`): `None` for the system's (found on
/// PATH).
///
/// # Panics
/// When the line asked for is not unpacked (run scripts/test.sh).
pub fn containerd_bin_dir() -> Option<PathBuf> {
    let line = containerd_line();
    if line == "1.6" {
        return None;
    }
    if line == GO_LINE {
        return Some(go_peers_bin());
    }
    let cache = nri_cache();
    let dir = Path::new(&cache).join(format!("containerd-{line}/usr/bin"));
    assert!(
        dir.join("containerd").exists() && dir.join("ctr").exists(),
        "NRI_CONTAINERD={line}: {} has no containerd: scripts/test.sh unpacks it \
         (`. scripts/lib/containerd-versions.sh; nri_containerd_versions`)",
        dir.display()
    );
    Some(dir)
}

/// The containerd line built from its Go module (`peers/go.mod`).
pub const GO_LINE: &str = "2.4";

fn nri_cache() -> String {
    std::env::var("NRI_CONTAINERD_CACHE").unwrap_or_else(|_| "/var/cache/nri-shim".into())
}

/// The programs of the Go reference peers (`peers/go.mod`: containerd
/// 2.4, runc 1.5, critest, crictl): `$NRI_GO_PEERS_BIN`, which
/// `scripts/lib/go-peers.sh` exports, else the cache's newest build.
///
/// # Panics
/// When they are not built (run `scripts/go-peers.sh`).
pub fn go_peers_bin() -> PathBuf {
    let dir = std::env::var_os("NRI_GO_PEERS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&nri_cache()).join("go-peers/current/bin"));
    assert!(
        dir.join("containerd").exists() && dir.join("runc").exists(),
        "{} has no Go reference peers: scripts/go-peers.sh builds them (scripts/test.sh runs it)",
        dir.display()
    );
    dir
}

/// The runc every comparison runs: runc 1.5, built from its Go module with
/// the other reference peers ([`go_peers_bin`]), not Debian 12's 1.1.5.
pub fn runc_bin() -> PathBuf {
    go_peers_bin().join("runc")
}

/// A binary of the containerd under test (`containerd`, `ctr`, ...).
pub fn containerd_cmd(name: &str) -> Command {
    match containerd_bin_dir() {
        Some(d) => Command::new(d.join(name)),
        None => Command::new(name),
    }
}

/// Whether the containerd under test asks every runtime handler for its
/// features (`<shim> -info`), as containerd 2.2.7, 2.3.4 and 2.4 do; 2.0
/// to 2.2.6 ask only handlers of runtime type `io.containerd.runc.v2`, 1.x
/// none.
pub fn introspects_every_handler() -> bool {
    containerd_line() == GO_LINE
}

/// TOML for containerd's config (version 2, which 2.x migrates): its own
/// NRI off on 2.x (on by default there, on the node's `/var/run/nri`).
pub fn containerd_nri_off() -> &'static str {
    if containerd_major() >= 2 {
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"
    } else {
        ""
    }
}

/// Fails loudly, naming the Debian package, when `cmd` is not installed.
pub(crate) fn require(cmd: &str, package: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "`{cmd}` not found: apt-get install {package} (scripts/test.sh installs it)"
    );
}

/// Writes a busybox rootfs (static binary + applet links) to `dir`.
pub fn busybox_rootfs(dir: &Path) {
    let busybox = Path::new("/bin/busybox");
    assert!(busybox.exists(), "/bin/busybox missing: apt-get install busybox-static");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["proc", "sys", "dev", "tmp", "etc", "root", "run"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    let list = Command::new(busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        // busybox lists itself: linking it would replace the binary.
        if applet != "busybox" {
            let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
        }
    }
}

/// Container ids run through [`Containerd::run_with`], with the instance
/// (its directory) that ran them, until that instance is dropped.
static IDS_IN_USE: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());

/// A running private containerd.
pub struct Containerd {
    /// Everything lives here.
    pub dir: tempfile::TempDir,
    /// containerd's gRPC socket (for `ctr -a`).
    pub sock: PathBuf,
    /// The busybox rootfs.
    pub rootfs: PathBuf,
    /// Pre-installed NRI plugins.
    pub plugin_dir: PathBuf,
    /// Their drop-in configs.
    pub conf_dir: PathBuf,
    /// The shim's NRI socket for external plugins.
    pub nri_sock: PathBuf,
    /// The shim's state root.
    pub shim_state: PathBuf,
    child: Child,
}

/// What to set up before containerd starts.
#[derive(Default)]
pub struct Setup<'a> {
    /// Pre-installed plugins: (file name, binary, drop-in config text).
    pub plugins: Vec<(&'a str, PathBuf, String)>,
    /// Extra TOML appended to the shim config (after its `[shim]` keys).
    pub shim_toml: &'a str,
    /// Extra keys of the shim config's `[nri]` table.
    pub nri_toml: &'a str,
    /// The daemon's `idle_timeout` (default "2s").
    pub idle_timeout: &'a str,
    /// The shim binary (default: this workspace's build).
    pub shim_bin: Option<PathBuf>,
}

impl Containerd {
    /// Starts containerd with the shim (`containerd-shim-nri-shim-v2` of
    /// this workspace) on its PATH and waits until it answers.
    pub fn start(setup: Setup<'_>) -> Containerd {
        if containerd_bin_dir().is_none() {
            require("containerd", "containerd");
            require("ctr", "containerd");
        }
        let dir = tempfile::Builder::new().prefix("nri-ctrd-").tempdir().unwrap();
        let t = dir.path();
        let bin = t.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let shim = setup
            .shim_bin
            .clone()
            .unwrap_or_else(|| workspace_bin("containerd-shim-nri-shim-v2"));
        std::os::unix::fs::symlink(shim, bin.join("containerd-shim-nri-shim-v2")).unwrap();
        let rootfs = t.join("rootfs");
        busybox_rootfs(&rootfs);
        let (plugin_dir, conf_dir) = (t.join("plugins"), t.join("conf.d"));
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&conf_dir).unwrap();
        for (name, binary, conf) in &setup.plugins {
            std::fs::copy(binary, plugin_dir.join(name)).unwrap();
            if !conf.is_empty() {
                std::fs::write(conf_dir.join(format!("{name}.conf")), conf).unwrap();
            }
        }
        let (sock, nri_sock, shim_state) = (t.join("containerd.sock"), t.join("nri/nri.sock"), t.join("shim-state"));
        std::fs::write(
            t.join("config.toml"),
            format!(
                r#"version = 2
root = "{t}/root"
state = "{t}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  level = "debug"
[plugins."io.containerd.internal.v1.opt"]
  path = "{t}/opt"
{nri_off}"#,
                t = t.display(),
                sock = sock.display(),
                nri_off = containerd_nri_off(),
            ),
        )
        .unwrap();
        std::fs::write(
            t.join("shim.toml"),
            format!(
                r#"[nri]
socket_path = "{nri}"
plugin_path = "{plugins}"
plugin_config_path = "{conf}"
{nri_extra}
[shim]
state_root = "{state}"
idle_timeout = "{idle}"
log_level = "debug"
{extra}
"#,
                nri = nri_sock.display(),
                plugins = plugin_dir.display(),
                conf = conf_dir.display(),
                state = shim_state.display(),
                idle = if setup.idle_timeout.is_empty() {
                    "2s"
                } else {
                    setup.idle_timeout
                },
                extra = setup.shim_toml,
                nri_extra = setup.nri_toml,
            ),
        )
        .unwrap();
        let child = spawn_containerd(t);
        let c = Containerd {
            sock,
            rootfs,
            plugin_dir,
            conf_dir,
            nri_sock,
            shim_state,
            child,
            dir,
        };
        c.wait_up();
        c
    }
}

/// Starts (or starts again) the containerd of `dir`: same config, root,
/// state and environment; its log is appended to.
/// Starts containerd ([`containerd_line`]) with `t/config.toml`, `t/bin`
/// first on its PATH (the shim), then the directory of the containerd under
/// test (its runc shim), the shim config `t/shim.toml`, logging to
/// `t/containerd.log`.
pub(crate) fn spawn_containerd(t: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(t.join("containerd.log"))
        .unwrap();
    let mut path = t.join("bin").display().to_string();
    if let Some(d) = containerd_bin_dir() {
        path = format!("{path}:{}", d.display());
    }
    let path = format!("{path}:{}", std::env::var("PATH").unwrap_or_default());
    containerd_cmd("containerd")
        .arg("--config")
        .arg(t.join("config.toml"))
        .current_dir(t)
        .env("PATH", path)
        .env("NRI_SHIM_CONFIG", t.join("shim.toml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start containerd")
}

impl Containerd {
    /// Waits until containerd answers (20 s deadline).
    fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ctr(&["version"]).status.success() {
            assert!(Instant::now() < deadline, "containerd did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops containerd with SIGTERM and waits for it to exit (shims and
    /// containers keep running, as with systemd's `KillMode=process`).
    ///
    /// # Panics
    /// If it has not exited after 20 s.
    pub fn stop(&mut self) {
        use nix::{sys::signal::Signal, unistd::Pid};
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().expect("wait containerd").is_none() {
            assert!(Instant::now() < deadline, "containerd ignored SIGTERM for 20s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts containerd again after [`Containerd::stop`], with the same
    /// config, root and state, and waits until it answers.
    pub fn start_again(&mut self) {
        self.child = spawn_containerd(self.dir.path());
        self.wait_up();
    }

    /// [`Containerd::stop`], `down` with no containerd, [`Containerd::start_again`].
    pub fn restart(&mut self, down: Duration) {
        self.stop();
        std::thread::sleep(down);
        self.start_again();
    }

    /// The shim config file (`$NRI_SHIM_CONFIG` of containerd and the shim).
    pub fn shim_config(&self) -> PathBuf {
        self.dir.path().join("shim.toml")
    }

    /// `ctr run --fifo-dir F --runtime RUNTIME FLAGS --rootfs ROOTFS ID CMD...`
    /// with any runtime (e.g. [`RUNC_RUNTIME`] to compare; runc's shim then
    /// also gets [`Containerd::runc_root_flags`]).
    ///
    /// # Panics
    /// When another live instance in this test binary has run a container
    /// with the same id: both would get the cgroup `/default/ID` (ctr's
    /// cgroups path is the namespace and the id), and removing one kills
    /// the other's processes. Tests of one binary run in parallel, so each
    /// uses ids of its own.
    pub fn run_with(&self, runtime: &str, id: &str, flags: &[&str], cmd: &[&str]) -> Output {
        {
            let mut used = IDS_IN_USE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((_, other)) = used.iter().find(|(i, d)| i == id && d != self.dir.path()) {
                panic!(
                    "container id {id} is in use by another test's containerd ({}): the two would share cgroup /default/{id}",
                    other.display()
                );
            }
            used.push((id.to_string(), self.dir.path().to_path_buf()));
        }
        let fifo = self.dir.path().join("fifo");
        let mut args: Vec<String> = vec!["run".into(), "--fifo-dir".into(), fifo.display().to_string()];
        args.extend(["--runtime".into(), runtime.into()]);
        args.extend(self.runc_root_flags(runtime));
        args.extend(flags.iter().map(|s| s.to_string()));
        args.extend(["--rootfs".into(), self.rootfs.display().to_string(), id.into()]);
        args.extend(cmd.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctr(&refs)
    }
}

impl Containerd {
    /// The `ctr run` flags of runc's shim when `runtime` is it (none for
    /// any other runtime): the reference runc ([`runc_bin`], runc 1.5,
    /// `--runc-binary`), and runc's state in this instance's directory
    /// (`--runc-root DIR/runc`). Without the latter runc's shim keeps it in
    /// the host's `/run/containerd/runc/NAMESPACE`, shared by every test
    /// and run: a run killed before its cleanup leaves a container there,
    /// and the next `ctr run` of the same id fails with "container with
    /// given ID already exists".
    pub fn runc_root_flags(&self, runtime: &str) -> Vec<String> {
        if runtime == RUNC_RUNTIME {
            vec![
                "--runc-binary".into(),
                runc_bin().display().to_string(),
                "--runc-root".into(),
                self.dir.path().join("runc").display().to_string(),
            ]
        } else {
            Vec::new()
        }
    }

    /// The lines `ctr -n NS t attach ID` gets from a running task within
    /// `window` (the attach is killed then), and what ctr printed on stderr.
    pub fn attach_lines(&self, ns: &str, id: &str, window: Duration) -> (Vec<String>, String) {
        use std::io::BufRead;
        let mut child = containerd_cmd("ctr")
            .arg("-a")
            .arg(&self.sock)
            .args(["-n", ns, "t", "attach", id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ctr t attach");
        let stdout = child.stdout.take().expect("attach stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let deadline = std::time::Instant::now() + window;
        let mut lines = Vec::new();
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            lines.push(l);
        }
        let _ = child.kill();
        let out = child.wait_with_output().expect("ctr t attach output");
        (lines, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// The shim daemon's log so far.
    pub fn shim_log(&self) -> String {
        let mut out = String::new();
        for d in std::fs::read_dir(&self.shim_state).into_iter().flatten().flatten() {
            out.push_str(&std::fs::read_to_string(d.path().join("shim.log")).unwrap_or_default());
        }
        out
    }

    /// Starts `ctr events`: every event containerd publishes from now on.
    pub fn events(&self) -> Events {
        let mut child = containerd_cmd("ctr")
            .arg("-a")
            .arg(&self.sock)
            .arg("events")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run ctr events");
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("ctr events stdout");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Events {
            child,
            rx,
            seen: Vec::new(),
            cursor: 0,
        }
    }

    /// `ctr -a <sock> args...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        containerd_cmd("ctr")
            .arg("-a")
            .arg(&self.sock)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// `ctr run --fifo-dir F --runtime io.containerd.nri-shim.v2 FLAGS --rootfs ROOTFS ID CMD...`
    /// (flags before `--rootfs`: ctr stops at the first positional).
    pub fn run(&self, id: &str, flags: &[&str], cmd: &[&str]) -> Output {
        self.run_with(RUNTIME, id, flags, cmd)
    }

    /// The bundle of task `id` in namespace `default`.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.dir
            .path()
            .join("state/io.containerd.runtime.v2.task/default")
            .join(id)
    }

    /// libcontainer state directories left in the shim's state root.
    pub fn libcontainer_states(&self) -> Vec<String> {
        let mut out = Vec::new();
        for d in std::fs::read_dir(&self.shim_state).into_iter().flatten().flatten() {
            for c in std::fs::read_dir(d.path().join("containers"))
                .into_iter()
                .flatten()
                .flatten()
            {
                out.push(c.file_name().to_string_lossy().into_owned());
            }
        }
        out
    }

    /// Waits until `ctr t ls` shows task `id` with `status` (20 s deadline).
    pub fn wait_status(&self, id: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = String::from_utf8_lossy(&self.ctr(&["t", "ls"]).stdout).into_owned();
            if out
                .lines()
                .any(|l| l.split_whitespace().next() == Some(id) && l.contains(status))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} never {status}: {out}\nshim log:\n{}",
                self.shim_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Pid of the shim daemon serving this containerd, if running.
    pub fn shim_daemon_pid(&self) -> Option<i32> {
        crate::shims_of(&self.sock)
            .into_iter()
            .find(|(_, cmd)| cmd.contains("containerd-shim-nri-shim-v2") && cmd.trim_end().ends_with("daemon"))
            .map(|(pid, _)| pid)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Remove leftover tasks (of every namespace), then stop containerd
        // and the shim daemon.
        if !matches!(self.child.try_wait(), Ok(None)) {
            // Stopped by the test (which failed before starting it again).
            self.child = spawn_containerd(self.dir.path());
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.ctr(&["version"]).status.success() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let namespaces = String::from_utf8_lossy(&self.ctr(&["ns", "ls", "-q"]).stdout).into_owned();
        for ns in namespaces.lines() {
            let ctr = |args: &[&str]| {
                let mut a = vec!["-n", ns];
                a.extend(args);
                String::from_utf8_lossy(&self.ctr(&a).stdout).into_owned()
            };
            for id in ctr(&["t", "ls", "-q"]).lines() {
                ctr(&["t", "kill", "-s", "SIGKILL", id]);
                ctr(&["t", "rm", "-f", id]);
            }
            for id in ctr(&["c", "ls", "-q"]).lines() {
                ctr(&["c", "rm", id]);
            }
        }
        use nix::{sys::signal::Signal, unistd::Pid};
        // The shim daemon, and any runc shim a refused create left.
        crate::kill_shims_of(&self.sock);
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
        IDS_IN_USE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(_, d)| d != self.dir.path());
        // Empty parent cgroups containerd created (`/default`, one per namespace).
        for ctl in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            for ns in namespaces.lines() {
                let _ = std::fs::remove_dir(ctl.path().join(ns));
            }
        }
    }
}

/// The output of `ctr events`, one line per event:
/// `DATE TIME ZONE UTC NAMESPACE TOPIC {json}`. Killed on drop.
pub struct Events {
    child: Child,
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    cursor: usize,
}

impl Events {
    /// Waits until an event line after the cursor (the start, the last
    /// match or [`Events::mark`]) satisfies `pred`; returns its index in
    /// [`Events::seen`] and moves the cursor past it.
    ///
    /// # Panics
    /// After `timeout`, listing what was seen.
    pub fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> usize {
        let deadline = Instant::now() + timeout;
        let mut from = self.cursor;
        loop {
            if let Some(i) = self.seen[from..].iter().position(|l| pred(l)) {
                self.cursor = from + i + 1;
                return from + i;
            }
            from = self.seen.len();
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "event not seen within {timeout:?}; seen:\n{:#?}",
                self.seen
            );
            if let Ok(l) = self.rx.recv_timeout(left) {
                self.seen.push(l);
            }
        }
    }

    /// Moves the cursor past everything that has arrived so far.
    pub fn mark(&mut self) {
        self.cursor = self.seen().len();
    }

    /// Collects what has arrived so far.
    pub fn seen(&mut self) -> &[String] {
        self.seen.extend(self.rx.try_iter());
        &self.seen
    }

    /// Event lines of `topic` (e.g. `/tasks/exit`) about container `id`.
    pub fn of(&mut self, topic: &str, id: &str) -> Vec<String> {
        let needle = format!("\"container_id\":\"{id}\"");
        self.seen()
            .iter()
            .filter(|l| l.split_whitespace().nth(5) == Some(topic) && l.contains(&needle))
            .cloned()
            .collect()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
