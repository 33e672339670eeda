//! critest, the CRI validation suite of cri-tools (built from its Go module
//! with the other reference peers), run against the CRI lane once per
//! runtime handler, with the images it pulls served by a registry of ours
//! on the loopback.
//!
//! No registry outside the machine is reachable, so every image critest
//! names is a stand-in built here from busybox-static (the lane's own
//! rootfs) plus what that test reads of it: the user a `USER` line names,
//! an `/etc/group` entry, a web server on the port the test dials, a file
//! that makes two images differ. They are pushed with `crane` (from
//! go-containerregistry, a Go peer) into `crane registry serve`, an
//! in-memory OCI distribution registry on `127.0.0.1`, and containerd's
//! registry hosts configuration (`hosts.toml`, [`mirror`]) makes it the
//! mirror of the registries critest names: the images keep their names
//! and tags. (critest's `--registry-prefix` would not do: with it, critest
//! drops every tag and pulls `:latest`.)
//!
//! The one image no stand-in can be is the one critest pins by digest
//! (`test-image-digest@sha256:...`): its tests fail for every handler.

use std::{
    collections::BTreeMap,
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    containerd::go_peers_bin,
    cri::{LAYER_TAR, blob, image_manifest},
};

/// One stand-in image: its name under the registry prefix (with its tag),
/// the `User` and `Cmd` of its config, and files added over busybox.
pub struct StandIn {
    /// `<path>:<tag>` in the registry: the image's name without its
    /// registry's host (`registry.k8s.io`, `gcr.io`, `k8s.gcr.io`), which the
    /// mirror serves under one.
    pub name: String,
    /// The config's `User` (empty: root).
    pub user: &'static str,
    /// The config's `Cmd`.
    pub cmd: &'static [&'static str],
    /// Files of the image's own layer.
    pub files: Vec<File>,
}

