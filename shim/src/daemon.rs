//! The shim's three faces: `start` (print the task address, starting the
//! node's daemon if needed), `delete` (clean up after a task, idempotent),
//! and the daemon itself.
//!
//! One daemon per containerd instance (keyed on containerd's address, so a
//! private test containerd gets its own) hosts the task service for every
//! container of this runtime and the node's single NRI adaptation: NRI
//! plugins expect one runtime per node that sees every pod.

use std::{
    io::Write as _,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use nri_adaptation::Adaptation;
use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};

use crate::{
    args::Flags,
    bootstrap::BootstrapParams,
    bundle::EXIT_STATUS_FILE,
    config::Config,
    events::RemotePublisher,
    record::TaskRecord,
    runner::HelperRunner,
    service::{Service, short_hash},
    task::{NAMESPACE_HEADER, TaskService},
};

/// Directory, under the state root, of the daemon serving containerd at
/// `address`.
pub fn daemon_dir(state_root: &Path, address: &str) -> PathBuf {
    state_root.join(short_hash(address))
}

fn answers(sock: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

/// `start`: prints only the task address (containerd reads stdout and
/// stderr together as the address; for containerd 2.x the bootstrap
/// result naming task API v3, see [`crate::bootstrap`]), starting the
/// daemon unless it runs,
/// and leaves the bundle's records (see [`crate::record`]): containerd's
/// `address` file, read on its restart to reconnect, and the shim's own
/// record, read by `delete`.
///
/// A daemon it starts reports its startup result through a pipe before
/// it serves: a failure (NRI socket in the way, plugin directory not a
/// directory, ...) fails `start` at once with the daemon's reason.
///
/// Only `state_root` is needed here (see
/// [`Config::state_root_lenient`]): a running daemon keeps taking
/// containers while its config file is invalid; a daemon that must be
/// started loads the file itself and reports when it cannot.
///
/// # Errors
/// When the daemon cannot be started, reports a failure, or does not come
/// up within 10 s; when the bundle records cannot be written.
pub fn start_action(flags: &Flags, state_root: &Path, params: Option<&BootstrapParams>) -> anyhow::Result<()> {
    let dir = daemon_dir(state_root, &flags.address);
    let sock = crate::layout::task_socket(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    // Before the daemon is spawned or probed: the first detection runs the
    // containerd binary, and a daemon that exists (or was just spawned)
    // counts its idle time from then on, so the reply must be ready when
    // containerd is told to dial.
    let reply = crate::bootstrap::reply(params, || {
        crate::bootstrap::containerd_major(&flags.publish_binary, &dir)
    });
    // One starter at a time, and never while the daemon decides to exit on
    // idle (it takes the same lock for its last check and the removal of
    // its socket): a daemon that answers the probe here has accepted it as
    // activity and stays for the client that follows.
    let starting = start_lock(&dir)?;
    if !answers(&sock) {
        let (child, ready) = spawn_daemon(flags, &dir, params.and_then(BootstrapParams::ttrpc_address))?;
        wait_ready(child, ready, &dir)?;
    }
    // The daemon stays for this task's Create however long containerd
    // takes to dial (see crate::claim).
    crate::claim::write(&dir, &flags.namespace, &flags.id).context("start claim")?;
    drop(starting);
    let address = format!("unix://{}", sock.display());
    let bundle = match &flags.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context("bundle (current directory)")?,
    };
    TaskRecord {
        version: crate::record::RECORD_VERSION,
        namespace: flags.namespace.clone(),
        id: flags.id.clone(),
        daemon_dir: dir.clone(),
    }
    .write(&bundle)?;
    crate::record::write_address(&bundle, &address)?;
    let mut out = std::io::stdout();
    out.write_all(&crate::bootstrap::render(&address, reply))?;
    out.flush()?;
    Ok(())
}

/// `<daemon dir>/start.lock`, taken by `start` around its probe (and the
/// daemon's launch) and by the daemon around its idle exit; released when
/// dropped.
fn start_lock(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::File::create(dir.join("start.lock")).context("start lock")?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("lock start.lock")
}

/// How long `start` waits for a new daemon's startup result.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The daemon's end of the startup pipe (an fd number) in its environment.
const READY_FD_ENV: &str = "NRI_SHIM_READY_FD";
/// The fd number the startup pipe has in the daemon.
const READY_FD: i32 = 3;

/// Spawns the daemon; `ttrpc_address` (from the bootstrap parameters)
/// overrides the `TTRPC_ADDRESS` it would inherit.
fn spawn_daemon(
    flags: &Flags,
    dir: &Path,
    ttrpc_address: Option<&str>,
) -> anyhow::Result<(std::process::Child, std::fs::File)> {
    let exe = std::env::current_exe().context("own executable")?;
    let log_path = dir.join("shim.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("open {}", log_path.display()))?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("startup pipe")?;
    let write_fd = std::os::fd::AsRawFd::as_raw_fd(&write);
    let mut cmd = std::process::Command::new(exe);
    // No `-id`: the daemon serves every task of this containerd, and the
    // first one's id in its argv (ps, top) would name a container that may
    // be long gone.
    cmd.args(["-namespace", &flags.namespace, "-address", &flags.address])
        .args(["-publish-binary", &flags.publish_binary])
        .arg("daemon")
        .env(READY_FD_ENV, READY_FD.to_string())
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(a) = ttrpc_address {
        cmd.env("TTRPC_ADDRESS", a);
    }
    // SAFETY: setsid, dup2 and fcntl are async-signal-safe. setsid
    // detaches the daemon from containerd's process group and session; the
    // pipe's write end becomes fd 3 without close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            if libc::dup2(write_fd, READY_FD) < 0 || libc::fcntl(READY_FD, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("spawn nri-shim daemon")?;
    drop(write);
    Ok((child, std::fs::File::from(read)))
}

/// Reads the daemon's startup result: `ok`, or `error: REASON`. End of
/// file without either means the daemon died before it could tell.
fn wait_ready(mut child: std::process::Child, mut ready: std::fs::File, dir: &Path) -> anyhow::Result<()> {
    use std::{io::Read as _, os::fd::AsRawFd as _};
    let deadline = Instant::now() + START_TIMEOUT;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "nri-shim daemon (pid {}) did not report its startup within {}s; see {}",
                child.id(),
                START_TIMEOUT.as_secs(),
                dir.join("shim.log").display()
            );
        }
        let mut pfd = libc::pollfd {
            fd: ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll the startup pipe");
        }
        if n == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match ready.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read the startup pipe"),
        }
        if got.ends_with(b"\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    let text = text.trim();
    if text == "ok" {
        return Ok(());
    }
    if let Some(reason) = text.strip_prefix("error: ") {
        bail!("nri-shim daemon failed to start: {reason}");
    }
    let status = child
        .try_wait()
        .ok()
        .flatten()
        .map_or_else(|| "closed its startup pipe".to_string(), |s| format!("exited ({s})"));
    bail!(
        "nri-shim daemon {status} before it was ready; see {}",
        dir.join("shim.log").display()
    )
}

