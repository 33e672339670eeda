//! `nri-logger`: see the crate docs (`plugins/logger/src/lib.rs`).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use nri_logger::Logger;
use nri_stub::{EventMask, Stub};

/// Index used when neither `--idx`, `NRI_PLUGIN_IDX` nor an `IDX-NAME`
/// executable name gives one: last, so the logger sees containers as the
/// other plugins adjusted them.
const DEFAULT_IDX: &str = "99";

/// NRI plugin that logs every pod and container event it receives.
#[derive(Parser, Debug)]
#[command(name = "nri-logger", version)]
struct Args {
    /// The runtime's NRI socket (ignored when launched by the runtime).
    #[arg(long, default_value = nri_proto::DEFAULT_SOCKET_PATH)]
    socket_path: PathBuf,
    /// Plugin index, two digits [default: NRI_PLUGIN_IDX, else 99].
    #[arg(long)]
    idx: Option<String>,
    /// Plugin name [default: NRI_PLUGIN_NAME, else the executable's name].
    #[arg(long)]
    name: Option<String>,
    /// Events to subscribe to: comma-separated names (RunPodSandbox,
    /// create_container, ...) or the groups pod, container, validate, all.
    #[arg(long, default_value = "all")]
    events: String,
    /// Also append one JSON object per event to this file.
    #[arg(long)]
    log_file: Option<PathBuf>,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let events = EventMask::parse(&args.events).with_context(|| format!("invalid --events {:?}", args.events))?;
    let logger = match &args.log_file {
        Some(path) => Logger::with_log_file(path)?,
        None => Logger::new(),
    };
    let mut builder = Stub::builder_arc(Arc::new(logger))
        .with_events(events)
        .with_socket_path(&args.socket_path)
        .with_default_plugin_idx(DEFAULT_IDX);
    if let Some(n) = args.name {
        builder = builder.with_plugin_name(n);
    }
    if let Some(i) = args.idx {
        builder = builder.with_plugin_idx(i);
    }
    let stub = builder.build()?;
    let plugin = stub.qualified_name();
    stub.run().await.with_context(|| format!("plugin {plugin}"))?;
    tracing::info!(plugin, "shut down by the runtime");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("nri-logger: error: {}", nri_stub::error_chain(e.as_ref()));
        std::process::exit(1);
    }
}
