//! The node side of the binary: the actions containerd and operators run
//! (`start`, `delete`, `inspect`, `upgrade`, `-info`) and the per-node
//! daemon they start or reach. May use every other module of the crate;
//! nothing outside `node` uses it.

pub mod args;
pub mod bootstrap;
pub mod claim;
pub mod configure;
pub mod control;
pub mod daemon;
pub mod delete;
pub mod gate;
pub mod metrics;
pub mod plugin_watch;
pub mod reload;
pub mod running;
pub mod shimlog;
pub mod start;
pub mod upgrade;

/// The binary's entry point: dispatches on the action before any thread
/// exists (the helper and `delete` may run libcontainer in this process).
pub fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(crate::container::helper::HELPER_ARG) {
        crate::container::helper::helper_main();
    }
    // The operator's installer actions, with flags of their own.
    if let Some(action @ ("configure" | "unconfigure")) = argv.get(1).map(String::as_str) {
        let result = configure::parse_args(argv[2..].iter().cloned())
            .map_err(anyhow::Error::msg)
            .and_then(|req| {
                let out = if action == "configure" {
                    configure::configure(&req)
                } else {
                    configure::unconfigure(&req)
                };
                out.map_err(anyhow::Error::from)
            });
        match result {
            Ok(report) => {
                print!("{report}");
                return;
            }
            Err(e) => {
                // Each error already names its cause; the chain would repeat it.
                eprintln!("containerd-shim-nri-shim-v2 {action}: {e}");
                std::process::exit(1);
            }
        }
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
        if let Err(e) = crate::info::info_action(std::io::stdin().lock(), std::io::stdout().lock()) {
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
        "start" => start::start_action(&flags, &crate::config::Config::state_root_lenient(), params.as_ref()),
        "delete" => delete::delete_action(&flags),
        "inspect" => {
            let ns = (!flags.namespace.is_empty()).then_some(flags.namespace.as_str());
            crate::task::audit::inspect_action(&crate::config::Config::state_root_lenient(), ns, &flags.id)
                .map(|text| print!("{text}"))
        }
        "daemon" => daemon::daemon_main(&flags),
        "upgrade" => {
            upgrade::upgrade_action(&crate::config::Config::state_root_lenient(), &flags.address).map(|t| print!("{t}"))
        }
        // Run by a daemon on the binary it is about to become: it must load
        // the config that image will load.
        upgrade::CHECK_ACTION => crate::config::Config::load()
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