/// The daemon's end of the startup pipe: `start` waits on it.
struct Ready(Option<std::fs::File>);

impl Ready {
    /// Takes the pipe named in the environment (and removes the variable,
    /// so no child inherits either).
    ///
    /// Must run before any thread exists.
    fn from_env() -> Ready {
        use std::os::fd::FromRawFd as _;
        let fd = std::env::var(READY_FD_ENV).ok().and_then(|v| v.parse::<i32>().ok());
        // SAFETY: no other thread exists yet (daemon_main runs first).
        unsafe { std::env::remove_var(READY_FD_ENV) };
        let Some(fd) = fd.filter(|fd| *fd > 2) else {
            return Ready(None);
        };
        // SAFETY: `start` put the pipe's write end at this number for us;
        // nothing else in this process owns it. Close-on-exec so helpers
        // and plugins do not keep `start` waiting.
        unsafe {
            if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
                return Ready(None);
            }
            Ready(Some(std::fs::File::from_raw_fd(fd)))
        }
    }

    fn report(&mut self, line: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = f.write_all(format!("{}\n", line.replace('\n', " ")).as_bytes());
        }
    }
}

/// `delete`: reports the exit status persisted in the bundle (137 when
/// none was recorded) as a protobuf `DeleteResponse` on stdout, after
/// making sure the task is gone. The daemon is asked first (a running task
/// is killed through it); when it is unreachable, fails mid-request, or
/// does not know the task (a daemon started since), the task is removed
/// here from the bundle's record (see [`crate::cleanup`]). The shim config
/// is read only for a bundle without a record, and leniently.
///
/// Must run before any thread is started (it may call libcontainer).
///
/// # Errors
/// When the response cannot be written.
pub fn delete_action(flags: &Flags) -> anyhow::Result<()> {
    use containerd_shim_protos::{api::DeleteResponse, protobuf::Message};
    let bundle = flags
        .bundle
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    let record = match TaskRecord::read(&bundle) {
        Ok(Some(r)) => r,
        other => {
            if let Err(e) = other {
                eprintln!("nri-shim delete {}: {}", flags.id, crate::error::chain(&e));
            }
            TaskRecord {
                version: crate::record::RECORD_VERSION,
                namespace: flags.namespace.clone(),
                id: flags.id.clone(),
                daemon_dir: daemon_dir(&Config::state_root_lenient(), &flags.address),
            }
        }
    };
    // The task's Create will not come now (a start whose Create failed or
    // never came is cleaned up with this); the daemon need not wait for it.
    crate::claim::consume(&record.daemon_dir, &record.namespace, &record.id);
    let sock = record.socket();
    let through_daemon = if answers(&sock) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(delete_through_daemon(&sock, &flags.namespace, &flags.id))
    } else {
        Err(anyhow::anyhow!("daemon socket {} does not answer", sock.display()))
    };
    match through_daemon {
        Ok(true) => {}
        outcome => {
            if let Err(e) = outcome {
                eprintln!(
                    "nri-shim delete {}: {e:#}; cleaning up from {}",
                    flags.id,
                    bundle.join(crate::record::RECORD_FILE).display()
                );
            }
            for problem in crate::cleanup::clean_up(&record, &bundle) {
                eprintln!("nri-shim delete {}: {}", flags.id, crate::error::chain(&problem));
            }
        }
    }
    let exit_status = std::fs::read_to_string(bundle.join(EXIT_STATUS_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(137);
    let rsp = DeleteResponse {
        exit_status,
        exited_at: protobuf::MessageField::some(crate::service::timestamp(std::time::SystemTime::now())),
        ..Default::default()
    };
    let mut out = std::io::stdout();
    out.write_all(&rsp.write_to_bytes()?)?;
    out.flush()?;
    Ok(())
}

/// Deletes the task through the daemon: `true` when the daemon deleted
/// it, `false` when it does not know it. A task still running is killed
/// first (containerd runs `delete` only for a task it gave up on).
async fn delete_through_daemon(sock: &Path, ns: &str, id: &str) -> anyhow::Result<bool> {
    use containerd_shim_protos::{
        api::{DeleteRequest, KillRequest},
        shim_async::TaskClient,
    };
    let client = ttrpc::asynchronous::Client::connect(&format!("unix://{}", sock.display())).await?;
    let task = TaskClient::new(client);
    let ctx = || {
        let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(30).as_nanos() as i64);
        ctx.add(NAMESPACE_HEADER.to_string(), ns.to_string());
        ctx
    };
    let req = DeleteRequest {
        id: id.to_string(),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = false;
    loop {
        match task.delete(ctx(), &req).await {
            Ok(_) => return Ok(true),
            Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::NOT_FOUND => return Ok(false),
            Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::FAILED_PRECONDITION => {
                if Instant::now() > deadline {
                    bail!("task {id} still running 10s after SIGKILL: {}", s.message());
                }
                if !killed {
                    let kill = KillRequest {
                        id: id.to_string(),
                        signal: libc::SIGKILL as u32,
                        all: true,
                        ..Default::default()
                    };
                    let _ = task.kill(ctx(), &kill).await;
                    killed = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The daemon: serves the task service on the socket, hosts NRI, exits
/// after `idle_timeout` with no tasks and no external plugin connected.
/// Its startup result goes to the `start` that spawned it (see
/// [`start_action`]) before it serves.
///
/// Must run before any thread is started.
///
/// # Errors
/// Startup failures (config, NRI socket, task socket), already logged.
pub fn daemon_main(flags: &Flags) -> anyhow::Result<()> {
    let mut ready = Ready::from_env();
    let r = daemon_run(flags, &mut ready);
    if let Err(e) = &r {
        let reason = format!("{e:#}");
        // shim.log first (stderr; time-stamped like the tracing lines), so
        // it names the reason by the time `start` fails.
        eprintln!(
            "{} ERROR containerd-shim-nri-shim-v2 daemon: {reason}",
            humantime::format_rfc3339_micros(std::time::SystemTime::now())
        );
        ready.report(&format!("error: {reason}"));
    }
    r
}

fn daemon_run(flags: &Flags, ready: &mut Ready) -> anyhow::Result<()> {
    // Before any thread: the variable is removed from the environment.
    let resume = crate::upgrade::Handover::from_env().context("resume after an upgrade")?;
    let config = Config::load()?;
    crate::monitor::set_subreaper().context("become child subreaper")?;
    // One malloc arena: the daemon's work is on one thread; the short-lived
    // blocking-pool threads would otherwise each leave an arena behind.
    // SAFETY: mallopt before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let dir = match &resume {
        Some(h) => h.dir.clone(),
        None => daemon_dir(&config.shim.state_root, &flags.address),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    // Targets, not EnvFilter: no regex engine in the resident daemon. The
    // filter was checked when the config was loaded.
    let filter = log_filter(&config.shim.log_level).unwrap_or_default();
    // Behind a reload handle: SIGHUP may change the level.
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(crate::shimlog::writer)
        .with_max_level(tracing::Level::TRACE)
        .finish()
        .with(filter)
        .try_init();
    let set_log_level = move |level: &str| -> anyhow::Result<()> {
        handle.reload(log_filter(level)?)?;
        Ok(())
    };
    crate::shimlog::rotate_stderr(&dir.join("shim.log"), config.shim.log_max_size);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(serve(flags, config, dir, ready, &set_log_level, resume))
}

/// The daemon's log filter for a `[shim] log_level` value. libcgroups
/// announces its manager at info and warns about every cgroup v1
/// controller the host lacks (hugetlb, perf_event, ...) each time the
/// daemon opens a container's cgroups (every exit and delete): not news,
/// so those targets are quieted unless the value names libcgroups itself.
///
/// # Errors
/// A value that is not a `tracing` targets filter.
pub fn log_filter(level: &str) -> Result<tracing_subscriber::filter::Targets, tracing_subscriber::filter::ParseError> {
    if level.contains("libcgroups") {
        return level.parse();
    }
    format!("{level},libcgroups::common=warn,libcgroups::v1::manager=error,libcgroups::v2::util=error").parse()
}

/// Sets the log filter (a `[shim] log_level` value) of the running daemon.
type SetLogLevel<'a> = &'a dyn Fn(&str) -> anyhow::Result<()>;

async fn serve(
    flags: &Flags,
    mut config: Config,
    dir: PathBuf,
    ready: &mut Ready,
    set_log_level: SetLogLevel<'_>,
    resume: Option<crate::upgrade::Handover>,
) -> anyhow::Result<()> {
    // The path started from, kept across upgrades: the file an operator
    // replaces (after a replacement /proc/self/exe names the old, deleted
    // inode).
    let exe = match &resume {
        Some(h) => h.exe.clone(),
        None => std::env::current_exe().context("own executable")?,
    };
    let ttrpc_address = std::env::var("TTRPC_ADDRESS").unwrap_or_else(|_| format!("{}.ttrpc", flags.address));
    let events = Arc::new(RemotePublisher::new(ttrpc_address));
    let service = Service::new(
        // Helpers from this image, not the file at `exe`: once a new binary
        // is installed there (before the upgrade, or one that is refused),
        // its helper protocol need not be this daemon's.
        Arc::new(HelperRunner::new("/proc/self/exe", dir.clone())),
        dir.clone(),
        events,
    );
    service.set_cdi(crate::cdi::Registry::new(config.cdi.spec_dirs.clone()));
    // The previous image's tasks before NRI starts: pre-installed plugins
    // are synchronized with them.
    let mut inherited = Vec::new();
    let mut listener_fd = None;
    if let Some(h) = resume {
        tracing::info!(from = %h.from_version, to = env!("CARGO_PKG_VERSION"), tasks = h.table.tasks.len(), connections = h.connections.len(), "nri-shim daemon taking over after an upgrade");
        // SAFETY: each fd named in the handover is open and taken once.
        let mut take = |fd| unsafe { crate::upgrade::inherit(fd) };
        service.resume(h.table, &mut take);
        for (key, fd) in h.log_fifos {
            if let Some(fd) = take(fd) {
                crate::shimlog::SHIM_LOG.adopt(&key, fd);
            }
        }
        listener_fd = take(h.listener);
        inherited = h
            .connections
            .into_iter()
            .filter_map(|c| take(c.fd).map(|fd| (fd, c.replay)))
            .collect();
    }
    let resumed = listener_fd.is_some();
    let metrics = config.metrics.address.map(|_| Arc::new(crate::metrics::Metrics::new()));
    // Why NRI is not running after an upgrade (told to the operator).
    let mut nri_failed: Option<String> = None;
    let nri = if config.nri.disable {
        tracing::info!("NRI disabled by configuration");
        None
    } else {
        let nri = build_adaptation(&service, &config, metrics.clone())?;
        match nri.start().await {
            Ok(()) => {}
            // After an upgrade containers run and containerd is connected:
            // an exit here would lose them all.
            Err(e) if resumed => {
                let why = crate::error::chain(&e);
                tracing::error!(error = %why, "NRI did not start after the upgrade; serving without it until the next restart or upgrade");
                nri_failed = Some(why);
            }
            Err(e) => return Err(e).context("start NRI"),
        }
        service.set_nri(Arc::new(nri.clone()));
        Some(nri)
    };
    if let (Some(address), Some(metrics)) = (config.metrics.address, metrics) {
        let (s, n) = (service.downgrade(), nri.clone());
        let served = crate::metrics::serve(address, metrics, move || crate::metrics::Snapshot {
            plugins: n.as_ref().map_or(0, |n| n.plugin_names().len()),
            tasks: s.upgrade().map(|s| s.task_states()).unwrap_or_default(),
        })
        .await;
        // Metrics are for watching: a taken port must not stop containers.
        match served {
            Ok(bound) => tracing::info!(address = %bound, "serving metrics on /metrics"),
            Err(e) => tracing::error!(error = %crate::error::chain(&e), "no metrics endpoint"),
        }
    }
    // Plugin files added or removed are picked up without a signal.
    let plugin_dirs = nri.as_ref().map(|n| {
        let (tx, rx) = tokio::sync::watch::channel(config.nri.plugin_path.clone());
        tokio::spawn(crate::plugin_watch::run(n.clone(), rx));
        tx
    });
    crate::monitor::spawn_stray_reaper().context("SIGCHLD handler")?;
    let sock = crate::layout::task_socket(&dir);
    let listener = match listener_fd {
        // The same socket (path and inode): containerd's next dial reaches it.
        Some(fd) => {
            let l = std::os::unix::net::UnixListener::from(fd);
            l.set_nonblocking(true).context("inherited task socket")?;
            tokio::net::UnixListener::from_std(l).context("inherited task socket")?
        }
        None => {
            let _ = std::fs::remove_file(&sock);
            tokio::net::UnixListener::bind(&sock).with_context(|| format!("listen on {}", sock.display()))?
        }
    };
    let listener_raw = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let gate = crate::gate::Gate::new();
    let mut first: Vec<std::io::Result<crate::gate::GatedStream>> = Vec::new();
    for (fd, replay) in inherited {
        let s = std::os::unix::net::UnixStream::from(fd);
        if s.set_nonblocking(true).is_ok()
            && let Ok(s) = tokio::net::UnixStream::from_std(s)
        {
            first.push(Ok(gate.wrap_with_replay(s, replay)));
        }
    }
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let task = Arc::new(TaskService::new(
        service.clone(),
        flags.namespace.clone(),
        shutdown.clone(),
    ));
    let accepted = service.clone();
    let watch = Arc::new(std::sync::Mutex::new(ConfigWatch::new(crate::config::Config::path())));
    let accept_watch = watch.clone();
    let accept_gate = gate.clone();
    // containerd's connections of the previous image first (an upgrade),
    // then new ones; none accepted while an upgrade is under way.
    let incoming = futures::StreamExt::chain(
        futures::stream::iter(first),
        futures::stream::unfold(listener, move |l| {
            let (accepted, watch, gate) = (accepted.clone(), accept_watch.clone(), accept_gate.clone());
            async move {
                let conn = loop {
                    gate.opened().await;
                    tokio::select! {
                        c = l.accept() => break c.map(|(s, _)| gate.wrap(s)),
                        _ = gate.closed() => {}
                    }
                };
                // `start` probes before printing the address: the client that
                // follows must find the daemon still here.
                accepted.touch();
                if let Ok(mut w) = watch.lock() {
                    w.check();
                }
                Some((conn, l))
            }
        }),
    );
    let mut server = ttrpc::asynchronous::Server::new()
        .add_listener(ttrpc::asynchronous::transport::Listener::new(incoming))
        .register_service(crate::task::services(task));
    server.start().await.context("start task server")?;
    tracing::info!(socket = %sock.display(), pid = std::process::id(), "nri-shim daemon serving");
    let _ = std::fs::write(crate::upgrade::pid_file(&dir), format!("{}\n", std::process::id()));
    if resumed {
        let line = format!(
            "ok pid={} version={} exe={} tasks={}",
            std::process::id(),
            env!("CARGO_PKG_VERSION"),
            exe.display(),
            service.task_count()
        );
        // The upgrade happened either way (there is no going back), but
        // the operator must see that plugins are not being called.
        let line = match &nri_failed {
            Some(why) => format!(
                "{line} warning: NRI did not start, containers are created without plugins until the next restart or upgrade: {why}"
            ),
            None => line,
        };
        tracing::info!(result = %line, "upgrade done");
        crate::upgrade::write_result(&dir, &line);
    }

    // Idle exit: no tasks, no task request in flight, no connection or
    // request, and no external NRI plugin, for idle_timeout; and no
    // `start` waiting for its task's Create (crate::claim).
    let mut idle = config.shim.idle_timeout;
    let mut idle_since: Option<Instant> = None;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("SIGHUP handler")?;
    // SIGTERM/SIGINT (systemd, an operator): the same orderly exit as on
    // idle, whatever still runs (containerd cleans up after a dead shim).
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).context("SIGINT handler")?;
    // SIGUSR2 (the `upgrade` action): re-execute the binary in place.
    let mut usr2 =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()).context("SIGUSR2 handler")?;
    // Handlers in place before `start` returns: a SIGHUP before would end
    // the daemon (the default action).
    ready.report("ok");
    let quiet = || {
        service
            .idle_for()
            .filter(|_| !nri.as_ref().is_some_and(|n| n.has_external_plugins()))
    };
    let reason = loop {
        match (quiet(), idle_since) {
            (None, _) => idle_since = None,
            (Some(_), None) => idle_since = Some(Instant::now()),
            (Some(q), Some(t)) if t.elapsed() >= idle && q >= idle => {
                // Decide under `start`'s lock: a starter that probed before
                // we got it has been accepted (activity) by the time we look
                // again; one that comes after finds no socket and starts a
                // new daemon.
                let lock_dir = dir.clone();
                let lock = tokio::task::spawn_blocking(move || start_lock(&lock_dir)).await;
                // Let a probe that connected meanwhile be accepted first.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let claims = crate::claim::pending(&dir, crate::claim::CLAIM_TTL);
                if claims == 0 && quiet().is_some_and(|q| q >= idle) {
                    let _ = std::fs::remove_file(&sock);
                    drop(lock);
                    break "idle";
                }
                idle_since = None;
            }
            _ => {}
        }
        let tick = idle.min(Duration::from_secs(1)).max(Duration::from_millis(50));
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = service.changed() => {}
            _ = shutdown.notified() => {}
            _ = hup.recv() => {
                reload_config(&mut config, nri.as_ref(), set_log_level).await;
                idle = config.shim.idle_timeout;
                if let Some(tx) = &plugin_dirs {
                    tx.send_if_modified(|d| {
                        let moved = *d != config.nri.plugin_path;
                        d.clone_from(&config.nri.plugin_path);
                        moved
                    });
                }
                if let Ok(mut w) = watch.lock() {
                    w.reloaded();
                }
            }
            _ = usr2.recv() => {
                let handover = Upgrade { exe: &exe, dir: &dir, gate: &gate, service: &service, nri: nri.as_ref(), listener: listener_raw };
                let e = handover.run().await;
                tracing::error!(error = %crate::error::chain(&e), "upgrade failed; this binary serves on");
                crate::upgrade::write_result(&dir, &format!("error: {}", crate::error::chain(&e)));
            }
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
    };
    tracing::info!(reason, tasks = service.task_count(), "nri-shim daemon exiting");
    let _ = std::fs::remove_file(crate::upgrade::pid_file(&dir));
    if reason != "idle" {
        // (On idle it went under the start lock: a successor may own the
        // path by now.)
        let _ = std::fs::remove_file(&sock);
    }
    let _ = server.shutdown().await;
    if let Some(n) = nri {
        n.stop().await;
    }
    Ok(())
}

/// An upgrade in the daemon (see [`crate::upgrade`]).
struct Upgrade<'a> {
    exe: &'a Path,
    dir: &'a Path,
    gate: &'a crate::gate::Gate,
    service: &'a Service,
    nri: Option<&'a Adaptation>,
    listener: std::os::fd::RawFd,
}

impl Upgrade<'_> {
    /// Checks the new binary, quiesces, hands over and re-executes it;
    /// returns only when the upgrade did not happen (everything undone).
    async fn run(&self) -> crate::upgrade::UpgradeError {
        tracing::info!(exe = %self.exe.display(), "upgrade requested");
        if let Err(e) = crate::upgrade::check_binary(self.exe).await {
            return e;
        }
        self.gate.close();
        crate::monitor::freeze(true);
        let e = self.quiesced_exec().await;
        crate::monitor::freeze(false);
        self.gate.open();
        e
    }

    async fn quiesced_exec(&self) -> crate::upgrade::UpgradeError {
        use crate::upgrade::UpgradeError;
        let deadline = Instant::now() + crate::upgrade::QUIESCE_TIMEOUT;
        loop {
            let busy = self.service.busy();
            let conns = !self.gate.quiet(&crate::upgrade::replayable);
            if busy.is_none() && !conns {
                break;
            }
            if Instant::now() > deadline {
                let mut why = busy.unwrap_or_default();
                if conns {
                    why.push_str(if why.is_empty() { "" } else { "; " });
                    why.push_str("a containerd request still unanswered");
                }
                return UpgradeError::Busy(why);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(n) = self.nri {
            n.stop().await;
        }
        // Stopping NRI awaited: a response may have started meanwhile.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !(self.gate.quiet(&crate::upgrade::replayable) && self.service.busy().is_none())
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Last: stdio is copied until here.
        self.service.stop_terminals(Duration::from_secs(1));
        let mut parks = self.service.stdin_parks();
        let late = crate::io::park_stdin(&mut parks, Duration::from_secs(1)).await;
        if late > 0 {
            tracing::warn!(
                copiers = late,
                "stdin copiers did not park before the upgrade (writing to a full pipe); bytes they hold are lost"
            );
        }
        let e = self.exec().await;
        crate::io::unpark_stdin(&parks);
        self.service.restart_terminals();
        if let Some(n) = self.nri
            && let Err(e) = n.start().await
        {
            tracing::error!(error = %crate::error::chain(&e), "NRI did not start again after the failed upgrade");
        }
        let _ = std::fs::remove_file(crate::upgrade::handover_file(self.dir));
        e
    }

    /// Writes the handover and execs; returns only on failure (the
    /// duplicated fds are closed then).
    async fn exec(&self) -> crate::upgrade::UpgradeError {
        use crate::upgrade::{Handover, UpgradeError, dup_for_exec};
        let mut keep = Vec::new();
        let state = (|| -> std::io::Result<Handover> {
            let listener = dup_for_exec(self.listener, &mut keep)?;
            let connections = self
                .gate
                .handover()
                .into_iter()
                .map(|(fd, replay)| dup_for_exec(fd, &mut keep).map(|fd| crate::upgrade::Connection { fd, replay }))
                .collect::<std::io::Result<_>>()?;
            let log_fifos = crate::shimlog::SHIM_LOG
                .fds()
                .into_iter()
                .map(|(k, fd)| dup_for_exec(fd, &mut keep).map(|d| (k, d)))
                .collect::<std::io::Result<_>>()?;
            let table = self.service.handover_state(&mut |fd| dup_for_exec(fd, &mut keep))?;
            Ok(Handover {
                version: crate::upgrade::HANDOVER_VERSION,
                exe: self.exe.to_path_buf(),
                from_version: env!("CARGO_PKG_VERSION").to_string(),
                dir: self.dir.to_path_buf(),
                listener,
                connections,
                log_fifos,
                table,
            })
        })();
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                return UpgradeError::Io {
                    what: "duplicate the fds to hand over".into(),
                    source: e,
                };
            }
        };
        let path = crate::upgrade::handover_file(self.dir);
        let text = serde_json::to_vec(&state).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            return UpgradeError::Io {
                what: format!("write {}", path.display()),
                source: e,
            };
        }
        tracing::info!(exe = %self.exe.display(), tasks = state.table.tasks.len(), connections = state.connections.len(), "handing over to the new binary");
        let e = crate::upgrade::exec(self.exe, &path);
        drop(keep);
        e
    }
}

/// SIGHUP: reads the config file again and applies what can change under
/// running containers (see [`crate::reload`]); an invalid file is logged
/// and the running configuration kept.
async fn reload_config(running: &mut Config, nri: Option<&Adaptation>, set_log_level: SetLogLevel<'_>) {
    let path = Config::path();
    let new = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %crate::error::chain(&e), "config reload failed; the running configuration stays in effect");
            return;
        }
    };
    let plan = crate::reload::plan(running, &new);
    let mut effective = crate::reload::effective(running, &new);
    if !plan.needs_restart.is_empty() {
        tracing::warn!(config = %path.display(), keys = ?plan.needs_restart, "config reload: these keys need a restart of the daemon (SIGTERM once no container runs, or an upgrade); their running values stay");
    }
    if plan.live.contains(&"shim.log_level") {
        if let Err(e) = set_log_level(&effective.shim.log_level) {
            tracing::error!(error = %format!("{e:#}"), "config reload: cannot set the log level");
            effective.shim.log_level = running.shim.log_level.clone();
        }
    }
    if plan.live.contains(&"shim.log_max_size") {
        crate::shimlog::set_log_max_size(effective.shim.log_max_size);
    }
    if let Some(nri) = nri {
        match nri.reconfigure(effective.nri.options()).await {
            Ok(r) => log_plugin_changes("config reload", &r),
            Err(e) => {
                tracing::error!(error = %crate::error::chain(&e), "config reload: the running NRI configuration stays in effect");
                effective.nri = running.nri.clone();
            }
        }
    }
    *running = effective;
    tracing::info!(config = %path.display(), changed = ?plan.live, "config reloaded");
}

