//! The daemon: one per containerd instance, it hosts the task service for
//! every container of this runtime and the node's single NRI adaptation
//! (NRI plugins expect one runtime per node that sees every pod).

use std::{
    io::Write as _,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use nri_adaptation::Adaptation;
use tracing_subscriber::layer::SubscriberExt as _;

use super::{
    reload::{ConfigWatch, reload_config},
    start::{READY_FD_ENV, daemon_dir, start_lock},
    upgrade::Upgrade,
};
use crate::{
    config::Config, container::runner::HelperRunner, node::args::Flags, task::events::RemotePublisher,
    task::service::Service, task::ttrpc::TaskService,
};

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

/// The daemon: serves the task service on the socket, hosts NRI, exits
/// after `idle_timeout` with no tasks and no external plugin connected.
/// Its startup result goes to the `start` that spawned it (see
/// [`super::start::start_action`]) before it serves.
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
    let resume = crate::node::upgrade::Handover::from_env().context("resume after an upgrade")?;
    let config = Config::load()?;
    crate::task::monitor::set_subreaper().context("become child subreaper")?;
    // One malloc arena: the daemon's work is on one thread; the short-lived
    // blocking-pool threads would otherwise each leave an arena behind.
    // SAFETY: mallopt before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let dir = match &resume {
        Some(h) => h.dir.clone(),
        None => daemon_dir(&config.shim.state_root, &flags.address),
    };
    crate::private::create_dir_all(&dir)?;
    // Targets, not EnvFilter: no regex engine in the resident daemon. The
    // filter was checked when the config was loaded.
    let filter = log_filter(&config.shim.log_level).unwrap_or_default();
    // Behind a reload handle: SIGHUP may change the level.
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(crate::node::shimlog::writer)
        .with_max_level(tracing::Level::TRACE)
        .finish()
        .with(filter);
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        // Crates that log through `log` (ttrpc, ...) reach the same
        // filter, except the WebAssembly compiler's: `log` records have no
        // per-call-site cache, so each of its ~15,000 debug records per
        // plugin module would be matched against the filter (at `debug`,
        // most of a module's compile time in a debug build).
        let _ = tracing_log::LogTracer::builder()
            .ignore_all(WASM_COMPILER_TARGETS)
            .init();
    }
    let set_log_level = move |level: &str| -> anyhow::Result<()> {
        handle.reload(log_filter(level)?)?;
        Ok(())
    };
    crate::node::shimlog::rotate_stderr(&dir.join("shim.log"), config.shim.log_max_size);
    // Log lines from here on are written by a thread of their own (see
    // shimlog::start_log_thread): never by the runtime thread.
    crate::node::shimlog::start_log_thread().context("start the log thread")?;
    // The state root (all of it: every containerd's daemon) as
    // crate::private makes it, when an older nri-shim left it readable;
    // also on an in-place upgrade, whose new image starts here.
    crate::private::tighten_and_log(dir.parent().unwrap_or(&dir));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let r = rt.block_on(serve(flags, config, dir, ready, &set_log_level, resume));
    crate::node::shimlog::flush_log(std::time::Duration::from_secs(2));
    r
}

/// Target prefixes of the WebAssembly compiler (wasmtime, Cranelift,
/// regalloc2): its records are never forwarded from `log`, see
/// [`log_filter`].
const WASM_COMPILER_TARGETS: [&str; 3] = ["wasmtime", "cranelift", "regalloc2"];

