//! The CRI lane's harness: Debian's containerd with its CRI plugin enabled,
//! everything private (config, root, state, sockets, CNI conf dir, IPAM
//! data, the shim's NRI socket and plugins), two runtime handlers on the
//! same containerd (`runc`: Debian's runc through `io.containerd.runc.v2`;
//! `nri-shim`: this workspace's shim), and a CRI v1 gRPC client
//! (`k8s-cri`) as kubelet would use it.
//!
//! No registry: one single-layer OCI image tarball (busybox-static's
//! applets, [`BUSYBOX`], and a pause image on the same layer, [`PAUSE`],
//! whose process is `sleep`) is built here and imported with
//! `ctr -n k8s.io images import`; `sandbox_image` names the pause image.
//! Pod networking is Debian's `containernetworking-plugins` (bridge +
//! host-local; CRI adds loopback) on a private bridge and subnet, without
//! masquerading or port maps: nothing leaves the machine, no iptables rule
//! is written. Pods get `cgroup_parent` under [`Cri::cgroup_root`]
//! (cgroupfs), so a container's cgroup is `<root>/<pod uid>/<container id>`
//! in every v1 controller.
//!
//! A test binary shares one containerd ([`shared`]); it is torn down when
//! the binary exits (an `atexit` hook: pods, tasks, containerd, the shim
//! daemon, the bridge, cgroups, mounts, the temp dir). Needs root; a
//! missing prerequisite fails naming the Debian package.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use api::{image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient};
pub use k8s_cri::v1 as api;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::containerd::{
    busybox_rootfs, containerd_bin_dir, containerd_cmd, containerd_major, containerd_nri_off, require,
    spawn_containerd, workspace_bin,
};

/// The runtime handlers every behaviour runs with: the reference first.
pub const HANDLERS: [&str; 2] = ["runc", "nri-shim"];
/// The containerd namespace of CRI's containers.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The busybox image (`/bin/sh` by default).
pub const BUSYBOX: &str = "localhost/nri-lane/busybox:1";
/// The pause image `sandbox_image` names: busybox's `sleep`.
pub const PAUSE: &str = "localhost/nri-lane/pause:1";
/// The pause image's process, as `/proc/1/cmdline` shows it (NULs as spaces).
pub const PAUSE_CMDLINE: &str = "/bin/sleep 2147483647 ";
/// Pods in this namespace get the lane's NRI adjustment (see [`NRI_ENV`]).
pub const NRI_NAMESPACE: &str = "nri-lane-nri";
/// The env var (name, value) the pre-installed `nri-adjuster` adds to
/// containers of pods in [`NRI_NAMESPACE`].
pub const NRI_ENV: (&str, &str) = ("NRI_LANE_VAR", "from-nri-adjuster");

/// Deadline of every CRI request.
const RPC_TIMEOUT: Duration = Duration::from_secs(60);

fn require_file(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: apt-get install {package} (scripts/test.sh installs it)"
    );
}

/// Runs `cmd` (stdin empty); panics, with its output, when it fails.
pub(crate) fn run(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_string()
}

/// The media type of an uncompressed image layer.
pub(crate) const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// Writes an amd64 image's config (busybox's `PATH`, `cmd`, `user` where
/// not empty) and manifest into the OCI layout `oci`, whose `layers` (their
/// descriptors, bottom first, uncompressed) are blobs there already;
/// returns the manifest's descriptor.
pub(crate) fn image_manifest(oci: &Path, layers: &[serde_json::Value], cmd: &[&str], user: &str) -> serde_json::Value {
    let mut config = serde_json::json!({
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Cmd": cmd,
    });
    if !user.is_empty() {
        config["User"] = user.into();
    }
    let diff_ids: Vec<&serde_json::Value> = layers.iter().map(|l| &l["digest"]).collect();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let config = blob(
        oci,
        "application/vnd.oci.image.config.v1+json",
        &serde_json::to_vec(&config).unwrap(),
    );
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    });
    blob(
        oci,
        "application/vnd.oci.image.manifest.v1+json",
        &serde_json::to_vec(&manifest).unwrap(),
    )
}