/// A file of a stand-in's own layer: its path (relative to `/`), bytes and
/// permission bits (`0o4755`: setuid).
pub struct File {
    /// Path relative to the root.
    pub path: String,
    /// Content.
    pub content: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// A regular file with mode 0644.
fn text(path: &str, content: impl Into<String>) -> File {
    File {
        path: path.into(),
        content: content.into().into_bytes(),
        mode: 0o644,
    }
}

/// The users and groups of a busybox image, as the upstream busybox images
/// ship them: critest's tests read `id` output and resolve `www-data`.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
bin:x:2:2:bin:/bin:/bin/false\nsys:x:3:3:sys:/dev:/bin/false\nmail:x:8:8:mail:/var/spool/mail:/bin/false\n\
www-data:x:33:33:www-data:/var/www:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n";
const GROUP: &str = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\ndisk:x:6:\n\
mail:x:8:\nwheel:x:10:root\nwww-data:x:33:\nusers:x:100:\nnogroup:x:65534:\n";

/// A web server's document: `httpd` answers `GET /` with 200 and this.
const INDEX: &str = "<html><body>stand-in web server</body></html>\n";

/// The nginx stand-in's `/usr/sbin/nginx`: what critest reads of nginx is
/// a process named `nginx` (`pidof`) whose command line says `master
/// process`, its pid in `/var/run/nginx.pid`, and a page on port 80. The
/// script is that process (the kernel names it after the script) and runs
/// busybox's `httpd`; it stops on SIGTERM as nginx does.
const NGINX: &str = "#!/bin/sh\nmkdir -p /var/run\necho $$ > /var/run/nginx.pid\n\
httpd -f -p \"${PORT:-80}\" -h /www &\nchild=$!\ntrap 'kill $child; exit 0' TERM INT QUIT\nwait\n";

/// The Apache httpd stand-in's command: says `httpd` on its log (critest
/// looks for it there) and serves port 80.
const HTTPD: &[&str] = &[
    "sh",
    "-c",
    "echo httpd: serving on port 80; exec httpd -f -p 80 -h /www",
];

/// Every image critest v1.37 pulls (Linux, amd64), as stand-ins.
///
/// - `e2e-test-images/busybox:1.29-2`: the default container image.
/// - `e2e-test-images/nginx:1.14-2` and `.../hostnet-nginx-amd64`: a web
///   server on port 80 (pod network) and 12003 (host network) that looks
///   like nginx where critest looks (a script that names itself nginx);
///   `httpd:2.4.39-4`: busybox `httpd` on port 80.
/// - `e2e-test-images/nonewprivs:1.3`: a setuid-root program printing its
///   effective uid (ours, `peers/cmd/effective-uid`).
/// - `test-image-user-*`: `USER` 1002, `www-data`, `1003:1004`,
///   `www-data:1004`, as cri-tools' image build script sets them.
/// - `test-image-predefined-group`: user 1000 (`default-user`), a member
///   of group 50000 in `/etc/group`.
/// - `test-image-{1,2,3}` differ (a file named after each);
///   `test-image-tags:{1,2,3}` are one image under three tags;
///   `test-image-tag:{test,all}`, `test-image-latest` and `pause:3.9`.
pub fn stand_ins() -> Vec<StandIn> {
    const SH: &[&str] = &["sh"];
    let r = "k8s-staging-cri-tools";
    let mut v = vec![
        StandIn {
            name: "e2e-test-images/busybox:1.29-2".into(),
            user: "",
            cmd: SH,
            files: vec![],
        },
        StandIn {
            name: "e2e-test-images/nginx:1.14-2".into(),
            user: "",
            cmd: &["/usr/sbin/nginx", "master process"],
            files: nginx(),
        },
        StandIn {
            name: "e2e-test-images/httpd:2.4.39-4".into(),
            user: "",
            cmd: HTTPD,
            files: vec![text("www/index.html", INDEX)],
        },
        StandIn {
            name: "e2e-test-images/nonewprivs:1.3".into(),
            user: "",
            cmd: &["/effective-uid"],
            files: vec![File {
                path: "effective-uid".into(),
                content: std::fs::read(peer("effective-uid")).unwrap(),
                mode: 0o4755,
            }],
        },
        StandIn {
            name: "pause:3.9".into(),
            user: "",
            cmd: &["sleep", "2147483647"],
            files: vec![],
        },
    ];
    // The host-network nginx listens on 12003.
    let mut hostnet = nginx();
    hostnet[0].content = NGINX.replace("${PORT:-80}", "12003").into_bytes();
    v.push(StandIn {
        name: format!("{r}/hostnet-nginx-amd64:latest"),
        user: "",
        cmd: &["/usr/sbin/nginx", "master process"],
        files: hostnet,
    });
    for (image, user) in [
        ("test-image-user-uid", "1002"),
        ("test-image-user-username", "www-data"),
        ("test-image-user-uid-group", "1003:1004"),
        ("test-image-user-username-group", "www-data:1004"),
    ] {
        v.push(StandIn {
            name: format!("{r}/{image}:latest"),
            user,
            cmd: SH,
            files: vec![],
        });
    }
    v.push(StandIn {
        name: format!("{r}/test-image-predefined-group:latest"),
        user: "1000",
        cmd: SH,
        files: vec![
            text(
                "etc/passwd",
                format!("{PASSWD}default-user:x:1000:1000::/home/default-user:/bin/sh\n"),
            ),
            text(
                "etc/group",
                format!("{GROUP}default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"),
            ),
        ],
    });
    for (image, marker) in [
        ("test-image-1:latest", "test-image-1"),
        ("test-image-2:latest", "test-image-2"),
        ("test-image-3:latest", "test-image-3"),
        ("test-image-latest:latest", "test-image-latest"),
        ("test-image-tags:1", "same-image"),
        ("test-image-tags:2", "same-image"),
        ("test-image-tags:3", "same-image"),
        ("test-image-tag:test", "test"),
        ("test-image-tag:all", "all"),
    ] {
        v.push(StandIn {
            name: format!("{r}/{image}"),
            user: "",
            cmd: SH,
            files: vec![text(marker, format!("{marker}\n"))],
        });
    }
    v
}

/// The nginx stand-in's files: the script and its page.
fn nginx() -> Vec<File> {
    vec![
        File {
            path: "usr/sbin/nginx".into(),
            content: NGINX.as_bytes().to_vec(),
            mode: 0o755,
        },
        text("www/index.html", INDEX),
    ]
}

/// A program of the Go peers; panics, naming the script, when it is not built.
fn peer(name: &str) -> PathBuf {
    let p = go_peers_bin().join(name);
    assert!(p.exists(), "{} is missing: scripts/go-peers.sh builds it", p.display());
    p
}

/// A busybox rootfs as busybox's own images are made: each applet a hard
/// link to the one binary (a masked `/bin/ls` then masks `ls` only, as
/// critest's MaskedPaths spec expects), busybox's users and groups.
fn busybox_hardlinked(dir: &Path) {
    let busybox = Path::new("/bin/busybox");
    assert!(busybox.exists(), "/bin/busybox missing: apt-get install busybox-static");
    for d in [
        "bin", "proc", "sys", "dev", "tmp", "etc", "root", "run", "var/run", "www",
    ] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let bin = dir.join("bin/busybox");
    std::fs::copy(busybox, &bin).unwrap();
    let list = run(Command::new(busybox).arg("--list-full"));
    for applet in list.lines().filter(|a| !a.ends_with("/busybox")) {
        let path = dir.join(applet);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::hard_link(&bin, &path).unwrap_or_else(|e| panic!("link {}: {e}", path.display()));
    }
    std::fs::write(dir.join("etc/passwd"), PASSWD).unwrap();
    std::fs::write(dir.join("etc/group"), GROUP).unwrap();
    // `ipcs -m`, which Debian's busybox-static leaves out, as far as
    // critest reads it: the IPC namespace's shared memory segments, whose
    // ids critest looks for.
    let ipcs = dir.join("usr/bin/ipcs");
    std::fs::write(&ipcs, "#!/bin/sh\ncat /proc/sysvipc/shm\n").unwrap();
    std::fs::set_permissions(&ipcs, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A command's stdout; panics, with its output, when it fails.
fn run(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&crate::cri::run(cmd).stdout).into_owned()
}

/// `tar` of `dir` (numeric root ownership) into `out`.
fn tar(dir: &Path, out: &Path) {
    // The same files give the same bytes whenever they were written: the
    // three `test-image-tags` must be one image (one layer digest), which
    // differing mtimes broke whenever their files straddled a second.
    run(Command::new("tar")
        .args([
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "--sort=name",
            "-C",
        ])
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg("."));
}

/// Builds each stand-in as an OCI image layout of its own under `dir`
/// (busybox's layer shared, then the image's files as a second layer);
/// returns `(name, layout)` pairs for [`Registry::push`].
pub fn build_layouts(dir: &Path, images: &[StandIn]) -> Vec<(String, PathBuf)> {
    let base_dir = dir.join("base");
    busybox_hardlinked(&base_dir);
    let base_tar = dir.join("base.tar");
    tar(&base_dir, &base_tar);
    let base = std::fs::read(&base_tar).unwrap();
    images
        .iter()
        .enumerate()
        .map(|(i, image)| {
            let oci = dir.join(format!("oci-{i}"));
            std::fs::create_dir_all(oci.join("blobs/sha256")).unwrap();
            let files = dir.join(format!("files-{i}"));
            std::fs::create_dir_all(&files).unwrap();
            for f in &image.files {
                let p = files.join(&f.path);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, &f.content).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode)).unwrap();
            }
            let files_tar = dir.join(format!("files-{i}.tar"));
            tar(&files, &files_tar);
            let layers = [
                blob(&oci, LAYER_TAR, &base),
                blob(&oci, LAYER_TAR, &std::fs::read(&files_tar).unwrap()),
            ];
            let desc = image_manifest(&oci, &layers, image.cmd, image.user);
            let index = serde_json::json!({ "schemaVersion": 2, "manifests": [desc] });
            std::fs::write(oci.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
            std::fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
            (image.name.clone(), oci)
        })
        .collect()
}

