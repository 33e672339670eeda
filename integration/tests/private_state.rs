//! What the shim keeps on a node is private (issue 43): after a full CRI
//! lifecycle (pod and container created, exec'd, updated, stopped,
//! deleted, and one create refused by a plugin) in which a plugin put a
//! marker into a container's env, a mount source, an OCI hook's arguments
//! and an annotation, an unprivileged local user (`nobody`, see
//! `integration::probe`) can read no file, list no directory and connect
//! to no socket of the shim's, and finds the marker nowhere; every
//! directory the shim made is `0700` and every file `0600`. The log at
//! `info` and the metrics endpoint carry no marker; `inspect` (root) shows
//! it.
//!
//! The state root is on a `0755` tmpfs under a `0755` directory, as
//! `/run/nri-shim` is under `/run` on a node: only the shim's own modes
//! keep `nobody` out. The same probe on runc's root and containerd's own
//! state, with the same values put into runc's container through CRI, is
//! printed beside ours (`-- --nocapture`); it is not asserted (it is
//! containerd's and runc's). Runs on the containerd line `NRI_CONTAINERD`
//! names. Root only.

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use integration::{
    Behaviour, EventLog,
    containerd::workspace_bin,
    cri::{CRI_NAMESPACE, Client, Cri, CriSetup, api, container},
    free_port,
    probe::{ProbeReport, ProbeRequest, run_as_nobody, tree},
    scrape,
};

const WAIT: Duration = Duration::from_secs(30);
/// The container name the refusing plugin refuses.
const REFUSED: &str = "refused";
const REFUSAL: &str = "refused by the test's policy plugin";

/// A marker unique to this run (so an older run's leftovers cannot match).
fn marker(who: &str) -> String {
    format!("s3cr3t-{who}-{}", std::process::id())
}

/// The plugin that injects `m` into env, a tmpfs mount's source, a
/// createRuntime hook's arguments and an annotation of every container.
fn injector(m: &str) -> (&'static str, PathBuf, String) {
    let b = Behaviour {
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({
            "env": [{"key": "DB_PASSWORD", "value": m}],
            "mounts": [{"destination": "/secret-mnt", "type": "tmpfs", "source": m, "options": ["nosuid"]}],
            "hooks": {"createRuntime": [{"path": "/bin/true", "args": ["true", m]}]},
            "annotations": {"example.com/secret": m},
        })),
        ..Default::default()
    };
    (
        "10-injector",
        workspace_bin("nri-test-plugin"),
        serde_json::to_string(&b).unwrap(),
    )
}