/// Logs what a reconfiguration or rescan of the NRI plugins did.
pub(crate) fn log_plugin_changes(why: &str, r: &nri_adaptation::Reconfigured) {
    if !r.stopped.is_empty() {
        tracing::info!(plugins = ?r.stopped, "{why}: pre-installed NRI plugins stopped");
    }
    if !r.started.is_empty() {
        tracing::info!(plugins = ?r.started, "{why}: pre-installed NRI plugins started");
    }
    if !r.failed.is_empty() {
        tracing::error!(plugins = ?r.failed, "{why}: pre-installed NRI plugins failed to start");
    }
}

/// Notices a config file edited while the daemon runs: it is applied only
/// on SIGHUP (an operator edits in several steps), which the operator must
/// be told.
struct ConfigWatch {
    path: PathBuf,
    loaded: Option<Vec<u8>>,
    mtime: Option<std::time::SystemTime>,
    warned: Option<Vec<u8>>,
}

impl ConfigWatch {
    fn new(path: PathBuf) -> ConfigWatch {
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        ConfigWatch {
            loaded: std::fs::read(&path).ok(),
            path,
            mtime,
            warned: None,
        }
    }

    /// Warns once per new content; a stat per call otherwise.
    fn check(&mut self) {
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if mtime == self.mtime {
            return;
        }
        self.mtime = mtime;
        let now = std::fs::read(&self.path).ok();
        if now != self.loaded && now != self.warned {
            tracing::warn!(
                config = %self.path.display(),
                pid = std::process::id(),
                "the shim config changed since this daemon loaded it; SIGHUP to the daemon applies it"
            );
            self.warned = now;
        }
    }