/// The registries critest's images name.
pub const REGISTRIES: [&str; 3] = ["registry.k8s.io", "gcr.io", "k8s.gcr.io"];

/// Writes `<hosts_dir>/<registry>/hosts.toml` for each of [`REGISTRIES`]:
/// `http://<addr>` is that registry's one host (containerd's registry
/// hosts format, read at each pull by containerd 1.5 and later): a
/// `[host]` entry, which containerd 1.7 goes by (a `server` alone, it
/// ignored, and dialed the registry's own host), and the same address as
/// `server`, the fallback, so that no pull leaves the loopback, not even
/// for an image the stand-ins lack (seen: "not found" on 1.7 and 2.4).
pub fn mirror(hosts_dir: &Path, addr: &str) {
    for r in REGISTRIES {
        let d = hosts_dir.join(r);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("hosts.toml"),
            format!(
                "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
    }
}

/// A `crane registry serve` on a free loopback port, killed on drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

impl Registry {
    /// Starts the registry (memory only) and waits until it accepts
    /// connections (10 s).
    pub fn start(log: &Path) -> Registry {
        let addr = format!("127.0.0.1:{}", crate::free_port());
        let child = Command::new(peer("crane"))
            .args(["registry", "serve", "--address", &addr])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::options().append(true).open(log).unwrap())
            .spawn()
            .expect("start crane registry serve");
        let registry = Registry { child, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&registry.addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry does not listen on {}: {}",
                registry.addr,
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        registry
    }

    /// `crane push` of the layout as `<addr>/<name>`.
    pub fn push(&self, layout: &Path, name: &str) {
        run(Command::new(peer("crane"))
            .args(["push", "--insecure"])
            .arg(layout)
            .arg(format!("{}/{name}", self.addr)));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A spec's outcome in a ginkgo report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Passed.
    Passed,
    /// Skipped, with the reason the test gave.
    Skipped(String),
    /// Failed (or panicked, timed out, ...): the state and the failure message.
    Failed(String),
}

/// One critest run: every spec by its full name (the describe texts and the
/// `It` text, joined by spaces).
#[derive(Debug, Default)]
pub struct Outcome {
    /// Spec name → outcome.
    pub specs: BTreeMap<String, State>,
    /// critest's exit status (non-zero when any spec failed).
    pub exit: Option<i32>,
    /// Wall time of the run.
    pub took: Duration,
}

impl Outcome {
    /// `(passed, failed, skipped)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for s in self.specs.values() {
            match s {
                State::Passed => c.0 += 1,
                State::Failed(_) => c.1 += 1,
                State::Skipped(_) => c.2 += 1,
            }
        }
        c
    }
}

