//! In-place upgrade (issue 10): a new shim binary installed at the path
//! the daemon runs from takes over through the `upgrade` action, while
//! containers run, without containerd noticing; a binary that cannot take
//! over leaves the old daemon serving. Real containerd (the harness's,
//! `NRI_CONTAINERD` picks the version), a real pre-installed plugin. Root
//! only.

use std::{
    io::BufRead as _,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use integration::{
    Behaviour, EventLog,
    containerd::{Containerd, RUNTIME, Setup, output_text as text, workspace_bin},
    test_plugin_bin,
};

const SHIM: &str = "containerd-shim-nri-shim-v2";

/// The plugin: logs creates and sets `UPG=adjusted` in every container.
fn adjusting(log: &EventLog) -> String {
    serde_json::to_string(&Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        adjust: Some(serde_json::json!({"env": [{"key": "UPG", "value": "adjusted"}]})),
        ..Default::default()
    })
    .unwrap()
}

/// The shim binary containerd runs: a copy of this workspace's (not the
/// harness's symlink), so the test can replace the file as an operator
/// would and the daemon's path is this file.
fn own_binary(c: &Containerd) -> PathBuf {
    let path = c.dir.path().join("bin").join(SHIM);
    std::fs::remove_file(&path).unwrap();
    std::fs::copy(workspace_bin(SHIM), &path).unwrap();
    path
}

/// Installs `content` at `path` as a package manager does: a new file
/// renamed over the old one (a running binary cannot be written to).
fn install(path: &Path, content: &[u8], mode: u32) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// This workspace's shim installed again at `binary`, then an upgrade,
/// which must succeed.
fn reinstall_and_upgrade(c: &Containerd, binary: &Path) {
    install(binary, &std::fs::read(workspace_bin(SHIM)).unwrap(), 0o755);
    let out = upgrade(c, binary);
    assert!(
        out.status.success(),
        "upgrade: {}\nshim log:\n{}",
        text(&out),
        tail(&c.shim_log(), 40)
    );
}

/// `<binary> upgrade` as an operator runs it (the config names the state root).
fn upgrade(c: &Containerd, binary: &Path) -> Output {
    std::process::Command::new(binary)
        .args(["-address", &c.sock.display().to_string(), "upgrade"])
        .env("NRI_SHIM_CONFIG", c.shim_config())
        .output()
        .expect("run the upgrade action")
}

fn run_in(c: &Containerd, id: &str, flags: &[&str], cmd: &[&str]) {
    let fifo = c.dir.path().join("fifo").display().to_string();
    let rootfs = c.rootfs.display().to_string();
    let mut args = vec!["run", "-d", "--fifo-dir", &fifo, "--runtime", RUNTIME];
    args.extend(flags);
    args.extend(["--rootfs", &rootfs, id]);
    args.extend(cmd);
    let out = c.ctr(&args);
    assert!(
        out.status.success(),
        "ctr run {id}: {}\nshim log:\n{}",
        text(&out),
        tail(&c.shim_log(), 40)
    );
}

/// `ctr t ls` as (id, pid, status), sorted.
fn tasks(c: &Containerd) -> Vec<(String, String, String)> {
    let out = c.ctr(&["t", "ls"]);
    let mut v: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(1)?.to_string(), f.get(2)?.to_string()))
        })
        .collect();
    v.sort();
    v
}

fn status_of(c: &Containerd, id: &str) -> Option<String> {
    tasks(c).into_iter().find(|t| t.0 == id).map(|t| t.2)
}