/// The plugin that refuses the create of containers named [`REFUSED`],
/// logging what it is sent to `log`.
fn refuser(log: &Path) -> (&'static str, PathBuf, String) {
    let b = Behaviour {
        events: Some("CreateContainer".into()),
        log: Some(log.to_path_buf()),
        fail: [("CreateContainer".to_string(), REFUSAL.to_string())].into(),
        only_container: Some(REFUSED.into()),
        ..Default::default()
    };
    (
        "20-refuser",
        workspace_bin("nri-test-plugin"),
        serde_json::to_string(&b).unwrap(),
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The bundle containerd made for task `id` (CRI's namespace).
fn bundle(cri: &Cri, id: &str) -> PathBuf {
    run_dir(cri)
        .join("state/io.containerd.runtime.v2.task")
        .join(CRI_NAMESPACE)
        .join(id)
}

/// The tmpfs holding containerd's state, runc's root and the shim's state.
fn run_dir(cri: &Cri) -> PathBuf {
    cri.shim_state.parent().unwrap().to_path_buf()
}

fn nri_socket(cri: &Cri) -> PathBuf {
    cri.dir.join("nri/nri.sock")
}

/// The files the shim writes into a bundle: the adjusted spec, containerd's
/// `address` and its own record (both from `start`, which containerd 2.x
/// runs for a pod's sandbox only), the init's exit status.
const BUNDLE_FILES: [&str; 4] = ["config.json", "address", "nri-shim.json", "nri-shim-exit-status"];

/// Bundles of containers (whose spec the plugins adjusted) and of pod
/// sandboxes (whose `config.json` no plugin adjusts: containerd's).
#[derive(Default)]
struct Bundles {
    containers: Vec<PathBuf>,
    sandboxes: Vec<PathBuf>,
}

impl Bundles {
    /// Of [`BUNDLE_FILES`] in the bundles, those the shim wrote.
    fn shim_files(&self) -> Vec<PathBuf> {
        let containers = self.containers.iter().flat_map(|b| BUNDLE_FILES.map(|f| b.join(f)));
        let sandboxes = self
            .sandboxes
            .iter()
            .flat_map(|b| BUNDLE_FILES[1..].iter().map(|f| b.join(f)));
        containers.chain(sandboxes).filter(|p| p.exists()).collect()
    }
}

/// What the shim owns at this moment: its state root, the NRI socket,
/// and the files it wrote into its tasks' bundles.
fn shim_paths(cri: &Cri, bundles: &Bundles) -> Vec<PathBuf> {
    let mut paths = tree(&cri.shim_state);
    paths.push(nri_socket(cri));
    paths.extend(bundles.shim_files());
    paths
}

/// Every directory under the state root is 0700, every file 0600, every
/// socket in a 0700 directory; the NRI socket is 0600; the bundle files
/// the shim wrote are 0600.
fn assert_modes(cri: &Cri, bundles: &Bundles) {
    let mut wrong = Vec::new();
    for p in tree(&cri.shim_state) {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let ft = meta.file_type();
        let m = mode(&p);
        let ok = if ft.is_dir() {
            m == 0o700
        } else if ft.is_socket() {
            mode(p.parent().unwrap()) == 0o700
        } else {
            m == 0o600
        };
        if !ok {
            wrong.push(format!("{} {m:04o}", p.display()));
        }
    }
    if mode(&nri_socket(cri)) != 0o600 {
        wrong.push(format!("{} {:04o}", nri_socket(cri).display(), mode(&nri_socket(cri))));
    }
    for p in bundles.shim_files() {
        if mode(&p) != 0o600 {
            wrong.push(format!("{} {:04o}", p.display(), mode(&p)));
        }
    }
    assert!(wrong.is_empty(), "not private:\n{}", wrong.join("\n"));
}

/// The probe as nobody over `paths`, searching the node's state trees.
fn probe(cri: &Cri, paths: Vec<PathBuf>, markers: &[&str]) -> ProbeReport {
    let bin = cri.dir.join("nri-nobody-probe");
    if !bin.exists() {
        // Where nobody can run it (the checkout need not be reachable).
        std::fs::copy(workspace_bin("nri-nobody-probe"), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    run_as_nobody(
        &bin,
        &ProbeRequest {
            paths,
            // containerd's state, runc's root and ours (the tmpfs), and
            // containerd's root (its database, content and snapshots). Not
            // the plugins' own config files (the operator's, in
            // `nri/conf.d`), which hold the marker by construction.
            search: vec![run_dir(cri), cri.dir.join("root")],
            markers: markers.iter().map(|m| m.to_string()).collect(),
        },
    )
}

async fn pod(c: &mut Client, cri: &Cri, handler: &str) -> (String, api::PodSandboxConfig) {
    let cfg = cri.pod_config("private", "private-state", handler, |_| {});
    (c.run_pod(&cfg, handler).await, cfg)
}

async fn update(c: &mut Client, id: &str) {
    c.rt.update_container_resources(api::UpdateContainerResourcesRequest {
        container_id: id.into(),
        linux: Some(api::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("UpdateContainerResources {id}: {e}"));
}

#[tokio::test]
async fn nothing_the_shim_keeps_is_readable_by_another_user() {
    let port = free_port();
    let ours = marker("nri-shim");
    let theirs = marker("runc");
    let metrics_toml = format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n");
    let seen_by_plugin = tempfile::tempdir().unwrap();
    let plugin_log = EventLog::new(seen_by_plugin.path().join("20-refuser.jsonl"));
    let cri = Cri::start(CriSetup {
        plugins: vec![injector(&ours), refuser(plugin_log.path())],
        run_on_tmpfs: true,
        shim_log_level: Some("info"),
        shim_toml: &metrics_toml,
        ..Default::default()
    });
    // As on a node: the state's parents let any user pass (the temp dir
    // is 0700; /run is 0755).
    std::fs::set_permissions(&cri.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(mode(&run_dir(&cri)), 0o755);
    let markers = [ours.as_str(), theirs.as_str()];
    let mut c = cri.client().await;

    // nri-shim: the plugin's values reach the container.
    let (pod_id, pod_cfg) = pod(&mut c, &cri, "nri-shim").await;
    let id = c
        .create_running(&pod_id, &pod_cfg, container("app", &["sleep", "3600"]), WAIT)
        .await;
    let seen = c
        .sh(&id, "echo env=$DB_PASSWORD; grep -c ' /secret-mnt ' /proc/mounts")
        .await;
    assert_eq!(seen, format!("env={ours}\n1\n"));
    update(&mut c, &id).await;
    let b = bundle(&cri, &id);
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    let spec_text = spec.to_string();
    for (what, needle) in [
        ("env", format!("DB_PASSWORD={ours}")),
        ("mount source", format!("\"source\":\"{ours}\"")),
        ("hook args", format!("\"args\":[\"true\",\"{ours}\"]")),
        ("annotation", format!("\"example.com/secret\":\"{ours}\"")),
    ] {
        assert!(spec_text.contains(&needle), "{what}: {needle} not in the adjusted spec");
    }
    // Root sees it all through `inspect`.
    let inspect = std::process::Command::new(workspace_bin("containerd-shim-nri-shim-v2"))
        .env("NRI_SHIM_CONFIG", cri.dir.join("shim.toml"))
        .args(["-namespace", CRI_NAMESPACE, "inspect", &id])
        .output()
        .unwrap();
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.contains(&ours), "inspect shows no marker:\n{inspect}");
    // A later plugin is sent the container as the earlier ones adjusted it
    // (NRI's adjusted view): what one plugin injects, the next one sees.
    let sent: Vec<_> = plugin_log
        .lines()
        .into_iter()
        .filter(|l| l.event == "CreateContainer" && l.container_name == "app")
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].env.contains(&format!("DB_PASSWORD={ours}")),
        "{:?}",
        sent[0].env
    );

    // While it runs: the state of a live container, libcontainer's included.
    let bundles = Bundles {
        containers: vec![b.clone()],
        sandboxes: vec![bundle(&cri, &pod_id)],
    };
    assert_modes(&cri, &bundles);
    let running = probe(&cri, shim_paths(&cri, &bundles), &markers);
    assert!(running.tried > 10, "{}", running.summary());

    // runc on the same values, given through CRI (no NRI on its path).
    let (runc_pod, runc_cfg) = pod(&mut c, &cri, "runc").await;
    let src = cri.dir.join(format!("src-{theirs}"));
    std::fs::create_dir_all(&src).unwrap();
    let mut cc = container("app", &["sleep", "3600"]);
    cc.envs.push(api::KeyValue {
        key: "DB_PASSWORD".into(),
        value: theirs.clone(),
    });
    cc.annotations.insert("example.com/secret".into(), theirs.clone());
    cc.mounts.push(api::Mount {
        container_path: "/secret-mnt".into(),
        host_path: src.display().to_string(),
        ..Default::default()
    });
    let runc_id = c.create_running(&runc_pod, &runc_cfg, cc, WAIT).await;
    update(&mut c, &runc_id).await;
    let runc_bundle = bundle(&cri, &runc_id);
    let mut runc_paths = tree(&run_dir(&cri).join("runc"));
    runc_paths.extend(tree(&runc_bundle));
    let runc_probe = probe(&cri, runc_paths, &markers);
    let bundle_modes = |b: &Path| {
        format!(
            "bundle {:04o}, config.json {:04o}",
            mode(b),
            mode(&b.join("config.json"))
        )
    };
    eprintln!(
        "containerd {}, running:\n  nri-shim ({}): {}\n  runc and containerd ({}): {}",
        integration::containerd::containerd_line(),
        bundle_modes(&b),
        running.summary(),
        bundle_modes(&runc_bundle),
        runc_probe.summary()
    );

    // The rest of the lifecycle, and a create a plugin refuses.
    c.stop(&id, 10).await.unwrap();
    c.remove(&id).await.unwrap();
    // CRI's CreateContainer only records the container; the task (and
    // NRI's CreateContainer) is created by StartContainer.
    let refused_id = c
        .create(&pod_id, &pod_cfg, container(REFUSED, &["sleep", "3600"]))
        .await;
    let refused =
        c.rt.start_container(api::StartContainerRequest {
            container_id: refused_id.clone(),
        })
        .await
        .expect_err("the refusing plugin's create");
    assert!(refused.message().contains(REFUSAL), "{refused:?}");
    c.remove_pod(&pod_id).await;
    c.remove_pod(&runc_pod).await;
    let after = probe(&cri, shim_paths(&cri, &Bundles::default()), &markers);
    assert_modes(&cri, &Bundles::default());

    // What leaves the daemon: its log at info, the metrics' labels.
    let log = cri.shim_log();
    assert!(!log.is_empty(), "no shim.log under {}", cri.shim_state.display());
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains(&ours)).collect();
    let metrics = scrape(port);
    eprintln!("after the lifecycle:\n  nri-shim: {}", after.summary());
    assert!(running.is_private(), "while running: {}", running.summary());
    assert!(after.is_private(), "after the lifecycle: {}", after.summary());
    assert!(
        leaked.is_empty(),
        "shim.log at info carries the marker:\n{}",
        leaked.join("\n")
    );
    assert!(metrics.contains("nri_shim_"), "no metrics: {metrics}");
    assert!(!metrics.contains(&ours), "the metrics carry the marker:\n{metrics}");
}

/// Every path under `root` whose mode grants group or others anything.
fn loose(root: &Path) -> Vec<String> {
    tree(root)
        .into_iter()
        .filter(|p| !std::fs::symlink_metadata(p).unwrap().file_type().is_socket() && mode(p) & 0o077 != 0)
        .map(|p| format!("{} {:04o}", p.display(), mode(&p)))
        .collect()
}

const TIGHTENED: &str = "made private";

/// A state root an older nri-shim left readable (0755 directories, 0644
/// files, as it made them) is made private when a daemon starts, and again
/// when an upgrade's new image takes over; each time the log says so once.
#[test]
fn a_state_root_left_readable_is_made_private_at_start_and_on_upgrade() {
    use integration::containerd::{Containerd, Setup, output_text};
    let c = Containerd::start(Setup {
        idle_timeout: "60s",
        ..Setup::default()
    });
    let set = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let old = c.shim_state.join("0123456789abcdef");
    std::fs::create_dir_all(old.join("audit/default")).unwrap();
    std::fs::write(old.join("audit/default/gone.json"), "an older record").unwrap();
    std::fs::write(old.join("shim.log"), "an older log\n").unwrap();
    for d in [&c.shim_state, &old, &old.join("audit"), &old.join("audit/default")] {
        set(d, 0o755);
    }
    set(&old.join("audit/default/gone.json"), 0o644);
    set(&old.join("shim.log"), 0o644);
    assert_eq!(loose(&c.shim_state).len(), 6);

    // The daemon's start.
    let out = c.run("priv-up", &["-d"], &["/bin/sleep", "1000"]);
    assert!(out.status.success(), "ctr run: {}", output_text(&out));
    c.wait_status("priv-up", "RUNNING");
    assert_eq!(loose(&c.shim_state), Vec::<String>::new());
    let said = |c: &Containerd| c.shim_log().lines().filter(|l| l.contains(TIGHTENED)).count();
    assert_eq!(said(&c), 1, "{}", c.shim_log());

    // An upgrade: the new image tightens what became loose meanwhile.
    let live = std::fs::read_dir(&c.shim_state)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p != &old)
        .expect("the daemon's directory");
    set(&live.join("shim.log"), 0o644);
    set(&live.join("audit"), 0o755);
    let binary = c.dir.path().join("bin/containerd-shim-nri-shim-v2");
    std::fs::remove_file(&binary).unwrap();
    std::fs::copy(workspace_bin("containerd-shim-nri-shim-v2"), &binary).unwrap();
    let out = std::process::Command::new(&binary)
        .args(["-address", &c.sock.display().to_string(), "upgrade"])
        .env("NRI_SHIM_CONFIG", c.shim_config())
        .output()
        .unwrap();
    assert!(out.status.success(), "upgrade: {}", output_text(&out));
    assert_eq!(loose(&c.shim_state), Vec::<String>::new());
    assert_eq!(said(&c), 2, "{}", c.shim_log());
    let out = c.ctr(&["t", "kill", "-s", "9", "priv-up"]);
    assert!(out.status.success(), "ctr t kill: {}", output_text(&out));
}