/// Reads ginkgo's JSON report (`--ginkgo.json-report`): the `It` specs.
///
/// # Panics
/// The file is missing or not a ginkgo report.
pub fn read_report(path: &Path) -> BTreeMap<String, State> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let suites: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut specs = BTreeMap::new();
    for suite in suites.as_array().expect("a ginkgo report is an array of suites") {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .collect();
            name.push(spec["LeafNodeText"].as_str().unwrap_or_default());
            let message = spec["Failure"]["Message"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .to_string();
            let state = match spec["State"].as_str().unwrap_or_default() {
                "passed" => State::Passed,
                "skipped" | "pending" => State::Skipped(message),
                other => State::Failed(format!("{other}: {message}")),
            };
            specs.insert(name.join(" "), state);
        }
    }
    specs
}

/// What one critest run is given.
pub struct Run<'a> {
    /// containerd's CRI socket.
    pub endpoint: &'a Path,
    /// The runtime handler every pod of the run names.
    pub handler: &'a str,
    /// The NRI socket critest's NRI tests attach their plugin to; `None`:
    /// critest skips them.
    pub nri_socket: Option<&'a Path>,
    /// Where the report, the log and critest's config go.
    pub dir: &'a Path,
}

/// Specs run at once: critest's own parallel mode (ginkgo nodes, started by
/// the `ginkgo` of the Go peers). Its specs mostly wait (a status polled
/// every 4 s, a container's exit): three at once take about a third of the
/// time on two cores; specs marked serial (the NRI ones) still run alone.
pub const NODES: u32 = 3;