/// Writes `bytes` as a blob of the OCI layout `oci`; returns its descriptor.
pub(crate) fn blob(oci: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let tmp = oci.join("blob.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    let digest = sha256(&tmp);
    std::fs::rename(&tmp, oci.join("blobs/sha256").join(&digest)).unwrap();
    serde_json::json!({ "mediaType": media_type, "digest": format!("sha256:{digest}"), "size": bytes.len() })
}

/// Builds `dir/images.tar`: an OCI image layout holding [`BUSYBOX`] and
/// [`PAUSE`], one uncompressed layer shared by both.
pub fn build_images(dir: &Path) -> PathBuf {
    require("tar", "tar");
    require("sha256sum", "coreutils");
    let layer_dir = dir.join("layer");
    busybox_rootfs(&layer_dir);
    let oci = dir.join("oci");
    std::fs::create_dir_all(oci.join("blobs/sha256")).unwrap();
    let layer_tar = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&layer_dir)
        .arg("-cf")
        .arg(&layer_tar)
        .arg("."));
    let layer = blob(&oci, LAYER_TAR, &std::fs::read(&layer_tar).unwrap());
    let mut manifests = Vec::new();
    for (name, cmd) in [(BUSYBOX, vec!["/bin/sh"]), (PAUSE, vec!["/bin/sleep", "2147483647"])] {
        let mut desc = image_manifest(&oci, std::slice::from_ref(&layer), &cmd, "");
        desc["platform"] = serde_json::json!({ "architecture": "amd64", "os": "linux" });
        desc["annotations"] = serde_json::json!({
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap(),
        });
        manifests.push(desc);
    }
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": manifests });
    std::fs::write(oci.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let tar = dir.join("images.tar");
    run(Command::new("tar").arg("-C").arg(&oci).arg("-cf").arg(&tar).arg("."));
    tar
}

/// A bridge name and a /24 no route of this machine uses yet.
fn pick_network() -> (String, String) {
    let routes = run(Command::new("ip").args(["-4", "route", "show", "table", "all"]));
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    let pid = std::process::id();
    for i in 0..256u32 {
        let octet = (pid + i) % 250 + 1;
        let prefix = format!("10.213.{octet}.");
        if !routes.contains(&prefix) {
            return (format!("nricri{}", (pid + i) % 100_000), format!("{prefix}0/24"));
        }
    }
    panic!("no free 10.213.x.0/24 subnet for the CRI lane's bridge:\n{routes}");
}

/// What to set up before containerd starts.
#[derive(Default)]
pub struct CriSetup<'a> {
    /// Pre-installed NRI plugins of the shim: (file name, binary, drop-in config text).
    pub plugins: Vec<(&'a str, PathBuf, String)>,
    /// The shim's `[shim] log_level`; `None`: `debug`.
    pub shim_log_level: Option<&'a str>,
    /// More tables of the shim's config file (`[metrics]`, ...), appended.
    pub shim_toml: &'a str,
    /// The `containerd-shim-nri-shim-v2` binary the `nri-shim` handler runs;
    /// `None`: this workspace's build next to the test binary.
    pub shim_bin: Option<PathBuf>,
    /// Two more handlers with the systemd cgroup driver: `runc-systemd`
    /// (`SystemdCgroup = true` in runc's options) and `nri-shim-systemd`
    /// (our runtime type; containerd 1.6's CRI passes another type's
    /// `options` only as `ConfigPath`, so they name a file holding
    /// `SystemdCgroup = true`, as Kata's handlers name theirs).
    pub systemd_handlers: bool,
    /// The `nri-shim` handler is added by the shim's own `configure
    /// containerd` (on the config otherwise written here), as an operator
    /// would add it, instead of being written here.
    pub configure: bool,
    /// Where an installer puts the shim (it may not exist yet): containerd
    /// finds it there (a link on its PATH), and its config names no
    /// `nri-shim` handler until the installer adds one.
    pub installed_shim: Option<PathBuf>,
    /// containerd's state directory, runc's root and the shim's state
    /// root on a tmpfs of their own, as on a node, where all three are
    /// under `/run` (`/run/containerd`, `/run/containerd/runc`,
    /// `/run/nri-shim`); otherwise in the test's temp directory on the
    /// disk, and runc's in the host's `/run/containerd/runc`. Unmounted by
    /// [`Cri::teardown`].
    pub run_on_tmpfs: bool,
    /// containerd's own NRI on, on a socket of the lane's
    /// ([`Cri::containerd_nri_socket`]) with no plugins of its own, for a
    /// test that attaches a plugin to it as runc's side of a comparison
    /// (containerd 1.7 and later); otherwise it is off on 2.x, where it is
    /// on by default on the host's `/var/run/nri/nri.sock`.
    pub containerd_nri: bool,
    /// CRI's registry hosts directory (`config_path`) at
    /// [`Cri::registry_hosts_dir`], for a test that points a registry's
    /// pulls at a mirror of its own with a `hosts.toml` there.
    pub registry_hosts: bool,
    /// `plugin_request_timeout` of the shim's NRI and of containerd's own
    /// (with [`CriSetup::containerd_nri`]); `None`: their default, 2 s.
    pub nri_request_timeout: Option<&'a str>,
    /// The shim's `[shim] idle_timeout`; `None`: `5s`.
    pub shim_idle_timeout: Option<&'a str>,
}