fn wait_status(c: &Containerd, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(c, id).as_deref() != Some(want) {
        assert!(
            Instant::now() < deadline,
            "{id} never {want}: {:?}\ncontainerd log:\n{}\nshim log:\n{}",
            tasks(c),
            tail(&c.log(), 40),
            tail(&c.shim_log(), 60)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Numbers of the `line N` lines `ctr t attach` gets within `window`.
fn attach_numbers(c: &Containerd, id: &str, window: Duration) -> Vec<u64> {
    let (lines, _) = c.attach_lines("default", id, window);
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("line ").and_then(|n| n.trim().parse().ok()))
        .collect()
}

fn exe_inode(pid: i32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/exe")).unwrap().ino()
}

/// containerd's log after `from` has no line of a lost shim (for the
/// tasks `ids` only, when given: a task delete closes that task's
/// connection and logs the same lines, for runc's shim too).
fn assert_no_disconnect(c: &Containerd, from: usize, ids: Option<&[&str]>) {
    let log = c.log();
    let after = &log[from..];
    for line in after.lines() {
        let lost = [
            "shim disconnected",
            "cleaning up dead shim",
            "cleaning up after dead shim",
        ]
        .iter()
        .any(|n| line.contains(n));
        let concerned = ids.is_none_or(|ids| ids.iter().any(|id| line.contains(&format!("id={id}"))));
        assert!(
            !(lost && concerned),
            "containerd lost the shim: {line}\n{}",
            tail(after, 80)
        );
    }
}

/// The plugin's adjustment is in the container's init environment.
fn assert_adjusted(c: &Containerd, id: &str) {
    let pid = tasks(c).into_iter().find(|t| t.0 == id).expect("task listed").1;
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env = String::from_utf8_lossy(&env);
    assert!(
        env.split('\0').any(|v| v == "UPG=adjusted"),
        "{id}: the plugin did not adjust it: {env:?}"
    );
}

fn exec_out(c: &Containerd, id: &str, exec_id: &str, cmd: &[&str]) -> String {
    let mut args = vec!["t", "exec", "--exec-id", exec_id, id];
    args.extend(cmd);
    let out = c.ctr(&args);
    assert!(
        out.status.success(),
        "ctr t exec {id}: {}\nshim log:\n{}",
        text(&out),
        tail(&c.shim_log(), 40)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn an_upgrade_keeps_every_container_and_connection() {
    let logs = tempfile::tempdir().unwrap();
    let log = EventLog::new(logs.path().join("events.jsonl"));
    let c = Containerd::start(Setup {
        plugins: vec![("10-adj", test_plugin_bin!().into(), adjusting(&log))],
        idle_timeout: "60s",
        ..Setup::default()
    });
    let binary = own_binary(&c);
    let gate = c.dir.path().join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let bind = format!("type=bind,src={},dst=/gate,options=rbind:rw", gate.display());
    let chatty = "i=0; while :; do echo line $i; i=$((i+1)); usleep 100000; done";
    run_in(&c, "upg-run", &[], &["/bin/sleep", "1000"]);
    run_in(&c, "upg-chatty", &[], &["/bin/sh", "-c", chatty]);
    run_in(
        &c,
        "upg-exit",
        &["--mount", &bind],
        &[
            "/bin/sh",
            "-c",
            "while [ ! -e /gate/exit ]; do usleep 20000; done; exit 7",
        ],
    );
    // Exits as the upgrade begins: its exit lands before, during or right
    // after the handover, and must be delivered once, exactly, in any case.
    run_in(
        &c,
        "upg-during",
        &["--mount", &bind],
        &["/bin/sh", "-c", "while [ ! -e /gate/during ]; do :; done; exit 5"],
    );
    for id in ["upg-run", "upg-chatty", "upg-exit", "upg-during"] {
        wait_status(&c, id, "RUNNING");
    }
    // An exec running across the upgrade.
    let fifo = c.dir.path().join("fifo").display().to_string();
    let exec = c.ctr(&[
        "t",
        "exec",
        "-d",
        "--fifo-dir",
        &fifo,
        "--exec-id",
        "upg-long",
        "upg-run",
        "/bin/sleep",
        "1000",
    ]);
    assert!(exec.status.success(), "exec upg-long: {}", text(&exec));
    assert_adjusted(&c, "upg-run");
    let before = tasks(&c);
    let pid = c.shim_daemon_pid().expect("shim daemon runs");
    let old_inode = exe_inode(pid);
    let syncs = log.of("10-adj", "Synchronize").len();

    // The operator installs the new binary and runs the upgrade.
    let new = std::fs::read(workspace_bin(SHIM)).unwrap();
    install(&binary, &new, 0o755);
    let new_inode = std::fs::metadata(&binary).unwrap().ino();
    assert_ne!(new_inode, old_inode);
    let mark = c.log().len();
    let shim_mark = c.shim_log().len();
    std::fs::write(gate.join("during"), "").unwrap();
    let out = upgrade(&c, &binary);
    assert!(
        out.status.success(),
        "upgrade: {}\nshim log:\n{}",
        text(&out),
        tail(&c.shim_log(), 60)
    );
    assert!(
        text(&out).contains(&format!("ok pid={pid}")),
        "upgrade said {}",
        text(&out)
    );

    // The same daemon process, now running the new file.
    assert_eq!(c.shim_daemon_pid(), Some(pid), "the daemon's pid changed");
    assert_eq!(exe_inode(pid), new_inode, "/proc/{pid}/exe is not the new binary");
    let shim_log = c.shim_log()[shim_mark..].to_string();
    assert!(
        shim_log.contains("handing over to the new binary") && shim_log.contains("taking over after an upgrade"),
        "{shim_log}"
    );

    // Nothing changed for containerd: the same tasks, pids and states
    // (the one that exited around the handover aside).
    wait_status(&c, "upg-during", "STOPPED");
    let strip =
        |v: Vec<(String, String, String)>| -> Vec<_> { v.into_iter().filter(|t| t.0 != "upg-during").collect() };
    assert_eq!(strip(tasks(&c)), strip(before));
    assert_no_disconnect(&c, mark, None);
    // Its exit code is the one it exited with.
    let rm = c.ctr(&["t", "rm", "upg-during"]);
    assert!(
        rm.status.success() && text(&rm).contains("exit code 5"),
        "ctr t rm upg-during: {}",
        text(&rm)
    );

    // The chatty container's output goes on, without a gap.
    let numbers = attach_numbers(&c, "upg-chatty", Duration::from_secs(2));
    assert!(numbers.len() >= 10, "attach after the upgrade got {numbers:?}");
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "lines not consecutive: {numbers:?}"
    );

    // An exit after the upgrade reaches containerd with its code.
    std::fs::write(gate.join("exit"), "").unwrap();
    wait_status(&c, "upg-exit", "STOPPED");
    let rm = c.ctr(&["t", "rm", "upg-exit"]);
    assert!(
        rm.status.success() && text(&rm).contains("exit code 7"),
        "ctr t rm upg-exit: {}",
        text(&rm)
    );

    // Exec, kill and delete work; the exec started before is still known.
    assert_eq!(exec_out(&c, "upg-run", "upg-after", &["/bin/echo", "after"]), "after");
    let kill = c.ctr(&["t", "kill", "--exec-id", "upg-long", "-s", "SIGKILL", "upg-run"]);
    assert!(
        kill.status.success(),
        "kill the exec started before the upgrade: {}",
        text(&kill)
    );
    let kill = c.ctr(&["t", "kill", "-s", "SIGKILL", "upg-run"]);
    assert!(kill.status.success(), "kill: {}", text(&kill));
    wait_status(&c, "upg-run", "STOPPED");
    let rm = c.ctr(&["t", "rm", "upg-run"]);
    assert!(
        rm.status.success() && text(&rm).contains("exit code 137"),
        "ctr t rm upg-run: {}",
        text(&rm)
    );

    // The pre-installed plugin was started again, synchronized, and
    // adjusts new containers.
    assert!(
        log.of("10-adj", "Synchronize").len() > syncs,
        "the plugin was not synchronized again"
    );
    run_in(&c, "upg-new", &[], &["/bin/sleep", "1000"]);
    wait_status(&c, "upg-new", "RUNNING");
    assert_adjusted(&c, "upg-new");
    assert_no_disconnect(&c, mark, Some(&["upg-chatty", "upg-new"]));

    // A second upgrade works too (the daemon runs from the same path).
    let out = upgrade(&c, &binary);
    assert!(out.status.success(), "second upgrade: {}", text(&out));
    wait_status(&c, "upg-new", "RUNNING");
    assert_eq!(exec_out(&c, "upg-new", "upg-env3", &["/bin/echo", "again"]), "again");
    let numbers = attach_numbers(&c, "upg-chatty", Duration::from_secs(2));
    assert!(numbers.len() >= 10, "attach after the second upgrade got {numbers:?}");
    assert_no_disconnect(&c, mark, Some(&["upg-chatty", "upg-new"]));
}

#[test]
fn a_binary_that_cannot_take_over_leaves_the_daemon_serving() {
    let c = Containerd::start(Setup {
        idle_timeout: "60s",
        ..Setup::default()
    });
    let binary = own_binary(&c);
    run_in(&c, "upg-keep", &[], &["/bin/sleep", "1000"]);
    wait_status(&c, "upg-keep", "RUNNING");
    let pid = c.shim_daemon_pid().expect("shim daemon runs");
    let inode = exe_inode(pid);
    let before = tasks(&c);
    let mark = c.log().len();
    let good = std::fs::read(workspace_bin(SHIM)).unwrap();

    // Not executable, then a binary of another handover format.
    install(&binary, &good, 0o644);
    let out = upgrade(&c, &workspace_bin(SHIM));
    assert!(!out.status.success(), "upgrade to a non-executable file succeeded");
    for needle in ["kept running the old binary", "refused", "cannot run it"] {
        assert!(text(&out).contains(needle), "{needle:?} not in {}", text(&out));
    }
    install(&binary, b"#!/bin/sh\necho nri-shim handover 999\n", 0o755);
    let out = upgrade(&c, &workspace_bin(SHIM));
    assert!(!out.status.success(), "upgrade to an incompatible binary succeeded");
    assert!(text(&out).contains("nri-shim handover 999"), "{}", text(&out));

    // The same process and image serve on: tasks, exec, new containers.
    assert_eq!(c.shim_daemon_pid(), Some(pid));
    assert_eq!(exe_inode(pid), inode);
    assert_eq!(tasks(&c), before);
    assert_eq!(exec_out(&c, "upg-keep", "upg-e1", &["/bin/echo", "still"]), "still");
    install(&binary, &good, 0o755);
    run_in(&c, "upg-keep2", &[], &["/bin/sleep", "1000"]);
    wait_status(&c, "upg-keep2", "RUNNING");
    assert_no_disconnect(&c, mark, None);
}

/// A terminal container's output, which the daemon copies from the pty
/// master to the stdout fifo, goes on across an upgrade: no line lost or
/// repeated, and the fifo's reader never sees end of file (it did when
/// the new image opened the fifo again: the old image's copy was its only
/// writer). Input typed into the stdin fifo reaches the process before and
/// after the upgrade.
#[test]
fn a_terminal_containers_output_goes_on_across_an_upgrade() {
    let c = Containerd::start(Setup {
        idle_timeout: "60s",
        ..Setup::default()
    });
    let binary = own_binary(&c);
    let chatty = "i=0; while :; do echo line $i; i=$((i+1)); usleep 100000; done";
    let script = format!("({chatty}) & while read l; do echo got $l; done");
    // `ctr run -t` wants a console even detached: `script` gives it one.
    // script's stdin stays open until it exits: at end of file on its stdin
    // script types ^D into its pty, which ctr (in raw mode, still copying
    // stdin while it starts the task) forwarded into the container's
    // terminal, ending the `read` loop at once (seen under load).
    let ctr = integration::containerd::containerd_cmd("ctr")
        .get_program()
        .to_string_lossy()
        .into_owned();
    let cmdline = format!(
        "{ctr} -a {} run -d -t --fifo-dir {} --runtime {RUNTIME} --rootfs {} upg-tty /bin/sh -c '{script}'",
        c.sock.display(),
        c.dir.path().join("fifo").display(),
        c.rootfs.display()
    );
    let mut script = std::process::Command::new("script")
        .args(["-qec", &cmdline, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs ctr on a pty");
    let script_stdin = script.stdin.take();
    let out = script.wait_with_output().expect("script's output");
    drop(script_stdin);
    assert!(out.status.success(), "ctr run -t: {}", text(&out));
    wait_status(&c, "upg-tty", "RUNNING");
    // ctr's fifos: <fifo dir>/<random>/upg-tty-stdout (and -stdin).
    let fifo = std::fs::read_dir(c.dir.path().join("fifo"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join("upg-tty-stdout"))
        .find(|p| p.exists())
        .expect("the tty's stdout fifo");
    let mut stdin = std::fs::OpenOptions::new()
        .write(true)
        .open(fifo.with_file_name("upg-tty-stdin"))
        .expect("the tty's stdin fifo");
    let reader = std::fs::File::open(&fifo).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // (line numbers, the lines the read loop answered) within `window`.
    let lines_for = |window: Duration| {
        let deadline = Instant::now() + window;
        let (mut numbers, mut got) = (Vec::<u64>::new(), Vec::new());
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            let l = l.trim().to_string();
            if let Some(n) = l.strip_prefix("line ").and_then(|n| n.parse().ok()) {
                numbers.push(n);
            } else if l.starts_with("got ") {
                got.push(l);
            }
        }
        (numbers, got)
    };
    use std::io::Write as _;
    stdin.write_all(b"before\n").unwrap();
    let (before, got_before) = lines_for(Duration::from_secs(1));
    assert!(!before.is_empty(), "no output before the upgrade");
    assert_eq!(got_before, ["got before"], "input before the upgrade");
    reinstall_and_upgrade(&c, &binary);
    stdin.write_all(b"after\n").unwrap();
    let (after, got_after) = lines_for(Duration::from_secs(2));
    assert!(after.len() >= 10, "output after the upgrade: {after:?}");
    assert_eq!(got_after, ["got after"], "input after the upgrade");
    let all: Vec<u64> = before.iter().chain(&after).copied().collect();
    assert!(
        all.windows(2).all(|w| w[1] == w[0] + 1),
        "lines lost or repeated: {all:?}"
    );
    let kill = c.ctr(&["t", "kill", "-s", "SIGKILL", "upg-tty"]);
    assert!(kill.status.success(), "kill: {}", text(&kill));
    wait_status(&c, "upg-tty", "STOPPED");
}

/// A plain container's stdin, which the daemon copies from the stdin fifo
/// into the process's pipe, goes on across an upgrade: lines written
/// before and after it arrive, and closing the client's stdin afterwards
/// is end of file for the process. `ctr run` stays attached, holding the
/// fifos, as a client streaming stdin does; it sees no disconnect.
#[test]
fn a_containers_stdin_goes_on_across_an_upgrade() {
    let c = Containerd::start(Setup {
        idle_timeout: "60s",
        ..Setup::default()
    });
    let binary = own_binary(&c);
    let mark = c.log().len();
    let mut ctr = integration::containerd::containerd_cmd("ctr")
        .args(["-a", &c.sock.display().to_string(), "run", "--fifo-dir"])
        .arg(c.dir.path().join("fifo"))
        .args(["--runtime", RUNTIME, "--rootfs"])
        .arg(&c.rootfs)
        .args([
            "upg-in",
            "/bin/sh",
            "-c",
            "while read l; do echo got $l; done; echo stdin-closed; exit 3",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ctr run");
    let mut stdin = ctr.stdin.take().unwrap();
    let stdout = ctr.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let next_line = |what: &str| {
        let l = rx.recv_timeout(Duration::from_secs(10));
        assert!(l.is_ok(), "no output line {what:?} within 10 s");
        l.unwrap()
    };
    wait_status(&c, "upg-in", "RUNNING");
    use std::io::Write as _;
    stdin.write_all(b"before\n").unwrap();
    assert_eq!(next_line("got before"), "got before");
    reinstall_and_upgrade(&c, &binary);
    stdin.write_all(b"after\n").unwrap();
    assert_eq!(next_line("got after"), "got after");
    // (Before ctr's own task delete, which disconnects.)
    assert_no_disconnect(&c, mark, None);
    drop(stdin);
    assert_eq!(next_line("stdin-closed"), "stdin-closed");
    let status = ctr.wait().unwrap();
    assert_eq!(status.code(), Some(3), "ctr run's exit status (the container's)");
    let rm = c.ctr(&["c", "rm", "upg-in"]);
    assert!(rm.status.success(), "ctr c rm: {}", text(&rm));
}

/// The CRI view across an upgrade: a pod (its sandbox through our shim)
/// and a chatty container in it run on, CRI reports them running, exec
/// works, the container's log keeps every line, a new container in the
/// same pod is still adjusted by the pre-installed plugin (restarted by
/// the new image and synchronized with the running pod), and the pod is
/// stopped and removed with nothing lost; containerd logs no disconnect.
#[tokio::test]
async fn a_cri_pod_goes_on_across_an_upgrade() {
    use integration::cri::{Cri, CriSetup, NRI_ENV, NRI_NAMESPACE, api, container, log_lines};
    const WAIT: Duration = Duration::from_secs(60);
    let bin_dir = tempfile::tempdir().unwrap();
    let binary = bin_dir.path().join(SHIM);
    install(&binary, &std::fs::read(workspace_bin(SHIM)).unwrap(), 0o755);
    let rule = format!(
        "[[rule]]\nname = \"upgrade\"\n[rule.match]\npod_namespace = \"{NRI_NAMESPACE}\"\n[rule.adjust]\nenv = {{ {} = \"{}\" }}\n",
        NRI_ENV.0, NRI_ENV.1
    );
    let cri = Cri::start(CriSetup {
        plugins: vec![("10-adjuster", workspace_bin("nri-adjuster"), rule)],
        shim_bin: Some(binary.clone()),
        ..Default::default()
    });
    let mut c = cri.client().await;
    let cfg = cri.pod_config("upg", NRI_NAMESPACE, "nri-shim", |_| {});
    let pod = c.run_pod(&cfg, "nri-shim").await;
    let chatty = "i=0; while :; do echo line $i; i=$((i+1)); usleep 100000; done";
    let id = c
        .create_running(&pod, &cfg, container("c", &["sh", "-c", chatty]), WAIT)
        .await;
    let probe = format!("echo ${}", NRI_ENV.0);
    assert_eq!(c.sh(&id, &probe).await.trim(), NRI_ENV.1, "adjusted before the upgrade");
    std::thread::sleep(Duration::from_millis(500));
    let mark = cri.log().len();

    install(&binary, &std::fs::read(workspace_bin(SHIM)).unwrap(), 0o755);
    let out = std::process::Command::new(&binary)
        .args(["-address", &cri.sock.display().to_string(), "upgrade"])
        .env("NRI_SHIM_CONFIG", cri.dir.join("shim.toml"))
        .output()
        .expect("run the upgrade action");
    assert!(out.status.success(), "upgrade: {}", text(&out));

    let st = c.status(&id).await.expect("ContainerStatus after the upgrade");
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32, "{st:?}");
    assert_eq!(c.sh(&id, &probe).await.trim(), NRI_ENV.1, "exec after the upgrade");
    let second = c
        .create_running(&pod, &cfg, container("d", &["sleep", "1000"]), WAIT)
        .await;
    assert_eq!(
        c.sh(&second, &probe).await.trim(),
        NRI_ENV.1,
        "a container created after the upgrade is adjusted"
    );
    std::thread::sleep(Duration::from_secs(1));
    // Every line number once, none missing (the log is sorted as text).
    let mut numbers: Vec<u64> = log_lines(&cfg, "c")
        .iter()
        .filter_map(|l| l.strip_prefix("stdout F line ")?.trim().parse().ok())
        .collect();
    numbers.sort_unstable();
    assert!(numbers.len() >= 15, "log of c: {numbers:?}");
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1) && numbers[0] == 0,
        "lines lost or repeated in c's log: {numbers:?}"
    );
    let log = cri.log()[mark..].to_string();
    assert!(
        !log.contains("shim disconnected") && !log.contains("cleaning up dead shim"),
        "containerd lost the shim:\n{}",
        tail(&log, 60)
    );
    c.remove_pod(&pod).await;
    cri.teardown();
}

/// After the exec there is no going back: when NRI cannot start in the new
/// image (here its socket path has become a directory), the daemon serves
/// on without plugins, and the operator's `upgrade` says so in its answer
/// with the reason, instead of a plain "ok".
#[test]
fn an_upgrade_whose_nri_cannot_start_says_so() {
    let c = Containerd::start(Setup {
        idle_timeout: "60s",
        ..Setup::default()
    });
    let binary = own_binary(&c);
    let out = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--rootfs",
        &c.rootfs.display().to_string(),
        "upg-nri",
        "/bin/sleep",
        "1000",
    ]);
    assert!(out.status.success(), "ctr run: {}", text(&out));
    wait_status(&c, "upg-nri", "RUNNING");
    // The old image keeps its listening fd; the path is a directory now.
    std::fs::rename(&c.nri_sock, c.nri_sock.with_extension("moved")).unwrap();
    std::fs::create_dir(&c.nri_sock).unwrap();
    install(&binary, &std::fs::read(workspace_bin(SHIM)).unwrap(), 0o755);
    let out = upgrade(&c, &binary);
    let said = text(&out);
    assert!(out.status.success(), "upgrade: {said}");
    assert!(
        said.contains("warning: NRI did not start") && said.contains(&c.nri_sock.display().to_string()),
        "the upgrade's answer names NRI's failure and the path: {said}\nshim log:\n{}",
        tail(&c.shim_log(), 30)
    );
    // Containers are still served.
    wait_status(&c, "upg-nri", "RUNNING");
    let kill = c.ctr(&["t", "kill", "-s", "SIGKILL", "upg-nri"]);
    assert!(kill.status.success(), "kill: {}", text(&kill));
    wait_status(&c, "upg-nri", "STOPPED");
    std::fs::remove_dir(&c.nri_sock).unwrap();
}

/// Issue 31 item 3: `upgrade` finds the daemon of a containerd (its
/// `-address`) without `NRI_SHIM_CONFIG`, whose state_root is not the
/// default here; for a containerd no daemon serves, it names what it
/// looked for and the variable to set.
#[test]
fn upgrade_finds_the_daemon_without_its_config() {
    let c = Containerd::start(Setup::default());
    run_in(&c, "upg-bare", &["-d"], &["/bin/sleep", "300"]);
    let bin = workspace_bin("containerd-shim-nri-shim-v2");
    let out = std::process::Command::new(&bin)
        .args(["-address", &c.sock.display().to_string(), "upgrade"])
        .env_remove("NRI_SHIM_CONFIG")
        .output()
        .expect("run the upgrade action");
    assert!(
        out.status.success(),
        "upgrade: {}\nshim log:\n{}",
        text(&out),
        tail(&c.shim_log(), 40)
    );
    assert_eq!(status_of(&c, "upg-bare").as_deref(), Some("RUNNING"));
    let out = std::process::Command::new(&bin)
        .args(["-address", "/nonexistent/containerd.sock", "upgrade"])
        .env_remove("NRI_SHIM_CONFIG")
        .output()
        .expect("run the upgrade action");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("no nri-shim daemon found for containerd at /nonexistent/containerd.sock")
            && said.contains("set NRI_SHIM_CONFIG"),
        "{said}"
    );
}