    /// The file was read again: its content is the one loaded now.
    fn reloaded(&mut self) {
        self.mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        self.loaded = std::fs::read(&self.path).ok();
        self.warned = None;
    }
}

fn build_adaptation(
    service: &Service,
    config: &Config,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) -> anyhow::Result<Adaptation> {
    let (s1, s2, s3) = (service.downgrade(), service.downgrade(), service.downgrade());
    let mut builder = Adaptation::builder("nri-shim", env!("CARGO_PKG_VERSION"));
    if let Some(m) = metrics {
        builder = builder.with_observer(m);
    }
    builder
        .with_options(config.nri.options())
        .with_sync_fn(move || {
            let s = s1.clone();
            async move { Ok(s.upgrade().map(|s| s.nri_state()).unwrap_or_default()) }
        })
        .with_update_fn(move |updates| {
            let s = s2.clone();
            async move {
                match s.upgrade() {
                    Some(s) => Ok(s.apply_updates(updates).await),
                    None => Ok(updates),
                }
            }
        })
        .with_evict_fn(move |ev| {
            let s = s3.clone();
            async move {
                // Detached: the kill tells the plugins StopContainer, which
                // waits for the request in progress, and a plugin may be
                // evicting from inside that very request (R7 shape).
                if let Some(s) = s.upgrade() {
                    tokio::spawn(async move { s.evict(&ev.container_id, &ev.reason).await });
                }
                Ok(())
            }
        })
        .build()
        .context("configure NRI")
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    #[test]
    fn libcgroups_noise_is_quieted_unless_the_level_names_it() {
        let f = super::log_filter("info").unwrap();
        assert!(f.would_enable("nri_shim::service::exit", &Level::INFO));
        assert!(!f.would_enable("libcgroups::v1::manager", &Level::WARN));
        assert!(f.would_enable("libcgroups::v1::manager", &Level::ERROR));
        assert!(!f.would_enable("libcgroups::common", &Level::INFO));
        assert!(f.would_enable("libcgroups::common", &Level::WARN));
        let f = super::log_filter("info,libcgroups=debug").unwrap();
        assert!(f.would_enable("libcgroups::v1::manager", &Level::DEBUG));
    }
}