/// The CRI config of [`CriSetup::systemd_handlers`], with our handler's
/// options file written into `dir`.
/// The handler name of nri-shim declared as `io.containerd.runc.v2` with
/// `runtime_path` (containerd 2.x only; see `as_runc_handler`).
pub const AS_RUNC: &str = "nri-shim-as-runc";

/// On containerd 2.x: the [`AS_RUNC`] handler, this shim declared with
/// runc's runtime type and `runtime_path`, the one configuration in which
/// containerd 2.0 to 2.3 asks a shim other than runc's for its features
/// (recursive read-only mounts, user namespaces); see
/// docs/operator-guide.md. Empty before 2.0.
fn as_runc_handler(bin: &Path) -> String {
    if containerd_major() < 2 {
        return String::new();
    }
    let r = r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes"#;
    format!(
        "    {r}.{AS_RUNC}]\n      runtime_type = \"io.containerd.runc.v2\"\n      runtime_path = \"{}\"\n",
        bin.join("containerd-shim-nri-shim-v2").display()
    )
}

/// containerd's NRI plugin on, on `<dir>/containerd-nri/nri.sock`, with
/// empty plugin directories of the lane (see [`CriSetup::containerd_nri`]).
fn containerd_nri_on(dir: &Path, request_timeout: Option<&str>) -> String {
    let d = dir.join("containerd-nri");
    for sub in ["plugins", "conf.d"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let timeout = request_timeout
        .map(|t| format!("  plugin_request_timeout = \"{t}\"\n"))
        .unwrap_or_default();
    format!(
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = \"{d}/nri.sock\"\n  \
         plugin_path = \"{d}/plugins\"\n  plugin_config_path = \"{d}/conf.d\"\n{timeout}",
        d = d.display()
    )
}

fn systemd_handlers(dir: &Path, runc: &Path) -> String {
    let options = dir.join("nri-shim-systemd.toml");
    std::fs::write(&options, "SystemdCgroup = true\n").unwrap();
    let r = r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes"#;
    format!(
        "    {r}.runc-systemd]\n      runtime_type = \"io.containerd.runc.v2\"\n    \
         {r}.runc-systemd.options]\n      SystemdCgroup = true\n      BinaryName = \"{}\"\n    \
         {r}.nri-shim-systemd]\n      runtime_type = \"io.containerd.nri-shim.v2\"\n    \
         {r}.nri-shim-systemd.options]\n      ConfigPath = \"{}\"\n",
        runc.display(),
        options.display()
    )
}

/// A gRPC channel to containerd's CRI service on the unix socket `path`
/// (tonic dials a unix socket through a connector), each call bounded by
/// `timeout`, connecting within 10 s.
///
/// # Errors
/// The socket cannot be connected to.
pub async fn channel(path: PathBuf, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://[::]:50051")
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

/// A running private containerd with CRI and the two handlers.
pub struct Cri {
    /// Everything lives here (removed by [`Cri::teardown`]).
    pub dir: PathBuf,
    /// containerd's socket: CRI gRPC and `ctr -a`.
    pub sock: PathBuf,
    /// The cgroup (relative to each v1 controller's root) pods are put under.
    pub cgroup_root: String,
    /// The pod network's subnet.
    pub subnet: String,
    /// The pod network's bridge.
    pub bridge: String,
    /// The shim daemon's state root.
    pub shim_state: PathBuf,
    child: Mutex<Option<Child>>,
    _tmp: Mutex<Option<tempfile::TempDir>>,
}

impl Cri {
    /// Builds and imports the images, writes the configs and starts
    /// containerd; waits until CRI answers and sees both images.
    pub fn start(setup: CriSetup<'_>) -> Cri {
        if containerd_bin_dir().is_none() {
            require("containerd", "containerd");
            require("ctr", "containerd");
            require("containerd-shim-runc-v2", "containerd");
        }
        // The reference handler's runc (1.5, from the Go peers).
        let runc = crate::containerd::runc_bin();
        require("ip", "iproute2");
        for p in ["bridge", "host-local", "loopback", "portmap"] {
            require_file(&format!("/usr/lib/cni/{p}"), "containernetworking-plugins");
        }
        let tmp = tempfile::Builder::new().prefix("nri-cri-").tempdir().unwrap();
        let t = tmp.path().to_path_buf();
        let bin = t.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let shim_bin = setup
            .shim_bin
            .clone()
            .unwrap_or_else(|| workspace_bin("containerd-shim-nri-shim-v2"));
        assert!(shim_bin.exists(), "{} is missing", shim_bin.display());
        let on_path = setup.installed_shim.as_ref().unwrap_or(&shim_bin);
        std::os::unix::fs::symlink(on_path, bin.join("containerd-shim-nri-shim-v2")).unwrap();
        let (plugin_dir, conf_dir) = (t.join("nri/plugins"), t.join("nri/conf.d"));
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&conf_dir).unwrap();
        for (name, binary, conf) in &setup.plugins {
            std::fs::copy(binary, plugin_dir.join(name)).unwrap();
            if !conf.is_empty() {
                std::fs::write(conf_dir.join(format!("{name}.conf")), conf).unwrap();
            }
        }
        let (bridge, subnet) = pick_network();
        let cni_conf = t.join("cni/net.d");
        std::fs::create_dir_all(&cni_conf).unwrap();
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "nri-cri-lane",
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": subnet }]],
                    "dataDir": t.join("cni/ipam"),
                },
            }, {
                // hostPort mappings (iptables DNAT), as a node's CNI chain has.
                "type": "portmap",
                "capabilities": { "portMappings": true },
            }],
        });
        std::fs::write(
            cni_conf.join("10-nri-cri-lane.conflist"),
            serde_json::to_vec_pretty(&conflist).unwrap(),
        )
        .unwrap();
        let sock = t.join("containerd.sock");
        let run = if setup.run_on_tmpfs {
            let run = t.join("run");
            std::fs::create_dir_all(&run).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                &run,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some("mode=0755"),
            )
            .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", run.display()));
            run
        } else {
            t.clone()
        };
        let shim_state = run.join("shim-state");
        std::fs::write(
            t.join("config.toml"),
            format!(
                r#"version = 2
root = "{t}/root"
state = "{run}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  level = "debug"
[plugins."io.containerd.internal.v1.opt"]
  path = "{t}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
{runc_root}{nri_shim_handler}{systemd_handlers}{as_runc}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
{registry}{nri_off}"#,
                t = t.display(),
                run = run.display(),
                sock = sock.display(),
                cni_conf = cni_conf.display(),
                nri_off = if setup.containerd_nri {
                    containerd_nri_on(&t, setup.nri_request_timeout)
                } else {
                    containerd_nri_off().to_string()
                },
                as_runc = as_runc_handler(&bin),
                registry = if setup.registry_hosts {
                    format!(
                        "  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"{}/certs.d\"\n",
                        t.display()
                    )
                } else {
                    String::new()
                },
                runc = runc.display(),
                // runc keeps its state under `/run/containerd/runc` unless
                // told otherwise: on the run's tmpfs too, so both runtimes
                // keep their state in memory as on a node.
                runc_root = if setup.run_on_tmpfs {
                    format!("        Root = \"{}/runc\"\n", run.display())
                } else {
                    String::new()
                },
                nri_shim_handler = if setup.configure || setup.installed_shim.is_some() {
                    ""
                } else {
                    "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nri-shim]\n      runtime_type = \"io.containerd.nri-shim.v2\"\n"
                },
                systemd_handlers = if setup.systemd_handlers {
                    systemd_handlers(&t, &runc)
                } else {
                    String::new()
                },
            ),
        )
        .unwrap();
        std::fs::write(
            t.join("shim.toml"),
            format!(
                r#"[nri]
socket_path = "{t}/nri/nri.sock"
plugin_path = "{plugins}"
plugin_config_path = "{conf}"
{request_timeout}[shim]
state_root = "{state}"
idle_timeout = "{idle}"
log_level = "{log_level}"
{extra}"#,
                t = t.display(),
                plugins = plugin_dir.display(),
                conf = conf_dir.display(),
                state = shim_state.display(),
                idle = setup.shim_idle_timeout.unwrap_or("5s"),
                request_timeout = setup
                    .nri_request_timeout
                    .map(|t| format!("plugin_request_timeout = \"{t}\"\n"))
                    .unwrap_or_default(),
                log_level = setup.shim_log_level.unwrap_or("debug"),
                extra = setup.shim_toml,
            ),
        )
        .unwrap();
        if setup.configure {
            let out = Command::new(&shim_bin)
                .args(["configure", "containerd", "--config"])
                .arg(t.join("config.toml"))
                .arg("--shim-config")
                .arg(t.join("shim.toml"))
                .output()
                .expect("run configure containerd");
            assert!(
                out.status.success(),
                "configure containerd: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let images = build_images(&t.join("images"));
        let child = spawn_containerd(&t);
        let cri = Cri {
            dir: t.clone(),
            sock,
            cgroup_root: format!("/nri-cri-lane-{}", std::process::id()),
            subnet,
            bridge,
            shim_state,
            child: Mutex::new(Some(child)),
            _tmp: Mutex::new(Some(tmp)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cri.ctr(&["version"]).status.success() {
            assert!(Instant::now() < deadline, "containerd did not start: {}", cri.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = cri.ctr(&["-n", "k8s.io", "images", "import", &images.display().to_string()]);
        assert!(
            out.status.success(),
            "ctr images import: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // CRI learns of imported images through events: wait until it sees both.
        block_on(async {
            let mut c = cri.client().await;
            for image in [BUSYBOX, PAUSE] {
                loop {
                    let st = c
                        .img
                        .image_status(api::ImageStatusRequest {
                            image: Some(api::ImageSpec {
                                image: image.into(),
                                ..Default::default()
                            }),
                            verbose: false,
                        })
                        .await;
                    if matches!(&st, Ok(r) if r.get_ref().image.is_some()) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "CRI does not see {image} after the import: {st:?}\n{}",
                        cri.log()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        cri
    }

    /// Stops containerd (SIGTERM; its shims and containers run on) and starts
    /// it again with the same config file; waits until CRI answers.
    pub fn restart(&self) {
        use nix::{sys::signal::Signal, unistd::Pid};
        let mut guard = self.child.lock().unwrap();
        if let Some(mut child) = guard.take() {
            let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = child.wait();
        }
        *guard = Some(spawn_containerd(&self.dir));
        drop(guard);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not start again: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The ttrpc API answers before the CRI plugin has loaded its state:
        // until then every CRI call fails with "server is not initialized yet".
        block_on(async {
            loop {
                let ready = match self
                    .client()
                    .await
                    .rt
                    .status(api::StatusRequest { verbose: false })
                    .await
                {
                    Ok(r) => r
                        .get_ref()
                        .status
                        .as_ref()
                        .is_some_and(|s| s.conditions.iter().any(|c| c.r#type == "RuntimeReady" && c.status)),
                    Err(_) => false,
                };
                if ready {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "CRI did not become ready after the restart: {}",
                    self.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }

    /// Starts containerd again if it has exited (as a supervisor would,
    /// for a test that restarts it with a signal); returns whether it did.
    /// Nothing after [`Cri::teardown`].
    pub fn respawn_if_exited(&self) -> bool {
        let mut guard = self.child.lock().unwrap();
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        *guard = Some(spawn_containerd(&self.dir));
        true
    }

    /// The pid of the containerd started last.
    pub fn containerd_pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// A CRI client on containerd's socket (create it in the runtime that uses it).
    pub async fn client(&self) -> Client {
        let channel = channel(self.sock.clone(), RPC_TIMEOUT)
            .await
            .expect("connect to containerd's CRI socket");
        Client {
            rt: RuntimeServiceClient::new(channel.clone()),
            img: ImageServiceClient::new(channel),
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

    /// containerd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// The last `n` lines of containerd's log and of the shim daemon's log.
    pub fn logs_tail(&self, n: usize) -> String {
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        };
        format!(
            "--- containerd.log (tail) ---\n{}\n--- shim.log (tail) ---\n{}",
            tail(self.log()),
            tail(self.shim_log())
        )
    }

    /// containerd's own NRI socket, where [`CriSetup::containerd_nri`]
    /// turned it on.
    pub fn containerd_nri_socket(&self) -> PathBuf {
        self.dir.join("containerd-nri/nri.sock")
    }

    /// Where [`CriSetup::registry_hosts`] points CRI's pulls: a
    /// `<registry host>/hosts.toml` there configures that registry.
    pub fn registry_hosts_dir(&self) -> PathBuf {
        self.dir.join("certs.d")
    }

    /// The shim's NRI socket (external plugins), there while its daemon runs.
    pub fn shim_nri_socket(&self) -> PathBuf {
        self.dir.join("nri/nri.sock")
    }

    /// The nri-shim daemon's whole `shim.log`.
    pub fn shim_log(&self) -> String {
        let mut shim = String::new();
        for d in std::fs::read_dir(&self.shim_state).into_iter().flatten().flatten() {
            shim.push_str(&std::fs::read_to_string(d.path().join("shim.log")).unwrap_or_default());
        }
        shim
    }

    /// A pod config for `handler`: unique name and uid, a log directory,
    /// `cgroup_parent` under [`Cri::cgroup_root`]; `f` edits it.
    pub fn pod_config(
        &self,
        name: &str,
        namespace: &str,
        handler: &str,
        f: impl FnOnce(&mut api::PodSandboxConfig),
    ) -> api::PodSandboxConfig {
        let uid = format!("{name}-{handler}-{}", std::process::id());
        let log_directory = self.dir.join("pod-logs").join(&uid);
        std::fs::create_dir_all(&log_directory).unwrap();
        let mut cfg = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: format!("{name}-{handler}"),
                uid: uid.clone(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.chars().take(63).collect(),
            log_directory: log_directory.display().to_string(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/{uid}", self.cgroup_root),
                // kubelet's defaults: pod network and IPC, a PID namespace per container.
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Pod as i32,
                        pid: api::NamespaceMode::Container as i32,
                        ipc: api::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        f(&mut cfg);
        cfg
    }

    /// The host path of file `file` of container `id`'s cgroup in the pod
    /// `pod` (cgroupfs: `<cgroup_parent>/<id>`): under the v1 controller
    /// `controller`'s hierarchy, or, on a pure cgroup v2 host, in the one
    /// hierarchy (`controller` unused there: v2 has one directory).
    pub fn cgroup_file(&self, pod: &api::PodSandboxConfig, id: &str, controller: &str, file: &str) -> PathBuf {
        let parent = &pod.linux.as_ref().unwrap().cgroup_parent;
        crate::cgroup::file(&format!("{parent}/{id}"), controller, file)
    }

    /// Stops and removes every pod, then containerd, the shim daemon, the
    /// bridge, the lane's cgroups and the temp dir. Idempotent.
    pub fn teardown(&self) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(60), async {
                let mut c = self.client().await;
                let pods =
                    c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
                        .await
                        .map(|r| r.into_inner().items)
                        .unwrap_or_default();
                for p in pods {
                    let _ =
                        c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
                            pod_sandbox_id: p.id.clone(),
                        })
                        .await;
                    let _ =
                        c.rt.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: p.id })
                            .await;
                }
            })
            .await;
        });
        let tasks = String::from_utf8_lossy(&self.ctr(&["-n", "k8s.io", "t", "ls", "-q"]).stdout).into_owned();
        for id in tasks.lines() {
            let _ = self.ctr(&["-n", "k8s.io", "t", "kill", "-s", "SIGKILL", id]);
            let _ = self.ctr(&["-n", "k8s.io", "t", "rm", "-f", id]);
        }
        use nix::{sys::signal::Signal, unistd::Pid};
        // The shim daemon, and any runc shim left by a refused create.
        crate::kill_shims_of(&self.sock);
        let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
        // The lane's cgroups, deepest first, in every v1 controller.
        for ctl in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            remove_cgroup_tree(&ctl.path().join(self.cgroup_root.trim_start_matches('/')));
        }
        // Mounts left under the temp dir (deepest first) before removing it.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = self.dir.display().to_string();
        let mut mounts: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", m]).stderr(Stdio::null()).status();
        }
        drop(self._tmp.lock().unwrap().take());
    }
}

impl Drop for Cri {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Runs `f` to completion on a runtime of its own, in a thread of its own
/// (callers may be inside a test's runtime, or in an `atexit` hook).
pub fn block_on<F: std::future::Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(f)
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

static SHARED: OnceLock<Cri> = OnceLock::new();

extern "C" fn teardown_shared() {
    if let Some(c) = SHARED.get() {
        c.teardown();
    }
}

/// The lane's containerd, shared by the tests of one test binary: started
/// on first use with `nri-adjuster` pre-installed in the shim (adds
/// [`NRI_ENV`] to containers of pods in [`NRI_NAMESPACE`]), torn down when
/// the binary exits.
pub fn shared() -> &'static Cri {
    SHARED.get_or_init(|| {
        let rule = format!(
            "[[rule]]\nname = \"cri-lane\"\n[rule.match]\npod_namespace = \"{NRI_NAMESPACE}\"\n[rule.adjust]\nenv = {{ {} = \"{}\" }}\n",
            NRI_ENV.0, NRI_ENV.1
        );
        let cri = Cri::start(CriSetup {
            plugins: vec![("10-adjuster", workspace_bin("nri-adjuster"), rule)],
            ..Default::default()
        });
        // SAFETY: registers a plain `extern "C" fn` that runs at exit.
        unsafe { libc::atexit(teardown_shared) };
        cri
    })
}

/// CRI clients (runtime and image services) on one channel.
#[derive(Clone)]
pub struct Client {
    /// RuntimeService.
    pub rt: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub img: ImageServiceClient<Channel>,
}

/// A container config: `name`, the busybox image, `command`, its log at
/// `<name>.log` in the pod's log directory.
pub fn container(name: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Client {
    /// RunPodSandbox with `handler`; returns the pod id.
    pub async fn run_pod(&mut self, cfg: &api::PodSandboxConfig, handler: &str) -> String {
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{handler}: RunPodSandbox: {e}"))
            .into_inner()
            .pod_sandbox_id
    }

    /// CreateContainer; returns the container id. A container without
    /// namespace options gets the pod's, as kubelet sends them.
    pub async fn create(&mut self, pod: &str, pod_cfg: &api::PodSandboxConfig, cfg: api::ContainerConfig) -> String {
        self.try_create(pod, pod_cfg, cfg)
            .await
            .unwrap_or_else(|e| panic!("CreateContainer in {pod}: {e}"))
    }

    /// CreateContainer as [`Client::create`] sends it; returns the
    /// container id or CRI's refusal.
    pub async fn try_create(
        &mut self,
        pod: &str,
        pod_cfg: &api::PodSandboxConfig,
        mut cfg: api::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        let pod_ns = pod_cfg
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        if let Some(sc) = cfg.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
            if sc.namespace_options.is_none() {
                sc.namespace_options = pod_ns;
            }
        }
        self.rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(cfg),
                sandbox_config: Some(pod_cfg.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    /// CreateContainer and StartContainer; returns the container id.
    pub async fn create_start(
        &mut self,
        pod: &str,
        pod_cfg: &api::PodSandboxConfig,
        cfg: api::ContainerConfig,
    ) -> String {
        let id = self.create(pod, pod_cfg, cfg).await;
        self.start(&id).await;
        id
    }

    /// CreateContainer and StartContainer, then waits (up to `timeout`)
    /// until the container runs; returns its id.
    pub async fn create_running(
        &mut self,
        pod: &str,
        pod_cfg: &api::PodSandboxConfig,
        cfg: api::ContainerConfig,
        timeout: Duration,
    ) -> String {
        let id = self.create_start(pod, pod_cfg, cfg).await;
        self.wait_state(&id, api::ContainerState::ContainerRunning, timeout)
            .await;
        id
    }

    /// StartContainer.
    pub async fn start(&mut self, id: &str) {
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {id}: {e}"));
    }

    /// ContainerStatus.
    pub async fn status(&mut self, id: &str) -> Result<api::ContainerStatus, tonic::Status> {
        self.rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().status.expect("status"))
    }

    /// Waits (up to `timeout`) until container `id` is in `state`.
    pub async fn wait_state(
        &mut self,
        id: &str,
        state: api::ContainerState,
        timeout: Duration,
    ) -> api::ContainerStatus {
        self.wait_state_every(id, state, timeout, Duration::from_millis(50))
            .await
    }

    /// [`Client::wait_state`], asking every `every`.
    pub async fn wait_state_every(
        &mut self,
        id: &str,
        state: api::ContainerState,
        timeout: Duration,
        every: Duration,
    ) -> api::ContainerStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self
                .status(id)
                .await
                .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"));
            if st.state == state as i32 {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "container {id} not {state:?} within {timeout:?}: {st:?}"
            );
            tokio::time::sleep(every).await;
        }
    }

    /// ExecSync `cmd` with a timeout in seconds (0: none).
    pub async fn exec(&mut self, id: &str, cmd: &[&str], timeout: i64) -> Result<api::ExecSyncResponse, tonic::Status> {
        self.rt
            .exec_sync(api::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// ExecSync `sh -c script` (10 s timeout); returns stdout, panics on an error.
    pub async fn sh(&mut self, id: &str, script: &str) -> String {
        let r = self
            .exec(id, &["sh", "-c", script], 10)
            .await
            .unwrap_or_else(|e| panic!("ExecSync in {id}: {e}"));
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    /// StopContainer with a timeout in seconds.
    pub async fn stop(&mut self, id: &str, timeout: i64) -> Result<(), tonic::Status> {
        self.rt
            .stop_container(api::StopContainerRequest {
                container_id: id.into(),
                timeout,
            })
            .await
            .map(|_| ())
    }

    /// RemoveContainer.
    pub async fn remove(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .remove_container(api::RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .map(|_| ())
    }

    /// PodSandboxStatus.
    pub async fn pod_status(&mut self, id: &str) -> Result<api::PodSandboxStatus, tonic::Status> {
        self.rt
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().status.expect("pod status"))
    }

    /// StopPodSandbox and RemovePodSandbox; panics if either fails.
    pub async fn remove_pod(&mut self, id: &str) {
        self.remove_pod_timed(id).await;
    }

    /// [`Client::remove_pod`], returning how long StopPodSandbox and
    /// RemovePodSandbox each took (the density bench reports them apart).
    pub async fn remove_pod_timed(&mut self, id: &str) -> (Duration, Duration) {
        let t = Instant::now();
        self.rt
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("StopPodSandbox {id}: {e}"));
        let stopped = t.elapsed();
        self.rt
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("RemovePodSandbox {id}: {e}"));
        (stopped, t.elapsed() - stopped)
    }
}

/// A CRI log file's lines without their timestamps (`stdout F text`), sorted.
pub fn log_lines(pod: &api::PodSandboxConfig, container: &str) -> Vec<String> {
    let path = Path::new(&pod.log_directory).join(format!("{container}.log"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.split_once(' ').map(|(_, rest)| rest).unwrap_or(l).to_string())
        .collect();
    lines.sort();
    lines
}