/// The daemon's log filter for a `[shim] log_level` value. Two
/// dependencies are quieted unless the value names them:
/// - libcgroups announces its manager at info and warns about every cgroup
///   v1 controller the host lacks (hugetlb, perf_event, ...) each time the
///   daemon opens a container's cgroups (every exit and delete): not news.
/// - The WebAssembly compiler (wasmtime, Cranelift, regalloc2) writes
///   about 15,000 debug lines per 100 KiB plugin module it compiles; at
///   `debug` they were 99.9 % of the log and made the compile, which the
///   daemon's startup waits for, several times slower. Only its warnings
///   through `tracing` are kept; through `log` it is not heard at all.
///
/// # Errors
/// A value that is not a `tracing` targets filter.
pub fn log_filter(level: &str) -> Result<tracing_subscriber::filter::Targets, tracing_subscriber::filter::ParseError> {
    // Targets match by prefix: `cranelift` covers cranelift_codegen and
    // wasmtime_internal_cranelift is covered by `wasmtime`.
    let quieted = [(
        "libcgroups",
        "libcgroups::common=warn,libcgroups::v1::manager=error,libcgroups::v2::util=error".to_string(),
    )]
    .into_iter()
    .chain(WASM_COMPILER_TARGETS.map(|t| (t, format!("{t}=warn"))));
    let mut filter = level.to_string();
    for (named, quiet) in quieted {
        if !level.contains(named) {
            filter.push(',');
            filter.push_str(&quiet);
        }
    }
    filter.parse()
}

/// Sets the log filter (a `[shim] log_level` value) of the running daemon.
pub(super) type SetLogLevel<'a> = &'a dyn Fn(&str) -> anyhow::Result<()>;

async fn serve(
    flags: &Flags,
    mut config: Config,
    dir: PathBuf,
    ready: &mut Ready,
    set_log_level: SetLogLevel<'_>,
    resume: Option<crate::node::upgrade::Handover>,
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
        let mut take = |fd| unsafe { crate::node::upgrade::inherit(fd) };
        service.resume(h.table, &mut take);
        for (key, fd) in h.log_fifos {
            if let Some(fd) = take(fd) {
                crate::node::shimlog::SHIM_LOG.adopt(&key, fd);
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
    let metrics = config
        .metrics
        .address
        .map(|_| Arc::new(crate::node::metrics::Metrics::new()));
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
        let served = crate::node::metrics::serve(address, metrics, move || crate::node::metrics::Snapshot {
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
        tokio::spawn(crate::node::plugin_watch::run(n.clone(), rx));
        tx
    });
    crate::task::monitor::spawn_stray_reaper().context("SIGCHLD handler")?;
    crate::waits::start_watchdog().context("start the runtime watchdog")?;
    let sock = crate::layout::task_socket(&dir);
    // The socket is served from the control thread (see
    // crate::node::control): created there, so its readiness is polled
    // there.
    let listener = match listener_fd {
        // The same socket (path and inode): containerd's next dial reaches it.
        Some(fd) => std::os::unix::net::UnixListener::from(fd),
        None => {
            let _ = std::fs::remove_file(&sock);
            std::os::unix::net::UnixListener::bind(&sock).with_context(|| format!("listen on {}", sock.display()))?
        }
    };
    listener.set_nonblocking(true).context("task socket")?;
    let listener_raw = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let gate = crate::node::gate::Gate::new();
    let inherited: Vec<_> = inherited
        .into_iter()
        .filter_map(|(fd, replay)| {
            let s = std::os::unix::net::UnixStream::from(fd);
            s.set_nonblocking(true).ok().map(|()| (s, replay))
        })
        .collect();
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let task = Arc::new(TaskService::new(
        service.clone(),
        flags.namespace.clone(),
        shutdown.clone(),
        Some(tokio::runtime::Handle::current()),
    ));
    let accepted = service.clone();
    let watch = Arc::new(std::sync::Mutex::new(ConfigWatch::new(crate::config::Config::path())));
    let accept_watch = watch.clone();
    let accept_gate = gate.clone();
    let control = crate::node::control::ControlThread::start().context("start the control thread")?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
    let server_task = control.handle().spawn(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                let _ = started_tx.send(Err(anyhow::Error::new(e).context("task socket")));
                return;
            }
        };
        // containerd's connections of the previous image first (an
        // upgrade), then new ones; none accepted while an upgrade is under
        // way.
        let first: Vec<std::io::Result<crate::node::gate::GatedStream>> = inherited
            .into_iter()
            .filter_map(|(s, replay)| tokio::net::UnixStream::from_std(s).ok().map(|s| (s, replay)))
            .map(|(s, replay)| Ok(accept_gate.wrap_with_replay(s, replay)))
            .collect();
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
                    // `start` probes before printing the address: the client
                    // that follows must find the daemon still here.
                    accepted.touch();
                    // A connection is the first sign of a coming create
                    // (start's probe, then containerd's dial): the grace
                    // period of its cgroup migration can start now (see
                    // crate::cgroups::prime).
                    crate::cgroups::prime::prime();
                    if let Ok(mut w) = watch.lock() {
                        w.check();
                    }
                    Some((conn, l))
                }
            }),
        );
        let mut server = ttrpc::asynchronous::Server::new()
            .add_listener(ttrpc::asynchronous::transport::Listener::new(incoming))
            .register_service(crate::task::ttrpc::services(task));
        if let Err(e) = server.start().await {
            let _ = started_tx.send(Err(anyhow::Error::new(e).context("start task server")));
            return;
        }
        let _ = started_tx.send(Ok(()));
        let _ = server_stopped.await;
        let _ = server.shutdown().await;
    });
    started.await.context("the control thread ended")??;
    tracing::info!(socket = %sock.display(), pid = std::process::id(), "nri-shim daemon serving");
    let _ = crate::private::write(
        &crate::node::upgrade::pid_file(&dir),
        format!("{}\n", std::process::id()),
    );
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
        crate::node::upgrade::write_result(&dir, &line);
    }

    // Idle exit: no tasks, no task request in flight, no connection or
    // request, and no external NRI plugin, for idle_timeout; and no
    // `start` waiting for its task's Create (crate::node::claim).
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
                let claims = crate::node::claim::pending(&dir, crate::node::claim::CLAIM_TTL);
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
                crate::node::upgrade::write_result(&dir, &format!("error: {}", crate::error::chain(&e)));
            }
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
    };
    tracing::info!(reason, tasks = service.task_count(), "nri-shim daemon exiting");
    let _ = std::fs::remove_file(crate::node::upgrade::pid_file(&dir));
    if reason != "idle" {
        // (On idle it went under the start lock: a successor may own the
        // path by now.)
        let _ = std::fs::remove_file(&sock);
    }
    let _ = stop_server.send(());
    let _ = server_task.await;
    drop(control);
    if let Some(n) = nri {
        n.stop().await;
    }
    Ok(())
}

