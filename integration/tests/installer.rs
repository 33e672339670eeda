//! `nri-shim-installer` (the DaemonSet's installer, issue 27 items 2 and 4)
//! without a cluster, on the containerd line `NRI_CONTAINERD` names
//! (`scripts/test.sh` runs it on each):
//!
//! - against a host root in a temp dir holding the line's own default
//!   config (`containerd config default`), and one importing a drop-in
//!   directory: the binary is copied, `containerd config dump` shows the
//!   handler, and SIGTERM gives the config back byte for byte and removes
//!   the binary;
//! - against a running private containerd with CRI, which a supervisor
//!   (this test) starts again when it exits: the installer restarts it with
//!   SIGTERM, waits for CRI, labels the node through a stand-in API server
//!   that speaks HTTPS as the real one (`integration/fake-kube-apiserver.py`:
//!   no RBAC, no admission), a pod runs with the handler; SIGTERM while the
//!   DaemonSet exists leaves everything; a new binary is taken by the
//!   running daemon in place (its container runs on); SIGTERM once the
//!   DaemonSet is gone unlabels, unconfigures, restarts containerd and
//!   leaves the binary to the daemon still serving the pod, saying so.
//!
//! Root only; a missing prerequisite (openssl, python3) fails naming it.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use integration::{
    containerd::{containerd_cmd, containerd_major, output_text, workspace_bin},
    cri::{Cri, CriSetup, api, container},
};

const SHIM: &str = "containerd-shim-nri-shim-v2";

