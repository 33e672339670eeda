//! Reload without drain (issue 10): SIGHUP makes the shim daemon read its
//! config again while containers run; an invalid file changes nothing and
//! new containers are still taken. Real containerd (the harness's), real
//! plugin processes. Root only.

use std::{path::Path, time::Duration};

use integration::{
    Behaviour, EventLog,
    containerd::{Containerd, Setup},
    test_plugin_bin,
};

fn logging(log: &EventLog) -> String {
    serde_json::to_string(&Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        ..Default::default()
    })
    .unwrap()
}

fn run(c: &Containerd, id: &str) {
    let out = c.run(id, &["-d"], &["sleep", "1000"]);
    assert!(
        out.status.success(),
        "ctr run {id}: {}{}\nshim log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.shim_log()
    );
}

fn hup(c: &Containerd) -> i32 {
    let pid = c.shim_daemon_pid().expect("shim daemon runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP).unwrap();
    pid
}

/// Waits until the shim log, after byte `from`, has a line with every needle.
fn wait_shim_log(c: &Containerd, from: usize, needles: &[&str]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = c.shim_log();
        if let Some(l) = log[from.min(log.len())..]
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return l.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no shim log line with {needles:?} after byte {from}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (20 s) until `plugin` logged its own exit; fails with the events
/// and the shim log.
fn wait_exit(c: &Containerd, log: &EventLog, plugin: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while log.of(plugin, "Exit").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{plugin} did not exit; events: {:?}\nshim log:\n{}",
            log.lines()
                .iter()
                .map(|l| format!("{} {}", l.plugin, l.event))
                .collect::<Vec<_>>(),
            c.shim_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Installs a plugin as an operator would: its config first (the
/// directory watch may launch the executable as soon as it appears).
fn install(c: &Containerd, name: &str, conf: &str) {
    std::fs::write(c.conf_dir.join(format!("{name}.conf")), conf).unwrap();
    std::fs::copy(test_plugin_bin!(), c.plugin_dir.join(name)).unwrap();
}

fn debug_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains(" DEBUG ")).count()
}

#[test]
fn sighup_applies_a_valid_config_and_keeps_running_on_an_invalid_one() {
    let logs = tempfile::tempdir().unwrap();
    let log = EventLog::new(logs.path().join("events.jsonl"));
    let c = Containerd::start(Setup {
        plugins: vec![("10-a", test_plugin_bin!().into(), logging(&log))],
        idle_timeout: "60s",
        ..Setup::default()
    });
    run(&c, "hup-c1");
    let pid = c.shim_daemon_pid().expect("shim daemon runs");

    // An operator mid-edit: the file does not parse. The reload names the
    // file, line and key, and the daemon goes on with what it had.
    let good = std::fs::read_to_string(c.shim_config()).unwrap();
    std::fs::write(c.shim_config(), good.replace("[shim]\n", "[shim]\nbogus_key = 1\n")).unwrap();
    let from = c.shim_log().len();
    hup(&c);
    let line = wait_shim_log(&c, from, &["config reload failed"]);
    for needle in ["shim.toml", "line ", "bogus_key"] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    // ... and still takes new containers (`start` does not load the file).
    run(&c, "hup-c2");
    assert_eq!(c.shim_daemon_pid(), Some(pid), "the same daemon serves c2");
    assert_eq!(log.of("10-a", "CreateContainer").len(), 2);
    assert!(
        debug_lines(&c.shim_log()) > 0,
        "log_level debug logs DEBUG lines before the reload"
    );

    // A valid edit: another NRI socket (needs a restart), log level info
    // (live); meanwhile 20-b is installed and 10-a removed.
    let other_sock = c.dir.path().join("nri/other.sock");
    let edited = good
        .replace(&c.nri_sock.display().to_string(), &other_sock.display().to_string())
        .replace("log_level = \"debug\"", "log_level = \"info\"");
    assert_ne!(edited, good);
    std::fs::write(c.shim_config(), &edited).unwrap();
    install(&c, "20-b", &logging(&log));
    std::fs::remove_file(c.plugin_dir.join("10-a")).unwrap();
    let from = c.shim_log().len();
    hup(&c);
    let done = wait_shim_log(&c, from, &["config reloaded"]);
    assert!(done.contains("shim.log_level"), "{done}");
    let restart = wait_shim_log(&c, from, &["need a restart"]);
    assert!(restart.contains("nri.socket_path"), "{restart}");
    assert!(Path::new(&c.nri_sock).exists() && !other_sock.exists());
    // 20-b joined knowing the running containers; 10-a ended.
    let sync = block(log.wait_event("20-b", "Synchronize"));
    let mut synced = sync.containers.clone();
    synced.sort();
    assert_eq!(synced, ["hup-c1", "hup-c2"]);
    wait_exit(&c, &log, "10-a");

    run(&c, "hup-c3");
    assert_eq!(c.shim_daemon_pid(), Some(pid));
    let creates = |p: &str| -> Vec<String> { log.of(p, "CreateContainer").into_iter().map(|l| l.container).collect() };
    assert_eq!(creates("20-b"), ["hup-c3"]);
    assert_eq!(creates("10-a"), ["hup-c1", "hup-c2"]);
    // (The directory watch may have started 20-b, logging at debug, between
    // the edit and the signal: count from the reload's own line.)
    let after = c.shim_log();
    let reloaded = from + after[from..].find("config reloaded").expect("reload logged");
    assert_eq!(
        debug_lines(&after[reloaded..]),
        0,
        "log_level info applied: no DEBUG line since the reload (c3's create logs one at debug)"
    );
}

/// A plugin file that appears in plugin_path is started and synchronized
/// with the running containers, and one whose file is removed is shut
/// down, without a signal, and given time to exit on its own (10-a takes
/// 300 ms after Shutdown: it was SIGKILLed as soon as its connection
/// closed); the containers keep running.
#[test]
fn plugin_path_changes_are_picked_up_without_a_signal() {
    let logs = tempfile::tempdir().unwrap();
    let log = EventLog::new(logs.path().join("events.jsonl"));
    let slow_exit = serde_json::to_string(&Behaviour {
        log: Some(log.path().to_path_buf()),
        events: Some("CreateContainer".into()),
        sleep_ms: [("Exit".to_string(), 300)].into(),
        ..Default::default()
    })
    .unwrap();
    let c = Containerd::start(Setup {
        plugins: vec![("10-a", test_plugin_bin!().into(), slow_exit)],
        idle_timeout: "60s",
        ..Setup::default()
    });
    run(&c, "dir-c1");
    let pid = c.shim_daemon_pid().expect("shim daemon runs");

    install(&c, "20-b", &logging(&log));
    eprintln!(
        "PS {}",
        String::from_utf8_lossy(
            &std::process::Command::new("ps")
                .args(["-eo", "pid,pgid,sid,ppid,stat,args"])
                .output()
                .unwrap()
                .stdout
        )
        .lines()
        .filter(|l| l.contains("sleep 1000") || l.contains("nri") || l.contains("plugins/"))
        .collect::<Vec<_>>()
        .join("\n")
    );
    let sync = block(log.wait_event("20-b", "Synchronize"));
    assert_eq!(sync.containers, ["dir-c1"]);
    std::fs::remove_file(c.plugin_dir.join("10-a")).unwrap();
    wait_exit(&c, &log, "10-a");

    run(&c, "dir-c2");
    assert_eq!(c.shim_daemon_pid(), Some(pid), "the same daemon serves c2");
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
    assert!(!argv.contains(" -id "), "the daemon's argv names no task: {argv}");
    let creates = |p: &str| -> Vec<String> { log.of(p, "CreateContainer").into_iter().map(|l| l.container).collect() };
    assert_eq!(creates("20-b"), ["dir-c2"]);
    assert_eq!(creates("10-a"), ["dir-c1"]);
    assert!(c.shim_log().contains("plugin directory changed"), "{}", c.shim_log());
    let tasks = integration::containerd::output_text(&c.ctr(&["t", "ls"]));
    for id in ["dir-c1", "dir-c2"] {
        assert!(
            tasks.lines().any(|l| l.starts_with(id) && l.contains("RUNNING")),
            "{id} runs after the plugin changes:\n{tasks}\nshim log:\n{}",
            c.shim_log()
        );
    }
}

/// shim.log rotates at `[shim] log_max_size` (a daemon that runs for
/// months must not fill the node's /run); a SIGHUP changes the size.
#[test]
fn shim_log_rotates_at_its_configured_size() {
    let c = Containerd::start(Setup {
        shim_toml: "log_max_size = \"1KiB\"",
        idle_timeout: "60s",
        ..Setup::default()
    });
    // Each `ctr run --rm` logs about 1 KiB at debug level.
    for id in ["rot-c1", "rot-c2", "rot-c3", "rot-c4"] {
        let out = c.run(id, &["--rm"], &["true"]);
        assert!(
            out.status.success(),
            "ctr run {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = std::fs::read_dir(&c.shim_state)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .find(|p| p.join("shim.log").exists())
        .expect("a daemon dir with shim.log");
    let (log, old) = (dir.join("shim.log"), dir.join("shim.log.1"));
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    assert!(
        old.exists(),
        "no {} after 4 containers; shim.log is {} bytes",
        old.display(),
        size(&log)
    );
    // A rotation happens at the first line past the size: each file holds
    // at most the size plus one line.
    for p in [&log, &old] {
        assert!(size(p) < 1024 + 4096, "{} is {} bytes", p.display(), size(p));
    }
    let newest = std::fs::read_to_string(&log).unwrap() + &std::fs::read_to_string(&old).unwrap();
    assert!(
        newest.contains("rot-c4"),
        "the newest container is in the two files:\n{newest}"
    );

    // "0" stops rotating: shim.log grows past the old size.
    let cfg = std::fs::read_to_string(c.shim_config()).unwrap();
    std::fs::write(c.shim_config(), cfg.replace("\"1KiB\"", "\"0\"")).unwrap();
    hup(&c);
    // From byte 0: the one reload of this test (an offset taken before it
    // could lie past the end of a file rotated meanwhile).
    wait_shim_log(&c, 0, &["config reloaded", "shim.log_max_size"]);
    let rotated = std::fs::read_to_string(&old).unwrap();
    for id in ["rot-c5", "rot-c6", "rot-c7", "rot-c8"] {
        let out = c.run(id, &["--rm"], &["true"]);
        assert!(
            out.status.success(),
            "ctr run {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        std::fs::read_to_string(&old).unwrap(),
        rotated,
        "no rotation with log_max_size 0"
    );
    assert!(size(&log) > 2048, "shim.log is {} bytes", size(&log));
}