fn build_adaptation(
    service: &Service,
    config: &Config,
    metrics: Option<Arc<crate::node::metrics::Metrics>>,
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
        assert!(f.would_enable("nri_shim::task::service::exit", &Level::INFO));
        assert!(!f.would_enable("libcgroups::v1::manager", &Level::WARN));
        assert!(f.would_enable("libcgroups::v1::manager", &Level::ERROR));
        assert!(!f.would_enable("libcgroups::common", &Level::INFO));
        assert!(f.would_enable("libcgroups::common", &Level::WARN));
        let f = super::log_filter("info,libcgroups=debug").unwrap();
        assert!(f.would_enable("libcgroups::v1::manager", &Level::DEBUG));
    }

    #[test]
    fn the_wasm_compiler_is_quieted_unless_the_level_names_it() {
        let f = super::log_filter("debug").unwrap();
        assert!(f.would_enable("nri_adaptation::plugin::wasm", &Level::DEBUG));
        for target in [
            "cranelift_codegen::timing::enabled",
            "wasmtime_internal_cranelift::compiler",
            "wasmtime::runtime::code_memory",
            "regalloc2::ion",
        ] {
            assert!(!f.would_enable(target, &Level::DEBUG), "{target}");
            assert!(!f.would_enable(target, &Level::INFO), "{target}");
            assert!(f.would_enable(target, &Level::WARN), "{target}");
        }
        // Asked for by name: as asked.
        let f = super::log_filter("info,cranelift_codegen=debug").unwrap();
        assert!(f.would_enable("cranelift_codegen::context", &Level::DEBUG));
        assert!(!f.would_enable("wasmtime::runtime", &Level::INFO));
    }
}