/// Runs critest (its Linux validation suite on [`NODES`] nodes) and reads
/// its report. critest's own output goes to
/// `<dir>/critest-<handler>.log`.
pub fn run_critest(r: &Run<'_>) -> Outcome {
    let critest = peer("critest");
    assert!(
        critest.exists(),
        "{} is missing: scripts/go-peers.sh builds it",
        critest.display()
    );
    let endpoint = format!("unix://{}", r.endpoint.display());
    // critest reads crictl's config file (by default /etc/crictl.yaml):
    // one of ours, so that nothing of the machine's is used.
    let config = r.dir.join(format!("crictl-{}.yaml", r.handler));
    std::fs::write(
        &config,
        format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 60\n"),
    )
    .unwrap();
    let report = r.dir.join(format!("critest-{}.json", r.handler));
    let log = r.dir.join(format!("critest-{}.log", r.handler));
    let mut cmd = Command::new(&critest);
    cmd.arg(format!("--config={}", config.display()))
        .arg(format!("--runtime-endpoint={endpoint}"))
        .arg(format!("--image-endpoint={endpoint}"))
        .arg(format!("--runtime-handler={}", r.handler))
        .arg(format!("--ginkgo.json-report={}", report.display()))
        // The same order for both handlers: a difference is the runtime's.
        .arg("--ginkgo.randomize-all=false")
        .arg("--ginkgo.seed=1")
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.timeout=40m");
    // A developer's narrowing to some specs (a regular expression), run on
    // one node: critest does not hand a focus on to its parallel nodes.
    match std::env::var("NRI_CRITEST_FOCUS") {
        Ok(focus) => cmd.arg(format!("--ginkgo.focus={focus}")),
        Err(_) => cmd.arg(format!("--parallel={NODES}")),
    };
    if let Some(sock) = r.nri_socket {
        cmd.arg(format!("--nri-socket={}", sock.display()));
    }
    let start = Instant::now();
    // critest finds ginkgo on PATH.
    let path = format!(
        "{}:{}",
        go_peers_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = cmd
        .env("PATH", path)
        .current_dir(r.dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .status()
        .expect("run critest");
    let took = start.elapsed();
    assert!(
        report.exists(),
        "critest ({}) wrote no report; its log {}:\n{}",
        r.handler,
        log.display(),
        tail(&log, 60)
    );
    Outcome {
        specs: read_report(&report),
        exit: status.code(),
        took,
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The specs that passed with `reference` and did not with `candidate`
/// (failed, skipped or absent), with what the candidate's run said.
pub fn regressions(reference: &Outcome, candidate: &Outcome) -> Vec<(String, String)> {
    reference
        .specs
        .iter()
        .filter(|(_, s)| **s == State::Passed)
        .filter_map(|(name, _)| match candidate.specs.get(name) {
            Some(State::Passed) => None,
            Some(State::Failed(m)) => Some((name.clone(), format!("failed: {m}"))),
            Some(State::Skipped(m)) => Some((name.clone(), format!("skipped: {m}"))),
            None => Some((name.clone(), "not run".into())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of ginkgo's shape: containers, suite nodes and states.
    #[test]
    fn reads_specs_and_finds_what_regressed() {
        let dir = tempfile::tempdir().unwrap();
        let report = |states: [&str; 3]| {
            let p = dir.path().join(format!("{}.json", states.join("-")));
            let json = serde_json::json!([{
                "SuiteDescription": "CRI validation",
                "SpecReports": [
                    { "LeafNodeType": "BeforeSuite", "LeafNodeText": "", "State": "passed" },
                    { "LeafNodeType": "It", "ContainerHierarchyTexts": ["[k8s.io] Image Manager"],
                      "LeafNodeText": "public image with tag", "State": states[0] },
                    { "LeafNodeType": "It", "ContainerHierarchyTexts": ["[k8s.io] NRI", "pod"],
                      "LeafNodeText": "sees events", "State": states[1],
                      "Failure": { "Message": "NRI socket not configured" } },
                    { "LeafNodeType": "It", "ContainerHierarchyTexts": ["[k8s.io] Image Manager"],
                      "LeafNodeText": "image with digest", "State": states[2],
                      "Failure": { "Message": "manifest unknown" } },
                ],
            }]);
            std::fs::write(&p, serde_json::to_vec(&json).unwrap()).unwrap();
            Outcome {
                specs: read_report(&p),
                ..Default::default()
            }
        };
        let runc = report(["passed", "passed", "failed"]);
        let shim = report(["passed", "skipped", "failed"]);
        assert_eq!(runc.counts(), (2, 1, 0));
        assert_eq!(shim.counts(), (1, 1, 1));
        assert_eq!(
            runc.specs["[k8s.io] Image Manager image with digest"],
            State::Failed("failed: manifest unknown".into())
        );
        assert_eq!(
            regressions(&runc, &shim),
            vec![(
                "[k8s.io] NRI pod sees events".to_string(),
                "skipped: NRI socket not configured".to_string()
            )]
        );
        assert!(regressions(&shim, &runc).is_empty());
    }
}
