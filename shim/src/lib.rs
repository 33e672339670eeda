//! # nri-shim
//!
//! A containerd shim v2 (`runtime_type = "io.containerd.nri-shim.v2"`,
//! binary `containerd-shim-nri-shim-v2`) that passes every container
//! through the node's NRI plugins and runs it with youki's libcontainer.
//!
//! | module | what |
//! |---|---|
//! | [`daemon`] | `start` / `delete` actions, the per-node daemon |
//! | [`bootstrap`] | `start`'s stdin and reply for containerd 1.6, 1.7 and 2.x |
//! | [`task`] | the containerd Task ttrpc service (v2 and v3 names) |
//! | [`service`] | the task lifecycle, NRI event mapping, events in order |
//! | [`runner`] | the seam to the container runtime; the helper-process runner |
//! | [`helper`] | libcontainer in a single-threaded helper process |
//! | [`bundle`] | `config.json`, rootfs mounts, the exit status file |
//! | [`cdi`] | CDI devices from spec files, by annotation or NRI adjustment |
//! | [`monitor`] | exact exit statuses through pidfds |
//! | [`nri`] | pods and containers from bundle annotations; the NRI seam |
//! | [`io`] | stdio fifos, files and terminals |
//! | [`cgroups`] | updates, stats, freeze, pids |
//! | [`cgroupv2`] | containerd's cgroup v2 metrics from a v2 cgroup |
//! | [`oom`] | OOM kills as they happen |
//! | [`record`] | what a task's bundle records for containerd's restart and for `delete` |
//! | [`cleanup`] | `delete` without the daemon |
//! | [`config`] | `/etc/nri-shim/config.toml` |
//! | [`info`] | `-info`: the runtime features containerd 2.x asks for |
//! | [`metrics`] | the optional Prometheus/OpenMetrics endpoint |
//! | [`plugin_watch`] | plugins added to or removed from `plugin_path`, without a signal |
//! | [`reload`] | SIGHUP: what a new config changes in a running daemon |
//! | [`events`] | ordered publishing to containerd |
//! | [`upgrade`] | in-place upgrade: a new binary takes over the running daemon |
//! | [`gate`] | containerd's connections paused at a ttrpc frame boundary |

#![warn(missing_docs)]

pub mod args;
pub mod audit;
pub mod bootstrap;
pub mod bundle;
pub mod cdi;
pub mod cgroups;
pub mod cgroupv2;
pub mod claim;
pub mod cleanup;
pub mod config;
pub mod daemon;
pub mod error;
pub mod events;
pub mod gate;
pub mod helper;
pub mod info;
pub mod io;
pub mod layout;
pub mod metrics;
pub mod monitor;
pub mod nri;
pub mod oom;
pub mod options;
pub mod plugin_watch;
pub mod record;
pub mod reload;
pub mod runner;
pub mod service;
pub mod shimlog;
pub mod sync;
pub mod task;
pub mod upgrade;

/// The binary's entry point: dispatches on the action before any thread
/// exists (the helper and `delete` may run libcontainer in this process).
pub fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(helper::HELPER_ARG) {
        helper::helper_main();
    }
    let mut flags = match args::parse(argv.into_iter().skip(1)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("containerd-shim-nri-shim-v2: {e} (-h for usage)");
            std::process::exit(2);
        }
    };
    // containerd 2.3+ sends `start` its bootstrap parameters on stdin;
    // they fill what the command line leaves out.
    let params = if flags.action == "start" && !flags.info && !flags.help && !flags.version {
        bootstrap::BootstrapParams::for_task(&bootstrap::read_stdin(), &flags)
    } else {
        None
    };
    if let Some(p) = &params {
        p.fill(&mut flags);
    }
    if let Err(e) = flags.require() {
        eprintln!("containerd-shim-nri-shim-v2: {e} (-h for usage)");
        std::process::exit(2);
    }
    if flags.version {
        println!("containerd-shim-nri-shim-v2 {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    if flags.help {
        print!("{}", args::USAGE);
        return;
    }
    if flags.info {
        if let Err(e) = info::info_action(std::io::stdin().lock(), std::io::stdout().lock()) {
            eprintln!("containerd-shim-nri-shim-v2 -info: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    // `start` and `delete` must work whatever the config file holds (an
    // operator mid-edit): `delete` reads the bundle's record instead; the
    // daemon loads the file itself and reports a failure to the `start`
    // waiting on it.
    let result = match flags.action.as_str() {
        // Only the state root, read leniently: a daemon that runs keeps
        // taking containers while its file is mid-edit.
        "start" => daemon::start_action(&flags, &config::Config::state_root_lenient(), params.as_ref()),
        "delete" => daemon::delete_action(&flags),
        "inspect" => {
            let ns = (!flags.namespace.is_empty()).then_some(flags.namespace.as_str());
            audit::inspect_action(&config::Config::state_root_lenient(), ns, &flags.id).map(|text| print!("{text}"))
        }
        "daemon" => daemon::daemon_main(&flags),
        "upgrade" => {
            upgrade::upgrade_action(&config::Config::state_root_lenient(), &flags.address).map(|t| print!("{t}"))
        }
        // Run by a daemon on the binary it is about to become: it must load
        // the config that image will load.
        upgrade::CHECK_ACTION => config::Config::load()
            .map(|_| println!("{}", upgrade::check_line()))
            .map_err(anyhow::Error::from),
        "" => Err(anyhow::anyhow!("no action given (start, delete, inspect, upgrade)")),
        other => Err(anyhow::anyhow!(
            "unknown action {other:?} (start, delete, inspect, upgrade)"
        )),
    };
    if let Err(e) = result {
        // `{:#}`: the error and its causes, outermost first. (The daemon
        // logged its own, time-stamped, in its shim.log.)
        if flags.action != "daemon" {
            eprintln!("containerd-shim-nri-shim-v2 {}: {e:#}", flags.action);
        }
        std::process::exit(1);
    }
}