/// An installer process, its output collected line by line.
struct Installer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Installer {
    fn start(args: &[String]) -> Installer {
        let mut child = Command::new(workspace_bin("nri-shim-installer"))
            .arg("install")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nri-shim-installer");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            });
        }
        Installer { child, lines }
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits until a line contains `what`; fails if the installer exits first.
    fn wait_line(&mut self, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.lines.lock().unwrap().iter().any(|l| l.contains(what)) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                panic!("installer exited ({st}) before printing {what:?}:\n{}", self.output());
            }
            assert!(
                Instant::now() < deadline,
                "no {what:?} within {timeout:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit status and everything it printed.
    fn term(mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        use nix::{sys::signal::Signal, unistd::Pid};
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return (st, self.output());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("installer still runs {timeout:?} after SIGTERM:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `containerd config dump` (on this line) of `config`, a node's config
/// kept under the host root `root`: its `imports` name the node's paths,
/// read here under `root` (a view file with those paths rewritten), as
/// containerd on that node would read them.
fn dump(root: &Path, config: &Path) -> String {
    let text = std::fs::read_to_string(config).unwrap();
    let view_text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("imports") {
                l.replace("'/", &format!("'{}/", root.display()))
                    .replace("\"/", &format!("\"{}/", root.display()))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let view = root.join("view.toml");
    std::fs::write(&view, view_text).unwrap();
    let o = containerd_cmd("containerd")
        .arg("--config")
        .arg(&view)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump");
    std::fs::remove_file(&view).unwrap();
    assert!(
        o.status.success(),
        "containerd config dump {}: {}",
        config.display(),
        output_text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn default_config() -> Vec<u8> {
    let o = containerd_cmd("containerd")
        .args(["config", "default"])
        .output()
        .expect("containerd config default");
    assert!(o.status.success(), "{}", output_text(&o));
    o.stdout
}

/// containerd 2.x runs its own NRI on the socket nri-shim's defaults use:
/// an operator passes --containerd-nri=disable there (configure refuses
/// otherwise).
fn nri_flag() -> &'static str {
    if containerd_major() >= 2 {
        "--containerd-nri=disable"
    } else {
        "--containerd-nri=keep"
    }
}

/// Runs the installer on `root` (no containerd running, no Kubernetes),
/// checks what `installed` says of the host root, SIGTERMs it and checks
/// that only the original config is left.
fn install_and_remove(root: &Path, main: &Path, installed: impl Fn()) {
    let original = std::fs::read(main).unwrap();
    let bin = root.join("usr/local/bin").join(SHIM);
    let args: Vec<String> = [
        "--host-namespace=self".to_string(),
        format!("--root={}", root.display()),
        format!("--source={}", workspace_bin(SHIM).display()),
        format!("--binary={}", bin.display()),
        format!("--ready-file={}", root.join("ready").display()),
        "--restart=none".into(),
        "--no-kubernetes".into(),
        nri_flag().into(),
    ]
    .into();
    let mut i = Installer::start(&args);
    i.wait_line("ready; waiting for SIGTERM", Duration::from_secs(60));
    assert_eq!(
        std::fs::read(&bin).unwrap(),
        std::fs::read(workspace_bin(SHIM)).unwrap()
    );
    installed();
    let (st, out) = i.term(Duration::from_secs(60));
    assert!(st.success(), "{out}");
    assert!(
        out.contains("uninstalled") && out.contains(&format!("removed {}", bin.display())),
        "{out}"
    );
    assert!(!bin.exists(), "the binary is removed once no daemon runs it");
    assert_eq!(
        std::fs::read(main).unwrap(),
        original,
        "the config is the original again:\n{out}"
    );
    let left: Vec<String> = walk(root)
        .into_iter()
        .filter(|p| !p.ends_with("config.toml"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(left.is_empty(), "left on the host root: {left:?}\n{out}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_lines_default_config_is_installed_and_given_back() {
    let root = tempfile::tempdir().unwrap();
    let main = root.path().join("etc/containerd/config.toml");
    std::fs::create_dir_all(main.parent().unwrap()).unwrap();
    std::fs::write(&main, default_config()).unwrap();
    install_and_remove(root.path(), &main, || {
        let d = dump(root.path(), &main);
        assert!(
            d.contains("runtimes.nri-shim]") && d.contains("io.containerd.nri-shim.v2"),
            "containerd's view lacks the handler:\n{d}"
        );
    });
}

#[test]
fn a_config_importing_a_directory_gets_a_drop_in_and_loses_it_again() {
    let root = tempfile::tempdir().unwrap();
    let main = root.path().join("etc/containerd/config.toml");
    std::fs::create_dir_all(root.path().join("etc/containerd/conf.d")).unwrap();
    let text = String::from_utf8(default_config()).unwrap();
    // containerd 2.4's default already imports that directory.
    let with_imports = if text.contains("imports = ['/etc/containerd/conf.d/*.toml']") {
        text.clone()
    } else {
        assert!(
            text.contains("imports = []"),
            "the default config has no empty imports:\n{text}"
        );
        text.replace("imports = []", "imports = [\"/etc/containerd/conf.d/*.toml\"]")
    };
    std::fs::write(&main, &with_imports).unwrap();
    let drop_in = root.path().join("etc/containerd/conf.d/nri-shim.toml");
    install_and_remove(root.path(), &main, || {
        assert_eq!(
            std::fs::read_to_string(&main).unwrap(),
            with_imports,
            "the main file is not touched"
        );
        assert!(drop_in.exists());
        let d = dump(root.path(), &main);
        assert!(
            d.contains("runtimes.nri-shim]") && d.contains("io.containerd.nri-shim.v2"),
            "containerd's view lacks the handler:\n{d}"
        );
    });
    assert!(!drop_in.exists());
}

/// The stand-in API server with node `node-a` and DaemonSet
/// `nri-shim/nri-shim-installer`, and the service account directory
/// pointing at it.
struct FakeApi {
    child: Child,
    dir: tempfile::TempDir,
    url: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e} (apt-get install openssl; scripts/test.sh installs it)"));
    assert!(o.status.success(), "openssl {args:?}: {}", output_text(&o));
}

impl FakeApi {
    fn start() -> FakeApi {
        let dir = tempfile::Builder::new().prefix("nri-fake-api-").tempdir().unwrap();
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=fake-cluster-ca",
            "-days",
            "2",
        ]);
        openssl(d, &ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=fake-kube-apiserver",
        ]);
        openssl(d, &csr);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        let sa = d.join("serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::copy(d.join("ca.crt"), sa.join("ca.crt")).unwrap();
        std::fs::write(sa.join("token"), "installer-token\n").unwrap();
        std::fs::write(sa.join("namespace"), "nri-shim").unwrap();
        let state = d.join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(
            state.join("nodes.json"),
            serde_json::json!({ "node-a": { "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": "node-a", "labels": { "kubernetes.io/hostname": "node-a" } } } })
            .to_string(),
        )
        .unwrap();
        std::fs::write(
            state.join("daemonsets.json"),
            serde_json::json!({ "nri-shim/nri-shim-installer": { "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": { "name": "nri-shim-installer", "namespace": "nri-shim" } } })
            .to_string(),
        )
        .unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-kube-apiserver.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&state)
            .arg(d.join("server.crt"))
            .arg(d.join("server.key"))
            .arg("installer-token")
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 (apt-get install python3)");
        let mut port = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        let port = port.trim().to_string();
        assert!(
            port.parse::<u16>().is_ok(),
            "the fake API server did not start: {port:?}"
        );
        FakeApi {
            child,
            dir,
            url: format!("https://127.0.0.1:{port}"),
        }
    }

    fn labels(&self) -> serde_json::Value {
        let nodes: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.path().join("state/nodes.json")).unwrap()).unwrap();
        nodes["node-a"]["metadata"]["labels"].clone()
    }

    fn delete_daemonset(&self) {
        std::fs::write(self.dir.path().join("state/daemonsets.json"), "{}").unwrap();
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("state/requests.jsonl")).unwrap_or_default()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_running_containerd_is_restarted_serves_a_pod_takes_an_upgrade_in_place_and_is_given_back() {
    let api = FakeApi::start();
    let host = tempfile::Builder::new().prefix("nri-host-").tempdir().unwrap();
    let bin = host.path().join("usr/local/bin").join(SHIM);
    let cri = Cri::start(CriSetup {
        installed_shim: Some(bin.clone()),
        ..Default::default()
    });
    let config = cri.dir.join("config.toml");
    let original = std::fs::read(&config).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // containerd's supervisor: starts it again whenever it exits.
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                cri.respawn_if_exited();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        // Set however the body ends: a failed assertion must fail the
        // test, not leave the scope waiting for the supervisor forever.
        let _stop = StopOnDrop(&stop);
        let args = |source: &Path| -> Vec<String> {
            vec![
                "--host-namespace=self".into(),
                format!("--root={}", host.path().display()),
                format!("--source={}", source.display()),
                format!("--binary={}", bin.display()),
                format!("--containerd-address={}", cri.sock.display()),
                format!("--containerd-config={}", config.display()),
                format!("--shim-config={}", cri.dir.join("shim.toml").display()),
                format!("--ready-file={}", host.path().join("ready").display()),
                "--restart=auto".into(),
                "--ready-timeout=60".into(),
                "--daemon-exit-timeout=3".into(),
                "--node-name=node-a".into(),
                "--daemonset=nri-shim-installer".into(),
                format!(
                    "--service-account-dir={}",
                    api.dir.path().join("serviceaccount").display()
                ),
                format!("--api-server={}", api.url),
            ]
        };
        let before = cri.containerd_pid();
        let mut first = Installer::start(&args(&workspace_bin(SHIM)));
        first.wait_line("ready; waiting for SIGTERM", Duration::from_secs(120));
        let out = first.output();
        assert!(out.contains("restarted containerd: SIGTERM to pid"), "{out}");
        assert_ne!(cri.containerd_pid(), before, "containerd was restarted:\n{out}");
        assert_eq!(api.labels()["nri-shim.io/runtime"], "installed", "{}", api.requests());
        assert_eq!(api.labels()["kubernetes.io/hostname"], "node-a", "other labels stay");
        assert!(
            api.requests()
                .contains(r#""content_type": "application/merge-patch+json", "authorized": true"#),
            "{}",
            api.requests()
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (pod, ctr) = rt.block_on(async {
            let mut c = cri.client().await;
            let cfg = cri.pod_config("installed", "default", "nri-shim", |_| {});
            let pod = c.run_pod(&cfg, "nri-shim").await;
            let ctr = c
                .create_running(&pod, &cfg, container("c", &["sleep", "1000"]), Duration::from_secs(30))
                .await;
            (pod, ctr)
        });
        // The pod runs through the installed binary.
        let daemon = daemon_of(&cri.sock);
        assert_eq!(
            std::fs::read_link(format!("/proc/{daemon}/exe")).unwrap(),
            bin,
            "the daemon runs the installed binary"
        );

        // The pod is replaced (the DaemonSet exists): nothing changes.
        let (st, out) = first.term(Duration::from_secs(60));
        assert!(
            st.success() && out.contains("this pod is being replaced, nri-shim stays installed"),
            "{out}"
        );
        assert!(dump(host.path(), &config).contains("runtimes.nri-shim]"));
        assert!(bin.exists());
        assert_eq!(api.labels()["nri-shim.io/runtime"], "installed");

        // The next pod brings a new binary: the running daemon takes it in
        // place, its container runs on; the config is unchanged, containerd
        // is not restarted.
        let newer = host.path().join("newer-shim");
        let mut bytes = std::fs::read(workspace_bin(SHIM)).unwrap();
        bytes.extend_from_slice(b"\0a newer build\0");
        std::fs::write(&newer, &bytes).unwrap();
        std::fs::set_permissions(&newer, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let pid_before = cri.containerd_pid();
        let mut second = Installer::start(&args(&newer));
        second.wait_line("ready; waiting for SIGTERM", Duration::from_secs(120));
        let out = second.output();
        assert!(
            out.contains(&format!("upgraded the daemon (pid {daemon}) in place")) && out.contains("ok pid="),
            "{out}"
        );
        assert!(out.contains("no restart"), "{out}");
        assert_eq!(cri.containerd_pid(), pid_before, "containerd was not restarted:\n{out}");
        assert_eq!(std::fs::read(&bin).unwrap(), bytes);
        assert_eq!(daemon_of(&cri.sock), daemon, "the same daemon, re-executed");
        assert!(
            !std::fs::read_link(format!("/proc/{daemon}/exe"))
                .unwrap()
                .display()
                .to_string()
                .ends_with("(deleted)"),
            "the daemon runs the new file"
        );
        rt.block_on(async {
            let mut c = cri.client().await;
            let st = c.status(&ctr).await.unwrap();
            assert_eq!(st.state, api::ContainerState::ContainerRunning as i32, "{st:?}");
        });

        // The DaemonSet is deleted: off the node again; the daemon still
        // serves the pod, so the binary stays.
        api.delete_daemonset();
        let restarted_from = cri.containerd_pid();
        let (st, out) = second.term(Duration::from_secs(120));
        eprintln!("--- the second installer's output ---\n{out}");
        assert!(st.success(), "{out}");
        assert!(out.contains("was deleted: uninstalling"), "{out}");
        assert!(
            out.contains("removed label nri-shim.io/runtime from node node-a"),
            "{out}"
        );
        assert!(out.contains("restarted containerd"), "{out}");
        assert!(
            out.contains(&format!(
                "left {}: nri-shim daemon(s) {daemon} still run containers",
                bin.display()
            )),
            "{out}"
        );
        assert!(bin.exists());
        assert_ne!(cri.containerd_pid(), restarted_from);
        assert_eq!(
            std::fs::read(&config).unwrap(),
            original,
            "the config is the original again"
        );
        assert!(api.labels().get("nri-shim.io/runtime").is_none(), "{}", api.labels());
        assert_eq!(api.labels()["kubernetes.io/hostname"], "node-a");
        rt.block_on(async {
            let mut c = cri.client().await;
            let cfg = cri.pod_config("after", "default", "nri-shim", |_| {});
            let e =
                c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(cfg),
                    runtime_handler: "nri-shim".into(),
                })
                .await
                .expect_err("the handler is gone");
            assert!(e.message().contains("nri-shim"), "{e}");
            c.remove_pod(&pod).await;
        });
    });
    cri.teardown();
}

/// Sets its flag when dropped, also while a panic unwinds.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The pid of the nri-shim daemon serving the containerd at `sock`.
fn daemon_of(sock: &Path) -> i32 {
    let needle = format!("-address\0{}\0", sock.display());
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains(SHIM) && cmd.contains(&needle) && cmd.ends_with("daemon\0") {
            return pid;
        }
    }
    panic!("no nri-shim daemon serves {}", sock.display());
}
