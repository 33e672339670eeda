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
    bundle::EXIT_STATUS_FILE,
    config::Config,
    events::RemotePublisher,
    helper,
    runner::HelperRunner,
    service::{Service, short_hash},
    task::{NAMESPACE_HEADER, TaskService},
};

/// Directory of the daemon serving containerd at `address`.
pub fn daemon_dir(config: &Config, address: &str) -> PathBuf {
    config.shim.state_root.join(short_hash(address))
}

/// The daemon's task socket.
pub fn socket_path(config: &Config, address: &str) -> PathBuf {
    daemon_dir(config, address).join("task.sock")
}

fn answers(sock: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

/// `start`: prints only the task address (containerd reads stdout and
/// stderr together as the address), starting the daemon unless it runs.
///
/// # Errors
/// When the daemon cannot be started or does not come up within 10 s.
pub fn start_action(flags: &Flags, config: &Config) -> anyhow::Result<()> {
    let sock = socket_path(config, &flags.address);
    if !answers(&sock) {
        let dir = daemon_dir(config, &flags.address);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        // One starter at a time; the loser finds the daemon up.
        let lock = std::fs::File::create(dir.join("start.lock")).context("start lock")?;
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .context("lock start.lock")
            .and_then(|_guard| {
                if answers(&sock) {
                    return Ok(());
                }
                spawn_daemon(flags, &dir)?;
                let deadline = Instant::now() + Duration::from_secs(10);
                while !answers(&sock) {
                    if Instant::now() > deadline {
                        bail!(
                            "nri-shim daemon did not come up within 10s; see {}",
                            dir.join("shim.log").display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })?;
    }
    let mut out = std::io::stdout();
    write!(out, "unix://{}", sock.display())?;
    out.flush()?;
    Ok(())
}

fn spawn_daemon(flags: &Flags, dir: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("own executable")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("shim.log"))
        .context("daemon log")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["-namespace", &flags.namespace, "-address", &flags.address])
        .args(["-publish-binary", &flags.publish_binary, "-id", &flags.id])
        .arg("daemon")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from
    // containerd's process group and session.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    cmd.spawn().context("spawn nri-shim daemon")?;
    Ok(())
}

/// `delete`: reports the exit status persisted in the bundle (137 when
/// none was recorded) as a protobuf `DeleteResponse` on stdout, after
/// making sure the task is gone: through the daemon if it answers, else by
/// deleting libcontainer's state (which kills what still runs) here.
///
/// Must run before any thread is started (it may call libcontainer).
///
/// # Errors
/// When the response cannot be written.
pub fn delete_action(flags: &Flags, config: &Config) -> anyhow::Result<()> {
    use containerd_shim_protos::{api::DeleteResponse, protobuf::Message};
    let bundle = flags
        .bundle
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    let sock = socket_path(config, &flags.address);
    if answers(&sock) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        if let Err(e) = rt.block_on(delete_through_daemon(&sock, &flags.namespace, &flags.id)) {
            eprintln!("nri-shim delete {}: {}", flags.id, nri_proto::error_chain(e.as_ref()));
        }
    } else {
        let root = daemon_dir(config, &flags.address).join("containers");
        if root.join(&flags.id).exists() {
            let r = helper::run_inline(helper::Request::Delete {
                id: flags.id.clone(),
                root,
                force: true,
                cgroups_path: None,
            });
            if let Err(e) = r.into_result() {
                eprintln!("nri-shim delete {}: {e}", flags.id);
            }
        }
        let _ = nix::mount::umount2(&bundle.join("rootfs"), nix::mount::MntFlags::MNT_DETACH);
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

async fn delete_through_daemon(sock: &Path, ns: &str, id: &str) -> anyhow::Result<()> {
    use containerd_shim_protos::{api::DeleteRequest, shim_async::TaskClient};
    let client = ttrpc::asynchronous::Client::connect(&format!("unix://{}", sock.display())).await?;
    let task = TaskClient::new(client);
    let mut ctx = ttrpc::context::with_timeout(Duration::from_secs(30).as_nanos() as i64);
    ctx.add(NAMESPACE_HEADER.to_string(), ns.to_string());
    let req = DeleteRequest {
        id: id.to_string(),
        ..Default::default()
    };
    match task.delete(ctx, &req).await {
        Ok(_) => Ok(()),
        Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::NOT_FOUND => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The daemon: serves the task service on the socket, hosts NRI, exits
/// after `idle_timeout` with no tasks and no external plugin connected.
///
/// # Errors
/// Startup failures (config, NRI socket, task socket).
pub fn daemon_main(flags: &Flags, config: Config) -> anyhow::Result<()> {
    crate::monitor::set_subreaper().context("become child subreaper")?;
    // One malloc arena: the daemon's work is on one thread; the short-lived
    // blocking-pool threads would otherwise each leave an arena behind.
    // SAFETY: mallopt before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let dir = daemon_dir(&config, &flags.address);
    std::fs::create_dir_all(&dir)?;
    // Targets, not EnvFilter: no regex engine in the resident daemon. The
    // filter was checked when the config was loaded.
    let filter: tracing_subscriber::filter::Targets = config.shim.log_level.parse().unwrap_or_default();
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(crate::shimlog::writer)
        .with_max_level(tracing::Level::TRACE)
        .finish()
        .with(filter)
        .try_init();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(serve(flags, config, dir))
}

async fn serve(flags: &Flags, config: Config, dir: PathBuf) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("own executable")?;
    let ttrpc_address = std::env::var("TTRPC_ADDRESS").unwrap_or_else(|_| format!("{}.ttrpc", flags.address));
    let events = Arc::new(RemotePublisher::new(ttrpc_address));
    let service = Service::new(Arc::new(HelperRunner::new(exe, dir.clone())), dir.clone(), events);
    let nri = if config.nri.disable {
        tracing::info!("NRI disabled by configuration");
        None
    } else {
        let nri = build_adaptation(&service, &config)?;
        nri.start().await.context("start NRI")?;
        service.set_nri(Arc::new(nri.clone()));
        Some(nri)
    };
    crate::monitor::spawn_stray_reaper().context("SIGCHLD handler")?;
    let sock = dir.join("task.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock).with_context(|| format!("listen on {}", sock.display()))?;
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let task = Arc::new(TaskService::new(
        service.clone(),
        flags.namespace.clone(),
        shutdown.clone(),
    ));
    let accepted = service.clone();
    let watch = Arc::new(std::sync::Mutex::new(ConfigWatch::new(crate::config::Config::path())));
    let incoming = futures::stream::unfold(listener, move |l| {
        let (accepted, watch) = (accepted.clone(), watch.clone());
        async move {
            let conn = l.accept().await.map(|(s, _)| s);
            // `start` probes before printing the address: the client that
            // follows must find the daemon still here.
            accepted.touch();
            if let Ok(mut w) = watch.lock() {
                w.check();
            }
            Some((conn, l))
        }
    });
    let mut server = ttrpc::asynchronous::Server::new()
        .add_listener(ttrpc::asynchronous::transport::Listener::new(incoming))
        .register_service(crate::task::services(task));
    server.start().await.context("start task server")?;
    tracing::info!(socket = %sock.display(), pid = std::process::id(), "nri-shim daemon serving");

    // Idle exit: no tasks, no task request in flight, no connection or
    // request, and no external NRI plugin, for idle_timeout.
    let idle = config.shim.idle_timeout;
    let mut idle_since: Option<Instant> = None;
    // SIGTERM/SIGINT (systemd, an operator): the same orderly exit as on
    // idle, whatever still runs (containerd cleans up after a dead shim).
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).context("SIGINT handler")?;
    let reason = loop {
        let quiet = service
            .idle_for()
            .filter(|_| !nri.as_ref().is_some_and(|n| n.has_external_plugins()));
        match (quiet, idle_since) {
            (None, _) => idle_since = None,
            (Some(_), None) => idle_since = Some(Instant::now()),
            (Some(q), Some(t)) if t.elapsed() >= idle && q >= idle => break "idle",
            _ => {}
        }
        let tick = idle.min(Duration::from_secs(1)).max(Duration::from_millis(50));
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = service.changed() => {}
            _ = shutdown.notified() => {}
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
    };
    tracing::info!(reason, tasks = service.task_count(), "nri-shim daemon exiting");
    let _ = std::fs::remove_file(&sock);
    let _ = server.shutdown().await;
    if let Some(n) = nri {
        n.stop().await;
    }
    Ok(())
}

/// Notices a config file edited while the daemon runs: the daemon keeps
/// the configuration it started with (plugins, sockets, state root cannot
/// change under running containers), which an operator must be told.
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
                "the shim config changed since this daemon started; it keeps the old one until it exits (idle exit, or SIGTERM once no container runs)"
            );
            self.warned = now;
        }
    }
}

fn build_adaptation(service: &Service, config: &Config) -> anyhow::Result<Adaptation> {
    let (s1, s2, s3) = (service.downgrade(), service.downgrade(), service.downgrade());
    Adaptation::builder("nri-shim", env!("CARGO_PKG_VERSION"))
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
